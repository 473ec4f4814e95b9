// Shape arithmetic and Tensor storage.
#include "kiln/ir/tensor.h"

#include <cstring>
#include <new>

namespace kiln::ir {

int64_t Shape::elementCount() const {
  int64_t count = 1;
  for (int64_t dim : dims_) count *= dim;
  return count;
}

Result<int64_t> Shape::checkedElementCount() const {
  // The product of the nonzero dimensions is bounded too, so the answer does not depend on where
  // a zero stands ([0,2^31,2^31] and [2^31,2^31,0] are both refused) and strides, which multiply
  // the trailing dimensions, stay in range on an empty tensor.
  int64_t nonzero = 1;
  bool empty = false;
  for (size_t axis = 0; axis < dims_.size(); ++axis) {
    if (dims_[axis] < 0) {
      return invalidInput("shape {} has a negative dimension at axis {}", toString(), axis);
    }
    if (dims_[axis] == 0) {
      empty = true;
      continue;
    }
    if (__builtin_mul_overflow(nonzero, dims_[axis], &nonzero) || nonzero > kMaxTensorElements) {
      return invalidInput(
          "shape {} has more than 2^40 elements (the product of its dimensions "
          "overflows kiln's limit)",
          toString());
    }
  }
  return empty ? 0 : nonzero;
}

std::vector<int64_t> Shape::strides() const {
  std::vector<int64_t> strides(dims_.size(), 1);
  for (size_t i = dims_.size(); i-- > 1;) strides[i - 1] = strides[i] * dims_[i];
  return strides;
}

std::string Shape::toString() const {
  std::vector<std::string> parts;
  for (int64_t dim : dims_) parts.push_back(dim < 0 ? "?" : std::to_string(dim));
  return fmt::format("[{}]", fmt::join(parts, ","));
}

Result<int64_t> normalizeAxis(int64_t axis, int64_t rank) {
  if (axis < -rank || axis >= rank || (rank == 0 && axis != 0 && axis != -1)) {
    return invalidInput("axis {} is out of range for rank {}", axis, rank);
  }
  return axis < 0 ? axis + rank : axis;
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  elementCount_ = shape_.elementCount();
  // 64-byte alignment so kernels may use aligned vector loads; at least one byte so every
  // tensor, even an empty one, has an address.
  const size_t bytes = std::max<size_t>(byteSize(), 1);
  const size_t rounded = (bytes + 63) / 64 * 64;
  auto* raw = static_cast<std::byte*>(::operator new[](rounded, std::align_val_t{64}));
  std::memset(raw, 0, rounded);
  data_ = std::shared_ptr<std::byte[]>(
      raw, [](std::byte* p) { ::operator delete[](p, std::align_val_t{64}); });
}

Tensor Tensor::view(DType dtype, Shape shape, std::byte* data) {
  Tensor tensor;
  tensor.dtype_ = dtype;
  tensor.shape_ = std::move(shape);
  tensor.elementCount_ = tensor.shape_.elementCount();
  tensor.data_ = std::shared_ptr<std::byte[]>(data, [](std::byte*) {});
  return tensor;
}

Result<Tensor> Tensor::allocate(DType dtype, Shape shape) {
  KILN_ASSIGN_OR_RETURN(int64_t count, shape.checkedElementCount());
  (void)count;
  return Tensor(dtype, std::move(shape));
}

double Tensor::elementAsDouble(int64_t index) const {
  return visitDType(dtype_, [&](auto tag) -> double {
    using T = decltype(tag);
    return convertElement<double>(data<T>()[index]);
  });
}

int64_t Tensor::elementAsInt64(int64_t index) const {
  return visitDType(dtype_, [&](auto tag) -> int64_t {
    using T = decltype(tag);
    return convertElement<int64_t>(data<T>()[index]);
  });
}

std::vector<int64_t> Tensor::toInt64Vector() const {
  std::vector<int64_t> values(elementCount_);
  for (int64_t i = 0; i < elementCount_; ++i) values[i] = elementAsInt64(i);
  return values;
}

Tensor Tensor::reshaped(Shape shape) const {
  KILN_CHECK(shape.elementCount() == elementCount_);
  Tensor view = *this;
  view.shape_ = std::move(shape);
  return view;
}

Tensor Tensor::clone() const {
  Tensor copy(dtype_, shape_);
  if (byteSize() > 0) std::memcpy(copy.data_.get(), data_.get(), byteSize());
  return copy;
}

Tensor Tensor::castTo(DType dtype) const {
  if (dtype == dtype_) return clone();
  Tensor out(dtype, shape_);
  visitDType(dtype_, [&](auto fromTag) {
    using From = decltype(fromTag);
    visitDType(dtype, [&](auto toTag) {
      using To = decltype(toTag);
      auto src = data<From>();
      auto dst = out.mutableData<To>();
      for (size_t i = 0; i < src.size(); ++i) dst[i] = convertElement<To>(src[i]);
    });
  });
  return out;
}

}  // namespace kiln::ir
