// What the indexing kernels (indexing*.cc) share: element copies that serve every dtype, an
// odometer over a shape, and the kernels registered from indexing.cc but defined elsewhere.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "kiln/reference/kernel.h"

namespace kiln::reference {

// Copies element `from` of `src` to element `to` of `dst` (same dtype). Pure data movement needs
// no arithmetic, so one byte copy serves every element type and keeps values bit-exact.
inline void copyElement(const Tensor& src, int64_t from, Tensor& dst, int64_t to) {
  const size_t size = ir::dtypeSize(src.dtype());
  std::memcpy(dst.mutableRawData() + to * size, src.rawData() + from * size, size);
}

// Calls fn(flatIndex, coords) for every element of `shape` in row-major order.
template <typename Fn>
void forEachIndex(const Shape& shape, Fn&& fn) {
  const int64_t total = shape.elementCount();
  std::vector<int64_t> coords(shape.rank(), 0);
  for (int64_t flat = 0; flat < total; ++flat) {
    fn(flat, static_cast<const std::vector<int64_t>&>(coords));
    for (size_t axis = shape.rank(); axis-- > 0;) {
      if (++coords[axis] < shape[axis]) break;
      coords[axis] = 0;
    }
  }
}

// "[1,0,2]": the coordinates of flat element `flat` of `shape`, for error messages.
std::string formatCoords(const Shape& shape, int64_t flat);

// An index read from an indices tensor, normalised into [0, size), or an error naming where in
// `indices` it sits and the range it had to lie in.
Result<int64_t> checkedIndex(const KernelContext& ctx, const Tensor& indices, int64_t position,
                             int64_t size, int64_t axis);

// For every element of `indices` (same rank as `data`), calls fn(flat, offset): `offset` is the
// flat position in `data` at the element's coordinates with the one along `axis` replaced by the
// (checked) index it holds. GatherElements reads there, ScatterElements writes there.
template <typename Fn>
Status forEachAxisIndex(const KernelContext& ctx, const Tensor& data, const Tensor& indices,
                        int64_t axis, Fn&& fn) {
  const int64_t rank = static_cast<int64_t>(data.rank());
  const std::vector<int64_t> strides = data.shape().strides();
  Status status;
  forEachIndex(indices.shape(), [&](int64_t flat, const std::vector<int64_t>& coords) {
    if (!status.isOk()) return;
    auto index = checkedIndex(ctx, indices, flat, data.shape()[axis], axis);
    if (!index.isOk()) {
      status = index.status();
      return;
    }
    int64_t offset = 0;
    for (int64_t i = 0; i < rank; ++i) offset += (i == axis ? *index : coords[i]) * strides[i];
    fn(flat, offset);
  });
  return status;
}

Status runScatterND(KernelContext& ctx);
Status runScatterElements(KernelContext& ctx);
Status runPad(KernelContext& ctx);
Status runResize(KernelContext& ctx);
Status runUpsample(KernelContext& ctx);

}  // namespace kiln::reference
