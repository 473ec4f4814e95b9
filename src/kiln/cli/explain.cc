// `kiln explain best.kiln [--against default | other.kiln]`: two CPU engines of one model run
// interleaved on the same inputs, then per layer side by side (time, tactic, layout, precision),
// sorted by where the time went, so that a user sees which decisions made the difference.
// "default" is the model's default route, built now: its model is --model or the one the
// manifest beside the engine names (NAME.manifest.json from `kiln tune --saveEngine`), checked
// against the hash the engine recorded.
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

namespace kiln::cli {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct ExplainOptions {
  std::string engine;
  std::string against = "default";
  std::string model;
  uint64_t seed = 0;
  double durationS = 2.0;
  int iterations = 20;
  double warmUpMs = 200;
  bool json = false;
};

// One side of the comparison: an engine loaded from a file, or the default route built now.
struct Side {
  std::string label;  // what the user named
  std::string route;
  std::optional<LoadedEngine> engine;
  std::optional<CpuBuild> build;
  const cpu::Plan* plan = nullptr;
  std::vector<double> totals;     // ms per run
  std::vector<double> stepTotal;  // ms summed over runs, per step
  std::vector<ir::Tensor> outputs;
};

struct Row {
  std::string layer, op;
  const cpu::Step* a = nullptr;
  const cpu::Step* b = nullptr;
  double aMs = 0, bMs = 0;
  bool differs() const {
    return !a || !b || a->tactic != b->tactic || a->layout != b->layout ||
           a->precision != b->precision;
  }
};

std::string decisions(const cpu::Step* step) {
  if (!step) return "(no such layer)";
  return fmt::format("{} {} {}", step->tactic, step->layout, step->precision);
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

int runExplain(const ExplainOptions& options) {
  auto loaded = loadEngine(options.engine);
  if (!loaded.isOk()) return reportError(loaded.status());
  Side a, b;
  a.label = options.engine;
  a.engine.emplace(std::move(loaded).value());
  a.route = a.engine->route;
  a.plan = &a.engine->plan;
  std::string modelPath;
  if (options.against == "default") {
    auto model = modelFor(options, *a.engine);
    if (!model.isOk()) return reportError(model.status());
    modelPath = *model;
    onnx::ImportOptions importOptions;
    importOptions.inputShapes = a.engine->inputShapes;
    auto imported = onnx::importModel(modelPath, importOptions);
    if (!imported.isOk()) return reportError(imported.status());
    auto built = buildCpu(std::move(imported->graph), BuilderConfig());
    if (!built.isOk()) return reportError(built.status());
    b.build.emplace(std::move(built).value());
    b.plan = &b.build->plan;
    b.label = "the default route, built now from " + modelPath;
  } else {
    auto other = loadEngine(options.against);
    if (!other.isOk()) return reportError(other.status());
    if (other->modelHash != a.engine->modelHash) {
      return reportError(invalidInput(
          "{} and {} were built from different models ({} and {}): explain compares two "
          "engines of one model",
          options.engine, options.against, a.engine->modelHash, other->modelHash));
    }
    if (other->inputShapes != a.engine->inputShapes) {
      return reportError(invalidInput("{} and {} were built for different input shapes",
                                      options.engine, options.against));
    }
    b.engine.emplace(std::move(other).value());
    b.route = b.engine->route;
    b.plan = &b.engine->plan;
    b.label = options.against;
  }

  // The same seeded inputs for both.
  std::mt19937_64 rng(options.seed);
  std::vector<ir::Tensor> inputs;
  for (const ir::Value* input : a.plan->graph().inputs) {
    inputs.push_back(ir::seededRandomTensor(input->dtype, input->shape, rng));
  }
  for (Side* side : {&a, &b}) {
    side->stepTotal.assign(side->plan->steps().size(), 0.0);
    auto outputs = side->plan->run(inputs);
    if (!outputs.isOk()) return reportError(outputs.status().withContext(side->label));
    side->outputs = std::move(outputs).value();
  }
  if (a.outputs.size() != b.outputs.size()) {
    return reportError(invalidInput("the two engines have different outputs"));
  }

  // Interleaved: A, B, A, B... so that both see the same machine state.
  using Clock = std::chrono::steady_clock;
  const auto warmEnd = Clock::now() + std::chrono::duration<double, std::milli>(options.warmUpMs);
  while (Clock::now() < warmEnd) {
    for (Side* side : {&a, &b}) {
      if (auto r = side->plan->run(inputs); !r.isOk()) return reportError(r.status());
    }
  }
  const auto start = Clock::now();
  std::vector<double> steps;
  while (static_cast<int>(a.totals.size()) < options.iterations ||
         Clock::now() - start < std::chrono::duration<double>(options.durationS)) {
    for (Side* side : {&a, &b}) {
      const auto begin = Clock::now();
      if (auto r = side->plan->run(inputs, &steps); !r.isOk()) return reportError(r.status());
      side->totals.push_back(
          std::chrono::duration<double, std::milli>(Clock::now() - begin).count());
      for (size_t i = 0; i < steps.size() && i < side->stepTotal.size(); ++i) {
        side->stepTotal[i] += steps[i];
      }
    }
  }
  const double runs = static_cast<double>(a.totals.size());

  // Layers matched by name (a fusion renames or removes some: those stand alone).
  std::vector<Row> rows;
  std::map<std::string, size_t> byName;
  for (size_t i = 0; i < a.plan->steps().size(); ++i) {
    const cpu::Step& step = *a.plan->steps()[i];
    byName[step.node->name] = rows.size();
    rows.push_back({step.node->name, step.node->opType, &step, nullptr, a.stepTotal[i] / runs, 0});
  }
  for (size_t i = 0; i < b.plan->steps().size(); ++i) {
    const cpu::Step& step = *b.plan->steps()[i];
    auto it = byName.find(step.node->name);
    if (it != byName.end() && !rows[it->second].b) {
      rows[it->second].b = &step;
      rows[it->second].bMs = b.stepTotal[i] / runs;
    } else {
      rows.push_back(
          {step.node->name, step.node->opType, nullptr, &step, 0, b.stepTotal[i] / runs});
    }
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& x, const Row& y) {
    return std::abs(x.aMs - x.bMs) > std::abs(y.aMs - y.bMs);
  });

  const TimingSummary ta = summarize(a.totals), tb = summarize(b.totals);
  std::vector<std::pair<std::string, double>> agreement;
  for (size_t o = 0; o < a.outputs.size(); ++o) {
    agreement.emplace_back(a.plan->graph().outputs[o]->name,
                           tune::computeLoss(tune::Metric::kCos, a.outputs[o], b.outputs[o], 0, 0));
  }

  if (options.json) {
    const tune::PairedComparison paired = tune::comparePaired(a.totals, b.totals);
    json j = {{"a", {{"label", a.label}, {"route", a.route}, {"median_ms", ta.median}}},
              {"speedup_a_over_b",
               {{"median", paired.speedup()},
                {"low", paired.speedupLow()},
                {"high", paired.speedupHigh()},
                {"pairs", paired.pairs}}},
              {"b", {{"label", b.label}, {"route", b.route}, {"median_ms", tb.median}}},
              {"runs", a.totals.size()},
              {"seed", options.seed},
              {"outputs_cos_distance", json::object()},
              {"layers", json::array()}};
    for (const auto& [name, loss] : agreement) {
      j["outputs_cos_distance"][name] = std::isfinite(loss) ? json(loss) : json("non-finite");
    }
    for (const Row& r : rows) {
      json row = {{"layer", r.layer},
                  {"op", r.op},
                  {"a_ms", r.aMs},
                  {"b_ms", r.bMs},
                  {"differs", r.differs()}};
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
  std::printf("inputs: seeded random (seed %llu), the same for both; %zu runs each, interleaved\n",
              static_cast<unsigned long long>(options.seed), a.totals.size());
  for (const auto& [name, loss] : agreement) {
    std::printf("output %s: cosine distance between A and B %.3g\n", name.c_str(), loss);
  }
  std::printf("total: A median %.4f ms [p90 %.4f], B median %.4f ms [p90 %.4f]: ", ta.median,
              ta.p90, tb.median, tb.p90);
  // Run i of A and run i of B were back to back: their ratio cancels the machine's drifts.
  const tune::PairedComparison paired = tune::comparePaired(a.totals, b.totals);
  std::printf("A is %.3fx B's speed, 95%% interval [%.3f, %.3f] over %d pairs (%s)\n",
              paired.speedup(), paired.speedupLow(), paired.speedupHigh(), paired.pairs,
              paired.significantlyFaster() ? "A significantly faster"
              : paired.speedupHigh() < 1.0 ? "A significantly slower"
                                           : "no significant difference");
  double sumA = 0, sumB = 0, sumDiffering = 0;
  for (const Row& r : rows) {
    sumA += r.aMs;
    sumB += r.bMs;
    if (r.differs()) sumDiffering += r.bMs - r.aMs;
  }
  std::printf(
      "layers: %.4f ms in A, %.4f ms in B (mean per run); the layers whose decisions differ "
      "account for %.4f ms of B - A\n",
      sumA, sumB, sumDiffering);
  std::printf("by where the time went (|A - B| first; * where a decision differs):\n");
  std::printf("  %-32s %-16s %10s %10s %10s  %s\n", "layer", "op", "A ms", "B ms", "A-B ms",
              "tactic layout precision");
  for (const Row& r : rows) {
    const std::string same = r.a && r.b && !r.differs() ? decisions(r.a) : "";
    std::printf("%s %-32s %-16s %10.4f %10.4f %+10.4f  %s\n", r.differs() ? "*" : " ",
                r.layer.c_str(), r.op.c_str(), r.aMs, r.bMs, r.aMs - r.bMs,
                same.empty() ? ("A: " + decisions(r.a)).c_str() : same.c_str());
    if (same.empty()) {
      std::printf("  %-32s %-16s %10s %10s %10s  B: %s\n", "", "", "", "", "",
                  decisions(r.b).c_str());
    }
  }
  return 0;
}

}  // namespace

Command addExplainCommand(CLI::App& app) {
  auto options = std::make_shared<ExplainOptions>();
  CLI::App* sub = app.add_subcommand(
      "explain",
      "Run two CPU engines of one model interleaved and show their layers side by side "
      "(time, tactic, layout, precision), sorted by where the time went");
  sub->add_option("engine", options->engine, "an engine file (kiln build or kiln tune)")
      ->required();
  sub->add_option("--against", options->against,
                  "\"default\" (the model's default route, built now) or another engine file")
      ->default_val("default");
  sub->add_option("--model", options->model,
                  "the .onnx file, for --against default (default: the model named by the "
                  "manifest beside the engine)");
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
