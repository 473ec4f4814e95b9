// Effects of the knobs of the CUDA backend's misc and pooling kernels (misc_steps.cc,
// pool_steps.cc): how an Einsum that is a matrix product runs, and the pooling kernels' blocks.
// Lowering needs no GPU, so the tactics and launch details show anywhere; outputs are compared
// where a GPU is present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

[[maybe_unused]] const int kMiscBlockEffects = [] {
  for (const char* threads : {"128", "512", "1024"}) {
    const std::string blocks = std::string(threads) + "-thread blocks";
    registerKnobEffect({
        .knob = "cuda.einsum.block",
        .value = threads,
        .shows = "kiln's einsum kernel (a row sum, ij->i, is no matrix product) launches " +
                 blocks + " instead of 256-thread ones",
        .backend = "cuda",
        .graph =
            [] {
              GraphSketch g;
              g.output(g.node("Einsum", {g.input("x", {40, 9})},
                              {{"equation", ir::Attribute{std::string("ij->i")}}}, "rows"));
              return g.take();
            },
        .expect =
            [blocks](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer("rows").tactic, "kiln.einsum");
              EXPECT_EQ(base.layer("rows").detail, "256-thread blocks");
              EXPECT_EQ(changed.layer("rows").detail, blocks);
            },
    });
    registerKnobEffect({
        .knob = "cuda.onehot.block",
        .value = threads,
        .shows = "the OneHot kernel launches " + blocks + " instead of 256-thread ones",
        .backend = "cuda",
        .graph =
            [] {
              GraphSketch g;
              g.output(g.node(
                  "OneHot",
                  {g.constant("ids",
                              ir::Tensor::fromVector<int64_t>(ir::Shape{2, 3}, {0, 4, 9, 2, 2, 7})),
                   g.constant("depth", ir::Tensor::fromVector<int64_t>(ir::Shape{}, {10})),
                   g.input("values", {2})},
                  {}, "onehot"));
              return g.take();
            },
        .expect =
            [blocks](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer("onehot").detail, "256-thread blocks");
              EXPECT_EQ(changed.layer("onehot").detail, blocks);
            },
    });
  }
  return 0;
}();

KILN_KNOB_EFFECT({
    .knob = "cuda.cumsum.kernel",
    .value = "lines",
    .shows = "a CumSum along the last axis of x [6, 70] runs a thread a line instead of a warp a "
             "line",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          g.output(g.node("CumSum", {g.input("x", {6, 70}), g.constant("axis", axes({1}))}, {},
                          "cumsum"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("cumsum").detail, "a warp a line");
          EXPECT_EQ(changed.layer("cumsum").detail, "a thread a line");
          EXPECT_EQ(changed.layer("cumsum").tactic, "kiln.cumsum");
        },
});

// x [2, 8, 9, 9] -> MaxPool 3x3 stride 2 -> GlobalAveragePool: NHWC by default, so the global
// pool takes a thread an output; with -cuda.layout=nchw, a block a plane.
ir::Graph pools() {
  GraphSketch g;
  auto pooled = g.node("MaxPool", {g.input("x", {2, 8, 9, 9})},
                       {{"kernel_shape", ints({3, 3})}, {"strides", ints({2, 2})}}, "max");
  g.output(g.node("GlobalAveragePool", {pooled}, {}, "mean"));
  return g.take();
}

[[maybe_unused]] const int kPoolEffects = [] {
  for (const char* layout : {"nhwc", "nchw"}) {
    for (const char* threads : {"128", "512"}) {
      const std::string block = std::string(threads) + "-thread blocks";
      const bool nhwc = std::string(layout) == "nhwc";
      const std::string global = nhwc ? "a thread an output, " : "a block a plane, ";
      // 8 float32 channels in NHWC: the windowed pool takes 4 channels a thread (cuda.pool.vector).
      const std::string window =
          nhwc ? "a thread per 4 channels (16-byte loads), " : "a thread an output, ";
      registerKnobEffect({
          .knob = "cuda.pool.block",
          .value = threads,
          .shows = std::string("under ") + layout + " the windowed and global pools launch " +
                   block + " instead of 256-thread ones",
          .backend = "cuda",
          .graph = pools,
          .baseRoute = std::string("-cuda.layout=") + layout,
          .expect =
              [block, global, window](const BuildSnapshot& base, const BuildSnapshot& changed) {
                EXPECT_EQ(base.layer("max").detail, window + "256-thread blocks");
                EXPECT_EQ(changed.layer("max").detail, window + block);
                EXPECT_EQ(base.layer("mean").detail, global + "256-thread blocks");
                EXPECT_EQ(changed.layer("mean").detail, global + block);
              },
      });
    }
  }
  return 0;
}();

KILN_KNOB_EFFECT({
    .knob = "cuda.pool.vector",
    .value = "off",
    .shows = "an NHWC MaxPool over 8 float32 channels takes a thread per output element instead "
             "of a thread per 4 channels with 16-byte loads",
    .backend = "cuda",
    .graph = pools,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("max").detail,
                    "a thread per 4 channels (16-byte loads), 256-thread blocks");
          EXPECT_EQ(changed.layer("max").detail, "a thread an output, 256-thread blocks");
          EXPECT_EQ(base.layer("max").layout, "nhwc");
        },
});

}  // namespace
}  // namespace kiln::testing
#endif
