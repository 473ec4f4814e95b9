// The CUDA backend's matrix products (kernels/gemm_steps.cc, gemm_product.cc): Gemm, MatMul and
// kiln.FusedGemm from cuBLASLt and from kiln's native kernel, in float32 and (as cuda.precision
// makes them) float16 and bfloat16, against the reference executor.
// Without a GPU each case checks the lowering's tactic (and so every cuda.gemm.* knob's effect on
// it, and where the epilogue runs); on a GPU it also runs the case, and checks that a step
// lowered to cuBLASLt still runs cuBLASLt once prepared (a silent fall back to kiln's kernel
// would hide broken descriptors).
// (cuda_test_util.h's `if (...) EXPECT_EQ(...)` trips -Wdangling-else; until it has braces.)
#pragma GCC diagnostic ignored "-Wdangling-else"
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "kiln/ir/op_schema.h"

namespace kiln::testing {
namespace {

using ir::Shape;

// cuBLASLt and kiln's kernel reorder the reference's (double) sums; fp32 stays within this.
constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

OpInput runtimeInput(Shape shape, unsigned seed) {
  return {uniformTensor(std::move(shape), seed, -1.0f, 1.0f), false};
}
OpInput constantInput(Shape shape, unsigned seed) {
  return {uniformTensor(std::move(shape), seed, -0.5f, 0.5f), true};
}

// The routes every product is checked under, and the tactic each gives a product whose epilogue
// (bias and/or activation) cuBLASLt can or cannot fuse.
struct ProductRoute {
  std::string route;
  std::string lt;  // the tactic's source part: "cublaslt", "cublaslt.timed", "native"
  bool separate = false;
};

const std::vector<ProductRoute>& productRoutes() {
  static const std::vector<ProductRoute> routes = {
      {"", "cublaslt"},
      {"-cuda.gemm.algo=timed", "cublaslt.timed"},
      {"-cuda.gemm.epilogue=separate", "cublaslt", true},
      {"-cuda.gemm.source=native", "native"},
      {"-cuda.gemm.source=native -cuda.gemm.epilogue=separate", "native", true},
  };
  return routes;
}

// The tactic under `route` of a product with an epilogue (`hasEpilogue`) that cuBLASLt's own
// epilogue computes exactly (`ltFuses`): kiln's epilogue kernel runs after the product when the
// epilogue is kept separate, or cuBLASLt cannot fuse it; the native kernel fuses any epilogue.
std::string tacticFor(const ProductRoute& route, bool hasEpilogue, bool ltFuses) {
  const bool native = route.lt == "native";
  const bool kernel = hasEpilogue && (route.separate || (!native && !ltFuses));
  return route.lt + (kernel ? "+epilogue" : "");
}

// The tactic of the step for `c`'s node once the plan is prepared on the device ("" without one).
std::string preparedTactic(const CudaOpCase& c) {
  BuilderConfig config;
  EXPECT_TRUE(config.setBuildRoute("-cuda.host_fallback=off " + c.route).isOk());
  auto build = buildCuda(
      makeSingleOpGraph(c.opType, c.inputs, c.attributes, c.opset, c.outputCount, c.domain),
      config);
  if (!build.isOk()) {
    ADD_FAILURE() << build.status().toString();
    return "";
  }
  const Status ready = build->plan.initialize();
  if (!ready.isOk()) {
    ADD_FAILURE() << ready.toString();
    return "";
  }
  return cudaTacticOf(*build, c.opType);
}

// Runs `c` (tactic checked at lowering); on a GPU, a cuBLASLt step must stay on cuBLASLt. Whether
// it kept its fused epilogue is recorded, not required: cuBLASLt may have no algorithm for it,
// and then runs the bare product and kiln's epilogue kernel.
void expectProduct(CudaOpCase c, double rtol = kRtol, double atol = kAtol) {
  c.rtol = rtol;
  c.atol = atol;
  expectCudaMatchesReference(c);
  if (!cuda::deviceAvailable() || c.expectTactic.rfind("cublaslt", 0) != 0) return;
  const std::string prepared = preparedTactic(c);
  EXPECT_EQ(prepared.rfind("cublaslt", 0), 0u)
      << "lowered to " << c.expectTactic << " but prepared as " << prepared;
  ::testing::Test::RecordProperty("prepared_tactic", prepared);
}

// --- Gemm --------------------------------------------------------------------------------------

// C's shapes against a [7, 5] output, and whether cuBLASLt fuses each: a vector along the
// columns goes to its BIAS epilogue (unscaled only), a full matrix to its C input (scaled by beta,
// which must not be 0). Other broadcasts run in kiln's epilogue kernel.
struct BiasShape {
  std::string name;
  Shape shape;
  bool ltFusesUnscaled;
  bool ltFusesScaled;
};

std::vector<BiasShape> biasShapes() {
  return {
      {"n", {5}, true, false},       {"1xn", {1, 5}, true, false}, {"mx1", {7, 1}, false, false},
      {"mxn", {7, 5}, true, true},   {"scalar", {}, false, false}, {"one", {1}, false, false},
      {"1x1", {1, 1}, false, false},
  };
}

TEST(CudaGemm, EveryTransposeCombination) {
  unsigned seed = 1;
  for (int transA = 0; transA < 2; ++transA) {
    for (int transB = 0; transB < 2; ++transB) {
      SCOPED_TRACE("transA=" + std::to_string(transA) + " transB=" + std::to_string(transB));
      const int64_t m = 7, n = 5, k = 9;
      const Shape a = transA ? Shape{k, m} : Shape{m, k};
      const Shape b = transB ? Shape{n, k} : Shape{k, n};
      for (const ProductRoute& route : productRoutes()) {
        CudaOpCase c{.opType = "Gemm",
                     .inputs = {runtimeInput(a, seed += 3), runtimeInput(b, seed + 1)},
                     .attributes = {{"transA", intAttr(transA)}, {"transB", intAttr(transB)}},
                     .route = route.route};
        c.expectTactic = tacticFor(route, false, true);
        expectProduct(c);
      }
    }
  }
}

TEST(CudaGemm, AlphaBetaAndEveryBiasShape) {
  unsigned seed = 100;
  for (const BiasShape& bias : biasShapes()) {
    for (float beta : {1.0f, 0.5f, 0.0f}) {
      for (int transB = 0; transB < 2; ++transB) {
        SCOPED_TRACE(bias.name + " beta=" + std::to_string(beta) +
                     " transB=" + std::to_string(transB));
        const bool ltFuses =
            beta == 1.0f ? bias.ltFusesUnscaled : (beta != 0.0f && bias.ltFusesScaled);
        for (const ProductRoute& route : productRoutes()) {
          CudaOpCase c{.opType = "Gemm",
                       .inputs = {runtimeInput({7, 11}, seed += 3),
                                  constantInput(transB ? Shape{5, 11} : Shape{11, 5}, seed + 1),
                                  constantInput(bias.shape, seed + 2)},
                       .attributes = {{"alpha", floatAttr(0.75f)},
                                      {"beta", floatAttr(beta)},
                                      {"transB", intAttr(transB)}},
                       .route = route.route};
          c.expectTactic = tacticFor(route, true, ltFuses);
          expectProduct(c);
        }
      }
    }
  }
}

TEST(CudaGemm, RuntimeBiasAndSingleRow) {
  // A runtime C (not a weight), and m = 1, where [1, n] is both a vector and the whole matrix.
  unsigned seed = 300;
  for (const ProductRoute& route : productRoutes()) {
    CudaOpCase c{.opType = "Gemm",
                 .inputs = {runtimeInput({1, 6}, seed += 3), constantInput({6, 4}, seed + 1),
                            runtimeInput({1, 4}, seed + 2)},
                 .attributes = {{"beta", floatAttr(2.0f)}},
                 .route = route.route};
    c.expectTactic = tacticFor(route, true, true);
    expectProduct(c);
  }
}

TEST(CudaGemm, TileEdgesAndLongSums) {
  // Sizes off the native kernel's 64x64x16 tiles, and sums long enough to reorder visibly.
  unsigned seed = 400;
  for (const ProductRoute& route : productRoutes()) {
    CudaOpCase c{.opType = "Gemm",
                 .inputs = {runtimeInput({130, 301}, seed += 3),
                            constantInput({301, 129}, seed + 1), constantInput({129}, seed + 2)},
                 .route = route.route};
    c.expectTactic = tacticFor(route, true, true);
    expectProduct(c);
  }
}

TEST(CudaGemm, EmptySumRunsKilnsKernel) {
  // k = 0: every element is the epilogue of 0 (beta * C); cuBLASLt takes no empty sum.
  CudaOpCase c{
      .opType = "Gemm",
      .inputs = {runtimeInput({3, 0}, 500), constantInput({0, 4}, 501), constantInput({4}, 502)},
      .attributes = {{"beta", floatAttr(0.5f)}},
      .expectTactic = "native"};
  expectProduct(c);
}

TEST(CudaGemm, Tf32WhereThePrecisionAllowsIt) {
  // cuda.precision=tf32: cuBLASLt may round the operands to TF32 (10-bit mantissas), so the
  // products drift by about 1e-3 of their size; the bias and Relu stay fused.
  CudaOpCase c = {.opType = "Gemm",
                  .inputs = {runtimeInput({33, 40}, 520), constantInput({40, 17}, 521),
                             constantInput({17}, 522)},
                  .route = "-cuda.precision=tf32",
                  .expectTactic = "cublaslt",
                  .rtol = 5e-3,
                  .atol = 5e-3};
  expectCudaMatchesReference(c);
}

// --- MatMul ------------------------------------------------------------------------------------

struct MatMulShape {
  std::string name;
  Shape a, b;
};

std::vector<MatMulShape> matMulShapes() {
  return {
      {"vector_vector", {5}, {5}},
      {"vector_matrix", {5}, {5, 3}},
      {"matrix_vector", {4, 5}, {5}},
      {"matrix_matrix", {4, 5}, {5, 3}},
      {"batched_matrix (folded)", {2, 4, 5}, {5, 3}},
      {"batched_vector (folded)", {2, 4, 5}, {5}},
      {"batch_of_ones_right (folded)", {2, 3, 4, 5}, {1, 1, 5, 6}},
      {"equal_batches_3d", {2, 4, 5}, {2, 5, 3}},
      {"equal_batches_4d", {2, 3, 4, 5}, {2, 3, 5, 6}},
      {"shared_left_matrix", {4, 5}, {2, 5, 3}},
      {"shared_left_batch_of_ones", {1, 4, 5}, {3, 5, 6}},
      {"shared_left_4d", {1, 1, 4, 5}, {2, 3, 5, 6}},
      {"shared_left_vector", {5}, {2, 5, 3}},
      {"left_padded_equal", {3, 4, 5}, {1, 3, 5, 2}},
      {"large", {3, 70, 130}, {3, 130, 66}},
  };
}

TEST(CudaMatMul, BroadcastingShapes) {
  unsigned seed = 600;
  for (const MatMulShape& s : matMulShapes()) {
    SCOPED_TRACE(s.name);
    for (const ProductRoute& route : productRoutes()) {
      CudaOpCase c{.opType = "MatMul",
                   .inputs = {runtimeInput(s.a, seed += 3), runtimeInput(s.b, seed + 1)},
                   .route = route.route};
      c.expectTactic = tacticFor(route, false, true);
      expectProduct(c);
    }
  }
}

TEST(CudaMatMul, ConstantRightOperand) {
  CudaOpCase c{.opType = "MatMul",
               .inputs = {runtimeInput({2, 3, 8}, 700), constantInput({8, 5}, 701)},
               .expectTactic = "cublaslt"};
  expectProduct(c);
}

TEST(CudaMatMul, EmptySumRunsKilnsKernel) {
  CudaOpCase c{.opType = "MatMul",
               .inputs = {runtimeInput({2, 3, 0}, 710), runtimeInput({2, 0, 4}, 711)},
               .expectTactic = "native"};
  expectProduct(c);
}

TEST(CudaMatMul, MixedBroadcastGoesToTheNextFactory) {
  // A's batch [3] against B's [2, 1]: neither side is shared nor equal; no GPU product takes it,
  // so the host fallback does (and with it off, the build fails).
  const std::vector<OpInput> inputs = {runtimeInput({3, 4, 5}, 720),
                                       runtimeInput({2, 1, 5, 6}, 721)};
  BuilderConfig config;
  ASSERT_TRUE(config.setBuildRoute("").isOk());
  auto build = buildCuda(makeSingleOpGraph("MatMul", inputs), config);
  ASSERT_TRUE(build.isOk()) << build.status().toString();
  EXPECT_EQ(cudaTacticOf(*build, "MatMul"), "host.reference");
}

// --- kiln.FusedGemm ----------------------------------------------------------------------------

struct ActivationCase {
  std::string name;
  CudaAttributes attributes;
  bool ltFuses;  // cuBLASLt's epilogue computes it (Relu, and GeluTanh as its GELU)
};

std::vector<ActivationCase> activationCases() {
  return {
      {"none", {}, true},
      {"Relu", {{"activation", stringAttr("Relu")}}, true},
      {"LeakyRelu",
       {{"activation", stringAttr("LeakyRelu")}, {"activation_alpha", floatAttr(0.1f)}},
       false},
      {"LeakyRelu_default", {{"activation", stringAttr("LeakyRelu")}}, false},
      {"Clip",
       {{"activation", stringAttr("Clip")},
        {"activation_alpha", floatAttr(-0.5f)},
        {"activation_beta", floatAttr(0.5f)}},
       false},
      {"Clip_unbounded", {{"activation", stringAttr("Clip")}}, false},
      {"Sigmoid", {{"activation", stringAttr("Sigmoid")}}, false},
      {"HardSigmoid",
       {{"activation", stringAttr("HardSigmoid")},
        {"activation_alpha", floatAttr(0.3f)},
        {"activation_beta", floatAttr(0.4f)}},
       false},
      {"HardSigmoid_default", {{"activation", stringAttr("HardSigmoid")}}, false},
      {"HardSwish", {{"activation", stringAttr("HardSwish")}}, false},
      {"Tanh", {{"activation", stringAttr("Tanh")}}, false},
      // Exact (erf) Gelu: cuBLASLt's GELU is the tanh approximation, so never fused there.
      {"Gelu", {{"activation", stringAttr("Gelu")}}, false},
      // cuBLASLt's GELU is the tanh approximation: GELU_BIAS / GELU.
      {"GeluTanh", {{"activation", stringAttr("GeluTanh")}}, true},
      {"Silu", {{"activation", stringAttr("Silu")}}, false},
  };
}

CudaOpCase fusedGemm(std::vector<OpInput> inputs, CudaAttributes attributes, std::string route) {
  return {.opType = "FusedGemm",
          .inputs = std::move(inputs),
          .attributes = std::move(attributes),
          .domain = ir::kKilnDomain,
          .route = std::move(route)};
}

TEST(CudaFusedGemm, EveryActivationWithAndWithoutBias) {
  unsigned seed = 800;
  for (const ActivationCase& activation : activationCases()) {
    for (bool bias : {true, false}) {
      SCOPED_TRACE(activation.name + (bias ? " with bias" : " without bias"));
      const bool hasEpilogue = bias || activation.name != "none";
      for (const ProductRoute& route : productRoutes()) {
        std::vector<OpInput> inputs = {runtimeInput({6, 16}, seed += 3),
                                       constantInput({16, 10}, seed + 1)};
        if (bias) inputs.push_back(constantInput({10}, seed + 2));
        CudaOpCase c = fusedGemm(std::move(inputs), activation.attributes, route.route);
        c.expectTactic = tacticFor(route, hasEpilogue, activation.ltFuses);
        expectProduct(c);
      }
    }
  }
}

TEST(CudaFusedGemm, BatchedLeftOperand) {
  // A [2, 3, 8] multiplies as the [6, 8] matrix it is; C [N] is cuBLASLt's bias, Relu after it.
  unsigned seed = 900;
  for (const ProductRoute& route : productRoutes()) {
    CudaAttributes attributes = {{"activation", stringAttr("Relu")}, {"transB", intAttr(1)}};
    CudaOpCase c = fusedGemm({runtimeInput({2, 3, 8}, seed += 3), constantInput({5, 8}, seed + 1),
                              constantInput({5}, seed + 2)},
                             attributes, route.route);
    c.expectTactic = tacticFor(route, true, true);
    expectProduct(c);
  }
}

TEST(CudaFusedGemm, ScaledBiasAndGelu) {
  // beta != 1: the [N] bias cannot be cuBLASLt's (unscaled) BIAS, so the epilogue kernel adds it.
  unsigned seed = 950;
  for (const ProductRoute& route : productRoutes()) {
    CudaAttributes attributes = {
        {"activation", stringAttr("Gelu")}, {"alpha", floatAttr(1.5f)}, {"beta", floatAttr(-0.5f)}};
    CudaOpCase c = fusedGemm({runtimeInput({9, 12}, seed += 3), constantInput({12, 7}, seed + 1),
                              constantInput({7}, seed + 2)},
                             attributes, route.route);
    c.expectTactic = tacticFor(route, true, false);
    expectProduct(c);
  }
}

TEST(CudaFusedGemm, EpilogueOnWholePacks) {
  // Rows of 32 floats: kiln's epilogue kernel takes them four at a time (16-byte packs), with a
  // full [M, N] bias (its row index changes between packs) and a scaled one.
  unsigned seed = 970;
  for (float beta : {1.0f, 0.5f}) {
    for (const ProductRoute& route : productRoutes()) {
      CudaAttributes attributes = {{"activation", stringAttr("Gelu")}, {"beta", floatAttr(beta)}};
      CudaOpCase c = fusedGemm({runtimeInput({6, 24}, seed += 3), constantInput({24, 32}, seed + 1),
                                constantInput({6, 32}, seed + 2)},
                               attributes, route.route);
      c.expectTactic = tacticFor(route, true, false);
      expectProduct(c);
    }
  }
}

// --- float16 and bfloat16 ----------------------------------------------------------------------

// Inputs stored in the reduced type, as cuda.precision makes them. The reference sums the same
// reduced inputs in double and rounds once; the GPU sums in float and rounds once (twice where
// kiln's epilogue kernel runs after the product, as the reference's FusedGemm does too).
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

// kiln.FusedGemm's schema takes no bfloat16 inputs, so a bfloat16 FusedGemm exists only where
// cuda.precision makes one: that case keeps float32 inputs and routes the node to bf16 (casts
// around it), against the float32 reference, its inputs' rounding allowed for in the tolerance.
void expectReducedProduct(CudaOpCase c, const ReducedType& type) {
  SCOPED_TRACE(type.name);
  if (c.opType == "FusedGemm" && type.dtype == ir::DType::kBFloat16) {
    c.route += " -cuda.precision=" + type.name;
  } else {
    for (OpInput& input : c.inputs) input.tensor = input.tensor.castTo(type.dtype);
  }
  expectProduct(std::move(c), type.rtol, type.atol);
}

TEST(CudaGemm, ReducedPrecisionTransposesAndBiases) {
  // Odd sizes (2-byte aligned rows) and tensor-core friendly ones; each bias where it goes: a
  // vector in cuBLASLt's BIAS epilogue, a scaled matrix as its C, a column in kiln's kernel.
  struct Sizes {
    int64_t m, n, k;
  };
  unsigned seed = 1000;
  for (const ReducedType& type : reducedTypes()) {
    for (Sizes size : {Sizes{7, 5, 9}, Sizes{64, 48, 72}}) {
      for (int transA = 0; transA < 2; ++transA) {
        for (int transB = 0; transB < 2; ++transB) {
          struct Bias {
            Shape shape;
            float beta;
            bool ltFuses;
          };
          const Bias biases[] = {{Shape{size.n}, 1.0f, true},
                                 {Shape{size.m, size.n}, 0.5f, true},
                                 {Shape{size.m, 1}, 1.0f, false}};
          for (const Bias& bias : biases) {
            SCOPED_TRACE("m=" + std::to_string(size.m) + " transA=" + std::to_string(transA) +
                         " transB=" + std::to_string(transB) + " bias " + bias.shape.toString());
            const Shape a = transA ? Shape{size.k, size.m} : Shape{size.m, size.k};
            const Shape b = transB ? Shape{size.n, size.k} : Shape{size.k, size.n};
            for (const ProductRoute& route : productRoutes()) {
              CudaOpCase c{.opType = "Gemm",
                           .inputs = {runtimeInput(a, seed += 3), constantInput(b, seed + 1),
                                      constantInput(bias.shape, seed + 2)},
                           .attributes = {{"transA", intAttr(transA)},
                                          {"transB", intAttr(transB)},
                                          {"alpha", floatAttr(0.75f)},
                                          {"beta", floatAttr(bias.beta)}},
                           .route = route.route};
              c.expectTactic = tacticFor(route, true, bias.ltFuses);
              expectReducedProduct(c, type);
            }
          }
        }
      }
    }
  }
}

TEST(CudaGemm, ReducedPrecisionEmptySum) {
  // k = 0 in float16 / bfloat16: kiln's kernel stores beta * C.
  for (const ReducedType& type : reducedTypes()) {
    CudaOpCase c{.opType = "Gemm",
                 .inputs = {runtimeInput({3, 0}, 1100), constantInput({0, 4}, 1101),
                            constantInput({4}, 1102)},
                 .attributes = {{"beta", floatAttr(0.5f)}},
                 .expectTactic = "native"};
    expectReducedProduct(c, type);
  }
}

TEST(CudaGemm, ReducedPrecisionIgnoresTf32) {
  // cuda.precision=tf32 concerns float32 products only; a float16 Gemm still runs cuBLASLt.
  for (const ReducedType& type : reducedTypes()) {
    CudaOpCase c = {.opType = "Gemm",
                    .inputs = {runtimeInput({33, 40}, 1110), constantInput({40, 17}, 1111),
                               constantInput({17}, 1112)},
                    .route = "-cuda.precision=tf32",
                    .expectTactic = "cublaslt"};
    expectReducedProduct(c, type);
  }
}

TEST(CudaMatMul, ReducedPrecisionShapes) {
  const std::vector<MatMulShape> shapes = {
      {"matrix_vector", {4, 5}, {5}},
      {"batched_matrix (folded)", {2, 4, 5}, {5, 3}},
      {"equal_batches_4d", {2, 3, 4, 16}, {2, 3, 16, 8}},
      {"shared_left_matrix", {4, 5}, {2, 5, 3}},
      {"large", {3, 70, 130}, {3, 130, 66}},
      {"tensor_core", {2, 64, 128}, {2, 128, 96}},
  };
  unsigned seed = 1200;
  for (const ReducedType& type : reducedTypes()) {
    for (const MatMulShape& s : shapes) {
      SCOPED_TRACE(s.name);
      for (const ProductRoute& route : productRoutes()) {
        CudaOpCase c{.opType = "MatMul",
                     .inputs = {runtimeInput(s.a, seed += 3), runtimeInput(s.b, seed + 1)},
                     .route = route.route};
        c.expectTactic = tacticFor(route, false, true);
        expectReducedProduct(c, type);
      }
    }
  }
}

TEST(CudaFusedGemm, ReducedPrecisionEveryActivation) {
  // n = 16: whole 16-byte packs for the epilogue kernel; with and without the bias.
  unsigned seed = 1300;
  for (const ReducedType& type : reducedTypes()) {
    for (const ActivationCase& activation : activationCases()) {
      for (bool bias : {true, false}) {
        SCOPED_TRACE(activation.name + (bias ? " with bias" : " without bias"));
        const bool hasEpilogue = bias || activation.name != "none";
        for (const ProductRoute& route : productRoutes()) {
          std::vector<OpInput> inputs = {runtimeInput({2, 5, 24}, seed += 3),
                                         constantInput({24, 16}, seed + 1)};
          if (bias) inputs.push_back(constantInput({16}, seed + 2));
          CudaOpCase c = fusedGemm(std::move(inputs), activation.attributes, route.route);
          c.expectTactic = tacticFor(route, hasEpilogue, activation.ltFuses);
          expectReducedProduct(c, type);
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln::testing
