// Effects of the CUDA attention knob (kernels/attention_steps.cc): kiln.Attention as the unfused
// products around a softmax, or as the fused flash kernel. Lowering names the kernel in the
// step's tactic, so the difference shows without a GPU; outputs are compared where one is present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "kiln/ir/op_schema.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// One kiln.Attention over [1, 2, 40, 64] heads with K [1, 2, 70, 64] (transpose_k) and a
// per-key mask, made float16 by the base route.
ir::Graph attentionHeads() {
  GraphSketch g;
  g.output(g.node("Attention",
                  {g.input("q", {1, 2, 40, 64}), g.input("k", {1, 2, 70, 64}),
                   g.input("v", {1, 2, 70, 64}), g.weight("mask", {1, 1, 1, 70}, 2.0f)},
                  {{"scale", ir::Attribute{0.125f}}, {"transpose_k", ir::Attribute{int64_t{1}}}},
                  "attn", ir::kKilnDomain));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.attention.kernel",
    .value = "unfused",
    .shows = "a float16 kiln.Attention over 70 keys, fused by default, runs as two cuBLASLt "
             "products around a softmax over float32 scores instead",
    .backend = "cuda",
    .graph = attentionHeads,
    .baseRoute = "-cuda.precision=fp16 -cuda.host_fallback=off",
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("attn").tactic, "kiln.attention.flash");
          EXPECT_EQ(changed.layer("attn").tactic, "kiln.attention.unfused");
        },
});

}  // namespace
}  // namespace kiln::testing
#endif  // KILN_HAVE_CUDA
