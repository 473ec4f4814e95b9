// Fused-op epilogues.

// Loops written for the vectoriser (see fast_math.h); before the includes on purpose.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("vect-cost-model=dynamic", "no-trapping-math", "no-math-errno", \
                     "fp-contract=off")
#endif

#include "kiln/backends/cpu/kernels/epilogue.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/backends/cpu/kernels/fast_math.h"

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

namespace {

// One loop per activation, each compiled for AVX-512, AVX2 and the baseline; the transcendental
// ones through fast_math.h, so that they vectorise (a libm call per element keeps a loop scalar:
// std::erf made ConvNeXt's GELU epilogue cost three times its GEMM) and give the same bits as the
// unfused activation kernels in eltwise.cc and fused_eltwise.cc.
KILN_ELTWISE_CLONES void activate(Epilogue::Activation activation, float alpha, float beta,
                                  float* data, int64_t count) {
  using A = Epilogue::Activation;
  switch (activation) {
    case A::kNone:
      return;
    case A::kRelu:
      for (int64_t i = 0; i < count; ++i) data[i] = data[i] < 0.0f ? 0.0f : data[i];
      return;
    case A::kLeakyRelu:
      for (int64_t i = 0; i < count; ++i) data[i] = data[i] < 0 ? alpha * data[i] : data[i];
      return;
    case A::kClip:
      for (int64_t i = 0; i < count; ++i) data[i] = std::min(std::max(data[i], alpha), beta);
      return;
    case A::kSigmoid:
      for (int64_t i = 0; i < count; ++i) data[i] = fastSigmoid(data[i]);
      return;
    case A::kHardSigmoid:
      for (int64_t i = 0; i < count; ++i) {
        data[i] = std::max(0.0f, std::min(1.0f, alpha * data[i] + beta));
      }
      return;
    case A::kHardSwish:
      for (int64_t i = 0; i < count; ++i) {
        data[i] *= std::max(0.0f, std::min(1.0f, data[i] / 6.0f + 0.5f));
      }
      return;
    case A::kTanh:
      for (int64_t i = 0; i < count; ++i) data[i] = fastTanh(data[i]);
      return;
    case A::kGelu:
      for (int64_t i = 0; i < count; ++i) data[i] = fastGelu(data[i]);
      return;
    case A::kGeluTanh:
      // 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)).
      for (int64_t i = 0; i < count; ++i) {
        const float x = data[i];
        data[i] = x / (1.0f + fastExp(-1.5957691216057308f * (x + 0.044715f * x * x * x)));
      }
      return;
    case A::kSilu:
      for (int64_t i = 0; i < count; ++i) data[i] = data[i] * fastSigmoid(data[i]);
      return;
  }
}

KILN_ELTWISE_CLONES void addResidual(float* data, const float* residual, int64_t count) {
  for (int64_t i = 0; i < count; ++i) data[i] += residual[i];
}

}  // namespace

void Epilogue::apply(float* data, int64_t count, const float* residual) const {
  if (residual) addResidual(data, residual, count);
  activate(activation_, alpha_, beta_, data, count);
}

}  // namespace kiln::cpu
