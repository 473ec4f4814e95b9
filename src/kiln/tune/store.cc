// The tuner's result store in SQLite: the schema, the checks that refuse a file that is not an
// intact kiln tuning cache, durable appends, and the JSON forms of the records.
#include "kiln/tune/store.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <set>
#include <utility>

namespace kiln::tune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kApplicationId = 0x4B494C4E;  // "KILN"
constexpr int kBusyTimeoutMs = 5000;

// ---------------------------------------------------------------------------------------------
// JSON helpers. JSON has no Inf/NaN (nlohmann writes null), yet a loss can be either: non-finite
// doubles are written as the strings "inf", "-inf" and "nan" and read back from them.

json encodeDouble(double value) {
  if (std::isfinite(value)) return value;
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}

// Samples as the store keeps them: all of them up to kStoredSamples, else every k-th (in the
// order measured, starting with the first) for the smallest k that keeps at most kStoredSamples.
// A model of a microsecond timed for a second yields a million samples, 11 MB of JSON a trial;
// the summary, interval and paired ratio are computed from every sample before they are stored.
json encodeSamples(const std::vector<double>& values) {
  const size_t stride = std::max<size_t>(1, (values.size() + kStoredSamples - 1) / kStoredSamples);
  json array = json::array();
  for (size_t i = 0; i < values.size(); i += stride) array.push_back(encodeDouble(values[i]));
  return array;
}

// Invalid UTF-8 (a crash message, an output name) is replaced rather than thrown about.
std::string dumpJson(const json& value) {
  return value.dump(-1, ' ', false, json::error_handler_t::replace);
}

Result<const json*> field(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end()) return invalidInput("missing field '{}'", key);
  return &*it;
}

Status readString(const json& object, const char* key, std::string& out) {
  KILN_ASSIGN_OR_RETURN(const json* value, field(object, key));
  if (!value->is_string()) return invalidInput("field '{}' is not a string", key);
  out = value->get<std::string>();
  return Status::ok();
}

Status readInt(const json& object, const char* key, int64_t& out) {
  KILN_ASSIGN_OR_RETURN(const json* value, field(object, key));
  if (!value->is_number_integer()) return invalidInput("field '{}' is not an integer", key);
  out = value->get<int64_t>();
  return Status::ok();
}

Status readInt32(const json& object, const char* key, int& out) {
  int64_t value = 0;
  KILN_RETURN_IF_ERROR(readInt(object, key, value));
  if (value < INT32_MIN || value > INT32_MAX)
    return invalidInput("field '{}' is out of range", key);
  out = static_cast<int>(value);
  return Status::ok();
}

Status decodeDouble(const json& value, const std::string& what, double& out) {
  if (value.is_number()) {
    out = value.get<double>();
    return Status::ok();
  }
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (text == "nan")
      out = std::nan("");
    else if (text == "inf")
      out = INFINITY;
    else if (text == "-inf")
      out = -INFINITY;
    else
      return invalidInput("{} is the string '{}', not a number, \"inf\", \"-inf\" or \"nan\"", what,
                          text);
    return Status::ok();
  }
  return invalidInput("{} is not a number", what);
}

Status readDouble(const json& object, const char* key, double& out) {
  KILN_ASSIGN_OR_RETURN(const json* value, field(object, key));
  return decodeDouble(*value, fmt::format("field '{}'", key), out);
}

Status readDoubles(const json& object, const char* key, std::vector<double>& out) {
  KILN_ASSIGN_OR_RETURN(const json* value, field(object, key));
  if (!value->is_array()) return invalidInput("field '{}' is not an array", key);
  out.clear();
  out.reserve(value->size());
  for (size_t i = 0; i < value->size(); ++i) {
    double element = 0;
    KILN_RETURN_IF_ERROR(decodeDouble((*value)[i], fmt::format("{}[{}]", key, i), element));
    out.push_back(element);
  }
  return Status::ok();
}

Status readBool(const json& object, const char* key, bool& out) {
  KILN_ASSIGN_OR_RETURN(const json* value, field(object, key));
  if (!value->is_boolean()) return invalidInput("field '{}' is not a boolean", key);
  out = value->get<bool>();
  return Status::ok();
}

Result<json> parseJson(const std::string& text, const char* what) {
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return invalidInput("{} is not valid JSON", what);
  return value;
}

json accuracyToJson(const std::vector<OutputAccuracy>& accuracy) {
  json array = json::array();
  for (const OutputAccuracy& output : accuracy) {
    array.push_back({{"output", output.output},
                     {"loss", encodeDouble(output.loss)},
                     {"threshold", encodeDouble(output.threshold)},
                     {"pass", output.pass},
                     {"note", output.note}});
  }
  return array;
}

Result<std::vector<OutputAccuracy>> accuracyFromJson(const json& array) {
  if (!array.is_array()) return invalidInput("accuracy is not an array");
  std::vector<OutputAccuracy> accuracy;
  for (size_t i = 0; i < array.size(); ++i) {
    const json& item = array[i];
    OutputAccuracy output;
    Status status = item.is_object() ? Status::ok() : invalidInput("not an object");
    if (status.isOk()) status = readString(item, "output", output.output);
    if (status.isOk()) status = readDouble(item, "loss", output.loss);
    if (status.isOk()) status = readDouble(item, "threshold", output.threshold);
    if (status.isOk()) status = readBool(item, "pass", output.pass);
    if (status.isOk()) status = readString(item, "note", output.note);
    KILN_RETURN_IF_ERROR(status.withContext(fmt::format("accuracy[{}]", i)));
    accuracy.push_back(std::move(output));
  }
  return accuracy;
}

json timingToJson(const std::optional<TrialTiming>& timing) {
  if (!timing) return nullptr;
  const TimingSummary& s = timing->summary;
  return {{"count", s.count},
          {"min", encodeDouble(s.min)},
          {"median", encodeDouble(s.median)},
          {"mean", encodeDouble(s.mean)},
          {"p90", encodeDouble(s.p90)},
          {"p99", encodeDouble(s.p99)},
          {"max", encodeDouble(s.max)},
          {"stddev", encodeDouble(s.stddev)},
          {"ci_low", encodeDouble(timing->ciLow)},
          {"ci_high", encodeDouble(timing->ciHigh)},
          {"confidence", encodeDouble(timing->confidence)},
          {"samples", encodeSamples(timing->samples)}};
}

Result<std::optional<TrialTiming>> timingFromJson(const json& object) {
  if (object.is_null()) return std::optional<TrialTiming>();
  if (!object.is_object()) return invalidInput("timing is neither an object nor null");
  TrialTiming timing;
  TimingSummary& s = timing.summary;
  Status status = readInt32(object, "count", s.count);
  if (status.isOk()) status = readDouble(object, "min", s.min);
  if (status.isOk()) status = readDouble(object, "median", s.median);
  if (status.isOk()) status = readDouble(object, "mean", s.mean);
  if (status.isOk()) status = readDouble(object, "p90", s.p90);
  if (status.isOk()) status = readDouble(object, "p99", s.p99);
  if (status.isOk()) status = readDouble(object, "max", s.max);
  if (status.isOk()) status = readDouble(object, "stddev", s.stddev);
  if (status.isOk()) status = readDouble(object, "ci_low", timing.ciLow);
  if (status.isOk()) status = readDouble(object, "ci_high", timing.ciHigh);
  if (status.isOk()) status = readDouble(object, "confidence", timing.confidence);
  if (status.isOk()) status = readDoubles(object, "samples", timing.samples);
  KILN_RETURN_IF_ERROR(status.withContext("timing"));
  return std::optional<TrialTiming>(std::move(timing));
}

// ---------------------------------------------------------------------------------------------
// SQLite helpers.

std::string quoted(const fs::path& path) { return "'" + path.string() + "'"; }

Status sqliteError(sqlite3* db, const fs::path& path, const std::string& doing) {
  // Damage SQLite finds while reading is a property of the file, not a passing I/O failure.
  const int code = db ? sqlite3_errcode(db) : SQLITE_NOMEM;
  if (code == SQLITE_CORRUPT) {
    return invalidInput("{} is corrupt: {}: {}", quoted(path), doing, sqlite3_errmsg(db));
  }
  if (code == SQLITE_NOTADB) {
    return invalidInput("{} is not a SQLite database, so not a kiln tuning cache: {}", quoted(path),
                        sqlite3_errmsg(db));
  }
  return ioError("{}: {}: {}", quoted(path), doing, db ? sqlite3_errmsg(db) : "out of memory");
}

// A prepared statement, finalised when it goes out of scope. Values are always bound, never
// spliced into the SQL text.
class Statement {
 public:
  Statement(sqlite3* db, const fs::path& path, std::string sql)
      : db_(db), path_(path), sql_(std::move(sql)) {
    prepareRc_ = sqlite3_prepare_v2(db, sql_.c_str(), -1, &stmt_, nullptr);
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Status prepared() const {
    if (prepareRc_ == SQLITE_OK) return Status::ok();
    return sqliteError(db_, path_, fmt::format("preparing \"{}\"", sql_));
  }

  void bind(int index, const std::string& text) {
    note(sqlite3_bind_text(stmt_, index, text.data(), static_cast<int>(text.size()),
                           SQLITE_TRANSIENT));
  }
  void bind(int index, int64_t value) { note(sqlite3_bind_int64(stmt_, index, value)); }
  void bind(int index, double value) { note(sqlite3_bind_double(stmt_, index, value)); }
  void bindNull(int index) { note(sqlite3_bind_null(stmt_, index)); }

  // True when a row is ready, false when the statement has finished.
  Result<bool> step() {
    KILN_RETURN_IF_ERROR(prepared());
    if (bindRc_ != SQLITE_OK) return sqliteError(db_, path_, "binding a parameter");
    int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return sqliteError(db_, path_, fmt::format("running \"{}\"", sql_));
  }

  // Runs a statement that returns no rows.
  Status run() {
    KILN_ASSIGN_OR_RETURN(bool row, step());
    (void)row;
    return Status::ok();
  }

  int type(int column) const { return sqlite3_column_type(stmt_, column); }
  int64_t integer(int column) const { return sqlite3_column_int64(stmt_, column); }
  double real(int column) const { return sqlite3_column_double(stmt_, column); }
  std::string text(int column) const {
    const auto* data = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
    return data ? std::string(data, sqlite3_column_bytes(stmt_, column)) : std::string();
  }

 private:
  void note(int rc) {
    if (bindRc_ == SQLITE_OK) bindRc_ = rc;
  }

  sqlite3* db_;
  const fs::path& path_;
  std::string sql_;
  sqlite3_stmt* stmt_ = nullptr;
  int prepareRc_ = SQLITE_OK;
  int bindRc_ = SQLITE_OK;
};

// Runs constant SQL without parameters (pragmas, schema, transaction control).
Status exec(sqlite3* db, const fs::path& path, const std::string& sql) {
  char* error = nullptr;
  if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error) == SQLITE_OK) return Status::ok();
  std::string message = error ? error : sqlite3_errmsg(db);
  sqlite3_free(error);
  return ioError("{}: running \"{}\": {}", quoted(path), sql, message);
}

// A write transaction, rolled back unless committed. IMMEDIATE takes the write lock at once, so
// the checks inside it see what the write will be applied to.
class Transaction {
 public:
  Transaction(sqlite3* db, const fs::path& path) : db_(db), path_(path) {}
  ~Transaction() {
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  // "BEGIN" for a read snapshot.
  Status begin(const char* sql = "BEGIN IMMEDIATE") {
    KILN_RETURN_IF_ERROR(exec(db_, path_, sql));
    open_ = true;
    return Status::ok();
  }
  Status commit() {
    KILN_RETURN_IF_ERROR(exec(db_, path_, "COMMIT"));
    open_ = false;
    return Status::ok();
  }

 private:
  sqlite3* db_;
  const fs::path& path_;
  bool open_ = false;
};

// The single integer a pragma such as application_id returns.
Result<int64_t> pragmaInteger(sqlite3* db, const fs::path& path, const char* sql) {
  Statement statement(db, path, sql);
  KILN_ASSIGN_OR_RETURN(bool row, statement.step());
  if (!row) return ioError("{}: \"{}\" returned nothing", quoted(path), sql);
  return statement.integer(0);
}

// Per-connection settings; journal_mode is persistent in the file but restating it is a no-op.
// FULL synchronous in WAL mode syncs the log at every commit: a committed trial survives a
// power cut, not only a killed process.
Status configure(sqlite3* db, const fs::path& path) {
  if (sqlite3_busy_timeout(db, kBusyTimeoutMs) != SQLITE_OK) {
    return sqliteError(db, path, "setting the busy timeout");
  }
  {
    Statement statement(db, path, "PRAGMA journal_mode = WAL");
    KILN_ASSIGN_OR_RETURN(bool row, statement.step());
    std::string mode = row ? statement.text(0) : "";
    if (mode != "wal") {
      return ioError("{}: cannot switch to WAL journal mode (got '{}')", quoted(path), mode);
    }
  }
  return exec(db, path, "PRAGMA synchronous = FULL");
}

Status corrupt(const fs::path& path, const std::string& what) {
  return invalidInput("{} is corrupt: {}", quoted(path), what);
}

const char* const kTrialColumns =
    "iteration, phase, route, status, message, accuracy, timing, build_ms, engine_path, "
    "engine_hash, finished_at";

// One row of `trials` (columns in kTrialColumns order). SQLite's columns take any type, so each
// one's type is checked rather than converted.
Result<TrialRecord> trialFromRow(const Statement& row) {
  auto expect = [&](int column, int type, const char* name) -> Status {
    if (row.type(column) == type) return Status::ok();
    return invalidInput("column '{}' has the wrong type", name);
  };
  TrialRecord record;
  KILN_RETURN_IF_ERROR(expect(0, SQLITE_INTEGER, "iteration"));
  record.iteration = row.integer(0);
  KILN_RETURN_IF_ERROR(expect(1, SQLITE_INTEGER, "phase"));
  record.phase = static_cast<int>(row.integer(1));
  KILN_RETURN_IF_ERROR(expect(2, SQLITE_TEXT, "route"));
  record.route = row.text(2);
  KILN_RETURN_IF_ERROR(expect(3, SQLITE_TEXT, "status"));
  KILN_ASSIGN_OR_RETURN(record.status, parseTrialStatus(row.text(3)));
  KILN_RETURN_IF_ERROR(expect(4, SQLITE_TEXT, "message"));
  record.message = row.text(4);
  KILN_RETURN_IF_ERROR(expect(5, SQLITE_TEXT, "accuracy"));
  KILN_ASSIGN_OR_RETURN(json accuracy, parseJson(row.text(5), "accuracy"));
  KILN_ASSIGN_OR_RETURN(record.accuracy, accuracyFromJson(accuracy));
  if (row.type(6) != SQLITE_NULL) {
    KILN_RETURN_IF_ERROR(expect(6, SQLITE_TEXT, "timing"));
    KILN_ASSIGN_OR_RETURN(json timing, parseJson(row.text(6), "timing"));
    KILN_ASSIGN_OR_RETURN(record.timing, timingFromJson(timing));
  }
  if (row.type(7) != SQLITE_FLOAT && row.type(7) != SQLITE_INTEGER) {
    return invalidInput("column 'build_ms' has the wrong type");
  }
  record.buildMs = row.real(7);
  KILN_RETURN_IF_ERROR(expect(8, SQLITE_TEXT, "engine_path"));
  record.enginePath = row.text(8);
  KILN_RETURN_IF_ERROR(expect(9, SQLITE_TEXT, "engine_hash"));
  record.engineHash = row.text(9);
  KILN_RETURN_IF_ERROR(expect(10, SQLITE_TEXT, "finished_at"));
  record.finishedAt = row.text(10);
  return record;
}

// Checks the first bytes ourselves: SQLite treats a file shorter than one page as an empty
// database rather than an error, so a truncated cache would otherwise pass for a foreign one.
Status checkFileHeader(const fs::path& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return ioError("cannot read {}: {}", quoted(path), ec.message());
  std::ifstream in(path, std::ios::binary);
  if (!in) return ioError("cannot open {}: {}", quoted(path), std::strerror(errno));
  unsigned char header[100] = {};
  in.read(reinterpret_cast<char*>(header), sizeof header);
  static const char kMagic[] = "SQLite format 3";  // with its terminating NUL: 16 bytes
  if (size < sizeof header || std::memcmp(header, kMagic, sizeof kMagic) != 0) {
    return invalidInput("{} is not a SQLite database, so not a kiln tuning cache", quoted(path));
  }
  // Bytes 16-17: the page size, big-endian, with 1 meaning 65536.
  uintmax_t pageSize = (uintmax_t{header[16]} << 8) | header[17];
  if (pageSize == 1) pageSize = 65536;
  if (pageSize < 512 || size % pageSize != 0) {
    return corrupt(path, fmt::format("{} bytes is not a whole number of {}-byte pages (truncated?)",
                                     size, pageSize));
  }
  return Status::ok();
}

Result<std::map<std::string, std::string>> readHeader(sqlite3* db, const fs::path& path) {
  Statement select(db, path, "SELECT key, value FROM header");
  if (!select.prepared().isOk()) return corrupt(path, sqlite3_errmsg(db));
  std::map<std::string, std::string> header;
  for (;;) {
    KILN_ASSIGN_OR_RETURN(bool row, select.step());
    if (!row) break;
    if (select.type(0) != SQLITE_TEXT || select.type(1) != SQLITE_TEXT) {
      return corrupt(path, "a header row is not text");
    }
    header[select.text(0)] = select.text(1);
  }
  return header;
}

Status openConnection(const fs::path& path, int flags, sqlite3** db) {
  int rc = sqlite3_open_v2(path.c_str(), db, flags, nullptr);
  if (rc == SQLITE_OK) return Status::ok();
  Status status = sqliteError(*db, path, "opening");
  sqlite3_close_v2(*db);
  *db = nullptr;
  return status;
}

}  // namespace

const char* trialStatusName(TrialStatus status) {
  switch (status) {
    case TrialStatus::kOk:
      return "ok";
    case TrialStatus::kCrash:
      return "crash";
    case TrialStatus::kTimeout:
      return "timeout";
    case TrialStatus::kOom:
      return "oom";
    case TrialStatus::kBuildError:
      return "build-error";
    case TrialStatus::kAccuracyFail:
      return "accuracy-fail";
  }
  return "?";
}

Result<TrialStatus> parseTrialStatus(const std::string& text) {
  for (TrialStatus status :
       {TrialStatus::kOk, TrialStatus::kCrash, TrialStatus::kTimeout, TrialStatus::kOom,
        TrialStatus::kBuildError, TrialStatus::kAccuracyFail}) {
    if (text == trialStatusName(status)) return status;
  }
  return invalidInput(
      "unknown trial status '{}' (expected ok, crash, timeout, oom, build-error or accuracy-fail)",
      text);
}

json toJson(const TrialRecord& record) {
  return {{"iteration", record.iteration},
          {"phase", record.phase},
          {"route", record.route},
          {"status", trialStatusName(record.status)},
          {"message", record.message},
          {"accuracy", accuracyToJson(record.accuracy)},
          {"timing", timingToJson(record.timing)},
          {"build_ms", encodeDouble(record.buildMs)},
          {"engine_path", record.enginePath},
          {"engine_hash", record.engineHash},
          {"finished_at", record.finishedAt}};
}

Result<TrialRecord> trialFromJson(const json& object) {
  if (!object.is_object()) return invalidInput("trial is not a JSON object");
  TrialRecord record;
  std::string status;
  KILN_RETURN_IF_ERROR(readInt(object, "iteration", record.iteration));
  KILN_RETURN_IF_ERROR(readInt32(object, "phase", record.phase));
  KILN_RETURN_IF_ERROR(readString(object, "route", record.route));
  KILN_RETURN_IF_ERROR(readString(object, "status", status));
  KILN_ASSIGN_OR_RETURN(record.status, parseTrialStatus(status));
  KILN_RETURN_IF_ERROR(readString(object, "message", record.message));
  KILN_ASSIGN_OR_RETURN(const json* accuracy, field(object, "accuracy"));
  KILN_ASSIGN_OR_RETURN(record.accuracy, accuracyFromJson(*accuracy));
  KILN_ASSIGN_OR_RETURN(const json* timing, field(object, "timing"));
  KILN_ASSIGN_OR_RETURN(record.timing, timingFromJson(*timing));
  KILN_RETURN_IF_ERROR(readDouble(object, "build_ms", record.buildMs));
  KILN_RETURN_IF_ERROR(readString(object, "engine_path", record.enginePath));
  KILN_RETURN_IF_ERROR(readString(object, "engine_hash", record.engineHash));
  KILN_RETURN_IF_ERROR(readString(object, "finished_at", record.finishedAt));
  return record;
}

json toJson(const ComparisonRecord& record) {
  const PairedComparison& c = record.comparison;
  return {{"route", record.route},
          {"pairs", c.pairs},
          {"ratio_median", encodeDouble(c.ratioMedian)},
          {"ratio_low", encodeDouble(c.ratioLow)},
          {"ratio_high", encodeDouble(c.ratioHigh)},
          {"confidence", encodeDouble(c.confidence)},
          {"candidate_samples", encodeSamples(record.candidateSamples)},
          {"baseline_samples", encodeSamples(record.baselineSamples)}};
}

Result<ComparisonRecord> comparisonFromJson(const json& object) {
  if (!object.is_object()) return invalidInput("comparison is not an object");
  ComparisonRecord record;
  PairedComparison& c = record.comparison;
  Status status = readString(object, "route", record.route);
  if (status.isOk()) status = readInt32(object, "pairs", c.pairs);
  if (status.isOk()) status = readDouble(object, "ratio_median", c.ratioMedian);
  if (status.isOk()) status = readDouble(object, "ratio_low", c.ratioLow);
  if (status.isOk()) status = readDouble(object, "ratio_high", c.ratioHigh);
  if (status.isOk()) status = readDouble(object, "confidence", c.confidence);
  if (status.isOk()) status = readDoubles(object, "candidate_samples", record.candidateSamples);
  if (status.isOk()) status = readDoubles(object, "baseline_samples", record.baselineSamples);
  KILN_RETURN_IF_ERROR(status);
  return record;
}

// ---------------------------------------------------------------------------------------------
// TuneStore.

const char* networkFilesystemName(int64_t statfsType) {
  switch (static_cast<uint32_t>(statfsType)) {
    case NFS_SUPER_MAGIC:
      return "NFS";
    case SMB_SUPER_MAGIC:
      return "SMB";
    case CIFS_SUPER_MAGIC:
      return "CIFS/SMB";
    case SMB2_SUPER_MAGIC:
      return "SMB2";
    case V9FS_MAGIC:
      return "9P";
    case CEPH_SUPER_MAGIC:
      return "CephFS";
    case AFS_SUPER_MAGIC:
    case AFS_FS_MAGIC:
      return "AFS";
    case CODA_SUPER_MAGIC:
      return "Coda";
    case NCP_SUPER_MAGIC:
      return "NCP";
    case 0x0BD00BD0:
      return "Lustre";
    case 0x47504653:
      return "GPFS";
    default:
      return nullptr;
  }
}

Status checkLocalFilesystem(const fs::path& path) {
  // The file's folder: the file itself may not exist yet.
  const fs::path folder = fs::absolute(path).parent_path();
  struct statfs info {};
  if (::statfs(folder.c_str(), &info) != 0) {
    return ioError("cannot examine the filesystem of {}: {}", quoted(folder), std::strerror(errno));
  }
  if (const char* name = networkFilesystemName(static_cast<int64_t>(info.f_type))) {
    return invalidInput(
        "{} is on a network filesystem ({}): SQLite's locking is not reliable there, and a "
        "tuning cache that two machines write at once can be corrupted. Put --cache on a local "
        "disk; for a study shared between machines use a PostgreSQL store",
        quoted(path), name);
  }
  return Status::ok();
}

Result<TuneStore> TuneStore::create(const fs::path& path,
                                    const std::map<std::string, std::string>& header) {
  KILN_RETURN_IF_ERROR(checkLocalFilesystem(path));
  // O_EXCL makes "refuse an existing file" atomic; SQLite then opens the empty file, which it
  // treats as an empty database.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) {
      return invalidInput(
          "{} already exists: use --continue to resume that run, or pick another file",
          quoted(path));
    }
    return ioError("cannot create {}: {}", quoted(path), std::strerror(errno));
  }
  ::close(fd);

  auto build = [&]() -> Result<TuneStore> {
    sqlite3* db = nullptr;
    KILN_RETURN_IF_ERROR(openConnection(path, SQLITE_OPEN_READWRITE, &db));
    TuneStore store(path, db);
    KILN_RETURN_IF_ERROR(configure(db, path));
    Transaction transaction(db, path);
    KILN_RETURN_IF_ERROR(transaction.begin());
    // Pragma values cannot be bound; these are compile-time constants, not data.
    KILN_RETURN_IF_ERROR(exec(db, path, fmt::format("PRAGMA application_id = {}", kApplicationId)));
    KILN_RETURN_IF_ERROR(
        exec(db, path, fmt::format("PRAGMA user_version = {}", kStoreSchemaVersion)));
    KILN_RETURN_IF_ERROR(exec(db, path,
                              "CREATE TABLE header(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
                              "CREATE TABLE trials("
                              "  iteration INTEGER PRIMARY KEY,"
                              "  phase INTEGER NOT NULL,"
                              "  route TEXT NOT NULL UNIQUE,"
                              "  status TEXT NOT NULL,"
                              "  message TEXT NOT NULL,"
                              "  accuracy TEXT NOT NULL,"  // JSON array
                              "  timing TEXT,"             // JSON object, NULL when it never ran
                              "  build_ms REAL NOT NULL,"
                              "  engine_path TEXT NOT NULL,"
                              "  engine_hash TEXT NOT NULL,"
                              "  finished_at TEXT NOT NULL);"
                              "CREATE TABLE comparisons(route TEXT PRIMARY KEY,"
                              "  record TEXT NOT NULL);"));  // JSON object
    for (const auto& [key, value] : header) {
      Statement insert(db, path, "INSERT INTO header(key, value) VALUES(?1, ?2)");
      insert.bind(1, key);
      insert.bind(2, value);
      KILN_RETURN_IF_ERROR(insert.run());
    }
    KILN_RETURN_IF_ERROR(transaction.commit());
    store.header_ = header;
    return Result<TuneStore>(std::move(store));
  };
  Result<TuneStore> store = build();
  if (!store.isOk()) {
    // A half-made file would only be refused by the next create; the store is closed by now.
    std::error_code ec;
    fs::remove(path, ec);
    fs::remove(path.string() + "-wal", ec);
    fs::remove(path.string() + "-shm", ec);
  }
  return store;
}

Result<TuneStore> TuneStore::open(const fs::path& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) return ioError("{} does not exist", quoted(path));
  if (!fs::is_regular_file(path, ec)) return invalidInput("{} is not a file", quoted(path));
  KILN_RETURN_IF_ERROR(checkLocalFilesystem(path));
  KILN_RETURN_IF_ERROR(checkFileHeader(path));

  // Read-write (the tuner appends) but never CREATE: a missing file must stay missing.
  sqlite3* db = nullptr;
  KILN_RETURN_IF_ERROR(openConnection(path, SQLITE_OPEN_READWRITE, &db));
  TuneStore store(path, db);
  if (sqlite3_busy_timeout(db, kBusyTimeoutMs) != SQLITE_OK) {
    return sqliteError(db, path, "setting the busy timeout");
  }

  // Only reads until the file is known to be ours, so a refused file is left as it was.
  KILN_ASSIGN_OR_RETURN(int64_t applicationId, pragmaInteger(db, path, "PRAGMA application_id"));
  if (applicationId != kApplicationId) {
    return invalidInput(
        "{} is not a kiln tuning cache (SQLite application_id {:#x}, kiln's is {:#x})",
        quoted(path), applicationId, kApplicationId);
  }
  KILN_ASSIGN_OR_RETURN(int64_t version, pragmaInteger(db, path, "PRAGMA user_version"));
  if (version != kStoreSchemaVersion) {
    return invalidInput("{} has schema version {}, this kiln reads {}", quoted(path), version,
                        kStoreSchemaVersion);
  }
  {
    // The first row is "ok" or the first of up to 100 problems; a few say enough.
    Statement check(db, path, "PRAGMA quick_check");
    std::string verdict;
    for (int rows = 0; rows < 4; ++rows) {
      KILN_ASSIGN_OR_RETURN(bool row, check.step());
      if (!row) break;
      verdict += (verdict.empty() ? "" : "; ") + check.text(0);
    }
    if (verdict != "ok") return corrupt(path, "SQLite's quick_check says: " + verdict);
  }
  {
    std::set<std::string> tables;
    Statement list(db, path, "SELECT name FROM sqlite_master WHERE type = 'table'");
    for (;;) {
      KILN_ASSIGN_OR_RETURN(bool row, list.step());
      if (!row) break;
      tables.insert(list.text(0));
    }
    for (const char* table : {"header", "trials", "comparisons"}) {
      if (!tables.count(table)) return corrupt(path, fmt::format("table '{}' is missing", table));
    }
  }
  KILN_ASSIGN_OR_RETURN(store.header_, readHeader(db, path));
  // Every row is parsed now so that a damaged file is refused before the tuner relies on it.
  KILN_RETURN_IF_ERROR(store.trials().status());
  KILN_RETURN_IF_ERROR(store.comparisons().status());
  KILN_RETURN_IF_ERROR(configure(db, path));
  return Result<TuneStore>(std::move(store));
}

TuneStore::TuneStore(fs::path path, sqlite3* db) : path_(std::move(path)), db_(db) {
  struct stat status {};
  if (::stat(path_.c_str(), &status) == 0) {
    device_ = static_cast<uint64_t>(status.st_dev);
    inode_ = static_cast<uint64_t>(status.st_ino);
  }
}

TuneStore::TuneStore(TuneStore&& other) noexcept
    : path_(std::move(other.path_)),
      db_(std::exchange(other.db_, nullptr)),
      header_(std::move(other.header_)),
      device_(other.device_),
      inode_(other.inode_) {}

TuneStore& TuneStore::operator=(TuneStore&& other) noexcept {
  if (this != &other) {
    if (db_) sqlite3_close_v2(db_);
    path_ = std::move(other.path_);
    db_ = std::exchange(other.db_, nullptr);
    header_ = std::move(other.header_);
    device_ = other.device_;
    inode_ = other.inode_;
  }
  return *this;
}

Status TuneStore::checkSameFile() const {
  struct stat status {};
  if (::stat(path_.c_str(), &status) != 0 || static_cast<uint64_t>(status.st_dev) != device_ ||
      static_cast<uint64_t>(status.st_ino) != inode_) {
    return ioError(
        "{} was deleted or replaced while kiln was recording into it; the trials it held went "
        "with it, so this run stops here (restore the file and resume, or start again)",
        quoted(path_));
  }
  return Status::ok();
}

Status TuneStore::checkWritable() const {
  if (sqlite3_db_readonly(db_, "main") == 1 || ::access(path_.c_str(), W_OK) != 0) {
    return ioError("{} is read-only: kiln tune records every trial in it", quoted(path_));
  }
  const fs::path folder = path_.has_parent_path() ? path_.parent_path() : fs::path(".");
  if (::access(folder.c_str(), W_OK) != 0) {
    return ioError("the folder of {} is read-only: SQLite writes its log beside the cache",
                   quoted(path_));
  }
  return Status::ok();
}

TuneStore::~TuneStore() {
  if (db_) sqlite3_close_v2(db_);
}

Status TuneStore::setHeaderField(const std::string& key, const std::string& value) {
  KILN_RETURN_IF_ERROR(checkSameFile());
  Statement upsert(db_, path_,
                   "INSERT INTO header(key, value) VALUES(?1, ?2) "
                   "ON CONFLICT(key) DO UPDATE SET value = excluded.value");
  upsert.bind(1, key);
  upsert.bind(2, value);
  KILN_RETURN_IF_ERROR(upsert.run());
  header_[key] = value;
  return Status::ok();
}

Result<std::vector<TrialRecord>> TuneStore::trials() const {
  Statement select(db_, path_,
                   fmt::format("SELECT {} FROM trials ORDER BY iteration", kTrialColumns).c_str());
  if (!select.prepared().isOk()) return corrupt(path_, sqlite3_errmsg(db_));
  std::vector<TrialRecord> trials;
  for (;;) {
    KILN_ASSIGN_OR_RETURN(bool row, select.step());
    if (!row) break;
    Result<TrialRecord> record = trialFromRow(select);
    if (!record.isOk()) {
      return corrupt(path_,
                     fmt::format("trial row {}: {}", trials.size(), record.status().message()));
    }
    // addTrial keeps iterations 0, 1, 2, ...; a gap means rows were lost or edited.
    if (record->iteration != static_cast<int64_t>(trials.size())) {
      return corrupt(path_, fmt::format("trial iteration {} where {} was expected",
                                        record->iteration, trials.size()));
    }
    trials.push_back(std::move(record).value());
  }
  return trials;
}

Status TuneStore::addTrial(const TrialRecord& record) {
  KILN_RETURN_IF_ERROR(checkSameFile());
  Transaction transaction(db_, path_);
  KILN_RETURN_IF_ERROR(transaction.begin());
  KILN_ASSIGN_OR_RETURN(int64_t count, pragmaInteger(db_, path_, "SELECT count(*) FROM trials"));
  if (record.iteration != count) {
    return internalError("{}: trial of route '{}' has iteration {}, but {} trials are recorded",
                         quoted(path_), record.route, record.iteration, count);
  }
  {
    Statement find(db_, path_, "SELECT iteration FROM trials WHERE route = ?1");
    find.bind(1, record.route);
    KILN_ASSIGN_OR_RETURN(bool row, find.step());
    if (row) {
      return internalError(
          "{}: route '{}' is already recorded (iteration {}); iteration {} repeats it",
          quoted(path_), record.route, find.integer(0), record.iteration);
    }
  }
  Statement insert(db_, path_,
                   fmt::format("INSERT INTO trials({}) VALUES(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, "
                               "?10, ?11)",
                               kTrialColumns)
                       .c_str());
  insert.bind(1, record.iteration);
  insert.bind(2, int64_t{record.phase});
  insert.bind(3, record.route);
  insert.bind(4, std::string(trialStatusName(record.status)));
  insert.bind(5, record.message);
  insert.bind(6, dumpJson(accuracyToJson(record.accuracy)));
  if (record.timing) {
    insert.bind(7, dumpJson(timingToJson(record.timing)));
  } else {
    insert.bindNull(7);
  }
  insert.bind(8, record.buildMs);
  insert.bind(9, record.enginePath);
  insert.bind(10, record.engineHash);
  insert.bind(11, record.finishedAt);
  KILN_RETURN_IF_ERROR(insert.run());
  return transaction.commit();
}

Result<std::vector<ComparisonRecord>> TuneStore::comparisons() const {
  // rowid order is insertion order: the order setComparisons was given.
  Statement select(db_, path_, "SELECT route, record FROM comparisons ORDER BY rowid");
  if (!select.prepared().isOk()) return corrupt(path_, sqlite3_errmsg(db_));
  std::vector<ComparisonRecord> comparisons;
  for (;;) {
    KILN_ASSIGN_OR_RETURN(bool row, select.step());
    if (!row) break;
    auto parse = [&]() -> Result<ComparisonRecord> {
      if (select.type(0) != SQLITE_TEXT || select.type(1) != SQLITE_TEXT) {
        return invalidInput("a column is not text");
      }
      KILN_ASSIGN_OR_RETURN(json object, parseJson(select.text(1), "record"));
      KILN_ASSIGN_OR_RETURN(ComparisonRecord record, comparisonFromJson(object));
      if (record.route != select.text(0)) {
        return invalidInput("record is for route '{}', its row for '{}'", record.route,
                            select.text(0));
      }
      return record;
    };
    Result<ComparisonRecord> record = parse();
    if (!record.isOk()) {
      return corrupt(path_, fmt::format("comparison row {}: {}", comparisons.size(),
                                        record.status().message()));
    }
    comparisons.push_back(std::move(record).value());
  }
  return comparisons;
}

Status TuneStore::setComparisons(const std::vector<ComparisonRecord>& comparisons) {
  KILN_RETURN_IF_ERROR(checkSameFile());
  Transaction transaction(db_, path_);
  KILN_RETURN_IF_ERROR(transaction.begin());
  KILN_RETURN_IF_ERROR(exec(db_, path_, "DELETE FROM comparisons"));
  std::set<std::string> routes;
  for (const ComparisonRecord& record : comparisons) {
    if (!routes.insert(record.route).second) {
      return internalError("{}: route '{}' has two comparisons", quoted(path_), record.route);
    }
    Statement insert(db_, path_, "INSERT INTO comparisons(route, record) VALUES(?1, ?2)");
    insert.bind(1, record.route);
    insert.bind(2, dumpJson(toJson(record)));
    KILN_RETURN_IF_ERROR(insert.run());
  }
  return transaction.commit();
}

Result<std::string> TuneStore::exportJsonLines() const {
  // One read transaction, so that a tuner appending meanwhile cannot split the export.
  // The header is read from the file, not the copy taken at open: the tuner may have set the
  // decision since.
  Transaction snapshot(db_, path_);
  KILN_RETURN_IF_ERROR(snapshot.begin("BEGIN"));
  KILN_ASSIGN_OR_RETURN(auto header, readHeader(db_, path_));
  KILN_ASSIGN_OR_RETURN(std::vector<TrialRecord> trials, this->trials());
  KILN_ASSIGN_OR_RETURN(std::vector<ComparisonRecord> comparisons, this->comparisons());
  KILN_RETURN_IF_ERROR(snapshot.commit());

  std::string out = dumpJson(json{{"header", header}}) + "\n";
  for (const TrialRecord& trial : trials) out += dumpJson(toJson(trial)) + "\n";
  for (const ComparisonRecord& comparison : comparisons) {
    out += dumpJson(json{{"comparison", toJson(comparison)}}) + "\n";
  }
  return out;
}

}  // namespace kiln::tune
