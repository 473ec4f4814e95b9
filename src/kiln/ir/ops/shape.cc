// Shape inference for the shape and data-layout ops: Constant, Reshape, Transpose, Concat, ...
#include "kiln/ir/op_schema.h"

namespace kiln::ir {

namespace {

Status inferConstant(InferContext& ctx) {
  const Node& node = ctx.node();
  if (node.attributes.size() != 1) {
    return ctx.error("must have exactly one of the attributes value, value_float, value_floats, "
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
  ctx.setOutput(0, value.dtype(), value.shape());
  return Status::ok();
}

}  // namespace

void registerShapeSchemas(OpRegistry& registry) {
  registry.add({.opType = "Constant", .minInputs = 0, .maxInputs = 0, .infer = inferConstant});
}

}  // namespace kiln::ir
