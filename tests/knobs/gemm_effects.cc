// Effects of the GEMM knobs: the native SGEMM as tactic source, prepacked weights, the panel
// depth and bfloat16 arithmetic.
#include <gtest/gtest.h>

#include <cmath>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// x[8, k] (a runtime input) times a constant weight w[k, 24].
ir::Graph weightMatMul(int64_t k, float weightScale = 0.5f) {
  GraphSketch g;
  g.output(g.node("MatMul", {g.input("x", {8, k}), g.weight("w", {k, 24}, weightScale)}, {}, "mm"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cpu.gemm.source",
    .value = "blas",
    .shows = "a MatMul runs on OpenBLAS's sgemm instead of kiln's packed SGEMM with its weight "
             "packed at build time",
    .graph = [] { return weightMatMul(16); },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mm").tactic, "native.sgemm.kc256.prepacked");
          EXPECT_EQ(changed.layer("mm").tactic, "blas.sgemm");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.gemm.prepack",
    .value = "off",
    .shows = "a native MatMul packs its weight on every run instead of once at build time",
    .graph = [] { return weightMatMul(16); },
    .baseRoute = "-cpu.gemm.source=native",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mm").tactic, "native.sgemm.kc256.prepacked");
          EXPECT_EQ(changed.layer("mm").tactic, "native.sgemm.kc256");
        },
});

// k = 1000 spans 4 panels at the default depth of 256; other depths cut it into 8, 3 or 2
// panels (float32 reassociation only: the outputs agree within 1e-4).
KnobEffect panelDepth(const std::string& kc, int panels) {
  return {
      .knob = "cpu.gemm.kc",
      .value = kc,
      .shows = "a native MatMul with k = 1000 runs as " + std::to_string(panels) +
               " packed panels of depth " + kc + " instead of 4 of depth 256",
      .graph = [] { return weightMatMul(1000); },
      .baseRoute = "-cpu.gemm.source=native",
      .expect =
          [kc](const BuildSnapshot& base, const BuildSnapshot& changed) {
            EXPECT_EQ(base.layer("mm").tactic, "native.sgemm.kc256.prepacked");
            EXPECT_EQ(changed.layer("mm").tactic, "native.sgemm.kc" + kc + ".prepacked");
          },
  };
}

const int kPanelDepthEffects[] = {
    registerKnobEffect(panelDepth("128", 8)),
    registerKnobEffect(panelDepth("384", 3)),
    registerKnobEffect(panelDepth("512", 2)),
};

// x in [-2, 2] (the runner's inputs), w in [-0.25, 0.25], k = 64. Rounding an operand to
// bfloat16 moves it by up to 2^-8 relative, about 0.0016 rms, so each product moves by about
// 0.0023 * |x w| (rms |x w| = 0.17) and an output's error has a standard deviation near
// sqrt(64) * 0.0023 * 0.17 = 0.003 (the largest of these 192 outputs moves by 0.007): 2e-2 is
// over six deviations. Float32 reassociation alone stays below 1e-5 here, so an output that
// moves by more than 1e-4 shows the bf16 arithmetic.
KILN_KNOB_EFFECT({
    .knob = "cpu.gemm.precision",
    .value = "bf16",
    .shows = "a MatMul rounds its operands to bfloat16 (float32 sums) on the same native kernels",
    .graph = [] { return weightMatMul(64, 0.25f); },
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mm").tactic, "native.sgemm.kc256.prepacked");
          EXPECT_EQ(base.layer("mm").precision, "fp32");
          EXPECT_EQ(changed.layer("mm").tactic, "native.sgemm.kc256.prepacked");
          EXPECT_EQ(changed.layer("mm").precision, "bf16");
          ASSERT_EQ(base.outputs.size(), 1u);
          double largest = 0;
          for (int64_t i = 0; i < base.outputs[0].elementCount(); ++i) {
            largest = std::max(largest, std::fabs(base.outputs[0].elementAsDouble(i) -
                                                  changed.outputs[0].elementAsDouble(i)));
          }
          EXPECT_GT(largest, 1e-4) << "bf16 gave float32 results";
          EXPECT_LT(largest, 2e-2);
        },
});

}  // namespace
}  // namespace kiln::testing
