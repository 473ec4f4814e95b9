// Effects of the CUDA backend's plan-level knobs: CUDA graphs, the timing cache, memory planning,
// aliases, in-place kernels and the host fallback. Lowering needs no GPU, so the differences in the
// plans show anywhere; outputs are compared where a GPU is present.
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "graph_sketch.h"
#include "knob_effects.h"
#include "planner_graphs.h"

namespace kiln::testing {
namespace {

// x -> Relu -> Exp -> Neg -> Sigmoid, 4 KiB a value.
ir::Graph unaryChain() {
  GraphSketch g;
  auto a = g.node("Relu", {g.input("x", {1024})}, {}, "a");
  auto b = g.node("Exp", {a}, {}, "b");
  auto c = g.node("Neg", {b}, {}, "c");
  g.output(g.node("Sigmoid", {c}, {}, "d"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.graphs",
    .value = "off",
    .shows = "runs launch each kernel from the host instead of replaying a captured CUDA graph",
    .backend = "cuda",
    .graph = unaryChain,
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.execution, "graph");
          EXPECT_EQ(changed.execution, "steps");
        },
});

// x [2, 8, 12, 12] -> Conv 3x3 -> Conv 3x3 (pads 1, other weights): two layers of one problem.
ir::Graph twinConvs() {
  GraphSketch g;
  auto first = g.node("Conv", {g.input("x", {2, 8, 12, 12}), g.weight("w1", {8, 8, 3, 3})},
                      {{"pads", ints({1, 1, 1, 1})}}, "conv1");
  g.output(g.node("Conv", {first, g.weight("w2", {8, 8, 3, 3})}, {{"pads", ints({1, 1, 1, 1})}},
                  "conv2"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.timing_cache",
    .value = "off",
    .shows = "timed convolutions are all timed afresh, none taken from the timing cache (with it, "
             "the second of two identical layers takes the first's choice)",
    .backend = "cuda",
    .graph = twinConvs,
    .baseRoute = "-cuda.conv.algo=timed",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.timingCache, "on");
          EXPECT_EQ(changed.timingCache, "off");
          if (base.outputs.empty()) return;  // no GPU: nothing was prepared
          // With the cache, at most the first layer is timed (none, if an earlier build in this
          // process timed the problem); without it, both are.
          EXPECT_GE(base.timingHits, 1);
          EXPECT_LE(base.timingMisses, 1);
          EXPECT_EQ(changed.timingHits, 0);
          EXPECT_EQ(changed.timingMisses, 2);
        },
});

// x -> Exp, Neg, Sigmoid, Abs (four branches) -> Sum: 4 KiB values.
ir::Graph fourBranches() {
  GraphSketch g;
  auto x = g.input("x", {1024});
  std::vector<std::string> branches;
  for (const char* op : {"Exp", "Neg", "Sigmoid", "Abs"})
    branches.push_back(g.node(op, {x}, {}, op));
  g.output(g.node("Sum", branches, {}, "sum"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.streams",
    .value = "2",
    .shows = "of four branches, the second runs on an auxiliary stream; the Sum waits for it",
    .backend = "cuda",
    .graph = fourBranches,
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.streams, 1);
          EXPECT_EQ(changed.streams, 2);
          EXPECT_EQ(changed.layer("Exp").stream, 0);
          EXPECT_EQ(changed.layer("Neg").stream, 1);
          EXPECT_EQ(changed.layer("Sigmoid").stream, 0);
          EXPECT_EQ(changed.layer("sum").stream, 0);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.streams",
    .value = "4",
    .shows = "each of four branches runs on a stream of its own",
    .backend = "cuda",
    .graph = fourBranches,
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.streams, 1);
          EXPECT_EQ(changed.streams, 4);
          EXPECT_EQ(changed.layer("Exp").stream, 0);
          EXPECT_EQ(changed.layer("Neg").stream, 1);
          EXPECT_EQ(changed.layer("Sigmoid").stream, 2);
          EXPECT_EQ(changed.layer("Abs").stream, 3);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.graphs.upload",
    .value = "on",
    .shows = "the plan's CUDA graph is uploaded to the device when the plan is built, not at its "
             "first launch",
    .backend = "cuda",
    .graph = fourBranches,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.execution, "graph");
          EXPECT_EQ(changed.execution, "graph, uploaded when built");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.streams.priority",
    .value = "branches",
    .shows = "with two streams, the auxiliary one (the second branch's) runs at the device's "
             "highest priority",
    .backend = "cuda",
    .graph = fourBranches,
    .baseRoute = "-fusion.eltwise_chain=off -cuda.streams=2",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.streamPriority, "equal");
          EXPECT_EQ(changed.streamPriority, "branches");
          EXPECT_EQ(changed.streams, 2);
          EXPECT_EQ(changed.layer("Neg").stream, 1);
        },
});

[[maybe_unused]] const int kAlignmentEffects = [] {
  for (const char* bytes : {"1024", "4096"}) {
    registerKnobEffect({
        .knob = "cuda.memory.alignment",
        .value = bytes,
        .shows = std::string("three live 1200-byte values take ") + bytes +
                 "-byte aligned ranges of the arena instead of 256-byte ones",
        .backend = "cuda",
        .graph =
            [] {
              // x [1, 300] -> a, b, then a + b: a and b are live together, beside x.
              GraphSketch g;
              auto x = g.input("x", {1, 300});
              auto a = g.node("Exp", {x}, {}, "a");
              auto b = g.node("Neg", {x}, {}, "b");
              g.output(g.node("Add", {a, b}, {}, "sum"));
              return g.take();
            },
        .baseRoute = "-fusion.eltwise_chain=off -cuda.memory.in_place=off",
        .expect =
            [bytes](const BuildSnapshot& base, const BuildSnapshot& changed) {
              const int64_t alignment = std::stoll(bytes);
              EXPECT_EQ(base.arenaBytes % 256, 0);
              EXPECT_EQ(changed.arenaBytes % alignment, 0) << changed.arenaBytes;
              // At least x, a and b (the sum may reuse x's range) each take a whole unit.
              EXPECT_GE(changed.arenaBytes, 3 * alignment);
              EXPECT_LT(base.arenaBytes, changed.arenaBytes);
            },
    });
  }
  return 0;
}();

[[maybe_unused]] const int kL2PersistEffects = [] {
  for (const char* buffer : {"arena", "weights"}) {
    registerKnobEffect({
        .knob = "cuda.l2.persist",
        .value = buffer,
        .shows = std::string("the plan's stream marks its accesses to the ") + buffer +
                 " as persisting in L2 (on a GPU: a window over the buffer)",
        .backend = "cuda",
        .graph = twinConvs,
        .expect =
            [buffer](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.l2Persist, "off");
              EXPECT_EQ(changed.l2Persist, buffer);
              EXPECT_EQ(base.l2WindowBytes, 0);
              if (changed.outputs.empty()) return;  // no GPU: nothing was prepared
              // The H200 (every GPU since sm_80) has persisting L2; the window covers the
              // buffer, which is far below the largest window.
              EXPECT_GT(changed.l2WindowBytes, 0);
              if (std::string(buffer) == "arena") {
                EXPECT_EQ(changed.l2WindowBytes, changed.arenaBytes);
              }
            },
    });
  }
  return 0;
}();

[[maybe_unused]] const int kL2LimitEffects = [] {
  for (const char* limit : {"half", "quarter"}) {
    registerKnobEffect({
        .knob = "cuda.l2.persist.limit",
        .value = limit,
        .shows = std::string("with the weights persisting in L2, the plan asks for ") + limit +
                 " the device's largest set-aside (on a GPU the window still covers the weights)",
        .backend = "cuda",
        .graph = twinConvs,
        .baseRoute = "-cuda.l2.persist=weights",
        .expect =
            [limit](const BuildSnapshot& base, const BuildSnapshot& changed) {
              EXPECT_EQ(base.l2Limit, "max");
              EXPECT_EQ(changed.l2Limit, limit);
              EXPECT_EQ(changed.l2Persist, "weights");
              if (changed.outputs.empty()) return;  // no GPU: nothing was prepared
              EXPECT_GT(changed.l2WindowBytes, 0);
              EXPECT_EQ(changed.l2WindowBytes, base.l2WindowBytes);
            },
    });
  }
  return 0;
}();

KILN_KNOB_EFFECT({
    .knob = "cuda.memory.planner",
    .value = "naive",
    .shows = "every value gets its own arena range: five 4 KiB values take 20 KiB, not 8",
    .backend = "cuda",
    .graph = unaryChain,
    .baseRoute = "-cuda.memory.in_place=off -fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.arenaBytes, 2 * 4096);
          EXPECT_EQ(changed.arenaBytes, 5 * 4096);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.memory.order",
    .value = "time",
    .shows = "placing device values in the order they are defined instead of largest first "
             "changes the arena of a Pad -> Slice chain: 8 ranges of 256 bytes instead of 7",
    .backend = "cuda",
    .graph = [] { return padThenSlice(64); },
    .baseRoute = "-cuda.memory.in_place=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.arenaBytes, 7 * 256) << base.summary();
          EXPECT_EQ(changed.arenaBytes, 8 * 256) << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.memory.fit",
    .value = "best",
    .shows = "placing each device value in the smallest gap that holds it instead of the lowest "
             "gives this graph 15 ranges of 256 bytes instead of 13 (best fit is not always "
             "better)",
    .backend = "cuda",
    .graph = [] { return fitChooser(64); },
    .baseRoute = "-cuda.memory.in_place=off -fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.arenaBytes, 13 * 256) << base.summary();
          EXPECT_EQ(changed.arenaBytes, 15 * 256) << changed.summary();
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.memory.in_place",
    .value = "off",
    .shows = "elementwise kernels write fresh buffers instead of over their input: x, Exp(x), "
             "Neg(.) and Add(., x) need three 4 KiB buffers at once instead of two",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto x = g.input("x", {1024});
          auto b = g.node("Neg", {g.node("Exp", {x}, {}, "a")}, {}, "b");
          g.output(g.node("Add", {b, x}, {}, "c"));
          return g.take();
        },
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          // The graph input is never written over (timing loops upload it once).
          EXPECT_EQ(base.arenaBytes, 2 * 4096);
          EXPECT_EQ(changed.arenaBytes, 3 * 4096);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.memory.alias_reshapes",
    .value = "off",
    .shows = "a Reshape becomes a copy kernel instead of a second name for its input's buffer",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto shape = g.constant("shape", ir::Tensor::fromVector<int64_t>(ir::Shape{2}, {8, 8}));
          auto r = g.node("Reshape", {g.node("Exp", {g.input("x", {64})}, {}, "exp"), shape}, {},
                          "reshape");
          g.output(g.node("Neg", {r}, {}, "neg"));
          return g.take();
        },
    .baseRoute = "-fusion.eltwise_chain=off",
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_FALSE(base.hasOp("Reshape"));
          EXPECT_TRUE(changed.hasOp("Reshape"));
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.host_fallback",
    .value = "off",
    .shows = "an op with no GPU kernel fails the build instead of running on the host",
    .backend = "cuda",
    .graph =
        [] {
          // LpPool has no GPU kernel (so far; when it gets one, pick another such op here).
          GraphSketch g;
          auto x = g.input("x", {1, 2, 3, 3});
          g.output(g.node("LpPool", {x},
                          {{"kernel_shape", ir::Attribute{std::vector<int64_t>{2, 2}}},
                           {"p", ir::Attribute{int64_t{2}}}},
                          "pool"));
          return g.take();
        },
    .expectBuildError = "no kernel for 'LpPool' (and cuda.host_fallback is off)",
});

// x [8,16] -> MatMul(w) -> Softmax -> MatMul(w2): the products and the normalisation precision
// knobs act on.
ir::Graph productSoftmaxProduct() {
  GraphSketch g;
  auto m = g.node("MatMul", {g.input("x", {8, 16}), g.weight("w", {16, 32})}, {}, "mm1");
  auto p = g.node("Softmax", {m}, {{"axis", ir::Attribute{int64_t{-1}}}}, "softmax");
  g.output(g.node("MatMul", {p, g.weight("w2", {32, 4})}, {}, "mm2"));
  return g.take();
}

KILN_KNOB_EFFECT({
    .knob = "cuda.precision",
    .value = "fp16",
    .shows = "the MatMuls and the Softmax run in fp16 (weights converted at build time), with "
             "casts at the region's edges only",
    .backend = "cuda",
    .graph = productSoftmaxProduct,
    .baseRoute = "-fusion.attention=off",
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mm1").precision, "fp32");
          EXPECT_EQ(changed.layer("mm1").precision, "fp16");
          EXPECT_EQ(changed.layer("mm2").precision, "fp16");
          EXPECT_EQ(changed.layer("softmax").precision, "fp16");
          EXPECT_FALSE(base.hasOp("Cast"));
          // x in, mm2 out.
          EXPECT_EQ(changed.layersOf("Cast").size(), 2u);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.precision",
    .value = "bf16",
    .shows = "the MatMuls run in bfloat16, with casts at the region's edges",
    .backend = "cuda",
    .graph = productSoftmaxProduct,
    .baseRoute = "-fusion.attention=off",
    .tolerance = 5e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mm2").precision, "fp32");
          EXPECT_EQ(changed.layer("mm1").precision, "bf16");
          EXPECT_EQ(changed.layer("mm2").precision, "bf16");
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.precision",
    .value = "tf32",
    .shows = "the MatMuls may use TF32 tensor cores; no types change and no casts appear",
    .backend = "cuda",
    .graph = productSoftmaxProduct,
    .baseRoute = "-fusion.attention=off",
    .tolerance = 1e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("mm1").precision, "fp32");
          EXPECT_EQ(changed.layer("mm1").precision, "tf32");
          EXPECT_EQ(changed.layer("softmax").precision, "fp32");
          EXPECT_FALSE(changed.hasOp("Cast"));
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.precision.norm_fp32",
    .value = "on",
    .shows = "under fp16 the Softmax keeps float32 storage, with a cast on each side of it",
    .backend = "cuda",
    .graph = productSoftmaxProduct,
    .baseRoute = "-fusion.attention=off -cuda.precision=fp16",
    .tolerance = 2e-2,
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_EQ(base.layer("softmax").precision, "fp16");
          EXPECT_EQ(base.layersOf("Cast").size(), 2u);
          EXPECT_EQ(changed.layer("softmax").precision, "fp32");
          EXPECT_EQ(changed.layersOf("Cast").size(), 4u);
        },
});

KILN_KNOB_EFFECT({
    .knob = "cuda.layout",
    .value = "nchw",
    .shows = "the Conv -> Relu -> MaxPool chain stays in ONNX's NCHW instead of channels-last "
             "(cuDNN's NHWC convolution, kiln's NHWC pool, transposes at the chain's edges)",
    .backend = "cuda",
    .graph =
        [] {
          GraphSketch g;
          auto c = g.node(
              "Conv",
              {g.input("x", {1, 8, 12, 12}), g.weight("w", {16, 8, 3, 3}), g.weight("b", {16})},
              {{"pads", ir::Attribute{std::vector<int64_t>{1, 1, 1, 1}}}}, "conv");
          auto r = g.node("Relu", {c}, {}, "relu");
          g.output(g.node("MaxPool", {r},
                          {{"kernel_shape", ir::Attribute{std::vector<int64_t>{2, 2}}},
                           {"strides", ir::Attribute{std::vector<int64_t>{2, 2}}}},
                          "pool"));
          return g.take();
        },
    .expect =
        [](const BuildSnapshot& base, const BuildSnapshot& changed) {
          EXPECT_TRUE(changed.hasOp("kiln.FusedConv"));
          EXPECT_FALSE(changed.hasOp("Transpose"));
          ASSERT_TRUE(base.hasOp("kiln.NhwcConv"));
          EXPECT_EQ(base.layersOf("kiln.NhwcConv")[0]->layout, "nhwc");
          EXPECT_TRUE(base.hasOp("kiln.NhwcMaxPool"));
          EXPECT_EQ(base.layersOf("Transpose").size(), 2u);
        },
});

}  // namespace
}  // namespace kiln::testing
#endif
