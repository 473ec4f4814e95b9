// The tuning run: study set-up (or its continuation), the trial loop over each phase, the
// finalist round and the decision, and what the run leaves behind (engine, manifest, report).
#include "kiln/tune/tuner.h"

#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "kiln/base/file.h"
#include "kiln/base/version.h"
#include "kiln/engine/engine_file.h"
#include "kiln/engine/timing_cache.h"
#if KILN_HAVE_CUDA
#include "kiln/backends/cuda/runtime.h"
#endif
#include "kiln/ir/inputs.h"
#include "kiln/ir/npy.h"
#include "kiln/onnx/import.h"
#include "kiln/reference/executor.h"
#include "kiln/tune/pg_store.h"
#include "kiln/tune/progress.h"
#include "kiln/tune/report.h"
#include "kiln/tune/store.h"
#include "kiln/tune/study.h"
#include "kiln/tune/study_status.h"
#include "kiln/tune/worker.h"

// OpenBLAS's build description (version, threading, target), for the manifest.
extern "C" char* openblas_get_config(void);

namespace kiln::tune {

using namespace detail;  // NOLINT: this file implements study.h
namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

const char* searchModeName(SearchMode mode) {
  switch (mode) {
    case SearchMode::kFast:
      return "fast";
    case SearchMode::kMixed:
      return "mixed";
    case SearchMode::kFull:
      return "full";
  }
  return "?";
}

Result<SearchMode> parseSearchMode(const std::string& text) {
  for (SearchMode mode : {SearchMode::kFast, SearchMode::kMixed, SearchMode::kFull}) {
    if (text == searchModeName(mode)) return mode;
  }
  return invalidInput("unknown search mode '{}' (allowed: fast, mixed, full)", text);
}

namespace detail {

json timingSettingsJson(const TimingSettings& t) {
  return {{"warmup_ms", t.warmUpMs},
          {"min_iterations", t.minIterations},
          {"min_seconds", t.minSeconds}};
}

TimingSettings timingSettingsFrom(const json& j) {
  return {.warmUpMs = j.at("warmup_ms").get<double>(),
          .minIterations = j.at("min_iterations").get<int>(),
          .minSeconds = j.at("min_seconds").get<double>()};
}

json accuracyJson(const AccuracySettings& a) {
  return {{"metric", metricName(a.metric)},
          {"atol", a.atol},
          {"rtol", a.rtol},
          {"threshold", a.threshold},
          {"per_output", a.perOutput}};
}

}  // namespace detail

json TuneOptions::studyJson() const {
  return {
      {"model", fs::absolute(model).string()},
      {"backend", backend},
      {"shapes", shapes},
      {"expression", expression},
      {"search", searchModeName(search)},
      {"load_inputs", loadInputs},
      {"load_ref_outputs", loadRefOutputs},
      {"seed", seed},
      {"accuracy", accuracyJson(accuracy)},
      {"timing", timingSettingsJson(timing)},
      {"finalists", finalists},
      {"mixed_min_gain", mixedMinGain},
      {"mixed_max_routes", mixedMaxRoutes},
      {"final_timing", timingSettingsJson(finalTiming)},
      {"save_engine", saveEngine.empty() ? "" : fs::absolute(saveEngine).string()},
      {"report", report.empty() ? "" : fs::absolute(report).string()},
      {"save_all_engines", saveAllEngines.empty() ? "" : fs::absolute(saveAllEngines).string()},
      {"timing_cache_file", timingCacheFile.empty() ? "" : fs::absolute(timingCacheFile).string()}};
}

Status TuneOptions::restoreStudy(const json& study) {
  try {
    // A model given again on the command line (moved since) is used, and checked against the
    // hash the run recorded; otherwise the recorded path.
    if (model.empty()) model = study.at("model").get<std::string>();
    backend = study.value("backend", std::string("cpu"));  // stores from before CUDA tuning
    shapes = study.at("shapes").get<std::string>();
    expression = study.at("expression").get<std::string>();
    KILN_ASSIGN_OR_RETURN(search, parseSearchMode(study.at("search").get<std::string>()));
    loadInputs = study.at("load_inputs").get<std::vector<std::string>>();
    loadRefOutputs = study.at("load_ref_outputs").get<std::vector<std::string>>();
    seed = study.at("seed").get<uint64_t>();
    const json& a = study.at("accuracy");
    KILN_ASSIGN_OR_RETURN(accuracy.metric, parseMetric(a.at("metric").get<std::string>()));
    accuracy.atol = a.at("atol").get<double>();
    accuracy.rtol = a.at("rtol").get<double>();
    accuracy.threshold = a.at("threshold").get<double>();
    accuracy.perOutput = a.at("per_output").get<std::map<std::string, double>>();
    timing = timingSettingsFrom(study.at("timing"));
    finalists = study.at("finalists").get<int>();
    // Stores from before the minimum gain combined every significant gain.
    mixedMinGain = study.value("mixed_min_gain", 0.0);
    // Stores from before the bound planned the whole product.
    mixedMaxRoutes = study.value("mixed_max_routes", size_t{0});
    finalTiming = timingSettingsFrom(study.at("final_timing"));
    saveEngine = study.at("save_engine").get<std::string>();
    report = study.at("report").get<std::string>();
    saveAllEngines = study.at("save_all_engines").get<std::string>();
    timingCacheFile = study.value("timing_cache_file", std::string());
  } catch (const json::exception& e) {
    return invalidInput("the cache's study settings are unreadable: {}", e.what());
  }
  return Status::ok();
}

Result<std::vector<std::string>> firstPhaseRoutes(const knobs::RouteExpression& expression,
                                                  SearchMode mode) {
  std::vector<knobs::Route> routes = mode == SearchMode::kFull
                                         ? knobs::expandProduct(expression, expression.axes)
                                         : knobs::expandFast(expression);
  std::vector<std::string> texts;
  const std::string baseline = expression.pinned.canonicalText();
  texts.push_back(baseline);
  for (const auto& route : routes) {
    std::string text = route.canonicalText();
    if (text != baseline) texts.push_back(std::move(text));
  }
  return texts;
}

namespace detail {

std::string isoNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

std::string displayRoute(const std::string& route) { return route.empty() ? "(default)" : route; }

}  // namespace detail

// What the chosen route's engine depends on: the machine and the software that built it. For
// the GPU, the device and the driver and library versions its tactics were chosen under (this
// process opens the device once to read them; the trials build and time in their own).
Result<json> targetFingerprint(const std::string& backend) {
  if (backend == "cuda") {
#if KILN_HAVE_CUDA
    auto device = cuda::currentDevice();
    if (!device.isOk()) return device.status().withContext("--backend cuda");
    return json{{"backend", "cuda"},
                {"gpu", device->name},
                {"compute_capability", device->computeCapability()},
                {"multiprocessors", device->multiprocessors},
                {"memory_bytes", device->memoryBytes},
                {"driver", device->driverVersion},
                {"cuda_runtime", device->runtimeVersion},
                {"cudnn", device->cudnnVersion},
                {"cublaslt", device->cublasLtVersion},
                {"kiln_version", std::string(kKilnVersion)}};
#else
    return Status(StatusCode::kUnsupported,
                  "--backend cuda: this kiln was built without the CUDA backend (KILN_CUDA=OFF, "
                  "or no CUDA toolkit at configure time)");
#endif
  }
  const EngineTarget target = currentTarget();
  return json{{"backend", "cpu"},
              {"cpu_model", target.cpuModel},
              {"avx2", target.avx2},
              {"avx512f", target.avx512f},
              {"fma", target.fma},
              {"avx512bf16", target.avx512bf16},
              {"cpus", std::thread::hardware_concurrency()},
              {"kiln_version", std::string(kKilnVersion)}};
}

json versionsJson() {
  return {
    {"kiln", std::string(kKilnVersion)}, {"sqlite", sqlite3_libversion()},
        {"openblas", openblas_get_config()},
#if defined(__clang__)
        {"compiler", "clang " __clang_version__},
#else
        {"compiler", "gcc " __VERSION__},
#endif
    {
      "cxx_standard_library", fmt::format("libstdc++ {}", _GLIBCXX_RELEASE)
    }
  };
}

namespace detail {

// The lanes of --gpus: "" (one unpinned lane), "all", or GPU indices "0,1,3" as CUDA numbers
// them in this process (so within its own CUDA_VISIBLE_DEVICES, if set). Every GPU chosen must be
// the model the study's target fingerprint names (device 0), since the trials' times are compared
// with one another.
Result<std::vector<Lane>> lanesFor(const TuneOptions& options) {
  // The GPUs this process sees: names (one model for a study) and ids (for the GPU locks).
  std::vector<std::string> names, ids;
  Status enumerated = Status::ok();
  if (const int pretend = faultInjection().pretendGpus; pretend > 0) {
    // Test builds: ids unique to the folder the process runs in, so that the processes of one
    // test contend for these GPUs and those of tests running at once do not.
    std::error_code ignored;
    const std::string where = knobs::stableHash(fs::current_path(ignored).string());
    for (int i = 0; i < pretend; ++i) {
      names.push_back("a pretended GPU (test build)");
      ids.push_back(fmt::format("pretend-{}-{}", where, i));
    }
  } else if (options.backend == "cuda") {
#if KILN_HAVE_CUDA
    auto visible = cuda::visibleDevices();
    if (visible.isOk()) {
      for (const auto& device : *visible) {
        names.push_back(device.name);
        ids.push_back(device.uuid);
      }
    } else {
      enumerated = visible.status();
    }
#else
    enumerated = Status(StatusCode::kUnsupported, "this kiln was built without the CUDA backend");
#endif
  }
  if (options.gpus.empty()) {
    // One unpinned lane, on the device CUDA shows first (if any: without one, the CUDA
    // backend's target fingerprint says why).
    Lane lane;
    if (options.backend == "cuda" && !ids.empty()) lane.deviceId = ids.front();
    return std::vector<Lane>{lane};
  }
  if (faultInjection().pretendGpus <= 0 && options.backend != "cuda") {
    return invalidInput(
        "--gpus {}: GPUs are for --backend cuda; the {} backend's trials run one at a time, since "
        "two timed at once would share the cores and memory bandwidth they measure",
        options.gpus, options.backend);
  }
  if (!enumerated.isOk()) return enumerated.withContext("--gpus " + options.gpus);
  std::vector<int> chosen;
  if (options.gpus == "all") {
    for (size_t i = 0; i < names.size(); ++i) chosen.push_back(static_cast<int>(i));
  } else {
    std::stringstream list(options.gpus);
    for (std::string item; std::getline(list, item, ',');) {
      int index = -1;
      size_t used = 0;
      try {
        index = std::stoi(item, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != item.size() || index < 0 ||
          index >= static_cast<int>(names.size())) {
        return invalidInput(
            "--gpus {}: '{}' is not a GPU of this machine (give 'all' or indices among 0..{}, "
            "comma-separated; CUDA shows {} GPU{})",
            options.gpus, item, names.size() - 1, names.size(), names.size() == 1 ? "" : "s");
      }
      if (std::find(chosen.begin(), chosen.end(), index) != chosen.end()) {
        return invalidInput("--gpus {}: GPU {} is named twice", options.gpus, index);
      }
      chosen.push_back(index);
    }
    if (chosen.empty()) return invalidInput("--gpus: no GPU given (give 'all' or '0,1,...')");
  }
  for (int index : chosen) {
    if (names[static_cast<size_t>(index)] != names[0]) {
      return invalidInput(
          "--gpus {}: GPU {} is {} but GPU 0, whose properties the study records, is {}: a "
          "study compares times taken on one GPU model; choose GPUs of one model (or set "
          "CUDA_VISIBLE_DEVICES so that device 0 is one of them)",
          options.gpus, index, names[static_cast<size_t>(index)], names[0]);
    }
  }
  // A child's CUDA_VISIBLE_DEVICES is in the system's numbering: translate through this
  // process's own list, if it has one.
  std::vector<std::string> parentList;
  if (const char* parent = std::getenv("CUDA_VISIBLE_DEVICES")) {
    std::stringstream list(parent);
    for (std::string item; std::getline(list, item, ',');) parentList.push_back(item);
  }
  std::vector<Lane> lanes;
  for (int index : chosen) {
    Lane lane;
    lane.gpu = index;
    lane.deviceId = ids[static_cast<size_t>(index)];
    lane.visibleDevices = static_cast<size_t>(index) < parentList.size()
                              ? parentList[static_cast<size_t>(index)]
                              : std::to_string(index);
    lane.environment = {"CUDA_VISIBLE_DEVICES=" + lane.visibleDevices};
    lanes.push_back(std::move(lane));
  }
  return lanes;
}

}  // namespace detail

std::string hashOfSpec(const std::string& spec) {
  std::string joined;
  for (const std::string& file : ir::filesOfSpec(spec)) {
    auto hash = fileHash(file);
    joined += (hash.isOk() ? *hash : "missing:" + file) + ";";
  }
  return "fnv1a64:" + knobs::stableHash(joined);
}

namespace detail {

// Writes the input sets and references into the work folder (fresh runs) and describes them.
Status prepareData(Study& study, const ir::Graph& graph) {
  const TuneOptions& o = study.options;
  if (!o.loadRefOutputs.empty() && o.loadRefOutputs.size() != o.loadInputs.size()) {
    return invalidInput(
        "--loadRefOutputs is given {} times and --loadInputs {} times: each reference file "
        "belongs to one input set",
        o.loadRefOutputs.size(), o.loadInputs.size());
  }
  fs::create_directories(study.workDir / "data");
  const size_t sets = std::max<size_t>(1, o.loadInputs.size());
  study.generatedReferences = o.loadRefOutputs.empty();
  std::optional<reference::ReferenceExecutor> oracle;
  if (study.generatedReferences) {
    KILN_ASSIGN_OR_RETURN(auto executor, reference::ReferenceExecutor::create(graph));
    oracle.emplace(std::move(executor));
  }
  study.data = json::array();
  for (size_t set = 0; set < sets; ++set) {
    std::map<std::string, ir::Tensor> given;
    if (set < o.loadInputs.size()) {
      KILN_ASSIGN_OR_RETURN(given, ir::loadNamedTensors({o.loadInputs[set]}, "--loadInputs"));
    }
    std::mt19937_64 rng(o.seed + set);
    ir::NamedTensors inputs;
    std::vector<ir::Tensor> ordered;
    for (const ir::Value* input : graph.inputs) {
      auto it = given.find(input->name);
      ir::Tensor tensor;
      if (it == given.end()) {
        tensor = ir::seededRandomTensor(input->dtype, input->shape, rng);
      } else {
        if (it->second.dtype() != input->dtype || it->second.shape() != input->shape) {
          return invalidInput("--loadInputs '{}': input '{}' is {}{} but the model takes {}{}",
                              o.loadInputs[set], input->name, ir::dtypeName(it->second.dtype()),
                              it->second.shape().toString(), ir::dtypeName(input->dtype),
                              input->shape.toString());
        }
        tensor = it->second;
        given.erase(it);
      }
      inputs.emplace_back(input->name, tensor);
      ordered.push_back(tensor);
    }
    if (!given.empty()) {
      return invalidInput("--loadInputs '{}' gives '{}', which is not an input of the model",
                          o.loadInputs[set], given.begin()->first);
    }
    const fs::path inputFile = study.workDir / "data" / fmt::format("inputs_{}.npz", set);
    KILN_RETURN_IF_ERROR(ir::writeNpz(inputFile, inputs));
    study.inputFiles.push_back(inputFile);

    std::vector<ir::Tensor> references;
    if (oracle) {
      KILN_ASSIGN_OR_RETURN(references, oracle->run(ordered));
    } else {
      KILN_ASSIGN_OR_RETURN(auto named,
                            ir::loadNamedTensors({o.loadRefOutputs[set]}, "--loadRefOutputs"));
      for (const std::string& name : study.outputNames) {
        auto it = named.find(name);
        if (it == named.end()) {
          return invalidInput("--loadRefOutputs '{}' has no reference for output '{}'",
                              o.loadRefOutputs[set], name);
        }
        references.push_back(std::move(it->second));
        named.erase(it);
      }
      if (!named.empty()) {
        return invalidInput("--loadRefOutputs '{}' gives '{}', which is not an output of the model",
                            o.loadRefOutputs[set], named.begin()->first);
      }
    }
    ir::NamedTensors namedReferences;
    for (size_t i = 0; i < references.size(); ++i) {
      namedReferences.emplace_back(study.outputNames[i], references[i]);
    }
    const fs::path referenceFile = study.workDir / "data" / fmt::format("references_{}.npz", set);
    KILN_RETURN_IF_ERROR(ir::writeNpz(referenceFile, namedReferences));
    study.references.push_back(std::move(references));

    KILN_ASSIGN_OR_RETURN(std::string inputHash, fileHash(inputFile));
    KILN_ASSIGN_OR_RETURN(std::string referenceHash, fileHash(referenceFile));
    json entry = {{"set", set},
                  {"inputs_file", inputFile.string()},
                  {"inputs_file_hash", inputHash},
                  {"references_file", referenceFile.string()},
                  {"references_file_hash", referenceHash},
                  {"references",
                   study.generatedReferences ? "generated by the reference executor" : "given"}};
    if (set < o.loadInputs.size()) {
      entry["inputs_given"] = o.loadInputs[set];
      entry["inputs_given_hash"] = hashOfSpec(o.loadInputs[set]);
    } else {
      entry["inputs_seed"] = o.seed + set;
    }
    if (!study.generatedReferences) {
      entry["references_given"] = o.loadRefOutputs[set];
      entry["references_given_hash"] = hashOfSpec(o.loadRefOutputs[set]);
    }
    study.data.push_back(entry);
  }
  return Status::ok();
}

// On --continue: the data must be what the run started with, and still in the work folder.
Status reloadData(Study& study, const json& data) {
  study.data = data;
  for (const json& entry : data) {
    for (const char* kind : {"inputs_given", "references_given"}) {
      if (!entry.contains(kind)) continue;
      const std::string spec = entry.at(kind).get<std::string>();
      for (const std::string& file : ir::filesOfSpec(spec)) {
        if (!fs::exists(file)) {
          return invalidInput("the data file {} that the run started with is missing", file);
        }
      }
      const std::string now = hashOfSpec(spec);
      if (now != entry.at(std::string(kind) + "_hash").get<std::string>()) {
        return invalidInput("the data changed since the run started: '{}' ({} now, {} then)", spec,
                            now, entry.at(std::string(kind) + "_hash").get<std::string>());
      }
    }
    for (const char* kind : {"inputs_file", "references_file"}) {
      const fs::path file = entry.at(kind).get<std::string>();
      auto hash = fileHash(file);
      if (!hash.isOk() || *hash != entry.at(std::string(kind) + "_hash").get<std::string>()) {
        return invalidInput("the run's work file {} is missing or changed; start a new run",
                            file.string());
      }
    }
    study.inputFiles.push_back(entry.at("inputs_file").get<std::string>());
    KILN_ASSIGN_OR_RETURN(ir::NamedTensors named,
                          ir::readNpz(entry.at("references_file").get<std::string>()));
    std::vector<ir::Tensor> references;
    for (auto& [name, tensor] : named) references.push_back(std::move(tensor));
    study.references.push_back(std::move(references));
    study.generatedReferences = entry.at("references").get<std::string>() != "given";
  }
  return Status::ok();
}

// ---- trials ---------------------------------------------------------------------------------

std::string signalText(int signal) {
  const char* name = sigabbrev_np(signal);
  const char* description = strsignal(signal);
  return fmt::format("SIG{} ({})", name ? name : std::to_string(signal).c_str(),
                     description ? description : "");
}

std::string lastLine(const std::string& text) {
  const auto end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return "";
  const auto start = text.rfind('\n', end);
  return text.substr(start == std::string::npos ? 0 : start + 1,
                     end - (start == std::string::npos ? 0 : start + 1) + 1);
}

// The timing cache of a CUDA study's trials: the one given, else the work folder's.
fs::path timingCacheOf(const Study& study) {
  if (study.options.backend != "cuda") return {};
  return study.options.timingCacheFile.empty() ? study.workDir / "timing.cache"
                                               : fs::absolute(study.options.timingCacheFile);
}

// `tag` names the trial's folder and engine file. `iteration` is provisional when trials run on
// several lanes: the store numbers trials in the order they end.
Result<TrialRun> runTrial(const Study& study, const Lane& lane, const std::string& route,
                          int64_t iteration, int phase, const std::atomic<bool>& stop,
                          Clock::time_point deadline, const std::string& tag) {
  const std::string& name = tag;
  TrialRun run;
  run.gpu = lane.gpu;
  TrialRecord& record = run.record;
  record.iteration = iteration;
  record.phase = phase;
  record.route = route;
  const fs::path dir = study.workDir / "trials" / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::create_directories(study.workDir / "engines");
  const fs::path engine = study.workDir / "engines" / fmt::format("{}.kiln", name);
  json request = {{"mode", "build"},
                  {"backend", study.options.backend},
                  {"timing_cache", timingCacheOf(study).string()},
                  {"model", study.options.model.string()},
                  {"shapes", study.options.shapes},
                  {"route", route},
                  {"engine", engine.string()},
                  {"outputs_dir", dir.string()},
                  {"timing", timingSettingsJson(study.options.timing)},
                  {"result", (dir / "result.json").string()},
                  {"memory_limit_bytes", study.options.trialLimits.memoryBytes},
                  {"inputs", json::array()}};
  for (const fs::path& file : study.inputFiles) request["inputs"].push_back(file.string());
  KILN_RETURN_IF_ERROR(writeFileAtomically(dir / "request.json", request.dump(1)));

  KILN_ASSIGN_OR_RETURN(
      ChildOutcome child,
      runChild(study.executable, {"__trial", (dir / "request.json").string()}, dir / "log.txt",
               study.options.trialLimits, &stop, deadline, lane.environment));
  record.finishedAt = isoNow();
  using Kind = ChildOutcome::Kind;
  const std::string logLine = lastLine(child.logTail);
  switch (child.kind) {
    case Kind::kStopped:
      run.stopped = true;
      return run;
    case Kind::kTimedOut:
      record.status = TrialStatus::kTimeout;
      record.message = fmt::format("no result after {:.0f} s (--trial-timeout); killed",
                                   study.options.trialLimits.timeoutSeconds);
      return run;
    case Kind::kSignaled:
      if (child.signal == SIGKILL) {
        // The tuner kills children only on timeout or stop (handled above): a SIGKILL from
        // elsewhere is the kernel's out-of-memory killer, or an operator.
        record.status = TrialStatus::kOom;
        record.message = "killed by SIGKILL (most likely the kernel's out-of-memory killer)";
      } else {
        record.status = TrialStatus::kCrash;
        record.message = fmt::format("killed by {}", signalText(child.signal));
        if (!logLine.empty()) record.message += ": " + logLine;
      }
      return run;
    case Kind::kExited:
      break;
  }
  if (child.exitCode == kTrialExitCannotStart || child.exitCode == kTrialExitBadRequest) {
    // The harness failed, not the route: recording it would exclude the route for good.
    return internalError(
        "the trial process for route '{}' could not start or read its request (exit code {}: "
        "{}); nothing was recorded for it, and --continue will try it again",
        displayRoute(route), child.exitCode, logLine);
  }
  if (child.exitCode == kTrialExitOutOfMemory) {
    record.status = TrialStatus::kOom;
    record.message =
        study.options.trialLimits.memoryBytes
            ? fmt::format(
                  "ran out of memory under the limit of {} MiB above the trial process's "
                  "own start-up (--trial-memory-limit)",
                  study.options.trialLimits.memoryBytes >> 20)
            : "ran out of memory";
    return run;
  }
  if (child.exitCode != 0) {
    record.status = TrialStatus::kCrash;
    record.message = fmt::format("exited with code {}", child.exitCode);
    if (!logLine.empty()) record.message += ": " + logLine;
    return run;
  }
  auto resultText = readFileBytes(dir / "result.json");
  json result;
  try {
    if (!resultText.isOk()) throw std::runtime_error(resultText.status().message());
    result = json::parse(*resultText);
    if (lane.gpu >= 0) {
      // A trial on a GPU other than its lane's would time two trials on one GPU.
      const json& seen = result.at("visible_devices");
      if (!seen.is_string() || seen.get<std::string>() != lane.visibleDevices) {
        return internalError(
            "the trial of route '{}' was to run on GPU {} alone (CUDA_VISIBLE_DEVICES={}) but "
            "saw CUDA_VISIBLE_DEVICES={}; nothing was recorded for it",
            displayRoute(route), lane.gpu, lane.visibleDevices, seen.dump());
      }
    }
    const std::string status = result.at("status").get<std::string>();
    record.buildMs = result.value("build_ms", 0.0);
    if (status == "build-error") {
      record.status = TrialStatus::kBuildError;
      record.message = result.at("message").get<std::string>();
      return run;
    }
    if (status != "ok") {
      record.status = TrialStatus::kCrash;
      record.message = "failed while running: " + result.at("message").get<std::string>();
      return run;
    }
    if (result.contains("engine_hash")) {  // cpu; a CUDA trial leaves no engine file
      record.enginePath = engine.string();
      record.engineHash = result.at("engine_hash").get<std::string>();
    }
    record.timing = analyzeTimings(result.at("samples").get<std::vector<double>>());
    const auto outputFiles = result.at("outputs").get<std::vector<std::string>>();
    if (outputFiles.size() != study.references.size()) {
      throw std::runtime_error(fmt::format("{} output files for {} input sets", outputFiles.size(),
                                           study.references.size()));
    }
    for (size_t set = 0; set < outputFiles.size(); ++set) {
      auto named = ir::readNpz(outputFiles[set]);
      if (!named.isOk()) throw std::runtime_error(named.status().message());
      std::vector<ir::Tensor> outputs;
      for (const std::string& name : study.outputNames) {
        auto it = std::find_if(named->begin(), named->end(),
                               [&](const auto& entry) { return entry.first == name; });
        if (it == named->end()) {
          throw std::runtime_error(fmt::format("no output '{}' in {}", name, outputFiles[set]));
        }
        outputs.push_back(it->second);
      }
      auto compared =
          compareOutputs(study.options.accuracy, study.outputNames, outputs, study.references[set]);
      if (!compared.isOk()) {
        record.status = TrialStatus::kAccuracyFail;
        record.message = compared.status().message();
        return run;
      }
      mergeWorst(record.accuracy, *compared);
      fs::remove(outputFiles[set]);
    }
  } catch (const std::exception& e) {
    record.status = TrialStatus::kCrash;
    record.message = fmt::format("exited without a readable result: {}", e.what());
    record.timing.reset();
    return run;
  }
  for (const OutputAccuracy& output : record.accuracy) {
    if (!output.pass) {
      record.status = TrialStatus::kAccuracyFail;
      record.message = fmt::format("output '{}': {}", output.output, output.note);
      return run;
    }
  }
  record.status = TrialStatus::kOk;
  return run;
}

// Runs `jobs` in order, one at a time per lane, each on the first free lane (so with every lane
// free, job k goes to lane k). `startNext` is asked on this thread before each job starts (false:
// start no more); `finished` is called on this thread as each ends, in the order they end. Trials
// in flight end before this returns, even after an error (the first is returned), so that every
// completed trial can be recorded.
Status runOnLanes(const Study& study, const std::vector<TrialJob>& jobs,
                  const std::atomic<bool>& stop, Clock::time_point deadline,
                  const std::function<bool(const TrialJob&, const Lane&)>& startNext,
                  const std::function<Status(const TrialJob&, Result<TrialRun>)>& finished) {
  const std::vector<Lane>& lanes = study.lanes;
  struct Ended {
    size_t job, lane;
    Result<TrialRun> run;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Ended> ended;
  std::vector<std::thread> threads(lanes.size());
  std::vector<bool> busy(lanes.size(), false);
  size_t next = 0, inFlight = 0;
  bool starting = true;
  Status first = Status::ok();
  while (true) {
    for (size_t lane = 0; starting && next < jobs.size() && lane < lanes.size(); ++lane) {
      if (busy[lane]) continue;
      if (!startNext(jobs[next], lanes[lane])) {
        starting = false;
        break;
      }
      busy[lane] = true;
      ++inFlight;
      threads[lane] = std::thread([&, lane, index = next] {
        const TrialJob& job = jobs[index];
        Result<TrialRun> run = internalError("the trial of '{}' did not run", job.route);
        try {
          run = runTrial(study, lanes[lane], job.route, job.iteration, job.phase, stop, deadline,
                         job.tag);
        } catch (const std::exception& e) {
          run = ioError("the trial of route '{}' could not be run: {}", displayRoute(job.route),
                        e.what());
        }
        std::lock_guard lock(mu);
        ended.push_back({index, lane, std::move(run)});
        cv.notify_one();
      });
      ++next;
    }
    if (inFlight == 0) break;
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return !ended.empty(); });
    Ended done = std::move(ended.front());
    ended.pop_front();
    lock.unlock();
    threads[done.lane].join();
    busy[done.lane] = false;
    --inFlight;
    Status status = finished(jobs[done.job], std::move(done.run));
    if (!status.isOk() && first.isOk()) {
      first = std::move(status);
      starting = false;
    }
  }
  return first;
}

// ---- phases ---------------------------------------------------------------------------------

const TrialRecord* findRecord(const std::vector<TrialRecord>& records, const std::string& route) {
  for (const auto& record : records) {
    if (record.route == route) return &record;
  }
  return nullptr;
}

}  // namespace detail

bool eligible(const TrialRecord* record) {
  return record && record->status == TrialStatus::kOk && record->timing.has_value();
}

SecondPhase planSecondPhase(const knobs::RouteExpression& expression,
                            const std::vector<TrialRecord>& records, double drift, double minGain,
                            size_t maxRoutes) {
  SecondPhase plan;
  std::vector<std::string> small;  // significant, but below minGain
  auto gainText = [](const knobs::KnobAxis& axis, const std::string& value, double gain) {
    return fmt::format("{}={} ({:.2f}%)", axis.label(), value, 100 * gain);
  };
  const TrialRecord* base = findRecord(records, expression.pinned.canonicalText());
  if (!eligible(base)) {
    plan.note = "the default route is not eligible, so no gain over it can be significant";
    return plan;
  }
  // Each axis's values with a significant gain of at least minGain, with their gains.
  struct Gain {
    size_t axis;
    std::string value;
    double gain;
  };
  std::vector<Gain> candidates;
  for (size_t a = 0; a < expression.axes.size(); ++a) {
    const auto& axis = expression.axes[a];
    const std::string baselineValue = expression.baselineValue(axis);
    for (const auto& value : axis.values) {
      if (value == baselineValue) continue;
      const std::string route = knobs::withSetting(expression.pinned, axis, value).canonicalText();
      const TrialRecord* record = findRecord(records, route);
      if (eligible(record) && significantlyFaster(*record->timing, *base->timing, drift)) {
        const double gain = 1 - record->timing->summary.median / base->timing->summary.median;
        if (gain >= minGain) {
          candidates.push_back({a, value, gain});
        } else {
          small.push_back(gainText(axis, value, gain));
        }
      }
    }
  }
  // Within maxRoutes: the largest gains first, each while the product (every axis at its baseline
  // or one of its values taken) stays within the bound.
  std::vector<bool> taken(candidates.size(), true);
  std::vector<std::string> capped;
  if (maxRoutes > 0) {
    std::vector<size_t> order(candidates.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return candidates[a].gain > candidates[b].gain; });
    std::vector<size_t> values(expression.axes.size(), 0);
    double product = 1;
    for (const size_t i : order) {
      const Gain& c = candidates[i];
      const double grown = product / static_cast<double>(values[c.axis] + 1) *
                           static_cast<double>(values[c.axis] + 2);
      if (grown <= static_cast<double>(maxRoutes)) {
        product = grown;
        ++values[c.axis];
      } else {
        taken[i] = false;
        capped.push_back(gainText(expression.axes[c.axis], c.value, c.gain));
      }
    }
  }
  std::vector<std::pair<const knobs::KnobAxis*, std::vector<std::string>>> selected;
  for (size_t a = 0; a < expression.axes.size(); ++a) {
    std::vector<std::string> gains;
    for (size_t i = 0; i < candidates.size(); ++i) {
      if (candidates[i].axis == a && taken[i]) gains.push_back(candidates[i].value);
    }
    if (gains.empty()) continue;
    const auto& axis = expression.axes[a];
    std::string text = axis.label() + "=[" + expression.baselineValue(axis);
    for (const auto& g : gains) text += "|" + g;
    plan.knobs.push_back(text + "]");
    selected.emplace_back(&axis, std::move(gains));
  }
  std::vector<knobs::Route> routes{expression.pinned};
  for (const auto& [axis, gains] : selected) {
    std::vector<knobs::Route> next;
    for (const auto& route : routes) {
      next.push_back(route);  // this knob at its baseline
      for (const auto& value : gains) next.push_back(knobs::withSetting(route, *axis, value));
    }
    routes = std::move(next);
  }
  std::set<std::string> seen;
  for (const auto& route : routes) {
    std::string text = route.canonicalText();
    if (findRecord(records, text) || !seen.insert(text).second) continue;
    plan.routes.push_back(std::move(text));
  }
  if (selected.size() < 2) {
    plan.note = selected.empty() ? "no knob's one-off change was a significant gain"
                                 : "only one knob's change was a significant gain, so there is "
                                   "nothing to combine";
    if (!small.empty()) plan.note += fmt::format(" of at least {:.2f}%", 100 * minGain);
  }
  // "N significant gain(s) <why>: a (x%), b (y%)" after the note so far.
  auto leftOut = [&](const std::vector<std::string>& gains, const std::string& why) {
    if (gains.empty()) return;
    plan.note +=
        fmt::format("{}{} significant gain{} {}: {}", plan.note.empty() ? "" : "; ", gains.size(),
                    gains.size() == 1 ? "" : "s", why, fmt::join(gains, ", "));
  };
  leftOut(small, fmt::format("below the {:.2f}% minimum left out", 100 * minGain));
  leftOut(capped, fmt::format("left out to keep the product within {} routes", maxRoutes));
  return plan;
}

namespace detail {

// ---- the finalist round and the decision ----------------------------------------------------

Result<std::vector<ComparisonRecord>> runFinalistRound(
    const Study& study, const std::vector<const TrialRecord*>& finalists, const TrialRecord& base,
    const std::atomic<bool>& stop, Clock::time_point deadline, std::string& failure,
    bool& stopped) {
  const fs::path dir = study.workDir / "trials" / "finalists";
  fs::remove_all(dir);
  fs::create_directories(dir);
  json request = {{"mode", "interleave"},
                  {"backend", study.options.backend},
                  {"timing_cache", timingCacheOf(study).string()},
                  {"inputs", study.inputFiles.front().string()},
                  {"timing", timingSettingsJson(study.options.finalTiming)},
                  {"memory_limit_bytes", study.options.trialLimits.memoryBytes},
                  {"result", (dir / "result.json").string()}};
  if (study.options.backend == "cuda" || study.rebuildFinalists) {
    // No engine files (CUDA; or a worker of a shared store, whose trials ran elsewhere): the
    // child builds each route's plan again, all of them on one GPU or CPU.
    json routes = json::array({base.route});
    for (const TrialRecord* finalist : finalists) routes.push_back(finalist->route);
    request["routes"] = routes;
    request["model"] = study.options.model.string();
    request["shapes"] = study.options.shapes;
  } else {
    // Each engine goes with the hash its trial recorded: the child refuses one that changed.
    json engines = json::array({base.enginePath});
    json hashes = json::array({base.engineHash});
    for (const TrialRecord* finalist : finalists) {
      engines.push_back(finalist->enginePath);
      hashes.push_back(finalist->engineHash);
    }
    request["engines"] = engines;
    request["engine_hashes"] = hashes;
  }
  KILN_RETURN_IF_ERROR(writeFileAtomically(dir / "request.json", request.dump(1)));
  // On the first lane's GPU: interleaving is what makes the comparison fair.
  KILN_ASSIGN_OR_RETURN(
      ChildOutcome child,
      runChild(study.executable, {"__trial", (dir / "request.json").string()}, dir / "log.txt",
               study.options.trialLimits, &stop, deadline, study.lanes.front().environment));
  std::vector<ComparisonRecord> comparisons;
  if (child.kind == ChildOutcome::Kind::kStopped) {
    stopped = true;
    return comparisons;
  }
  if (child.kind != ChildOutcome::Kind::kExited || child.exitCode != 0) {
    failure =
        fmt::format("the interleaved re-measurement failed ({}; its log: {})",
                    child.kind == ChildOutcome::Kind::kTimedOut ? "timed out"
                    : child.kind == ChildOutcome::Kind::kSignaled
                        ? "killed by " + signalText(child.signal)
                        : fmt::format("exit code {}: {}", child.exitCode, lastLine(child.logTail)),
                    (dir / "log.txt").string());
    return comparisons;
  }
  try {
    KILN_ASSIGN_OR_RETURN(std::string text, readFileBytes(dir / "result.json"));
    const json result = json::parse(text);
    if (result.at("status").get<std::string>() != "ok") {
      failure = "the interleaved re-measurement failed: " + result.at("message").get<std::string>();
      return comparisons;
    }
    const auto samples = result.at("samples").get<std::vector<std::vector<double>>>();
    for (size_t i = 0; i < finalists.size(); ++i) {
      ComparisonRecord comparison;
      comparison.route = finalists[i]->route;
      comparison.candidateSamples = samples.at(i + 1);
      comparison.baselineSamples = samples.at(0);
      comparison.comparison =
          comparePaired(comparison.candidateSamples, comparison.baselineSamples);
      comparisons.push_back(std::move(comparison));
    }
  } catch (const std::exception& e) {
    failure = fmt::format("the interleaved re-measurement left no readable result: {}", e.what());
    comparisons.clear();
  }
  return comparisons;
}

std::string formatRatio(const PairedComparison& c) {
  return fmt::format("{:.3f}x [{:.3f}, {:.3f}]", c.speedup(), c.speedupLow(), c.speedupHigh());
}

// ---- what the run leaves behind --------------------------------------------------------------

Status copyEngine(const TrialRecord& record, const fs::path& to) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, readFileBytes(record.enginePath));
  if ("fnv1a64:" + knobs::stableHash(bytes) != record.engineHash) {
    return invalidInput("the engine of route '{}' ({}) changed since its trial; its hash differs",
                        displayRoute(record.route), record.enginePath);
  }
  std::error_code error;
  if (!to.parent_path().empty()) fs::create_directories(to.parent_path(), error);
  if (error)
    return ioError("cannot create the folder {}: {}", to.parent_path().string(), error.message());
  return writeFileAtomically(to, bytes);
}

// The spec with every file made absolute, so that a continued run finds the same files from any
// working folder ("name:file.npy,file.npz" -> "name:/abs/file.npy,/abs/file.npz").
std::string absoluteSpec(const std::string& spec) {
  std::string out;
  std::stringstream entries(spec);
  for (std::string entry; std::getline(entries, entry, ',');) {
    if (entry.empty()) continue;
    const auto colon = entry.find(':');
    const std::string name = colon == std::string::npos ? "" : entry.substr(0, colon + 1);
    const std::string file = colon == std::string::npos ? entry : entry.substr(colon + 1);
    out += (out.empty() ? "" : ",") + name + fs::absolute(file).string();
  }
  return out;
}

// Creates the folders the outputs go to before any trial runs, so that a path that cannot be
// written fails the run at once, not after hours of trials (and not for good on --continue,
// which cannot change it).
Status checkOutputPaths(const TuneOptions& options) {
  std::vector<fs::path> folders;
  for (const fs::path& file : {options.saveEngine, options.report}) {
    if (!file.empty()) folders.push_back(fs::absolute(file).parent_path());
  }
  if (!options.saveAllEngines.empty()) folders.push_back(options.saveAllEngines);
  for (const fs::path& folder : folders) {
    std::error_code error;
    fs::create_directories(folder, error);
    if (error || !fs::is_directory(folder)) {
      return invalidInput("cannot write outputs to {}: {}", folder.string(),
                          error ? error.message() : "not a folder");
    }
  }
  return Status::ok();
}

// An exclusive flock on <work folder>/lock, released when the process ends (even by SIGKILL).
struct WorkFolderLock {
  int fd = -1;
  WorkFolderLock() = default;
  WorkFolderLock(WorkFolderLock&& other) noexcept : fd(std::exchange(other.fd, -1)) {}
  WorkFolderLock& operator=(WorkFolderLock&&) = delete;
  ~WorkFolderLock() {
    if (fd >= 0) ::close(fd);
  }
};

Result<WorkFolderLock> lockWorkFolder(const fs::path& folder, const fs::path& cache) {
  std::error_code error;
  fs::create_directories(folder, error);
  if (error)
    return ioError("cannot create the work folder {}: {}", folder.string(), error.message());
  WorkFolderLock lock;
  const fs::path path = folder / "lock";
  lock.fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock.fd < 0) return ioError("cannot open {}: {}", path.string(), std::strerror(errno));
  if (::flock(lock.fd, LOCK_EX | LOCK_NB) != 0) {
    return invalidInput("another kiln tune (pid {}) is using {}; wait for it or stop it first",
                        lockHolder(lock.fd), cache.empty() ? folder.string() : cache.string());
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(lock.fd, 0) != 0 || ::pwrite(lock.fd, pid.data(), pid.size(), 0) < 0) {
    // The pid is only for the message of a refused second run; the lock itself holds.
  }
  return lock;
}

Result<GpuLocks> GpuLocks::acquire(const std::vector<Lane>& lanes) {
  GpuLocks locks;
  for (const Lane& lane : lanes) {
    if (lane.deviceId.empty()) continue;
    // In /tmp whatever TMPDIR says (Slurm gives each job its own): the lock is the host's.
    const fs::path path = fs::path("/tmp") / fmt::format("kiln-gpu-{}.lock", lane.deviceId);
    int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    const bool writable = fd >= 0;
    if (fd < 0) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // another user's lock file
    if (fd < 0) return ioError("cannot open {}: {}", path.string(), std::strerror(errno));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const std::string holder = lockHolder(fd);
      ::close(fd);
      return invalidInput(
          "{} ({}) is in use by another kiln tune or kiln worker (pid {}): two trials timed on "
          "one GPU would disturb each other's times; wait for it, stop it, or choose other GPUs",
          lane.gpu >= 0 ? fmt::format("GPU {}", lane.gpu) : std::string("the GPU"), lane.deviceId,
          holder);
    }
    const std::string pid = std::to_string(::getpid());
    if (writable && (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0)) {
      // The pid is only for the message of a refused second process; the lock itself holds.
    }
    locks.fds_.push_back(fd);
  }
  return locks;
}

GpuLocks::~GpuLocks() {
  for (int fd : fds_) ::close(fd);
}

fs::path manifestPathFor(const fs::path& engine) {
  fs::path manifest = engine;
  return manifest.replace_extension(".manifest.json");
}

}  // namespace detail

namespace detail {

// The finalist round and the decision, once every planned trial is recorded (or the tuning
// timeout ended the run: `outOfTime`, with `remaining` routes not measured).
Result<Conclusion> concludeStudy(const Study& study, ResultStore& store,
                                 const std::vector<TrialRecord>& records, double drift,
                                 bool outOfTime, int64_t remaining,
                                 const std::string& degenerateNote, const std::atomic<bool>& stop,
                                 Clock::time_point deadline, Progress& progress) {
  Conclusion conclusion;
  Decision& decision = conclusion.decision;
  std::vector<ComparisonRecord>& comparisons = conclusion.comparisons;
  bool& keepTrialFiles = conclusion.keepTrialFiles;
  bool& harnessFailed = conclusion.harnessFailed;
  const TuneOptions& options = study.options;
  auto say = [&](std::string_view format, auto&&... args) {
    progress.say(fmt::format(fmt::runtime(format), args...));
  };
  if (!degenerateNote.empty()) decision.notes.push_back(degenerateNote);
  decision.baseline = study.baseline;
  const TrialRecord* base = findRecord(records, study.baseline);
  if (outOfTime) {
    decision.provisional = true;
    decision.notes.push_back(fmt::format(
        "the tuning timeout ({:.1f} s) ended the run with {} planned routes not measured; "
        "continue it with --continue to finish",
        options.tuningTimeoutSeconds, remaining));
  }
  std::vector<const TrialRecord*> eligibleRecords;
  for (const auto& record : records) {
    if (eligible(&record)) eligibleRecords.push_back(&record);
  }
  std::sort(eligibleRecords.begin(), eligibleRecords.end(),
            [](auto* a, auto* b) { return a->timing->summary.median < b->timing->summary.median; });
  if (eligibleRecords.empty()) {
    decision.winner.reset();
    decision.reason = "no route was eligible: every trial failed or missed the accuracy threshold";
  } else if (!eligible(base)) {
    decision.winner = eligibleRecords.front()->route;
    decision.reason = fmt::format(
        "the default route was not eligible ({}), so no speedup over it can be measured; the "
        "fastest eligible route by median was chosen",
        base ? std::string(trialStatusName(base->status)) + ": " + base->message : "not measured");
  } else {
    std::vector<const TrialRecord*> finalists;
    for (const TrialRecord* record : eligibleRecords) {
      if (record->route != study.baseline &&
          significantlyFaster(*record->timing, *base->timing, drift) &&
          static_cast<int>(finalists.size()) < options.finalists) {
        finalists.push_back(record);
      }
    }
    decision.winner = study.baseline;
    if (finalists.empty()) {
      decision.reason =
          "no route's median interval lay entirely below the default's: no candidate beat the "
          "default by more than the measured noise, so the default route stays";
    } else if (outOfTime) {
      decision.winner = finalists.front()->route;
      decision.reason = fmt::format(
          "the fastest route whose median interval lies below the default's; it was not "
          "re-measured interleaved with the default because the tuning timeout was reached "
          "(provisional)");
    } else {
      std::string failure;
      bool stopped = false;
      // A continued run whose finalist round already completed (it was stopped while writing
      // its outputs) keeps those measurements rather than drawing new ones.
      KILN_ASSIGN_OR_RETURN(std::vector<ComparisonRecord> stored, store.comparisons());
      std::set<std::string> storedRoutes, finalistRoutes;
      for (const auto& c : stored) storedRoutes.insert(c.route);
      for (const TrialRecord* f : finalists) finalistRoutes.insert(f->route);
      if (!stored.empty() && storedRoutes == finalistRoutes) {
        say("finalists: {} route{} already re-measured interleaved with the default\n",
            finalists.size(), finalists.size() == 1 ? "" : "s");
        comparisons = std::move(stored);
      } else {
        say("finalists: re-measuring {} route{} interleaved with the default\n", finalists.size(),
            finalists.size() == 1 ? "" : "s");
        json routes = json::array();
        for (const TrialRecord* f : finalists) routes.push_back(f->route);
        progress.event("finalists", {{"routes", routes}});
        progress.beginStep("finalists",
                           fmt::format("finalist round ({} route{} interleaved with the default)",
                                       finalists.size(), finalists.size() == 1 ? "" : "s"));
        auto round = runFinalistRound(study, finalists, *base, stop, deadline, failure, stopped);
        progress.endStep();
        KILN_ASSIGN_OR_RETURN(comparisons, std::move(round));
        if (stopped && stop.load()) {
          conclusion.stopped = true;
          return conclusion;
        }
        if (stopped) {
          outOfTime = true;
          failure = "the tuning timeout was reached during the finalist round";
        }
        if (failure.empty()) {
          conclusion.measuredComparisons = true;
          if (!study.deferComparisons) KILN_RETURN_IF_ERROR(store.setComparisons(comparisons));
        }
      }
      const ComparisonRecord* best = nullptr;
      for (const auto& c : comparisons) {
        say("  {}: {} the default's speed ({} pairs){}\n", displayRoute(c.route),
            formatRatio(c.comparison), c.comparison.pairs,
            c.comparison.significantlyFaster() ? ", significant" : "");
        progress.event("comparison", {{"route", c.route},
                                      {"ratio_median", c.comparison.ratioMedian},
                                      {"pairs", c.comparison.pairs},
                                      {"significant", c.comparison.significantlyFaster()}});
        if (c.comparison.significantlyFaster() &&
            (!best || c.comparison.ratioMedian < best->comparison.ratioMedian)) {
          best = &c;
        }
      }
      if (!failure.empty()) {
        // Not a finding about the routes: the decision stays open for --continue to complete.
        decision.provisional = true;
        decision.reason = failure + "; the default route stays until the round is completed";
        decision.notes.push_back("the finalist round did not complete; --continue runs it again");
        keepTrialFiles = true;  // the evidence of what went wrong
        if (!outOfTime) harnessFailed = true;
      } else if (!best) {
        decision.reason = fmt::format(
            "{} route{} beat the default in their own trials, but none was significantly faster "
            "when re-measured interleaved with it (A/B in one process), so the default route "
            "stays",
            finalists.size(), finalists.size() == 1 ? "" : "s");
      } else {
        decision.winner = best->route;
        decision.comparison = best->comparison;
        decision.reason = fmt::format(
            "the fastest of {} finalist{} re-measured interleaved with the default: {} its "
            "speed over {} pairs at {:.0f}% confidence, the whole interval above 1",
            finalists.size(), finalists.size() == 1 ? "" : "s", formatRatio(best->comparison),
            best->comparison.pairs, best->comparison.confidence * 100);
      }
    }
  }

  return conclusion;
}

}  // namespace detail

ControlTrials controlTrials(const std::map<std::string, std::string>& header) {
  ControlTrials controls;
  if (auto it = header.find("control"); it != header.end()) {
    auto parsed = trialFromJson(json::parse(it->second, nullptr, false));
    if (parsed.isOk()) controls.first = *parsed;
  }
  if (auto it = header.find("control_other_gpus"); it != header.end()) {
    const json others = json::parse(it->second, nullptr, false);
    for (const json& other : others.is_array() ? others : json::array()) {
      auto parsed = trialFromJson(other);
      if (parsed.isOk()) controls.others.emplace_back(other.value("gpu", -1), *parsed);
    }
  }
  return controls;
}

std::optional<double> controlDrift(const TrialRecord* baseline, const ControlTrials& controls) {
  if (!eligible(baseline) || !controls.first || !eligible(&*controls.first)) return std::nullopt;
  const double base = baseline->timing->summary.median;
  double drift = std::abs(controls.first->timing->summary.median - base) / base;
  for (const auto& [gpu, other] : controls.others) {
    if (eligible(&other))
      drift = std::max(drift, std::abs(other.timing->summary.median - base) / base);
  }
  return drift;
}

namespace {

// --store postgresql://...: the study, its model and data go into the shared store with phase
// one queued. With --submit that is all; otherwise this process works on the study as one
// worker until it is decided, then prints where it stands.
Result<int> submitStudy(const Study& study, std::map<std::string, std::string> header,
                        const std::vector<std::string>& phaseOne, int64_t memoryAsGiven,
                        const std::atomic<bool>& stop) {
  const TuneOptions& options = study.options;
  header["store"] = "postgresql";
  header["trial_limits"] = json{
      {"timeout_s", options.trialLimits.timeoutSeconds},
      {"memory_bytes",
       memoryAsGiven}}.dump();
  header.erase("target");  // bound by the first worker that takes a trial
  std::map<std::string, std::string> blobs;
  KILN_ASSIGN_OR_RETURN(blobs["model"], readFileBytes(options.model));
  for (const json& entry : study.data) {
    for (const char* kind : {"inputs", "references"}) {
      const fs::path file = entry.at(std::string(kind) + "_file").get<std::string>();
      KILN_ASSIGN_OR_RETURN(blobs["data/" + file.filename().string()], readFileBytes(file));
    }
  }
  KILN_ASSIGN_OR_RETURN(pg::StudyStore store,
                        pg::StudyStore::create(options.store, options.backend, header, blobs,
                                               phaseOne, options.maxAttempts));
  const std::string uri = pg::redacted(options.store);
  if (!options.quiet) {
    std::printf("submitted study %lld to %s: %s search, %zu route%s in phase one\n",
                static_cast<long long>(store.id()), uri.c_str(), searchModeName(options.search),
                phaseOne.size(), phaseOne.size() == 1 ? "" : "s");
  }
  if (options.submit) {
    if (!options.quiet) {
      std::printf(
          "start workers with: kiln worker --store '%s' --backend %s\n"
          "follow it with:     kiln status '%s' --study %lld\n",
          uri.c_str(), options.backend.c_str(), uri.c_str(), static_cast<long long>(store.id()));
    }
    std::fflush(stdout);
    return 0;
  }
  std::fflush(stdout);
  WorkerOptions worker{.store = options.store,
                       .backend = options.backend,
                       .exitWhenIdleSeconds = 0,
                       .onlyStudy = store.id(),
                       .workRoot = study.workDir / "worker",
                       .quiet = options.quiet};
  KILN_ASSIGN_OR_RETURN(int code, runWorker(worker, stop));
  if (code != 0) {
    if (!options.quiet) {
      std::printf(
          "stopped: study %lld stays in the store with every trial recorded so far; go on with "
          "kiln worker --store '%s' --backend %s --study %lld\n",
          static_cast<long long>(store.id()), uri.c_str(), options.backend.c_str(),
          static_cast<long long>(store.id()));
    }
    return code;
  }
  KILN_RETURN_IF_ERROR(store.reloadHeader());
  KILN_ASSIGN_OR_RETURN(json queue, store.queueJson());
  KILN_ASSIGN_OR_RETURN(json described, describeStudy(store, std::nullopt, queue));
  if (!options.quiet) std::fputs(studyText(described).c_str(), stdout);
  const json& decision = described.at("decision");
  return !decision.is_null() && !decision.at("winner").is_null() ? 0 : 1;
}

}  // namespace

Result<int> runTune(TuneOptions options, const std::atomic<bool>& stop) {
  const auto started = Clock::now();
  const Clock::time_point deadline =
      options.tuningTimeoutSeconds > 0
          ? started + std::chrono::duration_cast<Clock::duration>(
                          std::chrono::duration<double>(options.tuningTimeoutSeconds))
          : Clock::time_point::max();
  Progress progress(
      chooseProgressStyle(options.quiet, options.jsonProgress, ::isatty(::fileno(stdout)) == 1),
      stdout, options.progressIntervalSeconds);
  auto say = [&](std::string_view format, auto&&... args) {
    progress.say(fmt::format(fmt::runtime(format), args...));
  };

  // ---- the store and the study --------------------------------------------------------------
  std::optional<TuneStore> store;
  if (options.resume) {
    if (options.cache.empty())
      return invalidInput("--continue needs --cache, the run's result store");
    KILN_ASSIGN_OR_RETURN(TuneStore opened, TuneStore::open(options.cache));
    KILN_RETURN_IF_ERROR(opened.checkWritable());
    store.emplace(std::move(opened));
    json study;
    try {
      study = json::parse(store->header().at("study"));
    } catch (const std::exception& e) {
      return invalidInput("{}: the header has no readable study settings ({})",
                          options.cache.string(), e.what());
    }
    KILN_RETURN_IF_ERROR(options.restoreStudy(study));
  }
  if (options.backend != "cpu" && options.backend != "cuda") {
    return invalidInput("--backend {}: kiln tunes for cpu or cuda", options.backend);
  }
  const bool shared = !options.store.empty();
  if (options.submit && !shared) {
    return invalidInput("--submit queues a study in a shared store: give --store postgresql://...");
  }
  if (shared) {
    if (!pg::isUri(options.store)) {
      return invalidInput(
          "--store {}: a shared store is a PostgreSQL URI (postgresql://...); the embedded "
          "SQLite store is --cache FILE",
          options.store);
    }
    // What a shared study cannot have: files on one machine, and a run of this process.
    for (const auto& [given, flag] : std::vector<std::pair<bool, const char*>>{
             {!options.cache.empty(), "--cache"},
             {options.resume, "--continue"},
             {!options.gpus.empty(), "--gpus"},
             {!options.saveEngine.empty(), "--saveEngine"},
             {!options.saveAllEngines.empty(), "--save-all-engines"},
             {!options.report.empty(), "--report"},
             {!options.timingCacheFile.empty(), "--timingCacheFile"},
             {options.tuningTimeoutSeconds > 0, "--tuning-timeout"}}) {
      if (given) {
        return invalidInput(
            "{} does not apply to a study in a shared store (--store): its trials run on the "
            "workers' machines (`kiln worker --gpus ...`), and `kiln status` / `kiln best` read "
            "its outcome; build the chosen route with `kiln build --route \"$(kiln best "
            "--study N URI)\"`",
            flag);
      }
    }
    if (options.maxAttempts < 1) {
      return invalidInput("--max-attempts {}: at least 1", options.maxAttempts);
    }
  }
  const int64_t memoryAsGiven = options.trialLimits.memoryBytes == kDefaultTrialMemory
                                    ? -1
                                    : static_cast<int64_t>(options.trialLimits.memoryBytes);
  if (options.backend != "cuda" && !options.timingCacheFile.empty()) {
    return invalidInput("--timingCacheFile applies to --backend cuda only");
  }
  if (options.backend == "cuda") {
    // A CUDA plan lives only in the process that built it: what a trial leaves is its route.
    if (!options.saveEngine.empty() || !options.saveAllEngines.empty()) {
      return invalidInput(
          "--backend cuda has no engine files to save (--saveEngine, --save-all-engines): a CUDA "
          "plan is rebuilt from its route (`kiln run --backend cuda --route ...`); the winning "
          "route is printed and written to --report");
    }
    if (!options.timingCacheFile.empty()) {
      // Read once here, so that a file that is not a timing cache stops the run at once rather
      // than failing every trial's build.
      KILN_RETURN_IF_ERROR(TimingCache::forFile(options.timingCacheFile).status());
    }
    if (options.trialLimits.memoryBytes == kDefaultTrialMemory) {
      options.trialLimits.memoryBytes = 0;
    } else if (options.trialLimits.memoryBytes > 0) {
      return invalidInput(
          "--trial-memory-limit does not apply to --backend cuda: the limit counts host "
          "mappings, and the CUDA driver maps far more than the trial uses (GPU memory is "
          "not limited by it)");
    }
  }
  if (options.trialLimits.memoryBytes == kDefaultTrialMemory) {
    const long pages = ::sysconf(_SC_PHYS_PAGES);
    const long pageSize = ::sysconf(_SC_PAGESIZE);
    options.trialLimits.memoryBytes =
        pages > 0 && pageSize > 0
            ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(pageSize) / 4 * 3
            : 0;
  }
  options.model = fs::absolute(options.model);
  if (!options.resume) {
    for (auto* specs : {&options.loadInputs, &options.loadRefOutputs}) {
      for (std::string& spec : *specs) spec = absoluteSpec(spec);
    }
  }
  Study study;
  study.options = options;
  KILN_ASSIGN_OR_RETURN(study.expression, knobs::parseRouteExpression(options.expression));
  study.baseline = study.expression.pinned.canonicalText();
  if (options.search == SearchMode::kFull) {
    KILN_ASSIGN_OR_RETURN(uint64_t count, study.expression.fullCount(uint64_t{1} << 40));
    if (count > kLargeSearchRoutes && !options.allowLargeSearch && !options.resume) {
      return invalidInput(
          "a full search of this expression builds {} routes (more than {}): pass "
          "--allow-large-search to run it, or use --search mixed",
          count, kLargeSearchRoutes);
    }
  }
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> phaseOne,
                        firstPhaseRoutes(study.expression, options.search));

  if (options.dryRun) {
    std::printf("%s search: %zu route%s%s\n", searchModeName(options.search), phaseOne.size(),
                phaseOne.size() == 1 ? "" : "s",
                options.search == SearchMode::kMixed ? " in phase one" : "");
    for (size_t i = 0; i < phaseOne.size(); ++i) {
      std::printf("  %3zu  %s\n", i + 1, displayRoute(phaseOne[i]).c_str());
    }
    if (options.search == SearchMode::kMixed) {
      auto full = study.expression.fullCount(uint64_t{1} << 40);
      bool known = full.isOk();
      uint64_t most = known ? *full - std::min<uint64_t>(*full, phaseOne.size()) : 0;
      if (options.mixedMaxRoutes > 0 && (!known || most > options.mixedMaxRoutes)) {
        most = options.mixedMaxRoutes;
        known = true;
      }
      if (known) {
        std::printf(
            "phase two: at most %llu more routes (the product over the knobs whose change is a "
            "significant gain, within --mixed-max-routes; known only after phase one)\n",
            static_cast<unsigned long long>(most));
      } else {
        std::printf("phase two: bounded by the full product, more than 2^40 routes\n");
      }
    }
    return 0;
  }

  // The model, once, in this process: output names, input shapes, and generated references.
  KILN_ASSIGN_OR_RETURN(std::string modelBytes, readFileBytes(options.model));
  const std::string modelHash = modelHashOf(modelBytes);
  if (store && store->header().count("model_hash") &&
      store->header().at("model_hash") != modelHash) {
    return invalidInput("{}: the model changed since the run started ({} is {} now, {} then)",
                        options.cache.string(), options.model.string(), modelHash,
                        store->header().at("model_hash"));
  }
  onnx::ImportOptions importOptions;
  KILN_ASSIGN_OR_RETURN(importOptions.inputShapes, onnx::parseShapeSpec(options.shapes));
  KILN_ASSIGN_OR_RETURN(onnx::Model model, onnx::importModel(options.model, importOptions));
  for (const ir::Value* output : model.graph.outputs) study.outputNames.push_back(output->name);
  for (const auto& [name, threshold] : options.accuracy.perOutput) {
    if (std::find(study.outputNames.begin(), study.outputNames.end(), name) ==
        study.outputNames.end()) {
      return invalidInput(
          "--accuracy-threshold names '{}', which is not an output of the model ({})", name,
          fmt::join(study.outputNames, ", "));
    }
  }
  KILN_ASSIGN_OR_RETURN(study.executable, currentExecutable());
  // A shared store's study is bound to the target of its first worker, not this machine's
  // (which may have no GPU).
  json target = nullptr;
  if (!shared) {
    KILN_ASSIGN_OR_RETURN(target, targetFingerprint(options.backend));
  }
  KILN_ASSIGN_OR_RETURN(study.lanes, lanesFor(options));
  // A shared store's study runs on its workers, which lock their own GPUs.
  std::optional<GpuLocks> gpuLocks;
  if (!shared) {
    KILN_ASSIGN_OR_RETURN(GpuLocks locked, GpuLocks::acquire(study.lanes));
    gpuLocks.emplace(std::move(locked));
  }

  if (options.cache.empty()) {
    char pattern[] = "/tmp/kiln-tune-XXXXXX";
    if (!::mkdtemp(pattern)) return ioError("cannot create a temporary folder for the run");
    study.workDir = pattern;
    study.temporary = true;
  } else {
    study.workDir = fs::absolute(fs::path(options.cache.string() + ".d"));
  }
  // One run at a time per cache: a second tuner on the same files would delete the first's
  // trial folders and overwrite its engines. The lock is the work folder's, held until exit.
  KILN_ASSIGN_OR_RETURN(WorkFolderLock lock, lockWorkFolder(study.workDir, options.cache));
  (void)lock;
  struct RemoveTemporary {
    const Study& study;
    ~RemoveTemporary() {
      std::error_code ignored;
      if (study.temporary) fs::remove_all(study.workDir, ignored);
    }
  } removeTemporary{study};

  if (store) {
    const auto& header = store->header();
    auto field = [&](const std::string& key) {
      auto it = header.find(key);
      return it == header.end() ? std::string() : it->second;
    };

    if (field("target") != target.dump()) {
      return invalidInput(
          "{}: the run started on another target or kiln ({} then, {} now); start a new run here",
          options.cache.string(), field("target"), target.dump());
    }
    json data;
    try {
      data = json::parse(field("data"));
    } catch (const std::exception& e) {
      return invalidInput("{}: the header's data description is unreadable: {}",
                          options.cache.string(), e.what());
    }
    KILN_RETURN_IF_ERROR(reloadData(study, data).withContext(options.cache.string()));
  } else {
    if (!options.cache.empty() && fs::exists(options.cache)) {
      return invalidInput(
          "{} exists: continue that run with --continue --cache {}, or choose another file",
          options.cache.string(), options.cache.string());
    }
    KILN_RETURN_IF_ERROR(checkOutputPaths(options));
    KILN_RETURN_IF_ERROR(prepareData(study, model.graph));
    std::map<std::string, std::string> header = {
        {"format", "kiln tuning cache"},
        {"tuner_version", std::string(kKilnVersion)},
        {"search", searchModeName(options.search)},
        {"expression", options.expression},
        {"accuracy", accuracyJson(options.accuracy).dump()},
        {"command_line", options.commandLine},
        {"default_route", study.baseline},
        {"model_path", fs::absolute(options.model).string()},
        {"model_hash", modelHash},
        {"data", study.data.dump()},
        {"target", target.dump()},
        {"study", options.studyJson().dump()},
        {"created_at", isoNow()}};
    if (shared) return submitStudy(study, header, phaseOne, memoryAsGiven, stop);
    const fs::path storePath = study.temporary ? study.workDir / "tune.db" : options.cache;
    KILN_ASSIGN_OR_RETURN(TuneStore created, TuneStore::create(storePath, header));
    store.emplace(std::move(created));
  }
  const std::string resumeCommand =
      study.temporary ? "" : fmt::format("kiln tune --continue --cache {}", options.cache.string());

  if (store->header().count("finished_at")) {
    say("this run finished at {}; nothing remains. Its decision: {}\n",
        store->header().at("finished_at"),
        store->header().count("decision") ? store->header().at("decision") : "(none)");
    progress.event("done",
                   {{"already_finished", store->header().at("finished_at")}, {"exit_code", 0}});
    return 0;
  }

  KILN_ASSIGN_OR_RETURN(std::vector<TrialRecord> records, store->trials());
  say("kiln tune: {} ({}), {} search, default route {}\n", options.model.string(), modelHash,
      searchModeName(options.search), displayRoute(study.baseline));
  say("accuracy: {} per output, threshold {}{}; references {}\n",
      metricName(options.accuracy.metric), options.accuracy.threshold,
      options.accuracy.perOutput.empty() ? "" : " (some outputs have their own)",
      study.generatedReferences ? "generated by the reference executor on seeded inputs" : "given");
  if (!records.empty()) say("continuing: {} trials already recorded\n", records.size());
  progress.event("start", {{"model", options.model.string()},
                           {"model_hash", modelHash},
                           {"backend", options.backend},
                           {"search", searchModeName(options.search)},
                           {"default_route", study.baseline},
                           {"metric", metricName(options.accuracy.metric)},
                           {"threshold", options.accuracy.threshold},
                           {"cache", options.cache.string()},
                           {"recorded", records.size()}});
  {
    // A continued run's live line starts from what the store holds.
    const TrialRecord* base = findRecord(records, study.baseline);
    size_t failures = 0;
    const TrialRecord* best = nullptr;
    for (const auto& r : records) {
      if (!eligible(&r)) {
        ++failures;
      } else if (eligible(base) && r.route != study.baseline &&
                 (!best || r.timing->summary.median < best->timing->summary.median)) {
        best = &r;
      }
    }
    progress.noteFailures(failures);
    if (best && significantlyFaster(*best->timing, *base->timing, 0)) {
      progress.noteBest(displayRoute(best->route),
                        base->timing->summary.median / best->timing->summary.median);
    }
  }
  // A reference that is the same number everywhere (a zero-initialised classifier head, a
  // saturated output) cannot tell an accurate route from an inaccurate one: say so loudly.
  std::vector<std::string> degenerate;
  for (size_t o = 0; o < study.outputNames.size(); ++o) {
    bool constant = true;
    for (const auto& references : study.references) {
      const ir::Tensor& reference = references.at(o);
      for (int64_t i = 1; i < reference.elementCount() && constant; ++i) {
        constant = reference.elementAsDouble(i) == reference.elementAsDouble(0);
      }
    }
    if (constant) degenerate.push_back(study.outputNames[o]);
  }
  std::string degenerateNote;
  if (!degenerate.empty()) {
    degenerateNote = fmt::format(
        "the reference of output{} '{}' is one value repeated in every input set, so accuracy "
        "cannot tell routes apart on it; give inputs and references that exercise the model",
        degenerate.size() == 1 ? "" : "s", fmt::join(degenerate, "', '"));
    say("warning: {}\n", degenerateNote);
    progress.event("warning", {{"message", degenerateNote}});
  }

  // ---- the trial loop -----------------------------------------------------------------------
  bool interrupted = false, outOfTime = false;
  int64_t remainingCount = 0;
  double drift = 0;  // set from the control trial after phase one
  const bool pinned = study.lanes.front().gpu >= 0;
  progress.setLanes(study.lanes.size());
  if (pinned) {
    std::vector<int> gpus;
    for (const Lane& lane : study.lanes) gpus.push_back(lane.gpu);
    say("trials on {} GPU{} at once ({}), one trial per GPU\n", gpus.size(),
        gpus.size() == 1 ? "" : "s", fmt::join(gpus, ", "));
  }
  // A cache that cannot be written (a full disk, a file size limit, the file deleted under the
  // run) stops the run: it says what could not be recorded, what the cache keeps, and how to
  // resume once the cause is gone.
  auto recordedOrStop = [&](Status status, const std::string& what) -> Status {
    if (status.isOk()) return status;
    return ioError(
        "{}\nstopped: {} could not be recorded; {} earlier trials are in the cache{}",
        status.message(), what, records.size(),
        resumeCommand.empty() ? "" : "; once it can be written, resume with: " + resumeCommand);
  };

  // Runs the phase's routes not yet recorded, on every lane, and records each as it ends (in the
  // order they end: with one lane, the phase's order).
  auto runPhase = [&](const std::vector<std::string>& routes, int phase) -> Status {
    size_t done = 0;
    std::vector<TrialJob> jobs;
    for (size_t i = 0; i < routes.size(); ++i) {
      if (findRecord(records, routes[i])) {
        ++done;
      } else {
        jobs.push_back({.route = routes[i],
                        .tag = fmt::format("p{}-{}", phase, i),
                        .iteration = static_cast<int64_t>(records.size()),
                        .phase = phase});
      }
    }
    progress.beginPhase(phase, routes.size(), done);
    auto startNext = [&](const TrialJob& job, const Lane& lane) {
      if (stop.load()) interrupted = true;
      if (Clock::now() > deadline) outOfTime = true;
      if (interrupted || outOfTime) return false;
      progress.beginTrial(job.route, displayRoute(job.route),
                          lane.gpu >= 0 ? std::optional<int>(lane.gpu) : std::nullopt);
      return true;
    };
    auto finished = [&](const TrialJob& job, Result<TrialRun> result) -> Status {
      if (!result.isOk() || result->stopped) {
        progress.abandonTrial(displayRoute(job.route));
        if (!result.isOk()) return result.status();
        if (stop.load())
          interrupted = true;
        else
          outOfTime = true;
        return Status::ok();
      }
      TrialRun& run = *result;
      run.record.iteration = static_cast<int64_t>(records.size());
      // The trial just finished is lost if it cannot be recorded; those before it are kept.
      Status stored = store->addTrial(run.record);
      if (!stored.isOk()) progress.abandonTrial(displayRoute(job.route));
      KILN_RETURN_IF_ERROR(
          recordedOrStop(stored, fmt::format("the trial of route '{}'", displayRoute(job.route))));
      records.push_back(run.record);
      ++done;
      const TrialRecord& r = run.record;
      std::string detail;
      std::optional<double> speedup;
      json fields = {
          {"route", r.route}, {"status", trialStatusName(r.status)}, {"build_s", r.buildMs / 1000}};
      if (run.gpu >= 0) fields["gpu"] = run.gpu;
      if (!r.message.empty()) fields["message"] = r.message;
      if (r.timing) {
        fields["median_ms"] = r.timing->summary.median;
        fields["interval_ms"] = {r.timing->ciLow, r.timing->ciHigh};
        detail = fmt::format("median {:.4f} ms [{:.4f}, {:.4f}]", r.timing->summary.median,
                             r.timing->ciLow, r.timing->ciHigh);
        const TrialRecord* base = findRecord(records, study.baseline);
        if (eligible(base) && r.route != study.baseline) {
          // The best so far is a route whose gain cleared the measured noise.
          if (eligible(&r) && significantlyFaster(*r.timing, *base->timing, drift)) {
            speedup = base->timing->summary.median / r.timing->summary.median;
          }
          fields["speedup"] = base->timing->summary.median / r.timing->summary.median;
          detail += fmt::format(
              "  {:.3f}x{}", base->timing->summary.median / r.timing->summary.median,
              // Before the control trial the drift is unknown: say only what was measured.
              !significantlyFaster(*r.timing, *base->timing, drift) ? ""
              : phase == 1 ? " (interval below the default's)"
                           : " (significant)");
        }
        double worst = 0;
        for (const auto& a : r.accuracy) {
          if (std::isnan(a.loss) || a.loss > worst) worst = a.loss;
        }
        detail += fmt::format("  loss {:.3g}  build {:.2f} s", worst, r.buildMs / 1000);
        fields["loss"] = std::isnan(worst) ? json(nullptr) : json(worst);
      }
      if (!r.message.empty()) detail += (detail.empty() ? "" : "  ") + r.message;
      if (run.gpu >= 0) detail += fmt::format("  (gpu {})", run.gpu);
      progress.endTrial(displayRoute(r.route),
                        fmt::format("[phase {} {}/{}] {}: {}  {}\n", phase, done, routes.size(),
                                    displayRoute(r.route), trialStatusName(r.status), detail),
                        !eligible(&r), speedup, std::move(fields));
      return Status::ok();
    };
    Status status = runOnLanes(study, jobs, stop, deadline, startNext, finished);
    if (interrupted || outOfTime) remainingCount += static_cast<int64_t>(routes.size() - done);
    return status;
  };

  say("phase one: {} route{}\n", phaseOne.size(), phaseOne.size() == 1 ? "" : "s");
  KILN_RETURN_IF_ERROR(runPhase(phaseOne, 1));

  // The control: the default route measured again after phase one, in a trial of its own. How
  // far its median moved is the drift between trials (clock, load, heat), and a gain must exceed
  // it as well as the measured intervals to count as significant. With several GPUs the default
  // is measured again on each, so that the drift also covers the differences between them (the
  // "control" header field holds the first GPU's trial, "control_other_gpus" the others').
  const TrialRecord* baseRecord = findRecord(records, study.baseline);
  if (!interrupted && !outOfTime && eligible(baseRecord) && !store->header().count("control")) {
    say("control: the default route again{}, to measure the drift between trials{}\n",
        study.lanes.size() > 1 ? " on every GPU" : "", study.lanes.size() > 1 ? " and GPUs" : "");
    progress.beginStep("control", "control trial (the default route again, for the drift)");
    std::vector<TrialJob> jobs;
    for (const Lane& lane : study.lanes) {
      jobs.push_back({.route = study.baseline,
                      .tag = jobs.empty() ? "control" : fmt::format("control-gpu{}", lane.gpu),
                      .iteration = baseRecord->iteration,
                      .phase = 1});
    }
    std::map<std::string, TrialRun> controls;  // by tag
    bool stopped = false;
    Status ran = runOnLanes(
        study, jobs, stop, deadline, [&](const TrialJob&, const Lane&) { return true; },
        [&](const TrialJob& job, Result<TrialRun> run) -> Status {
          if (!run.isOk()) return run.status();
          stopped |= run->stopped;
          controls[job.tag] = std::move(*run);
          return Status::ok();
        });
    progress.endStep();
    KILN_RETURN_IF_ERROR(ran);
    if (stopped) {
      if (stop.load())
        interrupted = true;
      else
        outOfTime = true;
    } else {
      if (study.lanes.size() > 1) {
        json others = json::array();
        for (const TrialJob& job : jobs) {
          if (job.tag == "control") continue;
          json record = toJson(controls.at(job.tag).record);
          record["gpu"] = controls.at(job.tag).gpu;
          others.push_back(std::move(record));
        }
        KILN_RETURN_IF_ERROR(recordedOrStop(
            store->setHeaderField("control_other_gpus", others.dump()), "the control trials"));
      }
      KILN_RETURN_IF_ERROR(recordedOrStop(
          store->setHeaderField("control", toJson(controls.at("control").record).dump()),
          "the control trial"));
    }
  }
  const ControlTrials controls = controlTrials(store->header());
  const std::optional<TrialRecord>& controlRecord = controls.first;
  const auto& otherControls = controls.others;
  if (const std::optional<double> measured = controlDrift(baseRecord, controls)) {
    drift = *measured;
    const double base = baseRecord->timing->summary.median;
    const double firstMove = std::abs(controlRecord->timing->summary.median - base) / base;
    say("control: default median {:.4f} ms, then {:.4f} ms{}: drift {:.2f}%{}\n", base,
        controlRecord->timing->summary.median,
        otherControls.empty() ? "" : fmt::format(" (gpu {})", study.lanes.front().gpu),
        100 * firstMove, otherControls.empty() ? ", the margin a gain must also clear" : "");
    json perGpu = json::array();
    for (const auto& [gpu, other] : otherControls) {
      if (!eligible(&other)) {
        say("control: on gpu {} the default route did not complete ({}: {})\n", gpu,
            trialStatusName(other.status), other.message);
        continue;
      }
      say("control: default median {:.4f} ms on gpu {}: {:.2f}% from the first trial\n",
          other.timing->summary.median, gpu,
          100 * std::abs(other.timing->summary.median - base) / base);
      perGpu.push_back({{"gpu", gpu}, {"control_median_ms", other.timing->summary.median}});
    }
    if (!otherControls.empty()) {
      say("control: drift {:.2f}% between trials and GPUs, the margin a gain must also clear\n",
          100 * drift);
    }
    json fields = {{"default_median_ms", base},
                   {"control_median_ms", controlRecord->timing->summary.median},
                   {"drift", drift}};
    if (!perGpu.empty()) fields["other_gpus"] = perGpu;
    progress.event("control", fields);
  } else if (controlRecord) {
    say("control: the default route's second trial did not complete ({}: {}); no drift margin\n",
        trialStatusName(controlRecord->status), controlRecord->message);
  }

  SecondPhase second;
  if (options.search == SearchMode::kMixed && !interrupted && !outOfTime) {
    second = planSecondPhase(study.expression, records, drift, options.mixedMinGain,
                             options.mixedMaxRoutes);
    say("phase two: {} route{} over {}{}\n", second.routes.size(),
        second.routes.size() == 1 ? "" : "s",
        second.knobs.empty() ? "no knobs" : fmt::format("{}", fmt::join(second.knobs, " ")),
        second.note.empty() ? "" : " (" + second.note + ")");
    progress.event(
        "phase_two_plan",
        {{"routes", second.routes.size()}, {"knobs", second.knobs}, {"note", second.note}});
    KILN_RETURN_IF_ERROR(runPhase(second.routes, 2));
  }

  if (interrupted) {
    say("\nstopped: {} trials recorded, {} routes of the planned phases remain{}\n", records.size(),
        remainingCount,
        options.search == SearchMode::kMixed ? " (phase two is planned after phase one)" : "");
    if (!resumeCommand.empty()) {
      say("resume with: {}\n", resumeCommand);
    } else {
      say("(no --cache was given, so this run cannot be resumed)\n");
    }
    progress.event("stopped", {{"recorded", records.size()},
                               {"remaining", remainingCount},
                               {"resume", resumeCommand},
                               {"exit_code", kTuneExitInterrupted}});
    return kTuneExitInterrupted;
  }

  // ---- decision ------------------------------------------------------------------------------
  Result<Conclusion> concluded =
      concludeStudy(study, *store, records, drift, outOfTime, remainingCount, degenerateNote, stop,
                    deadline, progress);
  if (!concluded.isOk() && concluded.status().code() == StatusCode::kIo) {
    return recordedOrStop(concluded.status(), "the finalist round");
  }
  KILN_ASSIGN_OR_RETURN(Conclusion conclusion, std::move(concluded));
  if (conclusion.stopped) {
    say("\nstopped during the finalist round: every trial is recorded; resume with: {}\n",
        resumeCommand.empty() ? "(not resumable without --cache)" : resumeCommand);
    progress.event("stopped", {{"recorded", records.size()},
                               {"remaining", 0},
                               {"resume", resumeCommand},
                               {"exit_code", kTuneExitInterrupted}});
    return kTuneExitInterrupted;
  }
  Decision& decision = conclusion.decision;
  const std::vector<ComparisonRecord>& comparisons = conclusion.comparisons;
  const bool keepTrialFiles = conclusion.keepTrialFiles;
  const bool harnessFailed = conclusion.harnessFailed;
  const TrialRecord* base = findRecord(records, study.baseline);

  // ---- outputs -------------------------------------------------------------------------------
  const TrialRecord* winner = decision.winner ? findRecord(records, *decision.winner) : nullptr;
  ReportInput report{
      .options = &options,
      .header = &store->header(),
      .records = &records,
      .comparisons = &comparisons,
      .decision = &decision,
      .secondPhaseKnobs = second.knobs,
      .secondPhaseNote = second.note,
      .generatedReferences = study.generatedReferences,
      .elapsedSeconds = std::chrono::duration<double>(Clock::now() - started).count(),
      .control = controlRecord ? &*controlRecord : nullptr,
      .drift = drift};
  say("\n{}", summaryText(report));
  if (winner && !options.saveEngine.empty()) {
    KILN_RETURN_IF_ERROR(copyEngine(*winner, options.saveEngine));
    json manifest = manifestJson(report, *winner, base, versionsJson(), target);
    manifest["engine"] = {{"file", fs::absolute(options.saveEngine).string()},
                          {"hash", winner->engineHash}};
    KILN_RETURN_IF_ERROR(
        writeFileAtomically(manifestPathFor(options.saveEngine), manifest.dump(2) + "\n"));
    say("saved the winning engine to {} and its manifest to {}\n", options.saveEngine.string(),
        manifestPathFor(options.saveEngine).string());
  }
  fs::path reportPath = options.report;
  if (reportPath.empty() && !options.saveEngine.empty()) {
    reportPath = fs::path(options.saveEngine).replace_extension(".report.md");
  }
  if (!reportPath.empty()) {
    KILN_RETURN_IF_ERROR(writeFileAtomically(reportPath, isHtmlReportPath(reportPath.string())
                                                             ? htmlReport(report)
                                                             : markdownReport(report)));
    say("wrote the report to {}\n", reportPath.string());
  }
  if (!options.saveAllEngines.empty()) {
    fs::create_directories(options.saveAllEngines);
    json index = json::array();
    for (const auto& record : records) {
      if (record.enginePath.empty()) continue;
      const std::string name =
          fmt::format("{:04}-{}.kiln", record.iteration, knobs::stableHash(record.route));
      KILN_RETURN_IF_ERROR(copyEngine(record, options.saveAllEngines / name));
      index.push_back({{"file", name},
                       {"route", record.route},
                       {"status", trialStatusName(record.status)},
                       {"median_ms", record.timing ? record.timing->summary.median : 0.0}});
    }
    KILN_RETURN_IF_ERROR(
        writeFileAtomically(options.saveAllEngines / "index.json", index.dump(1) + "\n"));
    say("kept {} engines in {}\n", index.size(), options.saveAllEngines.string());
  }
  if (!decision.provisional) {
    KILN_RETURN_IF_ERROR(recordedOrStop(
        store->setHeaderField("decision", decisionJson(decision).dump()), "the decision"));
    KILN_RETURN_IF_ERROR(
        recordedOrStop(store->setHeaderField("finished_at", isoNow()), "the decision"));
    // The candidates' engines and trial folders were only needed until the decision.
    std::error_code ignored;
    if (!keepTrialFiles) fs::remove_all(study.workDir / "engines", ignored);
    if (!keepTrialFiles) fs::remove_all(study.workDir / "trials", ignored);
  } else if (!resumeCommand.empty()) {
    say("the run is incomplete; finish it with: {}\n", resumeCommand);
  }
  const int exitCode = harnessFailed     ? 3  // as for an internal error; --continue completes it
                       : decision.winner ? 0
                                         : 1;
  json done = decisionJson(decision);
  done["exit_code"] = exitCode;
  done["trials"] = records.size();
  if (!reportPath.empty()) done["report"] = reportPath.string();
  if (winner && !options.saveEngine.empty()) done["engine"] = options.saveEngine.string();
  progress.event("done", std::move(done));
  return exitCode;
}

}  // namespace kiln::tune
