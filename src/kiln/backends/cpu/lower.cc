// Lowering an ir::Graph to a CPU plan: a kernel per node (by the route's knobs), then the
// arena layout of every runtime value.
#include <cblas.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <thread>
#include <unordered_map>

#include "kiln/backends/cpu/kernels/steps.h"
#include "kiln/backends/cpu/memory_planner.h"
#include "kiln/backends/cpu/plan.h"

namespace kiln::cpu {

const knobs::Knob kThreads = knobs::declareKnob({
    .name = "cpu.threads",
    .kind = knobs::KnobKind::kInt,
    .minValue = 0,
    .maxValue = 256,
    .defaultValue = "0",
    .help = "threads for the CPU kernels (0: one per core)",
    .backends = {"cpu"},
});

const knobs::Knob kSpin = knobs::declareKnob({
    .name = "cpu.threads.spin_us",
    .kind = knobs::KnobKind::kInt,
    .minValue = 0,
    .maxValue = 100000,
    // 50 us: on the 2-core development machine at 2 threads (medians of two 1.5 s runs, 0 -> 50
    // us), mobilenet_v3_small 4.7-8.0 -> 3.5-4.1 ms, bert_mini 8.4-12.0 -> 7.2, shufflenet 7.9-8.2
    // -> 4.8, squeezenet 10.6-11.4 -> 9.1-9.8; 200 us was no better on shufflenet (7.2-7.9).
    .defaultValue = "50",
    .help = "microseconds the plan's threads spin waiting for the next parallel loop (or for "
            "each other) before they sleep on a condition variable (0: sleep at once)",
    .backends = {"cpu"},
});

const knobs::Knob kAffinity = knobs::declareKnob({
    .name = "cpu.threads.affinity",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"off", "on"},
    .defaultValue = "off",
    .help = "off: the plan's pool workers run wherever the OS schedules them; on: each pool worker "
            "is bound to its own CPU among those the process may use (the calling thread is not)",
    .backends = {"cpu"},
});

const knobs::Knob kChunkClaim = knobs::declareKnob({
    .name = "cpu.threads.chunks",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"own", "any"},
    .defaultValue = "own",
    // own: at 2 threads on the 2-core development machine, 3 interleaved rounds each, the four
    // CNNs 2-8 % faster (3 of 3 rounds each), BERT-mini and ViT-tiny 3-5 % slower (their native
    // GEMMs), bench/cpu/results/2026-12-05-threads-chunks.md.
    .help = "how the threads share a parallel loop's chunks. own: thread t runs chunk t first "
            "(the same rows or planes on every call and in every layer split alike, so a core "
            "reads what it wrote itself), then any chunk a late thread left; any: each thread "
            "takes the next free chunk, whichever thread arrives first (own measured faster on "
            "CNNs, any on transformers)",
    .backends = {"cpu"},
});

const knobs::Knob kAliasReshapes = knobs::declareKnob({
    .name = "cpu.memory.alias_reshapes",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "Reshape, Flatten, Squeeze, Unsqueeze and Identity reuse their input's buffer "
            "(no copy, no step) instead of copying it",
    .backends = {"cpu"},
    .perNode = true,
});

const knobs::Knob kInPlace = knobs::declareKnob({
    .name = "cpu.memory.in_place",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "an elementwise step writes its output over an input of the same shape that nothing "
            "reads afterwards, instead of into a buffer of its own",
    .backends = {"cpu"},
    .perNode = true,
});

namespace {

std::unique_ptr<Step> chooseStep(const ir::Node& node, const knobs::Route& route) {
  if (auto step = makeGemmStep(node, route)) return step;
  if (auto step = makeOnednnConvStep(node, route)) return step;
  if (auto step = makeConvStep(node, route)) return step;
  if (auto step = makePoolStep(node, route)) return step;
  if (auto step = makeSoftmaxStep(node, route)) return step;
  if (auto step = makeAttentionStep(node, route)) return step;
  if (auto step = makeLayerNormStep(node, route)) return step;
  if (auto step = makeTransposeStep(node, route)) return step;
  if (auto step = makeEltwiseStep(node, route)) return step;
  if (auto step = makeFusedEltwiseStep(node, route)) return step;
  if (auto step = makeDataMoveStep(node, route)) return step;
  if (auto step = makeReduceStep(node, route)) return step;
  return makeReferenceStep(node);
}

bool allOutputsConstant(const ir::Node& node) {
  for (const ir::Value* output : node.outputs) {
    if (output && !output->constant) return false;
  }
  return true;
}

// A node whose output holds its input's bytes unchanged (row-major order is all a shape
// changes), so the output can be a second name for the input's buffer.
bool isAlias(const ir::Node& node, const knobs::Route& route) {
  static const std::set<std::string> kAliasOps = {"Reshape", "Flatten", "Squeeze", "Unsqueeze",
                                                  "Identity"};
  if (!node.domain.empty() || !kAliasOps.count(node.opType)) return false;
  if (node.outputs.size() != 1 || !node.outputs[0] || !node.inputs[0]) return false;
  if (node.inputs[0]->constant || node.outputs[0]->constant) return false;
  return route.value(kAliasReshapes, &node) == "on";
}

// The input a step may write its output over: its kernel reads element i of that input before
// writing element i of the output and touches no other element of either, which holds for the
// elementwise kernels below (they take no __restrict pointers). -1: none.
int inPlaceInput(const Step& step) {
  static const std::set<std::string> kElementwiseTactics = {"fast.unary", "fast.binary_broadcast"};
  // cpu.eltwise.grain adds ".g<elements>" to the tactic; the kernel is the same.
  const std::string tactic = step.tactic.substr(0, step.tactic.find(".g"));
  if (!kElementwiseTactics.count(tactic)) return -1;
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

}  // namespace

Result<Plan> lowerToCpu(std::shared_ptr<const ir::Graph> graph, const knobs::Route& route) {
  Plan plan;
  plan.graph_ = graph;
  const int64_t threads = route.intValue(kThreads);
  plan.threads_ = threads > 0 ? static_cast<int>(threads)
                              : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  plan.spinMicros_ = static_cast<int>(route.intValue(kSpin));
  plan.pool_ =
      std::make_unique<ThreadPool>(plan.threads_, plan.spinMicros_, route.value(kAffinity) == "on",
                                   route.value(kChunkClaim) == "own");
  for (const auto& value : graph->values()) {
    if (!value->hasType) {
      return internalError("value '{}' has no type: lower only shape-inferred graphs", value->name);
    }
  }

  // Kernels first: which nodes run as steps, and which are aliases of their input.
  backends::BufferRequests requests;
  for (const auto& nodePtr : graph->nodes()) {
    const ir::Node& node = *nodePtr;
    if (allOutputsConstant(node)) continue;  // folded at build time (e.g. Shape of a static shape)
    if (isAlias(node, route)) {
      requests.aliases.push_back(&node);
      continue;
    }
    std::unique_ptr<Step> step = chooseStep(node, route);
    if (!step) {
      return unsupported("{}: the CPU backend has no kernel for '{}'", node.describe(),
                         node.opType);
    }
    step->node = &node;
    requests.steps.push_back(&node);
    const int input = inPlaceInput(*step);
    requests.inPlaceInputs.push_back(input >= 0 && route.value(kInPlace, step->node) == "on" ? input
                                                                                             : -1);
    plan.steps_.push_back(std::move(step));
  }
  requests.reuse = route.value(kMemoryPlanner) == "reuse";
  requests.alignment = memoryAlignment(route);
  requests.fit = memoryFit(route);
  requests.order = memoryOrder(route);
  plan.arenaAlignment_ = requests.alignment;
  const backends::BufferAssignment memory = backends::assignBuffers(*graph, requests);
  plan.arenaBytes_ = memory.arenaBytes;
  auto refFor = [&](const ir::Value* value) {
    BufferRef ref{value->dtype, value->shape};
    if (value->constant) {
      ref.constant = &*value->constant;
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
  return plan;
}

Result<std::vector<ir::Tensor>> Plan::run(const std::vector<ir::Tensor>& inputs,
                                          std::vector<double>* stepMilliseconds) const {
  if (inputs.size() != inputs_.size()) {
    return invalidInput("the model has {} inputs, {} were given", inputs_.size(), inputs.size());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype() != inputs_[i].dtype || inputs[i].shape() != inputs_[i].shape) {
      return invalidInput("input '{}' must be {} {}, got {} {}", graph_->inputs[i]->name,
                          ir::dtypeName(inputs_[i].dtype), inputs_[i].shape.toString(),
                          ir::dtypeName(inputs[i].dtype()), inputs[i].shape().toString());
    }
  }
  // The arena's base is aligned as its offsets are (cpu.memory.alignment), so that aligned
  // offsets are aligned addresses: the allocation has room to slide the base that far.
  if (arena_.empty() && arenaBytes_ > 0) {
    arena_ = ir::Tensor(ir::DType::kUInt8, ir::Shape{arenaBytes_ + arenaAlignment_ - 1});
  }
  std::byte* base = arena_.empty() ? nullptr : arena_.mutableRawData();
  if (base) {
    const auto address = reinterpret_cast<std::uintptr_t>(base);
    const auto alignment = static_cast<std::uintptr_t>(arenaAlignment_);
    base += (alignment - address % alignment) % alignment;
  }
  openblas_set_num_threads(threads_);
  ExecutionContext context(base, *pool_);
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::memcpy(context.address(inputs_[i]), inputs[i].rawData(), inputs[i].byteSize());
  }
  if (stepMilliseconds) stepMilliseconds->assign(steps_.size(), 0.0);
  for (size_t i = 0; i < steps_.size(); ++i) {
    const auto start = std::chrono::steady_clock::now();
    Status status = steps_[i]->run(context);
    if (!status.isOk()) return status;
    if (stepMilliseconds) {
      (*stepMilliseconds)[i] =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
    }
  }
  std::vector<ir::Tensor> outputs;
  for (const BufferRef& ref : outputs_) {
    ir::Tensor out(ref.dtype, ref.shape);
    std::memcpy(out.mutableRawData(), context.address(ref), out.byteSize());
    outputs.push_back(std::move(out));
  }
  return outputs;
}

}  // namespace kiln::cpu
