// Simplifies chains of data-layout ops: two Transposes become one (or none when they cancel),
// identity Transposes and Reshapes to the same shape disappear, a Transpose that only moves axes
// of size 1 becomes a Reshape (it moves no byte, and the backends alias Reshapes), and a
// Reshape, Squeeze, Unsqueeze or Flatten followed by a Reshape becomes that last Reshape alone.
//
//   %t = Transpose(%x) {perm=[0,2,1]}; %y = Transpose(%t) {perm=[0,2,1]}; %z = Relu(%y)
//     =>   %z = Relu(%x)
//   %a = Flatten(%x); %b = Reshape(%a, [6,4])   =>   %b = Reshape(%x, [6,4])
//   %y = Transpose(%x [1,197,192]) {perm=[1,0,2]}   =>   %y = Reshape(%x, [197,1,192])
#include <algorithm>
#include <numeric>
#include <unordered_set>

#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kSimplifyTransposeReshape = knobs::declareKnob({
    .name = "graph.simplify_transpose_reshape",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "merge Transpose pairs and Reshape chains, drop identity Transposes and Reshapes, "
            "and turn Transposes that only move axes of size 1 into Reshapes",
});

namespace {

bool isOp(const ir::Node* node, const char* opType) {
  return node && node->domain.empty() && node->opType == opType;
}

// Transpose's permutation; without the attribute it reverses the axes.
std::optional<std::vector<int64_t>> permutation(const ir::Node& node) {
  if (!node.input(0) || !node.inputs[0]->hasType) return std::nullopt;
  std::vector<int64_t> reversed(node.inputs[0]->shape.rank());
  std::iota(reversed.rbegin(), reversed.rend(), 0);
  auto perm = node.getInts("perm", reversed);
  if (!perm.isOk() || perm->size() != reversed.size()) return std::nullopt;
  return *perm;
}

bool isIdentity(const std::vector<int64_t>& perm) {
  for (size_t i = 0; i < perm.size(); ++i) {
    if (perm[i] != static_cast<int64_t>(i)) return false;
  }
  return true;
}

// Whether the axes of size other than 1 keep their relative order under `perm` (so the
// Transpose's output has its input's elements in the same order). Not for empty tensors, whose
// 0 in a Reshape's shape would mean "copy this dimension".
bool movesOnlyUnitAxes(const ir::Shape& input, const std::vector<int64_t>& perm) {
  const auto rank = static_cast<int64_t>(input.rank());
  int64_t last = -1;
  for (const int64_t axis : perm) {
    if (axis < 0 || axis >= rank || input[static_cast<size_t>(axis)] == 0) return false;
    if (input[static_cast<size_t>(axis)] == 1) continue;
    if (axis < last) return false;
    last = axis;
  }
  return true;
}

// Turns `transpose` into a Reshape to its output shape.
void makeReshape(ir::Graph& graph, ir::Node& transpose) {
  const ir::Shape& shape = transpose.outputs[0]->shape;
  ir::Value* target = graph.addUniqueValue(transpose.name + "_shape");
  target->constant =
      ir::Tensor::fromVector<int64_t>(ir::Shape{static_cast<int64_t>(shape.rank())}, shape.dims());
  target->dtype = ir::DType::kInt64;
  target->shape = target->constant->shape();
  target->hasType = true;
  target->isInitializer = true;
  transpose.opType = "Reshape";
  transpose.attributes.clear();
  transpose.inputs = {transpose.inputs[0], target};
}

// Points the readers of `node`'s output at its input, as when removing an Identity. A graph
// output keeps its name: the input takes it over, unless the input is itself visible (a graph
// input, a constant or another output), which would change the model's interface.
bool bypass(ir::Graph& graph, const ir::Node& node) {
  ir::Value* input = node.inputs[0];
  ir::Value* output = node.outputs[0];
  if (graph.isGraphOutput(output)) {
    if (!input->producer || graph.isGraphOutput(input)) return false;
    const std::string name = output->name;
    graph.renameValue(output, name + ".removed");
    graph.renameValue(input, name);
  }
  graph.replaceAllUses(output, input);
  return true;
}

// The ops whose output is their input's elements in the same order under another shape.
bool isReshapeLike(const ir::Node* node) {
  return isOp(node, "Reshape") || isOp(node, "Squeeze") || isOp(node, "Unsqueeze") ||
         isOp(node, "Flatten");
}

// How many nodes still read `value`, not counting those this pass has already removed.
size_t liveReaders(const ir::Graph& graph, const ir::Value* value,
                   const std::unordered_set<const ir::Node*>& removed) {
  size_t count = 0;
  for (const ir::Node* reader : graph.consumers(value)) count += !removed.count(reader);
  return count;
}

}  // namespace

Status simplifyTransposeReshape(ir::Graph& graph, PassContext& context) {
  std::unordered_set<const ir::Node*> removed;
  std::vector<ir::Node*> skipped;  // inner Transposes now bypassed: removed if nothing reads them
  std::vector<ir::Node*> nodes;
  for (const auto& node : graph.nodes()) nodes.push_back(node.get());
  for (ir::Node* node : nodes) {
    if (!node->input(0) || node->outputs.empty() || !node->outputs[0]) continue;
    if (isOp(node, "Transpose")) {
      auto perm = permutation(*node);
      if (!perm) continue;
      ir::Node* inner = node->inputs[0]->producer;
      auto innerPerm = isOp(inner, "Transpose") ? permutation(*inner) : std::nullopt;
      if (innerPerm) {
        // y[j] = t[perm[j]] = x[innerPerm[perm[j]]]. The inner Transpose may have other
        // readers: it stays for them and this one no longer waits on it.
        std::vector<int64_t> composed(perm->size());
        for (size_t j = 0; j < perm->size(); ++j) composed[j] = (*innerPerm)[(*perm)[j]];
        node->inputs[0] = inner->inputs[0];
        node->attributes["perm"] = ir::Attribute{composed};
        perm = composed;
        skipped.push_back(inner);
        context.note("merged Transpose '{}' into '{}'", inner->name, node->name);
      }
      if (isIdentity(*perm)) {
        if (bypass(graph, *node)) {
          removed.insert(node);
          context.note("removed identity Transpose '{}'", node->name);
        }
        continue;
      }
      if (!node->outputs[0]->hasType || !movesOnlyUnitAxes(node->inputs[0]->shape, *perm)) {
        continue;
      }
      // Then it is a Reshape, and may merge with the Reshapes around it below.
      makeReshape(graph, *node);
      context.note("Transpose '{}' only moves axes of size 1: now a Reshape", node->name);
    }
    if (!isOp(node, "Reshape") || !node->input(1) || !node->inputs[1]->constant) continue;
    // Repeated: an earlier Reshape in the chain may already have been merged into this one's
    // inner node (a Squeeze after a Reshape), leaving the chain one level deeper.
    for (ir::Node* inner = node->inputs[0]->producer;
         isReshapeLike(inner) && !removed.count(inner) && inner->input(0) &&
         !graph.isGraphOutput(inner->outputs[0]) &&
         liveReaders(graph, inner->outputs[0], removed) == 1;
         inner = node->inputs[0]->producer) {
      node->inputs[0] = inner->inputs[0];
      // A 0 in the shape copies the input's dimension at that position (unless allowzero), and
      // the input has just changed: spell the result's shape out instead.
      auto allowZero = node->getInt("allowzero", 0);
      const std::vector<int64_t> requested = node->inputs[1]->constant->toInt64Vector();
      if (allowZero.isOk() && *allowZero == 0 &&
          std::find(requested.begin(), requested.end(), 0) != requested.end()) {
        const ir::Shape& shape = node->outputs[0]->shape;
        ir::Value* spelled = graph.addUniqueValue(node->inputs[1]->name + "_resolved");
        spelled->constant = ir::Tensor::fromVector<int64_t>(
            ir::Shape{static_cast<int64_t>(shape.rank())}, shape.dims());
        spelled->dtype = ir::DType::kInt64;
        spelled->shape = spelled->constant->shape();
        spelled->hasType = true;
        spelled->isInitializer = true;
        node->inputs[1] = spelled;
      }
      removed.insert(inner);  // this Reshape was its only reader
      context.note("merged {} '{}' into Reshape '{}'", inner->opType, inner->name, node->name);
    }
    if (node->inputs[0]->hasType && node->inputs[0]->shape == node->outputs[0]->shape &&
        bypass(graph, *node)) {
      removed.insert(node);
      context.note("removed Reshape '{}' to the same shape", node->name);
    }
  }
  // The bypassed inner Transposes go when nothing reads them any more; walk backwards so a
  // chain of them goes in one sweep.
  for (auto it = skipped.rbegin(); it != skipped.rend(); ++it) {
    ir::Node* inner = *it;
    if (!removed.count(inner) && !graph.isGraphOutput(inner->outputs[0]) &&
        liveReaders(graph, inner->outputs[0], removed) == 0) {
      removed.insert(inner);
    }
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
