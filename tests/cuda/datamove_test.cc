// The CUDA data-movement steps against the reference executor, bit for bit: copies, Transpose
// (strided and tiled), Slice, Expand, Concat, Split, Pad, Tile, Gather, GatherElements, GatherND,
// ScatterND, ScatterElements (with reductions too), DepthToSpace, SpaceToDepth, Trilu and Resize,
// over odd shapes, every axis (negative too) and several dtypes (float32, int64, bool, float16
// bits).
#include <algorithm>
#include <cstring>
#include <limits>
#include <random>

#include "cuda_test_util.h"

namespace kiln::testing {
namespace {

using ir::DType;
using ir::Shape;
using ir::Tensor;

// Seeded data of any dtype, never all zeros (booleans are a random mix).
Tensor dataOf(DType dtype, Shape shape, unsigned seed) {
  switch (dtype) {
    case DType::kFloat32:
      return uniformTensor(std::move(shape), seed, -10, 10);
    case DType::kBool:
      return uniformTensor(std::move(shape), seed, 0, 2).castTo(DType::kInt64).castTo(dtype);
    case DType::kInt64:
    case DType::kInt32:
      return uniformTensor(std::move(shape), seed, -1000, 1000).castTo(dtype);
    default:
      return uniformTensor(std::move(shape), seed, -10, 10).castTo(dtype);
  }
}

Tensor floats(Shape shape, unsigned seed) {
  return dataOf(DType::kFloat32, std::move(shape), seed);
}

Tensor ints(std::vector<int64_t> values) {
  return Tensor::fromVector<int64_t>(Shape{static_cast<int64_t>(values.size())}, values);
}

Tensor intsShaped(Shape shape, std::vector<int64_t> values) {
  return Tensor::fromVector<int64_t>(std::move(shape), values);
}

Tensor floatValues(std::vector<float> values) {
  return Tensor::fromVector<float>(Shape{static_cast<int64_t>(values.size())}, values);
}

// Seeded indices in [-size, size) (negative ones count from the back).
Tensor randomIndices(Shape shape, int64_t size, unsigned seed, DType dtype = DType::kInt64) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> pick(-size, size - 1);
  std::vector<int64_t> values(static_cast<size_t>(shape.elementCount()));
  for (int64_t& v : values) v = pick(rng);
  return Tensor::fromVector<int64_t>(std::move(shape), values).castTo(dtype);
}

OpInput runtime(Tensor tensor) { return {std::move(tensor), false}; }
OpInput constant(Tensor tensor) { return {std::move(tensor), true}; }

// A data-movement case: exact match, the host fallback off.
CudaOpCase exact(std::string op, std::vector<OpInput> inputs, CudaAttributes attributes,
                 std::string tactic, int opset = 18, int outputs = 1, std::string route = "") {
  CudaOpCase c;
  c.opType = std::move(op);
  c.inputs = std::move(inputs);
  c.attributes = std::move(attributes);
  c.opset = opset;
  c.outputCount = outputs;
  c.route = std::move(route);
  c.expectTactic = std::move(tactic);
  c.rtol = 0;
  c.atol = 0;
  return c;
}

const std::vector<DType> kMoveTypes = {DType::kFloat32, DType::kInt64, DType::kBool,
                                       DType::kFloat16};

// --- Copies ------------------------------------------------------------------------------------

TEST(CudaDataMove, ShapeOpsCopyWhenAliasingIsOff) {
  const std::string route = "-cuda.memory.alias_reshapes=off -graph.eliminate_identity=off";
  for (DType dtype : kMoveTypes) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const Tensor x = dataOf(dtype, {3, 1, 5, 7}, 1);
    expectCudaMatchesReference(
        exact("Reshape", {runtime(x), constant(ints({15, 7}))}, {}, "kiln.copy", 18, 1, route));
    expectCudaMatchesReference(
        exact("Flatten", {runtime(x)}, {{"axis", intAttr(2)}}, "kiln.copy", 18, 1, route));
    expectCudaMatchesReference(
        exact("Squeeze", {runtime(x), constant(ints({1}))}, {}, "kiln.copy", 18, 1, route));
    expectCudaMatchesReference(
        exact("Unsqueeze", {runtime(x), constant(ints({0, -1}))}, {}, "kiln.copy", 18, 1, route));
    expectCudaMatchesReference(exact("Identity", {runtime(x)}, {}, "kiln.copy", 18, 1, route));
  }
}

TEST(CudaDataMove, InferenceDropoutIsACopy) {
  expectCudaMatchesReference(exact("Dropout", {runtime(floats({4, 9}, 2))}, {}, "kiln.copy", 13, 1,
                                   "-graph.eliminate_identity=off"));
}

// --- Transpose, DepthToSpace, SpaceToDepth -------------------------------------------------------

struct TransposeCase {
  Shape shape;
  std::vector<int64_t> perm;
  const char* tactic;
};

TEST(CudaDataMove, TransposeAnyRankAndPermutation) {
  const std::vector<TransposeCase> cases = {
      {{7, 3}, {1, 0}, "kiln.transpose"},                      // too small to tile
      {{33, 65}, {1, 0}, "kiln.transpose.tiled"},              // odd tile edges
      {{2, 3, 4, 5}, {0, 2, 3, 1}, "kiln.transpose"},          // NCHW to NHWC with 3 channels
      {{2, 17, 9, 40}, {0, 3, 1, 2}, "kiln.transpose.tiled"},  // NHWC to NCHW
      {{3, 4, 5}, {1, 0, 2}, "kiln.transpose"},                // the inner axis stays: strided rows
      // A size-1 axis dropped and two axes merged: [99, 12] from source strides [1, 99].
      {{12, 1, 9, 11}, {2, 1, 3, 0}, "kiln.transpose.tiled"},
      // The same with 5 output columns: below the tile's minimum extent, so strided.
      {{5, 1, 9, 11}, {2, 1, 3, 0}, "kiln.transpose"},
      {{2, 3, 4, 5, 6}, {4, 2, 0, 3, 1}, "kiln.transpose"},
      {{2, 3, 2, 5, 3, 7}, {5, 3, 1, 0, 2, 4}, "kiln.transpose"},
      // Four batch axes around the tile (rows 11, cols 8).
      {{2, 9, 2, 10, 8, 11}, {1, 3, 5, 0, 2, 4}, "kiln.transpose.tiled"},
      // The same with 3 output columns: strided.
      {{2, 9, 2, 10, 3, 11}, {1, 3, 5, 0, 2, 4}, "kiln.transpose"},
  };
  for (const TransposeCase& t : cases) {
    SCOPED_TRACE(t.shape.toString());
    expectCudaMatchesReference(
        exact("Transpose", {runtime(floats(t.shape, 3))}, {{"perm", intsAttr(t.perm)}}, t.tactic));
  }
}

TEST(CudaDataMove, TransposeWithoutPermReversesTheAxes) {
  // [12, 9, 10] to [10, 9, 12]: rows 10, cols 12, the middle axis a batch axis.
  expectCudaMatchesReference(
      exact("Transpose", {runtime(floats({12, 9, 10}, 4))}, {}, "kiln.transpose.tiled"));
  expectCudaMatchesReference(
      exact("Transpose", {runtime(floats({4, 9, 10}, 4))}, {}, "kiln.transpose"));
}

TEST(CudaDataMove, TransposeMovesEveryDtype) {
  for (DType dtype : kMoveTypes) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    expectCudaMatchesReference(exact("Transpose", {runtime(dataOf(dtype, {3, 19, 40}, 5))},
                                     {{"perm", intsAttr({2, 0, 1})}}, "kiln.transpose.tiled"));
    expectCudaMatchesReference(exact("Transpose", {runtime(dataOf(dtype, {2, 3, 4, 5}, 6))},
                                     {{"perm", intsAttr({3, 1, 2, 0})}}, "kiln.transpose"));
  }
}

TEST(CudaDataMove, TiledTransposeKnobPicksTheStridedKernel) {
  const Tensor x = floats({33, 65}, 7);
  expectCudaMatchesReference(
      exact("Transpose", {runtime(x)}, {{"perm", intsAttr({1, 0})}}, "kiln.transpose.tiled"));
  expectCudaMatchesReference(exact("Transpose", {runtime(x)}, {{"perm", intsAttr({1, 0})}},
                                   "kiln.transpose", 18, 1, "-cuda.transpose.tiled=off"));
}

TEST(CudaDataMove, DepthToSpaceBothModes) {
  for (const char* mode : {"DCR", "CRD"}) {
    SCOPED_TRACE(mode);
    expectCudaMatchesReference(exact("DepthToSpace", {runtime(floats({2, 8, 3, 5}, 8))},
                                     {{"blocksize", intAttr(2)}, {"mode", stringAttr(mode)}}, ""));
    expectCudaMatchesReference(exact("DepthToSpace",
                                     {runtime(dataOf(DType::kInt64, {1, 18, 4, 9}, 9))},
                                     {{"blocksize", intAttr(3)}, {"mode", stringAttr(mode)}}, ""));
  }
}

TEST(CudaDataMove, SpaceToDepth) {
  expectCudaMatchesReference(
      exact("SpaceToDepth", {runtime(floats({2, 3, 6, 4}, 10))}, {{"blocksize", intAttr(2)}}, ""));
  expectCudaMatchesReference(exact("SpaceToDepth",
                                   {runtime(dataOf(DType::kFloat16, {1, 5, 9, 27}, 11))},
                                   {{"blocksize", intAttr(3)}}, ""));
}

// --- Slice and Expand --------------------------------------------------------------------------

struct SliceCase {
  Shape shape;
  std::vector<int64_t> starts, ends, axes, steps;  // empty axes/steps: the input is omitted
};

TEST(CudaDataMove, SliceClampsAndStepsBothWays) {
  const std::vector<SliceCase> cases = {
      {{10, 12}, {1, -3}, {8, 100}, {0, 1}, {2, 1}},
      {{10, 12}, {-1}, {-100}, {1}, {-1}},  // the whole axis reversed
      {{10, 12}, {8}, {1}, {0}, {-3}},      // a negative step, clamped start
      {{10, 12}, {-100, 100}, {100, -100}, {0, 1}, {1, -2}},
      {{10, 12}, {2}, {5}, {}, {}},  // contiguous rows: one copy
      {{4, 5, 6, 7}, {1, -2, 5}, {3, 0, 0}, {-3, -1, 2}, {1, -1, -2}},
      {{3, 1, 9}, {7}, {-1000}, {2}, {-4}},
      {{6}, {0}, {6}, {0}, {5}},
  };
  for (const SliceCase& s : cases) {
    SCOPED_TRACE(s.shape.toString());
    std::vector<OpInput> inputs = {runtime(floats(s.shape, 12)), constant(ints(s.starts)),
                                   constant(ints(s.ends))};
    if (!s.axes.empty()) inputs.push_back(constant(ints(s.axes)));
    if (!s.steps.empty()) inputs.push_back(constant(ints(s.steps)));
    expectCudaMatchesReference(exact("Slice", inputs, {}, "kiln.slice"));
  }
}

TEST(CudaDataMove, SliceTakesInt32BoundsAndEveryDtype) {
  for (DType dtype : kMoveTypes) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    expectCudaMatchesReference(
        exact("Slice",
              {runtime(dataOf(dtype, {5, 7, 9}, 13)), constant(ints({4, 1}).castTo(DType::kInt32)),
               constant(ints({-6, 8}).castTo(DType::kInt32)),
               constant(ints({0, 2}).castTo(DType::kInt32)),
               constant(ints({-1, 3}).castTo(DType::kInt32))},
              {}, "kiln.slice"));
  }
}

TEST(CudaDataMove, SliceBeforeOpset10TakesAttributes) {
  expectCudaMatchesReference(exact(
      "Slice", {runtime(floats({6, 8}, 14))},
      {{"starts", intsAttr({1, -5})}, {"ends", intsAttr({5, 1000})}, {"axes", intsAttr({0, 1})}},
      "kiln.slice", 9));
}

TEST(CudaDataMove, ExpandBroadcastsEveryWay) {
  struct ExpandCase {
    Shape shape;
    std::vector<int64_t> target;
  };
  const std::vector<ExpandCase> cases = {
      {{3, 1, 5}, {2, 3, 4, 5}},    {{1}, {7}}, {{4, 1}, {4, 9}}, {{1, 6}, {5, 1, 6}},
      {{2, 1, 3, 1}, {2, 5, 3, 4}},
  };
  for (const ExpandCase& e : cases) {
    for (DType dtype : {DType::kFloat32, DType::kBool}) {
      SCOPED_TRACE(e.shape.toString() + " " + std::string(ir::dtypeName(dtype)));
      expectCudaMatchesReference(
          exact("Expand", {runtime(dataOf(dtype, e.shape, 15)), constant(ints(e.target))}, {},
                "kiln.expand"));
    }
  }
}

// --- Concat and Split --------------------------------------------------------------------------

TEST(CudaDataMove, ConcatAnyAxis) {
  expectCudaMatchesReference(exact("Concat",
                                   {runtime(floats({2, 3, 4}, 16)), runtime(floats({2, 5, 4}, 17)),
                                    runtime(floats({2, 1, 4}, 18))},
                                   {{"axis", intAttr(1)}}, "kiln.concat"));
  expectCudaMatchesReference(exact("Concat",
                                   {runtime(floats({2, 3, 4}, 19)), runtime(floats({2, 3, 7}, 20))},
                                   {{"axis", intAttr(-1)}}, "kiln.concat"));
  expectCudaMatchesReference(exact("Concat",
                                   {runtime(floats({1, 3}, 21)), runtime(floats({4, 3}, 22))},
                                   {{"axis", intAttr(0)}}, "kiln.concat"));
}

TEST(CudaDataMove, ConcatOfManyInputsAndConstants) {
  std::vector<OpInput> inputs;
  for (unsigned k = 0; k < 11; ++k) {
    const Tensor part = dataOf(DType::kInt64, {3, static_cast<int64_t>(k % 4 + 1), 5}, 23 + k);
    inputs.push_back(k % 3 == 1 ? constant(part) : runtime(part));
  }
  expectCudaMatchesReference(exact("Concat", inputs, {{"axis", intAttr(-2)}}, "kiln.concat"));
}

TEST(CudaDataMove, ConcatEveryDtype) {
  for (DType dtype : kMoveTypes) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    expectCudaMatchesReference(
        exact("Concat", {runtime(dataOf(dtype, {3, 2}, 40)), runtime(dataOf(dtype, {3, 9}, 41))},
              {{"axis", intAttr(1)}}, "kiln.concat"));
  }
}

TEST(CudaDataMove, SplitBySizesInput) {
  expectCudaMatchesReference(exact("Split",
                                   {runtime(floats({4, 10, 3}, 42)), constant(ints({2, 3, 5}))},
                                   {{"axis", intAttr(1)}}, "kiln.split", 18, 3));
  expectCudaMatchesReference(
      exact("Split", {runtime(dataOf(DType::kBool, {6, 7}, 43)), constant(ints({1, 6}))},
            {{"axis", intAttr(-1)}}, "kiln.split", 13, 2));
}

TEST(CudaDataMove, SplitByNumOutputsLeavesTheLastPartSmaller) {
  expectCudaMatchesReference(exact("Split", {runtime(floats({10, 3}, 44))},
                                   {{"axis", intAttr(0)}, {"num_outputs", intAttr(3)}},
                                   "kiln.split", 18, 3));
}

TEST(CudaDataMove, SplitBySplitAttributeAndEqualParts) {
  expectCudaMatchesReference(exact("Split", {runtime(floats({3, 9}, 45))},
                                   {{"axis", intAttr(1)}, {"split", intsAttr({4, 4, 1})}},
                                   "kiln.split", 11, 3));
  expectCudaMatchesReference(exact("Split", {runtime(dataOf(DType::kFloat16, {2, 6, 5}, 46))},
                                   {{"axis", intAttr(-2)}}, "kiln.split", 13, 3));
}

// --- Pad and Tile ------------------------------------------------------------------------------

TEST(CudaDataMove, PadEveryMode) {
  const Tensor x = floats({3, 4, 5}, 47);
  const Tensor pads = ints({1, 0, 2, 2, 3, 1});
  for (const char* mode : {"constant", "reflect", "edge", "wrap"}) {
    SCOPED_TRACE(mode);
    expectCudaMatchesReference(
        exact("Pad", {runtime(x), constant(pads)}, {{"mode", stringAttr(mode)}}, "kiln.pad", 19));
  }
}

TEST(CudaDataMove, PadNegativePadsCropFirst) {
  const Tensor x = floats({6, 7}, 48);
  const Tensor pads = ints({-2, 3, 1, -3});
  for (const char* mode : {"constant", "reflect", "edge", "wrap"}) {
    SCOPED_TRACE(mode);
    expectCudaMatchesReference(
        exact("Pad", {runtime(x), constant(pads)}, {{"mode", stringAttr(mode)}}, "kiln.pad", 19));
  }
}

TEST(CudaDataMove, PadReflectsPastTheEdgeAndOneElementAxes) {
  // Pads larger than the axis reflect periodically, as the reference does.
  expectCudaMatchesReference(exact("Pad",
                                   {runtime(floats({1, 3}, 49)), constant(ints({2, 5, 1, 4}))},
                                   {{"mode", stringAttr("reflect")}}, "kiln.pad"));
}

TEST(CudaDataMove, PadConstantValueAndAxes) {
  const Tensor x = floats({2, 3, 4, 5}, 50);
  expectCudaMatchesReference(exact("Pad",
                                   {runtime(x), constant(ints({1, 2, 3, 0})),
                                    constant(Tensor::scalar<float>(2.5f)), constant(ints({-1, 1}))},
                                   {}, "kiln.pad"));
  // A runtime constant value is read on the device.
  expectCudaMatchesReference(exact("Pad",
                                   {runtime(x), constant(ints({0, 1, 1, 0, 2, 2, 0, 1})),
                                    runtime(Tensor::scalar<float>(-7.25f))},
                                   {}, "kiln.pad"));
}

TEST(CudaDataMove, PadEveryDtype) {
  for (DType dtype : kMoveTypes) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const Tensor value = Tensor::scalar<float>(1.0f).castTo(dtype);
    expectCudaMatchesReference(exact(
        "Pad", {runtime(dataOf(dtype, {3, 5}, 51)), constant(ints({1, 2, 0, 3})), constant(value)},
        {}, "kiln.pad"));
    expectCudaMatchesReference(
        exact("Pad", {runtime(dataOf(dtype, {3, 5}, 52)), constant(ints({2, 1, 2, 3}))},
              {{"mode", stringAttr("edge")}}, "kiln.pad"));
  }
}

TEST(CudaDataMove, PadBeforeOpset11TakesAttributes) {
  expectCudaMatchesReference(exact("Pad", {runtime(floats({3, 4}, 53))},
                                   {{"pads", intsAttr({1, 2, 0, 1})}, {"value", floatAttr(4.5f)}},
                                   "kiln.pad", 2));
}

TEST(CudaDataMove, TileRepeatsEachAxis) {
  expectCudaMatchesReference(
      exact("Tile", {runtime(floats({2, 3, 4}, 54)), constant(ints({2, 1, 3}))}, {}, "kiln.tile"));
  expectCudaMatchesReference(exact(
      "Tile", {runtime(dataOf(DType::kInt64, {5}, 55)), constant(ints({4}))}, {}, "kiln.tile"));
  expectCudaMatchesReference(
      exact("Tile", {runtime(dataOf(DType::kBool, {1, 3, 1, 2}, 56)), constant(ints({3, 2, 5, 1}))},
            {}, "kiln.tile"));
}

// --- Gather family and scatters ----------------------------------------------------------------

TEST(CudaDataMove, GatherAnyAxisWithNegativeIndices) {
  const Tensor data = floats({5, 7, 3}, 57);
  expectCudaMatchesReference(exact("Gather", {runtime(data), runtime(randomIndices({4}, 5, 58))},
                                   {{"axis", intAttr(0)}}, "kiln.gather"));
  expectCudaMatchesReference(
      exact("Gather", {runtime(data), runtime(randomIndices({2, 3}, 7, 59, DType::kInt32))},
            {{"axis", intAttr(1)}}, "kiln.gather"));
  expectCudaMatchesReference(exact("Gather", {runtime(data), runtime(randomIndices({6}, 3, 60))},
                                   {{"axis", intAttr(-1)}}, "kiln.gather"));
  // A scalar index drops the axis.
  expectCudaMatchesReference(exact("Gather", {runtime(data), runtime(Tensor::scalar<int64_t>(-2))},
                                   {{"axis", intAttr(1)}}, "kiln.gather"));
}

TEST(CudaDataMove, GatherFromConstantsAndWithConstantIndices) {
  // An embedding: a constant table read at runtime indices.
  expectCudaMatchesReference(
      exact("Gather", {constant(floats({50, 16}, 61)), runtime(randomIndices({3, 7}, 50, 62))}, {},
            "kiln.gather"));
  expectCudaMatchesReference(
      exact("Gather", {runtime(dataOf(DType::kFloat16, {4, 9}, 63)), constant(ints({8, -9, 0, 3}))},
            {{"axis", intAttr(1)}}, "kiln.gather"));
}

// A Gather moves the runs after its axis as 4-, 8- or 16-byte words where their bytes allow
// (cuda.gather.vector): against the reference, and bit for bit against the element kernel
// (-cuda.gather.vector=off), over runs of every width class; out-of-range runtime indices give
// zero rows in both.
TEST(CudaDataMove, GatherInWordsMatchesTheReferenceAndTheElementKernel) {
  struct Case {
    DType dtype;
    Shape shape;
    int64_t axis;
    int word;  // what the step should move: the element size when it moves elements
  };
  const Case cases[] = {
      {DType::kFloat16, {6, 5, 8}, 1, 16},   {DType::kFloat16, {6, 5, 4}, 1, 8},
      {DType::kFloat16, {6, 5, 6}, 1, 4},    {DType::kFloat16, {6, 5, 3}, 1, 2},
      {DType::kFloat32, {9, 40}, 0, 16},     {DType::kFloat32, {4, 7, 3}, 1, 4},
      {DType::kFloat32, {4, 7, 2, 3}, 1, 8}, {DType::kInt64, {5, 4}, 0, 16},
      {DType::kBool, {5, 6, 12}, 1, 4},      {DType::kFloat16, {4, 3, 96}, -2, 16},
  };
  unsigned seed = 900;
  for (const Case& c : cases) {
    const Tensor data = dataOf(c.dtype, c.shape, seed++);
    const int64_t axis = c.axis < 0 ? c.axis + static_cast<int64_t>(c.shape.rank()) : c.axis;
    const int64_t axisSize = c.shape[static_cast<size_t>(axis)];
    SCOPED_TRACE(std::string(ir::dtypeName(c.dtype)) + " " + c.shape.toString() + " axis " +
                 std::to_string(c.axis));
    const Tensor indices = randomIndices({7}, axisSize, seed++);
    expectCudaMatchesReference(exact("Gather", {runtime(data), runtime(indices)},
                                     {{"axis", intAttr(c.axis)}}, "kiln.gather"));
    // Index 1 is out of range at run time: the reference would refuse it, so the two kernels are
    // compared with each other, and those rows must be zero.
    Tensor wild = indices;
    wild.mutableData<int64_t>()[1] = axisSize + 3;
    std::vector<ir::Tensor> outputs[2];
    for (int words = 0; words < 2; ++words) {
      BuilderConfig config;
      ASSERT_TRUE(config
                      .setBuildRoute(std::string("-cuda.host_fallback=off -cuda.gather.vector=") +
                                     (words ? "on" : "off"))
                      .isOk());
      auto build = buildCuda(
          makeSingleOpGraph("Gather", {runtime(data), runtime(wild)}, {{"axis", intAttr(c.axis)}}),
          config);
      ASSERT_TRUE(build.isOk()) << build.status().toString();
      ASSERT_EQ(build->plan.steps().size(), 1u);
      const std::string detail = build->plan.steps()[0]->detail();
      const int element = static_cast<int>(ir::dtypeSize(c.dtype));
      const int expected = words ? c.word : element;
      EXPECT_EQ(detail.find("-byte words") != std::string::npos, expected > element) << detail;
      if (expected > element) {
        EXPECT_EQ(detail.rfind(std::to_string(expected) + "-byte words", 0), 0u) << detail;
      }
      if (!cuda::deviceAvailable()) GTEST_SKIP() << "no GPU";
      auto ran = build->plan.run({data, wild});
      ASSERT_TRUE(ran.isOk()) << ran.status().toString();
      outputs[words] = std::move(ran).value();
    }
    const ir::Tensor& elements = outputs[0][0];
    const ir::Tensor& words = outputs[1][0];
    ASSERT_EQ(elements.byteSize(), words.byteSize());
    EXPECT_EQ(std::memcmp(elements.rawData(), words.rawData(), elements.byteSize()), 0);
    // Output [outer, 7, inner]: the second index's runs are all-zero bytes.
    const auto& dims = c.shape.dims();
    int64_t outer = 1;
    int64_t inner = 1;
    for (int64_t a = 0; a < static_cast<int64_t>(dims.size()); ++a) {
      if (a < axis) outer *= dims[static_cast<size_t>(a)];
      if (a > axis) inner *= dims[static_cast<size_t>(a)];
    }
    const size_t runBytes = static_cast<size_t>(inner) * ir::dtypeSize(c.dtype);
    const std::byte* bytes = words.rawData();
    for (int64_t o = 0; o < outer; ++o) {
      const std::byte* run = bytes + (static_cast<size_t>(o) * 7 + 1) * runBytes;
      EXPECT_TRUE(std::all_of(run, run + runBytes, [](std::byte b) { return b == std::byte{0}; }))
          << "outer " << o;
    }
  }
}

// One constant index (a scalar, or one element) is a strided view: a copy of a contiguous block
// when the axis is the outermost, a strided gather otherwise; negative indices count from the end.
TEST(CudaDataMove, GatherOfOneConstantIndexIsAView) {
  const Tensor data = floats({3, 4, 5, 6}, 64);
  for (int64_t axis : {0, 1, 2, 3, -1}) {
    for (int64_t index : {0, 2, -1}) {
      SCOPED_TRACE("axis " + std::to_string(axis) + " index " + std::to_string(index));
      expectCudaMatchesReference(exact("Gather",
                                       {runtime(data), constant(Tensor::scalar<int64_t>(index))},
                                       {{"axis", intAttr(axis)}}, "kiln.gather.view"));
      expectCudaMatchesReference(exact("Gather", {runtime(data), constant(ints({index}))},
                                       {{"axis", intAttr(axis)}}, "kiln.gather.view"));
    }
  }
  // Two-byte elements (moved in wider units where the runs allow) and bool.
  expectCudaMatchesReference(exact(
      "Gather",
      {runtime(dataOf(DType::kFloat16, {3, 2, 4, 8}, 65)), constant(Tensor::scalar<int64_t>(1))},
      {{"axis", intAttr(1)}}, "kiln.gather.view"));
  expectCudaMatchesReference(
      exact("Gather", {runtime(dataOf(DType::kBool, {4, 3}, 66)), constant(ints({-3}))},
            {{"axis", intAttr(1)}}, "kiln.gather.view"));
}

TEST(CudaDataMove, GatherWithOutOfRangeConstantIndicesFallsToTheHost) {
  // The reference reports the bad index; the GPU step would not, so there is none.
  BuilderConfig config;
  ASSERT_TRUE(config.setBuildRoute("-cuda.host_fallback=off").isOk());
  auto build = buildCuda(
      makeSingleOpGraph("Gather", {runtime(floats({4, 3}, 64)), constant(ints({1, 4}))}), config);
  EXPECT_FALSE(build.isOk());
}

TEST(CudaDataMove, GatherElementsAnyAxis) {
  const Tensor data = floats({4, 6, 5}, 65);
  expectCudaMatchesReference(exact("GatherElements",
                                   {runtime(data), runtime(randomIndices({4, 3, 5}, 6, 66))},
                                   {{"axis", intAttr(1)}}, "kiln.gather_elements"));
  expectCudaMatchesReference(exact(
      "GatherElements", {runtime(data), runtime(randomIndices({7, 6, 2}, 4, 67, DType::kInt32))},
      {{"axis", intAttr(0)}}, "kiln.gather_elements"));
  expectCudaMatchesReference(exact("GatherElements",
                                   {runtime(data), runtime(randomIndices({2, 2, 9}, 5, 68))},
                                   {{"axis", intAttr(-1)}}, "kiln.gather_elements"));
}

TEST(CudaDataMove, GatherNDWithAndWithoutBatchDims) {
  const Tensor data = floats({3, 4, 5}, 69);
  // Rows of [i, j] indices pick rows of 5.
  expectCudaMatchesReference(exact("GatherND",
                                   {runtime(data), runtime(intsShaped({2, 2}, {2, -1, 0, 3}))}, {},
                                   "kiln.gather_nd"));
  // Full indices pick single elements.
  expectCudaMatchesReference(
      exact("GatherND", {runtime(data), runtime(intsShaped({2, 3}, {1, 2, 3, -3, 0, -5}))}, {},
            "kiln.gather_nd"));
  // batch_dims=1: each batch indexes its own [4, 5].
  expectCudaMatchesReference(
      exact("GatherND", {runtime(data), runtime(intsShaped({3, 2, 1}, {0, 3, -1, 2, 1, 1}))},
            {{"batch_dims", intAttr(1)}}, "kiln.gather_nd"));
}

TEST(CudaDataMove, ScatterNDReplacesSlices) {
  expectCudaMatchesReference(
      exact("ScatterND",
            {runtime(floats({6, 5}, 70)), runtime(intsShaped({3, 1}, {4, 0, -1})),
             runtime(floats({3, 5}, 71))},
            {}, "kiln.scatter_nd"));
  expectCudaMatchesReference(exact(
      "ScatterND",
      {runtime(dataOf(DType::kInt64, {2, 3, 4}, 72)), runtime(intsShaped({2, 2}, {1, 2, 0, -3})),
       runtime(dataOf(DType::kInt64, {2, 4}, 73))},
      {}, "kiln.scatter_nd"));
}

TEST(CudaDataMove, ScatterElementsReplacesElements) {
  // Within each column the two indices differ, so no element is written twice.
  expectCudaMatchesReference(exact(
      "ScatterElements",
      {runtime(floats({4, 5}, 74)), runtime(intsShaped({2, 5}, {0, 1, 2, 3, -1, 3, -4, 0, 1, 2})),
       runtime(floats({2, 5}, 75))},
      {{"axis", intAttr(0)}}, "kiln.scatter_elements"));
  expectCudaMatchesReference(exact(
      "ScatterElements",
      {runtime(dataOf(DType::kBool, {3, 4}, 76)), runtime(intsShaped({3, 2}, {1, 3, 0, -1, 2, 1})),
       runtime(dataOf(DType::kBool, {3, 2}, 77))},
      {{"axis", intAttr(-1)}}, "kiln.scatter_elements"));
}

// Scatters with a reduction apply duplicates in index order, as the reference does, so even
// floating sums and products match it bit for bit.
const std::vector<DType> kScatterReduceTypes = {DType::kFloat32, DType::kFloat16, DType::kFloat64,
                                                DType::kInt64,   DType::kInt32,   DType::kUInt8,
                                                DType::kBool};

// Data with a NaN (floating types), so that max and min show NaN winning.
Tensor scatterData(DType dtype, Shape shape, unsigned seed) {
  Tensor data = dataOf(DType::kFloat32, std::move(shape), seed);
  data.mutableData<float>()[3] = std::numeric_limits<float>::quiet_NaN();
  if (dtype == DType::kFloat32) return data;
  if (ir::isFloating(dtype)) return data.castTo(dtype);
  return dataOf(dtype, data.shape(), seed);
}

TEST(CudaDataMove, ScatterElementsReducesDuplicatesInOrder) {
  // Indices in [-3, 3) along axis 0 of a [3, 5] data: every column gets several updates.
  const Tensor indices = randomIndices({7, 4}, 3, 120);
  for (const char* reduction : {"add", "mul", "max", "min"}) {
    for (DType dtype : kScatterReduceTypes) {
      SCOPED_TRACE(std::string(reduction) + " " + std::string(ir::dtypeName(dtype)));
      expectCudaMatchesReference(exact("ScatterElements",
                                       {runtime(scatterData(dtype, {3, 5}, 121)), runtime(indices),
                                        runtime(dataOf(dtype, {7, 4}, 122))},
                                       {{"axis", intAttr(0)}, {"reduction", stringAttr(reduction)}},
                                       "kiln.scatter_elements.reduce"));
    }
  }
  // The last axis of a rank-3 tensor, int32 indices, and opset 16 (add and mul only).
  expectCudaMatchesReference(exact(
      "ScatterElements",
      {runtime(floats({2, 3, 4}, 123)), runtime(randomIndices({2, 2, 9}, 4, 124, DType::kInt32)),
       runtime(floats({2, 2, 9}, 125))},
      {{"axis", intAttr(-1)}, {"reduction", stringAttr("add")}}, "kiln.scatter_elements.reduce",
      16));
}

TEST(CudaDataMove, ScatterNDReducesDuplicatesInOrder) {
  // Rows of one index pick rows of 5 (duplicates among the 7); full indices pick elements.
  const Tensor rowIndices = randomIndices({7, 1}, 4, 126);
  const Tensor elementIndices = intsShaped({6, 2}, {1, 2, -3, 0, 1, 2, 0, -1, 1, 2, 3, 4});
  for (const char* reduction : {"add", "mul", "max", "min"}) {
    for (DType dtype : kScatterReduceTypes) {
      SCOPED_TRACE(std::string(reduction) + " " + std::string(ir::dtypeName(dtype)));
      expectCudaMatchesReference(exact("ScatterND",
                                       {runtime(scatterData(dtype, {4, 5}, 127)),
                                        runtime(rowIndices), runtime(dataOf(dtype, {7, 5}, 128))},
                                       {{"reduction", stringAttr(reduction)}},
                                       "kiln.scatter_nd.reduce"));
      expectCudaMatchesReference(exact("ScatterND",
                                       {runtime(scatterData(dtype, {4, 5}, 129)),
                                        runtime(elementIndices), runtime(dataOf(dtype, {6}, 130))},
                                       {{"reduction", stringAttr(reduction)}},
                                       "kiln.scatter_nd.reduce"));
    }
  }
  // Constant int32 indices, a rank-3 data with slices of [2, 3], opset 16.
  expectCudaMatchesReference(
      exact("ScatterND",
            {runtime(floats({3, 2, 3}, 131)),
             constant(intsShaped({4, 1}, {2, 0, 2, -1}).castTo(DType::kInt32)),
             runtime(floats({4, 2, 3}, 132))},
            {{"reduction", stringAttr("mul")}}, "kiln.scatter_nd.reduce", 16));
}

// --- Trilu -------------------------------------------------------------------------------------

TEST(CudaDataMove, TriluUpperAndLowerWithAnyDiagonal) {
  const Tensor x = floats({2, 5, 7}, 78);
  for (int64_t upper : {1, 0}) {
    for (int64_t k : {0, 2, -1, 9}) {
      SCOPED_TRACE("upper " + std::to_string(upper) + " k " + std::to_string(k));
      expectCudaMatchesReference(exact("Trilu", {runtime(x), constant(Tensor::scalar<int64_t>(k))},
                                       {{"upper", intAttr(upper)}}, "kiln.trilu", 14));
    }
  }
  expectCudaMatchesReference(
      exact("Trilu", {runtime(dataOf(DType::kInt64, {6, 4}, 79))}, {}, "kiln.trilu", 14));
}

TEST(CudaDataMove, TriluReadsARuntimeDiagonalOnTheDevice) {
  expectCudaMatchesReference(
      exact("Trilu", {runtime(floats({3, 6, 6}, 80)), runtime(Tensor::scalar<int64_t>(-2))},
            {{"upper", intAttr(0)}}, "kiln.trilu", 14));
}

// --- Resize ------------------------------------------------------------------------------------

// Resize from opset 18 with constant scales (or, when `sizes` is given, constant sizes).
CudaOpCase resizeCase(const Tensor& x, std::vector<float> scales, CudaAttributes attributes,
                      std::string tactic, std::vector<int64_t> sizes = {}, int opset = 18) {
  std::vector<OpInput> inputs = {runtime(x), OpInput{}};
  if (sizes.empty()) {
    inputs.push_back(constant(floatValues(scales)));
  } else {
    inputs.push_back(OpInput{});
    inputs.push_back(constant(ints(sizes)));
  }
  CudaOpCase c = exact("Resize", inputs, std::move(attributes), std::move(tactic), opset);
  if (c.expectTactic != "kiln.resize.nearest") {
    c.rtol = 1e-5;
    c.atol = 1e-5;
  }
  return c;
}

TEST(CudaDataMove, ResizeNearestEveryRoundingAndTransform) {
  const Tensor x = floats({1, 2, 5, 7}, 81);
  for (const char* rounding : {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}) {
    for (const char* transform : {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                                  "half_pixel_symmetric"}) {
      SCOPED_TRACE(std::string(rounding) + " " + transform);
      const CudaAttributes attributes = {{"mode", stringAttr("nearest")},
                                         {"nearest_mode", stringAttr(rounding)},
                                         {"coordinate_transformation_mode", stringAttr(transform)}};
      expectCudaMatchesReference(
          resizeCase(x, {1, 1, 2, 1.5f}, attributes, "kiln.resize.nearest", {}, 19));
      expectCudaMatchesReference(
          resizeCase(x, {}, attributes, "kiln.resize.nearest", {1, 2, 3, 4}, 19));
    }
  }
}

TEST(CudaDataMove, ResizeNearestTfHalfPixelBeforeOpset13) {
  expectCudaMatchesReference(
      resizeCase(floats({1, 1, 4, 6}, 82), {1, 1, 1.75f, 0.5f},
                 {{"coordinate_transformation_mode", stringAttr("tf_half_pixel_for_nn")}},
                 "kiln.resize.nearest", {}, 11));
}

TEST(CudaDataMove, ResizeNearestMovesEveryDtype) {
  for (DType dtype : kMoveTypes) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    expectCudaMatchesReference(resizeCase(dataOf(dtype, {2, 3, 4, 5}, 83), {1, 1, 2.5f, 0.6f},
                                          {{"mode", stringAttr("nearest")}},
                                          "kiln.resize.nearest"));
  }
}

TEST(CudaDataMove, ResizeLinearEveryTransformUpAndDown) {
  const Tensor x = floats({2, 3, 6, 9}, 84);
  for (const char* transform : {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel",
                                "half_pixel_symmetric"}) {
    SCOPED_TRACE(transform);
    const CudaAttributes attributes = {{"mode", stringAttr("linear")},
                                       {"coordinate_transformation_mode", stringAttr(transform)}};
    // Both image axes interpolate: the two-axis kernel.
    expectCudaMatchesReference(
        resizeCase(x, {1, 1, 2, 1.5f}, attributes, "kiln.resize.two_axes", {}, 19));
    // Halving the height asymmetrically lands every row on an input row: one tap there.
    const bool collapses = std::string(transform) == "asymmetric";
    expectCudaMatchesReference(
        resizeCase(x, {1, 1, 0.5f, 0.4f}, attributes,
                   collapses ? "kiln.resize.interpolate" : "kiln.resize.two_axes", {}, 19));
    // One output column: that axis collapses to one tap under some transforms, not others.
    expectCudaMatchesReference(resizeCase(x, {}, attributes, "", {2, 3, 13, 1}, 19));
  }
}

// The two-axis kernel (two neighbouring axes with two taps each, the rest copied) against the
// general one's cases: NCHW and NHWC images, float16, DeepLabV3's final 8x upsampling; one
// resized axis, three, or a resized batch axis stay general.
TEST(CudaDataMove, ResizeTwoNeighbouringAxesLinear) {
  const CudaAttributes linear = {{"mode", stringAttr("linear")}};
  const CudaAttributes aligned = {{"mode", stringAttr("linear")},
                                  {"coordinate_transformation_mode", stringAttr("align_corners")}};
  expectCudaMatchesReference(
      resizeCase(floats({2, 3, 7, 5}, 90), {1, 1, 2.5f, 3}, linear, "kiln.resize.two_axes"));
  expectCudaMatchesReference(
      resizeCase(floats({2, 7, 5, 24}, 91), {1, 2, 1.6f, 1}, aligned, "kiln.resize.two_axes"));
  CudaOpCase half = resizeCase(floats({1, 21, 65, 65}, 92).castTo(DType::kFloat16), {}, linear,
                               "kiln.resize.two_axes", {1, 21, 520, 520});
  half.rtol = half.atol = 1e-2;
  expectCudaMatchesReference(half);
  expectCudaMatchesReference(
      resizeCase(floats({2, 3, 7, 5}, 93), {1, 1, 1, 3}, linear, "kiln.resize.interpolate"));
  expectCudaMatchesReference(
      resizeCase(floats({2, 3, 7, 5}, 94), {1, 2, 2, 3}, linear, "kiln.resize.interpolate"));
  expectCudaMatchesReference(
      resizeCase(floats({2, 3, 7, 5}, 95), {2, 1, 2, 3}, linear, "kiln.resize.interpolate"));
}

TEST(CudaDataMove, ResizeCubicWithAndWithoutExcludeOutside) {
  const Tensor x = floats({1, 2, 7, 8}, 85);
  for (int64_t exclude : {0, 1}) {
    SCOPED_TRACE("exclude_outside " + std::to_string(exclude));
    expectCudaMatchesReference(resizeCase(x, {1, 1, 1.5f, 2.25f},
                                          {{"mode", stringAttr("cubic")},
                                           {"exclude_outside", intAttr(exclude)},
                                           {"cubic_coeff_a", floatAttr(-0.5f)}},
                                          "kiln.resize.interpolate"));
  }
}

TEST(CudaDataMove, ResizeAntialiasedDownsampling) {
  const Tensor x = floats({1, 2, 16, 21}, 86);
  for (const char* mode : {"linear", "cubic"}) {
    SCOPED_TRACE(mode);
    expectCudaMatchesReference(resizeCase(x, {1, 1, 0.25f, 0.6f},
                                          {{"mode", stringAttr(mode)}, {"antialias", intAttr(1)}},
                                          "kiln.resize.interpolate"));
  }
}

TEST(CudaDataMove, ResizeTfCropAndResizeExtrapolates) {
  const Tensor x = floats({1, 2, 6, 7}, 87);
  const Tensor roi = floatValues({0, 0, -0.2f, 0.3f, 1, 1, 0.9f, 1.4f});
  for (const char* mode : {"nearest", "linear"}) {
    SCOPED_TRACE(mode);
    CudaOpCase c =
        exact("Resize", {runtime(x), constant(roi), constant(floatValues({1, 1, 1.5f, 1.3f}))},
              {{"mode", stringAttr(mode)},
               {"coordinate_transformation_mode", stringAttr("tf_crop_and_resize")},
               {"extrapolation_value", floatAttr(-3.5f)}},
              std::string(mode) == "nearest" ? "kiln.resize.nearest" : "kiln.resize.interpolate");
    c.rtol = c.atol = std::string(mode) == "nearest" ? 0 : 1e-5;
    expectCudaMatchesReference(c);
  }
}

TEST(CudaDataMove, ResizeAxesAndAspectRatioPolicy) {
  const Tensor x = floats({2, 3, 5, 8}, 88);
  // Opset 18's axes: scales for the spatial axes only.
  expectCudaMatchesReference(
      resizeCase(x, {2, 0.75f}, {{"mode", stringAttr("linear")}, {"axes", intsAttr({2, -1})}},
                 "kiln.resize.two_axes"));
  for (const char* policy : {"not_larger", "not_smaller"}) {
    SCOPED_TRACE(policy);
    expectCudaMatchesReference(resizeCase(
        x, {}, {{"keep_aspect_ratio_policy", stringAttr(policy)}, {"axes", intsAttr({2, 3})}},
        "kiln.resize.nearest", {9, 11}));
  }
}

TEST(CudaDataMove, ResizeOpset10AndUpsample) {
  const Tensor x = floats({1, 2, 3, 4}, 89);
  CudaOpCase resize10 = exact("Resize", {runtime(x), constant(floatValues({1, 1, 2, 1.5f}))},
                              {{"mode", stringAttr("linear")}}, "kiln.resize.two_axes", 10);
  resize10.rtol = resize10.atol = 1e-5;
  expectCudaMatchesReference(resize10);
  expectCudaMatchesReference(exact("Upsample", {runtime(x), constant(floatValues({1, 1, 2, 3}))},
                                   {{"mode", stringAttr("nearest")}}, "kiln.resize.nearest", 9));
  CudaOpCase upsample7 =
      exact("Upsample", {runtime(x)},
            {{"mode", stringAttr("linear")}, {"scales", floatsAttr({1, 1, 2, 2})}},
            "kiln.resize.two_axes", 7);
  upsample7.rtol = upsample7.atol = 1e-5;
  expectCudaMatchesReference(upsample7);
}

}  // namespace
}  // namespace kiln::testing
