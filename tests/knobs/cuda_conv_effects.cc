// Effects of the CUDA convolution knobs (kernels/conv_steps.cc): the kernel source, cuDNN's
// engine choice and where the epilogue runs, and what cuda.precision does to a convolution.
// Lowering names the choice in the step's tactic and precision, so the differences show without
// a GPU; outputs are compared where one is present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// x [1, 8, 12, 12] -> Conv 3x3 (pads 1) with a bias: one step, "cudnn" by default.
ir::Graph convWithBias() {
  GraphSketch g;
  g.output(g.node("Conv",
                  {g.input("x", {1, 8, 12, 12}), g.weight("w", {8, 8, 3, 3}), g.weight("b", {8})},
                  {{"pads", ints({1, 1, 1, 1})}}, "conv"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.conv.source",
    .value = "native",
    .shows = "the Conv runs kiln's direct kernel instead of a cuDNN engine",
    .backend = "cuda",
    .graph = convWithBias,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").tactic, "cudnn");
          EXPECT_EQ(changed.layer("conv").tactic, "kiln.conv");
        },
});

// x [2, 16, 10, 10] -> depthwise Conv 3x3 (group 16, pads 1) with a bias; NHWC by default.
ir::Graph depthwiseConv() {
  GraphSketch g;
  g.output(g.node(
      "Conv", {g.input("x", {2, 16, 10, 10}), g.weight("w", {16, 1, 3, 3}), g.weight("b", {16})},
      {{"pads", ints({1, 1, 1, 1})}, {"group", ir::Attribute{int64_t{16}}}}, "dw"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.conv.depthwise",
    .value = "source",
    .shows = "the depthwise convolution runs a cuDNN engine (cuda.conv.source's) instead of "
             "kiln's depthwise kernel",
    .backend = "cuda",
    .graph = depthwiseConv,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("dw").tactic, "kiln.conv.depthwise.window");
          EXPECT_EQ(changed.layer("dw").tactic, "cudnn");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.conv.depthwise.window",
    .value = "loads",
    .shows = "the 3x3 depthwise convolution runs kiln's direct depthwise kernel (every tap loaded "
             "for every output) instead of the window kernel",
    .backend = "cuda",
    .graph = depthwiseConv,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("dw").tactic, "kiln.conv.depthwise.window");
          EXPECT_EQ(changed.layer("dw").tactic, "kiln.conv.depthwise");
        },
});

struct DepthwiseLaunchEffect {
  const char* knob;
  const char* value;
  const char* baseRoute;
  const char* baseTactic;
  const char* tactic;
};

[[maybe_unused]] const int kDepthwiseLaunchEffects = [] {
  const char* loads = "-cuda.conv.depthwise.window=loads";
  for (const DepthwiseLaunchEffect effect : std::vector<DepthwiseLaunchEffect>{
           {"cuda.conv.depthwise.pixels", "2", loads, "kiln.conv.depthwise",
            "kiln.conv.depthwise.px2"},
           {"cuda.conv.depthwise.pixels", "4", loads, "kiln.conv.depthwise",
            "kiln.conv.depthwise.px4"},
           {"cuda.conv.depthwise.block", "128", "", "kiln.conv.depthwise.window",
            "kiln.conv.depthwise.window.block128"},
           {"cuda.conv.depthwise.block", "512", "", "kiln.conv.depthwise.window",
            "kiln.conv.depthwise.window.block512"},
           {"cuda.conv.depthwise.block", "occupancy", "", "kiln.conv.depthwise.window",
            "kiln.conv.depthwise.window.occupancy"},
           {"cuda.conv.depthwise.window.registers", "56", "", "kiln.conv.depthwise.window",
            "kiln.conv.depthwise.window.regs56"},
           {"cuda.conv.depthwise.window.pixels", "8", "", "kiln.conv.depthwise.window",
            "kiln.conv.depthwise.window.px8"},
           {"cuda.conv.depthwise.window.pixels", "4", "", "kiln.conv.depthwise.window",
            "kiln.conv.depthwise.window.px4"},
           {"cuda.conv.depthwise.window.pixels", "2", "", "kiln.conv.depthwise.window",
            "kiln.conv.depthwise.window.px2"}}) {
    const std::string baseTactic = effect.baseTactic;
    const std::string tactic = effect.tactic;
    registerKnobEffect({
        .knob = effect.knob,
        .value = effect.value,
        .shows = "kiln's depthwise kernel launches as " + tactic +
                 " names (pixels a thread, threads a block) instead of " + baseTactic +
                 "'s defaults",
        .backend = "cuda",
        .graph = depthwiseConv,
        .baseRoute = effect.baseRoute,
        .expect =
            [baseTactic, tactic](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer("dw").tactic, baseTactic);
              EXPECT_EQ(changed.layer("dw").tactic, tactic);
            },
    });
  }
  return 0;
}();

[[maybe_unused]] const int kNativeBlockEffects = [] {
  for (const char* threads : {"128", "512"}) {
    const std::string detail = std::string("kiln's direct kernel, ") + threads + "-thread blocks";
    registerKnobEffect({
        .knob = "cuda.conv.native.block",
        .value = threads,
        .shows = "kiln's direct convolution kernel launches " + std::string(threads) +
                 "-thread blocks instead of 256-thread ones",
        .backend = "cuda",
        .graph = convWithBias,
        .baseRoute = "-cuda.conv.source=native",
        .expect =
            [detail](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.layer("conv").detail, "kiln's direct kernel, 256-thread blocks");
              EXPECT_EQ(changed.layer("conv").detail, detail);
            },
    });
  }
  return 0;
}();

// auto moves two elements a thread: 8 bytes of float32 (the graph as it is), 4 of float16.
[[maybe_unused]] const int kDepthwiseVectorEffects = [] {
  struct VectorEffect {
    const char* bytes;
    const char* baseRoute;
    const char* baseBytes;
  };
  for (const VectorEffect effect :
       {VectorEffect{"16", "-cuda.precision=fp16", "4"},
        VectorEffect{"8", "-cuda.precision=fp16", "4"}, VectorEffect{"4", "", "8"}}) {
    const std::string detail = "kiln's depthwise window kernel, 2 px a thread, 256-thread blocks, ";
    const std::string runs = std::string("runs of up to ") + effect.bytes + " bytes";
    const std::string baseRuns = std::string("runs of up to ") + effect.baseBytes + " bytes";
    registerKnobEffect({
        .knob = "cuda.conv.depthwise.vector",
        .value = effect.bytes,
        .shows = "kiln's depthwise kernel moves channel " + runs + " a thread instead of " +
                 effect.baseBytes + " (two elements)",
        .backend = "cuda",
        .graph = depthwiseConv,
        .baseRoute = effect.baseRoute,
        .expect =
            [detail, runs, baseRuns](const BuildSnapshot& base, const BuildSnapshot& changed) {
              // 2 px a thread: auto's choice for a plane this small (fewer than 2^17 threads).
              EXPECT_EQ(base.layer("dw").detail, detail + baseRuns);
              EXPECT_EQ(changed.layer("dw").detail, detail + runs);
            },
    });
  }
  return 0;
}();

KILN_KNOB_EFFECT({
    .knob = "cuda.conv.algo",
    .value = "timed",
    .shows = "the cuDNN engine is the fastest of up to eight timed when the plan is prepared, "
             "not the heuristics' first",
    .backend = "cuda",
    .graph = convWithBias,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").tactic, "cudnn");
          EXPECT_EQ(changed.layer("conv").tactic, "cudnn.timed");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.conv.epilogue",
    .value = "separate",
    .shows = "the bias is added by kiln's epilogue kernel after the bare cuDNN convolution, not "
             "inside cuDNN's graph",
    .backend = "cuda",
    .graph = convWithBias,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").tactic, "cudnn");
          EXPECT_EQ(changed.layer("conv").tactic, "cudnn+epilogue");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.precision",
    .value = "fp16",
    .shows = "the Conv stays on cuDNN but reads and writes float16 (float math, tensor cores), "
             "with casts at its input and output",
    .backend = "cuda",
    .graph = convWithBias,
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").precision, "fp32");
          EXPECT_EQ(changed.layer("conv").precision, "fp16");
          EXPECT_EQ(changed.layer("conv").tactic, "cudnn");
          EXPECT_EQ(changed.layersOf("Cast").size(), 2u);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.precision",
    .value = "tf32",
    .shows = "the Conv's cuDNN engines may use TF32 tensor cores; no types change",
    .backend = "cuda",
    .graph = convWithBias,
    .tolerance = 1e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").precision, "fp32");
          EXPECT_EQ(changed.layer("conv").precision, "tf32");
          EXPECT_EQ(changed.layer("conv").tactic, "cudnn");
          EXPECT_FALSE(changed.hasOp("Cast"));
        },
});

[[maybe_unused]] const int kEpilogueBlockEffects = [] {
  for (const char* threads : {"128", "512", "1024"}) {
    const std::string blocks = std::string("an epilogue kernel of ") + threads + "-thread blocks";
    registerKnobEffect({
        .knob = "cuda.conv.epilogue.block",
        .value = threads,
        .shows = "with the bias left to kiln's epilogue kernel (cuda.conv.epilogue=separate), "
                 "that kernel launches " +
                 std::string(threads) + "-thread blocks instead of 256-thread ones",
        .backend = "cuda",
        .graph = convWithBias,
        .baseRoute = "-cuda.conv.epilogue=separate",
        .expect =
            [blocks](const BuildSnapshot& base, const BuildSnapshot& changed) {
              const std::string& before = base.layer("conv").detail;
              const std::string& after = changed.layer("conv").detail;
              EXPECT_NE(before.find("an epilogue kernel of 256-thread blocks"), std::string::npos)
                  << before;
              EXPECT_NE(after.find(blocks), std::string::npos) << after;
            },
    });
  }
  return 0;
}();

[[maybe_unused]] const int kPadChannelEffects = [] {
  for (const char* multiple : {"4", "8"}) {
    registerKnobEffect({
        .knob = "cuda.conv.pad_channels",
        .value = multiple,
        .shows = std::string("a 3-channel stem convolution reads its input zero-padded to ") +
                 multiple + " channels (a Pad before it), with the same result",
        .backend = "cuda",
        .graph =
            [] {
              GraphSketch g;
              g.output(g.node(
                  "Conv",
                  {g.input("x", {2, 3, 16, 16}), g.weight("w", {8, 3, 3, 3}), g.weight("b", {8})},
                  {{"pads", ints({1, 1, 1, 1})}, {"strides", ints({2, 2})}}, "stem"));
              return g.take();
            },
        .expect =
            [multiple](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_FALSE(base.hasOp("Pad")) << base.summary();
              EXPECT_EQ(changed.layer("stem_pad_channels").op, "Pad");
              EXPECT_NE(changed.ir.find(std::string("float32[2,16,16,") + multiple + "]"),
                        std::string::npos)
                  << changed.ir;
              EXPECT_EQ(changed.layer("stem").op, "kiln.NhwcConv");
            },
    });
  }
  return 0;
}();

}  // namespace
}  // namespace kiln::testing
#endif
