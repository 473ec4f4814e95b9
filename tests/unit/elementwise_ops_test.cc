// Elementwise ops on what the ONNX conformance data (ONNX 1.12) leaves out: ops newer than it
// (Gelu, Mish, Bitwise*), integer and half-precision dtypes, legacy opset-6 broadcasting, the
// conversions Cast must get right, and the errors for bad types, shapes and attributes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "op_test_util.h"

namespace kiln {
namespace {

using ir::Attribute;
using ir::BFloat16;
using ir::DType;
using ir::Float16;
using ir::Shape;
using ir::Tensor;
using testing::floatAttr;
using testing::intAttr;
using testing::OpInput;
using testing::runSingleOp;
using testing::stringAttr;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

template <typename T>
Tensor tensor(Shape shape, std::vector<T> values) {
  return Tensor::fromVector<T>(std::move(shape), values);
}

Tensor floats(std::vector<float> values) {
  const auto count = static_cast<int64_t>(values.size());
  return tensor<float>({count}, std::move(values));
}

template <typename T>
std::vector<T> values(const Tensor& t) {
  auto data = t.data<T>();
  return {data.begin(), data.end()};
}

// Runs the op and returns its outputs, failing the test on an error.
std::vector<Tensor> runAll(const std::string& op, const std::vector<OpInput>& inputs,
                           const std::map<std::string, Attribute>& attributes, int opset,
                           int outputCount) {
  auto result = runSingleOp(op, inputs, attributes, opset, outputCount);
  EXPECT_TRUE(result.isOk()) << result.status().toString();
  return result.isOk() ? *result : std::vector<Tensor>(static_cast<size_t>(outputCount));
}

Tensor runOk(const std::string& op, const std::vector<OpInput>& inputs,
             const std::map<std::string, Attribute>& attributes = {}, int opset = 18) {
  return runAll(op, inputs, attributes, opset, 1)[0];
}

// Runs the op expecting an error of `code` whose message contains `text`.
void expectError(const std::string& op, const std::vector<OpInput>& inputs,
                 const std::map<std::string, Attribute>& attributes, int opset, StatusCode code,
                 const std::string& text) {
  auto result = runSingleOp(op, inputs, attributes, opset);
  ASSERT_FALSE(result.isOk()) << op << " unexpectedly succeeded";
  EXPECT_EQ(result.status().code(), code) << result.status().toString();
  EXPECT_NE(result.status().message().find(text), std::string::npos) << result.status().message();
}

void expectFloatsNear(const std::vector<float>& actual, const std::vector<double>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(actual[i], expected[i], 1e-6 + 1e-6 * std::fabs(expected[i])) << "element " << i;
  }
}

// --- Every op on every dtype ------------------------------------------------------------------

// Shape inference decides which dtypes an op accepts and the kernel dispatches on them
// separately; for every dtype the two must agree: accepted and computed, or refused as invalid.
TEST(Elementwise, InferenceAndKernelAgreeOnDTypes) {
  const std::vector<std::pair<std::string, std::map<std::string, Attribute>>> unaryOps = {
      {"Relu", {}},  {"LeakyRelu", {}},   {"Sigmoid", {}},
      {"Tanh", {}},  {"HardSigmoid", {}}, {"HardSwish", {}},
      {"Elu", {}},   {"Selu", {}},        {"Celu", {}},
      {"Gelu", {}},  {"Softplus", {}},    {"Softsign", {}},
      {"Erf", {}},   {"Exp", {}},         {"Log", {}},
      {"Sqrt", {}},  {"Reciprocal", {}},  {"Abs", {}},
      {"Neg", {}},   {"Floor", {}},       {"Ceil", {}},
      {"Round", {}}, {"Sign", {}},        {"Sin", {}},
      {"Cos", {}},   {"Tan", {}},         {"Asin", {}},
      {"Acos", {}},  {"Atan", {}},        {"Sinh", {}},
      {"Cosh", {}},  {"Asinh", {}},       {"Acosh", {}},
      {"Atanh", {}}, {"Not", {}},         {"IsNaN", {}},
      {"IsInf", {}}, {"Shrink", {}},      {"ThresholdedRelu", {}},
      {"Mish", {}},  {"BitwiseNot", {}},  {"Identity", {}},
      {"Clip", {}},  {"Dropout", {}},     {"Cast", {{"to", intAttr(1)}}},
      {"Min", {}},   {"Max", {}},         {"Sum", {}},
      {"Mean", {}}};
  const std::vector<std::pair<std::string, std::map<std::string, Attribute>>> binaryOps = {
      {"Add", {}},         {"Sub", {}},
      {"Mul", {}},         {"Div", {}},
      {"Pow", {}},         {"Mod", {{"fmod", intAttr(1)}}},
      {"PRelu", {}},       {"Equal", {}},
      {"Less", {}},        {"Greater", {}},
      {"LessOrEqual", {}}, {"GreaterOrEqual", {}},
      {"And", {}},         {"Or", {}},
      {"Xor", {}},         {"BitShift", {{"direction", stringAttr("LEFT")}}},
      {"BitwiseAnd", {}},  {"BitwiseOr", {}},
      {"BitwiseXor", {}},  {"CastLike", {}},
      {"Min", {}},         {"Max", {}},
      {"Sum", {}},         {"Mean", {}}};
  std::map<std::string, int> accepted;  // "op/inputs" -> number of dtypes run
  for (int d = 0; d <= static_cast<int>(DType::kBool); ++d) {
    const DType dtype = static_cast<DType>(d);
    const Tensor ones = tensor<float>({2}, {1, 1}).castTo(dtype);
    auto check = [&](const std::string& op, const std::map<std::string, Attribute>& attributes,
                     const std::vector<OpInput>& inputs) {
      auto result = runSingleOp(op, inputs, attributes, 20);
      EXPECT_TRUE(result.isOk() || result.status().code() == StatusCode::kInvalidInput)
          << op << " on " << ir::dtypeName(dtype) << ": " << result.status().toString();
      accepted[op + "/" + std::to_string(inputs.size())] += result.isOk();
    };
    for (const auto& [op, attributes] : unaryOps) check(op, attributes, {{ones}});
    for (const auto& [op, attributes] : binaryOps) check(op, attributes, {{ones}, {ones}});
    check("Where", {}, {{tensor<bool>({2}, {true, false})}, {ones}, {ones}});
  }
  EXPECT_EQ(accepted["Add/2"], 12);  // every numeric type
  EXPECT_EQ(accepted["Relu/1"], 8);  // floats and signed integers
  EXPECT_EQ(accepted["Sin/1"], 4);
  EXPECT_EQ(accepted["Not/1"], 1);
  EXPECT_EQ(accepted["BitShift/2"], 4);
  EXPECT_EQ(accepted["PRelu/2"], 8);
  EXPECT_EQ(accepted["Equal/2"], 13);
  EXPECT_EQ(accepted["Where/3"], 13);
  EXPECT_EQ(accepted["Cast/1"], 13);
}

// --- Unary -------------------------------------------------------------------------------------

TEST(Gelu, ExactAndTanhApproximation) {
  Tensor x = floats({-2, -0.5f, 0, 1, 3});
  expectFloatsNear(
      values<float>(runOk("Gelu", {{x}}, {}, 20)),
      {-0.04550026389635842, -0.15426876936299344, 0, 0.8413447460685429, 2.99595030590511});
  expectFloatsNear(
      values<float>(runOk("Gelu", {{x}}, {{"approximate", stringAttr("tanh")}}, 20)),
      {-0.04540230591222494, -0.15428599017485606, 0, 0.8411919906082768, 2.996362607918227});
}

TEST(Gelu, RejectsUnknownApproximation) {
  expectError("Gelu", {{floats({1})}}, {{"approximate", stringAttr("fast")}}, 20,
              StatusCode::kInvalidInput,
              "'approximate' must be \"none\" or \"tanh\", got \"fast\"");
}

TEST(Mish, MatchesDefinition) {
  Tensor x = floats({-3, -1, 0, 1, 25});
  expectFloatsNear(values<float>(runOk("Mish", {{x}})),
                   {-0.1456474612756246, -0.30340146137410895, 0, 0.8650983882673103, 25});
}

TEST(Relu, SignedIntegersSinceOpset14) {
  Tensor x = tensor<int8_t>({4}, {-128, -1, 0, 127});
  EXPECT_EQ(values<int8_t>(runOk("Relu", {{x}}, {}, 14)), (std::vector<int8_t>{0, 0, 0, 127}));
}

TEST(Relu, RejectsUnsignedAndBool) {
  expectError("Relu", {{tensor<uint8_t>({1}, {1})}}, {}, 14, StatusCode::kInvalidInput,
              "input 0 has type uint8");
  expectError("Relu", {{tensor<bool>({1}, {true})}}, {}, 14, StatusCode::kInvalidInput,
              "input 0 has type bool");
}

TEST(Round, HalvesToEven) {
  Tensor x = floats({0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 2.4f, -2.6f});
  EXPECT_EQ(values<float>(runOk("Round", {{x}})), (std::vector<float>{0, 2, 2, -0.0f, -2, 2, -3}));
}

TEST(Sign, IntegersAndNaN) {
  EXPECT_EQ(values<int32_t>(runOk("Sign", {{tensor<int32_t>({3}, {-7, 0, 9})}})),
            (std::vector<int32_t>{-1, 0, 1}));
  auto out = values<float>(runOk("Sign", {{floats({kNaN, -0.0f, -3})}}));
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], -1.0f);
}

TEST(AbsNeg, IntegerExtremesWrapLikeNumpy) {
  Tensor x = tensor<int8_t>({3}, {-128, -5, 5});
  EXPECT_EQ(values<int8_t>(runOk("Abs", {{x}})), (std::vector<int8_t>{-128, 5, 5}));
  EXPECT_EQ(values<int8_t>(runOk("Neg", {{x}})), (std::vector<int8_t>{-128, 5, -5}));
  Tensor big = tensor<int64_t>({1}, {std::numeric_limits<int64_t>::min()});
  EXPECT_EQ(values<int64_t>(runOk("Neg", {{big}}))[0], std::numeric_limits<int64_t>::min());
}

TEST(Erf, IntegerInputTruncates) {
  // erf lies in (-1, 1), so the result cast back to the integer type truncates to 0.
  EXPECT_EQ(values<int32_t>(runOk("Erf", {{tensor<int32_t>({3}, {-3, 1, 3})}})),
            (std::vector<int32_t>{0, 0, 0}));
}

TEST(Shrink, IntegerInput) {
  Tensor x = tensor<int32_t>({5}, {-4, -1, 0, 1, 4});
  Tensor out = runOk("Shrink", {{x}}, {{"lambd", floatAttr(1.5f)}, {"bias", floatAttr(1.0f)}});
  EXPECT_EQ(values<int32_t>(out), (std::vector<int32_t>{-3, 0, 0, 0, 3}));
}

TEST(Celu, RejectsZeroAlpha) {
  expectError("Celu", {{floats({1})}}, {{"alpha", floatAttr(0)}}, 12, StatusCode::kInvalidInput,
              "'alpha' must not be 0");
}

TEST(LeakyRelu, RejectsWrongAttributeKindAtBuildTime) {
  auto result = runSingleOp("LeakyRelu", {{floats({1})}}, {{"alpha", stringAttr("big")}});
  ASSERT_FALSE(result.isOk());
  EXPECT_NE(result.status().message().find("alpha"), std::string::npos)
      << result.status().message();
}

TEST(IsInf, DetectsOnlyTheRequestedSign) {
  Tensor x = floats({-kInf, kInf, kNaN, 1});
  EXPECT_EQ(values<bool>(runOk("IsInf", {{x}}, {{"detect_positive", intAttr(0)}}, 10)),
            (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(values<bool>(runOk("IsInf", {{x}}, {{"detect_negative", intAttr(0)}}, 10)),
            (std::vector<bool>{false, true, false, false}));
  expectError("IsInf", {{x}}, {{"detect_negative", intAttr(2)}}, 10, StatusCode::kInvalidInput,
              "'detect_negative' must be 0 or 1");
}

TEST(Not, RejectsNonBool) {
  expectError("Not", {{floats({1})}}, {}, 18, StatusCode::kInvalidInput,
              "input 0 has type float32; the op accepts bool");
}

TEST(Bitwise, NotAndOrXorOnIntegers) {
  Tensor a = tensor<uint8_t>({3}, {0x0f, 0xf0, 0xff});
  Tensor b = tensor<uint8_t>({3}, {0x3c, 0x3c, 0x00});
  EXPECT_EQ(values<uint8_t>(runOk("BitwiseNot", {{a}})), (std::vector<uint8_t>{0xf0, 0x0f, 0x00}));
  EXPECT_EQ(values<uint8_t>(runOk("BitwiseAnd", {{a}, {b}})),
            (std::vector<uint8_t>{0x0c, 0x30, 0x00}));
  EXPECT_EQ(values<uint8_t>(runOk("BitwiseOr", {{a}, {b}})),
            (std::vector<uint8_t>{0x3f, 0xfc, 0xff}));
  EXPECT_EQ(values<uint8_t>(runOk("BitwiseXor", {{a}, {b}})),
            (std::vector<uint8_t>{0x33, 0xcc, 0xff}));
  Tensor s = tensor<int16_t>({2}, {5, -1});
  EXPECT_EQ(values<int16_t>(runOk("BitwiseNot", {{s}})), (std::vector<int16_t>{-6, 0}));
  expectError("BitwiseNot", {{floats({1})}}, {}, 18, StatusCode::kInvalidInput,
              "input 0 has type float32");
}

TEST(HalfPrecision, Float16AndBFloat16ComputeThroughFloat) {
  Tensor h = tensor<Float16>({2}, {Float16(1.5f), Float16(-2.0f)});
  Tensor sum = runOk("Add", {{h}, {h}});
  ASSERT_EQ(sum.dtype(), DType::kFloat16);
  EXPECT_EQ(static_cast<float>(sum.data<Float16>()[0]), 3.0f);
  EXPECT_EQ(static_cast<float>(sum.data<Float16>()[1]), -4.0f);
  Tensor b = tensor<BFloat16>({1}, {BFloat16(0.0f)});
  Tensor sigmoid = runOk("Sigmoid", {{b}});
  ASSERT_EQ(sigmoid.dtype(), DType::kBFloat16);
  EXPECT_EQ(static_cast<float>(sigmoid.data<BFloat16>()[0]), 0.5f);
}

// --- Binary ------------------------------------------------------------------------------------

TEST(Binary, RejectsMixedTypes) {
  expectError("Add", {{floats({1})}, {tensor<int64_t>({1}, {1})}}, {}, 14,
              StatusCode::kInvalidInput, "inputs 0 and 1 must have the same type");
}

TEST(Binary, RejectsUnbroadcastableShapes) {
  expectError("Mul", {{tensor<float>({2, 3}, std::vector<float>(6))}, {floats({1, 2})}}, {}, 14,
              StatusCode::kInvalidInput, "cannot be broadcast");
}

TEST(Binary, IntegerAdditionWraps) {
  Tensor a = tensor<int32_t>({1}, {std::numeric_limits<int32_t>::max()});
  EXPECT_EQ(values<int32_t>(runOk("Add", {{a}, {tensor<int32_t>({1}, {1})}}))[0],
            std::numeric_limits<int32_t>::min());
  Tensor u = tensor<uint16_t>({1}, {65535});
  EXPECT_EQ(values<uint16_t>(runOk("Mul", {{u}, {u}}))[0], 1);
}

TEST(Div, IntegersTruncateTowardZero) {
  Tensor a = tensor<int32_t>({4}, {-7, 7, -7, std::numeric_limits<int32_t>::min()});
  Tensor b = tensor<int32_t>({4}, {2, -2, -2, -1});
  EXPECT_EQ(values<int32_t>(runOk("Div", {{a}, {b}}, {}, 14)),
            (std::vector<int32_t>{-3, -3, 3, std::numeric_limits<int32_t>::min()}));
}

TEST(Div, RejectsIntegerDivisionByZero) {
  expectError("Div", {{tensor<int64_t>({2}, {1, 2})}, {tensor<int64_t>({2}, {1, 0})}}, {}, 14,
              StatusCode::kInvalidInput, "integer division by zero: input 1 holds 0 at index 1");
}

TEST(Mod, IntegerSignConventions) {
  Tensor a = tensor<int32_t>({4}, {-7, 7, -7, 7});
  Tensor b = tensor<int32_t>({4}, {3, -3, -3, 3});
  // fmod=0: Python's %, the sign of the divisor.
  EXPECT_EQ(values<int32_t>(runOk("Mod", {{a}, {b}}, {}, 13)),
            (std::vector<int32_t>{2, -2, -1, 1}));
  // fmod=1: C's fmod, the sign of the dividend.
  EXPECT_EQ(values<int32_t>(runOk("Mod", {{a}, {b}}, {{"fmod", intAttr(1)}}, 13)),
            (std::vector<int32_t>{-1, 1, -1, 1}));
}

TEST(Mod, FloatNeedsFmod) {
  expectError("Mod", {{floats({1})}, {floats({2})}}, {}, 13, StatusCode::kInvalidInput,
              "need attribute 'fmod' set to 1");
}

TEST(Pow, MixedTypesTakeTheBaseType) {
  Tensor base = tensor<int64_t>({4}, {2, 3, 2, -1});
  Tensor intExponent = tensor<int32_t>({4}, {10, 3, -1, -3});
  EXPECT_EQ(values<int64_t>(runOk("Pow", {{base}, {intExponent}}, {}, 15)),
            (std::vector<int64_t>{1024, 27, 0, -1}));
  Tensor floatExponent = floats({0.5f, 2.5f, 3, 2});
  // sqrt(2) = 1.41 and 3^2.5 = 15.59 truncate to the base's integer type.
  EXPECT_EQ(values<int64_t>(runOk("Pow", {{base}, {floatExponent}}, {}, 15)),
            (std::vector<int64_t>{1, 15, 8, 1}));
}

TEST(Pow, MixedTypesRefusedBeforeOpset12) {
  expectError("Pow", {{floats({2})}, {tensor<int64_t>({1}, {2})}}, {}, 7, StatusCode::kInvalidInput,
              "must have the same type");
}

TEST(BitShift, ShiftsAndWidthOverflow) {
  Tensor a = tensor<uint8_t>({3}, {1, 0x80, 0xff});
  Tensor amount = tensor<uint8_t>({3}, {7, 1, 8});
  EXPECT_EQ(
      values<uint8_t>(runOk("BitShift", {{a}, {amount}}, {{"direction", stringAttr("LEFT")}}, 11)),
      (std::vector<uint8_t>{0x80, 0x00, 0x00}));
  EXPECT_EQ(
      values<uint8_t>(runOk("BitShift", {{a}, {amount}}, {{"direction", stringAttr("RIGHT")}}, 11)),
      (std::vector<uint8_t>{0, 0x40, 0}));
  expectError("BitShift", {{a}, {amount}}, {{"direction", stringAttr("UP")}}, 11,
              StatusCode::kInvalidInput, "'direction' must be \"LEFT\" or \"RIGHT\", got \"UP\"");
  expectError("BitShift", {{tensor<int32_t>({1}, {1})}, {tensor<int32_t>({1}, {1})}},
              {{"direction", stringAttr("LEFT")}}, 11, StatusCode::kInvalidInput,
              "input 0 has type int32");
}

TEST(Comparison, EqualOnBoolAndNaN) {
  Tensor a = tensor<bool>({2}, {true, false});
  EXPECT_EQ(values<bool>(runOk("Equal", {{a}, {tensor<bool>({1}, {true})}}, {}, 11)),
            (std::vector<bool>{true, false}));
  EXPECT_EQ(values<bool>(runOk("Equal", {{floats({kNaN, 1})}, {floats({kNaN, 1})}}, {}, 11)),
            (std::vector<bool>{false, true}));
}

TEST(LegacyBroadcast, AddAlignsBAtAxisBeforeOpset7) {
  Tensor a = tensor<float>({2, 3, 2}, std::vector<float>(12, 0));
  Tensor b = tensor<float>({3}, {1, 2, 3});
  Tensor out = runOk("Add", {{a}, {b}}, {{"broadcast", intAttr(1)}, {"axis", intAttr(1)}}, 6);
  EXPECT_EQ(out.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(values<float>(out), (std::vector<float>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3}));
}

TEST(LegacyBroadcast, RequiresTheFlagAndFittingShapes) {
  Tensor a = tensor<float>({2, 3}, std::vector<float>(6, 0));
  expectError("Add", {{a}, {floats({1, 2, 3})}}, {}, 6, StatusCode::kInvalidInput,
              "differ and attribute 'broadcast' is not set");
  expectError("Add", {{a}, {floats({1, 2})}}, {{"broadcast", intAttr(1)}, {"axis", intAttr(1)}}, 6,
              StatusCode::kInvalidInput, "dimension 0 is 2, not 3");
}

TEST(PRelu, PerChannelSlopeBeforeOpset7) {
  Tensor x = tensor<float>({1, 2, 2}, {-1, 1, -1, 1});
  Tensor slope = floats({0.5f, 0.25f});
  EXPECT_EQ(values<float>(runOk("PRelu", {{x}, {slope}}, {}, 6)),
            (std::vector<float>{-0.5f, 1, -0.25f, 1}));
}

TEST(PRelu, SlopeMustBroadcastOntoX) {
  Tensor x = tensor<float>({2, 3}, std::vector<float>(6, -1));
  expectError("PRelu", {{x}, {tensor<float>({2, 3, 1}, std::vector<float>(6, 1))}}, {}, 16,
              StatusCode::kInvalidInput, "slope [2,3,1] does not broadcast onto X [2,3]");
  EXPECT_EQ(values<int32_t>(runOk(
                "PRelu", {{tensor<int32_t>({2}, {-4, 4})}, {tensor<int32_t>({1}, {3})}}, {}, 16)),
            (std::vector<int32_t>{-12, 4}));
}

// --- Variadic, Where ---------------------------------------------------------------------------

TEST(Variadic, MeanOfThreeBroadcastInputs) {
  Tensor a = tensor<float>({2, 1}, {1, 2});
  Tensor b = floats({10, 20, 30});
  Tensor c = tensor<float>({}, {4});
  Tensor out = runOk("Mean", {{a}, {b}, {c}}, {}, 13);
  EXPECT_EQ(out.shape(), (Shape{2, 3}));
  expectFloatsNear(values<float>(out), {5, 25.0 / 3, 35.0 / 3, 16.0 / 3, 26.0 / 3, 12});
}

TEST(Variadic, MaxPropagatesNaN) {
  auto out = values<float>(runOk("Max", {{floats({kNaN, 1})}, {floats({1, kNaN})}}, {}, 13));
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_TRUE(std::isnan(out[1]));
}

TEST(Variadic, ShapesMustMatchBeforeOpset8) {
  expectError("Sum", {{floats({1, 2})}, {floats({1})}}, {}, 6, StatusCode::kInvalidInput,
              "before opset 8 they must match");
}

TEST(Where, BroadcastsAllThree) {
  Tensor condition = tensor<bool>({2, 1}, {true, false});
  Tensor x = tensor<int64_t>({1, 3}, {1, 2, 3});
  Tensor y = tensor<int64_t>({}, {-1});
  Tensor out = runOk("Where", {{condition}, {x}, {y}}, {}, 16);
  EXPECT_EQ(out.shape(), (Shape{2, 3}));
  EXPECT_EQ(values<int64_t>(out), (std::vector<int64_t>{1, 2, 3, -1, -1, -1}));
  expectError("Where", {{floats({1})}, {x}, {y}}, {}, 16, StatusCode::kInvalidInput,
              "input 0 has type float32; the op accepts bool");
}

// --- Clip, Cast, Dropout -----------------------------------------------------------------------

TEST(Clip, AttributesBeforeOpset11) {
  Tensor x = floats({-5, 0, 5});
  EXPECT_EQ(values<float>(runOk("Clip", {{x}}, {{"min", floatAttr(-1)}, {"max", floatAttr(2)}}, 6)),
            (std::vector<float>{-1, 0, 2}));
}

TEST(Clip, IntegerWithOnlyMaxAndInvertedBounds) {
  Tensor x = tensor<int32_t>({3}, {-5, 0, 5});
  EXPECT_EQ(values<int32_t>(runOk("Clip", {{x}, {}, {tensor<int32_t>({}, {1})}}, {}, 13)),
            (std::vector<int32_t>{-5, 0, 1}));
  // min > max: everything becomes max, as numpy.clip gives.
  EXPECT_EQ(values<int32_t>(runOk(
                "Clip", {{x}, {tensor<int32_t>({}, {3})}, {tensor<int32_t>({}, {1})}}, {}, 13)),
            (std::vector<int32_t>{1, 1, 1}));
}

TEST(Clip, BoundsMustBeScalars) {
  expectError("Clip", {{floats({1, 2})}, {floats({0, 1})}}, {}, 13, StatusCode::kInvalidInput,
              "input 1 (min) must be a scalar");
}

TEST(Cast, FloatToIntegerAndBool) {
  Tensor x = floats({1.7f, -1.7f, 0, kNaN, 300});
  EXPECT_EQ(values<int32_t>(runOk("Cast", {{x}}, {{"to", intAttr(6)}}, 13)),
            (std::vector<int32_t>{1, -1, 0, 0, 300}));
  EXPECT_EQ(values<bool>(runOk("Cast", {{x}}, {{"to", intAttr(9)}}, 13)),
            (std::vector<bool>{true, true, false, true, true}));
  // Out of range: ONNX leaves it undefined; kiln saturates.
  EXPECT_EQ(values<uint8_t>(runOk("Cast", {{x}}, {{"to", intAttr(2)}}, 13)),
            (std::vector<uint8_t>{1, 0, 0, 0, 255}));
}

TEST(Cast, DoubleToFloat16RoundsOnce) {
  // 1 + 2^-11 + 2^-40 lies just above the midpoint between the halves 1 and 1 + 2^-10; via
  // float it would land on the midpoint and round to even (1).
  Tensor x = tensor<double>({1}, {1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)});
  Tensor out = runOk("Cast", {{x}}, {{"to", intAttr(10)}}, 13);
  EXPECT_EQ(out.data<Float16>()[0].bits, 0x3c01);
}

TEST(Cast, Int64ToBFloat16AndBack) {
  Tensor x = tensor<int64_t>({2}, {257, -3});
  Tensor half = runOk("Cast", {{x}}, {{"to", intAttr(16)}}, 13);
  EXPECT_EQ(static_cast<float>(half.data<BFloat16>()[0]), 256.0f);  // 8 significant bits
  EXPECT_EQ(values<int64_t>(runOk("Cast", {{half}}, {{"to", intAttr(7)}}, 13)),
            (std::vector<int64_t>{256, -3}));
}

TEST(Cast, RefusesStringsAndUnknownTypes) {
  expectError("Cast", {{floats({1})}}, {{"to", intAttr(8)}}, 13, StatusCode::kUnsupported,
              "attribute 'to': string tensors are not supported");
  expectError("Cast", {{floats({1})}}, {{"to", intAttr(99)}}, 13, StatusCode::kInvalidInput,
              "attribute 'to': 99 is not an ONNX element type");
  expectError("Cast", {{floats({1})}}, {}, 13, StatusCode::kInvalidInput, "'to'");
}

TEST(CastLike, TakesTheSecondInputsType) {
  Tensor out = runOk("CastLike", {{floats({2.9f, -0.5f})}, {tensor<int8_t>({1}, {0})}}, {}, 15);
  EXPECT_EQ(values<int8_t>(out), (std::vector<int8_t>{2, 0}));
}

TEST(Dropout, MaskTypeFollowsOpset) {
  Tensor x = floats({1, 2});
  auto old = runAll("Dropout", {{x}}, {{"ratio", floatAttr(0.3f)}}, 7, 2);
  EXPECT_EQ(values<float>(old[0]), (std::vector<float>{1, 2}));
  EXPECT_EQ(values<float>(old[1]), (std::vector<float>{1, 1}));
  auto current = runAll("Dropout", {{x}}, {}, 13, 2);
  EXPECT_EQ(values<bool>(current[1]), (std::vector<bool>{true, true}));
}

TEST(Dropout, TrainingModeOnlyWithZeroRatio) {
  Tensor x = floats({1, 2});
  Tensor on = tensor<bool>({}, {true});
  expectError("Dropout", {{x}, {tensor<float>({}, {0.5f}), true}, {on, true}}, {}, 13,
              StatusCode::kUnsupported, "training-mode Dropout with a nonzero ratio");
  // At run time too, when training_mode is not known at build time.
  expectError("Dropout", {{x}, {tensor<float>({}, {0.5f})}, {on}}, {}, 13, StatusCode::kUnsupported,
              "training-mode Dropout with a nonzero ratio");
  EXPECT_EQ(values<float>(runOk("Dropout", {{x}, {tensor<float>({}, {0.0f})}, {on}}, {}, 13)),
            (std::vector<float>{1, 2}));
  expectError("Dropout", {{x}, {tensor<float>({}, {1.0f}), true}}, {}, 13,
              StatusCode::kInvalidInput, "ratio must be in [0, 1), got 1");
}

TEST(Identity, CopiesAnyType) {
  Tensor x = tensor<uint16_t>({2, 1}, {7, 9});
  Tensor out = runOk("Identity", {{x}}, {}, 16);
  EXPECT_EQ(out.shape(), (Shape{2, 1}));
  EXPECT_EQ(values<uint16_t>(out), (std::vector<uint16_t>{7, 9}));
}

}  // namespace
}  // namespace kiln
