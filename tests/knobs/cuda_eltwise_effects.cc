// Effects of the CUDA backend's elementwise and reduction knobs: the vector width of the flat
// elementwise kernels and the row reduction's block size. Both change launches, not tactics, so
// the cases read the layers' launch details (BuildSnapshot::Layer::detail).
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "kiln/backends/cuda/codegen/nvrtc.h"
#include "knob_effects.h"

namespace kiln::testing {

namespace {

KILN_KNOB_EFFECT({
    .knob = "cuda.eltwise.vector_width",
    .value = "1",
    .shows = "a Sigmoid, two Casts and a bias Add move one element per thread instead of four "
             "as one aligned load and store",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {4, 1030});
          auto s = g.node("Sigmoid", {x}, {}, "sigmoid");
          auto c = g.node("Cast", {s}, {{"to", ir::Attribute{int64_t{11}}}}, "cast");  // double
          auto back = g.node("Cast", {c}, {{"to", ir::Attribute{int64_t{1}}}}, "back");
          g.output(g.node("Add", {back, g.weight("bias", {1})}, {}, "add"));
          return g.take();
        },
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          for (const char* layer : {"sigmoid", "cast", "back", "add"}) {
            EXPECT_EQ(base.layer(layer).detail, "flat, vector width 4, 256-thread blocks")
                << base.summary();
            EXPECT_EQ(changed.layer(layer).detail, "flat, vector width 1, 256-thread blocks")
                << changed.summary();
          }
          EXPECT_EQ(base.layer("sigmoid").tactic, "kiln.unary");
          EXPECT_EQ(base.layer("add").tactic, "kiln.binary");
        },
});

// SiLU and an NHWC channel scale (as squeeze-excite blocks end), fused into one
// kiln.FusedElementwise.
ir::Graph channelScale() {
  GraphSketch g;
  auto x = g.input("x", {2, 6, 6, 32});
  auto silu = g.node("Mul", {x, g.node("Sigmoid", {x}, {}, "sigmoid")}, {}, "silu");
  g.output(g.node("Mul", {silu, g.input("s", {2, 1, 1, 32})}, {}, "scale"));
  return g.take();
}

std::string noNvrtc() {
  std::string why;
  return cuda::nvrtcAvailable(&why) ? "" : why;
}

// The one FusedElementwise layer's launch detail.
std::string fusedDetail(const BuildSnapshot& build) {
  const auto layers = build.layersOf("kiln.FusedElementwise");
  EXPECT_EQ(layers.size(), 1u) << build.summary();
  if (layers.size() != 1) return "";
  const std::string& detail = layers[0]->detail;
  // "generated kiln_fused_<hash>, vector 4 (16 bytes), ...": the hash changes with the kernel.
  const size_t comma = detail.find(',');
  return comma == std::string::npos ? detail : detail.substr(comma + 2);
}

KILN_KNOB_EFFECT({
    .knob = "cuda.eltwise.codegen",
    .value = "interpreter",
    .shows =
        "the fused SiLU and channel scale run in the kernel that interprets any program instead of "
        "one NVRTC generated for it",
    .backend = "cuda",
    .graph = channelScale,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          ASSERT_TRUE(changed.hasOp("kiln.FusedElementwise")) << changed.summary();
          EXPECT_EQ(base.layersOf("kiln.FusedElementwise")[0]->tactic, "kiln.fused_eltwise.nvrtc");
          EXPECT_EQ(changed.layersOf("kiln.FusedElementwise")[0]->tactic, "kiln.fused_eltwise");
          EXPECT_EQ(changed.layersOf("kiln.FusedElementwise")[0]->detail,
                    "strided rank 3 (32-bit index), 3 instructions, 256-thread blocks");
        },
    .skipReason = noNvrtc,
});

[[maybe_unused]] const int kEltwiseBlockEffects = [] {
  for (const char* threads : {"128", "512", "1024"}) {
    const std::string blocks = std::string(", ") + threads + "-thread blocks";
    registerKnobEffect({
        .knob = "cuda.eltwise.block",
        .value = threads,
        .shows = std::string("kiln's prebuilt elementwise kernels (a unary and a binary) "
                             "launch ") +
                 threads + "-thread blocks instead of 256-thread ones",
        .backend = "cuda",
        .graph =
            [] {
              GraphSketch g;
              auto x = g.input("x", {2, 6, 6, 32});
              auto e = g.node("Exp", {x}, {}, "exp");
              g.output(g.node("Add", {e, g.input("b", {2, 6, 6, 32})}, {}, "add"));
              return g.take();
            },
        .baseRoute = "-fusion.eltwise_chain=off",
        .expect =
            [blocks](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer("exp").detail, "flat, vector width 4, 256-thread blocks");
              EXPECT_EQ(changed.layer("exp").detail, "flat, vector width 4" + blocks);
              EXPECT_EQ(changed.layer("add").detail, "flat, vector width 4" + blocks);
            },
    });
  }
  return 0;
}();

KILN_KNOB_EFFECT({
    .knob = "cuda.eltwise.codegen.fast_math",
    .value = "on",
    .shows = "the generated kernel of a fused SiLU and channel scale computes its sigmoid with "
             "__expf and __fdividef",
    .backend = "cuda",
    .graph = channelScale,
    .tolerance = 1e-3,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(fusedDetail(base), "vector 4 (16 bytes), block 256, unroll 1");
          EXPECT_EQ(fusedDetail(changed), "vector 4 (16 bytes), block 256, unroll 1, fast math");
        },
    .skipReason = noNvrtc,
});

KILN_KNOB_EFFECT({
    .knob = "cuda.eltwise.codegen.index",
    .value = "64",
    .shows = "the generated kernel of a fused SiLU and channel scale does its index arithmetic "
             "in 64 bits, though every index fits 32",
    .backend = "cuda",
    .graph = channelScale,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(fusedDetail(base), "vector 4 (16 bytes), block 256, unroll 1");
          EXPECT_EQ(fusedDetail(changed), "vector 4 (16 bytes), block 256, unroll 1, 64-bit index");
        },
    .skipReason = noNvrtc,
});

struct CodegenLaunch {
  const char* knob;
  const char* value;
  const char* detail;  // the changed build's, after the kernel name
};

// The launch knobs: each changes the generated kernel's block, pack or unrolling.
[[maybe_unused]] const int kCodegenLaunchEffects = [] {
  for (const CodegenLaunch launch : std::vector<CodegenLaunch>{
           {"cuda.eltwise.codegen.block", "128", "vector 4 (16 bytes), block 128, unroll 1"},
           {"cuda.eltwise.codegen.block", "512", "vector 4 (16 bytes), block 512, unroll 1"},
           {"cuda.eltwise.codegen.block", "1024", "vector 4 (16 bytes), block 1024, unroll 1"},
           {"cuda.eltwise.codegen.vector_bytes", "8", "vector 2 (8 bytes), block 256, unroll 1"},
           {"cuda.eltwise.codegen.vector_bytes", "4", "vector 1 (4 bytes), block 256, unroll 1"},
           {"cuda.eltwise.codegen.unroll", "2", "vector 4 (16 bytes), block 256, unroll 2"},
           {"cuda.eltwise.codegen.unroll", "4", "vector 4 (16 bytes), block 256, unroll 4"}}) {
    const std::string expected = launch.detail;
    registerKnobEffect({
        .knob = launch.knob,
        .value = launch.value,
        .shows =
            std::string("the generated kernel of a fused SiLU and channel scale launches with ") +
            launch.detail + " instead of vector 4 (16 bytes), block 256, unroll 1",
        .backend = "cuda",
        .graph = channelScale,
        .expect =
            [expected](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(fusedDetail(base), "vector 4 (16 bytes), block 256, unroll 1");
              EXPECT_EQ(fusedDetail(changed), expected);
            },
        .skipReason = noNvrtc,
    });
  }
  return 0;
}();

// A long-row ReduceMean (a block per row) and a short-row ReduceSum (a warp per row).
ir::Graph rowReductions() {
  GraphSketch g;
  auto x = g.input("x", {6, 3000});
  g.output(g.node("ReduceMean", {x, g.constant("last", axes({-1}))}, {}, "mean"));
  auto z = g.input("z", {300, 50});
  g.output(g.node("ReduceSum", {z, g.constant("inner", axes({1}))}, {}, "sum"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.reduce.block",
    .value = "128",
    .shows = "row reductions launch 128-thread blocks instead of 256: a 128-thread block per "
             "long row, four warps' rows per block for short ones",
    .backend = "cuda",
    .graph = rowReductions,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mean").detail, "rows, a 256-thread block per output");
          EXPECT_EQ(changed.layer("mean").detail, "rows, a 128-thread block per output");
          EXPECT_EQ(base.layer("sum").detail, "rows, a warp per output, 256-thread blocks");
          EXPECT_EQ(changed.layer("sum").detail, "rows, a warp per output, 128-thread blocks");
          EXPECT_EQ(changed.layer("mean").tactic, "kiln.reduce");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.reduce.block",
    .value = "512",
    .shows = "row reductions launch 512-thread blocks instead of 256",
    .backend = "cuda",
    .graph = rowReductions,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mean").detail, "rows, a 256-thread block per output");
          EXPECT_EQ(changed.layer("mean").detail, "rows, a 512-thread block per output");
          EXPECT_EQ(changed.layer("sum").detail, "rows, a warp per output, 512-thread blocks");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.reduce.warp_row_limit",
    .value = "4096",
    .shows = "the 3000-element rows of a ReduceMean take a warp an output instead of a block",
    .backend = "cuda",
    .graph = rowReductions,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mean").detail, "rows, a 256-thread block per output");
          EXPECT_EQ(changed.layer("mean").detail, "rows, a warp per output, 256-thread blocks");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.reduce.warp_row_limit",
    .value = "256",
    .shows = "the 500-element rows of a ReduceSum take a block an output instead of a warp",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          g.output(g.node("ReduceSum", {g.input("x", {40, 500}), g.constant("last", axes({-1}))},
                          {}, "sum"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("sum").detail, "rows, a warp per output, 256-thread blocks");
          EXPECT_EQ(changed.layer("sum").detail, "rows, a 256-thread block per output");
        },
});

// A spatial mean over NHWC ([8, side, side, 40] to [8, 1, 1, 40]): 10 tiles of 32 outputs.
std::function<ir::Graph()> spatialMean(int64_t side) {
  return [side] {
    GraphSketch g;
    auto x = g.input("x", {8, side, side, 40});
    g.output(g.node("ReduceMean", {x, g.constant("hw", axes({1, 2}))}, {}, "mean"));
    return g.take();
  };
}

struct SplitEffect {
  const char* knob;
  const char* value;
  int splits;  // the changed build's
};

[[maybe_unused]] const int kReduceSplitEffects = [] {
  auto detail = [](int splits) {
    return "columns, 32x8 blocks, range split " + std::to_string(splits) + " ways";
  };
  for (const SplitEffect effect : std::vector<SplitEffect>{
           // 112x112 (12544 elements, 196 splits at most of 64): the block target binds,
           // 1056 / 10 tiles -> 106 splits by default.
           {"cuda.reduce.split_blocks", "264", 27},
           {"cuda.reduce.split_blocks", "528", 53},
           {"cuda.reduce.split_blocks", "2112", 196},
           // 56x56 (3136 elements): the minimum binds, 3136 / 64 -> 49 splits by default.
           {"cuda.reduce.split_min_chunk", "128", 24},
           {"cuda.reduce.split_min_chunk", "256", 12},
           {"cuda.reduce.split_min_chunk", "512", 6}}) {
    const bool blocks = std::string(effect.knob) == "cuda.reduce.split_blocks";
    const std::string expected = detail(effect.splits);
    const std::string base = detail(blocks ? 106 : 49);
    registerKnobEffect({
        .knob = effect.knob,
        .value = effect.value,
        .shows = "a spatial mean over NHWC splits its range " + std::to_string(effect.splits) +
                 " ways instead of " + (blocks ? "106" : "49"),
        .backend = "cuda",
        .graph = spatialMean(blocks ? 112 : 56),
        .expect =
            [expected, base](const BuildSnapshot& baseBuild, const BuildSnapshot& changed) {
              EXPECT_EQ(baseBuild.layer("mean").detail, base);
              EXPECT_EQ(changed.layer("mean").detail, expected);
            },
    });
  }
  return 0;
}();

[[maybe_unused]] const int kColumnSliceEffects = [] {
  for (const char* slices : {"4", "16", "32"}) {
    const std::string columns = std::string("columns, 32x") + slices + " blocks";
    registerKnobEffect({
        .knob = "cuda.reduce.column_slices",
        .value = slices,
        .shows = "column reductions launch " + columns.substr(9) + " instead of 32x8, split or not",
        .backend = "cuda",
        .graph =
            [] {
              // ReduceSum over the outer axis of [64, 40] (not split), and a spatial mean over
              // 56x56 NHWC (split 49 ways).
              GraphSketch g;
              g.output(g.node("ReduceSum", {g.input("x", {64, 40}), g.constant("outer", axes({0}))},
                              {}, "sum"));
              g.output(g.node("ReduceMean",
                              {g.input("y", {8, 56, 56, 40}), g.constant("hw", axes({1, 2}))}, {},
                              "mean"));
              return g.take();
            },
        .expect =
            [columns](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer("sum").detail, "columns, 32x8 blocks");
              EXPECT_EQ(changed.layer("sum").detail, columns);
              EXPECT_EQ(base.layer("mean").detail, "columns, 32x8 blocks, range split 49 ways");
              EXPECT_EQ(changed.layer("mean").detail, columns + ", range split 49 ways");
            },
    });
  }
  return 0;
}();

}  // namespace
}  // namespace kiln::testing
#endif
