// Effects of the CUDA normalisation knobs (kernels/norm_steps.cc): which row kernel a Softmax
// over contiguous rows takes, and a normalisation run in the reduced type. Lowering names them
// in the step's tactic and precision, so the differences show without a GPU; outputs are
// compared where one is present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// A Softmax over rows of `width` elements (the last axis).
std::function<ir::Graph()> softmaxRows(int64_t width) {
  return [width] {
    GraphSketch g;
    g.output(g.node("Softmax", {g.input("x", {4, width})}, {{"axis", ir::Attribute{int64_t{-1}}}},
                    "softmax"));
    return g.take();
  };
}

KILN_KNOB_EFFECT({
    .knob = "cuda.softmax.row_kernel",
    .value = "warp",
    .shows = "rows of 2048 elements are reduced by one warp each instead of one block each (auto "
             "gives rows past 1024 a block)",
    .backend = "cuda",
    .graph = softmaxRows(2048),
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("softmax").tactic, "kiln.softmax.block");
          EXPECT_EQ(changed.layer("softmax").tactic, "kiln.softmax.warp");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.softmax.row_kernel",
    .value = "block",
    .shows = "rows of 64 elements are reduced by a 512-thread block each instead of a warp each",
    .backend = "cuda",
    .graph = softmaxRows(64),
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("softmax").tactic, "kiln.softmax.warp");
          EXPECT_EQ(changed.layer("softmax").tactic, "kiln.softmax.block");
        },
});

// x [6, 32] -> LayerNormalization over the last axis.
ir::Graph layerNorm() {
  GraphSketch g;
  g.output(g.node("LayerNormalization",
                  {g.input("x", {6, 32}), g.weight("gamma", {32}), g.weight("beta", {32})},
                  {{"axis", ir::Attribute{int64_t{-1}}}}, "ln"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.precision.norm_fp32",
    .value = "on",
    .shows = "under fp16 the LayerNormalization keeps float32 storage (no casts, as nothing else "
             "is reduced) instead of kiln's row kernel on float16 data between two casts",
    .backend = "cuda",
    .graph = layerNorm,
    .baseRoute = "-cuda.precision=fp16 -cuda.host_fallback=off",
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(changed.layer("ln").precision, "fp32");
          EXPECT_FALSE(changed.hasOp("Cast"));
          EXPECT_EQ(base.layer("ln").precision, "fp16");
          EXPECT_EQ(base.layer("ln").tactic, "kiln.layernorm");
          EXPECT_EQ(base.layersOf("Cast").size(), 2u);
        },
});

}  // namespace
}  // namespace kiln::testing
#endif
