// The CPU backend's data-movement kernels (cpu.datamove.impl: copies, Concat, Split, Slice,
// Expand, Tile, Pad, Gather, Where, Cast, Resize) and reductions (cpu.reduce.impl) against the
// reference kernels they replace: each case builds a one-node graph with the family's knob at
// "fast" and at "reference" and compares the plans' tactics and outputs. Data movement must be
// bit-exact; reductions agree within 1e-5 relative (only the association of sums differs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kiln/backends/cpu/kernels/datamove.h"
#include "kiln/engine/builder.h"
#include "op_test_util.h"

namespace kiln::testing {
namespace {

using ir::Attribute;
using ir::DType;
using ir::Shape;
using ir::Tensor;

using Attributes = std::map<std::string, Attribute>;

// Passes that would remove or rewrite the single node under test (an Identity, a Reshape that
// would become an alias of its input) are off in every build here.
constexpr const char* kIsolate =
    " -graph.eliminate_identity=off -graph.eliminate_noops=off -cpu.memory.alias_reshapes=off";

Tensor randomFloats(Shape shape, unsigned seed, float low = -3, float high = 3) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(static_cast<size_t>(shape.elementCount()));
  for (float& v : values) v = uniform(rng);
  return Tensor::fromVector<float>(std::move(shape), values);
}

template <typename T>
Tensor sequence(Shape shape, T start = T{0}) {
  std::vector<T> values(static_cast<size_t>(shape.elementCount()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<T>(start + static_cast<T>(i));
  return Tensor::fromVector<T>(std::move(shape), values);
}

Tensor randomBools(Shape shape, unsigned seed) {
  std::mt19937 rng(seed);
  Tensor t(DType::kBool, shape);
  for (bool& b : t.mutableData<bool>()) b = (rng() & 1) != 0;
  return t;
}

Tensor int64s(Shape shape, std::vector<int64_t> values) {
  return Tensor::fromVector<int64_t>(std::move(shape), values);
}
Tensor int64s(std::vector<int64_t> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return int64s(Shape{n}, std::move(values));
}

OpInput runtime(Tensor t) { return {std::move(t), false}; }
OpInput constant(Tensor t) { return {std::move(t), true}; }
OpInput omitted() { return {}; }

struct PlanRun {
  bool built = false;
  std::string tactic;  // the op's step ("" when no step runs it)
  Status status;       // of the run
  std::vector<Tensor> outputs;
};

PlanRun buildAndRun(const std::string& route, const std::string& opType,
                    const std::vector<OpInput>& inputs, const Attributes& attributes, int opset,
                    int outputCount) {
  BuilderConfig config;
  Status routed = config.setBuildRoute(route);
  EXPECT_TRUE(routed.isOk()) << routed.toString();
  auto build = buildCpu(makeSingleOpGraph(opType, inputs, attributes, opset, outputCount), config);
  EXPECT_TRUE(build.isOk()) << build.status().toString();
  if (!build.isOk()) return {};
  PlanRun result;
  result.built = true;
  for (const auto& step : build->plan.steps()) {
    if (step->node->opType == opType) result.tactic = step->tactic;
  }
  std::vector<Tensor> runtimeInputs;
  for (const OpInput& input : inputs) {
    if (!input.constant && !input.tensor.empty()) runtimeInputs.push_back(input.tensor);
  }
  auto outputs = build->plan.run(runtimeInputs);
  result.status = outputs.status();
  if (outputs.isOk()) result.outputs = std::move(*outputs);
  return result;
}

// One comparison: the op, its inputs and attributes, the knob and the tactic its fast value must
// choose (empty: the fast family declines and the reference runs both times).
struct Case {
  std::string knob;
  std::string fastTactic;
  std::string op;
  std::vector<OpInput> inputs;
  Attributes attributes;
  int opset = 18;
  int outputs = 1;
  double tolerance = 0;  // relative; 0: bit-exact
  std::string route;     // added to both builds

  Case& atOpset(int value) {
    opset = value;
    return *this;
  }
  Case& withOutputs(int count) {
    outputs = count;
    return *this;
  }
  // Four threads whatever the machine: model-sized cases, and those above a kernel's chunk size
  // (MiBs; the engine tests above split small ones), then run on several threads.
  Case& onFourThreads() {
    route += " -cpu.threads=4";
    return *this;
  }
};

Case move(std::string tactic, std::string op, std::vector<OpInput> inputs,
          Attributes attributes = {}) {
  return {"cpu.datamove.impl", std::move(tactic), std::move(op), std::move(inputs),
          std::move(attributes)};
}

Case reduce(std::string tactic, std::string op, std::vector<OpInput> inputs,
            Attributes attributes = {}) {
  Case c{"cpu.reduce.impl", std::move(tactic), std::move(op), std::move(inputs),
         std::move(attributes)};
  c.tolerance = 1e-5;
  // The eltwise family's last-axis ReduceMean comes first in lowering; off, so that these cases
  // compare this family's loops with the reference kernel on every axis set.
  c.route = " -cpu.eltwise.impl=reference";
  return c;
}

// Builds and runs `c` with the knob at fast and at reference; expects the tactics and identical
// outputs (or the same error).
void expectMatch(const Case& c) {
  SCOPED_TRACE(c.op + " via " + c.knob + c.route);
  const std::string base = std::string(kIsolate) + c.route;
  const PlanRun fast =
      buildAndRun("-" + c.knob + "=fast" + base, c.op, c.inputs, c.attributes, c.opset, c.outputs);
  const PlanRun reference = buildAndRun("-" + c.knob + "=reference" + base, c.op, c.inputs,
                                        c.attributes, c.opset, c.outputs);
  ASSERT_TRUE(fast.built && reference.built);
  EXPECT_EQ(reference.tactic, "reference");
  EXPECT_EQ(fast.tactic, c.fastTactic.empty() ? "reference" : c.fastTactic);
  ASSERT_EQ(fast.status.isOk(), reference.status.isOk())
      << fast.status.toString() << " vs " << reference.status.toString();
  if (!reference.status.isOk()) {
    EXPECT_EQ(fast.status.toString(), reference.status.toString());
    return;
  }
  ASSERT_EQ(fast.outputs.size(), reference.outputs.size());
  for (size_t o = 0; o < fast.outputs.size(); ++o) {
    const Tensor& actual = fast.outputs[o];
    const Tensor& expected = reference.outputs[o];
    ASSERT_EQ(actual.shape(), expected.shape()) << "output " << o;
    ASSERT_EQ(actual.dtype(), expected.dtype()) << "output " << o;
    if (c.tolerance == 0) {
      ASSERT_EQ(std::memcmp(actual.rawData(), expected.rawData(), expected.byteSize()), 0)
          << "output " << o << " differs";
      continue;
    }
    for (int64_t i = 0; i < expected.elementCount(); ++i) {
      const double e = expected.elementAsDouble(i), a = actual.elementAsDouble(i);
      if (std::isnan(e)) {
        EXPECT_TRUE(std::isnan(a)) << "output " << o << " element " << i;
      } else if (std::isinf(e)) {
        EXPECT_EQ(a, e) << "output " << o << " element " << i;
      } else {
        ASSERT_NEAR(a, e, c.tolerance * std::max(1.0, std::fabs(e)))
            << "output " << o << " element " << i;
      }
    }
  }
}

// --- the copy engines, split into small chunks
// ----------------------------------------------------

// The engines split work over threads only for MiBs; these run them directly with 1 KiB chunks
// on four threads, so that chunks start mid-box, mid-row and mid-column-block, and compare with
// element-by-element loops.
TEST(CpuDataMoveEngines, BoxCopierChunksCoverEveryElementOnce) {
  using cpu::datamove::BoxCopier;
  using cpu::datamove::CopyBox;
  // Input [6, 5, 5000] of distinct values; output [6, 8, 5000]: out[:, 0:5] = in, and
  // out[:, 5:8] = in[:, 4:1:-1, ::-1] (rows of 20 KB: column blocks, one with a negative stride).
  // A second output [600, 7] gets in's first 4200 elements in rows of 7 (grouped short rows).
  const int64_t n = 6, c = 5, w = 5000;
  const int64_t inCount = n * c * w, outCount = n * 8 * w, smallCount = 600 * 7;
  std::vector<uint32_t> arena(static_cast<size_t>(inCount + outCount + smallCount), 0);
  for (int64_t i = 0; i < inCount; ++i)
    arena[static_cast<size_t>(i)] = static_cast<uint32_t>(i + 1);
  const std::vector<std::optional<cpu::BufferRef>> inputs = {
      cpu::BufferRef{DType::kUInt32, Shape{n, c, w}, 0}};
  const std::vector<std::optional<cpu::BufferRef>> outputs = {
      cpu::BufferRef{DType::kUInt32, Shape{n, 8, w}, inCount * 4},
      cpu::BufferRef{DType::kUInt32, Shape{600, 7}, (inCount + outCount) * 4}};
  std::vector<CopyBox> boxes = {
      {.dims = {n, c, w}, .src = {c * w, w, 1}, .dst = {8 * w, w, 1}},
      {.dims = {n, 3, w},
       .src = {c * w, -w, -1},
       .dst = {8 * w, w, 1},
       .srcOffset = 4 * w + w - 1,
       .dstOffset = 5 * w},
      {.output = 1, .dims = {600, 7}, .src = {7, 1}, .dst = {7, 1}},
  };
  cpu::ThreadPool pool(4);
  const cpu::ExecutionContext context(reinterpret_cast<std::byte*>(arena.data()), pool);
  BoxCopier(boxes, 4, /*chunkBytes=*/1024).run(context, inputs, outputs);
  const uint32_t* in = arena.data();
  const uint32_t* out = in + inCount;
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t k = 0; k < 8; ++k) {
      for (int64_t x = 0; x < w; ++x) {
        const uint32_t expected =
            k < c ? in[(b * c + k) * w + x] : in[(b * c + 9 - k) * w + (w - 1 - x)];
        ASSERT_EQ(out[(b * 8 + k) * w + x], expected) << b << "," << k << "," << x;
      }
    }
  }
  for (int64_t i = 0; i < smallCount; ++i) ASSERT_EQ(out[outCount + i], in[i]) << i;
}

TEST(CpuDataMoveEngines, AxisGatherChunksMatchElementLoops) {
  // Output [7, 9, 11] from input [4, 5, 6]: per-axis tables that repeat and reverse; in a second
  // case the last table is a contiguous run (a memcpy per row).
  const std::vector<int64_t> inDims = {4, 5, 6};
  const int64_t inCount = 4 * 5 * 6;
  for (bool contiguous : {false, true}) {
    std::vector<std::vector<int64_t>> offsets = {
        {0, 1, 1, 2, 3, 3, 0}, {4, 3, 2, 1, 0, 0, 1, 2, 3}, {0, 1, 2, 3, 4, 5}};
    if (!contiguous) {
      offsets[2].clear();
      for (int64_t x = 0; x < 11; ++x) offsets[2].push_back((x * 7) % 6);
    }
    for (int64_t& o : offsets[0]) o *= 30;
    for (int64_t& o : offsets[1]) o *= 6;
    const int64_t inner = static_cast<int64_t>(offsets[2].size());
    std::vector<uint64_t> in(static_cast<size_t>(inCount));
    for (int64_t i = 0; i < inCount; ++i)
      in[static_cast<size_t>(i)] = static_cast<uint64_t>(i * 31 + 7);
    std::vector<uint64_t> out(static_cast<size_t>(7 * 9 * inner), 0);
    cpu::ThreadPool pool(4);
    cpu::datamove::AxisGather(offsets, 8, /*chunkBytes=*/64)
        .run(reinterpret_cast<const std::byte*>(in.data()),
             reinterpret_cast<std::byte*>(out.data()), pool);
    for (int64_t a = 0; a < 7; ++a) {
      for (int64_t b = 0; b < 9; ++b) {
        for (int64_t x = 0; x < inner; ++x) {
          const int64_t source = offsets[0][static_cast<size_t>(a)] +
                                 offsets[1][static_cast<size_t>(b)] +
                                 offsets[2][static_cast<size_t>(x)];
          ASSERT_EQ(out[static_cast<size_t>((a * 9 + b) * inner + x)],
                    in[static_cast<size_t>(source)])
              << contiguous << ": " << a << "," << b << "," << x;
        }
      }
    }
  }
}

// --- copies ------------------------------------------------------------------------------------

TEST(CpuDataMoveKernels, CopyingShapeOpsMatchReference) {
  const Tensor x = randomFloats(Shape{2, 3, 4}, 1);
  expectMatch(move("fast.copy", "Reshape", {runtime(x), constant(int64s({4, -1}))}));
  expectMatch(move("fast.copy", "Flatten", {runtime(x)}, {{"axis", intAttr(2)}}));
  expectMatch(move("fast.copy", "Squeeze",
                   {runtime(randomFloats(Shape{2, 1, 5}, 2)), constant(int64s({1}))}));
  expectMatch(move("fast.copy", "Unsqueeze", {runtime(x), constant(int64s({0, -1}))}));
  expectMatch(move("fast.copy", "Identity", {runtime(sequence<int64_t>(Shape{7}, -3))}));
  expectMatch(move("fast.copy", "Identity", {runtime(randomBools(Shape{3, 3}, 3))}));
  expectMatch(move("fast.copy", "Dropout", {runtime(x)}));
  // Asking for the mask is the reference kernel's.
  expectMatch(move("", "Dropout", {runtime(x)}).withOutputs(2));
  expectMatch(move("fast.copy", "Reshape",
                   {runtime(randomFloats(Shape{64, 30000}, 4)), constant(int64s({-1}))})
                  .onFourThreads());
}

// --- Concat, Split -----------------------------------------------------------------------------

TEST(CpuDataMoveKernels, ConcatMatchesReferenceOnEveryAxis) {
  const Tensor a = randomFloats(Shape{2, 3, 4, 5}, 10);
  const Tensor b = randomFloats(Shape{2, 3, 4, 5}, 11);
  for (int64_t axis : {0, 1, 2, 3, -1, -3}) {
    expectMatch(move("fast.concat", "Concat", {runtime(a), runtime(b), runtime(a)},
                     {{"axis", intAttr(axis)}}));
  }
  // Unequal extents along the axis, an empty input, a constant input, other dtypes.
  expectMatch(move(
      "fast.concat", "Concat",
      {runtime(randomFloats(Shape{3, 1, 2}, 12)), runtime(Tensor(DType::kFloat32, Shape{3, 0, 2})),
       constant(randomFloats(Shape{3, 5, 2}, 13)), runtime(randomFloats(Shape{3, 2, 2}, 14))},
      {{"axis", intAttr(1)}}));
  expectMatch(
      move("fast.concat", "Concat",
           {runtime(sequence<int64_t>(Shape{4, 3})), runtime(sequence<int64_t>(Shape{4, 1}, 90))},
           {{"axis", intAttr(1)}}));
  expectMatch(move("fast.concat", "Concat",
                   {runtime(randomBools(Shape{5, 3}, 15)), runtime(randomBools(Shape{2, 3}, 16))},
                   {{"axis", intAttr(0)}}));
  expectMatch(move(
      "fast.concat", "Concat",
      {runtime(Tensor::fromVector<float>(Shape{2, 3}, {1, 2, 3, 4, 5, 6}).castTo(DType::kFloat16)),
       runtime(Tensor(DType::kFloat16, Shape{2, 7}))},
      {{"axis", intAttr(-1)}}));
  // Channel concats of SqueezeNet's feature maps, NCHW and NHWC.
  expectMatch(move("fast.concat", "Concat",
                   {runtime(randomFloats(Shape{1, 64, 55, 55}, 17)),
                    runtime(randomFloats(Shape{1, 48, 55, 55}, 18))},
                   {{"axis", intAttr(1)}})
                  .onFourThreads());
  expectMatch(move("fast.concat", "Concat",
                   {runtime(randomFloats(Shape{1, 55, 55, 64}, 19)),
                    runtime(randomFloats(Shape{1, 55, 55, 48}, 20))},
                   {{"axis", intAttr(3)}})
                  .onFourThreads());
}

TEST(CpuDataMoveKernels, SplitMatchesReference) {
  const Tensor x = randomFloats(Shape{4, 6, 10}, 21);
  expectMatch(
      move("fast.split", "Split", {runtime(x), constant(int64s({1, 3, 2}))}, {{"axis", intAttr(1)}})
          .withOutputs(3));
  expectMatch(move("fast.split", "Split", {runtime(x), constant(int64s({7, 0, 3}))},
                   {{"axis", intAttr(-1)}})
                  .withOutputs(3));
  expectMatch(
      move("fast.split", "Split", {runtime(x)}, {{"axis", intAttr(0)}, {"num_outputs", intAttr(2)}})
          .withOutputs(2));
  expectMatch(
      move("fast.split", "Split", {runtime(x)}, {{"axis", intAttr(2)}, {"split", intsAttr({4, 6})}})
          .atOpset(11)
          .withOutputs(2));
  expectMatch(move("fast.split", "Split", {runtime(sequence<int32_t>(Shape{3, 8}))},
                   {{"axis", intAttr(1)}, {"num_outputs", intAttr(3)}})
                  .withOutputs(3));
  // ShuffleNet's channel split of an NCHW map.
  expectMatch(move("fast.split", "Split", {runtime(randomFloats(Shape{1, 232, 56, 56}, 22))},
                   {{"axis", intAttr(1)}, {"num_outputs", intAttr(2)}})
                  .withOutputs(2)
                  .onFourThreads());
}

// --- Slice -------------------------------------------------------------------------------------

TEST(CpuDataMoveKernels, SliceMatchesReferenceWithStepsAndClamping) {
  const Tensor x = randomFloats(Shape{5, 7, 9}, 30);
  struct SliceArgs {
    std::vector<int64_t> starts, ends, axes, steps;
  };
  const std::vector<SliceArgs> slices = {
      {{1}, {4}, {0}, {1}},
      {{0, 2}, {5, -1}, {1, 2}, {2, 3}},
      {{-1}, {-100}, {2}, {-1}},                  // reversed, end clamped
      {{6, 100}, {1, -100}, {-2, -3}, {-2, -2}},  // negative steps, out-of-range starts
      {{-100, 3}, {100, 1000}, {0, 1}, {1, 1}},   // out-of-range starts and ends clamp
      {{3}, {3}, {1}, {1}},                       // empty
      {{4}, {1}, {2}, {1}},                       // empty: start past end
      {{0, 0, 0}, {5, 7, 9}, {0, 1, 2}, {4, 6, 8}},
  };
  for (const SliceArgs& s : slices) {
    expectMatch(move("fast.slice", "Slice",
                     {runtime(x), constant(int64s(s.starts)), constant(int64s(s.ends)),
                      constant(int64s(s.axes)), constant(int64s(s.steps))}));
  }
  // Default axes and steps, int32 parameters, int64 and bool data, opset 9's attributes.
  expectMatch(move("fast.slice", "Slice",
                   {runtime(sequence<int64_t>(Shape{6, 4})),
                    constant(Tensor::fromVector<int32_t>(Shape{2}, {1, 1})),
                    constant(Tensor::fromVector<int32_t>(Shape{2}, {-1, 3}))}));
  expectMatch(move("fast.slice", "Slice",
                   {runtime(randomBools(Shape{8}, 31)), constant(int64s({7})),
                    constant(int64s({0})), omitted(), constant(int64s({-3}))}));
  expectMatch(
      move(
          "fast.slice", "Slice", {runtime(x)},
          {{"starts", intsAttr({1, -4})}, {"ends", intsAttr({3, 100})}, {"axes", intsAttr({0, 2})}})
          .atOpset(9));
  expectMatch(
      move("fast.slice", "Slice",
           {runtime(randomFloats(Shape{1, 64, 112, 112}, 32)), constant(int64s({1, 0})),
            constant(int64s({112, 112})), constant(int64s({2, 3})), constant(int64s({2, 1}))})
          .onFourThreads());
}

// --- Expand, Tile ------------------------------------------------------------------------------

TEST(CpuDataMoveKernels, ExpandMatchesReferenceWithBroadcasting) {
  expectMatch(move("fast.expand", "Expand",
                   {runtime(randomFloats(Shape{3, 1}, 40)), constant(int64s({2, 3, 4}))}));
  expectMatch(move("fast.expand", "Expand",
                   {runtime(randomFloats(Shape{1, 4}, 41)), constant(int64s({3, 1}))}));
  expectMatch(move("fast.expand", "Expand",
                   {runtime(sequence<int64_t>(Shape{2, 1, 3})), constant(int64s({2, 5, 3}))}));
  expectMatch(
      move("fast.expand", "Expand", {runtime(randomBools(Shape{1}, 42)), constant(int64s({7}))}));
  expectMatch(move("fast.expand", "Expand",
                   {runtime(randomFloats(Shape{1, 1, 128}, 43)), constant(int64s({64, 128, 1}))})
                  .onFourThreads());
}

TEST(CpuDataMoveKernels, TileMatchesReference) {
  expectMatch(move("fast.tile", "Tile",
                   {runtime(randomFloats(Shape{2, 3}, 50)), constant(int64s({2, 3}))}));
  expectMatch(move("fast.tile", "Tile",
                   {runtime(sequence<int64_t>(Shape{2, 1, 3})), constant(int64s({1, 4, 2}))}));
  expectMatch(
      move("fast.tile", "Tile", {runtime(randomBools(Shape{3}, 51)), constant(int64s({5}))}));
  expectMatch(
      move("fast.tile", "Tile",
           {runtime(randomFloats(Shape{1, 3, 128, 128}, 52)), constant(int64s({2, 1, 2, 3}))})
          .onFourThreads());
}

// --- Pad ---------------------------------------------------------------------------------------

TEST(CpuDataMoveKernels, PadMatchesReferenceInEveryMode) {
  const Tensor x = randomFloats(Shape{2, 3, 4, 5}, 60);
  const std::vector<std::vector<int64_t>> padSets = {
      {0, 0, 1, 2, 0, 0, 2, 1},
      {1, 0, 0, 3, 0, 2, 1, 0},
      {0, 1, -1, 2, 1, -1, 0, -2},  // negative pads crop
  };
  for (const auto& pads : padSets) {
    for (const char* mode : {"constant", "edge", "reflect", "wrap"}) {
      expectMatch(move("fast.pad", "Pad", {runtime(x), constant(int64s(pads))},
                       {{"mode", stringAttr(mode)}})
                      .atOpset(19));
    }
    expectMatch(move("fast.pad", "Pad",
                     {runtime(x), constant(int64s(pads)), constant(Tensor::scalar<float>(-2.5f))}));
  }
  // Axes input, int64 data with a value, opset 2's attributes, a runtime value (reference).
  expectMatch(move("fast.pad", "Pad",
                   {runtime(sequence<int64_t>(Shape{3, 4})), constant(int64s({1, 2, 3, 0})),
                    constant(Tensor::scalar<int64_t>(-7)), constant(int64s({-1, 0}))}));
  expectMatch(move("fast.pad", "Pad", {runtime(x)},
                   {{"pads", intsAttr({0, 0, 1, 1, 0, 0, 1, 1})}, {"value", floatAttr(1.5f)}})
                  .atOpset(2));
  expectMatch(move("", "Pad",
                   {runtime(x), constant(int64s({0, 0, 1, 1, 0, 0, 1, 1})),
                    runtime(Tensor::scalar<float>(3.0f))}));
  // Everything cropped away along one axis: all fill.
  expectMatch(move("fast.pad", "Pad",
                   {runtime(randomFloats(Shape{2, 3}, 61)), constant(int64s({0, -3, 0, 2}))}));
  expectMatch(move("fast.pad", "Pad",
                   {runtime(randomFloats(Shape{1, 32, 112, 112}, 62)),
                    constant(int64s({0, 0, 1, 1, 0, 0, 1, 1}))})
                  .onFourThreads());
}

// --- Gather ------------------------------------------------------------------------------------

TEST(CpuDataMoveKernels, GatherMatchesReferenceOnEveryAxis) {
  const Tensor data = randomFloats(Shape{5, 4, 3}, 70);
  const Tensor indices = int64s(Shape{2, 2}, {0, -1, 2, -3});
  for (int64_t axis : {0, 1, -1, -3}) {
    expectMatch(move("fast.gather", "Gather", {runtime(data), runtime(indices)},
                     {{"axis", intAttr(axis)}}));
    expectMatch(move("fast.gather", "Gather", {runtime(data), constant(indices)},
                     {{"axis", intAttr(axis)}}));
  }
  // int32 and scalar indices, int64 and bool data, a constant table (embeddings).
  expectMatch(move("fast.gather", "Gather",
                   {runtime(data), runtime(Tensor::fromVector<int32_t>(Shape{3}, {2, -2, 0}))},
                   {{"axis", intAttr(1)}}));
  expectMatch(
      move("fast.gather", "Gather",
           {runtime(sequence<int64_t>(Shape{6, 2})), runtime(Tensor::scalar<int64_t>(-2))}));
  expectMatch(move("fast.gather", "Gather",
                   {runtime(randomBools(Shape{4, 5}, 71)), constant(int64s({4, 0, 1}))},
                   {{"axis", intAttr(1)}}));
  std::vector<int64_t> tokens(10240);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>((i * 37) % 1000);
  expectMatch(
      move("fast.gather", "Gather",
           {constant(randomFloats(Shape{1000, 256}, 72)), runtime(int64s(Shape{20, 512}, tokens))})
          .onFourThreads());
}

TEST(CpuDataMoveKernels, GatherReportsOutOfRangeIndicesAsTheReferenceDoes) {
  const Tensor data = randomFloats(Shape{5, 4}, 73);
  for (int64_t bad : {5, -6, 1000}) {
    expectMatch(move("fast.gather", "Gather",
                     {runtime(data), runtime(int64s(Shape{2, 2}, {0, 1, bad, 2}))}));
    expectMatch(move("fast.gather", "Gather",
                     {runtime(data), runtime(Tensor::fromVector<int32_t>(
                                         Shape{2}, {1, static_cast<int32_t>(bad)}))}));
  }
  // A constant index out of range is left to the reference kernel, which reports it.
  expectMatch(move("", "Gather", {runtime(data), constant(int64s({0, 9}))}));
}

// --- Where -------------------------------------------------------------------------------------

TEST(CpuDataMoveKernels, WhereMatchesReferenceWithBroadcasting) {
  const std::vector<std::array<Shape, 3>> shapes = {
      {Shape{3, 4}, Shape{3, 4}, Shape{3, 4}},
      {Shape{1, 4}, Shape{3, 1}, Shape{}},
      {Shape{2, 1, 4}, Shape{3, 4}, Shape{2, 3, 1}},
      {Shape{1, 1, 5, 5}, Shape{2, 4, 5, 5}, Shape{1}},
      {Shape{}, Shape{2, 3}, Shape{2, 3}},
  };
  unsigned seed = 80;
  for (const auto& [c, x, y] : shapes) {
    const Tensor condition = randomBools(c, seed++);
    expectMatch(move(
        "fast.where", "Where",
        {runtime(condition), runtime(randomFloats(x, seed++)), runtime(randomFloats(y, seed++))}));
    expectMatch(move(
        "fast.where", "Where",
        {runtime(condition), runtime(sequence<int64_t>(x)), runtime(sequence<int64_t>(y, 100))}));
  }
  // BERT's mask: a constant fill where the mask says so; then one over several chunks.
  expectMatch(move("fast.where", "Where",
                   {runtime(randomBools(Shape{1, 1, 128, 128}, seed++)),
                    constant(Tensor::scalar<float>(-std::numeric_limits<float>::infinity())),
                    runtime(randomFloats(Shape{1, 4, 128, 128}, seed++))})
                  .onFourThreads());
  expectMatch(move("fast.where", "Where",
                   {runtime(randomBools(Shape{1, 1, 256, 256}, seed++)),
                    constant(Tensor::scalar<float>(0.0f)),
                    runtime(randomFloats(Shape{1, 12, 256, 256}, seed++))})
                  .onFourThreads());
}

// --- Cast --------------------------------------------------------------------------------------

TEST(CpuDataMoveKernels, CastMatchesReferenceIncludingSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor floats = Tensor::fromVector<float>(
      Shape{12}, {0.0f, -0.0f, 1.9f, -1.9f, 2.5f, 1e10f, -1e10f, 3e9f, inf, -inf,
                  std::numeric_limits<float>::quiet_NaN(), 1e-30f});
  const Tensor wide = int64s(
      {0, -1, 7, int64_t{1} << 40, -(int64_t{1} << 33) - 5, std::numeric_limits<int64_t>::max()});
  const Tensor narrow = Tensor::fromVector<int32_t>(Shape{4}, {0, -5, 123456, -2147483647});
  const Tensor bools = randomBools(Shape{9}, 90);
  constexpr int64_t kFloat = 1, kInt32 = 6, kInt64 = 7, kBool = 9, kFloat16 = 10;
  const std::vector<std::pair<Tensor, int64_t>> casts = {
      {floats, kInt64}, {floats, kInt32}, {floats, kBool},  {wide, kFloat},
      {wide, kInt32},   {wide, kBool},    {narrow, kInt64}, {narrow, kFloat},
      {narrow, kBool},  {bools, kFloat},  {bools, kInt64},  {bools, kInt32}};
  for (const auto& [input, to] : casts) {
    expectMatch(move("fast.cast", "Cast", {runtime(input)}, {{"to", intAttr(to)}}));
  }
  // CastLike takes the type of its second input; other types are the reference kernel's.
  expectMatch(move("fast.cast", "CastLike",
                   {runtime(floats), runtime(Tensor::fromVector<int32_t>(Shape{1}, {0}))}));
  expectMatch(move("", "Cast", {runtime(floats)}, {{"to", intAttr(kFloat16)}}));
  expectMatch(move("fast.cast", "Cast", {runtime(randomFloats(Shape{1024, 1024}, 91, -1e4f, 1e4f))},
                   {{"to", intAttr(kInt64)}})
                  .onFourThreads());
}

// --- Resize ------------------------------------------------------------------------------------

Tensor floats(std::vector<float> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return Tensor::fromVector<float>(Shape{n}, values);
}

// The opset at which each coordinate transform exists: tf_half_pixel_for_nn until 13,
// half_pixel_symmetric from 19.
int opsetFor(const std::string& transform) {
  if (transform == "tf_half_pixel_for_nn") return 11;
  return transform == "half_pixel_symmetric" ? 19 : 18;
}

TEST(CpuDataMoveKernels, NearestResizeMatchesReference) {
  const Tensor x = randomFloats(Shape{1, 3, 5, 7}, 100);
  for (const char* transform : {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                                "tf_half_pixel_for_nn", "half_pixel_symmetric"}) {
    for (const char* rounding : {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}) {
      for (const std::vector<float>& scales :
           std::vector<std::vector<float>>{{1, 1, 2, 2}, {1, 1, 0.6f, 1.7f}, {1, 2, 3, 0.5f}}) {
        expectMatch(move("fast.resize_nearest", "Resize",
                         {runtime(x), omitted(), constant(floats(scales))},
                         {{"mode", stringAttr("nearest")},
                          {"coordinate_transformation_mode", stringAttr(transform)},
                          {"nearest_mode", stringAttr(rounding)}})
                        .atOpset(opsetFor(transform)));
      }
    }
  }
  // Sizes instead of scales, int64 data, opset 10's legacy rounding, the axes attribute.
  expectMatch(move("fast.resize_nearest", "Resize",
                   {runtime(sequence<int64_t>(Shape{2, 2, 3, 4})), omitted(), omitted(),
                    constant(int64s({2, 2, 7, 9}))},
                   {{"mode", stringAttr("nearest")}}));
  expectMatch(move("fast.resize_nearest", "Resize", {runtime(x), constant(floats({1, 1, 2, 0.5f}))},
                   {{"mode", stringAttr("nearest")}})
                  .atOpset(10));
  expectMatch(move("fast.resize_nearest", "Resize",
                   {runtime(x), omitted(), constant(floats({3, 2}))},
                   {{"axes", intsAttr({2, 3})},
                    {"coordinate_transformation_mode", stringAttr("asymmetric")},
                    {"nearest_mode", stringAttr("floor")}}));
  expectMatch(move("fast.resize_nearest", "Resize",
                   {runtime(randomFloats(Shape{1, 32, 56, 56}, 101)), omitted(),
                    constant(floats({1, 1, 2, 2}))},
                   {{"coordinate_transformation_mode", stringAttr("asymmetric")},
                    {"nearest_mode", stringAttr("floor")}})
                  .onFourThreads());
}

TEST(CpuDataMoveKernels, LinearResizeMatchesReference) {
  const Tensor x = randomFloats(Shape{2, 3, 6, 5}, 110);
  for (const char* transform : {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                                "tf_half_pixel_for_nn", "half_pixel_symmetric"}) {
    for (const std::vector<float>& scales :
         std::vector<std::vector<float>>{{1, 1, 2, 2}, {1, 1, 0.5f, 1.7f}, {1, 1, 1, 3}}) {
      // tf_half_pixel_for_nn maps coordinate o to o + 0.5 even at scale 1, so the leading axes
      // blend neighbours: the reference kernel's.
      const std::string tactic =
          std::string(transform) == "tf_half_pixel_for_nn" ? "" : "fast.resize_linear";
      expectMatch(move(tactic, "Resize", {runtime(x), omitted(), constant(floats(scales))},
                       {{"mode", stringAttr("linear")},
                        {"coordinate_transformation_mode", stringAttr(transform)}})
                      .atOpset(opsetFor(transform)));
    }
  }
  expectMatch(move("fast.resize_linear", "Resize",
                   {runtime(x), omitted(), omitted(), constant(int64s({2, 3, 1, 9}))},
                   {{"mode", stringAttr("linear")},
                    {"coordinate_transformation_mode", stringAttr("align_corners")}}));
  // Leading axes that resize, cubic mode and antialiasing are the reference kernel's.
  expectMatch(move("", "Resize", {runtime(x), omitted(), constant(floats({1, 2, 2, 2}))},
                   {{"mode", stringAttr("linear")}}));
  expectMatch(move("", "Resize", {runtime(x), omitted(), constant(floats({1, 1, 2, 2}))},
                   {{"mode", stringAttr("cubic")}}));
  expectMatch(move("", "Resize", {runtime(x), omitted(), constant(floats({1, 1, 0.5f, 0.5f}))},
                   {{"mode", stringAttr("linear")}, {"antialias", intAttr(1)}}));
  expectMatch(move("fast.resize_linear", "Resize",
                   {runtime(randomFloats(Shape{1, 16, 80, 80}, 111)), omitted(),
                    constant(floats({1, 1, 2, 2}))},
                   {{"mode", stringAttr("linear")}})
                  .onFourThreads());
}

// --- Reductions --------------------------------------------------------------------------------

struct ReducedAxes {
  std::vector<int64_t> axes;
  const char* tactic;  // the loop the merged axes pick
};

TEST(CpuReduceKernels, ReductionsMatchReferenceOverAnyAxes) {
  const Tensor x = randomFloats(Shape{2, 3, 5, 7}, 120);
  const std::vector<ReducedAxes> axisSets = {
      {{2, 3}, "fast.reduce_rows"},     {{-1}, "fast.reduce_rows"},
      {{1, 2, 3}, "fast.reduce_rows"},  {{0}, "fast.reduce_columns"},
      {{1}, "fast.reduce_columns"},     {{0, 1}, "fast.reduce_columns"},
      {{2}, "fast.reduce_columns"},     {{0, 2}, "fast.reduce_generic"},
      {{1, 3}, "fast.reduce_generic"},  {{0, 1, 2, 3}, "fast.reduce_all"},
      {{0, -1}, "fast.reduce_generic"},
  };
  for (const char* op : {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"}) {
    for (const ReducedAxes& a : axisSets) {
      for (int64_t keep : {0, 1}) {
        expectMatch(reduce(a.tactic, op, {runtime(x), constant(int64s(a.axes))},
                           {{"keepdims", intAttr(keep)}}));
      }
    }
    // No axes: everything; with noop_with_empty_axes, nothing (a copy).
    expectMatch(reduce("fast.reduce_all", op, {runtime(x)}));
    expectMatch(
        reduce("fast.reduce_copy", op, {runtime(x)}, {{"noop_with_empty_axes", intAttr(1)}}));
    // An axis of extent 1 reduces nothing but the shape.
    expectMatch(reduce("fast.reduce_copy", op,
                       {runtime(randomFloats(Shape{3, 1, 4}, 121)), constant(int64s({1}))}));
    // Axes as an attribute before opset 18 (13 for ReduceSum).
    expectMatch(reduce("fast.reduce_rows", op, {runtime(x)}, {{"axes", intsAttr({2, 3})}})
                    .atOpset(std::string(op) == "ReduceSum" ? 11 : 13));
  }
}

TEST(CpuReduceKernels, ExtremaPropagateNaNAndSumsStayAccurate) {
  Tensor x = randomFloats(Shape{4, 6, 9}, 130);
  auto values = x.mutableData<float>();
  values[5] = std::numeric_limits<float>::quiet_NaN();          // in row 0 of [24, 9]
  values[9 * 7 + 8] = std::numeric_limits<float>::quiet_NaN();  // last of row 7
  values[100] = -std::numeric_limits<float>::infinity();
  for (const char* op : {"ReduceMax", "ReduceMin", "ReduceSum"}) {
    for (const ReducedAxes& a : std::vector<ReducedAxes>{{{2}, "fast.reduce_rows"},
                                                         {{0}, "fast.reduce_columns"},
                                                         {{1}, "fast.reduce_columns"},
                                                         {{0, 2}, "fast.reduce_generic"},
                                                         {{0, 1, 2}, "fast.reduce_all"}}) {
      expectMatch(reduce(a.tactic, op, {runtime(x), constant(int64s(a.axes))}));
    }
  }
  // A large offset: a float accumulator would lose the small terms.
  expectMatch(
      reduce("fast.reduce_rows", "ReduceSum",
             {runtime(randomFloats(Shape{3, 5000}, 131, 1e4f, 1e4f + 1)), constant(int64s({1}))}));
}

TEST(CpuReduceKernels, LargeReductionsSplitOverThreadsMatchReference) {
  const Tensor x = randomFloats(Shape{1, 96, 56, 56}, 140, 0.5f, 2.5f);
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax"}) {
    expectMatch(
        reduce("fast.reduce_rows", op, {runtime(x), constant(int64s({2, 3}))}).onFourThreads());
    expectMatch(
        reduce("fast.reduce_columns", op, {runtime(x), constant(int64s({1}))}).onFourThreads());
    expectMatch(reduce("fast.reduce_all", op, {runtime(x)}).onFourThreads());
  }
  // One [pixels, channels] block (NHWC's spatial mean): bands of rows, one a thread, combined
  // in order; a NaN in the last band still wins the extrema.
  Tensor nhwc = randomFloats(Shape{1, 3136, 96}, 141, 0.5f, 2.5f);
  for (const char* op : {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin"}) {
    expectMatch(
        reduce("fast.reduce_columns", op, {runtime(nhwc), constant(int64s({1}))}).onFourThreads());
  }
  nhwc.mutableData<float>()[3000 * 96 + 5] = std::nanf("");
  for (const char* op : {"ReduceMax", "ReduceMin"}) {
    expectMatch(
        reduce("fast.reduce_columns", op, {runtime(nhwc), constant(int64s({1}))}).onFourThreads());
  }
}

TEST(CpuReduceKernels, OtherTypesAndEmptyInputsStayReference) {
  expectMatch(
      reduce("", "ReduceSum", {runtime(sequence<int64_t>(Shape{3, 4})), constant(int64s({1}))}));
  expectMatch(
      reduce("", "ReduceProd", {runtime(randomFloats(Shape{3, 4}, 150)), constant(int64s({1}))}));
  expectMatch(reduce("", "ReduceMax",
                     {runtime(Tensor(DType::kFloat32, Shape{3, 0})), constant(int64s({1}))}));
}

}  // namespace
}  // namespace kiln::testing
