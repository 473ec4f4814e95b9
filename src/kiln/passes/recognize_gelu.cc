// Recognizes GELU written out with Erf (exact) or Tanh (the tanh approximation) and replaces it
// by one Gelu node.
//
//   %u = Div(%x, 1.4142135); %e = Erf(%u); %a = Add(%e, 1); %m = Mul(%x, %a); %y = Mul(%m, 0.5)
//     =>   %y = Gelu(%x) {approximate="none"}
#include <algorithm>
#include <cmath>
#include <numbers>
#include <unordered_set>

#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kRecognizeGelu = knobs::declareKnob({
    .name = "graph.recognize_gelu",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "replace GELU written with Erf or Tanh (exact or tanh approximation) by one Gelu node",
});

namespace {

// The single node that reads `value`, if exactly one node reads it and it is not a graph
// output: only then may the node producing `value` disappear into the Gelu.
ir::Node* soleReader(const ir::Graph& graph, const ir::Value* value) {
  if (!value || graph.isGraphOutput(value)) return nullptr;
  std::vector<ir::Node*> readers = graph.consumers(value);
  return readers.size() == 1 ? readers[0] : nullptr;
}

bool isOp(const ir::Node* node, const char* opType) {
  return node && node->domain.empty() && node->opType == opType && node->inputs.size() == 2;
}

// The operand of a two-input node that is not `known`, or null when neither or both are.
ir::Value* otherOperand(const ir::Node& node, const ir::Value* known) {
  if (node.inputs.size() != 2) return nullptr;
  if (node.inputs[0] == known && node.inputs[1] != known) return node.inputs[1];
  if (node.inputs[1] == known && node.inputs[0] != known) return node.inputs[0];
  return nullptr;
}

// Whether `value` is a one-element float constant equal to `expected` within 1e-6 relative
// (exporters write these constants rounded to float32), of a rank that does not broadcast the
// result beyond x's shape.
bool isConstant(const ir::Value* value, double expected, const ir::Value* x) {
  if (!value || !value->constant || value->constant->elementCount() != 1 ||
      !ir::isFloating(value->constant->dtype()) || value->shape.rank() > x->shape.rank()) {
    return false;
  }
  return std::fabs(value->constant->elementAsDouble(0) - expected) <= 1e-6 * std::fabs(expected);
}

// `node` computes `input` * `factor` as Mul(input, c) or Mul(c, input) with c == factor, or as
// Div(input, c) with c == 1 / factor.
bool scales(const ir::Node* node, const ir::Value* input, double factor, const ir::Value* x) {
  if (isOp(node, "Mul")) return isConstant(otherOperand(*node, input), factor, x);
  return isOp(node, "Div") && node->inputs[0] == input &&
         isConstant(node->inputs[1], 1 / factor, x);
}

struct GeluMatch {
  ir::Value* x = nullptr;
  const char* approximate = "none";
  ir::Node* last = nullptr;  // whose output the Gelu takes over
  std::vector<ir::Node*> nodes;
};

// From `inner`, the Erf or Tanh node, to the end: Add(inner, 1), then 0.5 * x * that, in the
// orders exporters write: (x * a) * 0.5, x * (a * 0.5), (x * 0.5) * a.
bool matchTail(const ir::Graph& graph, const ir::Node& inner, GeluMatch& match) {
  ir::Node* addOne = soleReader(graph, inner.outputs[0]);
  if (!isOp(addOne, "Add") || !isConstant(otherOperand(*addOne, inner.outputs[0]), 1.0, match.x)) {
    return false;
  }
  match.nodes.push_back(addOne);
  ir::Value* onePlus = addOne->outputs[0];
  ir::Node* product = soleReader(graph, onePlus);
  if (!product) return false;
  match.nodes.push_back(product);
  if (scales(product, onePlus, 0.5, match.x)) {
    // x * (a * 0.5)
    ir::Node* times = soleReader(graph, product->outputs[0]);
    if (!isOp(times, "Mul") || otherOperand(*times, product->outputs[0]) != match.x) return false;
    match.nodes.push_back(times);
    match.last = times;
    return true;
  }
  if (!isOp(product, "Mul")) return false;
  ir::Value* other = otherOperand(*product, onePlus);
  if (!other) return false;
  if (other == match.x) {
    // (x * a) * 0.5
    ir::Node* half = soleReader(graph, product->outputs[0]);
    if (!scales(half, product->outputs[0], 0.5, match.x)) return false;
    match.nodes.push_back(half);
    match.last = half;
    return true;
  }
  // (x * 0.5) * a, where x * 0.5 is read by nothing else.
  ir::Node* half = other->producer;
  if (!half || soleReader(graph, other) != product || !scales(half, match.x, 0.5, match.x)) {
    return false;
  }
  match.nodes.push_back(half);
  match.last = product;
  return true;
}

// x / sqrt(2) -> Erf -> tail.
std::optional<GeluMatch> matchExact(const ir::Graph& graph, ir::Node& erf) {
  ir::Value* scaled = erf.input(0);
  if (!scaled || !scaled->producer || soleReader(graph, scaled) != &erf) return std::nullopt;
  ir::Node* scale = scaled->producer;
  if (!isOp(scale, "Mul") && !isOp(scale, "Div")) return std::nullopt;
  GeluMatch match;
  // The operand that is not the constant is x; try both for Mul.
  for (ir::Value* candidate : scale->inputs) {
    if (candidate && !candidate->constant &&
        scales(scale, candidate, 1 / std::numbers::sqrt2, candidate)) {
      match.x = candidate;
    }
  }
  if (!match.x || !ir::isFloating(match.x->dtype)) return std::nullopt;
  match.nodes = {scale, &erf};
  if (!matchTail(graph, erf, match)) return std::nullopt;
  return match;
}

// x^3 as Pow(x, 3), Mul(x, Mul(x, x)) or Mul(Mul(x, x), x); the nodes go to `nodes`.
bool isCube(const ir::Graph& graph, ir::Node* node, const ir::Value* x,
            std::vector<ir::Node*>& nodes) {
  if (!node) return false;
  if (node->domain.empty() && node->opType == "Pow" && node->inputs.size() == 2 &&
      node->inputs[0] == x) {
    const ir::Value* exponent = node->inputs[1];
    if (!exponent->constant || exponent->constant->elementCount() != 1 ||
        exponent->constant->elementAsDouble(0) != 3.0 || exponent->shape.rank() > x->shape.rank()) {
      return false;
    }
    nodes.push_back(node);
    return true;
  }
  if (!isOp(node, "Mul")) return false;
  const ir::Value* square = otherOperand(*node, x);
  if (!square || !square->producer || soleReader(graph, square) != node) return false;
  ir::Node* squareNode = square->producer;
  if (!isOp(squareNode, "Mul") || squareNode->inputs[0] != x || squareNode->inputs[1] != x) {
    return false;
  }
  nodes.push_back(squareNode);
  nodes.push_back(node);
  return true;
}

// sqrt(2/pi) * (x + 0.044715 * x^3) -> Tanh -> tail.
std::optional<GeluMatch> matchTanh(const ir::Graph& graph, ir::Node& tanh) {
  ir::Value* scaled = tanh.input(0);
  if (!scaled || !scaled->producer || soleReader(graph, scaled) != &tanh) return std::nullopt;
  ir::Node* scale = scaled->producer;
  if (!isOp(scale, "Mul")) return std::nullopt;
  const double sqrt2OverPi = std::sqrt(2 / std::numbers::pi);
  // The sum is the operand of the scale that is not the constant.
  ir::Value* sum = nullptr;
  for (ir::Value* candidate : scale->inputs) {
    if (candidate && !candidate->constant && candidate->producer &&
        isConstant(otherOperand(*scale, candidate), sqrt2OverPi, candidate)) {
      sum = candidate;
    }
  }
  if (!sum || soleReader(graph, sum) != scale) return std::nullopt;
  ir::Node* add = sum->producer;
  if (!isOp(add, "Add")) return std::nullopt;
  // One addend is x, the other 0.044715 * x^3.
  for (int side = 0; side < 2; ++side) {
    GeluMatch match;
    match.x = add->inputs[side];
    ir::Value* cubic = add->inputs[1 - side];
    if (!match.x || !cubic || match.x == cubic || !cubic->producer ||
        !ir::isFloating(match.x->dtype) || soleReader(graph, cubic) != add) {
      continue;
    }
    ir::Node* coefficient = cubic->producer;
    if (!isOp(coefficient, "Mul")) continue;
    bool found = false;
    for (ir::Value* cube : coefficient->inputs) {
      if (found || !cube || !cube->producer || soleReader(graph, cube) != coefficient ||
          !isConstant(otherOperand(*coefficient, cube), 0.044715, match.x)) {
        continue;
      }
      std::vector<ir::Node*> cubeNodes;
      if (!isCube(graph, cube->producer, match.x, cubeNodes)) continue;
      match.nodes = cubeNodes;
      found = true;
    }
    if (!found) continue;
    match.approximate = "tanh";
    match.nodes.insert(match.nodes.end(), {coefficient, add, scale, &tanh});
    if (matchTail(graph, tanh, match)) return match;
  }
  return std::nullopt;
}

}  // namespace

Status recognizeGelu(ir::Graph& graph, PassContext& context) {
  const auto opset = graph.opsetImports.find("");
  const int modelOpset = opset == graph.opsetImports.end() ? 0 : opset->second;
  std::unordered_set<const ir::Node*> removed;
  // Collect first: the loop below inserts nodes, which would invalidate iteration.
  std::vector<ir::Node*> candidates;
  for (const auto& node : graph.nodes()) candidates.push_back(node.get());
  for (ir::Node* node : candidates) {
    if (removed.count(node) || !node->domain.empty() || node->inputs.size() != 1) continue;
    std::optional<GeluMatch> match;
    if (node->opType == "Erf") match = matchExact(graph, *node);
    if (node->opType == "Tanh") match = matchTanh(graph, *node);
    if (!match) continue;
    ir::Value* output = match->last->outputs[0];
    // A constant of higher rank than x would have broadcast the result to another shape.
    if (output->shape != match->x->shape || output->dtype != match->x->dtype) continue;
    const std::string name = match->last->name;
    ir::Node* gelu = graph.insertNode("Gelu", match->last);
    gelu->name = name;
    gelu->opsetVersion = std::max(20, modelOpset);
    gelu->inputs = {match->x};
    gelu->outputs = {output};
    gelu->attributes["approximate"] = ir::Attribute{std::string(match->approximate)};
    output->producer = gelu;
    for (ir::Node* matched : match->nodes) removed.insert(matched);
    context.note("recognized Gelu '{}' (approximate={}, {} nodes)", name, match->approximate,
                 match->nodes.size());
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  return Status::ok();
}

}  // namespace kiln::passes
