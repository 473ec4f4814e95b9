// Effects of the CUDA normalisation knobs (kernels/norm_steps.cc): which row kernel a Softmax
// or a LayerNormalization over contiguous rows takes and its launch shape, and a normalisation
// run in the reduced type. Lowering names them in the step's tactic, detail and precision, so the
// differences show without a GPU; outputs are compared where one is present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

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

// x [6, width] -> LayerNormalization over the last axis.
std::function<ir::Graph()> layerNormRows(int64_t width) {
  return [width] {
    GraphSketch g;
    g.output(
        g.node("LayerNormalization",
               {g.input("x", {6, width}), g.weight("gamma", {width}), g.weight("beta", {width})},
               {{"axis", ir::Attribute{int64_t{-1}}}}, "ln"));
    return g.take();
  };
}

KILN_KNOB_EFFECT({
    .knob = "cuda.precision.norm_fp32",
    .value = "on",
    .shows = "under fp16 the LayerNormalization keeps float32 storage (no casts, as nothing else "
             "is reduced) instead of kiln's row kernel on float16 data between two casts",
    .backend = "cuda",
    .graph = layerNormRows(32),
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

// A Softmax over the channels of x [2, 21, 6, 5] (a segmentation head's): lines 30 elements apart.
ir::Graph softmaxChannels() {
  GraphSketch g;
  g.output(g.node("Softmax", {g.input("x", {2, 21, 6, 5})}, {{"axis", ir::Attribute{int64_t{1}}}},
                  "softmax"));
  return g.take();
}

[[maybe_unused]] const int kElementwiseNormEffects = [] {
  for (const char* threads : {"128", "512", "1024"}) {
    const std::string blocks = std::string("a thread an element, ") + threads + "-thread blocks";
    registerKnobEffect({
        .knob = "cuda.norm.elementwise_block",
        .value = threads,
        .shows = std::string("an unfolded BatchNormalization and an LRN launch ") + threads +
                 "-thread blocks instead of 256-thread ones",
        .backend = "cuda",
        .graph =
            [] {
              GraphSketch g;
              auto bn =
                  g.node("BatchNormalization",
                         {g.input("x", {2, 6, 5, 5}), g.weight("scale", {6}), g.weight("bias", {6}),
                          g.weight("mean", {6}), g.weight("var", {6}, 0.4f, 1.0f)},
                         {}, "bn");
              g.output(g.node("LRN", {bn}, {{"size", ir::Attribute{int64_t{3}}}}, "lrn"));
              return g.take();
            },
        .expect =
            [blocks](const BuildSnapshot& base, const BuildSnapshot& changed) {
              for (const char* layer : {"bn", "lrn"}) {
                EXPECT_EQ(base.layer(layer).detail, "a thread an element, 256-thread blocks");
                EXPECT_EQ(changed.layer(layer).detail, blocks);
              }
            },
    });
  }
  return 0;
}();

struct RowLaunchEffect {
  const char* knob;
  const char* value;
  const char* layer;
  std::function<ir::Graph()> graph;
  const char* base;  // the layer's detail without the knob
  const char* changed;
};

[[maybe_unused]] const int kRowLaunchEffects = [] {
  for (const RowLaunchEffect& effect : std::vector<RowLaunchEffect>{
           {"cuda.softmax.warp_rows", "2", "softmax", softmaxRows(64),
            "a warp a row, 4 rows a block", "a warp a row, 2 rows a block"},
           {"cuda.softmax.warp_rows", "8", "softmax", softmaxRows(64),
            "a warp a row, 4 rows a block", "a warp a row, 8 rows a block"},
           {"cuda.softmax.online", "on", "softmax", softmaxRows(64), "a warp a row, 4 rows a block",
            "a warp a row, 4 rows a block, online maximum and sum"},
           {"cuda.softmax.block_threads", "128", "softmax", softmaxRows(2048),
            "a 512-thread block a row", "a 128-thread block a row"},
           {"cuda.softmax.block_threads", "256", "softmax", softmaxRows(2048),
            "a 512-thread block a row", "a 256-thread block a row"},
           {"cuda.norm.row_kernel", "block", "ln", layerNormRows(32),
            "a warp a row, 4 rows a block", "a 512-thread block a row"},
           {"cuda.norm.row_kernel", "warp", "ln", layerNormRows(2048), "a 512-thread block a row",
            "a warp a row, 4 rows a block"},
           {"cuda.norm.warp_rows", "2", "ln", layerNormRows(32), "a warp a row, 4 rows a block",
            "a warp a row, 2 rows a block"},
           {"cuda.norm.warp_rows", "8", "ln", layerNormRows(32), "a warp a row, 4 rows a block",
            "a warp a row, 8 rows a block"},
           {"cuda.softmax.warp_row_limit", "256", "softmax", softmaxRows(300),
            "a warp a row, 4 rows a block", "a 512-thread block a row"},
           {"cuda.softmax.warp_row_limit", "4096", "softmax", softmaxRows(2048),
            "a 512-thread block a row", "a warp a row, 4 rows a block"},
           {"cuda.norm.warp_row_limit", "256", "ln", layerNormRows(300),
            "a warp a row, 4 rows a block", "a 512-thread block a row"},
           {"cuda.norm.warp_row_limit", "4096", "ln", layerNormRows(2048),
            "a 512-thread block a row", "a warp a row, 4 rows a block"},
           {"cuda.norm.block_threads", "128", "ln", layerNormRows(2048), "a 512-thread block a row",
            "a 128-thread block a row"},
           {"cuda.norm.block_threads", "256", "ln", layerNormRows(2048), "a 512-thread block a row",
            "a 256-thread block a row"},
           {"cuda.softmax.strided_block", "128", "softmax", softmaxChannels,
            "strided lines, a thread a line, 256-thread blocks",
            "strided lines, a thread a line, 128-thread blocks"},
           {"cuda.softmax.strided_block", "512", "softmax", softmaxChannels,
            "strided lines, a thread a line, 256-thread blocks",
            "strided lines, a thread a line, 512-thread blocks"},
           {"cuda.softmax.strided_block", "1024", "softmax", softmaxChannels,
            "strided lines, a thread a line, 256-thread blocks",
            "strided lines, a thread a line, 1024-thread blocks"},
       }) {
    const std::string layer = effect.layer, base = effect.base, changed = effect.changed;
    registerKnobEffect({
        .knob = effect.knob,
        .value = effect.value,
        .shows = "the rows launch as \"" + changed + "\" instead of \"" + base + "\"",
        .backend = "cuda",
        .graph = effect.graph,
        .expect =
            [layer, base, changed](const BuildSnapshot& before, const BuildSnapshot& after) {
              EXPECT_EQ(before.layer(layer).detail, base);
              EXPECT_EQ(after.layer(layer).detail, changed);
            },
    });
  }
  return 0;
}();

KILN_KNOB_EFFECT({
    .knob = "cuda.norm.register_rows",
    .value = "off",
    .shows = "under fp16 the LayerNormalization's 32-element rows go through the generic row "
             "kernel instead of being held in registers",
    .backend = "cuda",
    .graph = layerNormRows(32),
    .baseRoute = "-cuda.precision=fp16",
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("ln").detail, "a warp a row, 4 rows a block");
          EXPECT_EQ(changed.layer("ln").detail,
                    "a warp a row, 4 rows a block, no register-held rows");
          EXPECT_EQ(changed.layer("ln").precision, "fp16");
        },
});

}  // namespace
}  // namespace kiln::testing
#endif
