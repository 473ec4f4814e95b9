// The shared store (src/kiln/tune/pg_store.h) against a real PostgreSQL server: its schema, one
// study's records, and the work queue's claims, leases and target binding.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "kiln/tune/pg_store.h"
#include "postgres/test_server.h"

namespace {

namespace fs = std::filesystem;
namespace pg = kiln::tune::pg;
using kiln::tune::TrialRecord;
using kiln::tune::TrialStatus;

class PgStoreTest : public kiln::testing::PgServerTest {
 protected:
  // A study with `routes` queued in phase one.
  pg::StudyStore study(const std::vector<std::string>& routes, int maxAttempts = 3,
                       const std::string& backend = "cpu") {
    auto store = pg::StudyStore::create(uri_, backend, {{"search", "fast"}, {"model_path", "m"}},
                                        {{"model", std::string("onnx\0bytes\xff", 11)}}, routes,
                                        maxAttempts);
    EXPECT_TRUE(store.isOk()) << store.status().message();
    return std::move(store).value();
  }

  pg::Connection connect() {
    auto connection = pg::connectStore(uri_);
    EXPECT_TRUE(connection.isOk()) << connection.status().message();
    return std::move(connection).value();
  }
};

TEST(ByteaHex, RoundTripsEveryByte) {
  std::string bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<char>(i));
  const std::string hex = pg::toByteaHex(bytes);
  EXPECT_EQ(hex.substr(0, 6), "\\x0001");
  auto back = pg::fromByteaHex(hex);
  ASSERT_TRUE(back.isOk());
  EXPECT_EQ(*back, bytes);
  EXPECT_FALSE(pg::fromByteaHex("00ff").isOk());
  EXPECT_FALSE(pg::fromByteaHex("\\x0g").isOk());
}

TEST_F(PgStoreTest, SchemaIsCreatedOnceAndOtherSchemasAreRefused) {
  pg::Connection first = connect();
  pg::Connection second = connect();  // the tables are there: nothing to create
  ASSERT_TRUE(second.exec("SELECT count(*) FROM queue").isOk());

  // Tables named like kiln's but no kiln_meta: someone else's database.
  ASSERT_TRUE(first.exec("CREATE SCHEMA foreign_app").isOk());
  ASSERT_TRUE(first.exec("CREATE TABLE foreign_app.queue(id int)").isOk());
  auto foreign = pg::connectStore(uri_ + "&options=-csearch_path%3Dforeign_app");
  ASSERT_FALSE(foreign.isOk());
  EXPECT_NE(foreign.status().message().find("not a kiln store"), std::string::npos)
      << foreign.status().message();

  // Another schema version: refused, naming both.
  ASSERT_TRUE(first.exec("UPDATE kiln_meta SET value = '99' WHERE key = 'schema_version'").isOk());
  auto newer = pg::connectStore(uri_);
  ASSERT_FALSE(newer.isOk());
  EXPECT_NE(newer.status().message().find("schema version 99; this kiln reads version 1"),
            std::string::npos)
      << newer.status().message();
}

TEST_F(PgStoreTest, AStudyKeepsItsHeaderBlobsTrialsAndComparisons) {
  pg::StudyStore created = study({"", "-a=1"});
  auto opened = pg::StudyStore::open(uri_, 0);  // the only study
  ASSERT_TRUE(opened.isOk()) << opened.status().message();
  EXPECT_EQ(opened->id(), created.id());
  EXPECT_EQ(opened->header().at("search"), "fast");
  auto blob = opened->blob("model");
  ASSERT_TRUE(blob.isOk());
  EXPECT_EQ(*blob, std::string("onnx\0bytes\xff", 11));
  EXPECT_FALSE(opened->blob("data/inputs_0.npz").isOk());

  TrialRecord record;
  record.route = "-a=1";
  record.status = TrialStatus::kCrash;
  record.message = "killed by SIGSEGV";
  record.finishedAt = "2026-12-06T00:00:00Z";
  ASSERT_TRUE(opened->addTrial(record).isOk());
  EXPECT_FALSE(opened->addTrial(record).isOk());  // iteration 0 again
  record.iteration = 1;
  auto twice = opened->addTrial(record);  // the route again
  ASSERT_FALSE(twice.isOk());
  EXPECT_NE(twice.message().find("already recorded"), std::string::npos) << twice.message();
  auto trials = created.trials();
  ASSERT_TRUE(trials.isOk());
  ASSERT_EQ(trials->size(), 1u);
  EXPECT_EQ((*trials)[0].message, "killed by SIGSEGV");
  EXPECT_EQ((*trials)[0].status, TrialStatus::kCrash);
  EXPECT_FALSE((*trials)[0].timing.has_value());

  kiln::tune::ComparisonRecord comparison;
  comparison.route = "-a=1";
  comparison.candidateSamples = {1.0, 2.0};
  comparison.baselineSamples = {2.0, 3.0};
  comparison.comparison =
      kiln::tune::comparePaired(comparison.candidateSamples, comparison.baselineSamples);
  ASSERT_TRUE(created.setComparisons({comparison}).isOk());
  auto comparisons = opened->comparisons();
  ASSERT_TRUE(comparisons.isOk());
  ASSERT_EQ(comparisons->size(), 1u);
  EXPECT_EQ((*comparisons)[0].baselineSamples, comparison.baselineSamples);

  ASSERT_TRUE(created.setHeaderField("decision", "{}").isOk());
  ASSERT_TRUE(opened->reloadHeader().isOk());
  EXPECT_EQ(opened->header().at("decision"), "{}");

  // Two studies: one must be named.
  pg::StudyStore other = study({""});
  auto ambiguous = pg::StudyStore::open(uri_, 0);
  ASSERT_FALSE(ambiguous.isOk());
  EXPECT_NE(ambiguous.status().message().find("holds 2 studies"), std::string::npos)
      << ambiguous.status().message();
  EXPECT_TRUE(pg::StudyStore::open(uri_, other.id()).isOk());
  EXPECT_FALSE(pg::StudyStore::open(uri_, 99).isOk());
}

TEST_F(PgStoreTest, ClaimsAreExclusiveAndAnExpiredLeaseGoesToAnotherWorker) {
  pg::StudyStore store = study({"", "-a=1"});
  pg::Connection a = connect(), b = connect(), c = connect();
  auto first = pg::claimItem(a, "T", "worker-a", 0.5, 0, "cpu");
  auto second = pg::claimItem(b, "T", "worker-b", 60, 0, "cpu");
  auto third = pg::claimItem(c, "T", "worker-c", 60, 0, "cpu");
  ASSERT_TRUE(first.isOk() && second.isOk() && third.isOk());
  ASSERT_TRUE(first->has_value() && second->has_value());
  EXPECT_FALSE(third->has_value());  // both taken
  EXPECT_EQ((*first)->route, "");
  EXPECT_EQ((*second)->route, "-a=1");
  EXPECT_EQ((*first)->attempts, 1);

  // worker-a's lease runs out: worker-c takes the item over, with the attempt counted.
  std::this_thread::sleep_for(std::chrono::milliseconds(800));
  auto taken = pg::claimItem(c, "T", "worker-c", 60, 0, "cpu");
  ASSERT_TRUE(taken.isOk() && taken->has_value());
  EXPECT_EQ((*taken)->id, (*first)->id);
  EXPECT_EQ((*taken)->attempts, 2);
  EXPECT_EQ((*taken)->lastWorker, "worker-a");
  // worker-a can neither renew nor complete it any more; worker-c can.
  auto renewed = pg::renewLease(a, **first, 60);
  ASSERT_TRUE(renewed.isOk());
  EXPECT_FALSE(*renewed);
  {
    auto transaction = pg::Transaction::begin(a);
    ASSERT_TRUE(transaction.isOk());
    auto mine = pg::lockForCompletion(a, **first);
    ASSERT_TRUE(mine.isOk());
    EXPECT_FALSE(*mine);
  }
  auto renewedByC = pg::renewLease(c, **taken, 60);
  ASSERT_TRUE(renewedByC.isOk());
  EXPECT_TRUE(*renewedByC);

  // Given back on a stop, the attempt is not counted.
  ASSERT_TRUE(pg::releaseItem(b, **second).isOk());
  auto again = pg::claimItem(b, "T", "worker-b", 60, 0, "cpu");
  ASSERT_TRUE(again.isOk() && again->has_value());
  EXPECT_EQ((*again)->id, (*second)->id);
  EXPECT_EQ((*again)->attempts, 1);

  auto left = pg::anyWorkLeft(a, "T", 0, "cpu");
  ASSERT_TRUE(left.isOk());
  EXPECT_TRUE(*left);  // running items count as work left
  auto json = store.queueJson();
  ASSERT_TRUE(json.isOk());
  EXPECT_EQ((*json)["running"], 2);
  EXPECT_EQ((*json)["running_items"].size(), 2u);
}

TEST_F(PgStoreTest, ALockedItemIsSkippedNotWaitedFor) {
  pg::StudyStore store = study({"", "-a=1"});
  pg::Connection a = connect(), b = connect();
  // A transaction holds the first item's row lock (as a claim in progress does).
  auto transaction = pg::Transaction::begin(a);
  ASSERT_TRUE(transaction.isOk());
  ASSERT_TRUE(a.exec("SELECT id FROM queue WHERE route = '' FOR UPDATE").isOk());
  const auto start = std::chrono::steady_clock::now();
  auto claimed = pg::claimItem(b, "T", "worker-b", 60, 0, "cpu");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  ASSERT_TRUE(claimed.isOk() && claimed->has_value()) << claimed.status().message();
  EXPECT_EQ((*claimed)->route, "-a=1");
}

TEST_F(PgStoreTest, TheFirstClaimBindsTheStudyToItsWorkersTarget) {
  pg::StudyStore cpuStudy = study({"", "-a=1", "-a=2"});
  pg::StudyStore cudaStudy = study({""}, 3, "cuda");
  pg::Connection connection = connect();
  auto none = pg::claimItem(connection, "T1", "w", 60, 0, "tpu");
  ASSERT_TRUE(none.isOk());
  EXPECT_FALSE(none->has_value());  // no study of that backend

  auto first = pg::claimItem(connection, "T1", "w1", 60, cpuStudy.id(), "cpu");
  ASSERT_TRUE(first.isOk() && first->has_value());
  EXPECT_EQ((*first)->target, "T1");
  ASSERT_TRUE(cpuStudy.reloadHeader().isOk());
  EXPECT_EQ(cpuStudy.header().at("target"), "T1");
  // A worker of another target takes nothing of it; one of the same target does.
  auto other = pg::claimItem(connection, "T2", "w2", 60, cpuStudy.id(), "cpu");
  ASSERT_TRUE(other.isOk());
  EXPECT_FALSE(other->has_value());
  auto same = pg::claimItem(connection, "T1", "w3", 60, cpuStudy.id(), "cpu");
  ASSERT_TRUE(same.isOk() && same->has_value());
  // The CUDA study is still unbound; `--study` keeps a worker to one study.
  auto cuda = pg::claimItem(connection, "T2", "w4", 60, 0, "cuda");
  ASSERT_TRUE(cuda.isOk() && cuda->has_value());
  EXPECT_EQ((*cuda)->study, cudaStudy.id());
  EXPECT_EQ((*cuda)->target, "T2");
}

// Study numbers repeat between stores; the store's own id tells them apart (a worker serving two
// stores keeps their study 1 in different folders).
TEST_F(PgStoreTest, StoresHaveTheirOwnIds) {
  pg::Connection connection = connect();
  ASSERT_TRUE(connection.exec("CREATE DATABASE other").isOk());
  const std::string otherUri = std::string(uri_).replace(uri_.find("/kiln?"), 6, "/other?");
  pg::StudyStore here = study({""});
  auto there = pg::StudyStore::create(otherUri, "cpu", {}, {}, {""}, 3);
  ASSERT_TRUE(there.isOk()) << there.status().message();
  EXPECT_EQ(here.id(), there->id());
  EXPECT_EQ(here.storeId().size(), 16u);
  EXPECT_NE(here.storeId(), there->storeId());
  auto again = pg::StudyStore::open(uri_, here.id());
  ASSERT_TRUE(again.isOk());
  EXPECT_EQ(again->storeId(), here.storeId());
}

}  // namespace
