// Reassociates two constant steps of one kind in a row into one, with their constants combined at
// build time: (x * c1) * c2 = x * (c1 * c2), (x + c1) - c2 = x + (c1 - c2), (x / c1) * c2 =
// x / (c1 / c2), and so on for floating-point tensors (integer division does not reassociate).
//
//   %a = Mul "m1" (%x, %c1); %y = Mul "m2" (%a, %c2)   =>   %y = Mul "m1" (%x, %m1_constant)
#include <algorithm>
#include <unordered_set>

#include "kiln/passes/passes.h"
#include "kiln/reference/executor.h"

namespace kiln::passes {

const knobs::Knob kReassociateConstants = knobs::declareKnob({
    .name = "graph.reassociate_constants",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "combine two Mul/Div or two Add/Sub by constants in a row into one by the constants "
            "combined at build time",
});

namespace {

// An Add, Sub, Mul or Div in the default domain with one runtime operand `data` and one
// constant operand; the constant second for Sub and Div (c - x and c / x do not chain).
struct ConstantStep {
  ir::Value* data = nullptr;
  ir::Value* constant = nullptr;
  bool additive = false;  // Add or Sub, else Mul or Div
  bool inverse = false;   // Sub or Div
};

std::optional<ConstantStep> constantStep(const ir::Node& node) {
  const std::string& op = node.opType;
  if (!node.domain.empty() || node.inputs.size() != 2 || node.outputs.size() != 1 ||
      !node.outputs[0] || !node.inputs[0] || !node.inputs[1] ||
      (op != "Add" && op != "Sub" && op != "Mul" && op != "Div") ||
      !ir::isFloating(node.outputs[0]->dtype) || node.opsetVersion < 7) {
    // Before opset 7 these ops broadcast by their own attributes.
    return std::nullopt;
  }
  ConstantStep step{.additive = op == "Add" || op == "Sub", .inverse = op == "Sub" || op == "Div"};
  if (node.inputs[1]->constant && !node.inputs[0]->constant) {
    step.data = node.inputs[0];
    step.constant = node.inputs[1];
  } else if (!step.inverse && node.inputs[0]->constant && !node.inputs[1]->constant) {
    step.data = node.inputs[1];
    step.constant = node.inputs[0];
  } else {
    return std::nullopt;
  }
  return step;
}

// Numpy's broadcast of two shapes, or null when they do not broadcast.
std::optional<ir::Shape> broadcastShape(const ir::Shape& a, const ir::Shape& b) {
  const size_t rank = std::max(a.rank(), b.rank());
  std::vector<int64_t> dims(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.rank() ? 1 : a[i - (rank - a.rank())];
    const int64_t db = i < rank - b.rank() ? 1 : b[i - (rank - b.rank())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    dims[i] = da == 1 ? db : da;
  }
  return ir::Shape(dims);
}

// c1 `op` c2 with ONNX's broadcasting, by the reference kernel of `op`.
Result<ir::Tensor> combine(const std::string& op, int opset, const ir::Value& c1,
                           const ir::Value& c2, const ir::Shape& shape) {
  ir::Node node;
  node.name = "reassociate";
  node.opType = op;
  node.opsetVersion = opset;
  ir::Value result;
  result.dtype = c1.dtype;
  result.shape = shape;
  result.hasType = true;
  node.outputs = {&result};
  const ir::Tensor* inputs[2] = {&*c1.constant, &*c2.constant};
  KILN_ASSIGN_OR_RETURN(std::vector<ir::Tensor> outputs, reference::evaluateNode(node, inputs));
  return std::move(outputs[0]);
}

}  // namespace

Status reassociateConstants(ir::Graph& graph, PassContext& context) {
  std::unordered_set<const ir::Node*> removed;
  for (const auto& nodePtr : graph.nodes()) {
    ir::Node& outer = *nodePtr;
    auto second = constantStep(outer);
    if (!second) continue;
    ir::Node* inner = second->data->producer;
    if (!inner || graph.isGraphOutput(second->data) || graph.consumers(second->data).size() != 1) {
      continue;
    }
    auto first = constantStep(*inner);
    if (!first || first->additive != second->additive ||
        first->constant->dtype != second->constant->dtype) {
      continue;
    }
    // (x op1 c1) op2 c2 = x op1 (c1 op c2), where op is the plain op (Add, Mul) when both steps
    // are plain or both inverse ((x - c1) - c2 = x - (c1 + c2)), the inverse op when they
    // differ ((x - c1) + c2 = x - (c1 - c2)).
    const bool same = first->inverse == second->inverse;
    const char* op = first->additive ? (same ? "Add" : "Sub") : (same ? "Mul" : "Div");
    const ir::Tensor& c1 = *first->constant->constant;
    const ir::Tensor& c2 = *second->constant->constant;
    auto shape = broadcastShape(c1.shape(), c2.shape());
    // The combined constant may not outgrow both: x * c[N,1] * c[1,M] would hold N*M values.
    if (!shape || shape->elementCount() > std::max(c1.elementCount(), c2.elementCount())) {
      continue;
    }
    KILN_ASSIGN_OR_RETURN(ir::Tensor combined, combine(op, outer.opsetVersion, *first->constant,
                                                       *second->constant, *shape));
    ir::Value* value = graph.addConstant(inner->name + "_constant", std::move(combined));
    context.note("reassociated {} '{}' into {} '{}' by a combined constant", outer.opType,
                 outer.name, inner->opType, inner->name);
    // The first step, with the combined constant, now writes the second's output (keeping its
    // name for readers and graph outputs).
    ir::Value* out = outer.outputs[0];
    second->data->producer = nullptr;
    inner->inputs = {first->data, value};
    inner->outputs[0] = out;
    out->producer = inner;
    outer.outputs[0] = nullptr;
    removed.insert(&outer);
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
