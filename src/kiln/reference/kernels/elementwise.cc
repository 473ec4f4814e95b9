// Reference kernels for the elementwise ops. Each op is one small lambda over compute values
// (double for every floating type, the integer itself for integers, bool for bool), constrained
// to the kinds of values it accepts; shared loops do the dtype dispatch, numpy broadcasting and
// the conversions back to the element type.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <concepts>
#include <cstring>
#include <functional>
#include <limits>
#include <numbers>
#include <string>
#include <type_traits>
#include <vector>

#include "kiln/reference/kernel.h"
#include "kiln/reference/kernels/broadcast.h"

namespace kiln::reference {

namespace {

using ir::BFloat16;
using ir::Float16;

template <typename T>
constexpr bool kIsHalf = std::is_same_v<T, Float16> || std::is_same_v<T, BFloat16>;

// The type an element of type T is computed in: double for all floating types, so that float32
// and the half types are rounded once, on the way back.
template <typename T>
using Compute = std::conditional_t<kIsHalf<T> || std::is_floating_point_v<T>, double, T>;

// What an op's lambda accepts, over compute types.
template <typename C>
concept Real = std::same_as<C, double>;
template <typename C>
concept Integer = std::integral<C> && !std::same_as<C, bool>;
template <typename C>
concept UnsignedInteger = Integer<C> && std::unsigned_integral<C>;
template <typename C>
concept Number = Real<C> || Integer<C>;
template <typename C>
concept SignedNumber = Real<C> || std::signed_integral<C>;
template <typename C>
concept Boolean = std::same_as<C, bool>;

template <typename T>
Compute<T> load(T value) {
  if constexpr (kIsHalf<T>) {
    return static_cast<float>(value);
  } else {
    return value;
  }
}

// Rounds a double to float, folding "inexact" into the last mantissa bit (round to odd). A
// float -> half rounding of that result then equals rounding the double directly, which a plain
// double -> float -> half chain does not always (double rounding).
float toFloatRoundToOdd(double value) {
  float rounded = static_cast<float>(value);
  if (std::isnan(value) || static_cast<double>(rounded) == value) return rounded;
  if (std::fabs(static_cast<double>(rounded)) > std::fabs(value)) {
    rounded = std::nextafter(rounded, 0.0f);
  }
  return std::bit_cast<float>(std::bit_cast<uint32_t>(rounded) | 1u);
}

// Floating -> integer truncates toward zero. ONNX leaves out-of-range values undefined; kiln
// saturates them and maps NaN to 0 rather than invoking C++ undefined behaviour.
template <Integer T>
T truncateToInteger(double value) {
  if (std::isnan(value)) return 0;
  if (value <= static_cast<double>(std::numeric_limits<T>::lowest())) {
    return std::numeric_limits<T>::lowest();
  }
  if (value >= static_cast<double>(std::numeric_limits<T>::max())) {
    return std::numeric_limits<T>::max();
  }
  return static_cast<T>(value);
}

// Converts a computed value to element type T with numpy's astype semantics (integers wrap,
// floating to integer truncates, anything nonzero is true).
template <typename T, typename C>
T store(C value) {
  if constexpr (kIsHalf<T>) {
    if constexpr (std::is_same_v<C, float>) {
      return T(value);
    } else {
      return T(toFloatRoundToOdd(static_cast<double>(value)));
    }
  } else if constexpr (std::is_same_v<T, bool>) {
    return value != C{};
  } else if constexpr (Integer<T> && std::is_floating_point_v<C>) {
    return truncateToInteger<T>(value);
  } else {
    return static_cast<T>(value);
  }
}

// Integer arithmetic wraps around as numpy's does. Signed overflow is undefined in C++, and
// narrow unsigned types promote to signed int, so compute in an unsigned type of at least
// unsigned int's width.
template <Integer C>
using Wrapping =
    std::conditional_t<(sizeof(C) < sizeof(unsigned)), unsigned, std::make_unsigned_t<C>>;

template <Integer C, typename Op>
C wrapping(C a, C b, Op op) {
  return static_cast<C>(op(static_cast<Wrapping<C>>(a), static_cast<Wrapping<C>>(b)));
}

template <Integer C>
C wrappingNegate(C value) {
  return wrapping(C{0}, value, std::minus<>());
}

Status unsupportedType(const KernelContext& ctx, DType dtype) {
  return ctx.unsupportedHere("element type {} is not supported", ir::dtypeName(dtype));
}

// --- Shared loops ------------------------------------------------------------------------------

// y[i] = fn(x[i]). The output is bool when fn returns bool, else the input's type.
template <typename Fn>
Status mapUnary(KernelContext& ctx, Fn fn) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  return ir::visitDType(x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = Compute<T>;
    if constexpr (std::is_invocable_v<Fn&, C>) {
      using Out = std::conditional_t<std::is_same_v<std::invoke_result_t<Fn&, C>, bool>, bool, T>;
      auto in = x.data<T>();
      auto out = y.mutableData<Out>();
      for (size_t i = 0; i < in.size(); ++i) out[i] = store<Out>(fn(load(in[i])));
      return Status::ok();
    } else {
      return unsupportedType(ctx, x.dtype());
    }
  });
}

// y = fn(a, b) under broadcasting, with `shapes` the shapes a and b broadcast as. Both inputs
// have one type; the output is bool when fn returns bool, else that type.
template <typename Fn>
Status mapBinary(KernelContext& ctx, const std::array<Shape, 2>& shapes, Fn fn) {
  const Tensor& a = ctx.input(0);
  const Tensor& b = ctx.input(1);
  Tensor& y = ctx.output(0);
  return ir::visitDType(a.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = Compute<T>;
    if constexpr (std::is_invocable_v<Fn&, C, C>) {
      using Out =
          std::conditional_t<std::is_same_v<std::invoke_result_t<Fn&, C, C>, bool>, bool, T>;
      auto lhs = a.data<T>();
      auto rhs = b.data<T>();
      auto out = y.mutableData<Out>();
      forEachBroadcastIndex(y.shape(), shapes, [&](int64_t o, const std::array<int64_t, 2>& at) {
        out[o] = store<Out>(fn(load(lhs[at[0]]), load(rhs[at[1]])));
      });
      return Status::ok();
    } else {
      return unsupportedType(ctx, a.dtype());
    }
  });
}

// The shapes a binary op's inputs broadcast as. Before opset 7, B (with broadcast=1) lines up
// with A from `axis` on; padding B's shape with trailing 1s makes that numpy broadcasting.
// Inference has validated the attributes.
Result<std::array<Shape, 2>> binaryOperandShapes(const KernelContext& ctx) {
  const Shape& a = ctx.input(0).shape();
  const Shape& b = ctx.input(1).shape();
  if (ctx.opset() >= 7 || a == b) return std::array<Shape, 2>{a, b};
  const int64_t aRank = static_cast<int64_t>(a.rank());
  KILN_ASSIGN_OR_RETURN(int64_t axis,
                        ctx.node().getInt("axis", aRank - static_cast<int64_t>(b.rank())));
  if (axis < 0) axis += aRank;
  std::vector<int64_t> dims = b.dims();
  dims.resize(static_cast<size_t>(std::max<int64_t>(aRank - axis, 0)), 1);
  return std::array<Shape, 2>{a, Shape(std::move(dims))};
}

template <typename Fn>
KernelFn unary(Fn fn) {
  return [fn](KernelContext& ctx) { return mapUnary(ctx, fn); };
}

template <typename Fn>
KernelFn binary(Fn fn) {
  return [fn](KernelContext& ctx) -> Status {
    KILN_ASSIGN_OR_RETURN(auto shapes, binaryOperandShapes(ctx));
    return mapBinary(ctx, shapes, fn);
  };
}

// Reads a float attribute as the double the lambdas compute with.
Result<double> floatAttribute(const KernelContext& ctx, const char* attr, float defaultValue) {
  KILN_ASSIGN_OR_RETURN(float value, ctx.node().getFloat(attr, defaultValue));
  return static_cast<double>(value);
}

// --- Unary ops ---------------------------------------------------------------------------------

double softplus(double x) {
  // log(1 + e^x) without overflowing e^x for large x.
  return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

template <Number C>
C absolute(C x) {
  if constexpr (Real<C>) {
    return std::fabs(x);
  } else if constexpr (std::is_signed_v<C>) {
    return x < 0 ? wrappingNegate(x) : x;
  } else {
    return x;
  }
}

template <Number C>
C sign(C x) {
  if constexpr (Real<C>) {
    if (std::isnan(x)) return x;
  }
  return static_cast<C>((x > 0) - (x < 0));
}

void registerUnaryKernels(KernelRegistry& registry) {
  registry.add("Relu", unary([]<SignedNumber C>(C x) { return x < 0 ? C{0} : x; }));
  registry.add("Sigmoid", unary([](Real auto x) { return 1 / (1 + std::exp(-x)); }));
  registry.add("Tanh", unary([](Real auto x) { return std::tanh(x); }));
  registry.add("HardSwish",
               unary([](Real auto x) { return x * std::max(0.0, std::min(1.0, x / 6 + 0.5)); }));
  registry.add("Softplus", unary([](Real auto x) { return softplus(x); }));
  registry.add("Softsign", unary([](Real auto x) { return x / (1 + std::fabs(x)); }));
  registry.add("Mish", unary([](Real auto x) { return x * std::tanh(softplus(x)); }));
  registry.add("Erf", unary([](Number auto x) { return std::erf(static_cast<double>(x)); }));
  registry.add("Exp", unary([](Real auto x) { return std::exp(x); }));
  registry.add("Log", unary([](Real auto x) { return std::log(x); }));
  registry.add("Sqrt", unary([](Real auto x) { return std::sqrt(x); }));
  registry.add("Reciprocal", unary([](Real auto x) { return 1 / x; }));
  registry.add("Abs", unary([](Number auto x) { return absolute(x); }));
  registry.add("Neg", unary([]<SignedNumber C>(C x) {
                 if constexpr (Real<C>) {
                   return -x;
                 } else {
                   return wrappingNegate(x);
                 }
               }));
  registry.add("Floor", unary([](Real auto x) { return std::floor(x); }));
  registry.add("Ceil", unary([](Real auto x) { return std::ceil(x); }));
  // The default rounding mode rounds halves to even, as ONNX requires.
  registry.add("Round", unary([](Real auto x) { return std::nearbyint(x); }));
  registry.add("Sign", unary([](Number auto x) { return sign(x); }));
  registry.add("Sin", unary([](Real auto x) { return std::sin(x); }));
  registry.add("Cos", unary([](Real auto x) { return std::cos(x); }));
  registry.add("Tan", unary([](Real auto x) { return std::tan(x); }));
  registry.add("Asin", unary([](Real auto x) { return std::asin(x); }));
  registry.add("Acos", unary([](Real auto x) { return std::acos(x); }));
  registry.add("Atan", unary([](Real auto x) { return std::atan(x); }));
  registry.add("Sinh", unary([](Real auto x) { return std::sinh(x); }));
  registry.add("Cosh", unary([](Real auto x) { return std::cosh(x); }));
  registry.add("Asinh", unary([](Real auto x) { return std::asinh(x); }));
  registry.add("Acosh", unary([](Real auto x) { return std::acosh(x); }));
  registry.add("Atanh", unary([](Real auto x) { return std::atanh(x); }));
  registry.add("Not", unary([](Boolean auto x) { return !x; }));
  registry.add("BitwiseNot", unary([]<Integer C>(C x) { return static_cast<C>(~x); }));
  registry.add("IsNaN", unary([](Real auto x) { return std::isnan(x); }));

  registry.add("LeakyRelu", [](KernelContext& ctx) -> Status {
    KILN_ASSIGN_OR_RETURN(const double alpha, floatAttribute(ctx, "alpha", 0.01f));
    return mapUnary(ctx, [alpha](Real auto x) { return x < 0 ? alpha * x : x; });
  });
  registry.add("HardSigmoid", [](KernelContext& ctx) -> Status {
    KILN_ASSIGN_OR_RETURN(const double alpha, floatAttribute(ctx, "alpha", 0.2f));
    KILN_ASSIGN_OR_RETURN(const double beta, floatAttribute(ctx, "beta", 0.5f));
    return mapUnary(
        ctx, [alpha, beta](Real auto x) { return std::max(0.0, std::min(1.0, alpha * x + beta)); });
  });
  registry.add("Elu", [](KernelContext& ctx) -> Status {
    KILN_ASSIGN_OR_RETURN(const double alpha, floatAttribute(ctx, "alpha", 1.0f));
    return mapUnary(ctx, [alpha](Real auto x) { return x < 0 ? alpha * std::expm1(x) : x; });
  });
  registry.add("Selu", [](KernelContext& ctx) -> Status {
    KILN_ASSIGN_OR_RETURN(const double alpha,
                          floatAttribute(ctx, "alpha", 1.67326319217681884765625f));
    KILN_ASSIGN_OR_RETURN(const double gamma,
                          floatAttribute(ctx, "gamma", 1.05070102214813232421875f));
    return mapUnary(ctx, [alpha, gamma](Real auto x) {
      return x > 0 ? gamma * x : gamma * (alpha * std::exp(x) - alpha);
    });
  });
  registry.add("Celu", [](KernelContext& ctx) -> Status {
    KILN_ASSIGN_OR_RETURN(const double alpha, floatAttribute(ctx, "alpha", 1.0f));
    return mapUnary(ctx, [alpha](Real auto x) {
      return std::max(0.0, x) + std::min(0.0, alpha * std::expm1(x / alpha));
    });
  });
  registry.add("Gelu", [](KernelContext& ctx) -> Status {
    KILN_ASSIGN_OR_RETURN(std::string approximate, ctx.node().getString("approximate", "none"));
    if (approximate == "tanh") {
      return mapUnary(ctx, [](Real auto x) {
        const double inner = std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x);
        return 0.5 * x * (1 + std::tanh(inner));
      });
    }
    return mapUnary(ctx, [](Real auto x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); });
  });
  registry.add("Shrink", [](KernelContext& ctx) -> Status {
    KILN_ASSIGN_OR_RETURN(const double lambd, floatAttribute(ctx, "lambd", 0.5f));
    KILN_ASSIGN_OR_RETURN(const double bias, floatAttribute(ctx, "bias", 0.0f));
    return mapUnary(ctx, [lambd, bias](Number auto x) {
      const double v = static_cast<double>(x);
      return v < -lambd ? v + bias : v > lambd ? v - bias : 0.0;
    });
  });
  registry.add("ThresholdedRelu", [](KernelContext& ctx) -> Status {
    KILN_ASSIGN_OR_RETURN(const double alpha, floatAttribute(ctx, "alpha", 1.0f));
    return mapUnary(ctx, [alpha](Real auto x) { return x > alpha ? x : 0.0; });
  });
  registry.add("IsInf", [](KernelContext& ctx) -> Status {
    KILN_ASSIGN_OR_RETURN(const bool negative, ctx.node().getInt("detect_negative", 1));
    KILN_ASSIGN_OR_RETURN(const bool positive, ctx.node().getInt("detect_positive", 1));
    return mapUnary(ctx, [negative, positive](Real auto x) {
      return std::isinf(x) && (x > 0 ? positive : negative);
    });
  });
}

// --- Binary ops --------------------------------------------------------------------------------

template <Integer C>
C truncatedQuotient(C a, C b) {
  // The one overflowing quotient, lowest / -1, wraps like numpy's.
  if constexpr (std::is_signed_v<C>) {
    if (b == -1) return wrappingNegate(a);
  }
  return static_cast<C>(a / b);
}

template <Integer C>
C truncatedRemainder(C a, C b) {
  if constexpr (std::is_signed_v<C>) {
    if (b == -1) return 0;
  }
  return static_cast<C>(a % b);
}

// Python's remainder: the sign of the divisor.
template <Integer C>
C flooredRemainder(C a, C b) {
  C r = truncatedRemainder(a, b);
  if constexpr (std::is_signed_v<C>) {
    if (r != 0 && ((r < 0) != (b < 0))) r = static_cast<C>(r + b);
  }
  return r;
}

// Integer division by zero has no value (numpy warns and writes garbage); refuse it.
Status checkNoIntegerZero(KernelContext& ctx, size_t input) {
  const Tensor& divisor = ctx.input(input);
  if (!ir::isInteger(divisor.dtype()) || ctx.output(0).elementCount() == 0) return Status::ok();
  for (int64_t i = 0; i < divisor.elementCount(); ++i) {
    if (divisor.elementAsInt64(i) == 0) {
      return ctx.error("integer division by zero: input {} holds 0 at index {}", input, i);
    }
  }
  return Status::ok();
}

// NaN-propagating min and max, like numpy's minimum and maximum.
template <Number C>
C minimum(C a, C b) {
  if constexpr (Real<C>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  }
  return b < a ? b : a;
}

template <Number C>
C maximum(C a, C b) {
  if constexpr (Real<C>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<double>::quiet_NaN();
  }
  return b > a ? b : a;
}

template <typename C>
C add(C a, C b) {
  if constexpr (Real<C>) {
    return a + b;
  } else {
    return wrapping(a, b, std::plus<>());
  }
}

template <typename C>
C multiply(C a, C b) {
  if constexpr (Real<C>) {
    return a * b;
  } else {
    return wrapping(a, b, std::multiplies<>());
  }
}

Status runDiv(KernelContext& ctx) {
  KILN_RETURN_IF_ERROR(checkNoIntegerZero(ctx, 1));
  KILN_ASSIGN_OR_RETURN(auto shapes, binaryOperandShapes(ctx));
  return mapBinary(ctx, shapes, []<Number C>(C a, C b) {
    if constexpr (Real<C>) {
      return a / b;
    } else {
      return truncatedQuotient(a, b);
    }
  });
}

Status runMod(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(const int64_t fmod, ctx.node().getInt("fmod", 0));
  KILN_RETURN_IF_ERROR(checkNoIntegerZero(ctx, 1));
  KILN_ASSIGN_OR_RETURN(auto shapes, binaryOperandShapes(ctx));
  if (fmod) {
    return mapBinary(ctx, shapes, []<Number C>(C a, C b) {
      if constexpr (Real<C>) {
        return std::fmod(a, b);
      } else {
        return truncatedRemainder(a, b);
      }
    });
  }
  return mapBinary(ctx, shapes, []<Integer C>(C a, C b) { return flooredRemainder(a, b); });
}

// base^exponent for integers by repeated squaring, wrapping on overflow like numpy. A negative
// exponent gives what truncating the real power gives.
template <Integer C, Integer E>
C integerPower(C base, E exponent) {
  if (exponent < 0) {
    if (base == 1) return 1;
    if constexpr (std::is_signed_v<C>) {
      if (base == -1) return (exponent % 2 == 0) ? C{1} : C{-1};
    }
    return 0;
  }
  C result = 1;
  auto remaining = static_cast<uint64_t>(exponent);
  while (remaining > 0) {
    if (remaining & 1u) result = multiply(result, base);
    base = multiply(base, base);
    remaining >>= 1;
  }
  return result;
}

// Pow's base and exponent may have different types (opset 12); the output has the base's.
Status runPow(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(auto shapes, binaryOperandShapes(ctx));
  const Tensor& base = ctx.input(0);
  const Tensor& exponent = ctx.input(1);
  Tensor& y = ctx.output(0);
  return ir::visitDType(base.dtype(), [&](auto baseTag) -> Status {
    using T = decltype(baseTag);
    if constexpr (!Number<Compute<T>>) {
      return unsupportedType(ctx, base.dtype());
    } else {
      return ir::visitDType(exponent.dtype(), [&](auto exponentTag) -> Status {
        using E = decltype(exponentTag);
        if constexpr (!Number<Compute<E>>) {
          return unsupportedType(ctx, exponent.dtype());
        } else {
          auto lhs = base.data<T>();
          auto rhs = exponent.data<E>();
          auto out = y.mutableData<T>();
          forEachBroadcastIndex(
              y.shape(), shapes, [&](int64_t o, const std::array<int64_t, 2>& at) {
                const Compute<T> b = load(lhs[at[0]]);
                const Compute<E> e = load(rhs[at[1]]);
                if constexpr (Integer<Compute<T>> && Integer<Compute<E>>) {
                  out[o] = integerPower(b, e);
                } else {
                  out[o] = store<T>(std::pow(static_cast<double>(b), static_cast<double>(e)));
                }
              });
          return Status::ok();
        }
      });
    }
  });
}

// Before opset 7 a slope of more than one value holds one per channel (X's axis 1); as a shape
// that broadcasts numpy-style, that is [C, 1, ..., 1].
Shape preluSlopeShape(const KernelContext& ctx) {
  const Shape& x = ctx.input(0).shape();
  const Shape& slope = ctx.input(1).shape();
  if (ctx.opset() >= 7) return slope;
  if (slope.elementCount() == 1) return Shape{};
  std::vector<int64_t> dims(x.rank() - 1, 1);
  dims[0] = slope.elementCount();
  return Shape(std::move(dims));
}

Status runPRelu(KernelContext& ctx) {
  return mapBinary(ctx, {ctx.input(0).shape(), preluSlopeShape(ctx)},
                   []<Number C>(C x, C slope) { return x < 0 ? multiply(x, slope) : x; });
}

Status runBitShift(KernelContext& ctx) {
  KILN_ASSIGN_OR_RETURN(std::string direction, ctx.node().getString("direction", ""));
  KILN_ASSIGN_OR_RETURN(auto shapes, binaryOperandShapes(ctx));
  const bool left = direction == "LEFT";
  return mapBinary(ctx, shapes, [left]<UnsignedInteger C>(C a, C amount) -> C {
    // Shifting by the width or more is undefined in C++; numpy gives 0.
    if (amount >= std::numeric_limits<C>::digits) return 0;
    return left ? static_cast<C>(static_cast<Wrapping<C>>(a) << amount)
                : static_cast<C>(a >> amount);
  });
}

void registerBinaryKernels(KernelRegistry& registry) {
  registry.add("Add", binary([]<Number C>(C a, C b) { return add(a, b); }));
  registry.add("Sub", binary([]<Number C>(C a, C b) {
                 if constexpr (Real<C>) {
                   return a - b;
                 } else {
                   return wrapping(a, b, std::minus<>());
                 }
               }));
  registry.add("Mul", binary([]<Number C>(C a, C b) { return multiply(a, b); }));
  registry.add("Div", runDiv);
  registry.add("Mod", runMod);
  registry.add("Pow", runPow);
  registry.add("PRelu", runPRelu);
  registry.add("BitShift", runBitShift);
  registry.add("Equal", binary([](auto a, decltype(a) b) { return a == b; }));
  registry.add("Less", binary([]<Number C>(C a, C b) { return a < b; }));
  registry.add("Greater", binary([]<Number C>(C a, C b) { return a > b; }));
  registry.add("LessOrEqual", binary([]<Number C>(C a, C b) { return a <= b; }));
  registry.add("GreaterOrEqual", binary([]<Number C>(C a, C b) { return a >= b; }));
  registry.add("And", binary([]<Boolean C>(C a, C b) { return a && b; }));
  registry.add("Or", binary([]<Boolean C>(C a, C b) { return a || b; }));
  registry.add("Xor", binary([]<Boolean C>(C a, C b) { return a != b; }));
  registry.add("BitwiseAnd", binary([]<Integer C>(C a, C b) { return static_cast<C>(a & b); }));
  registry.add("BitwiseOr", binary([]<Integer C>(C a, C b) { return static_cast<C>(a | b); }));
  registry.add("BitwiseXor", binary([]<Integer C>(C a, C b) { return static_cast<C>(a ^ b); }));
}

// --- Variadic ops, Where -----------------------------------------------------------------------

// Folds all inputs, broadcast to the output's shape, with `fold`, then maps each result through
// `finish`. Floating sums accumulate in double.
template <typename Fold, typename Finish>
Status foldInputs(KernelContext& ctx, Fold fold, Finish finish) {
  Tensor& y = ctx.output(0);
  const DType dtype = ctx.input(0).dtype();
  return ir::visitDType(dtype, [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = Compute<T>;
    if constexpr (std::is_invocable_v<Fold&, C, C>) {
      std::vector<C> accumulator(static_cast<size_t>(y.elementCount()));
      for (size_t k = 0; k < ctx.inputCount(); ++k) {
        auto in = ctx.input(k).data<T>();
        const std::array<Shape, 1> shapes = {ctx.input(k).shape()};
        forEachBroadcastIndex(y.shape(), shapes, [&](int64_t o, const std::array<int64_t, 1>& at) {
          const C value = load(in[at[0]]);
          accumulator[o] = k == 0 ? value : fold(accumulator[o], value);
        });
      }
      auto out = y.mutableData<T>();
      for (size_t i = 0; i < out.size(); ++i) out[i] = store<T>(finish(accumulator[i]));
      return Status::ok();
    } else {
      return unsupportedType(ctx, dtype);
    }
  });
}

Status runWhere(KernelContext& ctx) {
  const Tensor& condition = ctx.input(0);
  const Tensor& x = ctx.input(1);
  const Tensor& y = ctx.input(2);
  Tensor& out = ctx.output(0);
  return ir::visitDType(x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    auto chosen = condition.data<bool>();
    auto whenTrue = x.data<T>();
    auto whenFalse = y.data<T>();
    auto result = out.mutableData<T>();
    const std::array<Shape, 3> shapes = {condition.shape(), x.shape(), y.shape()};
    forEachBroadcastIndex(out.shape(), shapes, [&](int64_t o, const std::array<int64_t, 3>& at) {
      result[o] = chosen[at[0]] ? whenTrue[at[1]] : whenFalse[at[2]];
    });
    return Status::ok();
  });
}

void registerVariadicKernels(KernelRegistry& registry) {
  auto same = [](auto value) { return value; };
  registry.add("Min", [same](KernelContext& ctx) {
    return foldInputs(
        ctx, []<Number C>(C a, C b) { return minimum(a, b); }, same);
  });
  registry.add("Max", [same](KernelContext& ctx) {
    return foldInputs(
        ctx, []<Number C>(C a, C b) { return maximum(a, b); }, same);
  });
  registry.add("Sum", [same](KernelContext& ctx) {
    return foldInputs(
        ctx, [](Real auto a, Real auto b) { return a + b; }, same);
  });
  registry.add("Mean", [](KernelContext& ctx) {
    const double count = static_cast<double>(ctx.inputCount());
    return foldInputs(
        ctx, [](Real auto a, Real auto b) { return a + b; },
        [count](auto sum) { return sum / count; });
  });
  registry.add("Where", runWhere);
}

// --- Clip, Cast, Identity, Dropout -------------------------------------------------------------

// The bound Clip applies: the attribute before opset 11 (defaulting to float's range as the
// spec says), the optional scalar input after (defaulting to no bound).
template <typename T>
Result<Compute<T>> clipBound(const KernelContext& ctx, size_t input, const char* attr, bool lower) {
  using C = Compute<T>;
  if (ctx.opset() < 11) {
    const float limit =
        lower ? std::numeric_limits<float>::lowest() : std::numeric_limits<float>::max();
    KILN_ASSIGN_OR_RETURN(double value, floatAttribute(ctx, attr, limit));
    return static_cast<C>(value);
  }
  if (const Tensor* bound = ctx.optionalInput(input)) return load(bound->data<T>()[0]);
  if constexpr (Real<C>) {
    return lower ? -std::numeric_limits<double>::infinity()
                 : std::numeric_limits<double>::infinity();
  } else {
    return lower ? std::numeric_limits<C>::lowest() : std::numeric_limits<C>::max();
  }
}

Status runClip(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  return ir::visitDType(x.dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    using C = Compute<T>;
    if constexpr (!Number<C>) {
      return unsupportedType(ctx, x.dtype());
    } else {
      KILN_ASSIGN_OR_RETURN(const C low, clipBound<T>(ctx, 1, "min", true));
      KILN_ASSIGN_OR_RETURN(const C high, clipBound<T>(ctx, 2, "max", false));
      auto in = x.data<T>();
      auto out = y.mutableData<T>();
      for (size_t i = 0; i < in.size(); ++i) {
        // min first, then max: with min > max every value becomes max, as numpy.clip gives.
        // NaN compares false both times and stays NaN.
        C value = load(in[i]);
        if (value < low) value = low;
        if (value > high) value = high;
        out[i] = store<T>(value);
      }
      return Status::ok();
    }
  });
}

// Cast and CastLike: the output's type, chosen by inference, is the target.
Status runCast(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  Tensor& y = ctx.output(0);
  return ir::visitDType(x.dtype(), [&](auto fromTag) -> Status {
    using From = decltype(fromTag);
    return ir::visitDType(y.dtype(), [&](auto toTag) -> Status {
      using To = decltype(toTag);
      auto in = x.data<From>();
      auto out = y.mutableData<To>();
      for (size_t i = 0; i < in.size(); ++i) out[i] = store<To>(load(in[i]));
      return Status::ok();
    });
  });
}

Status copyInput(KernelContext& ctx) {
  const Tensor& x = ctx.input(0);
  if (x.byteSize() > 0) std::memcpy(ctx.output(0).mutableRawData(), x.rawData(), x.byteSize());
  return Status::ok();
}

Status runDropout(KernelContext& ctx) {
  // Training mode masks at random, except with ratio 0, which keeps every element.
  if (const Tensor* training = ctx.optionalInput(2); training && training->data<bool>()[0]) {
    const Tensor* ratio = ctx.optionalInput(1);
    if (!ratio || ratio->elementAsDouble(0) != 0) {
      return ctx.unsupportedHere(
          "training-mode Dropout with a nonzero ratio (random masking) is not supported");
    }
  }
  KILN_RETURN_IF_ERROR(copyInput(ctx));
  if (ctx.outputCount() > 1 && ctx.node().outputs[1]) {
    Tensor& mask = ctx.output(1);
    ir::visitDType(mask.dtype(), [&](auto tag) {
      using T = decltype(tag);
      for (T& kept : mask.mutableData<T>()) kept = store<T>(1.0);
    });
  }
  return Status::ok();
}

}  // namespace

void registerElementwiseKernels(KernelRegistry& registry) {
  registerUnaryKernels(registry);
  registerBinaryKernels(registry);
  registerVariadicKernels(registry);
  registry.add("Clip", runClip);
  registry.add("Cast", runCast);
  registry.add("CastLike", runCast);
  registry.add("Identity", copyInput);
  registry.add("Dropout", runDropout);
}

}  // namespace kiln::reference
