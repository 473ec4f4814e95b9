// Fuses a MatMul by a constant matrix with the bias Add and activation after it, and a Gemm with
// the activation after it, into one kiln FusedGemm (A may be batched: [..., K] x [K, N] + [N]).
//
//   %m = MatMul "fc" (%x, %w); %b = Add (%m, %bias); %y = Relu (%b)
//     =>   %y = kiln.FusedGemm "fc" (%x, %w, %bias) {activation="Relu"}
//
// A Reshape between the product and the activation moves after the fused node.
#include <algorithm>

#include "kiln/ir/op_schema.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kFuseGemmActivation = knobs::declareKnob({
    .name = "fusion.gemm_act",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "fuse MatMul (constant weight) + bias Add + activation, or Gemm + activation, into "
            "FusedGemm",
    .perNode = true,
});

namespace {

// The one node reading `value` (once), when `value` is not also a graph output.
ir::Node* soleReader(const ir::Graph& graph, const ir::Value* value) {
  if (!value || graph.isGraphOutput(value)) return nullptr;
  const std::vector<ir::Node*> readers = graph.consumers(value);
  if (readers.size() != 1) return nullptr;
  const auto& inputs = readers[0]->inputs;
  return std::count(inputs.begin(), inputs.end(), value) == 1 ? readers[0] : nullptr;
}

bool isFusableFloat(ir::DType dtype) {
  return dtype == ir::DType::kFloat16 || dtype == ir::DType::kFloat32 ||
         dtype == ir::DType::kFloat64;
}

// A constant addend that varies only along the last axis of `y` ([N], [1, N], [1], ...): the
// Gemm bias C it amounts to, as a rank-1 tensor (or a scalar), else null.
std::optional<ir::Tensor> lastAxisBias(const ir::Value& addend, const ir::Value& y) {
  if (!addend.constant || addend.dtype != y.dtype || addend.shape.rank() > y.shape.rank()) {
    return std::nullopt;
  }
  const size_t rank = addend.shape.rank();
  for (size_t i = 0; i + 1 < rank; ++i) {
    if (addend.shape[i] != 1) return std::nullopt;
  }
  const int64_t n = y.shape[y.shape.rank() - 1];
  if (rank > 0 && addend.shape[rank - 1] != 1 && addend.shape[rank - 1] != n) return std::nullopt;
  return rank <= 1 ? *addend.constant
                   : addend.constant->reshaped(ir::Shape{addend.shape[rank - 1]});
}

struct GemmChain {
  ir::Node* product = nullptr;  // the MatMul or Gemm
  ir::Node* biasAdd = nullptr;
  ir::Value* bias = nullptr;          // an existing constant usable as C as it is
  std::optional<ir::Tensor> newBias;  // or a reshaped copy to add
  ir::Node* activation = nullptr;
  std::map<std::string, ir::Attribute> activationAttributes;
  ir::Node* reshape = nullptr;  // between the product and the activation; moves after them
  ir::Value* output = nullptr;
  ir::Node* last = nullptr;
};

// The activation reading `value`, if FusedGemm can apply it: directly, or through a Reshape
// (GPT-2's MLP: Gemm [S, 4E] -> Reshape [1, S, 4E] -> Gelu), which then moves after the fused
// node, an elementwise activation being the same before or after a reshape.
void matchActivation(const ir::Graph& graph, GemmChain& chain) {
  ir::Node* reader = soleReader(graph, chain.output);
  ir::Node* reshape = nullptr;
  if (reader && reader->domain.empty() && reader->opType == "Reshape" &&
      reader->input(0) == chain.output && reader->outputs.size() == 1 && reader->outputs[0]) {
    reshape = reader;
    reader = soleReader(graph, reshape->outputs[0]);
  }
  const ir::Value* input = reshape ? reshape->outputs[0] : chain.output;
  if (!reader || reader->input(0) != input || !reader->outputs[0]) return;
  if (auto attributes = fusedActivationAttributes(*reader)) {
    chain.activation = reader;
    chain.activationAttributes = std::move(*attributes);
    if (reshape) {
      // The fused node writes the product's shape, before the Reshape.
      chain.reshape = reshape;
      chain.last = reshape;
    } else {
      chain.last = reader;
      chain.output = reader->outputs[0];
    }
  }
}

std::optional<GemmChain> matchChain(const ir::Graph& graph, ir::Node& node,
                                    const knobs::Route& route) {
  if (!node.domain.empty() || (node.opType != "MatMul" && node.opType != "Gemm") ||
      node.outputs.size() != 1 || !node.outputs[0] || !route.isOn(kFuseGemmActivation, &node)) {
    return std::nullopt;
  }
  GemmChain chain;
  chain.product = &node;
  chain.last = &node;
  chain.output = node.outputs[0];
  const ir::Value* a = node.input(0);
  const ir::Value* w = node.input(1);
  if (!a || !w || !isFusableFloat(a->dtype)) return std::nullopt;
  if (node.opType == "MatMul") {
    // FusedGemm's A is a matrix or a batch of rows; its B is one constant matrix.
    if (a->shape.rank() < 2 || w->shape.rank() != 2 || !w->constant) return std::nullopt;
    // Gemm broadcasts C only from opset 7 on.
    if (node.opsetVersion < 7) return std::nullopt;
    if (ir::Node* add = soleReader(graph, chain.output);
        add && add->domain.empty() && add->opType == "Add" && add->inputs.size() == 2 &&
        add->outputs.size() == 1 && add->outputs[0]) {
      ir::Value* addend = add->inputs[0] == chain.output ? add->inputs[1] : add->inputs[0];
      if (auto bias = lastAxisBias(*addend, *chain.output)) {
        chain.biasAdd = add;
        if (addend->shape.rank() <= 1) {
          chain.bias = addend;
        } else {
          chain.newBias = std::move(bias);
        }
        chain.last = add;
        chain.output = add->outputs[0];
      }
    }
    matchActivation(graph, chain);
    if (!chain.biasAdd && !chain.activation) return std::nullopt;
    // Gemm before opset 11 requires C.
    if (!chain.biasAdd && node.opsetVersion < 11) return std::nullopt;
    return chain;
  }
  matchActivation(graph, chain);
  if (!chain.activation) return std::nullopt;
  return chain;
}

}  // namespace

Status fuseGemmActivation(ir::Graph& graph, PassContext& context) {
  std::vector<GemmChain> chains;
  for (const auto& node : graph.nodes()) {
    if (auto chain = matchChain(graph, *node, context.route)) chains.push_back(std::move(*chain));
  }
  std::vector<const ir::Node*> replaced;
  std::vector<std::pair<ir::Node*, std::string>> names;
  for (GemmChain& chain : chains) {
    ir::Node& product = *chain.product;
    // Just before the chain's last node: every input of the chain is defined by then.
    ir::Node* fused = graph.insertNode("FusedGemm", chain.last);
    fused->domain = ir::kKilnDomain;
    fused->opsetVersion = product.opsetVersion;
    if (product.opType == "Gemm") {
      fused->attributes = product.attributes;
      fused->inputs = product.inputs;
    } else {
      fused->inputs = {product.input(0), product.input(1)};
      if (chain.newBias) {
        ir::Value* bias = graph.addUniqueValue(product.name + "_bias");
        bias->dtype = chain.newBias->dtype();
        bias->shape = chain.newBias->shape();
        bias->hasType = true;
        bias->constant = std::move(*chain.newBias);
        bias->isInitializer = true;
        chain.bias = bias;
      }
      if (chain.bias) fused->inputs.push_back(chain.bias);
    }
    fused->attributes.insert(chain.activationAttributes.begin(), chain.activationAttributes.end());
    fused->outputs = {chain.output};
    chain.output->producer = fused;
    if (chain.reshape) {
      // The Reshape now reshapes the activated product into what the activation wrote.
      ir::Value* activated = chain.activation->outputs[0];
      chain.reshape->outputs = {activated};
      activated->producer = chain.reshape;
    }
    std::string parts = fmt::format("{} '{}'", product.opType, product.name);
    for (ir::Node* node : {chain.biasAdd, chain.activation}) {
      if (!node) continue;
      parts += fmt::format(" + {} '{}'", node->opType, node->name);
      replaced.push_back(node);
    }
    replaced.push_back(&product);
    // The fused node keeps the product's name, so per-node knobs naming it still apply.
    names.emplace_back(fused, product.name);
    context.note("fused {} into FusedGemm", parts);
  }
  graph.removeNodes([&](const ir::Node& node) {
    return std::find(replaced.begin(), replaced.end(), &node) != replaced.end();
  });
  for (auto& [node, name] : names) node->name = name;
  // The moved Reshapes' former outputs: nothing reads or writes them now.
  if (std::any_of(chains.begin(), chains.end(), [](const GemmChain& c) { return c.reshape; })) {
    graph.removeUnusedValues();
  }
  return Status::ok();
}

}  // namespace kiln::passes
