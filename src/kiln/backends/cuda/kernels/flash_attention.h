// kiln.Attention (src/kiln/ir/ops/attention.h) as one fused kernel (flash_attention.cu): the
// scores of a block of query rows against a tile of keys at a time, in registers only, with a
// running (online) softmax, so the score matrix is never written to memory. Float16 and bfloat16
// on tensor cores (mma.sync, float32 accumulation), head sizes 32, 64 and 128; sm_80 or newer.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kiln/backends/cuda/kernels/attention.h"  // AttentionMask
#include "kiln/backends/cuda/kernels/gemm.h"       // GemmType

namespace kiln::cuda {

// Where one operand's matrix of batch entry b (b = outer * heads + head) lies: at
// outer * outerStride + head * headStride elements from the operand's pointer, rows rowStride
// elements apart, columns contiguous.
struct FlashOperand {
  int64_t outerStride = 0, headStride = 0, rowStride = 0;
};

// Y[b] = softmax(scale * Q[b] · K'[b] + mask[b]) · V[b] for every batch entry b < batch, all of
// `type` (float16 or bfloat16): Q [sq, d]; K' [d, skv] as stored, or K [skv, d] with transposeK;
// V [skv, d] (Dv == D); Y [sq, d]; each where its FlashOperand says (dense matrices one after
// another: heads 1, outerStride rows * columns, rowStride columns). The mask is attention.h's
// AttentionMask, of `type`. A row whose softmax is NaN in the reference (every score -inf, or a NaN
// score) gives NaN, or zeros with nanToZero.
struct FlashAttentionArgs {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* y = nullptr;
  GemmType type = kGemmFloat16;
  int64_t batch = 0, sq = 0, skv = 0, d = 0;
  int64_t heads = 1;
  FlashOperand qLayout, kLayout, vLayout, yLayout;
  bool transposeK = false;
  float scale = 1.0f;
  AttentionMask mask;
  bool nanToZero = false;
  // Warps a CTA (2, 4 or 8), each 16 query rows: fewer make more CTAs of a short batch (GPT-2's
  // 12 heads of 512 queries are 96 CTAs of 64 rows, fewer than an H200's 132 SMs), more share
  // each staged key tile among more rows.
  int warps = 4;
  // Per query block of the CTA's rows (warps * 16), in block order: the first and one past the last
  // key tile (kFlashKeyTile keys) holding a key the mask leaves to any of the block's rows of any
  // batch entry; a CTA walks only those (blocks with the most tiles first). Null: every tile. Tiles
  // outside are -inf for every row of the block, and add nothing to a row with a finite score
  // (its maximum is unchanged and its probabilities there are exp(-inf) = 0); a NaN or +inf score
  // there is not seen, where without skipping it would make its row NaN.
  const int32_t* keyTiles = nullptr;
  // Split keys (cuda.attention.flash.split): with `work` set (keyTiles is then ignored), CTA
  // i * batch + b takes work item i of batch entry b, four int32 each: the query block, its first
  // and one past its last key tile, and a slot. Slot -1 walks the block's whole range and writes
  // its rows of Y as without splitting. A slot s >= 0 walks one part of a longer range and leaves
  // its rows' unnormalised output, running maximum and probability sum in `partial` (float
  // [batch][slots][warps * 16][d]) and `partialStats` (float [batch][slots][warps * 16][2]) at
  // entry b's slot s; the combine kernel launchFlashAttention runs after it then merges a block's
  // slots into its rows of Y. `combine` holds, three int32 each for `combines` query blocks, the
  // block, its first slot and its number of slots (consecutive). All of these on the device.
  const int32_t* work = nullptr;
  int works = 0;
  int slots = 0;
  float* partial = nullptr;
  float* partialStats = nullptr;
  const int32_t* combine = nullptr;
  int combines = 0;
};

// Keys a tile of the kernel (FlashAttentionArgs::keyTiles counts in these).
constexpr int64_t kFlashKeyTile = 64;

// Whether the kernel handles this type and head size (Dv == D in {32, 64, 128}, reduced types
// only) and at least one query and one key; the caller keeps everything else on the unfused path.
inline bool flashAttentionSupports(GemmType type, int64_t d, int64_t dv, int64_t sq, int64_t skv) {
  const bool reduced = type == kGemmFloat16 || type == kGemmBFloat16;
  const bool head = d == dv && (d == 32 || d == 64 || d == 128);
  return reduced && head && sq >= 1 && skv >= 1;
}

// Allows the kernel instance `args` picks its shared memory (above 48 KiB for d = 128). Call once
// per device before the first launch (not a stream operation).
cudaError_t configureFlashAttention(const FlashAttentionArgs& args);

// The flash kernel, and with split keys (args.work and args.combines) the combine kernel after it
// on the same stream.
cudaError_t launchFlashAttention(const FlashAttentionArgs& args, cudaStream_t stream);

}  // namespace kiln::cuda
