// kiln.Attention: scaled dot-product attention as one node, made by the fuse_attention pass from
// the MatMul / scale / mask / Softmax / MatMul chain exporters write.
//
//   Y = softmax(scale * Q · K' + mask) · V          (softmax over the last axis)
//
// Inputs: Q [..., Sq, D]; K, either K' itself [..., D, Skv] (transpose_k=0) or its transpose
// [..., Skv, D] (transpose_k=1, K' = K^T); V [..., Skv, Dv]; mask (optional), added to the scores,
// of Q's dtype and broadcastable to the scores' shape [..., Sq, Skv]. Q, K and V have the same
// batch dimensions [...]. The output is [..., Sq, Dv] of Q's dtype.
//
// Attributes: `scale` (float, default 1); `transpose_k` (0 or 1, default 0); `nan_to_zero` (0 or
// 1, default 0): probabilities that are NaN become 0. torch exports scaled_dot_product_attention
// with Where(IsNaN(p), 0, p) after the softmax, so that a fully masked row (all scores -inf)
// gives zeros instead of NaN; the pass folds that in here.
//
// The geometry below is shared by shape inference, the reference kernel and the CPU kernel, so
// the three read the node the same way.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/graph.h"

namespace kiln::ir {

struct AttentionGeometry {
  int64_t batch = 1;  // product of the batch dimensions [...]
  int64_t sq = 0, skv = 0, d = 0, dv = 0;
  bool transposeK = false;
  float scale = 1.0f;
  bool nanToZero = false;
  Shape output;  // [..., Sq, Dv]

  // The mask, if any, as offsets into its elements: mask element of (batch b, row i, column j)
  // is at maskBatchOffsets[b] + i * maskRowStride + j * maskColumnStride (strides are 0 along
  // broadcast axes).
  bool hasMask = false;
  std::vector<int64_t> maskBatchOffsets;
  int64_t maskRowStride = 0, maskColumnStride = 0;
};

// Reads the node's attributes and its inputs' shapes (Q, K, V, mask?), or says what is wrong,
// naming the node, the input and the dimensions.
Result<AttentionGeometry> attentionGeometry(const Node& node);

}  // namespace kiln::ir
