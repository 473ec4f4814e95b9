// The CUDA backend's normalisation steps (norm.h's kernels): Softmax, LogSoftmax and Hardmax,
// LpNormalization, LayerNormalization (with its optional Mean and InvStdDev outputs),
// InstanceNormalization, inference BatchNormalization and MeanVarianceNormalization, all in
// float32. Each factory reads the node's axis and shapes into the kernel's row or line geometry
// and refuses (nullptr: the host runs it) what it cannot compute exactly as the reference does.
#include <algorithm>
#include <optional>
#include <set>

#include "kiln/backends/cuda/kernels/datamove.h"
#include "kiln/backends/cuda/kernels/norm.h"
#include "kiln/backends/cuda/kernels/steps.h"

namespace kiln::cuda {

const knobs::Knob kSoftmaxRowKernel = knobs::declareKnob({
    .name = "cuda.softmax.row_kernel",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "warp", "block"},
    .defaultValue = "auto",
    .help = "Softmax, LogSoftmax and Hardmax over contiguous rows: one warp per row (four rows a "
            "block), one 512-thread block per row, or auto (a warp for rows of at most 1024 "
            "elements, a block for longer ones)",
    .backends = {"cuda"},
    // Only the order of the row's sums differs between the kernels: not a numerics change.
    .perNode = true,
});

namespace {

using ir::DType;

// Rows longer than this go to a block each rather than a warp.
constexpr int64_t kWarpRowLimit = 1024;

int64_t product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t result = 1;
  for (size_t i = begin; i < end && i < dims.size(); ++i) result *= dims[i];
  return result;
}

bool isFloat32(const ir::Value* value) { return value && value->dtype == DType::kFloat32; }

RowKernel rowKernelFor(int64_t width) {
  return width <= kWarpRowLimit ? RowKernel::kWarp : RowKernel::kBlock;
}

// The lines along `axis` of `shape`.
Lines linesAlong(const ir::Shape& shape, size_t axis) {
  const auto& dims = shape.dims();
  return {product(dims, 0, axis), dims[axis], product(dims, axis + 1, dims.size())};
}

// --- Softmax, LogSoftmax, Hardmax, LpNormalization ----------------------------------------------

class LinesStep final : public Step {
 public:
  // p == 0: the softmax family (`kind`); p == 1 or 2: LpNormalization.
  LinesStep(SoftmaxKind kind, int p, Lines lines, RowKernel rows)
      : kind_(kind), p_(p), lines_(lines), rows_(rows) {}

  Status enqueue(const Context& context) const override {
    const float* x = context.data<float>(*inputs[0]);
    float* y = context.data<float>(*outputs[0]);
    if (p_ == 0) {
      KILN_CUDA_CHECK(launchSoftmax(kind_, lines_, rows_, x, y, context.stream));
    } else {
      KILN_CUDA_CHECK(launchLpNormalization(p_, lines_, rows_, x, y, context.stream));
    }
    KILN_CUDA_CHECK_LAUNCH(p_ == 0 ? "the softmax" : "the Lp normalisation");
    return Status::ok();
  }

 private:
  SoftmaxKind kind_;
  int p_;
  Lines lines_;
  RowKernel rows_;
};

std::unique_ptr<Step> makeSoftmax(const ir::Node& node, const knobs::Route& route) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  if (!isFloat32(x) || !isFloat32(y) || x->shape != y->shape) return nullptr;
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  if (rank == 0) return nullptr;
  Lines lines;
  if (node.opsetVersion >= 13) {
    auto rawAxis = node.getInt("axis", -1);
    if (!rawAxis.isOk()) return nullptr;
    auto axis = ir::normalizeAxis(*rawAxis, rank);
    if (!axis.isOk()) return nullptr;
    lines = linesAlong(x->shape, static_cast<size_t>(*axis));
  } else {
    // Before opset 13 the input is coerced to 2-D at `axis`; axis == rank is a valid split.
    auto rawAxis = node.getInt("axis", 1);
    if (!rawAxis.isOk() || *rawAxis < -rank || *rawAxis > rank) return nullptr;
    const size_t axis = static_cast<size_t>(*rawAxis < 0 ? *rawAxis + rank : *rawAxis);
    const auto& dims = x->shape.dims();
    lines = {product(dims, 0, axis), product(dims, axis, dims.size()), 1};
  }
  const std::string& choice = route.value(kSoftmaxRowKernel, &node);
  RowKernel rows = rowKernelFor(lines.length);
  if (choice == "warp") rows = RowKernel::kWarp;
  if (choice == "block") rows = RowKernel::kBlock;
  const SoftmaxKind kind = node.opType == "Softmax"      ? SoftmaxKind::kSoftmax
                           : node.opType == "LogSoftmax" ? SoftmaxKind::kLogSoftmax
                                                         : SoftmaxKind::kHardmax;
  auto step = std::make_unique<LinesStep>(kind, 0, lines, rows);
  // The kernel chosen is part of the tactic: strided lines, or a warp or a block per row.
  step->tactic = lines.inner > 1            ? "kiln.softmax.strided"
                 : rows == RowKernel::kWarp ? "kiln.softmax.warp"
                                            : "kiln.softmax.block";
  return step;
}

std::unique_ptr<Step> makeLpNormalization(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  if (!isFloat32(x) || !isFloat32(y) || x->shape != y->shape) return nullptr;
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  auto rawAxis = node.getInt("axis", -1);
  auto p = node.getInt("p", 2);
  if (rank == 0 || !rawAxis.isOk() || !p.isOk() || (*p != 1 && *p != 2)) return nullptr;
  auto axis = ir::normalizeAxis(*rawAxis, rank);
  if (!axis.isOk()) return nullptr;
  const Lines lines = linesAlong(x->shape, static_cast<size_t>(*axis));
  auto step = std::make_unique<LinesStep>(SoftmaxKind::kSoftmax, static_cast<int>(*p), lines,
                                          rowKernelFor(lines.length));
  step->tactic = "kiln.lpnorm";
  return step;
}

// --- LayerNormalization and InstanceNormalization -----------------------------------------------

// Where a row's scale or bias values come from: the parameter itself, one value per element of
// the row, or (when it broadcasts within the row) a copy expanded to the row into the workspace
// by `expand` before the normalisation runs.
struct RowParameter {
  int input = -1;  // -1: absent
  std::optional<StridedGather> expand;
};

// How LayerNormalization's parameter `input` (broadcasting to `x`) covers the rows that start at
// `axis`: nullopt when it varies between rows, which the kernel does not do.
std::optional<RowParameter> rowParameter(const ir::Node& node, size_t input, const ir::Shape& x,
                                         size_t axis) {
  const ir::Value* value = node.input(input);
  if (!value) return RowParameter{};
  if (!isFloat32(value) || value->shape.rank() > x.rank()) return std::nullopt;
  const size_t lead = x.rank() - value->shape.rank();
  const std::vector<int64_t> strides = value->shape.strides();
  auto dimAt = [&](size_t a) { return a < lead ? int64_t{1} : value->shape[a - lead]; };
  for (size_t a = 0; a < axis; ++a) {
    if (dimAt(a) != 1) return std::nullopt;
  }
  RowParameter parameter{static_cast<int>(input), std::nullopt};
  bool direct = true;
  for (size_t a = axis; a < x.rank(); ++a) {
    if (dimAt(a) != x[a] && dimAt(a) != 1) return std::nullopt;
    direct = direct && dimAt(a) == x[a];
  }
  if (direct) return parameter;
  StridedGather expand;
  for (size_t a = axis; a < x.rank(); ++a) {
    if (expand.rank == kMaxMoveRank) return std::nullopt;
    expand.dims[expand.rank] = x[a];
    expand.srcStrides[expand.rank] = dimAt(a) == 1 || a < lead ? 0 : strides[a - lead];
    ++expand.rank;
  }
  expand.srcElements = value->shape.elementCount();
  parameter.expand = expand;
  return parameter;
}

constexpr int64_t kWorkspaceAlignment = 256;

class RowNormStep final : public Step {
 public:
  RowNormStep(RowNormalization norm, RowParameter scale, RowParameter bias)
      : norm_(norm), scale_(std::move(scale)), bias_(std::move(bias)) {}

  int64_t workspaceBytes() const override {
    return 2 * expandedBytes();  // the scale's and the bias's expanded rows, at most
  }

  Status enqueue(const Context& context) const override {
    KILN_ASSIGN_OR_RETURN(const float* scale, parameter(context, scale_, 0));
    KILN_ASSIGN_OR_RETURN(const float* bias, parameter(context, bias_, expandedBytes()));
    auto output = [&](size_t i) {
      return i < outputs.size() && outputs[i] ? context.data<float>(*outputs[i]) : nullptr;
    };
    KILN_CUDA_CHECK(launchRowNormalization(norm_, rowKernelFor(norm_.width),
                                           context.data<float>(*inputs[0]), scale, bias, output(0),
                                           output(1), output(2), context.stream));
    KILN_CUDA_CHECK_LAUNCH("the row normalisation");
    return Status::ok();
  }

 private:
  int64_t expandedBytes() const {
    const int64_t bytes = norm_.width * static_cast<int64_t>(sizeof(float));
    return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
  }

  // The parameter's values one per row element: the input itself, or its expansion into the
  // workspace at `workspaceOffset`; null when absent.
  Result<const float*> parameter(const Context& context, const RowParameter& p,
                                 int64_t workspaceOffset) const {
    if (p.input < 0) return static_cast<const float*>(nullptr);
    const std::byte* source = context.address(*inputs[static_cast<size_t>(p.input)]);
    if (!p.expand) return reinterpret_cast<const float*>(source);
    std::byte* target = context.workspace + workspaceOffset;
    KILN_CUDA_CHECK(launchStridedGather(*p.expand, source, target, sizeof(float), context.stream));
    KILN_CUDA_CHECK_LAUNCH("the normalisation parameter's expansion");
    return reinterpret_cast<const float*>(target);
  }

  RowNormalization norm_;
  RowParameter scale_;
  RowParameter bias_;
};

std::unique_ptr<Step> makeLayerNorm(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  if (!isFloat32(x) || !isFloat32(y) || x->shape != y->shape || !node.input(1)) return nullptr;
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  auto rawAxis = node.getInt("axis", -1);
  auto epsilon = node.getFloat("epsilon", 1e-5f);
  if (rank == 0 || !rawAxis.isOk() || !epsilon.isOk()) return nullptr;
  auto axis = ir::normalizeAxis(*rawAxis, rank);
  if (!axis.isOk()) return nullptr;
  const size_t a = static_cast<size_t>(*axis);
  RowNormalization norm;
  norm.rows = product(x->shape.dims(), 0, a);
  norm.width = product(x->shape.dims(), a, x->shape.rank());
  norm.epsilon = *epsilon;
  // Mean and InvStdDev, when asked for, must be float (stash_type 1) with one value per row.
  for (size_t i = 1; i < node.outputs.size(); ++i) {
    const ir::Value* stat = node.outputs[i];
    if (!stat) continue;
    if (i > 2 || !isFloat32(stat) || stat->shape.elementCount() != norm.rows) return nullptr;
    if (norm.width == 0 && norm.rows > 0) return nullptr;  // nothing to average
  }
  auto scale = rowParameter(node, 1, x->shape, a);
  auto bias = rowParameter(node, 2, x->shape, a);
  if (!scale || !bias) return nullptr;
  auto step = std::make_unique<RowNormStep>(norm, std::move(*scale), std::move(*bias));
  step->tactic = "kiln.layernorm";
  return step;
}

std::unique_ptr<Step> makeInstanceNorm(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const ir::Value* scale = node.input(1);
  const ir::Value* bias = node.input(2);
  if (!isFloat32(x) || !isFloat32(y) || !isFloat32(scale) || !isFloat32(bias)) return nullptr;
  auto epsilon = node.getFloat("epsilon", 1e-5f);
  if (x->shape.rank() < 2 || x->shape != y->shape || !epsilon.isOk()) return nullptr;
  const int64_t channels = x->shape[1];
  if (scale->shape.elementCount() != channels || bias->shape.elementCount() != channels) {
    return nullptr;
  }
  RowNormalization norm;
  norm.rows = x->shape[0] * channels;
  norm.width = product(x->shape.dims(), 2, x->shape.rank());
  norm.epsilon = *epsilon;
  norm.channels = std::max<int64_t>(channels, 1);
  auto step = std::make_unique<RowNormStep>(norm, RowParameter{1, std::nullopt},
                                            RowParameter{2, std::nullopt});
  step->tactic = "kiln.instancenorm";
  return step;
}

// --- BatchNormalization ------------------------------------------------------------------------

class BatchNormStep final : public Step {
 public:
  explicit BatchNormStep(BatchNormGeometry geometry) : geometry_(geometry) {}

  Status enqueue(const Context& context) const override {
    auto in = [&](size_t i) { return context.data<float>(*inputs[i]); };
    KILN_CUDA_CHECK(launchBatchNormalization(geometry_, in(0), in(1), in(2), in(3), in(4),
                                             context.data<float>(*outputs[0]), context.stream));
    KILN_CUDA_CHECK_LAUNCH("the batch normalisation");
    return Status::ok();
  }

 private:
  BatchNormGeometry geometry_;
};

std::unique_ptr<Step> makeBatchNorm(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  if (node.inputs.size() != 5 || !isFloat32(y) || x->shape.rank() < 2 || x->shape != y->shape) {
    return nullptr;
  }
  for (size_t i = 1; i < node.outputs.size(); ++i) {
    if (node.outputs[i]) return nullptr;  // training statistics
  }
  auto epsilon = node.getFloat("epsilon", 1e-5f);
  auto spatial = node.getInt("spatial", 1);
  auto training = node.getInt("training_mode", 0);
  if (!epsilon.isOk() || !spatial.isOk() || !training.isOk() || *training != 0) return nullptr;
  BatchNormGeometry geometry;
  geometry.count = x->shape.elementCount();
  geometry.channels = x->shape[1];
  geometry.inner = product(x->shape.dims(), 2, x->shape.rank());
  geometry.perElement = node.opsetVersion < 9 && *spatial == 0;
  geometry.epsilon = *epsilon;
  const int64_t parameters =
      geometry.perElement ? geometry.channels * geometry.inner : geometry.channels;
  for (size_t i = 0; i < 5; ++i) {
    const ir::Value* input = node.inputs[i];
    if (!isFloat32(input)) return nullptr;
    if (i > 0 && input->shape.elementCount() != parameters) return nullptr;
  }
  if (geometry.count > 0 && (geometry.channels <= 0 || geometry.inner <= 0)) return nullptr;
  auto step = std::make_unique<BatchNormStep>(geometry);
  step->tactic = "kiln.batchnorm";
  return step;
}

// --- MeanVarianceNormalization -----------------------------------------------------------------

class MeanVarianceStep final : public Step {
 public:
  explicit MeanVarianceStep(SlotGeometry geometry) : geometry_(geometry) {}

  Status enqueue(const Context& context) const override {
    KILN_CUDA_CHECK(launchMeanVarianceNormalization(geometry_, context.data<float>(*inputs[0]),
                                                    context.data<float>(*outputs[0]),
                                                    context.stream));
    KILN_CUDA_CHECK_LAUNCH("the mean-variance normalisation");
    return Status::ok();
  }

 private:
  SlotGeometry geometry_;
};

std::unique_ptr<Step> makeMeanVariance(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  if (!isFloat32(x) || !isFloat32(y) || x->shape != y->shape || rank > kMaxNormRank) {
    return nullptr;
  }
  auto axes = node.getInts("axes", {0, 2, 3});
  if (!axes.isOk()) return nullptr;
  std::set<int64_t> reduced;
  for (int64_t axis : *axes) {
    auto normalized = ir::normalizeAxis(axis, rank);
    if (!normalized.isOk()) return nullptr;
    reduced.insert(*normalized);
  }
  const std::vector<int64_t> strides = x->shape.strides();
  SlotGeometry geometry;
  for (int64_t a = 0; a < rank; ++a) {
    if (reduced.count(a)) {
      geometry.reducedDims[geometry.reducedRank] = x->shape[a];
      geometry.reducedStrides[geometry.reducedRank++] = strides[a];
    } else {
      geometry.keptDims[geometry.keptRank] = x->shape[a];
      geometry.keptStrides[geometry.keptRank++] = strides[a];
    }
  }
  auto step = std::make_unique<MeanVarianceStep>(geometry);
  step->tactic = "kiln.mvn";
  return step;
}

std::unique_ptr<Step> makeNormStep(const ir::Node& node, const knobs::Route& route) {
  if (!node.domain.empty() || node.inputs.empty() || !node.inputs[0]) return nullptr;
  if (node.outputs.empty() || !node.outputs[0]) return nullptr;
  const std::string& op = node.opType;
  if (op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") return makeSoftmax(node, route);
  if (op == "LpNormalization") return makeLpNormalization(node);
  if (op == "LayerNormalization") return makeLayerNorm(node);
  if (op == "InstanceNormalization") return makeInstanceNorm(node);
  if (op == "BatchNormalization") return makeBatchNorm(node);
  if (op == "MeanVarianceNormalization") return makeMeanVariance(node);
  return nullptr;
}

const int kRegistered = registerStepFactory(kRankNorm, "norm", makeNormStep);

}  // namespace
}  // namespace kiln::cuda
