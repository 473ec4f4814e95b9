// Effects of the attention knobs: fusion.attention (the fuse_attention pass),
// fusion.attention_heads (the attention_heads pass) and cpu.attention.impl (the CPU kernel of
// kiln.Attention).
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

// GPT-2's attention: one packed QKV projection [1, 6, 3 * 2 * 4] split into Q, K and V, each
// reshaped to [1, 6, 2, 4] and transposed to heads-first (K to [1, 2, 4, 6]), and the output
// transposed back and merged to [1, 6, 8].
ir::Graph packedHeadsAttention() {
  GraphSketch g;
  auto x = g.input("x", {1, 6, 24});
  auto parts = g.nodeOutputs(
      "Split", {x, g.constant("sizes", ir::Tensor::fromVector<int64_t>(ir::Shape{3}, {8, 8, 8}))},
      {{"axis", ir::Attribute{int64_t{2}}}}, "split", 3);
  auto heads = g.constant("heads", ir::Tensor::fromVector<int64_t>(ir::Shape{4}, {1, 6, 2, 4}));
  auto q = g.node("Transpose", {g.node("Reshape", {parts[0], heads}, {}, "q_split")},
                  {{"perm", ints({0, 2, 1, 3})}}, "q_heads");
  auto kt = g.node("Transpose", {g.node("Reshape", {parts[1], heads}, {}, "k_split")},
                   {{"perm", ints({0, 2, 3, 1})}}, "k_heads");
  auto v = g.node("Transpose", {g.node("Reshape", {parts[2], heads}, {}, "v_split")},
                  {{"perm", ints({0, 2, 1, 3})}}, "v_heads");
  auto scores = g.node("MatMul", {q, kt}, {}, "qk");
  auto scaled =
      g.node("Mul", {scores, g.constant("scale", ir::Tensor::scalar<float>(0.5f))}, {}, "scale");
  auto p = g.node("Softmax", {scaled}, {{"axis", ir::Attribute{int64_t{-1}}}}, "softmax");
  auto y = g.node("Transpose", {g.node("MatMul", {p, v}, {}, "pv")}, {{"perm", ints({0, 2, 1, 3})}},
                  "y_heads");
  g.output(
      g.node("Reshape",
             {y, g.constant("merged", ir::Tensor::fromVector<int64_t>(ir::Shape{3}, {1, 6, 8}))},
             {}, "y_merge"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "fusion.attention_heads",
    .value = "off",
    .shows = "the Split and the four Transposes around the Attention layer stay, instead of the "
             "layer reading its heads from the packed projection in place",
    .graph = packedHeadsAttention,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("qk").op, "kiln.Attention");
          EXPECT_FALSE(base.hasOp("Transpose")) << base.summary();
          EXPECT_FALSE(base.hasOp("Split")) << base.summary();
          EXPECT_EQ(changed.layer("qk").op, "kiln.Attention");
          EXPECT_EQ(changed.layer("q_heads").op, "Transpose");
          EXPECT_EQ(changed.layer("y_heads").op, "Transpose");
          EXPECT_EQ(changed.layer("split").op, "Split");
          // The heads-first copies of Q, K, V and the output are gone from the arena.
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
