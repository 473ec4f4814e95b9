// Removes nodes whose output is their input unchanged: a Cast to the input's own type, an Expand,
// Tile, Reshape, Squeeze, Unsqueeze or Flatten to the input's own shape, a Slice that takes every
// element in order, a Pad by zero on every side, a Concat, Sum, Mean, Max or Min of one input,
// and a multiplication or division by ones or addition or subtraction of zeros that broadcasts to
// the input's shape.
//
//   %c = Cast(%x) {to=FLOAT} on float %x; %y = Mul(%c, 1.0); %z = Relu(%y)   =>   %z = Relu(%x)
#include <algorithm>
#include <unordered_set>

#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kEliminateNoops = knobs::declareKnob({
    .name = "graph.eliminate_noops",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "remove nodes that return their input unchanged (Cast to its own type, Expand or "
            "Reshape to its own shape, whole Slice, zero Pad, one-input Concat, x*1, x+0, ...)",
});

namespace {

// Every element of the constant equals `target` (false for a non-constant).
bool isConstantFilledWith(const ir::Value* value, double target) {
  if (!value || !value->constant) return false;
  const ir::Tensor& tensor = *value->constant;
  for (int64_t i = 0; i < tensor.elementCount(); ++i) {
    if (tensor.elementAsDouble(i) != target) return false;
  }
  return true;
}

// The constant ints of input `index` (an omitted input gives `absent`), or null when the input
// is not known at build time.
std::optional<std::vector<int64_t>> constantInts(const ir::Node& node, size_t index,
                                                 std::vector<int64_t> absent) {
  const ir::Value* value = node.input(index);
  if (!value) return absent;
  if (!value->constant) return std::nullopt;
  return value->constant->toInt64Vector();
}

bool allZero(const std::vector<int64_t>& values) {
  return std::all_of(values.begin(), values.end(), [](int64_t v) { return v == 0; });
}

// The pads of a Pad node, from the attribute before opset 11 and the input after.
std::optional<std::vector<int64_t>> padAmounts(const ir::Node& pad) {
  if (pad.opsetVersion < 11) {
    auto pads = pad.getInts(pad.hasAttribute("paddings") ? "paddings" : "pads", {});
    return pads.isOk() ? std::optional(*pads) : std::nullopt;
  }
  return constantInts(pad, 1, {});
}

// Which input of the arithmetic node `node` passes through when its other operand is the
// identity element (1 for Mul and Div, 0 for Add and Sub), or -1 when none does.
int passThroughOperand(const ir::Node& node) {
  if (node.inputs.size() != 2 || !node.inputs[0] || !node.inputs[1]) return -1;
  const bool multiplicative = node.opType == "Mul" || node.opType == "Div";
  // Adding +0 turns a -0 input into +0: equal values, which is all that the readers compare.
  const double identity = multiplicative ? 1.0 : 0.0;
  if (isConstantFilledWith(node.inputs[1], identity)) return 0;
  // 1 * x and 0 + x; 1 / x and 0 - x are not x.
  const bool commutative = node.opType == "Mul" || node.opType == "Add";
  if (commutative && isConstantFilledWith(node.inputs[0], identity)) return 1;
  return -1;
}

// The input that `node` returns unchanged, if it is a no-op; null otherwise. The caller checks
// that the input's type and shape are the output's.
ir::Value* noopInput(const ir::Node& node) {
  if (!node.domain.empty() || node.outputs.empty() || !node.outputs[0]) return nullptr;
  const std::string& op = node.opType;
  if (op == "Cast" || op == "CastLike" || op == "Expand" || op == "Tile" || op == "Reshape" ||
      op == "Squeeze" || op == "Unsqueeze" || op == "Flatten") {
    // The output's type and shape decide these: the same as the input's is the input.
    return node.input(0);
  }
  if (op == "Slice") {
    // The same shape with positive steps takes every element in order; a negative step over an
    // axis longer than one would reverse it.
    if (node.opsetVersion < 10) return node.input(0);
    auto steps = constantInts(node, 4, {});
    if (!steps) return nullptr;
    for (int64_t step : *steps) {
      if (step <= 0) return nullptr;
    }
    return node.input(0);
  }
  if (op == "Pad") {
    // All-zero pads in any mode: the same shape alone would also allow a shift (+1, -1).
    auto pads = padAmounts(node);
    return pads && allZero(*pads) ? node.input(0) : nullptr;
  }
  if (op == "Concat" || op == "Sum" || op == "Mean" || op == "Max" || op == "Min") {
    return node.inputs.size() == 1 ? node.input(0) : nullptr;
  }
  if (op == "Mul" || op == "Div" || op == "Add" || op == "Sub") {
    const int operand = passThroughOperand(node);
    return operand < 0 ? nullptr : node.inputs[static_cast<size_t>(operand)];
  }
  return nullptr;
}

}  // namespace

Status eliminateNoops(ir::Graph& graph, PassContext& context) {
  std::unordered_set<const ir::Node*> removed;
  for (const auto& nodePtr : graph.nodes()) {
    const ir::Node& node = *nodePtr;
    ir::Value* input = noopInput(node);
    if (!input) continue;
    ir::Value* output = node.outputs[0];
    if (!input->hasType || !output->hasType || input->dtype != output->dtype ||
        input->shape != output->shape) {
      continue;
    }
    if (graph.isGraphOutput(output)) {
      // The graph output keeps its name: the input takes it over, unless the input is itself
      // visible (a graph input, a constant or another output), which would change the interface.
      if (!input->producer || graph.isGraphOutput(input)) continue;
      const std::string name = output->name;
      graph.renameValue(output, name + ".removed");
      graph.renameValue(input, name);
    }
    graph.replaceAllUses(output, input);
    removed.insert(&node);
    context.note("removed no-op {} '{}'", node.opType, node.name);
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
