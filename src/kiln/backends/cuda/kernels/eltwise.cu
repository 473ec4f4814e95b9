// kiln's elementwise kernels (eltwise.h). One thread per output element in grid-stride loops of
// 256-thread blocks; on the flat walk a thread moves four elements at a time as one aligned pack
// (a float4 for 4-byte types) where the launch allows it, the remainder one by one. Each op is a
// small functor over the compute type (float for float32, float16 and bfloat16, double for
// float64, the integer itself for integers, bool for bool), instantiated only for the element
// types the reference kernel accepts; results go back to the element type as the reference's
// `store` does (integers wrap, floating to integer truncates and saturates, to half rounds once).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kiln/backends/cuda/kernels/device_types.cuh"
#include "kiln/backends/cuda/kernels/eltwise.h"
#include "kiln/backends/cuda/kernels/fused_ops.cuh"

namespace kiln::cuda {

int elementBytes(ElementType type) {
  switch (type) {
    case ElementType::kFloat64:
    case ElementType::kInt64:
    case ElementType::kUInt64:
      return 8;
    case ElementType::kFloat32:
    case ElementType::kInt32:
    case ElementType::kUInt32:
      return 4;
    case ElementType::kFloat16:
    case ElementType::kBFloat16:
    case ElementType::kInt16:
    case ElementType::kUInt16:
      return 2;
    case ElementType::kInt8:
    case ElementType::kUInt8:
    case ElementType::kBool:
      return 1;
  }
  return 0;
}

BroadcastGeometry flatGeometry(int64_t count, int operands) {
  BroadcastGeometry geometry;
  geometry.count = count;
  geometry.operands = operands;
  geometry.flat = true;
  geometry.rank = 1;
  geometry.dims[0] = count;
  for (int k = 0; k < operands && k < kMaxBroadcastOperands; ++k) geometry.strides[k][0] = 1;
  geometry.narrowIndex = count < (int64_t{1} << 30);
  return geometry;
}

namespace {

// Enough 256-thread blocks to fill an H200 (132 SMs, eight each) about four times over; the
// grid-stride loops cover the rest.
constexpr int64_t kMaxBlocks = 4096;
constexpr int kPack = 4;  // elements a thread moves at once on the vector path

unsigned blocksFor(int64_t work, int threads) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((work + threads - 1) / threads, kMaxBlocks)));
}

// A launch's block: a whole number of warps, at most 1024 threads.
bool validBlock(int threads) { return threads >= 32 && threads <= 1024 && threads % 32 == 0; }

// --- Element types -------------------------------------------------------------------------------

using device::BoolByte;
using device::kIsBool;
using device::kIsHalf;
using device::kIsInteger;
using device::kIsReal;
using device::Tag;

// The families an op accepts, as a bit set.
constexpr unsigned kReal = 1, kSigned = 2, kUnsigned = 4, kBool = 8;
constexpr unsigned kInts = kSigned | kUnsigned;
constexpr unsigned kNumbers = kReal | kInts;
constexpr unsigned kAny = kNumbers | kBool;

template <typename T>
constexpr unsigned familyOf() {
  if constexpr (kIsReal<T>) {
    return kReal;
  } else if constexpr (kIsBool<T>) {
    return kBool;
  } else if constexpr (std::is_signed_v<T>) {
    return kSigned;
  } else {
    return kUnsigned;
  }
}

template <typename T>
constexpr bool accepts(unsigned families) {
  return (familyOf<T>() & families) != 0;
}

// The type an element is computed in.
template <typename T>
struct ComputeOf {
  using type = T;
};
template <>
struct ComputeOf<__half> {
  using type = float;
};
template <>
struct ComputeOf<__nv_bfloat16> {
  using type = float;
};
template <>
struct ComputeOf<BoolByte> {
  using type = bool;
};
template <typename T>
using Compute = typename ComputeOf<T>::type;

template <typename T>
__device__ __forceinline__ Compute<T> load(T value) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(value);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(value);
  } else if constexpr (kIsBool<T>) {
    return value.bits != 0;
  } else {
    return value;
  }
}

// Floating -> integer truncates toward zero, saturating, NaN to 0 (the reference's
// truncateToInteger); the double holds every floating input exactly.
template <typename T>
__device__ __forceinline__ T truncateToInteger(double value) {
  if (isnan(value)) return T{0};
  if (value <= static_cast<double>(std::numeric_limits<T>::lowest())) {
    return std::numeric_limits<T>::lowest();
  }
  if (value >= static_cast<double>(std::numeric_limits<T>::max())) {
    return std::numeric_limits<T>::max();
  }
  return static_cast<T>(value);
}

// A computed value to element type T, as the reference's store: to half rounds once (from float
// or double), to bool tests for nonzero (NaN is true), floating to integer truncates and
// saturates, integer to integer wraps.
template <typename T, typename V>
__device__ __forceinline__ T storeAs(V value) {
  if constexpr (std::is_same_v<T, __half>) {
    if constexpr (std::is_same_v<V, float>) {
      return __float2half_rn(value);
    } else if constexpr (std::is_same_v<V, bool>) {
      return __float2half_rn(value ? 1.0f : 0.0f);
    } else {
      return __double2half(static_cast<double>(value));
    }
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    if constexpr (std::is_same_v<V, float>) {
      return __float2bfloat16_rn(value);
    } else if constexpr (std::is_same_v<V, bool>) {
      return __float2bfloat16_rn(value ? 1.0f : 0.0f);
    } else {
      return __double2bfloat16(static_cast<double>(value));
    }
  } else if constexpr (kIsBool<T>) {
    return BoolByte{static_cast<uint8_t>(value != V{} ? 1 : 0)};
  } else if constexpr (kIsInteger<T> && std::is_floating_point_v<V>) {
    return truncateToInteger<T>(static_cast<double>(value));
  } else {
    return static_cast<T>(value);
  }
}

// Four elements, aligned so that they move as one load or store.
template <typename T>
struct alignas(sizeof(T) * kPack) Pack {
  T v[kPack];
};

template <typename T>
bool packAligned(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % (sizeof(T) * kPack) == 0;
}

// --- Math ----------------------------------------------------------------------------------------

#define KILN_MATH_OVERLOADS(name)                                             \
  __device__ __forceinline__ float name##Of(float x) { return ::name##f(x); } \
  __device__ __forceinline__ double name##Of(double x) { return ::name(x); }

KILN_MATH_OVERLOADS(exp)
KILN_MATH_OVERLOADS(expm1)
KILN_MATH_OVERLOADS(log)
KILN_MATH_OVERLOADS(log1p)
KILN_MATH_OVERLOADS(sqrt)
KILN_MATH_OVERLOADS(tanh)
KILN_MATH_OVERLOADS(erf)
KILN_MATH_OVERLOADS(erfc)
KILN_MATH_OVERLOADS(sin)
KILN_MATH_OVERLOADS(cos)
KILN_MATH_OVERLOADS(tan)
KILN_MATH_OVERLOADS(asin)
KILN_MATH_OVERLOADS(acos)
KILN_MATH_OVERLOADS(atan)
KILN_MATH_OVERLOADS(sinh)
KILN_MATH_OVERLOADS(cosh)
KILN_MATH_OVERLOADS(asinh)
KILN_MATH_OVERLOADS(acosh)
KILN_MATH_OVERLOADS(atanh)
KILN_MATH_OVERLOADS(floor)
KILN_MATH_OVERLOADS(ceil)
KILN_MATH_OVERLOADS(rint)
KILN_MATH_OVERLOADS(fabs)
#undef KILN_MATH_OVERLOADS

__device__ __forceinline__ float fmodOf(float x, float y) { return ::fmodf(x, y); }
__device__ __forceinline__ double fmodOf(double x, double y) { return ::fmod(x, y); }

// std::min and std::max exactly (a NaN second operand loses, a NaN first one wins), as the
// reference's activations use them.
template <typename C>
__device__ __forceinline__ C stdMin(C a, C b) {
  return b < a ? b : a;
}
template <typename C>
__device__ __forceinline__ C stdMax(C a, C b) {
  return a < b ? b : a;
}

// HardSigmoid's clamp as the reference writes it, std::max(0, std::min(1, v)): a NaN v gives 1
// (std::min(1, NaN) is its first operand). The NaN is tested for explicitly because ptxas may
// reorder the min/max pair into a clamp (max first), which sends NaN to 0.
template <typename C>
__device__ __forceinline__ C hardSigmoidClamp(C v) {
  if (isnan(v)) return C(1);
  return stdMax(C(0), stdMin(C(1), v));
}

// NaN-propagating, as numpy's minimum and maximum.
template <typename C>
__device__ __forceinline__ C minimum(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (isnan(a) || isnan(b)) return a + b;
  }
  return b < a ? b : a;
}
template <typename C>
__device__ __forceinline__ C maximum(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (isnan(a) || isnan(b)) return a + b;
  }
  return b > a ? b : a;
}

// Integer arithmetic wraps: compute in an unsigned type at least as wide as unsigned int.
template <typename C>
using Wrapping =
    std::conditional_t<(sizeof(C) < sizeof(unsigned)), unsigned, std::make_unsigned_t<C>>;

template <typename C>
__device__ __forceinline__ C wrappingAdd(C a, C b) {
  return static_cast<C>(static_cast<Wrapping<C>>(a) + static_cast<Wrapping<C>>(b));
}
template <typename C>
__device__ __forceinline__ C wrappingSub(C a, C b) {
  return static_cast<C>(static_cast<Wrapping<C>>(a) - static_cast<Wrapping<C>>(b));
}
template <typename C>
__device__ __forceinline__ C wrappingMul(C a, C b) {
  return static_cast<C>(static_cast<Wrapping<C>>(a) * static_cast<Wrapping<C>>(b));
}
template <typename C>
__device__ __forceinline__ C wrappingNegate(C a) {
  return wrappingSub(C{0}, a);
}

template <typename C>
__device__ __forceinline__ C softplus(C x) {
  return x > C(0) ? x + log1pOf(expOf(-x)) : log1pOf(expOf(x));
}

// --- Unary ops -----------------------------------------------------------------------------------

// Each op: kTypes (the families it accepts), kGivesBool, and operator() over the compute type.
// alpha and beta are the attributes eltwise.h lists per op.
struct UnaryParams {
  float alpha = 0;
  float beta = 0;
};

#define KILN_REAL_UNARY(Name, expression)                      \
  struct Name : UnaryParams {                                  \
    static constexpr unsigned kTypes = kReal;                  \
    static constexpr bool kGivesBool = false;                  \
    template <typename C>                                      \
    __device__ __forceinline__ C operator()(C x) const {       \
      [[maybe_unused]] const C alphaC = static_cast<C>(alpha); \
      [[maybe_unused]] const C betaC = static_cast<C>(beta);   \
      return expression;                                       \
    }                                                          \
  };

KILN_REAL_UNARY(AcosOp, acosOf(x))
KILN_REAL_UNARY(AcoshOp, acoshOf(x))
KILN_REAL_UNARY(AsinOp, asinOf(x))
KILN_REAL_UNARY(AsinhOp, asinhOf(x))
KILN_REAL_UNARY(AtanOp, atanOf(x))
KILN_REAL_UNARY(AtanhOp, atanhOf(x))
KILN_REAL_UNARY(CeilOp, ceilOf(x))
KILN_REAL_UNARY(CeluOp, stdMax(C(0), x) + stdMin(C(0), alphaC* expm1Of(x / alphaC)))
KILN_REAL_UNARY(CosOp, cosOf(x))
KILN_REAL_UNARY(CoshOp, coshOf(x))
KILN_REAL_UNARY(EluOp, x < C(0) ? alphaC * expm1Of(x) : x)
KILN_REAL_UNARY(ExpOp, expOf(x))
KILN_REAL_UNARY(FloorOp, floorOf(x))
// 0.5 x (1 + erf(x / sqrt 2)) written with erfc, which keeps its precision for negative x.
KILN_REAL_UNARY(GeluOp, C(0.5) * x * erfcOf(-x * C(0.70710678118654752440)))
// 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), which keeps its precision for negative x.
KILN_REAL_UNARY(GeluTanhOp, x / (C(1) + expOf(C(-2) * C(0.79788456080286535588) *
                                              (x + C(0.044715) * x * x * x))))
KILN_REAL_UNARY(HardSigmoidOp, hardSigmoidClamp(alphaC* x + betaC))
KILN_REAL_UNARY(HardSwishOp, x* stdMax(C(0), stdMin(C(1), x / C(6) + C(0.5))))
KILN_REAL_UNARY(LeakyReluOp, x < C(0) ? alphaC * x : x)
KILN_REAL_UNARY(LogOp, logOf(x))
KILN_REAL_UNARY(MishOp, x* tanhOf(softplus(x)))
KILN_REAL_UNARY(ReciprocalOp, C(1) / x)
KILN_REAL_UNARY(RoundOp, rintOf(x))
KILN_REAL_UNARY(SeluOp, x > C(0) ? betaC * x : betaC * (alphaC * expm1Of(x)))
KILN_REAL_UNARY(SigmoidOp, C(1) / (C(1) + expOf(-x)))
KILN_REAL_UNARY(SinOp, sinOf(x))
KILN_REAL_UNARY(SinhOp, sinhOf(x))
KILN_REAL_UNARY(SoftplusOp, softplus(x))
KILN_REAL_UNARY(SoftsignOp, x / (C(1) + fabsOf(x)))
KILN_REAL_UNARY(SqrtOp, sqrtOf(x))
KILN_REAL_UNARY(TanOp, tanOf(x))
KILN_REAL_UNARY(TanhOp, tanhOf(x))
KILN_REAL_UNARY(ThresholdedReluOp, x > alphaC ? x : C(0))
#undef KILN_REAL_UNARY

struct AbsOp : UnaryParams {
  static constexpr unsigned kTypes = kNumbers;
  static constexpr bool kGivesBool = false;
  template <typename C>
  __device__ __forceinline__ C operator()(C x) const {
    if constexpr (std::is_floating_point_v<C>) {
      return fabsOf(x);
    } else if constexpr (std::is_signed_v<C>) {
      return x < 0 ? wrappingNegate(x) : x;
    } else {
      return x;
    }
  }
};

struct NegOp : UnaryParams {
  static constexpr unsigned kTypes = kReal | kSigned;
  static constexpr bool kGivesBool = false;
  template <typename C>
  __device__ __forceinline__ C operator()(C x) const {
    if constexpr (std::is_floating_point_v<C>) {
      return -x;
    } else {
      return wrappingNegate(x);
    }
  }
};

struct ReluOp : UnaryParams {
  static constexpr unsigned kTypes = kReal | kSigned;
  static constexpr bool kGivesBool = false;
  template <typename C>
  __device__ __forceinline__ C operator()(C x) const {
    return x < C(0) ? C(0) : x;
  }
};

struct SignOp : UnaryParams {
  static constexpr unsigned kTypes = kNumbers;
  static constexpr bool kGivesBool = false;
  template <typename C>
  __device__ __forceinline__ C operator()(C x) const {
    if constexpr (std::is_floating_point_v<C>) {
      if (isnan(x)) return x;
    }
    if constexpr (std::is_unsigned_v<C>) {
      return static_cast<C>(x != C(0) ? 1 : 0);
    } else {
      return static_cast<C>(static_cast<int>(x > C(0)) - static_cast<int>(x < C(0)));
    }
  }
};

struct BitwiseNotOp : UnaryParams {
  static constexpr unsigned kTypes = kInts;
  static constexpr bool kGivesBool = false;
  template <typename C>
  __device__ __forceinline__ C operator()(C x) const {
    return static_cast<C>(~x);
  }
};

struct NotOp : UnaryParams {
  static constexpr unsigned kTypes = kBool;
  static constexpr bool kGivesBool = true;
  __device__ __forceinline__ bool operator()(bool x) const { return !x; }
};

// Erf of an integer is computed in double (and truncated back), as the reference does.
struct ErfOp : UnaryParams {
  static constexpr unsigned kTypes = kNumbers;
  static constexpr bool kGivesBool = false;
  template <typename C>
  __device__ __forceinline__ auto operator()(C x) const {
    if constexpr (std::is_floating_point_v<C>) {
      return erfOf(x);
    } else {
      return ::erf(static_cast<double>(x));
    }
  }
};

// alpha: lambd, beta: bias. Integers are computed in double.
struct ShrinkOp : UnaryParams {
  static constexpr unsigned kTypes = kNumbers;
  static constexpr bool kGivesBool = false;
  template <typename C>
  __device__ __forceinline__ auto operator()(C x) const {
    using R = std::conditional_t<std::is_floating_point_v<C>, C, double>;
    const R v = static_cast<R>(x);
    const R lambd = static_cast<R>(alpha);
    const R bias = static_cast<R>(beta);
    return v < -lambd ? v + bias : v > lambd ? v - bias : R(0);
  }
};

struct IsNaNOp : UnaryParams {
  static constexpr unsigned kTypes = kReal;
  static constexpr bool kGivesBool = true;
  template <typename C>
  __device__ __forceinline__ bool operator()(C x) const {
    return isnan(x);
  }
};

// alpha: detect_negative, beta: detect_positive.
struct IsInfOp : UnaryParams {
  static constexpr unsigned kTypes = kReal;
  static constexpr bool kGivesBool = true;
  template <typename C>
  __device__ __forceinline__ bool operator()(C x) const {
    return isinf(x) && (x > C(0) ? beta != 0 : alpha != 0);
  }
};

// Calls fn(Op{alpha, beta}) for the op's functor.
template <typename Fn>
cudaError_t byUnaryOp(UnaryOp op, float alpha, float beta, Fn&& fn) {
  auto with = [&](auto functor) {
    functor.alpha = alpha;
    functor.beta = beta;
    return fn(functor);
  };
  switch (op) {
    case UnaryOp::kAbs:
      return with(AbsOp{});
    case UnaryOp::kAcos:
      return with(AcosOp{});
    case UnaryOp::kAcosh:
      return with(AcoshOp{});
    case UnaryOp::kAsin:
      return with(AsinOp{});
    case UnaryOp::kAsinh:
      return with(AsinhOp{});
    case UnaryOp::kAtan:
      return with(AtanOp{});
    case UnaryOp::kAtanh:
      return with(AtanhOp{});
    case UnaryOp::kBitwiseNot:
      return with(BitwiseNotOp{});
    case UnaryOp::kCeil:
      return with(CeilOp{});
    case UnaryOp::kCelu:
      return with(CeluOp{});
    case UnaryOp::kCos:
      return with(CosOp{});
    case UnaryOp::kCosh:
      return with(CoshOp{});
    case UnaryOp::kElu:
      return with(EluOp{});
    case UnaryOp::kErf:
      return with(ErfOp{});
    case UnaryOp::kExp:
      return with(ExpOp{});
    case UnaryOp::kFloor:
      return with(FloorOp{});
    case UnaryOp::kGelu:
      return with(GeluOp{});
    case UnaryOp::kGeluTanh:
      return with(GeluTanhOp{});
    case UnaryOp::kHardSigmoid:
      return with(HardSigmoidOp{});
    case UnaryOp::kHardSwish:
      return with(HardSwishOp{});
    case UnaryOp::kIsInf:
      return with(IsInfOp{});
    case UnaryOp::kIsNaN:
      return with(IsNaNOp{});
    case UnaryOp::kLeakyRelu:
      return with(LeakyReluOp{});
    case UnaryOp::kLog:
      return with(LogOp{});
    case UnaryOp::kMish:
      return with(MishOp{});
    case UnaryOp::kNeg:
      return with(NegOp{});
    case UnaryOp::kNot:
      return with(NotOp{});
    case UnaryOp::kReciprocal:
      return with(ReciprocalOp{});
    case UnaryOp::kRelu:
      return with(ReluOp{});
    case UnaryOp::kRound:
      return with(RoundOp{});
    case UnaryOp::kSelu:
      return with(SeluOp{});
    case UnaryOp::kShrink:
      return with(ShrinkOp{});
    case UnaryOp::kSigmoid:
      return with(SigmoidOp{});
    case UnaryOp::kSign:
      return with(SignOp{});
    case UnaryOp::kSin:
      return with(SinOp{});
    case UnaryOp::kSinh:
      return with(SinhOp{});
    case UnaryOp::kSoftplus:
      return with(SoftplusOp{});
    case UnaryOp::kSoftsign:
      return with(SoftsignOp{});
    case UnaryOp::kSqrt:
      return with(SqrtOp{});
    case UnaryOp::kTan:
      return with(TanOp{});
    case UnaryOp::kTanh:
      return with(TanhOp{});
    case UnaryOp::kThresholdedRelu:
      return with(ThresholdedReluOp{});
  }
  return cudaErrorInvalidValue;
}

// --- The flat map: y[i] = fn(x[i]) ---------------------------------------------------------------

// fn maps an In element to an Out element. With `vector`, both pointers are pack-aligned.
template <typename In, typename Out, typename Fn>
__global__ void mapKernel(int64_t count, bool vector, const In* x, Out* y, Fn fn) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if (vector) {
    const int64_t packs = count / kPack;
    const auto* xp = reinterpret_cast<const Pack<In>*>(x);
    auto* yp = reinterpret_cast<Pack<Out>*>(y);
    for (int64_t p = first; p < packs; p += stride) {
      const Pack<In> in = xp[p];
      Pack<Out> out;
#pragma unroll
      for (int k = 0; k < kPack; ++k) out.v[k] = fn(in.v[k]);
      yp[p] = out;
    }
    done = packs * kPack;
  }
  for (int64_t i = done + first; i < count; i += stride) y[i] = fn(x[i]);
}

template <typename In, typename Out, typename Fn>
cudaError_t launchMap(int64_t count, int vectorWidth, int threads, const void* x, void* y, Fn fn,
                      cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  if (!validBlock(threads)) return cudaErrorInvalidValue;
  const bool vector =
      vectorWidth == kPack && count >= kPack && packAligned<In>(x) && packAligned<Out>(y);
  const int64_t work = vector ? count / kPack + count % kPack : count;
  mapKernel<In, Out, Fn><<<blocksFor(work, threads), threads, 0, stream>>>(
      count, vector, static_cast<const In*>(x), static_cast<Out*>(y), fn);
  return cudaGetLastError();
}

template <typename T, typename Op>
struct UnaryApply {
  using Out = std::conditional_t<Op::kGivesBool, BoolByte, T>;
  Op op;
  __device__ __forceinline__ Out operator()(T x) const { return storeAs<Out>(op(load(x))); }
};

// --- Broadcast walks -----------------------------------------------------------------------------

// Operand offsets at output element i on the strided walk: i's coordinates over the merged
// dimensions, last dimension fastest, times each operand's strides.
template <int N, typename Index>
__device__ __forceinline__ void stridedOffsets(const BroadcastGeometry& g, Index i,
                                               Index (&offsets)[N]) {
#pragma unroll
  for (int k = 0; k < N; ++k) offsets[k] = 0;
#pragma unroll
  for (int d = kMaxBroadcastRank - 1; d >= 0; --d) {
    if (d < g.rank) {
      const Index dim = static_cast<Index>(g.dims[d]);
      const Index coordinate = i % dim;
      i /= dim;
#pragma unroll
      for (int k = 0; k < N; ++k) offsets[k] += coordinate * static_cast<Index>(g.strides[k][d]);
    }
  }
}

// Calls at(i, offsets) for every output element i: the flat walk, or the strided one in 32- or
// 64-bit indices.
template <int N, typename At>
__device__ __forceinline__ void forEachElement(const BroadcastGeometry& g, int64_t begin, At at) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x + begin;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (g.flat) {
    for (int64_t i = first; i < g.count; i += stride) {
      int64_t offsets[N];
#pragma unroll
      for (int k = 0; k < N; ++k) offsets[k] = g.scalar[k] ? 0 : i;
      at(i, offsets);
    }
  } else if (g.narrowIndex) {
    for (int64_t i = first; i < g.count; i += stride) {
      uint32_t narrow[N];
      stridedOffsets<N, uint32_t>(g, static_cast<uint32_t>(i), narrow);
      int64_t offsets[N];
#pragma unroll
      for (int k = 0; k < N; ++k) offsets[k] = narrow[k];
      at(i, offsets);
    }
  } else {
    for (int64_t i = first; i < g.count; i += stride) {
      int64_t offsets[N];
      stridedOffsets<N, int64_t>(g, i, offsets);
      at(i, offsets);
    }
  }
}

// A pack of four elements of operand `x` at pack p: loaded, or the scalar repeated.
template <typename T>
__device__ __forceinline__ Pack<T> packAt(const T* x, bool scalar, int64_t p) {
  if (!scalar) return reinterpret_cast<const Pack<T>*>(x)[p];
  Pack<T> pack;
  const T value = x[0];
#pragma unroll
  for (int k = 0; k < kPack; ++k) pack.v[k] = value;
  return pack;
}

// Whether a flat launch can take the vector path: every full-size operand and the output are
// pack-aligned.
template <typename T>
bool flatVectorOk(const BroadcastGeometry& g, int vectorWidth, const void* const* operands,
                  int count, const void* out, int outBytes) {
  if (!g.flat || vectorWidth != kPack || g.count < kPack) return false;
  for (int k = 0; k < count; ++k) {
    if (!g.scalar[k] && !packAligned<T>(operands[k])) return false;
  }
  return reinterpret_cast<uintptr_t>(out) % (static_cast<uintptr_t>(outBytes) * kPack) == 0;
}

int64_t flatWork(const BroadcastGeometry& g, bool vector) {
  return vector ? g.count / kPack + g.count % kPack : g.count;
}

// --- Binary ops ----------------------------------------------------------------------------------

#define KILN_BINARY_OP(Name, types, givesBool, body)                \
  struct Name {                                                     \
    static constexpr unsigned kTypes = types;                       \
    static constexpr bool kGivesBool = givesBool;                   \
    template <typename C>                                           \
    __device__ __forceinline__ auto operator()(C a, C b) const body \
  };

KILN_BINARY_OP(AddOp, kNumbers, false, {
  if constexpr (std::is_floating_point_v<C>) {
    return a + b;
  } else {
    return wrappingAdd(a, b);
  }
})
KILN_BINARY_OP(SubOp, kNumbers, false, {
  if constexpr (std::is_floating_point_v<C>) {
    return a - b;
  } else {
    return wrappingSub(a, b);
  }
})
KILN_BINARY_OP(MulOp, kNumbers, false, {
  if constexpr (std::is_floating_point_v<C>) {
    return a * b;
  } else {
    return wrappingMul(a, b);
  }
})
// Integer division truncates; lowest / -1 wraps; by zero gives 0 (the reference refuses it).
KILN_BINARY_OP(DivOp, kNumbers, false, {
  if constexpr (std::is_floating_point_v<C>) {
    return a / b;
  } else {
    if (b == C(0)) return C(0);
    if constexpr (std::is_signed_v<C>) {
      if (b == C(-1)) return wrappingNegate(a);
    }
    return static_cast<C>(a / b);
  }
})
// The dividend's sign (C's fmod and %); an integer modulo zero gives 0.
KILN_BINARY_OP(FmodOp, kNumbers, false, {
  if constexpr (std::is_floating_point_v<C>) {
    return fmodOf(a, b);
  } else {
    if (b == C(0)) return C(0);
    if constexpr (std::is_signed_v<C>) {
      if (b == C(-1)) return C(0);
    }
    return static_cast<C>(a % b);
  }
})
// Integers only: the divisor's sign (Python's %).
KILN_BINARY_OP(ModOp, kInts, false, {
  if (b == C(0)) return C(0);
  if constexpr (std::is_signed_v<C>) {
    if (b == C(-1)) return C(0);
    C r = static_cast<C>(a % b);
    if (r != 0 && ((r < 0) != (b < 0))) r = static_cast<C>(r + b);
    return r;
  } else {
    return static_cast<C>(a % b);
  }
})
KILN_BINARY_OP(PReluOp, kNumbers, false, {
  if constexpr (std::is_floating_point_v<C>) {
    return a < C(0) ? a * b : a;
  } else if constexpr (std::is_signed_v<C>) {
    return a < C(0) ? wrappingMul(a, b) : a;
  } else {
    (void)b;
    return a;  // an unsigned x is never negative
  }
})
KILN_BINARY_OP(MaxOp, kNumbers, false, { return maximum(a, b); })
KILN_BINARY_OP(MinOp, kNumbers, false, { return minimum(a, b); })
KILN_BINARY_OP(EqualOp, kAny, true, { return a == b; })
KILN_BINARY_OP(LessOp, kNumbers, true, { return a < b; })
KILN_BINARY_OP(LessOrEqualOp, kNumbers, true, { return a <= b; })
KILN_BINARY_OP(GreaterOp, kNumbers, true, { return a > b; })
KILN_BINARY_OP(GreaterOrEqualOp, kNumbers, true, { return a >= b; })
KILN_BINARY_OP(AndOp, kBool, true, { return a && b; })
KILN_BINARY_OP(OrOp, kBool, true, { return a || b; })
KILN_BINARY_OP(XorOp, kBool, true, { return a != b; })
KILN_BINARY_OP(BitwiseAndOp, kInts, false, { return static_cast<C>(a & b); })
KILN_BINARY_OP(BitwiseOrOp, kInts, false, { return static_cast<C>(a | b); })
KILN_BINARY_OP(BitwiseXorOp, kInts, false, { return static_cast<C>(a ^ b); })
KILN_BINARY_OP(ShiftLeftOp, kUnsigned, false, {
  if (b >= static_cast<C>(std::numeric_limits<C>::digits)) return C(0);
  return static_cast<C>(static_cast<Wrapping<C>>(a) << b);
})
KILN_BINARY_OP(ShiftRightOp, kUnsigned, false, {
  if (b >= static_cast<C>(std::numeric_limits<C>::digits)) return C(0);
  return static_cast<C>(a >> b);
})
#undef KILN_BINARY_OP

template <typename Fn>
cudaError_t byBinaryOp(BinaryOp op, Fn&& fn) {
  switch (op) {
    case BinaryOp::kAdd:
      return fn(AddOp{});
    case BinaryOp::kSub:
      return fn(SubOp{});
    case BinaryOp::kMul:
      return fn(MulOp{});
    case BinaryOp::kDiv:
      return fn(DivOp{});
    case BinaryOp::kMod:
      return fn(ModOp{});
    case BinaryOp::kFmod:
      return fn(FmodOp{});
    case BinaryOp::kPRelu:
      return fn(PReluOp{});
    case BinaryOp::kMax:
      return fn(MaxOp{});
    case BinaryOp::kMin:
      return fn(MinOp{});
    case BinaryOp::kEqual:
      return fn(EqualOp{});
    case BinaryOp::kLess:
      return fn(LessOp{});
    case BinaryOp::kLessOrEqual:
      return fn(LessOrEqualOp{});
    case BinaryOp::kGreater:
      return fn(GreaterOp{});
    case BinaryOp::kGreaterOrEqual:
      return fn(GreaterOrEqualOp{});
    case BinaryOp::kAnd:
      return fn(AndOp{});
    case BinaryOp::kOr:
      return fn(OrOp{});
    case BinaryOp::kXor:
      return fn(XorOp{});
    case BinaryOp::kBitwiseAnd:
      return fn(BitwiseAndOp{});
    case BinaryOp::kBitwiseOr:
      return fn(BitwiseOrOp{});
    case BinaryOp::kBitwiseXor:
      return fn(BitwiseXorOp{});
    case BinaryOp::kShiftLeft:
      return fn(ShiftLeftOp{});
    case BinaryOp::kShiftRight:
      return fn(ShiftRightOp{});
  }
  return cudaErrorInvalidValue;
}

template <typename T, typename Op>
struct BinaryApply {
  using Out = std::conditional_t<Op::kGivesBool, BoolByte, T>;
  Op op;
  __device__ __forceinline__ Out operator()(T a, T b) const {
    return storeAs<Out>(op(load(a), load(b)));
  }
};

template <typename T, typename Apply>
__global__ void binaryKernel(BroadcastGeometry g, bool vector, const T* a, const T* b,
                             typename Apply::Out* y, Apply apply) {
  using Out = typename Apply::Out;
  int64_t done = 0;
  if (vector) {
    const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t packs = g.count / kPack;
    auto* yp = reinterpret_cast<Pack<Out>*>(y);
    for (int64_t p = first; p < packs; p += stride) {
      const Pack<T> pa = packAt(a, g.scalar[0], p);
      const Pack<T> pb = packAt(b, g.scalar[1], p);
      Pack<Out> out;
#pragma unroll
      for (int k = 0; k < kPack; ++k) out.v[k] = apply(pa.v[k], pb.v[k]);
      yp[p] = out;
    }
    done = packs * kPack;
  }
  forEachElement<2>(g, done,
                    [&](int64_t i, const int64_t(&at)[2]) { y[i] = apply(a[at[0]], b[at[1]]); });
}

// --- Pow -----------------------------------------------------------------------------------------

enum class PowMode : int {
  kInteger,  // integer ^ integer, wrapping
  kFloat,    // float32/float16/bfloat16 ^ the same: powf
  kDouble,   // anything else: pow in double
};

// The exponent at `offset` as a double, or as an integer (its sign and two's-complement bits).
__device__ __forceinline__ double exponentAsDouble(const void* b, int64_t offset,
                                                   ElementType type) {
  switch (type) {
    case ElementType::kFloat32:
      return static_cast<const float*>(b)[offset];
    case ElementType::kFloat16:
      return __half2float(static_cast<const __half*>(b)[offset]);
    case ElementType::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(b)[offset]);
    case ElementType::kFloat64:
      return static_cast<const double*>(b)[offset];
    case ElementType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(b)[offset]);
    case ElementType::kInt32:
      return static_cast<const int32_t*>(b)[offset];
    case ElementType::kInt16:
      return static_cast<const int16_t*>(b)[offset];
    case ElementType::kInt8:
      return static_cast<const int8_t*>(b)[offset];
    case ElementType::kUInt64:
      return static_cast<double>(static_cast<const uint64_t*>(b)[offset]);
    case ElementType::kUInt32:
      return static_cast<const uint32_t*>(b)[offset];
    case ElementType::kUInt16:
      return static_cast<const uint16_t*>(b)[offset];
    case ElementType::kUInt8:
      return static_cast<const uint8_t*>(b)[offset];
    default:
      return 0;
  }
}

struct IntegerExponent {
  bool negative;
  uint64_t bits;
};

__device__ __forceinline__ IntegerExponent exponentAsInteger(const void* b, int64_t offset,
                                                             ElementType type) {
  auto signedValue = [](int64_t v) { return IntegerExponent{v < 0, static_cast<uint64_t>(v)}; };
  switch (type) {
    case ElementType::kInt64:
      return signedValue(static_cast<const int64_t*>(b)[offset]);
    case ElementType::kInt32:
      return signedValue(static_cast<const int32_t*>(b)[offset]);
    case ElementType::kInt16:
      return signedValue(static_cast<const int16_t*>(b)[offset]);
    case ElementType::kInt8:
      return signedValue(static_cast<const int8_t*>(b)[offset]);
    case ElementType::kUInt64:
      return {false, static_cast<const uint64_t*>(b)[offset]};
    case ElementType::kUInt32:
      return {false, static_cast<const uint32_t*>(b)[offset]};
    case ElementType::kUInt16:
      return {false, static_cast<const uint16_t*>(b)[offset]};
    case ElementType::kUInt8:
      return {false, static_cast<const uint8_t*>(b)[offset]};
    default:
      return {false, 0};
  }
}

// base^exponent by repeated squaring, wrapping; a negative exponent gives what truncating the
// real power gives (the reference's integerPower).
template <typename C>
__device__ __forceinline__ C integerPower(C base, IntegerExponent exponent) {
  if (exponent.negative) {
    if (base == C(1)) return C(1);
    if constexpr (std::is_signed_v<C>) {
      if (base == C(-1)) return (exponent.bits & 1u) == 0 ? C(1) : C(-1);
    }
    return C(0);
  }
  C result = 1;
  uint64_t remaining = exponent.bits;
  while (remaining > 0) {
    if (remaining & 1u) result = wrappingMul(result, base);
    base = wrappingMul(base, base);
    remaining >>= 1;
  }
  return result;
}

// CUDA's pow is within two ulps of the exact power, the host's (glibc, which the reference
// calls) within about half of one: an exact integer power such as 9^0.5 can come out here just
// below the integer (2.9999999999999996) and truncate to one less than the reference's 3. Before
// an integer output truncates it, a power within two to four ulps of an integer is taken as
// that integer. Only below 2^31: further up a few ulps are a sizeable fraction, and a power that
// merely lies close to an integer would be moved across it.
__device__ __forceinline__ double snapToInteger(double power) {
  constexpr double kLimit = 2147483648.0;             // 2^31
  constexpr double kUlps = 1.0 / 2251799813685248.0;  // 2^-51 of the integer: 2 to 4 ulps
  const double nearest = ::rint(power);
  if (::fabs(nearest) >= kLimit || ::fabs(power - nearest) > ::fabs(nearest) * kUlps) return power;
  return nearest;
}

template <typename T>
__global__ void powKernel(BroadcastGeometry g, PowMode mode, ElementType exponentType, const T* a,
                          const void* b, T* y) {
  forEachElement<2>(g, 0, [&](int64_t i, const int64_t(&at)[2]) {
    const Compute<T> base = load(a[at[0]]);
    if constexpr (kIsInteger<T>) {
      if (mode == PowMode::kInteger) {
        y[i] = integerPower(base, exponentAsInteger(b, at[1], exponentType));
        return;
      }
    }
    if constexpr (std::is_same_v<Compute<T>, float>) {
      if (mode == PowMode::kFloat) {
        y[i] =
            storeAs<T>(::powf(base, static_cast<float>(exponentAsDouble(b, at[1], exponentType))));
        return;
      }
    }
    const double power = ::pow(static_cast<double>(base), exponentAsDouble(b, at[1], exponentType));
    if constexpr (kIsInteger<T>) {
      y[i] = storeAs<T>(snapToInteger(power));
    } else {
      y[i] = storeAs<T>(power);
    }
  });
}

bool isFloatLike(ElementType type) {
  return type == ElementType::kFloat32 || type == ElementType::kFloat16 ||
         type == ElementType::kBFloat16;
}

bool isReal(ElementType type) { return isFloatLike(type) || type == ElementType::kFloat64; }

// --- Where, variadic -----------------------------------------------------------------------------

template <typename U>
__global__ void whereKernel(BroadcastGeometry g, const uint8_t* condition, const U* x, const U* y,
                            U* out) {
  forEachElement<3>(g, 0, [&](int64_t i, const int64_t(&at)[3]) {
    const uint8_t chosen = condition[at[0]];
    const U whenTrue = x[at[1]];
    const U whenFalse = y[at[2]];
    out[i] = chosen ? whenTrue : whenFalse;
  });
}

struct VariadicInputs {
  const void* pointers[kMaxBroadcastOperands];
};

// Floating sums accumulate in double; extrema compare in the compute type.
template <typename T>
__global__ void variadicKernel(BroadcastGeometry g, VariadicOp op, VariadicInputs inputs, T* y) {
  using C = Compute<T>;
  using Acc = std::conditional_t<kIsReal<T>, double, C>;
  forEachElement<kMaxBroadcastOperands>(
      g, 0, [&](int64_t i, const int64_t(&at)[kMaxBroadcastOperands]) {
        Acc acc = static_cast<Acc>(load(static_cast<const T*>(inputs.pointers[0])[at[0]]));
#pragma unroll
        for (int k = 1; k < kMaxBroadcastOperands; ++k) {
          if (k >= g.operands) break;
          const Acc v = static_cast<Acc>(load(static_cast<const T*>(inputs.pointers[k])[at[k]]));
          switch (op) {
            case VariadicOp::kSum:
            case VariadicOp::kMean:
              acc = acc + v;
              break;
            case VariadicOp::kMax:
              acc = maximum(acc, v);
              break;
            case VariadicOp::kMin:
              acc = minimum(acc, v);
              break;
          }
        }
        if constexpr (kIsReal<T>) {
          if (op == VariadicOp::kMean) acc /= static_cast<double>(g.operands);
        }
        y[i] = storeAs<T>(acc);
      });
}

// --- Clip ----------------------------------------------------------------------------------------

template <typename T>
struct ClipApply {
  Compute<T> low;
  Compute<T> high;
  __device__ __forceinline__ T operator()(T x) const {
    Compute<T> value = load(x);
    if (value < low) value = low;
    if (value > high) value = high;
    return storeAs<T>(value);
  }
};

template <typename T>
__global__ void clipKernel(int64_t count, bool vector, const T* x, T* y, const T* minPointer,
                           const T* maxPointer, Compute<T> low, Compute<T> high) {
  if (minPointer) low = load(minPointer[0]);
  if (maxPointer) high = load(maxPointer[0]);
  const ClipApply<T> apply{low, high};
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t done = 0;
  if (vector) {
    const int64_t packs = count / kPack;
    const auto* xp = reinterpret_cast<const Pack<T>*>(x);
    auto* yp = reinterpret_cast<Pack<T>*>(y);
    for (int64_t p = first; p < packs; p += stride) {
      const Pack<T> in = xp[p];
      Pack<T> out;
#pragma unroll
      for (int k = 0; k < kPack; ++k) out.v[k] = apply(in.v[k]);
      yp[p] = out;
    }
    done = packs * kPack;
  }
  for (int64_t i = done + first; i < count; i += stride) y[i] = apply(x[i]);
}

// --- Cast ----------------------------------------------------------------------------------------

template <typename From, typename To>
struct CastApply {
  __device__ __forceinline__ To operator()(From x) const { return storeAs<To>(load(x)); }
};

// --- kiln.FusedElementwise -----------------------------------------------------------------------

__device__ __forceinline__ float fusedEvaluate(const FusedInstruction& instruction, float x,
                                               float y) {
  const float alpha = instruction.params[0], beta = instruction.params[1];
  switch (instruction.opcode) {
    case FusedOpcode::kRelu:
      return kiln_relu(x);
    case FusedOpcode::kSigmoid:
      return kiln_sigmoid(x);
    case FusedOpcode::kTanh:
      return kiln_tanh(x);
    case FusedOpcode::kExp:
      return kiln_exp(x);
    case FusedOpcode::kLog:
      return kiln_log(x);
    case FusedOpcode::kSqrt:
      return kiln_sqrt(x);
    case FusedOpcode::kNeg:
      return kiln_neg(x);
    case FusedOpcode::kAbs:
      return kiln_abs(x);
    case FusedOpcode::kErf:
      return kiln_erf(x);
    case FusedOpcode::kReciprocal:
      return kiln_reciprocal(x);
    case FusedOpcode::kHardSigmoid:
      return kiln_hard_sigmoid(x, alpha, beta);
    case FusedOpcode::kHardSwish:
      return kiln_hard_swish(x);
    case FusedOpcode::kLeakyRelu:
      return kiln_leaky_relu(x, alpha);
    case FusedOpcode::kClip:
      return kiln_clip(x, alpha, beta);
    case FusedOpcode::kGelu:
      return kiln_gelu(x);
    case FusedOpcode::kGeluTanh:
      return kiln_gelu_tanh(x);
    case FusedOpcode::kAdd:
      return kiln_add(x, y);
    case FusedOpcode::kSub:
      return kiln_sub(x, y);
    case FusedOpcode::kMul:
      return kiln_mul(x, y);
    case FusedOpcode::kDiv:
      return kiln_div(x, y);
    case FusedOpcode::kPow:
      return kiln_pow(x, y);
    case FusedOpcode::kMax:
      return kiln_max(x, y);
    case FusedOpcode::kMin:
      return kiln_min(x, y);
  }
  return __int_as_float(0x7fc00000);  // NaN
}

// Runs the program on one element's input values.
__device__ __forceinline__ float runProgram(const FusedProgram& program,
                                            const float (&in)[kMaxBroadcastOperands]) {
  float values[kMaxFusedInstructions];
  float result = 0.0f;
  for (int j = 0; j < program.length; ++j) {
    const FusedInstruction& instruction = program.code[j];
    const int8_t first = instruction.operands[0], second = instruction.operands[1];
    const float x = first >= 0 ? in[first] : values[-1 - first];
    const float y =
        instruction.operandCount > 1 ? (second >= 0 ? in[second] : values[-1 - second]) : 0.0f;
    result = fusedEvaluate(instruction, x, y);
    values[j] = result;
  }
  return result;
}

struct FusedInputs {
  const void* pointers[kMaxBroadcastOperands];
};

template <typename T>
__global__ void fusedKernel(BroadcastGeometry g, FusedProgram program, bool vector,
                            FusedInputs inputs, T* y) {
  auto input = [&](int k) { return static_cast<const T*>(inputs.pointers[k]); };
  int64_t done = 0;
  if (vector) {
    const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t packs = g.count / kPack;
    auto* yp = reinterpret_cast<Pack<T>*>(y);
    for (int64_t p = first; p < packs; p += stride) {
      Pack<T> packsIn[kMaxBroadcastOperands];
#pragma unroll
      for (int k = 0; k < kMaxBroadcastOperands; ++k) {
        if (k < g.operands) packsIn[k] = packAt(input(k), g.scalar[k], p);
      }
      Pack<T> out;
#pragma unroll
      for (int e = 0; e < kPack; ++e) {
        float in[kMaxBroadcastOperands];
#pragma unroll
        for (int k = 0; k < kMaxBroadcastOperands; ++k) {
          in[k] = k < g.operands ? load(packsIn[k].v[e]) : 0.0f;
        }
        out.v[e] = storeAs<T>(runProgram(program, in));
      }
      yp[p] = out;
    }
    done = packs * kPack;
  }
  forEachElement<kMaxBroadcastOperands>(g, done,
                                        [&](int64_t i, const int64_t(&at)[kMaxBroadcastOperands]) {
                                          float in[kMaxBroadcastOperands];
#pragma unroll
                                          for (int k = 0; k < kMaxBroadcastOperands; ++k) {
                                            in[k] = k < g.operands ? load(input(k)[at[k]]) : 0.0f;
                                          }
                                          y[i] = storeAs<T>(runProgram(program, in));
                                        });
}

}  // namespace

// --- Launchers -----------------------------------------------------------------------------------

bool unarySupported(UnaryOp op, ElementType type) {
  return byUnaryOp(op, 0, 0, [&](auto functor) {
           using Op = std::decay_t<decltype(functor)>;
           return device::byElementType(type, [](auto tag) {
             using T = typename std::decay_t<decltype(tag)>::type;
             return accepts<T>(Op::kTypes) ? cudaSuccess : cudaErrorInvalidValue;
           });
         }) == cudaSuccess;
}

cudaError_t launchUnary(const UnaryLaunch& launch, cudaStream_t stream) {
  return byUnaryOp(launch.op, launch.alpha, launch.beta, [&](auto functor) {
    using Op = std::decay_t<decltype(functor)>;
    return device::byElementType(launch.type, [&](auto tag) -> cudaError_t {
      using T = typename std::decay_t<decltype(tag)>::type;
      if constexpr (accepts<T>(Op::kTypes)) {
        using Apply = UnaryApply<T, Op>;
        return launchMap<T, typename Apply::Out>(launch.count, launch.vectorWidth,
                                                 launch.blockThreads, launch.x, launch.y,
                                                 Apply{functor}, stream);
      } else {
        return cudaErrorInvalidValue;
      }
    });
  });
}

bool binaryGivesBool(BinaryOp op) {
  bool givesBool = false;
  byBinaryOp(op, [&](auto functor) {
    givesBool = std::decay_t<decltype(functor)>::kGivesBool;
    return cudaSuccess;
  });
  return givesBool;
}

bool binarySupported(BinaryOp op, ElementType type) {
  return byBinaryOp(op, [&](auto functor) {
           using Op = std::decay_t<decltype(functor)>;
           return device::byElementType(type, [](auto tag) {
             using T = typename std::decay_t<decltype(tag)>::type;
             return accepts<T>(Op::kTypes) ? cudaSuccess : cudaErrorInvalidValue;
           });
         }) == cudaSuccess;
}

cudaError_t launchBinary(const BinaryLaunch& launch, cudaStream_t stream) {
  const BroadcastGeometry& g = launch.geometry;
  if (g.operands != 2) return cudaErrorInvalidValue;
  return byBinaryOp(launch.op, [&](auto functor) {
    using Op = std::decay_t<decltype(functor)>;
    return device::byElementType(launch.type, [&](auto tag) -> cudaError_t {
      using T = typename std::decay_t<decltype(tag)>::type;
      if constexpr (accepts<T>(Op::kTypes)) {
        using Apply = BinaryApply<T, Op>;
        using Out = typename Apply::Out;
        if (g.count <= 0) return cudaSuccess;
        const void* operands[2] = {launch.a, launch.b};
        const bool vector = flatVectorOk<T>(g, launch.vectorWidth, operands, 2, launch.y,
                                            static_cast<int>(sizeof(Out)));
        binaryKernel<T, Apply><<<blocksFor(flatWork(g, vector), launch.blockThreads),
                                 launch.blockThreads, 0, stream>>>(
            g, vector, static_cast<const T*>(launch.a), static_cast<const T*>(launch.b),
            static_cast<Out*>(launch.y), Apply{functor});
        return cudaGetLastError();
      } else {
        return cudaErrorInvalidValue;
      }
    });
  });
}

bool powSupported(ElementType base, ElementType exponent) {
  return base != ElementType::kBool && exponent != ElementType::kBool;
}

cudaError_t launchPow(const PowLaunch& launch, cudaStream_t stream) {
  if (!powSupported(launch.base, launch.exponent) || launch.geometry.operands != 2) {
    return cudaErrorInvalidValue;
  }
  PowMode mode = PowMode::kDouble;
  if (!isReal(launch.base) && !isReal(launch.exponent)) mode = PowMode::kInteger;
  if (isFloatLike(launch.base) && isFloatLike(launch.exponent)) mode = PowMode::kFloat;
  if (launch.geometry.count <= 0) return cudaSuccess;
  return device::byElementType(launch.base, [&](auto tag) -> cudaError_t {
    using T = typename std::decay_t<decltype(tag)>::type;
    if constexpr (kIsBool<T>) {
      return cudaErrorInvalidValue;
    } else {
      powKernel<T><<<blocksFor(launch.geometry.count, launch.blockThreads), launch.blockThreads, 0,
                     stream>>>(launch.geometry, mode, launch.exponent,
                               static_cast<const T*>(launch.a), launch.b,
                               static_cast<T*>(launch.y));
      return cudaGetLastError();
    }
  });
}

cudaError_t launchWhere(const WhereLaunch& launch, cudaStream_t stream) {
  const BroadcastGeometry& g = launch.geometry;
  if (g.operands != 3) return cudaErrorInvalidValue;
  if (g.count <= 0) return cudaSuccess;
  auto run = [&](auto word) {
    using U = std::decay_t<decltype(word)>;
    whereKernel<U><<<blocksFor(g.count, launch.blockThreads), launch.blockThreads, 0, stream>>>(
        g, static_cast<const uint8_t*>(launch.condition), static_cast<const U*>(launch.x),
        static_cast<const U*>(launch.y), static_cast<U*>(launch.out));
    return cudaGetLastError();
  };
  switch (launch.elementBytes) {
    case 1:
      return run(uint8_t{});
    case 2:
      return run(uint16_t{});
    case 4:
      return run(uint32_t{});
    case 8:
      return run(uint64_t{});
    default:
      return cudaErrorInvalidValue;
  }
}

bool variadicSupported(VariadicOp op, ElementType type) {
  if (type == ElementType::kBool) return false;
  if (op == VariadicOp::kSum || op == VariadicOp::kMean) return isReal(type);
  return true;
}

cudaError_t launchVariadic(const VariadicLaunch& launch, cudaStream_t stream) {
  const BroadcastGeometry& g = launch.geometry;
  if (!variadicSupported(launch.op, launch.type) || g.operands < 1 ||
      g.operands > kMaxBroadcastOperands) {
    return cudaErrorInvalidValue;
  }
  if (g.count <= 0) return cudaSuccess;
  VariadicInputs inputs{};
  for (int k = 0; k < g.operands; ++k) inputs.pointers[k] = launch.inputs[k];
  return device::byElementType(launch.type, [&](auto tag) -> cudaError_t {
    using T = typename std::decay_t<decltype(tag)>::type;
    if constexpr (kIsBool<T>) {
      return cudaErrorInvalidValue;
    } else {
      variadicKernel<T>
          <<<blocksFor(g.count, launch.blockThreads), launch.blockThreads, 0, stream>>>(
              g, launch.op, inputs, static_cast<T*>(launch.y));
      return cudaGetLastError();
    }
  });
}

bool clipSupported(ElementType type) { return type != ElementType::kBool; }

cudaError_t launchClip(const ClipLaunch& launch, cudaStream_t stream) {
  if (!clipSupported(launch.type)) return cudaErrorInvalidValue;
  if (launch.count <= 0) return cudaSuccess;
  return device::byElementType(launch.type, [&](auto tag) -> cudaError_t {
    using T = typename std::decay_t<decltype(tag)>::type;
    if constexpr (kIsBool<T>) {
      return cudaErrorInvalidValue;
    } else {
      using C = Compute<T>;
      C low, high;
      if constexpr (kIsReal<T>) {
        low = static_cast<C>(launch.floatMin);
        high = static_cast<C>(launch.floatMax);
      } else {
        low = std::numeric_limits<C>::lowest();
        high = std::numeric_limits<C>::max();
      }
      const bool vector = launch.vectorWidth == kPack && launch.count >= kPack &&
                          packAligned<T>(launch.x) && packAligned<T>(launch.y);
      const int64_t work = vector ? launch.count / kPack + launch.count % kPack : launch.count;
      clipKernel<T><<<blocksFor(work, launch.blockThreads), launch.blockThreads, 0, stream>>>(
          launch.count, vector, static_cast<const T*>(launch.x), static_cast<T*>(launch.y),
          static_cast<const T*>(launch.min), static_cast<const T*>(launch.max), low, high);
      return cudaGetLastError();
    }
  });
}

bool castSupported(ElementType, ElementType) { return true; }

cudaError_t launchCast(const CastLaunch& launch, cudaStream_t stream) {
  return device::byElementType(launch.from, [&](auto fromTag) {
    using From = typename std::decay_t<decltype(fromTag)>::type;
    return device::byElementType(launch.to, [&](auto toTag) {
      using To = typename std::decay_t<decltype(toTag)>::type;
      return launchMap<From, To>(launch.count, launch.vectorWidth, launch.blockThreads, launch.x,
                                 launch.y, CastApply<From, To>{}, stream);
    });
  });
}

bool fusedSupported(ElementType type) { return isFloatLike(type); }

cudaError_t launchFused(const FusedLaunch& launch, cudaStream_t stream) {
  const BroadcastGeometry& g = launch.geometry;
  if (!fusedSupported(launch.type) || g.operands < 1 || g.operands > kMaxBroadcastOperands ||
      launch.program.length < 1 || launch.program.length > kMaxFusedInstructions) {
    return cudaErrorInvalidValue;
  }
  if (g.count <= 0) return cudaSuccess;
  FusedInputs inputs{};
  for (int k = 0; k < g.operands; ++k) inputs.pointers[k] = launch.inputs[k];
  return device::byElementType(launch.type, [&](auto tag) -> cudaError_t {
    using T = typename std::decay_t<decltype(tag)>::type;
    if constexpr (std::is_same_v<Compute<T>, float>) {
      const bool vector = flatVectorOk<T>(g, launch.vectorWidth, inputs.pointers, g.operands,
                                          launch.y, static_cast<int>(sizeof(T)));
      fusedKernel<T>
          <<<blocksFor(flatWork(g, vector), launch.blockThreads), launch.blockThreads, 0, stream>>>(
              g, launch.program, vector, inputs, static_cast<T*>(launch.y));
      return cudaGetLastError();
    } else {
      return cudaErrorInvalidValue;
    }
  });
}

}  // namespace kiln::cuda
