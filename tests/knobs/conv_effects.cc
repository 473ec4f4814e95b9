// Effects of the convolution knobs (cpu.conv.algo's pointwise, cpu.conv.im2col_tile) and of the
// NHWC layout (graph.layout). cpu_effects.cc holds cpu.conv.algo's other
// values.
#include <gtest/gtest.h>

#include <cmath>

#include "../unit/cpu_route_util.h"
#include "graph_sketch.h"
#include "kiln/knobs/knob.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

const std::map<std::string, ir::Attribute> kSame3x3 = {{"pads", ints({1, 1, 1, 1})}};
constexpr const char* kDefaultTile = "1024";  // cpu.conv.im2col_tile's default

// A GEMM-based tactic with the default GEMM source: "im2col+native.tile1024", say.
std::string gemm(const std::string& algo, const std::string& tile = kDefaultTile) {
  const knobs::KnobSpec* source = knobs::KnobRegistry::global().find("cpu.gemm.source");
  return algo + "+" + (source ? source->defaultValue : "?") + (tile == "0" ? "" : ".tile" + tile);
}

KILN_KNOB_EFFECT({
    .knob = "cpu.conv.algo",
    .value = "pointwise",
    .shows = "a depthwise 1x1 Conv runs as a GEMM on its input instead of the direct loop",
    .graph =
        [] {
          GraphSketch g;
          g.output(g.node("Conv", {g.input("x", {1, 8, 10, 10}), g.weight("w", {8, 1, 1, 1})},
                          {{"group", ir::Attribute{int64_t{8}}}}, "conv"));
          return g.take();
        },
    .baseRoute = kiln::testing::kNativeNchwRoute,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").tactic, "direct");
          EXPECT_EQ(changed.layer("conv").tactic, gemm("pointwise"));
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.conv.algo",
    .value = "im2col",
    .shows = "a 1x1 Conv copies its input into columns instead of multiplying it in place",
    .graph =
        [] {
          GraphSketch g;
          g.output(g.node("Conv", {g.input("x", {1, 6, 9, 7}), g.weight("w", {10, 6, 1, 1})}, {},
                          "conv"));
          return g.take();
        },
    .baseRoute = kiln::testing::kNativeNchwRoute,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").tactic, gemm("pointwise"));
          EXPECT_EQ(changed.layer("conv").tactic, gemm("im2col"));
        },
});

// A 3x3 Conv over 64x64 pixels: 4096 output pixels, tiled differently by each value.
ir::Graph largeConv() {
  GraphSketch g;
  g.output(g.node("Conv", {g.input("x", {1, 3, 64, 64}), g.weight("w", {5, 3, 3, 3})}, kSame3x3,
                  "conv"));
  return g.take();
}

KnobEffect tileEffect(const std::string& value) {
  return {
      .knob = "cpu.conv.im2col_tile",
      .value = value,
      .shows = value == "0" ? "the 4096-pixel im2col GEMM runs whole instead of in tiles"
                            : "the 4096-pixel im2col GEMM runs in tiles of " + value + " pixels",
      .graph = largeConv,
      .baseRoute = kiln::testing::kNativeNchwRoute,
      .expect =
          [value](const BuildSnapshot& base, const BuildSnapshot& changed) {
            EXPECT_EQ(base.layer("conv").tactic, gemm("im2col"));
            EXPECT_EQ(changed.layer("conv").tactic, gemm("im2col", value));
          },
  };
}

const int kTileEffects[] = {
    registerKnobEffect(tileEffect("0")),
    registerKnobEffect(tileEffect("256")),
    registerKnobEffect(tileEffect("4096")),
};

// conv -> relu -> conv -> max pool -> concat with the first conv's pooled output: every node has
// an NHWC form, so only the graph's input and output transpose.
ir::Graph convChain() {
  GraphSketch g;
  auto x = g.input("x", {1, 4, 12, 12});
  auto c1 = g.node("Conv", {x, g.weight("w1", {8, 4, 3, 3}), g.weight("b1", {8})}, kSame3x3, "c1");
  auto r1 = g.node("Relu", {c1}, {}, "r1");
  auto c2 = g.node("Conv", {r1, g.weight("w2", {8, 1, 3, 3})},
                   {{"pads", ints({1, 1, 1, 1})}, {"group", ir::Attribute{int64_t{8}}}}, "c2");
  const std::map<std::string, ir::Attribute> pool = {{"kernel_shape", ints({2, 2})},
                                                     {"strides", ints({2, 2})}};
  auto p2 = g.node("MaxPool", {c2}, pool, "p2");
  auto p1 = g.node("AveragePool", {r1}, pool, "p1");
  auto cat = g.node("Concat", {p1, p2}, {{"axis", ir::Attribute{int64_t{1}}}}, "cat");
  g.output(g.node("GlobalAveragePool", {cat}, {}, "gap"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "graph.layout",
    .value = "nchw",
    .shows = "convolutions, pools and the Relu and Concat between them run in ONNX's NCHW "
             "instead of NHWC, without NHWC's Transpose in",
    .graph = convChain,
    .baseRoute = kiln::testing::kNativeConvRoute,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(changed.layer("c1").op, "kiln.FusedConv");
          EXPECT_EQ(changed.layer("c1").layout, "nchw");
          EXPECT_EQ(base.layer("c1").op, "kiln.NhwcConv");
          EXPECT_EQ(base.layer("c1").layout, "nhwc");
          EXPECT_EQ(base.layer("c1").tactic, "nhwc." + gemm("im2col"));
          EXPECT_EQ(base.layer("c2").tactic, "nhwc.depthwise");
          EXPECT_EQ(base.layer("p1").op, "kiln.NhwcAveragePool");
          EXPECT_EQ(base.layer("p2").op, "kiln.NhwcMaxPool");
          EXPECT_EQ(base.layer("gap").op, "kiln.NhwcGlobalAveragePool");
          EXPECT_EQ(base.layer("gap").tactic, "nhwc.global_pool");
          EXPECT_EQ(base.layer("cat").op, "Concat");
          EXPECT_EQ(changed.layer("p2").op, "MaxPool");
          // NHWC's graph-input transpose; its [1,1,1,16] -> [1,16,1,1] output is a Reshape,
          // which the CPU backend aliases without a step.
          EXPECT_EQ(base.layersOf("Transpose").size(), 1u) << base.summary();
          EXPECT_TRUE(changed.layersOf("Transpose").empty()) << changed.summary();
          EXPECT_EQ(base.layers.size(), changed.layers.size() + 1) << base.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.conv.precision",
    .value = "bf16",
    .shows = "a dense 3x3 Conv's GEMM reads bfloat16 operands: the layer says bf16 and the outputs "
             "move by about bfloat16's rounding (K = 36, operands within 2)",
    .graph =
        [] {
          GraphSketch g;
          g.output(g.node("Conv", {g.input("x", {1, 4, 10, 10}), g.weight("w", {8, 4, 3, 3})},
                          {{"pads", ints({1, 1, 1, 1})}}, "conv"));
          return g.take();
        },
    .baseRoute = kiln::testing::kNativeNchwRoute,
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").precision, "fp32");
          EXPECT_EQ(changed.layer("conv").precision, "bf16");
          EXPECT_TRUE(changed.layer("conv").tactic.starts_with("im2col+native"))
              << changed.layer("conv").tactic;
          // Rounded operands must show in the outputs, or the knob did not reach the kernel.
          double largest = 0;
          const ir::Tensor& a = base.outputs[0];
          const ir::Tensor& b = changed.outputs[0];
          for (int64_t i = 0; i < a.elementCount(); ++i) {
            largest = std::max(largest, std::fabs(a.elementAsDouble(i) - b.elementAsDouble(i)));
          }
          EXPECT_GT(largest, 1e-4);
        },
});

}  // namespace
}  // namespace kiln::testing
