// The CUDA backend's executable form of a graph: an ordered list of steps (one kernel choice per
// node, with its tactic, layout and precision), every runtime value placed in one device arena by
// the memory planner, the constants in one device weights buffer, one stream, and (where every
// step allows it) a CUDA graph captured once and replayed.
//
// Lowering (lowerToCuda) decides kernels and memory without touching a device, so plans can be
// inspected and tested anywhere; the device resources are made on the first run (or
// Plan::initialize), where steps also do their device-side preparation (library algorithm
// choice, descriptors).
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/backends/cuda/runtime.h"
#include "kiln/base/status.h"
#include "kiln/engine/timing_cache.h"
#include "kiln/ir/graph.h"
#include "kiln/knobs/route.h"

namespace kiln::cuda {

// Where one value lives while a plan runs: a range of the arena, or of the weights buffer.
struct BufferRef {
  ir::DType dtype = ir::DType::kFloat32;
  ir::Shape shape;
  int64_t offset = -1;                   // bytes into the arena; -1 for constants
  int64_t weightOffset = -1;             // bytes into the weights buffer, for constants
  const ir::Tensor* constant = nullptr;  // the host copy of a constant

  int64_t elements() const { return shape.elementCount(); }
  int64_t bytes() const { return elements() * static_cast<int64_t>(ir::dtypeSize(dtype)); }
};

// What a step sees while it is enqueued.
class Context {
 public:
  cudaStream_t stream = nullptr;
  std::byte* arena = nullptr;
  std::byte* weights = nullptr;
  std::byte* workspace = nullptr;  // the plan's scratch, workspaceBytes() of the largest step
  int64_t workspaceBytes = 0;
  cublasLtHandle_t cublasLt = nullptr;
  cudnnHandle_t cudnn = nullptr;

  std::byte* address(const BufferRef& ref) const {
    return ref.constant ? weights + ref.weightOffset : arena + ref.offset;
  }
  template <typename T>
  T* data(const BufferRef& ref) const {
    return reinterpret_cast<T*>(address(ref));
  }
};

// Device-side preparation, once per plan: a step may choose its library algorithm (timing
// candidates on `context`'s stream and buffers), build descriptors, and keep derived constants in
// memory it asks `keep` to own.
struct PrepareContext {
  Context context;
  const DeviceInfo* device = nullptr;
  std::vector<DeviceMemory>* keep = nullptr;  // owned by the plan, freed with it
  // Where timed choices are looked up and recorded (null: cuda.timing_cache=off), under
  // timingDevice (the GPU, driver, library and kiln versions); what happened, for the report.
  TimingCache* timingCache = nullptr;
  std::string timingDevice;
  int timingHits = 0;    // timed choices found in the cache and rebuilt
  int timingMisses = 0;  // timed here (then recorded)

  // Device memory that lives as long as the plan.
  Result<std::byte*> allocate(int64_t bytes, std::string_view what);
  // The cached record for `key` (counted as a hit by the caller once rebuilt), if any.
  std::optional<nlohmann::json> cachedChoice(const std::string& key) const;
  // Records what timing chose for `key` (and counts a miss).
  void recordChoice(const std::string& key, nlohmann::json choice);
  // Drops a record that could not be rebuilt.
  void forgetChoice(const std::string& key);
};

// One node's kernel. The choices it records (tactic, layout, precision) are what `kiln inspect`
// shows per layer and what an engine file keeps.
class Step {
 public:
  virtual ~Step() = default;
  // Called once on the device before the first enqueue, with inputs and outputs placed.
  virtual Status prepare(PrepareContext& /*context*/) { return Status::ok(); }
  // Scratch this step needs while it runs (valid after prepare).
  virtual int64_t workspaceBytes() const { return 0; }
  // Enqueues the step's work on context.stream. Must not synchronise the stream unless
  // capturable() is false.
  virtual Status enqueue(const Context& context) const = 0;
  // False for steps that synchronise or touch host memory: a plan with one is never captured
  // into a CUDA graph.
  virtual bool capturable() const { return true; }
  // Kernels this step generated at lowering (CUDA C++ definitions, "" for none). The plan
  // compiles all its steps' definitions as one NVRTC program when it initializes, then hands each
  // step the loaded library (bindGenerated) before prepare.
  virtual std::string generatedCode() const { return ""; }
  virtual Status bindGenerated(cudaLibrary_t /*library*/) { return Status::ok(); }
  // How the step launches, beyond its tactic ("rows, a warp per output, 256-thread blocks"; after
  // prepare, the algorithm a library was asked for and gave): what the launch knobs changed, for
  // profiles and tests. "" when there is nothing to add.
  virtual std::string detail() const { return ""; }

  const ir::Node* node = nullptr;
  std::string tactic;  // "cublaslt", "cudnn", "kiln.eltwise", "host.reference", ...
  std::string layout = "nchw";
  std::string precision = "fp32";
  std::vector<std::optional<BufferRef>> inputs;   // nullopt for omitted optional inputs
  std::vector<std::optional<BufferRef>> outputs;  // nullopt for omitted optional outputs
};

// Makes a step for `node` if this factory's kernels handle it (its op, dtypes, attributes and the
// route's knobs), else nullptr. Factories are tried by rank, lowest first; the host fallback is
// last.
using StepFactory = std::function<std::unique_ptr<Step>(const ir::Node&, const knobs::Route&)>;
// Registers a factory at static-initialisation time (like knobs, from the file of the kernels it
// makes). Returns a token to keep in a namespace-scope constant.
int registerStepFactory(int rank, std::string name, StepFactory factory);

// How a run is timed: device time between CUDA events around the plan's work.
struct TimingOptions {
  int warmUpRuns = 10;
  int runs = 100;
  bool includeCopies = false;  // host-to-device inputs and device-to-host outputs in each run
};

class Plan {
 public:
  Plan();
  ~Plan();
  Plan(Plan&&) noexcept;
  Plan& operator=(Plan&&) noexcept;

  // Makes the device resources, uploads the constants, prepares every step and (where allowed)
  // captures the CUDA graph. run() calls it when needed.
  Status initialize();

  // Runs the plan on `inputs` (in the graph's input order, exact dtypes and shapes) and returns the
  // graph's outputs. With `stepMilliseconds`, runs step by step (no graph) and records each
  // step's device time. One thread at a time.
  Result<std::vector<ir::Tensor>> run(const std::vector<ir::Tensor>& inputs,
                                      std::vector<double>* stepMilliseconds = nullptr);

  // Uploads `inputs` once, then times `options.runs` runs (after warm-up) with CUDA events;
  // returns each run's milliseconds.
  Result<std::vector<double>> time(const std::vector<ir::Tensor>& inputs,
                                   const TimingOptions& options);

  // Fills the activation arena with `byte` (initializing first): tests poison it before a run, so
  // an output element no kernel wrote shows up (0xFF bytes read as NaN in float types).
  Status fillArena(uint8_t byte);

  const std::vector<std::unique_ptr<Step>>& steps() const { return steps_; }
  int64_t arenaBytes() const { return arenaBytes_; }
  int64_t weightBytes() const { return weightBytes_; }
  int64_t workspaceBytes() const;  // valid after initialize
  // Whether the route lets runs replay a CUDA graph (cuda.graphs), before any step says no.
  bool graphsAllowed() const { return graphsAllowed_; }
  // Whether the instantiated graph is uploaded when the plan initializes (cuda.graphs.upload).
  bool graphUpload() const { return graphUpload_; }
  // Whether runs replay a CUDA graph: the route allows it and every step is capturable.
  bool usesGraph() const;
  // Why runs do not replay a graph ("" when they do, or before initialize).
  std::string graphNote() const;
  // The kernels generated at lowering (distinct definitions) and the milliseconds NVRTC took to
  // compile them when the plan initialized (0 when found compiled by an earlier plan).
  int generatedKernels() const;
  double codegenMilliseconds() const;
  // The timing cache this plan prepares with: its file ("" for the process's in-memory one; set
  // before initialize) and, after initialize, the timed choices it found there and timed itself.
  void setTimingCacheFile(std::filesystem::path path) { timingCacheFile_ = std::move(path); }
  bool timingCacheAllowed() const { return timingCacheAllowed_; }  // cuda.timing_cache
  int timingCacheHits() const;
  int timingCacheMisses() const;
  // The buffer whose accesses the plan's stream marks as persisting in the L2 cache
  // (cuda.l2.persist: "off", "arena" or "weights") and, after initialize, the bytes of the window
  // the device gave it (0 where it supports none).
  const std::string& l2Persist() const { return l2Persist_; }
  // The share of the device's largest persisting set-aside the plan asks for
  // (cuda.l2.persist.limit: "max", "half" or "quarter").
  const std::string& l2PersistLimit() const { return l2PersistLimit_; }
  int64_t l2WindowBytes() const;
  // The streams runs spread the steps over (cuda.streams; 1: the plan's stream alone), step i's
  // stream (0 is the plan's) and the steps on other streams it waits for.
  int streamCount() const { return streamCount_; }
  // The auxiliary streams' priority (cuda.streams.priority: "equal" or "branches").
  const std::string& streamPriority() const { return streamPriority_; }
  // The byte alignment of arena ranges, constants and stream workspaces (cuda.memory.alignment).
  int64_t alignment() const { return alignment_; }
  int stepStream(size_t i) const { return stepStreams_.empty() ? 0 : stepStreams_[i]; }
  const std::vector<int>& stepWaits(size_t i) const { return stepWaits_[i]; }
  const ir::Graph& graph() const { return *graph_; }

 private:
  friend Result<Plan> lowerToCuda(std::shared_ptr<const ir::Graph> graph,
                                  const knobs::Route& route);
  struct Device;  // everything made on the device

  Status compileGenerated(Device& device);
  Status uploadInputs(const std::vector<ir::Tensor>& inputs);
  Status enqueueSteps() const;
  Status enqueueOnStreams() const;  // enqueueSteps with streamCount_ > 1
  Status enqueueRun();              // graph launch or the steps
  Result<std::vector<ir::Tensor>> downloadOutputs();

  std::shared_ptr<const ir::Graph> graph_;  // steps point at its nodes and constants
  std::vector<std::unique_ptr<Step>> steps_;
  std::vector<BufferRef> inputs_;
  std::vector<BufferRef> outputs_;
  std::vector<const ir::Tensor*> constants_;  // in weights-buffer order
  std::vector<int64_t> constantOffsets_;
  int64_t arenaBytes_ = 0;
  int64_t weightBytes_ = 0;
  bool graphsAllowed_ = true;
  bool graphUpload_ = false;              // cuda.graphs.upload
  bool timingCacheAllowed_ = true;        // cuda.timing_cache
  std::string l2Persist_ = "off";         // cuda.l2.persist
  std::string l2PersistLimit_ = "max";    // cuda.l2.persist.limit
  int streamCount_ = 1;                   // cuda.streams, as the schedule used them
  std::string streamPriority_ = "equal";  // cuda.streams.priority
  int64_t alignment_ = 256;               // cuda.memory.alignment
  std::vector<int> stepStreams_;
  std::vector<std::vector<int>> stepWaits_;
  std::vector<bool> stepSignals_;  // whether a step on another stream waits for step i
  std::filesystem::path timingCacheFile_;
  std::unique_ptr<Device> device_;
};

// Lowers an inferred (and usually optimised) graph to a CUDA plan, choosing each node's kernel by
// the route's cuda.* knobs. Touches no device.
Result<Plan> lowerToCuda(std::shared_ptr<const ir::Graph> graph, const knobs::Route& route);

}  // namespace kiln::cuda
