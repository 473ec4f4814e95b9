// kiln.Attention's row softmax on the GPU (attention.cu): the step between the two matrix
// products of the unfused attention (attention_steps.cc), over the float32 scores
// scale * Q · K' the first product left in the workspace.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kiln/backends/cuda/kernels/gemm.h"

namespace kiln::cuda {

// kiln.Attention's mask as both tactics' kernels read it: the element of (batch entry b, query
// row i, key j) is values[batchOffsets[b] + i * rowStride + j * columnStride], of the operands'
// type (strides 0 along broadcast axes; batchOffsets is device memory of one entry per batch
// entry). `values` null: no mask.
struct AttentionMask {
  const void* values = nullptr;
  const int64_t* batchOffsets = nullptr;
  int64_t rowStride = 0, columnStride = 0;
};

// Every row of `scores` ([batch * sq, skv], row-major, float32, rows scoresPitch elements apart)
// becomes
//   p = softmax(row + mask row)       (max-subtracted; NaN scores do not raise the maximum)
// computed in float and written to the same row of `probabilities` ([batch * sq, skv] of `type`,
// rows probabilitiesPitch elements apart; for float32 it may be `scores` itself, with the same
// pitch); with nanToZero, a NaN p becomes 0. `scores` is scratch the kernel may overwrite.
struct AttentionSoftmaxArgs {
  float* scores = nullptr;
  void* probabilities = nullptr;
  GemmType type = kGemmFloat32;
  int64_t batch = 0, sq = 0, skv = 0;
  int64_t scoresPitch = 0, probabilitiesPitch = 0;
  AttentionMask mask;
  bool nanToZero = false;
  // Rows of at most 1024 scores take a warp each, warpRows (1 to 16) a block; longer rows a
  // block of blockThreads (a multiple of 32 up to 512) each.
  int warpRows = 4;
  int blockThreads = 512;
};

cudaError_t launchAttentionSoftmax(const AttentionSoftmaxArgs& args, cudaStream_t stream);

}  // namespace kiln::cuda
