// kiln's kernels for the ops of no other family (misc.h). Correct first: one thread per output
// element (or per line) in grid-stride loops, with the reference's accumulation types and order;
// CumSum scans contiguous lines a warp at a time, and TopK ranks elements through shared-memory
// tiles of their line.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "kiln/backends/cuda/kernels/device_types.cuh"
#include "kiln/backends/cuda/kernels/misc.h"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride loops cover the rest

unsigned blocksFor(int64_t work, int threads = kThreads) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((work + threads - 1) / threads, kMaxBlocks)));
}

using device::byNumericType;
using device::Tag;

using device::bySize;

using device::kIsHalf;
template <typename T>
constexpr bool kIsFloating = kIsHalf<T> || std::is_floating_point_v<T>;

// --- The reference's accumulation (AccumulatorOf, widen, narrow) ----------------------------

// Floating types accumulate in double, integers in uint64 (wrapping).
template <typename T>
using Acc = std::conditional_t<kIsFloating<T>, double, uint64_t>;

template <typename T>
__device__ __forceinline__ Acc<T> widen(T value) {
  if constexpr (std::is_same_v<T, __half>) {
    return static_cast<double>(__half2float(value));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return static_cast<double>(__bfloat162float(value));
  } else if constexpr (kIsFloating<T>) {
    return static_cast<double>(value);
  } else {
    return static_cast<uint64_t>(value);
  }
}

// As ir::convertElement: to half through float (two roundings, as the reference does).
template <typename T>
__device__ __forceinline__ T narrow(Acc<T> value) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(static_cast<float>(value));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}

// Sums and products without contraction into fused multiply-adds, which would round differently
// from the reference's separate operations.
__device__ __forceinline__ double accAdd(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ uint64_t accAdd(uint64_t a, uint64_t b) { return a + b; }
__device__ __forceinline__ double accMul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ uint64_t accMul(uint64_t a, uint64_t b) { return a * b; }

// --- Fill, EyeLike, Range ---------------------------------------------------------------------

template <typename U>
__global__ void fillKernel(U* dst, int64_t count, U value) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    dst[i] = value;
  }
}

template <typename U>
__global__ void eyeLikeKernel(U* dst, int64_t rows, int64_t cols, int64_t k, U one) {
  const int64_t count = rows * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / cols;
    const int64_t col = i - row * cols;
    dst[i] = col - row == k ? one : U{0};
  }
}

template <typename T>
__global__ void rangeKernel(RangeParams r, T* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < r.count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_floating_point_v<T>) {
      out[i] = static_cast<T>(__dadd_rn(r.start, __dmul_rn(static_cast<double>(i), r.delta)));
    } else {
      out[i] = static_cast<T>(r.startInt + i * r.deltaInt);
    }
  }
}

// --- CumSum -----------------------------------------------------------------------------------

// The line geometry of a CumSum: false where a runtime axis is out of range.
struct CumSumLines {
  int64_t length = 0;
  int64_t inner = 1;
};

__device__ __forceinline__ bool cumSumLines(const CumSumParams& p, CumSumLines& lines) {
  int64_t axis = p.axis;
  if (p.axisDevice) {
    axis = p.axis64 ? *static_cast<const int64_t*>(p.axisDevice)
                    : static_cast<int64_t>(*static_cast<const int32_t*>(p.axisDevice));
    if (axis < 0) axis += p.rank;
  }
  if (axis < 0 || axis >= p.rank) return false;
  lines.length = p.dims[axis];
  lines.inner = 1;
  for (int a = static_cast<int>(axis) + 1; a < p.rank; ++a) lines.inner *= p.dims[a];
  return true;
}

// One thread per line, walking it in the reference's order.
template <typename T>
__global__ void cumSumLineKernel(CumSumParams p, const T* __restrict__ x, T* __restrict__ y,
                                 int64_t total) {
  CumSumLines g;
  if (!cumSumLines(p, g) || g.length == 0) return;
  const int64_t lineCount = total / g.length;
  for (int64_t line = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; line < lineCount;
       line += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t outer = line / g.inner;
    const int64_t t = line - outer * g.inner;
    const int64_t base = outer * g.length * g.inner + t;
    Acc<T> sum = 0;
    for (int64_t s = 0; s < g.length; ++s) {
      const int64_t i = p.reverse ? g.length - 1 - s : s;
      const int64_t at = base + i * g.inner;
      const Acc<T> value = widen(x[at]);
      if (p.exclusive) y[at] = narrow<T>(sum);
      sum = accAdd(sum, value);
      if (!p.exclusive) y[at] = narrow<T>(sum);
    }
  }
}

// One warp per contiguous line (the axis is the innermost): 32 elements at a time, scanned
// across the warp and added to the carry of the chunks before.
template <typename T>
__global__ void cumSumWarpKernel(int64_t lineCount, int64_t length, bool exclusive, bool reverse,
                                 const T* __restrict__ x, T* __restrict__ y) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warpsPerBlock = blockDim.x / kWarp;
  const int64_t firstWarp = blockIdx.x * warpsPerBlock + threadIdx.x / kWarp;
  const int64_t warpCount = gridDim.x * warpsPerBlock;
  // Every lane of a warp runs the same iterations, so the shuffles see the whole warp.
  for (int64_t line = firstWarp; line < lineCount; line += warpCount) {
    const int64_t base = line * length;
    Acc<T> carry = 0;
    for (int64_t chunk = 0; chunk < length; chunk += kWarp) {
      const int64_t s = chunk + lane;
      const bool valid = s < length;
      const int64_t at = base + (reverse ? length - 1 - s : s);
      const Acc<T> value = valid ? widen(x[at]) : Acc<T>{0};
      Acc<T> inclusive = value;
#pragma unroll
      for (int offset = 1; offset < kWarp; offset *= 2) {
        const Acc<T> before = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive = accAdd(inclusive, before);
      }
      Acc<T> previous = __shfl_up_sync(0xffffffffu, inclusive, 1);
      if (lane == 0) previous = 0;
      if (valid) y[at] = narrow<T>(accAdd(carry, exclusive ? previous : inclusive));
      carry = accAdd(carry, __shfl_sync(0xffffffffu, inclusive, kWarp - 1));
    }
  }
}

// --- Einsum -----------------------------------------------------------------------------------

template <typename T>
__global__ void einsumKernel(EinsumParams p, T* __restrict__ out, int64_t outputs, int64_t terms) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < outputs;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t offsets[kMaxEinsumOperands] = {};
    int64_t rest = o;
    for (int a = p.outputRank - 1; a >= 0; --a) {
      const int64_t coord = rest % p.outputExtents[a];
      rest /= p.outputExtents[a];
      for (int k = 0; k < p.operands; ++k) offsets[k] += coord * p.outputStrides[k][a];
    }
    int64_t counter[kMaxEinsumLabels] = {};
    Acc<T> sum = 0;
    for (int64_t t = 0; t < terms; ++t) {
      Acc<T> term = widen(static_cast<const T*>(p.data[0])[offsets[0]]);
      for (int k = 1; k < p.operands; ++k) {
        term = accMul(term, widen(static_cast<const T*>(p.data[k])[offsets[k]]));
      }
      sum = accAdd(sum, term);
      // The odometer over the summed labels, the last fastest.
      for (int a = p.summedRank - 1; a >= 0; --a) {
        for (int k = 0; k < p.operands; ++k) offsets[k] += p.summedStrides[k][a];
        if (++counter[a] < p.summedExtents[a]) break;
        for (int k = 0; k < p.operands; ++k) {
          offsets[k] -= p.summedStrides[k][a] * p.summedExtents[a];
        }
        counter[a] = 0;
      }
    }
    out[o] = narrow<T>(sum);
  }
}

// --- OneHot -----------------------------------------------------------------------------------

// An index element as the reference's elementAsDouble reads it.
template <typename I>
__device__ __forceinline__ double indexAsDouble(I value) {
  if constexpr (std::is_same_v<I, __half>) {
    return static_cast<double>(__half2float(value));
  } else if constexpr (std::is_same_v<I, __nv_bfloat16>) {
    return static_cast<double>(__bfloat162float(value));
  } else {
    return static_cast<double>(value);
  }
}

template <typename U, typename I>
__global__ void oneHotKernel(OneHotParams p, const I* __restrict__ indices,
                             const U* __restrict__ values, U* __restrict__ out, int64_t total) {
  const U off = values[0];
  const U on = values[1];
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i % p.inner;
    const int64_t r = i / p.inner;
    const int64_t d = r % p.depth;
    const int64_t o = r / p.depth;
    const double raw = indexAsDouble(indices[o * p.inner + t]);
    int64_t hot = -1;
    if (isfinite(raw) && fabs(raw) < static_cast<double>(p.depth) + 1) {
      hot = static_cast<int64_t>(trunc(raw));
      if (hot < 0 && p.negativeFromBack) hot += p.depth;
    }
    out[i] = d == hot ? on : off;
  }
}

// --- TopK -------------------------------------------------------------------------------------

// The type TopK compares elements in: float for the float types, double for float64, the
// integer itself (widened) for integers.
template <typename T>
using KeyOf = std::conditional_t<
    std::is_same_v<T, double>, double,
    std::conditional_t<kIsFloating<T>, float,
                       std::conditional_t<std::is_signed_v<T>, int64_t, uint64_t>>>;

template <typename T>
__device__ __forceinline__ KeyOf<T> keyOf(T value) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(value);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(value);
  } else {
    return static_cast<KeyOf<T>>(value);
  }
}

// The reference's selectedBefore: by value (descending for largest), NaN after every number.
template <typename K>
__device__ __forceinline__ bool selectedBefore(K a, K b, bool largest) {
  if constexpr (std::is_floating_point_v<K>) {
    if (isnan(a)) return false;
    if (isnan(b)) return true;
  }
  return largest ? a > b : a < b;
}

// A block per (line, 256 consecutive positions): each thread counts the elements of the line
// that a stable sort puts before its own (those selected before it, and equal ones at lower
// positions), through tiles of the line in shared memory; an element whose count stays below k
// lands at that place in the output. The block stops early once each of its elements has k
// others before it.
template <typename T>
__global__ void topKKernel(TopKParams p, const T* __restrict__ x, T* __restrict__ values,
                           int64_t* __restrict__ indices, int64_t chunks, int64_t work) {
  using K = KeyOf<T>;
  __shared__ K tile[kThreads];
  // Every thread of a block runs the same iterations, so the barriers are uniform.
  for (int64_t w = blockIdx.x; w < work; w += gridDim.x) {
    const int64_t line = w / chunks;
    const int64_t chunk = w - line * chunks;
    const int64_t outer = line / p.inner;
    const int64_t t = line - outer * p.inner;
    const int64_t base = outer * p.n * p.inner + t;
    const int64_t i = chunk * kThreads + threadIdx.x;
    const bool mine = i < p.n;
    const K key = mine ? keyOf(x[base + i * p.inner]) : K{};
    int64_t rank = 0;
    for (int64_t start = 0; start < p.n; start += kThreads) {
      __syncthreads();  // the previous tile is consumed
      const int64_t j = start + threadIdx.x;
      if (j < p.n) tile[threadIdx.x] = keyOf(x[base + j * p.inner]);
      __syncthreads();
      if (mine && rank < p.k) {
        const int count = static_cast<int>(min(static_cast<int64_t>(kThreads), p.n - start));
        for (int q = 0; q < count; ++q) {
          const int64_t other = start + q;
          const K value = tile[q];
          if (other < i) {
            rank += !selectedBefore(key, value, p.largest);
          } else if (other > i) {
            rank += selectedBefore(value, key, p.largest);
          }
        }
      }
      if (__syncthreads_and(!mine || rank >= p.k)) break;
    }
    if (mine && rank < p.k) {
      const int64_t at = (outer * p.k + rank) * p.inner + t;
      if (values) values[at] = x[base + i * p.inner];
      if (indices) indices[at] = i;
    }
  }
}

bool validThreads(int threads) { return threads >= 32 && threads <= 1024 && threads % 32 == 0; }

}  // namespace

cudaError_t launchFill(void* dst, int64_t count, uint64_t pattern, int elementSize,
                       cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  return bySize(elementSize, [&](auto tag) {
    using U = decltype(tag);
    fillKernel<U><<<blocksFor(count), kThreads, 0, stream>>>(static_cast<U*>(dst), count,
                                                             static_cast<U>(pattern));
    return cudaGetLastError();
  });
}

cudaError_t launchEyeLike(void* dst, int64_t rows, int64_t cols, int64_t k, uint64_t one,
                          int elementSize, cudaStream_t stream) {
  const int64_t count = rows * cols;
  if (count <= 0) return cudaSuccess;
  return bySize(elementSize, [&](auto tag) {
    using U = decltype(tag);
    eyeLikeKernel<U><<<blocksFor(count), kThreads, 0, stream>>>(static_cast<U*>(dst), rows, cols, k,
                                                                static_cast<U>(one));
    return cudaGetLastError();
  });
}

cudaError_t launchRange(const RangeParams& range, ElementType type, void* out,
                        cudaStream_t stream) {
  if (range.count <= 0) return cudaSuccess;
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    rangeKernel<T><<<blocksFor(range.count), kThreads, 0, stream>>>(range, static_cast<T*>(out));
    return cudaGetLastError();
  };
  switch (type) {
    case ElementType::kFloat32:
      return launch(float{});
    case ElementType::kFloat64:
      return launch(double{});
    case ElementType::kInt16:
      return launch(int16_t{});
    case ElementType::kInt32:
      return launch(int32_t{});
    case ElementType::kInt64:
      return launch(int64_t{});
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t launchCumSum(const CumSumParams& params, ElementType type, const void* x, void* y,
                         cudaStream_t stream) {
  if (params.rank < 1 || params.rank > kMaxMiscRank) return cudaErrorInvalidValue;
  int64_t total = 1;
  for (int a = 0; a < params.rank; ++a) total *= params.dims[a];
  if (total <= 0) return cudaSuccess;
  if (!params.axisDevice && (params.axis < 0 || params.axis >= params.rank)) {
    return cudaErrorInvalidValue;
  }
  // A known innermost axis: a warp per line.
  const bool warpLines =
      !params.axisDevice && params.axis == params.rank - 1 && !params.threadLines;
  return byNumericType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = static_cast<const T*>(x);
    T* out = static_cast<T*>(y);
    if (warpLines) {
      const int64_t length = params.dims[params.rank - 1];
      const int64_t lineCount = total / length;
      const int64_t warpsPerBlock = kThreads / kWarp;
      const auto blocks = static_cast<unsigned>(
          std::min<int64_t>((lineCount + warpsPerBlock - 1) / warpsPerBlock, kMaxBlocks));
      cumSumWarpKernel<T><<<blocks, kThreads, 0, stream>>>(lineCount, length, params.exclusive,
                                                           params.reverse, in, out);
    } else {
      // With a runtime axis the line count is unknown here: at most every element starts one.
      cumSumLineKernel<T><<<blocksFor(total), kThreads, 0, stream>>>(params, in, out, total);
    }
    return cudaGetLastError();
  });
}

cudaError_t launchEinsum(const EinsumParams& params, ElementType type, void* out,
                         cudaStream_t stream) {
  if (params.operands < 1 || params.operands > kMaxEinsumOperands ||
      !validThreads(params.blockThreads)) {
    return cudaErrorInvalidValue;
  }
  if (params.outputRank < 0 || params.outputRank > kMaxEinsumLabels || params.summedRank < 0 ||
      params.summedRank > kMaxEinsumLabels) {
    return cudaErrorInvalidValue;
  }
  int64_t outputs = 1;
  for (int a = 0; a < params.outputRank; ++a) outputs *= params.outputExtents[a];
  int64_t terms = 1;
  for (int a = 0; a < params.summedRank; ++a) terms *= params.summedExtents[a];
  if (outputs <= 0) return cudaSuccess;
  return byNumericType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    einsumKernel<T><<<blocksFor(outputs, params.blockThreads), params.blockThreads, 0, stream>>>(
        params, static_cast<T*>(out), outputs, terms);
    return cudaGetLastError();
  });
}

cudaError_t launchOneHot(const OneHotParams& params, ElementType indexType, const void* indices,
                         const void* values, void* out, int elementSize, cudaStream_t stream) {
  const int64_t total = params.outer * params.depth * params.inner;
  if (total <= 0) return cudaSuccess;
  if (!validThreads(params.blockThreads)) return cudaErrorInvalidValue;
  return bySize(elementSize, [&](auto sizeTag) {
    using U = decltype(sizeTag);
    return byNumericType(indexType, [&](auto tag) {
      using I = typename decltype(tag)::type;
      oneHotKernel<U, I><<<blocksFor(total, params.blockThreads), params.blockThreads, 0, stream>>>(
          params, static_cast<const I*>(indices), static_cast<const U*>(values),
          static_cast<U*>(out), total);
      return cudaGetLastError();
    });
  });
}

cudaError_t launchTopK(const TopKParams& params, ElementType type, const void* x, void* values,
                       int64_t* indices, cudaStream_t stream) {
  const int64_t lines = params.outer * params.inner;
  if (lines <= 0 || params.k <= 0 || params.n <= 0) return cudaSuccess;
  if (params.k > params.n) return cudaErrorInvalidValue;
  const int64_t chunks = (params.n + kThreads - 1) / kThreads;
  const int64_t work = lines * chunks;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(work, kMaxBlocks));
  return byNumericType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    topKKernel<T><<<blocks, kThreads, 0, stream>>>(params, static_cast<const T*>(x),
                                                   static_cast<T*>(values), indices, chunks, work);
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
