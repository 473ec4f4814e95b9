// The data-movement kernel family's shared machinery (datamove.cc, gather.cc, resize.cc): element
// copies described per axis, planned at build time and run over the plan's threads.
//
// Most data-movement ops are one or more strided boxes: Slice reads a box of its input with
// scaled (possibly negative) strides, Concat writes each input as a box of the output, Expand
// reads with stride 0 along broadcast axes, Tile is Expand over a [repeat, dim] view of each axis.
// Ops whose source coordinate is not affine in the output coordinate (nearest Resize, reflecting
// Pad) use per-axis offset tables instead.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "kiln/backends/cpu/kernels/steps.h"

namespace kiln::cpu::datamove {

// The least work worth a chunk of its own on another thread: about 100 us of one thread's work,
// ten times what waking a worker was measured to cost on the 2-core development machine (~8 us
// idle, more under load, where splitting the models' copies and selects measured slower than
// not). Copies of in-cache data run at ~45 GB/s there; Where and Cast at ~25 GB/s of output.
// The box copies (Concat, Split, Slice, Pad, ...) take cpu.copy.chunk instead (64 KiB by
// default: each thread then copies what its core's cache holds); Gather and Resize keep this.
inline constexpr int64_t kCopyChunkBytes = 4 * 1024 * 1024;
inline constexpr int64_t kComputeChunkBytes = 1024 * 1024;

// Items of `itemBytes` each per parallelFor chunk so that a chunk holds `chunkBytes`.
inline int64_t grainFor(int64_t itemBytes, int64_t chunkBytes = kCopyChunkBytes) {
  return std::max<int64_t>(1, chunkBytes / std::max<int64_t>(itemBytes, 1));
}

// Copies element i of an N-d box from src[srcOffset + Σ i_a * src_a] to dst[dstOffset + Σ i_a *
// dst_a], in elements of the step's element size, reading step input `input` and writing step
// output `output`.
struct CopyBox {
  int input = 0;
  int output = 0;
  std::vector<int64_t> dims, src, dst;
  int64_t srcOffset = 0;
  int64_t dstOffset = 0;
};

// A set of boxes copied in one go (the boxes of one step write disjoint output elements).
// Axes are merged at build time (size-1 axes dropped, adjacent axes that stay adjacent in both
// source and destination fused), so a contiguous box is one memcpy and a Concat along axis 1 is
// one memcpy per input and batch entry. Work is split into units of up to 16 KiB (groups of
// short rows, or column blocks of long ones) spread over the pool.
class BoxCopier {
 public:
  BoxCopier() = default;
  // `chunkBytes`: the least work per thread (tests make it small to exercise the splitting).
  BoxCopier(std::vector<CopyBox> boxes, size_t elementSize, int64_t chunkBytes = kCopyChunkBytes);

  void run(const ExecutionContext& context, const std::vector<std::optional<BufferRef>>& inputs,
           const std::vector<std::optional<BufferRef>>& outputs) const;

  // The merged boxes (for tests of the planning).
  const std::vector<CopyBox>& boxes() const { return boxes_; }
  // Plans chunks of at least `chunkBytes` (cpu.copy.chunk) instead of the constructor's.
  void setChunkBytes(int64_t chunkBytes) { grain_ = grainFor(unitBytes_, chunkBytes); }

 private:
  struct Plan {
    int64_t rows = 1;         // product of all but the last merged axis
    int64_t inner = 1;        // the last merged axis
    int64_t rowsPerUnit = 1;  // > 1: a unit is a group of whole rows
    int64_t colsPerUnit = 1;  // < inner: a unit is a column block of one row
    int64_t colBlocks = 1;
    int64_t units = 0;
  };
  void runUnits(const CopyBox& box, const Plan& plan, const std::byte* src, std::byte* dst,
                int64_t begin, int64_t end) const;

  std::vector<CopyBox> boxes_;
  std::vector<Plan> plans_;
  std::vector<int64_t> firstUnit_;  // prefix sums of plans_[i].units
  size_t elementSize_ = 4;
  int64_t grain_ = 1;      // units per chunk
  int64_t unitBytes_ = 0;  // bytes a unit moves, on average
};

// Merges a box's axes as described above; a box with an empty axis gets dims {0}.
CopyBox simplifyBox(CopyBox box);

// Copies out[i_0, ..., i_{n-1}] = in[Σ_a offsets[a][i_a]] (element offsets), for any table of
// per-axis source offsets. The last axis is one memcpy per row where its table is a contiguous
// run; rows are spread over the pool.
class AxisGather {
 public:
  AxisGather() = default;
  AxisGather(std::vector<std::vector<int64_t>> offsets, size_t elementSize,
             int64_t chunkBytes = kCopyChunkBytes);

  void run(const std::byte* src, std::byte* dst, ThreadPool& pool) const;

 private:
  std::vector<std::vector<int64_t>> offsets_;  // offsets_[a].size() is output axis a's extent
  size_t elementSize_ = 4;
  int64_t rows_ = 0;   // output rows (all axes but the last)
  int64_t inner_ = 0;  // the last axis's extent
  int64_t chunkBytes_ = kCopyChunkBytes;
  bool contiguousInner_ = false;  // offsets_.back() is 0, 1, 2, ... (plus a constant)
};

// The family's ops outside datamove.cc; each returns null where it does not apply.
std::unique_ptr<Step> makeGatherStep(const ir::Node& node);
std::unique_ptr<Step> makeResizeStep(const ir::Node& node);

}  // namespace kiln::cpu::datamove
