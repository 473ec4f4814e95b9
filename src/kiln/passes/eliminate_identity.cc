// Removes Identity nodes and inference-mode Dropout (whose output equals its input).
//
//   %y = Identity(%x); %z = Relu(%y)   =>   %z = Relu(%x)
#include <algorithm>

#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kEliminateIdentity = knobs::declareKnob({
    .name = "graph.eliminate_identity",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "remove Identity nodes and inference-mode Dropout",
});

namespace {

bool isPassThrough(const ir::Node& node) {
  if (node.opType == "Identity") return true;
  // Dropout is the identity at inference unless training_mode is a constant true; its mask
  // output must be unused.
  if (node.opType != "Dropout") return false;
  if (node.outputs.size() > 1 && node.outputs[1]) return false;
  const ir::Value* training = node.input(2);
  return !training || (training->constant && training->constant->elementAsInt64(0) == 0);
}

}  // namespace

Status eliminateIdentity(ir::Graph& graph, PassContext& context) {
  std::vector<const ir::Node*> removed;
  for (const auto& nodePtr : graph.nodes()) {
    const ir::Node& node = *nodePtr;
    if (!isPassThrough(node) || !node.input(0) || !node.outputs[0]) continue;
    ir::Value* input = node.inputs[0];
    ir::Value* output = node.outputs[0];
    if (graph.isGraphOutput(output)) {
      // Keep the graph output's name: the input takes it over, unless the input is itself
      // visible (a graph input, a constant, or another output), which would change the
      // interface.
      const bool visible = !input->producer || graph.isGraphOutput(input);
      if (visible) continue;
      const std::string name = output->name;
      graph.renameValue(output, name + ".removed");
      graph.renameValue(input, name);
    }
    graph.replaceAllUses(output, input);
    removed.push_back(&node);
    context.note("removed {} '{}'", node.opType, node.name);
  }
  graph.removeNodes([&](const ir::Node& node) {
    return std::find(removed.begin(), removed.end(), &node) != removed.end();
  });
  return Status::ok();
}

}  // namespace kiln::passes
