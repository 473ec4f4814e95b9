// A PostgreSQL client for the tuner's shared store (libpq, Debian's libpq-dev): one connection,
// parameterised statements, transactions. Errors name the server (its URI without the password)
// and carry the server's own message. Every value crosses as text, as libpq's text protocol
// gives it; NULL is an empty optional.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/base/status.h"

struct pg_conn;

namespace kiln::tune::pg {

// "postgresql://..." or "postgres://..." (libpq's URI forms).
bool isUri(std::string_view text);
// The URI with any password replaced by "***", for messages and logs.
std::string redacted(std::string_view uri);

using Value = std::optional<std::string>;

struct Rows {
  std::vector<std::string> columns;
  std::vector<std::vector<Value>> rows;
  int64_t affected = 0;  // rows an INSERT/UPDATE/DELETE touched
  std::string command;   // the command tag ("INSERT 0 1", "COMMIT", "ROLLBACK", ...)

  // The first row's column `name`; an internal error if the result has no such cell.
  Result<Value> first(std::string_view name) const;
};

class Connection {
 public:
  // Connects (libpq's connection URI); fails with the server's reason.
  static Result<Connection> open(const std::string& uri);

  Connection(Connection&& other) noexcept;
  Connection& operator=(Connection&& other) noexcept;
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection();

  // Runs one statement with $1, $2, ... bound to `params` (as text; an empty optional is NULL).
  Result<Rows> exec(std::string_view sql, const std::vector<Value>& params = {});

  const std::string& where() const { return where_; }  // the redacted URI
  // The connection to the server is gone (it stopped, restarted, or the network failed): a
  // statement's error then says nothing about the statement, and a new connection may succeed.
  bool broken() const;

 private:
  Connection(pg_conn* conn, std::string where) : conn_(conn), where_(std::move(where)) {}
  pg_conn* conn_ = nullptr;
  std::string where_;
};

// BEGIN on construction; ROLLBACK on destruction unless commit() succeeded.
class Transaction {
 public:
  static Result<Transaction> begin(Connection& connection);
  Transaction(Transaction&& other) noexcept;
  Transaction& operator=(Transaction&&) = delete;
  Transaction(const Transaction&) = delete;
  ~Transaction();
  Status commit();

 private:
  explicit Transaction(Connection* connection) : connection_(connection) {}
  Connection* connection_ = nullptr;  // null once committed or moved from
};

}  // namespace kiln::tune::pg
