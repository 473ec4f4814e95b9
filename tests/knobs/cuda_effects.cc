// Effects of the CUDA backend's plan-level knobs: CUDA graphs, memory planning, aliases, in-place
// kernels and the host fallback. Lowering needs no GPU, so the differences in the plans show
// anywhere; outputs are compared where a GPU is present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// x -> Relu -> Exp -> Neg -> Sigmoid, 4 KiB a value.
ir::Graph unaryChain() {
  GraphSketch g;
  auto a = g.node("Relu", {g.input("x", {1024})}, {}, "a");
  auto b = g.node("Exp", {a}, {}, "b");
  auto c = g.node("Neg", {b}, {}, "c");
  g.output(g.node("Sigmoid", {c}, {}, "d"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.graphs",
    .value = "off",
    .shows = "runs launch each kernel from the host instead of replaying a captured CUDA graph",
    .backend = "cuda",
    .graph = unaryChain,
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.execution, "graph");
          EXPECT_EQ(changed.execution, "steps");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.memory.planner",
    .value = "naive",
    .shows = "every value gets its own arena range: five 4 KiB values take 20 KiB, not 8",
    .backend = "cuda",
    .graph = unaryChain,
    .baseRoute = "-cuda.memory.in_place=off -fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.arenaBytes, 2 * 4096);
          EXPECT_EQ(changed.arenaBytes, 5 * 4096);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.memory.in_place",
    .value = "off",
    .shows = "elementwise kernels write fresh buffers instead of over their input: x, Exp(x), "
             "Neg(.) and Add(., x) need three 4 KiB buffers at once instead of two",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {1024});
          auto b = g.node("Neg", {g.node("Exp", {x}, {}, "a")}, {}, "b");
          g.output(g.node("Add", {b, x}, {}, "c"));
          return g.take();
        },
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          // The graph input is never written over (timing loops upload it once).
          EXPECT_EQ(base.arenaBytes, 2 * 4096);
          EXPECT_EQ(changed.arenaBytes, 3 * 4096);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.memory.alias_reshapes",
    .value = "off",
    .shows = "a Reshape becomes a copy kernel instead of a second name for its input's buffer",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto shape = g.constant("shape", ir::Tensor::fromVector<int64_t>(ir::Shape{2}, {8, 8}));
          auto r = g.node("Reshape", {g.node("Exp", {g.input("x", {64})}, {}, "exp"), shape}, {},
                          "reshape");
          g.output(g.node("Neg", {r}, {}, "neg"));
          return g.take();
        },
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_FALSE(base.hasOp("Reshape"));
          EXPECT_TRUE(changed.hasOp("Reshape"));
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.host_fallback",
    .value = "off",
    .shows = "an op with no GPU kernel fails the build instead of running on the host",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto a = g.input("a", {3, 5});
          auto b = g.input("b", {5, 2});
          g.output(g.node("Einsum", {a, b},
                          {{"equation", ir::Attribute{std::string("ij,jk->ik")}}}, "product"));
          return g.take();
        },
    .expectBuildError = "no kernel for 'Einsum' (and cuda.host_fallback is off)",
});

}  // namespace
}  // namespace kiln::testing
#endif
