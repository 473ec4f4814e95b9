// kiln's pooling kernels on the GPU (pool.cu): windowed max (with MaxPool's Indices) and average
// pooling over 1-D to 3-D spatial axes of any layout the element strides describe (NCHW and
// NHWC), and the global pools.
// x and y are float32, float16 or bfloat16 (both the same); sums and comparisons are in float,
// and a reduced-type result is rounded once.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kiln/backends/cuda/kernels/eltwise.h"  // ElementType

namespace kiln::cuda {

enum class PoolKind : int {
  kMax,                // padding never wins; a window wholly in padding gives -inf
  kAverage,            // divided by the taps inside the input
  kAverageIncludePad,  // divided by the taps inside the padded input (count_include_pad=1)
};

// A pool's extents with the spatial axes right-aligned into (depth, height, width), as
// ConvGeometry: missing leading axes have extent, kernel and stride 1 and no padding. Strides
// are in elements, per logical axis.
struct PoolGeometry {
  int64_t batch = 0;
  int64_t channels = 0;
  int64_t in[3] = {1, 1, 1};
  int64_t out[3] = {1, 1, 1};
  int64_t kernel[3] = {1, 1, 1};
  int64_t stride[3] = {1, 1, 1};
  int64_t dilation[3] = {1, 1, 1};
  int64_t padBegin[3] = {0, 0, 0};
  int64_t padEnd[3] = {0, 0, 0};  // bounds the padded input of kAverageIncludePad
  int64_t xStrides[5] = {};       // x over (n, c, d, h, w)
  int64_t yStrides[5] = {};       // y over (n, c, d, h, w)
  bool channelsLast = false;      // threads walk the output channel-fastest (NHWC)
};

// Whether the kernels below take elements of `type` (float32, float16, bfloat16; the windowed
// kernel's max also takes int8 and uint8).
bool poolSupported(ElementType type);

// One thread per output element. With `indices` (kMax only: int64, laid out as y) each output
// also gets the index MaxPool's Indices output gives the element it took: (n * channels + c) *
// the spatial size, plus the element's spatial offset, row-major over (d, h, w), or column-major
// with `columnMajor` (storage_order=1); -1 for a window wholly in padding.
// `blockThreads` (a power of two, 32 to 512) a block, for this and launchGlobalPool.
// With `vectorWidth` (what windowPoolVectorWidth gave, else 0) an NHWC 2-D pool takes a thread
// per that many channels of an output pixel instead: 16-byte loads and stores and 32-bit index
// arithmetic, the same taps in the same order per channel, so the same bits.
cudaError_t launchWindowPool(const PoolGeometry& geometry, PoolKind kind, ElementType type,
                             const void* x, void* y, int64_t* indices, bool columnMajor,
                             int blockThreads, cudaStream_t stream, int vectorWidth = 0);

// The channels a thread of the vectorised windowed kernel takes (16 bytes of them: 8 float16 or
// bfloat16, 4 float32) where the pool is NHWC and 2-D, without indices, its channels and pixel
// strides multiples of that and its sizes within 32-bit indices; 0 where it does not apply.
int windowPoolVectorWidth(const PoolGeometry& geometry, ElementType type, bool indices);

// y[n * channels + c] = mean or max of the `size` spatial elements of plane (n, c): contiguous
// planes (NCHW: a block a plane), or with channelsLast (a thread an output) the elements `channels`
// apart ([N, ..., C]). NaN elements never win the max (a plane of NaN gives -inf, as the
// reference); an empty plane gives NaN for the mean and -inf for the max.
cudaError_t launchGlobalPool(bool average, ElementType type, const void* x, void* y, int64_t batch,
                             int64_t channels, int64_t size, bool channelsLast, int blockThreads,
                             cudaStream_t stream);

}  // namespace kiln::cuda
