// Effects of the CUDA normalisation knobs (kernels/norm_steps.cc): which row kernel a Softmax
// over contiguous rows takes. Lowering names it in the step's tactic, so the difference shows
// without a GPU; outputs are compared where one is present.
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

}  // namespace
}  // namespace kiln::testing
#endif
