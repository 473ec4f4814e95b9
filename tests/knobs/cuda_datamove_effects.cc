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

// x [6, 20] and y [6, 12] joined along the columns: each part is 6 strided rows of the output.
ir::Graph concatColumns() {
  GraphSketch g;
  g.output(g.node("Concat", {g.input("x", {6, 20}), g.input("y", {6, 12})},
                  {{"axis", ir::Attribute{int64_t{1}}}}, "concat"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.concat.impl",
    .value = "copies",
    .shows = "a Concat of [6, 20] and [6, 12] along the columns is two strided 2D copies "
             "instead of one kernel",
    .backend = "cuda",
    .graph = concatColumns,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("concat").detail, "2 parts, 256-thread blocks");
          EXPECT_EQ(changed.layer("concat").detail, "2 parts, a 2D copy a part");
          EXPECT_EQ(changed.layer("concat").tactic, "kiln.concat");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.split.impl",
    .value = "copies",
    .shows = "a Split of [6, 32] into 20 and 12 columns is two strided 2D copies instead of one "
             "kernel",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto parts =
              g.nodeOutputs("Split", {g.input("x", {6, 32}), g.constant("sizes", axes({20, 12}))},
                            {{"axis", ir::Attribute{int64_t{1}}}}, "split", 2);
          // Each part feeds an Abs, so neither output is the Split's own graph output.
          g.output(g.node("Abs", {parts[0]}, {}, "abs0"));
          g.output(g.node("Abs", {parts[1]}, {}, "abs1"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("split").detail, "2 parts, 256-thread blocks");
          EXPECT_EQ(changed.layer("split").detail, "2 parts, a 2D copy a part");
          EXPECT_EQ(changed.layer("split").tactic, "kiln.split");
        },
});

// One case a value for a block knob of the kernels that take a thread an element: the step `layer`
// of `graph` launches `threads`-thread blocks instead of 256.
// `detail` is what the layer says before its blocks ("16-byte words, " for a Gather of rows).
void registerBlockEffects(const char* knob, const char* layer, const char* tactic,
                          const std::string& what, std::function<ir::Graph()> graph,
                          const std::string& detail = "") {
  for (const char* threads : {"128", "512", "1024"}) {
    const std::string blocks = std::string(threads) + "-thread blocks";
    registerKnobEffect({
        .knob = knob,
        .value = threads,
        .shows = what + " launches " + blocks + " instead of 256-thread ones",
        .backend = "cuda",
        .graph = graph,
        .expect =
            [layer = std::string(layer), tactic = std::string(tactic), blocks, detail](
                const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer(layer).detail, detail + "256-thread blocks");
              EXPECT_EQ(changed.layer(layer).detail, detail + blocks);
              EXPECT_EQ(base.layer(layer).tactic, tactic);
              EXPECT_EQ(changed.layer(layer).tactic, tactic);
            },
    });
  }
}

// An embedding lookup: rows of 24 float32 (96 bytes) from a table [50, 24].
ir::Graph lookup() {
  GraphSketch g;
  g.output(g.node("Gather", {g.input("table", {50, 24}), g.constant("ids", axes({3, 49, 0, 7, 7}))},
                  {}, "lookup"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.gather.vector",
    .value = "off",
    .shows = "an embedding lookup of 96-byte rows moves a thread per float32 element instead of "
             "a thread per 16-byte word",
    .backend = "cuda",
    .graph = lookup,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("lookup").detail, "16-byte words, 256-thread blocks");
          EXPECT_EQ(changed.layer("lookup").detail, "256-thread blocks");
          EXPECT_EQ(base.layer("lookup").tactic, "kiln.gather");
          EXPECT_EQ(changed.layer("lookup").tactic, "kiln.gather");
        },
});

[[maybe_unused]] const int kIndexBlockEffects = [] {
  registerBlockEffects(
      "cuda.table.block", "pad", "kiln.pad", "a reflect Pad of x [2, 3, 9, 9]", [] {
        GraphSketch g;
        g.output(g.node(
            "Pad", {g.input("x", {2, 3, 9, 9}), g.constant("pads", axes({0, 0, 2, 1, 0, 0, 1, 2}))},
            {{"mode", ir::Attribute{std::string("reflect")}}}, "pad"));
        return g.take();
      });
  registerBlockEffects("cuda.gather.block", "lookup", "kiln.gather",
                       "an embedding lookup (Gather of rows)", lookup, "16-byte words, ");
  registerBlockEffects(
      "cuda.scatter.block", "scatter", "kiln.scatter_nd", "a ScatterND of two rows into x [6, 10]",
      [] {
        GraphSketch g;
        g.output(
            g.node("ScatterND",
                   {g.input("x", {6, 10}),
                    g.constant("rows", ir::Tensor::fromVector<int64_t>(ir::Shape{2, 1}, {4, 1})),
                    g.input("updates", {2, 10})},
                   {}, "scatter"));
        return g.take();
      });
  registerBlockEffects(
      "cuda.resize.block", "resize", "kiln.resize.two_axes",
      "a bilinear 2x upsampling of x [1, 3, 10, 12]", [] {
        GraphSketch g;
        g.output(g.node("Resize",
                        {g.input("x", {1, 3, 10, 12}), "",
                         g.constant("scales", ir::Tensor::fromVector<float>(
                                                  ir::Shape{4}, {1.0f, 1.0f, 2.0f, 2.0f}))},
                        {{"mode", ir::Attribute{std::string("linear")}}}, "resize"));
        return g.take();
      });
  registerBlockEffects("cuda.trilu.block", "trilu", "kiln.trilu",
                       "a Trilu keeping the lower triangle of x [2, 9, 12]", [] {
                         GraphSketch g;
                         g.output(g.node("Trilu", {g.input("x", {2, 9, 12})},
                                         {{"upper", ir::Attribute{int64_t{0}}}}, "trilu"));
                         return g.take();
                       });
  return 0;
}();

}  // namespace
}  // namespace kiln::testing
#endif
