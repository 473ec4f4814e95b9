// `kiln explain best.kiln [--against default | other.kiln]`: two CPU engines of one model run
// interleaved on the same inputs, then per layer side by side (time, tactic, layout, precision),
// sorted by where the time went, so that a user sees which decisions made the difference.
// "default" is the model's default route, built now: its model is --model or the one the
// manifest beside the engine names (NAME.manifest.json from `kiln tune --saveEngine`), checked
// against the hash the engine recorded.
//
// `kiln explain --backend cuda --model m.onnx --route R [--against default | ROUTE]`: the CUDA
// backend writes no engine files, so the two sides are routes of the model, both built now and
// timed on the GPU. Without a GPU here the two plans' decisions are shown side by side, untimed.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

#include "kiln/base/file.h"
#include "kiln/base/statistics.h"
#include "kiln/cli/commands.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/inputs.h"
#include "kiln/tune/accuracy.h"
#include "kiln/tune/timing.h"
#if KILN_HAVE_CUDA
#include "kiln/backends/cuda/runtime.h"
#endif

namespace kiln::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct ExplainOptions {
  std::string engine;
  std::string against = "default";
  std::string model;
  std::string backend = "cpu";
  std::string route;   // --backend cuda: side A's route
  std::string shapes;  // --backend cuda: fixes dynamic input shapes
  std::string timingCacheFile;
  uint64_t seed = 0;
  double durationS = 2.0;
  int iterations = 20;
  double warmUpMs = 200;
  bool json = false;
};

// One layer of one side: what was decided for it and its mean time per run.
struct Layer {
  std::string name, op, tactic, layout, precision;
  double ms = 0;
};

// One side of the comparison, as measured.
struct Side {
  std::string label;  // what the user named
  std::string route;
  std::vector<Layer> layers;
  std::vector<double> totals;  // ms per timed sample (interleaved with the other side's)
  std::vector<ir::Tensor> outputs;
};

struct Comparison {
  Side a, b;
  std::vector<std::string> outputNames;
  std::string sampleNote;  // what one timing sample is
  std::string timeNote;    // what a layer's time is
  bool timed = true;       // false: decisions only (CUDA without a GPU here)
  std::string untimedReason;
};

struct Row {
  std::string layer, op;
  const Layer* a = nullptr;
  const Layer* b = nullptr;
  bool differs() const {
    return !a || !b || a->tactic != b->tactic || a->layout != b->layout ||
           a->precision != b->precision;
  }
  double aMs() const { return a ? a->ms : 0; }
  double bMs() const { return b ? b->ms : 0; }
};

std::string decisions(const Layer* layer) {
  if (!layer) return "(no such layer)";
  return fmt::format("{} {} {}", layer->tactic, layer->layout, layer->precision);
}

template <typename Step>
std::vector<Layer> layersOf(const std::vector<std::unique_ptr<Step>>& steps) {
  std::vector<Layer> layers;
  for (const auto& step : steps) {
    layers.push_back(
        {step->node->name, step->node->opType, step->tactic, step->layout, step->precision, 0});
  }
  return layers;
}

Result<std::string> modelFor(const ExplainOptions& options, const LoadedEngine& engine) {
  std::string model = options.model;
  if (model.empty()) {
    const fs::path manifest = fs::path(options.engine).replace_extension(".manifest.json");
    if (!fs::exists(manifest)) {
      return invalidInput(
          "--against default builds the model's default route, so kiln needs the model: give "
          "--model model.onnx (no {} names it)",
          manifest.string());
    }
    KILN_ASSIGN_OR_RETURN(std::string text, readFileBytes(manifest));
    const json parsed = json::parse(text, nullptr, false);
    if (parsed.is_discarded() || !parsed.contains("model") || !parsed["model"].contains("path") ||
        !parsed["model"]["path"].is_string()) {
      return invalidInput("{} has no model.path; give --model model.onnx", manifest.string());
    }
    model = parsed["model"]["path"].get<std::string>();
  }
  KILN_ASSIGN_OR_RETURN(std::string bytes, readFileBytes(model));
  if (modelHashOf(bytes) != engine.modelHash) {
    return invalidInput("{} is not the model {} was built from ({} now, {} in the engine)", model,
                        options.engine, modelHashOf(bytes), engine.modelHash);
  }
  return model;
}

std::vector<ir::Tensor> seededInputs(const ir::Graph& graph, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<ir::Tensor> inputs;
  for (const ir::Value* input : graph.inputs) {
    inputs.push_back(ir::seededRandomTensor(input->dtype, input->shape, rng));
  }
  return inputs;
}

// Two CPU engines (or an engine and the default route built now), run alternately: A, B, A,
// B..., each run's total and its steps' times recorded.
Result<Comparison> measureCpu(const ExplainOptions& options) {
  Comparison c;
  Side& a = c.a;
  Side& b = c.b;
  KILN_ASSIGN_OR_RETURN(LoadedEngine engineA, loadEngine(options.engine));
  std::optional<LoadedEngine> engineB;
  std::optional<CpuBuild> build;
  a.label = options.engine;
  a.route = engineA.route;
  const cpu::Plan* planA = &engineA.plan;
  const cpu::Plan* planB = nullptr;
  if (options.against == "default") {
    KILN_ASSIGN_OR_RETURN(std::string modelPath, modelFor(options, engineA));
    onnx::ImportOptions importOptions;
    importOptions.inputShapes = engineA.inputShapes;
    KILN_ASSIGN_OR_RETURN(onnx::Model imported, onnx::importModel(modelPath, importOptions));
    KILN_ASSIGN_OR_RETURN(CpuBuild built, buildCpu(std::move(imported.graph), BuilderConfig()));
    build.emplace(std::move(built));
    planB = &build->plan;
    b.label = "the default route, built now from " + modelPath;
  } else {
    KILN_ASSIGN_OR_RETURN(LoadedEngine other, loadEngine(options.against));
    if (other.modelHash != engineA.modelHash) {
      return invalidInput(
          "{} and {} were built from different models ({} and {}): explain compares two "
          "engines of one model",
          options.engine, options.against, engineA.modelHash, other.modelHash);
    }
    if (other.inputShapes != engineA.inputShapes) {
      return invalidInput("{} and {} were built for different input shapes", options.engine,
                          options.against);
    }
    engineB.emplace(std::move(other));
    b.route = engineB->route;
    planB = &engineB->plan;
    b.label = options.against;
  }
  a.layers = layersOf(planA->steps());
  b.layers = layersOf(planB->steps());
  for (const ir::Value* output : planA->graph().outputs) c.outputNames.push_back(output->name);

  const std::vector<ir::Tensor> inputs = seededInputs(planA->graph(), options.seed);
  const std::pair<Side*, const cpu::Plan*> sides[] = {{&a, planA}, {&b, planB}};
  for (const auto& [side, plan] : sides) {
    auto outputs = plan->run(inputs);
    if (!outputs.isOk()) return outputs.status().withContext(side->label);
    side->outputs = std::move(outputs).value();
  }
  // Interleaved: A, B, A, B... so that both see the same machine state.
  using Clock = std::chrono::steady_clock;
  const auto warmEnd = Clock::now() + std::chrono::duration<double, std::milli>(options.warmUpMs);
  while (Clock::now() < warmEnd) {
    for (const auto& [side, plan] : sides) KILN_RETURN_IF_ERROR(plan->run(inputs).status());
  }
  const auto start = Clock::now();
  std::vector<double> steps;
  while (static_cast<int>(a.totals.size()) < options.iterations ||
         Clock::now() - start < std::chrono::duration<double>(options.durationS)) {
    for (const auto& [side, plan] : sides) {
      const auto begin = Clock::now();
      KILN_RETURN_IF_ERROR(plan->run(inputs, &steps).status());
      side->totals.push_back(
          std::chrono::duration<double, std::milli>(Clock::now() - begin).count());
      for (size_t i = 0; i < steps.size() && i < side->layers.size(); ++i) {
        side->layers[i].ms += steps[i];
      }
    }
  }
  for (Side* side : {&a, &b}) {
    for (Layer& layer : side->layers) layer.ms /= static_cast<double>(side->totals.size());
  }
  c.sampleNote = fmt::format("{} runs each, interleaved", a.totals.size());
  c.timeNote = "mean per run";
  return c;
}

#if KILN_HAVE_CUDA
// Two routes of one model on the GPU: both plans built from the model, then timed alternately
// in batches of 10 runs (device time between CUDA events, the graph's replay where the plan has
// one), each batch's median one sample; the layers from step-by-step runs, alternately too.
// Without a GPU here, the two plans' decisions side by side, untimed.
Result<Comparison> measureCuda(const ExplainOptions& options) {
  Comparison c;
  KILN_ASSIGN_OR_RETURN(onnx::ImportOptions importOptions, importOptionsFromShapes(options.shapes));
  std::optional<CudaBuild> builds[2];
  Side* sides[2] = {&c.a, &c.b};
  const std::string routes[2] = {options.route,
                                 options.against == "default" ? "" : options.against};
  for (int i = 0; i < 2; ++i) {
    KILN_ASSIGN_OR_RETURN(onnx::Model model, onnx::importModel(options.model, importOptions));
    if (i == 0) {
      for (const ir::Value* output : model.graph.outputs) c.outputNames.push_back(output->name);
    }
    KILN_ASSIGN_OR_RETURN(BuilderConfig config, builderConfigFromFlags(routes[i], ""));
    config.timingCacheFile = options.timingCacheFile;
    auto built = buildCuda(std::move(model.graph), config);
    if (!built.isOk()) return built.status().withContext(i == 0 ? "--route" : "--against");
    sides[i]->route = config.getBuildRoute();
    sides[i]->label = i == 0 ? "--route " + (routes[0].empty() ? "(default)" : routes[0])
                      : options.against == "default" ? "the default route"
                                                     : "--against " + options.against;
    sides[i]->layers = layersOf(built->plan.steps());
    builds[i].emplace(std::move(built).value());
  }
  auto device = cuda::currentDevice();
  if (!device.isOk()) {
    c.timed = false;
    c.untimedReason = device.status().message();
    return c;
  }
  const std::vector<ir::Tensor> inputs = seededInputs(builds[0]->plan.graph(), options.seed);
  for (int i = 0; i < 2; ++i) {
    auto outputs = builds[i]->plan.run(inputs);
    if (!outputs.isOk()) return outputs.status().withContext(sides[i]->label);
    sides[i]->outputs = std::move(outputs).value();
  }
  using Clock = std::chrono::steady_clock;
  const cuda::TimingOptions batch{.warmUpRuns = 0, .runs = 10, .includeCopies = false};
  const auto warmEnd = Clock::now() + std::chrono::duration<double, std::milli>(options.warmUpMs);
  while (Clock::now() < warmEnd) {
    for (int i = 0; i < 2; ++i) KILN_RETURN_IF_ERROR(builds[i]->plan.time(inputs, batch).status());
  }
  const auto start = Clock::now();
  while (static_cast<int>(c.a.totals.size()) < options.iterations ||
         Clock::now() - start < std::chrono::duration<double>(options.durationS)) {
    for (int i = 0; i < 2; ++i) {
      KILN_ASSIGN_OR_RETURN(std::vector<double> runs, builds[i]->plan.time(inputs, batch));
      sides[i]->totals.push_back(summarize(runs).median);
    }
  }
  const int profiled = std::max(options.iterations, 10);
  std::vector<double> steps;
  for (int run = 0; run < profiled; ++run) {
    for (int i = 0; i < 2; ++i) {
      KILN_RETURN_IF_ERROR(builds[i]->plan.run(inputs, &steps).status());
      for (size_t s = 0; s < steps.size() && s < sides[i]->layers.size(); ++s) {
        sides[i]->layers[s].ms += steps[s] / profiled;
      }
    }
  }
  c.sampleNote = fmt::format(
      "{} batches of 10 runs each, interleaved (GPU time between CUDA events; a sample is a "
      "batch's median)",
      c.a.totals.size());
  c.timeNote = fmt::format("mean GPU time over {} step-by-step runs", profiled);
  return c;
}
#endif

int printComparison(const ExplainOptions& options, Comparison& c) {
  Side& a = c.a;
  Side& b = c.b;
  // Layers matched by name (a fusion renames or removes some: those stand alone).
  std::vector<Row> rows;
  std::map<std::string, size_t> byName;
  for (const Layer& layer : a.layers) {
    byName[layer.name] = rows.size();
    rows.push_back({layer.name, layer.op, &layer, nullptr});
  }
  for (const Layer& layer : b.layers) {
    auto it = byName.find(layer.name);
    if (it != byName.end() && !rows[it->second].b) {
      rows[it->second].b = &layer;
    } else {
      rows.push_back({layer.name, layer.op, nullptr, &layer});
    }
  }
  if (c.timed) {
    std::stable_sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) {
      return std::abs(x.aMs() - x.bMs()) > std::abs(y.aMs() - y.bMs());
    });
  }
  size_t differing = 0;
  for (const Row& r : rows) differing += r.differs();

  std::vector<std::pair<std::string, double>> agreement;
  if (c.timed) {
    for (size_t o = 0; o < a.outputs.size() && o < b.outputs.size(); ++o) {
      agreement.emplace_back(
          o < c.outputNames.size() ? c.outputNames[o] : std::to_string(o),
          tune::computeLoss(tune::Metric::kCos, a.outputs[o], b.outputs[o], 0, 0));
    }
  }

  if (options.json) {
    json j = {{"backend", options.backend},
              {"timed", c.timed},
              {"a", {{"label", a.label}, {"route", a.route}}},
              {"b", {{"label", b.label}, {"route", b.route}}},
              {"seed", options.seed},
              {"layers_differing", differing},
              {"layers", json::array()}};
    if (!c.timed) j["untimed_reason"] = c.untimedReason;
    if (c.timed) {
      const TimingSummary ta = summarize(a.totals), tb = summarize(b.totals);
      const tune::PairedComparison paired = tune::comparePaired(a.totals, b.totals);
      j["a"]["median_ms"] = ta.median;
      j["b"]["median_ms"] = tb.median;
      j["speedup_a_over_b"] = {{"median", paired.speedup()},
                               {"low", paired.speedupLow()},
                               {"high", paired.speedupHigh()},
                               {"pairs", paired.pairs}};
      j["runs"] = a.totals.size();
      j["samples"] = c.sampleNote;
      j["outputs_cos_distance"] = json::object();
      for (const auto& [name, loss] : agreement) {
        j["outputs_cos_distance"][name] = std::isfinite(loss) ? json(loss) : json("non-finite");
      }
    }
    for (const Row& r : rows) {
      json row = {{"layer", r.layer}, {"op", r.op}, {"differs", r.differs()}};
      if (c.timed) {
        row["a_ms"] = r.aMs();
        row["b_ms"] = r.bMs();
      }
      if (r.a)
        row["a"] = {
            {"tactic", r.a->tactic}, {"layout", r.a->layout}, {"precision", r.a->precision}};
      if (r.b)
        row["b"] = {
            {"tactic", r.b->tactic}, {"layout", r.b->layout}, {"precision", r.b->precision}};
      j["layers"].push_back(row);
    }
    std::printf("%s\n", j.dump(1).c_str());
    return 0;
  }

  auto routeText = [](const std::string& route) { return route.empty() ? "(default)" : route; };
  std::printf("A: %s (route %s)\n", a.label.c_str(), routeText(a.route).c_str());
  std::printf("B: %s (route %s)\n", b.label.c_str(), routeText(b.route).c_str());
  if (!c.timed) {
    std::printf(
        "not timed: %s\nthe decisions of the two plans, in A's order (%zu of %zu layers "
        "differ, marked *):\n",
        c.untimedReason.c_str(), differing, rows.size());
    std::printf("  %-32s %-16s  %s\n", "layer", "op", "tactic layout precision");
    for (const Row& r : rows) {
      const std::string same = r.a && r.b && !r.differs() ? decisions(r.a) : "";
      std::printf("%s %-32s %-16s  %s\n", r.differs() ? "*" : " ", r.layer.c_str(), r.op.c_str(),
                  same.empty() ? ("A: " + decisions(r.a)).c_str() : same.c_str());
      if (same.empty()) std::printf("  %-32s %-16s  B: %s\n", "", "", decisions(r.b).c_str());
    }
    return 0;
  }
  std::printf("inputs: seeded random (seed %llu), the same for both; %s\n",
              static_cast<unsigned long long>(options.seed), c.sampleNote.c_str());
  for (const auto& [name, loss] : agreement) {
    std::printf("output %s: cosine distance between A and B %.3g\n", name.c_str(), loss);
  }
  const TimingSummary ta = summarize(a.totals), tb = summarize(b.totals);
  std::printf("total: A median %.4f ms [p90 %.4f], B median %.4f ms [p90 %.4f]: ", ta.median,
              ta.p90, tb.median, tb.p90);
  // Sample i of A and sample i of B were back to back: their ratio cancels the machine's drifts.
  const tune::PairedComparison paired = tune::comparePaired(a.totals, b.totals);
  std::printf("A is %.3fx B's speed, 95%% interval [%.3f, %.3f] over %d pairs (%s)\n",
              paired.speedup(), paired.speedupLow(), paired.speedupHigh(), paired.pairs,
              paired.significantlyFaster() ? "A significantly faster"
              : paired.speedupHigh() < 1.0 ? "A significantly slower"
                                           : "no significant difference");
  double sumA = 0, sumB = 0, sumDiffering = 0;
  for (const Row& r : rows) {
    sumA += r.aMs();
    sumB += r.bMs();
    if (r.differs()) sumDiffering += r.bMs() - r.aMs();
  }
  std::printf(
      "layers: %.4f ms in A, %.4f ms in B (%s); the layers whose decisions differ account for "
      "%.4f ms of B - A\n",
      sumA, sumB, c.timeNote.c_str(), sumDiffering);
  std::printf("by where the time went (|A - B| first; * where a decision differs):\n");
  std::printf("  %-32s %-16s %10s %10s %10s  %s\n", "layer", "op", "A ms", "B ms", "A-B ms",
              "tactic layout precision");
  for (const Row& r : rows) {
    const std::string same = r.a && r.b && !r.differs() ? decisions(r.a) : "";
    std::printf("%s %-32s %-16s %10.4f %10.4f %+10.4f  %s\n", r.differs() ? "*" : " ",
                r.layer.c_str(), r.op.c_str(), r.aMs(), r.bMs(), r.aMs() - r.bMs(),
                same.empty() ? ("A: " + decisions(r.a)).c_str() : same.c_str());
    if (same.empty()) {
      std::printf("  %-32s %-16s %10s %10s %10s  B: %s\n", "", "", "", "", "",
                  decisions(r.b).c_str());
    }
  }
  return 0;
}

int runExplain(const ExplainOptions& options) {
  if (options.backend == "cuda") {
    if (!options.engine.empty()) {
      return reportError(invalidInput(
          "--backend cuda compares two routes of a model (--model and --route), not engine "
          "files: the CUDA backend writes none ('{}')",
          options.engine));
    }
    if (options.model.empty()) {
      return reportError(invalidInput("--backend cuda needs --model model.onnx"));
    }
#if KILN_HAVE_CUDA
    auto measured = measureCuda(options);
    if (!measured.isOk()) return reportError(measured.status());
    return printComparison(options, *measured);
#else
    return reportError(unsupported(
        "--backend cuda: this kiln was built without the CUDA backend (KILN_CUDA=OFF, or no "
        "CUDA toolkit was found when it was configured)"));
#endif
  }
  if (options.engine.empty()) {
    return reportError(invalidInput("give the engine to explain (kiln explain best.kiln)"));
  }
  if (!options.route.empty() || !options.shapes.empty() || !options.timingCacheFile.empty()) {
    return reportError(invalidInput(
        "--route, --shapes and --timingCacheFile apply to --backend cuda (a CPU engine fixed "
        "its route and shapes when it was built)"));
  }
  auto measured = measureCpu(options);
  if (!measured.isOk()) return reportError(measured.status());
  return printComparison(options, *measured);
}

}  // namespace

Command addExplainCommand(CLI::App& app) {
  auto options = std::make_shared<ExplainOptions>();
  CLI::App* sub = app.add_subcommand(
      "explain",
      "Run two engines of one model (or, on the GPU, two routes) interleaved and show their "
      "layers side by side (time, tactic, layout, precision), sorted by where the time went");
  sub->add_option("engine", options->engine,
                  "an engine file (kiln build or kiln tune); none with --backend cuda");
  sub->add_option("--against", options->against,
                  "\"default\" (the model's default route, built now) or another engine file; "
                  "with --backend cuda, \"default\" or another route")
      ->default_val("default");
  sub->add_option("--model", options->model,
                  "the .onnx file, for --against default (default: the model named by the "
                  "manifest beside the engine); required with --backend cuda");
  sub->add_option("--backend", options->backend,
                  "cpu (engine files) or cuda (two routes of --model, built now)")
      ->default_val("cpu")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  sub->add_option("--route", options->route, "--backend cuda: the route to explain (side A)");
  sub->add_option("--shapes", options->shapes,
                  "--backend cuda: fix dynamic input shapes: name:1x3x224x224,name2:...");
  sub->add_option("--timingCacheFile", options->timingCacheFile,
                  "--backend cuda: the timing cache both builds read and extend");
  sub->add_option("--seed", options->seed, "seed for the random inputs")->default_val(0);
  sub->add_option("--warmUp", options->warmUpMs, "warm-up of both, ms")
      ->default_val(200)
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--iterations", options->iterations, "minimum runs of each")
      ->default_val(20)
      ->check(CLI::PositiveNumber);
  sub->add_option("--duration", options->durationS, "minimum timed seconds")
      ->default_val(2.0)
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--json", options->json, "print the comparison as JSON");
  return {sub, [options] { return runExplain(*options); }};
}

}  // namespace kiln::cli
