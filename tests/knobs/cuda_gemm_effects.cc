// Effects of the CUDA backend's matrix-product knobs (cuda.gemm.*): the product's source, how
// cuBLASLt's algorithm is chosen, and where the bias and activation run. Lowering needs no GPU,
// so the tactics show anywhere; outputs are compared where a GPU is present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// fc = Gemm(x [8, 16], w [16, 24], b [24]): a bias cuBLASLt's BIAS epilogue adds.
ir::Graph gemmWithBias() {
  GraphSketch g;
  g.output(g.node("Gemm", {g.input("x", {8, 16}), g.weight("w", {16, 24}), g.weight("b", {24})}, {},
                  "fc"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.gemm.source",
    .value = "native",
    .shows = "a Gemm runs kiln's tiled SGEMM kernel (bias in its stores) instead of cuBLASLt",
    .backend = "cuda",
    .graph = gemmWithBias,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("fc").tactic, "cublaslt");
          EXPECT_EQ(changed.layer("fc").tactic, "native");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.gemm.algo",
    .value = "timed",
    .shows = "cuBLASLt's algorithm for a Gemm is the fastest of up to eight timed at prepare, "
             "instead of its heuristics' first",
    .backend = "cuda",
    .graph = gemmWithBias,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("fc").tactic, "cublaslt");
          EXPECT_EQ(changed.layer("fc").tactic, "cublaslt.timed");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.gemm.epilogue",
    .value = "separate",
    .shows = "a Gemm's bias is added by kiln's epilogue kernel after the bare cuBLASLt product, "
             "instead of by cuBLASLt's BIAS epilogue",
    .backend = "cuda",
    .graph = gemmWithBias,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("fc").tactic, "cublaslt");
          EXPECT_EQ(changed.layer("fc").tactic, "cublaslt+epilogue");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.gemm.gelu_epilogue",
    .value = "tanh",
    .shows = "a Gemm followed by an (erf) Gelu takes cuBLASLt's GELU epilogue, the tanh "
             "approximation, instead of kiln's epilogue kernel after the product",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g(20);  // Gelu is an opset-20 op
          auto product =
              g.node("Gemm", {g.input("x", {8, 16}), g.weight("w", {16, 24}), g.weight("b", {24})},
                     {}, "fc");
          g.output(g.node("Gelu", {product}, {}, "gelu"));
          return g.take();
        },
    .tolerance = 2e-3,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          ASSERT_EQ(base.layers.size(), 1u) << base.summary();
          ASSERT_EQ(changed.layers.size(), 1u) << changed.summary();
          EXPECT_EQ(base.layers[0].tactic, "cublaslt+epilogue");
          EXPECT_EQ(changed.layers[0].tactic, "cublaslt");
        },
});

}  // namespace
}  // namespace kiln::testing
#endif
