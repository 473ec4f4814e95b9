// The CPU backend's convolution and NHWC kernels against the reference executor: every
// cpu.conv.algo value, in NCHW and (through the layout pass) NHWC, on 1, 2 and 3 threads and two
// tile sizes, over strides, dilations, asymmetric pads, groups, depthwise (3x3, 5x5 and 7x7 of
// the depthwise kernel, tiny planes, shapes it leaves to direct), 1x1, batch 2 and odd sizes;
// FusedConv with residual and activation; NHWC pools; and how conv work splits into tasks.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>

#include "kiln/backends/cpu/kernels/conv.h"
#include "kiln/engine/builder.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/knobs/knob.h"
#include "kiln/reference/executor.h"
// After op_schema.h, which it needs.
#include "../knobs/graph_sketch.h"
#include "cpu_conv_test_util.h"
#include "cpu_route_util.h"

namespace kiln::testing {
namespace {

using cpu::ConvTasks;
using cpu::Step;
using ir::Attribute;
using ir::Shape;
using ir::Tensor;

struct CpuRun {
  std::map<std::string, const Step*> steps;  // by node name
  std::vector<std::string> layouts;
  std::vector<Tensor> outputs;
  std::optional<CpuBuild> build;

  const Step* step(const std::string& name) const {
    auto it = steps.find(name);
    return it == steps.end() ? nullptr : it->second;
  }
};

// Builds with `route`, kiln's own NCHW kernels unless it says otherwise, and runs once.
CpuRun runCpu(const GraphFactory& make, const std::string& route,
              const std::vector<Tensor>& inputs) {
  CpuRun run;
  BuilderConfig config;
  Status routed = config.setBuildRoute(kiln::testing::nativeNchwRoute(route));
  EXPECT_TRUE(routed.isOk()) << routed.toString();
  auto build = buildCpu(make(), config);
  EXPECT_TRUE(build.isOk()) << build.status().toString();
  if (!build.isOk()) return run;
  run.build.emplace(std::move(*build));
  for (const auto& step : run.build->plan.steps()) {
    run.steps[step->node->name] = step.get();
    run.layouts.push_back(step->layout);
  }
  auto outputs = run.build->plan.run(inputs);
  EXPECT_TRUE(outputs.isOk()) << outputs.status().toString();
  if (outputs.isOk()) run.outputs = std::move(*outputs);
  return run;
}

struct ConvCase {
  const char* name;
  Shape x, w;
  Attributes attributes;
  bool bias = false;
};

void PrintTo(const ConvCase& c, std::ostream* out) { *out << c.name; }

// Odd sizes throughout, so tiles, rows and channel blocks end part-way.
const std::vector<ConvCase>& convCases() {
  static const std::vector<ConvCase> cases = {
      {"3x3_same", {1, 3, 7, 9}, {5, 3, 3, 3}, {{"pads", ints({1, 1, 1, 1})}}, true},
      {"stride2_asymmetric_pads",
       {1, 4, 9, 8},
       {6, 4, 3, 3},
       {{"strides", ints({2, 2})}, {"pads", ints({0, 1, 2, 1})}}},
      {"dilation2",
       {1, 2, 11, 10},
       {3, 2, 3, 3},
       {{"dilations", ints({2, 2})}, {"pads", ints({2, 2, 2, 2})}}},
      {"mixed_strides_dilations_3x2_batch2",
       {2, 3, 8, 7},
       {4, 3, 3, 2},
       {{"strides", ints({2, 1})}, {"dilations", ints({1, 2})}, {"pads", ints({1, 0, 0, 1})}},
       true},
      {"group2", {1, 4, 6, 6}, {6, 2, 3, 3}, {{"group", intAttr(2)}, {"pads", ints({1, 1, 1, 1})}}},
      {"depthwise_stride2_batch2",
       {2, 5, 9, 7},
       {5, 1, 3, 3},
       {{"group", intAttr(5)}, {"pads", ints({1, 1, 1, 1})}, {"strides", ints({2, 2})}},
       true},
      {"depthwise_multiplier2", {1, 3, 6, 6}, {6, 1, 3, 3}, {{"group", intAttr(3)}}},
      {"depthwise_1x1", {1, 4, 5, 5}, {4, 1, 1, 1}, {{"group", intAttr(4)}}, true},
      {"pointwise_batch2", {2, 7, 5, 3}, {9, 7, 1, 1}, {}, true},
      {"1x1_stride2", {1, 4, 7, 7}, {3, 4, 1, 1}, {{"strides", ints({2, 2})}}},
      {"1x1_padded", {1, 3, 4, 5}, {2, 3, 1, 1}, {{"pads", ints({1, 0, 0, 1})}}},
      {"1x1_end_padded", {1, 3, 4, 5}, {2, 3, 1, 1}, {{"pads", ints({0, 0, 1, 2})}}, true},
      {"pointwise_group2", {1, 6, 4, 5}, {4, 3, 1, 1}, {{"group", intAttr(2)}}},
      {"large_tiled", {1, 3, 40, 37}, {4, 3, 3, 3}, {{"pads", ints({1, 1, 1, 1})}}, true},
      {"5x5_batch2", {2, 3, 17, 19}, {8, 3, 5, 5}, {{"pads", ints({2, 2, 2, 2})}}, true},
      // The depthwise kernel: 3x3 and 5x5, stride 1 and 2, interior and border columns of odd
      // and even widths, tiny planes of border pixels only, and two it does not take.
      {"dw3x3_pad1_w7",
       {1, 4, 7, 7},
       {4, 1, 3, 3},
       {{"group", intAttr(4)}, {"pads", ints({1, 1, 1, 1})}},
       true},
      {"dw3x3_pad0_w8", {1, 3, 6, 8}, {3, 1, 3, 3}, {{"group", intAttr(3)}}},
      {"dw3x3_stride2_pad1_w16_batch2",
       {2, 3, 9, 16},
       {3, 1, 3, 3},
       {{"group", intAttr(3)}, {"strides", ints({2, 2})}, {"pads", ints({1, 1, 1, 1})}},
       true},
      {"dw3x3_stride2_asymmetric_w15",
       {1, 3, 8, 15},
       {3, 1, 3, 3},
       {{"group", intAttr(3)}, {"strides", ints({2, 2})}, {"pads", ints({0, 1, 2, 1})}}},
      {"dw5x5_pad2_w17",
       {1, 3, 9, 17},
       {3, 1, 5, 5},
       {{"group", intAttr(3)}, {"pads", ints({2, 2, 2, 2})}},
       true},
      {"dw5x5_stride2_pad2_w33_batch2",
       {2, 2, 12, 33},
       {2, 1, 5, 5},
       {{"group", intAttr(2)}, {"strides", ints({2, 2})}, {"pads", ints({2, 2, 2, 2})}}},
      {"dw5x5_asymmetric_w16",
       {1, 2, 7, 16},
       {2, 1, 5, 5},
       {{"group", intAttr(2)}, {"pads", ints({1, 2, 0, 3})}},
       true},
      {"dw5x5_stride2_pad0_w8",
       {1, 2, 9, 8},
       {2, 1, 5, 5},
       {{"group", intAttr(2)}, {"strides", ints({2, 2})}}},
      {"dw3x3_1x1_input",
       {1, 3, 1, 1},
       {3, 1, 3, 3},
       {{"group", intAttr(3)}, {"pads", ints({1, 1, 1, 1})}},
       true},
      {"dw5x5_2x3_input",
       {1, 2, 2, 3},
       {2, 1, 5, 5},
       {{"group", intAttr(2)}, {"pads", ints({2, 2, 2, 2})}},
       true},
      // 7x7 (ConvNeXt's): widths that end vectors part-way, in-place (unpadded) and padded
      // planes, asymmetric pads, stride 2's phases, planes smaller than the kernel.
      {"dw7x7", {1, 3, 9, 9}, {3, 1, 7, 7}, {{"group", intAttr(3)}, {"pads", ints({3, 3, 3, 3})}}},
      {"dw7x7_pad3_w19_batch2",
       {2, 4, 11, 19},
       {4, 1, 7, 7},
       {{"group", intAttr(4)}, {"pads", ints({3, 3, 3, 3})}},
       true},
      {"dw7x7_pad0_w20", {1, 2, 12, 20}, {2, 1, 7, 7}, {{"group", intAttr(2)}}},
      {"dw7x7_asymmetric_w13",
       {1, 3, 10, 13},
       {3, 1, 7, 7},
       {{"group", intAttr(3)}, {"pads", ints({2, 3, 4, 1})}},
       true},
      {"dw7x7_stride2_pad3_w23_batch2",
       {2, 3, 15, 23},
       {3, 1, 7, 7},
       {{"group", intAttr(3)}, {"strides", ints({2, 2})}, {"pads", ints({3, 3, 3, 3})}},
       true},
      {"dw7x7_stride2_pad0_w16",
       {1, 2, 13, 16},
       {2, 1, 7, 7},
       {{"group", intAttr(2)}, {"strides", ints({2, 2})}}},
      {"dw7x7_stride2_asymmetric_w17",
       {1, 2, 14, 17},
       {2, 1, 7, 7},
       {{"group", intAttr(2)}, {"strides", ints({2, 2})}, {"pads", ints({1, 3, 2, 0})}}},
      {"dw7x7_3x3_input",
       {1, 3, 3, 3},
       {3, 1, 7, 7},
       {{"group", intAttr(3)}, {"pads", ints({3, 3, 3, 3})}},
       true},
      {"dw7x7_2x2_input",
       {1, 2, 2, 2},
       {2, 1, 7, 7},
       {{"group", intAttr(2)}, {"pads", ints({3, 3, 3, 3})}}},
      {"dw3x5", {1, 3, 8, 9}, {3, 1, 3, 5}, {{"group", intAttr(3)}, {"pads", ints({1, 2, 1, 2})}}},
      {"dw3x3_dilation2",
       {1, 3, 9, 10},
       {3, 1, 3, 3},
       {{"group", intAttr(3)}, {"dilations", ints({2, 2})}, {"pads", ints({2, 2, 2, 2})}}},
      {"auto_pad_same_upper",
       {1, 2, 6, 5},
       {3, 2, 3, 3},
       {{"auto_pad", Attribute{std::string("SAME_UPPER")}}, {"strides", ints({2, 2})}}},
  };
  return cases;
}

GraphFactory convGraph(const ConvCase& c) {
  return [c] {
    GraphSketch g;
    std::vector<std::string> inputs = {g.input("x", c.x), g.weight("w", c.w)};
    if (c.bias) inputs.push_back(g.weight("b", Shape{c.w[0]}));
    g.output(g.node("Conv", inputs, c.attributes, "conv"));
    return g.take();
  };
}

class ConvAlgorithms : public ::testing::TestWithParam<ConvCase> {};

TEST_P(ConvAlgorithms, EveryAlgoLayoutThreadCountAndTileMatchesReference) {
  const ConvCase& c = GetParam();
  const GraphFactory make = convGraph(c);
  const std::vector<Tensor> inputs = randomInputs(make(), 11);
  const std::vector<Tensor> expected = runReference(make, inputs);
  for (const char* layout : {"nchw", "nhwc"}) {
    for (const char* algo : {"auto", "im2col", "direct", "pointwise", "depthwise"}) {
      for (int threads : {1, 2, 3}) {
        for (const char* tile : {"0", "256"}) {
          const std::string route = fmt::format(
              "-graph.layout={} -cpu.conv.algo={} -cpu.threads={} -cpu.conv.im2col_tile={}", layout,
              algo, threads, tile);
          SCOPED_TRACE(route);
          const CpuRun run = runCpu(make, route, inputs);
          const Step* step = run.step("conv");
          ASSERT_NE(step, nullptr);
          EXPECT_EQ(step->layout, layout);
          EXPECT_NE(step->tactic, "reference");
          expectClose(run.outputs, expected);
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ConvAlgorithms, ::testing::ValuesIn(convCases()),
                         [](const auto& info) { return std::string(info.param.name); });

// "im2col+<source>.tile1024" and the like name the default GEMM source.
std::string gemm(const std::string& algo, const std::string& tile = ".tile1024") {
  const knobs::KnobSpec* source = knobs::KnobRegistry::global().find("cpu.gemm.source");
  return algo + "+" + (source ? source->defaultValue : "?") + tile;
}

std::string tacticOf(const ConvCase& c, const std::string& route) {
  const GraphFactory make = convGraph(c);
  const CpuRun run = runCpu(make, route, randomInputs(make(), 3));
  const Step* step = run.step("conv");
  return step ? step->tactic : "";
}

const ConvCase& caseNamed(const std::string& name) {
  for (const ConvCase& c : convCases()) {
    if (name == c.name) return c;
  }
  ADD_FAILURE() << name;
  return convCases()[0];
}

TEST(ConvTactics, AutoPicksDepthwiseOrDirectForDepthwisePointwiseFor1x1AndIm2colOtherwise) {
  EXPECT_EQ(tacticOf(caseNamed("depthwise_stride2_batch2"), ""), "depthwise");
  EXPECT_EQ(tacticOf(caseNamed("depthwise_multiplier2"), ""), "direct");
  EXPECT_EQ(tacticOf(caseNamed("pointwise_batch2"), ""), gemm("pointwise"));
  EXPECT_EQ(tacticOf(caseNamed("1x1_stride2"), ""), gemm("im2col"));
  // Padding at the end makes the output larger than the input: not the input's own GEMM.
  EXPECT_EQ(tacticOf(caseNamed("1x1_end_padded"), ""), gemm("im2col"));
  EXPECT_EQ(tacticOf(caseNamed("3x3_same"), ""), gemm("im2col"));
  EXPECT_EQ(tacticOf(caseNamed("3x3_same"), "-cpu.conv.im2col_tile=0"), gemm("im2col", ""));
}

TEST(ConvTactics, PointwiseFallsBackToAutoWhereItDoesNotApply) {
  EXPECT_EQ(tacticOf(caseNamed("3x3_same"), "-cpu.conv.algo=pointwise"), gemm("im2col"));
  EXPECT_EQ(tacticOf(caseNamed("depthwise_stride2_batch2"), "-cpu.conv.algo=pointwise"),
            "depthwise");
  EXPECT_EQ(tacticOf(caseNamed("depthwise_1x1"), "-cpu.conv.algo=pointwise"), gemm("pointwise"));
  EXPECT_EQ(tacticOf(caseNamed("pointwise_batch2"), "-cpu.conv.algo=im2col"), gemm("im2col"));
}

TEST(ConvTactics, AutoPicksTheDepthwiseKernelWhereItFitsUnlessThePlaneIsTiny) {
  for (const char* name :
       {"dw3x3_pad1_w7", "dw3x3_pad0_w8", "dw3x3_stride2_pad1_w16_batch2",
        "dw3x3_stride2_asymmetric_w15", "dw5x5_pad2_w17", "dw5x5_stride2_pad2_w33_batch2",
        "dw5x5_asymmetric_w16", "dw5x5_stride2_pad0_w8", "dw5x5_2x3_input", "dw7x7",
        "dw7x7_pad3_w19_batch2", "dw7x7_pad0_w20", "dw7x7_asymmetric_w13",
        "dw7x7_stride2_pad3_w23_batch2", "dw7x7_stride2_pad0_w16", "dw7x7_stride2_asymmetric_w17",
        "dw7x7_3x3_input"}) {
    EXPECT_EQ(tacticOf(caseNamed(name), ""), "depthwise") << name;
  }
  // A single output pixel, or fewer than the kernel has rows: auto keeps the direct loop, the
  // knob value still forces the kernel.
  EXPECT_EQ(tacticOf(caseNamed("dw3x3_1x1_input"), ""), "direct");
  EXPECT_EQ(tacticOf(caseNamed("dw3x3_1x1_input"), "-cpu.conv.algo=depthwise"), "depthwise");
  EXPECT_EQ(tacticOf(caseNamed("dw7x7_2x2_input"), ""), "direct");
  EXPECT_EQ(tacticOf(caseNamed("dw7x7_2x2_input"), "-cpu.conv.algo=depthwise"), "depthwise");
  EXPECT_EQ(tacticOf(caseNamed("dw3x3_pad1_w7"), "-cpu.conv.algo=direct"), "direct");
  EXPECT_EQ(tacticOf(caseNamed("dw3x3_pad1_w7"), "-cpu.conv.precision=bf16"), "depthwise");
}

TEST(ConvTactics, DepthwiseFallsBackToAutoWhereItDoesNotApply) {
  EXPECT_EQ(tacticOf(caseNamed("dw3x5"), "-cpu.conv.algo=depthwise"), "direct");
  EXPECT_EQ(tacticOf(caseNamed("dw3x3_dilation2"), "-cpu.conv.algo=depthwise"), "direct");
  EXPECT_EQ(tacticOf(caseNamed("depthwise_multiplier2"), "-cpu.conv.algo=depthwise"), "direct");
  EXPECT_EQ(tacticOf(caseNamed("depthwise_1x1"), "-cpu.conv.algo=depthwise"), "direct");
  EXPECT_EQ(tacticOf(caseNamed("3x3_same"), "-cpu.conv.algo=depthwise"), gemm("im2col"));
  EXPECT_EQ(tacticOf(caseNamed("dw3x3_pad1_w7"), "-graph.layout=nhwc -cpu.conv.algo=depthwise"),
            "nhwc.depthwise");
}

TEST(ConvTactics, NhwcTacticsNameTheLayout) {
  EXPECT_EQ(tacticOf(caseNamed("depthwise_stride2_batch2"), "-graph.layout=nhwc"),
            "nhwc.depthwise");
  EXPECT_EQ(tacticOf(caseNamed("depthwise_multiplier2"), "-graph.layout=nhwc"), "nhwc.direct");
  EXPECT_EQ(tacticOf(caseNamed("pointwise_batch2"), "-graph.layout=nhwc"),
            "nhwc." + gemm("pointwise"));
  EXPECT_EQ(tacticOf(caseNamed("5x5_batch2"), "-graph.layout=nhwc -cpu.conv.im2col_tile=4096"),
            "nhwc." + gemm("im2col", ".tile4096"));
  EXPECT_EQ(tacticOf(caseNamed("5x5_batch2"), "-graph.layout=nhwc -cpu.conv.algo=reference"),
            "reference");
}

// Conv + residual Add + activation fuse into FusedConv; its epilogue must match the chain's.
struct FusedCase {
  const char* activation;
  Attributes attributes;  // of the activation node
  bool viaClipInputs = false;
};

GraphFactory fusedGraph(const FusedCase& f, const Shape& x, const Shape& w, Attributes conv) {
  return [f, x, w, conv] {
    GraphSketch g;
    auto in = g.input("x", x);
    auto skip = g.input("skip", Shape{x[0], w[0], x[2], x[3]});
    auto c = g.node("Conv", {in, g.weight("w", w), g.weight("b", Shape{w[0]})}, conv, "conv");
    auto sum = g.node("Add", {c, skip}, {}, "residual");
    std::vector<std::string> actInputs = {sum};
    if (f.viaClipInputs) {
      actInputs.push_back(g.constant("lo", Tensor::scalar<float>(-0.25f)));
      actInputs.push_back(g.constant("hi", Tensor::scalar<float>(0.5f)));
    }
    g.output(g.node(f.activation, actInputs, f.attributes, "act"));
    return g.take();
  };
}

TEST(FusedConv, ResidualAndActivationMatchReferenceInBothLayouts) {
  const std::vector<FusedCase> activations = {
      {"Relu", {}},       {"LeakyRelu", {{"alpha", Attribute{0.3f}}}},
      {"HardSwish", {}},  {"Sigmoid", {}},
      {"Clip", {}, true}, {"Gelu", {{"approximate", Attribute{std::string("tanh")}}}},
  };
  struct Geometry {
    Shape x, w;
    Attributes conv;
  };
  const std::vector<Geometry> geometries = {
      {{1, 3, 9, 11}, {4, 3, 3, 3}, {{"pads", ints({1, 1, 1, 1})}}},
      {{2, 6, 5, 7}, {6, 6, 1, 1}, {}},
      {{1, 6, 7, 5}, {6, 1, 3, 3}, {{"pads", ints({1, 1, 1, 1})}, {"group", intAttr(6)}}},
      {{2, 5, 9, 11}, {5, 1, 7, 7}, {{"pads", ints({3, 3, 3, 3})}, {"group", intAttr(5)}}},
  };
  for (const FusedCase& f : activations) {
    for (const Geometry& geometry : geometries) {
      const GraphFactory make = fusedGraph(f, geometry.x, geometry.w, geometry.conv);
      const std::vector<Tensor> inputs = randomInputs(make(), 5);
      const std::vector<Tensor> expected = runReference(make, inputs);
      for (const char* layout : {"nchw", "nhwc"}) {
        for (const char* algo : {"auto", "im2col", "direct", "depthwise"}) {
          for (int threads : {1, 3}) {
            const std::string route = fmt::format(
                "-graph.layout={} -cpu.conv.algo={} -cpu.threads={} -cpu.conv.im2col_tile=256",
                layout, algo, threads);
            SCOPED_TRACE(std::string(f.activation) + " x" + geometry.x.toString() + " " + route);
            const CpuRun run = runCpu(make, route, inputs);
            ASSERT_EQ(run.steps.count("residual"), 0u) << "the residual Add was not fused";
            ASSERT_EQ(run.steps.count("act"), 0u) << "the activation was not fused";
            ASSERT_NE(run.step("conv"), nullptr);
            EXPECT_EQ(run.step("conv")->node->opType,
                      std::string(layout) == "nhwc" ? "NhwcConv" : "FusedConv");
            expectClose(run.outputs, expected);
          }
        }
      }
    }
  }
}

// SiLU as exporters write it (Conv, then x * Sigmoid(x)) fuses into the convolution as its
// "Silu" activation, in both layouts, and matches the chain.
TEST(FusedConv, SiluFromSigmoidAndMulMatchesReference) {
  const GraphFactory make = [] {
    GraphSketch g;
    auto c = g.node("Conv",
                    {g.input("x", Shape{2, 6, 7, 5}), g.weight("w", Shape{6, 1, 3, 3}),
                     g.weight("b", Shape{6})},
                    {{"pads", ints({1, 1, 1, 1})}, {"group", intAttr(6)}}, "conv");
    auto s = g.node("Sigmoid", {c}, {}, "sig");
    g.output(g.node("Mul", {s, c}, {}, "mul"));
    return g.take();
  };
  const std::vector<Tensor> inputs = randomInputs(make(), 6);
  const std::vector<Tensor> expected = runReference(make, inputs);
  for (const char* layout : {"nchw", "nhwc"}) {
    SCOPED_TRACE(layout);
    const CpuRun run = runCpu(make, fmt::format("-graph.layout={}", layout), inputs);
    EXPECT_EQ(run.steps.count("sig"), 0u);
    EXPECT_EQ(run.steps.count("mul"), 0u);
    ASSERT_NE(run.step("conv"), nullptr);
    auto activation = run.step("conv")->node->getString("activation", "");
    ASSERT_TRUE(activation.isOk());
    EXPECT_EQ(*activation, "Silu");
    expectClose(run.outputs, expected);
  }
}

// Pools in NHWC (through the layout pass) against the reference, over threads.
TEST(NhwcPools, MatchReference) {
  struct PoolCase {
    const char* op;
    Shape x;
    Attributes attributes;
  };
  const std::vector<PoolCase> cases = {
      {"MaxPool",
       {1, 5, 9, 7},
       {{"kernel_shape", ints({3, 3})}, {"strides", ints({2, 2})}, {"pads", ints({1, 1, 1, 1})}}},
      {"MaxPool",
       {2, 3, 8, 8},
       {{"kernel_shape", ints({2, 3})},
        {"dilations", ints({2, 1})},
        {"ceil_mode", intAttr(1)},
        {"strides", ints({2, 2})}}},
      {"AveragePool",
       {1, 7, 6, 9},
       {{"kernel_shape", ints({3, 2})},
        {"pads", ints({1, 0, 1, 1})},
        {"count_include_pad", intAttr(1)}}},
      {"AveragePool",
       {2, 4, 7, 7},
       {{"kernel_shape", ints({3, 3})}, {"strides", ints({2, 2})}, {"pads", ints({1, 1, 1, 1})}}},
      // Channel rows long enough for the vector loops (and their remainders).
      {"MaxPool",
       {1, 37, 9, 9},
       {{"kernel_shape", ints({3, 3})}, {"strides", ints({2, 2})}, {"ceil_mode", intAttr(1)}}},
      {"AveragePool",
       {1, 40, 8, 8},
       {{"kernel_shape", ints({3, 3})}, {"pads", ints({1, 1, 1, 1})}}},
      // Blocks of 64 channels, then of 8, then an overlapping last one.
      {"MaxPool",
       {1, 139, 7, 7},
       {{"kernel_shape", ints({3, 3})}, {"strides", ints({2, 2})}, {"pads", ints({1, 1, 1, 1})}}},
      {"AveragePool",
       {1, 75, 6, 6},
       {{"kernel_shape", ints({3, 3})},
        {"pads", ints({1, 1, 1, 1})},
        {"count_include_pad", intAttr(0)}}},
      {"GlobalAveragePool", {2, 70, 5, 3}, {}},
      {"GlobalMaxPool", {1, 65, 4, 4}, {}},
  };
  for (const PoolCase& c : cases) {
    const GraphFactory make = [c] {
      GraphSketch g;
      g.output(g.node(c.op, {g.input("x", c.x)}, c.attributes, "pool"));
      return g.take();
    };
    const std::vector<Tensor> inputs = randomInputs(make(), 9);
    const std::vector<Tensor> expected = runReference(make, inputs);
    for (int threads : {1, 2, 3}) {
      for (const char* layout : {"nchw", "nhwc"}) {
        const std::string route = fmt::format("-graph.layout={} -cpu.threads={}", layout, threads);
        SCOPED_TRACE(std::string(c.op) + " " + c.x.toString() + " " + route);
        const CpuRun run = runCpu(make, route, inputs);
        ASSERT_NE(run.step("pool"), nullptr);
        EXPECT_EQ(run.step("pool")->layout, layout);
        EXPECT_NE(run.step("pool")->tactic, "reference");
        expectClose(run.outputs, expected);
      }
    }
  }
}

// Windows wholly in the padding give -inf, as the reference's do; NaN windows stay NaN.
TEST(NhwcPools, MaxPoolKeepsTheReferenceRulesForPaddingAndNaN) {
  const GraphFactory make = [] {
    GraphSketch g;
    g.output(g.node("MaxPool", {g.input("x", {1, 2, 2, 2})},
                    {{"kernel_shape", ints({2, 2})}, {"pads", ints({2, 2, 0, 0})}}, "pool"));
    return g.take();
  };
  const float nan = std::nanf("");
  const std::vector<Tensor> inputs = {
      Tensor::fromVector<float>({1, 2, 2, 2}, {nan, nan, nan, nan, 1.0f, nan, -2.0f, nan})};
  const std::vector<Tensor> expected = runReference(make, inputs);
  const CpuRun run = runCpu(make, "-graph.layout=nhwc", inputs);
  ASSERT_EQ(run.outputs.size(), 1u);
  ASSERT_EQ(run.outputs[0].shape(), expected[0].shape());
  for (int64_t i = 0; i < expected[0].elementCount(); ++i) {
    const double e = expected[0].elementAsDouble(i), a = run.outputs[0].elementAsDouble(i);
    if (std::isnan(e)) {
      EXPECT_TRUE(std::isnan(a)) << i;
    } else {
      EXPECT_EQ(a, e) << i;
    }
  }
}

// The NaN rule on channel rows the vector loops take: a NaN tap loses to any number in every
// lane, a window of NaNs stays NaN, whichever tap the NaNs are.
TEST(NhwcPools, MaxPoolNaNRuleHoldsInEveryVectorLane) {
  // 35: blocks of 8 and an overlapping last one; 75: a block of 64 too.
  for (const int64_t kChannels : {35, 75}) {
    SCOPED_TRACE(kChannels);
    const GraphFactory make = [kChannels] {
      GraphSketch g;
      g.output(g.node("MaxPool", {g.input("x", {1, kChannels, 3, 3})},
                      {{"kernel_shape", ints({2, 2})}, {"strides", ints({1, 1})}}, "pool"));
      return g.take();
    };
    const float nan = std::nanf("");
    std::vector<float> x(static_cast<size_t>(kChannels * 9));
    for (int64_t c = 0; c < kChannels; ++c) {
      for (int64_t p = 0; p < 9; ++p) {
        float& v = x[static_cast<size_t>(c * 9 + p)];
        v = static_cast<float>((c * 7 + p * 3) % 11) - 5.0f;
        // Channel c: NaN at the pixels whose bit (p % 5) is set in c (channel 31: all but p = 9).
        if ((c >> (p % 5)) & 1) v = nan;
      }
    }
    const std::vector<Tensor> inputs = {Tensor::fromVector<float>({1, kChannels, 3, 3}, x)};
    const std::vector<Tensor> expected = runReference(make, inputs);
    const CpuRun run = runCpu(make, "-graph.layout=nhwc", inputs);
    ASSERT_EQ(run.step("pool")->layout, "nhwc");
    ASSERT_EQ(run.outputs.size(), 1u);
    ASSERT_EQ(run.outputs[0].shape(), expected[0].shape());
    int nans = 0;
    for (int64_t i = 0; i < expected[0].elementCount(); ++i) {
      const double e = expected[0].elementAsDouble(i), a = run.outputs[0].elementAsDouble(i);
      if (std::isnan(e)) {
        ++nans;
        EXPECT_TRUE(std::isnan(a)) << i;
      } else {
        EXPECT_EQ(a, e) << i;
      }
    }
    EXPECT_GT(nans, 0);  // some windows are all NaN, so both halves of the rule are checked
  }
}

TEST(ConvTasksPlan, TilesShrinkToGiveEveryThreadATaskButNotBelowTheMinimum) {
  // One thread: tiles of the knob's size, run one after another.
  ConvTasks t = ConvTasks::plan(4096, 1, 1024, 1);
  EXPECT_EQ(t.tile, 1024);
  EXPECT_EQ(t.count, 4);
  EXPECT_FALSE(t.parallel);
  // Eight threads, one image: 8 tiles of 512.
  t = ConvTasks::plan(4096, 1, 1024, 8);
  EXPECT_EQ(t.tile, 512);
  EXPECT_EQ(t.count, 8);
  EXPECT_TRUE(t.parallel);
  // 3 threads over 1000 pixels: ceil(1000 / 3) rounded up to 8.
  t = ConvTasks::plan(1000, 1, 1024, 3);
  EXPECT_EQ(t.tile, 336);
  EXPECT_EQ(t.count, 3);
  EXPECT_TRUE(t.parallel);
  // A 7x7 image is one task: below 64 pixels a tile is not worth splitting.
  t = ConvTasks::plan(49, 1, 1024, 4);
  EXPECT_EQ(t.tile, 49);
  EXPECT_EQ(t.count, 1);
  EXPECT_FALSE(t.parallel);
  // 0: whole images; parallel only across images (batch x group).
  t = ConvTasks::plan(3136, 1, 0, 4);
  EXPECT_EQ(t.tile, 3136);
  EXPECT_FALSE(t.parallel);
  t = ConvTasks::plan(100, 8, 0, 4);
  EXPECT_EQ(t.count, 8);
  EXPECT_TRUE(t.parallel);
  // Enough images already: tiles keep the knob's size.
  t = ConvTasks::plan(2000, 4, 256, 4);
  EXPECT_EQ(t.tile, 256);
  EXPECT_EQ(t.tilesPerImage, 8);
  EXPECT_EQ(t.count, 32);
  EXPECT_EQ(ConvTasks::plan(0, 1, 256, 2).count, 0);
}

}  // namespace
}  // namespace kiln::testing
