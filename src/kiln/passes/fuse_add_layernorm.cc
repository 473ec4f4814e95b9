// Fuses a residual Add into the LayerNormalization that reads it, as transformers write every
// sublayer's end (BERT's Add -> LayerNorm; GPT-2's and ViT's residual stream, where the sum also
// goes on to the next residual Add):
//
//   %s = Add "res" (%x, %skip); %y = LayerNormalization "ln" (%s, %scale, %b)
//     =>   %y, %s = kiln.AddLayerNormalization "ln" (%x, %scale, %b, %skip)
//
// The second output, the sum itself, is written only where something else reads it. Both Add
// operands must have the sum's shape and dtype (a broadcast bias Add is a Gemm epilogue's, not
// this), and the LayerNormalization must not write its Mean / InvStdDev outputs.
#include <algorithm>
#include <unordered_set>

#include "kiln/ir/op_schema.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kFuseAddLayerNorm = knobs::declareKnob({
    .name = "fusion.add_layernorm",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "fuse a residual Add (operands of one shape) into the LayerNormalization that reads "
            "it, one pass over the rows that also writes the sum where it is read elsewhere (per "
            "node: the LayerNormalization's name)",
    .perNode = true,
});

namespace {

bool isOp(const ir::Node* node, const char* opType) {
  return node && node->domain.empty() && node->opType == opType;
}

// The Add that `norm` normalises the output of, if it can join it.
ir::Node* residualAdd(const ir::Node& norm) {
  if (!isOp(&norm, "LayerNormalization") || !norm.input(0) || !norm.input(1)) return nullptr;
  for (size_t i = 1; i < norm.outputs.size(); ++i) {
    if (norm.outputs[i]) return nullptr;  // Mean / InvStdDev
  }
  ir::Node* add = norm.inputs[0]->producer;
  if (!isOp(add, "Add") || add->inputs.size() != 2 || !add->input(0) || !add->input(1) ||
      add->outputs.size() != 1) {
    return nullptr;
  }
  const ir::Value* sum = add->outputs[0];
  for (const ir::Value* operand : add->inputs) {
    if (operand->shape != sum->shape || operand->dtype != sum->dtype) return nullptr;
  }
  // The fused node takes the Add's place, so the norm's parameters must exist by then: constants
  // or graph inputs, as they are in every exported model.
  for (size_t i = 1; i < norm.inputs.size(); ++i) {
    if (norm.inputs[i] && norm.inputs[i]->producer) return nullptr;
  }
  return add;
}

}  // namespace

Status fuseAddLayerNorm(ir::Graph& graph, PassContext& context) {
  std::unordered_set<const ir::Node*> removed;
  std::vector<ir::Node*> candidates;
  for (const auto& node : graph.nodes()) candidates.push_back(node.get());
  for (ir::Node* norm : candidates) {
    ir::Node* add = residualAdd(*norm);
    if (!add || removed.count(add) || !context.route.isOn(kFuseAddLayerNorm, norm)) continue;
    ir::Value* sum = add->outputs[0];
    std::vector<ir::Node*> readers = graph.consumers(sum);
    const bool sumRead = graph.isGraphOutput(sum) || readers.size() > 1 ||
                         std::count(norm->inputs.begin(), norm->inputs.end(), sum) > 1;
    // Where the Add was: the Add's other readers come after it, but may come before the norm.
    ir::Node* fused = graph.insertNode("AddLayerNormalization", add);
    fused->name = norm->name;
    fused->domain = ir::kKilnDomain;
    fused->opsetVersion = norm->opsetVersion;  // the LayerNormalization schema reads it
    fused->attributes = norm->attributes;
    fused->inputs = {add->inputs[0], norm->inputs[1], norm->input(2), add->inputs[1]};
    fused->outputs = {norm->outputs[0]};
    norm->outputs[0]->producer = fused;
    if (sumRead) {
      fused->outputs.push_back(sum);
      sum->producer = fused;
    }
    removed.insert(add);
    removed.insert(norm);
    context.note("fused Add '{}' into LayerNormalization '{}'{}", add->name, norm->name,
                 sumRead ? " (the sum is read elsewhere too)" : "");
  }
  graph.removeNodes([&](const ir::Node& node) { return removed.count(&node) > 0; });
  if (!removed.empty()) graph.removeUnusedValues();
  return Status::ok();
}

}  // namespace kiln::passes
