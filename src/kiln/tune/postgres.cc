#include "kiln/tune/postgres.h"

#include <libpq-fe.h>

#include <regex>
#include <utility>

#include <fmt/format.h>

namespace kiln::tune::pg {

bool isUri(std::string_view text) {
  return text.rfind("postgresql://", 0) == 0 || text.rfind("postgres://", 0) == 0;
}

std::string redacted(std::string_view uri) {
  // scheme://user:password@host...  and  ...?password=...&...
  static const std::regex kUserPassword(R"(^(postgres(?:ql)?://[^:/@?]*):[^@/?]*@)");
  static const std::regex kPasswordParameter(R"(([?&]password=)[^&]*)");
  std::string text = std::regex_replace(std::string(uri), kUserPassword, "$1:***@");
  return std::regex_replace(text, kPasswordParameter, "$1***");
}

namespace {

std::string trimmed(const char* message) {
  std::string text = message ? message : "";
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

Result<Value> Rows::first(std::string_view name) const {
  for (size_t c = 0; c < columns.size(); ++c) {
    if (columns[c] == name) {
      if (rows.empty()) return internalError("no row for column '{}'", name);
      return rows.front()[c];
    }
  }
  return internalError("no column '{}' in the result", name);
}

Result<Connection> Connection::open(const std::string& uri) {
  const std::string where = redacted(uri);
  // kiln's defaults first: the URI's own settings (expanded from dbname) override them. A store
  // that does not answer within 10 s, or a connection silent for about a minute, is an error
  // rather than a wait of hours (TCP's own timeouts).
  const char* keywords[] = {
      "connect_timeout",  "keepalives",       "keepalives_idle", "keepalives_interval",
      "keepalives_count", "tcp_user_timeout", "dbname",          nullptr};
  const char* values[] = {"10", "1", "30", "10", "3", "60000", uri.c_str(), nullptr};
  pg_conn* conn = PQconnectdbParams(keywords, values, /*expand_dbname=*/1);
  if (!conn) return ioError("cannot connect to {}: out of memory", where);
  if (PQstatus(conn) != CONNECTION_OK) {
    const std::string message = trimmed(PQerrorMessage(conn));
    PQfinish(conn);
    return ioError("cannot connect to the PostgreSQL store {}: {}", where, message);
  }
  return Connection(conn, where);
}

Connection::Connection(Connection&& other) noexcept
    : conn_(std::exchange(other.conn_, nullptr)), where_(std::move(other.where_)) {}

Connection& Connection::operator=(Connection&& other) noexcept {
  if (this != &other) {
    if (conn_) PQfinish(conn_);
    conn_ = std::exchange(other.conn_, nullptr);
    where_ = std::move(other.where_);
  }
  return *this;
}

Connection::~Connection() {
  if (conn_) PQfinish(conn_);
}

bool Connection::broken() const { return !conn_ || PQstatus(conn_) != CONNECTION_OK; }

Result<Rows> Connection::exec(std::string_view sql, const std::vector<Value>& params) {
  std::vector<const char*> values;
  for (const Value& p : params) values.push_back(p ? p->c_str() : nullptr);
  const std::string text(sql);
  PGresult* result = PQexecParams(conn_, text.c_str(), static_cast<int>(values.size()), nullptr,
                                  values.data(), nullptr, nullptr, 0);
  if (!result) {
    return ioError("the PostgreSQL store {}: {}", where_, trimmed(PQerrorMessage(conn_)));
  }
  const ExecStatusType status = PQresultStatus(result);
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    const std::string message = trimmed(PQresultErrorMessage(result));
    PQclear(result);
    return ioError("the PostgreSQL store {}: {}", where_, message);
  }
  Rows rows;
  const int columns = PQnfields(result);
  for (int c = 0; c < columns; ++c) rows.columns.emplace_back(PQfname(result, c));
  const int count = PQntuples(result);
  rows.rows.reserve(static_cast<size_t>(count));
  for (int r = 0; r < count; ++r) {
    std::vector<Value> row;
    for (int c = 0; c < columns; ++c) {
      if (PQgetisnull(result, r, c)) {
        row.emplace_back(std::nullopt);
      } else {
        row.emplace_back(
            std::string(PQgetvalue(result, r, c), static_cast<size_t>(PQgetlength(result, r, c))));
      }
    }
    rows.rows.push_back(std::move(row));
  }
  rows.command = PQcmdStatus(result);
  const char* affected = PQcmdTuples(result);
  rows.affected = affected && *affected ? std::stoll(affected) : 0;
  PQclear(result);
  return rows;
}

Result<Transaction> Transaction::begin(Connection& connection) {
  KILN_RETURN_IF_ERROR(connection.exec("BEGIN").status());
  return Transaction(&connection);
}

Transaction::Transaction(Transaction&& other) noexcept
    : connection_(std::exchange(other.connection_, nullptr)) {}

Transaction::~Transaction() {
  if (connection_) (void)connection_->exec("ROLLBACK");
}

Status Transaction::commit() {
  if (!connection_) return internalError("commit of a transaction that is not open");
  Connection* connection = std::exchange(connection_, nullptr);
  KILN_ASSIGN_OR_RETURN(Rows done, connection->exec("COMMIT"));
  // COMMIT of a transaction a statement failed in answers ROLLBACK, not an error.
  if (done.command != "COMMIT") {
    return ioError("the PostgreSQL store {}: the transaction was rolled back ({})",
                   connection->where(), done.command);
  }
  return Status::ok();
}

}  // namespace kiln::tune::pg
