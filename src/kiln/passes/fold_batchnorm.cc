// Folds an inference BatchNormalization with constant statistics into the Conv, ConvTranspose or
// Gemm before it, whose constant weight and bias absorb the per-channel scale and shift.
//
//   %c = Conv "c" (%x, %w, %b); %y = BatchNormalization "bn" (%c, %s, %t, %mean, %var)
//     =>   %y = Conv "c" (%x, %w_bn, %b_bn)
#include <algorithm>
#include <cmath>

#include "kiln/passes/conv_weights.h"
#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kFoldBatchNorm = knobs::declareKnob({
    .name = "graph.fold_batchnorm",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "fold BatchNormalization into the preceding Conv, ConvTranspose or Gemm",
});

namespace {

// Per channel, y = x * scale + shift is what the BatchNormalization computes.
struct ChannelAffine {
  std::vector<double> scale;
  std::vector<double> shift;
};

// The BatchNormalization's affine map, if it is the inference form with constant per-channel
// statistics for `channels` channels.
std::optional<ChannelAffine> inferenceAffine(const ir::Node& bn, int64_t channels) {
  if (bn.inputs.size() != 5) return std::nullopt;
  // Training mode (or its running statistics outputs) updates state the fold would lose.
  for (size_t i = 1; i < bn.outputs.size(); ++i) {
    if (bn.outputs[i]) return std::nullopt;
  }
  auto training = bn.getInt("training_mode", 0);
  auto spatial = bn.getInt("spatial", 1);
  auto epsilon = bn.getFloat("epsilon", 1e-5f);
  if (!training.isOk() || *training != 0 || !spatial.isOk() || !epsilon.isOk()) {
    return std::nullopt;
  }
  if (bn.opsetVersion < 9 && *spatial != 1) return std::nullopt;  // per-element statistics
  for (size_t i = 1; i < 5; ++i) {
    const ir::Value* input = bn.inputs[i];
    if (!input || !input->constant || input->shape.rank() != 1 || input->shape[0] != channels) {
      return std::nullopt;
    }
  }
  ChannelAffine affine;
  for (int64_t c = 0; c < channels; ++c) {
    const double gamma = bn.inputs[1]->constant->elementAsDouble(c);
    const double beta = bn.inputs[2]->constant->elementAsDouble(c);
    const double mean = bn.inputs[3]->constant->elementAsDouble(c);
    const double var = bn.inputs[4]->constant->elementAsDouble(c);
    const double scale = gamma / std::sqrt(var + static_cast<double>(*epsilon));
    affine.scale.push_back(scale);
    affine.shift.push_back(beta - mean * scale);
  }
  return affine;
}

}  // namespace

Status foldBatchNorm(ir::Graph& graph, PassContext& context) {
  std::vector<const ir::Node*> folded;
  for (const auto& nodePtr : graph.nodes()) {
    ir::Node& bn = *nodePtr;
    if (!bn.domain.empty() || bn.opType != "BatchNormalization" || bn.outputs.empty() ||
        !bn.outputs[0] || !bn.input(0)) {
      continue;
    }
    ir::Value* x = bn.inputs[0];
    ir::Node* producer = x->producer;
    if (!producer || !producer->domain.empty() ||
        (producer->opType != "Conv" && producer->opType != "ConvTranspose" &&
         producer->opType != "Gemm") ||
        producer->outputs.size() != 1 || graph.isGraphOutput(x) || graph.consumers(x).size() != 1 ||
        std::count(bn.inputs.begin(), bn.inputs.end(), x) != 1) {
      continue;
    }
    const ir::Value* w = producer->input(1);
    if (!w || !w->constant || !isFoldableFloat(w->dtype) || x->shape.rank() < 2) continue;
    const int64_t channels = x->shape[1];
    auto affine = inferenceAffine(bn, channels);
    auto channelOf = weightOutputChannels(*producer, channels);
    auto bias = biasPerChannel(*producer, channels);
    if (!affine || !channelOf || !bias) continue;

    std::vector<double> weights = tensorValues(*w->constant);
    for (size_t i = 0; i < weights.size(); ++i) {
      weights[i] *= affine->scale[static_cast<size_t>((*channelOf)[i])];
    }
    for (size_t m = 0; m < bias->size(); ++m) {
      (*bias)[m] = (*bias)[m] * affine->scale[m] + affine->shift[m];
    }
    // New initializers: the old weight may be shared with another node.
    ir::Value* newWeight = addFoldedConstant(graph, w->name + "_bn", w->dtype, w->shape, weights);
    ir::Value* newBias =
        addFoldedConstant(graph, producer->name + "_bias_bn", w->dtype, ir::Shape{channels}, *bias);
    producer->inputs.resize(3);
    producer->inputs[1] = newWeight;
    producer->inputs[2] = newBias;
    if (producer->opType == "Gemm") producer->attributes["beta"] = ir::Attribute{1.0f};
    // The producer now writes the BatchNormalization's output, keeping its name for readers and
    // graph outputs.
    ir::Value* y = bn.outputs[0];
    producer->outputs[0] = y;
    y->producer = producer;
    x->producer = nullptr;
    bn.outputs[0] = nullptr;
    folded.push_back(&bn);
    context.note("folded BatchNormalization '{}' into {} '{}'", bn.name, producer->opType,
                 producer->name);
  }
  graph.removeNodes([&](const ir::Node& node) {
    return std::find(folded.begin(), folded.end(), &node) != folded.end();
  });
  return Status::ok();
}

}  // namespace kiln::passes
