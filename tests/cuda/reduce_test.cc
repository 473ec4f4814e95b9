// The CUDA reduction steps (kernels/reduce_steps.cc) against the reference executor: every
// Reduce* op over each pattern of axes (all, innermost, outermost, middle, contiguous and split
// runs) with and without keepdims, axes as attribute and as input, rows short (a warp per
// output) and long (a block), every block size, each element type the reference takes (integer
// wrap-around, truncating means, saturating L2/LogSum), NaN and infinities, empty reductions,
// noop_with_empty_axes, and ArgMax/ArgMin with ties both ways.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "cuda_test_util.h"

namespace kiln::testing {
namespace {

using ir::DType;
using ir::Shape;
using ir::Tensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

const char* const kReduceOps[] = {"ReduceSum",       "ReduceMean",     "ReduceMax", "ReduceMin",
                                  "ReduceProd",      "ReduceL1",       "ReduceL2",  "ReduceLogSum",
                                  "ReduceLogSumExp", "ReduceSumSquare"};

OpInput runtime(Tensor tensor) { return {std::move(tensor), false}; }
OpInput constant(Tensor tensor) { return {std::move(tensor), true}; }

Tensor axesTensor(std::vector<int64_t> axes) {
  return Tensor::fromVector<int64_t>(Shape{static_cast<int64_t>(axes.size())}, axes);
}

Tensor values(std::vector<float> v) {
  return Tensor::fromVector<float>(Shape{static_cast<int64_t>(v.size())}, v);
}

Tensor randomInts(DType dtype, Shape shape, unsigned seed, int64_t low, int64_t high) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> pick(low, high);
  std::vector<int64_t> v(static_cast<size_t>(shape.elementCount()));
  for (int64_t& x : v) x = pick(rng);
  return Tensor::fromVector<int64_t>(std::move(shape), v).castTo(dtype);
}

// The input range where `op` is well conditioned: positive sums for LogSum, products near one.
std::pair<float, float> rangeFor(const std::string& op) {
  if (op == "ReduceLogSum") return {0.1f, 2.0f};
  if (op == "ReduceProd") return {0.7f, 1.4f};
  return {-2.0f, 2.0f};
}

double rtolFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return 1e-5;
    case DType::kFloat16:
      return 2e-3;
    case DType::kBFloat16:
      return 1.6e-2;
    case DType::kFloat64:
      return 1e-9;
    default:
      return 0;
  }
}

// A Reduce* case: axes (nullopt: none given) as the op's opset takes them.
CudaOpCase reduceCase(const std::string& op, const Tensor& x,
                      std::optional<std::vector<int64_t>> axes, int64_t keepdims, int opset = 18,
                      std::string route = "") {
  CudaOpCase c;
  c.opType = op;
  c.opset = opset;
  c.inputs = {runtime(x)};
  c.attributes = {{"keepdims", intAttr(keepdims)}};
  const int axesInputSince = op == "ReduceSum" ? 13 : 18;
  if (axes) {
    if (opset >= axesInputSince) {
      c.inputs.push_back(constant(axesTensor(*axes)));
    } else {
      c.attributes["axes"] = intsAttr(*axes);
    }
  }
  c.route = std::move(route);
  c.expectTactic = "kiln.reduce";
  c.rtol = rtolFor(x.dtype());
  c.atol = ir::isFloating(x.dtype()) ? 1e-6 : 0;
  return c;
}

const std::vector<std::vector<int64_t>> kAxisPatterns = {
    {},            // every axis
    {-1},          // innermost: rows
    {0},           // outermost: columns
    {1},           // middle: columns
    {1, 2},        // a contiguous middle run
    {0, 2},        // split runs, innermost kept
    {1, 3},        // split runs, innermost reduced
    {0, 1, 2, 3},  // every axis, named
};

TEST(CudaReduce, EveryOpOverEveryAxisPattern) {
  unsigned seed = 1;
  for (const char* op : kReduceOps) {
    const auto [low, high] = rangeFor(op);
    const Tensor x = uniformTensor({3, 4, 5, 6}, seed++, low, high);
    for (const auto& axes : kAxisPatterns) {
      for (int64_t keepdims : {0, 1}) {
        SCOPED_TRACE(std::string(op) + " axes " + std::to_string(axes.size()) + " keepdims " +
                     std::to_string(keepdims));
        expectCudaMatchesReference(reduceCase(op, x, axes, keepdims));
      }
    }
    // Axes as an attribute, before opset 18 (13 for ReduceSum).
    expectCudaMatchesReference(reduceCase(op, x, std::vector<int64_t>{2, 3}, 1, 11));
    // No axes at all: every axis.
    expectCudaMatchesReference(reduceCase(op, x, std::nullopt, 0));
  }
}

TEST(CudaReduce, LongAndShortRowsAndColumnsUnderEveryBlockSize) {
  const std::vector<Shape> shapes = {{3, 5000}, {2000, 7}, {700, 40}, {1, 100000}};
  for (const std::string route : {"", "-cuda.reduce.block=128", "-cuda.reduce.block=512"}) {
    SCOPED_TRACE(route);
    unsigned seed = 20;
    for (const Shape& shape : shapes) {
      const Tensor x = uniformTensor(shape, seed++, -1, 1);
      for (const char* op :
           {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceLogSumExp", "ReduceL2"}) {
        expectCudaMatchesReference(reduceCase(op, x, std::vector<int64_t>{-1}, 1, 18, route));
        expectCudaMatchesReference(reduceCase(op, x, std::vector<int64_t>{0}, 0, 18, route));
      }
    }
  }
}

TEST(CudaReduce, FloatTypes) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat64}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    unsigned seed = 30;
    for (const char* op : kReduceOps) {
      const auto [low, high] = rangeFor(op);
      const Tensor x = uniformTensor({4, 9, 33}, seed++, low, high).castTo(dtype);
      for (const auto& axes :
           {std::vector<int64_t>{-1}, std::vector<int64_t>{1}, std::vector<int64_t>{0, 2}}) {
        expectCudaMatchesReference(reduceCase(op, x, axes, 1));
      }
    }
  }
}

TEST(CudaReduce, IntegersWrapTruncateAndSaturate) {
  for (DType dtype : {DType::kInt32, DType::kInt64, DType::kUInt32, DType::kUInt64}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const bool isSigned = ir::isSigned(dtype);
    // Large values wrap Sum, SumSquare and Prod; negative ones make Mean truncate toward zero.
    const Tensor big = randomInts(dtype, {5, 7, 9}, 40, isSigned ? -2000000000 : 0, 2000000000);
    const Tensor small = randomInts(dtype, {5, 7, 9}, 41, isSigned ? -9 : 0, 9);
    for (const char* op : kReduceOps) {
      for (const auto& axes :
           {std::vector<int64_t>{-1}, std::vector<int64_t>{0}, std::vector<int64_t>{0, 2}}) {
        expectCudaMatchesReference(reduceCase(op, small, axes, 0));
        // Sums in double of squares this large would make L2's truncation order-sensitive.
        const std::string name = op;
        if (name != "ReduceLogSum" && name != "ReduceLogSumExp" && name != "ReduceL2") {
          expectCudaMatchesReference(reduceCase(op, big, axes, 1));
        }
      }
    }
  }
  // int8 and uint8 (opset 12+) and bool (opset 20) reduce by Max and Min only.
  for (DType dtype : {DType::kInt8, DType::kUInt8}) {
    const Tensor x = randomInts(dtype, {6, 10}, 42, ir::isSigned(dtype) ? -128 : 0, 127);
    for (const char* op : {"ReduceMax", "ReduceMin"}) {
      expectCudaMatchesReference(reduceCase(op, x, std::vector<int64_t>{1}, 1));
      expectCudaMatchesReference(reduceCase(op, x, std::vector<int64_t>{0}, 0));
    }
  }
  const Tensor flags = randomInts(DType::kInt64, {6, 10}, 43, 0, 1).castTo(DType::kBool);
  for (const char* op : {"ReduceMax", "ReduceMin"}) {
    expectCudaMatchesReference(reduceCase(op, flags, std::vector<int64_t>{1}, 1, 20));
    expectCudaMatchesReference(reduceCase(op, flags, std::vector<int64_t>{0}, 0, 20));
  }
}

TEST(CudaReduce, NaNAndInfinities) {
  // Rows of four: a NaN, +inf, -inf, both infinities, all -inf, all finite.
  const Tensor x = values({kNaN,  1,     2,     3,      //
                           kInf,  1,     2,     3,      //
                           -kInf, 1,     2,     3,      //
                           kInf,  -kInf, 0,     1,      //
                           -kInf, -kInf, -kInf, -kInf,  //
                           0.5f,  -1,    2,     -0.0f})
                       .reshaped({6, 4});
  for (const char* op : kReduceOps) {
    expectCudaMatchesReference(reduceCase(op, x, std::vector<int64_t>{1}, 0));
    expectCudaMatchesReference(reduceCase(op, x, std::vector<int64_t>{0}, 0));
  }
}

TEST(CudaReduce, EmptyReductionsGiveTheIdentities) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt32, DType::kInt64}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const Tensor x = Tensor(DType::kFloat32, Shape{3, 0, 4}).castTo(dtype);
    for (const char* op : kReduceOps) {
      expectCudaMatchesReference(reduceCase(op, x, std::vector<int64_t>{1}, 1));
      expectCudaMatchesReference(reduceCase(op, x, std::vector<int64_t>{1}, 0));
    }
  }
}

TEST(CudaReduce, NoopWithEmptyAxesStillAppliesTheOp) {
  const Tensor x = uniformTensor({3, 5}, 50, 0.1f, 2.0f);
  for (const char* op : kReduceOps) {
    CudaOpCase c = reduceCase(op, x, std::nullopt, 1);
    c.attributes["noop_with_empty_axes"] = intAttr(1);
    expectCudaMatchesReference(c);
  }
}

// --- ArgMax / ArgMin ---------------------------------------------------------------------------

CudaOpCase argCase(const std::string& op, const Tensor& x, int64_t axis, int64_t keepdims,
                   int64_t selectLast, std::string route = "") {
  CudaOpCase c;
  c.opType = op;
  c.inputs = {runtime(x)};
  c.attributes = {{"axis", intAttr(axis)},
                  {"keepdims", intAttr(keepdims)},
                  {"select_last_index", intAttr(selectLast)}};
  c.opset = 13;
  c.route = std::move(route);
  c.expectTactic = "kiln.reduce";
  c.rtol = 0;
  c.atol = 0;
  return c;
}

TEST(CudaReduce, ArgMaxAndArgMinWithTiesBothWays) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                      DType::kInt32, DType::kInt64, DType::kUInt8, DType::kInt8}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    // Few distinct values, so ties are common.
    const Tensor x = randomInts(DType::kInt64, {3, 4, 5}, 60, 0, 3).castTo(dtype);
    for (const char* op : {"ArgMax", "ArgMin"}) {
      for (int64_t axis : {0, 1, 2, -1}) {
        for (int64_t keepdims : {0, 1}) {
          for (int64_t last : {0, 1}) {
            expectCudaMatchesReference(argCase(op, x, axis, keepdims, last));
          }
        }
      }
    }
  }
  // Long lines (a block per output) and many short ones.
  for (const std::string route : {"", "-cuda.reduce.block=128", "-cuda.reduce.block=512"}) {
    const Tensor longRows = randomInts(DType::kInt64, {4, 3000}, 61, 0, 50).castTo(DType::kFloat32);
    const Tensor shortRows = uniformTensor({3000, 7}, 62, -1, 1);
    for (const char* op : {"ArgMax", "ArgMin"}) {
      for (int64_t last : {0, 1}) {
        expectCudaMatchesReference(argCase(op, longRows, -1, 1, last, route));
        expectCudaMatchesReference(argCase(op, longRows, 0, 0, last, route));
        expectCudaMatchesReference(argCase(op, shortRows, 1, 0, last, route));
      }
    }
  }
  // NaN wins (the first, or the last with select_last_index).
  const Tensor nans = values({1, kNaN, 3, kNaN, kInf, -kInf, 2, 2}).reshaped({2, 4});
  for (const char* op : {"ArgMax", "ArgMin"}) {
    for (int64_t last : {0, 1}) {
      expectCudaMatchesReference(argCase(op, nans, 1, 1, last));
      expectCudaMatchesReference(argCase(op, nans, 0, 1, last));
    }
  }
}

// Few outputs over a long range (a global pool over NHWC): the range is split over blocks, each
// split's partial states combined in order; every reducer that splits, in each float type, and
// integer sums and arg-extrema with ties.
TEST(CudaReduce, SplitColumnsForFewOutputsOverLongRanges) {
  unsigned seed = 90;
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    SCOPED_TRACE(std::string(ir::dtypeName(dtype)));
    const Tensor nhwc = uniformTensor({4, 40, 36, 24}, seed++, -2, 2).castTo(dtype);
    for (const char* op :
         {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceL2", "ReduceLogSumExp"}) {
      SCOPED_TRACE(op);
      expectCudaMatchesReference(reduceCase(op, nhwc, std::vector<int64_t>{1, 2}, 1));
    }
  }
  // More, shorter splits (cuda.reduce.split_blocks, cuda.reduce.split_min_chunk).
  const Tensor wide = uniformTensor({8, 56, 56, 40}, seed++, -2, 2).castTo(DType::kFloat16);
  for (const char* route : {"-cuda.reduce.split_blocks=1056 -cuda.reduce.split_min_chunk=64",
                            "-cuda.reduce.split_blocks=2112 -cuda.reduce.split_min_chunk=128",
                            "-cuda.reduce.split_blocks=528 -cuda.reduce.split_min_chunk=256"}) {
    SCOPED_TRACE(route);
    for (const char* op : {"ReduceMean", "ReduceMax"}) {
      expectCudaMatchesReference(reduceCase(op, wide, std::vector<int64_t>{1, 2}, 1, 18, route));
    }
  }
  const Tensor ints = randomInts(DType::kInt64, {6000, 5}, seed++, -9, 9).castTo(DType::kInt32);
  expectCudaMatchesReference(reduceCase("ReduceSum", ints, std::vector<int64_t>{0}, 0));
  const Tensor ties = randomInts(DType::kInt64, {9000, 3}, seed++, 0, 4).castTo(DType::kFloat32);
  for (const char* op : {"ArgMax", "ArgMin"}) {
    for (int64_t last : {0, 1}) expectCudaMatchesReference(argCase(op, ties, 0, 1, last));
  }
}

}  // namespace
}  // namespace kiln::testing
