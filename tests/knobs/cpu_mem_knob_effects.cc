// Effects of the CPU backend's memory-layout and normalisation knobs: cpu.memory.alignment (the
// byte alignment of each value's range in the arena) and cpu.layernorm.variance (one- or two-pass
// row variance, shown in the tactic).
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "kiln/ir/op_schema.h"
#include "knob_effects.h"
#include "planner_graphs.h"

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

KILN_KNOB_EFFECT({
    .knob = "cpu.memory.order",
    .value = "time",
    .shows = "placing values in the order they are defined instead of largest first changes the "
             "arena of a Pad -> Slice chain",
    .graph = [] { return padThenSlice(16); },
    .baseRoute = "-cpu.memory.in_place=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_NE(base.arenaBytes, changed.arenaBytes) << base.summary() << changed.summary();
          EXPECT_EQ(base.arenaBytes, 448) << base.summary();
          EXPECT_EQ(changed.arenaBytes, 512) << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.memory.fit",
    .value = "best",
    .shows = "placing each value in the smallest gap that holds it instead of the lowest one "
             "gives this graph a larger arena (best fit is not always better)",
    .graph = [] { return fitChooser(16); },
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
