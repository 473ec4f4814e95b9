// Effects of the knobs of the CUDA backend's misc kernels (misc_steps.cc): how an Einsum that is
// a matrix product runs. Lowering needs no GPU, so the tactics show anywhere; outputs are compared
// where a GPU is present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

KILN_KNOB_EFFECT({
    .knob = "cuda.einsum.impl",
    .value = "native",
    .shows = "an attention-score Einsum (bhid,bhjd->bhij) runs kiln's einsum kernel (double sums) "
             "instead of a batched cuBLASLt product",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto q = g.input("q", {2, 3, 4, 8});
          auto k = g.input("k", {2, 3, 5, 8});
          g.output(g.node("Einsum", {q, k},
                          {{"equation", ir::Attribute{std::string("bhid,bhjd->bhij")}}}, "scores"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("scores").tactic, "cublaslt");
          EXPECT_EQ(changed.layer("scores").tactic, "kiln.einsum");
        },
});

}  // namespace
}  // namespace kiln::testing
#endif
