// kiln's own fused ops (FusedConv, FusedGemm): each must compute what the chain of ONNX ops it
// replaces computes, so the oracle is that chain run op by op through the reference kernels.
// Also the inference errors for malformed fused nodes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kiln/ir/op_schema.h"
#include "op_test_util.h"

namespace kiln::testing {
namespace {

using ir::Attribute;
using ir::DType;
using ir::Shape;
using ir::Tensor;

using Attributes = std::map<std::string, Attribute>;

// Runs the kiln-domain op `opType` on runtime inputs (an empty Tensor omits an optional input).
Result<std::vector<Tensor>> runFusedOp(const std::string& opType, const std::vector<Tensor>& inputs,
                                       const Attributes& attributes) {
  std::vector<testing::OpInput> runtime;
  for (const Tensor& input : inputs) runtime.push_back({input});
  return testing::runSingleOp(opType, runtime, attributes, 18, 1, ir::kKilnDomain);
}

Tensor randomTensor(Shape shape, unsigned seed) {
  return uniformTensor(std::move(shape), seed, -2, 2);
}

// One unfused step: the ONNX op on runtime inputs, its only output.
Tensor runStep(const std::string& opType, const std::vector<Tensor>& inputs,
               const Attributes& attributes = {}) {
  std::vector<OpInput> opInputs;
  for (const Tensor& t : inputs) opInputs.push_back({t, false});
  auto result = runSingleOp(opType, opInputs, attributes);
  EXPECT_TRUE(result.isOk()) << result.status().toString();
  return result.isOk() ? (*result)[0] : Tensor();
}

void expectClose(const Result<std::vector<Tensor>>& result, const Tensor& expected) {
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  const Tensor& actual = (*result)[0];
  ASSERT_EQ(actual.shape(), expected.shape());
  for (int64_t i = 0; i < expected.elementCount(); ++i) {
    const double e = expected.elementAsDouble(i);
    EXPECT_NEAR(actual.elementAsDouble(i), e, 1e-5 * std::max(1.0, std::fabs(e)))
        << "element " << i;
  }
}

void expectError(const Result<std::vector<Tensor>>& result, const std::string& text) {
  ASSERT_FALSE(result.isOk());
  EXPECT_NE(result.status().message().find(text), std::string::npos) << result.status().message();
}

const Attributes kConvAttributes = {{"pads", intsAttr({1, 1, 1, 1})},
                                    {"strides", intsAttr({1, 2})}};

TEST(FusedConv, IsConvThenResidualThenActivation) {
  const Tensor x = randomTensor(Shape{2, 4, 6, 7}, 1);
  const Tensor w = randomTensor(Shape{6, 2, 3, 3}, 2);
  const Tensor b = randomTensor(Shape{6}, 3);
  Attributes convAttributes = kConvAttributes;
  convAttributes["group"] = intAttr(2);
  const Tensor conv = runStep("Conv", {x, w, b}, convAttributes);
  const Tensor residual = randomTensor(conv.shape(), 4);
  const Tensor expected = runStep("Relu", {runStep("Add", {conv, residual})});
  Attributes attributes = convAttributes;
  attributes["activation"] = stringAttr("Relu");
  expectClose(runFusedOp("FusedConv", {x, w, b, residual}, attributes), expected);
}

TEST(FusedConv, WithoutActivationOrBiasIsConvPlusResidual) {
  const Tensor x = randomTensor(Shape{1, 3, 5, 5}, 5);
  const Tensor w = randomTensor(Shape{4, 3, 3, 3}, 6);
  const Tensor conv = runStep("Conv", {x, w}, kConvAttributes);
  const Tensor residual = randomTensor(conv.shape(), 7);
  expectClose(runFusedOp("FusedConv", {x, w, Tensor(), residual}, kConvAttributes),
              runStep("Add", {conv, residual}));
}

// Every activation against its ONNX op: name, the ONNX op's attributes, the fused parameters.
struct ActivationCase {
  std::string name;
  Attributes onnx;
  Attributes fused;
};

TEST(FusedConv, EachActivationMatchesItsOnnxOp) {
  const std::vector<ActivationCase> cases = {
      {"Relu", {}, {}},
      {"LeakyRelu", {{"alpha", floatAttr(0.3f)}}, {{"activation_alpha", floatAttr(0.3f)}}},
      {"Sigmoid", {}, {}},
      {"Tanh", {}, {}},
      {"HardSwish", {}, {}},
      {"HardSigmoid",
       {{"alpha", floatAttr(0.25f)}, {"beta", floatAttr(0.4f)}},
       {{"activation_alpha", floatAttr(0.25f)}, {"activation_beta", floatAttr(0.4f)}}},
      {"Gelu", {}, {}},
  };
  const Tensor x = randomTensor(Shape{1, 2, 6, 6}, 8);
  const Tensor w = randomTensor(Shape{3, 2, 3, 3}, 9);
  const Tensor conv = runStep("Conv", {x, w}, kConvAttributes);
  for (const ActivationCase& c : cases) {
    SCOPED_TRACE(c.name);
    Attributes attributes = kConvAttributes;
    attributes.insert(c.fused.begin(), c.fused.end());
    attributes["activation"] = stringAttr(c.name);
    auto onnx = runSingleOp(c.name, {{conv, false}}, c.onnx, c.name == "Gelu" ? 20 : 18);
    ASSERT_TRUE(onnx.isOk()) << onnx.status().toString();
    expectClose(runFusedOp("FusedConv", {x, w}, attributes), (*onnx)[0]);
  }
}

// Silu has no ONNX op: it is x * Sigmoid(x), as the chain exporters write computes it.
TEST(FusedConv, SiluIsXTimesSigmoidOfX) {
  const Tensor x = randomTensor(Shape{1, 2, 6, 6}, 14);
  const Tensor w = randomTensor(Shape{3, 2, 3, 3}, 15);
  const Tensor conv = runStep("Conv", {x, w}, kConvAttributes);
  Attributes attributes = kConvAttributes;
  attributes["activation"] = stringAttr("Silu");
  expectClose(runFusedOp("FusedConv", {x, w}, attributes),
              runStep("Mul", {conv, runStep("Sigmoid", {conv})}));
}

// GeluTanh is ONNX's Gelu with approximate="tanh".
TEST(FusedConv, GeluTanhIsTheTanhApproximateGelu) {
  const Tensor x = randomTensor(Shape{1, 2, 6, 6}, 16);
  const Tensor w = randomTensor(Shape{3, 2, 3, 3}, 17);
  const Tensor conv = runStep("Conv", {x, w}, kConvAttributes);
  Attributes attributes = kConvAttributes;
  attributes["activation"] = stringAttr("GeluTanh");
  auto onnx = runSingleOp("Gelu", {{conv, false}}, {{"approximate", stringAttr("tanh")}}, 20);
  ASSERT_TRUE(onnx.isOk()) << onnx.status().toString();
  expectClose(runFusedOp("FusedConv", {x, w}, attributes), (*onnx)[0]);
}

TEST(FusedConv, ClipBoundsAreAlphaAndBeta) {
  const Tensor x = randomTensor(Shape{1, 2, 6, 6}, 10);
  const Tensor w = randomTensor(Shape{3, 2, 3, 3}, 11);
  const Tensor conv = runStep("Conv", {x, w}, kConvAttributes);
  const Tensor expected =
      runStep("Clip", {conv, Tensor::scalar<float>(-0.5f), Tensor::scalar<float>(1.5f)});
  Attributes attributes = kConvAttributes;
  attributes["activation"] = stringAttr("Clip");
  attributes["activation_alpha"] = floatAttr(-0.5f);
  attributes["activation_beta"] = floatAttr(1.5f);
  expectClose(runFusedOp("FusedConv", {x, w}, attributes), expected);
}

TEST(FusedConv, Float16RoundsLikeTheChain) {
  const Tensor x = randomTensor(Shape{1, 2, 4, 4}, 12).castTo(DType::kFloat16);
  const Tensor w = randomTensor(Shape{2, 2, 3, 3}, 13).castTo(DType::kFloat16);
  const Tensor conv = runStep("Conv", {x, w});
  Attributes attributes = {{"activation", stringAttr("Sigmoid")}};
  auto fused = runFusedOp("FusedConv", {x, w}, attributes);
  ASSERT_TRUE(fused.isOk()) << fused.status().toString();
  EXPECT_EQ((*fused)[0].dtype(), DType::kFloat16);
  const Tensor expected = runStep("Sigmoid", {conv});
  for (int64_t i = 0; i < expected.elementCount(); ++i) {
    EXPECT_NEAR((*fused)[0].elementAsDouble(i), expected.elementAsDouble(i), 1e-3);
  }
}

TEST(FusedConv, RejectsUnknownActivation) {
  expectError(runFusedOp("FusedConv",
                         {randomTensor(Shape{1, 1, 3, 3}, 1), randomTensor(Shape{1, 1, 1, 1}, 2)},
                         {{"activation", stringAttr("Swish")}}),
              "activation 'Swish' is not one of");
}

TEST(FusedConv, RejectsNonFloatActivationParameter) {
  expectError(
      runFusedOp("FusedConv",
                 {randomTensor(Shape{1, 1, 3, 3}, 1), randomTensor(Shape{1, 1, 1, 1}, 2)},
                 {{"activation", stringAttr("LeakyRelu")}, {"activation_alpha", intAttr(1)}}),
      "activation_alpha");
}

TEST(FusedConv, RejectsResidualOfAnotherShape) {
  expectError(runFusedOp("FusedConv",
                         {randomTensor(Shape{1, 1, 3, 3}, 1), randomTensor(Shape{2, 1, 1, 1}, 2),
                          Tensor(), randomTensor(Shape{1, 1, 3, 3}, 3)},
                         {}),
              "residual float32[1,1,3,3] must have the convolution's type float32[1,2,3,3]");
}

TEST(FusedConv, ConvRulesApply) {
  // Conv's own inference: the channel check speaks of the weight and group.
  expectError(
      runFusedOp("FusedConv",
                 {randomTensor(Shape{1, 3, 3, 3}, 1), randomTensor(Shape{2, 2, 1, 1}, 2)}, {}),
      "has 3 channels, but W");
}

TEST(FusedGemm, BatchedMatMulPlusBiasThenActivation) {
  const Tensor a = randomTensor(Shape{2, 3, 4}, 20);
  const Tensor w = randomTensor(Shape{4, 5}, 21);
  const Tensor bias = randomTensor(Shape{5}, 22);
  const Tensor expected = runStep("Tanh", {runStep("Add", {runStep("MatMul", {a, w}), bias})});
  expectClose(runFusedOp("FusedGemm", {a, w, bias}, {{"activation", stringAttr("Tanh")}}),
              expected);
}

TEST(FusedGemm, GemmAttributesThenActivation) {
  const Tensor a = randomTensor(Shape{4, 3}, 23);
  const Tensor b = randomTensor(Shape{5, 4}, 24);
  const Tensor c = randomTensor(Shape{3, 5}, 25);
  const Attributes gemm = {{"transA", intAttr(1)},
                           {"transB", intAttr(1)},
                           {"alpha", floatAttr(0.5f)},
                           {"beta", floatAttr(2.0f)}};
  Attributes attributes = gemm;
  attributes["activation"] = stringAttr("LeakyRelu");
  attributes["activation_alpha"] = floatAttr(0.2f);
  const Tensor expected =
      runStep("LeakyRelu", {runStep("Gemm", {a, b, c}, gemm)}, {{"alpha", floatAttr(0.2f)}});
  expectClose(runFusedOp("FusedGemm", {a, b, c}, attributes), expected);
}

TEST(FusedGemm, BatchedWithTransposedWeightAndNoBias) {
  const Tensor a = randomTensor(Shape{2, 2, 3}, 26);
  const Tensor b = randomTensor(Shape{4, 3}, 27);
  const Tensor expected = runStep("Relu", {runStep("MatMul", {a, runStep("Transpose", {b})})});
  expectClose(
      runFusedOp("FusedGemm", {a, b}, {{"transB", intAttr(1)}, {"activation", stringAttr("Relu")}}),
      expected);
}

TEST(FusedGemm, RejectsBatchedTransA) {
  expectError(
      runFusedOp("FusedGemm", {randomTensor(Shape{2, 3, 4}, 1), randomTensor(Shape{4, 5}, 2)},
                 {{"transA", intAttr(1)}}),
      "needs transA=0");
}

TEST(FusedGemm, RejectsBatchedBiasThatVariesAlongRows) {
  expectError(runFusedOp("FusedGemm",
                         {randomTensor(Shape{2, 3, 4}, 1), randomTensor(Shape{4, 5}, 2),
                          randomTensor(Shape{3, 5}, 3)},
                         {}),
              "C [3,5] must broadcast to [5]");
}

TEST(FusedGemm, RejectsInnerDimensionMismatch) {
  expectError(
      runFusedOp("FusedGemm", {randomTensor(Shape{2, 3, 4}, 1), randomTensor(Shape{3, 5}, 2)}, {}),
      "inner dimensions differ");
  expectError(
      runFusedOp("FusedGemm", {randomTensor(Shape{3, 4}, 1), randomTensor(Shape{3, 5}, 2)}, {}),
      "inner dimensions differ");
}

TEST(FusedGemm, RejectsIntegers) {
  const Tensor a = Tensor::fromVector<int32_t>(Shape{1, 2}, {1, 2});
  const Tensor b = Tensor::fromVector<int32_t>(Shape{2, 1}, {3, 4});
  expectError(runFusedOp("FusedGemm", {a, b}, {}), "FusedGemm accepts float16, float32, float64");
}

}  // namespace
}  // namespace kiln::testing
