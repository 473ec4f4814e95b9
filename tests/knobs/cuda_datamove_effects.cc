// Effects of the CUDA data-movement knobs (kernels/datamove_steps.cc). Lowering names the kernel
// in the step's tactic, so the difference shows without a GPU; outputs are compared where one is
// present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

KILN_KNOB_EFFECT({
    .knob = "cuda.transpose.tiled",
    .value = "off",
    .shows = "a [48, 40] -> [40, 48] Transpose gathers with strides instead of going through "
             "32x32 shared-memory tiles",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          g.output(
              g.node("Transpose", {g.input("x", {48, 40})}, {{"perm", ints({1, 0})}}, "transpose"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("transpose").tactic, "kiln.transpose.tiled");
          EXPECT_EQ(changed.layer("transpose").tactic, "kiln.transpose");
        },
});

}  // namespace
}  // namespace kiln::testing
#endif
