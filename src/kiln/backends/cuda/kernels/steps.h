// What the CUDA backend's kernel files share: the host fallback step, and the ranks at which
// their step factories are tried (lower first). A factory returns nullptr for a node it does not
// handle, so a node falls through to the next one, and finally to the host.
#pragma once

#include <memory>

#include "kiln/backends/cuda/plan.h"

namespace kiln::cuda {

// Ranks of the step factories (registerStepFactory).
enum FactoryRank : int {
  kRankGemm = 100,       // Gemm, MatMul, kiln.FusedGemm (cuBLASLt or kiln's own)
  kRankConv = 200,       // Conv, kiln.FusedConv, kiln.NhwcConv (cuDNN or kiln's own)
  kRankAttention = 300,  // kiln.Attention
  kRankNorm = 400,       // Softmax, LayerNormalization, pooling, reductions
  kRankReduce = 450,     // the Reduce* family, ArgMax, ArgMin
  kRankEltwise = 500,    // unary, binary, Where, Cast, kiln.FusedElementwise
  kRankDataMove = 600,   // Transpose, Concat, Split, Slice, Gather, Pad, Expand, Resize, copies
  kRankMisc = 650,       // CumSum, Einsum, OneHot, TopK, EyeLike, Dropout's mask, Range, fills
};

// The reference kernel run on the host: inputs copied to the host, the node evaluated, outputs
// copied back (not capturable). nullptr when the reference executor has no kernel for the node.
std::unique_ptr<Step> makeHostStep(const ir::Node& node);

}  // namespace kiln::cuda
