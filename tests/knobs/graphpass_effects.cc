// Effects of the graph-transformation knobs added with the clean-up and folding passes
// (eliminate_noops, reassociate_constants, eliminate_common_subexpressions,
// fold_transpose_into_gemm, fold_pad_into_conv, fold_affine_into_conv): each, off, leaves the nodes
// its pass removes as layers of their own.
#include <gtest/gtest.h>

#include "../unit/cpu_route_util.h"
#include "graph_sketch.h"
#include "kiln/ir/shape_inference.h"
#include "kiln/passes/passes.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

ir::Tensor int64s(std::vector<int64_t> values) {
  const auto count = static_cast<int64_t>(values.size());
  return ir::Tensor::fromVector<int64_t>(ir::Shape{count}, values);
}

KILN_KNOB_EFFECT({
    .knob = "graph.eliminate_noops",
    .value = "off",
    .shows = "a Cast of a float to float and a Mul by one stay layers before the Relu",
    .graph =
        [] {
          GraphSketch g;
          auto cast =
              g.node("Cast", {g.input("x", {4, 8})}, {{"to", ir::Attribute{int64_t{1}}}}, "cast");
          auto one = g.constant("one", ir::Tensor::fromVector<float>(ir::Shape{}, {1.0f}));
          auto mul = g.node("Mul", {cast, one}, {}, "mul");
          g.output(g.node("Relu", {mul}, {}, "relu"));
          return g.take();
        },
    // Elementwise chains would otherwise become one FusedElementwise either way.
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layers.size(), 1u) << base.summary();
          EXPECT_EQ(base.layer("relu").op, "Relu");
          EXPECT_EQ(changed.layer("cast").op, "Cast");
          EXPECT_EQ(changed.layer("mul").op, "Mul");
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.eliminate_common_subexpressions",
    .value = "off",
    .shows = "two equal Transposes of one input stay two layers instead of one",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {2, 16, 8});
          auto a = g.node("Transpose", {x}, {{"perm", ints({0, 2, 1})}}, "t1");
          auto b = g.node("Transpose", {x}, {{"perm", ints({0, 2, 1})}}, "t2");
          g.output(g.node("Mul", {a, b}, {}, "mul"));
          return g.take();
        },
    // Elementwise chains would otherwise become one FusedElementwise either way.
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          ASSERT_EQ(base.layersOf("Transpose").size(), 1u) << base.summary();
          EXPECT_EQ(base.layersOf("Transpose")[0]->name, "t1");
          EXPECT_EQ(changed.layersOf("Transpose").size(), 2u) << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.fold_transpose_into_gemm",
    .value = "off",
    .shows = "q x Transpose(k) stays a Transpose layer and a MatMul instead of one Gemm(transB)",
    .graph =
        [] {
          GraphSketch g;
          auto kt = g.node("Transpose", {g.input("k", {24, 16})}, {{"perm", ints({1, 0})}}, "t");
          g.output(g.node("MatMul", {g.input("q", {8, 16}), kt}, {}, "mm"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layers.size(), 1u) << base.summary();
          EXPECT_EQ(base.layer("mm").op, "Gemm");
          EXPECT_NE(base.ir.find("transB=1"), std::string::npos) << base.ir;
          EXPECT_EQ(changed.layer("t").op, "Transpose");
          EXPECT_EQ(changed.layer("mm").op, "MatMul");
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.fold_pad_into_conv",
    .value = "off",
    .shows = "a zero Pad before a Conv stays a layer instead of becoming the Conv's pads",
    .graph =
        [] {
          GraphSketch g;
          auto pads = g.constant("pads", int64s({0, 0, 1, 1, 0, 0, 1, 1}));
          auto padded = g.node("Pad", {g.input("x", {1, 4, 8, 8}), pads}, {}, "pad");
          g.output(g.node("Conv", {padded, g.weight("w", {6, 4, 3, 3}), g.weight("b", {6})}, {},
                          "conv"));
          return g.take();
        },
    .baseRoute = kiln::testing::kNativeNchwRoute,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layers.size(), 1u) << base.summary();
          EXPECT_NE(base.ir.find("pads=[1,1,1,1]"), std::string::npos) << base.ir;
          EXPECT_EQ(changed.layer("pad").op, "Pad");
          EXPECT_EQ(changed.layers.size(), 2u) << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.fold_affine_into_conv",
    .value = "off",
    .shows = "a per-channel Mul and Add after a Conv stay layers instead of folding into its "
             "weight and bias",
    .graph =
        [] {
          GraphSketch g;
          auto conv = g.node("Conv", {g.input("x", {1, 4, 8, 8}), g.weight("w", {6, 4, 3, 3})},
                             {{"pads", ints({1, 1, 1, 1})}}, "conv");
          auto scaled =
              g.node("Mul", {conv, g.weight("scale", {1, 6, 1, 1}, 0.5f, 1.0f)}, {}, "scale");
          g.output(g.node("Add", {scaled, g.weight("shift", {6, 1, 1})}, {}, "shift"));
          return g.take();
        },
    // Elementwise chains would otherwise become one FusedElementwise either way.
    .baseRoute = kiln::testing::nativeNchwRoute("-fusion.eltwise_chain=off"),
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layers.size(), 1u) << base.summary();
          EXPECT_FALSE(base.hasOp("Mul"));
          EXPECT_EQ(changed.layer("scale").op, "Mul");
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.reassociate_constants",
    .value = "off",
    .shows = "x * c1 * c2 stays two Mul layers instead of one Mul by c1 * c2",
    .graph =
        [] {
          GraphSketch g;
          auto a = g.node("Mul", {g.input("x", {4, 8}), g.weight("c1", {8})}, {}, "m1");
          g.output(g.node("Mul", {a, g.weight("c2", {1, 8})}, {}, "m2"));
          return g.take();
        },
    // Elementwise chains would otherwise become one FusedElementwise either way.
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          ASSERT_EQ(base.layers.size(), 1u) << base.summary();
          EXPECT_EQ(base.layer("m1").op, "Mul");
          EXPECT_EQ(changed.layersOf("Mul").size(), 2u) << changed.summary();
        },
});

// Not a knob effect: two draws of a random op are two values, whatever their attributes. The
// importer does not read random ops yet, so the graph is built directly and the pass run on it.
TEST(EliminateCommonSubexpressions, NeverMergesRandomOps) {
  GraphSketch g;
  auto x = g.input("x", {4, 8});
  const std::map<std::string, ir::Attribute> seeded = {{"seed", ir::Attribute{1.0f}}};
  auto a = g.node("RandomNormalLike", {x}, seeded, "r1");
  auto b = g.node("RandomNormalLike", {x}, seeded, "r2");
  g.output(a);
  g.output(b);
  auto c = g.node("RandomUniformLike", {x}, {}, "u1");
  auto d = g.node("RandomUniformLike", {x}, {}, "u2");
  g.output(g.node("Sub", {c, d}, {}, "sub"));
  ir::Graph graph = g.take();
  const knobs::Route route;
  std::vector<std::string> changes;
  passes::PassContext context{route, changes};
  ASSERT_TRUE(passes::eliminateCommonSubexpressions(graph, context).isOk());
  EXPECT_TRUE(changes.empty()) << changes.front();
  EXPECT_EQ(graph.nodes().size(), 5u);
}

// Not a knob effect: x / 0 is inf or nan, which no folded weight reproduces, so the Div stays.
// (Golden tests cannot hold this case: their output comparison takes inf - inf for a difference.)
TEST(FoldAffineIntoConv, LeavesDivisionByZero) {
  GraphSketch g;
  auto conv = g.node("Conv", {g.input("x", {1, 2, 3, 3}), g.weight("w", {2, 2, 1, 1})}, {}, "conv");
  auto divisor = g.constant("divisor", ir::Tensor::fromVector<float>(ir::Shape{2, 1, 1}, {2, 0}));
  g.output(g.node("Div", {conv, divisor}, {}, "div"));
  ir::Graph graph = g.take();
  ASSERT_TRUE(ir::inferShapes(graph, nullptr).isOk());
  const knobs::Route route;
  std::vector<std::string> changes;
  passes::PassContext context{route, changes};
  ASSERT_TRUE(passes::foldAffineIntoConv(graph, context).isOk());
  EXPECT_TRUE(changes.empty()) << changes.front();
  EXPECT_EQ(graph.nodes().size(), 2u);
}

}  // namespace
}  // namespace kiln::testing
