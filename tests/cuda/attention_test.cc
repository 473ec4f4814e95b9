// The CUDA backend's kiln.Attention (kernels/attention_steps.cc, attention.cu): the two batched
// products around the masked row softmax, against the reference executor, over every attribute
// (scale, transpose_k, nan_to_zero), mask broadcasts, rank 2 to 4, rows of every width the
// softmax kernel distinguishes (a warp each with 4, 8, 16 or 32 scores a lane; a block each
// beyond 1024), each product source, and float32, float16 and bfloat16; then the fused kernel
// (cuda.attention.kernel=flash, flash_attention.cu) over its head sizes, lengths and masks.
// (cuda_test_util.h's `if (...) EXPECT_EQ(...)` trips -Wdangling-else; until it has braces.)
#pragma GCC diagnostic ignored "-Wdangling-else"
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

// The unfused tactic's cases name it: the default (flash) would fuse the float16 ones it takes.
CudaOpCase attention(std::vector<OpInput> inputs, CudaAttributes attributes,
                     const std::string& route) {
  CudaOpCase c{.opType = "Attention",
               .inputs = std::move(inputs),
               .attributes = std::move(attributes),
               .domain = ir::kKilnDomain,
               .route = route.find("cuda.attention.kernel") == std::string::npos
                            ? "-cuda.attention.kernel=unfused " + route
                            : route,
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
  for (OpInput& input : c.inputs) {
    if (!input.tensor.empty()) input.tensor = input.tensor.castTo(type.dtype);  // not omitted ones
  }
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

// --- cuda.attention.kernel=flash ---------------------------------------------------------------

// The fused kernel (flash_attention.cu): float16 and bfloat16, head sizes 32, 64 and 128, query
// blocks of 64 rows and key tiles of 64, so lengths below, at and across those (1, 7, 49, 64, 77,
// 128, 512) exercise full and partial blocks and tiles.
const std::string kFlashRoute = "-cuda.attention.kernel=flash";

CudaOpCase flashAttention(std::vector<OpInput> inputs, CudaAttributes attributes) {
  CudaOpCase c = attention(std::move(inputs), std::move(attributes), kFlashRoute);
  c.expectTactic = "kiln.attention.flash";
  return c;
}

// Q [..., sq, d], K (transpose_k) or K', V [..., skv, d], random in [-1, 1] (Q scaled up so the
// softmax is not flat), and the mask if given.
std::vector<OpInput> flashInputs(const std::vector<int64_t>& batch, int64_t sq, int64_t skv,
                                 int64_t d, bool transposeK, unsigned seed) {
  const Shape k = transposeK ? withBatch(batch, {skv, d}) : withBatch(batch, {d, skv});
  return {runtimeInput(withBatch(batch, {sq, d}), seed, 3.0f), runtimeInput(k, seed + 1),
          runtimeInput(withBatch(batch, {skv, d}), seed + 2)};
}

CudaAttributes flashAttributes(int64_t d, bool transposeK, int nanToZero = 0) {
  return {{"scale", floatAttr(1.0f / std::sqrt(static_cast<float>(d)))},
          {"transpose_k", intAttr(transposeK ? 1 : 0)},
          {"nan_to_zero", intAttr(nanToZero)}};
}

TEST(CudaAttention, FlashShapes) {
  struct Lengths {
    int64_t sq, skv;
  };
  const std::vector<Lengths> lengths = {{1, 1},     {7, 7},     {49, 49}, {64, 64}, {77, 77},
                                        {128, 128}, {512, 512}, {1, 77},  {77, 1},  {49, 128},
                                        {128, 49},  {7, 512},   {512, 7}};
  unsigned seed = 800;
  for (const ReducedType& type : reducedTypes()) {
    for (const int64_t d : {32, 64, 128}) {
      for (const Lengths& l : lengths) {
        // Rank 2 to 4; the long ones with one batch entry to keep the reference quick.
        const std::vector<int64_t> batch = std::max(l.sq, l.skv) >= 512 ? std::vector<int64_t>{1}
                                           : l.sq == l.skv              ? std::vector<int64_t>{2, 3}
                                                                        : std::vector<int64_t>{};
        for (const bool transposeK : {false, true}) {
          SCOPED_TRACE("d=" + std::to_string(d) + " sq=" + std::to_string(l.sq) + " skv=" +
                       std::to_string(l.skv) + " transpose_k=" + std::to_string(transposeK));
          expectReduced(flashAttention(flashInputs(batch, l.sq, l.skv, d, transposeK, seed += 4),
                                       flashAttributes(d, transposeK)),
                        type);
        }
      }
    }
  }
}

// cuda.attention.flash.warps: CTAs of 2 and 8 warps (32 and 128 query rows) over lengths below,
// at and across those blocks, with and without a mask, K and K'.
TEST(CudaAttention, FlashWarps) {
  struct Lengths {
    int64_t sq, skv;
  };
  const std::vector<Lengths> lengths = {{1, 1}, {31, 49}, {33, 77}, {128, 128}, {200, 130}};
  unsigned seed = 1500;
  for (const char* warps : {"2", "8"}) {
    for (const ReducedType& type : reducedTypes()) {
      for (const int64_t d : {32, 64, 128}) {
        for (const Lengths& l : lengths) {
          for (const bool masked : {false, true}) {
            const bool transposeK = masked;
            SCOPED_TRACE(std::string("warps=") + warps + " d=" + std::to_string(d) +
                         " sq=" + std::to_string(l.sq) + " skv=" + std::to_string(l.skv) +
                         (masked ? " masked" : ""));
            std::vector<OpInput> inputs = flashInputs({2}, l.sq, l.skv, d, transposeK, seed += 5);
            if (masked) inputs.push_back(runtimeInput({l.sq, l.skv}, seed + 3, 3.0f));
            CudaOpCase c = attention(std::move(inputs), flashAttributes(d, transposeK),
                                     kFlashRoute + " -cuda.attention.flash.warps=" + warps);
            c.expectTactic = "kiln.attention.flash";
            expectReduced(std::move(c), type);
          }
        }
      }
    }
  }
}

TEST(CudaAttention, FlashMaskBroadcasts) {
  // Scores [2, 3, 77, 130]: a full mask, BERT's per-key [B, 1, 1, Skv], GPT-2's per-position
  // [1, 1, Sq, Skv], one row for all [Skv], and one value per query row [Sq, 1].
  const std::vector<Shape> masks = {
      {2, 3, 77, 130}, {2, 1, 1, 130}, {1, 1, 77, 130}, {130}, {77, 1}};
  unsigned seed = 900;
  for (const ReducedType& type : reducedTypes()) {
    for (const Shape& mask : masks) {
      for (const bool transposeK : {false, true}) {
        SCOPED_TRACE("mask " + mask.toString() + " transpose_k=" + std::to_string(transposeK));
        std::vector<OpInput> inputs = flashInputs({2, 3}, 77, 130, 64, transposeK, seed += 5);
        inputs.push_back(runtimeInput(mask, seed + 3, 3.0f));
        expectReduced(flashAttention(std::move(inputs), flashAttributes(64, transposeK)), type);
      }
    }
  }
}

// A causal mask [1, 1, sq, skv]: key j is -inf for query i when j > i + (skv - sq), so the first
// rows see only the first keys and every later key tile is all -inf for them (with fewer keys
// than queries, the first sq - skv rows see none).
ir::Tensor causalMask(int64_t sq, int64_t skv) {
  ir::Tensor mask = uniformTensor({1, 1, sq, skv}, 1000, -1.0f, 0.0f);
  auto values = mask.mutableData<float>();
  for (int64_t i = 0; i < sq; ++i) {
    for (int64_t j = std::max<int64_t>(0, i + (skv - sq) + 1); j < skv; ++j) {
      values[static_cast<size_t>(i * skv + j)] = -std::numeric_limits<float>::infinity();
    }
  }
  return mask;
}

TEST(CudaAttention, FlashCausalMask) {
  struct Case {
    int64_t sq, skv, d;
  };
  unsigned seed = 1100;
  for (const ReducedType& type : reducedTypes()) {
    for (const Case& c : std::vector<Case>{
             {77, 77, 64}, {130, 130, 32}, {512, 512, 64}, {1, 200, 128}, {49, 120, 64}}) {
      for (const bool transposeK : {false, true}) {
        SCOPED_TRACE("sq=" + std::to_string(c.sq) + " skv=" + std::to_string(c.skv) +
                     " d=" + std::to_string(c.d) + " transpose_k=" + std::to_string(transposeK));
        std::vector<OpInput> inputs = flashInputs({1, 2}, c.sq, c.skv, c.d, transposeK, seed += 4);
        inputs.push_back({causalMask(c.sq, c.skv), false});
        expectReduced(flashAttention(std::move(inputs), flashAttributes(c.d, transposeK)), type);
      }
    }
  }
}

// A mask [70, 100] (two query blocks, two key tiles) with rows 3 and 65 all -inf (NaN, or zeros
// with nan_to_zero), row 10 -inf over the first key tile only and row 11 over the second only
// (the running maximum starts at -inf, or later tiles add nothing), and some scattered -inf.
ir::Tensor maskedRows() {
  constexpr int64_t kSkv = 100;
  ir::Tensor mask = uniformTensor({70, kSkv}, 1200, -2.0f, 0.0f);
  auto values = mask.mutableData<float>();
  auto set = [&](int64_t i, int64_t from, int64_t to) {
    for (int64_t j = from; j < to; ++j) {
      values[static_cast<size_t>(i * kSkv + j)] = -std::numeric_limits<float>::infinity();
    }
  };
  set(3, 0, kSkv);
  set(65, 0, kSkv);
  set(10, 0, 64);
  set(11, 64, kSkv);
  set(20, 5, 6);
  set(40, 70, 71);
  return mask;
}

TEST(CudaAttention, FlashFullyMaskedRows) {
  unsigned seed = 1300;
  for (const ReducedType& type : reducedTypes()) {
    for (int nanToZero = 0; nanToZero < 2; ++nanToZero) {
      for (const bool transposeK : {false, true}) {
        SCOPED_TRACE("nan_to_zero=" + std::to_string(nanToZero) +
                     " transpose_k=" + std::to_string(transposeK));
        std::vector<OpInput> inputs = flashInputs({2}, 70, 100, 64, transposeK, seed += 4);
        inputs.push_back({maskedRows(), false});
        expectReduced(flashAttention(std::move(inputs), flashAttributes(64, transposeK, nanToZero)),
                      type);
      }
    }
  }
}

TEST(CudaAttention, FlashConstantMask) {
  // The mask as a weight (uploaded with the constants) rather than a runtime input.
  std::vector<OpInput> inputs = flashInputs({2, 2}, 33, 90, 32, true, 1400);
  inputs.push_back({uniformTensor({2, 1, 1, 90}, 1404, -4.0f, 0.0f), true});
  for (const ReducedType& type : reducedTypes()) {
    expectReduced(flashAttention(inputs, flashAttributes(32, true)), type);
  }
}

// The output of `c` with its inputs cast to `type`, run under `route`; the step's detail in
// `detail`. Empty without a GPU.
ir::Tensor runFlash(CudaOpCase c, const ReducedType& type, const std::string& route,
                    std::string* detail) {
  for (OpInput& input : c.inputs) {
    if (!input.tensor.empty()) input.tensor = input.tensor.castTo(type.dtype);
  }
  StepReport step;
  ir::Tensor output = runCudaCase(c, route, &step);
  *detail = step.detail;
  return output;
}

// cuda.attention.flash.skip_masked (on by default): with a constant mask, each CTA walks only the
// key tiles its rows can see. Causal masks with as many keys as queries, more keys (the later
// rows see every tile) and fewer, under every CTA size; a mask whose first rows and a whole query
// block are all -inf (NaN rows, or zeros with nan_to_zero: an empty range of tiles). Each against
// the reference, and bit for bit against every tile walked (-cuda.attention.flash.skip_masked=off),
// with the tiles walked as the detail says.
TEST(CudaAttention, FlashSkipsTheKeyTilesAConstantMaskHides) {
  struct Case {
    std::string name;
    int64_t sq, skv;
    const char* warps;
    int nanToZero;
    const char* walked;  // "W of T key tiles walked" in the detail
  };
  const std::vector<Case> cases = {
      // 8 blocks of 64 rows: block r walks r + 1 tiles.
      {"causal_512", 512, 512, "4", 0, "36 of 64"},
      // 16 blocks of 32 rows: block r walks r / 2 + 1 tiles.
      {"causal_512_2warps", 512, 512, "2", 0, "72 of 128"},
      // 2 blocks of 128 rows over 4 tiles: block 0 sees keys up to 127 + 23 (3 tiles), block 1
      // all of them.
      {"causal_more_keys", 200, 223, "8", 0, "7 of 8"},
      // Row i sees keys up to i - 53 (rows 0-52 none): 1, 2 and 2 tiles for the 3 blocks.
      {"causal_fewer_keys", 130, 77, "4", 0, "5 of 6"},
      // Row i sees keys up to i - 50, rows 0-2 and 64-127 none: 1, 0, 3 and 3 tiles.
      {"masked_blocks", 200, 150, "4", 0, "7 of 12"},
      {"masked_blocks_nan_to_zero", 200, 150, "4", 1, "7 of 12"},
  };
  unsigned seed = 1600;
  for (const Case& c : cases) {
    ir::Tensor mask = causalMask(c.sq, c.skv);
    if (c.name.rfind("masked_blocks", 0) == 0) {
      // Causal, and then rows 0-2 and the whole second block (rows 64-127) all -inf, and row 150
      // -inf over its first tile only.
      auto values = mask.mutableData<float>();
      const float inf = std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < c.sq; ++i) {
        for (int64_t j = 0; j < c.skv; ++j) {
          if (i < 3 || (i >= 64 && i < 128) || (i == 150 && j < 64)) {
            values[static_cast<size_t>(i * c.skv + j)] = -inf;
          }
        }
      }
    }
    for (const ReducedType& type : reducedTypes()) {
      for (const bool transposeK : {false, true}) {
        SCOPED_TRACE(c.name + " " + type.name + " transpose_k=" + std::to_string(transposeK));
        std::vector<OpInput> inputs = flashInputs({1, 2}, c.sq, c.skv, 64, transposeK, seed += 4);
        inputs.push_back({mask, true});
        // Split keys off: with them, walking every tile would split other ranges.
        const std::string route = kFlashRoute +
                                  " -cuda.attention.flash.warps=" + std::string(c.warps) +
                                  " -cuda.attention.flash.split=off";
        CudaOpCase skipping =
            flashAttention(std::move(inputs), flashAttributes(64, transposeK, c.nanToZero));
        skipping.route = route;
        expectReduced(skipping, type);
        std::string skipped, walkedAll;
        const ir::Tensor got = runFlash(skipping, type, route, &skipped);
        const ir::Tensor all =
            runFlash(skipping, type, route + " -cuda.attention.flash.skip_masked=off", &walkedAll);
        EXPECT_NE(skipped.find(std::string(c.walked) + " key tiles walked (the rest masked)"),
                  std::string::npos)
            << skipped;
        EXPECT_EQ(walkedAll.find("key tiles walked"), std::string::npos) << walkedAll;
        if (!cuda::deviceAvailable()) continue;
        ASSERT_EQ(got.byteSize(), all.byteSize());
        EXPECT_EQ(std::memcmp(got.rawData(), all.rawData(), got.byteSize()), 0);
      }
    }
  }
}

// cuda.attention.flash.split: a query block's key tiles over several CTAs, their partial rows
// merged by the combine kernel. Each case against the reference at 1, 2 and 4 tiles a CTA and
// auto, with the split the detail says:
// - causal masks (constant, so the ranges are the skipped ones: 1 to 8 tiles a block), with 2
//   and 8 warps;
// - 11 tiles unmasked, 200 queries and 700 keys (a partial last tile), K and K';
// - a runtime mask with rows all -inf (NaN, or zeros with nan_to_zero), a row -inf over its first
//   tile only and one over its second only: parts that see no finite score must add nothing.
// A split that splits nothing (4 tiles a CTA over 4 tiles) gives the bits of no split.
TEST(CudaAttention, FlashSplitsLongKeyRanges) {
  struct Case {
    std::string name;
    int64_t sq, skv;
    const char* warps;
    bool causal, transposeK;
    const char* split;
    const char* detail;  // in the step's detail
  };
  const std::vector<Case> cases = {
      {"causal_512", 512, 512, "4", true, true, "2",
       "keys split over 20 CTAs an entry (at most 2 tiles each; 18 parts merged into 6 of the 8 "
       "blocks)"},
      {"causal_512_auto", 512, 512, "4", true, false, "auto",
       "keys split over 20 CTAs an entry (at most 2 tiles each; 18 parts merged into 6 of the 8 "
       "blocks)"},
      {"causal_512_one", 512, 512, "4", true, true, "1",
       "keys split over 36 CTAs an entry (at most 1 tile each; 35 parts merged into 7 of the 8 "
       "blocks)"},
      // 16 blocks of 32 rows walking r / 2 + 1 tiles: those of 5 to 8 in two parts.
      {"causal_512_2warps", 512, 512, "2", true, true, "4",
       "keys split over 24 CTAs an entry (at most 4 tiles each; 16 parts merged into 8 of the 16 "
       "blocks)"},
      // 4 blocks of 128 rows walking 2, 4, 6 and 8 tiles.
      {"causal_512_8warps", 512, 512, "8", true, true, "1",
       "keys split over 20 CTAs an entry (at most 1 tile each; 20 parts merged into 4 of the 4 "
       "blocks)"},
      {"long", 200, 700, "4", false, true, "4",
       "keys split over 12 CTAs an entry (at most 4 tiles each; 12 parts merged into 4 of the 4 "
       "blocks)"},
      {"long_k_prime", 200, 700, "4", false, false, "2",
       "keys split over 24 CTAs an entry (at most 2 tiles each; 24 parts merged into 4 of the 4 "
       "blocks)"},
  };
  unsigned seed = 1700;
  for (const Case& c : cases) {
    for (const ReducedType& type : reducedTypes()) {
      SCOPED_TRACE(c.name + " " + type.name);
      std::vector<OpInput> inputs = flashInputs({1, 2}, c.sq, c.skv, 64, c.transposeK, seed += 4);
      if (c.causal) inputs.push_back({causalMask(c.sq, c.skv), true});
      CudaOpCase split = flashAttention(std::move(inputs), flashAttributes(64, c.transposeK));
      split.route = kFlashRoute + " -cuda.attention.flash.warps=" + std::string(c.warps) +
                    " -cuda.attention.flash.split=" + c.split;
      expectReduced(split, type);
      std::string detail;
      runFlash(split, type, split.route, &detail);
      EXPECT_NE(detail.find(c.detail), std::string::npos) << detail;
    }
  }
  for (int nanToZero = 0; nanToZero < 2; ++nanToZero) {
    for (const ReducedType& type : reducedTypes()) {
      SCOPED_TRACE("masked rows, nan_to_zero=" + std::to_string(nanToZero) + " " + type.name);
      std::vector<OpInput> inputs = flashInputs({2}, 70, 100, 64, true, seed += 4);
      inputs.push_back({maskedRows(), false});
      CudaOpCase split = flashAttention(std::move(inputs), flashAttributes(64, true, nanToZero));
      split.route = kFlashRoute + " -cuda.attention.flash.split=1";
      expectReduced(split, type);
      std::string detail;
      runFlash(split, type, split.route, &detail);
      EXPECT_NE(detail.find("keys split over 4 CTAs an entry (at most 1 tile each; 4 parts "
                            "merged into 2 of the 2 blocks)"),
                std::string::npos)
          << detail;
    }
  }
  for (const ReducedType& type : reducedTypes()) {
    SCOPED_TRACE("nothing to split " + type.name);
    CudaOpCase c = flashAttention(flashInputs({1, 2}, 130, 256, 64, true, seed += 4),
                                  flashAttributes(64, true));
    std::string four, off;
    const ir::Tensor got = runFlash(c, type, kFlashRoute + " -cuda.attention.flash.split=4", &four);
    const ir::Tensor all =
        runFlash(c, type, kFlashRoute + " -cuda.attention.flash.split=off", &off);
    EXPECT_EQ(four, off);
    EXPECT_EQ(four.find("keys split"), std::string::npos) << four;
    if (!cuda::deviceAvailable()) continue;
    ASSERT_EQ(got.byteSize(), all.byteSize());
    EXPECT_EQ(std::memcmp(got.rawData(), all.rawData(), got.byteSize()), 0);
  }
}

TEST(CudaAttention, FlashFallsBackToUnfused) {
  // Asked for flash, nodes the fused kernel does not take run unfused: float32, a head size
  // outside 32 / 64 / 128, Dv != D, and no keys.
  auto unfused = [](std::vector<OpInput> inputs) {
    return attention(std::move(inputs), {{"transpose_k", intAttr(1)}}, kFlashRoute);
  };
  expectCudaMatchesReference(unfused(flashInputs({2}, 9, 11, 64, true, 1500)));
  expectReduced(unfused(flashInputs({2}, 9, 11, 16, true, 1510)), reducedTypes()[0]);
  expectReduced(unfused({runtimeInput({2, 9, 64}, 1520), runtimeInput({2, 11, 64}, 1521),
                         runtimeInput({2, 11, 32}, 1522)}),
                reducedTypes()[0]);
  expectReduced(unfused({runtimeInput({2, 3, 64}, 1530), runtimeInput({2, 0, 64}, 1531),
                         runtimeInput({2, 0, 64}, 1532)}),
                reducedTypes()[1]);
}

// cuda.attention.kernel=flash (the default): every float16 / bfloat16 node the kernel takes, at
// any length; float32 and other head sizes unfused.
TEST(CudaAttention, DefaultFusesFloat16Attention) {
  auto byDefault = [](std::vector<OpInput> inputs, const char* tactic) {
    CudaOpCase c = attention(std::move(inputs), {{"transpose_k", intAttr(1)}}, "");
    c.route = "";
    c.expectTactic = tactic;
    return c;
  };
  expectReduced(byDefault(flashInputs({2}, 40, 256, 64, true, 1600), "kiln.attention.flash"),
                reducedTypes()[0]);
  expectReduced(byDefault(flashInputs({1}, 40, 600, 64, true, 1610), "kiln.attention.flash"),
                reducedTypes()[1]);
  expectReduced(byDefault(flashInputs({2}, 40, 60, 16, true, 1615), "kiln.attention.unfused"),
                reducedTypes()[0]);
  expectCudaMatchesReference(
      byDefault(flashInputs({2}, 9, 11, 64, true, 1620), "kiln.attention.unfused"));
}

// --- the heads form (num_heads; the attention_heads pass)
// -----------------------------------------

// Q [B, Sq, H * D], K [B, Skv, H * D], V [B, Skv, H * Dv] (or packed: Q [B, S, 3 * H * D] alone),
// every head a column block: the products read with row strides of the whole projection, the
// unfused tactic loops over the B outer entries, and the fused kernel offsets per head.
struct HeadsCase {
  std::string name;
  int64_t batch, heads, sq, skv, d, dv;
  bool packed;
  std::vector<int64_t> mask;  // empty: none
};

std::vector<OpInput> headsInputs(const HeadsCase& c, unsigned seed) {
  std::vector<OpInput> inputs;
  if (c.packed) {
    inputs = {runtimeInput({c.batch, c.sq, 3 * c.heads * c.d}, seed, 2.0f), OpInput{}, OpInput{}};
  } else {
    inputs = {runtimeInput({c.batch, c.sq, c.heads * c.d}, seed, 2.0f),
              runtimeInput({c.batch, c.skv, c.heads * c.d}, seed + 1),
              runtimeInput({c.batch, c.skv, c.heads * c.dv}, seed + 2)};
  }
  if (!c.mask.empty()) {
    inputs.push_back(c.mask.size() == 4 && c.mask[2] == c.sq && c.mask[3] == c.skv && c.sq == c.skv
                         ? OpInput{causalMask(c.sq, c.skv), false}
                         : runtimeInput(Shape(c.mask), seed + 3, 3.0f));
  }
  return inputs;
}

CudaAttributes headsAttributes(const HeadsCase& c) {
  return {{"num_heads", intAttr(c.heads)},
          {"transpose_k", intAttr(1)},
          {"scale", floatAttr(1.0f / std::sqrt(static_cast<float>(c.d)))}};
}

TEST(CudaAttention, HeadsFormUnfused) {
  const std::vector<HeadsCase> cases = {
      {"separate, Dv != D, Sq != Skv", 2, 3, 7, 9, 8, 6, false, {2, 1, 1, 9}},
      {"separate, one outer entry", 1, 4, 33, 20, 16, 16, false, {}},
      {"packed, GPT-2-like causal", 1, 2, 77, 77, 64, 64, true, {1, 1, 77, 77}},
      {"packed, three outer entries", 3, 2, 12, 12, 8, 8, true, {3, 1, 1, 12}},
  };
  unsigned seed = 1600;
  for (const HeadsCase& c : cases) {
    SCOPED_TRACE(c.name);
    for (const std::string& route : kRoutes) {
      expectCudaMatchesReference(attention(headsInputs(c, seed += 4), headsAttributes(c), route));
      for (const ReducedType& type : reducedTypes()) {
        expectReduced(attention(headsInputs(c, seed += 4), headsAttributes(c), route), type);
      }
    }
  }
}

TEST(CudaAttention, HeadsFormFlash) {
  const std::vector<HeadsCase> cases = {
      {"GPT-2: packed, 512 causal", 1, 2, 512, 512, 64, 64, true, {1, 1, 512, 512}},
      {"packed, two outer entries, per-key mask", 2, 3, 77, 77, 32, 32, true, {2, 1, 1, 77}},
      {"BERT-like: separate, per-key mask", 2, 2, 128, 128, 64, 64, false, {2, 1, 1, 128}},
      {"separate, Sq != Skv, head 128", 2, 2, 49, 130, 128, 128, false, {}},
  };
  unsigned seed = 1700;
  for (const HeadsCase& c : cases) {
    SCOPED_TRACE(c.name);
    for (const ReducedType& type : reducedTypes()) {
      expectReduced(flashAttention(headsInputs(c, seed += 4), headsAttributes(c)), type);
    }
  }
}

}  // namespace
}  // namespace kiln::testing
