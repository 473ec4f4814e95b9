// Effects of the CUDA precision-placement knobs (precision.cc) under fp16: which kinds of node
// stay in float32 while the rest run reduced. Lowering records each step's precision, so the
// differences show without a GPU; outputs are compared where one is present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

constexpr const char* kFp16 = "-cuda.precision=fp16 -fusion.eltwise_chain=off";

KILN_KNOB_EFFECT({
    .knob = "cuda.precision.reduce_fp32",
    .value = "on",
    .shows = "under fp16 a ReduceMean after a MatMul reads and writes float32 (a Cast between "
             "them) while the MatMul stays float16",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto product =
              g.node("MatMul", {g.input("x", {8, 32}), g.weight("w", {32, 16})}, {}, "mm");
          g.output(g.node("ReduceMean", {product, g.constant("axes", axes({1}))}, {}, "mean"));
          return g.take();
        },
    .baseRoute = kFp16,
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mean").precision, "fp16");
          EXPECT_EQ(changed.layer("mean").precision, "fp32");
          EXPECT_EQ(changed.layer("mm").precision, "fp16");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.precision.eltwise_fp32",
    .value = "on",
    .shows = "under fp16 an Exp before a MatMul stays float32 while the MatMul runs float16",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto e = g.node("Exp", {g.input("x", {8, 32})}, {}, "exp");
          g.output(g.node("MatMul", {e, g.weight("w", {32, 16})}, {}, "mm"));
          return g.take();
        },
    .baseRoute = kFp16,
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("exp").precision, "fp16");
          EXPECT_EQ(changed.layer("exp").precision, "fp32");
          EXPECT_EQ(changed.layer("mm").precision, "fp16");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.precision.products_fp32",
    .value = "on",
    .shows = "under fp16 a MatMul stays float32 while the Exp after it runs float16",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto product =
              g.node("MatMul", {g.input("x", {8, 32}), g.weight("w", {32, 16})}, {}, "mm");
          g.output(g.node("Exp", {product}, {}, "exp"));
          return g.take();
        },
    .baseRoute = kFp16,
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mm").precision, "fp16");
          EXPECT_EQ(changed.layer("mm").precision, "fp32");
          EXPECT_EQ(changed.layer("exp").precision, "fp16");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.precision.attention_fp32",
    .value = "on",
    .shows = "under fp16 a kiln.Attention stays float32 (and so takes the unfused kernels, not "
             "the reduced-only flash one) while the MatMul after it runs float16",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto attention =
              g.node("Attention",
                     {g.input("q", {1, 2, 40, 32}), g.input("k", {1, 2, 70, 32}),
                      g.input("v", {1, 2, 70, 32})},
                     {{"scale", ir::Attribute{0.17f}}, {"transpose_k", ir::Attribute{int64_t{1}}}},
                     "attn", ir::kKilnDomain);
          g.output(g.node("MatMul", {attention, g.weight("w", {32, 16})}, {}, "mm"));
          return g.take();
        },
    .baseRoute = kFp16,
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("attn").precision, "fp16");
          EXPECT_EQ(base.layer("attn").tactic, "kiln.attention.flash");
          EXPECT_EQ(changed.layer("attn").precision, "fp32");
          EXPECT_EQ(changed.layer("attn").tactic, "kiln.attention.unfused");
          EXPECT_EQ(changed.layer("mm").precision, "fp16");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.precision.outputs_fp32",
    .value = "on",
    .shows = "under fp16 the MatMul that writes the graph's output runs float32 while the one "
             "before it runs float16",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto first =
              g.node("MatMul", {g.input("x", {8, 32}), g.weight("w1", {32, 16})}, {}, "first");
          g.output(g.node("MatMul", {first, g.weight("w2", {16, 4})}, {}, "last"));
          return g.take();
        },
    .baseRoute = kFp16,
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("last").precision, "fp16");
          EXPECT_EQ(changed.layer("last").precision, "fp32");
          EXPECT_EQ(changed.layer("first").precision, "fp16");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.precision.inputs_fp32",
    .value = "on",
    .shows = "under fp16 the MatMul that reads the graph's input runs float32 while the one after "
             "it runs float16",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto first =
              g.node("MatMul", {g.input("x", {8, 32}), g.weight("w1", {32, 16})}, {}, "first");
          g.output(g.node("MatMul", {first, g.weight("w2", {16, 4})}, {}, "last"));
          return g.take();
        },
    .baseRoute = kFp16,
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("first").precision, "fp16");
          EXPECT_EQ(changed.layer("first").precision, "fp32");
          EXPECT_EQ(changed.layer("last").precision, "fp16");
        },
});

}  // namespace
}  // namespace kiln::testing
#endif
