// kiln.Attention's row softmax (attention.h), with the mask added on the way: one warp per row
// for rows of up to 1024 keys (four rows a block), one 512-thread block per row beyond. Each
// thread keeps to the same columns through the three passes (mask and maximum, sum, normalise),
// so the masked scores it writes in the first pass are its own to read in the next.
// Accumulation is in float with the precise expf, as the Softmax kernels (norm.cu).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kiln/backends/cuda/kernels/attention.h"

namespace kiln::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpRowThreads = 128;
constexpr int kBlockRowThreads = 512;
constexpr int64_t kWarpRowLimit = 1024;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // the row loops cover the rest

struct SumOp {
  __device__ static float identity() { return 0.0f; }
  __device__ float operator()(float a, float b) const { return a + b; }
};

// fmaxf ignores a NaN operand, as the reference's std::max(max, score) skips NaN scores.
struct MaxOp {
  __device__ static float identity() { return -INFINITY; }
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename Op>
__device__ __forceinline__ float warpReduce(float value, Op op) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(kFullMask, value, offset));
  }
  return value;
}

// Every thread of the block gets the result; `shared` holds kWarpSize floats.
template <typename Op>
__device__ __forceinline__ float blockReduce(float value, Op op, float* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  value = warpReduce(value, op);
  __syncthreads();  // the previous reduction may still be reading `shared`
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : Op::identity();
  return warpReduce(value, op);
}

template <bool kWarpPerRow, typename Op>
__device__ __forceinline__ float rowReduce(float value, Op op, float* shared) {
  if constexpr (kWarpPerRow) {
    return warpReduce(value, op);
  } else {
    return blockReduce(value, op, shared);
  }
}

// A warp's (or the block's) row is the same for all its threads, so whole warps (blocks) enter
// and leave the row loop together, as the shuffles and barriers need.
template <bool kWarpPerRow>
__global__ void __launch_bounds__(kWarpPerRow ? kWarpRowThreads : kBlockRowThreads)
    attentionSoftmaxKernel(AttentionSoftmaxArgs args) {
  __shared__ float shared[kWarpSize];
  const int64_t rows = args.batch * args.sq;
  const int rowsPerBlock = kWarpPerRow ? static_cast<int>(blockDim.x) / kWarpSize : 1;
  const int lane =
      kWarpPerRow ? static_cast<int>(threadIdx.x) % kWarpSize : static_cast<int>(threadIdx.x);
  const int size = kWarpPerRow ? kWarpSize : static_cast<int>(blockDim.x);
  const int64_t first = static_cast<int64_t>(blockIdx.x) * rowsPerBlock +
                        (kWarpPerRow ? static_cast<int64_t>(threadIdx.x) / kWarpSize : 0);
  const int64_t step = static_cast<int64_t>(gridDim.x) * rowsPerBlock;
  const int64_t width = args.skv;
  for (int64_t row = first; row < rows; row += step) {
    float* scores = args.scores + row * width;
    const float* mask = nullptr;
    if (args.mask) {
      const int64_t b = row / args.sq;
      const int64_t i = row - b * args.sq;
      mask = args.mask + args.maskBatchOffsets[b] + i * args.maskRowStride;
    }
    float max = MaxOp::identity();
    for (int64_t j = lane; j < width; j += size) {
      float score = scores[j];
      if (mask) {
        score += mask[j * args.maskColumnStride];
        scores[j] = score;
      }
      max = fmaxf(max, score);
    }
    max = rowReduce<kWarpPerRow>(max, MaxOp(), shared);
    // Subtracting the maximum keeps expf from overflowing; a row of -inf gives NaN (-inf - -inf),
    // as the reference and the unfused Softmax do.
    float sum = 0.0f;
    for (int64_t j = lane; j < width; j += size) sum += expf(scores[j] - max);
    sum = rowReduce<kWarpPerRow>(sum, SumOp(), shared);
    for (int64_t j = lane; j < width; j += size) {
      float p = expf(scores[j] - max) / sum;
      if (args.nanToZero && isnan(p)) p = 0.0f;
      scores[j] = p;
    }
  }
}

unsigned blocksFor(int64_t count, int64_t perBlock) {
  return static_cast<unsigned>(std::min<int64_t>((count + perBlock - 1) / perBlock, kMaxBlocks));
}

}  // namespace

cudaError_t launchAttentionSoftmax(const AttentionSoftmaxArgs& args, cudaStream_t stream) {
  const int64_t rows = args.batch * args.sq;
  if (rows <= 0 || args.skv <= 0) return cudaSuccess;
  if (args.skv <= kWarpRowLimit) {
    attentionSoftmaxKernel<true>
        <<<blocksFor(rows, kWarpRowThreads / kWarpSize), kWarpRowThreads, 0, stream>>>(args);
  } else {
    attentionSoftmaxKernel<false><<<blocksFor(rows, 1), kBlockRowThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace kiln::cuda
