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
// The heads form (`num_heads` H > 0, made by the attention_heads pass): the operands stay in the
// [B, S, H * D] layout the projections write, with head h in columns [h * D, (h + 1) * D), so
// that the Reshape / Transpose pairs exporters put around attention go away. Q [B, Sq, H * D];
// K [B, Skv, H * D] (transpose_k must be 1: K's rows are the keys); V [B, Skv, H * Dv]; the
// output is [B, Sq, H * Dv]. Packed: with K and V omitted, Q is [B, S, 3 * H * D], the Q, K and
// V projections side by side along the last axis (Dv = D), as GPT-2's one c_attn product writes
// them. The scores are [B, H, Sq, Skv], as in the plain form with Q [B, H, Sq, D], and the mask
// broadcasts to that.
//
// The geometry below is shared by shape inference, the reference kernel and the CPU kernel, so
// the three read the node the same way.
#pragma once

#include <cstdint>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/graph.h"

namespace kiln::ir {

// Where an operand's matrices lie in its input's elements: the matrix of flat batch entry b
// (b = outer * heads + head) starts at offset(b), its rows rowStride elements apart, its columns
// contiguous. K's rows are the keys with transpose_k, else the depth (K' [D, Skv]).
struct AttentionOperand {
  int64_t base = 0;  // the packed form's K and V start H * D and 2 * H * D into a row
  int64_t outerStride = 0, headStride = 0, rowStride = 0;

  int64_t offset(int64_t b, int64_t heads) const {
    return base + (b / heads) * outerStride + (b % heads) * headStride;
  }
};

struct AttentionGeometry {
  int64_t batch = 1;  // product of the scores' batch dimensions (B * H in the heads form)
  int64_t sq = 0, skv = 0, d = 0, dv = 0;
  // The heads form's H (1 in the plain form, where each batch entry's matrices are dense and
  // one after another), and where Q, K, V and the output lie.
  int64_t heads = 1;
  bool packed = false;  // K and V are read from input 0 too
  AttentionOperand q, k, v, y;
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
