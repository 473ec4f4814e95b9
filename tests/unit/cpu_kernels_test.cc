// The CPU backend's fast float32 kernels (pooling, softmax, layernorm, transpose, eltwise) must
// match the reference kernel they replace: each case builds a one-node graph twice, with the
// family's knob at "fast" and at "reference", and compares the plans' outputs and tactics.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "cpu_route_util.h"
#include "kiln/engine/builder.h"
#include "op_test_util.h"

namespace kiln::testing {
namespace {

using ir::Attribute;
using ir::DType;
using ir::Shape;
using ir::Tensor;

using Attributes = std::map<std::string, Attribute>;

Tensor randomTensor(Shape shape, unsigned seed, float low = -3, float high = 3) {
  return uniformTensor(std::move(shape), seed, low, high);
}

struct PlanRun {
  std::string tactic;  // the op's step
  std::vector<Tensor> outputs;
};

PlanRun buildAndRun(const std::string& route, const std::string& opType,
                    const std::vector<OpInput>& inputs, const Attributes& attributes, int opset,
                    int outputCount) {
  BuilderConfig config;
  Status routed = config.setBuildRoute(kiln::testing::nativeNchwRoute(route));
  EXPECT_TRUE(routed.isOk()) << routed.toString();
  auto build = buildCpu(makeSingleOpGraph(opType, inputs, attributes, opset, outputCount), config);
  EXPECT_TRUE(build.isOk()) << build.status().toString();
  if (!build.isOk()) return {};
  PlanRun result;
  for (const auto& step : build->plan.steps()) {
    if (step->node->opType == opType) result.tactic = step->tactic;
  }
  std::vector<Tensor> runtime;
  for (const OpInput& input : inputs) {
    if (!input.constant && !input.tensor.empty()) runtime.push_back(input.tensor);
  }
  auto outputs = build->plan.run(runtime);
  EXPECT_TRUE(outputs.isOk()) << outputs.status().toString();
  if (outputs.isOk()) result.outputs = std::move(*outputs);
  return result;
}

// Runs the op with `knob` at fast and at reference; expects the fast run to choose
// `fastTactic` (empty: the knob must not matter, the reference runs both times) and to match
// the reference outputs within 1e-5 relative.
void expectFastMatchesReference(const std::string& knob, const std::string& fastTactic,
                                const std::string& opType, const std::vector<OpInput>& inputs,
                                const Attributes& attributes = {}, int opset = 18,
                                int outputCount = 1, const std::string& baseRoute = "") {
  SCOPED_TRACE(opType);
  const PlanRun fast = buildAndRun(baseRoute + " -" + knob + "=fast", opType, inputs, attributes,
                                   opset, outputCount);
  const PlanRun reference = buildAndRun(baseRoute + " -" + knob + "=reference", opType, inputs,
                                        attributes, opset, outputCount);
  EXPECT_EQ(reference.tactic, "reference");
  EXPECT_EQ(fast.tactic, fastTactic.empty() ? "reference" : fastTactic);
  ASSERT_EQ(fast.outputs.size(), reference.outputs.size());
  for (size_t o = 0; o < fast.outputs.size(); ++o) {
    const Tensor& actual = fast.outputs[o];
    const Tensor& expected = reference.outputs[o];
    ASSERT_EQ(actual.shape(), expected.shape());
    ASSERT_EQ(actual.dtype(), expected.dtype());
    for (int64_t i = 0; i < expected.elementCount(); ++i) {
      const double e = expected.elementAsDouble(i), a = actual.elementAsDouble(i);
      if (std::isnan(e)) {
        EXPECT_TRUE(std::isnan(a)) << "element " << i;
        continue;
      }
      if (std::isinf(e)) {
        EXPECT_EQ(a, e) << "element " << i;
        continue;
      }
      ASSERT_NEAR(a, e, 1e-5 * std::max(1.0, std::fabs(e))) << "output " << o << " element " << i;
    }
  }
}

OpInput runtime(Tensor t) { return {std::move(t), false}; }
OpInput constant(Tensor t) { return {std::move(t), true}; }

// --- cpu.pool.impl -----------------------------------------------------------------------------

TEST(CpuPoolKernels, MaxPoolMatchesReference) {
  const Tensor x = randomTensor(Shape{2, 3, 9, 7}, 1);
  expectFastMatchesReference("cpu.pool.impl", "fast.window_pool", "MaxPool", {runtime(x)},
                             {{"kernel_shape", intsAttr({3, 3})}, {"strides", intsAttr({2, 2})}});
  expectFastMatchesReference("cpu.pool.impl", "fast.window_pool", "MaxPool", {runtime(x)},
                             {{"kernel_shape", intsAttr({3, 2})},
                              {"pads", intsAttr({1, 0, 2, 1})},
                              {"ceil_mode", intAttr(1)},
                              {"strides", intsAttr({2, 3})}});
  expectFastMatchesReference("cpu.pool.impl", "fast.window_pool", "MaxPool", {runtime(x)},
                             {{"kernel_shape", intsAttr({2, 2})},
                              {"dilations", intsAttr({2, 2})},
                              {"pads", intsAttr({1, 1, 1, 1})}});
  expectFastMatchesReference(
      "cpu.pool.impl", "fast.window_pool", "MaxPool", {runtime(x)},
      {{"kernel_shape", intsAttr({3, 3})}, {"auto_pad", stringAttr("SAME_UPPER")}});
}

// Windows wholly inside the input go through the separable row kernels (3x3 stride 2, 2x2
// stride 2 and 3x3 stride 1 compiled for their extents; other kernels of column stride 1 or 2 the
// general one), border windows (padding, ceil_mode) and other strides tap by tap: odd sizes,
// rows wider than one block of the row kernels, on 1 and 2 threads.
TEST(CpuPoolKernels, WindowPoolsMatchReferenceOverKernelsStridesPadsAndThreads) {
  struct PoolCase {
    const char* name;
    Shape x;
    Attributes attributes;
  };
  const auto square = [](int64_t k, int64_t s) {
    return Attributes{{"kernel_shape", intsAttr({k, k})}, {"strides", intsAttr({s, s})}};
  };
  const auto with = [](Attributes a, const std::string& name, Attribute value) {
    a[name] = std::move(value);
    return a;
  };
  const std::vector<PoolCase> cases = {
      {"3x3_s2_ceil", {2, 3, 19, 23}, with(square(3, 2), "ceil_mode", intAttr(1))},
      {"3x3_s2_ceil_exact", {1, 3, 21, 37}, with(square(3, 2), "ceil_mode", intAttr(1))},
      {"3x3_s2_floor", {2, 3, 19, 24}, square(3, 2)},
      {"3x3_s2_pad1", {1, 5, 16, 17}, with(square(3, 2), "pads", intsAttr({1, 1, 1, 1}))},
      {"3x3_s2_asymmetric_pads_ceil",
       {1, 2, 14, 19},
       with(with(square(3, 2), "pads", intsAttr({0, 2, 1, 0})), "ceil_mode", intAttr(1))},
      {"2x2_s2", {2, 4, 18, 37}, square(2, 2)},
      {"2x2_s2_ceil", {1, 3, 9, 11}, with(square(2, 2), "ceil_mode", intAttr(1))},
      {"3x3_s1_pad1", {1, 3, 10, 21}, with(square(3, 1), "pads", intsAttr({1, 1, 1, 1}))},
      {"3x3_s1", {1, 2, 7, 35}, square(3, 1)},
      {"5x5_s2_pad2", {1, 2, 21, 30}, with(square(5, 2), "pads", intsAttr({2, 2, 2, 2}))},
      {"5x5_s1", {1, 2, 9, 26}, square(5, 1)},
      {"3x2_s1x2_asymmetric",
       {1, 3, 12, 19},
       {{"kernel_shape", intsAttr({3, 2})},
        {"strides", intsAttr({1, 2})},
        {"pads", intsAttr({1, 0, 2, 1})}}},
      {"1x1_s2", {1, 2, 7, 9}, square(1, 2)},
      {"3x3_s3", {1, 2, 17, 20}, square(3, 3)},
      {"3x3_s2_wide_rows", {1, 2, 5, 600}, square(3, 2)},
      {"3x3_s1_wide_rows", {1, 1, 4, 300}, with(square(3, 1), "pads", intsAttr({0, 1, 0, 1}))},
      {"4x3_s2_wide_rows",
       {1, 1, 6, 531},
       {{"kernel_shape", intsAttr({4, 3})}, {"strides", intsAttr({2, 2})}}},
  };
  // Dilated windows: MaxPool only (AveragePool has dilations from opset 19).
  const std::vector<PoolCase> dilated = {
      {"3x3_s2_dilation2", {1, 2, 17, 22}, with(square(3, 2), "dilations", intsAttr({2, 2}))},
      {"2x3_s1_dilation_3x2",
       {1, 2, 12, 25},
       {{"kernel_shape", intsAttr({2, 3})},
        {"dilations", intsAttr({3, 2})},
        {"pads", intsAttr({1, 2, 1, 2})}}},
  };
  for (int threads : {1, 2}) {
    const std::string route = "-cpu.threads=" + std::to_string(threads);
    for (const PoolCase& c : cases) {
      SCOPED_TRACE(std::string(c.name) + " " + route);
      const Tensor x = randomTensor(c.x, 21);
      expectFastMatchesReference("cpu.pool.impl", "fast.window_pool", "MaxPool", {runtime(x)},
                                 c.attributes, 18, 1, route);
      for (int64_t include : {0, 1}) {
        expectFastMatchesReference("cpu.pool.impl", "fast.window_pool", "AveragePool", {runtime(x)},
                                   with(c.attributes, "count_include_pad", intAttr(include)), 18, 1,
                                   route);
      }
    }
    for (const PoolCase& c : dilated) {
      SCOPED_TRACE(std::string(c.name) + " " + route);
      expectFastMatchesReference("cpu.pool.impl", "fast.window_pool", "MaxPool",
                                 {runtime(randomTensor(c.x, 22))}, c.attributes, 18, 1, route);
    }
  }
}

// NaN loses to any number but a window of NaNs stays NaN, inside the input as at its borders:
// plane 0 holds a 3x3 block of NaNs (one whole window at stride 2, parts of several at stride
// 1), plane 1 scattered NaNs.
TEST(CpuPoolKernels, MaxPoolKeepsTheReferenceNaNRule) {
  Tensor x = randomTensor(Shape{1, 2, 9, 40}, 23);
  float* data = x.mutableData<float>().data();
  for (int64_t y = 2; y < 5; ++y) {
    for (int64_t c = 4; c < 7; ++c) data[y * 40 + c] = std::nanf("");
  }
  for (int64_t i = 360; i < 720; i += 7) data[i] = std::nanf("");
  for (int64_t stride : {1, 2}) {
    expectFastMatchesReference(
        "cpu.pool.impl", "fast.window_pool", "MaxPool", {runtime(x)},
        {{"kernel_shape", intsAttr({3, 3})}, {"strides", intsAttr({stride, stride})}});
  }
}

TEST(CpuPoolKernels, MaxPoolWithIndicesStaysReference) {
  const Tensor x = randomTensor(Shape{1, 2, 5, 5}, 2);
  expectFastMatchesReference("cpu.pool.impl", "", "MaxPool", {runtime(x)},
                             {{"kernel_shape", intsAttr({2, 2})}}, 18, 2);
}

TEST(CpuPoolKernels, AveragePoolMatchesReferenceBothPadCounts) {
  const Tensor x = randomTensor(Shape{2, 5, 8, 11}, 3);
  for (int64_t include : {0, 1}) {
    expectFastMatchesReference("cpu.pool.impl", "fast.window_pool", "AveragePool", {runtime(x)},
                               {{"kernel_shape", intsAttr({3, 3})},
                                {"pads", intsAttr({1, 1, 1, 1})},
                                {"strides", intsAttr({2, 2})},
                                {"count_include_pad", intAttr(include)}});
    expectFastMatchesReference("cpu.pool.impl", "fast.window_pool", "AveragePool", {runtime(x)},
                               {{"kernel_shape", intsAttr({2, 3})},
                                {"pads", intsAttr({0, 1, 1, 2})},
                                {"strides", intsAttr({2, 2})},
                                {"ceil_mode", intAttr(1)},
                                {"count_include_pad", intAttr(include)}});
  }
}

TEST(CpuPoolKernels, GlobalPoolsMatchReference) {
  const Tensor x = randomTensor(Shape{3, 7, 13, 5}, 4);
  expectFastMatchesReference("cpu.pool.impl", "fast.global_pool", "GlobalAveragePool",
                             {runtime(x)});
  expectFastMatchesReference("cpu.pool.impl", "fast.global_pool", "GlobalMaxPool", {runtime(x)});
}

TEST(CpuPoolKernels, NonFourDimensionalPoolsStayReference) {
  const Tensor x = randomTensor(Shape{1, 2, 9}, 5);
  expectFastMatchesReference("cpu.pool.impl", "", "MaxPool", {runtime(x)},
                             {{"kernel_shape", intsAttr({3})}});
}

// --- cpu.softmax.impl --------------------------------------------------------------------------

TEST(CpuSoftmaxKernels, SoftmaxAndLogSoftmaxMatchReference) {
  const Tensor x = randomTensor(Shape{3, 5, 37}, 6, -20, 20);
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    expectFastMatchesReference("cpu.softmax.impl", "fast.softmax_rows", op, {runtime(x)});
    expectFastMatchesReference("cpu.softmax.impl", "fast.softmax_rows", op, {runtime(x)},
                               {{"axis", intAttr(2)}});
    // Opset 11's axis=1 flattens [5, 37] into one row: not the last axis, so the reference runs.
    expectFastMatchesReference("cpu.softmax.impl", "", op, {runtime(x)}, {{"axis", intAttr(1)}},
                               11);
    expectFastMatchesReference("cpu.softmax.impl", "", op, {runtime(x)}, {{"axis", intAttr(1)}});
  }
  expectFastMatchesReference("cpu.softmax.impl", "fast.softmax_rows", "Softmax",
                             {runtime(randomTensor(Shape{1}, 7))});
}

// --- cpu.layernorm.impl ------------------------------------------------------------------------

TEST(CpuLayerNormKernels, MatchesReference) {
  const Tensor x = randomTensor(Shape{2, 7, 33}, 8, -4, 6);
  expectFastMatchesReference(
      "cpu.layernorm.impl", "fast.layernorm_rows", "LayerNormalization",
      {runtime(x), runtime(randomTensor(Shape{33}, 9)), runtime(randomTensor(Shape{33}, 10))});
  // No bias, two normalised axes, a scale with a leading 1.
  expectFastMatchesReference("cpu.layernorm.impl", "fast.layernorm_rows", "LayerNormalization",
                             {runtime(x), constant(randomTensor(Shape{1, 7, 33}, 11))},
                             {{"axis", intAttr(1)}, {"epsilon", floatAttr(1e-3f)}});
  // A large offset: the two-pass variance must not cancel.
  expectFastMatchesReference(
      "cpu.layernorm.impl", "fast.layernorm_rows", "LayerNormalization",
      {runtime(randomTensor(Shape{4, 64}, 12, 1000, 1001)), runtime(randomTensor(Shape{64}, 13))});
}

TEST(CpuLayerNormKernels, StatisticsOutputsStayReference) {
  const Tensor x = randomTensor(Shape{3, 8}, 14);
  expectFastMatchesReference("cpu.layernorm.impl", "", "LayerNormalization",
                             {runtime(x), runtime(randomTensor(Shape{8}, 15))}, {}, 18, 3);
}

// --- cpu.transpose.impl ------------------------------------------------------------------------

TEST(CpuTransposeKernels, MatchesReferenceForRanksAndDtypes) {
  const Tensor x = randomTensor(Shape{3, 5, 7, 2}, 16);
  for (const std::vector<int64_t>& perm : std::vector<std::vector<int64_t>>{
           {0, 1, 2, 3}, {3, 2, 1, 0}, {0, 2, 1, 3}, {1, 0, 3, 2}, {0, 3, 1, 2}, {2, 3, 0, 1}}) {
    expectFastMatchesReference("cpu.transpose.impl", "fast.transpose_tiled", "Transpose",
                               {runtime(x)}, {{"perm", intsAttr(perm)}});
  }
  // Default perm (reversed), tiles with ragged edges, a plain copy once size-1 axes go (the
  // graph pass would make that Transpose a Reshape: kept off to reach the kernel), rank 5.
  expectFastMatchesReference("cpu.transpose.impl", "fast.transpose_tiled", "Transpose",
                             {runtime(randomTensor(Shape{67, 45}, 17))});
  expectFastMatchesReference("cpu.transpose.impl", "fast.transpose_tiled", "Transpose",
                             {runtime(randomTensor(Shape{1, 9}, 18))}, {}, 18, 1,
                             "-graph.simplify_transpose_reshape=off");
  expectFastMatchesReference("cpu.transpose.impl", "fast.transpose_tiled", "Transpose",
                             {runtime(randomTensor(Shape{2, 1, 3, 4, 5}, 19))},
                             {{"perm", intsAttr({4, 1, 0, 3, 2})}});
  // NCHW -> NHWC with 2, 3 and 4 channels: the planes are interleaved (ragged bands of rows,
  // two images, on one and on two threads).
  for (int64_t channels : {2, 3, 4}) {
    for (const char* threads : {"-cpu.threads=1", "-cpu.threads=2"}) {
      SCOPED_TRACE(std::to_string(channels) + " channels, " + threads);
      expectFastMatchesReference("cpu.transpose.impl", "fast.transpose_tiled", "Transpose",
                                 {runtime(randomTensor(Shape{2, channels, 37, 41}, 20))},
                                 {{"perm", intsAttr({0, 2, 3, 1})}}, 18, 1, threads);
    }
  }
  std::vector<int64_t> ints(60);
  for (size_t i = 0; i < ints.size(); ++i) ints[i] = static_cast<int64_t>(i * 7919);
  expectFastMatchesReference("cpu.transpose.impl", "fast.transpose_tiled", "Transpose",
                             {runtime(Tensor::fromVector<int64_t>(Shape{3, 4, 5}, ints))},
                             {{"perm", intsAttr({2, 0, 1})}});
  std::vector<uint8_t> bytes(60);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 13);
  expectFastMatchesReference("cpu.transpose.impl", "fast.transpose_tiled", "Transpose",
                             {runtime(Tensor::fromVector<uint8_t>(Shape{5, 12}, bytes))});
}

// --- cpu.eltwise.impl --------------------------------------------------------------------------

TEST(CpuEltwiseKernels, UnaryOpsMatchReference) {
  const Tensor x = randomTensor(Shape{3, 17, 5}, 20, -6, 6);
  const Tensor positive = randomTensor(Shape{3, 17, 5}, 21, 0.01f, 9);
  for (const char* op : {"Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Neg", "Abs", "HardSwish",
                         "HardSigmoid", "Gelu", "LeakyRelu"}) {
    expectFastMatchesReference("cpu.eltwise.impl", "fast.unary", op, {runtime(x)});
  }
  for (const char* op : {"Sqrt", "Reciprocal"}) {
    expectFastMatchesReference("cpu.eltwise.impl", "fast.unary", op, {runtime(positive)});
  }
  expectFastMatchesReference("cpu.eltwise.impl", "fast.unary", "Gelu", {runtime(x)},
                             {{"approximate", stringAttr("tanh")}}, 20);
  expectFastMatchesReference("cpu.eltwise.impl", "fast.unary", "HardSigmoid", {runtime(x)},
                             {{"alpha", floatAttr(0.3f)}, {"beta", floatAttr(0.4f)}});
  expectFastMatchesReference("cpu.eltwise.impl", "fast.unary", "Clip",
                             {runtime(x), constant(Tensor::fromVector<float>(Shape{}, {-1.5f})),
                              constant(Tensor::fromVector<float>(Shape{}, {2.5f}))});
}

TEST(CpuEltwiseKernels, BinaryOpsMatchReferenceWithBroadcasting) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {Shape{4, 5, 6}, Shape{4, 5, 6}},        // equal
      {Shape{4, 5, 6}, Shape{}},               // scalar right
      {Shape{1}, Shape{4, 5, 6}},              // scalar left
      {Shape{4, 5, 6}, Shape{6}},              // along the last axis
      {Shape{2, 3, 4, 5}, Shape{1, 3, 1, 1}},  // per channel
      {Shape{4, 1, 6}, Shape{5, 1}},           // both sides broadcast
      {Shape{3, 1}, Shape{1, 7}},              // outer product
      {Shape{2, 3, 1, 5}, Shape{3, 4, 1}},
  };
  unsigned seed = 30;
  for (const auto& [a, b] : shapes) {
    const Tensor lhs = randomTensor(a, seed++, -3, 3);
    const Tensor rhs = randomTensor(b, seed++, 0.5f, 3);  // positive: safe divisors
    for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
      expectFastMatchesReference("cpu.eltwise.impl", "fast.binary_broadcast", op,
                                 {runtime(lhs), runtime(rhs)});
    }
    expectFastMatchesReference("cpu.eltwise.impl", "fast.binary_broadcast", "Pow",
                               {runtime(rhs), runtime(randomTensor(a, seed++, -2, 2))});
  }
  const Tensor base = randomTensor(Shape{5, 9}, 50, 0.1f, 4);
  for (float e : {2.0f, 0.5f, 3.0f}) {
    expectFastMatchesReference("cpu.eltwise.impl", "fast.binary_broadcast", "Pow",
                               {runtime(base), constant(Tensor::fromVector<float>(Shape{}, {e}))});
  }
  // An integer exponent is the reference kernel's.
  expectFastMatchesReference("cpu.eltwise.impl", "", "Pow",
                             {runtime(base), constant(Tensor::fromVector<int64_t>(Shape{}, {2}))});
}

// The reduction family (cpu.reduce.impl) takes ReduceMean when eltwise's kernel does not; it is
// held at reference here so the eltwise knob alone decides.
TEST(CpuEltwiseKernels, ReduceMeanOverLastAxisMatchesReference) {
  const Tensor x = randomTensor(Shape{3, 4, 29}, 60);
  const Tensor lastAxis = Tensor::fromVector<int64_t>(Shape{1}, {-1});
  const std::string noReduce = "-cpu.reduce.impl=reference";
  expectFastMatchesReference("cpu.eltwise.impl", "fast.reduce_mean_rows", "ReduceMean",
                             {runtime(x), constant(lastAxis)}, {}, 18, 1, noReduce);
  expectFastMatchesReference("cpu.eltwise.impl", "fast.reduce_mean_rows", "ReduceMean",
                             {runtime(x), constant(lastAxis)}, {{"keepdims", intAttr(0)}}, 18, 1,
                             noReduce);
  expectFastMatchesReference("cpu.eltwise.impl", "fast.reduce_mean_rows", "ReduceMean",
                             {runtime(x)}, {{"axes", intsAttr({2})}}, 13, 1, noReduce);
  expectFastMatchesReference("cpu.eltwise.impl", "", "ReduceMean",
                             {runtime(x), constant(Tensor::fromVector<int64_t>(Shape{1}, {1}))}, {},
                             18, 1, noReduce);
}

}  // namespace
}  // namespace kiln::testing
