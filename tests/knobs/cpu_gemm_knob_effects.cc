// Effects of the native SGEMM's scheduling knobs: the micro-kernel family, the cache blocking of
// packed A and B, and how one product splits among threads. None of them changes the arithmetic
// beyond float32 reassociation (the blocking and the split not even that).
#include <gtest/gtest.h>

#include <algorithm>

#include "graph_sketch.h"
#include "kiln/backends/cpu/kernels/sgemm.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// x[m, k] (a runtime input) times a constant weight w[k, n].
ir::Graph weightMatMul(int64_t m, int64_t k, int64_t n) {
  GraphSketch g;
  g.output(g.node("MatMul", {g.input("x", {m, k}), g.weight("w", {k, n})}, {}, "mm"));
  return g.take();
}

bool cpuRuns(cpu::GemmKernel kernel) { return cpu::gemmKernelSupported(kernel); }

// A forced kernel shows in the tactic; one this CPU lacks runs as auto and says so.
KnobEffect microKernel(const std::string& value, cpu::GemmKernel kernel, const std::string& what) {
  return {
      .knob = "cpu.gemm.kernel",
      .value = value,
      .shows = "a native MatMul runs on the " + what +
               " micro-kernel instead of the best this CPU supports (auto, with a note in the "
               "tactic, where the CPU lacks it)",
      .graph = [] { return weightMatMul(13, 70, 37); },
      .expect =
          [value, kernel](const BuildSnapshot& base, const BuildSnapshot& changed) {
            EXPECT_EQ(base.layer("mm").tactic, "native.sgemm.kc256.prepacked");
            EXPECT_EQ(changed.layer("mm").tactic,
                      "native.sgemm.kc256." + (cpuRuns(kernel) ? value : "auto-no-" + value) +
                          ".prepacked");
          },
  };
}

const int kMicroKernelEffects[] = {
    registerKnobEffect(microKernel("avx512", cpu::GemmKernel::kAvx512, "AVX-512")),
    registerKnobEffect(microKernel("avx2", cpu::GemmKernel::kAvx2, "AVX2")),
    registerKnobEffect(microKernel("portable", cpu::GemmKernel::kPortable, "portable C++")),
};

// At the default panel depth (kc = 256) a packed row of A or column of B holds 1 KiB, so a
// block of A of `kib` KiB is `kib` rows (mc) and a block of B of `kib` KiB is `kib` columns (nc).
KnobEffect blockA(const std::string& kib, int64_t m) {
  return {
      .knob = "cpu.gemm.block_a",
      .value = kib,
      .shows = "a native MatMul with m = " + std::to_string(m) + " packs A in blocks of " + kib +
               " rows (" + kib + " KiB) instead of 384",
      .graph = [m] { return weightMatMul(m, 64, 24); },
      .expect =
          [kib](const BuildSnapshot& base, const BuildSnapshot& changed) {
            EXPECT_EQ(base.layer("mm").tactic, "native.sgemm.kc256.prepacked");
            EXPECT_EQ(changed.layer("mm").tactic, "native.sgemm.kc256.a" + kib + "k.prepacked");
          },
  };
}

const int kBlockAEffects[] = {
    registerKnobEffect(blockA("96", 200)),
    registerKnobEffect(blockA("192", 400)),
    registerKnobEffect(blockA("768", 800)),
};

KnobEffect blockB(const std::string& kib, int64_t n) {
  return {
      .knob = "cpu.gemm.block_b",
      .value = kib,
      .shows = "a native MatMul with n = " + std::to_string(n) + " takes B in blocks of " + kib +
               " columns (" + kib + " KiB) instead of 4096",
      .graph = [n] { return weightMatMul(4, 64, n); },
      .expect =
          [kib](const BuildSnapshot& base, const BuildSnapshot& changed) {
            EXPECT_EQ(base.layer("mm").tactic, "native.sgemm.kc256.prepacked");
            EXPECT_EQ(changed.layer("mm").tactic, "native.sgemm.kc256.b" + kib + "k.prepacked");
            // Blocking only partitions C: every element is summed in the same order.
            ASSERT_EQ(base.outputs.size(), 1u);
            ASSERT_EQ(changed.outputs.size(), 1u);
            for (int64_t i = 0; i < base.outputs[0].elementCount(); ++i) {
              ASSERT_EQ(base.outputs[0].elementAsDouble(i), changed.outputs[0].elementAsDouble(i));
            }
          },
  };
}

const int kBlockBEffects[] = {
    registerKnobEffect(blockB("1024", 1100)),
    registerKnobEffect(blockB("16384", 4200)),
};

KnobEffect split(const std::string& value, const std::string& how) {
  return {
      .knob = "cpu.gemm.split",
      .value = value,
      .shows = "a native MatMul on 2 threads cuts C " + how +
               " instead of choosing the cheapest grid of row and column bands",
      .graph = [] { return weightMatMul(96, 128, 200); },
      .baseRoute = "-cpu.threads=2",
      .expect =
          [value](const BuildSnapshot& base, const BuildSnapshot& changed) {
            EXPECT_EQ(base.layer("mm").tactic, "native.sgemm.kc256.prepacked");
            EXPECT_EQ(changed.layer("mm").tactic, "native.sgemm.kc256." + value + ".prepacked");
            ASSERT_EQ(base.outputs.size(), 1u);
            ASSERT_EQ(changed.outputs.size(), 1u);
            for (int64_t i = 0; i < base.outputs[0].elementCount(); ++i) {
              ASSERT_EQ(base.outputs[0].elementAsDouble(i), changed.outputs[0].elementAsDouble(i));
            }
          },
  };
}

const int kSplitEffects[] = {
    registerKnobEffect(split("rows", "only along m (row bands)")),
    registerKnobEffect(split("columns", "only along n (column bands)")),
};

// x[200, 64] times w[64, 48] plus a bias, then Relu: one kiln.FusedGemm after fusion.
KILN_KNOB_EFFECT({
    .knob = "cpu.gemm.epilogue",
    .value = "tiles",
    .shows = "a native FusedGemm applies its Relu to each block of C as soon as the block is "
             "final instead of over the whole output after the product",
    .graph =
        [] {
          GraphSketch g;
          const std::string y =
              g.node("MatMul", {g.input("x", {200, 64}), g.weight("w", {64, 48})}, {}, "fc");
          g.output(g.node("Relu", {g.node("Add", {y, g.weight("b", {48})})}));
          return g.take();
        },
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("fc").op, "kiln.FusedGemm");
          EXPECT_EQ(base.layer("fc").tactic, "native.sgemm.kc256.prepacked");
          EXPECT_EQ(changed.layer("fc").tactic, "native.sgemm.kc256.prepacked.epilogue-tiles");
        },
});

}  // namespace
}  // namespace kiln::testing
