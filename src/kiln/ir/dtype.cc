// DType names, sizes and the binary16 / bfloat16 conversions.
#include "kiln/ir/dtype.h"

#include <bit>
#include <cmath>

namespace kiln::ir {

namespace {
struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kFloat32, "float32", 4},   {DType::kFloat16, "float16", 2},
    {DType::kBFloat16, "bfloat16", 2}, {DType::kFloat64, "float64", 8},
    {DType::kInt64, "int64", 8},       {DType::kInt32, "int32", 4},
    {DType::kInt16, "int16", 2},       {DType::kInt8, "int8", 1},
    {DType::kUInt64, "uint64", 8},     {DType::kUInt32, "uint32", 4},
    {DType::kUInt16, "uint16", 2},     {DType::kUInt8, "uint8", 1},
    {DType::kBool, "bool", 1},
};
}  // namespace

std::string_view dtypeName(DType dtype) { return kDTypes[static_cast<int>(dtype)].name; }
size_t dtypeSize(DType dtype) { return kDTypes[static_cast<int>(dtype)].size; }

std::optional<DType> dtypeFromName(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

Result<DType> dtypeFromOnnxType(int64_t code) {
  // Numbers from onnx.proto's TensorProto.DataType.
  switch (code) {
    case 1:
      return DType::kFloat32;
    case 2:
      return DType::kUInt8;
    case 3:
      return DType::kInt8;
    case 4:
      return DType::kUInt16;
    case 5:
      return DType::kInt16;
    case 6:
      return DType::kInt32;
    case 7:
      return DType::kInt64;
    case 9:
      return DType::kBool;
    case 10:
      return DType::kFloat16;
    case 11:
      return DType::kFloat64;
    case 12:
      return DType::kUInt32;
    case 13:
      return DType::kUInt64;
    case 16:
      return DType::kBFloat16;
    case 0:
      return invalidInput("element type is undefined (0)");
    case 8:
      return unsupported("string tensors are not supported");
    case 14:
    case 15:
      return unsupported("complex tensors are not supported");
    default:
      if (code >= 17 && code <= 23) {
        return unsupported("element type {} (float8 or 4-bit) is not supported", code);
      }
      return invalidInput("{} is not an ONNX element type", code);
  }
}

bool isFloating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16 ||
         dtype == DType::kFloat64;
}
bool isInteger(DType dtype) { return !isFloating(dtype) && dtype != DType::kBool; }
bool isSigned(DType dtype) {
  return isFloating(dtype) || dtype == DType::kInt64 || dtype == DType::kInt32 ||
         dtype == DType::kInt16 || dtype == DType::kInt8;
}

Float16::Float16(float value) {
  const uint32_t f = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (f >> 16) & 0x8000u;
  const uint32_t absF = f & 0x7fffffffu;
  if (absF >= 0x7f800000u) {  // inf or nan
    bits = static_cast<uint16_t>(sign | 0x7c00u | (absF > 0x7f800000u ? 0x200u : 0u));
    return;
  }
  if (absF >= 0x477ff000u) {  // rounds to >= 65520: overflow to inf
    bits = static_cast<uint16_t>(sign | 0x7c00u);
    return;
  }
  if (absF < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    // Scale by 2^24 so the subnormal half's integer mantissa is the rounded float value.
    const float scaled = std::bit_cast<float>(absF) * 16777216.0f;
    bits = static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
    return;
  }
  // Normal: rebias the exponent and round the mantissa to nearest even.
  uint32_t mantissa = absF & 0x7fffffu;
  uint32_t exponent = (absF >> 23) - 127 + 15;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  bits = static_cast<uint16_t>(sign | half);
}

Float16::operator float() const {
  const uint32_t sign = (bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    const float magnitude = static_cast<float>(mantissa) / 16777216.0f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent - 15 + 127) << 23) | (mantissa << 13));
}

BFloat16::BFloat16(float value) {
  uint32_t f = std::bit_cast<uint32_t>(value);
  if ((f & 0x7fffffffu) > 0x7f800000u) {  // nan: keep it a quiet nan
    bits = static_cast<uint16_t>((f >> 16) | 0x40u);
    return;
  }
  const uint32_t roundingBias = 0x7fffu + ((f >> 16) & 1u);
  bits = static_cast<uint16_t>((f + roundingBias) >> 16);
}

BFloat16::operator float() const { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

}  // namespace kiln::ir
