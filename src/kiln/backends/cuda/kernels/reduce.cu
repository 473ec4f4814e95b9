// kiln's reduction kernels (reduce.h). A reducer says how one output's state starts, takes an
// element, combines with another partial state and is written out; the two kernels only decide
// which threads share an output. LogSumExp takes two passes over its elements: the maximum first
// (the shift that keeps exp from overflowing), then the shifted sum.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/backends/cuda/kernels/device_types.cuh"
#include "kiln/backends/cuda/kernels/reduce.h"

namespace kiln::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int64_t kMaxBlocks = 4096;  // grid-stride loops cover the rest
// A warp per output up to this many reduced elements, a block beyond.
// The column kernel's block: 32 neighbouring outputs by 8 slices of the reduced range.
constexpr int kColumnWidth = 32;
constexpr int kMaxColumnSlices = 32;  // a column block's slices: ReduceLaunch::columnSlices

unsigned blocksFor(int64_t units) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(units, kMaxBlocks)));
}

// --- Element types -------------------------------------------------------------------------------

using device::BoolByte;
using device::kIsBool;
using device::kIsHalf;
using device::kIsInteger;
using device::kIsReal;
using device::Tag;

// The value an extremum or an index search compares: float for float32 and the half types
// (exact), double for float64, the widest integer of the signedness for integers and bool.
template <typename T>
using Wide = std::conditional_t<
    kIsReal<T>, std::conditional_t<std::is_same_v<T, double>, double, float>,
    std::conditional_t<kIsBool<T> || std::is_unsigned_v<T>, unsigned long long, long long>>;

template <typename T>
__device__ __forceinline__ Wide<T> wide(T value) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(value);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(value);
  } else if constexpr (kIsBool<T>) {
    return value.bits != 0 ? 1ull : 0ull;
  } else {
    return static_cast<Wide<T>>(value);
  }
}

template <typename T>
__device__ __forceinline__ double asDouble(T value) {
  return static_cast<double>(wide(value));
}

template <typename T>
__device__ __forceinline__ T truncateToInteger(double value) {
  if (isnan(value)) return T{0};
  if (value <= static_cast<double>(std::numeric_limits<T>::lowest())) {
    return std::numeric_limits<T>::lowest();
  }
  if (value >= static_cast<double>(std::numeric_limits<T>::max())) {
    return std::numeric_limits<T>::max();
  }
  return static_cast<T>(value);
}

// A double result to element type T, rounded once (floating) or truncated and saturated
// (integers), as the reference's convertElement and saturate.
template <typename T>
__device__ __forceinline__ T fromDouble(double value) {
  if constexpr (std::is_same_v<T, __half>) {
    return __double2half(value);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __double2bfloat16(value);
  } else if constexpr (kIsInteger<T>) {
    return truncateToInteger<T>(value);
  } else {
    return static_cast<T>(value);
  }
}

// A compared value back to T (exact: it is one of the inputs, or an identity T holds).
template <typename T>
__device__ __forceinline__ T fromWide(Wide<T> value) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(value);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(value);
  } else if constexpr (kIsBool<T>) {
    return BoolByte{static_cast<uint8_t>(value != 0 ? 1 : 0)};
  } else {
    return static_cast<T>(value);
  }
}

// --- Warp shuffles of each state type ------------------------------------------------------------

__device__ __forceinline__ float shuffleXor(float v, int mask) {
  return __shfl_xor_sync(kFullMask, v, mask);
}
__device__ __forceinline__ double shuffleXor(double v, int mask) {
  return __shfl_xor_sync(kFullMask, v, mask);
}
__device__ __forceinline__ long long shuffleXor(long long v, int mask) {
  return __shfl_xor_sync(kFullMask, v, mask);
}
__device__ __forceinline__ unsigned long long shuffleXor(unsigned long long v, int mask) {
  return __shfl_xor_sync(kFullMask, v, mask);
}

template <typename V>
struct Candidate {
  V value;
  long long index;  // -1: none yet
};

template <typename V>
__device__ __forceinline__ Candidate<V> shuffleXor(Candidate<V> c, int mask) {
  return {shuffleXor(c.value, mask), shuffleXor(c.index, mask)};
}

template <typename V>
__device__ __forceinline__ bool isNaN(V value) {
  if constexpr (std::is_floating_point_v<V>) {
    return isnan(value);
  } else {
    return false;
  }
}

// NaN-propagating, as the reference's extremum.
template <typename V>
__device__ __forceinline__ V maximum(V a, V b) {
  if (isNaN(a) || isNaN(b)) return isNaN(a) ? a : b;
  return b > a ? b : a;
}
template <typename V>
__device__ __forceinline__ V minimum(V a, V b) {
  if (isNaN(a) || isNaN(b)) return isNaN(a) ? a : b;
  return b < a ? b : a;
}

// --- Reducers ------------------------------------------------------------------------------------
//
// identity(); take(state, element, r, shift); combine(a, b); finish(state, shift) -> Out. Only
// LogSumExp reads `shift` (its first pass's maximum).

// Sum, Mean, Prod, SumSquare, L1, L2, LogSum in double: floating inputs, and integer inputs of
// L2 and LogSum (whose results are truncated back).
template <typename T>
struct DoubleSum {
  using State = double;
  using Out = T;
  static constexpr bool kTwoPass = false;
  ReduceOp op;
  int64_t count;
  __device__ State identity() const { return op == ReduceOp::kProd ? 1.0 : 0.0; }
  __device__ State take(State s, T element, int64_t, double) const {
    const double x = asDouble(element);
    switch (op) {
      case ReduceOp::kProd:
        return s * x;
      case ReduceOp::kSumSquare:
      case ReduceOp::kL2:
        return s + x * x;
      case ReduceOp::kL1:
        return s + fabs(x);
      default:
        return s + x;
    }
  }
  __device__ State combine(State a, State b) const { return op == ReduceOp::kProd ? a * b : a + b; }
  __device__ Out finish(State s, double) const {
    if (op == ReduceOp::kMean) s /= static_cast<double>(count);
    if (op == ReduceOp::kL2) s = sqrt(s);
    if (op == ReduceOp::kLogSum) s = log(s);
    return fromDouble<T>(s);
  }
};

// Sum, Mean, Prod, SumSquare and L1 of integers: modulo 2^64, then narrowed; Mean divides the
// narrowed sum, truncating (0 for the empty set).
template <typename T>
struct WrappingSum {
  using State = unsigned long long;
  using Out = T;
  static constexpr bool kTwoPass = false;
  ReduceOp op;
  int64_t count;
  __device__ State identity() const { return op == ReduceOp::kProd ? 1ull : 0ull; }
  __device__ State take(State s, T element, int64_t, double) const {
    State x = static_cast<State>(element);
    switch (op) {
      case ReduceOp::kProd:
        return s * x;
      case ReduceOp::kSumSquare:
        return s + x * x;
      case ReduceOp::kL1:
        if constexpr (std::is_signed_v<T>) {
          if (element < 0) x = 0ull - x;
        }
        return s + x;
      default:
        return s + x;
    }
  }
  __device__ State combine(State a, State b) const { return op == ReduceOp::kProd ? a * b : a + b; }
  __device__ Out finish(State s, double) const {
    const T value = static_cast<T>(s);
    if (op != ReduceOp::kMean) return value;
    if (count <= 0) return T{0};
    using Division = std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>;
    return static_cast<T>(static_cast<Division>(value) / static_cast<Division>(count));
  }
};

// Max and Min: NaN propagates; the empty set gives -inf / +inf, or the type's limits.
template <typename T>
struct Extremum {
  using State = Wide<T>;
  using Out = T;
  static constexpr bool kTwoPass = false;
  bool isMax;
  __device__ State identity() const {
    if constexpr (kIsReal<T>) {
      return isMax ? -INFINITY : INFINITY;
    } else if constexpr (kIsBool<T>) {
      return isMax ? 0ull : 1ull;
    } else {
      return isMax ? static_cast<State>(std::numeric_limits<T>::lowest())
                   : static_cast<State>(std::numeric_limits<T>::max());
    }
  }
  __device__ State take(State s, T element, int64_t, double) const {
    return combine(s, wide(element));
  }
  __device__ State combine(State a, State b) const { return isMax ? maximum(a, b) : minimum(a, b); }
  __device__ Out finish(State s, double) const { return fromWide<T>(s); }
};

// The maximum in double: LogSumExp's first pass.
template <typename T>
struct DoubleMax {
  using State = double;
  __device__ State identity() const { return -INFINITY; }
  __device__ State take(State s, T element, int64_t, double) const {
    return maximum(s, asDouble(element));
  }
  __device__ State combine(State a, State b) const { return maximum(a, b); }
};

// log(sum(exp(x - shift))) + shift with shift the maximum; a non-finite maximum (NaN, +inf, or
// -inf for the empty set and all -inf) is the result.
template <typename T>
struct LogSumExp {
  using State = double;
  using Out = T;
  static constexpr bool kTwoPass = true;
  __device__ State identity() const { return 0.0; }
  __device__ State take(State s, T element, int64_t, double shift) const {
    return isfinite(shift) ? s + exp(asDouble(element) - shift) : s;
  }
  __device__ State combine(State a, State b) const { return a + b; }
  __device__ Out finish(State s, double shift) const {
    return fromDouble<T>(isfinite(shift) ? shift + log(s) : shift);
  }
};

// ArgMax and ArgMin: NaN beats every number (numpy's rule); among equals the first index, or
// the last with select_last_index. A total order, so partial results combine in any order.
template <typename T>
struct ArgExtremum {
  using V = Wide<T>;
  using State = Candidate<V>;
  using Out = int64_t;
  static constexpr bool kTwoPass = false;
  bool isMax;
  bool lastOnTie;
  __device__ State identity() const { return {V{}, -1}; }
  __device__ bool chosenOver(const State& a, const State& b) const {
    if (b.index < 0) return true;
    if (a.index < 0) return false;
    const bool aNaN = isNaN(a.value), bNaN = isNaN(b.value);
    const bool tie = aNaN && bNaN ? true : (aNaN || bNaN ? false : a.value == b.value);
    if (tie) return lastOnTie ? a.index > b.index : a.index < b.index;
    if (aNaN || bNaN) return aNaN;
    return isMax ? a.value > b.value : a.value < b.value;
  }
  __device__ State take(State s, T element, int64_t r, double) const {
    return combine(s, State{wide(element), static_cast<long long>(r)});
  }
  __device__ State combine(State a, State b) const { return chosenOver(a, b) ? a : b; }
  __device__ Out finish(State s, double) const { return s.index < 0 ? 0 : s.index; }
};

// --- Offsets -------------------------------------------------------------------------------------

__device__ __forceinline__ int64_t keptOffset(const ReduceGeometry& g, int64_t o) {
  int64_t offset = 0;
  for (int d = g.keptRank - 1; d >= 0; --d) {
    const int64_t dim = g.keptDims[d];
    offset += (o % dim) * g.keptStrides[d];
    o /= dim;
  }
  return offset;
}

__device__ __forceinline__ int64_t reducedOffset(const ReduceGeometry& g, int64_t r) {
  if (g.reducedRank == 1) return r * g.reducedStrides[0];
  int64_t offset = 0;
  for (int d = g.reducedRank - 1; d >= 0; --d) {
    const int64_t dim = g.reducedDims[d];
    offset += (r % dim) * g.reducedStrides[d];
    r /= dim;
  }
  return offset;
}

// --- Group reductions ----------------------------------------------------------------------------

// Every lane of the warp gets the combination of all 32 states.
template <typename R, typename S>
__device__ __forceinline__ S warpReduce(const R& reducer, S s) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    s = reducer.combine(s, shuffleXor(s, offset));
  }
  return s;
}

// Every thread of the block gets the combination of all states; `shared` holds kWarpSize states.
template <typename R, typename S>
__device__ __forceinline__ S blockReduce(const R& reducer, S s, S* shared) {
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  s = warpReduce(reducer, s);
  __syncthreads();  // an earlier reduction may still be reading `shared`
  if (lane == 0) shared[warp] = s;
  __syncthreads();
  s = lane < warps ? shared[lane] : reducer.identity();
  s = warpReduce(reducer, s);
  return s;
}

// Storage for kWarpSize states of any reducer (aligned for the widest).
template <typename S>
__device__ __forceinline__ S* sharedStates() {
  __shared__ alignas(16) unsigned char raw[kWarpSize * 16];
  static_assert(sizeof(S) <= 16, "a reduction state fits 16 bytes");
  return reinterpret_cast<S*>(raw);
}

// The combination over one output's elements by a group of `size` threads (this one is `lane`):
// a warp (kBlockGroup false) or the whole block.
template <bool kBlockGroup, typename R, typename First, typename T>
__device__ __forceinline__ typename R::State reduceGroup(const R& reducer, const First& first,
                                                         const ReduceGeometry& g, const T* x,
                                                         int64_t base, int lane, int size,
                                                         double* shiftOut) {
  double shift = 0.0;
  if constexpr (R::kTwoPass) {
    typename First::State m = first.identity();
    for (int64_t r = lane; r < g.reduced; r += size) {
      m = first.take(m, x[base + reducedOffset(g, r)], r, 0.0);
    }
    if constexpr (kBlockGroup) {
      m = blockReduce(first, m, sharedStates<typename First::State>());
    } else {
      m = warpReduce(first, m);
    }
    shift = m;
  }
  typename R::State s = reducer.identity();
  for (int64_t r = lane; r < g.reduced; r += size) {
    s = reducer.take(s, x[base + reducedOffset(g, r)], r, shift);
  }
  if constexpr (kBlockGroup) {
    s = blockReduce(reducer, s, sharedStates<typename R::State>());
  } else {
    s = warpReduce(reducer, s);
  }
  *shiftOut = shift;
  return s;
}

// Rows: a warp (kBlockGroup false: blockDim.x / 32 outputs per block) or a block per output.
template <bool kBlockGroup, typename R, typename T>
__global__ void rowsKernel(ReduceGeometry g, R reducer, DoubleMax<T> first, const T* x,
                           typename R::Out* y) {
  const int groupsPerBlock = kBlockGroup ? 1 : static_cast<int>(blockDim.x) / kWarpSize;
  const int group = kBlockGroup ? 0 : static_cast<int>(threadIdx.x) / kWarpSize;
  const int lane = kBlockGroup ? static_cast<int>(threadIdx.x) : threadIdx.x % kWarpSize;
  const int size = kBlockGroup ? static_cast<int>(blockDim.x) : kWarpSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * groupsPerBlock;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * groupsPerBlock + group; o < g.outputs;
       o += stride) {
    double shift = 0.0;
    const typename R::State s =
        reduceGroup<kBlockGroup>(reducer, first, g, x, keptOffset(g, o), lane, size, &shift);
    if (lane == 0) y[o] = reducer.finish(s, shift);
  }
}

// A column block's partial states of output column tx, combined in slice order.
template <typename R>
__device__ typename R::State combineSlices(const R& reducer, const typename R::State* partial,
                                           int tx) {
  typename R::State total = partial[tx];
  for (int slice = 1; slice < static_cast<int>(blockDim.y); ++slice) {
    total = reducer.combine(total, partial[slice * kColumnWidth + tx]);
  }
  return total;
}

// Columns: threadIdx.x takes neighbouring outputs, threadIdx.y a slice of the reduced range; the
// slices combine in order through shared memory.
template <typename R, typename T>
__global__ void columnsKernel(ReduceGeometry g, R reducer, DoubleMax<T> first, const T* x,
                              typename R::Out* y) {
  using S = typename R::State;
  __shared__ alignas(16) unsigned char raw[kMaxColumnSlices * kColumnWidth * 16];
  static_assert(sizeof(S) <= 16 && sizeof(double) <= 16, "a reduction state fits 16 bytes");
  S* partial = reinterpret_cast<S*>(raw);
  double* shifts = reinterpret_cast<double*>(raw);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t tiles = (g.outputs + kColumnWidth - 1) / kColumnWidth;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t o = tile * kColumnWidth + tx;
    const bool active = o < g.outputs;
    const int64_t base = active ? keptOffset(g, o) : 0;
    double shift = 0.0;
    if constexpr (R::kTwoPass) {
      double m = first.identity();
      if (active) {
        for (int64_t r = ty; r < g.reduced; r += blockDim.y) {
          m = first.take(m, x[base + reducedOffset(g, r)], r, 0.0);
        }
      }
      __syncthreads();  // the previous tile may still be reading the shared states
      shifts[ty * kColumnWidth + tx] = m;
      __syncthreads();
      m = shifts[tx];
      for (int slice = 1; slice < static_cast<int>(blockDim.y); ++slice) {
        m = first.combine(m, shifts[slice * kColumnWidth + tx]);
      }
      shift = m;
    }
    S s = reducer.identity();
    if (active) {
      for (int64_t r = ty; r < g.reduced; r += blockDim.y) {
        s = reducer.take(s, x[base + reducedOffset(g, r)], r, shift);
      }
    }
    __syncthreads();
    partial[ty * kColumnWidth + tx] = s;
    __syncthreads();
    if (ty == 0 && active) y[o] = reducer.finish(combineSlices(reducer, partial, tx), shift);
  }
}

// Split columns, for few outputs over a long reduced range (the column kernel would start too
// few blocks): block (tile, split) reduces its tile's outputs over the split's contiguous chunk of
// the reduced range into partials[split * outputs + o]; combineSplitsKernel then combines the
// splits in order. Not for two-pass reducers.
template <typename R, typename T>
__global__ void columnsSplitKernel(ReduceGeometry g, R reducer, const T* x,
                                   typename R::State* partials, int64_t chunk) {
  using S = typename R::State;
  __shared__ alignas(16) unsigned char raw[kMaxColumnSlices * kColumnWidth * 16];
  static_assert(sizeof(S) <= 16, "a reduction state fits 16 bytes");
  S* partial = reinterpret_cast<S*>(raw);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kColumnWidth + tx;
  const int64_t split = blockIdx.y;
  const bool active = o < g.outputs;
  const int64_t begin = split * chunk;
  const int64_t end = begin + chunk < g.reduced ? begin + chunk : g.reduced;
  S s = reducer.identity();
  if (active) {
    const int64_t base = keptOffset(g, o);
    for (int64_t r = begin + ty; r < end; r += blockDim.y) {
      s = reducer.take(s, x[base + reducedOffset(g, r)], r, 0.0);
    }
  }
  partial[ty * kColumnWidth + tx] = s;
  __syncthreads();
  if (ty == 0 && active) partials[split * g.outputs + o] = combineSlices(reducer, partial, tx);
}

template <typename R>
__global__ void combineSplitsKernel(int64_t outputs, R reducer, const typename R::State* partials,
                                    int64_t splits, typename R::Out* y) {
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < outputs;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    typename R::State total = partials[o];
    for (int64_t split = 1; split < splits; ++split) {
      total = reducer.combine(total, partials[split * outputs + o]);
    }
    y[o] = reducer.finish(total, 0.0);
  }
}

template <typename R, typename T>
cudaError_t launchWith(const ReduceLaunch& launch, const R& reducer, cudaStream_t stream) {
  const ReduceGeometry& g = launch.geometry;
  const T* x = static_cast<const T*>(launch.x);
  auto* y = static_cast<typename R::Out*>(launch.y);
  const DoubleMax<T> first{};
  const int64_t splits = R::kTwoPass ? 1 : reduceColumnSplits(launch);
  if (splits > 1) {
    if (!launch.workspace) return cudaErrorInvalidValue;
    auto* partials = static_cast<typename R::State*>(launch.workspace);
    const int64_t chunk = (g.reduced + splits - 1) / splits;
    const dim3 grid(static_cast<unsigned>((g.outputs + kColumnWidth - 1) / kColumnWidth),
                    static_cast<unsigned>(splits));
    columnsSplitKernel<R, T><<<grid, dim3(kColumnWidth, launch.columnSlices), 0, stream>>>(
        g, reducer, x, partials, chunk);
    combineSplitsKernel<R><<<blocksFor((g.outputs + 255) / 256), 256, 0, stream>>>(
        g.outputs, reducer, partials, splits, y);
  } else if (!g.rows) {
    const dim3 block(kColumnWidth, launch.columnSlices);
    columnsKernel<R, T>
        <<<blocksFor((g.outputs + kColumnWidth - 1) / kColumnWidth), block, 0, stream>>>(
            g, reducer, first, x, y);
  } else if (reduceUsesWarpRows(launch)) {
    const int groups = launch.blockThreads / kWarpSize;
    rowsKernel<false, R, T>
        <<<blocksFor((g.outputs + groups - 1) / groups), launch.blockThreads, 0, stream>>>(
            g, reducer, first, x, y);
  } else {
    rowsKernel<true, R, T>
        <<<blocksFor(g.outputs), launch.blockThreads, 0, stream>>>(g, reducer, first, x, y);
  }
  return cudaGetLastError();
}

bool isRealType(ElementType type) {
  return type == ElementType::kFloat32 || type == ElementType::kFloat16 ||
         type == ElementType::kBFloat16 || type == ElementType::kFloat64;
}

}  // namespace

int64_t reduceColumnSplits(const ReduceLaunch& launch) {
  const ReduceGeometry& g = launch.geometry;
  if (g.rows || g.outputs <= 0 || launch.op == ReduceOp::kLogSumExp) return 1;
  const int64_t target = std::max<int64_t>(1, launch.splitTargetBlocks);
  const int64_t tiles = (g.outputs + kColumnWidth - 1) / kColumnWidth;
  if (tiles >= target || tiles > 65535) return 1;
  const int64_t wanted = (target + tiles - 1) / tiles;
  // Each chunk at least splitMinChunk long.
  const int64_t most = g.reduced / std::max<int64_t>(1, launch.splitMinChunk);
  return std::max<int64_t>(1, std::min<int64_t>({wanted, most, 65535}));
}

int64_t reduceWorkspaceBytes(const ReduceLaunch& launch) {
  const int64_t splits = reduceColumnSplits(launch);
  return splits > 1 ? splits * launch.geometry.outputs * 16 : 0;
}

bool reduceUsesWarpRows(const ReduceLaunch& launch) {
  return launch.geometry.reduced <= launch.warpRowLimit;
}

bool reduceSupported(ReduceOp op, ElementType type) {
  if (type != ElementType::kBool) return true;
  return op == ReduceOp::kMax || op == ReduceOp::kMin;
}

cudaError_t launchReduce(const ReduceLaunch& launch, cudaStream_t stream) {
  const ReduceGeometry& g = launch.geometry;
  if (!reduceSupported(launch.op, launch.type)) return cudaErrorInvalidValue;
  if (launch.blockThreads != 128 && launch.blockThreads != 256 && launch.blockThreads != 512) {
    return cudaErrorInvalidValue;
  }
  if (launch.columnSlices < 1 || launch.columnSlices > kMaxColumnSlices) {
    return cudaErrorInvalidValue;
  }
  if (g.keptRank > kMaxReduceRank || g.reducedRank > kMaxReduceRank || g.reduced < 0) {
    return cudaErrorInvalidValue;
  }
  if (g.outputs <= 0) return cudaSuccess;
  const ReduceOp op = launch.op;
  const bool real = isRealType(launch.type);
  return device::byElementType(launch.type, [&](auto tag) -> cudaError_t {
    using T = typename std::decay_t<decltype(tag)>::type;
    switch (op) {
      case ReduceOp::kMax:
      case ReduceOp::kMin:
        return launchWith<Extremum<T>, T>(launch, Extremum<T>{op == ReduceOp::kMax}, stream);
      default:
        break;
    }
    if constexpr (kIsBool<T>) {
      return cudaErrorInvalidValue;
    } else {
      switch (op) {
        case ReduceOp::kArgMax:
        case ReduceOp::kArgMin:
          return launchWith<ArgExtremum<T>, T>(
              launch, ArgExtremum<T>{op == ReduceOp::kArgMax, launch.selectLastIndex}, stream);
        case ReduceOp::kLogSumExp:
          return launchWith<LogSumExp<T>, T>(launch, LogSumExp<T>{}, stream);
        case ReduceOp::kL2:
        case ReduceOp::kLogSum:
          return launchWith<DoubleSum<T>, T>(launch, DoubleSum<T>{op, g.reduced}, stream);
        default:
          break;
      }
      if (real) return launchWith<DoubleSum<T>, T>(launch, DoubleSum<T>{op, g.reduced}, stream);
      if constexpr (kIsInteger<T>) {
        return launchWith<WrappingSum<T>, T>(launch, WrappingSum<T>{op, g.reduced}, stream);
      } else {
        return cudaErrorInvalidValue;
      }
    }
  });
}

}  // namespace kiln::cuda
