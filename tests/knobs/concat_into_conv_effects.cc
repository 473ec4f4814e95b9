// Effect of fusion.concat_into_conv (the dissolve_channel_concat pass): a SqueezeNet fire module's
// end, the 1x1 and 3x3 expand branches concatenated along the channels, pooled, and read by the
// next module's 1x1 squeeze convolution; and SqueezeNet's classifier, a 1x1 convolution with more
// output channels than the Concat it reads has, which only `always` splits.
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

ir::Graph fireEnd() {
  GraphSketch g;
  auto s = g.input("s", {1, 8, 9, 9});
  auto e1 = g.node("Conv", {s, g.weight("e1w", {16, 8, 1, 1}, 0.3f)}, {}, "expand1x1");
  auto e3 = g.node("Conv", {s, g.weight("e3w", {16, 8, 3, 3}, 0.1f)},
                   {{"pads", ints({1, 1, 1, 1})}}, "expand3x3");
  auto r1 = g.node("Relu", {e1}, {}, "relu1");
  auto r3 = g.node("Relu", {e3}, {}, "relu3");
  auto cat = g.node("Concat", {r1, r3}, {{"axis", ir::Attribute{int64_t{1}}}}, "cat");
  auto pool =
      g.node("MaxPool", {cat}, {{"kernel_shape", ints({3, 3})}, {"strides", ints({2, 2})}}, "pool");
  auto squeeze =
      g.node("Conv", {pool, g.weight("sw", {8, 32, 1, 1}, 0.2f), g.weight("sb", {8}, 0.1f)}, {},
             "squeeze");
  g.output(g.node("Relu", {squeeze}, {}, "relu_s"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "fusion.concat_into_conv",
    .value = "off",
    .shows = "the expand branches are copied into one tensor by a Concat layer and pooled once, "
             "instead of each branch pooled and read by its own part of the squeeze convolution",
    .graph = fireEnd,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_FALSE(base.hasOp("Concat")) << base.summary();
          EXPECT_EQ(base.layersOf("kiln.NhwcMaxPool").size(), 2u) << base.summary();
          EXPECT_EQ(base.layer("squeeze_part0").op, "kiln.NhwcConv") << base.summary();
          EXPECT_EQ(base.layer("squeeze_part1").op, "kiln.NhwcConv") << base.summary();
          EXPECT_EQ(changed.layer("cat").op, "Concat") << changed.summary();
          EXPECT_EQ(changed.layersOf("kiln.NhwcMaxPool").size(), 1u) << changed.summary();
          EXPECT_EQ(changed.layer("squeeze").op, "kiln.NhwcConv") << changed.summary();
        },
});

ir::Graph classifierEnd() {
  GraphSketch g;
  auto a = g.input("a", {1, 16, 5, 5});
  auto b = g.input("b", {1, 16, 5, 5});
  auto cat = g.node("Concat", {a, b}, {{"axis", ir::Attribute{int64_t{1}}}}, "cat");
  auto classifier = g.node("Conv", {cat, g.weight("cw", {40, 32, 1, 1}, 0.2f)}, {}, "classifier");
  g.output(g.node("Relu", {classifier}, {}, "relu"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "fusion.concat_into_conv",
    .value = "always",
    .shows = "a 1x1 convolution writing 40 channels over a Concat of 16 + 16 splits in two parts "
             "(the second part reads and writes 40 channels again to save copying 32), where the "
             "default `cheaper` keeps the Concat",
    .graph = classifierEnd,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("cat").op, "Concat") << base.summary();
          EXPECT_EQ(base.layer("classifier").op, "kiln.NhwcConv") << base.summary();
          EXPECT_FALSE(changed.hasOp("Concat")) << changed.summary();
          EXPECT_EQ(changed.layer("classifier_part0").op, "kiln.NhwcConv") << changed.summary();
          EXPECT_EQ(changed.layer("classifier_part1").op, "kiln.NhwcConv") << changed.summary();
        },
});

}  // namespace
}  // namespace kiln::testing
