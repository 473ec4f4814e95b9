// The CPU backend's threading and work-split knobs: a pool with pinned workers binds each worker
// (never the caller) to one allowed CPU and still runs every index once; and results stay those
// of the reference kernels under every cpu.eltwise.grain (unary, binary, row mean, fused),
// cpu.transpose.tile and cpu.attention.block_rows value, on 1 to 3 threads, with and without
// cpu.threads.affinity.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../knobs/graph_sketch.h"
#include "kiln/backends/cpu/thread_pool.h"
#include "kiln/engine/builder.h"
#include "kiln/ir/op_schema.h"
#include "op_test_util.h"

namespace kiln::testing {
namespace {

std::set<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::set<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.insert(cpu);
  }
  return cpus;
}

// The CPUs the calling thread may run on.
std::set<int> threadCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(set), &set), 0);
  std::set<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.insert(cpu);
  }
  return cpus;
}

TEST(ThreadPoolAffinity, WorkersAreBoundToDistinctAllowedCpusAndTheCallerIsNot) {
  const std::set<int> allowed = allowedCpus();
  const std::vector<int> ordered(allowed.begin(), allowed.end());
  const std::set<int> callerBefore = threadCpus();
  for (int threads : {2, 3, 5}) {
    SCOPED_TRACE(std::to_string(threads) + " threads");
    cpu::ThreadPool pool(threads, 50, /*pinWorkers=*/true);
    ASSERT_EQ(pool.workerCpus().size(), static_cast<size_t>(threads - 1));
    for (size_t i = 0; i < pool.workerCpus().size(); ++i) {
      EXPECT_EQ(pool.workerCpus()[i], ordered[(i + 1) % ordered.size()]) << "worker " << i;
    }
    // Every index once, and each chunk a worker ran on exactly its CPU.
    const std::thread::id caller = std::this_thread::get_id();
    std::mutex mutex;
    std::vector<std::set<int>> workerMasks;
    std::vector<int> hits(1000, 0);
    for (int call = 0; call < 200; ++call) {
      pool.parallelFor(1000, 1, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) ++hits[static_cast<size_t>(i)];
        if (std::this_thread::get_id() != caller) {
          const std::set<int> mask = threadCpus();
          std::lock_guard lock(mutex);
          workerMasks.push_back(mask);
        }
      });
    }
    for (int h : hits) ASSERT_EQ(h, 200);
    for (const std::set<int>& mask : workerMasks) {
      ASSERT_EQ(mask.size(), 1u);
      EXPECT_TRUE(allowed.count(*mask.begin()));
    }
    EXPECT_EQ(threadCpus(), callerBefore);
  }
  cpu::ThreadPool unpinned(3, 0);
  EXPECT_TRUE(unpinned.workerCpus().empty());
}

std::vector<ir::Tensor> randomInputs(const ir::Graph& graph, unsigned seed) {
  std::vector<ir::Tensor> inputs;
  for (const ir::Value* input : graph.inputs) {
    inputs.push_back(uniformTensor(input->shape, seed++, -2.0f, 2.0f));
  }
  return inputs;
}

struct Built {
  std::vector<std::string> tactics;
  std::vector<ir::Tensor> outputs;
  int64_t arenaBytes = 0;
};

Built buildAndRun(const std::string& route, ir::Graph graph,
                  const std::vector<ir::Tensor>& inputs) {
  BuilderConfig config;
  const Status routed = config.setBuildRoute(route);
  EXPECT_TRUE(routed.isOk()) << routed.toString();
  auto build = buildCpu(std::move(graph), config);
  EXPECT_TRUE(build.isOk()) << build.status().toString();
  if (!build.isOk()) return {};
  Built result;
  for (const auto& step : build->plan.steps()) result.tactics.push_back(step->tactic);
  result.arenaBytes = build->plan.arenaBytes();
  auto outputs = build->plan.run(inputs);
  EXPECT_TRUE(outputs.isOk()) << outputs.status().toString();
  if (outputs.isOk()) result.outputs = std::move(*outputs);
  return result;
}

void expectClose(const std::vector<ir::Tensor>& actual, const std::vector<ir::Tensor>& expected,
                 double tolerance) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t o = 0; o < expected.size(); ++o) {
    ASSERT_EQ(actual[o].shape(), expected[o].shape());
    for (int64_t i = 0; i < expected[o].elementCount(); ++i) {
      const double e = expected[o].elementAsDouble(i), a = actual[o].elementAsDouble(i);
      ASSERT_NEAR(a, e, tolerance * std::max(1.0, std::fabs(e)))
          << "output " << o << " element " << i;
    }
  }
}

// Builds `make()` with `referenceRoute` and with `route` plus each of `values` of `knob` on 1 to
// 3 threads (3 with pinned workers too), checks every step's tactic contains `tactic` and the
// outputs match the reference's.
template <typename MakeGraph>
void checkAgainstReference(MakeGraph make, const std::string& route,
                           const std::string& referenceRoute, const std::string& knob,
                           const std::vector<std::string>& values, const std::string& tactic,
                           double tolerance = 1e-5) {
  const std::vector<ir::Tensor> inputs = randomInputs(make(), 7);
  const Built reference = buildAndRun(referenceRoute, make(), inputs);
  for (const std::string& value : values) {
    for (const std::string threads : {"1", "2", "3", "3 -cpu.threads.affinity=on"}) {
      const std::string full = route + " -" + knob + "=" + value + " -cpu.threads=" + threads;
      SCOPED_TRACE(full);
      const Built built = buildAndRun(full, make(), inputs);
      ASSERT_FALSE(built.tactics.empty());
      for (const std::string& t : built.tactics) {
        EXPECT_NE(t.find(tactic), std::string::npos) << t;
      }
      expectClose(built.outputs, reference.outputs, tolerance);
    }
  }
}

TEST(CpuEltwiseGrain, UnfusedKernelsMatchTheReferenceAtEveryGrain) {
  // 3 x 100003 elements: chunks of every grain but the largest split it, unevenly.
  auto make = [] {
    GraphSketch g;
    auto x = g.input("x", {3, 100003});
    auto e = g.node("Exp", {g.node("Relu", {x}, {}, "relu")}, {}, "exp");
    auto a = g.node("Add", {e, g.input("y", {1, 100003})}, {}, "add");
    auto p = g.node("Pow", {g.node("Abs", {a}, {}, "abs"), g.weight("power", {1}, 0.2f, 1.5f)}, {},
                    "pow");
    auto axes = g.constant("axes", ir::Tensor::fromVector<int64_t>(ir::Shape{1}, {-1}));
    g.output(g.node("ReduceMean", {p, axes}, {}, "mean"));
    return g.take();
  };
  checkAgainstReference(make, "-fusion.eltwise_chain=off",
                        "-fusion.eltwise_chain=off -cpu.eltwise.impl=reference",
                        "cpu.eltwise.grain", {"16384", "65536", "262144", "1048576"}, "fast.");
}

TEST(CpuEltwiseGrain, IsPerNodeAndKeepsStepsInPlace) {
  auto make = [] {
    GraphSketch g;
    auto r = g.node("Relu", {g.input("x", {4096})}, {}, "relu");
    g.output(g.node("Neg", {r}, {}, "neg"));
    return g.take();
  };
  const std::vector<ir::Tensor> inputs = randomInputs(make(), 3);
  const std::string route = "-fusion.eltwise_chain=off -cpu.threads=2";
  const Built base = buildAndRun(route, make(), inputs);
  const Built changed = buildAndRun(route + " -cpu.eltwise.grain@relu=65536", make(), inputs);
  EXPECT_EQ(base.tactics, (std::vector<std::string>{"fast.unary", "fast.unary"}));
  EXPECT_EQ(changed.tactics, (std::vector<std::string>{"fast.unary.g65536", "fast.unary"}));
  expectClose(changed.outputs, base.outputs, 0.0);
  // The suffixed tactic still writes over its input (cpu.memory.in_place).
  const Built copying = buildAndRun(route + " -cpu.memory.in_place=off", make(), inputs);
  EXPECT_LT(base.arenaBytes, copying.arenaBytes);
  EXPECT_EQ(changed.arenaBytes, base.arenaBytes);
}

TEST(CpuEltwiseGrain, FusedKernelMatchesTheReferenceAtEveryGrain) {
  auto make = [] {
    GraphSketch g;
    auto x = g.input("x", {5, 70001});
    auto r = g.node("Relu", {x}, {}, "relu");
    auto m = g.node("Mul", {r, g.input("s", {1, 70001})}, {}, "mul");
    g.output(g.node("Tanh", {g.node("Add", {m, g.weight("b", {70001})}, {}, "add")}, {}, "tanh"));
    return g.take();
  };
  checkAgainstReference(make, "", "-cpu.eltwise.impl=reference", "cpu.eltwise.grain",
                        {"16384", "65536", "262144", "1048576"}, "fast.fused_eltwise");
}

TEST(CpuTransposeTile, MatchesTheReferenceAtEveryTile) {
  // Sides that are not multiples of any tile, and two outer axes.
  auto make = [] {
    GraphSketch g;
    g.output(
        g.node("Transpose", {g.input("x", {2, 3, 131, 77})}, {{"perm", ints({1, 0, 3, 2})}}, "t"));
    return g.take();
  };
  checkAgainstReference(make, "", "-cpu.transpose.impl=reference", "cpu.transpose.tile",
                        {"16", "32", "64"}, "fast.transpose_tiled");
}

TEST(CpuAttentionBlockRows, MatchesTheReferenceAtEveryBlockSize) {
  // 150 queries: blocks of 15, 30, 50, 75 or 150 rows a head.
  auto make = [] {
    GraphSketch g;
    auto q = g.input("q", {2, 2, 150, 16});
    auto k = g.input("k", {2, 2, 16, 37});
    auto v = g.input("v", {2, 2, 37, 8});
    g.output(
        g.node("Attention", {q, k, v}, {{"scale", ir::Attribute{0.25f}}}, "attn", ir::kKilnDomain));
    return g.take();
  };
  checkAgainstReference(make, "", "-cpu.attention.impl=reference", "cpu.attention.block_rows",
                        {"auto", "16", "32", "64", "128", "256"}, "fast.attention", 2e-5);
}

}  // namespace
}  // namespace kiln::testing
