// kiln's data-movement kernels on the GPU (datamove.cu): strided and tiled gathers (Transpose,
// Slice, Expand, DepthToSpace, SpaceToDepth), segmented copies (Concat, Split), per-axis offset
// tables (Pad, Tile, nearest Resize), index-driven gathers and scatters (Gather, GatherElements,
// GatherND, ScatterND, ScatterElements), Trilu, and the interpolating Resize. Every kernel but the
// interpolating Resize moves elements as 1, 2, 4 or 8 raw bytes, so one kernel serves every dtype
// and values stay bit-exact.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kiln/backends/cuda/kernels/eltwise.h"  // ElementType

namespace kiln::cuda {

// The most axes a data-movement kernel takes by value (after merging, see the steps).
constexpr int kMaxMoveRank = 8;

// dst (contiguous, row-major over `dims`) [i] = src[srcOffset + sum_a coord_a(i) * srcStrides[a]].
// Strides are in elements and may be 0 (broadcast) or negative (reversed slices); every partial
// sum of the offset must stay within [0, srcElements).
struct StridedGather {
  int rank = 0;
  int64_t dims[kMaxMoveRank] = {};
  int64_t srcStrides[kMaxMoveRank] = {};
  int64_t srcOffset = 0;
  int64_t srcElements = 0;  // the source's element count: chooses 32- or 64-bit index math
  int blockThreads = 256;   // threads a block (a multiple of 32 up to 1024)
};
cudaError_t launchStridedGather(const StridedGather& gather, const void* src, void* dst,
                                int elementSize, cudaStream_t stream);

// A transpose whose destination-contiguous axis is not source-contiguous, through 32x32 tiles in
// shared memory so that both the reads and the writes are coalesced. The output is seen as
// (batch..., rows, ..., cols): `rows` is the output axis the source walks contiguously (stride 1
// in the source), `cols` the output's last axis (stride 1 in the output); the other output axes
// are the batch axes, each with its source and destination stride.
struct TiledTranspose {
  int batchRank = 0;
  int64_t batchDims[kMaxMoveRank] = {};
  int64_t batchSrcStrides[kMaxMoveRank] = {};
  int64_t batchDstStrides[kMaxMoveRank] = {};
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t srcColStride = 0;  // source elements between neighbouring cols (rows are 1 apart)
  int64_t dstRowStride = 0;  // output elements between neighbouring rows (cols are 1 apart)
  int64_t srcOffset = 0;
  int threadRows = 8;  // thread rows a 32x32 tile (1, 2, 4, 8, 16 or 32): a 32 x threadRows block
};
cudaError_t launchTiledTranspose(const TiledTranspose& transpose, const void* src, void* dst,
                                 int elementSize, cudaStream_t stream);

// Concat and Split: the big tensor is `outer` rows of `rowWidth` elements, and each row is the
// parts' rows side by side; part k is `outer` rows of starts[k + 1] - starts[k] elements.
// `starts` (count + 1 entries, starts[0] = 0, starts[count] = rowWidth) and `parts` (count
// pointers) are in device memory.
struct SegmentedCopy {
  int64_t outer = 0;
  int64_t rowWidth = 0;
  int count = 0;
  const int64_t* starts = nullptr;
  void* const* parts = nullptr;
  int blockThreads = 256;  // threads a block (a multiple of 32 up to 1024)
};
// Concat: the parts are the sources, `big` the destination.
cudaError_t launchConcat(const SegmentedCopy& copy, void* big, int elementSize,
                         cudaStream_t stream);
// Split: `big` is the source, the parts the destinations.
cudaError_t launchSplit(const SegmentedCopy& copy, const void* big, int elementSize,
                        cudaStream_t stream);

// dst (contiguous over `dims`) [i] = src[sum_a tables[tableStart[a] + coord_a(i)]], or the fill
// element where any of those table entries is negative. The tables (device memory) hold, per
// output axis, each coordinate's source offset in elements. The fill is read from `fillDevice`
// (one element in device memory, a runtime value) when that is set, else it is `fill`.
struct AxisTableGather {
  int rank = 0;
  int64_t dims[kMaxMoveRank] = {};
  int64_t tableStart[kMaxMoveRank] = {};
  const int64_t* tables = nullptr;
  uint64_t fill = 0;  // the fill element's bytes, in the low `elementSize` bytes
  const void* fillDevice = nullptr;
  int blockThreads = 256;  // threads a block (a multiple of 32 up to 1024)
};
cudaError_t launchAxisTableGather(const AxisTableGather& gather, const void* src, void* dst,
                                  int elementSize, cudaStream_t stream);

// Gather: data seen as [outer, axisSize, inner], indices as `indexCount` values (int32 or int64,
// negative ones counting from the back), out as [outer, indexCount, inner]. An index outside
// [-axisSize, axisSize) makes its output elements zero (all-zero bytes) rather than read out of
// bounds; the steps refuse constant indices that are out of range, so only runtime indices can
// do this.
struct GatherGeometry {
  int64_t outer = 0;
  int64_t axisSize = 0;
  int64_t indexCount = 0;
  int64_t inner = 0;
  int blockThreads = 256;  // threads a block (a multiple of 32 up to 1024)
  // Move each run of `inner` elements as the widest words (4, 8 or 16 bytes) that divide its
  // bytes and the two buffers' alignment, a thread a word; otherwise (or when false) a thread an
  // element. The same bytes either way.
  bool words = true;
};
cudaError_t launchGather(const GatherGeometry& geometry, const void* data, const void* indices,
                         bool indices64, void* out, int elementSize, cudaStream_t stream);
// The word launchGather moves for this geometry: elementSize when it moves elements, else 4, 8 or
// 16. Null pointers count as aligned (what the steps say at build time, where the arena aligns
// every buffer to 256 bytes; a view's offset can lower it at run time).
int gatherWordBytes(const GatherGeometry& geometry, int elementSize, const void* data = nullptr,
                    const void* out = nullptr);

// GatherElements and ScatterElements: `indices` has the rank of data; element e of indices (with
// coordinates c) names the data element at c with c[axis] replaced by its value.
struct ElementIndexing {
  int rank = 0;
  int axis = 0;
  int64_t indexDims[kMaxMoveRank] = {};
  int64_t dataStrides[kMaxMoveRank] = {};
  int64_t axisSize = 0;    // data's extent along axis
  int blockThreads = 256;  // threads a block (a multiple of 32 up to 1024)
};
// out (indices' shape) [e] = data[...]; out-of-range indices give zero elements.
cudaError_t launchGatherElements(const ElementIndexing& indexing, const void* data,
                                 const void* indices, bool indices64, void* out, int elementSize,
                                 cudaStream_t stream);
// out (data's shape, already holding data) [...] = updates[e]; out-of-range indices are skipped.
// With duplicate indices the winner is unspecified (ONNX leaves reduction 'none' with duplicates
// undefined).
cudaError_t launchScatterElements(const ElementIndexing& indexing, const void* indices,
                                  bool indices64, const void* updates, void* out, int elementSize,
                                  cudaStream_t stream);

// GatherND and ScatterND: each row of `k` indices picks a slice of `sliceSize` contiguous data
// elements; dims/strides are data's along the k indexed axes. For GatherND, rows come in batches
// of `rowsPerBatch`, each indexing its own block of `batchBlock` data elements (batch_dims).
struct NdIndexing {
  int64_t rows = 0;
  int k = 0;
  int64_t sliceSize = 0;
  int64_t rowsPerBatch = 1;
  int64_t batchBlock = 0;
  int64_t dims[kMaxMoveRank] = {};
  int64_t strides[kMaxMoveRank] = {};
  int blockThreads = 256;  // threads a block (a multiple of 32 up to 1024)
};
// out [row * sliceSize + t] = data[slice(row) + t]; rows with an out-of-range index give zeros.
cudaError_t launchGatherND(const NdIndexing& indexing, const void* data, const void* indices,
                           bool indices64, void* out, int elementSize, cudaStream_t stream);
// out (already holding data) [slice(row) + t] = updates[row * sliceSize + t]; rows with an
// out-of-range index are skipped; duplicates: the winner is unspecified.
cudaError_t launchScatterND(const NdIndexing& indexing, const void* indices, bool indices64,
                            const void* updates, void* out, int elementSize, cudaStream_t stream);

// ScatterElements and ScatterND with a reduction, as the reference applies it: each update
// combines into its target in index order (duplicates included), floating add and mul in the
// element type (float16 and bfloat16 through float, rounded at each update), integers wrapping,
// bool adding as 'or' and multiplying as 'and', NaN winning max and min. Updates that may share a
// target are applied in order by one thread: for ScatterElements a thread per position of
// indices off the axis (it walks the axis), for ScatterND a thread per slice element (it walks
// the rows). `out` already holds data; out-of-range indices are skipped.
enum class ScatterReduction : int { kAdd, kMul, kMax, kMin };
cudaError_t launchScatterElementsReduce(const ElementIndexing& indexing, ScatterReduction reduction,
                                        ElementType type, const void* indices, bool indices64,
                                        const void* updates, void* out, cudaStream_t stream);
cudaError_t launchScatterNDReduce(const NdIndexing& indexing, ScatterReduction reduction,
                                  ElementType type, const void* indices, bool indices64,
                                  const void* updates, void* out, cudaStream_t stream);

// Trilu over `count` elements whose last two axes are rows x cols: keeps element (r, c) where
// c - r >= k (upper) or c - r <= k (lower), else zero bytes. k is *kDevice when kDevice is not
// null (a runtime input), else `k`.
cudaError_t launchTrilu(const void* x, void* y, int64_t count, int64_t rows, int64_t cols,
                        bool upper, int64_t k, const int64_t* kDevice, int elementSize,
                        int blockThreads, cudaStream_t stream);

// Interpolating Resize (linear, cubic, antialiased): per output axis a, each coordinate has
// taps[a] (source offset, weight) pairs at tables[tableStart[a] + coord * taps[a] + t]; an output
// element sums weight products times source values over the taps' tensor product (the last
// axis's taps fastest, weights multiplied in axis order, as the reference does). A negative first
// offset marks a coordinate outside the crop (tf_crop_and_resize): the element is
// `extrapolation`. float32, float16 or bfloat16 data; the sums are float32.
struct ResizeTables {
  int rank = 0;
  int64_t dims[kMaxMoveRank] = {};
  int64_t taps[kMaxMoveRank] = {};
  int64_t tableStart[kMaxMoveRank] = {};
  const int64_t* offsets = nullptr;  // device memory
  const float* weights = nullptr;    // device memory, beside offsets
  float extrapolation = 0.0f;
  // Set where two neighbouring axes (axis, axis + 1) take two taps at every coordinate, every
  // other axis copies its input (one tap, weight 1, the same coordinate), no coordinate is
  // outside and every index fits 31 bits (bilinear upsampling of NCHW or NHWC images): a kernel
  // then walks the output as [outer, H, W, inner] in 32-bit arithmetic, summing the same products
  // in the same order as the general one.
  bool twoAxesLinear = false;
  int axis = 0;
  int64_t inner = 1;       // output elements after axis + 1 (the input's too)
  int64_t inputPlane = 0;  // input elements a step of `outer` moves: inH * inW * inner
  int blockThreads = 256;  // threads a block (a multiple of 32 up to 1024)
};
cudaError_t launchResizeInterpolate(const ResizeTables& tables, ElementType type, const void* x,
                                    void* y, cudaStream_t stream);

}  // namespace kiln::cuda
