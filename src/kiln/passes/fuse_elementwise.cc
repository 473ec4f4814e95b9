// Merges connected float32 elementwise nodes whose intermediate values nothing else reads into one
// kiln.FusedElementwise, so the chain reads its inputs and writes its output once instead of
// passing every intermediate through memory.
//
//   %s = Sigmoid "sig" (%x); %y = Mul "silu" (%x, %s)
//     =>   %y = kiln.FusedElementwise "silu" (%x) {program=["Sigmoid x0","Mul x0 t0"]}
//
// A group grows backwards from its last node (the only one whose output leaves the group): a
// producer joins when every reader of its output is already in the group, its output has the
// group's output shape (computing a smaller value at the output's size would repeat its work),
// and the group is below fusion.eltwise_chain.max_ops. The program format is in
// src/kiln/ir/ops/fused_elementwise.h.
#include <algorithm>
#include <limits>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "kiln/ir/op_schema.h"
#include "kiln/ir/ops/fused_elementwise.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kFuseElementwise = knobs::declareKnob({
    .name = "fusion.eltwise_chain",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "merge connected float32 elementwise nodes (activations, broadcasting arithmetic) "
            "into one FusedElementwise",
    .perNode = true,
});

const knobs::Knob kFuseElementwiseMaxOps = knobs::declareKnob({
    .name = "fusion.eltwise_chain.max_ops",
    .kind = knobs::KnobKind::kEnum,
    .choices = {"2", "4", "8", "16", "32"},
    .defaultValue = "16",
    .help = "the most elementwise nodes one FusedElementwise absorbs",
});

namespace {

using ir::EltwiseOpcode;

bool isFloat32(const ir::Value* value) { return value && value->dtype == ir::DType::kFloat32; }

// What one fusable node contributes: its opcode, parameters and the values it reads.
struct Operation {
  EltwiseOpcode opcode = EltwiseOpcode::kRelu;
  std::array<float, 2> params{};
  std::vector<ir::Value*> operands;
};

std::optional<float> floatOf(const ir::Node& node, const char* attr, float defaultValue) {
  auto value = node.getFloat(attr, defaultValue);
  return value.isOk() ? std::optional<float>(*value) : std::nullopt;
}

// A Clip bound: the attribute before opset 11 (float's range by default, as the reference kernel
// reads it), a constant float32 scalar input after (no bound when absent).
std::optional<float> clipBound(const ir::Node& clip, size_t input, const char* attr, bool lower) {
  if (clip.opsetVersion < 11) {
    return floatOf(
        clip, attr,
        lower ? std::numeric_limits<float>::lowest() : std::numeric_limits<float>::max());
  }
  const ir::Value* bound = clip.input(input);
  if (!bound) {
    return lower ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  }
  if (!isFloat32(bound) || !bound->constant || bound->constant->elementCount() != 1) {
    return std::nullopt;
  }
  return bound->constant->data<float>()[0];
}

std::optional<Operation> unaryOperation(const ir::Node& node) {
  static const std::pair<const char*, EltwiseOpcode> kPlain[] = {
      {"Relu", EltwiseOpcode::kRelu},
      {"Sigmoid", EltwiseOpcode::kSigmoid},
      {"Tanh", EltwiseOpcode::kTanh},
      {"Exp", EltwiseOpcode::kExp},
      {"Log", EltwiseOpcode::kLog},
      {"Sqrt", EltwiseOpcode::kSqrt},
      {"Neg", EltwiseOpcode::kNeg},
      {"Abs", EltwiseOpcode::kAbs},
      {"Erf", EltwiseOpcode::kErf},
      {"Reciprocal", EltwiseOpcode::kReciprocal},
      {"HardSwish", EltwiseOpcode::kHardSwish},
      {"HardSigmoid", EltwiseOpcode::kHardSigmoid},
      {"LeakyRelu", EltwiseOpcode::kLeakyRelu},
      {"Clip", EltwiseOpcode::kClip},
      {"Gelu", EltwiseOpcode::kGelu},
  };
  const auto* entry = std::find_if(std::begin(kPlain), std::end(kPlain),
                                   [&](const auto& e) { return node.opType == e.first; });
  if (entry == std::end(kPlain) || !isFloat32(node.input(0))) return std::nullopt;
  Operation op{.opcode = entry->second, .operands = {node.inputs[0]}};
  switch (op.opcode) {
    case EltwiseOpcode::kHardSigmoid: {
      auto alpha = floatOf(node, "alpha", 0.2f);
      auto beta = floatOf(node, "beta", 0.5f);
      if (!alpha || !beta) return std::nullopt;
      op.params = {*alpha, *beta};
      break;
    }
    case EltwiseOpcode::kLeakyRelu: {
      auto alpha = floatOf(node, "alpha", 0.01f);
      if (!alpha) return std::nullopt;
      op.params = {*alpha, 0.0f};
      break;
    }
    case EltwiseOpcode::kClip: {
      auto low = clipBound(node, 1, "min", true);
      auto high = clipBound(node, 2, "max", false);
      if (!low || !high) return std::nullopt;
      op.params = {*low, *high};
      return op;  // its bound inputs are parameters now
    }
    case EltwiseOpcode::kGelu: {
      auto approximate = node.getString("approximate", "none");
      if (!approximate.isOk()) return std::nullopt;
      if (*approximate == "tanh") {
        op.opcode = EltwiseOpcode::kGeluTanh;
      } else if (*approximate != "none") {
        return std::nullopt;
      }
      break;
    }
    default:
      break;
  }
  if (node.inputs.size() != 1) return std::nullopt;
  return op;
}

std::optional<Operation> binaryOperation(const ir::Node& node) {
  // The opset from which each op broadcasts numpy-style (before, B aligned by `axis`).
  static const std::tuple<const char*, EltwiseOpcode, int> kBinary[] = {
      {"Add", EltwiseOpcode::kAdd, 7}, {"Sub", EltwiseOpcode::kSub, 7},
      {"Mul", EltwiseOpcode::kMul, 7}, {"Div", EltwiseOpcode::kDiv, 7},
      {"Pow", EltwiseOpcode::kPow, 7}, {"Max", EltwiseOpcode::kMax, 8},
      {"Min", EltwiseOpcode::kMin, 8},
  };
  const auto* entry = std::find_if(std::begin(kBinary), std::end(kBinary),
                                   [&](const auto& e) { return node.opType == std::get<0>(e); });
  if (entry == std::end(kBinary) || node.opsetVersion < std::get<2>(*entry)) return std::nullopt;
  if (node.inputs.size() != 2 || !isFloat32(node.inputs[0]) || !isFloat32(node.inputs[1])) {
    return std::nullopt;
  }
  // A runtime exponent is left alone: the kernels specialise constant ones (squares, roots).
  if (std::get<1>(*entry) == EltwiseOpcode::kPow && !node.inputs[1]->constant) return std::nullopt;
  return Operation{.opcode = std::get<1>(*entry), .operands = {node.inputs[0], node.inputs[1]}};
}

// The operation `node` contributes to a group, or nothing when it cannot join one.
std::optional<Operation> fusableOperation(const ir::Node& node, const knobs::Route& route) {
  if (!node.domain.empty() || node.outputs.size() != 1 || !isFloat32(node.outputs[0]) ||
      !route.isOn(kFuseElementwise, &node)) {
    return std::nullopt;
  }
  if (auto op = unaryOperation(node)) return op;
  return binaryOperation(node);
}

struct Group {
  std::vector<ir::Node*> nodes;  // in graph order; the last is the sink
  std::vector<ir::Value*> inputs;
  ir::EltwiseProgram program;
};

class GroupFinder {
 public:
  GroupFinder(ir::Graph& graph, const knobs::Route& route) : graph_(graph) {
    maxOps_ = std::stoul(route.value(kFuseElementwiseMaxOps));
    size_t position = 0;
    for (const auto& node : graph.nodes()) {
      order_[node.get()] = position++;
      if (auto op = fusableOperation(*node, route)) operations_.emplace(node.get(), std::move(*op));
      for (const ir::Value* input : node->inputs) {
        if (!input) continue;
        std::vector<ir::Node*>& readers = readers_[input];
        if (readers.empty() || readers.back() != node.get()) readers.push_back(node.get());
      }
    }
  }

  // Groups from the last node backwards, so each group starts at the end of its chain.
  std::vector<Group> findGroups() {
    std::vector<Group> groups;
    const auto& nodes = graph_.nodes();
    for (auto it = nodes.rbegin(); it != nodes.rend(); ++it) {
      ir::Node* sink = it->get();
      if (assigned_.count(sink) || !operations_.count(sink)) continue;
      std::optional<Group> group = grow(sink);
      if (!group) continue;
      for (ir::Node* node : group->nodes) assigned_.insert(node);
      groups.push_back(std::move(*group));
    }
    return groups;
  }

 private:
  // Whether `producer` may join a group whose members are `members` and output shape `shape`.
  bool canJoin(const ir::Node* producer, const std::unordered_set<const ir::Node*>& members,
               const ir::Shape& shape) const {
    if (!producer || members.count(producer) || assigned_.count(producer) ||
        !operations_.count(producer)) {
      return false;
    }
    const ir::Value* output = producer->outputs[0];
    if (output->shape != shape || graph_.isGraphOutput(output)) return false;
    auto readers = readers_.find(output);
    return readers != readers_.end() &&
           std::all_of(readers->second.begin(), readers->second.end(),
                       [&](const ir::Node* reader) { return members.count(reader) > 0; });
  }

  std::optional<Group> grow(ir::Node* sink) {
    const ir::Shape& shape = sink->outputs[0]->shape;
    std::vector<ir::Node*> members = {sink};
    std::unordered_set<const ir::Node*> inGroup = {sink};
    // Nearest producers first (breadth-first from the sink), so the cap keeps the chain's end.
    for (bool grew = true; grew && members.size() < maxOps_;) {
      grew = false;
      for (size_t m = 0; m < members.size() && members.size() < maxOps_; ++m) {
        for (const ir::Value* operand : operations_.at(members[m]).operands) {
          if (members.size() >= maxOps_) break;
          ir::Node* producer = operand->producer;
          if (!canJoin(producer, inGroup, shape)) continue;
          members.push_back(producer);
          inGroup.insert(producer);
          grew = true;
        }
      }
    }
    if (members.size() < 2) return std::nullopt;
    std::sort(members.begin(), members.end(),
              [&](const ir::Node* a, const ir::Node* b) { return order_.at(a) < order_.at(b); });
    return makeGroup(std::move(members), shape);
  }

  // The program of `members` (in graph order), or nothing when no input has the output's shape
  // (an outer-product broadcast such as [3,1] + [1,4]: each input would be read many times).
  std::optional<Group> makeGroup(std::vector<ir::Node*> members, const ir::Shape& shape) const {
    Group group;
    std::unordered_map<const ir::Value*, ir::EltwiseOperand> operandOf;
    for (size_t k = 0; k < members.size(); ++k) {
      const Operation& op = operations_.at(members[k]);
      ir::EltwiseInstruction instruction{.opcode = op.opcode, .params = op.params};
      for (size_t i = 0; i < op.operands.size(); ++i) {
        ir::Value* value = op.operands[i];
        auto [it, added] = operandOf.emplace(
            value, ir::EltwiseOperand{true, static_cast<int>(group.inputs.size())});
        if (added) group.inputs.push_back(value);
        instruction.operands[i] = it->second;
      }
      group.program.instructions.push_back(instruction);
      operandOf[members[k]->outputs[0]] = ir::EltwiseOperand{false, static_cast<int>(k)};
    }
    const bool someInputIsFull = std::any_of(group.inputs.begin(), group.inputs.end(),
                                             [&](const ir::Value* v) { return v->shape == shape; });
    if (!someInputIsFull) return std::nullopt;
    group.nodes = std::move(members);
    return group;
  }

  ir::Graph& graph_;
  size_t maxOps_ = 16;
  std::unordered_map<const ir::Node*, size_t> order_;
  std::unordered_map<const ir::Node*, Operation> operations_;
  std::unordered_map<const ir::Value*, std::vector<ir::Node*>> readers_;
  std::unordered_set<const ir::Node*> assigned_;
};

}  // namespace

Status fuseElementwise(ir::Graph& graph, PassContext& context) {
  std::vector<Group> groups = GroupFinder(graph, context.route).findGroups();
  std::unordered_set<const ir::Node*> replaced;
  std::vector<std::pair<ir::Node*, std::string>> names;
  for (Group& group : groups) {
    ir::Node* sink = group.nodes.back();
    ir::Value* output = sink->outputs[0];
    ir::Node* fused = graph.insertNode("FusedElementwise", sink);
    fused->domain = ir::kKilnDomain;
    fused->opsetVersion = 1;
    fused->inputs = group.inputs;
    fused->outputs = {output};
    fused->attributes["program"] = ir::Attribute{group.program.toStrings()};
    output->producer = fused;
    std::vector<std::string> parts;
    for (ir::Node* node : group.nodes) {
      parts.push_back(fmt::format("{} '{}'", node->opType, node->name));
      replaced.insert(node);
    }
    // The fused node keeps the last node's name, so per-node knobs naming it still apply.
    names.emplace_back(fused, sink->name);
    context.note("fused {} into FusedElementwise", fmt::join(parts, " + "));
  }
  graph.removeNodes([&](const ir::Node& node) { return replaced.count(&node) > 0; });
  for (auto& [node, name] : names) node->name = name;
  return Status::ok();
}

}  // namespace kiln::passes
