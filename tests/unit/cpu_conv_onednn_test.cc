// The CPU backend's oneDNN convolutions (conv_onednn.cc, cpu.conv.source=onednn) against the
// reference executor: 1x1, 3x3 and 5x5 of strides 1 and 2 with symmetric and asymmetric pads,
// dilations, groups, depthwise 3x3 and 7x7, batch 2 and channel counts off oneDNN's blocks of 16,
// in NCHW and (through graph.layout=nhwc) NHWC graphs, over every cpu.onednn.* value and 1 to 3
// threads (slices of output channels, rows or images); FusedConv with each
// activation and a residual, fused into the primitive and left to kiln's epilogue; and which nodes
// oneDNN takes, and what their tactics say.
#if KILN_HAVE_ONEDNN
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>

#include "kiln/backends/cpu/plan.h"
#include "kiln/engine/builder.h"
#include "kiln/ir/op_schema.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/reference/executor.h"
// After op_schema.h, which it needs.
#include "../knobs/graph_sketch.h"
#include "cpu_conv_test_util.h"

namespace kiln::testing {
namespace {

using cpu::Step;
using ir::Attribute;
using ir::Shape;
using ir::Tensor;
using CpuRun = RepeatedCpuRun;

struct ConvCase {
  const char* name;
  Shape x, w;
  Attributes attributes;
  bool bias = false;
};

void PrintTo(const ConvCase& c, std::ostream* out) { *out << c.name; }

const std::vector<ConvCase>& convCases() {
  static const std::vector<ConvCase> cases = {
      {"pointwise", {1, 24, 9, 7}, {40, 24, 1, 1}, {}, true},
      {"pointwise_batch2_odd_channels", {2, 7, 5, 3}, {9, 7, 1, 1}, {}},
      {"1x1_stride2", {1, 16, 7, 7}, {8, 16, 1, 1}, {{"strides", ints({2, 2})}}, true},
      {"3x3_same", {1, 32, 10, 9}, {48, 32, 3, 3}, {{"pads", ints({1, 1, 1, 1})}}, true},
      {"3x3_first_layer", {1, 3, 17, 19}, {16, 3, 3, 3}, {{"strides", ints({2, 2})}}, true},
      {"3x3_stride2_asymmetric_pads",
       {1, 20, 9, 8},
       {24, 20, 3, 3},
       {{"strides", ints({2, 2})}, {"pads", ints({0, 1, 2, 1})}}},
      {"3x3_dilation2",
       {1, 16, 11, 10},
       {16, 16, 3, 3},
       {{"dilations", ints({2, 2})}, {"pads", ints({2, 2, 2, 2})}},
       true},
      {"5x5_batch2", {2, 5, 13, 11}, {8, 5, 5, 5}, {{"pads", ints({2, 2, 2, 2})}}, true},
      {"group2",
       {1, 32, 6, 6},
       {32, 16, 3, 3},
       {{"group", intAttr(2)}, {"pads", ints({1, 1, 1, 1})}}},
      {"group4_odd", {1, 12, 7, 5}, {8, 3, 3, 3}, {{"group", intAttr(4)}}, true},
      {"depthwise3x3",
       {1, 32, 9, 9},
       {32, 1, 3, 3},
       {{"group", intAttr(32)}, {"pads", ints({1, 1, 1, 1})}},
       true},
      {"depthwise3x3_stride2_batch2",
       {2, 5, 9, 7},
       {5, 1, 3, 3},
       {{"group", intAttr(5)}, {"pads", ints({1, 1, 1, 1})}, {"strides", ints({2, 2})}}},
      {"depthwise7x7",
       {1, 24, 9, 9},
       {24, 1, 7, 7},
       {{"group", intAttr(24)}, {"pads", ints({3, 3, 3, 3})}},
       true},
      {"depthwise_dilation2",
       {1, 16, 9, 10},
       {16, 1, 3, 3},
       {{"group", intAttr(16)}, {"dilations", ints({2, 2})}, {"pads", ints({2, 2, 2, 2})}}},
      // Split over threads in slices of 16 output channels (groups), batch 2: the slices read
      // and write strided parts of the input and output.
      {"3x3_batch2_sliced", {2, 16, 7, 6}, {40, 16, 3, 3}, {{"pads", ints({1, 1, 1, 1})}}, true},
      {"group2_batch2_sliced",
       {2, 32, 5, 5},
       {64, 16, 3, 3},
       {{"group", intAttr(2)}, {"pads", ints({1, 1, 1, 1})}},
       true},
      {"depthwise_batch2_sliced",
       {2, 40, 6, 5},
       {40, 1, 3, 3},
       {{"group", intAttr(40)}, {"pads", ints({1, 1, 1, 1})}},
       true},
      {"auto_pad_same_upper",
       {1, 8, 6, 5},
       {16, 8, 3, 3},
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

class OnednnConv : public ::testing::TestWithParam<ConvCase> {};

TEST_P(OnednnConv, EveryGraphLayoutAlgoFormatPostopsAndThreadCountMatchesReference) {
  const ConvCase& c = GetParam();
  const GraphFactory make = convGraph(c);
  const std::vector<Tensor> inputs = randomInputs(make(), 11);
  const std::vector<Tensor> expected = runReference(make, inputs);
  for (const char* graphLayout : {"nchw", "nhwc"}) {
    for (const char* algo : {"direct", "winograd"}) {
      for (const char* layout : {"auto", "blocked", "plain"}) {
        for (const char* postops : {"on", "off"}) {
          for (int threads : {1, 2, 3}) {
            const std::string route = fmt::format(
                "-graph.layout={} -cpu.conv.source=onednn -cpu.onednn.conv_algo={} "
                "-cpu.onednn.layout={} -cpu.onednn.postops={} -cpu.threads={}",
                graphLayout, algo, layout, postops, threads);
            SCOPED_TRACE(route);
            const CpuRun run = runCpuTwice(make, route, inputs);
            const std::string tactic = run.tactic("conv");
            EXPECT_TRUE(tactic.starts_with("onednn.")) << tactic;
            EXPECT_EQ(run.layouts.at("conv"), graphLayout);
            // A Conv with a bias and postops off adds it in kiln's epilogue.
            EXPECT_EQ(tactic.ends_with("+epilogue"), c.bias && std::string(postops) == "off")
                << tactic;
            const bool fallback = tactic.find(".no_winograd") != std::string::npos;
            const bool winograd = !fallback && tactic.find("wino") != std::string::npos;
            EXPECT_EQ(winograd || fallback, std::string(algo) == "winograd") << tactic;
            expectClose(run.outputs, expected, winograd ? 2e-3 : 1e-4);
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, OnednnConv, ::testing::ValuesIn(convCases()),
                         [](const auto& info) { return std::string(info.param.name); });

// Conv + residual Add + activation, which the fusion pass turns into one FusedConv.
struct Activation {
  const char* op;
  Attributes attributes;
  bool clipInputs = false;  // Clip's bounds as inputs
};

GraphFactory fusedGraph(const Activation& a, const Shape& x, const Shape& w, Attributes conv,
                        bool residual) {
  return [a, x, w, conv, residual] {
    GraphSketch g;
    auto in = g.input("x", x);
    std::string y =
        g.node("Conv", {in, g.weight("w", w), g.weight("b", Shape{w[0]})}, conv, "conv");
    if (residual) y = g.node("Add", {y, g.input("skip", Shape{x[0], w[0], x[2], x[3]})}, {}, "add");
    if (std::string(a.op) == "Silu") {
      g.output(g.node("Mul", {g.node("Sigmoid", {y}, {}, "sig"), y}, {}, "act"));
      return g.take();
    }
    std::vector<std::string> actInputs = {y};
    if (a.clipInputs) {
      actInputs.push_back(g.constant("lo", Tensor::scalar<float>(-0.25f)));
      actInputs.push_back(g.constant("hi", Tensor::scalar<float>(0.5f)));
    }
    g.output(g.node(a.op, actInputs, a.attributes, "act"));
    return g.take();
  };
}

TEST(OnednnFusedConv, EachActivationWithAndWithoutResidualMatchesReference) {
  const std::vector<Activation> activations = {
      {"Relu", {}},
      {"LeakyRelu", {{"alpha", Attribute{0.3f}}}},
      {"Clip", {}, true},
      {"Sigmoid", {}},
      {"HardSigmoid", {{"alpha", Attribute{0.3f}}, {"beta", Attribute{0.4f}}}},
      {"HardSwish", {}},
      {"Tanh", {}},
      {"Gelu", {}},
      {"Gelu", {{"approximate", Attribute{std::string("tanh")}}}},
      {"Silu", {}},
  };
  struct Geometry {
    Shape x, w;
    Attributes conv;
  };
  const std::vector<Geometry> geometries = {
      {{1, 16, 9, 11}, {32, 16, 3, 3}, {{"pads", ints({1, 1, 1, 1})}}},
      {{2, 6, 5, 7}, {20, 6, 1, 1}, {}},
      {{1, 24, 7, 5}, {24, 1, 3, 3}, {{"pads", ints({1, 1, 1, 1})}, {"group", intAttr(24)}}},
  };
  for (const Activation& a : activations) {
    for (const Geometry& geometry : geometries) {
      for (bool residual : {true, false}) {
        const GraphFactory make = fusedGraph(a, geometry.x, geometry.w, geometry.conv, residual);
        const std::vector<Tensor> inputs = randomInputs(make(), 5);
        const std::vector<Tensor> expected = runReference(make, inputs);
        for (const char* layout : {"nchw-blocked", "nchw-plain", "nhwc-plain", "nhwc-blocked"}) {
          for (const char* postops : {"on", "off"}) {
            for (int threads : {1, 2}) {
              const std::string route = fmt::format(
                  "-graph.layout={} -cpu.conv.source=onednn -cpu.onednn.layout={} "
                  "-cpu.onednn.postops={} -cpu.threads={}",
                  std::string(layout).substr(0, 4), std::string(layout).substr(5), postops,
                  threads);
              SCOPED_TRACE(fmt::format("{} {} residual {} {}", a.op, geometry.x.toString(),
                                       residual, route));
              const CpuRun run = runCpuTwice(make, route, inputs);
              ASSERT_EQ(run.tactics.count("add") + run.tactics.count("act"), 0u)
                  << "the chain was not fused into the convolution";
              EXPECT_EQ(run.ops.at("conv"), layout[1] == 'h' ? "NhwcConv" : "FusedConv");
              const std::string tactic = run.tactic("conv");
              EXPECT_TRUE(tactic.starts_with("onednn.")) << tactic;
              EXPECT_EQ(tactic.ends_with("+epilogue"), std::string(postops) == "off") << tactic;
              expectClose(run.outputs, expected);
            }
          }
        }
      }
    }
  }
}

std::string tacticOf(const GraphFactory& make, const std::string& route) {
  return runCpuTwice(make, route, randomInputs(make(), 3)).tactic("conv");
}

const ConvCase& caseNamed(const std::string& name) {
  for (const ConvCase& c : convCases()) {
    if (name == c.name) return c;
  }
  ADD_FAILURE() << name;
  return convCases()[0];
}

TEST(OnednnTactics, OnednnByDefaultNativeWhereTheRouteAsksPerNode) {
  const GraphFactory make = [] {
    GraphSketch g;
    auto a = g.node("Conv", {g.input("x", {1, 16, 8, 8}), g.weight("wa", {16, 16, 3, 3})},
                    {{"pads", ints({1, 1, 1, 1})}}, "a");
    g.output(g.node("Conv", {a, g.weight("wb", {8, 16, 1, 1})}, {}, "b"));
    return g.take();
  };
  const std::vector<Tensor> inputs = randomInputs(make(), 4);
  const std::vector<Tensor> expected = runReference(make, inputs);
  const CpuRun native = runCpuTwice(make, "-graph.layout=nchw -cpu.conv.source=native", inputs);
  EXPECT_FALSE(native.tactic("a").starts_with("onednn.")) << native.tactic("a");
  EXPECT_FALSE(native.tactic("b").starts_with("onednn.")) << native.tactic("b");
  const CpuRun both = runCpuTwice(make, "-graph.layout=nchw", inputs);
  EXPECT_TRUE(both.tactic("a").starts_with("onednn.")) << both.tactic("a");
  EXPECT_TRUE(both.tactic("b").starts_with("onednn.")) << both.tactic("b");
  expectClose(both.outputs, expected);
  const CpuRun one = runCpuTwice(make, "-graph.layout=nchw -cpu.conv.source@b=native", inputs);
  EXPECT_TRUE(one.tactic("a").starts_with("onednn.")) << one.tactic("a");
  EXPECT_EQ(one.tactic("b"), native.tactic("b"));
  expectClose(one.outputs, expected);
}

TEST(OnednnTactics, NchwGraphsReorderToBlockedByDefaultPlainReadsNchw) {
  const GraphFactory make = convGraph(caseNamed("3x3_same"));
  const std::string blocked = tacticOf(make, "-graph.layout=nchw");
  EXPECT_TRUE(blocked.ends_with(".via_nhwc")) << blocked;  // brgconv's f32 format on AVX-512
  const std::string plain = tacticOf(make, "-graph.layout=nchw -cpu.onednn.layout=plain");
  EXPECT_TRUE(plain.starts_with("onednn.")) << plain;
  EXPECT_EQ(plain.find(".via_"), std::string::npos) << plain;
}

TEST(OnednnTactics, WinogradWhereOnednnHasItDirectElsewhere) {
  const std::string route = "-graph.layout=nchw -cpu.onednn.conv_algo=winograd";
  // 3x3, stride 1, 32 -> 48 channels: oneDNN's AVX-512 Winograd kernels take it.
  const std::string dense = tacticOf(convGraph(caseNamed("3x3_same")), route);
  EXPECT_NE(dense.find("wino"), std::string::npos) << dense;
  EXPECT_EQ(dense.find("no_winograd"), std::string::npos) << dense;
  // Not 3x3 stride 1: direct, and the tactic says why.
  for (const char* name : {"pointwise", "3x3_first_layer", "depthwise3x3"}) {
    const std::string tactic = tacticOf(convGraph(caseNamed(name)), route);
    EXPECT_TRUE(tactic.ends_with(".no_winograd")) << name << ": " << tactic;
  }
}

TEST(OnednnTactics, DeclinesRuntimeWeights) {
  // Weights that are a graph input cannot be reordered at build time: the native kernels run.
  const GraphFactory runtimeWeights = [] {
    GraphSketch g;
    g.output(g.node("Conv", {g.input("x", {1, 8, 6, 6}), g.input("w", {8, 8, 3, 3})}, {}, "conv"));
    return g.take();
  };
  const std::string tactic = tacticOf(runtimeWeights, "-cpu.conv.source=onednn");
  EXPECT_FALSE(tactic.starts_with("onednn.")) << tactic;
}

TEST(OnednnTactics, NhwcGraphsReadAndWriteNhwcWithoutReordersByDefault) {
  const std::string route = "-graph.layout=nhwc -cpu.conv.source=onednn";
  for (const char* name : {"3x3_same", "group2"}) {
    const GraphFactory make = convGraph(caseNamed(name));
    for (const std::string& plain :
         {tacticOf(make, route), tacticOf(make, route + " -cpu.onednn.layout=plain")}) {
      EXPECT_TRUE(plain.starts_with("onednn.")) << name << ": " << plain;
      EXPECT_EQ(plain.find(".via_"), std::string::npos) << name << ": " << plain;
    }
    const std::string native = tacticOf(make, "-graph.layout=nhwc -cpu.conv.source=native");
    EXPECT_TRUE(native.starts_with("nhwc.")) << name << ": " << native;
  }
  // oneDNN's own choice for a grouped convolution is channel blocks, reordered to and from.
  const std::string blocked =
      tacticOf(convGraph(caseNamed("group2")), route + " -cpu.onednn.layout=blocked");
  EXPECT_TRUE(blocked.ends_with(".via_nChw16c")) << blocked;
}

}  // namespace
}  // namespace kiln::testing

#endif  // KILN_HAVE_ONEDNN
