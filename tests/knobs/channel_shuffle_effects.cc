// Effect of fusion.channel_shuffle (the fuse_channel_shuffle pass): a ShuffleNet v2 unit's end,
// two branches concatenated, shuffled in two groups and split for the next unit.
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

ir::Graph shuffleUnit() {
  GraphSketch g;
  auto a = g.input("a", {1, 8, 5, 5});
  auto b = g.input("b", {1, 8, 5, 5});
  auto cat = g.node("Concat", {a, b}, {{"axis", ir::Attribute{int64_t{1}}}}, "cat");
  auto r = g.node(
      "Reshape",
      {cat, g.constant("s5", ir::Tensor::fromVector<int64_t>(ir::Shape{5}, {1, 2, 8, 5, 5}))}, {},
      "view");
  auto t = g.node("Transpose", {r}, {{"perm", ints({0, 2, 1, 3, 4})}}, "shuffle");
  auto y =
      g.node("Reshape",
             {t, g.constant("s4", ir::Tensor::fromVector<int64_t>(ir::Shape{4}, {1, 16, 5, 5}))},
             {}, "view_back");
  g.output(g.node("Relu", {y}, {}, "relu"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "fusion.channel_shuffle",
    .value = "off",
    .shows = "the Concat, the Transpose between two Reshapes and the rest run as layers of their "
             "own, each copying the data, instead of one ChannelShuffle layer",
    .graph = shuffleUnit,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("shuffle").op, "kiln.ChannelShuffle") << base.summary();
          EXPECT_EQ(base.layer("shuffle").tactic, "fast.channel_shuffle");
          EXPECT_FALSE(base.hasOp("Concat")) << base.summary();
          EXPECT_EQ(changed.layer("cat").op, "Concat") << changed.summary();
          EXPECT_EQ(changed.layer("shuffle").op, "Transpose");
        },
});

}  // namespace
}  // namespace kiln::testing
