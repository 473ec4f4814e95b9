// Time of one float32 GEMM, C[m, n] = A[m, k] * B[k, n], through each source of sgemm():
// OpenBLAS, the native kernels (B packed per call or prepacked, each panel depth), and bf16, on
// the shapes the shared models run, at 1 and 2 threads; prepacked products at 2 threads also with
// each cpu.gemm.split. GFLOP/s is reported as a counter. The pool's threads spin between calls for
// the plan's default time (cpu.threads.spin_us), as in a plan's run, so that a call does not
// time the worker's wake-up from sleep.
//
//   build/bench/kiln_gemm_bench --benchmark_filter='vit' --benchmark_repetitions=5
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kiln/backends/cpu/kernels/sgemm.h"

namespace {

using kiln::cpu::GemmArgs;
using kiln::cpu::GemmOptions;
using kiln::cpu::GemmPrecision;
using kiln::cpu::GemmSource;
using kiln::cpu::GemmSplit;
using kiln::cpu::PackedGemmB;
using kiln::cpu::ThreadPool;

struct Shape {
  const char* name;
  int64_t m, n, k;
};

// The shapes of the shared models' products: attention and MLP of vit_tiny and bert_mini, a
// 1x1 convolution of a small CNN (weights as A), and a square reference point.
const Shape kShapes[] = {
    {"square128", 128, 128, 128},    {"vit_qkv", 197, 576, 192},   {"vit_mlp_up", 197, 768, 192},
    {"vit_mlp_down", 197, 192, 768}, {"vit_scores", 197, 197, 64}, {"bert_ffn", 128, 256, 256},
    {"bert_ffn_up", 128, 1024, 256}, {"conv1x1", 16, 3136, 64},    {"conv1x1_wide", 64, 784, 128},
    {"classifier", 1, 1000, 1024},
};

std::vector<float> randomValues(int64_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = uniform(rng);
  return v;
}

enum class Mode { kBlas, kNative, kNativePrepacked, kBf16Prepacked };

// cpu.threads.spin_us's default (lower.cc).
constexpr int kSpinMicros = 50;

void runGemm(benchmark::State& state, Shape shape, Mode mode, int threads, int64_t kc,
             GemmSplit split) {
  const std::vector<float> a = randomValues(shape.m * shape.k, 1);
  const std::vector<float> b = randomValues(shape.k * shape.n, 2);
  std::vector<float> c(static_cast<size_t>(shape.m * shape.n));
  ThreadPool pool(threads, kSpinMicros);
  openblas_set_num_threads(threads);
  const GemmOptions options{
      .source = mode == Mode::kBlas ? GemmSource::kBlas : GemmSource::kNative,
      .precision = mode == Mode::kBf16Prepacked ? GemmPrecision::kBf16 : GemmPrecision::kFp32,
      .kc = kc,
      .split = split};
  std::unique_ptr<PackedGemmB> packed;
  if (mode == Mode::kNativePrepacked || mode == Mode::kBf16Prepacked) {
    packed = std::make_unique<PackedGemmB>(options, false, shape.k, shape.n, b.data(), shape.n);
  }
  const GemmArgs args{.m = shape.m,
                      .n = shape.n,
                      .k = shape.k,
                      .a = a.data(),
                      .lda = shape.k,
                      .b = b.data(),
                      .ldb = shape.n,
                      .c = c.data(),
                      .ldc = shape.n};
  for (auto _ : state) {
    if (packed) {
      kiln::cpu::sgemm(args, *packed, pool);
    } else {
      kiln::cpu::sgemm(options, args, pool);
    }
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPS"] = benchmark::Counter(
      2.0 * static_cast<double>(shape.m * shape.n * shape.k) * state.iterations(),
      benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

const int kRegistered = [] {
  const std::pair<Mode, const char*> modes[] = {{Mode::kBlas, "blas"},
                                                {Mode::kNative, "native"},
                                                {Mode::kNativePrepacked, "native_prepacked"},
                                                {Mode::kBf16Prepacked, "bf16_prepacked"}};
  for (const Shape& shape : kShapes) {
    for (int threads : {1, 2}) {
      for (auto [mode, modeName] : modes) {
        const std::vector<int64_t> depths = mode == Mode::kBlas
                                                ? std::vector<int64_t>{kiln::cpu::kDefaultGemmKc}
                                                : std::vector<int64_t>{128, 256, 384, 512};
        for (int64_t kc : depths) {
          std::string name =
              std::string(shape.name) + "/" + modeName + "/t" + std::to_string(threads);
          if (mode != Mode::kBlas) name += "/kc" + std::to_string(kc);
          benchmark::RegisterBenchmark(name.c_str(), runGemm, shape, mode, threads, kc,
                                       GemmSplit::kAuto)
              ->UseRealTime();
          if (mode != Mode::kNativePrepacked || threads == 1 || kc != kiln::cpu::kDefaultGemmKc) {
            continue;
          }
          for (auto [split, splitName] :
               {std::pair{GemmSplit::kRows, "rows"}, std::pair{GemmSplit::kColumns, "columns"}}) {
            benchmark::RegisterBenchmark((name + "/" + splitName).c_str(), runGemm, shape, mode,
                                         threads, kc, split)
                ->UseRealTime();
          }
        }
      }
    }
  }
  return 0;
}();

}  // namespace

BENCHMARK_MAIN();
