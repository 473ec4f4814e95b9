// The shared store: many studies in one PostgreSQL database, each with the SQLite store's
// header, trials and comparisons (the same columns), its data and model as blobs, and a work
// queue that workers on many machines claim from (`kiln worker`, src/kiln/tune/worker.h).
//
// Tables (created the first time kiln connects, under an advisory lock; `kiln_meta` names the
// schema version and a database of another version is refused):
//   studies(id, created_at, backend, target, max_attempts)  target: the fingerprint of the machines
//       that may run its trials (GPU or CPU model, driver, libraries, kiln); NULL until the
//       first worker takes a trial, which binds it to its own.
//   header(study, key, value)          trials(study, iteration, phase, route, status, ...)
//   comparisons(study, position, route, record)   blobs(study, name, bytes)
//   queue(id, study, kind, route, phase, position, state, worker, lease_until, attempts,
//         last_worker, last_error)
//       kind: trial | control | finalists; state: queued | running | done | failed.
//
// A worker claims the oldest claimable item (queued, or running under an expired lease) with
// FOR UPDATE SKIP LOCKED, so that many claim at once without waiting on one another, and holds
// it under a lease it renews; every completion first checks that the lease is still its own.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/base/status.h"
#include "kiln/tune/postgres.h"
#include "kiln/tune/store.h"

namespace kiln::tune::pg {

inline constexpr int kSchemaVersion = 1;
inline constexpr int kDefaultMaxAttempts = 3;

// Connects and makes sure kiln's tables are there (creating them in an empty database).
// A database whose kiln_meta says another format or version is refused, naming both.
Result<Connection> connectStore(const std::string& uri);

// One item of a study's work queue, as claimed by a worker.
struct QueueItem {
  int64_t id = 0;
  int64_t study = 0;
  std::string kind;  // "trial", "control" (the default again after phase one), "finalists"
  std::string route;
  int phase = 1;
  int64_t position = 0;  // its place in the phase's order
  int attempts = 0;      // claims so far, this one included
  int maxAttempts = kDefaultMaxAttempts;
  std::string worker;      // who holds it now
  std::string lastWorker;  // who held it before (a lost lease)
  std::string lastError;   // why the last attempt gave it back, if it said
  std::string target;      // the study's target once bound
};

class StudyStore final : public ResultStore {
 public:
  // A new study: its header, its blobs (name -> bytes), and phase one queued in order.
  static Result<StudyStore> create(const std::string& uri, const std::string& backend,
                                   const std::map<std::string, std::string>& header,
                                   const std::map<std::string, std::string>& blobs,
                                   const std::vector<std::string>& phaseOne, int maxAttempts);
  // An existing study; `study` 0 means the only study in the database (an error if there are
  // several or none, listing them).
  static Result<StudyStore> open(const std::string& uri, int64_t study);

  StudyStore(StudyStore&&) noexcept = default;
  StudyStore& operator=(StudyStore&&) noexcept = default;

  int64_t id() const { return id_; }
  // The store's own name among stores (kiln_meta's store_id, random when it was created): study
  // numbers repeat between stores, so a worker's folder for a study carries both.
  const std::string& storeId() const { return storeId_; }
  std::string where() const override;
  const std::map<std::string, std::string>& header() const override { return header_; }
  Status setHeaderField(const std::string& key, const std::string& value) override;
  Result<std::vector<TrialRecord>> trials() const override;
  // Appends at the next iteration (record.iteration must be the count of trials recorded).
  Status addTrial(const TrialRecord& record) override;
  Result<std::vector<ComparisonRecord>> comparisons() const override;
  Status setComparisons(const std::vector<ComparisonRecord>& comparisons) override;

  // Reads the header again (other workers change it).
  Status reloadHeader();
  Result<std::string> blob(const std::string& name) const;
  // The queue: {queued, running, done, failed, max_attempts, target,
  //             running_items: [{kind, route, worker, attempts, lease_seconds_left}]}.
  Result<nlohmann::json> queueJson() const;

  Connection& connection() { return *connection_; }
  // Who records the trials added from now on (the trials table's `worker` column).
  void setWorker(std::string worker) { worker_ = std::move(worker); }

 private:
  StudyStore(std::unique_ptr<Connection> connection, int64_t id)
      : connection_(std::move(connection)), id_(id) {}
  std::unique_ptr<Connection> connection_;
  int64_t id_ = 0;
  std::map<std::string, std::string> header_;
  std::string worker_;
  std::string storeId_;
};

// Every study in the database: [{id, created_at, model_path, search, backend, finished_at,
// target, queued, running, done, failed}].
Result<nlohmann::json> listStudies(Connection& connection);

// Claims the next item of a `backend` study for a worker with `target` (the target fingerprint's
// JSON text): the oldest queued or lease-expired item of a study bound to that target or not bound
// yet (binding it), optionally of one study only. The claim counts an attempt and holds a lease of
// `leaseSeconds`. Nothing claimable: an empty optional.
Result<std::optional<QueueItem>> claimItem(Connection& connection, const std::string& target,
                                           const std::string& worker, double leaseSeconds,
                                           int64_t onlyStudy, const std::string& backend);
// Extends the lease; false when the item is no longer this claim's (the lease expired and
// another worker took it, or it was completed).
Result<bool> renewLease(Connection& connection, const QueueItem& item, double leaseSeconds);
// A worker stopping on request gives its item back without counting the attempt.
Status releaseItem(Connection& connection, const QueueItem& item);

// Gives the item back with its attempt counted: its step failed in this worker in a way that is
// not a finding about the route (`error` says how), and another attempt may succeed.
Status requeueItem(Connection& connection, const QueueItem& item, const std::string& error);

// Within a transaction: locks the study's row (completions of one study are serialised) and
// checks that `item` is still this claim's. False: the claim was lost; change nothing.
Result<bool> lockForCompletion(Connection& connection, const QueueItem& item);
// Within that transaction: the item's end ("done" or "failed").
Status finishItem(Connection& connection, const QueueItem& item, const std::string& state);
// Within that transaction: queues items of `kind` for `routes` (positions 0, 1, ...).
Status enqueue(Connection& connection, int64_t study, const std::string& kind, int phase,
               const std::vector<std::string>& routes);
// Within that transaction: counts of the study's items by kind, phase and state, as
// "kind/phase/state" -> count.
Result<std::map<std::string, int64_t>> countItems(Connection& connection, int64_t study);
// Is any item (of any study this target may take, or of `onlyStudy`) queued or running?
Result<bool> anyWorkLeft(Connection& connection, const std::string& target, int64_t onlyStudy,
                         const std::string& backend);

// Hex for bytea's text form, and back.
std::string toByteaHex(const std::string& bytes);
Result<std::string> fromByteaHex(const std::string& text);

}  // namespace kiln::tune::pg
