// kiln's normalisation kernels on the GPU (norm.cu): Softmax, LogSoftmax, Hardmax and
// LpNormalization along one axis, LayerNormalization and InstanceNormalization over rows,
// inference BatchNormalization, MeanVarianceNormalization over any set of axes, and LRN across
// channels. Elements are float32, float16 or bfloat16 (every data tensor of a launch the same:
// `type`); the kernels load them into float, accumulate in float (the row and slot statistics of
// the Layer/Instance/MeanVariance normalisations, and LRN, in double, as the reference) and round
// once on the way out.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kiln/backends/cuda/kernels/eltwise.h"  // ElementType

namespace kiln::cuda {

// A tensor seen as [outer, length, inner]: outer * inner lines of `length` elements, `inner`
// apart. inner == 1 makes the lines contiguous rows.
struct Lines {
  int64_t outer = 0;
  int64_t length = 0;
  int64_t inner = 1;
};

// How contiguous rows (inner == 1) are spread: one warp per row (four rows per block), suited to
// short rows, or one block per row, suited to long ones. Strided lines (inner > 1) always take
// one thread per line.
enum class RowKernel : int { kWarp, kBlock };

// A row kernel and its launch shape (cuda.softmax.* and cuda.norm.* choose them).
struct RowLaunch {
  RowKernel kernel = RowKernel::kWarp;
  int warpRows = 4;        // kWarp: rows (one warp each) a block, 1 to 8
  int blockThreads = 512;  // kBlock: threads of a row's block, a multiple of 32 up to 512
  // kWarp, LayerNormalization of float16 / bfloat16: hold a row of up to 1024 elements in
  // registers (16-byte vectors, one read) where it fits, instead of the generic row kernel.
  bool registerRows = true;
  // Softmax and LogSoftmax rows: the maximum and the sum from one read (online), not two.
  bool onlineSoftmax = false;
  // Lines along an axis that is not the innermost (a thread a line): threads a block, a multiple
  // of 32 up to 1024.
  int linesThreads = 256;
};

enum class SoftmaxKind : int {
  kSoftmax,     // exp(x - max) / sum
  kLogSoftmax,  // (x - max) - log(sum)
  kHardmax,     // 1 at the first maximum (the first NaN, if any), 0 elsewhere
};

// Whether the kernels below take elements of `type` (float32, float16, bfloat16).
bool normSupported(ElementType type);

// Normalises every line of x into y, max-subtracted for stability.
cudaError_t launchSoftmax(SoftmaxKind kind, const Lines& lines, const RowLaunch& rows,
                          ElementType type, const void* x, void* y, cudaStream_t stream);

// y = x / ||line||_p for p = 1 or 2, per line.
cudaError_t launchLpNormalization(int p, const Lines& lines, const RowLaunch& rows,
                                  ElementType type, const void* x, void* y, cudaStream_t stream);

// Rows of `width` contiguous elements, each normalised to zero mean and unit variance (biased,
// two-pass, in double), then scaled and shifted: y = (x - mean) / sqrt(var + epsilon) * scale +
// bias. With channels == 0 scale and bias have one value per element of a row (LayerNormalization);
// otherwise one per row, row r taking value r % channels (InstanceNormalization). x, scale, bias
// and y are of `type`; bias, mean and invStdDev (rows values each, of `statType`: float32 or
// `type`) may be null. With `skip` (of x's shape and `type`), the rows normalised are x + skip,
// rounded to `type` as an Add would, and written to `sum` when that is not null
// (kiln.AddLayerNormalization).
struct RowNormalization {
  int64_t rows = 0;
  int64_t width = 0;
  float epsilon = 1e-5f;
  int64_t channels = 0;
  ElementType type = ElementType::kFloat32;
  ElementType statType = ElementType::kFloat32;
};
cudaError_t launchRowNormalization(const RowNormalization& norm, const RowLaunch& rows,
                                   const void* x, const void* scale, const void* bias, void* y,
                                   void* mean, void* invStdDev, cudaStream_t stream,
                                   const void* skip = nullptr, void* sum = nullptr);

// Inference BatchNormalization over `count` elements: y = (x - mean) / sqrt(var + epsilon) *
// scale + bias, with parameter index (i / inner) % channels, or i % (channels * inner) when
// perElement (the pre-opset-9 spatial=0 form). Every tensor is of `type`.
struct BatchNormGeometry {
  int64_t count = 0;
  int64_t channels = 0;
  int64_t inner = 1;
  bool perElement = false;
  float epsilon = 1e-5f;
  ElementType type = ElementType::kFloat32;
  int blockThreads = 256;  // a thread an element; a multiple of 32 up to 1024
};
cudaError_t launchBatchNormalization(const BatchNormGeometry& geometry, const void* x,
                                     const void* scale, const void* bias, const void* mean,
                                     const void* var, void* y, cudaStream_t stream);

constexpr int kMaxNormRank = 8;

// MeanVarianceNormalization: y = (x - mean) / (sqrt(var) + 1e-9) with one mean and (biased)
// variance per slot, a slot being one combination of the kept axes' coordinates; the reduced
// axes run within it. Strides are x's, in elements.
struct SlotGeometry {
  int keptRank = 0;
  int64_t keptDims[kMaxNormRank] = {};
  int64_t keptStrides[kMaxNormRank] = {};
  int reducedRank = 0;
  int64_t reducedDims[kMaxNormRank] = {};
  int64_t reducedStrides[kMaxNormRank] = {};
};
cudaError_t launchMeanVarianceNormalization(const SlotGeometry& geometry, ElementType type,
                                            const void* x, void* y, cudaStream_t stream);

// LRN over x [batch, channels, inner] (inner: the spatial extents' product): y = x / (bias +
// alpha / size * s)^beta, s the sum of x^2 over channels c - (size - 1) / 2 .. c + size / 2 that
// exist. x and y are of `type`.
struct LrnGeometry {
  int64_t batch = 0;
  int64_t channels = 0;
  int64_t inner = 1;
  int64_t size = 1;
  float alpha = 1e-4f;
  float beta = 0.75f;
  float bias = 1.0f;
  ElementType type = ElementType::kFloat32;
  int blockThreads = 256;  // a thread an element; a multiple of 32 up to 1024
};
cudaError_t launchLrn(const LrnGeometry& geometry, const void* x, void* y, cudaStream_t stream);

}  // namespace kiln::cuda
