// The CUDA plan itself: lowering without a device (memory planning, aliases, the host fallback and
// its knob) and, where a GPU is present, running, CUDA graph replay and event timing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "../knobs/graph_sketch.h"
#include "cuda_test_util.h"
#include "kiln/backends/cuda/plan.h"
#include "kiln/base/file.h"

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

// Two identical convolutions and two identical matrix products (same shapes, other weights): with
// their choices timed, each pair times once and the second takes the first's choice.
ir::Graph twinLayersWithProducts() {
  GraphSketch g;
  auto x = g.input("x", {2, 8, 16, 16});
  const CudaAttributes pads = {{"pads", ir::Attribute{std::vector<int64_t>{1, 1, 1, 1}}}};
  auto w1 = g.constant("w1", uniformTensor({8, 8, 3, 3}, 11, -0.3f, 0.3f));
  auto w2 = g.constant("w2", uniformTensor({8, 8, 3, 3}, 12, -0.3f, 0.3f));
  auto c1 = g.node("Conv", {x, w1}, pads, "conv1");
  auto c2 = g.node("Conv", {g.node("Relu", {c1}, {}, "relu1"), w2}, pads, "conv2");
  auto flat = g.constant("flat", ir::Tensor::fromVector<int64_t>(ir::Shape{2}, {256, 16}));
  auto rows = g.node("Reshape", {g.node("Relu", {c2}, {}, "relu2"), flat}, {}, "rows");
  auto p1 = g.constant("p1", uniformTensor({16, 64}, 13, -0.5f, 0.5f));
  auto p2 = g.constant("p2", uniformTensor({16, 64}, 14, -0.5f, 0.5f));
  g.output(g.node("MatMul", {rows, p1}, {}, "mm1"));
  g.output(g.node("MatMul", {rows, p2}, {}, "mm2"));
  return g.take();
}

struct TimedBuild {
  std::vector<ir::Tensor> outputs;
  int hits = 0;
  int misses = 0;
};

Result<TimedBuild> timedBuild(const std::string& route, const std::filesystem::path& cache) {
  BuilderConfig config;
  KILN_RETURN_IF_ERROR(
      config.setBuildRoute("-cuda.conv.algo=timed -cuda.gemm.algo=timed " + route));
  config.timingCacheFile = cache;
  KILN_ASSIGN_OR_RETURN(CudaBuild built, buildCuda(twinLayersWithProducts(), config));
  KILN_RETURN_IF_ERROR(built.plan.initialize());
  TimedBuild result;
  KILN_ASSIGN_OR_RETURN(result.outputs, built.plan.run({uniformTensor({2, 8, 16, 16}, 15, -1, 1)}));
  result.hits = built.plan.timingCacheHits();
  result.misses = built.plan.timingCacheMisses();
  return result;
}

void expectSameBits(const std::vector<ir::Tensor>& a, const std::vector<ir::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t o = 0; o < a.size(); ++o) {
    ASSERT_EQ(a[o].byteSize(), b[o].byteSize());
    EXPECT_EQ(std::memcmp(a[o].rawData(), b[o].rawData(), a[o].byteSize()), 0) << "output " << o;
  }
}

TEST(CudaPlan, TimingCacheTimesIdenticalLayersOnceAndLaterBuildsNotAtAll) {
  if (!cuda::deviceAvailable()) GTEST_SKIP() << cuda::currentDevice().status().message();
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / fmt::format("kiln_cuda_timing_{}", ::getpid());
  std::filesystem::remove_all(dir);
  const std::filesystem::path path = dir / "timing.cache";

  auto first = timedBuild("", path);
  ASSERT_TRUE(first.isOk()) << first.status().toString();
  // Each of the four layers had candidates to time; each pair timed once.
  EXPECT_EQ(first->misses, 2);
  EXPECT_EQ(first->hits, 2);
  ASSERT_TRUE(std::filesystem::exists(path));
  const std::string saved = readFileBytes(path).value();
  const nlohmann::json file = nlohmann::json::parse(saved);
  ASSERT_EQ(file.at("devices").size(), 1u);
  const std::string device = file.at("devices").begin().key();
  EXPECT_NE(device.find(cuda::currentDevice()->name), std::string::npos) << device;
  EXPECT_EQ(file.at("devices").at(device).size(), 2u) << saved;

  // A later build finds every choice; the same choices give the same bits.
  auto second = timedBuild("", path);
  ASSERT_TRUE(second.isOk()) << second.status().toString();
  EXPECT_EQ(second->misses, 0);
  EXPECT_EQ(second->hits, 4);
  expectSameBits(first->outputs, second->outputs);

  // cuda.timing_cache=off times every layer and leaves the file alone.
  auto off = timedBuild("-cuda.timing_cache=off", path);
  ASSERT_TRUE(off.isOk()) << off.status().toString();
  EXPECT_EQ(off->hits, 0);
  EXPECT_EQ(off->misses, 4);
  EXPECT_EQ(readFileBytes(path).value(), saved);

  // Records that no longer match what the libraries offer are timed again and replaced.
  nlohmann::json stale = file;
  for (auto& [key, record] : stale["devices"][device].items()) {
    if (record.contains("algo")) record["algo"] = "00";
    if (record.contains("engine")) record["engine"] = -5;
  }
  const std::filesystem::path stalePath = dir / "stale.cache";
  ASSERT_TRUE(writeFileAtomically(stalePath, stale.dump()).isOk());
  auto retimed = timedBuild("", stalePath);
  ASSERT_TRUE(retimed.isOk()) << retimed.status().toString();
  EXPECT_EQ(retimed->hits, 2);  // the twins of the two layers timed again
  EXPECT_EQ(retimed->misses, 2);
  const nlohmann::json replaced = nlohmann::json::parse(readFileBytes(stalePath).value());
  for (const auto& [key, record] : replaced.at("devices").at(device).items()) {
    EXPECT_NE(record.value("algo", std::string("x")), "00") << key;
    EXPECT_NE(record.value("engine", int64_t{0}), -5) << key;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln::testing
