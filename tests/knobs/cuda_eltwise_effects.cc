// Effects of the CUDA backend's elementwise and reduction knobs: the vector width of the flat
// elementwise kernels and the row reduction's block size. Both change launches, not tactics, so
// the cases read the layers' launch details (BuildSnapshot::Layer::detail).
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {

namespace {

ir::Tensor axes(std::vector<int64_t> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return ir::Tensor::fromVector<int64_t>(ir::Shape{n}, values);
}

KILN_KNOB_EFFECT({
    .knob = "cuda.eltwise.vector_width",
    .value = "1",
    .shows = "a Sigmoid, two Casts and a bias Add move one element per thread instead of four "
             "as one aligned load and store",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {4, 1030});
          auto s = g.node("Sigmoid", {x}, {}, "sigmoid");
          auto c = g.node("Cast", {s}, {{"to", ir::Attribute{int64_t{11}}}}, "cast");  // double
          auto back = g.node("Cast", {c}, {{"to", ir::Attribute{int64_t{1}}}}, "back");
          g.output(g.node("Add", {back, g.weight("bias", {1})}, {}, "add"));
          return g.take();
        },
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          for (const char* layer : {"sigmoid", "cast", "back", "add"}) {
            EXPECT_EQ(base.layer(layer).detail, "flat, vector width 4") << base.summary();
            EXPECT_EQ(changed.layer(layer).detail, "flat, vector width 1") << changed.summary();
          }
          EXPECT_EQ(base.layer("sigmoid").tactic, "kiln.unary");
          EXPECT_EQ(base.layer("add").tactic, "kiln.binary");
        },
});

// A long-row ReduceMean (a block per row) and a short-row ReduceSum (a warp per row).
ir::Graph rowReductions() {
  GraphSketch g;
  auto x = g.input("x", {6, 3000});
  g.output(g.node("ReduceMean", {x, g.constant("last", axes({-1}))}, {}, "mean"));
  auto z = g.input("z", {300, 50});
  g.output(g.node("ReduceSum", {z, g.constant("inner", axes({1}))}, {}, "sum"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.reduce.block",
    .value = "128",
    .shows = "row reductions launch 128-thread blocks instead of 256: a 128-thread block per "
             "long row, four warps' rows per block for short ones",
    .backend = "cuda",
    .graph = rowReductions,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mean").detail, "rows, a 256-thread block per output");
          EXPECT_EQ(changed.layer("mean").detail, "rows, a 128-thread block per output");
          EXPECT_EQ(base.layer("sum").detail, "rows, a warp per output, 256-thread blocks");
          EXPECT_EQ(changed.layer("sum").detail, "rows, a warp per output, 128-thread blocks");
          EXPECT_EQ(changed.layer("mean").tactic, "kiln.reduce");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.reduce.block",
    .value = "512",
    .shows = "row reductions launch 512-thread blocks instead of 256",
    .backend = "cuda",
    .graph = rowReductions,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mean").detail, "rows, a 256-thread block per output");
          EXPECT_EQ(changed.layer("mean").detail, "rows, a 512-thread block per output");
          EXPECT_EQ(changed.layer("sum").detail, "rows, a warp per output, 512-thread blocks");
        },
});

}  // namespace
}  // namespace kiln::testing
#endif
