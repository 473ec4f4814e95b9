// Host-side helpers the CUDA backend's step factories share: the kernels' element type of an
// ir::DType, and the product of a run of dimensions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/backends/cuda/kernels/eltwise.h"  // ElementType
#include "kiln/ir/dtype.h"
#include "kiln/ir/graph.h"

namespace kiln::cuda {

// The kernels' element type of `dtype` (every ir::DType has one).
inline std::optional<ElementType> elementTypeOf(ir::DType dtype) {
  switch (dtype) {
    case ir::DType::kFloat32:
      return ElementType::kFloat32;
    case ir::DType::kFloat16:
      return ElementType::kFloat16;
    case ir::DType::kBFloat16:
      return ElementType::kBFloat16;
    case ir::DType::kFloat64:
      return ElementType::kFloat64;
    case ir::DType::kInt64:
      return ElementType::kInt64;
    case ir::DType::kInt32:
      return ElementType::kInt32;
    case ir::DType::kInt16:
      return ElementType::kInt16;
    case ir::DType::kInt8:
      return ElementType::kInt8;
    case ir::DType::kUInt64:
      return ElementType::kUInt64;
    case ir::DType::kUInt32:
      return ElementType::kUInt32;
    case ir::DType::kUInt16:
      return ElementType::kUInt16;
    case ir::DType::kUInt8:
      return ElementType::kUInt8;
    case ir::DType::kBool:
      return ElementType::kBool;
  }
  return std::nullopt;
}

// The kernels' element type of `value`'s dtype; nullopt where `value` is absent.
inline std::optional<ElementType> elementTypeOf(const ir::Value* value) {
  if (!value) return std::nullopt;
  return elementTypeOf(value->dtype);
}

// The kernels' element type for `dtype` where it is float32, float16 or bfloat16; nullopt for
// every other dtype.
inline std::optional<ElementType> floatTypeOf(ir::DType dtype) {
  switch (dtype) {
    case ir::DType::kFloat32:
      return ElementType::kFloat32;
    case ir::DType::kFloat16:
      return ElementType::kFloat16;
    case ir::DType::kBFloat16:
      return ElementType::kBFloat16;
    default:
      return std::nullopt;
  }
}

// The product of dims[begin, end), stopping at the end of `dims`.
inline int64_t product(const std::vector<int64_t>& dims, size_t begin, size_t end) {
  int64_t result = 1;
  for (size_t i = begin; i < end && i < dims.size(); ++i) result *= dims[i];
  return result;
}

}  // namespace kiln::cuda
