// Effects of the CPU backend's threading and work-split knobs: cpu.threads.affinity (pool workers
// bound to CPUs), cpu.eltwise.grain (elements per parallel chunk of the elementwise kernels),
// cpu.transpose.tile and cpu.attention.block_rows. Per-step choices show in the step's tactic.
#include <gtest/gtest.h>
#include <sched.h>

#include <string>
#include <vector>

#include "graph_sketch.h"
#include "kiln/ir/op_schema.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// The CPUs the pool's workers of a 3-thread plan are bound to: the 2nd and 3rd allowed CPUs,
// wrapping round.
std::string expectedWorkerCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return "";
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  if (cpus.empty()) return "";
  return std::to_string(cpus[1 % cpus.size()]) + "," + std::to_string(cpus[2 % cpus.size()]);
}

KILN_KNOB_EFFECT({
    .knob = "cpu.threads.affinity",
    .value = "on",
    .shows = "the plan's two pool workers are bound to the 2nd and 3rd allowed CPUs instead of "
             "running wherever the OS puts them",
    .graph =
        [] {
          GraphSketch g;
          g.output(g.node("Relu", {g.input("x", {4, 70000})}, {}, "relu"));
          return g.take();
        },
    .baseRoute = "-cpu.threads=3",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.workerCpus, "") << base.summary();
          EXPECT_EQ(changed.workerCpus, expectedWorkerCpus()) << changed.summary();
          EXPECT_EQ(changed.threads, 3);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.threads.chunks",
    .value = "any",
    .shows = "the plan's pool hands each parallel loop's chunks to whichever thread comes first, "
             "instead of chunk t to thread t (ThreadPool.OwnChunksGoToTheirThreads shows what "
             "that means)",
    .graph =
        [] {
          GraphSketch g;
          g.output(g.node("Relu", {g.input("x", {4, 70000})}, {}, "relu"));
          return g.take();
        },
    .baseRoute = "-cpu.threads=2",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.chunks, "own") << base.summary();
          EXPECT_EQ(changed.chunks, "any") << changed.summary();
          EXPECT_EQ(changed.threads, 2);
        },
});

// A unary, a broadcast binary and a last-axis mean of 2 x 40000 elements, unfused.
ir::Graph unfusedEltwise() {
  GraphSketch g;
  auto r = g.node("Relu", {g.input("x", {2, 40000})}, {}, "relu");
  auto a = g.node("Add", {r, g.weight("bias", {40000})}, {}, "add");
  auto axes = g.constant("axes", ir::Tensor::fromVector<int64_t>(ir::Shape{1}, {-1}));
  g.output(g.node("ReduceMean", {a, axes}, {}, "mean"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cpu.eltwise.grain",
    .value = "16384",
    .shows = "the unary, binary and row-mean kernels split into chunks of 16K elements instead "
             "of 256K (their tactics say so), with the same outputs",
    .graph = unfusedEltwise,
    .baseRoute = "-fusion.eltwise_chain=off -cpu.threads=2",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("relu").tactic, "fast.unary");
          EXPECT_EQ(changed.layer("relu").tactic, "fast.unary.g16384");
          EXPECT_EQ(changed.layer("add").tactic, "fast.binary_broadcast.g16384");
          EXPECT_EQ(changed.layer("mean").tactic, "fast.reduce_mean_rows.g16384");
          // The grain does not change which steps write in place.
          EXPECT_EQ(base.arenaBytes, changed.arenaBytes);
        },
});

// x -> Relu -> Mul -> Sigmoid, fused into one kiln.FusedElementwise of 3 x 50000 elements.
ir::Graph fusedEltwise() {
  GraphSketch g;
  auto r = g.node("Relu", {g.input("x", {3, 50000})}, {}, "relu");
  auto m = g.node("Mul", {r, g.weight("scale", {50000})}, {}, "mul");
  g.output(g.node("Sigmoid", {m}, {}, "sigmoid"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cpu.eltwise.grain",
    .value = "65536",
    .shows = "the fused elementwise kernel splits into chunks a quarter of the default size",
    .graph = fusedEltwise,
    .baseRoute = "-cpu.threads=2",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          ASSERT_EQ(base.layersOf("kiln.FusedElementwise").size(), 1u) << base.summary();
          EXPECT_EQ(base.layersOf("kiln.FusedElementwise")[0]->tactic, "fast.fused_eltwise");
          ASSERT_EQ(changed.layersOf("kiln.FusedElementwise").size(), 1u) << changed.summary();
          EXPECT_EQ(changed.layersOf("kiln.FusedElementwise")[0]->tactic,
                    "fast.fused_eltwise.g65536");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.eltwise.grain",
    .value = "1048576",
    .shows = "elementwise chunks of at least 1M elements: the 80K-element layers stay whole",
    .graph = unfusedEltwise,
    .baseRoute = "-fusion.eltwise_chain=off -cpu.threads=2",
    .expect =
        [](const BuildSnapshot&, const BuildSnapshot& changed) {
          EXPECT_EQ(changed.layer("relu").tactic, "fast.unary.g1048576");
          EXPECT_EQ(changed.layer("add").tactic, "fast.binary_broadcast.g1048576");
        },
});

// A [3, 70, 90] -> [3, 90, 70] Transpose: its last two axes go through the tiled copy.
ir::Graph transposeGraph() {
  GraphSketch g;
  g.output(g.node("Transpose", {g.input("x", {3, 70, 90})}, {{"perm", ints({0, 2, 1})}}, "t"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cpu.transpose.tile",
    .value = "16",
    .shows = "the Transpose copies 16x16 tiles instead of 32x32",
    .graph = transposeGraph,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("t").tactic, "fast.transpose_tiled");
          EXPECT_EQ(changed.layer("t").tactic, "fast.transpose_tiled.t16");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.transpose.tile",
    .value = "64",
    .shows = "the Transpose copies 64x64 tiles instead of 32x32",
    .graph = transposeGraph,
    .expect =
        [](const BuildSnapshot&, const BuildSnapshot& changed) {
          EXPECT_EQ(changed.layer("t").tactic, "fast.transpose_tiled.t64");
        },
});

// kiln.Attention over 2 heads of 150 queries and 40 keys (auto: one block of 128 rows at most,
// so two blocks of 75 rows a head).
ir::Graph attentionGraph() {
  GraphSketch g;
  auto q = g.input("q", {1, 2, 150, 8});
  auto k = g.input("k", {1, 2, 8, 40});
  auto v = g.input("v", {1, 2, 40, 4});
  g.output(
      g.node("Attention", {q, k, v}, {{"scale", ir::Attribute{0.35f}}}, "attn", ir::kKilnDomain));
  return g.take();
}

void expectAttentionTactic(const BuildSnapshot& base, const BuildSnapshot& changed,
                           const std::string& tactic) {
  EXPECT_EQ(base.layer("attn").tactic, "fast.attention") << base.summary();
  EXPECT_EQ(changed.layer("attn").tactic, tactic) << changed.summary();
}

KILN_KNOB_EFFECT({
    .knob = "cpu.attention.block_rows",
    .value = "16",
    .shows = "kiln.Attention takes blocks of at most 16 query rows (10 a head) instead of 75",
    .graph = attentionGraph,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          expectAttentionTactic(base, changed, "fast.attention.r16");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.attention.block_rows",
    .value = "32",
    .shows = "kiln.Attention takes blocks of at most 32 query rows (5 a head) instead of 75",
    .graph = attentionGraph,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          expectAttentionTactic(base, changed, "fast.attention.r32");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.attention.block_rows",
    .value = "64",
    .shows = "kiln.Attention takes blocks of at most 64 query rows (3 a head) instead of 75",
    .graph = attentionGraph,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          expectAttentionTactic(base, changed, "fast.attention.r64");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.attention.block_rows",
    .value = "128",
    .shows = "kiln.Attention takes blocks of at most 128 query rows whatever the key count",
    .graph = attentionGraph,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          expectAttentionTactic(base, changed, "fast.attention.r128");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.attention.block_rows",
    .value = "256",
    .shows = "kiln.Attention takes each head's 150 query rows in one block instead of two",
    .graph = attentionGraph,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          expectAttentionTactic(base, changed, "fast.attention.r256");
        },
});

}  // namespace
}  // namespace kiln::testing
