// Effects of the knobs that steer cuDNN's and cuBLASLt's choices (kernels/conv_steps.cc,
// kernels/gemm_product.cc): how much workspace an engine or algorithm may take, which heuristics
// rank cuDNN's engines, which numerics its engines may use, how many candidates a timed choice
// times and how often. Lowering states the request in the step's detail, so the difference shows
// without a GPU; on a GPU the detail also names what the library gave, and the cases check that
// the answer keeps to the request (an engine's workspace within the limit, say).
#if KILN_HAVE_CUDA
#include <gtest/gtest.h>

#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "graph_sketch.h"
#include "knob_effects.h"

namespace kiln::testing {
namespace {

// x [2, 16, 14, 14] -> Conv 3x3 (pads 1) with a bias: one cuDNN step, the shape Winograd engines
// take.
ir::Graph conv3x3() {
  GraphSketch g;
  g.output(g.node(
      "Conv", {g.input("x", {2, 16, 14, 14}), g.weight("w", {16, 16, 3, 3}), g.weight("b", {16})},
      {{"pads", ints({1, 1, 1, 1})}}, "conv"));
  return g.take();
}

// fc = Gemm(x [64, 256], w [256, 128], b [128]).
ir::Graph gemm() {
  GraphSketch g;
  g.output(g.node("Gemm",
                  {g.input("x", {64, 256}), g.weight("w", {256, 128}), g.weight("b", {128})}, {},
                  "fc"));
  return g.take();
}

// The workspace a prepared step says its library's choice takes ("workspace N bytes"), or -1
// when the detail names none (no GPU: nothing was prepared).
int64_t preparedWorkspace(const std::string& detail) {
  std::smatch match;
  static const std::regex pattern("workspace (\\d+) bytes");
  return std::regex_search(detail, match, pattern) ? std::stoll(match[1]) : -1;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

struct DetailEffect {
  const char* knob;
  const char* value;
  const char* base;     // in the base build's detail
  const char* changed;  // in the changed build's detail instead
  const char* baseRoute = "";
  double tolerance = 1e-4;
};

// Registers one case a row: the layer's detail says `base` without the knob and `changed` with
// it; a workspace limit (cuda.*.workspace) must also hold for what the GPU prepared.
void registerDetailEffects(const char* layer, std::function<ir::Graph()> graph,
                           const std::vector<DetailEffect>& rows) {
  for (const DetailEffect& row : rows) {
    const std::string name = layer, base = row.base, changed = row.changed, knob = row.knob;
    const int64_t limit =
        contains(knob, ".workspace") ? int64_t{std::stoi(row.value)} << 20 : int64_t{-1};
    registerKnobEffect({
        .knob = row.knob,
        .value = row.value,
        .shows = std::string("the request to the library reads \"") + row.changed +
                 "\" instead of \"" + row.base + "\"",
        .backend = "cuda",
        .graph = graph,
        .baseRoute = row.baseRoute,
        .tolerance = row.tolerance,
        .expect =
            [name, base, changed, limit](const BuildSnapshot& before, const BuildSnapshot& after) {
              const std::string& was = before.layer(name).detail;
              const std::string& now = after.layer(name).detail;
              EXPECT_TRUE(contains(was, base)) << was;
              EXPECT_FALSE(contains(was, changed)) << was;
              EXPECT_TRUE(contains(now, changed)) << now;
              if (limit >= 0 && !after.outputs.empty()) {
                const int64_t used = preparedWorkspace(now);
                EXPECT_GE(used, 0) << "a prepared step names its workspace: " << now;
                EXPECT_LE(used, limit) << now;
              }
            },
    });
  }
}

[[maybe_unused]] const int kConvEffects = [] {
  const char* timed = "-cuda.conv.algo=timed";
  registerDetailEffects(
      "conv", conv3x3,
      {
          {"cuda.conv.workspace", "0", "within 256 MiB of workspace", "within 0 MiB of workspace"},
          {"cuda.conv.workspace", "16", "within 256 MiB", "within 16 MiB"},
          {"cuda.conv.workspace", "64", "within 256 MiB", "within 64 MiB"},
          {"cuda.conv.workspace", "1024", "within 256 MiB", "within 1024 MiB"},
          {"cuda.conv.candidates", "2", "8 configs timed", "2 configs timed", timed},
          {"cuda.conv.candidates", "4", "8 configs timed", "4 configs timed", timed},
          {"cuda.conv.candidates", "16", "8 configs timed", "16 configs timed", timed},
          {"cuda.conv.timing_runs", "1", "timed 3 runs each", "timed 1 runs each", timed},
          {"cuda.conv.timing_runs", "10", "timed 3 runs each", "timed 10 runs each", timed},
          {"cuda.conv.heuristics", "b", "cuDNN, heuristics A", "cuDNN, heuristics B"},
          {"cuda.conv.winograd", "allow", "workspace", "allowed, Winograd", "", 1e-3},
          {"cuda.conv.fft", "allow", "workspace", "allowed, FFT", "", 1e-3},
          {"cuda.conv.reduced_precision", "allow", "workspace", "allowed, reduced precision", "",
           2e-2},
          {"cuda.conv.nondeterministic", "deny", "workspace", ", deterministic"},
          {"cuda.conv.engine_rank", "1", "the first that plans", "number 2 of those that plan"},
          {"cuda.conv.engine_rank", "2", "the first that plans", "number 3 of those that plan"},
          {"cuda.conv.engine_rank", "3", "the first that plans", "number 4 of those that plan"},
      });
  return 0;
}();

[[maybe_unused]] const int kFoldBatchEffects = [] {
  registerDetailEffects(
      "proj",
      [] {
        // proj = MatMul(x [4, 8, 32], w [32, 16]): one right matrix.
        GraphSketch g;
        g.output(g.node("MatMul", {g.input("x", {4, 8, 32}), g.weight("w", {32, 16})}, {}, "proj"));
        return g.take();
      },
      {
          {"cuda.gemm.fold_batch", "off", "m=32 n=16 k=32 batch=1", "m=8 n=16 k=32 batch=4"},
      });
  return 0;
}();

[[maybe_unused]] const int kGemmEffects = [] {
  const char* timed = "-cuda.gemm.algo=timed";
  registerDetailEffects(
      "fc", gemm,
      {
          {"cuda.gemm.workspace", "0", "workspace within 32 MiB", "workspace within 0 MiB"},
          {"cuda.gemm.workspace", "4", "workspace within 32 MiB", "workspace within 4 MiB"},
          {"cuda.gemm.workspace", "128", "workspace within 32 MiB", "workspace within 128 MiB"},
          {"cuda.gemm.candidates", "2", "up to 8 timed", "up to 2 timed", timed},
          {"cuda.gemm.candidates", "4", "up to 8 timed", "up to 4 timed", timed},
          {"cuda.gemm.candidates", "16", "up to 8 timed", "up to 16 timed", timed},
          {"cuda.gemm.timing_runs", "1", "timed 3 runs each", "timed 1 runs each", timed},
          {"cuda.gemm.timing_runs", "10", "timed 3 runs each", "timed 10 runs each", timed},
          {"cuda.gemm.split_k", "deny", "split-K allowed", "split-K denied"},
          {"cuda.gemm.epilogue.block", "128", "epilogue kernel of 256-thread blocks",
           "epilogue kernel of 128-thread blocks", "-cuda.gemm.epilogue=separate"},
          {"cuda.gemm.epilogue.block", "512", "epilogue kernel of 256-thread blocks",
           "epilogue kernel of 512-thread blocks", "-cuda.gemm.epilogue=separate"},
          {"cuda.gemm.epilogue.block", "1024", "epilogue kernel of 256-thread blocks",
           "epilogue kernel of 1024-thread blocks", "-cuda.gemm.epilogue=separate"},
          {"cuda.gemm.algo_rank", "1", "split-K allowed", "the heuristics' number 2"},
          {"cuda.gemm.algo_rank", "2", "split-K allowed", "the heuristics' number 3"},
          {"cuda.gemm.algo_rank", "3", "split-K allowed", "the heuristics' number 4"},
      });
  return 0;
}();

// Products and convolutions small enough for kiln's own kernels (cuda.*.native_below).
struct NativeBelow {
  const char* knob;
  const char* value;
  std::function<ir::Graph()> graph;
  const char* layer;
  const char* library;  // the base build's tactic
  const char* native;   // the changed build's
};

[[maybe_unused]] const int kNativeBelowEffects = [] {
  auto tinyConv = [] {
    // x [1, 16, 1, 1] -> 1x1 Conv to 8 channels: 128 multiply-adds (a squeeze-excite FC).
    GraphSketch g;
    g.output(g.node("Conv",
                    {g.input("x", {1, 16, 1, 1}), g.weight("w", {8, 16, 1, 1}), g.weight("b", {8})},
                    {}, "conv"));
    return g.take();
  };
  auto tinyGemm = [] {
    GraphSketch g;  // [1, 16] x [16, 24]: 384 multiply-adds
    g.output(g.node("Gemm", {g.input("x", {1, 16}), g.weight("w", {16, 24}), g.weight("b", {24})},
                    {}, "fc"));
    return g.take();
  };
  for (const NativeBelow& e : std::vector<NativeBelow>{
           {"cuda.conv.native_below", "65536", tinyConv, "conv", "cudnn", "kiln.conv"},
           // conv3x3: 6272 outputs of 144 multiply-adds each, 903168 in all.
           {"cuda.conv.native_below", "1048576", conv3x3, "conv", "cudnn", "kiln.conv"},
           {"cuda.gemm.native_below", "16384", tinyGemm, "fc", "cublaslt", "native"},
           // gemm: 64 x 128 x 256 = 2097152 multiply-adds, above both thresholds: the tiny one.
           {"cuda.gemm.native_below", "262144", tinyGemm, "fc", "cublaslt", "native"}}) {
    const std::string layer = e.layer, library = e.library, native = e.native;
    registerKnobEffect({
        .knob = e.knob,
        .value = e.value,
        .shows = std::string("a ") + e.layer + " below " + e.value +
                 " multiply-adds runs kiln's kernel instead of the library",
        .backend = "cuda",
        .graph = e.graph,
        .expect =
            [layer, library, native](const BuildSnapshot& before, const BuildSnapshot& after) {
              EXPECT_EQ(before.layer(layer).tactic, library);
              EXPECT_EQ(after.layer(layer).tactic, native);
            },
    });
  }
  return 0;
}();

}  // namespace
}  // namespace kiln::testing
#endif
