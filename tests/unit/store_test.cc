// The tuner's SQLite result store: round trips, refusal of files that are not intact kiln
// caches (leaving them untouched), append invariants, comparisons and the JSON-lines export.
#include "kiln/tune/store.h"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

namespace kiln::tune {
namespace {

namespace fs = std::filesystem;

std::string readBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

void writeBytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

// Plain SQLite, outside kiln, as another tool (or a damaged disk) would leave the file.
void execRaw(const fs::path& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr),
            SQLITE_OK);
  char* error = nullptr;
  int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  std::string message = error ? error : "";
  sqlite3_free(error);
  sqlite3_close(db);
  ASSERT_EQ(rc, SQLITE_OK) << message;
}

bool sameDouble(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

void expectSameTrial(const TrialRecord& a, const TrialRecord& b) {
  SCOPED_TRACE("trial " + std::to_string(a.iteration));
  EXPECT_EQ(a.iteration, b.iteration);
  EXPECT_EQ(a.phase, b.phase);
  EXPECT_EQ(a.route, b.route);
  EXPECT_EQ(a.status, b.status);
  EXPECT_EQ(a.message, b.message);
  ASSERT_EQ(a.accuracy.size(), b.accuracy.size());
  for (size_t i = 0; i < a.accuracy.size(); ++i) {
    EXPECT_EQ(a.accuracy[i].output, b.accuracy[i].output);
    EXPECT_TRUE(sameDouble(a.accuracy[i].loss, b.accuracy[i].loss))
        << a.accuracy[i].loss << " vs " << b.accuracy[i].loss;
    EXPECT_TRUE(sameDouble(a.accuracy[i].threshold, b.accuracy[i].threshold));
    EXPECT_EQ(a.accuracy[i].pass, b.accuracy[i].pass);
    EXPECT_EQ(a.accuracy[i].note, b.accuracy[i].note);
  }
  ASSERT_EQ(a.timing.has_value(), b.timing.has_value());
  if (a.timing) {
    const TimingSummary& x = a.timing->summary;
    const TimingSummary& y = b.timing->summary;
    EXPECT_EQ(x.count, y.count);
    EXPECT_DOUBLE_EQ(x.min, y.min);
    EXPECT_DOUBLE_EQ(x.median, y.median);
    EXPECT_DOUBLE_EQ(x.mean, y.mean);
    EXPECT_DOUBLE_EQ(x.p90, y.p90);
    EXPECT_DOUBLE_EQ(x.p99, y.p99);
    EXPECT_DOUBLE_EQ(x.max, y.max);
    EXPECT_DOUBLE_EQ(x.stddev, y.stddev);
    EXPECT_DOUBLE_EQ(a.timing->ciLow, b.timing->ciLow);
    EXPECT_DOUBLE_EQ(a.timing->ciHigh, b.timing->ciHigh);
    EXPECT_DOUBLE_EQ(a.timing->confidence, b.timing->confidence);
    EXPECT_EQ(a.timing->samples, b.timing->samples);  // bit-exact: doubles round-trip
  }
  EXPECT_DOUBLE_EQ(a.buildMs, b.buildMs);
  EXPECT_EQ(a.enginePath, b.enginePath);
  EXPECT_EQ(a.engineHash, b.engineHash);
  EXPECT_EQ(a.finishedAt, b.finishedAt);
}

// A measurement built by hand (not analyzeTimings) so the test pins exact values.
TrialTiming makeTiming(std::vector<double> samples, double median) {
  TrialTiming timing;
  timing.samples = std::move(samples);
  timing.summary.count = static_cast<int>(timing.samples.size());
  timing.summary.min = 1.0 / 3.0;
  timing.summary.median = median;
  timing.summary.mean = median + 0.01;
  timing.summary.p90 = median + 0.2;
  timing.summary.p99 = median + 0.3;
  timing.summary.max = median + 0.4;
  timing.summary.stddev = 0.0123456789;
  timing.ciLow = median - 0.05;
  timing.ciHigh = median + 0.05;
  timing.confidence = 0.95;
  return timing;
}

// Three trials: ok with timing and accuracy, a crash with no timing, an accuracy failure with
// a NaN loss (and an infinite one).
std::vector<TrialRecord> sampleTrials() {
  TrialRecord ok;
  ok.iteration = 0;
  ok.phase = 1;
  ok.route = "";
  ok.status = TrialStatus::kOk;
  ok.accuracy = {{"logits", 3.5e-7, 1e-5, true, ""}, {"aux", 0.0, 1e-3, true, ""}};
  ok.timing = makeTiming({1.25, 1.5, 1.125, 1.0 / 7.0, 2.0}, 1.25);
  ok.buildMs = 12.75;
  ok.enginePath = "engines/0.kiln";
  ok.engineHash = "sha256:0011";
  ok.finishedAt = "2026-12-02T10:00:00Z";

  TrialRecord crash;
  crash.iteration = 1;
  crash.phase = 1;
  crash.route = "cpu.gemm.tile=8";
  crash.status = TrialStatus::kCrash;
  crash.message = "killed by signal 11 (SIGSEGV)\nwith a second line and 'quotes'";
  crash.buildMs = 3.5;
  crash.finishedAt = "2026-12-02T10:00:01Z";

  TrialRecord fail;
  fail.iteration = 2;
  fail.phase = 2;
  fail.route = "cpu.conv.algo=winograd,cpu.gemm.tile=16";
  fail.status = TrialStatus::kAccuracyFail;
  fail.message = "output 'logits' misses its threshold";
  fail.accuracy = {
      {"logits", std::numeric_limits<double>::quiet_NaN(), 1e-5, false,
       "NaN where the reference is finite at element 12"},
      {"aux", std::numeric_limits<double>::infinity(), 1e-3, false, "Inf at element 0"}};
  fail.timing = makeTiming({0.9, 0.95, 0.875}, 0.9);
  fail.buildMs = 20;
  fail.enginePath = "engines/2.kiln";
  fail.engineHash = "sha256:2222";
  fail.finishedAt = "2026-12-02T10:00:02Z";
  return {ok, crash, fail};
}

std::vector<ComparisonRecord> sampleComparisons() {
  ComparisonRecord a;
  a.route = "cpu.conv.algo=im2col";
  a.comparison.pairs = 3;
  a.comparison.ratioMedian = 0.8;
  a.comparison.ratioLow = 0.75;
  a.comparison.ratioHigh = 0.85;
  a.comparison.confidence = 0.9;
  a.candidateSamples = {0.8, 0.81, 0.79};
  a.baselineSamples = {1.0, 1.01, 0.99};
  ComparisonRecord b;
  b.route = "cpu.gemm.tile=16";
  b.comparison.pairs = 2;
  b.comparison.ratioMedian = 1.1;
  b.comparison.ratioLow = 1.0;
  b.comparison.ratioHigh = 1.2;
  b.candidateSamples = {1.1, 1.1};
  b.baselineSamples = {1.0, 1.0};
  // Deliberately not in route order: the store keeps the order it was given.
  return {b, a};
}

void expectSameComparison(const ComparisonRecord& a, const ComparisonRecord& b) {
  EXPECT_EQ(a.route, b.route);
  EXPECT_EQ(a.comparison.pairs, b.comparison.pairs);
  EXPECT_DOUBLE_EQ(a.comparison.ratioMedian, b.comparison.ratioMedian);
  EXPECT_DOUBLE_EQ(a.comparison.ratioLow, b.comparison.ratioLow);
  EXPECT_DOUBLE_EQ(a.comparison.ratioHigh, b.comparison.ratioHigh);
  EXPECT_DOUBLE_EQ(a.comparison.confidence, b.comparison.confidence);
  EXPECT_EQ(a.candidateSamples, b.candidateSamples);
  EXPECT_EQ(a.baselineSamples, b.baselineSamples);
}

const std::map<std::string, std::string> kHeader = {
    {"model_hash", "sha256:abcd"}, {"kiln_version", "0.1.0"}, {"strategy", "fast"}};

class TuneStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() / ("kiln_store_test_" + std::to_string(::getpid()) + "_" +
                                        std::to_string(counter++) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A closed store holding the three sample trials.
  fs::path makeStore(const std::string& name = "tune.db") {
    fs::path path = dir_ / name;
    auto store = TuneStore::create(path, kHeader);
    EXPECT_TRUE(store.isOk()) << store.status().toString();
    if (!store.isOk()) return path;
    for (const TrialRecord& trial : sampleTrials()) {
      Status status = store->addTrial(trial);
      EXPECT_TRUE(status.isOk()) << status.toString();
    }
    return path;
  }

  // Opening `path` fails with a message naming the file and containing `reason`, and the file's
  // bytes are what they were.
  void expectRefused(const fs::path& path, const std::string& reason) {
    const std::string before = readBytes(path);
    auto store = TuneStore::open(path);
    ASSERT_FALSE(store.isOk());
    EXPECT_NE(store.status().message().find(reason), std::string::npos) << store.status().message();
    EXPECT_NE(store.status().message().find(path.string()), std::string::npos)
        << store.status().message();
    EXPECT_EQ(readBytes(path), before) << "a refused file was modified";
    EXPECT_FALSE(fs::exists(path.string() + "-wal")) << "a refused file was left a WAL";
  }

  fs::path dir_;
};

TEST_F(TuneStoreTest, RoundTripsTrialsAndHeader) {
  fs::path path = dir_ / "tune.db";
  const std::vector<TrialRecord> trials = sampleTrials();
  {
    auto store = TuneStore::create(path, kHeader);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    EXPECT_EQ(store->path(), path);
    EXPECT_EQ(store->header(), kHeader);
    for (const TrialRecord& trial : trials) ASSERT_TRUE(store->addTrial(trial).isOk());
    auto same = store->trials();
    ASSERT_TRUE(same.isOk()) << same.status().toString();
    ASSERT_EQ(same->size(), 3u);
    for (size_t i = 0; i < trials.size(); ++i) expectSameTrial((*same)[i], trials[i]);
  }
  // The store object is gone (connection closed); a new one sees every row.
  auto reopened = TuneStore::open(path);
  ASSERT_TRUE(reopened.isOk()) << reopened.status().toString();
  EXPECT_EQ(reopened->header(), kHeader);
  auto read = reopened->trials();
  ASSERT_TRUE(read.isOk()) << read.status().toString();
  ASSERT_EQ(read->size(), 3u);
  for (size_t i = 0; i < trials.size(); ++i) expectSameTrial((*read)[i], trials[i]);
  EXPECT_TRUE(std::isnan((*read)[2].accuracy[0].loss));
  EXPECT_TRUE(std::isinf((*read)[2].accuracy[1].loss));
  EXPECT_FALSE((*read)[1].timing.has_value());
}

TEST_F(TuneStoreTest, SetsTheFileUpAsKilnsWalDatabase) {
  fs::path path = makeStore();
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  auto pragma = [&](const char* sql) {
    sqlite3_stmt* statement = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db, sql, -1, &statement, nullptr), SQLITE_OK);
    EXPECT_EQ(sqlite3_step(statement), SQLITE_ROW);
    std::string value = reinterpret_cast<const char*>(sqlite3_column_text(statement, 0));
    sqlite3_finalize(statement);
    return value;
  };
  EXPECT_EQ(pragma("PRAGMA application_id"), std::to_string(0x4B494C4E));
  EXPECT_EQ(pragma("PRAGMA user_version"), std::to_string(kStoreSchemaVersion));
  EXPECT_EQ(pragma("PRAGMA journal_mode"), "wal");
  // Plain columns where queries want them.
  EXPECT_EQ(pragma("SELECT status FROM trials WHERE iteration = 1"), "crash");
  EXPECT_EQ(pragma("SELECT count(*) FROM trials WHERE timing IS NULL"), "1");
  EXPECT_EQ(pragma("SELECT value FROM header WHERE key = 'model_hash'"), "sha256:abcd");
  sqlite3_close(db);
}

TEST_F(TuneStoreTest, ReaderSeesRowsWhileTheWriterIsOpen) {
  fs::path path = dir_ / "tune.db";
  auto writer = TuneStore::create(path, kHeader);
  ASSERT_TRUE(writer.isOk()) << writer.status().toString();
  const std::vector<TrialRecord> trials = sampleTrials();
  ASSERT_TRUE(writer->addTrial(trials[0]).isOk());
  // `kiln cache export` opens the file while the tuner still holds it.
  auto reader = TuneStore::open(path);
  ASSERT_TRUE(reader.isOk()) << reader.status().toString();
  EXPECT_EQ(reader->trials()->size(), 1u);
  ASSERT_TRUE(writer->addTrial(trials[1]).isOk());
  EXPECT_EQ(reader->trials()->size(), 2u);
  auto lines = reader->exportJsonLines();
  ASSERT_TRUE(lines.isOk()) << lines.status().toString();
}

TEST_F(TuneStoreTest, MovedStoreKeepsWorking) {
  fs::path path = dir_ / "tune.db";
  const std::vector<TrialRecord> trials = sampleTrials();
  {
    auto created = TuneStore::create(path, kHeader);
    ASSERT_TRUE(created.isOk());
    TuneStore moved(std::move(created).value());
    ASSERT_TRUE(moved.addTrial(trials[0]).isOk());
    auto other = TuneStore::create(dir_ / "other.db", {});
    ASSERT_TRUE(other.isOk());
    *other = std::move(moved);  // closes other.db, takes tune.db
    EXPECT_EQ(other->path(), path);
    EXPECT_EQ(other->header(), kHeader);
    ASSERT_TRUE(other->addTrial(trials[1]).isOk());
  }
  auto reopened = TuneStore::open(path);
  ASSERT_TRUE(reopened.isOk()) << reopened.status().toString();
  EXPECT_EQ(reopened->trials()->size(), 2u);
  EXPECT_TRUE(TuneStore::open(dir_ / "other.db").isOk());
}

TEST_F(TuneStoreTest, CreateRefusesAnExistingFile) {
  fs::path path = dir_ / "precious.db";
  writeBytes(path, "results of last week\n");
  auto store = TuneStore::create(path, kHeader);
  ASSERT_FALSE(store.isOk());
  EXPECT_NE(store.status().message().find(path.string()), std::string::npos);
  EXPECT_NE(store.status().message().find("--continue"), std::string::npos)
      << store.status().message();
  EXPECT_EQ(readBytes(path), "results of last week\n");

  // An existing store too: its trials are kept.
  fs::path existing = makeStore();
  const std::string before = readBytes(existing);
  EXPECT_FALSE(TuneStore::create(existing, {}).isOk());
  EXPECT_EQ(readBytes(existing), before);
  EXPECT_EQ(TuneStore::open(existing)->trials()->size(), 3u);
}

// SQLite's locking is unreliable on network filesystems: the store refuses them by statfs's
// filesystem type. No network filesystem can be mounted here, so the classification is checked
// by its magic numbers, and a local folder must pass.
TEST_F(TuneStoreTest, NetworkFilesystemsAreRecognisedAndLocalOnesPass) {
  using kiln::tune::networkFilesystemName;
  EXPECT_STREQ(networkFilesystemName(0x6969), "NFS");
  EXPECT_STREQ(networkFilesystemName(0xFF534D42), "CIFS/SMB");
  EXPECT_STREQ(networkFilesystemName(0xFE534D42), "SMB2");
  EXPECT_STREQ(networkFilesystemName(0x01021997), "9P");
  EXPECT_STREQ(networkFilesystemName(0x00C36400), "CephFS");
  EXPECT_STREQ(networkFilesystemName(0x0BD00BD0), "Lustre");
  EXPECT_STREQ(networkFilesystemName(0x47504653), "GPFS");
  EXPECT_EQ(networkFilesystemName(0xEF53), nullptr);      // ext4
  EXPECT_EQ(networkFilesystemName(0x58465342), nullptr);  // XFS
  EXPECT_EQ(networkFilesystemName(0x01021994), nullptr);  // tmpfs
  EXPECT_TRUE(kiln::tune::checkLocalFilesystem(dir_ / "new.db").isOk());
  EXPECT_TRUE(TuneStore::create(dir_ / "new.db", kHeader).isOk());
}

TEST_F(TuneStoreTest, OpenRefusesAMissingFileWithoutCreatingIt) {
  fs::path path = dir_ / "missing.db";
  auto store = TuneStore::open(path);
  ASSERT_FALSE(store.isOk());
  EXPECT_NE(store.status().message().find("does not exist"), std::string::npos);
  EXPECT_NE(store.status().message().find(path.string()), std::string::npos);
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(TuneStoreTest, OpenRefusesATextFile) {
  fs::path path = dir_ / "hello.txt";
  writeBytes(path, "hello");
  expectRefused(path, "not a SQLite database");
  // Longer than a SQLite header, still not one.
  writeBytes(path, std::string(8192, 'x'));
  expectRefused(path, "not a SQLite database");
}

TEST_F(TuneStoreTest, OpenRefusesATruncatedStore) {
  fs::path path = makeStore();
  fs::path truncated = dir_ / "truncated.db";
  writeBytes(truncated, readBytes(path).substr(0, 100));
  expectRefused(truncated, "corrupt");
}

TEST_F(TuneStoreTest, OpenRefusesAnotherApplicationsDatabase) {
  fs::path path = dir_ / "foreign.db";
  execRaw(path, "CREATE TABLE trials(x INTEGER); INSERT INTO trials VALUES(1);");
  expectRefused(path, "not a kiln tuning cache");
}

TEST_F(TuneStoreTest, OpenRefusesAnotherSchemaVersion) {
  fs::path path = makeStore();
  execRaw(path, "PRAGMA user_version = 99");
  expectRefused(path, "schema version 99, this kiln reads 1");
}

TEST_F(TuneStoreTest, OpenRefusesARowThatDoesNotParse) {
  fs::path path = makeStore();
  execRaw(path, "UPDATE trials SET status = 'exploded' WHERE iteration = 1");
  expectRefused(path, "corrupt");
  expectRefused(path, "exploded");

  fs::path badJson = makeStore("bad_json.db");
  execRaw(badJson, "UPDATE trials SET accuracy = '[{\"output\": ' WHERE iteration = 0");
  expectRefused(badJson, "corrupt");
  expectRefused(badJson, "accuracy");

  fs::path badField = makeStore("bad_field.db");
  execRaw(badField, "UPDATE trials SET timing = '{\"count\": 3}' WHERE iteration = 0");
  expectRefused(badField, "corrupt");
  expectRefused(badField, "min");

  fs::path gap = makeStore("gap.db");
  execRaw(gap, "DELETE FROM trials WHERE iteration = 1");
  expectRefused(gap, "corrupt");
}

TEST_F(TuneStoreTest, OpenRefusesAMissingTable) {
  fs::path path = makeStore();
  execRaw(path, "DROP TABLE comparisons");
  expectRefused(path, "corrupt");
  expectRefused(path, "comparisons");
}

TEST_F(TuneStoreTest, OpenRefusesDamagedPages) {
  // Enough trials to fill several pages, then garbage over a page that is not the header.
  fs::path path = dir_ / "damaged.db";
  {
    auto store = TuneStore::create(path, kHeader);
    ASSERT_TRUE(store.isOk());
    TrialRecord trial = sampleTrials()[0];
    trial.message = std::string(500, 'm');
    for (int i = 0; i < 60; ++i) {
      trial.iteration = i;
      trial.route = "cpu.gemm.tile=" + std::to_string(i);
      ASSERT_TRUE(store->addTrial(trial).isOk());
    }
  }
  std::string bytes = readBytes(path);
  ASSERT_GE(bytes.size(), 4u * 4096);
  for (size_t i = 4096; i < 3 * 4096; ++i) bytes[i] = static_cast<char>(0xA5 ^ (i * 7));
  writeBytes(path, bytes);
  expectRefused(path, "corrupt");
}

TEST_F(TuneStoreTest, AddTrialRefusesDuplicateRoutesAndOutOfOrderIterations) {
  fs::path path = makeStore();
  auto store = TuneStore::open(path);
  ASSERT_TRUE(store.isOk()) << store.status().toString();

  TrialRecord repeat = sampleTrials()[1];
  repeat.iteration = 3;
  Status status = store->addTrial(repeat);
  ASSERT_FALSE(status.isOk());
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_NE(status.message().find("cpu.gemm.tile=8"), std::string::npos) << status.message();

  TrialRecord skip = sampleTrials()[1];
  skip.route = "cpu.gemm.tile=32";
  skip.iteration = 5;
  status = store->addTrial(skip);
  ASSERT_FALSE(status.isOk());
  EXPECT_EQ(status.code(), StatusCode::kInternal);
  EXPECT_NE(status.message().find("iteration 5"), std::string::npos) << status.message();

  skip.iteration = 2;  // already taken
  EXPECT_FALSE(store->addTrial(skip).isOk());

  // The refusals left nothing behind, and the right next trial still goes in.
  EXPECT_EQ(store->trials()->size(), 3u);
  skip.iteration = 3;
  ASSERT_TRUE(store->addTrial(skip).isOk());
  auto reopened = TuneStore::open(path);
  ASSERT_TRUE(reopened.isOk());
  ASSERT_EQ(reopened->trials()->size(), 4u);
  EXPECT_EQ(reopened->trials()->back().route, "cpu.gemm.tile=32");
}

TEST_F(TuneStoreTest, SetHeaderFieldUpserts) {
  fs::path path = makeStore();
  {
    auto store = TuneStore::open(path);
    ASSERT_TRUE(store.isOk());
    ASSERT_TRUE(store->setHeaderField("decision", "cpu.gemm.tile=16").isOk());
    ASSERT_TRUE(store->setHeaderField("strategy", "mixed").isOk());
    EXPECT_EQ(store->header().at("decision"), "cpu.gemm.tile=16");
    EXPECT_EQ(store->header().at("strategy"), "mixed");
  }
  auto reopened = TuneStore::open(path);
  ASSERT_TRUE(reopened.isOk());
  auto expected = kHeader;
  expected["decision"] = "cpu.gemm.tile=16";
  expected["strategy"] = "mixed";
  EXPECT_EQ(reopened->header(), expected);
}

TEST_F(TuneStoreTest, ComparisonsRoundTripAndAreReplaced) {
  fs::path path = makeStore();
  const std::vector<ComparisonRecord> comparisons = sampleComparisons();
  {
    auto store = TuneStore::open(path);
    ASSERT_TRUE(store.isOk());
    EXPECT_TRUE(store->comparisons()->empty());
    ASSERT_TRUE(store->setComparisons(comparisons).isOk());
  }
  {
    auto store = TuneStore::open(path);
    ASSERT_TRUE(store.isOk());
    auto read = store->comparisons();
    ASSERT_TRUE(read.isOk()) << read.status().toString();
    ASSERT_EQ(read->size(), 2u);
    for (size_t i = 0; i < comparisons.size(); ++i) {
      expectSameComparison((*read)[i], comparisons[i]);
    }
    // A list with a route twice is refused as a whole; the previous round stays.
    EXPECT_FALSE(store->setComparisons({comparisons[0], comparisons[0]}).isOk());
    EXPECT_EQ(store->comparisons()->size(), 2u);
    ASSERT_TRUE(store->setComparisons({comparisons[1]}).isOk());
  }
  auto store = TuneStore::open(path);
  ASSERT_TRUE(store.isOk());
  auto read = store->comparisons();
  ASSERT_TRUE(read.isOk());
  ASSERT_EQ(read->size(), 1u);
  expectSameComparison((*read)[0], comparisons[1]);
}

TEST_F(TuneStoreTest, ExportsOneJsonObjectPerLine) {
  fs::path path = makeStore();
  auto store = TuneStore::open(path);
  ASSERT_TRUE(store.isOk());
  ASSERT_TRUE(store->setComparisons(sampleComparisons()).isOk());
  auto text = store->exportJsonLines();
  ASSERT_TRUE(text.isOk()) << text.status().toString();

  std::vector<std::string> lines;
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 1u + 3u + 2u);

  std::vector<nlohmann::json> parsed;
  for (const std::string& line : lines) {
    parsed.push_back(nlohmann::json::parse(line, nullptr, false));
    ASSERT_FALSE(parsed.back().is_discarded()) << line;
    ASSERT_TRUE(parsed.back().is_object()) << line;
  }
  EXPECT_EQ(parsed[0]["header"]["model_hash"], "sha256:abcd");
  EXPECT_EQ(parsed[0]["header"].size(), kHeader.size());

  const std::vector<TrialRecord> trials = sampleTrials();
  for (size_t i = 0; i < trials.size(); ++i) {
    auto trial = trialFromJson(parsed[1 + i]);
    ASSERT_TRUE(trial.isOk()) << trial.status().toString();
    expectSameTrial(*trial, trials[i]);
  }
  EXPECT_NE(lines[3].find("\"nan\""), std::string::npos) << lines[3];
  EXPECT_NE(lines[3].find("\"inf\""), std::string::npos) << lines[3];
  EXPECT_EQ(parsed[1]["status"], "ok");
  EXPECT_TRUE(parsed[2]["timing"].is_null());
  EXPECT_EQ(parsed[1]["timing"]["samples"].size(), 5u);
  EXPECT_EQ(parsed[4]["comparison"]["route"], "cpu.gemm.tile=16");
  EXPECT_EQ(parsed[5]["comparison"]["route"], "cpu.conv.algo=im2col");
  EXPECT_EQ(parsed[5]["comparison"]["candidate_samples"].size(), 3u);
}

TEST(TrialJson, RoundTripsAndRejectsMissingOrIllTypedFields) {
  const TrialRecord record = sampleTrials()[2];
  nlohmann::json json = toJson(record);
  auto back = trialFromJson(json);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  expectSameTrial(*back, record);

  for (const char* key : {"iteration", "phase", "route", "status", "message", "accuracy", "timing",
                          "build_ms", "engine_path", "engine_hash", "finished_at"}) {
    nlohmann::json missing = json;
    missing.erase(key);
    auto result = trialFromJson(missing);
    ASSERT_FALSE(result.isOk()) << key;
    EXPECT_NE(result.status().message().find(key), std::string::npos) << result.status().message();
  }
  nlohmann::json wrong = json;
  wrong["iteration"] = "two";
  EXPECT_FALSE(trialFromJson(wrong).isOk());
  wrong = json;
  wrong["status"] = "exploded";
  EXPECT_FALSE(trialFromJson(wrong).isOk());
  wrong = json;
  wrong["accuracy"][0]["loss"] = "lots";
  EXPECT_FALSE(trialFromJson(wrong).isOk());
  wrong = json;
  wrong["accuracy"][0].erase("pass");
  EXPECT_FALSE(trialFromJson(wrong).isOk());
  wrong = json;
  wrong["timing"]["samples"] = 3;
  EXPECT_FALSE(trialFromJson(wrong).isOk());
  EXPECT_FALSE(trialFromJson(nlohmann::json::array()).isOk());
}

TEST(TrialStatusNames, RoundTrip) {
  for (TrialStatus status :
       {TrialStatus::kOk, TrialStatus::kCrash, TrialStatus::kTimeout, TrialStatus::kOom,
        TrialStatus::kBuildError, TrialStatus::kAccuracyFail}) {
    auto parsed = parseTrialStatus(trialStatusName(status));
    ASSERT_TRUE(parsed.isOk());
    EXPECT_EQ(*parsed, status);
  }
  EXPECT_STREQ(trialStatusName(TrialStatus::kBuildError), "build-error");
  EXPECT_FALSE(parseTrialStatus("exploded").isOk());
}

// Regression: significance once depended on a flag set only by analyzeTimings, so a timing read
// back from the store (on --continue) was never significant and mixed search's second phase
// came out empty after a resume.
TEST_F(TuneStoreTest, TimingsReadBackDecideSignificanceAsBefore) {
  std::vector<double> slow, fast;
  for (int i = 0; i < 40; ++i) {
    slow.push_back(10.0 + 0.01 * (i % 7));
    fast.push_back(8.0 + 0.01 * (i % 5));
  }
  TrialRecord base, gain;
  base.iteration = 0;
  base.timing = analyzeTimings(slow);
  gain.iteration = 1;
  gain.route = "-graph.layout=nhwc";
  gain.timing = analyzeTimings(fast);
  ASSERT_TRUE(significantlyFaster(*gain.timing, *base.timing));
  const fs::path path = dir_ / "tune.db";
  {
    auto store = TuneStore::create(path, kHeader);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    ASSERT_TRUE(store->addTrial(base).isOk());
    ASSERT_TRUE(store->addTrial(gain).isOk());
  }
  auto store = TuneStore::open(path);
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  auto read = store->trials();
  ASSERT_TRUE(read.isOk());
  ASSERT_EQ(read->size(), 2u);
  EXPECT_TRUE((*read)[1].timing->reachesConfidence());
  EXPECT_TRUE(significantlyFaster(*(*read)[1].timing, *(*read)[0].timing));
  EXPECT_FALSE(significantlyFaster(*(*read)[0].timing, *(*read)[1].timing));
}

// A microsecond-scale model timed for a second gives a million samples: the store keeps every
// k-th (at most kStoredSamples), while the summary and the intervals, computed from all of them,
// read back unchanged. Before, each such trial stored 11 MB of JSON.
TEST_F(TuneStoreTest, ManySamplesAreThinnedAndTheStatisticsKept) {
  std::vector<double> samples, baseline;
  const size_t count = 10 * kStoredSamples + 3;
  for (size_t i = 0; i < count; ++i) {
    samples.push_back(0.001 + 1e-6 * static_cast<double>(i % 97));
    baseline.push_back(0.002 + 1e-6 * static_cast<double>(i % 89));
  }
  TrialRecord trial;
  trial.iteration = 0;
  trial.timing = analyzeTimings(samples);
  ComparisonRecord comparison;
  comparison.route = "-graph.layout=nhwc";
  comparison.candidateSamples = samples;
  comparison.baselineSamples = baseline;
  comparison.comparison = comparePaired(samples, baseline);
  const fs::path path = dir_ / "tune.db";
  {
    auto store = TuneStore::create(path, kHeader);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    ASSERT_TRUE(store->addTrial(trial).isOk());
    ASSERT_TRUE(store->setComparisons({comparison}).isOk());
  }
  EXPECT_LT(fs::file_size(path), 1u << 20);
  auto store = TuneStore::open(path);
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  auto trials = store->trials();
  ASSERT_TRUE(trials.isOk());
  const TrialTiming& read = *(*trials)[0].timing;
  // Every 11th sample (the smallest stride that keeps at most kStoredSamples), from the first.
  ASSERT_EQ(read.samples.size(), (count + 10) / 11);
  EXPECT_LE(read.samples.size(), kStoredSamples);
  for (size_t i = 0; i < read.samples.size(); ++i) ASSERT_EQ(read.samples[i], samples[11 * i]);
  EXPECT_EQ(read.summary.count, static_cast<int>(count));
  EXPECT_EQ(read.summary.median, trial.timing->summary.median);
  EXPECT_EQ(read.ciLow, trial.timing->ciLow);
  EXPECT_EQ(read.ciHigh, trial.timing->ciHigh);
  auto comparisons = store->comparisons();
  ASSERT_TRUE(comparisons.isOk());
  const ComparisonRecord& pair = (*comparisons)[0];
  ASSERT_EQ(pair.candidateSamples.size(), pair.baselineSamples.size());
  EXPECT_LE(pair.candidateSamples.size(), kStoredSamples);
  EXPECT_EQ(pair.baselineSamples[1], baseline[11]);
  EXPECT_EQ(pair.comparison.pairs, static_cast<int>(count));
  EXPECT_EQ(pair.comparison.ratioHigh, comparison.comparison.ratioHigh);
}

// A cache deleted or replaced while a run records into it: SQLite would go on writing into the
// unlinked file and every later trial would vanish with it, so each write checks the path first.
TEST_F(TuneStoreTest, WritesStopWhenTheFileIsDeletedOrReplaced) {
  const std::vector<TrialRecord> trials = sampleTrials();
  for (bool replace : {false, true}) {
    SCOPED_TRACE(replace ? "replaced" : "deleted");
    const fs::path path = dir_ / "fresh.db";
    auto store = TuneStore::create(path, kHeader);
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    ASSERT_TRUE(store->addTrial(trials[0]).isOk());
    fs::remove(path);
    if (replace) fs::copy_file(makeStore("other.db"), path);
    const Status added = store->addTrial(trials[1]);
    ASSERT_FALSE(added.isOk());
    EXPECT_NE(added.message().find("was deleted or replaced while kiln was recording into it"),
              std::string::npos)
        << added.message();
    EXPECT_FALSE(store->setComparisons({}).isOk());
    EXPECT_FALSE(store->setHeaderField("k", "v").isOk());
    fs::remove(path);
    fs::remove(dir_ / "other.db");
  }
}

// A read-only cache is refused before a resumed run does any work (root may write anything, so
// there the check has nothing to refuse).
TEST_F(TuneStoreTest, ReadOnlyFilesAreNotWritable) {
  const fs::path path = makeStore();
  auto store = TuneStore::open(path);
  ASSERT_TRUE(store.isOk());
  EXPECT_TRUE(store->checkWritable().isOk()) << store->checkWritable().toString();
  if (::geteuid() == 0) GTEST_SKIP() << "root bypasses file permissions";
  fs::permissions(path, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  auto readOnly = TuneStore::open(path);
  ASSERT_TRUE(readOnly.isOk());
  const Status writable = readOnly->checkWritable();
  EXPECT_FALSE(writable.isOk());
  EXPECT_NE(writable.message().find("is read-only"), std::string::npos) << writable.message();
  fs::permissions(path, fs::perms::owner_read | fs::perms::owner_write);
}

}  // namespace
}  // namespace kiln::tune
