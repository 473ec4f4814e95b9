// kiln.Attention's row softmax on the GPU (attention.cu): the step between the two matrix
// products of the unfused attention (attention_steps.cc), over the scores scale * Q · K' the
// first product left in the workspace.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kiln::cuda {

// Every row of `scores` ([batch * sq, skv], row-major, in place) becomes
//   p = softmax(row + mask row)       (max-subtracted; NaN scores do not raise the maximum)
// and, with nanToZero, a NaN p becomes 0. The mask element of (batch entry b, query row i, key
// j) is mask[maskBatchOffsets[b] + i * maskRowStride + j * maskColumnStride]; `mask` null means
// none. maskBatchOffsets is device memory of `batch` entries.
struct AttentionSoftmaxArgs {
  float* scores = nullptr;
  int64_t batch = 0, sq = 0, skv = 0;
  const float* mask = nullptr;
  const int64_t* maskBatchOffsets = nullptr;
  int64_t maskRowStride = 0, maskColumnStride = 0;
  bool nanToZero = false;
};

cudaError_t launchAttentionSoftmax(const AttentionSoftmaxArgs& args, cudaStream_t stream);

}  // namespace kiln::cuda
