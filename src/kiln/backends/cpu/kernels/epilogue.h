// The epilogue of kiln's fused ops on the CPU: `+ residual`, then the activation, applied to a
// block of float32 outputs right after the GEMM or convolution that produced it.
#pragma once

#include <optional>

#include "kiln/base/status.h"
#include "kiln/ir/graph.h"

namespace kiln::cpu {

class Epilogue {
 public:
  enum class Activation {
    kNone,
    kRelu,
    kLeakyRelu,
    kClip,
    kSigmoid,
    kHardSigmoid,
    kHardSwish,
    kTanh,
    kGelu,
    kGeluTanh,  // Gelu with approximate="tanh"
    kSilu,      // x * sigmoid(x)
  };

  // Reads a FusedConv/FusedGemm node's `activation`, `activation_alpha`, `activation_beta`;
  // nullopt for an activation this epilogue does not implement (the step then falls back).
  static std::optional<Epilogue> fromNode(const ir::Node& node);

  bool empty() const { return activation_ == Activation::kNone; }
  // data[i] = act(data[i] + residual[i]) for i < count; residual may be null.
  void apply(float* data, int64_t count, const float* residual) const;

 private:
  Activation activation_ = Activation::kNone;
  float alpha_ = 0, beta_ = 0;
};

}  // namespace kiln::cpu
