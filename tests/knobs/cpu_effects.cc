// Effects of the CPU backend's knobs: tactic choices, threads and memory planning.
#include <gtest/gtest.h>

#include <thread>

#include "../unit/cpu_route_util.h"
#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

KILN_KNOB_EFFECT({
    .knob = "cpu.threads",
    .value = "3",
    .shows = "the plan runs on 3 threads instead of one per core",
    .graph =
        [] {
          GraphSketch g;
          g.output(g.node("Relu", {g.input("x", {64})}, {}, "relu"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.threads,
                    static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
          EXPECT_EQ(changed.threads, 3);
        },
    .skipReason =
        [] {
          return std::thread::hardware_concurrency() == 3
                     ? std::string("this machine has 3 cores: 3 threads is the default here")
                     : std::string();
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.threads.spin_us",
    .value = "500",
    .shows = "the plan's 2 threads spin for 500 us waiting for work before they sleep, and the "
             "outputs stay the same",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {64, 256});
          g.output(g.node("Softmax", {g.node("Relu", {x}, {}, "relu")}, {}, "softmax"));
          return g.take();
        },
    .baseRoute = "-cpu.threads=2",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_NE(base.spinMicros, 500);
          EXPECT_EQ(changed.spinMicros, 500);
          EXPECT_EQ(changed.threads, 2);
        },
});

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
    .knob = "cpu.memory.planner",
    .value = "naive",
    .shows = "without in-place steps, a chain of five 4 KiB values takes 5 ranges instead of 2",
    .graph = unaryChain,
    .baseRoute = "-cpu.memory.in_place=off -fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          // Reuse alternates two ranges along the chain (a value's range is free once the step
          // after its reader starts).
          EXPECT_EQ(base.arenaBytes, 2 * 4096) << base.summary();
          EXPECT_EQ(changed.arenaBytes, 5 * 4096) << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.memory.in_place",
    .value = "off",
    .shows = "each step of an elementwise chain writes a new range instead of over its input",
    .graph = unaryChain,
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.arenaBytes, 4096) << base.summary();
          EXPECT_EQ(changed.arenaBytes, 2 * 4096) << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.memory.alias_reshapes",
    .value = "off",
    .shows = "a Reshape becomes a copying layer instead of a second name for its input's buffer",
    .graph =
        [] {
          GraphSketch g;
          auto a = g.node("Relu", {g.input("x", {4, 6})}, {}, "relu");
          auto shape = g.constant("shape", ir::Tensor::fromVector<int64_t>(ir::Shape{2}, {6, 4}));
          auto r = g.node("Reshape", {a, shape}, {}, "reshape");
          g.output(g.node("Sigmoid", {r}, {}, "sigmoid"));
          return g.take();
        },
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_FALSE(base.hasOp("Reshape")) << base.summary();
          EXPECT_EQ(changed.layer("reshape").op, "Reshape");
          EXPECT_LT(base.arenaBytes, changed.arenaBytes);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.gemm.source",
    .value = "reference",
    .shows = "a MatMul runs on the reference kernel instead of OpenBLAS",
    .graph =
        [] {
          GraphSketch g;
          g.output(g.node("MatMul", {g.input("x", {8, 16}), g.input("y", {16, 4})}, {}, "mm"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mm").tactic, "native.sgemm.kc256");
          EXPECT_EQ(changed.layer("mm").tactic, "reference");
        },
});

ir::Graph denseConv() {
  GraphSketch g;
  g.output(g.node("Conv", {g.input("x", {1, 4, 10, 10}), g.weight("w", {8, 4, 3, 3})},
                  {{"pads", ints({1, 1, 1, 1})}}, "conv"));
  return g.take();
}

ir::Graph depthwiseConv() {
  GraphSketch g;
  g.output(g.node("Conv", {g.input("x", {1, 8, 10, 10}), g.weight("w", {8, 1, 3, 3})},
                  {{"pads", ints({1, 1, 1, 1})}, {"group", ir::Attribute{int64_t{8}}}}, "conv"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cpu.conv.algo",
    .value = "im2col",
    .shows = "a depthwise Conv runs as im2col+GEMM per group instead of the depthwise kernel",
    .graph = depthwiseConv,
    .baseRoute = kiln::testing::kNativeNchwRoute,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").tactic, "depthwise");
          EXPECT_TRUE(changed.layer("conv").tactic.starts_with("im2col"))
              << changed.layer("conv").tactic;
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.conv.algo",
    .value = "direct",
    .shows = "a dense 3x3 Conv runs as the direct loop instead of im2col+GEMM",
    .graph = denseConv,
    .baseRoute = kiln::testing::kNativeNchwRoute,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_TRUE(base.layer("conv").tactic.starts_with("im2col")) << base.layer("conv").tactic;
          EXPECT_EQ(changed.layer("conv").tactic, "direct");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.conv.algo",
    .value = "direct",
    .shows = "a 3x3 depthwise Conv runs as the generic direct loop instead of the depthwise kernel",
    .graph = depthwiseConv,
    .baseRoute = kiln::testing::kNativeNchwRoute,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").tactic, "depthwise");
          EXPECT_EQ(changed.layer("conv").tactic, "direct");
        },
});

// A depthwise Conv with a 1x1 output plane, which auto leaves to the direct loop (faster there
// than the depthwise kernel's per-plane copy).
ir::Graph tinyDepthwiseConv() {
  GraphSketch g;
  g.output(g.node("Conv", {g.input("x", {1, 8, 1, 1}), g.weight("w", {8, 1, 3, 3})},
                  {{"pads", ints({1, 1, 1, 1})}, {"group", ir::Attribute{int64_t{8}}}}, "conv"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cpu.conv.algo",
    .value = "depthwise",
    .shows = "a depthwise Conv on a 1x1 plane runs on the depthwise kernel instead of the direct "
             "loop auto keeps for it",
    .graph = tinyDepthwiseConv,
    .baseRoute = kiln::testing::kNativeNchwRoute,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").tactic, "direct");
          EXPECT_EQ(changed.layer("conv").tactic, "depthwise");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.conv.algo",
    .value = "reference",
    .shows = "a dense 3x3 Conv runs on the reference kernel",
    .graph = denseConv,
    .baseRoute = kiln::testing::kNativeNchwRoute,
    .expect =
        [](const BuildSnapshot&, const BuildSnapshot& changed) {
          EXPECT_EQ(changed.layer("conv").tactic, "reference");
        },
});

// The *.impl knobs: the family's float32 kernel, or the reference kernel.
struct ImplCase {
  const char* knob;
  const char* op;
  const char* tactic;  // the fast kernel's tactic name
  std::function<ir::Graph()> graph;
};

KnobEffect implEffect(const ImplCase& c) {
  return {
      .knob = c.knob,
      .value = "reference",
      .shows = std::string(c.op) + " runs on the reference kernel instead of " + c.tactic,
      .graph = c.graph,
      .baseRoute = kiln::testing::kNativeNchwRoute,
      .expect =
          [op = std::string(c.op), tactic = std::string(c.tactic)](const BuildSnapshot& base,
                                                                   const BuildSnapshot& changed) {
            ASSERT_EQ(base.layersOf(op).size(), 1u) << base.summary();
            EXPECT_EQ(base.layersOf(op)[0]->tactic, tactic);
            EXPECT_EQ(changed.layersOf(op)[0]->tactic, "reference");
          },
  };
}

ir::Graph oneNode(const std::string& op, ir::Shape shape,
                  std::map<std::string, ir::Attribute> attributes = {},
                  const std::vector<std::string>& extraWeights = {}) {
  GraphSketch g;
  std::vector<std::string> inputs = {g.input("x", shape)};
  for (const std::string& w : extraWeights) {
    inputs.push_back(g.weight(w, ir::Shape{shape[shape.rank() - 1]}));
  }
  g.output(g.node(op, inputs, std::move(attributes), "node"));
  return g.take();
}

const int kImplEffects[] = {
    registerKnobEffect(implEffect({"cpu.pool.impl", "MaxPool", "fast.window_pool",
                                   [] {
                                     return oneNode("MaxPool", {1, 3, 8, 8},
                                                    {{"kernel_shape", ints({2, 2})},
                                                     {"strides", ints({2, 2})}});
                                   }})),
    registerKnobEffect(implEffect({"cpu.softmax.impl", "Softmax", "fast.softmax_rows",
                                   [] {
                                     return oneNode("Softmax", {4, 33});
                                   }})),
    registerKnobEffect(
        implEffect({"cpu.layernorm.impl", "LayerNormalization", "fast.layernorm_rows",
                    [] {
                      return oneNode("LayerNormalization", {4, 16},
                                     {{"axis", ir::Attribute{int64_t{-1}}}}, {"scale", "bias"});
                    }})),
    registerKnobEffect(
        implEffect({"cpu.transpose.impl", "Transpose", "fast.transpose_tiled",
                    [] {
                      return oneNode("Transpose", {2, 3, 5}, {{"perm", ints({2, 0, 1})}});
                    }})),
    registerKnobEffect(implEffect(
        {"cpu.eltwise.impl", "Sigmoid", "fast.unary", [] { return oneNode("Sigmoid", {40}); }})),
};

}  // namespace
}  // namespace kiln::testing
