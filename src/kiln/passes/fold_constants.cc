// Evaluates nodes whose inputs are all known at build time with the reference kernels and
// replaces their outputs by constants (shape computations, weight transposes, casts of
// initializers).
//
//   %s = Shape(%x); %r = Reshape(%y, %s)   =>   %r = Reshape(%y, const %s)
#include <algorithm>

#include "kiln/passes/passes.h"
#include "kiln/reference/executor.h"

namespace kiln::passes {

const knobs::Knob kFoldConstants = knobs::declareKnob({
    .name = "graph.fold_constants",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "evaluate nodes whose inputs are all constant at build time",
});

const knobs::Knob kFoldConstantsMaxMib = knobs::declareKnob({
    .name = "graph.fold_constants.max_mib",
    .kind = knobs::KnobKind::kInt,
    .minValue = 0,
    .maxValue = 4096,
    .defaultValue = "64",
    .help = "largest output (MiB) constant folding may create; larger nodes run at inference",
});

Status foldConstants(ir::Graph& graph, PassContext& context) {
  const int64_t maxBytes = context.route.intValue(kFoldConstantsMaxMib) << 20;
  std::vector<const ir::Node*> folded;
  for (const auto& nodePtr : graph.nodes()) {
    const ir::Node& node = *nodePtr;
    bool allConstant = true;
    bool outputsKnown = true;  // shape inference already folded it (e.g. Shape of a static input)
    int64_t outputBytes = 0;
    for (const ir::Value* input : node.inputs) allConstant &= !input || input->constant.has_value();
    for (const ir::Value* output : node.outputs) {
      if (!output) continue;
      outputBytes += output->shape.elementCount() * ir::dtypeSize(output->dtype);
      outputsKnown &= output->constant.has_value();
    }
    if (!outputsKnown && (!allConstant || outputBytes > maxBytes)) continue;
    if (!outputsKnown) {
      std::vector<const ir::Tensor*> inputs;
      for (const ir::Value* input : node.inputs) {
        inputs.push_back(input ? &*input->constant : nullptr);
      }
      KILN_ASSIGN_OR_RETURN(std::vector<ir::Tensor> results, reference::evaluateNode(node, inputs));
      for (size_t i = 0; i < node.outputs.size(); ++i) {
        if (node.outputs[i]) node.outputs[i]->constant = std::move(results[i]);
      }
    }
    for (ir::Value* output : node.outputs) {
      if (output) output->isInitializer = true;
    }
    folded.push_back(&node);
    context.note("folded {} '{}'", node.opType, node.name);
  }
  graph.removeNodes([&](const ir::Node& node) {
    return std::find(folded.begin(), folded.end(), &node) != folded.end();
  });
  return Status::ok();
}

}  // namespace kiln::passes
