// Device-side helpers the CUDA backend's .cu files share: the storage type of each ElementType
// (bool as one byte), calls of a functor with the element type as a Tag, type traits, and the
// half types' loads and stores through float (rounding to nearest even on the way out).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kiln/backends/cuda/kernels/eltwise.h"  // ElementType

namespace kiln::cuda::device {

// bool as stored: one byte, anything nonzero true.
struct BoolByte {
  uint8_t bits;
};

template <typename T>
struct Tag {
  using type = T;
};

// Calls fn(Tag<T>{}) with T the storage type of `type` (BoolByte for bool).
template <typename Fn>
cudaError_t byElementType(ElementType type, Fn&& fn) {
  switch (type) {
    case ElementType::kFloat32:
      return fn(Tag<float>{});
    case ElementType::kFloat16:
      return fn(Tag<__half>{});
    case ElementType::kBFloat16:
      return fn(Tag<__nv_bfloat16>{});
    case ElementType::kFloat64:
      return fn(Tag<double>{});
    case ElementType::kInt64:
      return fn(Tag<int64_t>{});
    case ElementType::kInt32:
      return fn(Tag<int32_t>{});
    case ElementType::kInt16:
      return fn(Tag<int16_t>{});
    case ElementType::kInt8:
      return fn(Tag<int8_t>{});
    case ElementType::kUInt64:
      return fn(Tag<uint64_t>{});
    case ElementType::kUInt32:
      return fn(Tag<uint32_t>{});
    case ElementType::kUInt16:
      return fn(Tag<uint16_t>{});
    case ElementType::kUInt8:
      return fn(Tag<uint8_t>{});
    case ElementType::kBool:
      return fn(Tag<BoolByte>{});
  }
  return cudaErrorInvalidValue;
}

// Calls fn(Tag<T>{}) with T the numeric type of `type`; bool is invalid.
template <typename Fn>
cudaError_t byNumericType(ElementType type, Fn&& fn) {
  switch (type) {
    case ElementType::kFloat32:
      return fn(Tag<float>{});
    case ElementType::kFloat16:
      return fn(Tag<__half>{});
    case ElementType::kBFloat16:
      return fn(Tag<__nv_bfloat16>{});
    case ElementType::kFloat64:
      return fn(Tag<double>{});
    case ElementType::kInt64:
      return fn(Tag<int64_t>{});
    case ElementType::kInt32:
      return fn(Tag<int32_t>{});
    case ElementType::kInt16:
      return fn(Tag<int16_t>{});
    case ElementType::kInt8:
      return fn(Tag<int8_t>{});
    case ElementType::kUInt64:
      return fn(Tag<uint64_t>{});
    case ElementType::kUInt32:
      return fn(Tag<uint32_t>{});
    case ElementType::kUInt16:
      return fn(Tag<uint16_t>{});
    case ElementType::kUInt8:
      return fn(Tag<uint8_t>{});
    case ElementType::kBool:
      return cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

// Calls fn(Tag<T>{}) with T float, __half or __nv_bfloat16; cudaErrorInvalidValue for any other
// type.
template <typename Fn>
cudaError_t byFloatType(ElementType type, Fn&& fn) {
  switch (type) {
    case ElementType::kFloat32:
      return fn(Tag<float>{});
    case ElementType::kFloat16:
      return fn(Tag<__half>{});
    case ElementType::kBFloat16:
      return fn(Tag<__nv_bfloat16>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// Calls fn(U{}) with U the unsigned word of `elementSize` bytes; other sizes are invalid.
template <typename Fn>
cudaError_t bySize(int elementSize, Fn&& fn) {
  switch (elementSize) {
    case 1:
      return fn(uint8_t{});
    case 2:
      return fn(uint16_t{});
    case 4:
      return fn(uint32_t{});
    case 8:
      return fn(uint64_t{});
    default:
      return cudaErrorInvalidValue;
  }
}

template <typename T>
constexpr bool kIsHalf = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <typename T>
constexpr bool kIsReal = kIsHalf<T> || std::is_same_v<T, float> || std::is_same_v<T, double>;
template <typename T>
constexpr bool kIsInteger = std::is_integral_v<T>;  // BoolByte is not
template <typename T>
constexpr bool kIsBool = std::is_same_v<T, BoolByte>;

// float32, float16 and bfloat16 storage to and from float arithmetic.
__device__ __forceinline__ float toFloat(float v) { return v; }
__device__ __forceinline__ float toFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float toFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T fromFloat(float v);
template <>
__device__ __forceinline__ float fromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half fromFloat<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 fromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// The same, as a load from and a store to storage.
__device__ __forceinline__ float load(float value) { return value; }
__device__ __forceinline__ float load(__half value) { return __half2float(value); }
__device__ __forceinline__ float load(__nv_bfloat16 value) { return __bfloat162float(value); }

__device__ __forceinline__ void store(float* at, float value) { *at = value; }
__device__ __forceinline__ void store(__half* at, float value) { *at = __float2half_rn(value); }
__device__ __forceinline__ void store(__nv_bfloat16* at, float value) {
  *at = __float2bfloat16_rn(value);
}

}  // namespace kiln::cuda::device
