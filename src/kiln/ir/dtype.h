// Element types of kiln tensors, with the half-precision conversions the executors share.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "kiln/base/status.h"

namespace kiln::ir {

enum class DType : uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat64,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt64,
  kUInt32,
  kUInt16,
  kUInt8,
  kBool,
};

std::string_view dtypeName(DType dtype);
// The kiln type of an ONNX TensorProto.DataType number (as initializers, Cast's `to` and
// EyeLike's `dtype` hold it). String, complex, float8 and 4-bit types are unsupported.
Result<DType> dtypeFromOnnxType(int64_t code);
std::optional<DType> dtypeFromName(std::string_view name);
size_t dtypeSize(DType dtype);
bool isFloating(DType dtype);
bool isInteger(DType dtype);  // signed or unsigned integer, not bool
bool isSigned(DType dtype);

// IEEE binary16, stored as its bits. Arithmetic goes through float.
struct Float16 {
  uint16_t bits = 0;
  Float16() = default;
  explicit Float16(float value);
  explicit operator float() const;
};

// bfloat16: the upper half of a float32, rounded to nearest even.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float value);
  explicit operator float() const;
};

template <typename T>
struct DTypeOf;
template <>
struct DTypeOf<float> {
  static constexpr DType value = DType::kFloat32;
};
template <>
struct DTypeOf<Float16> {
  static constexpr DType value = DType::kFloat16;
};
template <>
struct DTypeOf<BFloat16> {
  static constexpr DType value = DType::kBFloat16;
};
template <>
struct DTypeOf<double> {
  static constexpr DType value = DType::kFloat64;
};
template <>
struct DTypeOf<int64_t> {
  static constexpr DType value = DType::kInt64;
};
template <>
struct DTypeOf<int32_t> {
  static constexpr DType value = DType::kInt32;
};
template <>
struct DTypeOf<int16_t> {
  static constexpr DType value = DType::kInt16;
};
template <>
struct DTypeOf<int8_t> {
  static constexpr DType value = DType::kInt8;
};
template <>
struct DTypeOf<uint64_t> {
  static constexpr DType value = DType::kUInt64;
};
template <>
struct DTypeOf<uint32_t> {
  static constexpr DType value = DType::kUInt32;
};
template <>
struct DTypeOf<uint16_t> {
  static constexpr DType value = DType::kUInt16;
};
template <>
struct DTypeOf<uint8_t> {
  static constexpr DType value = DType::kUInt8;
};
template <>
struct DTypeOf<bool> {
  static constexpr DType value = DType::kBool;
};

// Calls fn(T{}) with T the C++ type of `dtype`. Every DType has a C++ type.
template <typename Fn>
decltype(auto) visitDType(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat32:
      return fn(float{});
    case DType::kFloat16:
      return fn(Float16{});
    case DType::kBFloat16:
      return fn(BFloat16{});
    case DType::kFloat64:
      return fn(double{});
    case DType::kInt64:
      return fn(int64_t{});
    case DType::kInt32:
      return fn(int32_t{});
    case DType::kInt16:
      return fn(int16_t{});
    case DType::kInt8:
      return fn(int8_t{});
    case DType::kUInt64:
      return fn(uint64_t{});
    case DType::kUInt32:
      return fn(uint32_t{});
    case DType::kUInt16:
      return fn(uint16_t{});
    case DType::kUInt8:
      return fn(uint8_t{});
    case DType::kBool:
      return fn(bool{});
  }
  return fn(float{});
}

// Converts between any two element types the way numpy's astype does for in-range values
// (float to integer truncates toward zero).
template <typename To, typename From>
To convertElement(From value) {
  if constexpr (std::is_same_v<From, Float16> || std::is_same_v<From, BFloat16>) {
    return convertElement<To>(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, Float16> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, bool>) {
    return value != From{};
  } else {
    return static_cast<To>(value);
  }
}

}  // namespace kiln::ir
