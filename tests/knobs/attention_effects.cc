// Effects of the attention knobs: fusion.attention (the fuse_attention pass) and
// cpu.attention.impl (the CPU kernel of kiln.Attention).
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// Two heads of attention as torch exports it: K^T from a Transpose of K, a sqrt scale on Q and on
// K^T, a [1, 1, 1, Skv] mask Add, Softmax over the keys, then the product with V.
ir::Graph torchAttention() {
  GraphSketch g;
  auto q = g.input("q", {1, 2, 9, 8});
  auto k = g.input("k", {1, 2, 11, 8});
  auto v = g.input("v", {1, 2, 11, 4});
  auto kt = g.node("Transpose", {k}, {{"perm", ints({0, 1, 3, 2})}}, "k_t");
  auto rootScale = g.constant("root_scale", ir::Tensor::scalar<float>(0.59460354f));
  auto qs = g.node("Mul", {q, rootScale}, {}, "q_scale");
  auto ks = g.node("Mul", {kt, rootScale}, {}, "k_scale");
  auto scores = g.node("MatMul", {qs, ks}, {}, "qk");
  auto masked = g.node("Add", {scores, g.weight("mask", {1, 1, 1, 11}, 2.0f)}, {}, "mask");
  auto p = g.node("Softmax", {masked}, {{"axis", ir::Attribute{int64_t{-1}}}}, "softmax");
  g.output(g.node("MatMul", {p, v}, {}, "pv"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "fusion.attention",
    .value = "off",
    .shows = "the MatMul / scale / mask / Softmax / MatMul chain stays unfused instead of one "
             "Attention layer",
    .graph = torchAttention,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layers.size(), 1u) << base.summary();
          EXPECT_EQ(base.layer("qk").op, "kiln.Attention");
          EXPECT_EQ(base.layer("qk").tactic, "fast.attention");
          EXPECT_FALSE(changed.hasOp("kiln.Attention")) << changed.summary();
          EXPECT_EQ(changed.layer("qk").op, "MatMul");
          EXPECT_EQ(changed.layer("softmax").op, "Softmax");
          EXPECT_EQ(changed.layer("pv").op, "MatMul");
          // The fused kernel keeps only one block of scores per thread; the unfused chain holds
          // the whole [2, 9, 11] score tensor in the arena.
          EXPECT_LT(base.arenaBytes, changed.arenaBytes);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.attention.impl",
    .value = "reference",
    .shows = "the Attention layer runs the reference kernel instead of fast.attention",
    .graph = torchAttention,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("qk").op, "kiln.Attention");
          EXPECT_EQ(base.layer("qk").tactic, "fast.attention");
          EXPECT_EQ(changed.layer("qk").op, "kiln.Attention");
          EXPECT_EQ(changed.layer("qk").tactic, "reference");
        },
});

}  // namespace
}  // namespace kiln::testing
