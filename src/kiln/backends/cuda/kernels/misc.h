// kiln's kernels on the GPU for the ops that belong to no other family (misc.cu): CumSum, Einsum,
// OneHot, TopK, EyeLike, Range and the fill that writes Dropout's mask and ConstantOfShape. Each
// computes what its reference kernel computes, in the reference's own arithmetic where that
// decides the result: CumSum and Einsum accumulate floating types in double and integers in
// wrapping 64-bit arithmetic, in the reference's order; TopK orders as the reference's stable
// sort does (NaN after every number, ties by lower index).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kiln/backends/cuda/kernels/eltwise.h"  // ElementType

namespace kiln::cuda {

// The most axes a misc kernel takes by value.
constexpr int kMaxMiscRank = 8;

// dst[i] = the `elementSize` low bytes of `pattern`, for i < count.
cudaError_t launchFill(void* dst, int64_t count, uint64_t pattern, int elementSize,
                       cudaStream_t stream);

// EyeLike: a rows x cols matrix with `one` (elementSize bytes) where col - row == k, zero bytes
// elsewhere.
cudaError_t launchEyeLike(void* dst, int64_t rows, int64_t cols, int64_t k, uint64_t one,
                          int elementSize, cudaStream_t stream);

// Range: out[i] = start + i * delta, for i < count: float32 and float64 computed in double
// (rounded once into float32), int16/int32/int64 in int64. Other types are invalid.
struct RangeParams {
  int64_t count = 0;
  double start = 0.0, delta = 0.0;     // floating types
  int64_t startInt = 0, deltaInt = 0;  // integer types
};
cudaError_t launchRange(const RangeParams& range, ElementType type, void* out, cudaStream_t stream);

// CumSum over the axis of a tensor of `dims`: running sums along each line (reversed with
// `reverse`; each element's sum excludes it with `exclusive`). The axis is `axis`, or, when
// axisDevice is set, the int32/int64 scalar there (a runtime input, negative counting from the
// back; an axis out of range leaves the output unwritten, where the reference refuses it).
// Floating types sum in double, integers in uint64 (wrapping), narrowed at each element as the
// reference does; bool is invalid.
struct CumSumParams {
  int rank = 0;
  int64_t dims[kMaxMiscRank] = {};
  int axis = 0;
  const void* axisDevice = nullptr;
  bool axis64 = true;  // axisDevice holds an int64 (else int32)
  bool exclusive = false;
  bool reverse = false;
  // Lines along the innermost axis (of a constant axis) go a warp each, unless this is set: then
  // a thread each, as the lines along any other axis.
  bool threadLines = false;
};
cudaError_t launchCumSum(const CumSumParams& params, ElementType type, const void* x, void* y,
                         cudaStream_t stream);

// Einsum as the reference computes it: each output element sums, over every combination of the
// summed labels (the last fastest), the product of the operands' elements (in operand order),
// floating types in double and integers in uint64, then narrows once. Operand k's element at a
// combination is at sum_label coord(label) * strides[k][label] (0 where it lacks or broadcasts
// the label; a repeated label's axes summed: a diagonal).
constexpr int kMaxEinsumOperands = 8;
constexpr int kMaxEinsumLabels = 16;
struct EinsumParams {
  int operands = 0;
  const void* data[kMaxEinsumOperands] = {};  // device pointers, set at enqueue
  int outputRank = 0;                         // output labels, in output axis order
  int64_t outputExtents[kMaxEinsumLabels] = {};
  int64_t outputStrides[kMaxEinsumOperands][kMaxEinsumLabels] = {};
  int summedRank = 0;  // the labels the output does not keep
  int64_t summedExtents[kMaxEinsumLabels] = {};
  int64_t summedStrides[kMaxEinsumOperands][kMaxEinsumLabels] = {};
  int blockThreads = 256;  // a thread an output element; a multiple of 32 up to 1024
};
cudaError_t launchEinsum(const EinsumParams& params, ElementType type, void* out,
                         cudaStream_t stream);

// OneHot: out [outer, depth, inner] = values[1] where the index at (outer, inner) selects that
// class, else values[0] (`values`: two elements in device memory, `elementSize` bytes each).
// Indices of `indexType` are read as doubles: finite ones with |index| < depth + 1 truncate
// toward zero, negative ones count from the back when `negativeFromBack` (opset 11), and
// anything else selects no class.
struct OneHotParams {
  int64_t outer = 0;
  int64_t depth = 0;
  int64_t inner = 0;
  bool negativeFromBack = true;
  int blockThreads = 256;  // a thread an output element; a multiple of 32 up to 1024
};
cudaError_t launchOneHot(const OneHotParams& params, ElementType indexType, const void* indices,
                         const void* values, void* out, int elementSize, cudaStream_t stream);

// TopK along the middle axis of x [outer, n, inner]: values [outer, k, inner] (elements copied
// bit for bit) and their int64 positions along the axis, in the reference's order: by value
// (descending with `largest`), NaN after every number, equal values by lower position. Either
// output may be null.
struct TopKParams {
  int64_t outer = 0;
  int64_t n = 0;
  int64_t inner = 0;
  int64_t k = 0;
  bool largest = true;
};
cudaError_t launchTopK(const TopKParams& params, ElementType type, const void* x, void* values,
                       int64_t* indices, cudaStream_t stream);

}  // namespace kiln::cuda
