// Effects of the oneDNN convolution knobs (kernels/conv_onednn.cc): the tactic source of float32
// convolutions, and the algorithm, tensor formats and post-ops of oneDNN's primitive. The knobs
// exist only in builds with oneDNN.
#if KILN_HAVE_ONEDNN
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// The cases below on an NCHW graph (the default layout is NHWC).
constexpr const char* kNchw = "-graph.layout=nchw";

// x [1, 32, 10, 10] -> Conv 3x3 (pads 1, bias) to 32 channels: a shape every oneDNN algorithm
// and format has a kernel for.
ir::Graph conv3x3() {
  GraphSketch g;
  g.output(g.node(
      "Conv", {g.input("x", {1, 32, 10, 10}), g.weight("w", {32, 32, 3, 3}), g.weight("b", {32})},
      {{"pads", ints({1, 1, 1, 1})}}, "conv"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cpu.conv.source",
    .value = "native",
    .shows = "a 3x3 Conv runs kiln's im2col instead of a oneDNN primitive (named in the tactic)",
    .graph = conv3x3,
    .baseRoute = kNchw,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_TRUE(base.layer("conv").tactic.starts_with("onednn.")) << base.summary();
          EXPECT_EQ(base.layer("conv").layout, "nchw");
          EXPECT_TRUE(changed.layer("conv").tactic.starts_with("im2col+")) << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.onednn.conv_algo",
    .value = "winograd",
    .shows = "the 3x3 stride-1 Conv runs oneDNN's Winograd kernel instead of its direct one, "
             "and its outputs move by Winograd's rounding",
    .graph = conv3x3,
    .baseRoute = kNchw,
    .tolerance = 1e-3,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").tactic.find("wino"), std::string::npos) << base.summary();
          EXPECT_NE(changed.layer("conv").tactic.find("wino"), std::string::npos)
              << changed.summary();
          EXPECT_EQ(changed.layer("conv").tactic.find("no_winograd"), std::string::npos);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.onednn.layout",
    .value = "plain",
    .shows = "in an NCHW graph, the oneDNN primitive reads and writes NCHW itself: no reorders "
             "around it",
    .graph = conv3x3,
    .baseRoute = kNchw,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_TRUE(base.layer("conv").tactic.ends_with(".via_nhwc")) << base.summary();
          EXPECT_TRUE(changed.layer("conv").tactic.starts_with("onednn.")) << changed.summary();
          EXPECT_EQ(changed.layer("conv").tactic.find(".via_"), std::string::npos);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.onednn.layout",
    .value = "blocked",
    .shows = "in an NHWC graph, a grouped Conv's oneDNN primitive works in channel blocks of 16, "
             "reordered from and to NHWC, instead of on NHWC itself",
    .graph =
        [] {
          GraphSketch g;
          g.output(g.node(
              "Conv",
              {g.input("x", {1, 32, 10, 10}), g.weight("w", {32, 16, 3, 3}), g.weight("b", {32})},
              {{"pads", ints({1, 1, 1, 1})}, {"group", ir::Attribute{int64_t{2}}}}, "conv"));
          return g.take();
        },
    .baseRoute = "",  // the defaults: oneDNN convolutions in an NHWC graph
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").layout, "nhwc") << base.summary();
          EXPECT_TRUE(base.layer("conv").tactic.starts_with("onednn.")) << base.summary();
          EXPECT_EQ(base.layer("conv").tactic.find(".via_"), std::string::npos);
          EXPECT_TRUE(changed.layer("conv").tactic.ends_with(".via_nChw16c")) << changed.summary();
          EXPECT_EQ(changed.layer("conv").layout, "nhwc");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.onednn.postops",
    .value = "off",
    .shows = "a FusedConv's bias, residual and Relu run in kiln's epilogue after the bare oneDNN "
             "primitive instead of inside it",
    .graph =
        [] {
          GraphSketch g;
          auto c = g.node(
              "Conv",
              {g.input("x", {1, 16, 8, 8}), g.weight("w", {16, 16, 3, 3}), g.weight("b", {16})},
              {{"pads", ints({1, 1, 1, 1})}}, "conv");
          auto sum = g.node("Add", {c, g.input("skip", {1, 16, 8, 8})}, {}, "add");
          g.output(g.node("Relu", {sum}, {}, "relu"));
          return g.take();
        },
    .baseRoute = kNchw,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").op, "kiln.FusedConv") << base.summary();
          EXPECT_TRUE(base.layer("conv").tactic.starts_with("onednn.")) << base.summary();
          EXPECT_FALSE(base.layer("conv").tactic.ends_with("+epilogue")) << base.summary();
          EXPECT_TRUE(changed.layer("conv").tactic.ends_with("+epilogue")) << changed.summary();
        },
});

}  // namespace
}  // namespace kiln::testing

#endif  // KILN_HAVE_ONEDNN
