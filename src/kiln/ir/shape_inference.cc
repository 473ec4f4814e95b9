// Whole-graph shape inference.
#include "kiln/ir/shape_inference.h"

#include "kiln/ir/op_schema.h"

namespace kiln::ir {

namespace {

Status checkArity(const Node& node, const OpSchema& schema) {
  const int inputs = static_cast<int>(node.inputs.size());
  const int outputs = static_cast<int>(node.outputs.size());
  if (inputs < schema.minInputs || inputs > schema.maxInputs) {
    return invalidInput("{}: expects {} to {} inputs, got {}", node.describe(), schema.minInputs,
                        schema.maxInputs, inputs);
  }
  if (outputs < schema.minOutputs || outputs > schema.maxOutputs) {
    return invalidInput("{}: expects {} to {} outputs, got {}", node.describe(), schema.minOutputs,
                        schema.maxOutputs, outputs);
  }
  for (int i = 0; i < schema.minInputs; ++i) {
    if (!node.hasInput(i)) {
      return invalidInput("{}: required input {} is missing", node.describe(), i);
    }
  }
  return Status::ok();
}

bool allInputsConstant(const Node& node) {
  for (const Value* input : node.inputs) {
    if (input && !input->constant) return false;
  }
  return true;
}

Status tryFold(Node& node, const OpSchema& schema, const ConstantEvaluator& evaluator) {
  if (!evaluator || !schema.foldable || !allInputsConstant(node)) return Status::ok();
  int64_t elements = 0;
  for (const Value* output : node.outputs) {
    if (output) elements += output->shape.elementCount();
  }
  if (elements > kMaxInferenceFoldElements) return Status::ok();
  KILN_ASSIGN_OR_RETURN(std::vector<Tensor> results, evaluator(node));
  for (size_t i = 0; i < node.outputs.size() && i < results.size(); ++i) {
    if (node.outputs[i]) node.outputs[i]->constant = std::move(results[i]);
  }
  return Status::ok();
}

}  // namespace

Status inferShapes(Graph& graph, const ConstantEvaluator& evaluator) {
  for (const auto& nodePtr : graph.nodes()) {
    Node& node = *nodePtr;
    const OpSchema* schema = OpRegistry::instance().find(node.domain, node.opType);
    if (!schema) {
      return unsupported("{}: kiln does not support op '{}'{}", node.describe(), node.opType,
                         node.domain.empty() ? "" : fmt::format(" of domain '{}'", node.domain));
    }
    KILN_RETURN_IF_ERROR(checkArity(node, *schema));
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      const Value* input = node.inputs[i];
      if (input && !input->hasType) {
        return internalError("{}: input {} ('{}') has no type; nodes are not in topological order",
                             node.describe(), i, input->name);
      }
    }
    InferContext context(node);
    KILN_RETURN_IF_ERROR(schema->infer(context));
    for (size_t i = 0; i < node.outputs.size(); ++i) {
      Value* output = node.outputs[i];
      if (!output) continue;
      const auto& type = context.outputs()[i];
      if (!type.set) {
        return internalError("{}: shape inference did not type output {}", node.describe(), i);
      }
      auto count = type.shape.checkedElementCount();
      if (!count.isOk())
        return count.status().withContext(node.describe() + ": output " + output->name);
      output->dtype = type.dtype;
      output->shape = type.shape;
      output->hasType = true;
      if (type.constant) output->constant = type.constant;
    }
    KILN_RETURN_IF_ERROR(tryFold(node, *schema, evaluator));
  }
  for (const Value* output : graph.outputs) {
    if (!output->hasType) {
      return invalidInput("graph output '{}' is not produced by any node", output->name);
    }
  }
  return Status::ok();
}

}  // namespace kiln::ir
