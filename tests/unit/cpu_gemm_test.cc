// The CPU backend's GEMM entry point (sgemm.h): the native packed SGEMM against a naive triple
// loop over many shapes, transpositions, strides, alpha/beta and thread counts, on every
// micro-kernel family this CPU runs; its bfloat16 mode bit for bit against a scalar model of
// bfloat16 arithmetic; and MatMul/Gemm/FusedGemm steps on the native source against the
// reference kernels.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "kiln/backends/cpu/kernels/sgemm.h"
#include "kiln/backends/cpu/kernels/sgemm_kernels.h"
#include "kiln/engine/builder.h"
#include "kiln/ir/op_schema.h"
#include "op_test_util.h"

namespace kiln::testing {
namespace {

using cpu::GemmArgs;
using cpu::GemmKernel;
using cpu::GemmOptions;
using cpu::GemmPrecision;
using cpu::GemmSource;
using cpu::PackedGemmB;
using cpu::ThreadPool;

std::vector<float> randomValues(int64_t count, unsigned seed, float low = -2, float high = 2) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = uniform(rng);
  return values;
}

// One product's operands, stored with the given transpositions and (padded) strides.
struct Problem {
  int64_t m, n, k;
  bool transA = false, transB = false;
  float alpha = 1.0f, beta = 0.0f;
  int64_t padA = 0, padB = 0, padC = 0;  // extra elements per stored row

  int64_t lda() const { return (transA ? m : k) + padA; }
  int64_t ldb() const { return (transB ? k : n) + padB; }
  int64_t ldc() const { return n + padC; }
  std::string describe() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
           (transA ? " transA" : "") + (transB ? " transB" : "") +
           " alpha=" + std::to_string(alpha) + " beta=" + std::to_string(beta) +
           " pads=" + std::to_string(padA) + "," + std::to_string(padB) + "," +
           std::to_string(padC);
  }
};

struct Operands {
  std::vector<float> a, b, c;
};

Operands operandsFor(const Problem& p, unsigned seed) {
  return {randomValues((p.transA ? p.k : p.m) * p.lda(), seed),
          randomValues((p.transB ? p.n : p.k) * p.ldb(), seed + 1),
          randomValues(p.m * p.ldc(), seed + 2)};
}

GemmArgs argsFor(const Problem& p, const Operands& x, float* c) {
  return {.transA = p.transA,
          .transB = p.transB,
          .m = p.m,
          .n = p.n,
          .k = p.k,
          .alpha = p.alpha,
          .a = x.a.data(),
          .lda = p.lda(),
          .b = x.b.data(),
          .ldb = p.ldb(),
          .beta = p.beta,
          .c = c,
          .ldc = p.ldc()};
}

float elementA(const Problem& p, const Operands& x, int64_t i, int64_t l) {
  return p.transA ? x.a[l * p.lda() + i] : x.a[i * p.lda() + l];
}
float elementB(const Problem& p, const Operands& x, int64_t l, int64_t j) {
  return p.transB ? x.b[j * p.ldb() + l] : x.b[l * p.ldb() + j];
}

// Checks `c` (the product run on x.c's copy) against a triple loop in double, within float32's
// rounding bound for a k-term sum: (k + 2) * 2^-24 * (|alpha| sum|a||b| + |beta c|), doubled.
void expectMatchesNaive(const Problem& p, const Operands& x, const std::vector<float>& c,
                        const std::string& what) {
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t l = 0; l < p.k; ++l) {
        const double term = double(elementA(p, x, i, l)) * elementB(p, x, l, j);
        sum += term;
        magnitude += std::fabs(term);
      }
      const double old = x.c[i * p.ldc() + j];
      const double expected = p.alpha * sum + (p.beta == 0.0f ? 0.0 : p.beta * old);
      const double bound = 2.0 * (p.k + 2) * std::ldexp(1.0, -24) *
                               (std::fabs(p.alpha) * magnitude + std::fabs(p.beta * old)) +
                           1e-30;
      ASSERT_NEAR(c[i * p.ldc() + j], expected, bound)
          << what << " " << p.describe() << " at (" << i << ", " << j << ")";
    }
    // Padding columns of C are never written.
    for (int64_t j = p.n; j < p.ldc(); ++j) {
      ASSERT_EQ(std::bit_cast<uint32_t>(c[i * p.ldc() + j]),
                std::bit_cast<uint32_t>(x.c[i * p.ldc() + j]))
          << what << " " << p.describe() << " wrote padding at (" << i << ", " << j << ")";
    }
  }
}

std::vector<float> runGemm(const GemmOptions& options, const Problem& p, const Operands& x,
                           int threads) {
  ThreadPool pool(threads);
  std::vector<float> c = x.c;
  cpu::sgemm(options, argsFor(p, x, c.data()), pool);
  return c;
}

std::vector<float> runPrepacked(const GemmOptions& options, const Problem& p, const Operands& x,
                                int threads) {
  ThreadPool pool(threads);
  const PackedGemmB packed(options, p.transB, p.k, p.n, x.b.data(), p.ldb());
  std::vector<float> c = x.c;
  GemmArgs args = argsFor(p, x, c.data());
  args.b = nullptr;  // must not be read
  cpu::sgemm(args, packed, pool);
  return c;
}

std::vector<Problem> shapes() {
  return {
      {1, 1, 1},      {1, 1, 2},     {2, 3, 1},     {3, 5, 7},    {13, 17, 19}, {14, 32, 256},
      {15, 33, 257},  {29, 65, 300}, {1, 100, 64},  {100, 1, 64}, {7, 1000, 3}, {64, 48, 1100},
      {197, 192, 64}, {16, 392, 64}, {28, 64, 513}, {6, 16, 16},  {5, 15, 9},   {42, 96, 130},
  };
}

std::string kernelName(GemmKernel kernel) { return cpu::gemmKernelName(kernel); }

TEST(NativeSgemm, MatchesNaiveOnEveryKernelShapeAndTransposition) {
  unsigned seed = 1;
  for (GemmKernel kernel : cpu::supportedGemmKernels()) {
    for (Problem p : shapes()) {
      for (int trans = 0; trans < 4; ++trans) {
        p.transA = trans & 1;
        p.transB = trans & 2;
        const Operands x = operandsFor(p, seed++);
        const int threads = 1 + static_cast<int>(seed % 3);
        const GemmOptions options{.source = GemmSource::kNative, .kernel = kernel};
        expectMatchesNaive(p, x, runGemm(options, p, x, threads),
                           kernelName(kernel) + " threads=" + std::to_string(threads));
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// The AVX-512 family packs slivers of contiguous depth (A's rows, a transposed B's columns)
// through 16x16 register transposes: the same bytes as the scalar packing, [k][lanes] with
// lanes past `valid` zero, for every count of valid lanes, depth remainder and stride.
TEST(NativeSgemm, VectorPackingOfContiguousDepthIsTheScalarPacking) {
  if (!cpu::gemmKernelSupported(GemmKernel::kAvx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  const cpu::sgemm_detail::PackFn pack = cpu::sgemm_detail::avx512Kernel().packContiguousDepth;
  ASSERT_NE(pack, nullptr);
  unsigned seed = 7;
  for (int lanes : {14, 32}) {
    for (int valid = 1; valid <= lanes; ++valid) {
      for (int64_t k : {1, 2, 15, 16, 17, 31, 32, 33, 100}) {
        const int64_t laneStride = k + static_cast<int64_t>(seed % 5);  // rows padded or not
        const std::vector<float> src = randomValues(valid * laneStride, seed++);
        std::vector<float> expected(static_cast<size_t>(k * lanes), 0.0f);
        for (int l = 0; l < valid; ++l) {
          for (int64_t d = 0; d < k; ++d) expected[d * lanes + l] = src[l * laneStride + d];
        }
        std::vector<float> packed(static_cast<size_t>(k * lanes), std::nanf(""));
        pack(src.data(), laneStride, valid, lanes, k, packed.data());
        ASSERT_EQ(std::memcmp(packed.data(), expected.data(), packed.size() * 4), 0)
            << "lanes " << lanes << " valid " << valid << " k " << k;
      }
    }
  }
}

TEST(NativeSgemm, AlphaBetaAndStridesOfStoredRows) {
  const std::vector<std::pair<float, float>> scalars = {
      {1.0f, 0.0f}, {0.5f, 0.0f}, {1.0f, 1.0f}, {-2.0f, 0.75f}, {1.0f, -1.0f}, {0.0f, 0.5f}};
  unsigned seed = 100;
  for (GemmKernel kernel : cpu::supportedGemmKernels()) {
    for (auto [alpha, beta] : scalars) {
      for (Problem p : {Problem{17, 45, 300}, Problem{3, 7, 5}, Problem{33, 20, 64}}) {
        p.alpha = alpha;
        p.beta = beta;
        p.transA = seed & 1;
        p.transB = seed & 2;
        p.padA = 3;
        p.padB = 5;
        p.padC = 2;
        const Operands x = operandsFor(p, seed++);
        const GemmOptions options{.source = GemmSource::kNative, .kc = 128, .kernel = kernel};
        expectMatchesNaive(p, x, runGemm(options, p, x, 2), kernelName(kernel));
        expectMatchesNaive(p, x, runPrepacked(options, p, x, 3), kernelName(kernel) + " prepacked");
        if (::testing::Test::HasFatalFailure()) return;
      }
    }
  }
}

// Also more rows than one packed block of A holds (mc) and more columns than one block of B
// (nc), which one thread meets at the larger depths.
TEST(NativeSgemm, EveryPanelDepthMatchesNaive) {
  for (int64_t kc : {128, 256, 384, 512}) {
    for (Problem p : {Problem{37, 70, 1000}, Problem{8, 40, 129}, Problem{400, 40, 600},
                      Problem{9, 2100, 520}}) {
      const Operands x = operandsFor(p, static_cast<unsigned>(kc));
      const GemmOptions options{.source = GemmSource::kNative, .kc = kc};
      expectMatchesNaive(p, x, runGemm(options, p, x, 2), "kc=" + std::to_string(kc));
      expectMatchesNaive(p, x, runPrepacked(options, p, x, 1),
                         "prepacked kc=" + std::to_string(kc));
    }
  }
}

// Each element of C is summed in one order whatever the split among threads, and prepacking B
// changes where B is read from, not the arithmetic.
TEST(NativeSgemm, ResultsDoNotDependOnThreadsOrPrepacking) {
  for (GemmPrecision precision : {GemmPrecision::kFp32, GemmPrecision::kBf16}) {
    for (Problem p : {Problem{197, 192, 300}, Problem{16, 392, 64}, Problem{45, 31, 17}}) {
      p.transB = p.k == 300;
      const Operands x = operandsFor(p, 7);
      const GemmOptions options{.source = GemmSource::kNative, .precision = precision, .kc = 128};
      const std::vector<float> one = runGemm(options, p, x, 1);
      for (int threads : {2, 3}) {
        EXPECT_EQ(runGemm(options, p, x, threads), one) << p.describe() << " threads " << threads;
        EXPECT_EQ(runPrepacked(options, p, x, threads), one)
            << p.describe() << " prepacked, threads " << threads;
      }
    }
  }
}

TEST(NativeSgemm, BetaZeroIgnoresNaNsInC) {
  for (GemmKernel kernel : cpu::supportedGemmKernels()) {
    Problem p{9, 35, 20};
    Operands x = operandsFor(p, 3);
    std::fill(x.c.begin(), x.c.end(), std::numeric_limits<float>::quiet_NaN());
    const std::vector<float> c =
        runGemm({.source = GemmSource::kNative, .kernel = kernel}, p, x, 2);
    for (float v : c) ASSERT_FALSE(std::isnan(v)) << kernelName(kernel);
  }
}

TEST(NativeSgemm, NoDepthOrZeroAlphaScalesC) {
  for (auto [k, alpha] : {std::pair{int64_t{0}, 1.0f}, std::pair{int64_t{8}, 0.0f}}) {
    Problem p{4, 5, k};
    p.alpha = alpha;
    p.beta = 0.5f;
    const Operands x = operandsFor(p, 11);
    const std::vector<float> c = runGemm({.source = GemmSource::kNative}, p, x, 2);
    for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i], 0.5f * x.c[i]);
  }
}

TEST(Sgemm, BlasSourceAndBatchesMatchNaive) {
  ThreadPool pool(2);
  for (GemmSource source : {GemmSource::kBlas, GemmSource::kNative}) {
    std::vector<Problem> problems = {{5, 6, 7}, {30, 17, 65}, {1, 40, 9}};
    std::vector<Operands> operands;
    std::vector<std::vector<float>> results;
    std::vector<GemmArgs> batch;
    for (size_t i = 0; i < problems.size(); ++i) {
      problems[i].transA = i == 1;
      problems[i].beta = i == 2 ? 1.0f : 0.0f;
      operands.push_back(operandsFor(problems[i], 50 + static_cast<unsigned>(i)));
    }
    for (size_t i = 0; i < problems.size(); ++i) results.push_back(operands[i].c);
    for (size_t i = 0; i < problems.size(); ++i) {
      batch.push_back(argsFor(problems[i], operands[i], results[i].data()));
    }
    cpu::sgemmBatch({.source = source}, batch, pool);
    for (size_t i = 0; i < problems.size(); ++i) {
      expectMatchesNaive(problems[i], operands[i], results[i],
                         source == GemmSource::kBlas ? "blas batch" : "native batch");
    }
  }
}

// The scalar model of GemmPrecision::kBf16: operands rounded to bfloat16 (nearest even,
// subnormals to zero), products exact, one float32 rounding per addition, each k pair summed
// odd element first; C's old value starts the sum when alpha == 1 and beta == 1.
float bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return x;
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  if ((rounded & 0x7f800000u) == 0) return std::bit_cast<float>(rounded & 0x80000000u);
  return std::bit_cast<float>(rounded);
}

std::vector<float> bf16Model(const Problem& p, const Operands& x) {
  std::vector<float> c = x.c;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      float sum = p.beta == 1.0f ? x.c[i * p.ldc() + j] : 0.0f;
      for (int64_t l = 0; l < p.k; l += 2) {
        if (l + 1 < p.k) sum += bf16(elementA(p, x, i, l + 1)) * bf16(elementB(p, x, l + 1, j));
        sum += bf16(elementA(p, x, i, l)) * bf16(elementB(p, x, l, j));
      }
      c[i * p.ldc() + j] = sum;
    }
  }
  return c;
}

TEST(NativeSgemm, Bf16IsExactlyTheScalarModelOnEveryKernel) {
  unsigned seed = 300;
  for (GemmKernel kernel : cpu::supportedGemmKernels()) {
    for (Problem p : {Problem{1, 1, 1}, Problem{13, 37, 65}, Problem{30, 70, 301},
                      Problem{16, 64, 600}, Problem{3, 5, 2}}) {
      for (int variant = 0; variant < 4; ++variant) {
        p.transA = variant & 1;
        p.transB = variant & 2;
        p.beta = variant == 3 ? 1.0f : 0.0f;
        p.padA = variant;
        const Operands x = operandsFor(p, seed++);
        const std::vector<float> expected = bf16Model(p, x);
        for (int64_t kc : {int64_t{128}, int64_t{256}}) {
          const GemmOptions options{.source = GemmSource::kNative,
                                    .precision = GemmPrecision::kBf16,
                                    .kc = kc,
                                    .kernel = kernel};
          const std::string what =
              kernelName(kernel) + " kc=" + std::to_string(kc) + " " + p.describe();
          EXPECT_EQ(runGemm(options, p, x, 1 + variant % 3), expected) << what;
          EXPECT_EQ(runPrepacked(options, p, x, 2), expected) << what << " prepacked";
        }
      }
    }
  }
}

// bf16 is a real change of arithmetic: close to float32 (within the operand rounding bound),
// but not equal to it.
TEST(NativeSgemm, Bf16DiffersFromFp32WithinTheRoundingBound) {
  const Problem p{20, 30, 64};
  const Operands x = operandsFor(p, 9);
  const std::vector<float> c =
      runGemm({.precision = GemmPrecision::kBf16}, p, x, 2);  // bf16 runs natively
  double largest = 0;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t l = 0; l < p.k; ++l) {
        sum += double(elementA(p, x, i, l)) * elementB(p, x, l, j);
        magnitude += std::fabs(double(elementA(p, x, i, l)) * elementB(p, x, l, j));
      }
      const double error = std::fabs(c[i * p.ldc() + j] - sum);
      // Each operand is within 2^-8 relative of its bfloat16 rounding.
      EXPECT_LE(error, (2 * std::ldexp(1.0, -8) + std::ldexp(1.0, -16)) * magnitude +
                           p.k * std::ldexp(1.0, -23) * magnitude);
      largest = std::max(largest, error / std::max(1e-6, magnitude));
    }
  }
  EXPECT_GT(largest, 1e-4) << "bf16 gave float32 results";
}

TEST(Bf16Model, RoundsToNearestEvenAndFlushesSubnormals) {
  EXPECT_EQ(bf16(1.0f), 1.0f);
  EXPECT_EQ(bf16(1.0f + std::ldexp(1.0f, -8)), 1.0f);  // a tie rounds to even
  EXPECT_EQ(bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(bf16(1e-39f), 0.0f);
}

// MatMul, Gemm and FusedGemm steps on the native source (float32 and bf16, prepacked or not)
// against the reference kernel.
struct StepCase {
  std::string opType, domain;
  std::vector<OpInput> inputs;
  std::map<std::string, ir::Attribute> attributes;
};

ir::Tensor tensorOf(ir::Shape shape, unsigned seed) {
  const std::vector<float> values = randomValues(shape.elementCount(), seed);
  return ir::Tensor::fromVector<float>(std::move(shape), values);
}

struct StepRun {
  std::string tactic, precision;
  ir::Tensor output;
};

StepRun runStep(const StepCase& c, const std::string& route) {
  BuilderConfig config;
  EXPECT_TRUE(config.setBuildRoute(route).isOk()) << route;
  ir::Graph graph =
      makeSingleOpGraph(c.opType, c.inputs, c.attributes, c.domain.empty() ? 18 : 1, 1, c.domain);
  if (!c.domain.empty()) graph.opsetImports[""] = 18;
  auto build = buildCpu(std::move(graph), config);
  EXPECT_TRUE(build.isOk()) << build.status().toString();
  if (!build.isOk()) return {};
  StepRun run;
  for (const auto& step : build->plan.steps()) {
    if (step->node->opType == c.opType) {
      run.tactic = step->tactic;
      run.precision = step->precision;
    }
  }
  std::vector<ir::Tensor> runtime;
  for (const OpInput& input : c.inputs) {
    if (!input.constant && !input.tensor.empty()) runtime.push_back(input.tensor);
  }
  auto outputs = build->plan.run(runtime);
  EXPECT_TRUE(outputs.isOk()) << outputs.status().toString();
  if (outputs.isOk()) run.output = std::move((*outputs)[0]);
  return run;
}

std::vector<StepCase> stepCases() {
  using ir::Attribute;
  return {
      {"MatMul", "", {{tensorOf({2, 37, 50}, 1)}, {tensorOf({50, 33}, 2), true}}, {}},
      {"MatMul", "", {{tensorOf({2, 37, 50}, 3)}, {tensorOf({50, 33}, 4)}}, {}},
      {"MatMul", "", {{tensorOf({3, 1, 9, 20}, 5)}, {tensorOf({2, 20, 11}, 6)}}, {}},
      {"MatMul", "", {{tensorOf({20}, 7)}, {tensorOf({20, 5}, 8), true}}, {}},
      {"MatMul", "", {{tensorOf({6, 20}, 9)}, {tensorOf({20}, 10), true}}, {}},
      {"Gemm",
       "",
       {{tensorOf({17, 40}, 11)}, {tensorOf({30, 40}, 12), true}, {tensorOf({30}, 13), true}},
       {{"transB", Attribute{int64_t{1}}}, {"alpha", Attribute{0.5f}}, {"beta", Attribute{2.0f}}}},
      {"Gemm",
       "",
       {{tensorOf({40, 17}, 14)}, {tensorOf({40, 30}, 15)}, {tensorOf({17, 1}, 16), true}},
       {{"transA", Attribute{int64_t{1}}}}},
      {"FusedGemm",
       ir::kKilnDomain,
       {{tensorOf({2, 5, 64}, 17)}, {tensorOf({48, 64}, 18), true}, {tensorOf({48}, 19), true}},
       {{"transB", Attribute{int64_t{1}}}, {"activation", Attribute{std::string("Relu")}}}},
  };
}

TEST(GemmSteps, NativeSourceMatchesTheReferenceKernel) {
  for (const StepCase& c : stepCases()) {
    const StepRun reference = runStep(c, "-cpu.gemm.source=reference");
    ASSERT_EQ(reference.tactic, "reference");
    for (const std::string route :
         {"-cpu.gemm.source=native", "-cpu.gemm.source=native -cpu.gemm.prepack=off",
          "-cpu.gemm.source=native -cpu.gemm.kc=128 -cpu.threads=3", "-cpu.gemm.source=blas"}) {
      const StepRun run = runStep(c, route);
      SCOPED_TRACE(c.opType + " " + c.inputs[0].tensor.shape().toString() + " " + route);
      const bool constantB = c.inputs[1].constant;
      if (route.find("blas") != std::string::npos) {
        EXPECT_EQ(run.tactic, "blas.sgemm");
      } else if (route.find("prepack=off") != std::string::npos || !constantB) {
        EXPECT_EQ(run.tactic.rfind("native.sgemm.kc", 0), 0u) << run.tactic;
        EXPECT_EQ(run.tactic.find("prepacked"), std::string::npos) << run.tactic;
      } else {
        EXPECT_NE(run.tactic.find("prepacked"), std::string::npos) << run.tactic;
      }
      EXPECT_EQ(run.precision, "fp32");
      ASSERT_EQ(run.output.shape(), reference.output.shape());
      for (int64_t i = 0; i < run.output.elementCount(); ++i) {
        const double e = reference.output.elementAsDouble(i);
        ASSERT_NEAR(run.output.elementAsDouble(i), e, 1e-5 * std::max(1.0, std::fabs(e)))
            << "element " << i;
      }
    }
    // bf16: operands in [-2, 2], k <= 64 here: within 2^-7 * sum|a||b| <= 2^-7 * 4k of float32.
    const StepRun bf16 = runStep(c, "-cpu.gemm.precision=bf16");
    EXPECT_EQ(bf16.precision, "bf16");
    EXPECT_EQ(bf16.tactic.rfind("native.sgemm", 0), 0u) << bf16.tactic;
    for (int64_t i = 0; i < bf16.output.elementCount(); ++i) {
      ASSERT_NEAR(bf16.output.elementAsDouble(i), reference.output.elementAsDouble(i),
                  std::ldexp(1.0, -7) * 4 * 64 * 2 + 1e-4);
    }
  }
}

}  // namespace
}  // namespace kiln::testing
