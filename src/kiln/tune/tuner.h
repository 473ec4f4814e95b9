// The global performance tuner: expands a route expression into candidate build routes, runs a
// trial for each in a child process, excludes every route that crashes, hangs, runs out of
// memory, fails to build or misses the accuracy threshold, and keeps the fastest remaining
// engine only if it beats the default route by more than the measured noise (confirmed by an
// interleaved re-measurement). Every completed trial is durable in the result store before the
// next starts, so a stopped or killed run resumes where it was.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/base/status.h"
#include "kiln/knobs/route_expression.h"
#include "kiln/tune/accuracy.h"
#include "kiln/tune/report.h"
#include "kiln/tune/store.h"
#include "kiln/tune/trial.h"

namespace kiln::tune {

enum class SearchMode { kFast, kMixed, kFull };
const char* searchModeName(SearchMode mode);
Result<SearchMode> parseSearchMode(const std::string& text);

// Full searches larger than this need --allow-large-search.
inline constexpr uint64_t kLargeSearchRoutes = 64;

struct TuneOptions {
  // What is searched: these define a study and are kept in the store's header.
  std::filesystem::path model;
  std::string backend = "cpu";  // cpu (engine files) or cuda (plans rebuilt from their route)
  std::string shapes;           // --shapes text
  std::string expression;       // the route expression's text
  SearchMode search = SearchMode::kFast;
  std::vector<std::string> loadInputs;      // one input set per entry
  std::vector<std::string> loadRefOutputs;  // its reference outputs (same count, or none)
  uint64_t seed = 0;                        // for inputs not given
  AccuracySettings accuracy;
  TimingSettings timing;
  int finalists = 3;  // routes re-measured interleaved with the default
  // mixed: a knob value's one-off gain must be significant and at least this (a fraction of the
  // default's median) to be combined in phase two.
  double mixedMinGain = 0.005;
  // mixed: the most routes phase two's product may hold (0: no bound); see planSecondPhase.
  size_t mixedMaxRoutes = 128;
  TimingSettings finalTiming{.warmUpMs = 100, .minIterations = 30, .minSeconds = 1.0};
  std::filesystem::path saveEngine;      // the winner's engine (+ .manifest.json beside it)
  std::filesystem::path report;          // Markdown report ("" : beside saveEngine, if given)
  std::filesystem::path saveAllEngines;  // every candidate's engine
  // cuda: the timing cache every trial reads and extends ("" : one in the work folder, so the
  // routes of this run share their timed layers).
  std::filesystem::path timingCacheFile;

  // How this run goes: may differ between a run and its continuation.
  std::filesystem::path cache;  // the result store ("" : a temporary one, not resumable)
  bool resume = false;          // --continue
  // --gpus: "" (one trial at a time, on the device CUDA shows first), "all", or indices
  // "0,1,3": one trial at a time per GPU, each trial's process pinned to its GPU. The same
  // routes with the same statuses as one GPU's run, sooner; the control trial measures the
  // default on every GPU, and the finalist round runs on the first.
  std::string gpus;
  // --store postgresql://...: the study goes into a PostgreSQL store shared by workers on many
  // machines (`kiln worker`) instead of a SQLite --cache. With `submit` it is queued and this
  // returns; without, this process works on it as one worker until it is decided.
  std::string store;
  bool submit = false;
  int maxAttempts = 3;  // claims of one trial before it is recorded as failing
  bool dryRun = false;
  bool allowLargeSearch = false;
  ChildLimits trialLimits{.timeoutSeconds = 600, .memoryBytes = 0};
  double tuningTimeoutSeconds = 0;  // 0: none
  std::string commandLine;
  bool quiet = false;
  bool jsonProgress = false;            // one JSON event a line on stdout, and nothing else
  double progressIntervalSeconds = 30;  // plain output: a line this often during one trial

  nlohmann::json studyJson() const;
  // Restores the study fields from studyJson(), keeping this object's run fields.
  Status restoreStudy(const nlohmann::json& study);
};

// TuneOptions::trialLimits.memoryBytes meaning "the backend's default": three quarters of
// physical memory for cpu; none for cuda (whose driver maps far more host memory than a trial
// uses).
inline constexpr uint64_t kDefaultTrialMemory = ~uint64_t{0};

// Process exit codes of a tuning run beyond 0/1/2/3 (see cli/commands.h).
inline constexpr int kTuneExitInterrupted = 130;

// What an engine's choices depend on, for manifests and `kiln verify`: the backend's target
// (the CPU's model and instruction sets, or the GPU, driver and libraries) and the versions of
// kiln and the libraries it links.
Result<nlohmann::json> targetFingerprint(const std::string& backend);
nlohmann::json versionsJson();
// The hash of a --loadInputs / --loadRefOutputs spec's files, as the store's data records it.
std::string hashOfSpec(const std::string& spec);

// Runs (or, with options.resume, continues) a tuning run; prints progress and the outcome to
// stdout. `stop` is set by the caller's SIGINT/SIGTERM handler. Returns the process exit code;
// user errors come back as a Status.
Result<int> runTune(TuneOptions options, const std::atomic<bool>& stop);

// The routes a study searches first (fast: default + one change at a time; full: the product;
// mixed: its fast phase), in order, as canonical texts with the baseline first.
Result<std::vector<std::string>> firstPhaseRoutes(const knobs::RouteExpression& expression,
                                                  SearchMode mode);

// A trial that ran and met the accuracy threshold: a candidate (ok, with a timing).
bool eligible(const TrialRecord* record);

// The control trials a study's header records: the default route measured again after phase
// one ("control"), and with --gpus on each other GPU ("control_other_gpus", as (gpu, trial)).
// Unreadable entries are left out.
struct ControlTrials {
  std::optional<TrialRecord> first;
  std::vector<std::pair<int, TrialRecord>> others;
};
ControlTrials controlTrials(const std::map<std::string, std::string>& header);
// The drift a gain must clear (see significantlyFaster): the largest relative move of the
// default's median in the completed controls; none unless the default and the first control
// both completed. The tuner plans phase two with it, and `kiln status` re-plans with it.
std::optional<double> controlDrift(const TrialRecord* baseline, const ControlTrials& controls);

// Mixed search's second phase: the product over the knobs whose one-off change was a
// significant gain (each such knob at its baseline value or one of its significant values),
// every other knob at its baseline, less every route already measured. Deterministic, so that a
// continued run plans exactly what the first run planned.
struct SecondPhase {
  std::vector<std::string> routes;  // canonical texts, not yet measured
  std::vector<std::string> knobs;   // "knob=[baseline|v1|...]" per combined axis
  std::string note;                 // why nothing (or little) is combined
};
// `drift`: the default route's relative drift between trials (see significantlyFaster).
// `minGain`: the smallest one-off gain (0.005: 0.5% less time than the default) that enters the
// product; a significant gain below it is named in the note and left out, since each knob
// multiplies the phase's size and gains that small seldom add up to one worth deploying.
// `maxRoutes` (0: none): the most routes the product may hold, the measured ones included. Where
// the gains' product is larger, values enter it largest gain first (ties in the expression's
// order) while the product stays within the bound; the others are named in the note and left
// out.
SecondPhase planSecondPhase(const knobs::RouteExpression& expression,
                            const std::vector<TrialRecord>& records, double drift = 0.0,
                            double minGain = 0.0, size_t maxRoutes = 0);

}  // namespace kiln::tune
