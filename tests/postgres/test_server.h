// A throwaway PostgreSQL server for a test (tests/postgres/pg-server.sh, KILN_PG_SERVER_SCRIPT):
// its own cluster in a folder, reachable only through a Unix socket there. CI installs
// PostgreSQL (scripts/setup.sh), so a server that cannot start is a test failure, not a skip.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

namespace kiln::testing {

class PgTestServer {
 public:
  // Starts a server in `dir` (created; removed by the caller). error() says why when it did not.
  explicit PgTestServer(const std::filesystem::path& dir) : dir_(dir) {
    std::filesystem::create_directories(dir_);
    const std::string command =
        std::string("'") + KILN_PG_SERVER_SCRIPT + "' start '" + dir_.string() + "' 2>&1";
    FILE* out = ::popen(command.c_str(), "r");
    if (!out) {
      error_ = "cannot run " + std::string(KILN_PG_SERVER_SCRIPT);
      return;
    }
    std::array<char, 512> buffer{};
    std::string text;
    while (std::fgets(buffer.data(), buffer.size(), out)) text += buffer.data();
    if (::pclose(out) != 0) {
      error_ = "the test server did not start: " + text;
      return;
    }
    while (!text.empty() && text.back() == '\n') text.pop_back();
    uri_ = text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
  }
  PgTestServer(const PgTestServer&) = delete;
  PgTestServer& operator=(const PgTestServer&) = delete;
  ~PgTestServer() { stop(); }

  bool started() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  const std::string& uri() const { return uri_; }

  // Starts it again after stop(), with its data; true when it did.
  bool restart() {
    if (!started() || !stopped_) return false;
    const std::string command =
        std::string("'") + KILN_PG_SERVER_SCRIPT + "' restart '" + dir_.string() + "'";
    stopped_ = std::system(command.c_str()) != 0;
    return !stopped_;
  }

  // Stops it (fast shutdown); true when it stopped or was not running.
  bool stop() {
    if (!started() || stopped_) return true;
    stopped_ = true;
    const std::string command =
        std::string("'") + KILN_PG_SERVER_SCRIPT + "' stop '" + dir_.string() + "'";
    return std::system(command.c_str()) == 0;
  }

 private:
  std::filesystem::path dir_;
  std::string uri_;
  std::string error_;
  bool stopped_ = false;
};

// A fixture with a fresh server per test: uri_ reaches it.
class PgServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/kiln-pg-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    server_ = std::make_unique<PgTestServer>(dir_);
    ASSERT_TRUE(server_->started()) << server_->error();
    uri_ = server_->uri();
  }
  void TearDown() override {
    if (server_) {
      EXPECT_TRUE(server_->stop());
    }
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::filesystem::path dir_;
  std::string uri_;
  std::unique_ptr<PgTestServer> server_;
};

}  // namespace kiln::testing
