// The CUDA backend's kiln.Attention (kernels/attention_steps.cc, attention.cu): the two batched
// products around the masked row softmax, against the reference executor, over every attribute
// (scale, transpose_k, nan_to_zero), mask broadcasts, rank 2 to 4, rows of every width the
// softmax kernel distinguishes (a warp each with 4, 8, 16 or 32 scores a lane; a block each
// beyond 1024), each product source, and float32, float16 and bfloat16.
// (cuda_test_util.h's `if (...) EXPECT_EQ(...)` trips -Wdangling-else; until it has braces.)
#pragma GCC diagnostic ignored "-Wdangling-else"
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kiln/ir/op_schema.h"

namespace kiln::testing {
namespace {

using ir::Shape;

constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

const std::vector<std::string> kRoutes = {"", "-cuda.gemm.algo=timed", "-cuda.gemm.source=native"};

OpInput runtimeInput(Shape shape, unsigned seed, float scale = 1.0f) {
  return {uniformTensor(std::move(shape), seed, -scale, scale), false};
}

CudaOpCase attention(std::vector<OpInput> inputs, CudaAttributes attributes,
                     const std::string& route) {
  CudaOpCase c{.opType = "Attention",
               .inputs = std::move(inputs),
               .attributes = std::move(attributes),
               .domain = ir::kKilnDomain,
               .route = route,
               .expectTactic = "kiln.attention.unfused"};
  c.rtol = kRtol;
  c.atol = kAtol;
  return c;
}

// Q [..., Sq, D], K' [..., D, Skv] (or K [..., Skv, D] with transpose_k), V [..., Skv, Dv].
struct Geometry {
  std::string name;
  std::vector<int64_t> batch;
  int64_t sq, skv, d, dv;
};

std::vector<Geometry> geometries() {
  return {
      {"rank2", {}, 5, 7, 8, 6},
      {"rank3", {3}, 4, 9, 16, 8},
      {"rank4", {2, 3}, 5, 7, 8, 4},
      {"one_query", {2, 2}, 1, 13, 8, 8},
      {"one_key", {2}, 6, 1, 4, 3},
      {"rows_of_200", {2}, 3, 200, 16, 8},    // 8 scores a lane
      {"rows_of_500", {2}, 3, 500, 8, 8},     // 16 a lane
      {"rows_of_1024", {1}, 3, 1024, 8, 4},   // 32 a lane, every lane full
      {"long_rows", {1, 2}, 3, 1500, 16, 8},  // beyond a warp's 1024: a block per row
  };
}

Shape withBatch(const std::vector<int64_t>& batch, std::vector<int64_t> tail) {
  std::vector<int64_t> dims = batch;
  dims.insert(dims.end(), tail.begin(), tail.end());
  return Shape(std::move(dims));
}

TEST(CudaAttention, ShapesTransposedKAndScale) {
  unsigned seed = 1;
  for (const Geometry& g : geometries()) {
    for (int transposeK = 0; transposeK < 2; ++transposeK) {
      SCOPED_TRACE(g.name + " transpose_k=" + std::to_string(transposeK));
      for (const std::string& route : kRoutes) {
        const Shape k =
            transposeK ? withBatch(g.batch, {g.skv, g.d}) : withBatch(g.batch, {g.d, g.skv});
        expectCudaMatchesReference(attention(
            {runtimeInput(withBatch(g.batch, {g.sq, g.d}), seed += 4), runtimeInput(k, seed + 1),
             runtimeInput(withBatch(g.batch, {g.skv, g.dv}), seed + 2)},
            {{"scale", floatAttr(0.35f)}, {"transpose_k", intAttr(transposeK)}}, route));
      }
    }
  }
}

TEST(CudaAttention, DefaultAttributes) {
  // scale 1, transpose_k 0, nan_to_zero 0.
  expectCudaMatchesReference(attention(
      {runtimeInput({2, 4, 8}, 50), runtimeInput({2, 8, 6}, 51), runtimeInput({2, 6, 5}, 52)}, {},
      ""));
}

TEST(CudaAttention, MaskBroadcasts) {
  // Scores [2, 3, 5, 7]: masks broadcast along every combination of axes, down to a scalar.
  const std::vector<Shape> masks = {{7},          {5, 7},       {1, 7},    {5, 1}, {2, 1, 1, 7},
                                    {1, 3, 5, 1}, {2, 3, 5, 7}, {3, 1, 7}, {1},    {}};
  unsigned seed = 100;
  for (const Shape& mask : masks) {
    SCOPED_TRACE("mask " + mask.toString());
    for (const std::string& route : kRoutes) {
      expectCudaMatchesReference(
          attention({runtimeInput({2, 3, 5, 8}, seed += 5), runtimeInput({2, 3, 7, 8}, seed + 1),
                     runtimeInput({2, 3, 7, 4}, seed + 2), runtimeInput(mask, seed + 3, 3.0f)},
                    {{"scale", floatAttr(0.5f)}, {"transpose_k", intAttr(1)}}, route));
    }
  }
}

TEST(CudaAttention, ConstantMask) {
  OpInput mask{uniformTensor({1, 1, 6}, 200, -4.0f, 0.0f), true};
  expectCudaMatchesReference(attention({runtimeInput({2, 3, 8}, 201), runtimeInput({2, 8, 6}, 202),
                                        runtimeInput({2, 6, 4}, 203), mask},
                                       {{"scale", floatAttr(0.25f)}}, ""));
}

// A mask whose second query row is all -inf (a fully masked row): its softmax is 0 / 0 = NaN,
// which nan_to_zero turns into zeros (and without it, NaN reaches the output as the reference's).
ir::Tensor fullyMaskedRow() {
  ir::Tensor mask = uniformTensor({4, 6}, 300, -2.0f, 0.0f);
  auto values = mask.mutableData<float>();
  for (int64_t j = 0; j < 6; ++j) {
    values[static_cast<size_t>(6 + j)] = -std::numeric_limits<float>::infinity();
  }
  values[3] = -std::numeric_limits<float>::infinity();  // one masked key in the first row
  return mask;
}

TEST(CudaAttention, NanToZeroOnFullyMaskedRows) {
  for (int nanToZero = 0; nanToZero < 2; ++nanToZero) {
    SCOPED_TRACE("nan_to_zero=" + std::to_string(nanToZero));
    for (const std::string& route : kRoutes) {
      expectCudaMatchesReference(
          attention({runtimeInput({2, 4, 8}, 310),
                     runtimeInput({2, 6, 8}, 311),
                     runtimeInput({2, 6, 5}, 312),
                     {fullyMaskedRow(), false}},
                    {{"transpose_k", intAttr(1)}, {"nan_to_zero", intAttr(nanToZero)}}, route));
    }
  }
}

TEST(CudaAttention, NoKeysGivesZeros) {
  // Skv = 0: every softmax is empty and every output element an empty sum.
  expectCudaMatchesReference(attention(
      {runtimeInput({2, 3, 8}, 400), runtimeInput({2, 8, 0}, 401), runtimeInput({2, 0, 4}, 402)},
      {}, ""));
}

// --- float16 and bfloat16 ----------------------------------------------------------------------

// Q, K, V and the mask stored in the reduced type, as cuda.precision makes them. The GPU keeps the
// scores in float32 but rounds the probabilities to the reduced type before P · V; the reference
// computes all in double from the same reduced inputs and rounds the output once.
struct ReducedType {
  ir::DType dtype;
  std::string name;
  double rtol, atol;
};

const std::vector<ReducedType>& reducedTypes() {
  static const std::vector<ReducedType> types = {
      {ir::DType::kFloat16, "fp16", 1e-2, 1e-2},
      {ir::DType::kBFloat16, "bf16", 5e-2, 5e-2},
  };
  return types;
}

void expectReduced(CudaOpCase c, const ReducedType& type) {
  SCOPED_TRACE(type.name);
  for (OpInput& input : c.inputs) input.tensor = input.tensor.castTo(type.dtype);
  c.rtol = type.rtol;
  c.atol = type.atol;
  expectCudaMatchesReference(c);
}

TEST(CudaAttention, ReducedPrecisionShapes) {
  unsigned seed = 500;
  for (const ReducedType& type : reducedTypes()) {
    for (const Geometry& g : geometries()) {
      for (int transposeK = 0; transposeK < 2; ++transposeK) {
        SCOPED_TRACE(g.name + " transpose_k=" + std::to_string(transposeK));
        for (const std::string& route : kRoutes) {
          const Shape k =
              transposeK ? withBatch(g.batch, {g.skv, g.d}) : withBatch(g.batch, {g.d, g.skv});
          expectReduced(
              attention({runtimeInput(withBatch(g.batch, {g.sq, g.d}), seed += 4),
                         runtimeInput(k, seed + 1),
                         runtimeInput(withBatch(g.batch, {g.skv, g.dv}), seed + 2)},
                        {{"scale", floatAttr(0.35f)}, {"transpose_k", intAttr(transposeK)}}, route),
              type);
        }
      }
    }
  }
}

TEST(CudaAttention, ReducedPrecisionMasks) {
  // A BERT-like head (64 wide, 128 keys) under masks broadcast per key, per row and in full.
  const std::vector<Shape> masks = {{2, 1, 1, 128}, {1, 1, 16, 128}, {2, 4, 16, 128}, {}};
  unsigned seed = 600;
  for (const ReducedType& type : reducedTypes()) {
    for (const Shape& mask : masks) {
      SCOPED_TRACE("mask " + mask.toString());
      for (const std::string& route : kRoutes) {
        expectReduced(
            attention(
                {runtimeInput({2, 4, 16, 64}, seed += 5), runtimeInput({2, 4, 128, 64}, seed + 1),
                 runtimeInput({2, 4, 128, 64}, seed + 2), runtimeInput(mask, seed + 3, 3.0f)},
                {{"scale", floatAttr(0.125f)}, {"transpose_k", intAttr(1)}}, route),
            type);
      }
    }
  }
}

TEST(CudaAttention, ReducedPrecisionFullyMaskedRows) {
  for (const ReducedType& type : reducedTypes()) {
    for (int nanToZero = 0; nanToZero < 2; ++nanToZero) {
      SCOPED_TRACE("nan_to_zero=" + std::to_string(nanToZero));
      expectReduced(
          attention({runtimeInput({2, 4, 8}, 710),
                     runtimeInput({2, 6, 8}, 711),
                     runtimeInput({2, 6, 5}, 712),
                     {fullyMaskedRow(), false}},
                    {{"transpose_k", intAttr(1)}, {"nan_to_zero", intAttr(nanToZero)}}, ""),
          type);
    }
  }
}

TEST(CudaAttention, ReducedPrecisionNoKeys) {
  for (const ReducedType& type : reducedTypes()) {
    expectReduced(attention({runtimeInput({2, 3, 8}, 720), runtimeInput({2, 8, 0}, 721),
                             runtimeInput({2, 0, 4}, 722)},
                            {}, ""),
                  type);
  }
}

}  // namespace
}  // namespace kiln::testing
