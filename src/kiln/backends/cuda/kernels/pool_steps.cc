// Pooling on the GPU with kiln's kernels (pool.cu): MaxPool (with its Indices output, either
// storage_order), AveragePool and the global pools, on NCHW tensors with 1 to 3 spatial axes
// (global pools: any number), and kiln's NHWC versions of each (layout.h; they have no Indices).
// float32, and float16 / bfloat16 (where cuda.precision made the node reduced: max exact,
// averages summed in float, rounded once).
//
// What stays on the host: LpPool, integer and float64 MaxPool.
//
// Tactics: "kiln.pool" (windowed), "kiln.global_pool".
#include <optional>
#include <string>
#include <vector>

#include "kiln/backends/cuda/kernels/element_type.h"
#include "kiln/backends/cuda/kernels/pool.h"
#include "kiln/backends/cuda/kernels/steps.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/layout.h"
#include "kiln/ir/ops/neural.h"

namespace kiln::cuda {

const knobs::Knob kPoolBlock = knobs::declareKnob({
    .name = "cuda.pool.block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512"},
    .defaultValue = "256",
    .help = "threads per block of kiln's pooling kernels: the windowed pools and the NHWC global "
            "pools (a thread an output), and the NCHW global pools (a block a plane)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kPoolVector = knobs::declareKnob({
    .name = "cuda.pool.vector",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "NHWC 2-D windowed pools (MaxPool, AveragePool) whose channels come in 16-byte groups: "
            "a thread per 16 bytes of an output pixel's channels, with 16-byte loads (on), or a "
            "thread per output element (off); the same bits either way",
    .backends = {"cuda"},
    .perNode = true,
});

namespace {

enum class PoolOp { kMax, kAverage, kGlobalMax, kGlobalAverage };

struct PoolNode {
  PoolOp op;
  bool nhwc;
};

std::optional<PoolNode> classify(const ir::Node& node) {
  struct Entry {
    const char* onnx;
    const char* nhwc;
    PoolOp op;
  };
  static const Entry kEntries[] = {
      {"MaxPool", "NhwcMaxPool", PoolOp::kMax},
      {"AveragePool", "NhwcAveragePool", PoolOp::kAverage},
      {"GlobalMaxPool", "NhwcGlobalMaxPool", PoolOp::kGlobalMax},
      {"GlobalAveragePool", "NhwcGlobalAveragePool", PoolOp::kGlobalAverage},
  };
  for (const Entry& entry : kEntries) {
    if (node.domain.empty() && node.opType == entry.onnx) return PoolNode{entry.op, false};
    if (node.domain == ir::kKilnDomain && node.opType == entry.nhwc) {
      return PoolNode{entry.op, true};
    }
  }
  return std::nullopt;
}

// Element strides over (n, c, d, h, w) of a tensor of `shape` (NCHW, or NHWC with `nhwc`), the
// spatial axes right-aligned; missing leading spatial axes get the stride an extent-1 axis would
// have.
void alignedStrides(const ir::Shape& shape, bool nhwc, int64_t out[5]) {
  const std::vector<int64_t> s = shape.strides();
  const size_t rank = shape.rank();
  const size_t spatial = rank - 2;
  const size_t missing = 3 - spatial;
  const size_t firstSpatial = nhwc ? 1 : 2;
  int64_t extent[3] = {1, 1, 1};
  out[0] = s[0];
  out[1] = nhwc ? s[rank - 1] : s[1];
  for (size_t i = 0; i < spatial; ++i) {
    out[2 + missing + i] = s[firstSpatial + i];
    extent[missing + i] = shape[firstSpatial + i];
  }
  for (size_t axis = missing; axis-- > 0;) out[2 + axis] = out[3 + axis] * extent[axis + 1];
}

class WindowPoolStep final : public Step {
 public:
  WindowPoolStep(PoolGeometry geometry, PoolKind kind, ElementType type, bool columnMajor,
                 int blockThreads, int vectorWidth)
      : geometry_(geometry),
        kind_(kind),
        type_(type),
        columnMajor_(columnMajor),
        blockThreads_(blockThreads),
        vectorWidth_(vectorWidth) {}

  std::string detail() const override {
    const std::string threads =
        vectorWidth_ ? "a thread per " + std::to_string(vectorWidth_) + " channels (16-byte loads)"
                     : std::string("a thread an output");
    return threads + ", " + std::to_string(blockThreads_) + "-thread blocks";
  }

  Status enqueue(const Context& context) const override {
    int64_t* indices =
        outputs.size() > 1 && outputs[1] ? context.data<int64_t>(*outputs[1]) : nullptr;
    return cudaStatus(launchWindowPool(geometry_, kind_, type_, context.address(*inputs[0]),
                                       context.address(*outputs[0]), indices, columnMajor_,
                                       blockThreads_, context.stream, vectorWidth_),
                      "the pooling kernel");
  }

 private:
  PoolGeometry geometry_;
  PoolKind kind_;
  ElementType type_;
  bool columnMajor_;  // MaxPool's storage_order=1
  int blockThreads_;
  int vectorWidth_;  // channels a thread (windowPoolVectorWidth), 0 for a thread an output
};

class GlobalPoolStep final : public Step {
 public:
  GlobalPoolStep(bool average, ElementType type, int64_t batch, int64_t channels, int64_t size,
                 bool nhwc, int blockThreads)
      : average_(average),
        type_(type),
        batch_(batch),
        channels_(channels),
        size_(size),
        nhwc_(nhwc),
        blockThreads_(blockThreads) {}

  std::string detail() const override {
    return (nhwc_ ? "a thread an output, " : "a block a plane, ") + std::to_string(blockThreads_) +
           "-thread blocks";
  }

  Status enqueue(const Context& context) const override {
    return cudaStatus(
        launchGlobalPool(average_, type_, context.address(*inputs[0]), context.address(*outputs[0]),
                         batch_, channels_, size_, nhwc_, blockThreads_, context.stream),
        "the global pooling kernel");
  }

 private:
  bool average_;
  ElementType type_;
  int64_t batch_, channels_, size_;
  bool nhwc_;
  int blockThreads_;
};

std::unique_ptr<Step> makeGlobalPoolStep(const PoolNode& pool, ElementType type, const ir::Shape& x,
                                         const ir::Shape& y, int blockThreads) {
  const ir::Shape nchw = pool.nhwc ? ir::permuteShape(x, ir::kNhwcToNchw) : x;
  std::vector<int64_t> expected(nchw.rank(), 1);
  expected[0] = nchw[0];
  expected[1] = nchw[1];
  const ir::Shape expectedNchw(expected);
  if (y != (pool.nhwc ? ir::permuteShape(expectedNchw, ir::kNchwToNhwc) : expectedNchw)) {
    return nullptr;
  }
  int64_t size = 1;
  for (size_t axis = 2; axis < nchw.rank(); ++axis) size *= nchw[axis];
  auto step = std::make_unique<GlobalPoolStep>(pool.op == PoolOp::kGlobalAverage, type, nchw[0],
                                               nchw[1], size, pool.nhwc, blockThreads);
  step->tactic = "kiln.global_pool";
  return step;
}

std::unique_ptr<Step> makeWindowPoolStep(const ir::Node& node, const PoolNode& pool,
                                         ElementType type, const ir::Shape& x, const ir::Shape& y,
                                         int blockThreads, bool vectorize, bool indices) {
  if (x.rank() > 5) return nullptr;
  const ir::Shape nchw = pool.nhwc ? ir::permuteShape(x, ir::kNhwcToNchw) : x;
  auto g = ir::resolvePoolGeometry(node, nchw);
  if (!g.isOk()) return nullptr;
  std::vector<int64_t> outDims = {nchw[0], nchw[1]};
  outDims.insert(outDims.end(), g->output.begin(), g->output.end());
  const ir::Shape outNchw(outDims);
  if (y != (pool.nhwc ? ir::permuteShape(outNchw, ir::kNchwToNhwc) : outNchw)) return nullptr;
  PoolKind kind = PoolKind::kMax;
  bool columnMajor = false;
  if (pool.op == PoolOp::kMax) {
    auto storageOrder = node.getInt("storage_order", 0);
    if (!storageOrder.isOk() || (*storageOrder != 0 && *storageOrder != 1)) return nullptr;
    columnMajor = *storageOrder == 1;
  }
  if (pool.op == PoolOp::kAverage) {
    auto includePad = node.getInt("count_include_pad", 0);
    if (!includePad.isOk()) return nullptr;
    kind = *includePad != 0 ? PoolKind::kAverageIncludePad : PoolKind::kAverage;
  }
  PoolGeometry geometry;
  geometry.batch = nchw[0];
  geometry.channels = nchw[1];
  const size_t spatial = g->spatialRank();
  const size_t missing = 3 - spatial;
  for (size_t i = 0; i < spatial; ++i) {
    geometry.in[missing + i] = g->input[i];
    geometry.out[missing + i] = g->output[i];
    geometry.kernel[missing + i] = g->kernel[i];
    geometry.stride[missing + i] = g->strides[i];
    geometry.dilation[missing + i] = g->dilations[i];
    geometry.padBegin[missing + i] = g->padsBegin[i];
    geometry.padEnd[missing + i] = g->padsEnd[i];
  }
  alignedStrides(x, pool.nhwc, geometry.xStrides);
  alignedStrides(y, pool.nhwc, geometry.yStrides);
  geometry.channelsLast = pool.nhwc;
  const int vectorWidth = vectorize ? windowPoolVectorWidth(geometry, type, indices) : 0;
  auto step = std::make_unique<WindowPoolStep>(geometry, kind, type, columnMajor, blockThreads,
                                               vectorWidth);
  step->tactic = "kiln.pool";
  return step;
}

std::unique_ptr<Step> makePoolStep(const ir::Node& node, const knobs::Route& route) {
  const std::optional<PoolNode> pool = classify(node);
  if (!pool) return nullptr;
  const ir::Value* x = node.input(0);
  if (!x || node.outputs.empty() || !node.outputs[0]) return nullptr;
  const ir::Value* y = node.outputs[0];
  // MaxPool's Indices: int64, shaped as Y; only the ONNX op has them.
  bool indices = false;
  for (size_t i = 1; i < node.outputs.size(); ++i) {
    const ir::Value* indexValue = node.outputs[i];
    if (!indexValue) continue;
    indices = true;
    if (i > 1 || pool->op != PoolOp::kMax || pool->nhwc || indexValue->dtype != ir::DType::kInt64 ||
        indexValue->shape != y->shape) {
      return nullptr;
    }
  }
  std::optional<ElementType> type = floatTypeOf(x->dtype);
  // ONNX's MaxPool also takes 8-bit integers (the windowed kernel's max is exact for them).
  if (pool->op == PoolOp::kMax && !pool->nhwc &&
      (x->dtype == ir::DType::kInt8 || x->dtype == ir::DType::kUInt8)) {
    type = elementTypeOf(x->dtype);
  } else if (!type || !poolSupported(*type)) {
    return nullptr;
  }
  if (y->dtype != x->dtype) return nullptr;
  if (x->shape.rank() < 3 || (pool->nhwc && x->shape.rank() != 4)) return nullptr;
  const int blockThreads = std::stoi(route.value(kPoolBlock, &node));
  std::unique_ptr<Step> step =
      pool->op == PoolOp::kGlobalMax || pool->op == PoolOp::kGlobalAverage
          ? makeGlobalPoolStep(*pool, *type, x->shape, y->shape, blockThreads)
          : makeWindowPoolStep(node, *pool, *type, x->shape, y->shape, blockThreads,
                               route.isOn(kPoolVector, &node), indices);
  if (step) step->layout = pool->nhwc ? "nhwc" : "nchw";
  return step;
}

const int kRegistered = registerStepFactory(kRankNorm, "pool", makePoolStep);

}  // namespace
}  // namespace kiln::cuda
