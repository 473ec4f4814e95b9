// ONNX Slice's reading of one axis, shared by shape inference, the reference kernel, the
// backends' lowerings and the passes that reason about slices, so that all of them clamp alike.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kiln::ir {

// The elements a Slice takes along one axis of `dim` elements: `length` of them, the first at
// `first`, then every `step` (step != 0). ONNX's clamping: a negative start or end counts from
// the back, then both are clamped into the axis ([0, dim] for positive steps, [-1, dim - 1] for
// negative ones, where -1 means "before the first element").
struct SliceAxis {
  int64_t first = 0;
  int64_t length = 0;
};

// The first element alone (what a kernel needs once the output's shape is known); 0 for an
// empty axis.
inline int64_t sliceFirst(int64_t start, int64_t step, int64_t dim) {
  if (dim <= 0) return 0;
  if (start < 0) start += dim;
  return step > 0 ? std::clamp<int64_t>(start, 0, dim) : std::clamp<int64_t>(start, 0, dim - 1);
}

inline SliceAxis resolveSliceAxis(int64_t start, int64_t end, int64_t step, int64_t dim) {
  if (dim <= 0 || step == 0) return {};
  start = sliceFirst(start, step, dim);
  if (end < 0) end += dim;
  if (step > 0) {
    end = std::clamp<int64_t>(end, 0, dim);
    return {start, end > start ? (end - start - 1) / step + 1 : 0};
  }
  end = std::clamp<int64_t>(end, -1, dim - 1);
  // The step's magnitude as unsigned, since -INT64_MIN does not fit in int64.
  const uint64_t magnitude = uint64_t{0} - static_cast<uint64_t>(step);
  return {start, start > end
                     ? static_cast<int64_t>(static_cast<uint64_t>(start - end - 1) / magnitude) + 1
                     : 0};
}

}  // namespace kiln::ir
