// The reduction family (Reduce*, ArgMax/ArgMin, Softmax/LogSoftmax/Hardmax, TopK, CumSum) on
// what the ONNX conformance data of libonnx-testdata 1.12 lacks: axes as an input at opset 18,
// empty sets, integer and half types, ties and NaN, and the errors for malformed nodes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "op_test_util.h"

namespace kiln::testing {
namespace {

using ir::DType;
using ir::Shape;
using ir::Tensor;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

OpInput runtime(Tensor tensor) { return {std::move(tensor), false}; }
OpInput constant(Tensor tensor) { return {std::move(tensor), true}; }
Tensor axes(std::vector<int64_t> values) {
  const int64_t count = static_cast<int64_t>(values.size());
  return Tensor::fromVector<int64_t>(Shape{count}, values);
}

// A 2x3 float input: [[1, 2, 3], [4, 5, 6]].
Tensor matrix() { return Tensor::fromVector<float>(Shape{2, 3}, {1, 2, 3, 4, 5, 6}); }

std::vector<double> valuesOf(const Tensor& tensor) {
  std::vector<double> values;
  for (int64_t i = 0; i < tensor.elementCount(); ++i) values.push_back(tensor.elementAsDouble(i));
  return values;
}

// Expects the op to succeed with one output of `shape` and (within 1e-6 relative) `values`;
// NaN and infinities must match exactly.
void expectOutput(const Result<std::vector<Tensor>>& result, const Shape& shape,
                  const std::vector<double>& values, size_t output = 0) {
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  const Tensor& tensor = (*result)[output];
  EXPECT_EQ(tensor.shape(), shape) << tensor.shape().toString();
  const std::vector<double> actual = valuesOf(tensor);
  ASSERT_EQ(actual.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i]) || std::isinf(values[i])) {
      EXPECT_TRUE(std::isnan(values[i]) ? std::isnan(actual[i]) : actual[i] == values[i])
          << "element " << i << ": " << actual[i] << " != " << values[i];
    } else {
      EXPECT_NEAR(actual[i], values[i], 1e-6 * std::max(1.0, std::fabs(values[i])))
          << "element " << i;
    }
  }
}

// Expects the op to fail with `code` and a message containing `text`.
void expectError(const Result<std::vector<Tensor>>& result, StatusCode code,
                 const std::string& text) {
  ASSERT_FALSE(result.isOk());
  EXPECT_EQ(result.status().code(), code) << result.status().toString();
  EXPECT_NE(result.status().message().find(text), std::string::npos) << result.status().message();
}

// --- Reduce* ---------------------------------------------------------------------------------

TEST(Reduce, AxesInputAtOpset18) {
  expectOutput(runSingleOp("ReduceMean", {runtime(matrix()), constant(axes({1}))},
                           {{"keepdims", intAttr(0)}}, 18),
               Shape{2}, {2, 5});
  expectOutput(runSingleOp("ReduceMax", {runtime(matrix()), constant(axes({-2}))}, {}, 18),
               Shape{1, 3}, {4, 5, 6});
}

TEST(Reduce, AxesAttributeBeforeOpset18) {
  expectOutput(runSingleOp("ReduceL2", {runtime(matrix())}, {{"axes", intsAttr({0})}}, 13),
               Shape{1, 3}, {std::sqrt(17.0), std::sqrt(29.0), std::sqrt(45.0)});
  expectOutput(runSingleOp("ReduceSum", {runtime(matrix())}, {{"axes", intsAttr({1})}}, 11),
               Shape{2, 1}, {6, 15});
}

TEST(Reduce, MissingAxesReduceEverything) {
  expectOutput(runSingleOp("ReduceProd", {runtime(matrix())}, {}, 18), Shape{1, 1}, {720});
  expectOutput(runSingleOp("ReduceSum", {runtime(matrix()), constant(axes({}))},
                           {{"keepdims", intAttr(0)}}, 13),
               Shape{}, {21});
}

TEST(Reduce, NoopWithEmptyAxesAppliesTheElementwisePart) {
  const std::map<std::string, ir::Attribute> noop = {{"noop_with_empty_axes", intAttr(1)}};
  expectOutput(runSingleOp("ReduceSum", {runtime(matrix()), constant(axes({}))}, noop, 13),
               Shape{2, 3}, {1, 2, 3, 4, 5, 6});
  expectOutput(runSingleOp("ReduceSumSquare", {runtime(matrix())}, noop, 18), Shape{2, 3},
               {1, 4, 9, 16, 25, 36});
}

TEST(Reduce, EmptySetsGiveTheIdentityOfEachReduction) {
  const Tensor empty = Tensor::fromVector<float>(Shape{2, 0}, {});
  const std::map<std::string, ir::Attribute> attrs = {{"keepdims", intAttr(0)}};
  auto run = [&](const char* op) {
    return runSingleOp(op, {runtime(empty), constant(axes({1}))}, attrs, 18);
  };
  expectOutput(run("ReduceSum"), Shape{2}, {0, 0});
  expectOutput(run("ReduceSumSquare"), Shape{2}, {0, 0});
  expectOutput(run("ReduceL1"), Shape{2}, {0, 0});
  expectOutput(run("ReduceL2"), Shape{2}, {0, 0});
  expectOutput(run("ReduceProd"), Shape{2}, {1, 1});
  expectOutput(run("ReduceMax"), Shape{2}, {-kInf, -kInf});
  expectOutput(run("ReduceMin"), Shape{2}, {kInf, kInf});
  expectOutput(run("ReduceLogSum"), Shape{2}, {-kInf, -kInf});
  expectOutput(run("ReduceLogSumExp"), Shape{2}, {-kInf, -kInf});
  expectOutput(run("ReduceMean"), Shape{2}, {kNaN, kNaN});
}

TEST(Reduce, IntegerEmptySetMaxIsTheLowestValue) {
  const Tensor empty = Tensor::fromVector<int32_t>(Shape{0, 2}, {});
  auto result = runSingleOp("ReduceMax", {runtime(empty), constant(axes({0}))}, {}, 18);
  expectOutput(result, Shape{1, 2},
               {std::numeric_limits<int32_t>::lowest(), std::numeric_limits<int32_t>::lowest()});
}

TEST(Reduce, MaxPropagatesNaN) {
  const Tensor input = Tensor::fromVector<float>(Shape{2, 2}, {1, NAN, NAN, 2});
  expectOutput(runSingleOp("ReduceMax", {runtime(input), constant(axes({1}))}, {}, 18), Shape{2, 1},
               {kNaN, kNaN});
}

TEST(Reduce, LogSumExpDoesNotOverflow) {
  const Tensor input = Tensor::fromVector<float>(Shape{2}, {1000, 1000});
  expectOutput(runSingleOp("ReduceLogSumExp", {runtime(input)}, {}, 13), Shape{1},
               {1000 + std::log(2.0)});
}

TEST(Reduce, IntegerSumsWrapAndMeansTruncate) {
  const Tensor big = Tensor::fromVector<int32_t>(Shape{2}, {2147483647, 1});
  expectOutput(runSingleOp("ReduceSum", {runtime(big)}, {}, 13), Shape{1}, {-2147483648.0});
  const Tensor odd = Tensor::fromVector<int64_t>(Shape{2}, {-3, -4});
  expectOutput(runSingleOp("ReduceMean", {runtime(odd)}, {}, 18), Shape{1}, {-3});
  expectOutput(runSingleOp("ReduceL1", {runtime(odd)}, {}, 18), Shape{1}, {7});
  // Exact beyond double's 53-bit mantissa.
  const Tensor exact = Tensor::fromVector<int64_t>(Shape{2}, {int64_t{1} << 60, 1});
  auto sum = runSingleOp("ReduceSum", {runtime(exact)}, {}, 13);
  ASSERT_TRUE(sum.isOk()) << sum.status().toString();
  EXPECT_EQ((*sum)[0].elementAsInt64(0), (int64_t{1} << 60) + 1);
}

TEST(Reduce, HalfPrecisionComputesThroughFloat) {
  const Tensor input = Tensor::fromVector<ir::Float16>(
      Shape{3}, {ir::Float16(0.5f), ir::Float16(1.5f), ir::Float16(2.0f)});
  auto result = runSingleOp("ReduceSum", {runtime(input)}, {}, 13);
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  EXPECT_EQ((*result)[0].dtype(), DType::kFloat16);
  expectOutput(result, Shape{1}, {4});
}

TEST(Reduce, BoolMaxAndMinFromOpset20) {
  const Tensor input = Tensor::fromVector<bool>(Shape{2, 2}, {true, false, false, false});
  expectOutput(runSingleOp("ReduceMax", {runtime(input), constant(axes({1}))}, {}, 20), Shape{2, 1},
               {1, 0});
  expectOutput(runSingleOp("ReduceMin", {runtime(input), constant(axes({0}))}, {}, 20), Shape{1, 2},
               {0, 0});
  expectError(runSingleOp("ReduceMax", {runtime(input)}, {}, 18), StatusCode::kInvalidInput,
              "input 0 has type bool");
}

TEST(Reduce, RejectsTypesTheSpecExcludes) {
  const Tensor bf16 = Tensor::fromVector<ir::BFloat16>(Shape{1}, {ir::BFloat16(1.0f)});
  expectError(runSingleOp("ReduceSum", {runtime(bf16)}, {}, 11), StatusCode::kInvalidInput,
              "input 0 has type bfloat16");
  const Tensor int8 = Tensor::fromVector<int8_t>(Shape{1}, {1});
  expectError(runSingleOp("ReduceSum", {runtime(int8)}, {}, 18), StatusCode::kInvalidInput,
              "input 0 has type int8");
  expectOutput(runSingleOp("ReduceMin", {runtime(int8)}, {}, 12), Shape{1}, {1});
}

TEST(Reduce, AxesMustBeKnownAtBuildTime) {
  expectError(runSingleOp("ReduceMean", {runtime(matrix()), runtime(axes({1}))}, {}, 18),
              StatusCode::kInvalidInput, "must be known at build time");
}

TEST(Reduce, AxesFormMustMatchTheOpset) {
  expectError(runSingleOp("ReduceMean", {runtime(matrix())}, {{"axes", intsAttr({1})}}, 18),
              StatusCode::kInvalidInput, "takes axes as an input from opset 18");
  expectError(runSingleOp("ReduceSum", {runtime(matrix()), constant(axes({1}))}, {}, 11),
              StatusCode::kInvalidInput, "takes axes as an attribute before opset 13");
}

TEST(Reduce, RejectsBadAxesAndKeepdims) {
  expectError(runSingleOp("ReduceSum", {runtime(matrix()), constant(axes({1, -1}))}, {}, 13),
              StatusCode::kInvalidInput, "axes name axis 1 twice");
  expectError(runSingleOp("ReduceMin", {runtime(matrix())}, {{"axes", intsAttr({2})}}, 13),
              StatusCode::kInvalidInput, "axis 2 is out of range for rank 2");
  expectError(runSingleOp("ReduceMin", {runtime(matrix())}, {{"keepdims", intAttr(2)}}, 13),
              StatusCode::kInvalidInput, "'keepdims' must be 0 or 1, got 2");
  const Tensor floatAxes = Tensor::fromVector<float>(Shape{1}, {1});
  expectError(runSingleOp("ReduceSum", {runtime(matrix()), constant(floatAxes)}, {}, 13),
              StatusCode::kInvalidInput, "axes must be a 1-D int64 tensor, got float32 [1]");
}

// --- ArgMax / ArgMin -------------------------------------------------------------------------

TEST(ArgReduce, TiesAndSelectLastIndex) {
  const Tensor input = Tensor::fromVector<int32_t>(Shape{2, 3}, {3, 1, 3, 0, 0, 2});
  expectOutput(runSingleOp("ArgMax", {runtime(input)}, {{"axis", intAttr(1)}}, 13), Shape{2, 1},
               {0, 2});
  expectOutput(runSingleOp("ArgMax", {runtime(input)},
                           {{"axis", intAttr(1)}, {"select_last_index", intAttr(1)}}, 13),
               Shape{2, 1}, {2, 2});
  expectOutput(runSingleOp("ArgMin", {runtime(input)},
                           {{"axis", intAttr(-1)}, {"keepdims", intAttr(0)}}, 13),
               Shape{2}, {1, 0});
}

TEST(ArgReduce, NaNWinsAsInNumpy) {
  const Tensor input = Tensor::fromVector<float>(Shape{4}, {1, NAN, 5, NAN});
  expectOutput(runSingleOp("ArgMax", {runtime(input)}, {}, 13), Shape{1}, {1});
  expectOutput(runSingleOp("ArgMin", {runtime(input)}, {{"select_last_index", intAttr(1)}}, 13),
               Shape{1}, {3});
}

TEST(ArgReduce, OutputIsInt64) {
  auto result = runSingleOp("ArgMin", {runtime(matrix())}, {}, 11);
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  EXPECT_EQ((*result)[0].dtype(), DType::kInt64);
  expectOutput(result, Shape{1, 3}, {0, 0, 0});
}

TEST(ArgReduce, RejectsEmptyAxisAndBadAxis) {
  const Tensor empty = Tensor::fromVector<float>(Shape{2, 0}, {});
  expectError(runSingleOp("ArgMax", {runtime(empty)}, {{"axis", intAttr(1)}}, 13),
              StatusCode::kInvalidInput, "axis 1 of input shape [2,0] is empty");
  expectError(runSingleOp("ArgMax", {runtime(matrix())}, {{"axis", intAttr(-3)}}, 13),
              StatusCode::kInvalidInput, "axis -3 is out of range for rank 2");
}

// --- Softmax / LogSoftmax / Hardmax ----------------------------------------------------------

TEST(Softmax, Opset13NormalisesOneAxis) {
  // [2, 2, 1] along axis 1: each pair (a, b) gives (1 - s, s) with s = sigmoid(b - a).
  const Tensor input = Tensor::fromVector<float>(Shape{2, 2, 1}, {0, 1, 2, 2});
  const double s = 1 / (1 + std::exp(-1.0));
  expectOutput(runSingleOp("Softmax", {runtime(input)}, {{"axis", intAttr(1)}}, 13), Shape{2, 2, 1},
               {1 - s, s, 0.5, 0.5});
}

TEST(Softmax, BeforeOpset13FlattensAtAxis) {
  // axis 0 coerces [2, 2, 1] to [1, 4]: one softmax over all four elements.
  const Tensor input = Tensor::fromVector<float>(Shape{2, 2, 1}, {0, 0, 0, 0});
  expectOutput(runSingleOp("Softmax", {runtime(input)}, {{"axis", intAttr(0)}}, 11), Shape{2, 2, 1},
               {0.25, 0.25, 0.25, 0.25});
  // The default axis 1 coerces to [2, 2]; at opset 13 the default is the last axis (size 1).
  expectOutput(runSingleOp("LogSoftmax", {runtime(input)}, {}, 11), Shape{2, 2, 1},
               {-std::log(2.0), -std::log(2.0), -std::log(2.0), -std::log(2.0)});
  expectOutput(runSingleOp("LogSoftmax", {runtime(input)}, {}, 13), Shape{2, 2, 1}, {0, 0, 0, 0});
}

TEST(Softmax, LargeInputsStayFinite) {
  const Tensor input = Tensor::fromVector<double>(Shape{2}, {1000, 1000});
  expectOutput(runSingleOp("Softmax", {runtime(input)}, {}, 13), Shape{2}, {0.5, 0.5});
  expectOutput(runSingleOp("LogSoftmax", {runtime(input)}, {}, 13), Shape{2},
               {-std::log(2.0), -std::log(2.0)});
}

TEST(Softmax, HardmaxPicksTheFirstMaximum) {
  const Tensor input = Tensor::fromVector<float>(Shape{2, 3}, {1, 3, 3, 2, 0, 2});
  expectOutput(runSingleOp("Hardmax", {runtime(input)}, {}, 13), Shape{2, 3}, {0, 1, 0, 1, 0, 0});
}

TEST(Softmax, BFloat16FromOpset13) {
  const Tensor input =
      Tensor::fromVector<ir::BFloat16>(Shape{2}, {ir::BFloat16(1.0f), ir::BFloat16(1.0f)});
  expectOutput(runSingleOp("Softmax", {runtime(input)}, {}, 13), Shape{2}, {0.5, 0.5});
  expectError(runSingleOp("Softmax", {runtime(input)}, {}, 11), StatusCode::kInvalidInput,
              "input 0 has type bfloat16");
}

TEST(Softmax, RejectsIntegersAndBadAxes) {
  const Tensor ints = Tensor::fromVector<int32_t>(Shape{2}, {1, 2});
  expectError(runSingleOp("Softmax", {runtime(ints)}, {}, 13), StatusCode::kInvalidInput,
              "input 0 has type int32");
  expectError(runSingleOp("Softmax", {runtime(matrix())}, {{"axis", intAttr(2)}}, 13),
              StatusCode::kInvalidInput, "axis 2 is out of range for rank 2");
  expectError(runSingleOp("Hardmax", {runtime(matrix())}, {{"axis", intAttr(3)}}, 11),
              StatusCode::kInvalidInput, "axis 3 is out of range for coercing rank 2 to 2-D");
}

// --- TopK ------------------------------------------------------------------------------------

Tensor kTensor(int64_t k) { return Tensor::fromVector<int64_t>(Shape{1}, {k}); }

TEST(TopK, TiesKeepTheLowerIndexFirst) {
  const Tensor input = Tensor::fromVector<float>(Shape{5}, {2, 7, 2, 7, 1});
  auto largest = runSingleOp("TopK", {runtime(input), constant(kTensor(3))}, {}, 11, 2);
  expectOutput(largest, Shape{3}, {7, 7, 2}, 0);
  expectOutput(largest, Shape{3}, {1, 3, 0}, 1);
  auto smallest =
      runSingleOp("TopK", {runtime(input), constant(kTensor(3))}, {{"largest", intAttr(0)}}, 11, 2);
  expectOutput(smallest, Shape{3}, {1, 2, 2}, 0);
  expectOutput(smallest, Shape{3}, {4, 0, 2}, 1);
}

TEST(TopK, NaNSortsAfterNumbers) {
  const Tensor input = Tensor::fromVector<float>(Shape{3}, {NAN, 1, 2});
  auto result = runSingleOp("TopK", {runtime(input), constant(kTensor(2))}, {}, 11, 2);
  expectOutput(result, Shape{2}, {2, 1}, 0);
  expectOutput(result, Shape{2}, {2, 1}, 1);
}

TEST(TopK, AlongAnInnerAxisOfIntegers) {
  const Tensor input = Tensor::fromVector<int32_t>(Shape{3, 2}, {5, 1, 9, 4, 7, 8});
  auto result =
      runSingleOp("TopK", {runtime(input), constant(kTensor(2))}, {{"axis", intAttr(0)}}, 11, 2);
  expectOutput(result, Shape{2, 2}, {9, 8, 7, 4}, 0);
  expectOutput(result, Shape{2, 2}, {1, 2, 2, 1}, 1);
}

TEST(TopK, AttributeKBeforeOpset10) {
  expectOutput(runSingleOp("TopK", {runtime(matrix())}, {{"k", intAttr(1)}}, 1, 2), Shape{2, 1},
               {3, 6}, 0);
  expectError(runSingleOp("TopK", {runtime(matrix())}, {}, 1, 2), StatusCode::kInvalidInput,
              "required attribute 'k' is missing");
  expectError(
      runSingleOp("TopK", {runtime(matrix()), constant(kTensor(1))}, {{"k", intAttr(1)}}, 10, 2),
      StatusCode::kInvalidInput, "the 'k' attribute is not allowed");
}

TEST(TopK, RejectsBadK) {
  expectError(runSingleOp("TopK", {runtime(matrix()), constant(kTensor(4))}, {}, 11, 2),
              StatusCode::kInvalidInput, "k = 4 is out of range for axis 1 of size 3");
  expectError(runSingleOp("TopK", {runtime(matrix()), runtime(kTensor(1))}, {}, 11, 2),
              StatusCode::kInvalidInput, "must be known at build time");
  const Tensor ints = Tensor::fromVector<int32_t>(Shape{1}, {1});
  expectError(runSingleOp("TopK", {runtime(ints), constant(kTensor(1))}, {}, 10, 2),
              StatusCode::kInvalidInput, "input 0 has type int32");
}

// --- CumSum ----------------------------------------------------------------------------------

Tensor axisTensor(int64_t axis) { return Tensor::scalar<int64_t>(axis); }

TEST(CumSum, ExclusiveReverseAlongAxis1) {
  expectOutput(runSingleOp("CumSum", {runtime(matrix()), runtime(axisTensor(1))},
                           {{"exclusive", intAttr(1)}, {"reverse", intAttr(1)}}, 14),
               Shape{2, 3}, {5, 3, 0, 11, 6, 0});
}

TEST(CumSum, Int64IsExact) {
  const Tensor input = Tensor::fromVector<int64_t>(Shape{2}, {int64_t{1} << 60, 1});
  auto result = runSingleOp("CumSum", {runtime(input), runtime(axisTensor(0))}, {}, 11);
  ASSERT_TRUE(result.isOk()) << result.status().toString();
  EXPECT_EQ((*result)[0].elementAsInt64(1), (int64_t{1} << 60) + 1);
}

TEST(CumSum, HalfTypesFromOpset14) {
  const Tensor input =
      Tensor::fromVector<ir::Float16>(Shape{2}, {ir::Float16(1.0f), ir::Float16(2.0f)});
  expectOutput(runSingleOp("CumSum", {runtime(input), runtime(axisTensor(0))}, {}, 14), Shape{2},
               {1, 3});
  expectError(runSingleOp("CumSum", {runtime(input), runtime(axisTensor(0))}, {}, 11),
              StatusCode::kInvalidInput, "input 0 has type float16");
}

TEST(CumSum, RejectsBadAxis) {
  // A runtime axis is checked when the kernel runs, a constant one at build time.
  expectError(runSingleOp("CumSum", {runtime(matrix()), runtime(axisTensor(2))}, {}, 14),
              StatusCode::kInvalidInput, "axis 2 is out of range for rank 2");
  expectError(runSingleOp("CumSum", {runtime(matrix()), constant(axisTensor(-3))}, {}, 14),
              StatusCode::kInvalidInput, "axis -3 is out of range for rank 2");
  const Tensor twoAxes = Tensor::fromVector<int64_t>(Shape{2}, {0, 1});
  expectError(runSingleOp("CumSum", {runtime(matrix()), constant(twoAxes)}, {}, 14),
              StatusCode::kInvalidInput, "axis must be a scalar or a one-element 1-D tensor");
}

}  // namespace
}  // namespace kiln::testing
