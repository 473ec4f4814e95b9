// Shape inference for the shape and data-layout ops: Constant, Reshape, Transpose, Concat, ...
#include <fmt/ranges.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <set>

#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/slice.h"

namespace kiln::ir {

namespace {

// Variadic inputs and outputs (Concat's inputs, Split's outputs) have no upper bound.
constexpr int kUnbounded = INT_MAX;

std::string listText(const std::vector<int64_t>& values) {
  return fmt::format("[{}]", fmt::join(values, ","));
}

// A possibly negative axis normalised into [0, rank), or an error naming what the axis is for.
Result<int64_t> axisIn(const InferContext& ctx, int64_t axis, int64_t rank, const char* role) {
  if (axis < -rank || axis >= rank) {
    return ctx.error("{} {} is out of range for rank {} (accepted: [{}, {}])", role, axis, rank,
                     -rank, rank - 1);
  }
  return axis < 0 ? axis + rank : axis;
}

// Normalises a list of axes against `rank`, refusing duplicates (they name one axis twice).
Result<std::vector<int64_t>> axesIn(const InferContext& ctx, const std::vector<int64_t>& axes,
                                    int64_t rank) {
  std::vector<int64_t> normalized;
  std::set<int64_t> seen;
  for (int64_t axis : axes) {
    KILN_ASSIGN_OR_RETURN(int64_t a, axisIn(ctx, axis, rank, "axis"));
    if (!seen.insert(a).second) return ctx.error("axes {} name axis {} twice", listText(axes), a);
    normalized.push_back(a);
  }
  return normalized;
}

// The value of a shape-like input (a shape, axes, repeats, ...), which must be known at build
// time, be 1-D and hold integers (int64, or also int32 where the spec allows it).
Result<std::vector<int64_t>> constantIntegers(const InferContext& ctx, size_t i, const char* role,
                                              bool allowInt32 = false) {
  KILN_ASSIGN_OR_RETURN(const Tensor* value, ctx.requireConstantInput(i, role));
  const bool typeOk =
      value->dtype() == DType::kInt64 || (allowInt32 && value->dtype() == DType::kInt32);
  if (!typeOk) {
    return ctx.error("input {} (the {}) must be {}, got {}", i, role,
                     allowInt32 ? "int32 or int64" : "int64", dtypeName(value->dtype()));
  }
  if (value->rank() != 1) {
    return ctx.error("input {} (the {}) must be 1-D, got shape {}", i, role,
                     value->shape().toString());
  }
  return value->toInt64Vector();
}

Status inferConstant(InferContext& ctx) {
  const Node& node = ctx.node();
  if (node.attributes.size() != 1) {
    return ctx.error(
        "must have exactly one of the attributes value, value_float, value_floats, "
        "value_int, value_ints");
  }
  const auto& [name, attribute] = *node.attributes.begin();
  Tensor value;
  if (name == "value") {
    KILN_ASSIGN_OR_RETURN(value, node.getTensor("value"));
  } else if (name == "value_float") {
    KILN_ASSIGN_OR_RETURN(float v, node.getFloat("value_float", 0));
    value = Tensor::scalar<float>(v);
  } else if (name == "value_int") {
    KILN_ASSIGN_OR_RETURN(int64_t v, node.getInt("value_int", 0));
    value = Tensor::scalar<int64_t>(v);
  } else if (name == "value_floats") {
    KILN_ASSIGN_OR_RETURN(auto v, node.getFloats("value_floats"));
    value = Tensor::fromVector<float>(Shape{static_cast<int64_t>(v.size())}, v);
  } else if (name == "value_ints") {
    KILN_ASSIGN_OR_RETURN(auto v, node.getInts("value_ints"));
    value = Tensor::fromVector<int64_t>(Shape{static_cast<int64_t>(v.size())}, v);
  } else if (name == "sparse_value" || name == "value_string" || name == "value_strings") {
    return ctx.unsupportedHere("attribute '{}' is not supported", name);
  } else {
    return ctx.error("unknown attribute '{}'", name);
  }
  (void)attribute;
  // The value is known here; making it a constant lets shape computations resolve without an
  // evaluator.
  ctx.setOutputConstant(0, std::move(value));
  return Status::ok();
}

// Reshape's target shape: 0 copies the input's dimension (unless allowzero), one -1 takes what
// is left.
Result<Shape> reshapeTarget(const InferContext& ctx, const Shape& input,
                            const std::vector<int64_t>& requested, bool allowZero) {
  std::vector<int64_t> dims(requested.size());
  std::optional<size_t> inferred;
  bool hasZero = false;
  for (size_t i = 0; i < requested.size(); ++i) {
    int64_t dim = requested[i];
    if (dim == -1) {
      if (inferred) return ctx.error("shape {} has more than one -1", listText(requested));
      inferred = i;
      dims[i] = 1;  // a placeholder, so the product below is of the other dimensions
      continue;
    }
    if (dim < -1) {
      return ctx.error("shape {} has {} at position {}; dimensions must be >= 0, or -1",
                       listText(requested), dim, i);
    }
    if (dim == 0 && !allowZero) {
      if (i >= input.rank()) {
        return ctx.error(
            "shape {} has 0 at position {}, which copies an input dimension, but "
            "the input {} has rank {}",
            listText(requested), i, input.toString(), input.rank());
      }
      dim = input[i];
    }
    hasZero |= dim == 0 && allowZero;
    dims[i] = dim;
  }
  if (allowZero && hasZero && inferred) {
    return ctx.error("shape {} has both 0 and -1, which allowzero=1 forbids", listText(requested));
  }
  auto known = Shape(dims).checkedElementCount();
  if (!known.isOk()) return known.status().withContext(ctx.node().describe());
  const int64_t inputCount = input.elementCount();
  if (inferred) {
    if (*known == 0 || inputCount % *known != 0) {
      return ctx.error("cannot reshape input {} ({} elements) to {}: the -1 cannot be inferred",
                       input.toString(), inputCount, listText(requested));
    }
    dims[*inferred] = inputCount / *known;
  } else if (*known != inputCount) {
    return ctx.error("cannot reshape input {} ({} elements) to {} ({} elements)", input.toString(),
                     inputCount, listText(requested), *known);
  }
  return Shape(std::move(dims));
}

Status inferReshape(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto requested, constantIntegers(ctx, 1, "shape"));
  int64_t allowZero = 0;
  if (ctx.opset() >= 14) {
    KILN_ASSIGN_OR_RETURN(allowZero, ctx.node().getInt("allowzero", 0));
    if (allowZero != 0 && allowZero != 1)
      return ctx.error("allowzero must be 0 or 1, got {}", allowZero);
  }
  KILN_ASSIGN_OR_RETURN(Shape shape,
                        reshapeTarget(ctx, ctx.inputShape(0), requested, allowZero == 1));
  ctx.setOutput(0, ctx.inputType(0), std::move(shape));
  return Status::ok();
}

Status inferFlatten(InferContext& ctx) {
  const int64_t rank = ctx.inputRank(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.node().getInt("axis", 1));
  // The split point may be anywhere from before the first axis to after the last.
  const int64_t lowest = ctx.opset() >= 11 ? -rank : 0;
  if (axis < lowest || axis > rank) {
    return ctx.error("axis {} is out of range for rank {} (accepted: [{}, {}])", axis, rank, lowest,
                     rank);
  }
  if (axis < 0) axis += rank;
  const auto& dims = ctx.inputShape(0).dims();
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < rank; ++i) (i < axis ? outer : inner) *= dims[i];
  ctx.setOutput(0, ctx.inputType(0), Shape{outer, inner});
  return Status::ok();
}

Status inferTranspose(InferContext& ctx) {
  const int64_t rank = ctx.inputRank(0);
  std::vector<int64_t> reversed(rank);
  for (int64_t i = 0; i < rank; ++i) reversed[i] = rank - 1 - i;
  KILN_ASSIGN_OR_RETURN(auto perm, ctx.node().getInts("perm", reversed));
  if (static_cast<int64_t>(perm.size()) != rank) {
    return ctx.error("perm {} has {} entries, the input has rank {}", listText(perm), perm.size(),
                     rank);
  }
  std::vector<bool> used(rank, false);
  std::vector<int64_t> dims(rank);
  for (int64_t i = 0; i < rank; ++i) {
    if (perm[i] < 0 || perm[i] >= rank || used[perm[i]]) {
      return ctx.error("perm {} is not a permutation of 0..{}", listText(perm), rank - 1);
    }
    used[perm[i]] = true;
    dims[i] = ctx.inputShape(0)[perm[i]];
  }
  ctx.setOutput(0, ctx.inputType(0), Shape(std::move(dims)));
  return Status::ok();
}

// Squeeze's and Unsqueeze's axes: an attribute before opset 13, an input from it.
Result<std::optional<std::vector<int64_t>>> squeezeAxes(const InferContext& ctx) {
  if (ctx.opset() >= 13) {
    if (ctx.node().hasAttribute("axes")) {
      return ctx.error("axes is an input from opset 13, not an attribute");
    }
    if (!ctx.hasInput(1)) return std::optional<std::vector<int64_t>>{};
    KILN_ASSIGN_OR_RETURN(auto axes, constantIntegers(ctx, 1, "axes"));
    return std::optional(std::move(axes));
  }
  if (ctx.inputCount() > 1) return ctx.error("takes axes as an attribute before opset 13");
  if (!ctx.node().hasAttribute("axes")) return std::optional<std::vector<int64_t>>{};
  KILN_ASSIGN_OR_RETURN(auto axes, ctx.node().getInts("axes"));
  return std::optional(std::move(axes));
}

Status inferSqueeze(InferContext& ctx) {
  const Shape& input = ctx.inputShape(0);
  const int64_t rank = ctx.inputRank(0);
  KILN_ASSIGN_OR_RETURN(auto requested, squeezeAxes(ctx));
  std::vector<bool> squeezed(rank, false);
  if (requested) {
    KILN_ASSIGN_OR_RETURN(auto axes, axesIn(ctx, *requested, rank));
    for (int64_t axis : axes) {
      if (input[axis] != 1) {
        return ctx.error("cannot squeeze axis {} of input {}: its size is {}, not 1", axis,
                         input.toString(), input[axis]);
      }
      squeezed[axis] = true;
    }
  } else {
    for (int64_t i = 0; i < rank; ++i) squeezed[i] = input[i] == 1;
  }
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < rank; ++i) {
    if (!squeezed[i]) dims.push_back(input[i]);
  }
  ctx.setOutput(0, ctx.inputType(0), Shape(std::move(dims)));
  return Status::ok();
}

Status inferUnsqueeze(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto requested, squeezeAxes(ctx));
  if (!requested) return ctx.error("axes are required");
  const int64_t outRank = ctx.inputRank(0) + static_cast<int64_t>(requested->size());
  KILN_ASSIGN_OR_RETURN(auto axes, axesIn(ctx, *requested, outRank));
  std::vector<bool> inserted(outRank, false);
  for (int64_t axis : axes) inserted[axis] = true;
  std::vector<int64_t> dims;
  size_t next = 0;
  for (int64_t i = 0; i < outRank; ++i) {
    dims.push_back(inserted[i] ? 1 : ctx.inputShape(0)[next++]);
  }
  ctx.setOutput(0, ctx.inputType(0), Shape(std::move(dims)));
  return Status::ok();
}

Status inferConcat(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(ctx.node().requireAttribute("axis"));
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.node().getInt("axis", 0));
  for (size_t i = 0; i < ctx.inputCount(); ++i) {
    if (!ctx.hasInput(i)) return ctx.error("input {} is missing", i);
  }
  const Shape& first = ctx.inputShape(0);
  if (first.rank() == 0) return ctx.error("cannot concatenate scalars (rank 0)");
  KILN_ASSIGN_OR_RETURN(axis, axisIn(ctx, axis, ctx.inputRank(0), "axis"));
  Shape out = first;
  for (size_t i = 1; i < ctx.inputCount(); ++i) {
    const Shape& shape = ctx.inputShape(i);
    if (ctx.inputType(i) != ctx.inputType(0)) {
      return ctx.error("input {} is {}, input 0 is {}", i, dtypeName(ctx.inputType(i)),
                       dtypeName(ctx.inputType(0)));
    }
    bool compatible = shape.rank() == first.rank();
    for (size_t a = 0; compatible && a < shape.rank(); ++a) {
      compatible = static_cast<int64_t>(a) == axis || shape[a] == first[a];
    }
    if (!compatible) {
      return ctx.error("input {} has shape {}, which does not match input 0's {} outside axis {}",
                       i, shape.toString(), first.toString(), axis);
    }
    out[axis] += shape[axis];
  }
  ctx.setOutput(0, ctx.inputType(0), std::move(out));
  return Status::ok();
}

// The sizes of Split's parts: given by the split attribute (before opset 13) or input (from
// 13), else equal parts, the last smaller when uneven (opset 18's num_outputs).
Result<std::vector<int64_t>> splitSizes(const InferContext& ctx, int64_t dim) {
  const Node& node = ctx.node();
  const int64_t parts = static_cast<int64_t>(ctx.outputCount());
  std::optional<std::vector<int64_t>> given;
  if (ctx.opset() >= 13) {
    if (node.hasAttribute("split")) return ctx.error("split is an input from opset 13");
    if (ctx.hasInput(1)) {
      KILN_ASSIGN_OR_RETURN(given, constantIntegers(ctx, 1, "split"));
    }
  } else {
    if (ctx.inputCount() > 1) return ctx.error("takes split as an attribute before opset 13");
    if (node.hasAttribute("split")) {
      KILN_ASSIGN_OR_RETURN(given, node.getInts("split"));
    }
  }
  if (ctx.opset() >= 18 && node.hasAttribute("num_outputs")) {
    if (given) return ctx.error("takes either the split input or num_outputs, not both");
    KILN_ASSIGN_OR_RETURN(int64_t numOutputs, node.getInt("num_outputs", 0));
    if (numOutputs != parts) {
      return ctx.error("num_outputs is {}, but the node has {} outputs", numOutputs, parts);
    }
  }
  if (given) {
    if (static_cast<int64_t>(given->size()) != parts) {
      return ctx.error("split {} has {} entries, but the node has {} outputs", listText(*given),
                       given->size(), parts);
    }
    int64_t sum = 0;
    for (int64_t size : *given) {
      if (size < 0) return ctx.error("split {} has a negative size", listText(*given));
      sum += size;
    }
    if (sum != dim) {
      return ctx.error("split {} sums to {}, but the split axis has size {}", listText(*given), sum,
                       dim);
    }
    return *given;
  }
  if (ctx.opset() < 18 && dim % parts != 0) {
    return ctx.error("cannot split an axis of size {} into {} equal parts", dim, parts);
  }
  const int64_t chunk = (dim + parts - 1) / parts;
  std::vector<int64_t> sizes(parts, chunk);
  sizes.back() = dim - chunk * (parts - 1);
  if (sizes.back() < 0) {
    return ctx.error(
        "cannot split an axis of size {} into {} parts of {} (the last would be "
        "negative)",
        dim, parts, chunk);
  }
  return sizes;
}

Status inferSplit(InferContext& ctx) {
  for (const Value* output : ctx.node().outputs) {
    if (!output) return ctx.unsupportedHere("omitted outputs are not supported");
  }
  const Shape& input = ctx.inputShape(0);
  KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.node().getInt("axis", 0));
  KILN_ASSIGN_OR_RETURN(axis, axisIn(ctx, axis, ctx.inputRank(0), "axis"));
  KILN_ASSIGN_OR_RETURN(auto sizes, splitSizes(ctx, input[axis]));
  for (size_t i = 0; i < sizes.size(); ++i) {
    Shape out = input;
    out[axis] = sizes[i];
    ctx.setOutput(i, ctx.inputType(0), std::move(out));
  }
  return Status::ok();
}

// Slice's starts, ends, axes and steps: attributes before opset 10, inputs from it.
struct SliceRequest {
  std::vector<int64_t> starts, ends, axes, steps;
};

Result<SliceRequest> sliceRequest(const InferContext& ctx) {
  SliceRequest request;
  const Node& node = ctx.node();
  if (ctx.opset() < 10) {
    if (ctx.inputCount() > 1) return ctx.error("takes starts/ends as attributes before opset 10");
    KILN_RETURN_IF_ERROR(node.requireAttribute("starts"));
    KILN_RETURN_IF_ERROR(node.requireAttribute("ends"));
    KILN_ASSIGN_OR_RETURN(request.starts, node.getInts("starts"));
    KILN_ASSIGN_OR_RETURN(request.ends, node.getInts("ends"));
    if (node.hasAttribute("axes")) {
      KILN_ASSIGN_OR_RETURN(request.axes, node.getInts("axes"));
    }
  } else {
    if (ctx.inputCount() < 3) return ctx.error("needs the starts and ends inputs from opset 10");
    KILN_ASSIGN_OR_RETURN(request.starts, constantIntegers(ctx, 1, "starts", true));
    KILN_ASSIGN_OR_RETURN(request.ends, constantIntegers(ctx, 2, "ends", true));
    if (ctx.hasInput(3)) {
      KILN_ASSIGN_OR_RETURN(request.axes, constantIntegers(ctx, 3, "axes", true));
    }
    if (ctx.hasInput(4)) {
      KILN_ASSIGN_OR_RETURN(request.steps, constantIntegers(ctx, 4, "steps", true));
    }
  }
  const size_t count = request.starts.size();
  const bool axesGiven = ctx.opset() < 10 ? node.hasAttribute("axes") : ctx.hasInput(3);
  if (!axesGiven) {
    for (size_t i = 0; i < count; ++i) request.axes.push_back(static_cast<int64_t>(i));
  }
  if (!ctx.hasInput(4)) request.steps.assign(count, 1);
  if (request.ends.size() != count || request.axes.size() != count ||
      request.steps.size() != count) {
    return ctx.error("starts {}, ends {}, axes {} and steps {} must have the same length",
                     listText(request.starts), listText(request.ends), listText(request.axes),
                     listText(request.steps));
  }
  return request;
}

Status inferSlice(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(SliceRequest request, sliceRequest(ctx));
  const int64_t rank = ctx.inputRank(0);
  KILN_ASSIGN_OR_RETURN(auto axes, axesIn(ctx, request.axes, rank));
  Shape out = ctx.inputShape(0);
  for (size_t i = 0; i < axes.size(); ++i) {
    if (request.steps[i] == 0) return ctx.error("steps {} contains 0", listText(request.steps));
    out[axes[i]] =
        resolveSliceAxis(request.starts[i], request.ends[i], request.steps[i], out[axes[i]]).length;
  }
  ctx.setOutput(0, ctx.inputType(0), std::move(out));
  return Status::ok();
}

Status inferExpand(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto requested, constantIntegers(ctx, 1, "shape"));
  for (int64_t dim : requested) {
    if (dim < 0) return ctx.error("shape {} has a negative dimension", listText(requested));
  }
  auto out = broadcastShapes(ctx.inputShape(0), Shape(requested));
  if (!out.isOk()) return out.status().withContext(ctx.node().describe());
  ctx.setOutput(0, ctx.inputType(0), std::move(out).value());
  return Status::ok();
}

Status inferTile(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto repeats, constantIntegers(ctx, 1, "repeats"));
  const Shape& input = ctx.inputShape(0);
  if (repeats.size() != input.rank()) {
    return ctx.error("repeats {} has {} entries, the input {} has rank {}", listText(repeats),
                     repeats.size(), input.toString(), input.rank());
  }
  Shape out = input;
  for (size_t i = 0; i < repeats.size(); ++i) {
    if (repeats[i] < 0) return ctx.error("repeats {} has a negative entry", listText(repeats));
    if (__builtin_mul_overflow(input[i], repeats[i], &out[i])) {
      return ctx.error("tiling input {} by {} overflows", input.toString(), listText(repeats));
    }
  }
  ctx.setOutput(0, ctx.inputType(0), std::move(out));
  return Status::ok();
}

// Shape's start/end (opset 15): negative counts from the back, then clamped into [0, rank].
int64_t clampedShapeBound(int64_t bound, int64_t rank) {
  if (bound < 0) bound += rank;
  return std::clamp<int64_t>(bound, 0, rank);
}

Status inferShape(InferContext& ctx) {
  const auto& dims = ctx.inputShape(0).dims();
  const int64_t rank = ctx.inputRank(0);
  int64_t start = 0, end = rank;
  if (ctx.opset() >= 15) {
    KILN_ASSIGN_OR_RETURN(start, ctx.node().getInt("start", 0));
    KILN_ASSIGN_OR_RETURN(end, ctx.node().getInt("end", rank));
  }
  start = clampedShapeBound(start, rank);
  end = std::max(start, clampedShapeBound(end, rank));
  std::vector<int64_t> values(dims.begin() + start, dims.begin() + end);
  ctx.setOutputConstant(0, Tensor::fromVector<int64_t>(Shape{end - start}, values));
  return Status::ok();
}

Status inferSize(InferContext& ctx) {
  ctx.setOutputConstant(0, Tensor::scalar<int64_t>(ctx.inputShape(0).elementCount()));
  return Status::ok();
}

Status inferConstantOfShape(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto dims, constantIntegers(ctx, 0, "shape"));
  for (int64_t dim : dims) {
    if (dim < 0) return ctx.error("shape {} has a negative dimension", listText(dims));
  }
  DType dtype = DType::kFloat32;
  if (ctx.node().hasAttribute("value")) {
    KILN_ASSIGN_OR_RETURN(Tensor value, ctx.node().getTensor("value"));
    if (value.elementCount() != 1) {
      return ctx.error("value must hold exactly one element, got shape {}",
                       value.shape().toString());
    }
    dtype = value.dtype();
    if (dtype == DType::kBFloat16 && ctx.opset() < 20) {
      return ctx.error("value may be bfloat16 only from opset 20");
    }
  }
  ctx.setOutput(0, dtype, Shape(std::move(dims)));
  return Status::ok();
}

// Reads one of Range's scalar inputs; a one-element 1-D tensor is accepted too, as exporters
// write them and the value is unambiguous.
Result<const Tensor*> rangeScalar(const InferContext& ctx, size_t i, const char* role) {
  KILN_ASSIGN_OR_RETURN(const Tensor* value, ctx.requireConstantInput(i, role));
  if (value->rank() > 1 || value->elementCount() != 1) {
    return ctx.error("{} (input {}) must be a scalar, got shape {}", role, i,
                     value->shape().toString());
  }
  return value;
}

// Range's length, max(ceil((limit - start) / delta), 0): in double for floating types, exact for
// integer types (where double would round large int64 values).
Result<int64_t> rangeLength(const InferContext& ctx, const Tensor& start, const Tensor& limit,
                            const Tensor& delta) {
  if (isFloating(start.dtype())) {
    const double s = start.elementAsDouble(0), l = limit.elementAsDouble(0);
    const double d = delta.elementAsDouble(0);
    if (d == 0 || !std::isfinite(s) || !std::isfinite(l) || !std::isfinite(d)) {
      return ctx.error("start {}, limit {} and delta {} must be finite, with delta non-zero", s, l,
                       d);
    }
    const double length = std::ceil((l - s) / d);
    if (length > static_cast<double>(kMaxTensorElements)) {
      return ctx.error("start {}, limit {}, delta {} give more than 2^40 elements", s, l, d);
    }
    return length > 0 ? static_cast<int64_t>(length) : 0;
  }
  const int64_t s = start.elementAsInt64(0), l = limit.elementAsInt64(0);
  const int64_t d = delta.elementAsInt64(0);
  if (d == 0) return ctx.error("delta must be non-zero");
  int64_t span = 0;
  if (__builtin_sub_overflow(l, s, &span)) {
    return ctx.error("start {} and limit {} are too far apart", s, l);
  }
  // Ceiling division that rounds toward +infinity for either sign.
  int64_t length = span / d;
  if (span % d != 0 && ((span < 0) == (d < 0))) ++length;
  return std::max<int64_t>(length, 0);
}

Status inferRange(InferContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const Tensor* start, rangeScalar(ctx, 0, "start"));
  KILN_ASSIGN_OR_RETURN(const Tensor* limit, rangeScalar(ctx, 1, "limit"));
  KILN_ASSIGN_OR_RETURN(const Tensor* delta, rangeScalar(ctx, 2, "delta"));
  const DType dtype = start->dtype();
  if (limit->dtype() != dtype || delta->dtype() != dtype) {
    return ctx.error("start, limit and delta must have one type, got {}, {} and {}",
                     dtypeName(dtype), dtypeName(limit->dtype()), dtypeName(delta->dtype()));
  }
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64 && dtype != DType::kInt16 &&
      dtype != DType::kInt32 && dtype != DType::kInt64) {
    return ctx.error("takes float, double, int16, int32 or int64, got {}", dtypeName(dtype));
  }
  KILN_ASSIGN_OR_RETURN(int64_t length, rangeLength(ctx, *start, *limit, *delta));
  ctx.setOutput(0, dtype, Shape{length});
  return Status::ok();
}

Status inferEyeLike(InferContext& ctx) {
  const Shape& input = ctx.inputShape(0);
  if (input.rank() != 2) return ctx.error("input must be 2-D, got shape {}", input.toString());
  // EyeLike knows bfloat16 only from opset 22, beyond what kiln accepts.
  if (ctx.inputType(0) == DType::kBFloat16) return ctx.error("input may not be bfloat16");
  DType dtype = ctx.inputType(0);
  if (ctx.node().hasAttribute("dtype")) {
    KILN_ASSIGN_OR_RETURN(int64_t code, ctx.node().getInt("dtype", 0));
    auto converted = dtypeFromOnnxType(code);
    if (!converted.isOk()) {
      return converted.status().withContext(ctx.node().describe() + ": attribute 'dtype'");
    }
    dtype = *converted;
    if (dtype == DType::kBFloat16) return ctx.error("dtype may not be bfloat16");
  }
  KILN_ASSIGN_OR_RETURN(int64_t k, ctx.node().getInt("k", 0));
  (void)k;  // any diagonal offset is valid; one outside the matrix gives all zeros
  ctx.setOutput(0, dtype, input);
  return Status::ok();
}

}  // namespace

void registerShapeSchemas(OpRegistry& registry) {
  registry.add({.opType = "Constant", .minInputs = 0, .maxInputs = 0, .infer = inferConstant});
  registry.add({.opType = "Reshape",
                .minInputs = 2,
                .maxInputs = 2,
                .infer = inferReshape,
                .shapeInputs = {1}});
  registry.add({.opType = "Flatten", .infer = inferFlatten});
  registry.add({.opType = "Transpose", .infer = inferTranspose});
  registry.add({.opType = "Squeeze", .maxInputs = 2, .infer = inferSqueeze, .shapeInputs = {1}});
  registry.add(
      {.opType = "Unsqueeze", .maxInputs = 2, .infer = inferUnsqueeze, .shapeInputs = {1}});
  registry.add({.opType = "Concat", .maxInputs = kUnbounded, .infer = inferConcat});
  registry.add({.opType = "Split",
                .maxInputs = 2,
                .maxOutputs = kUnbounded,
                .infer = inferSplit,
                .shapeInputs = {1}});
  registry.add(
      {.opType = "Slice", .maxInputs = 5, .infer = inferSlice, .shapeInputs = {1, 2, 3, 4}});
  registry.add({.opType = "Expand",
                .minInputs = 2,
                .maxInputs = 2,
                .infer = inferExpand,
                .shapeInputs = {1}});
  registry.add(
      {.opType = "Tile", .minInputs = 2, .maxInputs = 2, .infer = inferTile, .shapeInputs = {1}});
  registry.add({.opType = "Shape", .infer = inferShape});
  registry.add({.opType = "Size", .infer = inferSize});
  registry.add({.opType = "ConstantOfShape", .infer = inferConstantOfShape, .shapeInputs = {0}});
  registry.add({.opType = "Range",
                .minInputs = 3,
                .maxInputs = 3,
                .infer = inferRange,
                .shapeInputs = {0, 1, 2}});
  registry.add({.opType = "EyeLike", .infer = inferEyeLike});
}

}  // namespace kiln::ir
