// The native SGEMM's scheduling knobs (cpu.gemm.kernel, block_a, block_b, split): every value
// against a naive triple loop on odd shapes (m, n, k not multiples of any register tile), with
// 1 and 2 threads, B packed on the fly and prepacked; the blocking and the split bit for bit
// against the default schedule; and MatMul/Gemm/FusedGemm steps under each value against the
// reference kernels, with the value in the step's tactic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kiln/backends/cpu/kernels/sgemm.h"
#include "kiln/engine/builder.h"
#include "kiln/ir/op_schema.h"
#include "op_test_util.h"

namespace kiln::testing {
namespace {

using cpu::GemmArgs;
using cpu::GemmKernel;
using cpu::GemmOptions;
using cpu::GemmSource;
using cpu::GemmSplit;
using cpu::PackedGemmB;
using cpu::ThreadPool;

std::vector<float> randomValues(int64_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = uniform(rng);
  return values;
}

// C[m, n] = A[m, k] * op(B) (B stored [n, k] when transB), beta 0, dense strides.
struct Problem {
  int64_t m, n, k;
  bool transB = false;
  std::string describe() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
           (transB ? " transB" : "");
  }
};

struct Operands {
  std::vector<float> a, b;
};

Operands operandsFor(const Problem& p, unsigned seed) {
  return {randomValues(p.m * p.k, seed), randomValues(p.k * p.n, seed + 1)};
}

GemmArgs argsFor(const Problem& p, const Operands& x, float* c) {
  return {.transB = p.transB,
          .m = p.m,
          .n = p.n,
          .k = p.k,
          .a = x.a.data(),
          .lda = p.k,
          .b = x.b.data(),
          .ldb = p.transB ? p.k : p.n,
          .c = c,
          .ldc = p.n};
}

// Within float32's rounding bound for a k-term sum, doubled: 2 (k + 2) 2^-24 sum |a||b|.
void expectMatchesNaive(const Problem& p, const Operands& x, const std::vector<float>& c,
                        const std::string& what) {
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) {
      double sum = 0, magnitude = 0;
      for (int64_t l = 0; l < p.k; ++l) {
        const double b = p.transB ? x.b[j * p.k + l] : x.b[l * p.n + j];
        sum += double(x.a[i * p.k + l]) * b;
        magnitude += std::fabs(double(x.a[i * p.k + l]) * b);
      }
      ASSERT_NEAR(c[i * p.n + j], sum, 2.0 * (p.k + 2) * std::ldexp(1.0, -24) * magnitude + 1e-30)
          << what << " " << p.describe() << " at (" << i << ", " << j << ")";
    }
  }
}

std::vector<float> runGemm(const GemmOptions& options, const Problem& p, const Operands& x,
                           int threads, bool prepack) {
  ThreadPool pool(threads);
  std::vector<float> c(static_cast<size_t>(p.m * p.n), 0.0f);
  GemmArgs args = argsFor(p, x, c.data());
  if (prepack) {
    const PackedGemmB packed(options, p.transB, p.k, p.n, x.b.data(), args.ldb);
    args.b = nullptr;  // must not be read
    cpu::sgemm(args, packed, pool);
  } else {
    cpu::sgemm(options, args, pool);
  }
  return c;
}

// Odd shapes; at kc = 512 a packed row or column holds 2 KiB, so the last one needs 3 blocks of
// A at 96 KiB (48 rows), 2 blocks of B at 1024 KiB (512 columns) and 2 panels of depth.
std::vector<Problem> oddShapes() {
  return {{13, 17, 19}, {7, 45, 33, false}, {29, 65, 300, true}, {101, 530, 520}};
}

std::string what(const std::string& knob, int threads, bool prepack) {
  return knob + " threads=" + std::to_string(threads) + (prepack ? " prepacked" : "");
}

TEST(GemmKnobs, EveryKernelValueMatchesNaive) {
  unsigned seed = 1;
  for (GemmKernel kernel :
       {GemmKernel::kAuto, GemmKernel::kAvx512, GemmKernel::kAvx2, GemmKernel::kPortable}) {
    if (!cpu::gemmKernelSupported(kernel)) continue;  // the knob falls back to auto (below)
    for (const Problem& p : oddShapes()) {
      const Operands x = operandsFor(p, seed++);
      const GemmOptions options{.source = GemmSource::kNative, .kc = 512, .kernel = kernel};
      for (int threads : {1, 2}) {
        for (bool prepack : {false, true}) {
          expectMatchesNaive(p, x, runGemm(options, p, x, threads, prepack),
                             what(cpu::gemmKernelName(kernel), threads, prepack));
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// Blocking and split only partition C among blocks and tasks: each element is summed in the
// same order, so every value gives the default schedule's bits (which match the naive loop).
TEST(GemmKnobs, EveryBlockingAndSplitGivesTheDefaultBits) {
  std::vector<std::pair<std::string, GemmOptions>> values;
  for (int64_t kib : {96, 192, 384, 768}) {
    values.push_back({"block_a=" + std::to_string(kib), {.kc = 512, .blockAKiB = kib}});
  }
  for (int64_t kib : {1024, 4096, 16384}) {
    values.push_back({"block_b=" + std::to_string(kib), {.kc = 512, .blockBKiB = kib}});
  }
  values.push_back({"split=auto", {.kc = 512, .split = GemmSplit::kAuto}});
  values.push_back({"split=rows", {.kc = 512, .split = GemmSplit::kRows}});
  values.push_back({"split=columns", {.kc = 512, .split = GemmSplit::kColumns}});
  values.push_back({"block_a=96 block_b=1024 split=columns",
                    {.kc = 512, .blockAKiB = 96, .blockBKiB = 1024, .split = GemmSplit::kColumns}});
  unsigned seed = 40;
  for (const Problem& p : oddShapes()) {
    const Operands x = operandsFor(p, seed++);
    const std::vector<float> reference =
        runGemm({.source = GemmSource::kNative, .kc = 512}, p, x, 1, false);
    expectMatchesNaive(p, x, reference, "default");
    for (auto [name, options] : values) {
      options.source = GemmSource::kNative;
      for (int threads : {1, 2}) {
        for (bool prepack : {false, true}) {
          const std::vector<float> c = runGemm(options, p, x, threads, prepack);
          EXPECT_EQ(c, reference) << what(name, threads, prepack) << " " << p.describe();
        }
      }
    }
  }
}

// MatMul, Gemm and FusedGemm steps under each knob value against the reference kernel.
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
  std::string tactic;
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
    if (step->node->opType == c.opType) run.tactic = step->tactic;
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
      {"MatMul", "", {{tensorOf({3, 1, 9, 20}, 5)}, {tensorOf({2, 20, 11}, 6)}}, {}},
      {"Gemm",
       "",
       {{tensorOf({17, 40}, 11)}, {tensorOf({30, 40}, 12), true}, {tensorOf({30}, 13), true}},
       {{"transB", Attribute{int64_t{1}}}, {"alpha", Attribute{0.5f}}, {"beta", Attribute{2.0f}}}},
      {"FusedGemm",
       ir::kKilnDomain,
       {{tensorOf({2, 5, 64}, 17)}, {tensorOf({48, 64}, 18), true}, {tensorOf({48}, 19), true}},
       {{"transB", Attribute{int64_t{1}}}, {"activation", Attribute{std::string("Relu")}}}},
  };
}

// Each knob value with the tactic part it must show (a kernel this CPU lacks: "auto-no-...").
std::vector<std::pair<std::string, std::string>> knobValues() {
  const auto kernel = [](const std::string& name, GemmKernel k) {
    return std::pair{"-cpu.gemm.kernel=" + name,
                     "." + (cpu::gemmKernelSupported(k) ? name : "auto-no-" + name)};
  };
  return {
      {"-cpu.gemm.kernel=auto", ""},
      kernel("avx512", GemmKernel::kAvx512),
      kernel("avx2", GemmKernel::kAvx2),
      kernel("portable", GemmKernel::kPortable),
      {"-cpu.gemm.block_a=96", ".a96k"},
      {"-cpu.gemm.block_a=192", ".a192k"},
      {"-cpu.gemm.block_a=768", ".a768k"},
      {"-cpu.gemm.block_b=1024", ".b1024k"},
      {"-cpu.gemm.block_b=16384", ".b16384k"},
      {"-cpu.gemm.split=rows", ".rows"},
      {"-cpu.gemm.split=columns", ".columns"},
      {"-cpu.gemm.kernel=portable -cpu.gemm.block_a=96 -cpu.gemm.split=rows",
       ".portable.a96k.rows"},
  };
}

TEST(GemmKnobs, StepsUnderEveryValueMatchTheReferenceAndShowItInTheTactic) {
  for (const StepCase& c : stepCases()) {
    const StepRun reference = runStep(c, "-cpu.gemm.source=reference");
    ASSERT_EQ(reference.tactic, "reference");
    for (const auto& [knobs, shown] : knobValues()) {
      for (const std::string threads : {"1", "2"}) {
        const std::string route = "-cpu.gemm.source=native -cpu.threads=" + threads + " " + knobs;
        SCOPED_TRACE(c.opType + " " + c.inputs[0].tensor.shape().toString() + " " + route);
        const StepRun run = runStep(c, route);
        const std::string packed = c.inputs[1].constant ? ".prepacked" : "";
        EXPECT_EQ(run.tactic, "native.sgemm.kc256" + shown + packed);
        ASSERT_EQ(run.output.shape(), reference.output.shape());
        for (int64_t i = 0; i < run.output.elementCount(); ++i) {
          const double e = reference.output.elementAsDouble(i);
          ASSERT_NEAR(run.output.elementAsDouble(i), e, 1e-5 * std::max(1.0, std::fabs(e)))
              << "element " << i;
        }
      }
    }
  }
}

// cpu.gemm.epilogue=tiles: FusedGemm's activation on each finished block of C (several blocks of
// A and B at block_a=96 and block_b=1024 here) matches the reference, which applies it after.
TEST(GemmKnobs, EpilogueInTilesMatchesTheReference) {
  using ir::Attribute;
  for (const std::string activation : {"Relu", "Sigmoid", "Tanh"}) {
    for (const StepCase& c : std::vector<StepCase>{
             {"FusedGemm",
              ir::kKilnDomain,
              {{tensorOf({2, 5, 64}, 17)},
               {tensorOf({48, 64}, 18), true},
               {tensorOf({48}, 19), true}},
              {{"transB", Attribute{int64_t{1}}}, {"activation", Attribute{activation}}}},
             {"FusedGemm",
              ir::kKilnDomain,
              {{tensorOf({203, 37}, 20)}, {tensorOf({37, 1030}, 21)}, {tensorOf({1030}, 22), true}},
              {{"activation", Attribute{activation}}}},
         }) {
      const StepRun reference = runStep(c, "-cpu.gemm.source=reference");
      for (const std::string route :
           {"-cpu.threads=1", "-cpu.threads=2",
            "-cpu.threads=2 -cpu.gemm.kc=512 -cpu.gemm.block_a=96 -cpu.gemm.block_b=1024"}) {
        SCOPED_TRACE(activation + " " + c.inputs[0].tensor.shape().toString() + " " + route);
        const StepRun after = runStep(c, "-cpu.gemm.source=native " + route);
        const StepRun tiles =
            runStep(c, "-cpu.gemm.source=native -cpu.gemm.epilogue=tiles " + route);
        EXPECT_EQ(tiles.tactic, after.tactic + ".epilogue-tiles");
        ASSERT_EQ(tiles.output.shape(), reference.output.shape());
        for (int64_t i = 0; i < tiles.output.elementCount(); ++i) {
          const double e = reference.output.elementAsDouble(i);
          ASSERT_NEAR(tiles.output.elementAsDouble(i), e, 1e-5 * std::max(1.0, std::fabs(e)))
              << "element " << i;
          // Same product, same activation: only where it runs differs.
          ASSERT_EQ(tiles.output.elementAsDouble(i), after.output.elementAsDouble(i)) << i;
        }
      }
    }
  }
  // Without an activation there is no epilogue to move.
  const StepCase matmul = stepCases()[0];
  EXPECT_EQ(runStep(matmul, "-cpu.gemm.epilogue=tiles").tactic, "native.sgemm.kc256.prepacked");
}

}  // namespace
}  // namespace kiln::testing
