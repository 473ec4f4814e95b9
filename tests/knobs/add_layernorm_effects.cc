// Effect of fusion.add_layernorm (the fuse_add_layernorm pass): a pre-LN transformer's residual
// stream, where each sum is normalised and also read by the next residual Add.
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// x1 = x + a; y = LayerNorm(x1); x2 = x1 + y * 2 (the next sublayer's residual, reading x1).
ir::Graph residualStream() {
  GraphSketch g(17);
  auto x = g.input("x", {6, 32});
  auto a = g.input("a", {6, 32});
  auto sum = g.node("Add", {x, a}, {}, "residual");
  auto y = g.node("LayerNormalization", {sum, g.weight("gamma", {32}), g.weight("beta", {32})},
                  {{"axis", ir::Attribute{int64_t{-1}}}}, "ln");
  auto doubled = g.node("Mul", {y, g.constant("two", ir::Tensor::scalar<float>(2.0f))}, {}, "mlp");
  g.output(g.node("Add", {sum, doubled}, {}, "next_residual"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "fusion.add_layernorm",
    .value = "off",
    .shows = "the residual Add stays a layer of its own before the LayerNormalization, instead of "
             "one AddLayerNormalization layer that also writes the sum the next Add reads",
    .graph = residualStream,
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("ln").op, "kiln.AddLayerNormalization") << base.summary();
          EXPECT_EQ(base.layer("ln").tactic, "fast.layernorm_rows");
          EXPECT_EQ(base.layers.size(), 3u) << base.summary();  // ln, mlp, next_residual
          EXPECT_EQ(changed.layer("residual").op, "Add");
          EXPECT_EQ(changed.layer("ln").op, "LayerNormalization");
          EXPECT_EQ(changed.layers.size(), 4u) << changed.summary();
        },
});

}  // namespace
}  // namespace kiln::testing
