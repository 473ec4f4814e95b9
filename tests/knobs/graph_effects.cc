// Effects of the graph.* knobs: each pass's knob, off, leaves the pattern it rewrites in place.
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

ir::Tensor scalar(float v) { return ir::Tensor::fromVector<float>(ir::Shape{}, {v}); }

KILN_KNOB_EFFECT({
    .knob = "graph.eliminate_identity",
    .value = "off",
    .shows = "the Identity between two Relus stays in the graph",
    .graph =
        [] {
          GraphSketch g;
          auto a = g.node("Relu", {g.input("x", {4, 8})}, {}, "a");
          auto i = g.node("Identity", {a}, {}, "id");
          g.output(g.node("Relu", {i}, {}, "b"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          // Kept in the graph, the Identity then lowers to a second name for its input's buffer
          // (cpu.memory.alias_reshapes), so only the IR shows it.
          EXPECT_EQ(base.ir.find("Identity"), std::string::npos) << base.ir;
          EXPECT_NE(changed.ir.find("Identity \"id\""), std::string::npos) << changed.ir;
        },
});

// x * (c1 + c2): the Add of two initializers larger than shape inference folds by itself.
ir::Graph constantSubgraph() {
  GraphSketch g;
  auto sum = g.node("Add", {g.weight("c1", {300, 300}), g.weight("c2", {300, 300})}, {}, "sum");
  g.output(g.node("Mul", {g.input("x", {300, 300}), sum}, {}, "mul"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "graph.fold_constants",
    .value = "off",
    .shows = "an Add of two 90 000-element initializers runs at inference instead of at build",
    .graph = constantSubgraph,
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layersOf("Add").size(), 0u);
          EXPECT_EQ(changed.layer("sum").op, "Add");
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.fold_constants.max_mib",
    .value = "0",
    .shows = "with a 0 MiB cap the 352 KiB constant Add is not folded",
    .graph = constantSubgraph,
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_FALSE(base.hasOp("Add"));
          EXPECT_EQ(changed.layer("sum").op, "Add");
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.eliminate_dead_nodes",
    .value = "off",
    .shows = "an Exp whose output nothing reads stays a layer",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {16});
          g.node("Exp", {x}, {}, "dead");
          g.output(g.node("Relu", {x}, {}, "used"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_FALSE(base.hasOp("Exp"));
          EXPECT_EQ(changed.layer("dead").op, "Exp");
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.simplify_transpose_reshape",
    .value = "off",
    .shows = "two Transposes that cancel stay two layers",
    .graph =
        [] {
          GraphSketch g;
          auto t1 =
              g.node("Transpose", {g.input("x", {2, 3, 4})}, {{"perm", ints({0, 2, 1})}}, "t1");
          auto t2 = g.node("Transpose", {t1}, {{"perm", ints({0, 2, 1})}}, "t2");
          g.output(g.node("Relu", {t2}, {}, "relu"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_FALSE(base.hasOp("Transpose"));
          EXPECT_EQ(changed.layersOf("Transpose").size(), 2u);
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.concat_slices_to_gather",
    .value = "off",
    .shows = "torch.roll as exported (two Slices and a Concat) stays three layers, not one Gather",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {1, 8, 8, 4});
          auto int64s = [&](const std::string& name, std::vector<int64_t> values) {
            const auto count = static_cast<int64_t>(values.size());
            return g.constant(name, ir::Tensor::fromVector<int64_t>(ir::Shape{count}, values));
          };
          auto shift = int64s("shift", {3});
          auto axis = int64s("axis", {1});
          auto tail = g.node("Slice", {x, shift, int64s("end", {8}), axis}, {}, "tail");
          auto head = g.node("Slice", {x, int64s("zero", {0}), shift, axis}, {}, "head");
          g.output(g.node("Concat", {tail, head}, {{"axis", ir::Attribute{int64_t{1}}}}, "roll"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layers.size(), 1u) << base.summary();
          EXPECT_EQ(base.layer("roll").op, "Gather");
          EXPECT_EQ(changed.layer("roll").op, "Concat");
          EXPECT_EQ(changed.layersOf("Slice").size(), 2u) << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.compose_row_moves",
    .value = "off",
    .shows = "Swin's shifted window partition (a Gather, Reshape, Transpose, Reshape) stays two "
             "copies instead of one Gather of rows",
    .graph =
        [] {
          GraphSketch g;
          auto int64s = [&](const std::string& name, std::vector<int64_t> values) {
            const auto count = static_cast<int64_t>(values.size());
            return g.constant(name, ir::Tensor::fromVector<int64_t>(ir::Shape{count}, values));
          };
          // [1,4,4,8]: roll the rows by one, then 2x2 windows.
          auto x = g.input("x", {1, 4, 4, 8});
          auto rolled = g.node("Gather", {x, int64s("shift", {1, 2, 3, 0})},
                               {{"axis", ir::Attribute{int64_t{1}}}}, "roll");
          auto view = g.node("Reshape", {rolled, int64s("s6", {1, 2, 2, 2, 2, 8})}, {}, "view");
          auto permuted =
              g.node("Transpose", {view}, {{"perm", ints({0, 1, 3, 2, 4, 5})}}, "permute");
          auto windows = g.node("Reshape", {permuted, int64s("s3", {4, 4, 8})}, {}, "windows");
          g.output(g.node("Relu", {windows}, {}, "relu"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layersOf("Gather").size(), 1u) << base.summary();
          EXPECT_FALSE(base.hasOp("Transpose")) << base.summary();
          EXPECT_EQ(changed.layer("roll").op, "Gather") << changed.summary();
          EXPECT_EQ(changed.layer("permute").op, "Transpose") << changed.summary();
          ASSERT_EQ(base.outputs.size(), 1u);
          ASSERT_EQ(changed.outputs.size(), 1u);
          // A copy is a copy: the same bits either way.
          ASSERT_EQ(base.outputs[0].elementCount(), changed.outputs[0].elementCount());
          for (int64_t i = 0; i < base.outputs[0].elementCount(); ++i) {
            ASSERT_EQ(base.outputs[0].elementAsDouble(i), changed.outputs[0].elementAsDouble(i));
          }
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.compose_row_moves.concats",
    .value = "off",
    .shows = "Swin's patch merging (six Slices and a Concat along the channels) stays seven "
             "layers instead of one Gather of rows",
    .graph =
        [] {
          GraphSketch g;
          auto int64s = [&](const std::string& name, std::vector<int64_t> values) {
            const auto count = static_cast<int64_t>(values.size());
            return g.constant(name, ir::Tensor::fromVector<int64_t>(ir::Shape{count}, values));
          };
          // x[:, i::2, j::2, :] for (i, j) = (0, 0), (1, 0), (0, 1), (1, 1), then Concat.
          auto x = g.input("x", {1, 4, 6, 3});
          auto end = int64s("end", {100});
          auto two = int64s("two", {2});
          auto rows = [&](const std::string& from, int64_t first, int64_t axis,
                          const std::string& name) {
            return g.node(
                "Slice",
                {from, int64s(name + "_start", {first}), end, int64s(name + "_axis", {axis}), two},
                {}, name);
          };
          auto even = rows(x, 0, 1, "even"), odd = rows(x, 1, 1, "odd");
          auto merged = g.node("Concat",
                               {rows(even, 0, 2, "x0"), rows(odd, 0, 2, "x1"),
                                rows(even, 1, 2, "x2"), rows(odd, 1, 2, "x3")},
                               {{"axis", ir::Attribute{int64_t{-1}}}}, "merge");
          g.output(g.node("Relu", {merged}, {}, "relu"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layersOf("Gather").size(), 1u) << base.summary();
          EXPECT_FALSE(base.hasOp("Slice")) << base.summary();
          EXPECT_FALSE(base.hasOp("Concat")) << base.summary();
          EXPECT_EQ(changed.layersOf("Slice").size(), 6u) << changed.summary();
          EXPECT_EQ(changed.layer("merge").op, "Concat") << changed.summary();
          ASSERT_EQ(base.outputs.size(), 1u);
          ASSERT_EQ(changed.outputs.size(), 1u);
          ASSERT_EQ(base.outputs[0].elementCount(), changed.outputs[0].elementCount());
          for (int64_t i = 0; i < base.outputs[0].elementCount(); ++i) {
            ASSERT_EQ(base.outputs[0].elementAsDouble(i), changed.outputs[0].elementAsDouble(i));
          }
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.recognize_layernorm",
    .value = "off",
    .shows = "the exporter's nine-node layer norm stays nine layers",
    .graph =
        [] {
          GraphSketch g(17);  // ReduceMean's axes as an attribute
          auto x = g.input("x", {4, 32});
          const std::map<std::string, ir::Attribute> last = {{"axes", ints({-1})}};
          auto mean = g.node("ReduceMean", {x}, last, "mean");
          auto centred = g.node("Sub", {x, mean}, {}, "centred");
          auto square = g.node("Pow", {centred, g.constant("two", scalar(2.0f))}, {}, "square");
          auto variance = g.node("ReduceMean", {square}, last, "variance");
          auto shifted = g.node("Add", {variance, g.constant("eps", scalar(1e-5f))}, {}, "eps_add");
          auto deviation = g.node("Sqrt", {shifted}, {}, "sqrt");
          auto normed = g.node("Div", {centred, deviation}, {}, "div");
          auto scaled = g.node("Mul", {normed, g.weight("gamma", {32})}, {}, "gamma_mul");
          g.output(g.node("Add", {scaled, g.weight("beta", {32})}, {}, "beta_add"));
          return g.take();
        },
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layers.size(), 1u) << base.summary();
          EXPECT_EQ(base.layers[0].op, "LayerNormalization");
          EXPECT_FALSE(changed.hasOp("LayerNormalization"));
          EXPECT_EQ(changed.layersOf("ReduceMean").size(), 2u);
        },
});

KILN_KNOB_EFFECT({
    .knob = "graph.recognize_gelu",
    .value = "off",
    .shows = "x * 0.5 * (1 + erf(x / sqrt 2)) stays five layers instead of one Gelu",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {4, 32});
          auto scaled = g.node("Div", {x, g.constant("sqrt2", scalar(1.41421356f))}, {}, "div");
          auto erf = g.node("Erf", {scaled}, {}, "erf");
          auto shifted = g.node("Add", {erf, g.constant("one", scalar(1.0f))}, {}, "add");
          auto product = g.node("Mul", {x, shifted}, {}, "mul");
          g.output(g.node("Mul", {product, g.constant("half", scalar(0.5f))}, {}, "half_mul"));
          return g.take();
        },
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_TRUE(base.hasOp("Gelu")) << base.summary();
          EXPECT_FALSE(changed.hasOp("Gelu"));
          EXPECT_EQ(changed.layer("erf").op, "Erf");
        },
});

}  // namespace
}  // namespace kiln::testing
