// Effects of the fusion.* knobs (and graph.fold_batchnorm, which fusion depends on).
#include <gtest/gtest.h>

#include "../unit/cpu_route_util.h"
#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

const std::map<std::string, ir::Attribute> kSame3x3 = {{"pads", ints({1, 1, 1, 1})}};

KILN_KNOB_EFFECT({
    .knob = "graph.fold_batchnorm",
    .value = "off",
    .shows = "a BatchNormalization after a Conv stays its own layer",
    .graph =
        [] {
          GraphSketch g;
          auto conv = g.node("Conv", {g.input("x", {1, 4, 8, 8}), g.weight("w", {6, 4, 3, 3})},
                             kSame3x3, "conv");
          auto bn = g.node("BatchNormalization",
                           {conv, g.weight("scale", {6}), g.weight("bias", {6}),
                            g.weight("mean", {6}), g.weight("var", {6}, 0.1f, 1.0f)},
                           {}, "bn");
          g.output(bn);
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_FALSE(base.hasOp("BatchNormalization"));
          EXPECT_EQ(changed.layer("bn").op, "BatchNormalization");
        },
});

ir::Graph convRelu() {
  GraphSketch g;
  auto conv =
      g.node("Conv", {g.input("x", {1, 4, 8, 8}), g.weight("w", {6, 4, 3, 3}), g.weight("b", {6})},
             kSame3x3, "conv");
  g.output(g.node("Relu", {conv}, {}, "relu"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "fusion.conv_act",
    .value = "off",
    .shows = "Conv + Relu stay two layers instead of one FusedConv",
    .graph = convRelu,
    .baseRoute = kiln::testing::kNativeNchwRoute,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").op, "kiln.FusedConv");
          EXPECT_EQ(changed.layer("conv").op, "Conv");
          EXPECT_EQ(changed.layer("relu").op, "Relu");
        },
});

KILN_KNOB_EFFECT({
    .knob = "fusion.conv_residual",
    .value = "off",
    .shows = "the residual Add after a Conv stays a layer (and the Relu after it too)",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {1, 4, 8, 8});
          auto conv = g.node("Conv", {x, g.weight("w", {4, 4, 3, 3})}, kSame3x3, "conv");
          auto sum = g.node("Add", {conv, x}, {}, "residual");
          g.output(g.node("Relu", {sum}, {}, "relu"));
          return g.take();
        },
    .baseRoute = kiln::testing::nativeNchwRoute("-fusion.eltwise_chain=off"),
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layers.size(), 1u) << base.summary();
          EXPECT_EQ(changed.layer("residual").op, "Add");
        },
});

KILN_KNOB_EFFECT({
    .knob = "fusion.gemm_act",
    .value = "off",
    .shows = "MatMul + bias Add + Relu stay three layers instead of one FusedGemm",
    .graph =
        [] {
          GraphSketch g;
          auto mm = g.node("MatMul", {g.input("x", {2, 5, 16}), g.weight("w", {16, 8})}, {}, "fc");
          auto biased = g.node("Add", {mm, g.weight("b", {8})}, {}, "bias");
          g.output(g.node("Relu", {biased}, {}, "relu"));
          return g.take();
        },
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("fc").op, "kiln.FusedGemm");
          EXPECT_EQ(changed.layer("fc").op, "MatMul");
          EXPECT_EQ(changed.layers.size(), 3u);
        },
});

}  // namespace
}  // namespace kiln::testing
