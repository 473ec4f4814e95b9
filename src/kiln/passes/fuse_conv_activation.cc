// Fuses a Conv with what follows it (a constant per-channel bias Add when the Conv has no bias, a
// residual Add, an activation) into one kiln FusedConv, so the result is written once.
//
//   %c = Conv "c" (%x, %w); %s = Add (%c, %skip); %y = Relu (%s)
//     =>   %y = kiln.FusedConv "c" (%x, %w, _, %skip) {activation="Relu", ...}
#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/ir/op_schema.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kFuseConvActivation = knobs::declareKnob({
    .name = "fusion.conv_act",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "fuse Conv with a following bias Add, residual Add and activation into FusedConv",
    .perNode = true,
});

const knobs::Knob kFuseConvResidual = knobs::declareKnob({
    .name = "fusion.conv_residual",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "let FusedConv absorb a residual Add (Conv output + a tensor of the same shape)",
    .perNode = true,
});

namespace {

ir::Attribute floatAttribute(float value) { return ir::Attribute{value}; }

// A Clip bound: the attribute before opset 11, a constant scalar input after. Null when the
// bound is not known at build time or is not exactly a float (the fused ops carry floats).
std::optional<float> clipBound(const ir::Node& clip, size_t input, const char* attr, bool lower) {
  const float unbounded =
      lower ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  if (clip.opsetVersion < 11) {
    // The attributes default to float's range, which bounds nothing a float tensor holds.
    auto value = clip.getFloat(attr, unbounded);
    return value.isOk() ? std::optional<float>(*value) : std::nullopt;
  }
  const ir::Value* bound = clip.input(input);
  if (!bound) return unbounded;
  if (!bound->constant || bound->constant->elementCount() != 1) return std::nullopt;
  const double value = bound->constant->elementAsDouble(0);
  if (static_cast<double>(static_cast<float>(value)) != value) return std::nullopt;
  return static_cast<float>(value);
}

// Attributes of the activation nodes read with defaults; null on a malformed attribute (the
// node is then left for its own kernel to report).
std::optional<float> floatOf(const ir::Node& node, const char* attr, float defaultValue) {
  auto value = node.getFloat(attr, defaultValue);
  return value.isOk() ? std::optional<float>(*value) : std::nullopt;
}

// Conv's output and each value the chain passes on must feed only the next node of the chain.
bool onlyFeeds(const ir::Graph& graph, const ir::Value* value, const ir::Node* next) {
  if (!value || graph.isGraphOutput(value)) return false;
  const std::vector<ir::Node*> readers = graph.consumers(value);
  if (readers.size() != 1 || readers[0] != next) return false;
  return std::count(next->inputs.begin(), next->inputs.end(), value) == 1;
}

// The single reader of `value` if it is an ONNX-domain node of type `opType`.
ir::Node* soleReader(const ir::Graph& graph, const ir::Value* value, const char* opType) {
  if (!value || graph.isGraphOutput(value)) return nullptr;
  const std::vector<ir::Node*> readers = graph.consumers(value);
  if (readers.size() != 1 || !readers[0]->domain.empty() || readers[0]->opType != opType) {
    return nullptr;
  }
  return onlyFeeds(graph, value, readers[0]) ? readers[0] : nullptr;
}

// The Add's operand other than `value`.
ir::Value* otherOperand(const ir::Node& add, const ir::Value* value) {
  if (add.inputs.size() != 2) return nullptr;
  return add.inputs[0] == value ? add.inputs[1] : add.inputs[0];
}

// A constant that broadcasts as [1, M, 1, ...] against the Conv output `y` gives the per-channel
// bias it adds; null otherwise.
std::optional<ir::Tensor> channelBias(const ir::Value& addend, const ir::Value& y) {
  if (!addend.constant || addend.dtype != y.dtype || addend.shape.rank() > y.shape.rank()) {
    return std::nullopt;
  }
  const int64_t channels = y.shape[1];
  const size_t offset = y.shape.rank() - addend.shape.rank();
  int64_t varying = 1;  // the addend's extent along the channel axis
  for (size_t i = 0; i < addend.shape.rank(); ++i) {
    const int64_t extent = addend.shape[i];
    if (offset + i == 1 && (extent == channels || extent == 1)) {
      varying = extent;
    } else if (extent != 1) {
      return std::nullopt;
    }
  }
  ir::Tensor doubles(ir::DType::kFloat64, ir::Shape{channels});
  auto out = doubles.mutableData<double>();
  for (int64_t m = 0; m < channels; ++m) {
    out[static_cast<size_t>(m)] = addend.constant->elementAsDouble(varying == 1 ? 0 : m);
  }
  return doubles.castTo(y.dtype);
}

// x * Sigmoid(x) as exporters write SiLU: `value` read by exactly a Sigmoid and a Mul of
// `value` and that Sigmoid's output, which nothing else reads. The (Sigmoid, Mul) pair.
std::optional<std::pair<ir::Node*, ir::Node*>> matchSilu(const ir::Graph& graph,
                                                         const ir::Value* value) {
  if (!value || graph.isGraphOutput(value)) return std::nullopt;
  const std::vector<ir::Node*> readers = graph.consumers(value);
  if (readers.size() != 2) return std::nullopt;
  for (int first = 0; first < 2; ++first) {
    ir::Node* sigmoid = readers[static_cast<size_t>(first)];
    ir::Node* mul = readers[static_cast<size_t>(1 - first)];
    if (!sigmoid->domain.empty() || sigmoid->opType != "Sigmoid" || sigmoid->inputs.size() != 1 ||
        sigmoid->outputs.size() != 1 || !sigmoid->outputs[0]) {
      continue;
    }
    if (!mul->domain.empty() || mul->opType != "Mul" || mul->inputs.size() != 2 ||
        mul->outputs.size() != 1 || !mul->outputs[0]) {
      continue;
    }
    const ir::Value* gate = sigmoid->outputs[0];
    const bool operands = (mul->inputs[0] == value && mul->inputs[1] == gate) ||
                          (mul->inputs[1] == value && mul->inputs[0] == gate);
    if (!operands || !onlyFeeds(graph, gate, mul)) continue;
    if (mul->outputs[0]->dtype != value->dtype || mul->outputs[0]->shape != value->shape) continue;
    return std::make_pair(sigmoid, mul);
  }
  return std::nullopt;
}

struct ConvChain {
  ir::Node* conv = nullptr;
  ir::Node* biasAdd = nullptr;
  std::optional<ir::Tensor> bias;
  ir::Node* residualAdd = nullptr;
  ir::Value* residual = nullptr;
  ir::Node* activation = nullptr;
  ir::Node* sigmoid = nullptr;  // Silu: the Sigmoid whose output the Mul (activation) takes
  std::map<std::string, ir::Attribute> activationAttributes;
  ir::Value* output = nullptr;  // what the fused node writes: the last node's output
  ir::Node* last = nullptr;
};

std::optional<ConvChain> matchChain(const ir::Graph& graph, ir::Node& conv,
                                    const knobs::Route& route) {
  if (!conv.domain.empty() || conv.opType != "Conv" || conv.outputs.size() != 1 ||
      !conv.outputs[0] || !route.isOn(kFuseConvActivation, &conv)) {
    return std::nullopt;
  }
  ConvChain chain;
  chain.conv = &conv;
  chain.last = &conv;
  ir::Value* y = conv.outputs[0];
  chain.output = y;
  if (y->shape.rank() < 3 || !ir::isFloating(y->dtype)) return std::nullopt;

  if (!conv.hasInput(2)) {
    if (ir::Node* add = soleReader(graph, chain.output, "Add")) {
      const ir::Value* addend = otherOperand(*add, chain.output);
      if (addend && add->outputs[0] && (chain.bias = channelBias(*addend, *y))) {
        chain.biasAdd = add;
        chain.last = add;
        chain.output = add->outputs[0];
      }
    }
  }
  if (route.isOn(kFuseConvResidual, &conv)) {
    if (ir::Node* add = soleReader(graph, chain.output, "Add")) {
      ir::Value* other = otherOperand(*add, chain.output);
      if (other && other != chain.output && other->dtype == y->dtype && other->shape == y->shape &&
          add->outputs[0]) {
        chain.residualAdd = add;
        chain.residual = other;
        chain.last = add;
        chain.output = add->outputs[0];
      }
    }
  }
  const std::vector<ir::Node*> readers = graph.consumers(chain.output);
  if (readers.size() == 1 && onlyFeeds(graph, chain.output, readers[0]) &&
      readers[0]->input(0) == chain.output && readers[0]->outputs.size() == 1 &&
      readers[0]->outputs[0]) {
    if (auto attributes = fusedActivationAttributes(*readers[0])) {
      chain.activation = readers[0];
      chain.activationAttributes = std::move(*attributes);
      chain.last = readers[0];
      chain.output = readers[0]->outputs[0];
    }
  } else if (auto silu = matchSilu(graph, chain.output)) {
    chain.sigmoid = silu->first;
    chain.activation = silu->second;
    chain.activationAttributes = {{"activation", ir::Attribute{std::string("Silu")}}};
    chain.last = silu->second;
    chain.output = silu->second->outputs[0];
  }
  if (!chain.residualAdd && !chain.activation) return std::nullopt;  // nothing worth a new op
  return chain;
}

}  // namespace

std::optional<std::map<std::string, ir::Attribute>> fusedActivationAttributes(
    const ir::Node& node) {
  if (!node.domain.empty() || node.outputs.size() != 1) return std::nullopt;
  std::map<std::string, ir::Attribute> attributes = {{"activation", ir::Attribute{node.opType}}};
  const std::string& op = node.opType;
  if (op == "Relu" || op == "Sigmoid" || op == "Tanh" || op == "HardSwish") {
    if (node.inputs.size() != 1) return std::nullopt;
  } else if (op == "LeakyRelu") {
    auto alpha = floatOf(node, "alpha", 0.01f);
    if (!alpha) return std::nullopt;
    attributes["activation_alpha"] = floatAttribute(*alpha);
  } else if (op == "HardSigmoid") {
    auto alpha = floatOf(node, "alpha", 0.2f);
    auto beta = floatOf(node, "beta", 0.5f);
    if (!alpha || !beta) return std::nullopt;
    attributes["activation_alpha"] = floatAttribute(*alpha);
    attributes["activation_beta"] = floatAttribute(*beta);
  } else if (op == "Clip") {
    auto low = clipBound(node, 1, "min", true);
    auto high = clipBound(node, 2, "max", false);
    if (!low || !high) return std::nullopt;
    attributes["activation_alpha"] = floatAttribute(*low);
    attributes["activation_beta"] = floatAttribute(*high);
  } else if (op == "Gelu") {
    // The tanh approximation is another function, with an activation of its own.
    auto approximate = node.getString("approximate", "none");
    if (!approximate.isOk() || (*approximate != "none" && *approximate != "tanh")) {
      return std::nullopt;
    }
    if (*approximate == "tanh") attributes["activation"] = ir::Attribute{std::string("GeluTanh")};
  } else {
    return std::nullopt;
  }
  return attributes;
}

Status fuseConvActivation(ir::Graph& graph, PassContext& context) {
  std::vector<ConvChain> chains;
  for (const auto& node : graph.nodes()) {
    if (auto chain = matchChain(graph, *node, context.route)) chains.push_back(std::move(*chain));
  }
  std::vector<const ir::Node*> replaced;
  std::vector<std::pair<ir::Node*, std::string>> names;
  for (ConvChain& chain : chains) {
    // Two Convs can match the same residual Add (ResNet's downsample branch: Add(conv3,
    // downsample)); the first in node order takes it, and the other stays as it is.
    bool taken = false;
    for (const ir::Node* node :
         {chain.biasAdd, chain.residualAdd, chain.sigmoid, chain.activation}) {
      taken |= node && std::find(replaced.begin(), replaced.end(), node) != replaced.end();
    }
    if (taken) continue;
    ir::Node& conv = *chain.conv;
    // Just before the chain's last node: X precedes the Conv and the residual precedes its Add.
    ir::Node* fused = graph.insertNode("FusedConv", chain.last);
    fused->domain = ir::kKilnDomain;
    fused->opsetVersion = conv.opsetVersion;
    fused->attributes = conv.attributes;
    fused->attributes.insert(chain.activationAttributes.begin(), chain.activationAttributes.end());
    fused->inputs = {conv.input(0), conv.input(1), conv.input(2), chain.residual};
    if (chain.bias) {
      ir::Value* bias = graph.addUniqueValue(conv.name + "_bias");
      bias->dtype = chain.bias->dtype();
      bias->shape = chain.bias->shape();
      bias->hasType = true;
      bias->constant = std::move(*chain.bias);
      bias->isInitializer = true;
      fused->inputs[2] = bias;
    }
    while (!fused->inputs.empty() && !fused->inputs.back()) fused->inputs.pop_back();
    fused->outputs = {chain.output};
    chain.output->producer = fused;
    std::string parts = fmt::format("Conv '{}'", conv.name);
    for (ir::Node* node : {chain.biasAdd, chain.residualAdd, chain.sigmoid, chain.activation}) {
      if (!node) continue;
      parts += fmt::format(" + {} '{}'", node->opType, node->name);
      replaced.push_back(node);
    }
    replaced.push_back(&conv);
    // The fused node keeps the Conv's name, so per-node knobs naming the Conv still apply.
    names.emplace_back(fused, conv.name);
    context.note("fused {} into FusedConv", parts);
  }
  graph.removeNodes([&](const ir::Node& node) {
    return std::find(replaced.begin(), replaced.end(), &node) != replaced.end();
  });
  for (auto& [node, name] : names) node->name = name;
  return Status::ok();
}

}  // namespace kiln::passes
