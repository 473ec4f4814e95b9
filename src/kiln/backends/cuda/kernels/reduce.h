// kiln's reduction kernels on the GPU (reduce.cu): the Reduce* family (Sum, Mean, Max, Min,
// Prod, L1, L2, LogSum, LogSumExp, SumSquare) over any set of axes, and ArgMax/ArgMin along one.
// Each computes what the reference kernel (src/kiln/reference/kernels/reduction.cc) computes:
// floating inputs accumulate in double (so only the order of the additions differs), integer
// sums and products wrap modulo 2^64, extrema propagate NaN, and the empty set gives the
// reference's identities (0, 1, NaN for Mean, -inf / +inf, the type's limits).
//
// The input is seen as kept and reduced axes (merged where neighbours walk as one): output
// element o is the reduction over the reduced coordinates r of input element
// keptOffset(o) + reducedOffset(r). Where the innermost input axis is reduced, a group of
// threads (a warp for short groups, a block for long ones) shares each output ("rows"); where it
// is kept, neighbouring threads take neighbouring outputs and split the reduced range among a
// few thread rows ("columns"), so reads are coalesced either way; with few outputs over a long
// range the range is split over blocks too, in a workspace of partial states combined in order.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "kiln/backends/cuda/kernels/eltwise.h"

namespace kiln::cuda {

enum class ReduceOp : int {
  kSum,
  kMean,
  kProd,
  kSumSquare,
  kL1,
  kL2,
  kLogSum,
  kLogSumExp,
  kMax,
  kMin,
  kArgMax,  // the int64 index along the (one) reduced axis
  kArgMin,
};

constexpr int kMaxReduceRank = 8;

struct ReduceGeometry {
  int64_t outputs = 0;  // output elements (the product of keptDims); 0 launches nothing
  int64_t reduced = 1;  // elements reduced into each output (the product of reducedDims; may be 0)
  int keptRank = 0;
  int64_t keptDims[kMaxReduceRank] = {};
  int64_t keptStrides[kMaxReduceRank] = {};  // input strides, in elements
  int reducedRank = 0;
  int64_t reducedDims[kMaxReduceRank] = {};
  int64_t reducedStrides[kMaxReduceRank] = {};
  bool rows = true;  // the innermost input axis is reduced (else kept: the column kernel)
};

struct ReduceLaunch {
  ReduceOp op = ReduceOp::kSum;
  ElementType type = ElementType::kFloat32;  // the input's; the output has it too (ArgMax: int64)
  ReduceGeometry geometry;
  bool selectLastIndex = false;  // ArgMax/ArgMin: ties go to the last index
  int blockThreads = 256;        // the row kernel's block: 128, 256 or 512
  int columnSlices = 8;          // the column kernels' threads along the reduced range, 1 to 32
  int64_t warpRowLimit = 1024;   // rows this long or shorter take a warp, longer ones a block
  // Split columns (see reduceColumnSplits): the blocks to aim for, and the fewest reduced
  // elements a split takes.
  int64_t splitTargetBlocks = 1056;
  int64_t splitMinChunk = 64;
  const void* x = nullptr;
  void* y = nullptr;
  void* workspace = nullptr;  // reduceWorkspaceBytes(op, geometry) bytes, 16-aligned
};

bool reduceSupported(ReduceOp op, ElementType type);
cudaError_t launchReduce(const ReduceLaunch& launch, cudaStream_t stream);

// Column reductions with few outputs and a long reduced range (global pooling over NHWC, say)
// split the range over blocks, enough for the launch's splitTargetBlocks where each split keeps
// at least splitMinChunk elements: how many splits (1: none), and the workspace their partial
// states need (0 without splits).
int64_t reduceColumnSplits(const ReduceLaunch& launch);
int64_t reduceWorkspaceBytes(const ReduceLaunch& launch);

// Whether the row kernel gives each output a warp (reductions of at most warpRowLimit elements)
// or a whole block.
bool reduceUsesWarpRows(const ReduceLaunch& launch);

}  // namespace kiln::cuda
