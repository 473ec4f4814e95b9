// Lowering an ir::Graph to a CUDA plan: a kernel per node (by the step factories, in rank order,
// and the route's cuda.* knobs), the arena layout of every runtime value and the weights layout.
#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "kiln/backends/buffer_assignment.h"
#include "kiln/backends/cuda/kernels/steps.h"
#include "kiln/backends/cuda/plan.h"
#include "kiln/backends/cuda/precision.h"
#include "kiln/backends/stream_schedule.h"

namespace kiln::cuda {

const knobs::Knob kGraphs = knobs::declareKnob({
    .name = "cuda.graphs",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "capture the plan's launches into a CUDA graph once and replay it (where every step "
            "allows capture), instead of launching each kernel from the host on every run",
    .backends = {"cuda"},
});

const knobs::Knob kGraphUpload = knobs::declareKnob({
    .name = "cuda.graphs.upload",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "off",
    .help = "with cuda.graphs on, upload the instantiated CUDA graph to the device when the plan "
            "is built (cudaGraphUpload), so the first run does not pay for it; off leaves the "
            "upload to the first launch",
    .backends = {"cuda"},
});

const knobs::Knob kTimingCache = knobs::declareKnob({
    .name = "cuda.timing_cache",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "layers whose choice is timed (cuda.gemm.algo=timed, cuda.conv.algo=timed) look the "
            "choice up in the timing cache first (the process's, and --timingCacheFile's when "
            "given) and record what they time there, so identical layers time once; off times "
            "every such layer afresh and records nothing",
    .backends = {"cuda"},
});

const knobs::Knob kMemoryPlanner = knobs::declareKnob({
    .name = "cuda.memory.planner",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"reuse", "naive"},
    .defaultValue = "reuse",
    .help = "device arena planning: share memory between values whose lifetimes do not overlap, "
            "or give each value its own range",
    .backends = {"cuda"},
});

const knobs::Knob kMemoryFit = knobs::declareKnob({
    .name = "cuda.memory.fit",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"first", "best"},
    .defaultValue = "first",
    .help = "where the reuse planner puts a device value among the gaps left by overlapping "
            "values already placed: the lowest gap that holds it, or the smallest (a tighter "
            "arena keeps more of the working set in the L2 cache; neither always gives the "
            "smaller one)",
    .backends = {"cuda"},
});

const knobs::Knob kMemoryOrder = knobs::declareKnob({
    .name = "cuda.memory.order",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"size", "time"},
    .defaultValue = "size",
    .help = "the order in which the reuse planner places device values: largest first, or in "
            "the order the plan defines them",
    .backends = {"cuda"},
});

const knobs::Knob kL2Persist = knobs::declareKnob({
    .name = "cuda.l2.persist",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"off", "arena", "weights"},
    .defaultValue = "off",
    .help = "mark the plan's accesses to one buffer as persisting in the L2 cache (an access "
            "policy window on its stream, carried into the CUDA graph, with the device's largest "
            "set-aside for persisting lines): the activation arena, the weights, or neither",
    .backends = {"cuda"},
});

const knobs::Knob kL2PersistLimit = knobs::declareKnob({
    .name = "cuda.l2.persist.limit",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"max", "half", "quarter"},
    .defaultValue = "max",
    .help = "with cuda.l2.persist on, the L2 set-aside for persisting lines: the device's largest, "
            "or half or a quarter of it (the window's hit ratio scaled to match), leaving more of "
            "the L2 to the accesses outside the window",
    .backends = {"cuda"},
});

const knobs::Knob kStreams = knobs::declareKnob({
    .name = "cuda.streams",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"1", "2", "4"},
    .defaultValue = "1",
    .help = "streams a run spreads the steps over: independent branches (an ASPP head's atrous "
            "convolutions, a residual block's shortcut) go to auxiliary streams, joined by events "
            "where a step needs another stream's result (forked from and joined into the plan's "
            "stream, so a CUDA graph captures them as parallel branches); each stream has its own "
            "workspace",
    .backends = {"cuda"},
});

const knobs::Knob kStreamPriority = knobs::declareKnob({
    .name = "cuda.streams.priority",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"equal", "branches"},
    .defaultValue = "equal",
    .help = "with cuda.streams above 1, the auxiliary streams run at the device's highest stream "
            "priority (branches: the block scheduler starts a side branch's blocks before the "
            "main path's waiting ones, so a short branch is not starved by a long one) or at the "
            "plan stream's own (equal)",
    .backends = {"cuda"},
});

const knobs::Knob kMemoryAlignment = knobs::declareKnob({
    .name = "cuda.memory.alignment",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "1024", "4096"},
    .defaultValue = "256",
    .help = "the byte alignment of every value's range in the activation arena, of each "
            "constant in the weights buffer and of each stream's workspace: larger ones start "
            "more tensors on their own DRAM pages and L2 sectors, at the cost of a larger arena",
    .backends = {"cuda"},
});

const knobs::Knob kAliasReshapes = knobs::declareKnob({
    .name = "cuda.memory.alias_reshapes",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "Reshape, Flatten, Squeeze, Unsqueeze and Identity reuse their input's device buffer "
            "(no kernel) instead of copying it",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kInPlace = knobs::declareKnob({
    .name = "cuda.memory.in_place",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "an elementwise kernel writes its output over an input of the same shape and type that "
            "nothing reads afterwards, instead of into a buffer of its own",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kHostFallback = knobs::declareKnob({
    .name = "cuda.host_fallback",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "run a node that has no GPU kernel on the host with the reference kernel (copying its "
            "inputs and outputs, and giving up CUDA graphs), instead of failing the build",
    .backends = {"cuda"},
});

namespace {

struct Factory {
  int rank;
  std::string name;
  StepFactory make;
};

std::vector<Factory>& factories() {
  static std::vector<Factory> all;
  return all;
}

bool allOutputsConstant(const ir::Node& node) {
  for (const ir::Value* output : node.outputs) {
    if (output && !output->constant) return false;
  }
  return true;
}

bool isAlias(const ir::Node& node, const knobs::Route& route) {
  static const std::set<std::string> kAliasOps = {"Reshape", "Flatten", "Squeeze", "Unsqueeze",
                                                  "Identity"};
  if (!node.domain.empty() || !kAliasOps.count(node.opType)) return false;
  if (node.outputs.size() != 1 || !node.outputs[0] || !node.inputs[0]) return false;
  if (node.inputs[0]->constant || node.outputs[0]->constant) return false;
  return route.value(kAliasReshapes, &node) == "on";
}

// Tactics whose kernels read element i of every input before writing element i of the output
// and touch no other element (so the output may overwrite a same-shaped input).
int inPlaceInput(const Step& step) {
  static const std::set<std::string> kElementwiseTactics = {
      "kiln.unary", "kiln.binary", "kiln.fused_eltwise", "kiln.fused_eltwise.nvrtc",
      "kiln.eltwise.nvrtc"};
  if (!kElementwiseTactics.count(step.tactic)) return -1;
  const ir::Value* output = step.node->outputs[0];
  for (size_t i = 0; i < step.node->inputs.size(); ++i) {
    const ir::Value* input = step.node->inputs[i];
    if (input && !input->constant && input->dtype == output->dtype &&
        input->shape == output->shape) {
      return static_cast<int>(i);
    }
  }
  return -1;
}

// The precision a step records: the reduced type its float outputs have (assignPrecision made
// them so), tf32 where the route allows TF32 products, else fp32.
std::string precisionOf(const ir::Node& node, const knobs::Route& route) {
  for (const ir::Value* output : node.outputs) {
    if (!output) continue;
    if (output->dtype == ir::DType::kFloat16) return "fp16";
    if (output->dtype == ir::DType::kBFloat16) return "bf16";
  }
  static const std::set<std::string> kProducts = {"Conv",     "Gemm",      "MatMul",   "FusedConv",
                                                  "NhwcConv", "FusedGemm", "Attention"};
  return kProducts.count(node.opType) && allowsTf32(node, route) ? "tf32" : "fp32";
}

}  // namespace

int registerStepFactory(int rank, std::string name, StepFactory factory) {
  auto& all = factories();
  all.push_back({rank, std::move(name), std::move(factory)});
  std::stable_sort(all.begin(), all.end(),
                   [](const Factory& a, const Factory& b) { return a.rank < b.rank; });
  return static_cast<int>(all.size());
}

Result<Plan> lowerToCuda(std::shared_ptr<const ir::Graph> graph, const knobs::Route& route) {
  Plan plan;
  plan.graph_ = graph;
  plan.graphsAllowed_ = route.value(kGraphs) == "on";
  plan.graphUpload_ = route.value(kGraphUpload) == "on";
  plan.timingCacheAllowed_ = route.value(kTimingCache) == "on";
  plan.l2Persist_ = route.value(kL2Persist);
  plan.l2PersistLimit_ = route.value(kL2PersistLimit);
  plan.streamPriority_ = route.value(kStreamPriority);
  plan.alignment_ = std::stoll(route.value(kMemoryAlignment));
  const int64_t alignment = plan.alignment_;
  for (const auto& value : graph->values()) {
    if (!value->hasType) {
      return internalError("value '{}' has no type: lower only shape-inferred graphs", value->name);
    }
  }
  const bool hostFallback = route.value(kHostFallback) == "on";
  backends::BufferRequests requests;
  for (const auto& nodePtr : graph->nodes()) {
    const ir::Node& node = *nodePtr;
    if (allOutputsConstant(node)) continue;  // folded at build time (e.g. Shape of a static shape)
    if (isAlias(node, route)) {
      requests.aliases.push_back(&node);
      continue;
    }
    std::unique_ptr<Step> step;
    for (const Factory& factory : factories()) {
      step = factory.make(node, route);
      if (step) break;
    }
    if (!step && hostFallback) step = makeHostStep(node);
    if (!step) {
      return unsupported(
          "{}: the CUDA backend has no kernel for '{}'{}", node.describe(), node.opType,
          hostFallback ? " (nor the reference executor)" : " (and cuda.host_fallback is off)");
    }
    step->node = &node;
    step->precision = precisionOf(node, route);
    requests.steps.push_back(&node);
    const int input = inPlaceInput(*step);
    requests.inPlaceInputs.push_back(input >= 0 && route.value(kInPlace, &node) == "on" ? input
                                                                                        : -1);
    plan.steps_.push_back(std::move(step));
  }
  requests.reuse = route.value(kMemoryPlanner) == "reuse";
  requests.fit = route.value(kMemoryFit) == "best" ? backends::Fit::kBest : backends::Fit::kFirst;
  requests.order =
      route.value(kMemoryOrder) == "time" ? backends::Order::kTime : backends::Order::kSize;
  requests.alignment = alignment;
  requests.keepInputsIntact = true;  // Plan::time uploads inputs once for many runs
  const backends::BufferAssignment memory = backends::assignBuffers(*graph, requests);
  plan.arenaBytes_ = memory.arenaBytes;

  // Constants: each distinct one once in the weights buffer.
  std::unordered_map<const ir::Tensor*, int64_t> weightOffset;
  auto refFor = [&](const ir::Value* value) {
    BufferRef ref{value->dtype, value->shape};
    if (value->constant) {
      ref.constant = &*value->constant;
      auto [it, inserted] = weightOffset.emplace(ref.constant, plan.weightBytes_);
      if (inserted) {
        plan.constants_.push_back(ref.constant);
        plan.constantOffsets_.push_back(plan.weightBytes_);
        const int64_t bytes = static_cast<int64_t>(ref.constant->byteSize());
        plan.weightBytes_ += (bytes + alignment - 1) / alignment * alignment;
      }
      ref.weightOffset = it->second;
    } else {
      ref.offset = memory.offsets.at(value);
    }
    return ref;
  };
  for (auto& step : plan.steps_) {
    for (const ir::Value* input : step->node->inputs) {
      step->inputs.push_back(input ? std::optional<BufferRef>(refFor(input)) : std::nullopt);
    }
    for (const ir::Value* output : step->node->outputs) {
      step->outputs.push_back(output ? std::optional<BufferRef>(refFor(output)) : std::nullopt);
    }
  }
  for (const ir::Value* input : graph->inputs) plan.inputs_.push_back(refFor(input));
  for (const ir::Value* output : graph->outputs) plan.outputs_.push_back(refFor(output));

  // Streams: each step as the arena ranges it reads and writes (constants are never written).
  const int maxStreams = std::stoi(route.value(kStreams));
  std::vector<backends::StepAccess> accesses;
  for (const auto& step : plan.steps_) {
    backends::StepAccess access;
    auto add = [](std::vector<backends::ByteRange>& ranges, const std::optional<BufferRef>& ref) {
      if (ref && !ref->constant && ref->bytes() > 0) {
        ranges.push_back({ref->offset, ref->offset + ref->bytes()});
      }
    };
    for (const auto& input : step->inputs) add(access.reads, input);
    for (const auto& output : step->outputs) add(access.writes, output);
    accesses.push_back(std::move(access));
  }
  const backends::StreamSchedule schedule = backends::scheduleStreams(accesses, maxStreams);
  plan.streamCount_ = schedule.streams;
  plan.stepStreams_ = schedule.stream;
  plan.stepWaits_ = schedule.waits;
  plan.stepSignals_ = schedule.signals;
  return plan;
}

}  // namespace kiln::cuda
