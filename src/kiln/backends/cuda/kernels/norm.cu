// kiln's normalisation kernels (norm.h). Rows are reduced by a warp (shuffles) or a block
// (shuffles, then one value per warp through shared memory); strided lines by one thread each.
// Accumulation is in float (float16 and bfloat16 elements are loaded into float and rounded once
// when stored); the precise expf/logf/sqrtf are used, not the fast intrinsics.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kiln/backends/cuda/kernels/device_types.cuh"
#include "kiln/backends/cuda/kernels/norm.h"

namespace kiln::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kElementwiseThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride loops cover the rest

unsigned blocksFor(int64_t count, int64_t perBlock) {
  return static_cast<unsigned>(std::min<int64_t>((count + perBlock - 1) / perBlock, kMaxBlocks));
}

using device::fromFloat;
using device::load;
using device::store;
using device::Tag;

// Sums over float or double values (the row statistics are double).
struct SumOp {
  template <typename V = float>
  __device__ static V identity() {
    return V(0);
  }
  template <typename V>
  __device__ V operator()(V a, V b) const {
    return a + b;
  }
};

struct MaxOp {
  template <typename V = float>
  __device__ static V identity() {
    return -INFINITY;
  }
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

// A butterfly: every lane ends with the same value (each pair adds the same two operands).
template <typename V, typename Op>
__device__ __forceinline__ V warpReduce(V value, Op op) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    value = op(value, __shfl_xor_sync(kFullMask, value, offset));
  }
  return value;
}

// Every thread of the block gets the result; `shared` holds kWarpSize values.
template <typename V, typename Op>
__device__ __forceinline__ V blockReduce(V value, Op op, V* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  value = warpReduce(value, op);
  __syncthreads();  // a previous reduction may still be reading `shared`
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  value = lane < warps ? shared[lane] : Op::template identity<V>();
  return warpReduce(value, op);
}

// A candidate for Hardmax: the value at `index` (-1: none yet).
struct Best {
  float value;
  int64_t index;
};

// Whether a is chosen over b: any NaN beats every number (as numpy's argmax), then the larger
// value, then the lower index, so the winner is the first NaN, else the first maximum.
__device__ __forceinline__ bool chosenOver(const Best& a, const Best& b) {
  if (b.index < 0) return true;
  if (a.index < 0) return false;
  const bool aNan = isnan(a.value), bNan = isnan(b.value);
  if (aNan || bNan) return aNan && bNan ? a.index < b.index : aNan;
  if (a.value != b.value) return a.value > b.value;
  return a.index < b.index;
}

__device__ __forceinline__ Best better(const Best& a, const Best& b) {
  return chosenOver(a, b) ? a : b;
}

__device__ __forceinline__ Best warpBest(Best best) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    Best other;
    other.value = __shfl_xor_sync(kFullMask, best.value, offset);
    other.index = __shfl_xor_sync(kFullMask, best.index, offset);
    best = better(best, other);
  }
  return best;
}

__device__ __forceinline__ Best blockBest(Best best, float* values, int64_t* indices) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  best = warpBest(best);
  __syncthreads();
  if (lane == 0) {
    values[warp] = best.value;
    indices[warp] = best.index;
  }
  __syncthreads();
  best = lane < warps ? Best{values[lane], indices[lane]} : Best{0.0f, -1};
  return warpBest(best);
}

// A softmax row's running maximum and the sum of exp(x - max) over the elements seen so far.
// {-inf, 0} is the empty state. Rescaling by exp(old - new) only where the maximum moved keeps a
// NaN sum (from a NaN element) NaN, as the three-pass sum is.
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ float rescaled(float sum, float from, float to) {
  return from == to ? sum : sum * expf(from - to);
}

__device__ __forceinline__ MaxSum withElement(MaxSum state, float v) {
  const float next = fmaxf(state.max, v);  // NaN never wins (as the three-pass maximum)
  const float term = v == -INFINITY ? 0.0f : expf(v - next);
  return {next, rescaled(state.sum, state.max, next) + term};
}

// Symmetric, so every lane of a butterfly ends with the same state.
__device__ __forceinline__ MaxSum combined(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  return {m, rescaled(a.sum, a.max, m) + rescaled(b.sum, b.max, m)};
}

__device__ __forceinline__ MaxSum warpMaxSum(MaxSum state) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const MaxSum other{__shfl_xor_sync(kFullMask, state.max, offset),
                       __shfl_xor_sync(kFullMask, state.sum, offset)};
    state = combined(state, other);
  }
  return state;
}

__device__ __forceinline__ MaxSum blockMaxSum(MaxSum state, float* maxes, float* sums) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  state = warpMaxSum(state);
  __syncthreads();
  if (lane == 0) {
    maxes[warp] = state.max;
    sums[warp] = state.sum;
  }
  __syncthreads();
  state = lane < warps ? MaxSum{maxes[lane], sums[lane]} : MaxSum{-INFINITY, 0.0f};
  return warpMaxSum(state);
}

// The most threads a row kernel's block has (eight warp rows, or a 512-thread block per row).
constexpr int kMaxRowThreads = 512;

// One warp per row, as many rows per block as the block has warps (RowLaunch::warpRows). A warp's
// row is uniform across its lanes, so whole warps enter or leave the row loop together (the
// shuffles need every lane).
struct WarpRows {
  __device__ static int rowsPerBlock() { return blockDim.x / kWarpSize; }
  __device__ static int64_t first() {
    return static_cast<int64_t>(blockIdx.x) * rowsPerBlock() + threadIdx.x / kWarpSize;
  }
  __device__ static int64_t stride() { return static_cast<int64_t>(gridDim.x) * rowsPerBlock(); }
  __device__ static int lane() { return threadIdx.x % kWarpSize; }
  __device__ static int size() { return kWarpSize; }
  template <typename V, typename Op>
  __device__ static V reduce(V value, Op op, V*) {
    return warpReduce(value, op);
  }
  __device__ static Best best(Best value, float*, int64_t*) { return warpBest(value); }
  __device__ static MaxSum maxSum(MaxSum value, float*, float*) { return warpMaxSum(value); }
};

// One block per row: every thread of the block takes the same rows, so the barriers inside the
// reductions are uniform.
struct BlockRows {
  __device__ static int64_t first() { return blockIdx.x; }
  __device__ static int64_t stride() { return gridDim.x; }
  __device__ static int lane() { return threadIdx.x; }
  __device__ static int size() { return blockDim.x; }
  template <typename V, typename Op>
  __device__ static V reduce(V value, Op op, V* shared) {
    return blockReduce(value, op, shared);
  }
  __device__ static Best best(Best value, float* values, int64_t* indices) {
    return blockBest(value, values, indices);
  }
  __device__ static MaxSum maxSum(MaxSum value, float* maxes, float* sums) {
    return blockMaxSum(value, maxes, sums);
  }
};

// What a line kernel does to each line.
enum class LineOp : int { kSoftmax, kLogSoftmax, kHardmax, kL1, kL2 };

template <typename Rows, typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    rowsKernel(LineOp op, int64_t rows, int64_t width, bool online, const T* __restrict__ x,
               T* __restrict__ y) {
  __shared__ float sharedValues[kWarpSize];
  __shared__ float sharedSums[kWarpSize];
  __shared__ int64_t sharedIndices[kWarpSize];
  const int lane = Rows::lane();
  const int size = Rows::size();
  for (int64_t row = Rows::first(); row < rows; row += Rows::stride()) {
    const T* in = x + row * width;
    T* out = y + row * width;
    if (op == LineOp::kHardmax) {
      Best best{0.0f, -1};
      for (int64_t j = lane; j < width; j += size) best = better(best, Best{load(in[j]), j});
      best = Rows::best(best, sharedValues, sharedIndices);
      for (int64_t j = lane; j < width; j += size) store(out + j, j == best.index ? 1.0f : 0.0f);
      continue;
    }
    if (op == LineOp::kL1 || op == LineOp::kL2) {
      float sum = 0.0f;
      for (int64_t j = lane; j < width; j += size) {
        const float v = load(in[j]);
        sum += op == LineOp::kL1 ? fabsf(v) : v * v;
      }
      sum = Rows::reduce(sum, SumOp(), sharedValues);
      const float norm = op == LineOp::kL2 ? sqrtf(sum) : sum;
      for (int64_t j = lane; j < width; j += size) store(out + j, load(in[j]) / norm);
      continue;
    }
    // Subtracting the maximum keeps exp from overflowing; it cancels out of the result. Three
    // passes (the maximum, the sum, the outputs), or with `online` the maximum and the sum from
    // one read, the sum rescaled whenever the maximum grows.
    float max = MaxOp::identity();
    float sum = 0.0f;
    if (online) {
      MaxSum state{-INFINITY, 0.0f};
      for (int64_t j = lane; j < width; j += size) state = withElement(state, load(in[j]));
      state = Rows::maxSum(state, sharedValues, sharedSums);
      max = state.max;
      sum = state.sum;
    } else {
      for (int64_t j = lane; j < width; j += size) max = fmaxf(max, load(in[j]));
      max = Rows::reduce(max, MaxOp(), sharedValues);
      for (int64_t j = lane; j < width; j += size) sum += expf(load(in[j]) - max);
      sum = Rows::reduce(sum, SumOp(), sharedValues);
    }
    if (op == LineOp::kSoftmax) {
      for (int64_t j = lane; j < width; j += size) store(out + j, expf(load(in[j]) - max) / sum);
    } else {
      const float logSum = logf(sum);
      for (int64_t j = lane; j < width; j += size) store(out + j, (load(in[j]) - max) - logSum);
    }
  }
}

// Lines `inner` apart (inner > 1): one thread per line, so neighbouring threads read
// neighbouring elements.
template <typename T>
__global__ void linesKernel(LineOp op, Lines lines, const T* __restrict__ x, T* __restrict__ y,
                            int64_t count) {
  for (int64_t line = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; line < count;
       line += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = line / lines.inner;
    const int64_t i = line - o * lines.inner;
    const T* in = x + o * lines.length * lines.inner + i;
    T* out = y + o * lines.length * lines.inner + i;
    const int64_t step = lines.inner;
    if (op == LineOp::kHardmax) {
      Best best{0.0f, -1};
      for (int64_t j = 0; j < lines.length; ++j) best = better(best, Best{load(in[j * step]), j});
      for (int64_t j = 0; j < lines.length; ++j) {
        store(out + j * step, j == best.index ? 1.0f : 0.0f);
      }
      continue;
    }
    if (op == LineOp::kL1 || op == LineOp::kL2) {
      float sum = 0.0f;
      for (int64_t j = 0; j < lines.length; ++j) {
        const float v = load(in[j * step]);
        sum += op == LineOp::kL1 ? fabsf(v) : v * v;
      }
      const float norm = op == LineOp::kL2 ? sqrtf(sum) : sum;
      for (int64_t j = 0; j < lines.length; ++j) store(out + j * step, load(in[j * step]) / norm);
      continue;
    }
    float max = MaxOp::identity();
    for (int64_t j = 0; j < lines.length; ++j) max = fmaxf(max, load(in[j * step]));
    float sum = 0.0f;
    for (int64_t j = 0; j < lines.length; ++j) sum += expf(load(in[j * step]) - max);
    const float logSum = logf(sum);
    for (int64_t j = 0; j < lines.length; ++j) {
      const float shifted = load(in[j * step]) - max;
      store(out + j * step, op == LineOp::kSoftmax ? expf(shifted) / sum : shifted - logSum);
    }
  }
}

// Element i of a row statistic: of type T where statsInT, else float.
template <typename T>
__device__ __forceinline__ void storeStat(void* at, int64_t i, float value, bool statsInT) {
  if (statsInT) {
    store(static_cast<T*>(at) + i, value);
  } else {
    static_cast<float*>(at)[i] = value;
  }
}

// The statistics are double, as the reference's: with a large common offset (rows near 1000,
// say) a float mean is off by up to half a float ulp of the offset, which is a visible part of
// a small deviation; in double the deviations keep every bit of the float inputs. Two passes
// (the mean, then the squared deviations from it), and the output computed in double too.
template <typename Rows, typename T>
__global__ void __launch_bounds__(kMaxRowThreads)
    rowNormKernel(RowNormalization n, const T* __restrict__ x, const T* __restrict__ scale,
                  const T* __restrict__ bias, T* __restrict__ y, void* __restrict__ mean,
                  void* __restrict__ invStdDev, bool statsInT, const T* __restrict__ skip,
                  T* __restrict__ sum) {
  __shared__ double shared[kWarpSize];
  const int lane = Rows::lane();
  const int size = Rows::size();
  const double count = static_cast<double>(n.width);
  for (int64_t row = Rows::first(); row < n.rows; row += Rows::stride()) {
    const T* in = x + row * n.width;
    const T* other = skip ? skip + row * n.width : nullptr;
    T* out = y + row * n.width;
    // Element j of the row: x, or x + skip rounded to T (each pass recomputes the same value).
    auto value = [&](int64_t j) -> float {
      return other ? load(fromFloat<T>(load(in[j]) + load(other[j]))) : load(in[j]);
    };
    double total = 0.0;
    for (int64_t j = lane; j < n.width; j += size) {
      const float v = value(j);
      if (sum) store(sum + row * n.width + j, v);
      total += v;
    }
    total = Rows::reduce(total, SumOp(), shared);
    const double mu = total / count;
    double squares = 0.0;
    for (int64_t j = lane; j < n.width; j += size) {
      const double d = value(j) - mu;
      squares += d * d;
    }
    squares = Rows::reduce(squares, SumOp(), shared);
    const double inv = 1.0 / sqrt(squares / count + static_cast<double>(n.epsilon));
    double rowScale = 0.0, rowBias = 0.0;
    if (n.channels > 0) {
      const int64_t c = row % n.channels;
      rowScale = load(scale[c]);
      rowBias = bias ? load(bias[c]) : 0.0f;
    }
    for (int64_t j = lane; j < n.width; j += size) {
      const double s = n.channels > 0 ? rowScale : load(scale[j]);
      const double b = n.channels > 0 ? rowBias : (bias ? load(bias[j]) : 0.0f);
      store(out + j, static_cast<float>((value(j) - mu) * inv * s + b));
    }
    if (lane == 0) {
      if (mean) storeStat<T>(mean, row, static_cast<float>(mu), statsInT);
      if (invStdDev) storeStat<T>(invStdDev, row, static_cast<float>(inv), statsInT);
    }
  }
}

// LayerNormalization rows of float16 / bfloat16 (per-element scale and bias, at most
// 32 * 8 * kVectors elements, 8-element 16-byte vectors throughout): one warp a row, the row held
// in registers, so it is read from memory once. Statistics in float over the registers, two-pass
// (the mean, then the squared deviations from it): inputs of 11 or 8 significant bits leave float
// sums of a few thousand terms far more exact than the output's rounding. One rounding per
// output. Lane l holds vectors l, l + 32, ... of the row.
template <typename T, int kVectors>
__global__ void __launch_bounds__(kMaxRowThreads)
    rowNormVectorKernel(RowNormalization n, const T* __restrict__ x, const T* __restrict__ scale,
                        const T* __restrict__ bias, T* __restrict__ y, void* __restrict__ mean,
                        void* __restrict__ invStdDev, bool statsInT, const T* __restrict__ skip,
                        T* __restrict__ sum) {
  constexpr int kPack = 8;
  const int lane = WarpRows::lane();
  const int64_t vectors = n.width / kPack;
  const float count = static_cast<float>(n.width);
  for (int64_t row = WarpRows::first(); row < n.rows; row += WarpRows::stride()) {
    const uint4* in = reinterpret_cast<const uint4*>(x + row * n.width);
    float v[kVectors][kPack];
    float total = 0.0f;
#pragma unroll
    for (int t = 0; t < kVectors; ++t) {
      const int64_t c = lane + t * kWarpSize;
      uint4 raw = make_uint4(0, 0, 0, 0);
      uint4 rawSkip = make_uint4(0, 0, 0, 0);
      if (c < vectors) {
        raw = in[c];
        if (skip) rawSkip = reinterpret_cast<const uint4*>(skip + row * n.width)[c];
      }
      T* e = reinterpret_cast<T*>(&raw);
      const T* f = reinterpret_cast<const T*>(&rawSkip);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        // With skip, x + skip rounded to T as an Add would leave it.
        if (skip) e[k] = fromFloat<T>(load(e[k]) + load(f[k]));
        v[t][k] = load(e[k]);
        total += v[t][k];  // 0 for the vectors past the row
      }
      if (sum && c < vectors) reinterpret_cast<uint4*>(sum + row * n.width)[c] = raw;
    }
    const float mu = warpReduce(total, SumOp()) / count;
    float squares = 0.0f;
#pragma unroll
    for (int t = 0; t < kVectors; ++t) {
      if (lane + t * kWarpSize >= vectors) continue;
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        const float d = v[t][k] - mu;
        squares += d * d;
      }
    }
    squares = warpReduce(squares, SumOp());
    const float inv = 1.0f / sqrtf(squares / count + n.epsilon);
    uint4* out = reinterpret_cast<uint4*>(y + row * n.width);
#pragma unroll
    for (int t = 0; t < kVectors; ++t) {
      const int64_t c = lane + t * kWarpSize;
      if (c >= vectors) continue;
      const uint4 rawScale = reinterpret_cast<const uint4*>(scale)[c];
      uint4 rawBias = make_uint4(0, 0, 0, 0);
      if (bias) rawBias = reinterpret_cast<const uint4*>(bias)[c];
      const T* s = reinterpret_cast<const T*>(&rawScale);
      const T* b = reinterpret_cast<const T*>(&rawBias);
      uint4 result;
      T* r = reinterpret_cast<T*>(&result);
#pragma unroll
      for (int k = 0; k < kPack; ++k) {
        store(r + k, (v[t][k] - mu) * inv * load(s[k]) + load(b[k]));
      }
      out[c] = result;
    }
    if (lane == 0) {
      if (mean) storeStat<T>(mean, row, mu, statsInT);
      if (invStdDev) storeStat<T>(invStdDev, row, inv, statsInT);
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// Launches rowNormVectorKernel when the rows fit it (see there); false when they do not.
template <typename T>
bool launchRowNormVector(const RowNormalization& n, int warpRows, const T* x, const T* scale,
                         const T* bias, T* y, void* mean, void* invStdDev, bool statsInT,
                         const T* skip, T* sum, cudaStream_t stream) {
  constexpr int64_t kPerWarpVector = kWarpSize * 8;  // elements a warp covers per vector a lane
  if (n.channels != 0 || n.width % 8 != 0 || n.width > 4 * kPerWarpVector || !aligned16(x) ||
      !aligned16(y) || !aligned16(scale) || (bias && !aligned16(bias)) ||
      (skip && !aligned16(skip)) || (sum && !aligned16(sum))) {
    return false;
  }
  const unsigned blocks = blocksFor(n.rows, warpRows);
  const int vectorsPerLane = static_cast<int>((n.width + kPerWarpVector - 1) / kPerWarpVector);
  auto launch = [&](auto kernel) {
    kernel<<<blocks, warpRows * kWarpSize, 0, stream>>>(n, x, scale, bias, y, mean, invStdDev,
                                                        statsInT, skip, sum);
  };
  switch (vectorsPerLane) {
    case 1:
      launch(rowNormVectorKernel<T, 1>);
      break;
    case 2:
      launch(rowNormVectorKernel<T, 2>);
      break;
    case 3:
      launch(rowNormVectorKernel<T, 3>);
      break;
    default:
      launch(rowNormVectorKernel<T, 4>);
      break;
  }
  return true;
}

template <typename T>
__global__ void batchNormKernel(BatchNormGeometry g, const T* __restrict__ x,
                                const T* __restrict__ scale, const T* __restrict__ bias,
                                const T* __restrict__ mean, const T* __restrict__ var,
                                T* __restrict__ y) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < g.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t p = g.perElement ? i % (g.channels * g.inner) : (i / g.inner) % g.channels;
    const float normalized = (load(x[i]) - load(mean[p])) / sqrtf(load(var[p]) + g.epsilon);
    store(y + i, normalized * load(scale[p]) + load(bias[p]));
  }
}

// The offset of index `k` over `rank` axes of `dims` with `strides` (the last axis fastest).
__device__ __forceinline__ int64_t offsetOf(int64_t k, int rank, const int64_t* dims,
                                            const int64_t* strides) {
  int64_t offset = 0;
  for (int a = rank - 1; a >= 0; --a) {
    offset += (k % dims[a]) * strides[a];
    k /= dims[a];
  }
  return offset;
}

// Statistics in double, as rowNormKernel's (and the reference's).
template <typename T>
__global__ void meanVarianceKernel(SlotGeometry g, const T* __restrict__ x, T* __restrict__ y,
                                   int64_t slots, int64_t count) {
  __shared__ double shared[kWarpSize];
  const double n = static_cast<double>(count);
  for (int64_t slot = blockIdx.x; slot < slots; slot += gridDim.x) {
    const int64_t base = offsetOf(slot, g.keptRank, g.keptDims, g.keptStrides);
    double sum = 0.0;
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      sum += load(x[base + offsetOf(k, g.reducedRank, g.reducedDims, g.reducedStrides)]);
    }
    const double mu = blockReduce(sum, SumOp(), shared) / n;
    double squares = 0.0;
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const double d =
          load(x[base + offsetOf(k, g.reducedRank, g.reducedDims, g.reducedStrides)]) - mu;
      squares += d * d;
    }
    const double denominator = sqrt(blockReduce(squares, SumOp(), shared) / n) + 1e-9;
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x) {
      const int64_t at = base + offsetOf(k, g.reducedRank, g.reducedDims, g.reducedStrides);
      store(y + at, static_cast<float>((load(x[at]) - mu) / denominator));
    }
  }
}

// One thread per element; neighbouring threads take neighbouring spatial positions, so each
// channel of the window is read coalesced. In double, as the reference (LRN is rare and small).
template <typename T>
__global__ void lrnKernel(LrnGeometry g, const T* __restrict__ x, T* __restrict__ y,
                          int64_t count) {
  const int64_t before = (g.size - 1) / 2;
  const int64_t after = g.size - 1 - before;
  const double coefficient = static_cast<double>(g.alpha) / static_cast<double>(g.size);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t position = i % g.inner;
    const int64_t c = i / g.inner % g.channels;
    const int64_t n = i / g.inner / g.channels;
    const T* plane = x + n * g.channels * g.inner + position;
    const int64_t first = c - before < 0 ? 0 : c - before;
    const int64_t last = c + after > g.channels - 1 ? g.channels - 1 : c + after;
    double squares = 0.0;
    for (int64_t k = first; k <= last; ++k) {
      const double v = load(plane[k * g.inner]);
      squares += v * v;
    }
    const double scale = static_cast<double>(g.bias) + coefficient * squares;
    store(y + i, static_cast<float>(load(x[i]) / pow(scale, static_cast<double>(g.beta))));
  }
}

// Whether `rows` is a launch shape the row kernels take.
bool validThreads(int threads) { return threads >= 32 && threads <= 1024 && threads % 32 == 0; }

bool validRowLaunch(const RowLaunch& rows) {
  return rows.warpRows >= 1 && rows.warpRows * kWarpSize <= kMaxRowThreads &&
         rows.blockThreads >= kWarpSize && rows.blockThreads <= kMaxRowThreads &&
         rows.blockThreads % kWarpSize == 0;
}

cudaError_t launchLines(LineOp op, const Lines& lines, const RowLaunch& rows, ElementType type,
                        const void* x, void* y, cudaStream_t stream) {
  const int64_t count = lines.outer * lines.inner;
  if (count <= 0 || lines.length <= 0) return cudaSuccess;
  if (!validRowLaunch(rows) || rows.linesThreads < kWarpSize || rows.linesThreads > 1024 ||
      rows.linesThreads % kWarpSize != 0) {
    return cudaErrorInvalidValue;
  }
  return device::byFloatType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(x);
    T* out = static_cast<T*>(y);
    if (lines.inner > 1) {
      linesKernel<T><<<blocksFor(count, rows.linesThreads), rows.linesThreads, 0, stream>>>(
          op, lines, in, out, count);
    } else if (rows.kernel == RowKernel::kWarp) {
      rowsKernel<WarpRows, T>
          <<<blocksFor(count, rows.warpRows), rows.warpRows * kWarpSize, 0, stream>>>(
              op, count, lines.length, rows.onlineSoftmax, in, out);
    } else {
      rowsKernel<BlockRows, T><<<blocksFor(count, 1), rows.blockThreads, 0, stream>>>(
          op, count, lines.length, rows.onlineSoftmax, in, out);
    }
    return cudaGetLastError();
  });
}

}  // namespace

bool normSupported(ElementType type) {
  return type == ElementType::kFloat32 || type == ElementType::kFloat16 ||
         type == ElementType::kBFloat16;
}

cudaError_t launchSoftmax(SoftmaxKind kind, const Lines& lines, const RowLaunch& rows,
                          ElementType type, const void* x, void* y, cudaStream_t stream) {
  const LineOp op = kind == SoftmaxKind::kSoftmax      ? LineOp::kSoftmax
                    : kind == SoftmaxKind::kLogSoftmax ? LineOp::kLogSoftmax
                                                       : LineOp::kHardmax;
  return launchLines(op, lines, rows, type, x, y, stream);
}

cudaError_t launchLpNormalization(int p, const Lines& lines, const RowLaunch& rows,
                                  ElementType type, const void* x, void* y, cudaStream_t stream) {
  if (p != 1 && p != 2) return cudaErrorInvalidValue;
  return launchLines(p == 1 ? LineOp::kL1 : LineOp::kL2, lines, rows, type, x, y, stream);
}

cudaError_t launchRowNormalization(const RowNormalization& norm, const RowLaunch& rows,
                                   const void* x, const void* scale, const void* bias, void* y,
                                   void* mean, void* invStdDev, cudaStream_t stream,
                                   const void* skip, void* sum) {
  if (norm.rows <= 0 || norm.width <= 0) return cudaSuccess;
  if (!scale || norm.channels < 0 || !validRowLaunch(rows)) return cudaErrorInvalidValue;
  if (norm.statType != ElementType::kFloat32 && norm.statType != norm.type) {
    return cudaErrorInvalidValue;
  }
  const bool statsInT = norm.statType == norm.type;
  return device::byFloatType(norm.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(x);
    const T* s = static_cast<const T*>(scale);
    const T* b = static_cast<const T*>(bias);
    T* out = static_cast<T*>(y);
    const T* other = static_cast<const T*>(skip);
    T* total = static_cast<T*>(sum);
    if constexpr (!std::is_same_v<T, float>) {
      // Reduced types take the vectorised kernel wherever it fits.
      if (rows.kernel == RowKernel::kWarp && rows.registerRows &&
          launchRowNormVector(norm, rows.warpRows, in, s, b, out, mean, invStdDev, statsInT, other,
                              total, stream)) {
        return cudaGetLastError();
      }
    }
    if (rows.kernel == RowKernel::kWarp) {
      rowNormKernel<WarpRows, T>
          <<<blocksFor(norm.rows, rows.warpRows), rows.warpRows * kWarpSize, 0, stream>>>(
              norm, in, s, b, out, mean, invStdDev, statsInT, other, total);
    } else {
      rowNormKernel<BlockRows, T><<<blocksFor(norm.rows, 1), rows.blockThreads, 0, stream>>>(
          norm, in, s, b, out, mean, invStdDev, statsInT, other, total);
    }
    return cudaGetLastError();
  });
}

cudaError_t launchBatchNormalization(const BatchNormGeometry& geometry, const void* x,
                                     const void* scale, const void* bias, const void* mean,
                                     const void* var, void* y, cudaStream_t stream) {
  if (geometry.count <= 0) return cudaSuccess;
  if (geometry.channels <= 0 || geometry.inner <= 0 || !validThreads(geometry.blockThreads)) {
    return cudaErrorInvalidValue;
  }
  return device::byFloatType(geometry.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    batchNormKernel<T>
        <<<blocksFor(geometry.count, geometry.blockThreads), geometry.blockThreads, 0, stream>>>(
            geometry, static_cast<const T*>(x), static_cast<const T*>(scale),
            static_cast<const T*>(bias), static_cast<const T*>(mean), static_cast<const T*>(var),
            static_cast<T*>(y));
    return cudaGetLastError();
  });
}

cudaError_t launchLrn(const LrnGeometry& geometry, const void* x, void* y, cudaStream_t stream) {
  const int64_t count = geometry.batch * geometry.channels * geometry.inner;
  if (count <= 0) return cudaSuccess;
  if (geometry.size < 1 || !validThreads(geometry.blockThreads)) return cudaErrorInvalidValue;
  return device::byFloatType(geometry.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    lrnKernel<T><<<blocksFor(count, geometry.blockThreads), geometry.blockThreads, 0, stream>>>(
        geometry, static_cast<const T*>(x), static_cast<T*>(y), count);
    return cudaGetLastError();
  });
}

cudaError_t launchMeanVarianceNormalization(const SlotGeometry& geometry, ElementType type,
                                            const void* x, void* y, cudaStream_t stream) {
  if (geometry.keptRank < 0 || geometry.keptRank > kMaxNormRank || geometry.reducedRank < 0 ||
      geometry.reducedRank > kMaxNormRank) {
    return cudaErrorInvalidValue;
  }
  int64_t slots = 1, count = 1;
  for (int a = 0; a < geometry.keptRank; ++a) slots *= geometry.keptDims[a];
  for (int a = 0; a < geometry.reducedRank; ++a) count *= geometry.reducedDims[a];
  if (slots <= 0 || count <= 0) return cudaSuccess;
  return device::byFloatType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    meanVarianceKernel<T><<<blocksFor(slots, 1), kElementwiseThreads, 0, stream>>>(
        geometry, static_cast<const T*>(x), static_cast<T*>(y), slots, count);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
