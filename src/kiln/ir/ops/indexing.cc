// Shape inference for the indexing ops: Gather/Scatter families, Pad, Resize/Upsample, Trilu,
// OneHot, DepthToSpace and SpaceToDepth.
#include <cmath>
#include <set>

#include "kiln/ir/op_schema.h"

namespace kiln::ir {

namespace {

bool isIndexType(DType dtype) { return dtype == DType::kInt64 || dtype == DType::kInt32; }

Status requireIndexType(const InferContext& ctx, size_t input, const char* role) {
  if (!isIndexType(ctx.inputType(input))) {
    return ctx.error("{} must be int32 or int64, got {}", role, dtypeName(ctx.inputType(input)));
  }
  return Status::ok();
}

// The attribute `axis` normalised against `rank`, or an error naming the attribute.
Result<int64_t> axisAttribute(const InferContext& ctx, int64_t defaultValue, int64_t rank) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.node().getInt("axis", defaultValue));
  if (axis < -rank || axis >= rank) {
    return ctx.error("axis {} is out of range for an input of rank {}", axis, rank);
  }
  return axis < 0 ? axis + rank : axis;
}

// A 1-D shape-determining input (pads, sizes, axes, ...) as integers.
Result<std::vector<int64_t>> constantInts(const InferContext& ctx, size_t input, const char* role) {
  KILN_ASSIGN_OR_RETURN(const Tensor* value, ctx.requireConstantInput(input, role));
  if (!isIndexType(value->dtype())) {
    return ctx.error("{} must be int32 or int64, got {}", role, dtypeName(value->dtype()));
  }
  if (value->rank() != 1) {
    return ctx.error("{} must be 1-D, got shape {}", role, value->shape().toString());
  }
  return value->toInt64Vector();
}

// --- Gather family ---------------------------------------------------------------------------

Status inferGather(InferContext& ctx) {
  const Shape& data = ctx.inputShape(0);
  if (data.rank() == 0) return ctx.error("data must have rank >= 1, got a scalar");
  KILN_ASSIGN_OR_RETURN(int64_t axis, axisAttribute(ctx, 0, ctx.inputRank(0)));
  KILN_RETURN_IF_ERROR(requireIndexType(ctx, 1, "indices"));
  std::vector<int64_t> dims(data.dims().begin(), data.dims().begin() + axis);
  for (int64_t dim : ctx.inputShape(1).dims()) dims.push_back(dim);
  for (size_t i = axis + 1; i < data.rank(); ++i) dims.push_back(data[i]);
  ctx.setOutput(0, ctx.inputType(0), Shape(std::move(dims)));
  return Status::ok();
}

// GatherElements and ScatterElements index `data` with a same-rank `indices` tensor: off the
// axis, every index position must exist in data.
Status checkElementwiseIndices(const InferContext& ctx, int64_t axis) {
  const Shape& data = ctx.inputShape(0);
  const Shape& indices = ctx.inputShape(1);
  if (data.rank() == 0) return ctx.error("data must have rank >= 1, got a scalar");
  if (indices.rank() != data.rank()) {
    return ctx.error("indices {} must have the rank of data {}", indices.toString(),
                     data.toString());
  }
  for (size_t i = 0; i < data.rank(); ++i) {
    if (static_cast<int64_t>(i) != axis && indices[i] > data[i]) {
      return ctx.error("indices {} is larger than data {} along axis {}", indices.toString(),
                       data.toString(), i);
    }
  }
  return requireIndexType(ctx, 1, "indices");
}

Status inferGatherElements(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, axisAttribute(ctx, 0, ctx.inputRank(0)));
  KILN_RETURN_IF_ERROR(checkElementwiseIndices(ctx, axis));
  ctx.setOutput(0, ctx.inputType(0), ctx.inputShape(1));
  return Status::ok();
}

Status inferGatherND(InferContext& ctx) {
  const Shape& data = ctx.inputShape(0);
  const Shape& indices = ctx.inputShape(1);
  KILN_RETURN_IF_ERROR(requireIndexType(ctx, 1, "indices"));
  if (data.rank() == 0 || indices.rank() == 0) {
    return ctx.error("data {} and indices {} must both have rank >= 1", data.toString(),
                     indices.toString());
  }
  KILN_ASSIGN_OR_RETURN(int64_t batchDims, ctx.node().getInt("batch_dims", 0));
  if (batchDims != 0 && ctx.opset() < 12) {
    return ctx.error("batch_dims needs opset 12 or later");
  }
  const int64_t r = data.rank();
  const int64_t q = indices.rank();
  if (batchDims < 0 || batchDims >= std::min(r, q)) {
    return ctx.error("batch_dims {} must be in [0, {}) for data {} and indices {}", batchDims,
                     std::min(r, q), data.toString(), indices.toString());
  }
  for (int64_t i = 0; i < batchDims; ++i) {
    if (data[i] != indices[i]) {
      return ctx.error("batch dimension {} differs: data {} vs indices {}", i, data.toString(),
                       indices.toString());
    }
  }
  const int64_t k = indices[q - 1];
  if (k < 1 || k > r - batchDims) {
    return ctx.error("the last dimension of indices {} must be in [1, {}] for data {}",
                     indices.toString(), r - batchDims, data.toString());
  }
  std::vector<int64_t> dims(indices.dims().begin(), indices.dims().end() - 1);
  for (int64_t i = batchDims + k; i < r; ++i) dims.push_back(data[i]);
  ctx.setOutput(0, ctx.inputType(0), Shape(std::move(dims)));
  return Status::ok();
}

// --- Scatter family --------------------------------------------------------------------------

// The `reduction` attribute, checked against the opset that introduced each value.
Status checkReduction(const InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string reduction, ctx.node().getString("reduction", "none"));
  if (reduction == "none") return Status::ok();
  if (reduction == "add" || reduction == "mul") {
    if (ctx.opset() < 16) return ctx.error("reduction '{}' needs opset 16 or later", reduction);
  } else if (reduction == "max" || reduction == "min") {
    if (ctx.opset() < 18) return ctx.error("reduction '{}' needs opset 18 or later", reduction);
  } else {
    return ctx.error("unknown reduction '{}' (expected none, add, mul, max or min)", reduction);
  }
  return Status::ok();
}

Status inferScatterElements(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t axis, axisAttribute(ctx, 0, ctx.inputRank(0)));
  KILN_RETURN_IF_ERROR(checkElementwiseIndices(ctx, axis));
  if (ctx.inputShape(2) != ctx.inputShape(1)) {
    return ctx.error("updates {} must have the shape of indices {}", ctx.inputShape(2).toString(),
                     ctx.inputShape(1).toString());
  }
  if (ctx.inputType(2) != ctx.inputType(0)) {
    return ctx.error("updates ({}) must have the element type of data ({})",
                     dtypeName(ctx.inputType(2)), dtypeName(ctx.inputType(0)));
  }
  KILN_RETURN_IF_ERROR(checkReduction(ctx));
  ctx.setOutput(0, ctx.inputType(0), ctx.inputShape(0));
  return Status::ok();
}

Status inferScatter(InferContext& ctx) {
  if (ctx.opset() >= 11) {
    return ctx.error("Scatter was replaced by ScatterElements at opset 11");
  }
  return inferScatterElements(ctx);
}

Status inferScatterND(InferContext& ctx) {
  const Shape& data = ctx.inputShape(0);
  const Shape& indices = ctx.inputShape(1);
  const Shape& updates = ctx.inputShape(2);
  KILN_RETURN_IF_ERROR(requireIndexType(ctx, 1, "indices"));
  if (data.rank() == 0 || indices.rank() == 0) {
    return ctx.error("data {} and indices {} must both have rank >= 1", data.toString(),
                     indices.toString());
  }
  const int64_t k = indices[indices.rank() - 1];
  if (k < 1 || k > static_cast<int64_t>(data.rank())) {
    return ctx.error("the last dimension of indices {} must be in [1, {}] for data {}",
                     indices.toString(), data.rank(), data.toString());
  }
  std::vector<int64_t> expected(indices.dims().begin(), indices.dims().end() - 1);
  for (size_t i = k; i < data.rank(); ++i) expected.push_back(data[i]);
  if (updates != Shape(expected)) {
    return ctx.error("updates {} must have shape {} (indices {} into data {})", updates.toString(),
                     Shape(expected).toString(), indices.toString(), data.toString());
  }
  if (ctx.inputType(2) != ctx.inputType(0)) {
    return ctx.error("updates ({}) must have the element type of data ({})",
                     dtypeName(ctx.inputType(2)), dtypeName(ctx.inputType(0)));
  }
  KILN_RETURN_IF_ERROR(checkReduction(ctx));
  ctx.setOutput(0, ctx.inputType(0), data);
  return Status::ok();
}

// --- Pad -------------------------------------------------------------------------------------

Status checkPadMode(const InferContext& ctx, const std::string& mode) {
  if (mode == "constant" || mode == "reflect" || mode == "edge") return Status::ok();
  if (mode == "wrap") {
    if (ctx.opset() < 19) return ctx.error("mode 'wrap' needs opset 19 or later");
    return Status::ok();
  }
  return ctx.error("unknown mode '{}' (expected constant, reflect, edge or wrap)", mode);
}

// Pads as [begin_0, ..., begin_{r-1}, end_0, ..., end_{r-1}] over all axes of the data: from the
// attribute before opset 11, from inputs (pads, and axes from opset 18) after.
Result<std::vector<int64_t>> fullPads(const InferContext& ctx) {
  const int64_t rank = ctx.inputRank(0);
  if (ctx.opset() < 11) {
    if (ctx.inputCount() != 1) return ctx.error("takes pads as an attribute before opset 11");
    const char* name = ctx.node().hasAttribute("paddings") ? "paddings" : "pads";
    KILN_RETURN_IF_ERROR(ctx.node().requireAttribute(name));
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> pads, ctx.node().getInts(name));
    if (static_cast<int64_t>(pads.size()) != 2 * rank) {
      return ctx.error("{} has {} values, expected {} (twice the rank of data {})", name,
                       pads.size(), 2 * rank, ctx.inputShape(0).toString());
    }
    return pads;
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> pads, constantInts(ctx, 1, "pads"));
  std::vector<int64_t> axes;
  if (ctx.hasInput(3)) {
    if (ctx.opset() < 18) return ctx.error("the axes input needs opset 18 or later");
    KILN_ASSIGN_OR_RETURN(axes, constantInts(ctx, 3, "axes"));
  } else {
    for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  }
  const int64_t count = static_cast<int64_t>(axes.size());
  if (static_cast<int64_t>(pads.size()) != 2 * count) {
    return ctx.error("pads has {} values, expected {} (twice the number of padded axes)",
                     pads.size(), 2 * count);
  }
  std::vector<int64_t> full(2 * rank, 0);
  std::set<int64_t> seen;
  for (int64_t i = 0; i < count; ++i) {
    if (axes[i] < -rank || axes[i] >= rank) {
      return ctx.error("axes value {} is out of range for data of rank {}", axes[i], rank);
    }
    const int64_t axis = axes[i] < 0 ? axes[i] + rank : axes[i];
    if (!seen.insert(axis).second) return ctx.error("axis {} appears twice in axes", axis);
    full[axis] = pads[i];
    full[axis + rank] = pads[i + count];
  }
  return full;
}

Status inferPad(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string mode, ctx.node().getString("mode", "constant"));
  KILN_RETURN_IF_ERROR(checkPadMode(ctx, mode));
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> pads, fullPads(ctx));
  if (ctx.opset() >= 11 && ctx.hasInput(2)) {
    if (ctx.inputType(2) != ctx.inputType(0)) {
      return ctx.error("constant_value ({}) must have the element type of data ({})",
                       dtypeName(ctx.inputType(2)), dtypeName(ctx.inputType(0)));
    }
    if (ctx.inputShape(2).elementCount() > 1) {
      return ctx.error("constant_value must be a scalar, got shape {}",
                       ctx.inputShape(2).toString());
    }
  }
  const Shape& data = ctx.inputShape(0);
  const size_t rank = data.rank();
  std::vector<int64_t> dims(rank);
  for (size_t i = 0; i < rank; ++i) {
    dims[i] = data[i] + pads[i] + pads[i + rank];
    if (dims[i] < 0) {
      return ctx.error("pads {} and {} make axis {} of data {} negative", pads[i], pads[i + rank],
                       i, data.toString());
    }
    // After cropping by negative pads, a non-constant mode needs some data to copy from.
    const int64_t kept =
        data[i] - std::max<int64_t>(0, -pads[i]) - std::max<int64_t>(0, -pads[i + rank]);
    if (mode != "constant" && kept <= 0 && dims[i] > 0) {
      return ctx.error("mode '{}' cannot pad axis {}: no data is left to copy from", mode, i);
    }
  }
  ctx.setOutput(0, ctx.inputType(0), Shape(std::move(dims)));
  return Status::ok();
}

// --- Resize and Upsample ---------------------------------------------------------------------

Status checkResizeModes(const InferContext& ctx) {
  const Node& node = ctx.node();
  KILN_ASSIGN_OR_RETURN(std::string mode, node.getString("mode", "nearest"));
  const bool legacy = ctx.node().opType == "Upsample" || ctx.opset() < 11;
  // Upsample-1 called linear "bilinear"; cubic arrived with opset-11 Resize.
  const bool knownMode = mode == "nearest" || mode == "linear" || (mode == "cubic" && !legacy) ||
                         (mode == "bilinear" && node.opType == "Upsample");
  if (!knownMode) {
    return ctx.error("unknown mode '{}' (expected nearest, linear{})", mode,
                     legacy ? "" : " or cubic");
  }
  if (legacy) return Status::ok();
  KILN_ASSIGN_OR_RETURN(std::string transform,
                        node.getString("coordinate_transformation_mode", "half_pixel"));
  static const std::set<std::string> kTransforms = {
      "half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"};
  const bool known = kTransforms.count(transform) > 0 ||
                     (transform == "tf_half_pixel_for_nn" && ctx.opset() < 13) ||
                     (transform == "half_pixel_symmetric" && ctx.opset() >= 19);
  if (!known) {
    return ctx.error("coordinate_transformation_mode '{}' is not defined at opset {}", transform,
                     ctx.opset());
  }
  KILN_ASSIGN_OR_RETURN(std::string nearest, node.getString("nearest_mode", "round_prefer_floor"));
  if (nearest != "round_prefer_floor" && nearest != "round_prefer_ceil" && nearest != "floor" &&
      nearest != "ceil") {
    return ctx.error("unknown nearest_mode '{}'", nearest);
  }
  if (ctx.opset() >= 18) {
    KILN_ASSIGN_OR_RETURN(std::string policy,
                          node.getString("keep_aspect_ratio_policy", "stretch"));
    if (policy != "stretch" && policy != "not_larger" && policy != "not_smaller") {
      return ctx.error("unknown keep_aspect_ratio_policy '{}'", policy);
    }
  }
  return Status::ok();
}

// The axes `roi`, `scales` and `sizes` refer to: the attribute from opset 18, else all.
Result<std::vector<int64_t>> resizeAxes(const InferContext& ctx) {
  const int64_t rank = ctx.inputRank(0);
  std::vector<int64_t> axes;
  if (ctx.opset() >= 18 && ctx.node().hasAttribute("axes")) {
    KILN_ASSIGN_OR_RETURN(axes, ctx.node().getInts("axes"));
    std::set<int64_t> seen;
    for (int64_t& axis : axes) {
      if (axis < -rank || axis >= rank) {
        return ctx.error("axes value {} is out of range for X of rank {}", axis, rank);
      }
      if (axis < 0) axis += rank;
      if (!seen.insert(axis).second) return ctx.error("axis {} appears twice in axes", axis);
    }
    return axes;
  }
  for (int64_t i = 0; i < rank; ++i) axes.push_back(i);
  return axes;
}

Status checkScales(const InferContext& ctx, const std::vector<float>& scales, size_t count) {
  if (scales.size() != count) {
    return ctx.error("scales has {} values, expected {}", scales.size(), count);
  }
  for (float scale : scales) {
    if (!(scale > 0) || !std::isfinite(scale)) {
      return ctx.error("scales must be positive and finite, got {}", scale);
    }
  }
  return Status::ok();
}

Result<std::vector<float>> constantScales(const InferContext& ctx, size_t input, size_t count) {
  KILN_ASSIGN_OR_RETURN(const Tensor* scales, ctx.requireConstantInput(input, "scales"));
  if (scales->dtype() != DType::kFloat32 || scales->rank() != 1) {
    return ctx.error("scales must be a 1-D float tensor, got {} {}", dtypeName(scales->dtype()),
                     scales->shape().toString());
  }
  std::vector<float> values(scales->data<float>().begin(), scales->data<float>().end());
  KILN_RETURN_IF_ERROR(checkScales(ctx, values, count));
  return values;
}

// floor(input * scale) per axis, as the ONNX reference computes it (in double).
Result<Shape> scaledShape(const InferContext& ctx, const Shape& input,
                          const std::vector<int64_t>& axes, const std::vector<float>& scales) {
  Shape output = input;
  for (size_t i = 0; i < axes.size(); ++i) {
    const double size = std::floor(static_cast<double>(scales[i]) * input[axes[i]]);
    if (size > static_cast<double>(kMaxTensorElements)) {
      return ctx.error("scale {} makes axis {} too large", scales[i], axes[i]);
    }
    output[axes[i]] = static_cast<int64_t>(size);
  }
  return output;
}

Result<Shape> sizedShape(const InferContext& ctx, const Shape& input,
                         const std::vector<int64_t>& axes, const std::vector<int64_t>& sizes) {
  if (sizes.size() != axes.size()) {
    return ctx.error("sizes has {} values, expected {}", sizes.size(), axes.size());
  }
  Shape output = input;
  for (size_t i = 0; i < axes.size(); ++i) {
    if (sizes[i] <= 0) return ctx.error("sizes must be positive, got {}", sizes[i]);
    if (input[axes[i]] == 0) return ctx.error("cannot resize axis {} of size 0", axes[i]);
    output[axes[i]] = sizes[i];
  }
  KILN_ASSIGN_OR_RETURN(std::string policy,
                        ctx.node().getString("keep_aspect_ratio_policy", "stretch"));
  if (ctx.opset() < 18 || policy == "stretch") return output;
  // One scale for all resized axes, the smallest (not_larger) or largest (not_smaller) ratio;
  // sizes are then rounded half up from it.
  double scale = static_cast<double>(sizes[0]) / input[axes[0]];
  for (size_t i = 1; i < axes.size(); ++i) {
    const double ratio = static_cast<double>(sizes[i]) / input[axes[i]];
    scale = policy == "not_larger" ? std::min(scale, ratio) : std::max(scale, ratio);
  }
  for (int64_t axis : axes) {
    output[axis] = static_cast<int64_t>(scale * input[axis] + 0.5);
  }
  return output;
}

Status inferResize(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkResizeModes(ctx));
  const Shape& input = ctx.inputShape(0);
  if (ctx.opset() < 11) {
    if (ctx.inputCount() != 2) return ctx.error("expects inputs X and scales before opset 11");
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, resizeAxes(ctx));
    KILN_ASSIGN_OR_RETURN(auto values, constantScales(ctx, 1, input.rank()));
    KILN_ASSIGN_OR_RETURN(Shape output, scaledShape(ctx, input, axes, values));
    ctx.setOutput(0, ctx.inputType(0), std::move(output));
    return Status::ok();
  }
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, resizeAxes(ctx));
  // An empty tensor stands for an omitted scales or sizes (opset 11 requires the scales input).
  auto given = [&](size_t i) { return ctx.hasInput(i) && ctx.inputShape(i).elementCount() > 0; };
  if (given(2) && given(3)) return ctx.error("only one of scales and sizes may be given");
  Shape output;
  if (given(2)) {
    KILN_ASSIGN_OR_RETURN(auto values, constantScales(ctx, 2, axes.size()));
    KILN_ASSIGN_OR_RETURN(output, scaledShape(ctx, input, axes, values));
  } else if (given(3)) {
    KILN_ASSIGN_OR_RETURN(std::vector<int64_t> sizes, constantInts(ctx, 3, "sizes"));
    KILN_ASSIGN_OR_RETURN(output, sizedShape(ctx, input, axes, sizes));
  } else {
    return ctx.error("one of scales and sizes must be given");
  }
  KILN_ASSIGN_OR_RETURN(std::string transform,
                        ctx.node().getString("coordinate_transformation_mode", "half_pixel"));
  if (transform == "tf_crop_and_resize") {
    if (!given(1)) return ctx.error("coordinate_transformation_mode tf_crop_and_resize needs roi");
    if (ctx.inputShape(1).elementCount() != static_cast<int64_t>(2 * axes.size())) {
      return ctx.error("roi has {} values, expected {}", ctx.inputShape(1).elementCount(),
                       2 * axes.size());
    }
  }
  ctx.setOutput(0, ctx.inputType(0), std::move(output));
  return Status::ok();
}

Status inferUpsample(InferContext& ctx) {
  if (ctx.opset() >= 10) return ctx.error("Upsample was replaced by Resize at opset 10");
  KILN_RETURN_IF_ERROR(checkResizeModes(ctx));
  const Shape& input = ctx.inputShape(0);
  std::vector<float> values;
  if (ctx.opset() < 9) {
    if (ctx.inputCount() != 1) return ctx.error("takes scales as an attribute before opset 9");
    KILN_RETURN_IF_ERROR(ctx.node().requireAttribute("scales"));
    KILN_ASSIGN_OR_RETURN(values, ctx.node().getFloats("scales"));
    KILN_RETURN_IF_ERROR(checkScales(ctx, values, input.rank()));
  } else {
    if (ctx.inputCount() != 2) return ctx.error("expects inputs X and scales from opset 9");
    KILN_ASSIGN_OR_RETURN(values, constantScales(ctx, 1, input.rank()));
  }
  std::vector<int64_t> axes;
  for (size_t i = 0; i < input.rank(); ++i) axes.push_back(static_cast<int64_t>(i));
  KILN_ASSIGN_OR_RETURN(Shape output, scaledShape(ctx, input, axes, values));
  ctx.setOutput(0, ctx.inputType(0), std::move(output));
  return Status::ok();
}

// --- Trilu, OneHot, DepthToSpace, SpaceToDepth ------------------------------------------------

Status inferTrilu(InferContext& ctx) {
  if (ctx.inputRank(0) < 2) {
    return ctx.error("input must have rank >= 2, got {}", ctx.inputShape(0).toString());
  }
  if (ctx.hasInput(1)) {
    if (ctx.inputType(1) != DType::kInt64 || ctx.inputShape(1).elementCount() != 1) {
      return ctx.error("k must be an int64 scalar, got {} {}", dtypeName(ctx.inputType(1)),
                       ctx.inputShape(1).toString());
    }
  }
  ctx.setOutput(0, ctx.inputType(0), ctx.inputShape(0));
  return Status::ok();
}

Status inferOneHot(InferContext& ctx) {
  if (ctx.inputType(0) == DType::kBool || ctx.inputType(1) == DType::kBool) {
    return ctx.error("indices and depth must be numeric, not bool");
  }
  KILN_ASSIGN_OR_RETURN(const Tensor* depthTensor, ctx.requireConstantInput(1, "depth"));
  if (depthTensor->elementCount() != 1 || depthTensor->rank() > 1) {
    return ctx.error("depth must be a scalar or a 1-element tensor, got shape {}",
                     depthTensor->shape().toString());
  }
  const int64_t depth = depthTensor->elementAsInt64(0);
  if (depth <= 0) return ctx.error("depth must be positive, got {}", depth);
  if (ctx.inputShape(2) != Shape{2}) {
    return ctx.error("values must have shape [2] (off, on), got {}", ctx.inputShape(2).toString());
  }
  const Shape& indices = ctx.inputShape(0);
  const int64_t outRank = ctx.inputRank(0) + 1;
  KILN_ASSIGN_OR_RETURN(int64_t axis, axisAttribute(ctx, -1, outRank));
  std::vector<int64_t> dims = indices.dims();
  dims.insert(dims.begin() + axis, depth);
  ctx.setOutput(0, ctx.inputType(2), Shape(std::move(dims)));
  return Status::ok();
}

Result<int64_t> blockSize(const InferContext& ctx) {
  KILN_RETURN_IF_ERROR(ctx.node().requireAttribute("blocksize"));
  KILN_ASSIGN_OR_RETURN(int64_t size, ctx.node().getInt("blocksize", 0));
  if (size <= 0) return ctx.error("blocksize must be positive, got {}", size);
  if (ctx.inputRank(0) != 4) {
    return ctx.error("input must have rank 4 (N, C, H, W), got {}", ctx.inputShape(0).toString());
  }
  return size;
}

Status inferDepthToSpace(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t block, blockSize(ctx));
  KILN_ASSIGN_OR_RETURN(std::string mode, ctx.node().getString("mode", "DCR"));
  if (mode != "DCR" && mode != "CRD") {
    return ctx.error("unknown mode '{}' (expected DCR or CRD)", mode);
  }
  const Shape& x = ctx.inputShape(0);
  if (x[1] % (block * block) != 0) {
    return ctx.error("channels {} are not divisible by blocksize^2 = {}", x[1], block * block);
  }
  ctx.setOutput(0, ctx.inputType(0),
                Shape{x[0], x[1] / (block * block), x[2] * block, x[3] * block});
  return Status::ok();
}

Status inferSpaceToDepth(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(int64_t block, blockSize(ctx));
  const Shape& x = ctx.inputShape(0);
  if (x[2] % block != 0 || x[3] % block != 0) {
    return ctx.error("height {} and width {} must be divisible by blocksize {}", x[2], x[3], block);
  }
  ctx.setOutput(0, ctx.inputType(0), Shape{x[0], x[1] * block * block, x[2] / block, x[3] / block});
  return Status::ok();
}

}  // namespace

void registerIndexingSchemas(OpRegistry& registry) {
  registry.add({.opType = "Gather", .minInputs = 2, .maxInputs = 2, .infer = inferGather});
  registry.add(
      {.opType = "GatherElements", .minInputs = 2, .maxInputs = 2, .infer = inferGatherElements});
  registry.add({.opType = "GatherND", .minInputs = 2, .maxInputs = 2, .infer = inferGatherND});
  registry.add({.opType = "ScatterND", .minInputs = 3, .maxInputs = 3, .infer = inferScatterND});
  registry.add(
      {.opType = "ScatterElements", .minInputs = 3, .maxInputs = 3, .infer = inferScatterElements});
  registry.add({.opType = "Scatter", .minInputs = 3, .maxInputs = 3, .infer = inferScatter});
  registry.add(
      {.opType = "Pad", .minInputs = 1, .maxInputs = 4, .infer = inferPad, .shapeInputs = {1, 3}});
  // roi (input 1 from opset 11) does not set the shape, but at opset 10 input 1 is scales.
  registry.add({.opType = "Resize",
                .minInputs = 1,
                .maxInputs = 4,
                .infer = inferResize,
                .shapeInputs = {1, 2, 3}});
  registry.add({.opType = "Upsample",
                .minInputs = 1,
                .maxInputs = 2,
                .infer = inferUpsample,
                .shapeInputs = {1}});
  registry.add({.opType = "Trilu", .minInputs = 1, .maxInputs = 2, .infer = inferTrilu});
  registry.add({.opType = "OneHot",
                .minInputs = 3,
                .maxInputs = 3,
                .infer = inferOneHot,
                .shapeInputs = {1}});
  registry.add({.opType = "DepthToSpace", .infer = inferDepthToSpace});
  registry.add({.opType = "SpaceToDepth", .infer = inferSpaceToDepth});
}

}  // namespace kiln::ir
