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
  auto copied = build(reshapeChain(), "-fusion.eltwise_chain=off -cuda.memory.alias_reshapes=off");
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

// LpPool has a reference kernel and (so far) no GPU kernel: it runs on the host unless the
// fallback is off. (When LpPool gets a GPU kernel, pick another such op here.)
const CudaAttributes kLpPoolAttributes = {
    {"kernel_shape", ir::Attribute{std::vector<int64_t>{2, 2}}}, {"p", ir::Attribute{int64_t{2}}}};

ir::Graph hostOnlyGraph() {
  GraphSketch g;
  auto x = g.input("x", {1, 2, 3, 3});
  g.output(g.node("LpPool", {x}, kLpPoolAttributes, "pool"));
  return g.take();
}

TEST(CudaPlan, AnOpWithNoGpuKernelRunsOnTheHostUnlessTheFallbackIsOff) {
  auto fallback = build(hostOnlyGraph(), "");
  ASSERT_TRUE(fallback.isOk()) << fallback.status().toString();
  ASSERT_EQ(fallback->plan.steps().size(), 1u);
  EXPECT_EQ(fallback->plan.steps()[0]->tactic, "host.reference");
  auto strict = build(hostOnlyGraph(), "-cuda.host_fallback=off");
  ASSERT_FALSE(strict.isOk());
  EXPECT_EQ(strict.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(
      strict.status().message().find("no kernel for 'LpPool' (and cuda.host_fallback is off)"),
      std::string::npos)
      << strict.status().message();
}

TEST(CudaPlan, HostFallbackRunsAndGivesUpCudaGraphs) {
  auto built = build(hostOnlyGraph(), "");
  ASSERT_TRUE(built.isOk()) << built.status().toString();
  if (!cuda::deviceAvailable()) GTEST_SKIP() << cuda::currentDevice().status().message();
  const ir::Tensor x = uniformTensor({1, 2, 3, 3}, 1, -1, 1);
  auto outputs = built->plan.run({x});
  ASSERT_TRUE(outputs.isOk()) << outputs.status().toString();
  auto expected = runSingleOp("LpPool", {{x, false}}, kLpPoolAttributes, 18);
  ASSERT_TRUE(expected.isOk());
  ASSERT_EQ((*expected)[0].elementCount(), 8);
  for (int64_t i = 0; i < 8; ++i) {
    EXPECT_FLOAT_EQ((*outputs)[0].elementAsDouble(i), (*expected)[0].elementAsDouble(i));
  }
  EXPECT_FALSE(built->plan.usesGraph());
  EXPECT_NE(built->plan.graphNote().find("host fallback"), std::string::npos);
}

}  // namespace
}  // namespace kiln::testing
