// The per-output-channel view of a product's constant weight and bias, for the folds into it.
#include "kiln/passes/conv_weights.h"

namespace kiln::passes {

bool isFoldableFloat(ir::DType dtype) {
  return dtype == ir::DType::kFloat16 || dtype == ir::DType::kFloat32 ||
         dtype == ir::DType::kFloat64;
}

std::vector<double> tensorValues(const ir::Tensor& tensor) {
  std::vector<double> values(static_cast<size_t>(tensor.elementCount()));
  for (size_t i = 0; i < values.size(); ++i) {
    values[i] = tensor.elementAsDouble(static_cast<int64_t>(i));
  }
  return values;
}

ir::Value* addFoldedConstant(ir::Graph& graph, const std::string& base, ir::DType dtype,
                             const ir::Shape& shape, const std::vector<double>& values) {
  return graph.addConstant(base, ir::Tensor::fromVector<double>(shape, values).castTo(dtype));
}

std::optional<std::vector<int64_t>> weightOutputChannels(const ir::Node& producer,
                                                         int64_t channels) {
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
  } else if (producer.opType == "MatMul") {
    // A 2-D B [K, N]: column n feeds output column n.
    if (w.rank() != 2 || w[1] != channels) return std::nullopt;
    for (size_t i = 0; i < channelOf.size(); ++i) channelOf[i] = static_cast<int64_t>(i) % w[1];
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

std::optional<std::vector<double>> biasPerChannel(const ir::Node& producer, int64_t channels) {
  std::vector<double> bias(static_cast<size_t>(channels), 0.0);
  const ir::Value* b = producer.opType == "MatMul" ? nullptr : producer.input(2);
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

}  // namespace kiln::passes
