// kiln's data-movement kernels (datamove.h). Simple and obviously correct first: one thread per
// destination element in grid-stride loops, elements moved as raw 1/2/4/8-byte words, every
// index guarded; the tiled transpose is the one kernel shaped for bandwidth.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/backends/cuda/kernels/datamove.h"
#include "kiln/backends/cuda/kernels/device_types.cuh"

namespace kiln::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;  // grid-stride loops cover the rest
// Below this many elements (source and destination), the strided gather indexes in 32 bits. A
// margin below 2^31 keeps `i + gridDim.x * blockDim.x` (at most 2^30 more, with 1024-thread
// blocks) from overflowing.
constexpr int64_t kNarrowLimit = int64_t{1} << 30;

constexpr int kTile = 32;  // the tiled transpose's tile edge

unsigned blocksFor(int64_t count, int threads = kThreads) {
  return static_cast<unsigned>(std::min<int64_t>((count + threads - 1) / threads, kMaxBlocks));
}

bool validBlock(int threads) { return threads >= 32 && threads <= 1024 && threads % 32 == 0; }

using device::bySize;

// Calls fn(Index{}) with the index type the indices tensor holds.
template <typename Fn>
cudaError_t byIndexType(bool indices64, Fn&& fn) {
  return indices64 ? fn(int64_t{}) : fn(int32_t{});
}

// An index as the reference reads it: negative counts from the back; -1 when out of range.
template <typename Index>
__device__ __forceinline__ int64_t normalizedIndex(const Index* indices, int64_t position,
                                                   int64_t size) {
  int64_t index = static_cast<int64_t>(indices[position]);
  if (index < 0) index += size;
  return index >= 0 && index < size ? index : -1;
}

template <typename U, typename I>
__global__ void stridedGatherKernel(StridedGather g, const U* __restrict__ src, U* __restrict__ dst,
                                    I total) {
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
       i < total; i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    I rest = i;
    I source = static_cast<I>(g.srcOffset);
#pragma unroll
    for (int a = kMaxMoveRank - 1; a >= 0; --a) {
      if (a >= g.rank) continue;
      const I dim = static_cast<I>(g.dims[a]);
      const I coord = rest % dim;
      rest /= dim;
      source += coord * static_cast<I>(g.srcStrides[a]);
    }
    dst[i] = src[source];
  }
}

template <typename U>
__global__ void tiledTransposeKernel(TiledTranspose t, const U* __restrict__ src,
                                     U* __restrict__ dst, int64_t rowTiles, int64_t colTiles,
                                     int64_t tileCount) {
  // tile[col][row] within the tile; the padding column keeps the column reads conflict-free.
  __shared__ U tile[kTile][kTile + 1];
  // Every thread of the block runs the same iterations, so the barriers are uniform.
  for (int64_t tileIndex = blockIdx.x; tileIndex < tileCount; tileIndex += gridDim.x) {
    int64_t rest = tileIndex;
    const int64_t colTile = rest % colTiles;
    rest /= colTiles;
    const int64_t rowTile = rest % rowTiles;
    rest /= rowTiles;
    int64_t srcBase = t.srcOffset;
    int64_t dstBase = 0;
    for (int a = t.batchRank - 1; a >= 0; --a) {
      const int64_t coord = rest % t.batchDims[a];
      rest /= t.batchDims[a];
      srcBase += coord * t.batchSrcStrides[a];
      dstBase += coord * t.batchDstStrides[a];
    }
    const int64_t row0 = rowTile * kTile;
    const int64_t col0 = colTile * kTile;
    // Read: neighbouring threads take neighbouring rows, which are neighbours in the source.
    for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
      const int64_t row = row0 + threadIdx.x;
      const int64_t col = col0 + k;
      if (row < t.rows && col < t.cols) {
        tile[k][threadIdx.x] = src[srcBase + row + col * t.srcColStride];
      }
    }
    __syncthreads();
    // Write: neighbouring threads take neighbouring cols, which are neighbours in the output.
    for (int k = threadIdx.y; k < kTile; k += blockDim.y) {
      const int64_t row = row0 + k;
      const int64_t col = col0 + threadIdx.x;
      if (row < t.rows && col < t.cols) {
        dst[dstBase + row * t.dstRowStride + col] = tile[threadIdx.x][k];
      }
    }
    __syncthreads();
  }
}

// The segment of a row that element `j` (0 <= j < starts[count]) falls in: the last k with
// starts[k] <= j, which skips empty segments.
__device__ __forceinline__ int findSegment(const int64_t* starts, int count, int64_t j) {
  int lo = 0, hi = count;  // starts[lo] <= j < starts[hi]
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    if (starts[mid] <= j) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

template <typename U>
__global__ void concatKernel(SegmentedCopy c, U* __restrict__ big, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = i / c.rowWidth;
    const int64_t j = i - o * c.rowWidth;
    const int k = findSegment(c.starts, c.count, j);
    const int64_t width = c.starts[k + 1] - c.starts[k];
    const U* part = static_cast<const U*>(c.parts[k]);
    big[i] = part[o * width + (j - c.starts[k])];
  }
}

template <typename U>
__global__ void splitKernel(SegmentedCopy c, const U* __restrict__ big, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = i / c.rowWidth;
    const int64_t j = i - o * c.rowWidth;
    const int k = findSegment(c.starts, c.count, j);
    const int64_t width = c.starts[k + 1] - c.starts[k];
    U* part = static_cast<U*>(c.parts[k]);
    part[o * width + (j - c.starts[k])] = big[i];
  }
}

template <typename U>
__global__ void axisTableKernel(AxisTableGather g, const U* __restrict__ src, U* __restrict__ dst,
                                int64_t total) {
  const U fill = g.fillDevice ? *static_cast<const U*>(g.fillDevice) : static_cast<U>(g.fill);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = i;
    int64_t source = 0;
    bool outside = false;
#pragma unroll
    for (int a = kMaxMoveRank - 1; a >= 0; --a) {
      if (a >= g.rank) continue;
      const int64_t coord = rest % g.dims[a];
      rest /= g.dims[a];
      const int64_t offset = g.tables[g.tableStart[a] + coord];
      outside = outside || offset < 0;
      source += offset;
    }
    dst[i] = outside ? fill : src[source];
  }
}

// I is the arithmetic's width: int32_t when every element and word count is below kNarrowLimit.
template <typename U, typename Index, typename I>
__global__ void gatherKernel(GatherGeometry g, const U* __restrict__ data,
                             const Index* __restrict__ indices, U* __restrict__ out, I total) {
  const I inner = static_cast<I>(g.inner);
  const I indexCount = static_cast<I>(g.indexCount);
  const I axisSize = static_cast<I>(g.axisSize);
  for (I i = static_cast<I>(blockIdx.x) * static_cast<I>(blockDim.x) + static_cast<I>(threadIdx.x);
       i < total; i += static_cast<I>(gridDim.x) * static_cast<I>(blockDim.x)) {
    const I r = i / inner;
    const I t = i - r * inner;
    const I o = r / indexCount;
    const I j = r - o * indexCount;
    const int64_t index = normalizedIndex(indices, j, g.axisSize);
    out[i] = index >= 0 ? data[(o * axisSize + static_cast<I>(index)) * inner + t] : U{};
  }
}

// The data offset that element e of indices names, or -1 when its index is out of range.
template <typename Index>
__device__ __forceinline__ int64_t elementTarget(const ElementIndexing& g, const Index* indices,
                                                 int64_t e) {
  int64_t rest = e;
  int64_t offset = 0;
#pragma unroll
  for (int a = kMaxMoveRank - 1; a >= 0; --a) {
    if (a >= g.rank) continue;
    const int64_t coord = rest % g.indexDims[a];
    rest /= g.indexDims[a];
    if (a != g.axis) offset += coord * g.dataStrides[a];
  }
  const int64_t index = normalizedIndex(indices, e, g.axisSize);
  return index < 0 ? -1 : offset + index * g.dataStrides[g.axis];
}

template <typename U, typename Index>
__global__ void gatherElementsKernel(ElementIndexing g, const U* __restrict__ data,
                                     const Index* __restrict__ indices, U* __restrict__ out,
                                     int64_t total) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t source = elementTarget(g, indices, e);
    out[e] = source >= 0 ? data[source] : U{0};
  }
}

template <typename U, typename Index>
__global__ void scatterElementsKernel(ElementIndexing g, const Index* __restrict__ indices,
                                      const U* __restrict__ updates, U* __restrict__ out,
                                      int64_t total) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < total;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t target = elementTarget(g, indices, e);
    if (target >= 0) out[target] = updates[e];
  }
}

// The first data element of row `row`'s slice, or -1 when one of its indices is out of range.
template <typename Index>
__device__ __forceinline__ int64_t sliceStart(const NdIndexing& g, const Index* indices,
                                              int64_t row) {
  int64_t start = (row / g.rowsPerBatch) * g.batchBlock;
  for (int j = 0; j < g.k; ++j) {
    const int64_t index = normalizedIndex(indices, row * g.k + j, g.dims[j]);
    if (index < 0) return -1;
    start += index * g.strides[j];
  }
  return start;
}

template <typename U, typename Index>
__global__ void gatherNdKernel(NdIndexing g, const U* __restrict__ data,
                               const Index* __restrict__ indices, U* __restrict__ out,
                               int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / g.sliceSize;
    const int64_t t = i - row * g.sliceSize;
    const int64_t start = sliceStart(g, indices, row);
    out[i] = start >= 0 ? data[start + t] : U{0};
  }
}

template <typename U, typename Index>
__global__ void scatterNdKernel(NdIndexing g, const Index* __restrict__ indices,
                                const U* __restrict__ updates, U* __restrict__ out, int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = i / g.sliceSize;
    const int64_t t = i - row * g.sliceSize;
    const int64_t start = sliceStart(g, indices, row);
    if (start >= 0) out[start + t] = updates[i];
  }
}

// --- Scatter with a reduction ---------------------------------------------------------------

using device::BoolByte;
using device::byElementType;
using device::Tag;

// The reference's combine (indexing_scatter.cc): `update` reduced into `current`.
template <typename T>
__device__ __forceinline__ T combine(ScatterReduction reduction, T current, T update) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(combine(reduction, __half2float(current), __half2float(update)));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(
        combine(reduction, __bfloat162float(current), __bfloat162float(update)));
  } else if constexpr (std::is_same_v<T, BoolByte>) {
    const bool a = current.bits != 0;
    const bool b = update.bits != 0;
    const bool additive =
        reduction == ScatterReduction::kAdd || reduction == ScatterReduction::kMax;
    return BoolByte{static_cast<uint8_t>(additive ? (a || b) : (a && b))};
  } else if constexpr (std::is_integral_v<T>) {
    const auto a = static_cast<uint64_t>(current);
    const auto b = static_cast<uint64_t>(update);
    switch (reduction) {
      case ScatterReduction::kAdd:
        return static_cast<T>(a + b);
      case ScatterReduction::kMul:
        return static_cast<T>(a * b);
      case ScatterReduction::kMax:
        return current < update ? update : current;
      case ScatterReduction::kMin:
        return update < current ? update : current;
    }
    return update;
  } else {
    switch (reduction) {
      case ScatterReduction::kAdd:
        return current + update;
      case ScatterReduction::kMul:
        return current * update;
      case ScatterReduction::kMax:
      case ScatterReduction::kMin:
        if (isnan(current) || isnan(update)) return std::numeric_limits<T>::quiet_NaN();
        if (reduction == ScatterReduction::kMax) return current < update ? update : current;
        return update < current ? update : current;
    }
    return update;
  }
}

// A thread per position of indices off the axis (`columns` of them, `inner` after the axis),
// walking the axis in order.
template <typename T, typename Index>
__global__ void scatterElementsReduceKernel(ElementIndexing g, ScatterReduction reduction,
                                            const Index* __restrict__ indices,
                                            const T* __restrict__ updates, T* __restrict__ out,
                                            int64_t columns, int64_t inner) {
  const int64_t along = g.indexDims[g.axis];
  for (int64_t q = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; q < columns;
       q += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t o = q / inner;
    const int64_t t = q - o * inner;
    for (int64_t j = 0; j < along; ++j) {
      const int64_t e = (o * along + j) * inner + t;
      const int64_t target = elementTarget(g, indices, e);
      if (target >= 0) out[target] = combine(reduction, out[target], updates[e]);
    }
  }
}

// A thread per slice element, walking the rows in order.
template <typename T, typename Index>
__global__ void scatterNdReduceKernel(NdIndexing g, ScatterReduction reduction,
                                      const Index* __restrict__ indices,
                                      const T* __restrict__ updates, T* __restrict__ out) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < g.sliceSize;
       t += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    for (int64_t row = 0; row < g.rows; ++row) {
      const int64_t start = sliceStart(g, indices, row);
      if (start < 0) continue;
      out[start + t] = combine(reduction, out[start + t], updates[row * g.sliceSize + t]);
    }
  }
}

template <typename U>
__global__ void triluKernel(const U* __restrict__ x, U* __restrict__ y, int64_t total, int64_t rows,
                            int64_t cols, bool upper, int64_t k,
                            const int64_t* __restrict__ kDevice) {
  const int64_t diagonal = kDevice ? *kDevice : k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t col = i % cols;
    const int64_t row = (i / cols) % rows;
    const int64_t offset = col - row;
    const bool keep = upper ? offset >= diagonal : offset <= diagonal;
    y[i] = keep ? x[i] : U{0};
  }
}

template <typename T>
__global__ void resizeInterpolateKernel(ResizeTables r, const T* __restrict__ x, T* __restrict__ y,
                                        int64_t total) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t base[kMaxMoveRank] = {};
    int64_t rest = i;
    bool outside = false;
    for (int a = r.rank - 1; a >= 0; --a) {
      const int64_t coord = rest % r.dims[a];
      rest /= r.dims[a];
      base[a] = r.tableStart[a] + coord * r.taps[a];
      outside = outside || r.offsets[base[a]] < 0;
    }
    if (outside) {
      y[i] = device::fromFloat<T>(r.extrapolation);
      continue;
    }
    int64_t tap[kMaxMoveRank] = {};
    float sum = 0.0f;
    while (true) {
      float weight = 1.0f;
      int64_t source = 0;
      for (int a = 0; a < r.rank; ++a) {
        weight *= r.weights[base[a] + tap[a]];
        source += r.offsets[base[a] + tap[a]];
      }
      sum += weight * device::load(x[source]);
      int a = r.rank - 1;
      for (; a >= 0; --a) {
        if (++tap[a] < r.taps[a]) break;
        tap[a] = 0;
      }
      if (a < 0) break;
    }
    y[i] = device::fromFloat<T>(sum);
  }
}

// ResizeTables::twoAxesLinear: output element (o, h, w, c) of [outer, H, W, inner] sums the four
// taps (h0, w0), (h0, w1), (h1, w0), (h1, w1) with weight wh * ww, as the general kernel does.
template <typename T>
__global__ void resizeTwoAxesKernel(ResizeTables r, const T* __restrict__ x, T* __restrict__ y,
                                    unsigned total) {
  const unsigned height = static_cast<unsigned>(r.dims[r.axis]);
  const unsigned width = static_cast<unsigned>(r.dims[r.axis + 1]);
  const unsigned inner = static_cast<unsigned>(r.inner);
  const unsigned plane = static_cast<unsigned>(r.inputPlane);
  const int64_t* rowOffsets = r.offsets + r.tableStart[r.axis];
  const float* rowWeights = r.weights + r.tableStart[r.axis];
  const int64_t* columnOffsets = r.offsets + r.tableStart[r.axis + 1];
  const float* columnWeights = r.weights + r.tableStart[r.axis + 1];
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    unsigned rest = i;
    const unsigned c = rest % inner;
    rest /= inner;
    const unsigned w = rest % width;
    rest /= width;
    const unsigned h = rest % height;
    const unsigned base = rest / height * plane + c;
    float sum = 0.0f;
#pragma unroll
    for (int th = 0; th < 2; ++th) {
      const unsigned row = base + static_cast<unsigned>(rowOffsets[2 * h + th]);
      const float rowWeight = rowWeights[2 * h + th];
#pragma unroll
      for (int tw = 0; tw < 2; ++tw) {
        const float weight = rowWeight * columnWeights[2 * w + tw];
        sum += weight * device::load(x[row + static_cast<unsigned>(columnOffsets[2 * w + tw])]);
      }
    }
    y[i] = device::fromFloat<T>(sum);
  }
}

bool validRank(int rank) { return rank >= 0 && rank <= kMaxMoveRank; }

int64_t productOf(const int64_t* dims, int rank) {
  int64_t total = 1;
  for (int a = 0; a < rank; ++a) total *= dims[a];
  return total;
}

}  // namespace

cudaError_t launchStridedGather(const StridedGather& gather, const void* src, void* dst,
                                int elementSize, cudaStream_t stream) {
  if (!validRank(gather.rank) || !validBlock(gather.blockThreads)) return cudaErrorInvalidValue;
  const int64_t total = productOf(gather.dims, gather.rank);
  if (total <= 0) return cudaSuccess;
  const bool narrow = total < kNarrowLimit && gather.srcElements < kNarrowLimit;
  return bySize(elementSize, [&](auto tag) {
    using U = decltype(tag);
    if (narrow) {
      stridedGatherKernel<U, int32_t>
          <<<blocksFor(total, gather.blockThreads), gather.blockThreads, 0, stream>>>(
              gather, static_cast<const U*>(src), static_cast<U*>(dst),
              static_cast<int32_t>(total));
    } else {
      stridedGatherKernel<U, int64_t>
          <<<blocksFor(total, gather.blockThreads), gather.blockThreads, 0, stream>>>(
              gather, static_cast<const U*>(src), static_cast<U*>(dst), total);
    }
    return cudaGetLastError();
  });
}

cudaError_t launchTiledTranspose(const TiledTranspose& transpose, const void* src, void* dst,
                                 int elementSize, cudaStream_t stream) {
  if (!validRank(transpose.batchRank) || transpose.threadRows < 1 || transpose.threadRows > kTile ||
      kTile % transpose.threadRows != 0) {
    return cudaErrorInvalidValue;
  }
  const int64_t batch = productOf(transpose.batchDims, transpose.batchRank);
  if (batch <= 0 || transpose.rows <= 0 || transpose.cols <= 0) return cudaSuccess;
  const int64_t rowTiles = (transpose.rows + kTile - 1) / kTile;
  const int64_t colTiles = (transpose.cols + kTile - 1) / kTile;
  const int64_t tileCount = batch * rowTiles * colTiles;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(tileCount, kMaxBlocks));
  return bySize(elementSize, [&](auto tag) {
    using U = decltype(tag);
    tiledTransposeKernel<U><<<blocks, dim3(kTile, transpose.threadRows), 0, stream>>>(
        transpose, static_cast<const U*>(src), static_cast<U*>(dst), rowTiles, colTiles, tileCount);
    return cudaGetLastError();
  });
}

cudaError_t launchConcat(const SegmentedCopy& copy, void* big, int elementSize,
                         cudaStream_t stream) {
  const int64_t total = copy.outer * copy.rowWidth;
  if (total <= 0) return cudaSuccess;
  if (copy.count <= 0 || !copy.starts || !copy.parts || !validBlock(copy.blockThreads)) {
    return cudaErrorInvalidValue;
  }
  return bySize(elementSize, [&](auto tag) {
    using U = decltype(tag);
    concatKernel<U><<<blocksFor(total, copy.blockThreads), copy.blockThreads, 0, stream>>>(
        copy, static_cast<U*>(big), total);
    return cudaGetLastError();
  });
}

cudaError_t launchSplit(const SegmentedCopy& copy, const void* big, int elementSize,
                        cudaStream_t stream) {
  const int64_t total = copy.outer * copy.rowWidth;
  if (total <= 0) return cudaSuccess;
  if (copy.count <= 0 || !copy.starts || !copy.parts || !validBlock(copy.blockThreads)) {
    return cudaErrorInvalidValue;
  }
  return bySize(elementSize, [&](auto tag) {
    using U = decltype(tag);
    splitKernel<U><<<blocksFor(total, copy.blockThreads), copy.blockThreads, 0, stream>>>(
        copy, static_cast<const U*>(big), total);
    return cudaGetLastError();
  });
}

cudaError_t launchAxisTableGather(const AxisTableGather& gather, const void* src, void* dst,
                                  int elementSize, cudaStream_t stream) {
  if (!validBlock(gather.blockThreads)) return cudaErrorInvalidValue;
  if (!validRank(gather.rank)) return cudaErrorInvalidValue;
  const int64_t total = productOf(gather.dims, gather.rank);
  if (total <= 0) return cudaSuccess;
  if (gather.rank > 0 && !gather.tables) return cudaErrorInvalidValue;
  return bySize(elementSize, [&](auto tag) {
    using U = decltype(tag);
    axisTableKernel<U><<<blocksFor(total, gather.blockThreads), gather.blockThreads, 0, stream>>>(
        gather, static_cast<const U*>(src), static_cast<U*>(dst), total);
    return cudaGetLastError();
  });
}

int gatherWordBytes(const GatherGeometry& geometry, int elementSize, const void* data,
                    const void* out) {
  if (!geometry.words) return elementSize;
  const auto rowBytes = static_cast<uint64_t>(geometry.inner) * static_cast<uint64_t>(elementSize);
  const uint64_t alignment = reinterpret_cast<uintptr_t>(data) | reinterpret_cast<uintptr_t>(out);
  for (int word : {16, 8, 4}) {
    if (word <= elementSize) break;
    if (rowBytes % word == 0 && alignment % word == 0) return word;
  }
  return elementSize;
}

cudaError_t launchGather(const GatherGeometry& geometry, const void* data, const void* indices,
                         bool indices64, void* out, int elementSize, cudaStream_t stream) {
  if (!validBlock(geometry.blockThreads)) return cudaErrorInvalidValue;
  if (geometry.outer * geometry.indexCount * geometry.inner <= 0) return cudaSuccess;
  const int word = gatherWordBytes(geometry, elementSize, data, out);
  GatherGeometry g = geometry;
  g.inner = geometry.inner * elementSize / word;
  const int64_t total = g.outer * g.indexCount * g.inner;
  const bool narrow = total < kNarrowLimit && g.outer * g.axisSize * g.inner < kNarrowLimit;
  auto launch = [&](auto tag) {
    using U = decltype(tag);
    return byIndexType(indices64, [&](auto indexTag) {
      using Index = decltype(indexTag);
      const unsigned blocks = blocksFor(total, g.blockThreads);
      if (narrow) {
        gatherKernel<U, Index, int32_t><<<blocks, g.blockThreads, 0, stream>>>(
            g, static_cast<const U*>(data), static_cast<const Index*>(indices),
            static_cast<U*>(out), static_cast<int32_t>(total));
      } else {
        gatherKernel<U, Index, int64_t><<<blocks, g.blockThreads, 0, stream>>>(
            g, static_cast<const U*>(data), static_cast<const Index*>(indices),
            static_cast<U*>(out), total);
      }
      return cudaGetLastError();
    });
  };
  if (word == 16) return launch(uint4{});
  return bySize(word, launch);
}

cudaError_t launchGatherElements(const ElementIndexing& indexing, const void* data,
                                 const void* indices, bool indices64, void* out, int elementSize,
                                 cudaStream_t stream) {
  if (!validBlock(indexing.blockThreads)) return cudaErrorInvalidValue;
  if (!validRank(indexing.rank) || indexing.axis < 0 || indexing.axis >= indexing.rank) {
    return cudaErrorInvalidValue;
  }
  const int64_t total = productOf(indexing.indexDims, indexing.rank);
  if (total <= 0) return cudaSuccess;
  return bySize(elementSize, [&](auto tag) {
    using U = decltype(tag);
    return byIndexType(indices64, [&](auto indexTag) {
      using Index = decltype(indexTag);
      gatherElementsKernel<U, Index>
          <<<blocksFor(total, indexing.blockThreads), indexing.blockThreads, 0, stream>>>(
              indexing, static_cast<const U*>(data), static_cast<const Index*>(indices),
              static_cast<U*>(out), total);
      return cudaGetLastError();
    });
  });
}

cudaError_t launchScatterElements(const ElementIndexing& indexing, const void* indices,
                                  bool indices64, const void* updates, void* out, int elementSize,
                                  cudaStream_t stream) {
  if (!validBlock(indexing.blockThreads)) return cudaErrorInvalidValue;
  if (!validRank(indexing.rank) || indexing.axis < 0 || indexing.axis >= indexing.rank) {
    return cudaErrorInvalidValue;
  }
  const int64_t total = productOf(indexing.indexDims, indexing.rank);
  if (total <= 0) return cudaSuccess;
  return bySize(elementSize, [&](auto tag) {
    using U = decltype(tag);
    return byIndexType(indices64, [&](auto indexTag) {
      using Index = decltype(indexTag);
      scatterElementsKernel<U, Index>
          <<<blocksFor(total, indexing.blockThreads), indexing.blockThreads, 0, stream>>>(
              indexing, static_cast<const Index*>(indices), static_cast<const U*>(updates),
              static_cast<U*>(out), total);
      return cudaGetLastError();
    });
  });
}

cudaError_t launchGatherND(const NdIndexing& indexing, const void* data, const void* indices,
                           bool indices64, void* out, int elementSize, cudaStream_t stream) {
  if (!validBlock(indexing.blockThreads)) return cudaErrorInvalidValue;
  const int64_t total = indexing.rows * indexing.sliceSize;
  if (total <= 0) return cudaSuccess;
  if (indexing.k < 1 || indexing.k > kMaxMoveRank || indexing.rowsPerBatch <= 0) {
    return cudaErrorInvalidValue;
  }
  return bySize(elementSize, [&](auto tag) {
    using U = decltype(tag);
    return byIndexType(indices64, [&](auto indexTag) {
      using Index = decltype(indexTag);
      gatherNdKernel<U, Index>
          <<<blocksFor(total, indexing.blockThreads), indexing.blockThreads, 0, stream>>>(
              indexing, static_cast<const U*>(data), static_cast<const Index*>(indices),
              static_cast<U*>(out), total);
      return cudaGetLastError();
    });
  });
}

cudaError_t launchScatterND(const NdIndexing& indexing, const void* indices, bool indices64,
                            const void* updates, void* out, int elementSize, cudaStream_t stream) {
  if (!validBlock(indexing.blockThreads)) return cudaErrorInvalidValue;
  const int64_t total = indexing.rows * indexing.sliceSize;
  if (total <= 0) return cudaSuccess;
  if (indexing.k < 1 || indexing.k > kMaxMoveRank || indexing.rowsPerBatch <= 0) {
    return cudaErrorInvalidValue;
  }
  return bySize(elementSize, [&](auto tag) {
    using U = decltype(tag);
    return byIndexType(indices64, [&](auto indexTag) {
      using Index = decltype(indexTag);
      scatterNdKernel<U, Index>
          <<<blocksFor(total, indexing.blockThreads), indexing.blockThreads, 0, stream>>>(
              indexing, static_cast<const Index*>(indices), static_cast<const U*>(updates),
              static_cast<U*>(out), total);
      return cudaGetLastError();
    });
  });
}

cudaError_t launchScatterElementsReduce(const ElementIndexing& indexing, ScatterReduction reduction,
                                        ElementType type, const void* indices, bool indices64,
                                        const void* updates, void* out, cudaStream_t stream) {
  if (!validBlock(indexing.blockThreads)) return cudaErrorInvalidValue;
  if (!validRank(indexing.rank) || indexing.axis < 0 || indexing.axis >= indexing.rank) {
    return cudaErrorInvalidValue;
  }
  const int64_t total = productOf(indexing.indexDims, indexing.rank);
  if (total <= 0) return cudaSuccess;
  const int64_t along = indexing.indexDims[indexing.axis];
  const int64_t columns = total / along;
  const int64_t inner =
      productOf(indexing.indexDims + indexing.axis + 1, indexing.rank - indexing.axis - 1);
  return byElementType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return byIndexType(indices64, [&](auto indexTag) {
      using Index = decltype(indexTag);
      scatterElementsReduceKernel<T, Index>
          <<<blocksFor(columns, indexing.blockThreads), indexing.blockThreads, 0, stream>>>(
              indexing, reduction, static_cast<const Index*>(indices),
              static_cast<const T*>(updates), static_cast<T*>(out), columns, inner);
      return cudaGetLastError();
    });
  });
}

cudaError_t launchScatterNDReduce(const NdIndexing& indexing, ScatterReduction reduction,
                                  ElementType type, const void* indices, bool indices64,
                                  const void* updates, void* out, cudaStream_t stream) {
  if (!validBlock(indexing.blockThreads)) return cudaErrorInvalidValue;
  if (indexing.rows * indexing.sliceSize <= 0) return cudaSuccess;
  if (indexing.k < 1 || indexing.k > kMaxMoveRank || indexing.rowsPerBatch <= 0) {
    return cudaErrorInvalidValue;
  }
  return byElementType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return byIndexType(indices64, [&](auto indexTag) {
      using Index = decltype(indexTag);
      scatterNdReduceKernel<T, Index>
          <<<blocksFor(indexing.sliceSize, indexing.blockThreads), indexing.blockThreads, 0,
             stream>>>(indexing, reduction, static_cast<const Index*>(indices),
                       static_cast<const T*>(updates), static_cast<T*>(out));
      return cudaGetLastError();
    });
  });
}

cudaError_t launchTrilu(const void* x, void* y, int64_t count, int64_t rows, int64_t cols,
                        bool upper, int64_t k, const int64_t* kDevice, int elementSize,
                        int blockThreads, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (rows <= 0 || cols <= 0 || !validBlock(blockThreads)) return cudaErrorInvalidValue;
  return bySize(elementSize, [&](auto tag) {
    using U = decltype(tag);
    triluKernel<U><<<blocksFor(count, blockThreads), blockThreads, 0, stream>>>(
        static_cast<const U*>(x), static_cast<U*>(y), count, rows, cols, upper, k, kDevice);
    return cudaGetLastError();
  });
}

cudaError_t launchResizeInterpolate(const ResizeTables& tables, ElementType type, const void* x,
                                    void* y, cudaStream_t stream) {
  if (!validRank(tables.rank) || !validBlock(tables.blockThreads)) return cudaErrorInvalidValue;
  const int64_t total = productOf(tables.dims, tables.rank);
  if (total <= 0) return cudaSuccess;
  if (tables.rank == 0 || !tables.offsets || !tables.weights) return cudaErrorInvalidValue;
  return device::byFloatType(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (tables.twoAxesLinear) {
      resizeTwoAxesKernel<T>
          <<<blocksFor(total, tables.blockThreads), tables.blockThreads, 0, stream>>>(
              tables, static_cast<const T*>(x), static_cast<T*>(y), static_cast<unsigned>(total));
    } else {
      resizeInterpolateKernel<T>
          <<<blocksFor(total, tables.blockThreads), tables.blockThreads, 0, stream>>>(
              tables, static_cast<const T*>(x), static_cast<T*>(y), total);
    }
    return cudaGetLastError();
  });
}

}  // namespace kiln::cuda
