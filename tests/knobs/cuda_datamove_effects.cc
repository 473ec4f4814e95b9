// Effects of the CUDA data-movement knobs (kernels/datamove_steps.cc). Lowering names the kernel
// in the step's tactic and its launch in the detail, so the difference shows without a GPU; outputs
// are compared where one is present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include <string>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

ir::Graph transpose48x40() {
  GraphSketch g;
  g.output(g.node("Transpose", {g.input("x", {48, 40})}, {{"perm", ints({1, 0})}}, "transpose"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.transpose.tiled",
    .value = "off",
    .shows = "a [48, 40] -> [40, 48] Transpose gathers with strides instead of going through "
             "32x32 shared-memory tiles",
    .backend = "cuda",
    .graph = transpose48x40,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("transpose").tactic, "kiln.transpose.tiled");
          EXPECT_EQ(changed.layer("transpose").tactic, "kiln.transpose");
        },
});

[[maybe_unused]] const int kTileRowEffects = [] {
  for (const char* rows : {"4", "16", "32"}) {
    const std::string detail = std::string("32x32 tiles, ") + rows + " thread rows";
    registerKnobEffect({
        .knob = "cuda.transpose.tile_rows",
        .value = rows,
        .shows = "the tiled transpose's blocks are 32 x " + std::string(rows) +
                 " threads instead of 32 x 8",
        .backend = "cuda",
        .graph = transpose48x40,
        .expect =
            [detail](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer("transpose").detail, "32x32 tiles, 8 thread rows");
              EXPECT_EQ(changed.layer("transpose").detail, detail);
              EXPECT_EQ(changed.layer("transpose").tactic, "kiln.transpose.tiled");
            },
    });
  }
  return 0;
}();

[[maybe_unused]] const int kCopyBlockEffects = [] {
  for (const char* threads : {"128", "512", "1024"}) {
    const std::string blocks = std::string(threads) + "-thread blocks";
    registerKnobEffect({
        .knob = "cuda.copy.block",
        .value = threads,
        .shows = "a strided Slice and a Concat launch " + blocks + " instead of 256-thread ones",
        .backend = "cuda",
        .graph =
            [] {
              // Every other column of x [8, 40] (a strided gather, its axes merged into one of
              // stride 2), then Concat with y [8, 3].
              GraphSketch g;
              auto sliced = g.node("Slice",
                                   {g.input("x", {8, 40}), g.constant("starts", axes({0})),
                                    g.constant("ends", axes({40})), g.constant("axes", axes({1})),
                                    g.constant("steps", axes({2}))},
                                   {}, "slice");
              g.output(g.node("Concat", {sliced, g.input("y", {8, 3})},
                              {{"axis", ir::Attribute{int64_t{1}}}}, "concat"));
              return g.take();
            },
        .expect =
            [blocks](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer("slice").detail, "strided rank 1, 256-thread blocks");
              EXPECT_EQ(changed.layer("slice").detail, "strided rank 1, " + blocks);
              EXPECT_EQ(base.layer("concat").detail, "2 parts, 256-thread blocks");
              EXPECT_EQ(changed.layer("concat").detail, "2 parts, " + blocks);
            },
    });
  }
  return 0;
}();

}  // namespace
}  // namespace kiln::testing
#endif
