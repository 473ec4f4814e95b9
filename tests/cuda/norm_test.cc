// The CUDA normalisation steps (kernels/norm_steps.cc) against the reference executor: Softmax,
// LogSoftmax and Hardmax along every axis and across the opset-13 change of meaning,
// LpNormalization, LayerNormalization (with its Mean and InvStdDev outputs),
// InstanceNormalization, inference BatchNormalization, MeanVarianceNormalization and LRN, through
// each row kernel (a warp per row, a block per row, a thread per strided line); in float32, and
// in float16 and bfloat16 (the types cuda.precision gives a reduced node).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kiln/ir/op_schema.h"

namespace kiln::testing {
namespace {

using ir::DType;
using ir::Shape;
using ir::Tensor;

// expf/logf/sqrtf and float sums against the reference's doubles.
constexpr double kRtol = 1e-5;
constexpr double kAtol = 1e-5;

OpInput runtime(Tensor tensor) { return {std::move(tensor), false}; }
OpInput constant(Tensor tensor) { return {std::move(tensor), true}; }

Tensor uniform(Shape shape, unsigned seed, float low = -3.0f, float high = 3.0f) {
  return uniformTensor(std::move(shape), seed, low, high);
}

CudaOpCase normCase(std::string op, std::vector<OpInput> inputs, CudaAttributes attributes,
                    std::string tactic, int opset = 18, int outputs = 1) {
  CudaOpCase c;
  c.opType = std::move(op);
  c.inputs = std::move(inputs);
  c.attributes = std::move(attributes);
  c.opset = opset;
  c.outputCount = outputs;
  c.expectTactic = std::move(tactic);
  c.rtol = kRtol;
  c.atol = kAtol;
  return c;
}

// The lowering's tactic for a one-node graph with the host fallback on ("" if the build fails).
std::string tacticWithFallback(const std::string& op, const std::vector<OpInput>& inputs,
                               const CudaAttributes& attributes, int opset = 18, int outputs = 1) {
  BuilderConfig config;
  EXPECT_TRUE(config.setBuildRoute("").isOk());
  auto build = buildCuda(makeSingleOpGraph(op, inputs, attributes, opset, outputs), config);
  if (!build.isOk()) {
    ADD_FAILURE() << build.status().toString();
    return "";
  }
  return cudaTacticOf(*build, op);
}

const char* const kSoftmaxOps[] = {"Softmax", "LogSoftmax", "Hardmax"};

// --- Softmax, LogSoftmax, Hardmax --------------------------------------------------------------

// From opset 13 the lines run along `axis` alone: the last axis gives contiguous rows (a warp
// each at this width), any other axis lines `inner` apart (a thread each).
TEST(CudaNorm, SoftmaxFamilyAlongEveryAxis) {
  const Tensor x = uniform({3, 5, 7}, 1);
  struct AxisCase {
    int64_t axis;
    const char* tactic;
  };
  const AxisCase axes[] = {{-1, "kiln.softmax.warp"},    {2, "kiln.softmax.warp"},
                           {1, "kiln.softmax.strided"},  {0, "kiln.softmax.strided"},
                           {-3, "kiln.softmax.strided"}, {-2, "kiln.softmax.strided"}};
  for (const char* op : kSoftmaxOps) {
    for (const AxisCase& a : axes) {
      SCOPED_TRACE(std::string(op) + " axis " + std::to_string(a.axis));
      expectCudaMatchesReference(
          normCase(op, {runtime(x)}, {{"axis", intAttr(a.axis)}}, a.tactic, 13));
    }
    // The default axis is the last; a rank-1 input is one row.
    expectCudaMatchesReference(normCase(op, {runtime(x)}, {}, "kiln.softmax.warp", 18));
    expectCudaMatchesReference(
        normCase(op, {runtime(uniform({37}, 2))}, {}, "kiln.softmax.warp", 18));
  }
}

// Before opset 13 the input is coerced to 2-D at `axis` (default 1): a row is everything from
// the axis on, so the rows are always contiguous; axis == rank makes rows of one element.
TEST(CudaNorm, SoftmaxFamilyBeforeOpset13CoercesTo2D) {
  const Tensor x = uniform({3, 5, 7}, 3);
  for (const char* op : kSoftmaxOps) {
    for (int opset : {1, 11}) {
      SCOPED_TRACE(std::string(op) + " opset " + std::to_string(opset));
      expectCudaMatchesReference(normCase(op, {runtime(x)}, {}, "kiln.softmax.warp", opset));
      for (int64_t axis : {0, 1, 2, 3, -1, -3}) {
        SCOPED_TRACE("axis " + std::to_string(axis));
        expectCudaMatchesReference(
            normCase(op, {runtime(x)}, {{"axis", intAttr(axis)}}, "kiln.softmax.warp", opset));
      }
    }
  }
}

// Rows longer than 1024 take a block each; the knob forces either kernel at any width.
TEST(CudaNorm, SoftmaxRowKernelsByWidthAndKnob) {
  const Tensor wide = uniform({3, 3000}, 4);
  const Tensor narrow = uniform({9, 100}, 5);
  const Tensor width1024 = uniform({2, 1024}, 6);
  const Tensor width1025 = uniform({2, 1025}, 7);
  for (const char* op : kSoftmaxOps) {
    SCOPED_TRACE(op);
    expectCudaMatchesReference(normCase(op, {runtime(wide)}, {}, "kiln.softmax.block"));
    expectCudaMatchesReference(normCase(op, {runtime(width1024)}, {}, "kiln.softmax.warp"));
    expectCudaMatchesReference(normCase(op, {runtime(width1025)}, {}, "kiln.softmax.block"));
    CudaOpCase warp = normCase(op, {runtime(wide)}, {}, "kiln.softmax.warp");
    warp.route = "-cuda.softmax.row_kernel=warp";
    expectCudaMatchesReference(warp);
    CudaOpCase block = normCase(op, {runtime(narrow)}, {}, "kiln.softmax.block");
    block.route = "-cuda.softmax.row_kernel=block";
    expectCudaMatchesReference(block);
    // Strided lines have one kernel, whatever the knob says.
    CudaOpCase strided =
        normCase(op, {runtime(narrow)}, {{"axis", intAttr(0)}}, "kiln.softmax.strided");
    strided.route = "-cuda.softmax.row_kernel=block";
    expectCudaMatchesReference(strided);
  }
}

// Every launch shape of the row kernels (cuda.softmax.warp_rows, block_threads) and the one-read
// (online) maximum and sum, on rows that hold the values the sums must treat as the reference
// does: a row all -inf (NaN out), a NaN among numbers (NaN row), +inf (NaN row), -inf before and
// among numbers (zeros there), and values far apart (the rescaling when the maximum grows).
TEST(CudaNorm, SoftmaxLaunchShapesAndOnlineSumsMatchTheReference) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int64_t width : {5, 100, 1500}) {
    Tensor x = uniform({7, width}, 9, -60.0f, 60.0f);
    auto row = [&](int64_t r) { return x.mutableData<float>().subspan(r * width, width); };
    for (float& v : row(0)) v = -inf;
    row(1)[width / 2] = nan;
    row(2)[width - 1] = inf;
    row(3)[0] = -inf;
    row(3)[width - 1] = -inf;
    for (int64_t j = 0; j < width; ++j) row(4)[j] = static_cast<float>(j) * 3.0f;  // rising
    for (const char* op : {"Softmax", "LogSoftmax"}) {
      for (const char* kernel : {"warp", "block"}) {
        for (const char* shape : {"-cuda.softmax.warp_rows=2", "-cuda.softmax.warp_rows=8",
                                  "-cuda.softmax.block_threads=128", ""}) {
          for (const char* online : {"on", "off"}) {
            const std::string route = std::string("-cuda.softmax.row_kernel=") + kernel + " " +
                                      shape + " -cuda.softmax.online=" + online;
            SCOPED_TRACE(std::string(op) + " width " + std::to_string(width) + " " + route);
            CudaOpCase c = normCase(op, {runtime(x)}, {}, std::string("kiln.softmax.") + kernel);
            c.route = route;
            expectCudaMatchesReference(c);
          }
        }
      }
    }
  }
}

// Values far apart: without the maximum subtracted, exp would overflow float.
TEST(CudaNorm, SoftmaxOfLargeValuesSubtractsTheMaximum) {
  const Tensor x = uniform({4, 50}, 8, -200.0f, 200.0f);
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    SCOPED_TRACE(op);
    expectCudaMatchesReference(normCase(op, {runtime(x)}, {}, "kiln.softmax.warp"));
    CudaOpCase block = normCase(op, {runtime(x)}, {}, "kiln.softmax.block");
    block.route = "-cuda.softmax.row_kernel=block";
    expectCudaMatchesReference(block);
    expectCudaMatchesReference(
        normCase(op, {runtime(x)}, {{"axis", intAttr(0)}}, "kiln.softmax.strided"));
  }
}

// Hardmax marks the first maximum of a line, or its first NaN: ties and NaNs placed so that each
// kernel's reduction order (lanes, warps, a serial loop) has to keep the lowest index.
TEST(CudaNorm, HardmaxTakesTheFirstMaximumOrTheFirstNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t width = 1500;  // more than a block's 512 threads, and than a warp's 32
  std::vector<float> values(static_cast<size_t>(4 * width), 0.0f);
  auto row = [&](int64_t r) { return values.begin() + r * width; };
  // Row 0: the maximum 5 at 7, 40, 600 and 1400 (lanes, warps and block strides apart).
  for (int64_t j : {7, 40, 600, 1400}) row(0)[j] = 5.0f;
  // Row 1: a larger value past NaNs at 900 and 1100: the first NaN wins.
  row(1)[1100] = nan;
  row(1)[900] = nan;
  row(1)[3] = 9.0f;
  // Row 2: all equal: index 0.
  std::fill(row(2), row(2) + width, -1.0f);
  // Row 3: distinct values, the maximum near the end.
  for (int64_t j = 0; j < width; ++j) row(3)[j] = static_cast<float>((j * 37) % 1499);
  const Tensor x = Tensor::fromVector<float>(Shape{4, width}, values);
  expectCudaMatchesReference(normCase("Hardmax", {runtime(x)}, {}, "kiln.softmax.block"));
  CudaOpCase warp = normCase("Hardmax", {runtime(x)}, {}, "kiln.softmax.warp");
  warp.route = "-cuda.softmax.row_kernel=warp";
  expectCudaMatchesReference(warp);
  // The same lines down axis 0 of the transpose: a thread per line.
  std::vector<float> transposed(values.size());
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t j = 0; j < width; ++j) transposed[j * 4 + r] = values[r * width + j];
  }
  expectCudaMatchesReference(
      normCase("Hardmax", {runtime(Tensor::fromVector<float>(Shape{width, 4}, transposed))},
               {{"axis", intAttr(0)}}, "kiln.softmax.strided"));
}

TEST(CudaNorm, SoftmaxTakesNoFloat64) {
  const Tensor wide = uniform({4, 8}, 9).castTo(DType::kFloat64);
  EXPECT_EQ(tacticWithFallback("Softmax", {runtime(wide)}, {}), "host.reference");
}

// --- LpNormalization ---------------------------------------------------------------------------

TEST(CudaNorm, LpNormalizationBothNormsAnyAxis) {
  const Tensor x = uniform({4, 6, 9}, 10);
  for (int64_t p : {1, 2}) {
    for (int64_t axis : {-1, 0, 1}) {
      SCOPED_TRACE("p " + std::to_string(p) + " axis " + std::to_string(axis));
      expectCudaMatchesReference(normCase("LpNormalization", {runtime(x)},
                                          {{"p", intAttr(p)}, {"axis", intAttr(axis)}},
                                          "kiln.lpnorm"));
    }
  }
  // Long rows take a block each.
  expectCudaMatchesReference(
      normCase("LpNormalization", {runtime(uniform({3, 2000}, 11))}, {}, "kiln.lpnorm"));
}

// --- LayerNormalization ------------------------------------------------------------------------

TEST(CudaNorm, LayerNormalizationOverTheTrailingAxes) {
  const Tensor x = uniform({2, 3, 4, 5}, 12);
  // Scale and bias with the rows' shape, constant or runtime; bias omitted.
  expectCudaMatchesReference(normCase(
      "LayerNormalization", {runtime(x), constant(uniform({5}, 13)), constant(uniform({5}, 14))},
      {}, "kiln.layernorm"));
  expectCudaMatchesReference(
      normCase("LayerNormalization",
               {runtime(x), runtime(uniform({3, 4, 5}, 15)), runtime(uniform({3, 4, 5}, 16))},
               {{"axis", intAttr(1)}, {"epsilon", floatAttr(1e-3f)}}, "kiln.layernorm"));
  expectCudaMatchesReference(normCase("LayerNormalization",
                                      {runtime(x), constant(uniform({4, 5}, 17))},
                                      {{"axis", intAttr(-2)}}, "kiln.layernorm"));
  // axis 0: the whole tensor is one row.
  expectCudaMatchesReference(normCase("LayerNormalization",
                                      {runtime(x), constant(uniform({2, 3, 4, 5}, 18))},
                                      {{"axis", intAttr(0)}}, "kiln.layernorm"));
}

// Scale or bias that broadcast within a row are expanded to the row first.
TEST(CudaNorm, LayerNormalizationExpandsBroadcastParameters) {
  const Tensor x = uniform({2, 3, 4, 5}, 19);
  expectCudaMatchesReference(normCase(
      "LayerNormalization", {runtime(x), constant(uniform({4, 1}, 20)), runtime(uniform({1}, 21))},
      {{"axis", intAttr(-2)}}, "kiln.layernorm"));
  expectCudaMatchesReference(
      normCase("LayerNormalization",
               {runtime(x), runtime(uniform({1, 1, 5}, 22)), constant(uniform({1, 4, 1}, 23))},
               {{"axis", intAttr(1)}}, "kiln.layernorm"));
}

// A scale that differs between rows is the host's (the kernel takes one row of parameters).
TEST(CudaNorm, LayerNormalizationWithPerRowScaleIsNotTaken) {
  const Tensor x = uniform({2, 3, 4, 5}, 24);
  EXPECT_EQ(tacticWithFallback("LayerNormalization", {runtime(x), constant(uniform({3, 1, 1}, 25))},
                               {{"axis", intAttr(2)}}),
            "host.reference");
}

TEST(CudaNorm, LayerNormalizationMeanAndInvStdDevOutputs) {
  const Tensor x = uniform({3, 4, 6}, 26, -5.0f, 9.0f);
  expectCudaMatchesReference(normCase(
      "LayerNormalization", {runtime(x), constant(uniform({6}, 27)), constant(uniform({6}, 28))},
      {}, "kiln.layernorm", 18, 3));
  expectCudaMatchesReference(normCase("LayerNormalization",
                                      {runtime(x), constant(uniform({4, 6}, 29))},
                                      {{"axis", intAttr(1)}}, "kiln.layernorm", 18, 3));
  // bfloat16 statistics (stash_type 16) are the host's.
  EXPECT_EQ(tacticWithFallback("LayerNormalization", {runtime(x), constant(uniform({6}, 30))},
                               {{"stash_type", intAttr(16)}}, 18, 3),
            "host.reference");
}

// Rows past 1024 elements take a block each; a large common offset tests the shifted mean.
TEST(CudaNorm, LayerNormalizationLongRowsAndLargeOffsets) {
  expectCudaMatchesReference(
      normCase("LayerNormalization",
               {runtime(uniform({3, 2500}, 31)), constant(uniform({2500}, 32)),
                constant(uniform({2500}, 33))},
               {}, "kiln.layernorm"));
  expectCudaMatchesReference(
      normCase("LayerNormalization",
               {runtime(uniform({4, 300}, 34, 1000.0f, 1001.0f)), constant(uniform({300}, 35))}, {},
               "kiln.layernorm"));
}

// Statistics in double keep rows far from zero exact: a float mean of values near 10000 would be
// off by up to half a float ulp there (5e-4), a sizeable part of deviations of about 0.3. Short
// rows (a warp each) with the Mean and InvStdDev outputs, instance planes and mean-variance slots.
TEST(CudaNorm, RowStatisticsKeepPrecisionFarFromZero) {
  expectCudaMatchesReference(
      normCase("LayerNormalization",
               {runtime(uniform({8, 64}, 36, 10000.0f, 10001.0f)), constant(uniform({64}, 37))}, {},
               "kiln.layernorm", 18, 3));
  expectCudaMatchesReference(normCase("InstanceNormalization",
                                      {runtime(uniform({2, 3, 7, 9}, 38, -2001.0f, -2000.0f)),
                                       constant(uniform({3}, 39)), constant(uniform({3}, 40))},
                                      {}, "kiln.instancenorm"));
  expectCudaMatchesReference(normCase("MeanVarianceNormalization",
                                      {runtime(uniform({2, 3, 4, 5}, 41, 5000.0f, 5000.5f))}, {},
                                      "kiln.mvn"));
}

// --- InstanceNormalization ---------------------------------------------------------------------

TEST(CudaNorm, InstanceNormalizationOneToThreeSpatialAxes) {
  const std::vector<Shape> shapes = {{2, 3, 5, 7}, {1, 4, 10}, {2, 2, 3, 4, 5}, {1, 2, 40, 40}};
  unsigned seed = 40;
  for (const Shape& shape : shapes) {
    SCOPED_TRACE(shape.toString());
    const int64_t channels = shape[1];
    expectCudaMatchesReference(
        normCase("InstanceNormalization",
                 {runtime(uniform(shape, seed)), constant(uniform({channels}, seed + 1)),
                  constant(uniform({channels}, seed + 2))},
                 {{"epsilon", floatAttr(1e-4f)}}, "kiln.instancenorm"));
    seed += 3;
  }
  // Runtime scale and bias.
  expectCudaMatchesReference(normCase(
      "InstanceNormalization",
      {runtime(uniform({2, 3, 6}, 60)), runtime(uniform({3}, 61)), runtime(uniform({3}, 62))}, {},
      "kiln.instancenorm"));
}

// --- BatchNormalization ------------------------------------------------------------------------

std::vector<OpInput> batchNormInputs(const Shape& x, const Shape& parameters, unsigned seed,
                                     bool constants = true) {
  auto parameter = [&](unsigned s, float low, float high) {
    Tensor t = uniform(parameters, s, low, high);
    return constants ? constant(std::move(t)) : runtime(std::move(t));
  };
  return {runtime(uniform(x, seed)), parameter(seed + 1, -2, 2), parameter(seed + 2, -1, 1),
          parameter(seed + 3, -1, 1), parameter(seed + 4, 0.1f, 3.0f)};
}

TEST(CudaNorm, BatchNormalizationInference) {
  expectCudaMatchesReference(normCase("BatchNormalization", batchNormInputs({2, 3, 4, 5}, {3}, 70),
                                      {{"epsilon", floatAttr(1e-3f)}}, "kiln.batchnorm", 15));
  expectCudaMatchesReference(
      normCase("BatchNormalization", batchNormInputs({6, 4}, {4}, 75), {}, "kiln.batchnorm", 15));
  expectCudaMatchesReference(normCase("BatchNormalization",
                                      batchNormInputs({2, 3, 2, 3, 4}, {3}, 80, false), {},
                                      "kiln.batchnorm", 9));
}

// Before opset 9, spatial=0 keeps statistics per element of a sample.
TEST(CudaNorm, BatchNormalizationPerElementBeforeOpset9) {
  expectCudaMatchesReference(normCase("BatchNormalization", batchNormInputs({2, 3, 4}, {3, 4}, 85),
                                      {{"spatial", intAttr(0)}}, "kiln.batchnorm", 7));
  expectCudaMatchesReference(normCase("BatchNormalization", batchNormInputs({2, 3, 4}, {3}, 90),
                                      {{"spatial", intAttr(1)}}, "kiln.batchnorm", 7));
}

// --- MeanVarianceNormalization -----------------------------------------------------------------

TEST(CudaNorm, MeanVarianceNormalizationOverAnyAxes) {
  const Tensor x = uniform({2, 3, 4, 5}, 95);
  expectCudaMatchesReference(normCase("MeanVarianceNormalization", {runtime(x)}, {}, "kiln.mvn"));
  for (const std::vector<int64_t>& axes :
       std::vector<std::vector<int64_t>>{{1}, {-1}, {0, 1, 2, 3}, {1, 3}, {0}}) {
    SCOPED_TRACE(::testing::PrintToString(axes));
    expectCudaMatchesReference(normCase("MeanVarianceNormalization", {runtime(x)},
                                        {{"axes", intsAttr(axes)}}, "kiln.mvn"));
  }
}

// --- LRN -----------------------------------------------------------------------------------------

// Odd and even sizes (an even window reaches one channel further up than down), windows wider
// than the channels, 1 to 3 spatial axes.
TEST(CudaNorm, LrnEverySizeAndRank) {
  struct LrnCase {
    Shape x;
    int64_t size;
    CudaAttributes attributes;
  };
  const std::vector<LrnCase> cases = {
      {{2, 7, 5, 6}, 5, {}},
      {{2, 7, 5, 6}, 1, {{"alpha", floatAttr(0.5f)}}},
      {{1, 6, 4, 4}, 2, {{"alpha", floatAttr(0.3f)}, {"beta", floatAttr(0.5f)}}},
      {{1, 6, 4, 4}, 4, {{"alpha", floatAttr(0.2f)}, {"bias", floatAttr(2.0f)}}},
      {{2, 3, 9}, 7, {{"alpha", floatAttr(1.0f)}, {"beta", floatAttr(1.5f)}}},
      {{1, 5, 2, 3, 4}, 3, {{"alpha", floatAttr(0.1f)}, {"bias", floatAttr(0.5f)}}},
      {{3, 8, 1}, 3, {{"alpha", floatAttr(0.4f)}}},
  };
  unsigned seed = 120;
  for (const LrnCase& l : cases) {
    SCOPED_TRACE(l.x.toString() + " size " + std::to_string(l.size));
    CudaAttributes attributes = l.attributes;
    attributes["size"] = intAttr(l.size);
    expectCudaMatchesReference(
        normCase("LRN", {runtime(uniform(l.x, seed++))}, attributes, "kiln.lrn"));
  }
}

// float16 (and, from opset 13, bfloat16) directly; float64 stays with the host.
TEST(CudaNorm, LrnReducedTypesAndFloat64) {
  const CudaAttributes attributes = {{"size", intAttr(3)}, {"alpha", floatAttr(0.5f)}};
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    CudaOpCase c = normCase("LRN", {runtime(uniform({2, 6, 5, 5}, 130).castTo(dtype))}, attributes,
                            "kiln.lrn", 13);
    c.rtol = dtype == DType::kFloat16 ? 1e-2 : 5e-2;
    c.atol = c.rtol;
    expectCudaMatchesReference(c);
  }
  EXPECT_EQ(tacticWithFallback("LRN", {runtime(uniform({1, 4, 3, 3}, 131).castTo(DType::kFloat64))},
                               attributes, 13),
            "host.reference");
}

// --- float16 and bfloat16 ---------------------------------------------------------------------

// Every tensor of the node in the reduced type (LayerNormalization's statistics stay float, as
// stash_type 1 gives them): float math on the GPU, double in the reference, both from the same
// rounded inputs and each rounded once at the end.
struct ReducedType {
  DType dtype;
  const char* name;
  double tolerance;
};
const ReducedType kReducedTypes[] = {{DType::kFloat16, "fp16", 1e-2},
                                     {DType::kBFloat16, "bf16", 5e-2}};

// `c` with its inputs in `t`'s type and its tolerance.
CudaOpCase inType(CudaOpCase c, const ReducedType& t) {
  for (OpInput& input : c.inputs) {
    if (!input.tensor.empty()) input.tensor = input.tensor.castTo(t.dtype);
  }
  c.rtol = t.tolerance;
  c.atol = t.tolerance;
  return c;
}

TEST(CudaNorm, ReducedTypesSoftmaxFamilyEveryKernel) {
  const Tensor x = uniform({3, 5, 7}, 200);
  const Tensor wide = uniform({3, 3000}, 201);
  for (const ReducedType& t : kReducedTypes) {
    for (const char* op : kSoftmaxOps) {
      SCOPED_TRACE(std::string(t.name) + " " + op);
      expectCudaMatchesReference(inType(normCase(op, {runtime(x)}, {}, "kiln.softmax.warp"), t));
      expectCudaMatchesReference(
          inType(normCase(op, {runtime(x)}, {{"axis", intAttr(1)}}, "kiln.softmax.strided"), t));
      expectCudaMatchesReference(
          inType(normCase(op, {runtime(wide)}, {}, "kiln.softmax.block"), t));
      CudaOpCase warp = inType(normCase(op, {runtime(wide)}, {}, "kiln.softmax.warp"), t);
      warp.route = "-cuda.softmax.row_kernel=warp";
      expectCudaMatchesReference(warp);
    }
  }
}

// float16 only: ONNX has no bfloat16 LpNormalization, and cuda.precision does not reduce it.
TEST(CudaNorm, ReducedTypesLpNormalization) {
  for (const ReducedType& t : {kReducedTypes[0]}) {
    for (int64_t p : {1, 2}) {
      for (int64_t axis : {-1, 0}) {
        SCOPED_TRACE(std::string(t.name) + " p " + std::to_string(p) + " axis " +
                     std::to_string(axis));
        expectCudaMatchesReference(
            inType(normCase("LpNormalization", {runtime(uniform({4, 6, 9}, 210))},
                            {{"p", intAttr(p)}, {"axis", intAttr(axis)}}, "kiln.lpnorm"),
                   t));
      }
    }
  }
}

TEST(CudaNorm, ReducedTypesLayerNormalization) {
  const Tensor x = uniform({2, 3, 4, 5}, 220);
  for (const ReducedType& t : kReducedTypes) {
    SCOPED_TRACE(t.name);
    expectCudaMatchesReference(
        inType(normCase("LayerNormalization",
                        {runtime(x), constant(uniform({5}, 221)), constant(uniform({5}, 222))}, {},
                        "kiln.layernorm"),
               t));
    // Runtime parameters; a broadcast scale and bias expanded to the row (two-byte elements).
    expectCudaMatchesReference(inType(
        normCase("LayerNormalization",
                 {runtime(x), runtime(uniform({3, 4, 5}, 223)), runtime(uniform({3, 4, 5}, 224))},
                 {{"axis", intAttr(1)}}, "kiln.layernorm"),
        t));
    expectCudaMatchesReference(
        inType(normCase("LayerNormalization",
                        {runtime(x), constant(uniform({4, 1}, 225)), runtime(uniform({1}, 226))},
                        {{"axis", intAttr(-2)}}, "kiln.layernorm"),
               t));
    // Long rows: a block each.
    expectCudaMatchesReference(
        inType(normCase("LayerNormalization",
                        {runtime(uniform({3, 2500}, 227)), constant(uniform({2500}, 228)),
                         constant(uniform({2500}, 229))},
                        {}, "kiln.layernorm"),
               t));
    // Float Mean and InvStdDev beside the reduced Y.
    expectCudaMatchesReference(
        inType(normCase("LayerNormalization",
                        {runtime(uniform({3, 4, 6}, 230)), constant(uniform({6}, 231)),
                         constant(uniform({6}, 232))},
                        {}, "kiln.layernorm", 18, 3),
               t));
  }
}

// cuda.precision=fp16 with norm_fp32 off makes the statistics reduced too (every float32 output
// of a reduced node gets the type): the step writes them in the type, casts bring them back.
// Rows of whole 16-byte vectors up to 1024 wide take the vectorised warp kernel (the row in
// registers): one to four vectors a lane, the last partly filled (776 = 97 vectors), without a
// bias, with the Mean and InvStdDev outputs, and far from zero; 770 is not whole vectors and
// takes the scalar warp kernel.
TEST(CudaNorm, ReducedLayerNormalizationVectorRows) {
  unsigned seed = 250;
  for (const ReducedType& t : kReducedTypes) {
    SCOPED_TRACE(t.name);
    for (const int64_t width : {8, 256, 768, 776, 1024, 770}) {
      SCOPED_TRACE("width " + std::to_string(width));
      expectCudaMatchesReference(inType(
          normCase("LayerNormalization",
                   {runtime(uniform({37, width}, seed)), constant(uniform({width}, seed + 1)),
                    constant(uniform({width}, seed + 2))},
                   {}, "kiln.layernorm"),
          t));
      seed += 3;
    }
    expectCudaMatchesReference(inType(normCase("LayerNormalization",
                                               {runtime(uniform({5, 7, 64}, seed, 100.0f, 101.0f)),
                                                runtime(uniform({64}, seed + 1))},
                                               {}, "kiln.layernorm", 18, 3),
                                      t));
  }
}

// kiln.AddLayerNormalization (X, Scale, B?, Skip) -> (Y, Sum?): X + Skip rounded to the type,
// then normalised; the scalar warp kernel (5, 770 wide), the vectorised one (768, reduced types),
// and a block a row (2500); with and without the Sum output and the bias.
CudaOpCase addNormCase(const Shape& shape, bool withSum, bool withBias, unsigned seed) {
  const int64_t width = shape.dims().back();
  CudaOpCase c = normCase("AddLayerNormalization",
                          {runtime(uniform(shape, seed)), constant(uniform({width}, seed + 1)),
                           withBias ? constant(uniform({width}, seed + 2)) : OpInput{},
                           runtime(uniform(shape, seed + 3))},
                          {}, "kiln.add_layernorm", 18, withSum ? 2 : 1);
  c.domain = ir::kKilnDomain;
  return c;
}

TEST(CudaNorm, AddLayerNormalizationEveryKernel) {
  unsigned seed = 270;
  for (const Shape& shape : {Shape{3, 5}, Shape{4, 768}, Shape{5, 770}, Shape{2, 2500}}) {
    for (const bool withSum : {false, true}) {
      for (const bool withBias : {false, true}) {
        SCOPED_TRACE(shape.toString() + (withSum ? " with the sum" : "") +
                     (withBias ? " with a bias" : ""));
        expectCudaMatchesReference(addNormCase(shape, withSum, withBias, seed += 4));
        for (const ReducedType& t : kReducedTypes) {
          SCOPED_TRACE(t.name);
          expectCudaMatchesReference(inType(addNormCase(shape, withSum, withBias, seed += 4), t));
        }
      }
    }
  }
}

TEST(CudaNorm, ReducedLayerNormalizationStatisticsUnderPrecision) {
  for (const ReducedType& t : kReducedTypes) {
    SCOPED_TRACE(t.name);
    CudaOpCase c = normCase("LayerNormalization",
                            {runtime(uniform({3, 4, 6}, 240)), constant(uniform({6}, 241)),
                             constant(uniform({6}, 242))},
                            {}, "kiln.layernorm", 18, 3);
    c.route = std::string("-cuda.precision=") + t.name + " -cuda.precision.norm_fp32=off";
    // Against float32, the inputs' rounding counts too.
    c.rtol = 2 * t.tolerance;
    c.atol = 2 * t.tolerance;
    expectCudaMatchesReference(c);
    BuilderConfig config;
    ASSERT_TRUE(config.setBuildRoute(c.route).isOk());
    auto build = buildCuda(makeSingleOpGraph(c.opType, c.inputs, c.attributes, c.opset, 3), config);
    ASSERT_TRUE(build.isOk()) << build.status().toString();
    for (const auto& step : build->plan.steps()) {
      if (step->node->opType == "LayerNormalization") {
        EXPECT_EQ(step->precision, t.name);
      }
    }
  }
}

// ONNX has no bfloat16 InstanceNormalization (nor does the reference executor): bfloat16 comes
// through cuda.precision (norm_fp32 off), against the float32 reference.
TEST(CudaNorm, ReducedTypesInstanceNormalization) {
  unsigned seed = 250;
  for (const ReducedType& t : kReducedTypes) {
    for (const Shape& shape : {Shape{2, 3, 5, 7}, Shape{1, 2, 40, 40}}) {
      SCOPED_TRACE(std::string(t.name) + " " + shape.toString());
      const int64_t channels = shape[1];
      CudaOpCase c =
          normCase("InstanceNormalization",
                   {runtime(uniform(shape, seed)), constant(uniform({channels}, seed + 1)),
                    runtime(uniform({channels}, seed + 2))},
                   {}, "kiln.instancenorm");
      if (t.dtype == DType::kFloat16) {
        c = inType(c, t);
      } else {
        c.route = "-cuda.precision=bf16 -cuda.precision.norm_fp32=off";
        c.rtol = 2 * t.tolerance;
        c.atol = 2 * t.tolerance;
      }
      expectCudaMatchesReference(c);
      seed += 3;
    }
  }
}

TEST(CudaNorm, ReducedTypesBatchNormalizationAndMeanVariance) {
  for (const ReducedType& t : kReducedTypes) {
    SCOPED_TRACE(t.name);
    expectCudaMatchesReference(
        inType(normCase("BatchNormalization", batchNormInputs({2, 3, 4, 5}, {3}, 260),
                        {{"epsilon", floatAttr(1e-3f)}}, "kiln.batchnorm", 15),
               t));
    expectCudaMatchesReference(
        inType(normCase("BatchNormalization", batchNormInputs({2, 3, 2, 3, 4}, {3}, 265, false), {},
                        "kiln.batchnorm", 15),
               t));
    expectCudaMatchesReference(
        inType(normCase("MeanVarianceNormalization", {runtime(uniform({2, 3, 4, 5}, 270))}, {},
                        "kiln.mvn"),
               t));
  }
}

}  // namespace
}  // namespace kiln::testing
