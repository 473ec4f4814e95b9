// The CUDA backend's normalisation steps (norm.h's kernels): Softmax, LogSoftmax and Hardmax,
// LpNormalization, LayerNormalization (with its optional Mean and InvStdDev outputs),
// InstanceNormalization, inference BatchNormalization, MeanVarianceNormalization and LRN, in
// float32, float16 or bfloat16 (the reduced types where cuda.precision made the node reduced,
// with cuda.precision.norm_fp32 off, or where the node came so: every data tensor of the node
// has the one type, the math is float or double). Each factory reads the node's axis and shapes
// into the kernel's row or line geometry and refuses (nullptr: the host runs it) what it cannot
// compute as the reference does.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>

#include "kiln/backends/cuda/kernels/datamove.h"
#include "kiln/backends/cuda/kernels/element_type.h"
#include "kiln/backends/cuda/kernels/norm.h"
#include "kiln/backends/cuda/kernels/steps.h"
#include "kiln/ir/op_schema.h"

namespace kiln::cuda {

const knobs::Knob kSoftmaxRowKernel = knobs::declareKnob({
    .name = "cuda.softmax.row_kernel",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "warp", "block"},
    .defaultValue = "auto",
    .help = "Softmax, LogSoftmax and Hardmax over contiguous rows: one warp per row "
            "(cuda.softmax.warp_rows rows a block), one block per row (cuda.softmax.block_threads "
            "threads), or auto (a warp for rows of at most 1024 elements, a block for longer ones)",
    .backends = {"cuda"},
    // Only the order of the row's sums differs between the kernels: not a numerics change.
    .perNode = true,
});

const knobs::Knob kSoftmaxWarpRows = knobs::declareKnob({
    .name = "cuda.softmax.warp_rows",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"4", "2", "8"},
    .defaultValue = "4",
    .help = "rows a block of the warp-per-row softmax kernel takes (a warp each: 128-thread "
            "blocks for 4; fewer rows make more, smaller blocks)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kSoftmaxBlockThreads = knobs::declareKnob({
    .name = "cuda.softmax.block_threads",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"512", "128", "256"},
    .defaultValue = "512",
    .help = "threads of the block-per-row softmax kernel (long rows): more loads in flight a "
            "row, or more rows resident a multiprocessor",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kSoftmaxOnline = knobs::declareKnob({
    .name = "cuda.softmax.online",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "off",
    .help = "Softmax and LogSoftmax over contiguous rows: the row maximum and the sum of "
            "exponentials from one read (the sum rescaled whenever the maximum grows), then the "
            "outputs, instead of three reads (maximum, sum, outputs)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kNormRowKernel = knobs::declareKnob({
    .name = "cuda.norm.row_kernel",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"auto", "warp", "block"},
    .defaultValue = "auto",
    .help = "LayerNormalization, kiln.AddLayerNormalization and InstanceNormalization rows: one "
            "warp per row (float16 and bfloat16 rows of up to 1024 elements held in registers), "
            "one block per row, or auto (a warp for rows of at most 1024 elements, a block for "
            "longer ones)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kNormRegisterRows = knobs::declareKnob({
    .name = "cuda.norm.register_rows",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "float16 and bfloat16 LayerNormalization rows of up to 1024 elements on the warp "
            "kernel: held in registers as 16-byte vectors (read once, float statistics), or "
            "through the generic row kernel (read in each pass, double statistics)",
    .backends = {"cuda"},
    .perNode = true,
    .changesNumerics = true,
});

const knobs::Knob kNormWarpRows = knobs::declareKnob({
    .name = "cuda.norm.warp_rows",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"4", "2", "8"},
    .defaultValue = "4",
    .help = "rows a block of the warp-per-row normalisation kernels takes (a warp each)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kNormBlockThreads = knobs::declareKnob({
    .name = "cuda.norm.block_threads",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"512", "128", "256"},
    .defaultValue = "512",
    .help = "threads of the block-per-row normalisation kernel (long rows, and InstanceNorm's "
            "planes)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kSoftmaxWarpRowLimit = knobs::declareKnob({
    .name = "cuda.softmax.warp_row_limit",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"1024", "256", "4096"},
    .defaultValue = "1024",
    .help = "under cuda.softmax.row_kernel=auto, the longest row that takes a warp (longer rows "
            "take a block)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kNormWarpRowLimit = knobs::declareKnob({
    .name = "cuda.norm.warp_row_limit",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"1024", "256", "4096"},
    .defaultValue = "1024",
    .help = "under cuda.norm.row_kernel=auto, the longest normalisation row that takes a warp "
            "(longer rows take a block)",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kNormElementwiseBlock = knobs::declareKnob({
    .name = "cuda.norm.elementwise_block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of the normalisations computed a thread an element: a "
            "BatchNormalization left unfolded (no Conv before it) and LRN",
    .backends = {"cuda"},
    .perNode = true,
});

const knobs::Knob kSoftmaxStridedBlock = knobs::declareKnob({
    .name = "cuda.softmax.strided_block",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"256", "128", "512", "1024"},
    .defaultValue = "256",
    .help = "threads per block of the kernel that runs Softmax, LogSoftmax and Hardmax along an "
            "axis that is not the innermost (a segmentation head's softmax over NCHW channels): "
            "a thread a line, neighbouring threads on neighbouring lines",
    .backends = {"cuda"},
    .perNode = true,
});

namespace {

using ir::DType;

// Rows longer than this go to a block each rather than a warp (LpNormalization's lines; the
// softmax and normalisation rows take cuda.softmax.warp_row_limit and cuda.norm.warp_row_limit).
constexpr int64_t kWarpRowLimit = 1024;

// The kernels' element type for `value`'s dtype: float32, float16 or bfloat16.
std::optional<ElementType> typeOf(const ir::Value* value) {
  if (!value) return std::nullopt;
  return floatTypeOf(value->dtype);
}

bool isFloat32(const ir::Value* value) { return value && value->dtype == DType::kFloat32; }

// Whether `value` is present with the same dtype as `like`.
bool sameType(const ir::Value* value, const ir::Value* like) {
  return value && like && value->dtype == like->dtype;
}

RowKernel rowKernelFor(int64_t width, int64_t limit = kWarpRowLimit) {
  return width <= limit ? RowKernel::kWarp : RowKernel::kBlock;
}

// The row knobs of one family of steps (cuda.softmax.* or cuda.norm.*).
struct RowKnobs {
  const knobs::Knob& kernel;
  const knobs::Knob& warpRowLimit;
  const knobs::Knob& warpRows;
  const knobs::Knob& blockThreads;
};

const RowKnobs kSoftmaxRows{kSoftmaxRowKernel, kSoftmaxWarpRowLimit, kSoftmaxWarpRows,
                            kSoftmaxBlockThreads};
const RowKnobs kNormRows{kNormRowKernel, kNormWarpRowLimit, kNormWarpRows, kNormBlockThreads};

// The row launch for rows of `width` under `knobs`.
RowLaunch rowLaunchFor(int64_t width, const ir::Node& node, const knobs::Route& route,
                       const RowKnobs& knobs) {
  RowLaunch launch;
  const std::string& choice = route.value(knobs.kernel, &node);
  launch.kernel = choice == "warp" ? RowKernel::kWarp
                  : choice == "block"
                      ? RowKernel::kBlock
                      : rowKernelFor(width, std::stoll(route.value(knobs.warpRowLimit, &node)));
  launch.warpRows = std::stoi(route.value(knobs.warpRows, &node));
  launch.blockThreads = std::stoi(route.value(knobs.blockThreads, &node));
  return launch;
}

// How `rows` spreads contiguous rows, for detail().
std::string rowLaunchText(const RowLaunch& rows) {
  return rows.kernel == RowKernel::kWarp
             ? fmt::format("a warp a row, {} rows a block", rows.warpRows)
             : fmt::format("a {}-thread block a row", rows.blockThreads);
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
  LinesStep(SoftmaxKind kind, int p, Lines lines, RowLaunch rows, ElementType type)
      : kind_(kind), p_(p), lines_(lines), rows_(rows), type_(type) {}

  std::string detail() const override {
    if (lines_.inner > 1) {
      return fmt::format("strided lines, a thread a line, {}-thread blocks", rows_.linesThreads);
    }
    return rowLaunchText(rows_) + (rows_.onlineSoftmax ? ", online maximum and sum" : "");
  }

  Status enqueue(const Context& context) const override {
    const void* x = context.address(*inputs[0]);
    void* y = context.address(*outputs[0]);
    if (p_ == 0) {
      KILN_CUDA_CHECK(launchSoftmax(kind_, lines_, rows_, type_, x, y, context.stream));
    } else {
      KILN_CUDA_CHECK(launchLpNormalization(p_, lines_, rows_, type_, x, y, context.stream));
    }
    KILN_CUDA_CHECK_LAUNCH(p_ == 0 ? "the softmax" : "the Lp normalisation");
    return Status::ok();
  }

 private:
  SoftmaxKind kind_;
  int p_;
  Lines lines_;
  RowLaunch rows_;
  ElementType type_;
};

std::unique_ptr<Step> makeSoftmax(const ir::Node& node, const knobs::Route& route) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const std::optional<ElementType> type = typeOf(x);
  if (!type || !sameType(y, x) || x->shape != y->shape) return nullptr;
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
  RowLaunch rows = rowLaunchFor(lines.length, node, route, kSoftmaxRows);
  rows.onlineSoftmax = node.opType != "Hardmax" && route.value(kSoftmaxOnline, &node) == "on";
  rows.linesThreads = std::stoi(route.value(kSoftmaxStridedBlock, &node));
  const SoftmaxKind kind = node.opType == "Softmax"      ? SoftmaxKind::kSoftmax
                           : node.opType == "LogSoftmax" ? SoftmaxKind::kLogSoftmax
                                                         : SoftmaxKind::kHardmax;
  auto step = std::make_unique<LinesStep>(kind, 0, lines, rows, *type);
  // The kernel chosen is part of the tactic: strided lines, or a warp or a block per row.
  step->tactic = lines.inner > 1                   ? "kiln.softmax.strided"
                 : rows.kernel == RowKernel::kWarp ? "kiln.softmax.warp"
                                                   : "kiln.softmax.block";
  return step;
}

std::unique_ptr<Step> makeLpNormalization(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const std::optional<ElementType> type = typeOf(x);
  if (!type || !sameType(y, x) || x->shape != y->shape) return nullptr;
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  auto rawAxis = node.getInt("axis", -1);
  auto p = node.getInt("p", 2);
  if (rank == 0 || !rawAxis.isOk() || !p.isOk() || (*p != 1 && *p != 2)) return nullptr;
  auto axis = ir::normalizeAxis(*rawAxis, rank);
  if (!axis.isOk()) return nullptr;
  const Lines lines = linesAlong(x->shape, static_cast<size_t>(*axis));
  RowLaunch rows;
  rows.kernel = rowKernelFor(lines.length);
  auto step =
      std::make_unique<LinesStep>(SoftmaxKind::kSoftmax, static_cast<int>(*p), lines, rows, *type);
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

// How LayerNormalization's parameter `input` (broadcasting to `x`, of its type) covers the rows
// that start at `axis`: nullopt when it varies between rows, which the kernel does not do.
std::optional<RowParameter> rowParameter(const ir::Node& node, size_t input,
                                         const ir::Value& xValue, size_t axis) {
  const ir::Value* value = node.input(input);
  if (!value) return RowParameter{};
  const ir::Shape& x = xValue.shape;
  if (!sameType(value, &xValue) || value->shape.rank() > x.rank()) return std::nullopt;
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
  // With `skip`, kiln.AddLayerNormalization: input 3 is added to x first, and output 1 is the sum.
  RowNormStep(RowNormalization norm, RowLaunch rows, RowParameter scale, RowParameter bias,
              bool skip = false)
      : norm_(norm), rows_(rows), scale_(std::move(scale)), bias_(std::move(bias)), skip_(skip) {}

  std::string detail() const override {
    return rowLaunchText(rows_) + (rows_.registerRows ? "" : ", no register-held rows");
  }

  int64_t workspaceBytes() const override {
    return 2 * expandedBytes();  // the scale's and the bias's expanded rows, at most
  }

  Status enqueue(const Context& context) const override {
    KILN_ASSIGN_OR_RETURN(const void* scale, parameter(context, scale_, 0));
    KILN_ASSIGN_OR_RETURN(const void* bias, parameter(context, bias_, expandedBytes()));
    auto output = [&](size_t i) -> void* {
      return i < outputs.size() && outputs[i] ? context.address(*outputs[i]) : nullptr;
    };
    if (skip_) {
      KILN_CUDA_CHECK(launchRowNormalization(norm_, rows_, context.address(*inputs[0]), scale, bias,
                                             output(0), nullptr, nullptr, context.stream,
                                             context.address(*inputs[3]), output(1)));
    } else {
      KILN_CUDA_CHECK(launchRowNormalization(norm_, rows_, context.address(*inputs[0]), scale, bias,
                                             output(0), output(1), output(2), context.stream));
    }
    KILN_CUDA_CHECK_LAUNCH("the row normalisation");
    return Status::ok();
  }

 private:
  int64_t expandedBytes() const {
    const int64_t bytes = norm_.width * static_cast<int64_t>(elementBytes(norm_.type));
    return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
  }

  // The parameter's values one per row element: the input itself, or its expansion into the
  // workspace at `workspaceOffset`; null when absent.
  Result<const void*> parameter(const Context& context, const RowParameter& p,
                                int64_t workspaceOffset) const {
    if (p.input < 0) return static_cast<const void*>(nullptr);
    const std::byte* source = context.address(*inputs[static_cast<size_t>(p.input)]);
    if (!p.expand) return static_cast<const void*>(source);
    std::byte* target = context.workspace + workspaceOffset;
    KILN_CUDA_CHECK(
        launchStridedGather(*p.expand, source, target, elementBytes(norm_.type), context.stream));
    KILN_CUDA_CHECK_LAUNCH("the normalisation parameter's expansion");
    return static_cast<const void*>(target);
  }

  RowNormalization norm_;
  RowLaunch rows_;
  RowParameter scale_;
  RowParameter bias_;
  bool skip_;
};

// LayerNormalization, or with `skip` kiln.AddLayerNormalization (X + Skip normalised; output 1
// the sum instead of the Mean).
std::unique_ptr<Step> makeLayerNorm(const ir::Node& node, const knobs::Route& route, bool skip) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const std::optional<ElementType> type = typeOf(x);
  if (!type || !sameType(y, x) || x->shape != y->shape || !node.input(1)) return nullptr;
  if (skip) {
    const ir::Value* other = node.input(3);
    const ir::Value* sum = node.outputs.size() > 1 ? node.outputs[1] : nullptr;
    if (!other || !sameType(other, x) || other->shape != x->shape || node.outputs.size() > 2 ||
        (sum && (!sameType(sum, x) || sum->shape != x->shape))) {
      return nullptr;
    }
  }
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
  norm.type = *type;
  // Mean and InvStdDev, when asked for, must have one value per row, both of one type: float
  // (stash_type 1), or x's type (cuda.precision gives a reduced node reduced statistics too).
  std::optional<DType> statType;
  for (size_t i = 1; i < node.outputs.size() && !skip; ++i) {
    const ir::Value* stat = node.outputs[i];
    if (!stat) continue;
    if (i > 2 || stat->shape.elementCount() != norm.rows) return nullptr;
    if (!isFloat32(stat) && !sameType(stat, x)) return nullptr;
    if (statType && *statType != stat->dtype) return nullptr;
    statType = stat->dtype;
    if (norm.width == 0 && norm.rows > 0) return nullptr;  // nothing to average
  }
  norm.statType = statType && *statType != DType::kFloat32 ? *type : ElementType::kFloat32;
  auto scale = rowParameter(node, 1, *x, a);
  auto bias = rowParameter(node, 2, *x, a);
  if (!scale || !bias) return nullptr;
  RowLaunch rows = rowLaunchFor(norm.width, node, route, kNormRows);
  rows.registerRows = route.value(kNormRegisterRows, &node) == "on";
  auto step = std::make_unique<RowNormStep>(norm, rows, std::move(*scale), std::move(*bias), skip);
  step->tactic = skip ? "kiln.add_layernorm" : "kiln.layernorm";
  return step;
}

std::unique_ptr<Step> makeInstanceNorm(const ir::Node& node, const knobs::Route& route) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const ir::Value* scale = node.input(1);
  const ir::Value* bias = node.input(2);
  const std::optional<ElementType> type = typeOf(x);
  if (!type || !sameType(y, x) || !sameType(scale, x) || !sameType(bias, x)) return nullptr;
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
  norm.type = *type;
  auto step =
      std::make_unique<RowNormStep>(norm, rowLaunchFor(norm.width, node, route, kNormRows),
                                    RowParameter{1, std::nullopt}, RowParameter{2, std::nullopt});
  step->tactic = "kiln.instancenorm";
  return step;
}

// --- BatchNormalization ------------------------------------------------------------------------

class BatchNormStep final : public Step {
 public:
  explicit BatchNormStep(BatchNormGeometry geometry) : geometry_(geometry) {}

  std::string detail() const override {
    return fmt::format("a thread an element, {}-thread blocks", geometry_.blockThreads);
  }

  Status enqueue(const Context& context) const override {
    auto in = [&](size_t i) -> const void* { return context.address(*inputs[i]); };
    KILN_CUDA_CHECK(launchBatchNormalization(geometry_, in(0), in(1), in(2), in(3), in(4),
                                             context.address(*outputs[0]), context.stream));
    KILN_CUDA_CHECK_LAUNCH("the batch normalisation");
    return Status::ok();
  }

 private:
  BatchNormGeometry geometry_;
};

std::unique_ptr<Step> makeBatchNorm(const ir::Node& node, int blockThreads) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const std::optional<ElementType> type = typeOf(y);
  if (node.inputs.size() != 5 || !type || x->shape.rank() < 2 || x->shape != y->shape) {
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
  geometry.type = *type;
  const int64_t parameters =
      geometry.perElement ? geometry.channels * geometry.inner : geometry.channels;
  for (size_t i = 0; i < 5; ++i) {
    const ir::Value* input = node.inputs[i];
    if (!sameType(input, y)) return nullptr;
    if (i > 0 && input->shape.elementCount() != parameters) return nullptr;
  }
  if (geometry.count > 0 && (geometry.channels <= 0 || geometry.inner <= 0)) return nullptr;
  geometry.blockThreads = blockThreads;
  auto step = std::make_unique<BatchNormStep>(geometry);
  step->tactic = "kiln.batchnorm";
  return step;
}

// --- MeanVarianceNormalization -----------------------------------------------------------------

class MeanVarianceStep final : public Step {
 public:
  MeanVarianceStep(SlotGeometry geometry, ElementType type) : geometry_(geometry), type_(type) {}

  Status enqueue(const Context& context) const override {
    KILN_CUDA_CHECK(launchMeanVarianceNormalization(geometry_, type_, context.address(*inputs[0]),
                                                    context.address(*outputs[0]), context.stream));
    KILN_CUDA_CHECK_LAUNCH("the mean-variance normalisation");
    return Status::ok();
  }

 private:
  SlotGeometry geometry_;
  ElementType type_;
};

std::unique_ptr<Step> makeMeanVariance(const ir::Node& node) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const int64_t rank = static_cast<int64_t>(x->shape.rank());
  const std::optional<ElementType> type = typeOf(x);
  if (!type || !sameType(y, x) || x->shape != y->shape || rank > kMaxNormRank) return nullptr;
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
  auto step = std::make_unique<MeanVarianceStep>(geometry, *type);
  step->tactic = "kiln.mvn";
  return step;
}

// --- LRN ---------------------------------------------------------------------------------------

class LrnStep final : public Step {
 public:
  explicit LrnStep(LrnGeometry geometry) : geometry_(geometry) {}

  std::string detail() const override {
    return fmt::format("a thread an element, {}-thread blocks", geometry_.blockThreads);
  }

  Status enqueue(const Context& context) const override {
    KILN_CUDA_CHECK(launchLrn(geometry_, context.address(*inputs[0]), context.address(*outputs[0]),
                              context.stream));
    KILN_CUDA_CHECK_LAUNCH("the local response normalisation");
    return Status::ok();
  }

 private:
  LrnGeometry geometry_;
};

std::unique_ptr<Step> makeLrn(const ir::Node& node, int blockThreads) {
  const ir::Value* x = node.inputs[0];
  const ir::Value* y = node.outputs[0];
  const std::optional<ElementType> type = typeOf(x);
  if (!type || !sameType(y, x) || x->shape != y->shape || x->shape.rank() < 3) return nullptr;
  // The reference's defaults (the schema requires size).
  auto size = node.getInt("size", 1);
  auto alpha = node.getFloat("alpha", 1e-4f);
  auto beta = node.getFloat("beta", 0.75f);
  auto bias = node.getFloat("bias", 1.0f);
  if (!size.isOk() || !alpha.isOk() || !beta.isOk() || !bias.isOk() || *size < 1) return nullptr;
  LrnGeometry geometry;
  geometry.batch = x->shape[0];
  geometry.channels = x->shape[1];
  geometry.inner = product(x->shape.dims(), 2, x->shape.rank());
  geometry.size = *size;
  geometry.alpha = *alpha;
  geometry.beta = *beta;
  geometry.bias = *bias;
  geometry.type = *type;
  geometry.blockThreads = blockThreads;
  auto step = std::make_unique<LrnStep>(geometry);
  step->tactic = "kiln.lrn";
  return step;
}

std::unique_ptr<Step> makeNormStep(const ir::Node& node, const knobs::Route& route) {
  if (node.inputs.empty() || !node.inputs[0] || node.outputs.empty() || !node.outputs[0]) {
    return nullptr;
  }
  if (node.domain == ir::kKilnDomain && node.opType == "AddLayerNormalization") {
    return makeLayerNorm(node, route, true);
  }
  if (!node.domain.empty()) return nullptr;
  const std::string& op = node.opType;
  if (op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") return makeSoftmax(node, route);
  if (op == "LpNormalization") return makeLpNormalization(node);
  if (op == "LayerNormalization") return makeLayerNorm(node, route, false);
  if (op == "InstanceNormalization") return makeInstanceNorm(node, route);
  if (op == "BatchNormalization") {
    return makeBatchNorm(node, std::stoi(route.value(kNormElementwiseBlock, &node)));
  }
  if (op == "MeanVarianceNormalization") return makeMeanVariance(node);
  if (op == "LRN") return makeLrn(node, std::stoi(route.value(kNormElementwiseBlock, &node)));
  return nullptr;
}

const int kRegistered = registerStepFactory(kRankNorm, "norm", makeNormStep);

}  // namespace
}  // namespace kiln::cuda
