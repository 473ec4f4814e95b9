// The neural family (Conv, ConvTranspose, pooling, LRN, normalizations, Gemm, MatMul, Einsum) on
// what the ONNX conformance data lacks: auto_pad variants, groups, Indices storage order, opset
// and dtype rules, optional outputs, numpy promotion and einsum forms, and the errors for
// malformed nodes.
#include <gtest/gtest.h>

#include <cmath>

#include "op_test_util.h"

namespace kiln::testing {
namespace {

using ir::DType;
using ir::Shape;
using ir::Tensor;

OpInput in(Tensor tensor) { return {std::move(tensor), false}; }
OpInput omitted() { return {}; }

Tensor f32(Shape shape, std::vector<float> values) {
  return Tensor::fromVector<float>(std::move(shape), values);
}

// 0, 1, 2, ... as float32 of the given shape.
Tensor iota(Shape shape) {
  std::vector<float> values(static_cast<size_t>(shape.elementCount()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  return f32(std::move(shape), values);
}

std::vector<double> valuesOf(const Tensor& tensor) {
  std::vector<double> values;
  for (int64_t i = 0; i < tensor.elementCount(); ++i) values.push_back(tensor.elementAsDouble(i));
  return values;
}

// Expects output `output` to have `shape` and, within 1e-5 relative, `values`.
void expectOutput(const Result<std::vector<Tensor>>& result, const Shape& shape,
                  const std::vector<double>& values, size_t output = 0) {
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  ASSERT_LT(output, result->size());
  const Tensor& tensor = (*result)[output];
  EXPECT_EQ(tensor.shape(), shape);
  const std::vector<double> actual = valuesOf(tensor);
  ASSERT_EQ(actual.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_NEAR(actual[i], values[i], 1e-5 * std::max(1.0, std::fabs(values[i])))
        << "element " << i;
  }
}

// Expects failure with `code` and a message containing `text`.
void expectError(const Result<std::vector<Tensor>>& result, StatusCode code,
                 const std::string& text) {
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.status().code(), code) << result.status().toString();
  EXPECT_NE(result.status().message().find(text), std::string::npos) << result.status().message();
}

// ---- Conv ------------------------------------------------------------------------------------

TEST(Conv, SumsWindowsAndAddsBias) {
  auto result = runSingleOp(
      "Conv", {in(iota({1, 1, 3, 3})), in(f32({1, 1, 2, 2}, {1, 1, 1, 1})), in(f32({1}, {1}))});
  expectOutput(result, {1, 1, 2, 2}, {9, 13, 21, 25});
}

TEST(Conv, SameUpperPadsAtTheEndAndSameLowerAtTheStart) {
  const Tensor x = f32({1, 1, 1, 4}, {1, 2, 3, 4});
  const Tensor w = f32({1, 1, 1, 2}, {1, 10});
  expectOutput(runSingleOp("Conv", {in(x), in(w)}, {{"auto_pad", stringAttr("SAME_UPPER")}}),
               {1, 1, 1, 4}, {21, 32, 43, 4});
  expectOutput(runSingleOp("Conv", {in(x), in(w)}, {{"auto_pad", stringAttr("SAME_LOWER")}}),
               {1, 1, 1, 4}, {10, 21, 32, 43});
  // Pads that restate what auto_pad computes are accepted; others are an error.
  expectOutput(
      runSingleOp("Conv", {in(x), in(w)},
                  {{"auto_pad", stringAttr("SAME_LOWER")}, {"pads", intsAttr({0, 1, 0, 0})}}),
      {1, 1, 1, 4}, {10, 21, 32, 43});
  expectError(
      runSingleOp("Conv", {in(x), in(w)},
                  {{"auto_pad", stringAttr("SAME_LOWER")}, {"pads", intsAttr({0, 0, 0, 1})}}),
      StatusCode::kInvalidInput,
      "pads [0,0,0,1] disagree with auto_pad SAME_LOWER, which implies pads [0,1,0,0]");
}

TEST(Conv, ValidAutoPadWithStridesAndDilations) {
  // Dilation 2 reads x[i] and x[i+2]; stride 2 keeps outputs 0 and 2 of 0..3.
  auto result = runSingleOp("Conv", {in(iota({1, 1, 7})), in(f32({1, 1, 2}, {1, 1}))},
                            {{"auto_pad", stringAttr("VALID")},
                             {"dilations", intsAttr({2})},
                             {"strides", intsAttr({2})}});
  expectOutput(result, {1, 1, 3}, {2, 6, 10});
}

TEST(Conv, GroupsConvolveTheirOwnChannels) {
  auto result =
      runSingleOp("Conv", {in(f32({1, 2, 1, 1}, {1, 2})), in(f32({2, 1, 1, 1}, {3, 4})), omitted()},
                  {{"group", intAttr(2)}});
  expectOutput(result, {1, 2, 1, 1}, {3, 8});
}

TEST(Conv, Float64AndFloat16) {
  const Tensor x64 = iota({1, 1, 2, 2}).castTo(DType::kFloat64);
  const Tensor w64 = f32({1, 1, 2, 2}, {1, 2, 3, 4}).castTo(DType::kFloat64);
  auto result = runSingleOp("Conv", {in(x64), in(w64)});
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  EXPECT_EQ((*result)[0].dtype(), DType::kFloat64);
  expectOutput(result, {1, 1, 1, 1}, {20});
  auto half =
      runSingleOp("Conv", {in(x64.castTo(DType::kFloat16)), in(w64.castTo(DType::kFloat16))});
  ASSERT_TRUE(half.isOk()) << half.status().toString();
  EXPECT_EQ((*half)[0].dtype(), DType::kFloat16);
  expectOutput(half, {1, 1, 1, 1}, {20});
}

TEST(Conv, RejectsKernelShapeThatDisagreesWithWeight) {
  auto result = runSingleOp("Conv", {in(iota({1, 1, 3, 3})), in(iota({1, 1, 2, 2}))},
                            {{"kernel_shape", intsAttr({3, 3})}});
  expectError(result, StatusCode::kInvalidInput,
              "kernel_shape [3,3] does not match weight shape [1,1,2,2]");
}

TEST(Conv, RejectsChannelMismatch) {
  auto result = runSingleOp("Conv", {in(iota({1, 3, 3, 3})), in(iota({1, 2, 2, 2}))});
  expectError(result, StatusCode::kInvalidInput,
              "X [1,3,3,3] has 3 channels, but W [1,2,2,2] with group 1 expects 2");
}

TEST(Conv, RejectsBadAttributes) {
  const Tensor x = iota({1, 1, 3, 3});
  const Tensor w = iota({1, 1, 2, 2});
  expectError(runSingleOp("Conv", {in(x), in(w)}, {{"strides", intsAttr({1})}}),
              StatusCode::kInvalidInput, "attribute 'strides' [1] has 1 values, expected 2");
  expectError(runSingleOp("Conv", {in(x), in(w)}, {{"strides", intsAttr({1, 0})}}),
              StatusCode::kInvalidInput, "value 0 at position 1 is outside [1,");
  expectError(runSingleOp("Conv", {in(x), in(w)}, {{"auto_pad", stringAttr("SAME")}}),
              StatusCode::kInvalidInput, "auto_pad 'SAME' is not one of");
  expectError(runSingleOp("Conv", {in(x), in(w)},
                          {{"auto_pad", stringAttr("VALID")}, {"pads", intsAttr({1, 1, 1, 1})}}),
              StatusCode::kInvalidInput,
              "pads [1,1,1,1] disagree with auto_pad VALID, which implies pads [0,0,0,0]");
  expectError(runSingleOp("Conv", {in(x), in(iota({1, 1, 5, 5}))}), StatusCode::kInvalidInput,
              "the (dilated) kernel spans 5 positions but the padded input has only 3");
  expectError(runSingleOp("Conv", {in(x), in(w), in(f32({2}, {0, 0}))}), StatusCode::kInvalidInput,
              "input 2 (B) has shape [2]; expected [1]");
}

TEST(Conv, RejectsBFloat16BeforeOpset22) {
  auto result = runSingleOp("Conv", {in(iota({1, 1, 2, 2}).castTo(DType::kBFloat16)),
                                     in(iota({1, 1, 1, 1}).castTo(DType::kBFloat16))});
  expectError(result, StatusCode::kInvalidInput,
              "has dtype bfloat16; Conv at opset 18 accepts float16, float32, float64");
}

// ---- ConvTranspose ---------------------------------------------------------------------------

TEST(ConvTranspose, ScattersWithStrideAndBias) {
  // Each input element stamps the kernel [1, 10] at 2 * i.
  auto result =
      runSingleOp("ConvTranspose",
                  {in(f32({1, 1, 3}, {1, 2, 3})), in(f32({1, 1, 2}, {1, 10})), in(f32({1}, {100}))},
                  {{"strides", intsAttr({2})}});
  expectOutput(result, {1, 1, 6}, {101, 110, 102, 120, 103, 130});
}

TEST(ConvTranspose, OutputShapeSetsThePadding) {
  // Full extent 6 (1 10 2 20 3 30); output_shape 5 removes one position: by default from the
  // start, with SAME_UPPER from the end.
  const Tensor x = f32({1, 1, 3}, {1, 2, 3});
  const Tensor w = f32({1, 1, 2}, {1, 10});
  expectOutput(runSingleOp("ConvTranspose", {in(x), in(w)},
                           {{"strides", intsAttr({2})}, {"output_shape", intsAttr({5})}}),
               {1, 1, 5}, {10, 2, 20, 3, 30});
  expectOutput(runSingleOp("ConvTranspose", {in(x), in(w)},
                           {{"strides", intsAttr({2})},
                            {"output_shape", intsAttr({1, 1, 5})},
                            {"auto_pad", stringAttr("SAME_UPPER")}}),
               {1, 1, 5}, {1, 10, 2, 20, 3});
}

TEST(ConvTranspose, PadsMustAgreeWithOutputShape) {
  const Tensor x = f32({1, 1, 3}, {1, 2, 3});
  const Tensor w = f32({1, 1, 2}, {1, 10});
  // output_shape 5 implies pads [1, 0]; restating them is fine, contradicting them is not.
  expectOutput(runSingleOp("ConvTranspose", {in(x), in(w)},
                           {{"strides", intsAttr({2})},
                            {"output_shape", intsAttr({5})},
                            {"pads", intsAttr({1, 0})}}),
               {1, 1, 5}, {10, 2, 20, 3, 30});
  expectError(runSingleOp("ConvTranspose", {in(x), in(w)},
                          {{"strides", intsAttr({2})},
                           {"output_shape", intsAttr({5})},
                           {"pads", intsAttr({0, 1})}}),
              StatusCode::kInvalidInput,
              "pads [0,1] disagree with output_shape [5], which implies pads [1,0]");
}

TEST(ConvTranspose, GroupsAndOutputPadding) {
  // Two groups of one channel each, one output channel per group; output_padding adds a zero.
  auto result = runSingleOp("ConvTranspose",
                            {in(f32({1, 2, 2}, {1, 2, 3, 4})), in(f32({2, 1, 1}, {10, 100}))},
                            {{"group", intAttr(2)}, {"output_padding", intsAttr({1})}});
  expectOutput(result, {1, 2, 3}, {10, 20, 0, 300, 400, 0});
}

TEST(ConvTranspose, RejectsWeightWithWrongInputChannels) {
  auto result = runSingleOp("ConvTranspose", {in(iota({1, 2, 3})), in(iota({3, 1, 2}))});
  expectError(result, StatusCode::kInvalidInput,
              "W [3,1,2] must have X's channel count 2 as its first dimension");
}

// ---- Pooling ---------------------------------------------------------------------------------

TEST(MaxPool, IndicesInBothStorageOrders) {
  // x = [[0, 1, 2], [3, 4, 5]] with a 2x2 window and stride 1: maxima 4 and 5.
  const Tensor x = iota({1, 1, 2, 3});
  const std::map<std::string, ir::Attribute> rowMajor = {{"kernel_shape", intsAttr({2, 2})}};
  auto result = runSingleOp("MaxPool", {in(x)}, rowMajor, 12, 2);
  expectOutput(result, {1, 1, 1, 2}, {4, 5});
  expectOutput(result, {1, 1, 1, 2}, {4, 5}, 1);
  auto columnMajor =
      runSingleOp("MaxPool", {in(x)},
                  {{"kernel_shape", intsAttr({2, 2})}, {"storage_order", intAttr(1)}}, 12, 2);
  // Column-major over (H=2, W=3): element (h, w) is h + 2 * w.
  expectOutput(columnMajor, {1, 1, 1, 2}, {3, 5}, 1);
  ASSERT_TRUE(columnMajor.isOk());
  EXPECT_EQ((*columnMajor)[1].dtype(), DType::kInt64);
}

TEST(MaxPool, PaddingNeverWinsAndIndicesSkipIt) {
  const Tensor x = f32({1, 1, 1, 2}, {-5, -7});
  auto result =
      runSingleOp("MaxPool", {in(x)},
                  {{"kernel_shape", intsAttr({1, 2})}, {"pads", intsAttr({0, 1, 0, 1})}}, 12, 2);
  expectOutput(result, {1, 1, 1, 3}, {-5, -5, -7});
  expectOutput(result, {1, 1, 1, 3}, {0, 0, 1}, 1);
}

TEST(MaxPool, NaNLosesToNumbers) {
  const Tensor x = f32({1, 1, 3}, {std::nanf(""), 2, 1});
  expectOutput(runSingleOp("MaxPool", {in(x)}, {{"kernel_shape", intsAttr({2})}}), {1, 1, 2},
               {2, 2});
}

TEST(MaxPool, Int8FromOpset12Only) {
  const Tensor x = Tensor::fromVector<int8_t>(Shape{1, 1, 4}, {-3, 7, -128, 2});
  auto result = runSingleOp("MaxPool", {in(x)}, {{"kernel_shape", intsAttr({2})}}, 12);
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  EXPECT_EQ((*result)[0].dtype(), DType::kInt8);
  expectOutput(result, {1, 1, 3}, {7, 7, 2});
  expectError(runSingleOp("MaxPool", {in(x)}, {{"kernel_shape", intsAttr({2})}}, 11),
              StatusCode::kInvalidInput, "MaxPool at opset 11 accepts float16, float32, float64");
}

TEST(MaxPool, CeilModeDropsAWindowStartingInThePadding) {
  // Input 4, kernel 2, stride 2, pad end 1: ceil gives 3 windows, but the third would start at
  // position 4, inside the end padding, so only 2 remain.
  auto result = runSingleOp("MaxPool", {in(iota({1, 1, 4}))},
                            {{"kernel_shape", intsAttr({2})},
                             {"strides", intsAttr({2})},
                             {"pads", intsAttr({0, 1})},
                             {"ceil_mode", intAttr(1)}});
  expectOutput(result, {1, 1, 2}, {1, 3});
  // Input 5 under the same window: the third window starts at 4, inside the input.
  auto five = runSingleOp(
      "MaxPool", {in(iota({1, 1, 5}))},
      {{"kernel_shape", intsAttr({2})}, {"strides", intsAttr({2})}, {"ceil_mode", intAttr(1)}});
  expectOutput(five, {1, 1, 3}, {1, 3, 4});
}

TEST(MaxPool, RequiresKernelShape) {
  expectError(runSingleOp("MaxPool", {in(iota({1, 1, 4}))}), StatusCode::kInvalidInput,
              "kernel_shape");
}

TEST(AveragePool, CountIncludePadChangesTheDivisor) {
  const Tensor x = f32({1, 1, 3}, {3, 6, 9});
  const std::map<std::string, ir::Attribute> attrs = {{"kernel_shape", intsAttr({3})},
                                                      {"pads", intsAttr({1, 1})}};
  expectOutput(runSingleOp("AveragePool", {in(x)}, attrs), {1, 1, 3}, {4.5, 6, 7.5});
  auto withPad = attrs;
  withPad["count_include_pad"] = intAttr(1);
  expectOutput(runSingleOp("AveragePool", {in(x)}, withPad), {1, 1, 3}, {3, 6, 5});
}

TEST(AveragePool, DilationsAtOpset19) {
  auto result = runSingleOp("AveragePool", {in(iota({1, 1, 5}))},
                            {{"kernel_shape", intsAttr({2})}, {"dilations", intsAttr({3})}}, 19);
  expectOutput(result, {1, 1, 2}, {1.5, 2.5});
}

TEST(LpPool, PNormsOfWindows) {
  const Tensor x = f32({1, 1, 4}, {3, -4, 0, 5});
  expectOutput(
      runSingleOp("LpPool", {in(x)}, {{"kernel_shape", intsAttr({2})}, {"strides", intsAttr({2})}}),
      {1, 1, 2}, {5, 5});
  expectOutput(
      runSingleOp("LpPool", {in(x)},
                  {{"kernel_shape", intsAttr({2})}, {"strides", intsAttr({2})}, {"p", intAttr(1)}}),
      {1, 1, 2}, {7, 5});
}

TEST(GlobalPools, ReduceEverySpatialAxis) {
  const Tensor x = iota({1, 2, 2, 2});
  expectOutput(runSingleOp("GlobalAveragePool", {in(x)}), {1, 2, 1, 1}, {1.5, 5.5});
  expectOutput(runSingleOp("GlobalMaxPool", {in(x)}), {1, 2, 1, 1}, {3, 7});
  expectError(runSingleOp("GlobalMaxPool", {in(iota({2, 2}))}), StatusCode::kInvalidInput,
              "expected rank 3 or more");
}

TEST(Lrn, NormalizesAcrossNeighbouringChannels) {
  // size 2: channel c sums squares of channels c and c+1 (floor((2-1)/2) = 0 before).
  const Tensor x = f32({1, 3, 1, 1}, {1, 2, 3});
  auto result = runSingleOp("LRN", {in(x)},
                            {{"size", intAttr(2)},
                             {"alpha", floatAttr(2.0f)},
                             {"beta", floatAttr(1.0f)},
                             {"bias", floatAttr(1.0f)}});
  expectOutput(result, {1, 3, 1, 1}, {1.0 / 6, 2.0 / 14, 3.0 / 10});
  expectError(runSingleOp("LRN", {in(x)}), StatusCode::kInvalidInput, "'size' is missing");
}

// ---- Normalizations --------------------------------------------------------------------------

Tensor channelVector(std::vector<float> values) {
  return f32({static_cast<int64_t>(values.size())}, values);
}

TEST(BatchNormalization, UsesPerChannelStatistics) {
  const Tensor x = f32({1, 2, 2}, {1, 3, 10, 20});
  auto result = runSingleOp("BatchNormalization",
                            {in(x), in(channelVector({2, 1})), in(channelVector({0, 5})),
                             in(channelVector({1, 10})), in(channelVector({4, 1}))},
                            {{"epsilon", floatAttr(0.0f)}});
  expectOutput(result, {1, 2, 2}, {0, 2, 5, 15});
}

TEST(BatchNormalization, PerElementStatisticsWithSpatialZeroBeforeOpset9) {
  const Tensor x = f32({1, 2, 2}, {1, 3, 10, 20});
  const Tensor ones = f32({2, 2}, {1, 1, 1, 1});
  auto result = runSingleOp(
      "BatchNormalization",
      {in(x), in(ones), in(f32({2, 2}, {0, 0, 0, 0})), in(f32({2, 2}, {1, 2, 3, 4})), in(ones)},
      {{"epsilon", floatAttr(0.0f)}, {"spatial", intAttr(0)}}, 7);
  expectOutput(result, {1, 2, 2}, {0, 1, 7, 16});
}

TEST(BatchNormalization, TrainingIsUnsupported) {
  const Tensor x = f32({1, 2, 1}, {1, 2});
  const Tensor c = channelVector({1, 1});
  expectError(runSingleOp("BatchNormalization", {in(x), in(c), in(c), in(c), in(c)},
                          {{"training_mode", intAttr(1)}}, 15),
              StatusCode::kUnsupported, "training_mode=1 is not supported");
  expectError(runSingleOp("BatchNormalization", {in(x), in(c), in(c), in(c), in(c)}, {}, 9, 3),
              StatusCode::kUnsupported, "exists only in training mode");
}

TEST(BatchNormalization, DTypeRulesFollowTheOpset) {
  const Tensor x = f32({1, 2, 1}, {1, 2}).castTo(DType::kBFloat16);
  const Tensor c = channelVector({1, 1}).castTo(DType::kBFloat16);
  auto bf16 = runSingleOp("BatchNormalization", {in(x), in(c), in(c), in(c), in(c)}, {}, 14);
  expectOutput(bf16, {1, 2, 1}, {1, 2});  // (x - 1) / sqrt(1 + 1e-5) + 1, rounded
  expectError(runSingleOp("BatchNormalization", {in(x), in(c), in(c), in(c), in(c)}, {}, 9),
              StatusCode::kInvalidInput, "accepts float16, float32, float64");
  // From opset 15 the statistics may be float32 under a float16 X; before, they may not.
  const Tensor half = f32({1, 2, 1}, {1, 2}).castTo(DType::kFloat16);
  const Tensor stats = channelVector({1, 1});
  auto mixed = runSingleOp("BatchNormalization",
                           {in(half), in(stats), in(stats), in(stats), in(stats)}, {}, 15);
  expectOutput(mixed, {1, 2, 1}, {1, 1 + 1 / std::sqrt(1 + 1e-5)});
  expectError(runSingleOp("BatchNormalization",
                          {in(half), in(stats), in(stats), in(stats), in(stats)}, {}, 13),
              StatusCode::kInvalidInput, "input 1 (scale) has dtype float32, but input 0 has");
}

TEST(BatchNormalization, RejectsStatisticsOfTheWrongShape) {
  const Tensor x = f32({1, 2, 1}, {1, 2});
  const Tensor c = channelVector({1, 1});
  expectError(
      runSingleOp("BatchNormalization", {in(x), in(c), in(c), in(channelVector({1, 1, 1})), in(c)}),
      StatusCode::kInvalidInput, "input 3 (input_mean) has shape [3]; expected [2]");
}

TEST(LayerNormalization, WritesMeanAndInvStdDev) {
  const Tensor x = f32({2, 2}, {1, 3, 0, 4});
  auto result =
      runSingleOp("LayerNormalization", {in(x), in(f32({2}, {2, 3})), in(f32({2}, {1, 1}))},
                  {{"epsilon", floatAttr(0.0f)}}, 17, 3);
  expectOutput(result, {2, 2}, {-1, 4, -1, 4});
  expectOutput(result, {2, 1}, {2, 2}, 1);
  expectOutput(result, {2, 1}, {1, 0.5}, 2);
  ASSERT_TRUE(result.isOk());
  EXPECT_EQ((*result)[1].dtype(), DType::kFloat32);
}

TEST(LayerNormalization, AxisZeroNormalizesEverything) {
  const Tensor x = f32({2, 2}, {1, 3, 0, 4});
  const double inv = 1 / std::sqrt(2.5);
  auto result = runSingleOp("LayerNormalization", {in(x), in(f32({1}, {1}))},
                            {{"axis", intAttr(0)}, {"epsilon", floatAttr(0.0f)}}, 17, 3);
  expectOutput(result, {2, 2}, {-inv, inv, -2 * inv, 2 * inv});
  expectOutput(result, {1, 1}, {2}, 1);
}

TEST(LayerNormalization, Errors) {
  const Tensor x = f32({2, 2}, {1, 3, 0, 4});
  expectError(runSingleOp("LayerNormalization", {in(x), in(f32({2}, {1, 1}))}, {}, 16),
              StatusCode::kInvalidInput, "LayerNormalization exists from opset 17 on");
  expectError(runSingleOp("LayerNormalization", {in(x), in(f32({3}, {1, 1, 1}))}, {}, 17),
              StatusCode::kInvalidInput, "input 1 (Scale) has shape [3], which does not broadcast");
  expectError(
      runSingleOp("LayerNormalization", {in(x), in(f32({2}, {1, 1}))}, {{"axis", intAttr(2)}}, 17),
      StatusCode::kInvalidInput, "axis 2 is out of range for rank 2");
  expectError(runSingleOp("LayerNormalization", {in(x), in(f32({2}, {1, 1}))},
                          {{"stash_type", intAttr(11)}}, 17),
              StatusCode::kInvalidInput, "stash_type 11 is not 1 (float) or 16 (bfloat16)");
}

TEST(InstanceNormalization, NormalizesEachChannelOfEachSample) {
  const Tensor x = f32({1, 2, 2}, {1, 3, 5, 5});
  auto result = runSingleOp("InstanceNormalization",
                            {in(x), in(channelVector({1, 2})), in(channelVector({0, 7}))});
  const double v = 1 / std::sqrt(1 + 1e-5);
  expectOutput(result, {1, 2, 2}, {-v, v, 7, 7});
  expectError(runSingleOp("InstanceNormalization",
                          {in(x), in(channelVector({1})), in(channelVector({0, 7}))}),
              StatusCode::kInvalidInput, "input 1 (scale) has shape [1]; expected [2]");
}

TEST(LpNormalization, L1AndL2AlongAnAxis) {
  const Tensor x = f32({2, 2}, {3, 4, 1, -1});
  const double r = 1 / std::sqrt(2.0);
  expectOutput(runSingleOp("LpNormalization", {in(x)}), {2, 2}, {0.6, 0.8, r, -r});
  expectOutput(runSingleOp("LpNormalization", {in(x)}, {{"p", intAttr(1)}}), {2, 2},
               {3.0 / 7, 4.0 / 7, 0.5, -0.5});
  expectOutput(runSingleOp("LpNormalization", {in(x)}, {{"p", intAttr(1)}, {"axis", intAttr(0)}}),
               {2, 2}, {0.75, 0.8, 0.25, -0.2});
  expectError(runSingleOp("LpNormalization", {in(x)}, {{"p", intAttr(3)}}),
              StatusCode::kInvalidInput, "p must be 1 or 2, got 3");
}

TEST(MeanVarianceNormalization, DefaultAndExplicitAxes) {
  const Tensor x = f32({2, 1, 1, 2}, {1, 3, 5, 7});
  const double s = std::sqrt(5.0);
  expectOutput(runSingleOp("MeanVarianceNormalization", {in(x)}), {2, 1, 1, 2},
               {-3 / s, -1 / s, 1 / s, 3 / s});
  expectOutput(runSingleOp("MeanVarianceNormalization", {in(x)}, {{"axes", intsAttr({-1})}}),
               {2, 1, 1, 2}, {-1, 1, -1, 1});
  expectError(runSingleOp("MeanVarianceNormalization", {in(x)}, {{"axes", intsAttr({1, 1})}}),
              StatusCode::kInvalidInput, "axes [1,1] names axis 1 twice");
}

// ---- Gemm, MatMul ----------------------------------------------------------------------------

TEST(Gemm, TransposesScalesAndBroadcastsC) {
  // A' = [[0,1,2],[3,4,5]], B' = [[0,1],[2,3],[4,5]]: A'B' = [[10,13],[28,40]].
  const Tensor aT = f32({3, 2}, {0, 3, 1, 4, 2, 5});
  const Tensor bT = f32({2, 3}, {0, 2, 4, 1, 3, 5});
  const std::map<std::string, ir::Attribute> attrs = {{"transA", intAttr(1)},
                                                      {"transB", intAttr(1)},
                                                      {"alpha", floatAttr(2.0f)},
                                                      {"beta", floatAttr(3.0f)}};
  expectOutput(runSingleOp("Gemm", {in(aT), in(bT), in(f32({2}, {1, 2}))}, attrs), {2, 2},
               {23, 32, 59, 86});
  expectOutput(runSingleOp("Gemm", {in(aT), in(bT), in(f32({2, 1}, {1, 2}))}, attrs), {2, 2},
               {23, 29, 62, 86});
  expectOutput(runSingleOp("Gemm", {in(aT), in(bT)}, attrs, 11), {2, 2}, {20, 26, 56, 80});
}

TEST(Gemm, Errors) {
  const Tensor a = iota({2, 3});
  const Tensor b = iota({3, 2});
  expectError(runSingleOp("Gemm", {in(a), in(b)}, {}, 9), StatusCode::kInvalidInput,
              "input C is required before opset 11");
  expectError(runSingleOp("Gemm", {in(a), in(b), in(iota({3}))}), StatusCode::kInvalidInput,
              "C [3] does not broadcast to the output shape [2,2]");
  expectError(runSingleOp("Gemm", {in(a), in(a)}), StatusCode::kInvalidInput,
              "inner dimensions differ");
  expectError(runSingleOp("Gemm", {in(iota({6})), in(b)}), StatusCode::kInvalidInput,
              "must both be matrices");
}

TEST(Gemm, Int32) {
  const Tensor a = Tensor::fromVector<int32_t>(Shape{2, 2}, {1, 2, 3, 4});
  const Tensor b = Tensor::fromVector<int32_t>(Shape{2, 2}, {5, 6, 7, 8});
  const Tensor c = Tensor::fromVector<int32_t>(Shape{1}, {-100});
  auto result = runSingleOp("Gemm", {in(a), in(b), in(c)});
  expectOutput(result, {2, 2}, {-81, -78, -57, -50});
  ASSERT_TRUE(result.isOk());
  EXPECT_EQ((*result)[0].dtype(), DType::kInt32);
  expectError(runSingleOp("Gemm", {in(a), in(b), in(c)}, {{"alpha", floatAttr(0.5f)}}),
              StatusCode::kUnsupported, "integer Gemm with alpha=0.5");
}

TEST(MatMul, PromotesVectorsLikeNumpy) {
  const Tensor v = f32({3}, {1, 2, 3});
  expectOutput(runSingleOp("MatMul", {in(v), in(f32({3}, {4, 5, 6}))}), Shape{}, {32});
  expectOutput(runSingleOp("MatMul", {in(f32({2}, {1, 1})), in(iota({2, 2, 3}))}), {2, 3},
               {3, 5, 7, 15, 17, 19});
  expectOutput(runSingleOp("MatMul", {in(iota({2, 1, 2})), in(f32({2}, {1, 10}))}), {2, 1},
               {10, 32});
}

TEST(MatMul, BroadcastsBatchAxes) {
  auto result = runSingleOp("MatMul", {in(f32({2, 1, 1, 2}, {1, 2, 3, 4})), in(iota({3, 2, 1}))});
  expectOutput(result, {2, 3, 1, 1}, {2, 8, 14, 4, 18, 32});
}

TEST(MatMul, IntegersAndErrors) {
  const Tensor a = Tensor::fromVector<int64_t>(Shape{1, 2}, {int64_t{1} << 40, 3});
  const Tensor b = Tensor::fromVector<int64_t>(Shape{2, 1}, {2, 5});
  auto result = runSingleOp("MatMul", {in(a), in(b)});
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  EXPECT_EQ((*result)[0].data<int64_t>()[0], (int64_t{1} << 41) + 15);
  expectError(runSingleOp("MatMul", {in(a), in(b)}, {}, 8), StatusCode::kInvalidInput,
              "MatMul at opset 8 accepts float16, float32, float64");
  expectError(runSingleOp("MatMul", {in(iota({2, 3})), in(iota({2, 3}))}),
              StatusCode::kInvalidInput, "inner dimensions differ: A [2,3] has 3 columns");
  expectError(runSingleOp("MatMul", {in(iota({2, 2, 3})), in(iota({3, 3, 1}))}),
              StatusCode::kInvalidInput, "batch dimensions of A [2,2,3] and B [3,3,1]");
}

// ---- Einsum ----------------------------------------------------------------------------------

Result<std::vector<Tensor>> einsum(const std::string& equation, std::vector<Tensor> operands,
                                   int opset = 12) {
  std::vector<OpInput> inputs;
  for (auto& operand : operands) inputs.push_back(in(std::move(operand)));
  return runSingleOp("Einsum", inputs, {{"equation", stringAttr(equation)}}, opset);
}

TEST(Einsum, TracesDiagonalsAndTransposes) {
  expectOutput(einsum("ii", {iota({3, 3})}), Shape{}, {12});
  expectOutput(einsum("ii->i", {iota({3, 3})}), {3}, {0, 4, 8});
  expectOutput(einsum("ij->ji", {iota({2, 3})}), {3, 2}, {0, 3, 1, 4, 2, 5});
  // Implicit output: the letters in alphabetical order, so "ba" transposes.
  expectOutput(einsum("ba", {iota({2, 3})}), {3, 2}, {0, 3, 1, 4, 2, 5});
}

TEST(Einsum, ContractionsAndOuterProducts) {
  expectOutput(einsum("ij,jk", {iota({2, 3}), iota({3, 2})}), {2, 2}, {10, 13, 28, 40});
  expectOutput(einsum("i,j->ij", {f32({2}, {1, 2}), f32({3}, {3, 4, 5})}), {2, 3},
               {3, 4, 5, 6, 8, 10});
  expectOutput(einsum("i j , j k -> i k", {iota({2, 3}), iota({3, 2})}), {2, 2}, {10, 13, 28, 40});
}

TEST(Einsum, EllipsisBroadcasts) {
  expectOutput(einsum("...ij,...jk->...ik", {iota({2, 1, 2}), f32({2, 1}, {1, 10})}), {2, 1, 1},
               {10, 32});
  expectOutput(einsum("...i,...i->...", {iota({2, 3}), f32({3}, {1, 1, 1})}), {2}, {3, 12});
  expectOutput(einsum("...ii->...i", {iota({2, 2, 2})}), {2, 2}, {0, 3, 4, 7});
}

TEST(Einsum, Integers) {
  const Tensor x = Tensor::fromVector<int64_t>(Shape{2, 2}, {1, -2, 3, 40});
  auto result = einsum("ij->", {x});
  expectOutput(result, Shape{}, {42});
  ASSERT_TRUE(result.isOk());
  EXPECT_EQ((*result)[0].dtype(), DType::kInt64);
}

TEST(Einsum, Errors) {
  expectError(einsum("ij,jk->ik", {iota({2, 3})}), StatusCode::kInvalidInput,
              "equation 'ij,jk->ik' has 2 input terms, but the node has 1 inputs");
  expectError(einsum("i$", {iota({2, 3})}), StatusCode::kInvalidInput, "invalid character '$'");
  expectError(einsum("ij,jk", {iota({2, 3}), iota({2, 2})}), StatusCode::kInvalidInput,
              "label 'j' has size 2 in operand 1 [2,2] but 3 in another operand");
  expectError(einsum("...i->i", {iota({2, 3})}), StatusCode::kInvalidInput,
              "explicit output omits '...'");
  expectError(einsum("i->j", {iota({2})}), StatusCode::kInvalidInput,
              "output label 'j' does not appear in any input term");
  expectError(einsum("ij", {iota({2})}), StatusCode::kInvalidInput,
              "operand 0 has shape [2], but its einsum term names 2 axes");
  expectError(einsum("ii", {iota({2, 3})}), StatusCode::kInvalidInput,
              "label 'i' repeats in operand 0 [2,3] with different sizes 2 and 3");
  expectError(einsum("ii", {iota({2, 2})}, 11), StatusCode::kInvalidInput,
              "Einsum exists from opset 12 on");
  expectError(einsum("ii", {iota({2, 2}).castTo(DType::kBFloat16)}), StatusCode::kInvalidInput,
              "has dtype bfloat16");
}

}  // namespace
}  // namespace kiln::testing
