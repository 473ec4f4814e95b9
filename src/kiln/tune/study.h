// The tuner's working parts, shared by `kiln tune` (src/kiln/tune/tuner.cc) and the workers of a
// PostgreSQL store (src/kiln/tune/worker.cc): a study ready for trials, the lanes trials run on,
// one trial in its own process, the finalist round and the decision. Not a public API.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/base/status.h"
#include "kiln/ir/tensor.h"
#include "kiln/knobs/route_expression.h"
#include "kiln/tune/progress.h"
#include "kiln/tune/report.h"
#include "kiln/tune/store.h"
#include "kiln/tune/tuner.h"

namespace kiln::tune::detail {

using Clock = std::chrono::steady_clock;

// Where trials run: one lane per GPU of --gpus (each trial's process pinned to its GPU through
// CUDA_VISIBLE_DEVICES, one trial at a time per GPU), or the one unpinned lane without --gpus.
struct Lane {
  int gpu = -1;                          // the --gpus index; -1: not pinned
  std::vector<std::string> environment;  // {"CUDA_VISIBLE_DEVICES=<the device>"} when pinned
  std::string visibleDevices;            // what the trial should see in CUDA_VISIBLE_DEVICES
  std::string deviceId;                  // the GPU's UUID ("" for the CPU): what GpuLocks locks
};

// Exclusive host-wide locks on the lanes' GPUs (flock on /tmp/kiln-gpu-<uuid>.lock, held until
// destroyed, released by the kernel when the process dies), so that no two kiln processes
// (`kiln tune`, `kiln worker`) time trials on one GPU at once.
class GpuLocks {
 public:
  // Refuses a GPU another kiln holds, naming it and the holder's pid.
  static Result<GpuLocks> acquire(const std::vector<Lane>& lanes);
  GpuLocks(GpuLocks&& other) noexcept : fds_(std::move(other.fds_)) { other.fds_.clear(); }
  GpuLocks& operator=(GpuLocks&&) = delete;
  ~GpuLocks();

 private:
  GpuLocks() = default;
  std::vector<int> fds_;
};

// Everything a run needs besides the store: the parsed study and its data, ready for trials.
struct Study {
  TuneOptions options;
  knobs::RouteExpression expression;
  std::string baseline;  // canonical text of the default route of this study
  std::filesystem::path workDir;
  bool temporary = false;  // no --cache: nothing to resume, removed at the end
  std::filesystem::path executable;
  std::vector<std::string> outputNames;
  std::vector<std::filesystem::path> inputFiles;  // one .npz per input set, in the work folder
  std::vector<std::vector<ir::Tensor>> references;
  bool generatedReferences = false;
  nlohmann::json data;      // the header's description of the data
  std::vector<Lane> lanes;  // at least one
  // The finalist round rebuilds every route's engine in its process instead of loading the
  // trials' engine files (a worker of a shared store: the trials ran on other machines).
  bool rebuildFinalists = false;
  // concludeStudy leaves the comparisons it measured for the caller to store (a worker stores
  // them with the decision, in the transaction that checks its claim).
  bool deferComparisons = false;
};

struct TrialRun {
  bool stopped = false;  // the run was stopped (or its time ran out) while this trial ran
  TrialRecord record;
  int gpu = -1;  // the lane's GPU (--gpus index), -1 when not pinned
};

// A trial for runOnLanes.
struct TrialJob {
  std::string route;
  std::string tag;  // its folder and engine file
  int64_t iteration = 0;
  int phase = 1;
};

std::string isoNow();
std::string displayRoute(const std::string& route);
nlohmann::json accuracyJson(const AccuracySettings& accuracy);

// The lanes of --gpus: "" (one unpinned lane), "all", or GPU indices "0,1,3".
Result<std::vector<Lane>> lanesFor(const TuneOptions& options);

// Writes the input sets and references into the work folder (fresh runs) and describes them.
Status prepareData(Study& study, const ir::Graph& graph);
// The data a study started with (its header's "data"), checked against the files it names.
Status reloadData(Study& study, const nlohmann::json& data);

// One trial in its own process. `tag` names its folder and engine file.
Result<TrialRun> runTrial(const Study& study, const Lane& lane, const std::string& route,
                          int64_t iteration, int phase, const std::atomic<bool>& stop,
                          Clock::time_point deadline, const std::string& tag);

const TrialRecord* findRecord(const std::vector<TrialRecord>& records, const std::string& route);

// The finalist round and the decision.
struct Conclusion {
  Decision decision;
  std::vector<ComparisonRecord> comparisons;
  bool keepTrialFiles = false;       // the evidence of a failed finalist round
  bool harnessFailed = false;        // the finalist round's process failed: exit code 3
  bool stopped = false;              // stopped during the finalist round: nothing decided
  bool measuredComparisons = false;  // `comparisons` were measured now (not read back)
};
// Once every planned trial is recorded (or the tuning timeout ended the run: `outOfTime`, with
// `remaining` routes not measured): re-measures the finalists interleaved with the default
// (their comparisons are stored) and decides.
Result<Conclusion> concludeStudy(const Study& study, ResultStore& store,
                                 const std::vector<TrialRecord>& records, double drift,
                                 bool outOfTime, int64_t remaining,
                                 const std::string& degenerateNote, const std::atomic<bool>& stop,
                                 Clock::time_point deadline, Progress& progress);

}  // namespace kiln::tune::detail
