// The tuner's result store: one SQLite file (--cache tune.db) holding the run's header and one
// row per completed trial, each committed durably before the next trial starts, so that a killed
// run resumes (`kiln tune --continue`) without losing or repeating a finished trial.
//
// The file is recognisably kiln's: SQLite's application_id is 0x4B494C4E ("KILN") and its
// user_version the schema version; a file that is not SQLite, not kiln's, of another schema
// version, or that fails SQLite's integrity check is refused with the reason.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/base/status.h"
#include "kiln/tune/accuracy.h"
#include "kiln/tune/timing.h"

struct sqlite3;

namespace kiln::tune {

inline constexpr int kStoreSchemaVersion = 1;

enum class TrialStatus { kOk, kCrash, kTimeout, kOom, kBuildError, kAccuracyFail };
// "ok", "crash", "timeout", "oom", "build-error", "accuracy-fail".
// At most this many samples of a timing (and pairs of a comparison) are stored; more are thinned
// to every k-th. Statistics are computed from all of them first.
inline constexpr size_t kStoredSamples = 4096;

const char* trialStatusName(TrialStatus status);
Result<TrialStatus> parseTrialStatus(const std::string& text);

// One completed trial.
struct TrialRecord {
  int64_t iteration = 0;  // 0, 1, 2, ... in the order trials completed
  int phase = 1;          // 1: fast/full, or mixed's first phase; 2: mixed's product
  std::string route;      // canonical text ("" is the default route)
  TrialStatus status = TrialStatus::kOk;
  std::string message;                   // why it failed; empty when ok
  std::vector<OutputAccuracy> accuracy;  // per output (empty when it never produced outputs)
  std::optional<TrialTiming> timing;     // present when it ran (ok, accuracy-fail)
  double buildMs = 0;
  std::string enginePath;  // where the trial saved its engine ("" if none)
  std::string engineHash;
  std::string finishedAt;  // ISO 8601, UTC
};

// The result of the interleaved re-measurement of one finalist against the default route.
struct ComparisonRecord {
  std::string route;
  PairedComparison comparison;
  std::vector<double> candidateSamples, baselineSamples;  // ms, pair by pair
};

nlohmann::json toJson(const TrialRecord& record);
Result<TrialRecord> trialFromJson(const nlohmann::json& json);
nlohmann::json toJson(const ComparisonRecord& record);
Result<ComparisonRecord> comparisonFromJson(const nlohmann::json& json);

// The name of a network filesystem ("NFS", "CIFS/SMB", "9P", "Lustre", ...) from statfs's
// f_type, or nullptr for a local (or unrecognised) one.
const char* networkFilesystemName(int64_t statfsType);
// Refuses a store on a network filesystem, naming it: SQLite's file locking is unreliable there
// (the SQLite documentation warns against it), so the embedded store stays on a local disk.
Status checkLocalFilesystem(const std::filesystem::path& path);

// What the tuner, `kiln status` and `kiln best` need of a study's store: its header, its trials
// and its finalist round. Two stores implement it: TuneStore (SQLite, one file, the embedded
// default) and pg::StudyStore (one study in a PostgreSQL database shared by many workers,
// src/kiln/tune/pg_store.h). Every write is durable when it returns.
class ResultStore {
 public:
  virtual ~ResultStore() = default;
  // Where the store is, for messages: the file, or the redacted URI and the study.
  virtual std::string where() const = 0;
  virtual const std::map<std::string, std::string>& header() const = 0;
  // Sets (or replaces) one header field durably, e.g. the decision once the run is finished.
  virtual Status setHeaderField(const std::string& key, const std::string& value) = 0;
  // Every completed trial, by iteration.
  virtual Result<std::vector<TrialRecord>> trials() const = 0;
  // Appends a trial durably. A route recorded twice or an iteration out of order is an internal
  // error.
  virtual Status addTrial(const TrialRecord& record) = 0;
  virtual Result<std::vector<ComparisonRecord>> comparisons() const = 0;
  // Replaces every comparison (the finalist round is redone as a whole when resumed).
  virtual Status setComparisons(const std::vector<ComparisonRecord>& comparisons) = 0;
};

class TuneStore final : public ResultStore {
 public:
  // Creates a new store at `path` with the header fields (key -> value, e.g. "model_hash").
  // Refuses to overwrite an existing file.
  static Result<TuneStore> create(const std::filesystem::path& path,
                                  const std::map<std::string, std::string>& header);
  // Opens an existing store, checking that it is a kiln tuning cache of this schema version and
  // intact. Errors name the file and say what is wrong with it.
  static Result<TuneStore> open(const std::filesystem::path& path);

  TuneStore(TuneStore&&) noexcept;
  TuneStore& operator=(TuneStore&&) noexcept;
  ~TuneStore();

  const std::filesystem::path& path() const { return path_; }
  std::string where() const override { return path_.string(); }
  const std::map<std::string, std::string>& header() const override { return header_; }
  Status setHeaderField(const std::string& key, const std::string& value) override;

  Result<std::vector<TrialRecord>> trials() const override;
  // Committed and synced when this returns.
  Status addTrial(const TrialRecord& record) override;

  Result<std::vector<ComparisonRecord>> comparisons() const override;
  Status setComparisons(const std::vector<ComparisonRecord>& comparisons) override;

  // The header, every trial, then every comparison, one JSON object a line
  // (`kiln cache export --jsonl`).
  Result<std::string> exportJsonLines() const;

  // Whether the tuner can record trials here: the file and its folder (where SQLite keeps its
  // write-ahead log) are writable. Checked before a resumed run starts its first trial, so a
  // read-only cache is refused up front rather than after a trial's work.
  Status checkWritable() const;

 private:
  TuneStore(std::filesystem::path path, sqlite3* db);
  // The path still names the file this store opened: writes to a cache deleted or replaced
  // while the run goes on would vanish with it, so every write checks first.
  Status checkSameFile() const;

  std::filesystem::path path_;
  sqlite3* db_ = nullptr;
  std::map<std::string, std::string> header_;
  uint64_t device_ = 0, inode_ = 0;  // of the file opened
};

}  // namespace kiln::tune
