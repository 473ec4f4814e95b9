// numpy-style broadcasting for reference kernels: per-input strides aligned to the output's
// rank (0 along broadcast axes), walked with an odometer.
#pragma once

#include <array>
#include <vector>

#include "kiln/ir/tensor.h"

namespace kiln::reference {

// Strides of `input` (row-major) as seen from an index into `output`: 0 where `input` has size 1
// or lacks the axis. `input` must broadcast to `output`.
inline std::vector<int64_t> broadcastStrides(const ir::Shape& input, const ir::Shape& output) {
  std::vector<int64_t> strides(output.rank(), 0);
  const std::vector<int64_t> own = input.strides();
  const size_t offset = output.rank() - input.rank();
  for (size_t i = 0; i < input.rank(); ++i) {
    strides[offset + i] = input[i] == 1 ? 0 : own[i];
  }
  return strides;
}

// Calls fn(outputIndex, inputIndices) for every element of `output` in row-major order, where
// inputIndices[k] is the flat index into input k under broadcasting.
template <size_t N, typename Fn>
void forEachBroadcastIndex(const ir::Shape& output, const std::array<ir::Shape, N>& inputs,
                           Fn&& fn) {
  const size_t rank = output.rank();
  std::array<std::vector<int64_t>, N> strides;
  for (size_t k = 0; k < N; ++k) strides[k] = broadcastStrides(inputs[k], output);
  const int64_t total = output.elementCount();
  std::vector<int64_t> counter(rank, 0);
  std::array<int64_t, N> index{};
  for (int64_t out = 0; out < total; ++out) {
    fn(out, index);
    // Advance the odometer and the input indices with it.
    for (size_t axis = rank; axis-- > 0;) {
      ++counter[axis];
      for (size_t k = 0; k < N; ++k) index[k] += strides[k][axis];
      if (counter[axis] < output[axis]) break;
      for (size_t k = 0; k < N; ++k) index[k] -= strides[k][axis] * counter[axis];
      counter[axis] = 0;
    }
  }
}

}  // namespace kiln::reference
