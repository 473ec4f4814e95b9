// `kiln run model.onnx` (or an engine file from `kiln build`): feed inputs (from .npy/.npz files,
// or seeded random), run the model on the CPU or the GPU, time it, print a summary of every output
// and optionally save them.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>
#include <sstream>

#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>

#if KILN_HAVE_CUDA
#include "kiln/backends/cuda/timing_loop.h"
#endif
#include "kiln/base/file.h"
#include "kiln/base/statistics.h"
#include "kiln/cli/commands.h"
#include "kiln/engine/builder.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/inputs.h"
#include "kiln/ir/npy.h"
#include "kiln/ir/printer.h"
#include "kiln/onnx/import.h"
#include "kiln/reference/executor.h"

namespace kiln::cli {

namespace {

struct RunOptions {
  std::string model;
  std::string shapes;
  std::vector<std::string> loadInputs;
  std::string saveOutputs;
  std::string saveInputs;
  uint64_t seed = 0;
  std::string route;
  std::string backend = "cpu";
  std::string dumpIrAfter;
  double warmUpMs = 200;  // trtexec's defaults
  int iterations = 10;    // at least this many timed runs...
  double durationS = 3;   // ...and at least this long
  std::string exportTimes;
  bool dumpProfile = false;
  bool dataTransfers = false;   // cuda: host/device copies inside each timed run
  std::string timingCacheFile;  // cuda: where timed choices are read from and saved to
};

void printSummary(const std::string& name, const ir::Tensor& tensor) {
  double sum = 0, lo = INFINITY, hi = -INFINITY;
  int64_t nonFinite = 0;
  for (int64_t i = 0; i < tensor.elementCount(); ++i) {
    const double v = tensor.elementAsDouble(i);
    if (!std::isfinite(v)) {
      ++nonFinite;
      continue;
    }
    sum += v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  const int64_t finite = tensor.elementCount() - nonFinite;
  std::printf("  %s : %s%s  min %.6g  max %.6g  mean %.6g", name.c_str(),
              std::string(ir::dtypeName(tensor.dtype())).c_str(), tensor.shape().toString().c_str(),
              finite ? lo : NAN, finite ? hi : NAN,
              finite ? sum / static_cast<double>(finite) : NAN);
  if (nonFinite) std::printf("  non-finite %lld", static_cast<long long>(nonFinite));
  std::printf("\n    first:");
  for (int64_t i = 0; i < std::min<int64_t>(tensor.elementCount(), 6); ++i) {
    std::printf(" %.6g", tensor.elementAsDouble(i));
  }
  std::printf("\n");
}

void printLatency(const std::vector<double>& latencies, double wallSeconds, const char* what);

// trtexec's timing loop: warm up for --warmUp ms, then run at least --iterations times and
// for at least --duration seconds; print the summary, and per-step times with --dumpProfile.
Status measure(const std::function<Result<std::vector<ir::Tensor>>(std::vector<double>*)>& run,
               const RunOptions& options, const cpu::Plan* plan) {
  using Clock = std::chrono::steady_clock;
  const auto warmUpEnd = Clock::now() + std::chrono::duration<double, std::milli>(options.warmUpMs);
  while (Clock::now() < warmUpEnd) KILN_RETURN_IF_ERROR(run(nullptr).status());
  std::vector<double> latencies;
  std::vector<double> stepTotals(plan ? plan->steps().size() : 0, 0.0);
  std::vector<double> steps;
  const auto start = Clock::now();
  while (static_cast<int>(latencies.size()) < options.iterations ||
         Clock::now() - start < std::chrono::duration<double>(options.durationS)) {
    const auto begin = Clock::now();
    KILN_RETURN_IF_ERROR(run(options.dumpProfile ? &steps : nullptr).status());
    latencies.push_back(std::chrono::duration<double, std::milli>(Clock::now() - begin).count());
    for (size_t i = 0; i < steps.size() && i < stepTotals.size(); ++i) stepTotals[i] += steps[i];
  }
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  printLatency(latencies, wall, "latency");
  const TimingSummary t = summarize(latencies);
  if (options.dumpProfile && plan) {
    std::printf("per-layer profile (mean ms over %d runs):\n", t.count);
    std::printf("  %-40s %-22s %-18s %10s %6s\n", "layer", "op", "tactic", "ms", "%");
    const double total = std::accumulate(stepTotals.begin(), stepTotals.end(), 0.0);
    for (size_t i = 0; i < plan->steps().size(); ++i) {
      const cpu::Step& step = *plan->steps()[i];
      std::printf("  %-40s %-22s %-18s %10.4f %5.1f%%\n", step.node->name.c_str(),
                  step.node->opType.c_str(), step.tactic.c_str(), stepTotals[i] / t.count,
                  total > 0 ? 100.0 * stepTotals[i] / total : 0.0);
    }
  }
  if (!options.exportTimes.empty()) {
    nlohmann::json times = nlohmann::json::array();
    for (double ms : latencies) times.push_back({{"latencyMs", ms}});
    KILN_RETURN_IF_ERROR(writeFileAtomically(options.exportTimes, times.dump(1)));
  }
  return Status::ok();
}

void printLatency(const std::vector<double>& latencies, double wallSeconds, const char* what) {
  const TimingSummary t = summarize(latencies);
  std::printf(
      "%s over %d runs (ms): min %.4f  median %.4f  mean %.4f  p90 %.4f  p99 %.4f  "
      "max %.4f\nthroughput: %.2f inferences/s\n",
      what, t.count, t.min, t.median, t.mean, t.p90, t.p99, t.max, t.count / wallSeconds);
}

#if KILN_HAVE_CUDA
// The GPU's timing loop: device time between CUDA events around each run (the CUDA graph's
// replay where the plan has one), copies excluded unless --dataTransfers; warm-up and the run
// count follow trtexec's flags. --dumpProfile runs step by step, an event pair per step.
Status measureCuda(cuda::Plan& plan, const std::vector<ir::Tensor>& inputs,
                   const RunOptions& options) {
  cuda::TimingLoop loop;
  loop.batch.includeCopies = options.dataTransfers;
  loop.warmUpMs = options.warmUpMs;
  loop.minRuns = options.iterations;
  loop.minSeconds = options.durationS;
  KILN_ASSIGN_OR_RETURN(cuda::TimedRuns timed, cuda::timeRuns(plan, inputs, loop));
  const std::vector<double>& latencies = timed.milliseconds;
  const double wall = timed.wallSeconds;
  std::printf("execution: %s\n", plan.usesGraph() ? "CUDA graph replay" : plan.graphNote().c_str());
  printLatency(latencies, wall,
               options.dataTransfers ? "GPU time with host copies" : "GPU compute time");
  if (options.dumpProfile) {
    std::vector<double> totals(plan.steps().size(), 0.0), steps;
    const int profiled = std::max(options.iterations, 10);
    for (int run = 0; run < profiled; ++run) {
      KILN_RETURN_IF_ERROR(plan.run(inputs, &steps).status());
      for (size_t i = 0; i < steps.size(); ++i) totals[i] += steps[i];
    }
    std::printf("per-layer profile (mean GPU ms over %d step-by-step runs):\n", profiled);
    std::printf("  %-40s %-22s %-18s %10s %6s\n", "layer", "op", "tactic", "ms", "%");
    const double total = std::accumulate(totals.begin(), totals.end(), 0.0);
    for (size_t i = 0; i < plan.steps().size(); ++i) {
      const cuda::Step& step = *plan.steps()[i];
      std::printf("  %-40s %-22s %-18s %10.4f %5.1f%%\n", step.node->name.c_str(),
                  step.node->opType.c_str(), step.tactic.c_str(), totals[i] / profiled,
                  total > 0 ? 100.0 * totals[i] / total : 0.0);
    }
  }
  if (!options.exportTimes.empty()) {
    nlohmann::json times = nlohmann::json::array();
    for (double ms : latencies) times.push_back({{"latencyMs", ms}});
    KILN_RETURN_IF_ERROR(writeFileAtomically(options.exportTimes, times.dump(1)));
  }
  return Status::ok();
}
#endif

int runModel(const RunOptions& options) {
  if (options.backend == "cuda") {
#if KILN_HAVE_CUDA
    // With --dump-ir-after the pass pipeline runs (and prints) on a machine without a GPU too;
    // the build then stops where it needs the device.
    if (auto device = cuda::currentDevice(); !device.isOk() && options.dumpIrAfter.empty()) {
      return reportError(device.status());
    }
#else
    return reportError(unsupported(
        "--backend cuda: this kiln was built without the CUDA backend (KILN_CUDA=OFF, or no CUDA "
        "toolkit was found when it was configured)"));
#endif
  } else if (options.dataTransfers) {
    return reportError(invalidInput("--dataTransfers applies to --backend cuda only"));
  } else if (!options.timingCacheFile.empty()) {
    return reportError(invalidInput("--timingCacheFile applies to --backend cuda only"));
  }
  const bool fromEngine = isEngineFile(options.model);
  if (fromEngine) {
    // The engine fixed shapes, route and passes when it was built; silently ignoring these
    // flags would run something other than what the user asked for.
    if (!options.shapes.empty() || !options.route.empty() || !options.dumpIrAfter.empty() ||
        options.backend != "cpu") {
      return reportError(invalidInput(
          "'{}' is an engine file: --shapes, --route, --dump-ir-after and --backend apply to "
          "ONNX models only (the engine fixed them when it was built)",
          options.model));
    }
  }
  auto parsedShapes = importOptionsFromShapes(options.shapes);
  if (!parsedShapes.isOk()) return reportError(parsedShapes.status());
  onnx::ImportOptions importOptions = *parsedShapes;
  auto given = ir::loadNamedTensors(options.loadInputs, "--loadInputs");
  if (!given.isOk()) return reportError(given.status());
  // A loaded input fixes its own shape, so dynamic dimensions need no --shapes for it.
  for (const auto& [name, tensor] : *given) {
    importOptions.inputShapes.try_emplace(name, tensor.shape().dims());
  }
  std::optional<onnx::Model> model;
  std::optional<LoadedEngine> engine;
  if (fromEngine) {
    auto loaded = loadEngine(options.model);
    if (!loaded.isOk()) return reportError(loaded.status());
    engine.emplace(std::move(loaded).value());
  } else {
    auto imported = onnx::importModel(options.model, importOptions);
    if (!imported.isOk()) return reportError(imported.status());
    model.emplace(std::move(imported).value());
  }
  const ir::Graph& graph = engine ? engine->plan.graph() : model->graph;
  std::vector<std::string> outputNames;
  for (const ir::Value* output : graph.outputs) outputNames.push_back(output->name);

  std::mt19937_64 rng(options.seed);
  std::vector<ir::Tensor> inputs;
  std::set<std::string> used;
  std::printf("inputs:\n");
  for (const ir::Value* input : graph.inputs) {
    auto it = given->find(input->name);
    if (it == given->end()) {
      inputs.push_back(ir::seededRandomTensor(input->dtype, input->shape, rng));
      std::printf("  %s : %s%s  (random, seed %llu)\n", input->name.c_str(),
                  std::string(ir::dtypeName(input->dtype)).c_str(), input->shape.toString().c_str(),
                  static_cast<unsigned long long>(options.seed));
      continue;
    }
    if (it->second.dtype() != input->dtype) {
      return reportError(invalidInput("input '{}' is {} in the model, but the file holds {}",
                                      input->name, ir::dtypeName(input->dtype),
                                      ir::dtypeName(it->second.dtype())));
    }
    inputs.push_back(it->second);
    used.insert(input->name);
    std::printf("  %s : %s%s  (loaded)\n", input->name.c_str(),
                std::string(ir::dtypeName(input->dtype)).c_str(), input->shape.toString().c_str());
  }
  for (const auto& [name, tensor] : *given) {
    if (!used.count(name)) {
      return reportError(
          invalidInput("--loadInputs gives '{}', which is not an input of the "
                       "model",
                       name));
    }
  }
  if (!options.saveInputs.empty()) {
    // The inputs as run (seeded or loaded), for another runtime to take the same ones.
    if (std::filesystem::path(options.saveInputs).extension() != ".npz") {
      return reportError(invalidInput("--saveInputs '{}' must end in .npz", options.saveInputs));
    }
    ir::NamedTensors named;
    for (size_t i = 0; i < inputs.size(); ++i) named.emplace_back(graph.inputs[i]->name, inputs[i]);
    Status saved = ir::writeNpz(options.saveInputs, named, /*compressed=*/false);
    if (!saved.isOk()) return reportError(saved);
    std::printf("saved inputs to %s\n", options.saveInputs.c_str());
  }

  // One function that runs the model once, on the backend asked for; timing wraps it.
  std::function<Result<std::vector<ir::Tensor>>(std::vector<double>*)> runOnce;
  std::optional<reference::ReferenceExecutor> oracle;
  std::optional<CpuBuild> build;
#if KILN_HAVE_CUDA
  std::optional<CudaBuild> cudaBuild;
#endif
  const cpu::Plan* plan = nullptr;
  if (engine) {
    plan = &engine->plan;
    std::printf("engine: %s (route: %s)\n", options.model.c_str(),
                engine->route.empty() ? "(default)" : engine->route.c_str());
    runOnce = [&](std::vector<double>* steps) { return engine->plan.run(inputs, steps); };
  } else if (options.backend == "reference") {
    if (!options.route.empty()) {
      return reportError(
          invalidInput("--route applies to the cpu backend, not the reference "
                       "executor (which takes no knobs)"));
    }
    auto executor = reference::ReferenceExecutor::create(graph);
    if (!executor.isOk()) return reportError(executor.status());
    oracle.emplace(std::move(executor).value());
    runOnce = [&](std::vector<double>*) { return oracle->run(inputs); };
#if KILN_HAVE_CUDA
  } else if (options.backend == "cuda") {
    auto flags = builderConfigFromFlags(options.route, options.dumpIrAfter);
    if (!flags.isOk()) return reportError(flags.status());
    flags->timingCacheFile = options.timingCacheFile;
    const auto buildStart = std::chrono::steady_clock::now();
    auto built = buildCuda(std::move(model->graph), *flags);
    if (!built.isOk()) return reportError(built.status());
    const double lowerMs =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - buildStart)
            .count();
    cudaBuild.emplace(std::move(built).value());
    auto device = cuda::currentDevice();
    if (!device.isOk()) {
      // Only --dump-ir-after gets here without a GPU: the plan's layers and tactics, then stop.
      std::printf("plan (%zu layers):\n", cudaBuild->plan.steps().size());
      for (const auto& step : cudaBuild->plan.steps()) {
        std::printf("  %-40s %-22s %s\n", step->node->name.c_str(), step->node->opType.c_str(),
                    step->tactic.c_str());
      }
      return reportError(device.status());
    }
    std::printf("device: %s\n", device->summary().c_str());
    std::printf("route: %s\n",
                flags->getBuildRoute().empty() ? "(default)" : flags->getBuildRoute().c_str());
    int onHost = 0;
    for (const auto& step : cudaBuild->plan.steps()) onHost += step->tactic == "host.reference";
    if (onHost > 0) {
      std::printf("note: %d of %zu layers have no GPU kernel and run on the host\n", onHost,
                  cudaBuild->plan.steps().size());
    }
    // The plan's device-side build: weights, step preparation (library algorithm choice, the
    // generated kernels' compilation), CUDA graph capture.
    const auto initializeStart = std::chrono::steady_clock::now();
    if (Status initialized = cudaBuild->plan.initialize(); !initialized.isOk()) {
      return reportError(initialized);
    }
    std::printf(
        "build: passes and lowering %.1f ms, device preparation %.1f ms (%d generated kernels, "
        "NVRTC %.1f ms; timed layers: %d from the timing cache, %d timed)\n",
        lowerMs,
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                  initializeStart)
            .count(),
        cudaBuild->plan.generatedKernels(), cudaBuild->plan.codegenMilliseconds(),
        cudaBuild->plan.timingCacheHits(), cudaBuild->plan.timingCacheMisses());
    runOnce = [&](std::vector<double>* steps) { return cudaBuild->plan.run(inputs, steps); };
#endif
  } else {
    auto flags = builderConfigFromFlags(options.route, options.dumpIrAfter);
    if (!flags.isOk()) return reportError(flags.status());
    const BuilderConfig& config = *flags;
    auto built = buildCpu(std::move(model->graph), config);
    if (!built.isOk()) return reportError(built.status());
    build.emplace(std::move(built).value());
    plan = &build->plan;
    std::printf("route: %s\n",
                config.getBuildRoute().empty() ? "(default)" : config.getBuildRoute().c_str());
    runOnce = [&](std::vector<double>* steps) { return build->plan.run(inputs, steps); };
  }

  auto outputs = runOnce(nullptr);
  if (!outputs.isOk()) return reportError(outputs.status());
#if KILN_HAVE_CUDA
  auto timing =
      cudaBuild ? measureCuda(cudaBuild->plan, inputs, options) : measure(runOnce, options, plan);
#else
  auto timing = measure(runOnce, options, plan);
#endif
  if (!timing.isOk()) return reportError(timing);
  std::printf("outputs:\n");
  ir::NamedTensors named;
  for (size_t i = 0; i < outputs->size(); ++i) {
    printSummary(outputNames[i], (*outputs)[i]);
    named.emplace_back(outputNames[i], (*outputs)[i]);
  }
  if (!options.saveOutputs.empty()) {
    const std::filesystem::path path(options.saveOutputs);
    const bool asNpy = path.extension() == ".npy" && named.size() == 1;
    if (!asNpy && path.extension() != ".npz") {
      return reportError(invalidInput(
          "--saveOutputs '{}' must end in .npz (or .npy when the model has one output)",
          options.saveOutputs));
    }
    Status saved = asNpy ? ir::writeNpy(path, named[0].second)
                         : ir::writeNpz(path, named, /*compressed=*/false);
    if (!saved.isOk()) return reportError(saved);
    std::printf("saved outputs to %s\n", options.saveOutputs.c_str());
  }
  return 0;
}

}  // namespace

Command addRunCommand(CLI::App& app) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* sub =
      app.add_subcommand("run", "Run a model on the CPU or GPU, time it, summarise its outputs");
  sub->add_option("model", options->model, "the .onnx file, or an engine file from `kiln build`")
      ->required();
  sub->add_option("--shapes", options->shapes,
                  "fix dynamic input shapes: name:1x3x224x224,name2:...");
  sub->add_option("--loadInputs", options->loadInputs,
                  "input files: name:file.npy, name:file.npz or file.npz (arrays named after "
                  "inputs); inputs not given are seeded random");
  sub->add_option("--saveOutputs", options->saveOutputs, "write the outputs to this .npz file");
  sub->add_option("--saveInputs", options->saveInputs,
                  "write the inputs (seeded or loaded) to this .npz file, before the build");
  sub->add_option("--seed", options->seed, "seed for random inputs")->default_val(0);
  sub->add_option("--route", options->route,
                  "build route: space-separated -knob=value tokens (`kiln knobs` lists them)");
  sub->add_option("--backend", options->backend,
                  "cpu (compiled, default), cuda (compiled for the GPU) or reference (the oracle)")
      ->check(CLI::IsMember({"cpu", "cuda", "reference"}));
  sub->add_option("--dump-ir-after", options->dumpIrAfter,
                  "print the IR after this pass (or 'all')");
  sub->add_option("--warmUp", options->warmUpMs, "warm-up time before timing, ms")
      ->default_val(200)
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--iterations", options->iterations, "minimum number of timed runs")
      ->default_val(10)
      ->check(CLI::PositiveNumber);
  sub->add_option("--duration", options->durationS, "minimum timed duration, seconds")
      ->default_val(3)
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--exportTimes", options->exportTimes, "write every run's latency as JSON");
  sub->add_flag("--dumpProfile", options->dumpProfile, "print per-layer times");
  sub->add_option("--timingCacheFile", options->timingCacheFile,
                  "cuda: read the choices of timed layers (cuda.gemm.algo=timed, "
                  "cuda.conv.algo=timed) from this timing cache and save new ones to it "
                  "(created if missing; one section per GPU and software versions)");
  sub->add_flag("--dataTransfers", options->dataTransfers,
                "cuda: time the host-to-device input and device-to-host output copies too "
                "(excluded by default)");
  return {sub, [options] { return runModel(*options); }};
}

}  // namespace kiln::cli
