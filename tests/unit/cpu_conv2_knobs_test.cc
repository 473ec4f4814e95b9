// Convolution scheduling knobs, round two, against the reference executor at 1 and 2 threads:
// cpu.onednn.split (how conv_onednn.cc slices one convolution over the plan's threads) and
// cpu.onednn.weights (blocked or plain weights) in NCHW and NHWC graphs, over every
// cpu.onednn.layout and postops value; and the cpu.gemm.* options
// (kc, kernel, block_a, block_b, split) reaching the GEMMs of kiln's native im2col and pointwise
// convolutions (conv.cc, conv_nhwc.cc), named in their tactics.
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
  bool fusedResidualRelu = false;  // + Add(skip) + Relu: one FusedConv (NhwcConv) with a residual
};

void PrintTo(const ConvCase& c, std::ostream* out) { *out << c.name; }

GraphFactory convGraph(const ConvCase& c) {
  return [c] {
    GraphSketch g;
    std::vector<std::string> inputs = {g.input("x", c.x), g.weight("w", c.w)};
    if (c.bias) inputs.push_back(g.weight("b", Shape{c.w[0]}));
    std::string y = g.node("Conv", inputs, c.attributes, "conv");
    if (c.fusedResidualRelu) {
      const Shape out{c.x[0], c.w[0], c.x[2], c.x[3]};  // the cases below keep the plane
      y = g.node("Relu", {g.node("Add", {y, g.input("skip", out)}, {}, "add")}, {}, "relu");
    }
    g.output(y);
    return g.take();
  };
}

std::string tacticOf(const CpuRun& run) { return run.tactic("conv"); }

#if KILN_HAVE_ONEDNN

const std::vector<ConvCase>& splitCases() {
  static const std::vector<ConvCase> cases = {
      {"pointwise_bias", {1, 24, 9, 7}, {40, 24, 1, 1}, {}, true},
      {"3x3_bias_40_channels", {1, 16, 7, 6}, {40, 16, 3, 3}, {{"pads", ints({1, 1, 1, 1})}}, true},
      {"3x3_stride2_asymmetric_pads",
       {1, 20, 9, 8},
       {24, 20, 3, 3},
       {{"strides", ints({2, 2})}, {"pads", ints({0, 1, 2, 1})}}},
      {"3x3_dilation2_batch2",
       {2, 16, 11, 10},
       {32, 16, 3, 3},
       {{"dilations", ints({2, 2})}, {"pads", ints({2, 2, 2, 2})}},
       true},
      {"group2_batch2",
       {2, 32, 5, 5},
       {64, 16, 3, 3},
       {{"group", intAttr(2)}, {"pads", ints({1, 1, 1, 1})}},
       true},
      {"depthwise3x3",
       {1, 40, 9, 9},
       {40, 1, 3, 3},
       {{"group", intAttr(40)}, {"pads", ints({1, 1, 1, 1})}},
       true},
      {"fused_residual_relu",
       {1, 16, 8, 7},
       {32, 16, 3, 3},
       {{"pads", ints({1, 1, 1, 1})}},
       true,
       true},
  };
  return cases;
}

class OnednnSplit : public ::testing::TestWithParam<ConvCase> {};

TEST_P(OnednnSplit, EverySplitWeightsLayoutPostopsAndThreadCountMatchesReference) {
  const ConvCase& c = GetParam();
  const GraphFactory make = convGraph(c);
  const std::vector<Tensor> inputs = randomInputs(make(), 17);
  const std::vector<Tensor> expected = runReference(make, inputs);
  for (const char* graphLayout : {"nchw", "nhwc"}) {
    for (const std::string split : {"auto", "channels", "rows", "none"}) {
      for (const char* weights : {"blocked", "plain"}) {
        for (const char* layout : {"auto", "blocked", "plain"}) {
          for (const char* postops : {"on", "off"}) {
            for (int threads : {1, 2}) {
              const std::string route = fmt::format(
                  "-graph.layout={} -cpu.conv.source=onednn -cpu.onednn.split={} "
                  "-cpu.onednn.weights={} -cpu.onednn.layout={} -cpu.onednn.postops={} "
                  "-cpu.threads={}",
                  graphLayout, split, weights, layout, postops, threads);
              SCOPED_TRACE(route);
              const CpuRun run = runCpuTwice(make, route, inputs);
              if (c.fusedResidualRelu) {
                ASSERT_EQ(run.tactics.count("add") + run.tactics.count("relu"), 0u)
                    << "the chain was not fused into the convolution";
              }
              const std::string tactic = tacticOf(run);
              EXPECT_TRUE(tactic.starts_with("onednn.")) << tactic;
              EXPECT_EQ(run.layouts.at("conv"), graphLayout);
              EXPECT_EQ(tactic.find(".weights_plain") != std::string::npos,
                        std::string(weights) == "plain")
                  << tactic;
              if (split == "auto") {
                EXPECT_EQ(tactic.find(".split_"), std::string::npos) << tactic;
              } else {
                // One slice for none or one thread; else one a thread at most.
                const size_t at = tactic.find(".split_" + split + "_x");
                ASSERT_NE(at, std::string::npos) << tactic;
                const int slices = std::stoi(tactic.substr(at + 9 + split.size()));
                EXPECT_GE(slices, 1) << tactic;
                EXPECT_LE(slices, split == "none" ? 1 : threads) << tactic;
              }
              expectClose(run.outputs, expected);
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, OnednnSplit, ::testing::ValuesIn(splitCases()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(OnednnSplit, TwoThreadsSliceAsAsked) {
  // 40 output channels in 3 blocks of 16, 6 output rows: both splits give each thread a slice.
  const ConvCase c{"3x3", {1, 16, 7, 6}, {40, 16, 3, 3}, {{"pads", ints({1, 1, 1, 1})}}, true};
  const GraphFactory make = convGraph(c);
  const std::vector<Tensor> inputs = randomInputs(make(), 3);
  for (const char* graphLayout : {"nchw", "nhwc"}) {
    const auto tactic = [&](const char* split) {
      return tacticOf(runCpuTwice(
          make,
          fmt::format("-graph.layout={} -cpu.threads=2 -cpu.onednn.split={}", graphLayout, split),
          inputs));
    };
    EXPECT_TRUE(tactic("channels").ends_with(".split_channels_x2")) << tactic("channels");
    EXPECT_TRUE(tactic("rows").ends_with(".split_rows_x2")) << tactic("rows");
    EXPECT_TRUE(tactic("none").ends_with(".split_none_x1")) << tactic("none");
    EXPECT_EQ(tactic("auto").find(".split_"), std::string::npos) << tactic("auto");
  }
}

#endif  // KILN_HAVE_ONEDNN

// The GEMM options of a native convolution: each non-default cpu.gemm.* value shows in the
// tactic of im2col and pointwise convolutions, NCHW and NHWC, and the results stay the
// reference's.
TEST(NativeConvGemmOptions, NonDefaultValuesReachTheTacticAndKeepResults) {
  struct Option {
    const char* route;
    const char* suffix;
  };
  const std::vector<Option> options = {
      {"-cpu.gemm.kc=128", ".kc128"},
      {"-cpu.gemm.kc=512", ".kc512"},
      {"-cpu.gemm.kernel=portable", ".portable"},
      {"-cpu.gemm.block_a=96", ".a96k"},
      {"-cpu.gemm.block_b=1024", ".b1024k"},
      {"-cpu.gemm.split=rows", ".rows"},
      {"-cpu.gemm.split=columns", ".columns"},
      {"-cpu.gemm.kc=128 -cpu.gemm.kernel=portable -cpu.gemm.split=rows", ".kc128.portable.rows"},
  };
  // Deep enough (patch 48 * 9 = 432) that kc 128 packs several panels.
  const std::vector<std::pair<ConvCase, const char*>> cases = {
      {{"3x3", {1, 48, 9, 8}, {40, 48, 3, 3}, {{"pads", ints({1, 1, 1, 1})}}, true}, "im2col+"},
      {{"pointwise", {2, 300, 5, 6}, {24, 300, 1, 1}, {}, true}, "pointwise+"},
      {{"3x3_fused", {1, 48, 6, 5}, {16, 48, 3, 3}, {{"pads", ints({1, 1, 1, 1})}}, true, true},
       "im2col+"},
  };
  for (const auto& [c, algo] : cases) {
    const GraphFactory make = convGraph(c);
    const std::vector<Tensor> inputs = randomInputs(make(), 23);
    const std::vector<Tensor> expected = runReference(make, inputs);
    for (const char* graphLayout : {"nchw", "nhwc"}) {
      for (int threads : {1, 2}) {
        const std::string base = fmt::format(
            "-graph.layout={} -cpu.conv.source=native -cpu.gemm.source=native -cpu.threads={}",
            graphLayout, threads);
        {
          SCOPED_TRACE(c.name + std::string(" ") + base);
          const CpuRun run = runCpuTwice(make, base, inputs);
          EXPECT_NE(tacticOf(run).find(algo), std::string::npos) << tacticOf(run);
          EXPECT_TRUE(tacticOf(run).ends_with("+native.tile1024")) << tacticOf(run);
          expectClose(run.outputs, expected);
        }
        for (const Option& option : options) {
          const std::string route = base + " " + option.route;
          SCOPED_TRACE(c.name + std::string(" ") + route);
          const CpuRun run = runCpuTwice(make, route, inputs);
          const std::string tactic = tacticOf(run);
          EXPECT_NE(tactic.find(algo), std::string::npos) << tactic;
          EXPECT_TRUE(tactic.ends_with(std::string("+native.tile1024") + option.suffix)) << tactic;
          expectClose(run.outputs, expected);
        }
      }
    }
  }
}

TEST(NativeConvGemmOptions, BlasConvolutionsNameNoNativeOptions) {
  const ConvCase c{"3x3", {1, 16, 6, 6}, {16, 16, 3, 3}, {{"pads", ints({1, 1, 1, 1})}}};
  const GraphFactory make = convGraph(c);
  const std::vector<Tensor> inputs = randomInputs(make(), 5);
  const CpuRun run = runCpuTwice(make,
                                 "-graph.layout=nchw -cpu.conv.source=native -cpu.conv.algo=im2col "
                                 "-cpu.gemm.source=blas -cpu.gemm.kc=128 -cpu.gemm.split=rows",
                                 inputs);
  EXPECT_EQ(tacticOf(run), "im2col+blas.tile1024");
  expectClose(run.outputs, runReference(make, inputs));
}

}  // namespace
}  // namespace kiln::testing
