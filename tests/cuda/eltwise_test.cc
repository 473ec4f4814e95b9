// The CUDA elementwise steps (kernels/eltwise_steps.cc) against the reference executor: every
// unary op over the four floating types (and the integer and bool ops over theirs), binary ops
// under each broadcast pattern (scalar, row, column, middle axis, both sides, rank 5, empty),
// integer wrap-around and shifts, Pow over mixed types, Where, the variadic ops, Clip with
// attribute, constant and runtime bounds, the Cast matrix, kiln.FusedElementwise programs, NaN
// and infinities, and kernels writing over their own input (in place) inside a graph.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "../knobs/graph_sketch.h"
#include "cuda_test_util.h"
#include "kiln/backends/cuda/codegen/nvrtc.h"
#include "kiln/ir/op_schema.h"
#include "kiln/reference/executor.h"

namespace kiln::testing {
namespace {

using ir::DType;
using ir::Shape;
using ir::Tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

const std::vector<DType> kFloatTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16,
                                        DType::kFloat64};
const std::vector<DType> kAllTypes = {
    DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt64,
    DType::kInt32,   DType::kInt16,   DType::kInt8,     DType::kUInt64,  DType::kUInt32,
    DType::kUInt16,  DType::kUInt8,   DType::kBool};

OpInput runtime(Tensor tensor) { return {std::move(tensor), false}; }
OpInput constant(Tensor tensor) { return {std::move(tensor), true}; }

Tensor floats(Shape shape, unsigned seed, float low = -5, float high = 5) {
  return uniformTensor(std::move(shape), seed, low, high);
}

Tensor values(std::vector<float> v) {
  return Tensor::fromVector<float>(Shape{static_cast<int64_t>(v.size())}, v);
}

Tensor ints(DType dtype, Shape shape, std::vector<int64_t> v) {
  return Tensor::fromVector<int64_t>(std::move(shape), v).castTo(dtype);
}

Tensor intsOf(DType dtype, std::vector<int64_t> v) {
  const int64_t n = static_cast<int64_t>(v.size());
  return ints(dtype, Shape{n}, std::move(v));
}

// Seeded integers in [low, high] of `dtype`.
Tensor randomInts(DType dtype, Shape shape, unsigned seed, int64_t low, int64_t high) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> pick(low, high);
  std::vector<int64_t> v(static_cast<size_t>(shape.elementCount()));
  for (int64_t& x : v) x = pick(rng);
  return ints(dtype, std::move(shape), v);
}

Tensor randomBools(Shape shape, unsigned seed) {
  return randomInts(DType::kInt64, std::move(shape), seed, 0, 1).castTo(DType::kBool);
}

// Seeded data of `dtype`: floats in [low, high], integers in a range every type holds.
Tensor dataOf(DType dtype, Shape shape, unsigned seed, float low = -5, float high = 5) {
  if (dtype == DType::kBool) return randomBools(std::move(shape), seed);
  if (ir::isFloating(dtype)) return floats(std::move(shape), seed, low, high).castTo(dtype);
  const int64_t lowInt = ir::isSigned(dtype) ? -100 : 0;
  return randomInts(dtype, std::move(shape), seed, lowInt, 120);
}

// Relative tolerance per element type: the kernels compute float32 and the half types in float
// and round once, where the reference computes in double (a half result may differ by an ulp).
double rtolFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 1e-5;
    case DType::kFloat16:
      return 2e-3;
    case DType::kBFloat16:
      return 1.6e-2;
    case DType::kFloat64:
      return 1e-6;
    default:
      return 0;
  }
}

double atolFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 1e-6;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 1e-4;
    case DType::kFloat64:
      return 1e-12;
    default:
      return 0;
  }
}

CudaOpCase opCase(std::string op, std::vector<OpInput> inputs, CudaAttributes attributes,
                  std::string tactic, DType dtype = DType::kFloat32, int opset = 18) {
  CudaOpCase c;
  c.opType = std::move(op);
  c.inputs = std::move(inputs);
  c.attributes = std::move(attributes);
  c.opset = opset;
  c.expectTactic = std::move(tactic);
  c.rtol = rtolFor(dtype);
  c.atol = atolFor(dtype);
  return c;
}

// A binary case through kiln.binary (cuda.eltwise.codegen=interpreter) and with the default
// nvrtc, which generates a kernel for float arithmetic over a strided broadcast
// (codegen_test.cc pins which cases) and leaves the rest to kiln.binary.
void expectBinaryMatchesReference(CudaOpCase c) {
  const std::string route = c.route;
  c.route = route + " -cuda.eltwise.codegen=interpreter";
  expectCudaMatchesReference(c);
  c.route = route + " -cuda.eltwise.codegen=nvrtc";
  c.expectTactic = "";
  expectCudaMatchesReference(c);
}

// --- Unary -------------------------------------------------------------------------------------

struct UnaryCase {
  const char* op;
  float low, high;  // the input range where the op is defined
  CudaAttributes attributes = {};
  int opset = 18;
};

const std::vector<UnaryCase>& realUnaryCases() {
  static const std::vector<UnaryCase> cases = {
      {"Abs", -5, 5},
      {"Acos", -0.99f, 0.99f},
      {"Acosh", 1, 10},
      {"Asin", -0.99f, 0.99f},
      {"Asinh", -5, 5},
      {"Atan", -5, 5},
      {"Atanh", -0.99f, 0.99f},
      {"Ceil", -5, 5},
      {"Celu", -5, 5, {{"alpha", floatAttr(0.7f)}}},
      {"Cos", -10, 10},
      {"Cosh", -5, 5},
      {"Elu", -5, 5, {{"alpha", floatAttr(0.5f)}}},
      {"Erf", -3, 3},
      {"Exp", -10, 10},
      {"Floor", -5, 5},
      {"Gelu", -6, 6, {}, 20},
      {"Gelu", -6, 6, {{"approximate", stringAttr("tanh")}}, 20},
      {"HardSigmoid", -6, 6, {{"alpha", floatAttr(0.3f)}, {"beta", floatAttr(0.4f)}}},
      {"HardSigmoid", -6, 6},
      {"HardSwish", -6, 6},
      {"LeakyRelu", -5, 5, {{"alpha", floatAttr(0.2f)}}},
      {"LeakyRelu", -5, 5},
      {"Log", 0.01f, 100},
      {"Mish", -10, 10},
      {"Neg", -5, 5},
      {"Reciprocal", 0.5f, 10},
      {"Relu", -5, 5},
      {"Round", -5, 5},
      {"Selu", -5, 5},
      {"Selu", -5, 5, {{"alpha", floatAttr(1.5f)}, {"gamma", floatAttr(0.9f)}}},
      {"Shrink", -2, 2, {{"lambd", floatAttr(0.7f)}, {"bias", floatAttr(0.3f)}}},
      {"Sigmoid", -20, 20},
      {"Sign", -3, 3},
      {"Sin", -10, 10},
      {"Sinh", -5, 5},
      {"Softplus", -30, 30},
      {"Softsign", -5, 5},
      {"Sqrt", 0, 100},
      {"Tan", -1.5f, 1.5f},
      {"Tanh", -10, 10},
      {"ThresholdedRelu", -3, 3, {{"alpha", floatAttr(0.5f)}}},
  };
  return cases;
}

TEST(CudaEltwise, EveryUnaryOpOnEveryFloatType) {
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    unsigned seed = 1;
    for (const UnaryCase& u : realUnaryCases()) {
      // 1031 elements: four-element packs and a tail of three.
      const Tensor x = dataOf(dtype, {1031}, seed++, u.low, u.high);
      expectCudaMatchesReference(
          opCase(u.op, {runtime(x)}, u.attributes, "kiln.unary", dtype, u.opset));
    }
  }
}

TEST(CudaEltwise, UnaryOpsOnNaNInfinitiesZerosAndHalves) {
  const Tensor special = values({kNaN, kInf, -kInf, 0.0f, -0.0f, 0.5f, -0.5f, 1.5f, 2.5f, -2.5f,
                                 3.5f, 1e30f, -1e30f, 1e-30f, 89.0f, -89.0f, 1e-3f, -1e-3f});
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const Tensor x = special.castTo(dtype);
    for (const char* op : {"Abs",
                           "Ceil",
                           "Elu",
                           "Erf",
                           "Exp",
                           "Floor",
                           "HardSigmoid",
                           "HardSwish",
                           "LeakyRelu",
                           "Neg",
                           "Relu",
                           "Round",
                           "Selu",
                           "Sigmoid",
                           "Sign",
                           "Softplus",
                           "Softsign",
                           "Tanh",
                           "ThresholdedRelu",
                           "IsNaN",
                           "Celu",
                           "Mish"}) {
      expectCudaMatchesReference(opCase(op, {runtime(x)}, {}, "kiln.unary", dtype));
    }
    for (const char* op : {"Gelu"}) {
      expectCudaMatchesReference(opCase(op, {runtime(x)}, {}, "kiln.unary", dtype, 20));
    }
    for (int64_t negative : {0, 1}) {
      for (int64_t positive : {0, 1}) {
        expectCudaMatchesReference(
            opCase("IsInf", {runtime(x)},
                   {{"detect_negative", intAttr(negative)}, {"detect_positive", intAttr(positive)}},
                   "kiln.unary", dtype));
      }
    }
  }
}

TEST(CudaEltwise, IntegerUnaryOpsWrapAtTheLimits) {
  struct Limits {
    DType dtype;
    int64_t lowest, highest;
  };
  const std::vector<Limits> signedTypes = {{DType::kInt8, -128, 127},
                                           {DType::kInt16, -32768, 32767},
                                           {DType::kInt32, INT32_MIN, INT32_MAX},
                                           {DType::kInt64, INT64_MIN, INT64_MAX}};
  for (const Limits& l : signedTypes) {
    SCOPED_TRACE(std::string(ir::dtypeName(l.dtype)));
    const Tensor x = intsOf(l.dtype, {l.lowest, l.lowest + 1, -7, -1, 0, 1, 5, 6, l.highest});
    for (const char* op : {"Abs", "Neg", "Relu", "Sign", "BitwiseNot"}) {
      expectCudaMatchesReference(opCase(op, {runtime(x)}, {}, "kiln.unary", l.dtype));
    }
  }
  for (DType dtype : {DType::kUInt8, DType::kUInt16, DType::kUInt32, DType::kUInt64}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const Tensor x = intsOf(dtype, {0, 1, 7, 100, 200});
    for (const char* op : {"Abs", "Sign", "BitwiseNot"}) {
      expectCudaMatchesReference(opCase(op, {runtime(x)}, {}, "kiln.unary", dtype));
    }
  }
}

TEST(CudaEltwise, ErfAndShrinkOfIntegersTruncateADoubleResult) {
  for (DType dtype : {DType::kInt8, DType::kInt32, DType::kInt64, DType::kUInt16}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const Tensor x = ir::isSigned(dtype)
                         ? intsOf(dtype, {-100, -6, -5, -3, -1, 0, 1, 2, 4, 5, 6, 100})
                         : intsOf(dtype, {0, 1, 2, 4, 5, 6, 100});
    expectCudaMatchesReference(opCase("Erf", {runtime(x)}, {}, "kiln.unary", dtype));
    expectCudaMatchesReference(opCase("Shrink", {runtime(x)},
                                      {{"lambd", floatAttr(1.5f)}, {"bias", floatAttr(0.5f)}},
                                      "kiln.unary", dtype));
  }
}

TEST(CudaEltwise, NotOfBool) {
  expectCudaMatchesReference(
      opCase("Not", {runtime(randomBools({3, 67}, 4))}, {}, "kiln.unary", DType::kBool));
}

// --- Binary ------------------------------------------------------------------------------------

struct BroadcastPair {
  Shape a, b;
  const char* name;
};

const std::vector<BroadcastPair>& broadcastPairs() {
  static const std::vector<BroadcastPair> pairs = {
      {{3, 5}, {3, 5}, "same shape"},
      {{5, 4097}, {5, 4097}, "same shape, odd count"},
      {{3, 5}, {}, "scalar right"},
      {{}, {3, 5}, "scalar left"},
      {{4, 7}, {7}, "row"},
      {{4, 7}, {4, 1}, "column"},
      {{2, 3, 5}, {3, 1}, "middle axis"},
      {{3, 1}, {1, 4}, "outer product"},
      {{2, 1, 4, 1, 3}, {3, 4, 5, 3}, "rank 5 both sides"},
      {{1, 3, 1, 8}, {2, 1, 6, 1}, "alternating"},
      {{1, 1, 1}, {1}, "one element"},
      {{0, 3}, {3}, "empty"},
  };
  return pairs;
}

TEST(CudaEltwise, ArithmeticUnderEveryBroadcastPattern) {
  unsigned seed = 10;
  for (const BroadcastPair& p : broadcastPairs()) {
    SCOPED_TRACE(p.name);
    for (DType dtype : kFloatTypes) {
      SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
      const Tensor a = dataOf(dtype, p.a, seed++);
      const Tensor b = dataOf(dtype, p.b, seed++, 0.5f, 4.0f);
      for (const char* op : {"Add", "Sub", "Mul", "Div", "Max", "Min"}) {
        expectBinaryMatchesReference(
            opCase(op, {runtime(a), runtime(b)}, {}, "kiln.binary", dtype));
      }
      expectCudaMatchesReference(
          opCase("Mod", {runtime(a), runtime(b)}, {{"fmod", intAttr(1)}}, "kiln.binary", dtype));
      // A constant second operand reads from the weights buffer.
      expectBinaryMatchesReference(
          opCase("Mul", {runtime(a), constant(b)}, {}, "kiln.binary", dtype));
    }
  }
}

TEST(CudaEltwise, ComparisonsGiveBool) {
  unsigned seed = 40;
  for (const BroadcastPair& p : broadcastPairs()) {
    SCOPED_TRACE(p.name);
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt64, DType::kUInt8}) {
      SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
      // Small integers, so that equal pairs occur.
      const Tensor a = randomInts(DType::kInt64, p.a, seed++, 0, 3).castTo(dtype);
      const Tensor b = randomInts(DType::kInt64, p.b, seed++, 0, 3).castTo(dtype);
      for (const char* op : {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"}) {
        expectCudaMatchesReference(
            opCase(op, {runtime(a), runtime(b)}, {}, "kiln.binary", DType::kBool));
      }
    }
  }
  const Tensor withNaN = values({kNaN, 1, kInf, -kInf, 0, -0.0f});
  const Tensor other = values({kNaN, kNaN, kInf, 3, -0.0f, 0});
  for (const char* op : {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"}) {
    expectCudaMatchesReference(
        opCase(op, {runtime(withNaN), runtime(other)}, {}, "kiln.binary", DType::kBool));
  }
}

TEST(CudaEltwise, LogicOnBool) {
  for (const BroadcastPair& p : broadcastPairs()) {
    SCOPED_TRACE(p.name);
    const Tensor a = randomBools(p.a, 50);
    const Tensor b = randomBools(p.b, 51);
    for (const char* op : {"And", "Or", "Xor", "Equal"}) {
      expectCudaMatchesReference(
          opCase(op, {runtime(a), runtime(b)}, {}, "kiln.binary", DType::kBool));
    }
  }
}

TEST(CudaEltwise, IntegerArithmeticWraps) {
  struct Limits {
    DType dtype;
    int64_t lowest, highest;
  };
  const std::vector<Limits> types = {{DType::kInt8, -128, 127},
                                     {DType::kInt16, -32768, 32767},
                                     {DType::kInt32, INT32_MIN, INT32_MAX},
                                     {DType::kInt64, INT64_MIN, INT64_MAX},
                                     {DType::kUInt8, 0, 255},
                                     {DType::kUInt16, 0, 65535},
                                     {DType::kUInt32, 0, UINT32_MAX},
                                     {DType::kUInt64, 0, INT64_MAX}};
  for (const Limits& l : types) {
    SCOPED_TRACE(std::string(ir::dtypeName(l.dtype)));
    const bool isSigned = ir::isSigned(l.dtype);
    // No zero divisors: the reference refuses integer division by zero.
    const Tensor a =
        intsOf(l.dtype, {l.lowest, l.highest, 7, isSigned ? -7 : 9, 100, l.highest - 1, 13, 1});
    const Tensor b = intsOf(l.dtype, {isSigned ? -1 : 1, 2, isSigned ? -3 : 3, 3, l.highest, 5,
                                      isSigned ? -5 : 6, l.highest});
    for (const char* op : {"Add", "Sub", "Mul", "Div", "Max", "Min"}) {
      expectCudaMatchesReference(opCase(op, {runtime(a), runtime(b)}, {}, "kiln.binary", l.dtype));
    }
    for (int64_t fmod : {0, 1}) {
      expectCudaMatchesReference(opCase("Mod", {runtime(a), runtime(b)}, {{"fmod", intAttr(fmod)}},
                                        "kiln.binary", l.dtype));
    }
    for (const char* op : {"BitwiseAnd", "BitwiseOr", "BitwiseXor"}) {
      expectCudaMatchesReference(opCase(op, {runtime(a), runtime(b)}, {}, "kiln.binary", l.dtype));
    }
    // Broadcast integer arithmetic too.
    const Tensor rows = randomInts(l.dtype, {6, 9}, 60, isSigned ? -50 : 0, 50);
    const Tensor column = randomInts(l.dtype, {6, 1}, 61, 1, 9);
    for (const char* op : {"Add", "Mul", "Div", "Mod"}) {
      expectCudaMatchesReference(
          opCase(op, {runtime(rows), runtime(column)}, {}, "kiln.binary", l.dtype));
    }
  }
}

TEST(CudaEltwise, BitShiftByEveryAmountUpToPastTheWidth) {
  for (DType dtype : {DType::kUInt8, DType::kUInt16, DType::kUInt32, DType::kUInt64}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const int width = static_cast<int>(ir::dtypeSize(dtype)) * 8;
    std::vector<int64_t> amounts;
    for (int s = 0; s <= width + 2; ++s) amounts.push_back(s);
    const int64_t n = static_cast<int64_t>(amounts.size());
    const Tensor amount = ints(dtype, {n}, amounts);
    const Tensor x = randomInts(dtype, {3, n}, 70, 1, 250);
    for (const char* direction : {"LEFT", "RIGHT"}) {
      expectCudaMatchesReference(opCase("BitShift", {runtime(x), runtime(amount)},
                                        {{"direction", stringAttr(direction)}}, "kiln.binary",
                                        dtype));
    }
  }
}

TEST(CudaEltwise, PReluSlopesBroadcastOntoX) {
  for (DType dtype :
       {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const Tensor x = dataOf(dtype, {2, 3, 4, 5}, 80);
    for (const Shape& slope : {Shape{}, Shape{5}, Shape{3, 1, 1}, Shape{2, 3, 4, 5}}) {
      expectCudaMatchesReference(opCase("PRelu", {runtime(x), constant(dataOf(dtype, slope, 81))},
                                        {}, "kiln.binary", dtype));
    }
  }
  // Before opset 7: one slope per channel.
  expectCudaMatchesReference(opCase("PRelu",
                                    {runtime(floats({2, 3, 4}, 82)), constant(floats({3}, 83))}, {},
                                    "kiln.binary", DType::kFloat32, 6));
}

TEST(CudaEltwise, LegacyBroadcastAlignsBAtAxis) {
  const Tensor a = floats({2, 3, 4, 5}, 90);
  expectBinaryMatchesReference(opCase("Add", {runtime(a), runtime(floats({3, 4}, 91))},
                                      {{"broadcast", intAttr(1)}, {"axis", intAttr(1)}},
                                      "kiln.binary", DType::kFloat32, 6));
  expectBinaryMatchesReference(opCase("Mul", {runtime(a), runtime(floats({4, 5}, 92))},
                                      {{"broadcast", intAttr(1)}}, "kiln.binary", DType::kFloat32,
                                      6));
}

TEST(CudaEltwise, MaxAndMinPropagateNaN) {
  const Tensor a = values({kNaN, 1, kNaN, kInf, -kInf, 0.0f, -0.0f});
  const Tensor b = values({1, kNaN, kNaN, 2, -3, -0.0f, 0.0f});
  for (const char* op : {"Max", "Min"}) {
    expectCudaMatchesReference(opCase(op, {runtime(a), runtime(b)}, {}, "kiln.binary"));
  }
}

// --- Pow ---------------------------------------------------------------------------------------

TEST(CudaEltwise, PowOverMixedBaseAndExponentTypes) {
  // float ^ float, broadcast.
  expectCudaMatchesReference(
      opCase("Pow", {runtime(floats({4, 9}, 100, 0.1f, 4)), runtime(floats({9}, 101, -3, 3))}, {},
             "kiln.binary"));
  // float ^ integer: negative bases too.
  expectCudaMatchesReference(opCase("Pow",
                                    {runtime(floats({3, 7}, 102, -3, 3)),
                                     runtime(intsOf(DType::kInt32, {-3, -2, -1, 0, 1, 2, 5}))},
                                    {}, "kiln.binary"));
  // integer ^ integer: negative exponents, wrap-around, +-1 bases.
  for (DType dtype : {DType::kInt64, DType::kInt32, DType::kInt8, DType::kUInt8}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const bool isSigned = ir::isSigned(dtype);
    const Tensor base = intsOf(dtype, {isSigned ? -1 : 0, 1, 2, 3, 7, 0, isSigned ? -2 : 5, 10});
    const Tensor exponent =
        intsOf(dtype, {isSigned ? -3 : 3, isSigned ? -2 : 2, 0, 5, 30, 3, 9, 63});
    expectCudaMatchesReference(
        opCase("Pow", {runtime(base), runtime(exponent)}, {}, "kiln.binary", dtype));
  }
  // integer ^ float truncates the real power; float64 and float16 bases.
  expectCudaMatchesReference(opCase("Pow",
                                    {runtime(intsOf(DType::kInt32, {1, 2, 3, 4, 9, 100})),
                                     runtime(values({0.5f, 1.5f, 2, -1, 0.5f, 2.5f}))},
                                    {}, "kiln.binary", DType::kInt32));
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    expectCudaMatchesReference(opCase(
        "Pow",
        {runtime(dataOf(dtype, {5, 6}, 103, 0.1f, 3)), runtime(dataOf(dtype, {6}, 104, -2, 2))}, {},
        "kiln.binary", dtype));
  }
  // Special values.
  expectCudaMatchesReference(opCase("Pow",
                                    {runtime(values({0, -0.0f, kInf, -kInf, kNaN, 1, -1, -8})),
                                     runtime(values({0, -1, 0.5f, 3, 0, kNaN, kInf, 1.0f / 3}))},
                                    {}, "kiln.binary"));
  // integer ^ float whose real power is an integer: the truncation must keep it (roots, powers
  // of negative bases, integer-valued exponents, and results up to int32's range).
  for (DType dtype : {DType::kInt32, DType::kInt64, DType::kInt16}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    expectCudaMatchesReference(opCase(
        "Pow",
        {runtime(intsOf(dtype, {4, 9, 16, 25, 81, 100, 1000, 10, -3, -2, 8, 7, 49, 16384, 625})),
         runtime(values(
             {0.5f, 0.5f, 0.25f, 1.5f, 0.75f, 1.5f, 0.5f, 4, 3, 5, 1.5f, 2, 0.5f, 0.5f, 0.25f}))},
        {}, "kiln.binary", dtype));
  }
  expectCudaMatchesReference(opCase("Pow",
                                    {runtime(intsOf(DType::kInt32, {10, 3, 2, 6, 46340, 1024})),
                                     runtime(values({9, 19, 30, 11, 2, 3.0f}))},
                                    {}, "kiln.binary", DType::kInt32));
}

// --- Where, variadic ---------------------------------------------------------------------------

TEST(CudaEltwise, WhereBroadcastsItsThreeOperands) {
  const Tensor condition = randomBools({3, 1, 5}, 110);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kFloat64, DType::kInt64,
                      DType::kInt8, DType::kBool}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    expectCudaMatchesReference(opCase(
        "Where",
        {runtime(condition), runtime(dataOf(dtype, {4, 5}, 111)), runtime(dataOf(dtype, {}, 112))},
        {}, "kiln.binary", dtype));
    expectCudaMatchesReference(
        opCase("Where",
               {runtime(randomBools({6, 7}, 113)), runtime(dataOf(dtype, {6, 7}, 114)),
                constant(dataOf(dtype, {6, 7}, 115))},
               {}, "kiln.binary", dtype));
  }
}

TEST(CudaEltwise, VariadicSumMeanMaxMin) {
  for (DType dtype : kFloatTypes) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const std::vector<OpInput> three = {runtime(dataOf(dtype, {2, 3, 4}, 120)),
                                        runtime(dataOf(dtype, {3, 1}, 121)),
                                        constant(dataOf(dtype, {}, 122))};
    for (const char* op : {"Sum", "Mean", "Max", "Min"}) {
      expectCudaMatchesReference(opCase(op, three, {}, "kiln.binary", dtype));
      CudaOpCase one = opCase(op, {runtime(dataOf(dtype, {5, 3}, 123))}, {}, "kiln.binary", dtype);
      one.route = "-graph.eliminate_noops=off";  // a one-input Sum is otherwise removed
      expectCudaMatchesReference(one);
    }
  }
  std::vector<OpInput> eight;
  for (unsigned k = 0; k < 8; ++k) eight.push_back(runtime(floats({k % 2 ? 1 : 4, 6}, 130 + k)));
  for (const char* op : {"Sum", "Mean", "Max", "Min"}) {
    expectCudaMatchesReference(opCase(op, eight, {}, "kiln.binary"));
  }
  for (DType dtype : {DType::kInt32, DType::kInt64, DType::kUInt8}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    for (const char* op : {"Max", "Min"}) {
      expectCudaMatchesReference(
          opCase(op,
                 {runtime(dataOf(dtype, {4, 5}, 140)), runtime(dataOf(dtype, {5}, 141)),
                  runtime(dataOf(dtype, {4, 1}, 142))},
                 {}, "kiln.binary", dtype));
    }
  }
  const std::vector<OpInput> nans = {runtime(values({kNaN, 1, 2, kInf})),
                                     runtime(values({0, kNaN, 3, -kInf})),
                                     runtime(values({0, 1, kNaN, 1}))};
  for (const char* op : {"Sum", "Mean", "Max", "Min"}) {
    expectCudaMatchesReference(opCase(op, nans, {}, "kiln.binary"));
  }
}

// --- Clip --------------------------------------------------------------------------------------

TEST(CudaEltwise, ClipFromAttributesBeforeOpset11) {
  const Tensor x = values({-3, -1, 0, 0.5f, 2, 7, kNaN, kInf, -kInf, 1e38f});
  expectCudaMatchesReference(opCase("Clip", {runtime(x)},
                                    {{"min", floatAttr(-1)}, {"max", floatAttr(2)}}, "kiln.unary",
                                    DType::kFloat32, 6));
  // No attributes: float's range, which infinities are clamped to.
  expectCudaMatchesReference(opCase("Clip", {runtime(x)}, {}, "kiln.unary", DType::kFloat32, 6));
  expectCudaMatchesReference(
      opCase("Clip", {runtime(x)}, {{"max", floatAttr(0.25f)}}, "kiln.unary", DType::kFloat32, 6));
  for (DType dtype : {DType::kFloat16, DType::kFloat64}) {
    expectCudaMatchesReference(opCase("Clip", {runtime(x.castTo(dtype))},
                                      {{"min", floatAttr(-0.1f)}, {"max", floatAttr(1.3f)}},
                                      "kiln.unary", dtype, 6));
  }
}

TEST(CudaEltwise, ClipWithConstantAndRuntimeBounds) {
  const Tensor x = floats({7, 13}, 150, -4, 4);
  const Tensor low = Tensor::scalar<float>(-1.5f);
  const Tensor high = Tensor::scalar<float>(2.25f);
  expectCudaMatchesReference(
      opCase("Clip", {runtime(x), constant(low), constant(high)}, {}, "kiln.unary"));
  expectCudaMatchesReference(
      opCase("Clip", {runtime(x), runtime(low), runtime(high)}, {}, "kiln.unary"));
  expectCudaMatchesReference(opCase("Clip", {runtime(x), runtime(low)}, {}, "kiln.unary"));
  expectCudaMatchesReference(
      opCase("Clip", {runtime(x), OpInput{}, runtime(high)}, {}, "kiln.unary"));
  expectCudaMatchesReference(opCase("Clip", {runtime(x)}, {}, "kiln.unary"));
  // min > max gives max everywhere.
  expectCudaMatchesReference(
      opCase("Clip", {runtime(x), runtime(high), runtime(low)}, {}, "kiln.unary"));
  const Tensor special = values({kNaN, kInf, -kInf, 0});
  expectCudaMatchesReference(
      opCase("Clip", {runtime(special), runtime(low), constant(high)}, {}, "kiln.unary"));
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat64, DType::kInt32,
                      DType::kInt64, DType::kUInt8, DType::kInt8}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const Tensor data = dataOf(dtype, {5, 11}, 151);
    const Tensor lowT = Tensor::scalar<float>(2).castTo(dtype);
    const Tensor highT = Tensor::scalar<float>(60).castTo(dtype);
    expectCudaMatchesReference(opCase("Clip", {runtime(data), runtime(lowT), constant(highT)}, {},
                                      "kiln.unary", dtype, 13));
    expectCudaMatchesReference(
        opCase("Clip", {runtime(data), OpInput{}, runtime(highT)}, {}, "kiln.unary", dtype, 13));
    expectCudaMatchesReference(opCase("Clip", {runtime(data)}, {}, "kiln.unary", dtype, 13));
  }
}

// --- Cast --------------------------------------------------------------------------------------

// ONNX TensorProto.DataType numbers.
int64_t onnxType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 1;
    case DType::kUInt8:
      return 2;
    case DType::kInt8:
      return 3;
    case DType::kUInt16:
      return 4;
    case DType::kInt16:
      return 5;
    case DType::kInt32:
      return 6;
    case DType::kInt64:
      return 7;
    case DType::kBool:
      return 9;
    case DType::kFloat16:
      return 10;
    case DType::kFloat64:
      return 11;
    case DType::kUInt32:
      return 12;
    case DType::kUInt64:
      return 13;
    case DType::kBFloat16:
      return 16;
  }
  return 0;
}

// Values of `dtype` that reach every conversion's edge cases: fractions both ways, halves,
// values past the narrow types' ranges (saturation, or wrap-around from integers), NaN and
// infinities from floating types, zero and nonzero for bool.
Tensor castSource(DType dtype) {
  if (dtype == DType::kBool) return randomBools({12}, 160);
  if (ir::isFloating(dtype)) {
    return values({-3.7f,    -1.5f,     -0.5f,   0.0f,     -0.0f,       0.5f,    1.5f,
                   2.5f,     3.7f,      100.25f, -100.25f, 300.5f,      -300.5f, 65519.0f,
                   70000.0f, -70000.0f, 1e10f,   -1e10f,   1e20f,       -1e20f,  3.4e38f,
                   1e-8f,    kNaN,      kInf,    -kInf,    16777217.0f, 255.9f,  256.0f})
        .castTo(dtype);
  }
  std::vector<int64_t> v = {0,
                            1,
                            7,
                            127,
                            128,
                            255,
                            256,
                            32767,
                            32768,
                            65535,
                            65536,
                            2049,
                            4097,
                            16777217,
                            INT32_MAX,
                            (int64_t{1} << 40) + 1,
                            (int64_t{1} << 53) + 1,
                            INT64_MAX};
  if (ir::isSigned(dtype)) {
    for (int64_t x : {-1, -128, -129, -32769, -2049, INT32_MIN}) v.push_back(x);
    v.push_back(INT64_MIN);
  }
  return intsOf(dtype, v);
}

TEST(CudaEltwise, CastBetweenEveryPairOfTypes) {
  for (DType from : kAllTypes) {
    for (DType to : kAllTypes) {
      SCOPED_TRACE(std::string(ir::dtypeName(from)) + " -> " + std::string(ir::dtypeName(to)));
      CudaOpCase c = opCase("Cast", {runtime(castSource(from))}, {{"to", intAttr(onnxType(to))}},
                            "kiln.unary", DType::kInt64);  // exact: conversions round once
      c.route = "-graph.eliminate_noops=off";              // keep casts to the input's type
      expectCudaMatchesReference(c);
    }
  }
}

TEST(CudaEltwise, CastLikeTakesTheSecondInputsType) {
  CudaOpCase c = opCase("CastLike",
                        {runtime(castSource(DType::kFloat32)),
                         constant(Tensor::scalar<float>(0).castTo(DType::kFloat16))},
                        {}, "kiln.unary", DType::kInt64);
  expectCudaMatchesReference(c);
  CudaOpCase toInt = opCase(
      "CastLike", {runtime(castSource(DType::kFloat64)), runtime(intsOf(DType::kInt16, {1}))}, {},
      "kiln.unary", DType::kInt64);
  expectCudaMatchesReference(toInt);
}

// --- kiln.FusedElementwise ---------------------------------------------------------------------

// The reference rounds each instruction to float32 from double; the kernel computes each in
// float32, so long programs (whose sums may cancel) get a wider tolerance.
CudaOpCase fused(std::vector<std::string> program, std::vector<OpInput> inputs, double rtol = 1e-5,
                 double atol = 1e-6) {
  return fusedElementwiseCase(std::move(program), std::move(inputs), rtol, atol);
}

// Runs a fused case with the interpreter and with the generated kernel (where NVRTC loads; else
// the nvrtc route must fall back to the interpreter), on top of the case's own route.
void expectFusedMatchesReference(CudaOpCase c) {
  const std::string route = c.route;
  c.route = route + " -cuda.eltwise.codegen=interpreter";
  c.expectTactic = "kiln.fused_eltwise";
  expectCudaMatchesReference(c);
  c.route = route + " -cuda.eltwise.codegen=nvrtc";
  c.expectTactic = cuda::nvrtcAvailable() ? "kiln.fused_eltwise.nvrtc" : "kiln.fused_eltwise";
  expectCudaMatchesReference(c);
}

TEST(CudaEltwise, FusedProgramsOverBroadcastInputs) {
  // SiLU plus a bias row.
  expectFusedMatchesReference(fused({"Sigmoid x0", "Mul x0 t0", "Add t1 x1"},
                                    {runtime(floats({4, 33}, 170)), constant(floats({33}, 171))}));
  // Every opcode once, on a [3, 5, 7] output with scalar, column and middle-axis inputs.
  const std::vector<std::string> everyOpcode = {"Relu x0",
                                                "Sigmoid t0",
                                                "Tanh x1",
                                                "Exp t2",
                                                "Log t3",
                                                "Abs x0",
                                                "Sqrt t5",
                                                "Neg t6",
                                                "Erf x1",
                                                "Reciprocal t3",
                                                "HardSigmoid x0 0.3 0.4",
                                                "HardSwish x1",
                                                "LeakyRelu x0 0.1",
                                                "Clip x1 -0.5 0.75",
                                                "Gelu x0",
                                                "GeluTanh x1",
                                                "Add t14 t15",
                                                "Sub t16 x2",
                                                "Mul t17 x3",
                                                "Div t18 t9",
                                                "Pow t1 x2",
                                                "Max t19 t20",
                                                "Min t21 t13",
                                                "Add t22 t8",
                                                "Add t23 t11",
                                                "Add t24 t12",
                                                "Add t25 t10",
                                                "Add t26 t4",
                                                "Add t27 t7"};
  const std::vector<OpInput> inputs = {
      runtime(floats({3, 5, 7}, 172, -3, 3)), runtime(floats({5, 1}, 173, -3, 3)),
      constant(Tensor::scalar<float>(1.5f)), runtime(floats({3, 1, 7}, 174, -2, 2))};
  expectFusedMatchesReference(fused(everyOpcode, inputs, 1e-4, 1e-4));
  // Eight inputs, the most a launch takes, one of them a scalar.
  std::vector<OpInput> eight;
  std::vector<std::string> sum = {"Add x0 x1"};
  for (int k = 0; k < 8; ++k) {
    eight.push_back(k == 5 ? constant(Tensor::scalar<float>(0.25f))
                           : runtime(floats({2, 1031}, 180 + static_cast<unsigned>(k))));
    if (k >= 2) sum.push_back("Mul t" + std::to_string(k - 2) + " x" + std::to_string(k));
  }
  expectFusedMatchesReference(fused(sum, eight, 1e-4, 1e-4));
  // NaN and infinities through Max, Min and Clip.
  expectFusedMatchesReference(fused({"Max x0 x1", "Min t0 x1", "Clip t1 -1 1", "Add t2 t0"},
                                    {runtime(values({kNaN, 1, kInf, -kInf, 0, 3})),
                                     runtime(values({0, kNaN, 2, -2, -0.0f, kInf}))}));
  // ... and through HardSigmoid (NaN gives 1, as the reference's std::min(1, NaN)) and HardSwish.
  const Tensor special = values({kNaN, kInf, -kInf, 0, -3, 3, 2.5f, -2.5f});
  expectFusedMatchesReference(fused({"HardSigmoid x0 0.3 0.4"}, {runtime(special)}));
  expectFusedMatchesReference(fused({"HardSigmoid x0 0.2 0.5"}, {runtime(special)}));
  expectFusedMatchesReference(fused({"HardSwish x0"}, {runtime(special)}));
}

// Past kMaxBroadcastOperands inputs the node goes to the host (no GPU kernel takes it).
TEST(CudaEltwise, FusedProgramWithNineInputsFallsBackToTheHost) {
  std::vector<OpInput> nine;
  std::vector<std::string> sum = {"Add x0 x1"};
  for (int k = 0; k < 9; ++k) {
    nine.push_back(runtime(floats({16}, 190 + static_cast<unsigned>(k))));
    if (k >= 2) sum.push_back("Add t" + std::to_string(k - 2) + " x" + std::to_string(k));
  }
  BuilderConfig config;
  ASSERT_TRUE(config.setBuildRoute("").isOk());
  auto build =
      buildCuda(makeSingleOpGraph("FusedElementwise", nine, {{"program", ir::Attribute{sum}}}, 1, 1,
                                  ir::kKilnDomain),
                config);
  ASSERT_TRUE(build.isOk()) << build.status().toString();
  EXPECT_EQ(cudaTacticOf(*build, "FusedElementwise"), "host.reference");
}

// --- Reduced precision, vector width -----------------------------------------------------------

TEST(CudaEltwise, Float16RoutesRunTheEltwiseKernelsInHalf) {
  // cuda.precision=fp16 turns each float32 node into an fp16 one between Casts; the result is
  // compared with the float32 reference at half precision.
  const std::string route = "-cuda.precision=fp16";
  const std::vector<std::string> program = {"Mul x0 x1", "Gelu t0", "Add t1 x0"};
  CudaOpCase c = fused(
      program, {runtime(floats({8, 129}, 200, -2, 2)), runtime(floats({129}, 201, -2, 2))}, 1e-2);
  c.route = route;
  c.atol = 1e-2;
  expectFusedMatchesReference(c);
  for (const char* op : {"Relu", "Sigmoid", "Tanh", "Exp", "Neg"}) {
    CudaOpCase u = opCase(op, {runtime(floats({3, 65}, 202, -3, 3))}, {}, "kiln.unary");
    u.route = route;
    u.rtol = 1e-2;
    u.atol = 1e-2;
    expectCudaMatchesReference(u);
  }
  CudaOpCase b =
      opCase("Add", {runtime(floats({3, 65}, 203)), runtime(floats({65}, 204))}, {}, "kiln.binary");
  b.route = route;
  b.rtol = 1e-2;
  b.atol = 1e-2;
  expectBinaryMatchesReference(b);
}

TEST(CudaEltwise, VectorWidthOneMatchesToo) {
  const std::string route = "-cuda.eltwise.vector_width=1";
  CudaOpCase u = opCase("Tanh", {runtime(floats({1031}, 210))}, {}, "kiln.unary");
  u.route = route;
  expectCudaMatchesReference(u);
  CudaOpCase b =
      opCase("Mul", {runtime(floats({5, 4097}, 211)), runtime(floats({}, 212))}, {}, "kiln.binary");
  b.route = route;
  expectCudaMatchesReference(b);
  CudaOpCase f = fused({"Relu x0", "Add t0 x1"},
                       {runtime(floats({2, 1031}, 213)), runtime(floats({2, 1031}, 214))});
  f.route = route;
  expectFusedMatchesReference(f);
}

// --- In place ----------------------------------------------------------------------------------

// Builds `make()` for the CUDA backend (no elementwise fusion, so each node is its own step),
// checks that at least `inPlaceSteps` elementwise steps write over one of their inputs, and on a
// GPU compares the outputs with the reference executor's.
void expectInPlaceGraphMatchesReference(const std::function<ir::Graph()>& make,
                                        const std::vector<Tensor>& inputs, int inPlaceSteps) {
  ir::Graph reference = make();
  ASSERT_TRUE(ir::inferShapes(reference, nullptr).isOk());
  auto executor = reference::ReferenceExecutor::create(reference);
  ASSERT_TRUE(executor.isOk()) << executor.status().toString();
  auto expected = executor->run(inputs);
  ASSERT_TRUE(expected.isOk()) << expected.status().toString();

  BuilderConfig config;
  ASSERT_TRUE(config.setBuildRoute("-cuda.host_fallback=off -fusion.eltwise_chain=off").isOk());
  auto build = buildCuda(make(), config);
  ASSERT_TRUE(build.isOk()) << build.status().toString();
  int inPlace = 0;
  for (const auto& step : build->plan.steps()) {
    if (step->tactic.rfind("kiln.", 0) != 0 || !step->outputs[0]) continue;
    for (const auto& input : step->inputs) {
      if (input && !input->constant && input->offset == step->outputs[0]->offset) ++inPlace;
    }
  }
  EXPECT_GE(inPlace, inPlaceSteps);
  if (!cuda::deviceAvailable()) GTEST_SKIP() << cuda::currentDevice().status().message();
  ASSERT_TRUE(build->plan.fillArena(0xFF).isOk());
  auto actual = build->plan.run(inputs);
  ASSERT_TRUE(actual.isOk()) << actual.status().toString();
  ASSERT_EQ(actual->size(), expected->size());
  for (size_t o = 0; o < expected->size(); ++o) {
    ASSERT_EQ((*actual)[o].shape(), (*expected)[o].shape());
    for (int64_t i = 0; i < (*expected)[o].elementCount(); ++i) {
      const double e = (*expected)[o].elementAsDouble(i), a = (*actual)[o].elementAsDouble(i);
      ASSERT_NEAR(a, e, 1e-6 + 1e-5 * std::fabs(e)) << "output " << o << " element " << i;
    }
  }
}

TEST(CudaEltwise, KernelsWriteOverTheirOwnInput) {
  auto make = [] {
    GraphSketch g;
    auto x = g.input("x", {6, 1029});
    auto a = g.node("Exp", {g.node("Neg", {x}, {}, "neg")}, {}, "exp");  // over neg
    auto b = g.node("Mul", {a, g.weight("scale", {1029})}, {}, "mul");   // over exp, row bias
    auto c = g.node("Add", {b, x}, {}, "add");                           // over mul
    auto d = g.node("Clip", {c, g.constant("lo", Tensor::scalar<float>(0.5f)), ""}, {}, "clip");
    auto mask = g.node("Greater", {d, g.constant("one", Tensor::scalar<float>(1.0f))}, {}, "gt");
    auto e = g.node("Where", {mask, d, x}, {}, "where");  // over clip
    auto f = g.node("FusedElementwise", {e, g.weight("w", {6, 1})},
                    {{"program", ir::Attribute{std::vector<std::string>{"Mul x0 x1", "Tanh t0"}}}},
                    "fused", ir::kKilnDomain);   // over where
    g.output(g.node("Sum", {f, x}, {}, "sum"));  // over fused
    return g.take();
  };
  expectInPlaceGraphMatchesReference(make, {floats({6, 1029}, 220, -2, 2)}, 5);
}

}  // namespace
}  // namespace kiln::testing
