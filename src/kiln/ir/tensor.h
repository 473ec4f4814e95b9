// Shape (static dimensions, overflow-checked arithmetic) and Tensor (typed, contiguous, row-major).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/base/status.h"
#include "kiln/ir/dtype.h"

namespace kiln::ir {

// The largest number of elements kiln accepts in one tensor (2^40); a guard against declared
// shapes that would make kiln allocate without bound.
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 40;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : dims_(dims) {}
  explicit Shape(std::vector<int64_t> dims) : dims_(std::move(dims)) {}

  size_t rank() const { return dims_.size(); }
  int64_t operator[](size_t axis) const { return dims_[axis]; }
  int64_t& operator[](size_t axis) { return dims_[axis]; }
  const std::vector<int64_t>& dims() const { return dims_; }
  std::vector<int64_t>& dims() { return dims_; }

  // Number of elements. Only valid on shapes that passed `checkedElementCount`; every shape kiln
  // stores on a value or tensor has.
  int64_t elementCount() const;
  // Number of elements, or an error if a dimension is negative or the product of the nonzero
  // dimensions overflows or exceeds kMaxTensorElements (whether or not another dimension is 0).
  Result<int64_t> checkedElementCount() const;

  // Row-major strides in elements.
  std::vector<int64_t> strides() const;

  bool operator==(const Shape& other) const { return dims_ == other.dims_; }
  bool operator!=(const Shape& other) const { return dims_ != other.dims_; }

  std::string toString() const;  // "[1,3,224,224]"

 private:
  std::vector<int64_t> dims_;
};

// Normalises a possibly negative axis into [0, rank), or says which axis was out of range.
Result<int64_t> normalizeAxis(int64_t axis, int64_t rank);

// A dense, row-major tensor. Copies share the data; `clone` copies it.
class Tensor {
 public:
  Tensor() = default;
  // Allocates a zero-filled tensor. The shape must have passed checkedElementCount.
  Tensor(DType dtype, Shape shape);
  // Allocates after checking the shape's size; the error names the shape.
  static Result<Tensor> allocate(DType dtype, Shape shape);
  // A tensor holding `values`, with the given shape (which must match their count).
  template <typename T>
  static Tensor fromVector(Shape shape, const std::vector<T>& values) {
    Tensor tensor(DTypeOf<T>::value, std::move(shape));
    auto out = tensor.mutableData<T>();
    for (size_t i = 0; i < values.size() && i < out.size(); ++i) out[i] = values[i];
    return tensor;
  }
  template <typename T>
  static Tensor scalar(T value) {
    return fromVector<T>(Shape{}, {value});
  }

  // A tensor over memory it does not own (an execution arena): the caller keeps `data` alive
  // and large enough for the shape.
  static Tensor view(DType dtype, Shape shape, std::byte* data);

  bool empty() const { return data_ == nullptr && shape_.rank() == 0; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  size_t rank() const { return shape_.rank(); }
  int64_t elementCount() const { return elementCount_; }
  size_t byteSize() const { return static_cast<size_t>(elementCount_) * dtypeSize(dtype_); }

  const std::byte* rawData() const { return data_.get(); }
  std::byte* mutableRawData() { return data_.get(); }

  template <typename T>
  std::span<const T> data() const {
    KILN_CHECK(DTypeOf<T>::value == dtype_);
    return {reinterpret_cast<const T*>(data_.get()), static_cast<size_t>(elementCount_)};
  }
  template <typename T>
  std::span<T> mutableData() {
    KILN_CHECK(DTypeOf<T>::value == dtype_);
    return {reinterpret_cast<T*>(data_.get()), static_cast<size_t>(elementCount_)};
  }

  // Reads element i converted to double / int64 (for small shape-like tensors and tests).
  double elementAsDouble(int64_t index) const;
  int64_t elementAsInt64(int64_t index) const;
  // All elements as int64 (for shape-like inputs: axes, pads, shapes). Floating types truncate.
  std::vector<int64_t> toInt64Vector() const;

  // Same data, another shape with the same element count.
  Tensor reshaped(Shape shape) const;
  Tensor clone() const;
  // Converts to another dtype (numpy astype semantics).
  Tensor castTo(DType dtype) const;

 private:
  DType dtype_ = DType::kFloat32;
  Shape shape_;
  int64_t elementCount_ = 0;
  std::shared_ptr<std::byte[]> data_;
};

}  // namespace kiln::ir
