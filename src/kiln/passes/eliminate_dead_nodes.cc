// Removes nodes none of whose outputs is read by another node or is a graph output.
#include <unordered_set>

#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kEliminateDeadNodes = knobs::declareKnob({
    .name = "graph.eliminate_dead_nodes",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "remove nodes whose outputs nothing reads",
});

Status eliminateDeadNodes(ir::Graph& graph, PassContext& context) {
  // Walk backwards so a chain of dead nodes goes in one sweep.
  std::unordered_set<const ir::Value*> live(graph.outputs.begin(), graph.outputs.end());
  std::unordered_set<const ir::Node*> dead;
  for (auto it = graph.nodes().rbegin(); it != graph.nodes().rend(); ++it) {
    const ir::Node& node = **it;
    bool used = false;
    for (const ir::Value* output : node.outputs) used |= output && live.count(output);
    if (!used) {
      dead.insert(&node);
      context.note("removed dead {} '{}'", node.opType, node.name);
      continue;
    }
    for (const ir::Value* input : node.inputs) {
      if (input) live.insert(input);
    }
  }
  graph.removeNodes([&](const ir::Node& node) { return dead.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
