// Effects of the convolution scheduling knobs of round two: cpu.onednn.split, how the oneDNN step
// (kernels/conv_onednn.cc) slices one convolution over the plan's threads, and
// cpu.onednn.weights, the format of its primitives' weights. The knob exists only in
// builds with oneDNN. (The cpu.gemm.* options reaching native convolutions' GEMMs are shown by
// tests/unit/cpu_conv2_knobs_test.cc.)
#if KILN_HAVE_ONEDNN
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// x [1, 16, 7, 6] -> Conv 3x3 (pads 1, bias) to 40 channels: three channel blocks of 16 and
// seven output rows, so that at 2 threads either split gives each thread a slice.
ir::Graph conv3x3() {
  GraphSketch g;
  g.output(g.node("Conv",
                  {g.input("x", {1, 16, 7, 6}), g.weight("w", {40, 16, 3, 3}), g.weight("b", {40})},
                  {{"pads", ints({1, 1, 1, 1})}}, "conv"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cpu.onednn.split",
    .value = "channels",
    .shows = "in an NHWC graph at 2 threads, the oneDNN convolution is sliced into two runs of "
             "output channels instead of two runs of output rows",
    .graph = conv3x3,
    .baseRoute = "-cpu.threads=2",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").layout, "nhwc") << base.summary();
          EXPECT_TRUE(base.layer("conv").tactic.starts_with("onednn.")) << base.summary();
          EXPECT_EQ(base.layer("conv").tactic.find(".split_"), std::string::npos);
          EXPECT_TRUE(changed.layer("conv").tactic.ends_with(".split_channels_x2"))
              << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.onednn.split",
    .value = "rows",
    .shows = "in an NCHW graph at 2 threads, the oneDNN convolution is sliced into two runs of "
             "output rows instead of two runs of output channels",
    .graph = conv3x3,
    .baseRoute = "-graph.layout=nchw -cpu.threads=2",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").layout, "nchw") << base.summary();
          EXPECT_TRUE(base.layer("conv").tactic.starts_with("onednn.")) << base.summary();
          EXPECT_EQ(base.layer("conv").tactic.find(".split_"), std::string::npos);
          EXPECT_TRUE(changed.layer("conv").tactic.ends_with(".split_rows_x2"))
              << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.onednn.split",
    .value = "none",
    .shows = "at 2 threads, the whole oneDNN convolution is one primitive run on the calling "
             "thread instead of one slice a thread",
    .graph = conv3x3,
    .baseRoute = "-cpu.threads=2",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_TRUE(base.layer("conv").tactic.starts_with("onednn.")) << base.summary();
          EXPECT_EQ(base.layer("conv").tactic.find(".split_"), std::string::npos);
          EXPECT_TRUE(changed.layer("conv").tactic.ends_with(".split_none_x1"))
              << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "cpu.onednn.weights",
    .value = "plain",
    .shows = "in an NHWC graph, the oneDNN primitive reads its weights as the graph's hwio "
             "instead of reordered into oneDNN's blocked format",
    .graph = conv3x3,
    .baseRoute = "",  // the defaults: oneDNN convolutions in an NHWC graph
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("conv").layout, "nhwc") << base.summary();
          EXPECT_TRUE(base.layer("conv").tactic.starts_with("onednn.")) << base.summary();
          EXPECT_EQ(base.layer("conv").tactic.find(".weights_plain"), std::string::npos);
          EXPECT_TRUE(changed.layer("conv").tactic.starts_with("onednn.")) << changed.summary();
          EXPECT_TRUE(changed.layer("conv").tactic.ends_with(".weights_plain"))
              << changed.summary();
        },
});

}  // namespace
}  // namespace kiln::testing

#endif  // KILN_HAVE_ONEDNN
