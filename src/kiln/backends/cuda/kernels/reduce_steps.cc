// The CUDA backend's reduction steps (reduce.h's kernels): ReduceSum, ReduceMean, ReduceMax,
// ReduceMin, ReduceProd, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp and ReduceSumSquare
// over constant axes (attribute or input), and ArgMax/ArgMin. The factory resolves the reduced
// axes as shape inference does and merges the input's axes into kept and reduced runs; runtime
// axes (unknown at lowering) get nullptr, so the node falls through to the host.
#include <map>
#include <optional>

#include "kiln/backends/cuda/kernels/element_type.h"
#include "kiln/backends/cuda/kernels/reduce.h"
#include "kiln/backends/cuda/kernels/steps.h"

namespace kiln::cuda {

const knobs::Knob kReduceBlock = knobs::declareKnob({
    .name = "cuda.reduce.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512"},
    .defaultValue = "256",
    .help = "threads per block of the row reduction (reductions over the innermost axis): 256, "
            "128 or 512, each block giving a warp to each of its outputs for short rows and "
            "itself to one output for long ones",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kReduceSplitBlocks = knobs::declareKnob({
    .name = "cuda.reduce.split_blocks",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"1056", "264", "528", "2112"},
    .defaultValue = "1056",
    .help = "blocks a column reduction with few outputs over a long range (a spatial mean in "
            "NHWC) aims for when it splits the range: 1056 is eight a multiprocessor of the "
            "H200, 264 two (more loads a thread, fewer partial states to combine)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kReduceSplitMinChunk = knobs::declareKnob({
    .name = "cuda.reduce.split_min_chunk",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"64", "128", "256", "512"},
    .defaultValue = "64",
    .help = "the fewest reduced elements one split of a column reduction takes (so short ranges "
            "are split less or not at all)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kReduceWarpRowLimit = knobs::declareKnob({
    .name = "cuda.reduce.warp_row_limit",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"1024", "256", "4096"},
    .defaultValue = "1024",
    .help = "the longest reduction over the innermost axis the row kernel gives one warp an "
            "output (longer ones get a whole block an output)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kReduceColumnSlices = knobs::declareKnob({
    .name = "cuda.reduce.column_slices",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"8", "4", "16", "32"},
    .defaultValue = "8",
    .help = "threads along the reduced range in a block of the column reduction (reductions "
            "over outer axes, 32 outputs a block): more slices take more of a long range at "
            "once, fewer leave more blocks resident",
    .backends = {"cuda"},
    .perNode = true,
});

namespace {

using ir::DType;

// The geometry of reducing `shape` over the axes flagged in `reduced`: size-1 axes dropped,
// neighbouring axes of one kind merged (the input is contiguous, so they always walk as one).
std::optional<ReduceGeometry> reduceGeometry(const ir::Shape& shape,
                                             const std::vector<bool>& reduced) {
  ReduceGeometry g;
  g.outputs = 1;
  g.reduced = 1;
  for (size_t a = 0; a < shape.rank(); ++a) (reduced[a] ? g.reduced : g.outputs) *= shape[a];
  const std::vector<int64_t> strides = shape.strides();
  struct Run {
    int64_t dim, stride;
    bool reduced;
  };
  std::vector<Run> runs;
  for (size_t a = 0; a < shape.rank(); ++a) {
    if (shape[a] == 1) continue;
    if (!runs.empty() && runs.back().reduced == reduced[a]) {
      runs.back().dim *= shape[a];
      runs.back().stride = strides[a];
      continue;
    }
    runs.push_back({shape[a], strides[a], reduced[a]});
  }
  g.rows = !runs.empty() && runs.back().reduced;
  for (const Run& run : runs) {
    int& rank = run.reduced ? g.reducedRank : g.keptRank;
    if (rank == kMaxReduceRank) return std::nullopt;
    (run.reduced ? g.reducedDims : g.keptDims)[rank] = run.dim;
    (run.reduced ? g.reducedStrides : g.keptStrides)[rank] = run.stride;
    ++rank;
  }
  return g;
}

class ReduceStep final : public Step {
 public:
  explicit ReduceStep(ReduceLaunch launch) : launch_(launch) {}

  Status enqueue(const Context& context) const override {
    ReduceLaunch launch = launch_;
    launch.x = context.address(*inputs[0]);
    launch.y = context.address(*outputs[0]);
    launch.workspace = context.workspace;
    KILN_CUDA_CHECK(launchReduce(launch, context.stream));
    KILN_CUDA_CHECK_LAUNCH("the reduction");
    return Status::ok();
  }

  int64_t workspaceBytes() const override { return reduceWorkspaceBytes(launch_); }

  std::string detail() const override {
    const std::string block = std::to_string(launch_.blockThreads);
    const int64_t splits = reduceColumnSplits(launch_);
    const std::string columns = "columns, 32x" + std::to_string(launch_.columnSlices) + " blocks";
    if (splits > 1) return columns + ", range split " + std::to_string(splits) + " ways";
    if (!launch_.geometry.rows) return columns;
    if (reduceUsesWarpRows(launch_)) {
      return "rows, a warp per output, " + block + "-thread blocks";
    }
    return "rows, a " + block + "-thread block per output";
  }

 private:
  ReduceLaunch launch_;
};

const std::map<std::string, ReduceOp>& reduceOps() {
  static const std::map<std::string, ReduceOp> ops = {
      {"ReduceSum", ReduceOp::kSum},       {"ReduceMean", ReduceOp::kMean},
      {"ReduceProd", ReduceOp::kProd},     {"ReduceSumSquare", ReduceOp::kSumSquare},
      {"ReduceL1", ReduceOp::kL1},         {"ReduceL2", ReduceOp::kL2},
      {"ReduceLogSum", ReduceOp::kLogSum}, {"ReduceLogSumExp", ReduceOp::kLogSumExp},
      {"ReduceMax", ReduceOp::kMax},       {"ReduceMin", ReduceOp::kMin},
      {"ArgMax", ReduceOp::kArgMax},       {"ArgMin", ReduceOp::kArgMin},
  };
  return ops;
}

// The reduced axes of a Reduce* node, as the reference resolves them: the attribute before the
// opset where axes became an input (13 for ReduceSum, 18 for the others), the constant input
// after; empty axes mean all axes, or none with noop_with_empty_axes. nullopt for runtime axes.
std::optional<std::vector<bool>> reducedAxes(const ir::Node& node, int64_t rank) {
  const int since = node.opType == "ReduceSum" ? 13 : 18;
  std::vector<int64_t> axes;
  bool noop = false;
  if (node.opsetVersion < since) {
    auto attribute = node.getInts("axes");
    if (!attribute.isOk()) return std::nullopt;
    axes = *attribute;
  } else {
    if (const ir::Value* input = node.input(1)) {
      if (!input->constant) return std::nullopt;
      axes = input->constant->toInt64Vector();
    }
    auto flag = node.getInt("noop_with_empty_axes", 0);
    if (!flag.isOk()) return std::nullopt;
    noop = *flag != 0;
  }
  if (axes.empty()) return std::vector<bool>(static_cast<size_t>(rank), !noop);
  std::vector<bool> reduced(static_cast<size_t>(rank), false);
  for (int64_t axis : axes) {
    auto normalized = ir::normalizeAxis(axis, rank);
    if (!normalized.isOk()) return std::nullopt;
    reduced[static_cast<size_t>(*normalized)] = true;
  }
  return reduced;
}

std::unique_ptr<Step> makeReduceStep(const ir::Node& node, const knobs::Route& route) {
  if (!node.domain.empty() || node.inputs.empty() || !node.inputs[0]) return nullptr;
  if (node.outputs.size() != 1 || !node.outputs[0]) return nullptr;
  auto it = reduceOps().find(node.opType);
  if (it == reduceOps().end()) return nullptr;
  const ReduceOp op = it->second;
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const auto type = elementTypeOf(x->dtype);
  if (!type || !reduceSupported(op, *type)) return nullptr;
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  const bool arg = op == ReduceOp::kArgMax || op == ReduceOp::kArgMin;
  ReduceLaunch launch;
  launch.op = op;
  launch.type = *type;
  std::vector<bool> reduced;
  if (arg) {
    if (y->dtype != DType::kInt64) return nullptr;
    auto rawAxis = node.getInt("axis", 0);
    auto last = node.opsetVersion >= 12 ? node.getInt("select_last_index", 0) : Result<int64_t>(0);
    if (!rawAxis.isOk() || !last.isOk()) return nullptr;
    auto axis = ir::normalizeAxis(*rawAxis, rank);
    if (!axis.isOk()) return nullptr;
    reduced.assign(static_cast<size_t>(rank), false);
    reduced[static_cast<size_t>(*axis)] = true;
    launch.selectLastIndex = *last != 0;
  } else {
    if (y->dtype != x->dtype) return nullptr;
    auto axes = reducedAxes(node, rank);
    if (!axes) return nullptr;
    reduced = std::move(*axes);
  }
  auto geometry = reduceGeometry(x->shape, reduced);
  if (!geometry || geometry->outputs != y->shape.elementCount()) return nullptr;
  launch.geometry = *geometry;
  launch.blockThreads = std::stoi(route.value(kReduceBlock, &node));
  launch.columnSlices = std::stoi(route.value(kReduceColumnSlices, &node));
  launch.warpRowLimit = std::stoll(route.value(kReduceWarpRowLimit, &node));
  launch.splitTargetBlocks = std::stoll(route.value(kReduceSplitBlocks, &node));
  launch.splitMinChunk = std::stoll(route.value(kReduceSplitMinChunk, &node));
  auto step = std::make_unique<ReduceStep>(launch);
  step->tactic = "kiln.reduce";
  return step;
}

const int kRegistered = registerStepFactory(kRankReduce, "reduce", makeReduceStep);

}  // namespace

}  // namespace kiln::cuda
