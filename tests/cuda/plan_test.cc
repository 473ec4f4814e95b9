// The CUDA plan itself: lowering without a device (memory planning, aliases, the host fallback and
// its knob) and, where a GPU is present, running, CUDA graph replay and event timing.
#include <gtest/gtest.h>

#include "../knobs/graph_sketch.h"
#include "cuda_test_util.h"
#include "kiln/backends/cuda/plan.h"

namespace kiln::testing {
namespace {

// x -> Reshape -> Exp -> Reshape -> Neg: two reshapes (aliases when allowed) around two unary
// steps whose outputs may be written in place.
ir::Graph reshapeChain() {
  GraphSketch g;
  auto x = g.input("x", {4, 64});
  auto shape = g.constant("shape", ir::Tensor::fromVector<int64_t>(ir::Shape{2}, {16, 16}));
  auto back = g.constant("back", ir::Tensor::fromVector<int64_t>(ir::Shape{2}, {4, 64}));
  auto r1 = g.node("Reshape", {x, shape}, {}, "r1");
  auto e = g.node("Exp", {r1}, {}, "exp");
  auto r2 = g.node("Reshape", {e, back}, {}, "r2");
  g.output(g.node("Neg", {r2}, {}, "neg"));
  return g.take();
}

Result<CudaBuild> build(ir::Graph graph, const std::string& route) {
  BuilderConfig config;
  KILN_RETURN_IF_ERROR(config.setBuildRoute(route));
  return buildCuda(std::move(graph), config);
}

std::vector<std::string> opsOf(const cuda::Plan& plan) {
  std::vector<std::string> ops;
  for (const auto& step : plan.steps()) ops.push_back(step->node->opType);
  return ops;
}

TEST(CudaPlan, ReshapesAliasTheirInputUnlessTheKnobIsOff) {
  auto aliased = build(reshapeChain(), "-fusion.eltwise_chain=off");
  ASSERT_TRUE(aliased.isOk()) << aliased.status().toString();
  EXPECT_EQ(opsOf(aliased->plan), (std::vector<std::string>{"Exp", "Neg"}));
  auto copied =
      build(reshapeChain(), "-fusion.eltwise_chain=off -cuda.memory.alias_reshapes=off");
  ASSERT_TRUE(copied.isOk()) << copied.status().toString();
  EXPECT_EQ(opsOf(copied->plan), (std::vector<std::string>{"Reshape", "Exp", "Reshape", "Neg"}));
}

TEST(CudaPlan, NaiveMemoryPlanGivesEveryValueItsOwnRange) {
  const std::string noInPlace =
      "-fusion.eltwise_chain=off -cuda.memory.in_place=off -cuda.memory.alias_reshapes=off";
  auto reuse = build(reshapeChain(), noInPlace);
  auto naive = build(reshapeChain(), noInPlace + " -cuda.memory.planner=naive");
  ASSERT_TRUE(reuse.isOk() && naive.isOk());
  // Five values of 1 KiB (256-byte aligned): naive keeps all five, reuse needs two at a time.
  EXPECT_EQ(naive->plan.arenaBytes(), 5 * 1024);
  EXPECT_EQ(reuse->plan.arenaBytes(), 2 * 1024);
}

// Einsum has a reference kernel and (so far) no GPU kernel: it runs on the host unless the
// fallback is off. (When Einsum gets a GPU kernel, pick another such op here.)
ir::Graph einsumGraph() {
  GraphSketch g;
  auto a = g.input("a", {3, 5});
  auto b = g.input("b", {5, 2});
  g.output(g.node("Einsum", {a, b}, {{"equation", ir::Attribute{std::string("ij,jk->ik")}}},
                  "product"));
  return g.take();
}

TEST(CudaPlan, AnOpWithNoGpuKernelRunsOnTheHostUnlessTheFallbackIsOff) {
  auto fallback = build(einsumGraph(), "");
  ASSERT_TRUE(fallback.isOk()) << fallback.status().toString();
  ASSERT_EQ(fallback->plan.steps().size(), 1u);
  EXPECT_EQ(fallback->plan.steps()[0]->tactic, "host.reference");
  auto strict = build(einsumGraph(), "-cuda.host_fallback=off");
  ASSERT_FALSE(strict.isOk());
  EXPECT_EQ(strict.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(strict.status().message().find("no kernel for 'Einsum' (and cuda.host_fallback is off)"),
            std::string::npos)
      << strict.status().message();
}

TEST(CudaPlan, HostFallbackRunsAndGivesUpCudaGraphs) {
  auto built = build(einsumGraph(), "");
  ASSERT_TRUE(built.isOk()) << built.status().toString();
  if (!cuda::deviceAvailable()) GTEST_SKIP() << cuda::currentDevice().status().message();
  const ir::Tensor a = uniformTensor({3, 5}, 1, -1, 1), b = uniformTensor({5, 2}, 2, -1, 1);
  auto outputs = built->plan.run({a, b});
  ASSERT_TRUE(outputs.isOk()) << outputs.status().toString();
  auto expected = runSingleOp("Einsum", {{a, false}, {b, false}},
                              {{"equation", ir::Attribute{std::string("ij,jk->ik")}}}, 18);
  ASSERT_TRUE(expected.isOk());
  for (int64_t i = 0; i < 6; ++i) {
    EXPECT_FLOAT_EQ((*outputs)[0].elementAsDouble(i), (*expected)[0].elementAsDouble(i));
  }
  EXPECT_FALSE(built->plan.usesGraph());
  EXPECT_NE(built->plan.graphNote().find("host fallback"), std::string::npos);
}

}  // namespace
}  // namespace kiln::testing
