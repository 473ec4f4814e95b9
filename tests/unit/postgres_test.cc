// The PostgreSQL client (src/kiln/tune/postgres.h) against a real server: a throwaway cluster
// started by tests/postgres/pg-server.sh for each test, on a Unix socket in a temporary folder.
// CI installs PostgreSQL (scripts/setup.sh), so a server that cannot start fails the test.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "kiln/tune/postgres.h"
#include "postgres/test_server.h"

namespace {

namespace fs = std::filesystem;
namespace pg = kiln::tune::pg;

using PostgresTest = kiln::testing::PgServerTest;

TEST(PostgresUri, RecognisedAndRedacted) {
  EXPECT_TRUE(pg::isUri("postgresql://host/db"));
  EXPECT_TRUE(pg::isUri("postgres://host/db"));
  EXPECT_FALSE(pg::isUri("tune.db"));
  EXPECT_FALSE(pg::isUri("/data/postgresql://x"));
  EXPECT_EQ(pg::redacted("postgresql://kiln:s3cret@db.example:5432/studies"),
            "postgresql://kiln:***@db.example:5432/studies");
  EXPECT_EQ(pg::redacted("postgresql:///studies?host=/run/pg&password=s3cret&user=kiln"),
            "postgresql:///studies?host=/run/pg&password=***&user=kiln");
  EXPECT_EQ(pg::redacted("postgresql://kiln@db/studies"), "postgresql://kiln@db/studies");
}

TEST_F(PostgresTest, ParameterisedStatementsRoundTripTextAndNull) {
  auto conn = pg::Connection::open(uri_);
  ASSERT_TRUE(conn.isOk()) << conn.status().message();
  ASSERT_TRUE(conn->exec("CREATE TABLE t(k TEXT PRIMARY KEY, v TEXT)").isOk());
  auto inserted = conn->exec("INSERT INTO t(k, v) VALUES($1, $2), ($3, $4)",
                             {"a", "it's \"quoted\"; DROP TABLE t", "b", std::nullopt});
  ASSERT_TRUE(inserted.isOk()) << inserted.status().message();
  EXPECT_EQ(inserted->affected, 2);
  auto rows = conn->exec("SELECT k, v FROM t ORDER BY k");
  ASSERT_TRUE(rows.isOk()) << rows.status().message();
  ASSERT_EQ(rows->rows.size(), 2u);
  EXPECT_EQ(rows->columns, (std::vector<std::string>{"k", "v"}));
  EXPECT_EQ(rows->rows[0][1], pg::Value("it's \"quoted\"; DROP TABLE t"));
  EXPECT_EQ(rows->rows[1][1], std::nullopt);
  EXPECT_EQ(*rows->first("k").value(), "a");
  // The server's own message comes back, with where.
  auto duplicate = conn->exec("INSERT INTO t(k) VALUES($1)", {"a"});
  ASSERT_FALSE(duplicate.isOk());
  EXPECT_NE(duplicate.status().message().find("duplicate key"), std::string::npos)
      << duplicate.status().message();
  EXPECT_NE(duplicate.status().message().find("postgresql:///kiln"), std::string::npos);
}

TEST_F(PostgresTest, TransactionsCommitOrRollBack) {
  auto conn = pg::Connection::open(uri_);
  ASSERT_TRUE(conn.isOk()) << conn.status().message();
  ASSERT_TRUE(conn->exec("CREATE TABLE t(k INTEGER PRIMARY KEY)").isOk());
  {
    auto tx = pg::Transaction::begin(*conn);
    ASSERT_TRUE(tx.isOk());
    ASSERT_TRUE(conn->exec("INSERT INTO t VALUES(1)").isOk());
    // Destroyed without commit: rolled back.
  }
  {
    auto tx = pg::Transaction::begin(*conn);
    ASSERT_TRUE(tx.isOk());
    ASSERT_TRUE(conn->exec("INSERT INTO t VALUES(2)").isOk());
    EXPECT_TRUE(tx->commit().isOk());
  }
  {
    // A failed statement aborts the transaction: its COMMIT is refused, not silently a rollback.
    auto tx = pg::Transaction::begin(*conn);
    ASSERT_TRUE(tx.isOk());
    ASSERT_TRUE(conn->exec("INSERT INTO t VALUES(3)").isOk());
    EXPECT_FALSE(conn->exec("INSERT INTO t VALUES(2)").isOk());
    const kiln::Status committed = tx->commit();
    EXPECT_FALSE(committed.isOk());
    EXPECT_NE(committed.message().find("rolled back"), std::string::npos) << committed.message();
  }
  auto rows = conn->exec("SELECT k FROM t ORDER BY k");
  ASSERT_TRUE(rows.isOk());
  ASSERT_EQ(rows->rows.size(), 1u);
  EXPECT_EQ(rows->rows[0][0], pg::Value("2"));
}

// The work queue's foundation: two workers claiming with FOR UPDATE SKIP LOCKED, each in its own
// open transaction, get different rows, and a row comes back to the queue when its claimer's
// transaction ends without committing.
TEST_F(PostgresTest, SkipLockedClaimsHandEachRowToOneWorker) {
  auto a = pg::Connection::open(uri_);
  auto b = pg::Connection::open(uri_);
  ASSERT_TRUE(a.isOk() && b.isOk());
  ASSERT_TRUE(a->exec("CREATE TABLE queue(id INTEGER PRIMARY KEY, state TEXT NOT NULL)").isOk());
  ASSERT_TRUE(a->exec("INSERT INTO queue VALUES(1, 'queued'), (2, 'queued')").isOk());
  const std::string claim =
      "SELECT id FROM queue WHERE state = 'queued' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED";
  auto txA = pg::Transaction::begin(*a);
  auto txB = pg::Transaction::begin(*b);
  ASSERT_TRUE(txA.isOk() && txB.isOk());
  auto first = a->exec(claim);
  auto second = b->exec(claim);
  ASSERT_TRUE(first.isOk() && second.isOk());
  ASSERT_EQ(first->rows.size(), 1u);
  ASSERT_EQ(second->rows.size(), 1u);
  EXPECT_EQ(first->rows[0][0], pg::Value("1"));
  EXPECT_EQ(second->rows[0][0], pg::Value("2"));  // row 1 is locked by the first worker
  // The second worker finishes its row; the first "dies" (its transaction is rolled back).
  ASSERT_TRUE(b->exec("UPDATE queue SET state = 'done' WHERE id = $1", {"2"}).isOk());
  EXPECT_TRUE(txB->commit().isOk());
  { auto dropped = std::move(*txA); }
  auto again = b->exec(claim);
  ASSERT_TRUE(again.isOk());
  ASSERT_EQ(again->rows.size(), 1u);
  EXPECT_EQ(again->rows[0][0], pg::Value("1"));
}

TEST(PostgresConnect, AServerThatIsNotThereIsNamedWithoutItsPassword) {
  char pattern[] = "/tmp/kiln-nopg-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string uri =
      std::string("postgresql:///kiln?host=") + pattern + "&user=kiln&password=s3cret";
  auto conn = pg::Connection::open(uri);
  fs::remove_all(pattern);
  ASSERT_FALSE(conn.isOk());
  EXPECT_NE(conn.status().message().find("cannot connect to the PostgreSQL store"),
            std::string::npos)
      << conn.status().message();
  EXPECT_NE(conn.status().message().find(pattern), std::string::npos);
  EXPECT_EQ(conn.status().message().find("s3cret"), std::string::npos) << conn.status().message();
}

}  // namespace
