// The CUDA pooling steps (kernels/pool_steps.cc) against the reference executor: MaxPool (with
// its Indices output in either storage order) and AveragePool over 1 to 3 spatial axes with
// strides, pads, dilations, auto_pad and ceil_mode, count_include_pad both ways, the global pools,
// and kiln's NHWC forms of each; in float32, and in float16 and bfloat16 (the types
// cuda.precision gives a reduced node).
#include <gtest/gtest.h>

#include <cstring>
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

OpInput runtime(Tensor tensor) { return {std::move(tensor), false}; }

Tensor uniform(Shape shape, unsigned seed) { return uniformTensor(std::move(shape), seed, -2, 2); }

// Max is exact; averages sum in float on the GPU and in double in the reference.
CudaOpCase poolCase(std::string op, Tensor x, CudaAttributes attributes, std::string tactic,
                    int opset = 18, std::string domain = "") {
  CudaOpCase c;
  c.opType = std::move(op);
  c.inputs = {runtime(std::move(x))};
  c.attributes = std::move(attributes);
  c.opset = opset;
  c.domain = std::move(domain);
  c.expectTactic = std::move(tactic);
  const bool max = c.opType.find("Max") != std::string::npos;
  c.rtol = max ? 0 : 1e-5;
  c.atol = max ? 0 : 1e-6;
  return c;
}

// A windowed pool's geometry, as MaxPool and AveragePool both take it.
struct Window {
  std::string name;
  Shape x;
  CudaAttributes attributes;
};

std::vector<Window> windows() {
  return {
      {"3x3_stride2_pads",
       {2, 3, 9, 11},
       {{"kernel_shape", intsAttr({3, 3})},
        {"strides", intsAttr({2, 2})},
        {"pads", intsAttr({1, 1, 1, 1})}}},
      {"2x2_stride2",
       {1, 4, 8, 6},
       {{"kernel_shape", intsAttr({2, 2})}, {"strides", intsAttr({2, 2})}}},
      {"asymmetric_pads",
       {1, 2, 7, 8},
       {{"kernel_shape", intsAttr({3, 2})}, {"pads", intsAttr({0, 1, 2, 1})}}},
      // The last window of each axis starts inside the input but reaches past the padding.
      {"ceil_mode",
       {1, 2, 8, 9},
       {{"kernel_shape", intsAttr({3, 3})},
        {"strides", intsAttr({2, 2})},
        {"pads", intsAttr({1, 0, 0, 1})},
        {"ceil_mode", intAttr(1)}}},
      {"dilated",
       {1, 3, 11, 10},
       {{"kernel_shape", intsAttr({2, 3})},
        {"dilations", intsAttr({3, 2})},
        {"pads", intsAttr({1, 1, 1, 1})}}},
      {"same_upper",
       {2, 2, 7, 10},
       {{"kernel_shape", intsAttr({3, 4})},
        {"strides", intsAttr({2, 3})},
        {"auto_pad", stringAttr("SAME_UPPER")}}},
      {"same_lower",
       {2, 2, 7, 10},
       {{"kernel_shape", intsAttr({3, 4})},
        {"strides", intsAttr({2, 3})},
        {"auto_pad", stringAttr("SAME_LOWER")}}},
      {"valid",
       {1, 2, 6, 7},
       {{"kernel_shape", intsAttr({2, 3})}, {"auto_pad", stringAttr("VALID")}}},
      {"1d",
       {2, 3, 15},
       {{"kernel_shape", intsAttr({4})}, {"strides", intsAttr({3})}, {"pads", intsAttr({1, 2})}}},
      {"3d",
       {1, 2, 5, 6, 7},
       {{"kernel_shape", intsAttr({2, 2, 3})},
        {"strides", intsAttr({2, 1, 2})},
        {"pads", intsAttr({0, 1, 1, 1, 0, 1})}}},
      {"3d_ceil_mode",
       {1, 1, 6, 5, 7},
       {{"kernel_shape", intsAttr({3, 2, 2})},
        {"strides", intsAttr({2, 2, 2})},
        {"ceil_mode", intAttr(1)}}},
      {"global_sized_window", {2, 3, 4, 5}, {{"kernel_shape", intsAttr({4, 5})}}},
  };
}

TEST(CudaPool, MaxPoolEveryWindow) {
  unsigned seed = 1;
  for (const Window& w : windows()) {
    SCOPED_TRACE(w.name);
    expectCudaMatchesReference(
        poolCase("MaxPool", uniform(w.x, seed++), w.attributes, "kiln.pool"));
  }
}

TEST(CudaPool, AveragePoolEveryWindowBothPadCounts) {
  unsigned seed = 100;
  for (const Window& w : windows()) {
    if (w.attributes.count("dilations")) continue;  // from opset 19, below
    for (int64_t include : {0, 1}) {
      SCOPED_TRACE(w.name + " count_include_pad " + std::to_string(include));
      CudaAttributes attributes = w.attributes;
      attributes["count_include_pad"] = intAttr(include);
      expectCudaMatchesReference(
          poolCase("AveragePool", uniform(w.x, seed++), attributes, "kiln.pool"));
    }
  }
}

TEST(CudaPool, AveragePoolDilationsFromOpset19) {
  for (int64_t include : {0, 1}) {
    SCOPED_TRACE("count_include_pad " + std::to_string(include));
    expectCudaMatchesReference(poolCase("AveragePool", uniform({1, 3, 11, 10}, 200),
                                        {{"kernel_shape", intsAttr({2, 3})},
                                         {"dilations", intsAttr({3, 2})},
                                         {"pads", intsAttr({1, 2, 1, 1})},
                                         {"count_include_pad", intAttr(include)}},
                                        "kiln.pool", 19));
  }
}

// NaN loses to any number in a window (a window of NaN only gives NaN); infinities are numbers.
TEST(CudaPool, MaxPoolNaNLosesToNumbers) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  Tensor x = uniform({1, 1, 6, 6}, 300);
  auto values = x.mutableData<float>();
  values[0] = nan;  // the first tap of the first window
  values[1] = nan;
  for (int64_t i : {14, 15, 20, 21}) values[static_cast<size_t>(i)] = nan;  // a whole window
  values[27] = -inf;
  values[33] = inf;
  expectCudaMatchesReference(
      poolCase("MaxPool", x, {{"kernel_shape", intsAttr({2, 2})}, {"strides", intsAttr({2, 2})}},
               "kiln.pool"));
  expectCudaMatchesReference(
      poolCase("MaxPool", x, {{"kernel_shape", intsAttr({3, 3})}, {"pads", intsAttr({1, 1, 1, 1})}},
               "kiln.pool"));
}

// MaxPool's Indices output and 8-bit MaxPool are the GPU's (cases below); float64 MaxPool is the
// host's.
TEST(CudaPool, MaxPoolIndicesAndInt8AreTakenFloat64IsNot) {
  BuilderConfig config;
  ASSERT_TRUE(config.setBuildRoute("").isOk());
  const CudaAttributes attributes = {{"kernel_shape", intsAttr({2, 2})}};
  auto indices = buildCuda(
      makeSingleOpGraph("MaxPool", {runtime(uniform({1, 2, 4, 4}, 310))}, attributes, 18, 2),
      config);
  ASSERT_TRUE(indices.isOk()) << indices.status().toString();
  EXPECT_EQ(cudaTacticOf(*indices, "MaxPool"), "kiln.pool");
  auto int8 = buildCuda(
      makeSingleOpGraph("MaxPool", {runtime(uniform({1, 2, 4, 4}, 311).castTo(DType::kInt8))},
                        attributes),
      config);
  ASSERT_TRUE(int8.isOk()) << int8.status().toString();
  EXPECT_EQ(cudaTacticOf(*int8, "MaxPool"), "kiln.pool");
  auto wide = buildCuda(
      makeSingleOpGraph("MaxPool", {runtime(uniform({1, 2, 4, 4}, 312).castTo(DType::kFloat64))},
                        attributes),
      config);
  ASSERT_TRUE(wide.isOk()) << wide.status().toString();
  EXPECT_EQ(cudaTacticOf(*wide, "MaxPool"), "host.reference");
}

// ONNX's MaxPool takes int8 and uint8 too: exact, over the full range of each, windows wholly in
// padding included (the type's lowest value, as the reference).
TEST(CudaPool, MaxPoolEightBitIntegersEveryWindow) {
  unsigned seed = 400;
  for (const Window& w : windows()) {
    SCOPED_TRACE(w.name);
    expectCudaMatchesReference(poolCase("MaxPool",
                                        uniformTensor(w.x, seed++, -128, 127).castTo(DType::kInt8),
                                        w.attributes, "kiln.pool"));
    expectCudaMatchesReference(poolCase("MaxPool",
                                        uniformTensor(w.x, seed++, 0, 255).castTo(DType::kUInt8),
                                        w.attributes, "kiln.pool"));
  }
  // A window wholly in padding.
  expectCudaMatchesReference(
      poolCase("MaxPool", uniformTensor({1, 1, 3, 3}, seed, 0, 255).castTo(DType::kUInt8),
               {{"kernel_shape", intsAttr({2, 2})},
                {"strides", intsAttr({3, 3})},
                {"pads", intsAttr({2, 2, 0, 0})}},
               "kiln.pool"));
}

// --- MaxPool's Indices ---------------------------------------------------------------------------

// Indices count in the NCHW input: (n * C + c) * the spatial size plus the taken element's
// spatial offset, row-major, or column-major over the spatial axes with storage_order=1; -1 where
// a window lies wholly in padding. Both outputs exact.
CudaOpCase indicesCase(Tensor x, CudaAttributes attributes, int64_t storageOrder, int opset = 18) {
  attributes["storage_order"] = intAttr(storageOrder);
  CudaOpCase c = poolCase("MaxPool", std::move(x), std::move(attributes), "kiln.pool", opset);
  c.outputCount = 2;
  return c;
}

TEST(CudaPool, MaxPoolIndicesEveryWindowBothStorageOrders) {
  unsigned seed = 320;
  for (const Window& w : windows()) {
    for (int64_t storageOrder : {0, 1}) {
      SCOPED_TRACE(w.name + " storage_order " + std::to_string(storageOrder));
      expectCudaMatchesReference(indicesCase(uniform(w.x, seed++), w.attributes, storageOrder));
    }
  }
  // Opset 8, the first with Indices (no ceil_mode, no dilations).
  expectCudaMatchesReference(indicesCase(uniform({2, 3, 7, 6}, seed++),
                                         {{"kernel_shape", intsAttr({3, 2})},
                                          {"strides", intsAttr({2, 2})},
                                          {"pads", intsAttr({1, 0, 1, 1})}},
                                         1, 8));
}

// Ties go to the first tap, NaN loses to numbers (a window of NaN reports its first NaN), and a
// window wholly in padding (pads as large as the kernel) reports -1 (and -inf).
TEST(CudaPool, MaxPoolIndicesOfTiesNaNAndPaddingOnlyWindows) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = uniform({1, 2, 6, 6}, 340);
  auto values = x.mutableData<float>();
  values[0] = nan;
  for (int64_t i : {14, 15, 20, 21}) values[static_cast<size_t>(i)] = nan;
  for (int64_t i : {38, 39, 44, 45}) values[static_cast<size_t>(i)] = 1.5f;  // a tie
  for (int64_t storageOrder : {0, 1}) {
    SCOPED_TRACE("storage_order " + std::to_string(storageOrder));
    expectCudaMatchesReference(indicesCase(
        x, {{"kernel_shape", intsAttr({2, 2})}, {"strides", intsAttr({2, 2})}}, storageOrder));
    expectCudaMatchesReference(indicesCase(x,
                                           {{"kernel_shape", intsAttr({2, 2})},
                                            {"strides", intsAttr({2, 2})},
                                            {"pads", intsAttr({2, 2, 2, 2})}},
                                           storageOrder));
  }
}

// float16 directly; bfloat16 through cuda.precision (the Indices stay int64), on values bfloat16
// holds exactly and distinct within any window, so that the float32 reference takes the same
// elements.
TEST(CudaPool, MaxPoolIndicesInReducedTypes) {
  const Window w = windows()[0];
  expectCudaMatchesReference(
      indicesCase(uniform(w.x, 350).castTo(DType::kFloat16), w.attributes, 0));
  Tensor exact(DType::kFloat32, w.x);
  auto values = exact.mutableData<float>();
  for (size_t i = 0; i < values.size(); ++i) {
    // Multiples of 1/4 in [-32, 32), distinct over any 256 consecutive elements.
    values[i] = static_cast<float>(static_cast<int64_t>(i * 37 % 256) - 128) / 4.0f;
  }
  CudaOpCase c = indicesCase(exact, w.attributes, 1);
  c.route = "-cuda.precision=bf16";
  expectCudaMatchesReference(c);
}

// --- Global pools ------------------------------------------------------------------------------

TEST(CudaPool, GlobalPoolsOverAnySpatialRank) {
  // The last is a plane of 2000 elements: several passes of the block's 256 threads.
  const std::vector<Shape> shapes = {
      {2, 3, 7, 9}, {2, 3, 5}, {1, 2, 3, 4, 5}, {1, 2, 40, 50}, {3, 1, 1, 1}};
  unsigned seed = 400;
  for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(std::string(op) + " " + shape.toString());
      expectCudaMatchesReference(poolCase(op, uniform(shape, seed++), {}, "kiln.global_pool"));
    }
  }
}

// --- kiln's NHWC pools -------------------------------------------------------------------------

struct NhwcCase {
  std::string op;
  Shape x;  // [N, H, W, C]
  CudaAttributes attributes;
  const char* tactic;
};

TEST(CudaPool, NhwcPoolsMatchTheReference) {
  const CudaAttributes window = {{"kernel_shape", intsAttr({3, 3})},
                                 {"strides", intsAttr({2, 2})},
                                 {"pads", intsAttr({1, 0, 1, 1})}};
  CudaAttributes includePad = window;
  includePad["count_include_pad"] = intAttr(1);
  CudaAttributes ceil = window;
  ceil["ceil_mode"] = intAttr(1);
  const std::vector<NhwcCase> cases = {
      {"NhwcMaxPool", {2, 9, 11, 3}, window, "kiln.pool"},
      {"NhwcMaxPool", {1, 8, 9, 16}, ceil, "kiln.pool"},
      {"NhwcAveragePool", {2, 9, 11, 3}, window, "kiln.pool"},
      {"NhwcAveragePool", {2, 9, 11, 5}, includePad, "kiln.pool"},
      {"NhwcAveragePool", {1, 8, 9, 4}, ceil, "kiln.pool"},
      {"NhwcGlobalAveragePool", {2, 7, 9, 5}, {}, "kiln.global_pool"},
      {"NhwcGlobalMaxPool", {2, 7, 9, 5}, {}, "kiln.global_pool"},
      {"NhwcGlobalAveragePool", {1, 30, 40, 3}, {}, "kiln.global_pool"},
  };
  unsigned seed = 500;
  for (const NhwcCase& n : cases) {
    SCOPED_TRACE(n.op + " " + n.x.toString());
    CudaOpCase c =
        poolCase(n.op, uniform(n.x, seed++), n.attributes, n.tactic, 18, ir::kKilnDomain);
    expectCudaMatchesReference(c);
    // The step records the layout it reads.
    BuilderConfig config;
    ASSERT_TRUE(config.setBuildRoute("-cuda.host_fallback=off").isOk());
    auto build = buildCuda(
        makeSingleOpGraph(c.opType, c.inputs, c.attributes, c.opset, 1, c.domain), config);
    ASSERT_TRUE(build.isOk()) << build.status().toString();
    ASSERT_EQ(build->plan.steps().size(), 1u);
    EXPECT_EQ(build->plan.steps()[0]->layout, "nhwc");
  }
}

// NHWC 2-D pools whose channels come in 16-byte groups take the vectorised kernel
// (cuda.pool.vector): checked against the reference, and bit for bit against the scalar kernel
// (-cuda.pool.vector=off), over every 2-D window, both average kinds, float16 and float32, NaN
// and infinities included.
TEST(CudaPool, NhwcVectorisedPoolsMatchTheReferenceAndTheScalarKernel) {
  unsigned seed = 700;
  for (const Window& w : windows()) {
    if (w.x.rank() != 4 || w.attributes.count("dilations")) continue;
    for (const char* op : {"NhwcMaxPool", "NhwcAveragePool"}) {
      for (int64_t include : {0, 1}) {
        if (std::string(op) == "NhwcMaxPool" && include) continue;
        for (DType dtype : {DType::kFloat16, DType::kFloat32}) {
          const int64_t channels = dtype == DType::kFloat16 ? 24 : 12;
          SCOPED_TRACE(w.name + " " + op + " " + std::string(ir::dtypeName(dtype)) +
                       " include_pad " + std::to_string(include));
          Tensor x = uniform(Shape{w.x[0], w.x[2], w.x[3], channels}, seed++);
          x.mutableData<float>()[1] = std::numeric_limits<float>::quiet_NaN();
          x.mutableData<float>()[channels + 2] = std::numeric_limits<float>::infinity();
          if (dtype == DType::kFloat16) x = x.castTo(DType::kFloat16);
          CudaAttributes attributes = w.attributes;
          if (std::string(op) == "NhwcAveragePool")
            attributes["count_include_pad"] = intAttr(include);
          CudaOpCase c = poolCase(op, x, attributes, "kiln.pool", 18, ir::kKilnDomain);
          if (dtype == DType::kFloat16)
            c.rtol = c.atol = std::string(op) == "NhwcMaxPool" ? 0 : 2e-3;
          expectCudaMatchesReference(c);
          // The two kernels, one after the other on the same input.
          std::vector<ir::Tensor> outputs[2];
          for (int vector = 0; vector < 2; ++vector) {
            BuilderConfig config;
            ASSERT_TRUE(
                config
                    .setBuildRoute(std::string("-cuda.host_fallback=off -cuda.pool.vector=") +
                                   (vector ? "on" : "off"))
                    .isOk());
            auto build = buildCuda(
                makeSingleOpGraph(c.opType, c.inputs, c.attributes, c.opset, 1, c.domain), config);
            ASSERT_TRUE(build.isOk()) << build.status().toString();
            const std::string detail = build->plan.steps()[0]->detail();
            EXPECT_EQ(detail.find("16-byte loads") != std::string::npos, vector == 1) << detail;
            if (!cuda::deviceAvailable()) GTEST_SKIP() << "no GPU";
            auto ran = build->plan.run({x});
            ASSERT_TRUE(ran.isOk()) << ran.status().toString();
            outputs[vector] = std::move(ran).value();
          }
          const ir::Tensor& scalar = outputs[0][0];
          const ir::Tensor& vectorised = outputs[1][0];
          ASSERT_EQ(scalar.byteSize(), vectorised.byteSize());
          EXPECT_EQ(std::memcmp(scalar.rawData(), vectorised.rawData(), scalar.byteSize()), 0);
        }
      }
    }
  }
}

// --- float16 and bfloat16 ---------------------------------------------------------------------

// The same cases in a reduced type. float16 cases give the node a float16 x: a maximum is one of
// the inputs (exact); an average is a float sum rounded once, against the reference's double
// rounded once. ONNX has no bfloat16 pools before opset 22 (nor does the reference executor), so
// bfloat16 cases keep a float32 x and let cuda.precision=bf16 make the node bfloat16 between
// casts, and compare with the float32 reference (the input's rounding counts too).
struct ReducedType {
  DType dtype;
  const char* name;
  double tolerance;  // for averages, and for anything through cuda.precision
  bool direct;       // x in the type; else through cuda.precision
};
const ReducedType kReducedTypes[] = {{DType::kFloat16, "fp16", 1e-2, true},
                                     {DType::kBFloat16, "bf16", 5e-2, false}};

CudaOpCase reducedPoolCase(const ReducedType& t, std::string op, const Tensor& x,
                           CudaAttributes attributes, std::string tactic, std::string domain = "") {
  CudaOpCase c = poolCase(std::move(op), t.direct ? x.castTo(t.dtype) : x, std::move(attributes),
                          std::move(tactic), 18, std::move(domain));
  if (!t.direct) c.route = std::string("-cuda.precision=") + t.name;
  if (!t.direct || c.opType.find("Max") == std::string::npos) {
    c.rtol = t.tolerance;
    c.atol = t.tolerance;
  }
  return c;
}

TEST(CudaPool, ReducedTypesEveryWindow) {
  unsigned seed = 600;
  for (const ReducedType& t : kReducedTypes) {
    for (const Window& w : windows()) {
      SCOPED_TRACE(std::string(t.name) + " " + w.name);
      expectCudaMatchesReference(
          reducedPoolCase(t, "MaxPool", uniform(w.x, seed++), w.attributes, "kiln.pool"));
      if (w.attributes.count("dilations")) continue;  // AveragePool takes them from opset 19
      for (int64_t include : {0, 1}) {
        CudaAttributes attributes = w.attributes;
        attributes["count_include_pad"] = intAttr(include);
        expectCudaMatchesReference(
            reducedPoolCase(t, "AveragePool", uniform(w.x, seed++), attributes, "kiln.pool"));
      }
    }
  }
}

TEST(CudaPool, ReducedTypesGlobalPools) {
  const std::vector<Shape> shapes = {{2, 3, 7, 9}, {2, 3, 5}, {1, 2, 40, 50}};
  unsigned seed = 700;
  for (const ReducedType& t : kReducedTypes) {
    for (const char* op : {"GlobalAveragePool", "GlobalMaxPool"}) {
      for (const Shape& shape : shapes) {
        SCOPED_TRACE(std::string(t.name) + " " + op + " " + shape.toString());
        expectCudaMatchesReference(
            reducedPoolCase(t, op, uniform(shape, seed++), {}, "kiln.global_pool"));
      }
    }
  }
}

TEST(CudaPool, ReducedTypesNhwcPools) {
  const CudaAttributes window = {{"kernel_shape", intsAttr({3, 3})},
                                 {"strides", intsAttr({2, 2})},
                                 {"pads", intsAttr({1, 0, 1, 1})}};
  CudaAttributes includePad = window;
  includePad["count_include_pad"] = intAttr(1);
  const std::vector<NhwcCase> cases = {
      {"NhwcMaxPool", {2, 9, 11, 8}, window, "kiln.pool"},
      {"NhwcAveragePool", {2, 9, 11, 3}, window, "kiln.pool"},
      {"NhwcAveragePool", {2, 9, 11, 5}, includePad, "kiln.pool"},
      {"NhwcGlobalAveragePool", {2, 7, 9, 16}, {}, "kiln.global_pool"},
      {"NhwcGlobalMaxPool", {2, 7, 9, 5}, {}, "kiln.global_pool"},
  };
  unsigned seed = 800;
  for (const ReducedType& t : kReducedTypes) {
    for (const NhwcCase& n : cases) {
      SCOPED_TRACE(std::string(t.name) + " " + n.op + " " + n.x.toString());
      expectCudaMatchesReference(
          reducedPoolCase(t, n.op, uniform(n.x, seed++), n.attributes, n.tactic, ir::kKilnDomain));
    }
  }
}

}  // namespace
}  // namespace kiln::testing
