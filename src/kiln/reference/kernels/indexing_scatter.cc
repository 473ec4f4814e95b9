// Reference kernels for ScatterND and ScatterElements (and the older Scatter): a copy of data
// with selected elements replaced by, or reduced with, the updates. Duplicate indices apply in
// index order, so with reduction 'none' the last update wins.
#include <cmath>
#include <limits>
#include <type_traits>

#include "kiln/reference/kernels/indexing.h"

namespace kiln::reference {

namespace {

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

Result<Reduction> readReduction(const KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string name, ctx.node().getString("reduction", "none"));
  if (name == "none") return Reduction::kNone;
  if (name == "add") return Reduction::kAdd;
  if (name == "mul") return Reduction::kMul;
  if (name == "max") return Reduction::kMax;
  if (name == "min") return Reduction::kMin;
  return ctx.error("unknown reduction '{}'", name);
}

// Reduces `update` into `current`. Integers wrap like numpy (computed in uint64 so that
// overflow is defined); bool adds as 'or' and multiplies as 'and'; NaN wins max and min.
template <typename T>
T combine(Reduction reduction, T current, T update) {
  if constexpr (std::is_same_v<T, ir::Float16> || std::is_same_v<T, ir::BFloat16>) {
    return T(combine(reduction, static_cast<float>(current), static_cast<float>(update)));
  } else if constexpr (std::is_same_v<T, bool>) {
    const bool additive = reduction == Reduction::kAdd || reduction == Reduction::kMax;
    return additive ? (current || update) : (current && update);
  } else if constexpr (std::is_integral_v<T>) {
    const auto a = static_cast<uint64_t>(current);
    const auto b = static_cast<uint64_t>(update);
    switch (reduction) {
      case Reduction::kAdd:
        return static_cast<T>(a + b);
      case Reduction::kMul:
        return static_cast<T>(a * b);
      case Reduction::kMax:
        return std::max(current, update);
      case Reduction::kMin:
        return std::min(current, update);
      case Reduction::kNone:
        return update;
    }
    return update;
  } else {
    switch (reduction) {
      case Reduction::kAdd:
        return current + update;
      case Reduction::kMul:
        return current * update;
      case Reduction::kMax:
      case Reduction::kMin:
        if (std::isnan(current) || std::isnan(update)) return std::numeric_limits<T>::quiet_NaN();
        return reduction == Reduction::kMax ? std::max(current, update) : std::min(current, update);
      case Reduction::kNone:
        return update;
    }
    return update;
  }
}

// Applies update element `from` of `updates` to element `to` of `out`.
void applyUpdate(Reduction reduction, const Tensor& updates, int64_t from, Tensor& out,
                 int64_t to) {
  if (reduction == Reduction::kNone) {
    copyElement(updates, from, out, to);
    return;
  }
  ir::visitDType(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    auto values = out.mutableData<T>();
    values[to] = combine<T>(reduction, values[to], updates.data<T>()[from]);
  });
}

}  // namespace

Status runScatterND(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  const Tensor& updates = ctx.input(2);
  Tensor& out = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(Reduction reduction, readReduction(ctx));
  std::memcpy(out.mutableRawData(), data.rawData(), data.byteSize());
  const auto& dims = data.shape().dims();
  const std::vector<int64_t> strides = data.shape().strides();
  const int64_t k = indices.shape().dims().back();
  const int64_t rows = indices.elementCount() / k;
  int64_t sliceSize = 1;
  for (size_t i = k; i < dims.size(); ++i) sliceSize *= dims[i];
  for (int64_t row = 0; row < rows; ++row) {
    int64_t target = 0;
    for (int64_t j = 0; j < k; ++j) {
      KILN_ASSIGN_OR_RETURN(int64_t index, checkedIndex(ctx, indices, row * k + j, dims[j], j));
      target += index * strides[j];
    }
    for (int64_t t = 0; t < sliceSize; ++t) {
      applyUpdate(reduction, updates, row * sliceSize + t, out, target + t);
    }
  }
  return Status::ok();
}

Status runScatterElements(KernelContext& ctx) {
  const Tensor& data = ctx.input(0);
  const Tensor& indices = ctx.input(1);
  const Tensor& updates = ctx.input(2);
  Tensor& out = ctx.output(0);
  KILN_ASSIGN_OR_RETURN(Reduction reduction, readReduction(ctx));
  KILN_ASSIGN_OR_RETURN(int64_t axisAttr, ctx.node().getInt("axis", 0));
  const int64_t rank = static_cast<int64_t>(data.rank());
  const int64_t axis = axisAttr < 0 ? axisAttr + rank : axisAttr;
  std::memcpy(out.mutableRawData(), data.rawData(), data.byteSize());
  return forEachAxisIndex(ctx, data, indices, axis, [&](int64_t flat, int64_t target) {
    applyUpdate(reduction, updates, flat, out, target);
  });
}

}  // namespace kiln::reference
