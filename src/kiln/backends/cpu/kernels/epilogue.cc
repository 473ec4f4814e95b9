// Fused-op epilogues.
#include "kiln/backends/cpu/kernels/epilogue.h"

#include <cmath>
#include <limits>

namespace kiln::cpu {

std::optional<Epilogue> Epilogue::fromNode(const ir::Node& node) {
  Epilogue epilogue;
  if (!node.hasAttribute("activation")) return epilogue;
  auto name = node.getString("activation", "");
  if (!name.isOk()) return std::nullopt;
  struct Entry {
    const char* name;
    Activation activation;
    float alpha, beta;  // the defaults of the ONNX op
  };
  constexpr float kInf = std::numeric_limits<float>::infinity();
  static const Entry kEntries[] = {
      {"Relu", Activation::kRelu, 0, 0},
      {"LeakyRelu", Activation::kLeakyRelu, 0.01f, 0},
      {"Clip", Activation::kClip, -kInf, kInf},
      {"Sigmoid", Activation::kSigmoid, 0, 0},
      {"HardSigmoid", Activation::kHardSigmoid, 0.2f, 0.5f},
      {"HardSwish", Activation::kHardSwish, 0, 0},
      {"Tanh", Activation::kTanh, 0, 0},
      {"Gelu", Activation::kGelu, 0, 0},
      {"GeluTanh", Activation::kGeluTanh, 0, 0},
      {"Silu", Activation::kSilu, 0, 0},
  };
  for (const Entry& entry : kEntries) {
    if (*name != entry.name) continue;
    auto alpha = node.getFloat("activation_alpha", entry.alpha);
    auto beta = node.getFloat("activation_beta", entry.beta);
    if (!alpha.isOk() || !beta.isOk()) return std::nullopt;
    epilogue.activation_ = entry.activation;
    epilogue.alpha_ = *alpha;
    epilogue.beta_ = *beta;
    return epilogue;
  }
  return std::nullopt;
}

void Epilogue::apply(float* data, int64_t count, const float* residual) const {
  if (residual) {
    for (int64_t i = 0; i < count; ++i) data[i] += residual[i];
  }
  switch (activation_) {
    case Activation::kNone:
      return;
    case Activation::kRelu:
      for (int64_t i = 0; i < count; ++i) data[i] = std::max(data[i], 0.0f);
      return;
    case Activation::kLeakyRelu:
      for (int64_t i = 0; i < count; ++i) data[i] = data[i] < 0 ? alpha_ * data[i] : data[i];
      return;
    case Activation::kClip:
      for (int64_t i = 0; i < count; ++i) data[i] = std::min(std::max(data[i], alpha_), beta_);
      return;
    case Activation::kSigmoid:
      for (int64_t i = 0; i < count; ++i) data[i] = 1.0f / (1.0f + std::exp(-data[i]));
      return;
    case Activation::kHardSigmoid:
      for (int64_t i = 0; i < count; ++i) {
        data[i] = std::max(0.0f, std::min(1.0f, alpha_ * data[i] + beta_));
      }
      return;
    case Activation::kHardSwish:
      for (int64_t i = 0; i < count; ++i) {
        data[i] *= std::max(0.0f, std::min(1.0f, data[i] / 6.0f + 0.5f));
      }
      return;
    case Activation::kTanh:
      for (int64_t i = 0; i < count; ++i) data[i] = std::tanh(data[i]);
      return;
    case Activation::kGelu:
      for (int64_t i = 0; i < count; ++i) {
        data[i] = 0.5f * data[i] * (1.0f + std::erf(data[i] * 0.70710678118654752f));
      }
      return;
    case Activation::kGeluTanh:
      // 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)).
      for (int64_t i = 0; i < count; ++i) {
        const float x = data[i];
        data[i] = x / (1.0f + std::exp(-1.5957691216057308f * (x + 0.044715f * x * x * x)));
      }
      return;
    case Activation::kSilu:
      for (int64_t i = 0; i < count; ++i) data[i] = data[i] / (1.0f + std::exp(-data[i]));
      return;
  }
}

}  // namespace kiln::cpu
