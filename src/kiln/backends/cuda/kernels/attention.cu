// kiln.Attention's row softmax (attention.h), with the mask added on the way. Rows of up to 1024
// keys take one warp each (four rows a block) and keep the row in registers (kPerLane scores a
// lane, the smallest of 4, 8, 16, 32 that covers the row): the scores are read once and the
// probabilities written once. Longer rows take one 512-thread block each and three passes over
// the float scores (mask and maximum, sum, normalise); each thread keeps to the same columns
// through the passes, so the masked scores it writes in the first pass are its own to read in the
// next. Arithmetic is float with the precise expf, as the Softmax kernels (norm.cu); the mask and
// the probabilities are float32, float16 or bfloat16, loaded into float and rounded once.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kiln/backends/cuda/kernels/attention.h"
#include "kiln/backends/cuda/kernels/device_types.cuh"

namespace kiln::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxRowThreads = 512;               // eight warp rows, or a 512-thread block a row
constexpr int64_t kWarpRowLimit = 1024;           // 32 scores a lane
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // the row loops cover the rest

using device::fromFloat;
using device::toFloat;

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

// The mask row of flat score row `row` (null without a mask).
template <typename T>
__device__ __forceinline__ const T* maskRow(const AttentionSoftmaxArgs& args, int64_t row) {
  if (!args.mask.values) return nullptr;
  const int64_t b = row / args.sq;
  const int64_t i = row - b * args.sq;
  return static_cast<const T*>(args.mask.values) + args.mask.batchOffsets[b] +
         i * args.mask.rowStride;
}

// One warp a row, the row in registers. A warp's row is the same for all its lanes, so whole
// warps enter and leave the row loop together, as the shuffles need.
template <typename T, int kPerLane>
__global__ void __launch_bounds__(kMaxRowThreads) warpSoftmaxKernel(AttentionSoftmaxArgs args) {
  const int kRowsPerBlock = static_cast<int>(blockDim.x) / kWarpSize;
  const int64_t rows = args.batch * args.sq;
  const int lane = static_cast<int>(threadIdx.x) % kWarpSize;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock +
                        static_cast<int64_t>(threadIdx.x) / kWarpSize;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  const int64_t width = args.skv;
  for (int64_t row = first; row < rows; row += step) {
    const float* scores = args.scores + row * args.scoresPitch;
    const T* mask = maskRow<T>(args, row);
    float v[kPerLane];
    float max = MaxOp::identity();
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int64_t j = lane + t * kWarpSize;
      float score = -INFINITY;
      if (j < width) {
        score = scores[j];
        if (mask) score += toFloat(mask[j * args.mask.columnStride]);
        max = fmaxf(max, score);
      }
      v[t] = score;
    }
    max = warpReduce(max, MaxOp());
    // Subtracting the maximum keeps expf from overflowing; a row of -inf gives NaN (-inf - -inf),
    // as the reference and the unfused Softmax do.
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      if (lane + t * kWarpSize < width) {
        v[t] = expf(v[t] - max);
        sum += v[t];
      }
    }
    sum = warpReduce(sum, SumOp());
    T* out = static_cast<T*>(args.probabilities) + row * args.probabilitiesPitch;
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int64_t j = lane + t * kWarpSize;
      if (j < width) {
        float p = v[t] / sum;
        if (args.nanToZero && isnan(p)) p = 0.0f;
        out[j] = fromFloat<T>(p);
      }
    }
  }
}

// One block a row, three passes over the float scores (which hold the masked scores after the
// first). The block's row is the same for all its threads, as the barriers need.
template <typename T>
__global__ void __launch_bounds__(kMaxRowThreads) blockSoftmaxKernel(AttentionSoftmaxArgs args) {
  __shared__ float shared[kWarpSize];
  const int64_t rows = args.batch * args.sq;
  const int thread = static_cast<int>(threadIdx.x);
  const int size = static_cast<int>(blockDim.x);
  const int64_t width = args.skv;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float* scores = args.scores + row * args.scoresPitch;
    const T* mask = maskRow<T>(args, row);
    float max = MaxOp::identity();
    for (int64_t j = thread; j < width; j += size) {
      float score = scores[j];
      if (mask) {
        score += toFloat(mask[j * args.mask.columnStride]);
        scores[j] = score;
      }
      max = fmaxf(max, score);
    }
    max = blockReduce(max, MaxOp(), shared);
    float sum = 0.0f;
    for (int64_t j = thread; j < width; j += size) sum += expf(scores[j] - max);
    sum = blockReduce(sum, SumOp(), shared);
    T* out = static_cast<T*>(args.probabilities) + row * args.probabilitiesPitch;
    for (int64_t j = thread; j < width; j += size) {
      float p = expf(scores[j] - max) / sum;
      if (args.nanToZero && isnan(p)) p = 0.0f;
      out[j] = fromFloat<T>(p);
    }
  }
}

unsigned blocksFor(int64_t count, int64_t perBlock) {
  return static_cast<unsigned>(std::min<int64_t>((count + perBlock - 1) / perBlock, kMaxBlocks));
}

template <typename T, int kPerLane>
cudaError_t launchWarpRows(const AttentionSoftmaxArgs& args, int64_t rows, cudaStream_t stream) {
  warpSoftmaxKernel<T, kPerLane>
      <<<blocksFor(rows, args.warpRows), args.warpRows * kWarpSize, 0, stream>>>(args);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launchTyped(const AttentionSoftmaxArgs& args, cudaStream_t stream) {
  const int64_t rows = args.batch * args.sq;
  if (args.skv <= 4 * kWarpSize) return launchWarpRows<T, 4>(args, rows, stream);
  if (args.skv <= 8 * kWarpSize) return launchWarpRows<T, 8>(args, rows, stream);
  if (args.skv <= 16 * kWarpSize) return launchWarpRows<T, 16>(args, rows, stream);
  if (args.skv <= kWarpRowLimit) return launchWarpRows<T, 32>(args, rows, stream);
  blockSoftmaxKernel<T><<<blocksFor(rows, 1), args.blockThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launchAttentionSoftmax(const AttentionSoftmaxArgs& args, cudaStream_t stream) {
  const int64_t rows = args.batch * args.sq;
  if (rows <= 0 || args.skv <= 0) return cudaSuccess;
  if (args.warpRows < 1 || args.warpRows * kWarpSize > kMaxRowThreads || args.blockThreads < 32 ||
      args.blockThreads > kMaxRowThreads || args.blockThreads % kWarpSize != 0) {
    return cudaErrorInvalidValue;
  }
  switch (args.type) {
    case kGemmFloat32:
      return launchTyped<float>(args, stream);
    case kGemmFloat16:
      return launchTyped<__half>(args, stream);
    case kGemmBFloat16:
      return launchTyped<__nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace kiln::cuda
