#include "kiln/tune/verify.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "kiln/base/file.h"
#include "kiln/engine/builder.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/inputs.h"
#include "kiln/ir/npy.h"
#include "kiln/onnx/import.h"
#include "kiln/reference/executor.h"
#include "kiln/tune/accuracy.h"
#include "kiln/tune/timing.h"
#include "kiln/tune/trial.h"
#include "kiln/tune/tuner.h"

namespace kiln::tune {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// One line of the verdict's evidence. `state`: ok, changed (differs from the tuning run: the
// measurement decides), regressed (the engine no longer holds), missing (cannot be checked).
struct Check {
  std::string what, state, detail;
};

struct Verification {
  std::vector<Check> checks;
  bool cannotCheck = false;  // a file is missing: no verdict about the engine
  std::vector<std::string> regressions;
  void add(std::string what, std::string state, std::string detail) {
    if (state == "missing") cannotCheck = true;
    if (state == "regressed") regressions.push_back(what + ": " + detail);
    checks.push_back({std::move(what), std::move(state), std::move(detail)});
  }
};

const json& field(const json& j, const char* key, const fs::path& manifest) {
  if (!j.is_object() || !j.contains(key)) {
    throw std::runtime_error(fmt::format("{} has no '{}'", manifest.string(), key));
  }
  return j.at(key);
}

// Keys whose values differ between then and now, as "key: then → now".
std::vector<std::string> differences(const json& then, const json& now) {
  std::vector<std::string> out;
  if (!then.is_object()) return {"(not recorded)"};
  for (const auto& [key, value] : now.items()) {
    if (!then.contains(key)) {
      out.push_back(fmt::format("{}: not recorded then, {} now", key, value.dump()));
    } else if (then.at(key) != value) {
      out.push_back(fmt::format("{}: {} then, {} now", key, then.at(key).dump(), value.dump()));
    }
  }
  return out;
}

AccuracySettings accuracyFrom(const json& a, const fs::path& manifest) {
  AccuracySettings settings;
  auto metric = parseMetric(field(a, "metric", manifest).get<std::string>());
  if (!metric.isOk()) throw std::runtime_error(metric.status().message());
  settings.metric = *metric;
  settings.threshold = field(a, "threshold", manifest).get<double>();
  settings.perOutput = a.value("per_output", std::map<std::string, double>{});
  settings.atol = a.value("atol", 1e-5);
  settings.rtol = a.value("rtol", 1e-5);
  return settings;
}

// Runs both interleaved, the order alternating pair by pair.
struct Timed {
  const cpu::Plan& plan;
  const knobs::Route& route;
};

Result<PairedComparison> measurePaired(const Timed& candidate, const Timed& baseline,
                                       const std::vector<ir::Tensor>& inputs,
                                       const VerifyOptions& options) {
  const auto warmEnd = Clock::now() + std::chrono::duration<double, std::milli>(options.warmUpMs);
  while (Clock::now() < warmEnd) {
    KILN_RETURN_IF_ERROR(runAsTimed(candidate.plan, candidate.route, inputs));
    KILN_RETURN_IF_ERROR(runAsTimed(baseline.plan, baseline.route, inputs));
  }
  std::vector<double> a, b;
  auto timeOne = [&](const Timed& engine, std::vector<double>& into) -> Status {
    const auto begin = Clock::now();
    KILN_RETURN_IF_ERROR(runAsTimed(engine.plan, engine.route, inputs));
    into.push_back(std::chrono::duration<double, std::milli>(Clock::now() - begin).count());
    return Status::ok();
  };
  const auto start = Clock::now();
  while (static_cast<int>(a.size()) < options.minPairs ||
         Clock::now() - start < std::chrono::duration<double>(options.durationS)) {
    if (a.size() % 2 == 0) {
      KILN_RETURN_IF_ERROR(timeOne(candidate, a));
      KILN_RETURN_IF_ERROR(timeOne(baseline, b));
    } else {
      KILN_RETURN_IF_ERROR(timeOne(baseline, b));
      KILN_RETURN_IF_ERROR(timeOne(candidate, a));
    }
  }
  return comparePaired(a, b);
}

}  // namespace

Result<int> runVerify(const VerifyOptions& options) {
  const fs::path& manifestPath = options.manifest;
  KILN_ASSIGN_OR_RETURN(std::string text, readFileBytes(manifestPath));
  const json manifest = json::parse(text, nullptr, false);
  if (manifest.is_discarded() || !manifest.is_object()) {
    return invalidInput(
        "{} is not JSON (a kiln tuning manifest is written by kiln tune "
        "--saveEngine)",
        manifestPath.string());
  }
  if (manifest.value("format", std::string()) != "kiln tuning manifest 1") {
    return invalidInput("{} is not a kiln tuning manifest (format '{}')", manifestPath.string(),
                        manifest.value("format", std::string("none")));
  }
  Verification v;
  std::string route, defaultRoute, commandLine, modelPath, modelHash, enginePath, engineHash;
  AccuracySettings accuracy;
  json decision, data, versionsThen, targetThen, lossThen;
  try {
    route = field(manifest, "route", manifestPath).get<std::string>();
    defaultRoute = field(manifest, "default_route", manifestPath).get<std::string>();
    commandLine = manifest.value("command_line", std::string());
    const json& model = field(manifest, "model", manifestPath);
    modelPath = options.model.empty() ? field(model, "path", manifestPath).get<std::string>()
                                      : options.model;
    modelHash = field(model, "hash", manifestPath).get<std::string>();
    const json& engine = field(manifest, "engine", manifestPath);
    enginePath = field(engine, "file", manifestPath).get<std::string>();
    engineHash = field(engine, "hash", manifestPath).get<std::string>();
    accuracy = accuracyFrom(field(manifest, "accuracy", manifestPath), manifestPath);
    decision = field(manifest, "decision", manifestPath);
    data = field(manifest, "data", manifestPath);
    versionsThen = manifest.value("versions", json());
    targetThen = manifest.value("target", json());
    lossThen = manifest.value("accuracy_loss", json::array());
  } catch (const std::exception& e) {
    return invalidInput("{}", e.what());
  }
  if (!data.is_array()) return invalidInput("{}: 'data' is not a list", manifestPath.string());
  // An engine moved beside its manifest since (NAME.manifest.json and NAME.kiln).
  if (!fs::exists(enginePath)) {
    std::string name = manifestPath.filename().string();
    if (name.ends_with(".manifest.json")) {
      const fs::path beside =
          manifestPath.parent_path() / (name.substr(0, name.size() - 14) + ".kiln");
      if (fs::exists(beside)) enginePath = beside.string();
    }
  }
  const bool defaultWon = decision.value("default_won", false);

  // ---- the files ----
  std::optional<std::string> modelBytes;
  if (auto bytes = readFileBytes(modelPath); !bytes.isOk()) {
    v.add("model", "missing",
          fmt::format("{} cannot be read: {}", modelPath, bytes.status().message()));
  } else if (modelHashOf(*bytes) != modelHash) {
    v.add("model", "regressed",
          fmt::format("{} changed since the tuning run ({} now, {} then): the engine was tuned "
                      "for another model",
                      modelPath, modelHashOf(*bytes), modelHash));
  } else {
    v.add("model", "ok", fmt::format("{} ({})", modelPath, modelHash));
    modelBytes = std::move(*bytes);
  }
  std::optional<LoadedEngine> engine;
  if (auto hash = fileHash(enginePath); !hash.isOk()) {
    v.add("engine", "missing", fmt::format("{} cannot be read", enginePath));
  } else if (*hash != engineHash) {
    v.add("engine", "regressed",
          fmt::format("{} is not the engine the tuner saved ({} now, {} then)", enginePath, *hash,
                      engineHash));
  } else if (auto loaded = loadEngine(enginePath); !loaded.isOk()) {
    v.add("engine", "regressed",
          fmt::format("{} does not load here: {}", enginePath, loaded.status().message()));
  } else {
    v.add("engine", "ok",
          fmt::format("{} ({}), route {}", enginePath, engineHash,
                      route.empty() ? "(default)" : route));
    engine.emplace(std::move(loaded).value());
  }

  // ---- the machine and the software ----
  KILN_ASSIGN_OR_RETURN(const json targetNow, targetFingerprint("cpu"));
  const auto targetChanges = differences(targetThen, targetNow);
  v.add("target", targetChanges.empty() ? "ok" : "changed",
        targetChanges.empty() ? "the machine is as tuned"
                              : fmt::format("{}", fmt::join(targetChanges, "; ")));
  const auto versionChanges = differences(versionsThen, versionsJson());
  v.add("versions", versionChanges.empty() ? "ok" : "changed",
        versionChanges.empty() ? "kiln and its libraries are as tuned"
                               : fmt::format("{}", fmt::join(versionChanges, "; ")));

  // ---- the data ----
  std::vector<std::vector<ir::Tensor>> inputSets, referenceSets;
  std::vector<std::string> outputNames;
  std::optional<onnx::Model> model;
  if (engine && modelBytes) {
    onnx::ImportOptions importOptions;
    importOptions.inputShapes = engine->inputShapes;
    auto imported = onnx::importModel(modelPath, importOptions);
    if (!imported.isOk()) return imported.status().withContext(modelPath);
    model.emplace(std::move(imported).value());
    for (const ir::Value* output : engine->plan.graph().outputs) {
      outputNames.push_back(output->name);
    }
    std::optional<reference::ReferenceExecutor> oracle;
    for (size_t set = 0; set < data.size(); ++set) {
      const json& entry = data[set];
      const std::string what = fmt::format("data set {}", set);
      std::vector<std::string> notes;
      bool usable = true;
      // Inputs: the user's files (unchanged), the run's copy, or the seed again.
      std::map<std::string, ir::Tensor> given;
      if (entry.contains("inputs_given")) {
        const std::string spec = entry["inputs_given"].get<std::string>();
        if (hashOfSpec(spec) != entry.value("inputs_given_hash", std::string())) {
          bool missing = false;
          for (const auto& f : ir::filesOfSpec(spec)) missing = missing || !fs::exists(f);
          v.add(what, missing ? "missing" : "regressed",
                fmt::format("the inputs '{}' {} since the tuning run", spec,
                            missing ? "are missing" : "changed"));
          usable = false;
        } else {
          KILN_ASSIGN_OR_RETURN(given, ir::loadNamedTensors({spec}, "--loadInputs"));
          notes.push_back(fmt::format("inputs {}", spec));
        }
      } else {
        notes.push_back(fmt::format("inputs seeded ({})", entry.value("inputs_seed", 0)));
      }
      std::vector<ir::Tensor> inputs;
      if (usable) {
        std::mt19937_64 rng(entry.value("inputs_seed", uint64_t{0}));
        for (const ir::Value* input : engine->plan.graph().inputs) {
          auto it = given.find(input->name);
          inputs.push_back(it != given.end()
                               ? it->second
                               : ir::seededRandomTensor(input->dtype, input->shape, rng));
        }
      }
      // References: the user's files (unchanged), or generated again by the reference executor.
      std::vector<ir::Tensor> references;
      if (usable && entry.contains("references_given")) {
        const std::string spec = entry["references_given"].get<std::string>();
        if (hashOfSpec(spec) != entry.value("references_given_hash", std::string())) {
          bool missing = false;
          for (const auto& f : ir::filesOfSpec(spec)) missing = missing || !fs::exists(f);
          v.add(what, missing ? "missing" : "regressed",
                fmt::format("the references '{}' {} since the tuning run", spec,
                            missing ? "are missing" : "changed"));
          usable = false;
        } else {
          KILN_ASSIGN_OR_RETURN(auto named, ir::loadNamedTensors({spec}, "--loadRefOutputs"));
          for (const std::string& name : outputNames) {
            auto it = named.find(name);
            if (it == named.end()) {
              return invalidInput("{} has no reference for output '{}'", spec, name);
            }
            references.push_back(it->second);
          }
          notes.push_back(fmt::format("references {}", spec));
        }
      } else if (usable) {
        if (!oracle) {
          KILN_ASSIGN_OR_RETURN(auto executor, reference::ReferenceExecutor::create(model->graph));
          oracle.emplace(std::move(executor));
        }
        KILN_ASSIGN_OR_RETURN(references, oracle->run(inputs));
        notes.push_back("references generated again by the reference executor");
      }
      if (usable) {
        v.add(what, "ok", fmt::format("{}", fmt::join(notes, ", ")));
        inputSets.push_back(std::move(inputs));
        referenceSets.push_back(std::move(references));
      }
    }
  }

  // The engine's route, for the runs (a test build's injected faults follow the route).
  BuilderConfig engineConfig;
  if (engine) KILN_RETURN_IF_ERROR(engineConfig.setBuildRoute(engine->route));

  // ---- accuracy ----
  json accuracyNow = json::array();
  if (engine && !inputSets.empty() && inputSets.size() == data.size()) {
    std::vector<OutputAccuracy> worst;
    for (size_t set = 0; set < inputSets.size(); ++set) {
      KILN_ASSIGN_OR_RETURN(auto outputs,
                            runForOutputs(engine->plan, engineConfig.route(), inputSets[set]));
      KILN_ASSIGN_OR_RETURN(auto compared,
                            compareOutputs(accuracy, outputNames, outputs, referenceSets[set]));
      if (set == 0) {
        worst = std::move(compared);
      } else {
        mergeWorst(worst, compared);
      }
    }
    for (const auto& a : worst) {
      std::string then;
      for (const auto& t : lossThen) {
        if (t.value("output", std::string()) == a.output && t.contains("loss")) {
          then = fmt::format(" ({} when tuned)",
                             t["loss"].is_number() ? fmt::format("{:.3g}", t["loss"].get<double>())
                                                   : t["loss"].dump());
        }
      }
      const std::string detail = fmt::format(
          "{} {} {:.3g} {} {:.3g}{}{}", a.output, metricName(accuracy.metric), a.loss,
          a.pass ? "<=" : "exceeds", a.threshold, then, a.note.empty() ? "" : "; " + a.note);
      v.add("accuracy", a.pass ? "ok" : "regressed", detail);
      accuracyNow.push_back({{"output", a.output},
                             {"loss", std::isfinite(a.loss) ? json(a.loss) : json("non-finite")},
                             {"threshold", a.threshold},
                             {"pass", a.pass}});
    }
  }

  // ---- speed against a fresh build of the default route ----
  json speed;
  if (engine && model && !inputSets.empty()) {
    BuilderConfig config;
    KILN_RETURN_IF_ERROR(config.setBuildRoute(defaultRoute).withContext("the default route"));
    onnx::ImportOptions importOptions;
    importOptions.inputShapes = engine->inputShapes;
    KILN_ASSIGN_OR_RETURN(onnx::Model fresh, onnx::importModel(modelPath, importOptions));
    KILN_ASSIGN_OR_RETURN(CpuBuild baseline, buildCpu(std::move(fresh.graph), config));
    KILN_ASSIGN_OR_RETURN(PairedComparison c, measurePaired({engine->plan, engineConfig.route()},
                                                            {baseline.plan, config.route()},
                                                            inputSets.front(), options));
    std::string then;
    if (decision.contains("speedup")) {
      then = fmt::format("; {:.3f}x when tuned", decision["speedup"].value("median", 0.0));
    }
    speed = {{"speedup", c.speedup()},
             {"low", c.speedupLow()},
             {"high", c.speedupHigh()},
             {"pairs", c.pairs},
             {"significant", c.significantlyFaster()}};
    const std::string measured = fmt::format(
        "{:.3f}x [{:.3f}, {:.3f}] the speed of a fresh build of the default route "
        "({} interleaved pairs){}",
        c.speedup(), c.speedupLow(), c.speedupHigh(), c.pairs, then);
    if (defaultWon) {
      // The tuner kept the default route: the engine should be as fast as a fresh build.
      // Its time over the fresh build's, certainly above 1 + tolerance.
      const bool slower = c.reachesConfidence() && c.ratioLow > 1.0 + options.tolerance;
      v.add("speed", slower ? "regressed" : "ok",
            measured + (slower ? fmt::format(": the saved engine (the default route) is now "
                                             "more than {:g}% slower than a fresh build of it",
                                             100 * options.tolerance)
                               : ": the saved engine is the default route, as fast as a fresh "
                                 "build of it"));
    } else {
      v.add("speed", c.significantlyFaster() ? "ok" : "regressed",
            measured + (c.significantlyFaster() ? "" : ": no longer significantly faster"));
    }
  }

  // ---- the verdict ----
  std::string verdict;
  int exitCode = 0;
  if (!v.regressions.empty()) {
    exitCode = kVerifyExitRegressed;
    verdict =
        fmt::format("RE-TUNE: the tuned engine no longer holds on this machine ({}){}",
                    fmt::join(v.regressions, "; "),
                    commandLine.empty() ? "" : ". Re-tune with a new --cache: " + commandLine);
  } else if (v.cannotCheck) {
    exitCode = 1;
    verdict =
        "CANNOT VERIFY: files the manifest names are missing (above); nothing was concluded "
        "about the engine";
  } else {
    verdict = defaultWon
                  ? "OK: the tuner kept the default route, and the saved engine still passes and "
                    "is as fast as a fresh build of it"
                  : "OK: the tuned engine still wins (significantly faster than a fresh build of "
                    "the default route) and still passes the accuracy threshold on this machine";
    bool changed = false;
    for (const auto& c : v.checks) changed = changed || c.state == "changed";
    if (changed) verdict += ", although the machine or the software changed (above)";
  }

  if (options.json) {
    json out = {{"manifest", manifestPath.string()},
                {"checks", json::array()},
                {"accuracy", accuracyNow},
                {"speed", speed},
                {"verdict", verdict},
                {"exit_code", exitCode}};
    for (const auto& c : v.checks) {
      out["checks"].push_back({{"what", c.what}, {"state", c.state}, {"detail", c.detail}});
    }
    std::printf("%s\n", out.dump(1).c_str());
  } else {
    std::printf("kiln verify: %s\n", manifestPath.string().c_str());
    for (const auto& c : v.checks) {
      std::printf("  %-9s %-12s %s\n", c.state.c_str(), c.what.c_str(), c.detail.c_str());
    }
    std::printf("%s\n", verdict.c_str());
  }
  return exitCode;
}

}  // namespace kiln::tune
