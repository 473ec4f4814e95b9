// Trials: the child's work (build, save, reload, run, time) and the parent's process handling
// (fork/exec under limits, timeouts, stopping, classification inputs).
#include "kiln/tune/trial.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <thread>

#include "kiln/base/file.h"
#include "kiln/base/version.h"
#include "kiln/engine/builder.h"
#include "kiln/engine/engine_file.h"
#include "kiln/ir/npy.h"
#include "kiln/onnx/import.h"
#if KILN_HAVE_CUDA
#include "kiln/backends/cuda/plan.h"
#include "kiln/backends/cuda/timing_loop.h"
#endif

namespace kiln::tune {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

FaultInjector& faultInjector() {
  static FaultInjector injector;
  return injector;
}

// Reads one input set (an .npz written by the tuner) in the graph's input order.
Result<std::vector<ir::Tensor>> readInputSet(const std::filesystem::path& path,
                                             const ir::Graph& graph) {
  KILN_ASSIGN_OR_RETURN(ir::NamedTensors named, ir::readNpz(path));
  std::vector<ir::Tensor> inputs;
  for (const ir::Value* input : graph.inputs) {
    auto it = std::find_if(named.begin(), named.end(),
                           [&](const auto& entry) { return entry.first == input->name; });
    if (it == named.end())
      return invalidInput("{} has no array for input '{}'", path.string(), input->name);
    inputs.push_back(it->second);
  }
  return inputs;
}

}  // namespace

Status runAsTimed(const cpu::Plan& plan, const knobs::Route& route,
                  const std::vector<ir::Tensor>& inputs) {
  if (faultInjector().beforeRun) faultInjector().beforeRun(route);
  return plan.run(inputs).status();
}

Result<std::vector<ir::Tensor>> runForOutputs(const cpu::Plan& plan, const knobs::Route& route,
                                              const std::vector<ir::Tensor>& inputs) {
  KILN_ASSIGN_OR_RETURN(std::vector<ir::Tensor> outputs, plan.run(inputs));
  if (faultInjector().onOutputs) faultInjector().onOutputs(route, outputs);
  return outputs;
}

namespace {

// Warm-up, then runs until both the minimum count and the minimum duration are reached.
Status runOnce(const cpu::Plan& plan, const knobs::Route& route,
               const std::vector<ir::Tensor>& inputs) {
  return runAsTimed(plan, route, inputs);
}

Result<std::vector<double>> timeRuns(const cpu::Plan& plan, const knobs::Route& route,
                                     const std::vector<ir::Tensor>& inputs,
                                     const TimingSettings& timing) {
  const auto warmUpEnd = Clock::now() + std::chrono::duration<double, std::milli>(timing.warmUpMs);
  do {
    KILN_RETURN_IF_ERROR(runOnce(plan, route, inputs));
  } while (Clock::now() < warmUpEnd);
  std::vector<double> samples;
  const auto start = Clock::now();
  while (static_cast<int>(samples.size()) < timing.minIterations ||
         Clock::now() - start < std::chrono::duration<double>(timing.minSeconds)) {
    const auto begin = Clock::now();
    KILN_RETURN_IF_ERROR(runOnce(plan, route, inputs));
    samples.push_back(std::chrono::duration<double, std::milli>(Clock::now() - begin).count());
  }
  return samples;
}

TimingSettings timingFromJson(const json& j) {
  TimingSettings timing;
  timing.warmUpMs = j.at("warmup_ms").get<double>();
  timing.minIterations = j.at("min_iterations").get<int>();
  timing.minSeconds = j.at("min_seconds").get<double>();
  return timing;
}

// A built trial's second half, on either backend: runs every input set and saves its outputs,
// then times the first set. A failure of the route's plan is a "run-error" in `result`.
using RunFunction = std::function<Result<std::vector<ir::Tensor>>(const std::vector<ir::Tensor>&)>;
using TimeFunction = std::function<Result<std::vector<double>>(const std::vector<ir::Tensor>&)>;

Result<json> runAndTime(const json& request, const ir::Graph& graph, const knobs::Route& route,
                        const std::filesystem::path& outputsDir, json result,
                        const RunFunction& run, const TimeFunction& time) {
  json outputFiles = json::array();
  std::vector<ir::Tensor> firstInputs;
  const json& inputSets = request.at("inputs");
  for (size_t set = 0; set < inputSets.size(); ++set) {
    KILN_ASSIGN_OR_RETURN(std::vector<ir::Tensor> inputs,
                          readInputSet(inputSets[set].get<std::string>(), graph));
    auto outputs = run(inputs);
    if (!outputs.isOk()) {
      result["status"] = "run-error";
      result["message"] = outputs.status().message();
      return result;
    }
    if (faultInjector().onOutputs) faultInjector().onOutputs(route, *outputs);
    ir::NamedTensors named;
    for (size_t o = 0; o < outputs->size(); ++o) {
      named.emplace_back(graph.outputs[o]->name, (*outputs)[o]);
    }
    const std::filesystem::path file = outputsDir / fmt::format("outputs_{}.npz", set);
    KILN_RETURN_IF_ERROR(ir::writeNpz(file, named));
    outputFiles.push_back(file.string());
    if (set == 0) firstInputs = std::move(inputs);
  }
  result["outputs"] = outputFiles;
  auto samples = time(firstInputs);
  if (!samples.isOk()) {
    result["status"] = "run-error";
    result["message"] = samples.status().message();
    return result;
  }
  result["samples"] = *samples;
  return result;
}

#if KILN_HAVE_CUDA
// A route's CUDA plan, built and prepared on the GPU (weights uploaded, library algorithms
// chosen, generated kernels compiled, the CUDA graph captured), with what each stage cost.
struct CudaTrialPlan {
  CudaBuild build;
  knobs::Route route;
  double lowerMs = 0;    // import, passes and lowering
  double prepareMs = 0;  // Plan::initialize
};

// Every failure here is the route's (a build error), not the harness's.
Result<CudaTrialPlan> buildCudaPlan(const json& request, const std::string& routeText) {
  const auto start = Clock::now();
  onnx::ImportOptions importOptions;
  KILN_ASSIGN_OR_RETURN(importOptions.inputShapes,
                        onnx::parseShapeSpec(request.at("shapes").get<std::string>()));
  KILN_ASSIGN_OR_RETURN(onnx::Model imported,
                        onnx::importModel(request.at("model").get<std::string>(), importOptions));
  BuilderConfig config;
  KILN_RETURN_IF_ERROR(config.setBuildRoute(routeText));
  config.timingCacheFile = request.value("timing_cache", std::string());
  KILN_ASSIGN_OR_RETURN(CudaBuild build, buildCuda(std::move(imported.graph), config));
  CudaTrialPlan trial{std::move(build), config.route()};
  const auto lowered = Clock::now();
  trial.lowerMs = std::chrono::duration<double, std::milli>(lowered - start).count();
  KILN_RETURN_IF_ERROR(trial.build.plan.initialize().withContext("preparing the plan on the GPU"));
  trial.prepareMs = std::chrono::duration<double, std::milli>(Clock::now() - lowered).count();
  return trial;
}

// GPU time of runs enqueued back to back, ten at a time, between CUDA events (the CUDA graph's
// replay where the plan has one; the inputs are uploaded before each batch, outside the events).
constexpr int kCudaBatch = 10;

Result<std::vector<double>> timeCudaRuns(cuda::Plan& plan, const std::vector<ir::Tensor>& inputs,
                                         const TimingSettings& timing) {
  cuda::TimingLoop loop;
  loop.batch.runs = kCudaBatch;
  loop.warmUpMs = timing.warmUpMs;
  loop.minRuns = timing.minIterations;
  loop.minSeconds = timing.minSeconds;
  KILN_ASSIGN_OR_RETURN(cuda::TimedRuns timed, cuda::timeRuns(plan, inputs, loop));
  return std::move(timed.milliseconds);
}

// A CUDA trial: no engine file (a plan lives in the process that built it), so the route's plan
// is built here, run on every input set and timed on the first.
Result<json> runCudaBuildRequest(const json& request) {
  json result = {{"status", "ok"}, {"message", ""}};
  const std::string routeText = request.at("route").get<std::string>();
  const std::filesystem::path outputsDir = request.at("outputs_dir").get<std::string>();
  const TimingSettings timing = timingFromJson(request.at("timing"));
  auto trial = buildCudaPlan(request, routeText);
  if (!trial.isOk()) {
    result["status"] = "build-error";
    result["message"] = trial.status().message();
    return result;
  }
  result["build_ms"] = trial->lowerMs + trial->prepareMs;
  cuda::Plan& plan = trial->build.plan;
  result["build"] = {{"lower_ms", trial->lowerMs},
                     {"prepare_ms", trial->prepareMs},
                     {"generated_kernels", plan.generatedKernels()},
                     {"nvrtc_ms", plan.codegenMilliseconds()},
                     {"timing_cache_hits", plan.timingCacheHits()},
                     {"timed_layers", plan.timingCacheMisses()},
                     {"graph", plan.usesGraph()}};
  if (faultInjector().afterBuild) faultInjector().afterBuild(trial->route);
  return runAndTime(
      request, plan.graph(), trial->route, outputsDir, result,
      [&](const std::vector<ir::Tensor>& inputs) { return plan.run(inputs); },
      [&](const std::vector<ir::Tensor>& inputs) { return timeCudaRuns(plan, inputs, timing); });
}
#endif

// The "build" request: what one candidate route's trial does.
Result<json> runBuildRequest(const json& request) {
#if KILN_HAVE_CUDA
  if (request.value("backend", std::string("cpu")) == "cuda") return runCudaBuildRequest(request);
#else
  if (request.value("backend", std::string("cpu")) == "cuda") {
    return json{{"status", "build-error"},
                {"message", "this kiln was built without the CUDA backend"}};
  }
#endif
  json result = {{"status", "ok"}, {"message", ""}};
  const std::filesystem::path model = request.at("model").get<std::string>();
  const std::string routeText = request.at("route").get<std::string>();
  const std::filesystem::path enginePath = request.at("engine").get<std::string>();
  const std::filesystem::path outputsDir = request.at("outputs_dir").get<std::string>();
  const TimingSettings timing = timingFromJson(request.at("timing"));

  auto buildFailure = [&](const Status& status) {
    result["status"] = "build-error";
    result["message"] = status.message();
    return result;
  };
  const auto buildStart = Clock::now();
  onnx::ImportOptions importOptions;
  KILN_ASSIGN_OR_RETURN(importOptions.inputShapes,
                        onnx::parseShapeSpec(request.at("shapes").get<std::string>()));
  KILN_ASSIGN_OR_RETURN(std::string bytes, readFileBytes(model));
  auto imported = onnx::importModel(model, importOptions);
  if (!imported.isOk()) return buildFailure(imported.status());
  BuilderConfig config;
  if (Status s = config.setBuildRoute(routeText); !s.isOk()) return buildFailure(s);
  EngineContents contents;
  contents.kilnVersion = std::string(kKilnVersion);
  contents.modelHash = modelHashOf(bytes);
  for (const ir::Value* input : imported->graph.inputs) {
    contents.inputShapes[input->name] = input->shape.dims();
  }
  auto built = buildCpu(std::move(imported->graph), config);
  if (!built.isOk()) return buildFailure(built.status());
  contents.route = config.getBuildRoute();
  contents.plan = &built->plan;
  if (Status s = saveEngine(enginePath, contents); !s.isOk()) return buildFailure(s);
  result["build_ms"] = std::chrono::duration<double, std::milli>(Clock::now() - buildStart).count();
  if (faultInjector().afterBuild) faultInjector().afterBuild(config.route());

  // What is run and timed is the engine file, as a deployment would load it.
  auto engine = loadEngine(enginePath);
  if (!engine.isOk()) return buildFailure(engine.status().withContext("reloading the engine"));
  KILN_ASSIGN_OR_RETURN(std::string engineBytes, readFileBytes(enginePath));
  result["engine_hash"] = "fnv1a64:" + knobs::stableHash(engineBytes);

  const cpu::Plan& plan = engine->plan;
  return runAndTime(
      request, plan.graph(), config.route(), outputsDir, result,
      [&](const std::vector<ir::Tensor>& inputs) { return plan.run(inputs); },
      [&](const std::vector<ir::Tensor>& inputs) {
        return timeRuns(plan, config.route(), inputs, timing);
      });
}

#if KILN_HAVE_CUDA
// The finalist round on the GPU: every route's plan built again and prepared in this one process
// (the default's first), then one batch of each per round, the starting plan rotating.
Result<json> runCudaInterleaveRequest(const json& request) {
  const TimingSettings timing = timingFromJson(request.at("timing"));
  std::vector<CudaTrialPlan> plans;
  for (const json& route : request.at("routes")) {
    auto plan = buildCudaPlan(request, route.get<std::string>());
    if (!plan.isOk()) {
      return json{{"status", "build-error"},
                  {"message",
                   plan.status()
                       .withContext(fmt::format("rebuilding route '{}'", route.get<std::string>()))
                       .message()}};
    }
    plans.push_back(std::move(plan).value());
  }
  const std::filesystem::path inputPath = request.at("inputs").get<std::string>();
  std::vector<std::vector<ir::Tensor>> inputs;
  for (const CudaTrialPlan& plan : plans) {
    KILN_ASSIGN_OR_RETURN(auto set, readInputSet(inputPath, plan.build.plan.graph()));
    inputs.push_back(std::move(set));
  }
  TimingSettings warmUp = timing;
  warmUp.minIterations = 0;
  warmUp.minSeconds = 0;
  for (size_t p = 0; p < plans.size(); ++p) {
    KILN_RETURN_IF_ERROR(timeCudaRuns(plans[p].build.plan, inputs[p], warmUp).status());
  }
  const cuda::TimingOptions batch{.warmUpRuns = 0, .runs = kCudaBatch, .includeCopies = false};
  std::vector<std::vector<double>> samples(plans.size());
  const auto start = Clock::now();
  const size_t count = plans.size();
  for (size_t round = 0;
       static_cast<int>(round) * kCudaBatch < timing.minIterations ||
       Clock::now() - start < std::chrono::duration<double>(timing.minSeconds * count);
       ++round) {
    for (size_t k = 0; k < count; ++k) {
      const size_t p = (round + k) % count;
      KILN_ASSIGN_OR_RETURN(std::vector<double> ms, plans[p].build.plan.time(inputs[p], batch));
      samples[p].insert(samples[p].end(), ms.begin(), ms.end());
    }
  }
  return json{{"status", "ok"}, {"message", ""}, {"samples", samples}};
}
#endif

// The "interleave" request: the finalist round. One run of each engine per round, the starting
// engine rotating, so that every engine sees the same machine state on average.
Result<json> runInterleaveRequest(const json& request) {
  if (request.value("backend", std::string("cpu")) == "cuda") {
#if KILN_HAVE_CUDA
    return runCudaInterleaveRequest(request);
#else
    return json{{"status", "build-error"},
                {"message", "this kiln was built without the CUDA backend"}};
#endif
  }
  const TimingSettings timing = timingFromJson(request.at("timing"));
  std::vector<LoadedEngine> engines;
  std::vector<knobs::Route> routes;
  if (request.contains("routes")) {
    // No engine files here (a worker of a shared store, the trials ran elsewhere): each route's
    // engine is built again in this process, the default's first.
    onnx::ImportOptions importOptions;
    KILN_ASSIGN_OR_RETURN(importOptions.inputShapes,
                          onnx::parseShapeSpec(request.at("shapes").get<std::string>()));
    for (const json& routeText : request.at("routes")) {
      auto built = [&]() -> Result<LoadedEngine> {
        KILN_ASSIGN_OR_RETURN(
            onnx::Model imported,
            onnx::importModel(request.at("model").get<std::string>(), importOptions));
        BuilderConfig config;
        KILN_RETURN_IF_ERROR(config.setBuildRoute(routeText.get<std::string>()));
        KILN_ASSIGN_OR_RETURN(CpuBuild build, buildCpu(std::move(imported.graph), config));
        LoadedEngine engine;
        engine.route = config.getBuildRoute();
        engine.plan = std::move(build.plan);
        return engine;
      }();
      if (!built.isOk()) {
        return json{{"status", "build-error"},
                    {"message", built.status()
                                    .withContext(fmt::format("rebuilding route '{}'",
                                                             routeText.get<std::string>()))
                                    .message()}};
      }
      KILN_ASSIGN_OR_RETURN(knobs::Route route, knobs::Route::parse(built->route));
      routes.push_back(std::move(route));
      engines.push_back(std::move(built).value());
    }
  }
  for (const json& path : request.value("engines", json::array())) {
    auto engine = loadEngine(path.get<std::string>());
    if (!engine.isOk()) {
      return json{{"status", "build-error"}, {"message", engine.status().message()}};
    }
    const size_t index = engines.size();
    if (request.contains("engine_hashes")) {
      KILN_ASSIGN_OR_RETURN(std::string bytes, readFileBytes(path.get<std::string>()));
      const std::string expected = request.at("engine_hashes").at(index).get<std::string>();
      if ("fnv1a64:" + knobs::stableHash(bytes) != expected) {
        return json{{"status", "build-error"},
                    {"message", fmt::format("{} changed since its trial (hash {} expected)",
                                            path.get<std::string>(), expected)}};
      }
    }
    KILN_ASSIGN_OR_RETURN(knobs::Route route, knobs::Route::parse(engine->route));
    routes.push_back(std::move(route));
    engines.push_back(std::move(engine).value());
  }
  const std::filesystem::path inputPath = request.at("inputs").get<std::string>();
  std::vector<std::vector<ir::Tensor>> inputs;
  for (const LoadedEngine& engine : engines) {
    KILN_ASSIGN_OR_RETURN(auto set, readInputSet(inputPath, engine.plan.graph()));
    inputs.push_back(std::move(set));
  }
  for (size_t e = 0; e < engines.size(); ++e) {
    TimingSettings warmUp = timing;
    warmUp.minIterations = 0;
    warmUp.minSeconds = 0;
    KILN_RETURN_IF_ERROR(timeRuns(engines[e].plan, routes[e], inputs[e], warmUp).status());
  }
  std::vector<std::vector<double>> samples(engines.size());
  const auto start = Clock::now();
  const size_t count = engines.size();
  for (size_t round = 0;
       static_cast<int>(round) < timing.minIterations ||
       Clock::now() - start < std::chrono::duration<double>(timing.minSeconds * count);
       ++round) {
    for (size_t k = 0; k < count; ++k) {
      const size_t e = (round + k) % count;
      const auto begin = Clock::now();
      KILN_RETURN_IF_ERROR(runOnce(engines[e].plan, routes[e], inputs[e]));
      samples[e].push_back(std::chrono::duration<double, std::milli>(Clock::now() - begin).count());
    }
  }
  return json{{"status", "ok"}, {"message", ""}, {"samples", samples}};
}

}  // namespace

void setFaultInjector(FaultInjector injector) { faultInjector() = std::move(injector); }
const FaultInjector& faultInjection() { return faultInjector(); }

namespace {

// --trial-memory-limit, applied by the trial process to itself once started: RLIMIT_DATA (heap
// and private writable mappings, thread stacks among them) at what the process already holds
// plus the limit. RLIMIT_AS counted every shared library's text (about 900 MiB in a CUDA build),
// and a limit set before exec counted the libraries' start-up too: OpenBLAS starts a thread with
// its buffers per core when it loads, so on the 16-core H100 machine kiln could not start under
// 2 GiB of RLIMIT_DATA (2026-12-06) while 1 GiB fits on 2 cores. The limit is what the trial
// itself may allocate, the same on every machine.
Status limitMemory(uint64_t bytes) {
  if (bytes == 0) return Status::ok();
  std::ifstream status("/proc/self/status");
  uint64_t dataKiB = 0;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmData:", 0) == 0) dataKiB = std::stoull(line.substr(7));
  }
  const rlimit limit{dataKiB * 1024 + bytes, dataKiB * 1024 + bytes};
  if (::setrlimit(RLIMIT_DATA, &limit) != 0) {
    return ioError("cannot set the trial's memory limit: {}", std::strerror(errno));
  }
  return Status::ok();
}

}  // namespace

int runTrialRequest(const std::filesystem::path& requestPath) {
  json request;
  std::filesystem::path resultPath;
  try {
    auto text = readFileBytes(requestPath);
    if (!text.isOk()) {
      std::fprintf(stderr, "kiln __trial: %s\n", text.status().message().c_str());
      return kTrialExitBadRequest;
    }
    request = json::parse(*text);
    resultPath = request.at("result").get<std::string>();
  } catch (const json::exception& e) {
    std::fprintf(stderr, "kiln __trial: %s: %s\n", requestPath.c_str(), e.what());
    return kTrialExitBadRequest;
  }
  try {
    if (Status s = limitMemory(request.value("memory_limit_bytes", uint64_t{0})); !s.isOk()) {
      std::fprintf(stderr, "kiln __trial: %s\n", s.message().c_str());
      return kTrialExitBadRequest;
    }
    const std::string mode = request.at("mode").get<std::string>();
    Result<json> result =
        mode == "interleave" ? runInterleaveRequest(request) : runBuildRequest(request);
    json out = result.isOk()
                   ? *result
                   : json{{"status", "run-error"}, {"message", result.status().message()}};
    // The GPUs this trial could see: the tuner pins each trial of --gpus to one, and checks.
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    out["visible_devices"] = visible ? json(visible) : json(nullptr);
    if (Status s = writeFileAtomically(resultPath, out.dump()); !s.isOk()) {
      std::fprintf(stderr, "kiln __trial: %s\n", s.message().c_str());
      return 1;
    }
    return 0;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "kiln __trial: out of memory\n");
    return kTrialExitOutOfMemory;
  } catch (const json::exception& e) {
    std::fprintf(stderr, "kiln __trial: bad request %s: %s\n", requestPath.c_str(), e.what());
    return kTrialExitBadRequest;
  }
}

Result<std::filesystem::path> currentExecutable() {
  // The magic link itself, not what it points to: exec'd from the forked child, it names the
  // very binary that is running even if a rebuild has since replaced or deleted the file.
  if (!std::filesystem::exists("/proc/self/exe")) {
    return ioError("cannot find the running kiln binary: /proc/self/exe is missing");
  }
  return std::filesystem::path("/proc/self/exe");
}

Result<std::string> fileHash(const std::filesystem::path& path) {
  KILN_ASSIGN_OR_RETURN(std::string bytes, readFileBytes(path));
  return "fnv1a64:" + knobs::stableHash(bytes);
}

namespace {

std::string tailOf(const std::filesystem::path& path, size_t bytes) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return "";
  file.seekg(0, std::ios::end);
  const std::streamoff size = file.tellg();
  const std::streamoff start = size > static_cast<std::streamoff>(bytes) ? size - bytes : 0;
  file.seekg(start);
  std::string text(static_cast<size_t>(size - start), '\0');
  file.read(text.data(), static_cast<std::streamsize>(text.size()));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

Result<ChildOutcome> runChild(const std::filesystem::path& executable,
                              const std::vector<std::string>& arguments,
                              const std::filesystem::path& logPath, const ChildLimits& limits,
                              const std::atomic<bool>* stop, Clock::time_point deadline,
                              const std::vector<std::string>& environment) {
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  // Its environment is this process's, with each "NAME=value" of `environment` in place of any
  // variable of that name.
  std::vector<std::string> envStorage(environment);
  for (char** entry = environ; *entry; ++entry) {
    const std::string_view text(*entry);
    const bool replaced = std::any_of(environment.begin(), environment.end(), [&](const auto& e) {
      const size_t eq = e.find('=');
      return text.size() > eq && text.substr(0, eq + 1) == std::string_view(e).substr(0, eq + 1);
    });
    if (!replaced) envStorage.emplace_back(text);
  }
  std::vector<char*> envp;
  for (std::string& entry : envStorage) envp.push_back(entry.data());
  envp.push_back(nullptr);
  std::vector<std::string> argvStorage;
  argvStorage.push_back(executable.string());
  argvStorage.insert(argvStorage.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (std::string& arg : argvStorage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int logFd = ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (logFd < 0) {
    return ioError("cannot write the trial log {}: {}", logPath.string(), std::strerror(errno));
  }
  const int nullFd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t parent = ::getpid();
  std::fflush(nullptr);

  const auto start = Clock::now();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(logFd);
    if (nullFd >= 0) ::close(nullFd);
    return ioError("cannot start a trial process: {}", std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the tuner died before prctl took effect
    // A child in a background process group must not read the terminal.
    if (nullFd >= 0) ::dup2(nullFd, STDIN_FILENO);
    ::dup2(logFd, STDOUT_FILENO);
    ::dup2(logFd, STDERR_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also from here, so the group exists before any kill below
  ::close(logFd);
  if (nullFd >= 0) ::close(nullFd);

  // Waits without reaping (WNOWAIT), so that the child's pid, and so its process group, cannot
  // be reused by an unrelated process before the group is killed.
  auto ended = [&](int options) {
    siginfo_t info{};
    while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT | options) < 0) {
      if (errno != EINTR) return -1;
    }
    return info.si_pid == pid ? 1 : 0;
  };
  auto killAndReap = [&](int* status) {
    ::kill(-pid, SIGKILL);
    while (::waitpid(pid, status, 0) < 0 && errno == EINTR) {
    }
  };

  ChildOutcome outcome;
  int status = 0;
  auto sleepFor = std::chrono::milliseconds(1);
  while (true) {
    const int done = ended(WNOHANG);
    if (done == 1) break;
    if (done < 0) {
      const int error = errno;
      killAndReap(&status);
      return internalError("waiting for a trial process: {}", std::strerror(error));
    }
    const auto now = Clock::now();
    // A stop (signal or the run's deadline) wins over the trial's own timeout: a stopped trial
    // is not recorded, a timed-out one is.
    const bool stopped = (stop && stop->load()) || now > deadline;
    const bool timedOut = !stopped && limits.timeoutSeconds > 0 &&
                          now - start > std::chrono::duration<double>(limits.timeoutSeconds);
    if (timedOut || stopped) {
      killAndReap(&status);
      outcome.kind = timedOut ? ChildOutcome::Kind::kTimedOut : ChildOutcome::Kind::kStopped;
      outcome.seconds = std::chrono::duration<double>(Clock::now() - start).count();
      outcome.logTail = tailOf(logPath, 2000);
      return outcome;
    }
    std::this_thread::sleep_for(sleepFor);
    sleepFor = std::min(sleepFor * 2, std::chrono::milliseconds(20));
  }
  killAndReap(&status);  // the child has ended; anything it left behind in its group goes too
  outcome.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  outcome.logTail = tailOf(logPath, 2000);
  if (WIFSIGNALED(status)) {
    outcome.kind = ChildOutcome::Kind::kSignaled;
    outcome.signal = WTERMSIG(status);
  } else {
    outcome.kind = ChildOutcome::Kind::kExited;
    outcome.exitCode = WEXITSTATUS(status);
  }
  return outcome;
}

}  // namespace kiln::tune
