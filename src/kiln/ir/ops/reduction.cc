// Shape inference for the reduction ops: the Reduce* family, ArgMax/ArgMin, Softmax/LogSoftmax/
// Hardmax, TopK and CumSum.
#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "kiln/ir/op_schema.h"

namespace kiln::ir {

namespace {

constexpr std::initializer_list<const char*> kReduceOps = {
    "ReduceMean", "ReduceSum", "ReduceMax",       "ReduceMin",    "ReduceProd",
    "ReduceL1",   "ReduceL2",  "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"};

std::string dtypeList(const std::vector<DType>& dtypes) {
  std::string names;
  for (DType dtype : dtypes) {
    if (!names.empty()) names += ", ";
    names += dtypeName(dtype);
  }
  return names;
}

Status checkDType(const InferContext& ctx, size_t input, const std::vector<DType>& allowed) {
  const DType dtype = ctx.inputType(input);
  if (std::find(allowed.begin(), allowed.end(), dtype) != allowed.end()) return Status::ok();
  return ctx.error("input {} has type {}; at this opset the op accepts {}", input, dtypeName(dtype),
                   dtypeList(allowed));
}

std::vector<DType> floatTypes(int opset, int bfloat16Since) {
  std::vector<DType> types = {DType::kFloat32, DType::kFloat64, DType::kFloat16};
  if (opset >= bfloat16Since) types.push_back(DType::kBFloat16);
  return types;
}

std::vector<DType> numericTypes(bool withBFloat16) {
  std::vector<DType> types = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kInt64,
                              DType::kInt32,   DType::kInt16,   DType::kInt8,    DType::kUInt64,
                              DType::kUInt32,  DType::kUInt16,  DType::kUInt8};
  if (withBFloat16) types.push_back(DType::kBFloat16);
  return types;
}

// normalizeAxis, with the error naming the node and what the axis is for.
Result<int64_t> resolveAxis(const InferContext& ctx, int64_t axis, int64_t rank, const char* what) {
  auto normalized = normalizeAxis(axis, rank);
  if (!normalized.isOk()) return ctx.error("{}: {}", what, normalized.status().message());
  return *normalized;
}

Result<bool> getFlag(const InferContext& ctx, const char* attr, int64_t defaultValue) {
  KILN_ASSIGN_OR_RETURN(int64_t value, ctx.node().getInt(attr, defaultValue));
  if (value != 0 && value != 1)
    return ctx.error("attribute '{}' must be 0 or 1, got {}", attr, value);
  return value == 1;
}

// --- Reduce* ---------------------------------------------------------------------------------

// ReduceSum took its axes as an input at opset 13, the other reductions at opset 18.
int axesInputSince(const std::string& opType) { return opType == "ReduceSum" ? 13 : 18; }

std::vector<DType> reduceTypes(const std::string& opType, int opset) {
  std::vector<DType> types = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kInt64,
                              DType::kInt32,   DType::kUInt64,  DType::kUInt32};
  if (opset >= 13) types.push_back(DType::kBFloat16);
  if (opType == "ReduceMax" || opType == "ReduceMin") {
    if (opset >= 12) types.insert(types.end(), {DType::kInt8, DType::kUInt8});
    if (opset >= 20) types.push_back(DType::kBool);
  }
  return types;
}

// The requested axes, from the attribute or (from axesInputSince) the constant second input.
Result<std::vector<int64_t>> requestedAxes(const InferContext& ctx) {
  const Node& node = ctx.node();
  const int since = axesInputSince(node.opType);
  if (ctx.opset() < since) {
    if (ctx.hasInput(1)) {
      return ctx.error("takes axes as an attribute before opset {}, not as an input", since);
    }
    return node.getInts("axes");
  }
  if (node.hasAttribute("axes")) {
    return ctx.error("takes axes as an input from opset {}; the 'axes' attribute is not allowed",
                     since);
  }
  if (!ctx.hasInput(1)) return std::vector<int64_t>{};
  KILN_ASSIGN_OR_RETURN(const Tensor* axes, ctx.requireConstantInput(1, "axes"));
  if (axes->dtype() != DType::kInt64 || axes->rank() > 1) {
    return ctx.error("axes must be a 1-D int64 tensor, got {} {}", dtypeName(axes->dtype()),
                     axes->shape().toString());
  }
  return axes->toInt64Vector();
}

// Which axes of the data input are reduced. Empty axes mean all axes, or none at all when
// noop_with_empty_axes is set.
Result<std::vector<bool>> reducedAxes(const InferContext& ctx) {
  const int64_t rank = ctx.inputRank(0);
  KILN_ASSIGN_OR_RETURN(std::vector<int64_t> axes, requestedAxes(ctx));
  bool noop = false;
  if (ctx.opset() >= axesInputSince(ctx.node().opType)) {
    KILN_ASSIGN_OR_RETURN(noop, getFlag(ctx, "noop_with_empty_axes", 0));
  }
  if (axes.empty()) return std::vector<bool>(rank, !noop);
  std::vector<bool> reduced(rank, false);
  for (int64_t axis : axes) {
    KILN_ASSIGN_OR_RETURN(int64_t normalized, resolveAxis(ctx, axis, rank, "axes"));
    if (reduced[normalized]) return ctx.error("axes name axis {} twice", normalized);
    reduced[normalized] = true;
  }
  return reduced;
}

Status inferReduce(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, reduceTypes(ctx.node().opType, ctx.opset())));
  KILN_ASSIGN_OR_RETURN(std::vector<bool> reduced, reducedAxes(ctx));
  KILN_ASSIGN_OR_RETURN(bool keepdims, getFlag(ctx, "keepdims", 1));
  const Shape& input = ctx.inputShape(0);
  std::vector<int64_t> dims;
  for (size_t axis = 0; axis < input.rank(); ++axis) {
    if (!reduced[axis]) {
      dims.push_back(input[axis]);
    } else if (keepdims) {
      dims.push_back(1);
    }
  }
  ctx.setOutput(0, ctx.inputType(0), Shape(std::move(dims)));
  return Status::ok();
}

// --- ArgMax / ArgMin -------------------------------------------------------------------------

Status inferArgReduce(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, numericTypes(ctx.opset() >= 13)));
  const Shape& input = ctx.inputShape(0);
  KILN_ASSIGN_OR_RETURN(int64_t rawAxis, ctx.node().getInt("axis", 0));
  KILN_ASSIGN_OR_RETURN(int64_t axis, resolveAxis(ctx, rawAxis, ctx.inputRank(0), "axis"));
  KILN_ASSIGN_OR_RETURN(bool keepdims, getFlag(ctx, "keepdims", 1));
  if (ctx.opset() >= 12) KILN_RETURN_IF_ERROR(getFlag(ctx, "select_last_index", 0).status());
  std::vector<int64_t> dims = input.dims();
  if (keepdims) {
    dims[axis] = 1;
  } else {
    dims.erase(dims.begin() + axis);
  }
  Shape output(std::move(dims));
  // An index into an empty axis does not exist; an empty output needs none.
  if (input[axis] == 0 && output.elementCount() > 0) {
    return ctx.error("axis {} of input shape {} is empty, so there is no {} index", axis,
                     input.toString(), ctx.node().opType == "ArgMax" ? "largest" : "smallest");
  }
  ctx.setOutput(0, DType::kInt64, std::move(output));
  return Status::ok();
}

// --- Softmax / LogSoftmax / Hardmax ----------------------------------------------------------

Status inferSoftmaxLike(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, floatTypes(ctx.opset(), 13)));
  const int64_t rank = ctx.inputRank(0);
  if (ctx.opset() >= 13) {
    KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.node().getInt("axis", -1));
    KILN_RETURN_IF_ERROR(resolveAxis(ctx, axis, rank, "axis").status());
  } else {
    // Before opset 13 the input is coerced to 2-D at `axis`; axis == rank (a trailing block of
    // one element) is a valid split.
    KILN_ASSIGN_OR_RETURN(int64_t axis, ctx.node().getInt("axis", 1));
    if (rank == 0 || axis < -rank || axis > rank) {
      return ctx.error("axis {} is out of range for coercing rank {} to 2-D", axis, rank);
    }
  }
  ctx.setOutput(0, ctx.inputType(0), ctx.inputShape(0));
  return Status::ok();
}

// --- TopK ------------------------------------------------------------------------------------

// K: the attribute `k` before opset 10, then a one-element int64 input known at build time.
Result<int64_t> topKCount(const InferContext& ctx) {
  if (ctx.opset() < 10) {
    if (ctx.hasInput(1)) return ctx.error("takes k as an attribute before opset 10");
    KILN_RETURN_IF_ERROR(ctx.node().requireAttribute("k"));
    return ctx.node().getInt("k", 0);
  }
  if (ctx.node().hasAttribute("k")) {
    return ctx.error("takes K as an input from opset 10; the 'k' attribute is not allowed");
  }
  KILN_ASSIGN_OR_RETURN(const Tensor* k, ctx.requireConstantInput(1, "K"));
  if (k->dtype() != DType::kInt64 || k->rank() > 1 || k->elementCount() != 1) {
    return ctx.error("K must be a one-element int64 tensor, got {} {}", dtypeName(k->dtype()),
                     k->shape().toString());
  }
  return k->elementAsInt64(0);
}

Status inferTopK(InferContext& ctx) {
  KILN_RETURN_IF_ERROR(
      checkDType(ctx, 0, ctx.opset() >= 11 ? numericTypes(false) : floatTypes(ctx.opset(), 24)));
  KILN_ASSIGN_OR_RETURN(int64_t rawAxis, ctx.node().getInt("axis", -1));
  KILN_ASSIGN_OR_RETURN(int64_t axis, resolveAxis(ctx, rawAxis, ctx.inputRank(0), "axis"));
  KILN_ASSIGN_OR_RETURN(int64_t k, topKCount(ctx));
  if (ctx.opset() >= 11) {
    KILN_RETURN_IF_ERROR(getFlag(ctx, "largest", 1).status());
    KILN_RETURN_IF_ERROR(getFlag(ctx, "sorted", 1).status());
  }
  Shape output = ctx.inputShape(0);
  if (k < 0 || k > output[axis]) {
    return ctx.error("k = {} is out of range for axis {} of size {}", k, axis, output[axis]);
  }
  output[axis] = k;
  ctx.setOutput(0, ctx.inputType(0), output);
  ctx.setOutput(1, DType::kInt64, output);
  return Status::ok();
}

// --- CumSum ----------------------------------------------------------------------------------

Status inferCumSum(InferContext& ctx) {
  std::vector<DType> types = {DType::kFloat32, DType::kFloat64, DType::kInt64,
                              DType::kInt32,   DType::kUInt64,  DType::kUInt32};
  if (ctx.opset() >= 14) types.insert(types.end(), {DType::kFloat16, DType::kBFloat16});
  KILN_RETURN_IF_ERROR(checkDType(ctx, 0, types));
  KILN_RETURN_IF_ERROR(checkDType(ctx, 1, {DType::kInt64, DType::kInt32}));
  KILN_RETURN_IF_ERROR(getFlag(ctx, "exclusive", 0).status());
  KILN_RETURN_IF_ERROR(getFlag(ctx, "reverse", 0).status());
  const Shape& axisShape = ctx.inputShape(1);
  if (axisShape.rank() > 1 || axisShape.elementCount() != 1) {
    return ctx.error("axis must be a scalar or a one-element 1-D tensor, got shape {}",
                     axisShape.toString());
  }
  // The axis may be a runtime value (it does not change the output shape); check it when known.
  if (const Tensor* axis = ctx.inputConstant(1)) {
    KILN_RETURN_IF_ERROR(
        resolveAxis(ctx, axis->elementAsInt64(0), ctx.inputRank(0), "axis").status());
  } else if (ctx.inputRank(0) == 0) {
    return ctx.error("the input is a scalar, which has no axis to sum along");
  }
  ctx.setOutput(0, ctx.inputType(0), ctx.inputShape(0));
  return Status::ok();
}

}  // namespace

void registerReductionSchemas(OpRegistry& registry) {
  for (const char* op : kReduceOps) {
    registry.add(
        {.opType = op, .minInputs = 1, .maxInputs = 2, .infer = inferReduce, .shapeInputs = {1}});
  }
  for (const char* op : {"ArgMax", "ArgMin"}) {
    registry.add({.opType = op, .infer = inferArgReduce});
  }
  for (const char* op : {"Softmax", "LogSoftmax", "Hardmax"}) {
    registry.add({.opType = op, .infer = inferSoftmaxLike});
  }
  registry.add({.opType = "TopK",
                .minInputs = 1,
                .maxInputs = 2,
                .minOutputs = 2,
                .maxOutputs = 2,
                .infer = inferTopK,
                .shapeInputs = {1}});
  registry.add({.opType = "CumSum", .minInputs = 2, .maxInputs = 2, .infer = inferCumSum});
}

}  // namespace kiln::ir
