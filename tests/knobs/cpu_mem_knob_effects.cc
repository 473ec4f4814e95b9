// Effects of the CPU backend's memory-layout and normalisation knobs: cpu.memory.alignment (the
// byte alignment of each value's range in the arena) and cpu.layernorm.variance (one- or two-pass
// row variance, shown in the tactic).
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "kiln/ir/op_schema.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// x -> Relu -> Exp -> Neg -> Sigmoid on 100 floats (400 bytes): without in-place steps the
// reuse planner alternates two ranges along the chain.
ir::Graph smallUnaryChain() {
  GraphSketch g;
  auto a = g.node("Relu", {g.input("x", {100})}, {}, "a");
  auto b = g.node("Exp", {a}, {}, "b");
  auto c = g.node("Neg", {b}, {}, "c");
  g.output(g.node("Sigmoid", {c}, {}, "d"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cpu.memory.alignment",
    .value = "4096",
    .shows = "the two 400-byte ranges of a chain take a 4 KiB page each instead of 448 bytes each",
    .graph = smallUnaryChain,
    .baseRoute = "-cpu.memory.in_place=off -fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.arenaBytes, 2 * 448) << base.summary();
          EXPECT_EQ(changed.arenaBytes, 2 * 4096) << changed.summary();
        },
});

// x [16] -> Pad to [64] -> Slice to [48]: values of 64, 256 and 192 bytes; x lives with the
// padded value, the padded value with the slice. Largest first: the padded value at 0, then the
// slice and x both at 256 (they never live together): 448 bytes. In order of definition: x at
// 0, the padded value at 64, and the slice finds no gap below it, so goes at 320: 512 bytes.
ir::Graph padThenSlice() {
  GraphSketch g;
  auto pads = g.constant("pads", ir::Tensor::fromVector<int64_t>(ir::Shape{2}, {16, 32}));
  auto padded = g.node("Pad", {g.input("x", {16}), pads}, {}, "pad");
  auto starts = g.constant("starts", ir::Tensor::fromVector<int64_t>(ir::Shape{1}, {8}));
  auto ends = g.constant("ends", ir::Tensor::fromVector<int64_t>(ir::Shape{1}, {56}));
  g.output(g.node("Slice", {padded, starts, ends}, {}, "slice"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cpu.memory.order",
    .value = "time",
    .shows = "placing values in the order they are defined instead of largest first changes the "
             "arena of a Pad -> Slice chain",
    .graph = padThenSlice,
    .baseRoute = "-cpu.memory.in_place=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_NE(base.arenaBytes, changed.arenaBytes) << base.summary() << changed.summary();
          EXPECT_EQ(base.arenaBytes, 448) << base.summary();
          EXPECT_EQ(changed.arenaBytes, 512) << changed.summary();
        },
});

// x [32] -> Pad to [48] (an output) -> Neg; Neg(x); Concat of the two Negs [80] (an output) ->
// Neg (an output): six values of 2, 3, 3, 2, 5 and 5 units of 64 bytes, found by a search over
// small graphs for one where the fits differ. Largest first, first fit packs them in 13 units
// (832 bytes); best fit puts the 3-unit Neg in a tighter gap that later forces a 5-unit value
// past the end: 15 units (960 bytes).
ir::Graph fitChooser() {
  GraphSketch g;
  auto x = g.input("x", {32});
  auto pads = g.constant("pads", ir::Tensor::fromVector<int64_t>(ir::Shape{2}, {0, 16}));
  auto padded = g.node("Pad", {x, pads}, {}, "pad");
  auto n1 = g.node("Neg", {padded}, {}, "n1");
  auto n2 = g.node("Neg", {x}, {}, "n2");
  auto cat = g.node("Concat", {n2, n1}, {{"axis", ir::Attribute{int64_t{0}}}}, "cat");
  g.output(padded);
  g.output(cat);
  g.output(g.node("Neg", {cat}, {}, "n3"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cpu.memory.fit",
    .value = "best",
    .shows = "placing each value in the smallest gap that holds it instead of the lowest one "
             "gives this graph a larger arena (best fit is not always better)",
    .graph = fitChooser,
    .baseRoute = "-cpu.memory.in_place=off -fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.arenaBytes, 13 * 64) << base.summary();
          EXPECT_EQ(changed.arenaBytes, 15 * 64) << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.layernorm.variance",
    .value = "one_pass",
    .shows = "the fast LayerNormalization kernel takes each row's variance from one read (sum "
             "and sum of squares) instead of two",
    .graph =
        [] {
          GraphSketch g;
          g.output(g.node("LayerNormalization",
                          {g.input("x", {4, 48}), g.weight("scale", {48}), g.weight("bias", {48})},
                          {{"axis", ir::Attribute{int64_t{-1}}}}, "ln"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("ln").tactic, "fast.layernorm_rows") << base.summary();
          EXPECT_EQ(changed.layer("ln").tactic, "fast.layernorm_rows.one_pass")
              << changed.summary();
        },
});

}  // namespace
}  // namespace kiln::testing
