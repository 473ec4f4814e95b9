#include "kiln/tune/worker.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "kiln/base/file.h"
#include "kiln/engine/engine_file.h"
#include "kiln/onnx/import.h"
#include "kiln/tune/pg_store.h"
#include "kiln/tune/study.h"
#include "kiln/tune/trial.h"

namespace kiln::tune {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace detail;  // NOLINT: the tuner's working parts

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown-host";
  return name;
}

// Output of a worker: one line at a time from any lane, flushed (workers run under Slurm and
// Kubernetes, whose logs are files).
class Log {
 public:
  explicit Log(bool quiet) : quiet_(quiet) {}
  template <typename... Args>
  void line(fmt::format_string<Args...> format, Args&&... args) {
    if (quiet_) return;
    std::lock_guard lock(mu_);
    std::fputs((fmt::format("kiln worker [{}] ", isoNow()) +
                fmt::format(format, std::forward<Args>(args)...) + "\n")
                   .c_str(),
               stdout);
    std::fflush(stdout);
  }

 private:
  bool quiet_;
  std::mutex mu_;
};

// The study's files in this worker's folder: the model and the data, from the store's blobs
// (written once per study and checked against the hashes the submitter recorded).
// What the header says of the study (its settings, expression and default route): enough to
// move it on (Worker::advance) without its files.
Result<Study> studyFromHeader(const pg::StudyStore& store) {
  const auto& header = store.header();
  auto field = [&](const std::string& key) -> Result<std::string> {
    auto it = header.find(key);
    if (it == header.end()) return invalidInput("{}: the header has no '{}'", store.where(), key);
    return it->second;
  };
  Study study;
  TuneOptions& options = study.options;
  KILN_ASSIGN_OR_RETURN(std::string studyText, field("study"));
  const json studyJson = json::parse(studyText, nullptr, false);
  if (!studyJson.is_object()) return invalidInput("{}: the study is unreadable", store.where());
  options.model = "(stored)";
  KILN_RETURN_IF_ERROR(options.restoreStudy(studyJson).withContext(store.where()));
  KILN_ASSIGN_OR_RETURN(std::string limitsText, field("trial_limits"));
  const json limits = json::parse(limitsText, nullptr, false);
  try {
    options.trialLimits.timeoutSeconds = limits.at("timeout_s").get<double>();
    const int64_t memory = limits.at("memory_bytes").get<int64_t>();
    if (memory >= 0) {
      options.trialLimits.memoryBytes = static_cast<uint64_t>(memory);
    } else if (options.backend == "cuda") {
      options.trialLimits.memoryBytes = 0;
    } else {
      // The default: three quarters of this machine's memory, as kiln tune takes it.
      const long pages = ::sysconf(_SC_PHYS_PAGES), pageSize = ::sysconf(_SC_PAGESIZE);
      options.trialLimits.memoryBytes =
          pages > 0 && pageSize > 0
              ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(pageSize) / 4 * 3
              : 0;
    }
  } catch (const json::exception& e) {
    return invalidInput("{}: the trial limits are unreadable: {}", store.where(), e.what());
  }
  options.timingCacheFile.clear();  // each worker's own, in its folder
  KILN_ASSIGN_OR_RETURN(study.expression, knobs::parseRouteExpression(options.expression));
  study.baseline = study.expression.pinned.canonicalText();
  return study;
}

// The study's files in this worker's folder: the model and the data, from the store's blobs
// (written once per study and checked against the hashes the submitter recorded).
Status loadStudyFiles(Study& study, pg::StudyStore& store, const fs::path& root, const Lane& lane) {
  const auto& header = store.header();
  auto field = [&](const std::string& key) -> Result<std::string> {
    auto it = header.find(key);
    if (it == header.end()) return invalidInput("{}: the header has no '{}'", store.where(), key);
    return it->second;
  };
  TuneOptions& options = study.options;
  study.workDir = root / fmt::format("{}-study-{}", store.storeId(), store.id());
  std::error_code error;
  fs::create_directories(study.workDir / "data", error);
  if (error) {
    return ioError("cannot create {}: {}", (study.workDir / "data").string(), error.message());
  }
  // The model, from the store, unless this worker already has it.
  KILN_ASSIGN_OR_RETURN(const std::string modelHash, field("model_hash"));
  const fs::path model = study.workDir / "model.onnx";
  auto present = readFileBytes(model);
  if (!present.isOk() || modelHashOf(*present) != modelHash) {
    KILN_ASSIGN_OR_RETURN(std::string bytes, store.blob("model"));
    if (modelHashOf(bytes) != modelHash) {
      return invalidInput("{}: the stored model's hash is {}, the header says {}", store.where(),
                          modelHashOf(bytes), modelHash);
    }
    KILN_RETURN_IF_ERROR(writeFileAtomically(model, bytes));
  }
  options.model = model;
  // The data, at this worker's paths; the files the submitter was given are not here.
  KILN_ASSIGN_OR_RETURN(std::string dataText, field("data"));
  json data = json::parse(dataText, nullptr, false);
  if (!data.is_array())
    return invalidInput("{}: the data description is unreadable", store.where());
  for (json& entry : data) {
    for (const char* kind : {"inputs", "references"}) {
      const std::string name = fmt::format("{}_{}.npz", kind, entry.at("set").get<int>());
      const fs::path local = study.workDir / "data" / name;
      const std::string hashKey = std::string(kind) + "_file_hash";
      auto hash = fileHash(local);
      if (!hash.isOk() || *hash != entry.at(hashKey).get<std::string>()) {
        KILN_ASSIGN_OR_RETURN(std::string bytes, store.blob("data/" + name));
        KILN_RETURN_IF_ERROR(writeFileAtomically(local, bytes));
      }
      entry[std::string(kind) + "_file"] = local.string();
      entry.erase(std::string(kind) + "_given");
    }
  }
  KILN_RETURN_IF_ERROR(reloadData(study, data).withContext(store.where()));
  onnx::ImportOptions importOptions;
  KILN_ASSIGN_OR_RETURN(importOptions.inputShapes, onnx::parseShapeSpec(options.shapes));
  KILN_ASSIGN_OR_RETURN(onnx::Model imported, onnx::importModel(model, importOptions));
  for (const ir::Value* output : imported.graph.outputs) study.outputNames.push_back(output->name);
  KILN_ASSIGN_OR_RETURN(study.executable, currentExecutable());
  study.lanes = {lane};
  study.rebuildFinalists = true;
  study.deferComparisons = true;
  return Status::ok();
}

// Renews a claim's lease until stopped; sets `lost` (and `trialStop`) when the claim is no
// longer this worker's, and `trialStop` when the worker is asked to stop.
class Heartbeat {
 public:
  Heartbeat(const WorkerOptions& options, const pg::QueueItem& item,
            const std::atomic<bool>& workerStop, const std::atomic<bool>& workerHalt)
      : thread_([this, &options, item, &workerStop, &workerHalt] {
          auto connection = pg::Connection::open(options.store);
          auto next = Clock::now();
          std::unique_lock lock(mu_);
          while (!done_) {
            if (workerStop.load() || workerHalt.load()) trialStop.store(true);
            if (Clock::now() >= next) {
              // A renewal that fails (the store unreachable for a moment) is tried again each
              // second, on a new connection once the old one broke; the lease runs out only if
              // the store stays unreachable for as long.
              lock.unlock();
              if (!connection.isOk() || connection->broken()) {
                connection = pg::Connection::open(options.store);
              }
              Result<bool> renewed = connection.isOk()
                                         ? pg::renewLease(*connection, item, options.leaseSeconds)
                                         : Result<bool>(connection.status());
              lock.lock();
              if (renewed.isOk() && !*renewed) {
                lost.store(true);
                trialStop.store(true);
              }
              next = Clock::now() +
                     std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                         renewed.isOk() ? options.leaseSeconds / 3 : 1.0));
            }
            cv_.wait_for(lock, std::chrono::milliseconds(200));
          }
        }) {}
  ~Heartbeat() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

  std::atomic<bool> trialStop{false};
  std::atomic<bool> lost{false};

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

class Worker {
 public:
  Worker(const WorkerOptions& options, const std::atomic<bool>& stop, std::string target,
         fs::path root)
      : options_(options),
        stop_(stop),
        target_(std::move(target)),
        root_(std::move(root)),
        log_(options.quiet) {}

  // One lane's loop: claim, run, record, until stopped, idle or failed (which stops the other
  // lanes too).
  Status runLane(const Lane& lane);

 private:
  Status runLaneUntilDone(const Lane& lane);
  Status handle(pg::Connection& claims, const Lane& lane, pg::QueueItem item);
  // Records the end of `item` (a trial's record; the control's; the decision) and moves the
  // study on, in one transaction. False: the claim was lost meanwhile, nothing was recorded.
  Result<bool> complete(pg::StudyStore& store, const Study& study, const pg::QueueItem& item,
                        TrialRecord* record, const Decision* decision, const std::string& state,
                        const std::vector<ComparisonRecord>* comparisons = nullptr);
  Status advance(pg::StudyStore& store, const Study& study);

  const WorkerOptions& options_;
  const std::atomic<bool>& stop_;
  std::string target_;
  fs::path root_;
  Log log_;
  std::mutex studiesMu_;
  std::map<std::string, Study> loaded_;  // by "<store id>-<study>", under studiesMu_
  std::atomic<bool> halt_{false};        // a lane ended with an error: the others stop too
};

std::string laneName(const Lane& lane) {
  return fmt::format("{}:{}{}", hostName(), ::getpid(),
                     lane.gpu >= 0 ? fmt::format("/gpu{}", lane.gpu) : std::string());
}

// The store unreachable this many times in a row (a restart, a network partition, waited for
// with a growing pause up to a minute: about ten minutes in all) ends the worker.
constexpr int kStoreRetries = 12;
// Steps of this many different items failing here in a row end the worker: one that cannot run
// trials (a broken installation) must not use up every trial's attempts. (One item failing again
// and again is that item's problem: its attempts run out.)
constexpr int kStepFailures = 3;

Status Worker::runLane(const Lane& lane) {
  Status status = runLaneUntilDone(lane);
  if (!status.isOk()) halt_.store(true);
  return status;
}

Status Worker::runLaneUntilDone(const Lane& lane) {
  const std::string name = laneName(lane);
  std::optional<pg::Connection> claims;
  int unreachable = 0;
  std::set<int64_t> failedItems;  // distinct items whose steps failed here in a row
  // An item whose step failed because the store went away: given back without counting the
  // attempt once the store is back (unless its lease ran out and another worker took it).
  std::optional<pg::QueueItem> giveBack;
  auto stopping = [&] { return stop_.load() || halt_.load(); };
  auto pause = [&](double seconds) {
    for (double slept = 0; slept < seconds && !stopping(); slept += 0.1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  };
  // Waits for a store that cannot be reached; gives up after kStoreRetries in a row. An error of
  // a statement on a working connection is not waited for: it will not go away.
  auto storeFailed = [&](const Status& status) -> Status {
    if (claims && !claims->broken()) return status.withContext(name);
    claims.reset();
    if (++unreachable > kStoreRetries) {
      return status.withContext(
          fmt::format("{}: the store stayed unreachable after {} tries", name, kStoreRetries));
    }
    const double wait = std::min(60.0, double(1 << std::min(unreachable, 6)));
    log_.line("{}: the store cannot be reached ({}); trying again in {:.0f} s", name,
              status.message(), wait);
    pause(wait);
    return Status::ok();
  };
  auto idleSince = Clock::now();
  while (!stopping()) {
    if (!claims) {
      auto connected = pg::connectStore(options_.store);
      if (!connected.isOk()) {
        KILN_RETURN_IF_ERROR(storeFailed(connected.status()));
        continue;
      }
      claims.emplace(std::move(connected).value());
    }
    if (giveBack) {
      auto released = pg::releaseItem(*claims, *giveBack);
      if (!released.isOk()) {
        KILN_RETURN_IF_ERROR(storeFailed(released));
        continue;
      }
      giveBack.reset();
    }
    auto item = pg::claimItem(*claims, target_, name, options_.leaseSeconds, options_.onlyStudy,
                              options_.backend);
    if (!item.isOk()) {
      KILN_RETURN_IF_ERROR(storeFailed(item.status()));
      continue;
    }
    unreachable = 0;
    if (*item) {
      const pg::QueueItem claimed = **item;
      Status handled = handle(*claims, lane, claimed);
      idleSince = Clock::now();
      if (handled.isOk()) {
        failedItems.clear();
        continue;
      }
      if (claims->broken() || !claims->exec("SELECT 1").isOk()) {
        // The store went away during the step: not the item's fault nor this worker's.
        log_.line("{}: {}; the store is unreachable, the item goes back once it is back", name,
                  handled.message());
        giveBack = claimed;
        claims.reset();
        continue;
      }
      // Not a finding about the route (the trial's process could not start, the study cannot
      // load here): the item goes back with its attempt counted, for any worker to try again
      // until its attempts run out.
      log_.line("{}: {}; the item goes back to the queue", name, handled.message());
      KILN_RETURN_IF_ERROR(pg::requeueItem(*claims, claimed, handled.message()));
      failedItems.insert(claimed.id);
      if (static_cast<int>(failedItems.size()) >= kStepFailures) {
        return handled.withContext(
            fmt::format("{}: steps of {} different items in a row failed here; this worker stops",
                        name, kStepFailures));
      }
      continue;
    }
    if (options_.exitWhenIdleSeconds >= 0) {
      auto left = pg::anyWorkLeft(*claims, target_, options_.onlyStudy, options_.backend);
      if (!left.isOk()) {
        KILN_RETURN_IF_ERROR(storeFailed(left.status()));
        continue;
      }
      if (*left) {
        idleSince = Clock::now();
      } else if (std::chrono::duration<double>(Clock::now() - idleSince).count() >=
                 options_.exitWhenIdleSeconds) {
        log_.line("{}: no work left for {:.0f} s; exiting", name, options_.exitWhenIdleSeconds);
        return Status::ok();
      }
    }
    pause(options_.pollSeconds);
  }
  return Status::ok();
}

Status Worker::handle(pg::Connection& claims, const Lane& lane, pg::QueueItem item) {
  KILN_ASSIGN_OR_RETURN(pg::StudyStore store, pg::StudyStore::open(options_.store, item.study));
  store.setWorker(item.worker);
  Heartbeat heartbeat(options_, item, stop_, halt_);
  const std::string what =
      item.kind == "finalists"
          ? fmt::format("study {}: the finalist round", item.study)
          : fmt::format("study {}: {} {} (phase {})", item.study,
                        item.kind == "control" ? "control trial of" : "trial of",
                        displayRoute(item.route), item.phase);
  const std::string last = item.lastWorker.empty() ? "unknown" : item.lastWorker;
  if (item.attempts > 1 && item.attempts <= item.maxAttempts) {
    log_.line("{}: attempt {} of {} ({})", what, item.attempts, item.maxAttempts,
              item.lastError.empty()
                  ? fmt::format("the last worker, {}, lost its lease", last)
                  : fmt::format("the last, on {}, failed: {}", last, item.lastError));
  }
  Result<Study> header = studyFromHeader(store);
  if (!header.isOk() && item.attempts > item.maxAttempts) {
    // Nothing can be recorded for a study whose header is unreadable: the item ends as failed,
    // so that no worker spins on it.
    log_.line("{}: {}; the item is marked failed", what, header.status().message());
    KILN_ASSIGN_OR_RETURN(pg::Transaction transaction, pg::Transaction::begin(store.connection()));
    KILN_ASSIGN_OR_RETURN(bool mine, pg::lockForCompletion(store.connection(), item));
    if (mine) KILN_RETURN_IF_ERROR(pg::finishItem(store.connection(), item, "failed"));
    return transaction.commit();
  }
  KILN_ASSIGN_OR_RETURN(Study study, std::move(header));
  if (item.attempts > item.maxAttempts) {
    // Claimed this often, it ended every worker that ran it (or they were lost while it ran):
    // recorded as failing rather than retried forever.
    const std::string message =
        item.lastError.empty()
            ? fmt::format(
                  "its worker was lost {} times (the last: {}): a worker that runs it dies, "
                  "hangs or loses the database; not tried again",
                  item.attempts - 1, last)
            : fmt::format("it failed in its worker {} times (the last: {}: {}); not tried again",
                          item.attempts - 1, last, item.lastError);
    log_.line("{}: {}", what, message);
    if (item.kind == "finalists") {
      Decision decision;
      decision.baseline = study.baseline;
      decision.winner = study.baseline;
      decision.provisional = true;
      decision.reason = "the finalist round " + message + "; the default route stays";
      return complete(store, study, item, nullptr, &decision, "failed").status();
    }
    TrialRecord record;
    record.phase = item.phase;
    record.route = item.route;
    record.status = TrialStatus::kCrash;
    record.message = message;
    record.finishedAt = isoNow();
    return complete(store, study, item, &record, nullptr, "failed").status();
  }

  {
    // The study's files and references, loaded once per study by this worker (its model read,
    // hashed and imported once, not per trial) and kept for its next items; one lane loads at a
    // time. A study that cannot load here is given back (by runLane) with its attempt counted.
    std::lock_guard lock(studiesMu_);
    const std::string key = fmt::format("{}-{}", store.storeId(), store.id());
    auto cached = loaded_.find(key);
    if (cached == loaded_.end()) {
      Study files = study;
      Status loaded = Status::ok();
      try {
        loaded = loadStudyFiles(files, store, root_, lane);
      } catch (const std::exception& e) {
        loaded = invalidInput("{}: {}", store.where(), e.what());
      }
      if (!loaded.isOk()) return loaded.withContext(what + ": cannot load the study");
      cached = loaded_.emplace(key, std::move(files)).first;
    }
    study = cached->second;
    study.lanes = {lane};
  }
  // The step was stopped before it ended: its lease was lost (another worker has the item now)
  // or this worker is stopping (the item goes back without counting the attempt).
  auto stoppedMidStep = [&]() -> Status {
    if (heartbeat.lost.load()) {
      log_.line("{}: lost the lease; another worker has it now", what);
      return Status::ok();
    }
    log_.line("{}: stopped; given back to the queue", what);
    return pg::releaseItem(claims, item);
  };

  if (item.kind == "finalists") {
    KILN_RETURN_IF_ERROR(store.reloadHeader());
    KILN_ASSIGN_OR_RETURN(std::vector<TrialRecord> records, store.trials());
    const std::optional<double> drift =
        controlDrift(findRecord(records, study.baseline), controlTrials(store.header()));
    log_.line("{}: starting", what);
    Progress progress(options_.quiet ? ProgressStyle::kQuiet : ProgressStyle::kPlain, stdout);
    KILN_ASSIGN_OR_RETURN(Conclusion conclusion,
                          concludeStudy(study, store, records, drift.value_or(0.0), false, 0, "",
                                        heartbeat.trialStop, Clock::time_point::max(), progress));
    if (conclusion.stopped) {
      return stoppedMidStep();
    }
    if (conclusion.harnessFailed) {
      // Not a finding about the routes: the round is tried again (by any worker) until its
      // attempts run out.
      log_.line("{}: {}; queued again", what, conclusion.decision.reason);
      return pg::requeueItem(claims, item, conclusion.decision.reason);
    }
    KILN_ASSIGN_OR_RETURN(
        bool recorded,
        complete(store, study, item, nullptr, &conclusion.decision, "done",
                 conclusion.measuredComparisons ? &conclusion.comparisons : nullptr));
    if (recorded) {
      log_.line("{}: decided: {} ({})", what,
                conclusion.decision.winner ? displayRoute(*conclusion.decision.winner)
                                           : std::string("no eligible route"),
                conclusion.decision.reason);
    }
    return Status::ok();
  }

  log_.line("{}: starting", what);
  const std::string tag = fmt::format("q{}-{}", item.id, item.attempts);
  KILN_ASSIGN_OR_RETURN(TrialRun run, runTrial(study, lane, item.route, 0, item.phase,
                                               heartbeat.trialStop, Clock::time_point::max(), tag));
  std::error_code ignored;
  fs::remove_all(study.workDir / "trials" / tag, ignored);
  if (run.stopped) {
    return stoppedMidStep();
  }
  // No engine is kept: whichever worker runs the finalist round rebuilds the finalists' engines
  // from their routes.
  if (!run.record.enginePath.empty()) fs::remove(run.record.enginePath, ignored);
  run.record.enginePath.clear();
  KILN_ASSIGN_OR_RETURN(bool recorded, complete(store, study, item, &run.record, nullptr, "done"));
  if (recorded) {
    const TrialRecord& r = run.record;
    log_.line("{}: {}{}{}", what, trialStatusName(r.status),
              r.timing ? fmt::format(", median {:.4f} ms", r.timing->summary.median) : "",
              r.message.empty() ? "" : ": " + r.message);
  } else {
    log_.line("{}: finished after its lease was lost; another worker's result counts", what);
  }
  return Status::ok();
}

Result<bool> Worker::complete(pg::StudyStore& store, const Study& study, const pg::QueueItem& item,
                              TrialRecord* record, const Decision* decision,
                              const std::string& state,
                              const std::vector<ComparisonRecord>* comparisons) {
  pg::Connection& connection = store.connection();
  KILN_ASSIGN_OR_RETURN(pg::Transaction transaction, pg::Transaction::begin(connection));
  KILN_ASSIGN_OR_RETURN(bool mine, pg::lockForCompletion(connection, item));
  if (!mine) return false;  // rolled back
  KILN_RETURN_IF_ERROR(store.reloadHeader());
  if (item.kind == "trial") {
    KILN_ASSIGN_OR_RETURN(std::vector<TrialRecord> records, store.trials());
    record->iteration = static_cast<int64_t>(records.size());
    KILN_RETURN_IF_ERROR(store.addTrial(*record));
  } else if (item.kind == "control") {
    KILN_RETURN_IF_ERROR(store.setHeaderField("control", toJson(*record).dump()));
  } else {
    if (comparisons) KILN_RETURN_IF_ERROR(store.setComparisons(*comparisons));
    KILN_RETURN_IF_ERROR(store.setHeaderField("decision", decisionJson(*decision).dump()));
    KILN_RETURN_IF_ERROR(store.setHeaderField("finished_at", isoNow()));
  }
  KILN_RETURN_IF_ERROR(pg::finishItem(connection, item, state));
  KILN_RETURN_IF_ERROR(advance(store, study));
  KILN_RETURN_IF_ERROR(transaction.commit());
  return true;
}

// Within the completing transaction (the study's row locked): what comes next once a step ends.
Status Worker::advance(pg::StudyStore& store, const Study& study) {
  KILN_ASSIGN_OR_RETURN(auto counts, pg::countItems(store.connection(), store.id()));
  auto count = [&](const std::string& kind, int phase, std::initializer_list<const char*> states) {
    int64_t n = 0;
    for (const char* state : states) {
      auto it = counts.find(fmt::format("{}/{}/{}", kind, phase, state));
      if (it != counts.end()) n += it->second;
    }
    return n;
  };
  auto any = [&](const std::string& kind, int phase) {
    return count(kind, phase, {"queued", "running", "done", "failed"}) > 0;
  };
  auto open = [&](const std::string& kind, int phase) {
    return count(kind, phase, {"queued", "running"}) > 0;
  };
  if (open("trial", 1)) return Status::ok();
  const auto& header = store.header();
  KILN_ASSIGN_OR_RETURN(std::vector<TrialRecord> records, store.trials());
  const TrialRecord* base = findRecord(records, study.baseline);
  // The control: the default route again after phase one, for the drift between trials (and
  // between the workers' machines, where they differ).
  if (!any("control", 1) && !header.count("control") && eligible(base)) {
    return pg::enqueue(store.connection(), store.id(), "control", 1, {study.baseline});
  }
  if (open("control", 1)) return Status::ok();
  const bool mixed = study.options.search == SearchMode::kMixed;
  if (mixed && !header.count("phase_two")) {
    // Planned once: the study's row lock serialises every completion, and the plan is recorded
    // in the same transaction as its queue.
    const std::optional<double> drift = controlDrift(base, controlTrials(header));
    const SecondPhase plan =
        planSecondPhase(study.expression, records, drift.value_or(0.0), study.options.mixedMinGain,
                        study.options.mixedMaxRoutes);
    KILN_RETURN_IF_ERROR(pg::enqueue(store.connection(), store.id(), "trial", 2, plan.routes));
    KILN_RETURN_IF_ERROR(store.setHeaderField(
        "phase_two",
        json{{"routes", plan.routes.size()}, {"knobs", plan.knobs}, {"note", plan.note}}.dump()));
    log_.line("study {}: phase two planned: {} route{} over {}{}", store.id(), plan.routes.size(),
              plan.routes.size() == 1 ? "" : "s",
              plan.knobs.empty() ? "no knobs" : fmt::format("{}", fmt::join(plan.knobs, " ")),
              plan.note.empty() ? "" : " (" + plan.note + ")");
    if (!plan.routes.empty()) return Status::ok();
  }
  if (open("trial", 2)) return Status::ok();
  if (!any("finalists", 0) && !header.count("finished_at")) {
    return pg::enqueue(store.connection(), store.id(), "finalists", 0, {study.baseline});
  }
  return Status::ok();
}

}  // namespace

Result<int> runWorker(const WorkerOptions& options, const std::atomic<bool>& stop) {
  if (!pg::isUri(options.store)) {
    return invalidInput(
        "--store {}: a worker takes trials from a PostgreSQL store "
        "(postgresql://...)",
        options.store);
  }
  if (options.backend != "cpu" && options.backend != "cuda") {
    return invalidInput("--backend {}: a worker runs cpu or cuda studies", options.backend);
  }
  if (options.leaseSeconds < 1) {
    return invalidInput("--lease {}: at least 1 second", options.leaseSeconds);
  }
  TuneOptions laneOptions;
  laneOptions.backend = options.backend;
  laneOptions.gpus = options.gpus;
  KILN_ASSIGN_OR_RETURN(std::vector<Lane> lanes, lanesFor(laneOptions));
  KILN_ASSIGN_OR_RETURN(GpuLocks gpuLocks, GpuLocks::acquire(lanes));
  KILN_ASSIGN_OR_RETURN(const json target, targetFingerprint(options.backend));
  fs::path root = options.workRoot;
  if (root.empty()) root = fs::temp_directory_path() / fmt::format("kiln-worker-{}", ::getuid());
  std::error_code error;
  fs::create_directories(root, error);
  if (error)
    return ioError("cannot create the worker folder {}: {}", root.string(), error.message());
  // Fail early on a store that cannot be reached or is not kiln's.
  KILN_RETURN_IF_ERROR(pg::connectStore(options.store).status());

  Worker worker(options, stop, target.dump(), root);
  Log log(options.quiet);
  log.line("{} on {} ({} lane{}), {} studies of this target, files in {}", laneName(Lane{}),
           pg::redacted(options.store), lanes.size(), lanes.size() == 1 ? "" : "s", options.backend,
           root.string());
  std::vector<Status> results(lanes.size(), Status::ok());
  std::vector<std::thread> threads;
  for (size_t i = 1; i < lanes.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = worker.runLane(lanes[i]); });
  }
  results[0] = worker.runLane(lanes[0]);
  for (auto& thread : threads) thread.join();
  for (const Status& status : results) {
    if (!status.isOk()) return status;
  }
  return stop.load() ? kTuneExitInterrupted : 0;
}

}  // namespace kiln::tune
