// Folds an inference BatchNormalization with constant statistics into the Conv, ConvTranspose or
// Gemm before it, whose constant weight and bias absorb the per-channel scale and shift.
//
//   %c = Conv "c" (%x, %w, %b); %y = BatchNormalization "bn" (%c, %s, %t, %mean, %var)
//     =>   %y = Conv "c" (%x, %w_bn, %b_bn)
#include <algorithm>
#include <cmath>

#include "kiln/passes/passes.h"

namespace kiln::passes {

const knobs::Knob kFoldBatchNorm = knobs::declareKnob({
    .name = "graph.fold_batchnorm",
    .kind = knobs::KnobKind::kBool,
    .defaultValue = "on",
    .help = "fold BatchNormalization into the preceding Conv, ConvTranspose or Gemm",
});

namespace {

bool isFoldableFloat(ir::DType dtype) {
  return dtype == ir::DType::kFloat16 || dtype == ir::DType::kFloat32 ||
         dtype == ir::DType::kFloat64;
}

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

std::vector<double> valuesOf(const ir::Tensor& tensor) {
  std::vector<double> values(static_cast<size_t>(tensor.elementCount()));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = tensor.elementAsDouble(static_cast<int64_t>(i));
  }
  return values;
}

// A new initializer holding `values` in `dtype`.
ir::Value* addConstant(ir::Graph& graph, const std::string& base, ir::DType dtype,
                       const ir::Shape& shape, const std::vector<double>& values) {
  ir::Value* value = graph.addUniqueValue(base);
  value->dtype = dtype;
  value->shape = shape;
  value->hasType = true;
  value->constant = ir::Tensor::fromVector<double>(shape, values).castTo(dtype);
  value->isInitializer = true;
  return value;
}

// The output channel each weight element scales by, for the producer's weight layout.
std::optional<std::vector<int64_t>> weightChannels(const ir::Node& producer, int64_t channels) {
  const ir::Shape& w = producer.inputs[1]->shape;
  std::vector<int64_t> channelOf(static_cast<size_t>(w.elementCount()));
  if (producer.opType == "Conv") {
    // [M, C/group, k...]: the leading axis is the output channel.
    if (w.rank() < 3 || w[0] != channels) return std::nullopt;
    const int64_t inner = w.elementCount() / channels;
    for (size_t i = 0; i < channelOf.size(); ++i) channelOf[i] = static_cast<int64_t>(i) / inner;
  } else if (producer.opType == "ConvTranspose") {
    // [C, M/group, k...]: input channel c of group c / (C/group) feeds output channels
    // group * M/group + j.
    auto group = producer.getInt("group", 1);
    if (!group.isOk() || *group < 1 || w.rank() < 3 || w[0] % *group != 0 ||
        w[1] * *group != channels) {
      return std::nullopt;
    }
    const int64_t inputsPerGroup = w[0] / *group;
    const int64_t kernel = w.elementCount() / (w[0] * w[1]);
    for (size_t i = 0; i < channelOf.size(); ++i) {
      const int64_t flat = static_cast<int64_t>(i) / kernel;
      const int64_t c = flat / w[1];
      const int64_t j = flat % w[1];
      channelOf[i] = c / inputsPerGroup * w[1] + j;
    }
  } else {
    // Gemm's B: [K, N], or [N, K] with transB. The new C is [N], which Gemm broadcasts only
    // from opset 7 on.
    auto transB = producer.getInt("transB", 0);
    if (!transB.isOk() || w.rank() != 2 || producer.opsetVersion < 7) return std::nullopt;
    const int64_t columns = w[1];
    if ((*transB ? w[0] : w[1]) != channels) return std::nullopt;
    for (size_t i = 0; i < channelOf.size(); ++i) {
      const int64_t flat = static_cast<int64_t>(i);
      channelOf[i] = *transB ? flat / columns : flat % columns;
    }
  }
  return channelOf;
}

// The producer's bias per output channel before the fold (zero without one), or null when the
// bias is not a constant this fold can rewrite.
std::optional<std::vector<double>> channelBias(const ir::Node& producer, int64_t channels) {
  std::vector<double> bias(static_cast<size_t>(channels), 0.0);
  const ir::Value* b = producer.input(2);
  if (!b) return bias;
  if (!b->constant) return std::nullopt;
  double factor = 1.0;
  if (producer.opType == "Gemm") {
    // C broadcasts to [M, N]; only a C that varies along N alone is a per-channel bias.
    const ir::Shape& c = b->shape;
    if (c.rank() > 2 || (c.rank() == 2 && c[0] != 1)) return std::nullopt;
    if (c.rank() > 0 && c[c.rank() - 1] != 1 && c[c.rank() - 1] != channels) return std::nullopt;
    auto beta = producer.getFloat("beta", 1.0f);
    if (!beta.isOk()) return std::nullopt;
    factor = *beta;
  } else if (b->shape.rank() != 1 || b->shape[0] != channels) {
    return std::nullopt;
  }
  const int64_t count = b->constant->elementCount();
  for (int64_t m = 0; m < channels; ++m) {
    bias[static_cast<size_t>(m)] = factor * b->constant->elementAsDouble(count == 1 ? 0 : m);
  }
  return bias;
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
    auto channelOf = weightChannels(*producer, channels);
    auto bias = channelBias(*producer, channels);
    if (!affine || !channelOf || !bias) continue;

    std::vector<double> weights = valuesOf(*w->constant);
    for (size_t i = 0; i < weights.size(); ++i) {
      weights[i] *= affine->scale[static_cast<size_t>((*channelOf)[i])];
    }
    for (size_t m = 0; m < bias->size(); ++m) {
      (*bias)[m] = (*bias)[m] * affine->scale[m] + affine->shift[m];
    }
    // New initializers: the old weight may be shared with another node.
    ir::Value* newWeight = addConstant(graph, w->name + "_bn", w->dtype, w->shape, weights);
    ir::Value* newBias =
        addConstant(graph, producer->name + "_bias_bn", w->dtype, ir::Shape{channels}, *bias);
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
