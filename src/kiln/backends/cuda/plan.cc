// Running a CUDA plan: device resources, constant upload, step preparation, CUDA graph capture
// and replay, and timing with CUDA events.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <set>

#include "kiln/backends/cuda/codegen/fused_codegen.h"
#include "kiln/backends/cuda/codegen/nvrtc.h"
#include "kiln/backends/cuda/plan.h"
#include "kiln/base/version.h"

namespace kiln::cuda {

Result<std::byte*> PrepareContext::allocate(int64_t bytes, std::string_view what) {
  KILN_ASSIGN_OR_RETURN(DeviceMemory memory, DeviceMemory::allocate(bytes, what));
  std::byte* data = memory.data();
  keep->push_back(std::move(memory));
  return data;
}

std::optional<nlohmann::json> PrepareContext::cachedChoice(const std::string& key) const {
  return timingCache ? timingCache->find(timingDevice, key) : std::nullopt;
}

void PrepareContext::recordChoice(const std::string& key, nlohmann::json choice) {
  ++timingMisses;
  if (timingCache) timingCache->put(timingDevice, key, std::move(choice));
}

void PrepareContext::forgetChoice(const std::string& key) {
  if (timingCache) timingCache->erase(timingDevice, key);
}

namespace {

// What a timed choice depends on besides the layer: the GPU, the driver and libraries that
// offered and ran the candidates, and kiln (which filters and orders them).
std::string timingDeviceKey(const DeviceInfo& info) {
  return fmt::format("{} sm_{}{} {} SMs, driver {}, runtime {}, cuDNN {}, cuBLASLt {}, kiln {}",
                     info.name, info.computeMajor, info.computeMinor, info.multiprocessors,
                     info.driverVersion, info.runtimeVersion, info.cudnnVersion,
                     info.cublasLtVersion, kKilnVersion);
}

}  // namespace

struct Plan::Device {
  DeviceInfo info;
  Stream stream;
  LibraryHandles handles;
  DeviceMemory arena;
  DeviceMemory weights;
  DeviceMemory workspace;
  std::vector<DeviceMemory> kept;  // steps' derived constants
  PinnedMemory staging;            // outputs, for timed runs that include copies
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t graphExec = nullptr;
  std::string graphNote;              // why the plan runs without a graph, when it does
  cudaLibrary_t generated = nullptr;  // the steps' generated kernels
  int generatedKernels = 0;
  double codegenMilliseconds = 0;
  int timingHits = 0;
  int timingMisses = 0;
  int64_t l2WindowBytes = 0;  // the persisting window set on the stream (0: none)
  // cuda.streams > 1: the auxiliary streams (stream k is aux[k - 1]), an event after each step
  // another stream waits for, and the fork and join events that tie them to the plan's stream.
  std::vector<Stream> aux;
  std::vector<Event> stepEvents;
  Event fork;
  std::vector<Event> joins;
  int64_t streamWorkspaceStride = 0;                  // each stream's slice of the workspace
  static inline std::atomic<int> persistingPlans{0};  // the process's plans with a window

  Context context() const {
    Context c;
    c.stream = stream.get();
    c.arena = arena.data();
    c.weights = weights.data();
    c.workspace = workspace.data();
    c.workspaceBytes = workspace.bytes();
    c.cublasLt = handles.cublasLt();
    c.cudnn = handles.cudnn();
    return c;
  }
  // What a step on stream `k` sees: that stream, and its own slice of the workspace.
  Context contextOn(int k) const {
    Context c = context();
    if (k == 0 && aux.empty()) return c;
    if (k > 0) c.stream = aux[static_cast<size_t>(k - 1)].get();
    c.workspace = workspace.data() ? workspace.data() + k * streamWorkspaceStride : nullptr;
    c.workspaceBytes = streamWorkspaceStride;
    return c;
  }
  ~Device() {
    if (graphExec) cudaGraphExecDestroy(graphExec);
    if (graph) cudaGraphDestroy(graph);
    if (generated) cudaLibraryUnload(generated);
    // The persisting lines and the set-aside belong to the context, not the plan: the last
    // plan of the process to use them gives them back, so later plans see the whole L2 again.
    if (l2WindowBytes > 0 && --persistingPlans == 0) {
      cudaCtxResetPersistingL2Cache();
      cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, 0);
    }
  }
};

Plan::Plan() = default;
Plan::~Plan() {
  // Work still queued reads the arena: let it finish before the memory goes.
  if (device_ && device_->stream.get()) cudaStreamSynchronize(device_->stream.get());
}
Plan::Plan(Plan&&) noexcept = default;
Plan& Plan::operator=(Plan&&) noexcept = default;

int64_t Plan::workspaceBytes() const { return device_ ? device_->workspace.bytes() : 0; }

bool Plan::usesGraph() const { return device_ && device_->graphExec != nullptr; }
std::string Plan::graphNote() const { return device_ ? device_->graphNote : ""; }
int Plan::generatedKernels() const { return device_ ? device_->generatedKernels : 0; }
int Plan::timingCacheHits() const { return device_ ? device_->timingHits : 0; }
int Plan::timingCacheMisses() const { return device_ ? device_->timingMisses : 0; }
int64_t Plan::l2WindowBytes() const { return device_ ? device_->l2WindowBytes : 0; }

namespace {

// Marks accesses to `buffer` from kernels on `stream` (and the graph captured from it) as
// persisting in the L2 cache: the device's largest set-aside for persisting lines, and a window
// over the buffer's first bytes up to the device's largest window, hit ratio scaled so the
// persisting part fits the set-aside. Returns the window's bytes (0 where the device has none).
Result<int64_t> persistInL2(const DeviceMemory& buffer, const DeviceInfo& info, cudaStream_t stream,
                            int limitDivisor) {
  int maxPersisting = 0, maxWindow = 0;
  KILN_CUDA_CHECK(
      cudaDeviceGetAttribute(&maxPersisting, cudaDevAttrMaxPersistingL2CacheSize, info.ordinal));
  KILN_CUDA_CHECK(
      cudaDeviceGetAttribute(&maxWindow, cudaDevAttrMaxAccessPolicyWindowSize, info.ordinal));
  if (maxPersisting <= 0 || maxWindow <= 0 || buffer.bytes() == 0) return int64_t{0};
  maxPersisting /= limitDivisor;  // cuda.l2.persist.limit
  KILN_CUDA_CHECK(
      cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, static_cast<size_t>(maxPersisting)));
  const int64_t window = std::min<int64_t>(buffer.bytes(), maxWindow);
  cudaStreamAttrValue value{};
  value.accessPolicyWindow.base_ptr = buffer.data();
  value.accessPolicyWindow.num_bytes = static_cast<size_t>(window);
  value.accessPolicyWindow.hitRatio =
      static_cast<float>(std::min(1.0, static_cast<double>(maxPersisting) / window));
  value.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
  value.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
  KILN_CUDA_CHECK(cudaStreamSetAttribute(stream, cudaStreamAttributeAccessPolicyWindow, &value));
  return window;
}

}  // namespace
double Plan::codegenMilliseconds() const { return device_ ? device_->codegenMilliseconds : 0; }

// Compiles the steps' generated kernels as one program (NVRTC's fixed cost is paid once a plan,
// and equal definitions, which share a name, once), loads it and binds each step to it.
Status Plan::compileGenerated(Device& device) {
  std::set<std::string> seen;
  std::string program;
  for (const auto& step : steps_) {
    std::string code = step->generatedCode();
    if (code.empty() || !seen.insert(code).second) continue;
    program += code;
  }
  if (program.empty()) return Status::ok();
  program = codegenPreamble() + program;
  const int before = nvrtcCompilations();
  const auto start = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(
      std::string cubin,
      compileToCubin(program, "kiln_plan.cu", device.info.computeMajor, device.info.computeMinor));
  if (nvrtcCompilations() != before) {
    device.codegenMilliseconds =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  }
  device.generatedKernels = static_cast<int>(seen.size());
  KILN_CUDA_CHECK(cudaLibraryLoadData(&device.generated, cubin.data(), nullptr, nullptr, 0, nullptr,
                                      nullptr, 0));
  for (const auto& step : steps_) {
    if (step->generatedCode().empty()) continue;
    KILN_RETURN_IF_ERROR(step->bindGenerated(device.generated));
  }
  return Status::ok();
}

Status Plan::initialize() {
  if (device_) return Status::ok();
  auto device = std::make_unique<Device>();
  KILN_ASSIGN_OR_RETURN(device->info, currentDevice());
  KILN_CUDA_CHECK(cudaSetDevice(device->info.ordinal));
  KILN_ASSIGN_OR_RETURN(device->stream, Stream::create());
  KILN_ASSIGN_OR_RETURN(device->handles, LibraryHandles::create(device->stream.get()));
  KILN_ASSIGN_OR_RETURN(device->arena, DeviceMemory::allocate(arenaBytes_, "the activation arena"));
  KILN_ASSIGN_OR_RETURN(device->weights, DeviceMemory::allocate(weightBytes_, "the weights"));
  if (l2Persist_ != "off") {
    // Set before the steps prepare, so timed choices see the cache as the runs will.
    KILN_ASSIGN_OR_RETURN(device->l2WindowBytes,
                          persistInL2(l2Persist_ == "arena" ? device->arena : device->weights,
                                      device->info, device->stream.get(),
                                      l2PersistLimit_ == "quarter" ? 4
                                      : l2PersistLimit_ == "half"  ? 2
                                                                   : 1));
    if (device->l2WindowBytes > 0) ++Device::persistingPlans;
  }
  for (size_t i = 0; i < constants_.size(); ++i) {
    const ir::Tensor& tensor = *constants_[i];
    if (tensor.byteSize() == 0) continue;
    KILN_CUDA_CHECK(cudaMemcpy(device->weights.data() + constantOffsets_[i], tensor.rawData(),
                               tensor.byteSize(), cudaMemcpyHostToDevice));
  }
  // Steps prepare in order, each seeing the arena and weights (a step that times candidates may
  // write its own outputs, which nothing has read yet).
  PrepareContext prepare;
  prepare.context = device->context();
  prepare.device = &device->info;
  prepare.keep = &device->kept;
  std::shared_ptr<TimingCache> timingCache;
  if (timingCacheAllowed_) {
    KILN_ASSIGN_OR_RETURN(timingCache, TimingCache::forFile(timingCacheFile_));
    prepare.timingCache = timingCache.get();
    prepare.timingDevice = timingDeviceKey(device->info);
  }
  KILN_RETURN_IF_ERROR(compileGenerated(*device));
  int64_t workspace = 0;
  bool capturable = graphsAllowed_;
  for (const auto& step : steps_) {
    KILN_RETURN_IF_ERROR(step->prepare(prepare));
    workspace = std::max(workspace, step->workspaceBytes());
    capturable = capturable && step->capturable();
  }
  device->timingHits = prepare.timingHits;
  device->timingMisses = prepare.timingMisses;
  if (timingCache) KILN_RETURN_IF_ERROR(timingCache->save());
  if (streamCount_ > 1) {
    // Steps on different streams may run at once: each stream gets a workspace of its own.
    device->streamWorkspaceStride = (workspace + alignment_ - 1) / alignment_ * alignment_;
    workspace = device->streamWorkspaceStride * streamCount_;
    int priority = 0;  // the default, which the plan's stream has
    if (streamPriority_ == "branches") {
      int least = 0;
      KILN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &priority));
    }
    for (int k = 1; k < streamCount_; ++k) {
      KILN_ASSIGN_OR_RETURN(Stream aux, Stream::create(priority));
      device->aux.push_back(std::move(aux));
    }
    KILN_ASSIGN_OR_RETURN(device->fork, Event::create());
    for (size_t i = 0; i < steps_.size(); ++i) {
      Event event;
      if (stepSignals_[i]) {
        KILN_ASSIGN_OR_RETURN(event, Event::create());
      }
      device->stepEvents.push_back(std::move(event));
    }
    for (int k = 1; k < streamCount_; ++k) {
      KILN_ASSIGN_OR_RETURN(Event join, Event::create());
      device->joins.push_back(std::move(join));
    }
  }
  KILN_ASSIGN_OR_RETURN(device->workspace, DeviceMemory::allocate(workspace, "the workspace"));
  KILN_CUDA_CHECK(cudaStreamSynchronize(device->stream.get()));
  device_ = std::move(device);

  if (!graphsAllowed_) {
    device_->graphNote = "CUDA graphs are off (cuda.graphs=off)";
  } else if (!capturable) {
    device_->graphNote = "a step synchronises with the host (host fallback), so no CUDA graph";
  } else {
    cudaStream_t stream = device_->stream.get();
    KILN_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const Status enqueued = enqueueSteps();
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (enqueued.isOk() && ended == cudaSuccess) {
      device_->graph = graph;
      KILN_CUDA_CHECK(cudaGraphInstantiate(&device_->graphExec, graph, 0));
      if (graphUpload_) {
        KILN_CUDA_CHECK(cudaGraphUpload(device_->graphExec, stream));
        KILN_CUDA_CHECK(cudaStreamSynchronize(stream));
      }
    } else {
      // A library call that cannot be captured: run step by step, and say so.
      if (graph) cudaGraphDestroy(graph);
      cudaGetLastError();
      device_->graphNote =
          fmt::format("CUDA graph capture failed, running step by step: {}",
                      enqueued.isOk() ? cudaGetErrorString(ended) : enqueued.message());
    }
  }
  return Status::ok();
}

Status Plan::fillArena(uint8_t byte) {
  KILN_RETURN_IF_ERROR(initialize());
  if (arenaBytes_ == 0) return Status::ok();
  KILN_CUDA_CHECK(cudaMemsetAsync(device_->arena.data(), byte, static_cast<size_t>(arenaBytes_),
                                  device_->stream.get()));
  KILN_CUDA_CHECK(cudaStreamSynchronize(device_->stream.get()));
  return Status::ok();
}

Status Plan::uploadInputs(const std::vector<ir::Tensor>& inputs) {
  if (inputs.size() != inputs_.size()) {
    return invalidInput("the model has {} inputs, {} were given", inputs_.size(), inputs.size());
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].dtype() != inputs_[i].dtype || inputs[i].shape() != inputs_[i].shape) {
      return invalidInput("input '{}' must be {} {}, got {} {}", graph_->inputs[i]->name,
                          ir::dtypeName(inputs_[i].dtype), inputs_[i].shape.toString(),
                          ir::dtypeName(inputs[i].dtype()), inputs[i].shape().toString());
    }
  }
  KILN_RETURN_IF_ERROR(initialize());
  const Context context = device_->context();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].byteSize() == 0) continue;
    KILN_CUDA_CHECK(cudaMemcpyAsync(context.address(inputs_[i]), inputs[i].rawData(),
                                    inputs[i].byteSize(), cudaMemcpyHostToDevice, context.stream));
  }
  return Status::ok();
}

Status Plan::enqueueOnStreams() const {
  const Device& d = *device_;
  cudaStream_t main = d.stream.get();
  // Fork: every auxiliary stream starts after what the plan's stream holds (the inputs' upload).
  KILN_CUDA_CHECK(cudaEventRecord(d.fork.get(), main));
  for (const Stream& aux : d.aux) KILN_CUDA_CHECK(cudaStreamWaitEvent(aux.get(), d.fork.get()));
  int cudnnStream = 0;  // the stream cuDNN's handle is bound to (its calls take no stream)
  Status failed = Status::ok();
  for (size_t i = 0; i < steps_.size() && failed.isOk(); ++i) {
    const int k = stepStreams_[i];
    const Context context = d.contextOn(k);
    for (int before : stepWaits_[i]) {
      KILN_CUDA_CHECK(
          cudaStreamWaitEvent(context.stream, d.stepEvents[static_cast<size_t>(before)].get()));
    }
    if (k != cudnnStream) {
      KILN_RETURN_IF_ERROR(cudnnStatus(cudnnSetStream(context.cudnn, context.stream),
                                       "binding cuDNN's handle to a stream"));
      cudnnStream = k;
    }
    Status status = steps_[i]->enqueue(context);
    if (!status.isOk()) {
      failed = Status(status.code(), fmt::format("{} ({}): {}", steps_[i]->node->describe(),
                                                 steps_[i]->tactic, status.message()));
      break;
    }
    if (stepSignals_[i]) KILN_CUDA_CHECK(cudaEventRecord(d.stepEvents[i].get(), context.stream));
  }
  // Join, even after a failure: a capture must end with every stream back on the plan's.
  for (size_t k = 0; k < d.aux.size(); ++k) {
    KILN_CUDA_CHECK(cudaEventRecord(d.joins[k].get(), d.aux[k].get()));
    KILN_CUDA_CHECK(cudaStreamWaitEvent(main, d.joins[k].get()));
  }
  if (cudnnStream != 0) {
    KILN_RETURN_IF_ERROR(
        cudnnStatus(cudnnSetStream(d.handles.cudnn(), main), "binding cuDNN's handle to a stream"));
  }
  return failed;
}

Status Plan::enqueueSteps() const {
  if (streamCount_ > 1) return enqueueOnStreams();
  const Context context = device_->context();
  for (const auto& step : steps_) {
    Status status = step->enqueue(context);
    if (!status.isOk()) {
      return Status(status.code(), fmt::format("{} ({}): {}", step->node->describe(), step->tactic,
                                               status.message()));
    }
  }
  return Status::ok();
}

Status Plan::enqueueRun() {
  if (device_->graphExec) {
    KILN_CUDA_CHECK(cudaGraphLaunch(device_->graphExec, device_->stream.get()));
    return Status::ok();
  }
  return enqueueSteps();
}

Result<std::vector<ir::Tensor>> Plan::downloadOutputs() {
  const Context context = device_->context();
  std::vector<ir::Tensor> outputs;
  for (const BufferRef& ref : outputs_) {
    ir::Tensor out(ref.dtype, ref.shape);
    if (out.byteSize() > 0) {
      KILN_CUDA_CHECK(cudaMemcpyAsync(out.mutableRawData(), context.address(ref), out.byteSize(),
                                      cudaMemcpyDeviceToHost, context.stream));
    }
    outputs.push_back(std::move(out));
  }
  KILN_RETURN_IF_ERROR(
      cudaStatus(cudaStreamSynchronize(context.stream), "running the plan (a kernel failed)"));
  return outputs;
}

Result<std::vector<ir::Tensor>> Plan::run(const std::vector<ir::Tensor>& inputs,
                                          std::vector<double>* stepMilliseconds) {
  KILN_RETURN_IF_ERROR(uploadInputs(inputs));
  if (!stepMilliseconds) {
    KILN_RETURN_IF_ERROR(enqueueRun());
    return downloadOutputs();
  }
  // Step by step, an event before each step and after the last.
  const Context context = device_->context();
  std::vector<Event> events;
  for (size_t i = 0; i <= steps_.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(Event event, Event::create());
    events.push_back(std::move(event));
  }
  for (size_t i = 0; i < steps_.size(); ++i) {
    KILN_CUDA_CHECK(cudaEventRecord(events[i].get(), context.stream));
    Status status = steps_[i]->enqueue(context);
    if (!status.isOk()) {
      return Status(status.code(), fmt::format("{} ({}): {}", steps_[i]->node->describe(),
                                               steps_[i]->tactic, status.message()));
    }
  }
  KILN_CUDA_CHECK(cudaEventRecord(events.back().get(), context.stream));
  KILN_ASSIGN_OR_RETURN(auto outputs, downloadOutputs());
  stepMilliseconds->assign(steps_.size(), 0.0);
  for (size_t i = 0; i < steps_.size(); ++i) {
    KILN_ASSIGN_OR_RETURN((*stepMilliseconds)[i], elapsedMs(events[i], events[i + 1]));
  }
  return outputs;
}

Result<std::vector<double>> Plan::time(const std::vector<ir::Tensor>& inputs,
                                       const TimingOptions& options) {
  KILN_RETURN_IF_ERROR(uploadInputs(inputs));
  const Context context = device_->context();
  int64_t outputBytes = 0;
  for (const BufferRef& ref : outputs_) outputBytes += ref.bytes();
  if (options.includeCopies && device_->staging.bytes() < outputBytes) {
    KILN_ASSIGN_OR_RETURN(device_->staging, PinnedMemory::allocate(outputBytes));
  }
  auto oneRun = [&]() -> Status {
    if (options.includeCopies) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i].byteSize() == 0) continue;
        KILN_CUDA_CHECK(cudaMemcpyAsync(context.address(inputs_[i]), inputs[i].rawData(),
                                        inputs[i].byteSize(), cudaMemcpyHostToDevice,
                                        context.stream));
      }
    }
    KILN_RETURN_IF_ERROR(enqueueRun());
    if (options.includeCopies) {
      int64_t at = 0;
      for (const BufferRef& ref : outputs_) {
        if (ref.bytes() == 0) continue;
        KILN_CUDA_CHECK(cudaMemcpyAsync(device_->staging.data() + at, context.address(ref),
                                        ref.bytes(), cudaMemcpyDeviceToHost, context.stream));
        at += ref.bytes();
      }
    }
    return Status::ok();
  };
  for (int i = 0; i < options.warmUpRuns; ++i) KILN_RETURN_IF_ERROR(oneRun());
  KILN_CUDA_CHECK(cudaStreamSynchronize(context.stream));
  std::vector<Event> events;
  for (int i = 0; i < 2 * options.runs; ++i) {
    KILN_ASSIGN_OR_RETURN(Event event, Event::create());
    events.push_back(std::move(event));
  }
  for (int i = 0; i < options.runs; ++i) {
    KILN_CUDA_CHECK(cudaEventRecord(events[2 * i].get(), context.stream));
    KILN_RETURN_IF_ERROR(oneRun());
    KILN_CUDA_CHECK(cudaEventRecord(events[2 * i + 1].get(), context.stream));
  }
  KILN_RETURN_IF_ERROR(
      cudaStatus(cudaStreamSynchronize(context.stream), "timing the plan (a kernel failed)"));
  std::vector<double> ms;
  for (int i = 0; i < options.runs; ++i) {
    KILN_ASSIGN_OR_RETURN(double elapsed, elapsedMs(events[2 * i], events[2 * i + 1]));
    ms.push_back(elapsed);
  }
  return ms;
}

}  // namespace kiln::cuda
