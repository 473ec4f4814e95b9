#include "kiln/tune/pg_store.h"

#include <memory>
#include <set>

#include <fmt/format.h>

namespace kiln::tune::pg {

namespace {

using json = nlohmann::json;

// "KILN" as an advisory lock key: schema creation by workers starting at once is serialised.
constexpr int64_t kSchemaLock = 0x4B494C4E;

const char* const kSchema = R"sql(
CREATE TABLE kiln_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE studies(
  id BIGSERIAL PRIMARY KEY,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  backend TEXT NOT NULL,
  target TEXT,
  max_attempts INTEGER NOT NULL CHECK (max_attempts > 0));
CREATE TABLE header(
  study BIGINT NOT NULL REFERENCES studies(id) ON DELETE CASCADE,
  key TEXT NOT NULL,
  value TEXT NOT NULL,
  PRIMARY KEY (study, key));
CREATE TABLE trials(
  study BIGINT NOT NULL REFERENCES studies(id) ON DELETE CASCADE,
  iteration BIGINT NOT NULL,
  phase INTEGER NOT NULL,
  route TEXT NOT NULL,
  status TEXT NOT NULL,
  message TEXT NOT NULL,
  accuracy TEXT NOT NULL,
  timing TEXT,
  build_ms DOUBLE PRECISION NOT NULL,
  engine_path TEXT NOT NULL,
  engine_hash TEXT NOT NULL,
  finished_at TEXT NOT NULL,
  worker TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (study, iteration),
  UNIQUE (study, route));
CREATE TABLE comparisons(
  study BIGINT NOT NULL REFERENCES studies(id) ON DELETE CASCADE,
  position INTEGER NOT NULL,
  route TEXT NOT NULL,
  record TEXT NOT NULL,
  PRIMARY KEY (study, route));
CREATE TABLE blobs(
  study BIGINT NOT NULL REFERENCES studies(id) ON DELETE CASCADE,
  name TEXT NOT NULL,
  bytes BYTEA NOT NULL,
  PRIMARY KEY (study, name));
CREATE TABLE queue(
  id BIGSERIAL PRIMARY KEY,
  study BIGINT NOT NULL REFERENCES studies(id) ON DELETE CASCADE,
  kind TEXT NOT NULL CHECK (kind IN ('trial', 'control', 'finalists')),
  route TEXT NOT NULL,
  phase INTEGER NOT NULL,
  position BIGINT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'done', 'failed')),
  worker TEXT,
  last_worker TEXT,
  last_error TEXT,
  lease_until TIMESTAMPTZ,
  attempts INTEGER NOT NULL DEFAULT 0);
CREATE INDEX queue_claimable ON queue(study, id) WHERE state IN ('queued', 'running');
)sql";

Result<int64_t> integerCell(const Rows& rows, std::string_view column) {
  KILN_ASSIGN_OR_RETURN(Value value, rows.first(column));
  if (!value) return internalError("column '{}' is NULL", column);
  try {
    return static_cast<int64_t>(std::stoll(*value));
  } catch (const std::exception&) {
    return internalError("column '{}' is not an integer: '{}'", column, *value);
  }
}

std::string text(const Value& value) { return value.value_or(""); }

int64_t integer(const Value& value) {
  try {
    return value ? std::stoll(*value) : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

Result<std::map<std::string, std::string>> readHeader(Connection& connection, int64_t study) {
  KILN_ASSIGN_OR_RETURN(Rows rows, connection.exec("SELECT key, value FROM header WHERE study = $1",
                                                   {std::to_string(study)}));
  std::map<std::string, std::string> header;
  for (const auto& row : rows.rows) header[text(row[0])] = text(row[1]);
  return header;
}

Result<std::string> readStoreId(Connection& connection) {
  KILN_ASSIGN_OR_RETURN(Rows rows,
                        connection.exec("SELECT value FROM kiln_meta WHERE key = 'store_id'"));
  if (rows.rows.empty() || !rows.rows[0][0] || rows.rows[0][0]->empty()) {
    return invalidInput("the PostgreSQL store {} has no store_id in kiln_meta", connection.where());
  }
  return *rows.rows[0][0];
}

QueueItem itemFromRow(const Rows& rows, size_t r) {
  auto cell = [&](std::string_view name) -> const Value& {
    for (size_t c = 0; c < rows.columns.size(); ++c) {
      if (rows.columns[c] == name) return rows.rows[r][c];
    }
    static const Value none;
    return none;
  };
  QueueItem item;
  item.id = integer(cell("id"));
  item.study = integer(cell("study"));
  item.kind = text(cell("kind"));
  item.route = text(cell("route"));
  item.phase = static_cast<int>(integer(cell("phase")));
  item.position = integer(cell("position"));
  item.attempts = static_cast<int>(integer(cell("attempts")));
  item.maxAttempts = static_cast<int>(integer(cell("max_attempts")));
  item.worker = text(cell("worker"));
  item.lastWorker = text(cell("last_worker"));
  item.lastError = text(cell("last_error"));
  item.target = text(cell("target"));
  return item;
}

}  // namespace

std::string toByteaHex(const std::string& bytes) {
  static const char* const digits = "0123456789abcdef";
  std::string out = "\\x";
  out.reserve(2 + 2 * bytes.size());
  for (unsigned char c : bytes) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

Result<std::string> fromByteaHex(const std::string& text) {
  if (text.size() < 2 || text[0] != '\\' || text[1] != 'x' || text.size() % 2 != 0) {
    return internalError("a bytea value is not in hex form");
  }
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size() / 2 - 1);
  for (size_t i = 2; i < text.size(); i += 2) {
    const int high = nibble(text[i]), low = nibble(text[i + 1]);
    if (high < 0 || low < 0) return internalError("a bytea value has a non-hex digit");
    out.push_back(static_cast<char>(high << 4 | low));
  }
  return out;
}

Result<Connection> connectStore(const std::string& uri) {
  KILN_ASSIGN_OR_RETURN(Connection connection, Connection::open(uri));
  // Warnings (a table already there) are not for the user.
  KILN_RETURN_IF_ERROR(connection.exec("SET client_min_messages = warning").status());
  // Blobs cross as bytea's hex text, whatever the server's default output.
  KILN_RETURN_IF_ERROR(connection.exec("SET bytea_output = hex").status());
  KILN_ASSIGN_OR_RETURN(Transaction transaction, Transaction::begin(connection));
  KILN_RETURN_IF_ERROR(
      connection.exec("SELECT pg_advisory_xact_lock($1)", {std::to_string(kSchemaLock)}).status());
  KILN_ASSIGN_OR_RETURN(Rows meta,
                        connection.exec("SELECT to_regclass('kiln_meta') IS NOT NULL AS present"));
  KILN_ASSIGN_OR_RETURN(Value present, meta.first("present"));
  if (present.value_or("f") != "t") {
    KILN_ASSIGN_OR_RETURN(Rows tables,
                          connection.exec("SELECT string_agg(table_name, ', ') AS names FROM "
                                          "information_schema.tables WHERE table_schema = "
                                          "current_schema() AND table_name IN ('studies', "
                                          "'header', 'trials', 'comparisons', 'blobs', 'queue')"));
    KILN_ASSIGN_OR_RETURN(Value clash, tables.first("names"));
    if (clash) {
      return invalidInput(
          "the PostgreSQL store {}: its schema has tables named like kiln's ({}) but no "
          "kiln_meta: it is not a kiln store; give kiln a database (or schema) of its own",
          connection.where(), *clash);
    }
    // One statement at a time: libpq's parameterised execution takes one.
    std::string_view schema = kSchema;
    for (size_t end; (end = schema.find(';')) != std::string_view::npos;
         schema.remove_prefix(end + 1)) {
      KILN_RETURN_IF_ERROR(
          connection.exec(schema.substr(0, end))
              .status()
              .withContext(fmt::format("creating kiln's tables in {}", connection.where())));
    }
    KILN_RETURN_IF_ERROR(connection
                             .exec("INSERT INTO kiln_meta(key, value) VALUES ('format', 'kiln "
                                   "tuning store'), ('schema_version', $1)",
                                   {std::to_string(kSchemaVersion)})
                             .status());
    // Names this store among others (workers keep each store's studies in their own folders).
    KILN_RETURN_IF_ERROR(connection
                             .exec("INSERT INTO kiln_meta(key, value) SELECT 'store_id', "
                                   "substr(md5(random()::text || clock_timestamp()::text), 1, 16)")
                             .status());
  } else {
    KILN_ASSIGN_OR_RETURN(Rows rows, connection.exec("SELECT key, value FROM kiln_meta"));
    std::map<std::string, std::string> values;
    for (const auto& row : rows.rows) values[text(row[0])] = text(row[1]);
    if (values["format"] != "kiln tuning store") {
      return invalidInput("the PostgreSQL store {}: kiln_meta says format '{}', not a kiln store",
                          connection.where(), values["format"]);
    }
    if (values["schema_version"] != std::to_string(kSchemaVersion)) {
      return invalidInput(
          "the PostgreSQL store {} has kiln's schema version {}; this kiln reads version {}",
          connection.where(), values["schema_version"], kSchemaVersion);
    }
  }
  KILN_RETURN_IF_ERROR(transaction.commit());
  return connection;
}

Result<StudyStore> StudyStore::create(const std::string& uri, const std::string& backend,
                                      const std::map<std::string, std::string>& header,
                                      const std::map<std::string, std::string>& blobs,
                                      const std::vector<std::string>& phaseOne, int maxAttempts) {
  KILN_ASSIGN_OR_RETURN(Connection opened, connectStore(uri));
  auto connection = std::make_unique<Connection>(std::move(opened));
  KILN_ASSIGN_OR_RETURN(Transaction transaction, Transaction::begin(*connection));
  KILN_ASSIGN_OR_RETURN(
      Rows created, connection->exec("INSERT INTO studies(backend, max_attempts) VALUES ($1, $2) "
                                     "RETURNING id",
                                     {backend, std::to_string(maxAttempts)}));
  KILN_ASSIGN_OR_RETURN(const int64_t id, integerCell(created, "id"));
  const std::string study = std::to_string(id);
  for (const auto& [key, value] : header) {
    KILN_RETURN_IF_ERROR(
        connection
            ->exec("INSERT INTO header(study, key, value) VALUES ($1, $2, $3)", {study, key, value})
            .status());
  }
  for (const auto& [name, bytes] : blobs) {
    KILN_RETURN_IF_ERROR(
        connection
            ->exec("INSERT INTO blobs(study, name, bytes) VALUES ($1, $2, $3::bytea)",
                   {study, name, toByteaHex(bytes)})
            .status()
            .withContext(fmt::format("storing {} ({} bytes)", name, bytes.size())));
  }
  KILN_RETURN_IF_ERROR(enqueue(*connection, id, "trial", 1, phaseOne));
  KILN_RETURN_IF_ERROR(transaction.commit());
  KILN_ASSIGN_OR_RETURN(std::string storeId, readStoreId(*connection));
  StudyStore store(std::move(connection), id);
  store.header_ = header;
  store.storeId_ = std::move(storeId);
  return store;
}

Result<StudyStore> StudyStore::open(const std::string& uri, int64_t study) {
  KILN_ASSIGN_OR_RETURN(Connection opened, connectStore(uri));
  auto connection = std::make_unique<Connection>(std::move(opened));
  if (study == 0) {
    KILN_ASSIGN_OR_RETURN(json studies, listStudies(*connection));
    if (studies.size() != 1) {
      std::string ids;
      for (const json& s : studies) ids += (ids.empty() ? "" : ", ") + s.at("id").dump();
      return invalidInput("the PostgreSQL store {} holds {} studies{}{}: name one with --study",
                          connection->where(), studies.size(), ids.empty() ? "" : ": ", ids);
    }
    study = studies[0].at("id").get<int64_t>();
  }
  KILN_ASSIGN_OR_RETURN(Rows found, connection->exec("SELECT id FROM studies WHERE id = $1",
                                                     {std::to_string(study)}));
  if (found.rows.empty()) {
    return invalidInput("the PostgreSQL store {} has no study {}", connection->where(), study);
  }
  KILN_ASSIGN_OR_RETURN(std::string storeId, readStoreId(*connection));
  StudyStore store(std::move(connection), study);
  store.storeId_ = std::move(storeId);
  KILN_RETURN_IF_ERROR(store.reloadHeader());
  return store;
}

std::string StudyStore::where() const {
  return fmt::format("study {} of {}", id_, connection_->where());
}

Status StudyStore::reloadHeader() {
  KILN_ASSIGN_OR_RETURN(header_, readHeader(*connection_, id_));
  return Status::ok();
}

Status StudyStore::setHeaderField(const std::string& key, const std::string& value) {
  KILN_RETURN_IF_ERROR(connection_
                           ->exec("INSERT INTO header(study, key, value) VALUES ($1, $2, $3) ON "
                                  "CONFLICT (study, key) DO UPDATE SET value = excluded.value",
                                  {std::to_string(id_), key, value})
                           .status());
  header_[key] = value;
  return Status::ok();
}

Result<std::vector<TrialRecord>> StudyStore::trials() const {
  KILN_ASSIGN_OR_RETURN(
      Rows rows, connection_->exec("SELECT iteration, phase, route, status, message, accuracy, "
                                   "timing, build_ms, engine_path, engine_hash, finished_at FROM "
                                   "trials WHERE study = $1 ORDER BY iteration",
                                   {std::to_string(id_)}));
  std::vector<TrialRecord> records;
  for (size_t r = 0; r < rows.rows.size(); ++r) {
    const auto& row = rows.rows[r];
    auto parse = [&]() -> Result<TrialRecord> {
      json object = {{"iteration", integer(row[0])},
                     {"phase", integer(row[1])},
                     {"route", text(row[2])},
                     {"status", text(row[3])},
                     {"message", text(row[4])},
                     {"accuracy", json::parse(text(row[5]))},
                     {"timing", row[6] ? json::parse(*row[6]) : json(nullptr)},
                     {"build_ms", std::stod(text(row[7]))},
                     {"engine_path", text(row[8])},
                     {"engine_hash", text(row[9])},
                     {"finished_at", text(row[10])}};
      return trialFromJson(object);
    };
    Result<TrialRecord> record = internalError("unread");
    try {
      record = parse();
    } catch (const std::exception& e) {
      record = invalidInput("{}", e.what());
    }
    if (!record.isOk()) {
      return invalidInput("{}: trial row {} is unreadable: {}", where(), r,
                          record.status().message());
    }
    records.push_back(std::move(record).value());
  }
  return records;
}

Status StudyStore::addTrial(const TrialRecord& record) {
  const json object = toJson(record);
  auto exec = [&]() -> Status {
    KILN_ASSIGN_OR_RETURN(Rows count,
                          connection_->exec("SELECT count(*) AS n FROM trials WHERE study = $1",
                                            {std::to_string(id_)}));
    KILN_ASSIGN_OR_RETURN(const int64_t n, integerCell(count, "n"));
    if (record.iteration != n) {
      return internalError("{}: trial of route '{}' has iteration {}, but {} trials are recorded",
                           where(), record.route, record.iteration, n);
    }
    KILN_ASSIGN_OR_RETURN(
        Rows inserted,
        connection_->exec(
            "INSERT INTO trials(study, iteration, phase, route, status, message, accuracy, "
            "timing, build_ms, engine_path, engine_hash, finished_at, worker) VALUES ($1, $2, $3, "
            "$4, $5, $6, $7, $8, $9, $10, $11, $12, $13) ON CONFLICT DO NOTHING",
            {std::to_string(id_), std::to_string(record.iteration), std::to_string(record.phase),
             record.route, std::string(trialStatusName(record.status)), record.message,
             object.at("accuracy").dump(),
             record.timing ? Value(object.at("timing").dump()) : Value(),
             object.at("build_ms").dump(), record.enginePath, record.engineHash, record.finishedAt,
             worker_}));
    if (inserted.affected != 1) {
      return internalError("{}: route '{}' is already recorded; iteration {} repeats it", where(),
                           record.route, record.iteration);
    }
    return Status::ok();
  };
  return exec();
}

Result<std::vector<ComparisonRecord>> StudyStore::comparisons() const {
  KILN_ASSIGN_OR_RETURN(Rows rows, connection_->exec("SELECT route, record FROM comparisons "
                                                     "WHERE study = $1 ORDER BY position",
                                                     {std::to_string(id_)}));
  std::vector<ComparisonRecord> comparisons;
  for (const auto& row : rows.rows) {
    json object = json::parse(text(row[1]), nullptr, false);
    Result<ComparisonRecord> record = comparisonFromJson(object);
    if (!record.isOk() || record->route != text(row[0])) {
      return invalidInput("{}: the comparison of route '{}' is unreadable", where(), text(row[0]));
    }
    comparisons.push_back(std::move(record).value());
  }
  return comparisons;
}

Status StudyStore::setComparisons(const std::vector<ComparisonRecord>& comparisons) {
  KILN_ASSIGN_OR_RETURN(Transaction transaction, Transaction::begin(*connection_));
  KILN_RETURN_IF_ERROR(
      connection_->exec("DELETE FROM comparisons WHERE study = $1", {std::to_string(id_)})
          .status());
  for (size_t i = 0; i < comparisons.size(); ++i) {
    KILN_RETURN_IF_ERROR(connection_
                             ->exec("INSERT INTO comparisons(study, position, route, record) "
                                    "VALUES ($1, $2, $3, $4)",
                                    {std::to_string(id_), std::to_string(i), comparisons[i].route,
                                     toJson(comparisons[i]).dump()})
                             .status());
  }
  return transaction.commit();
}

Result<std::string> StudyStore::blob(const std::string& name) const {
  KILN_ASSIGN_OR_RETURN(Rows rows,
                        connection_->exec("SELECT bytes FROM blobs WHERE study = $1 AND name = $2",
                                          {std::to_string(id_), name}));
  if (rows.rows.empty() || !rows.rows[0][0]) {
    return invalidInput("{}: the study has no stored '{}'", where(), name);
  }
  return fromByteaHex(*rows.rows[0][0]);
}

Result<json> StudyStore::queueJson() const {
  KILN_ASSIGN_OR_RETURN(
      Rows counts,
      connection_->exec("SELECT state, count(*) AS n FROM queue WHERE study = $1 GROUP BY state",
                        {std::to_string(id_)}));
  json queue = {{"queued", 0}, {"running", 0}, {"done", 0}, {"failed", 0}};
  for (const auto& row : counts.rows) queue[text(row[0])] = integer(row[1]);
  KILN_ASSIGN_OR_RETURN(Rows study, connection_->exec("SELECT target, max_attempts FROM studies "
                                                      "WHERE id = $1",
                                                      {std::to_string(id_)}));
  if (study.rows.empty()) return invalidInput("{}: the study is gone", where());
  queue["target"] = study.rows[0][0] ? json(*study.rows[0][0]) : json(nullptr);
  queue["max_attempts"] = integer(study.rows[0][1]);
  KILN_ASSIGN_OR_RETURN(
      Rows running,
      connection_->exec("SELECT kind, route, worker, attempts, extract(epoch FROM lease_until - "
                        "now()) AS left FROM queue WHERE study = $1 AND state = 'running' ORDER "
                        "BY id",
                        {std::to_string(id_)}));
  queue["running_items"] = json::array();
  for (const auto& row : running.rows) {
    queue["running_items"].push_back(
        {{"kind", text(row[0])},
         {"route", text(row[1])},
         {"worker", text(row[2])},
         {"attempts", integer(row[3])},
         {"lease_seconds_left", std::stod(text(row[4]).empty() ? "0" : text(row[4]))}});
  }
  return queue;
}

Result<json> listStudies(Connection& connection) {
  KILN_ASSIGN_OR_RETURN(
      Rows rows,
      connection.exec(
          "SELECT s.id, s.created_at, s.target IS NOT NULL AS bound, "
          "(SELECT value FROM header h WHERE h.study = s.id AND h.key = 'model_path') AS model, "
          "(SELECT value FROM header h WHERE h.study = s.id AND h.key = 'search') AS search, "
          "(SELECT value FROM header h WHERE h.study = s.id AND h.key = 'finished_at') AS "
          "finished_at, "
          "(SELECT count(*) FROM queue q WHERE q.study = s.id AND q.state = 'queued') AS queued, "
          "(SELECT count(*) FROM queue q WHERE q.study = s.id AND q.state = 'running') AS "
          "running, "
          "(SELECT count(*) FROM queue q WHERE q.study = s.id AND q.state IN ('done', 'failed')) "
          "AS ended FROM studies s ORDER BY s.id"));
  json studies = json::array();
  for (const auto& row : rows.rows) {
    studies.push_back({{"id", integer(row[0])},
                       {"created_at", text(row[1])},
                       {"bound", text(row[2]) == "t"},
                       {"model_path", text(row[3])},
                       {"search", text(row[4])},
                       {"finished_at", row[5] ? json(*row[5]) : json(nullptr)},
                       {"queued", integer(row[6])},
                       {"running", integer(row[7])},
                       {"ended", integer(row[8])}});
  }
  return studies;
}

Result<std::optional<QueueItem>> claimItem(Connection& connection, const std::string& target,
                                           const std::string& worker, double leaseSeconds,
                                           int64_t onlyStudy, const std::string& backend) {
  for (int tries = 0; tries < 8; ++tries) {
    KILN_ASSIGN_OR_RETURN(Transaction transaction, Transaction::begin(connection));
    KILN_ASSIGN_OR_RETURN(
        Rows claimed,
        connection.exec(
            "WITH candidate AS ("
            "  SELECT q.id FROM queue q JOIN studies s ON s.id = q.study"
            "  WHERE s.backend = $5 AND (s.target IS NULL OR s.target = $1)"
            "    AND ($3::bigint = 0 OR q.study = $3::bigint)"
            "    AND (q.state = 'queued' OR (q.state = 'running' AND q.lease_until < now()))"
            "  ORDER BY q.study, q.id LIMIT 1 FOR UPDATE OF q SKIP LOCKED) "
            "UPDATE queue q SET state = 'running', last_worker = COALESCE(q.worker, q.last_worker),"
            "  last_error = CASE WHEN q.worker IS NULL THEN q.last_error END, worker = $2,"
            "  lease_until = now() + make_interval(secs => $4), attempts = q.attempts + 1 "
            "FROM candidate WHERE q.id = candidate.id "
            "RETURNING q.id, q.study, q.kind, q.route, q.phase, q.position, q.attempts, q.worker,"
            "  q.last_worker, q.last_error, (SELECT max_attempts FROM studies WHERE id = q.study) "
            "AS "
            "max_attempts, (SELECT target FROM studies WHERE id = q.study) AS target",
            {target, worker, std::to_string(onlyStudy), fmt::format("{}", leaseSeconds), backend}));
    if (claimed.rows.empty()) {
      KILN_RETURN_IF_ERROR(transaction.commit());
      return std::optional<QueueItem>();
    }
    QueueItem item = itemFromRow(claimed, 0);
    if (item.target.empty()) {
      // The study's first trial: bind it to this worker's target, in this transaction. Another
      // worker binding it at once waits for this row lock and then finds it bound.
      KILN_ASSIGN_OR_RETURN(
          Rows bound,
          connection.exec("UPDATE studies SET target = $1 WHERE id = $2 AND target IS NULL",
                          {target, std::to_string(item.study)}));
      if (bound.affected != 1) {
        KILN_ASSIGN_OR_RETURN(Rows now, connection.exec("SELECT target FROM studies WHERE id = $1",
                                                        {std::to_string(item.study)}));
        if (now.rows.empty() || text(now.rows[0][0]) != target) continue;  // rolled back
      } else {
        KILN_RETURN_IF_ERROR(
            connection
                .exec("INSERT INTO header(study, key, value) VALUES ($1, 'target', $2) ON "
                      "CONFLICT (study, key) DO UPDATE SET value = excluded.value",
                      {std::to_string(item.study), target})
                .status());
      }
      item.target = target;
    }
    KILN_RETURN_IF_ERROR(transaction.commit());
    return std::optional<QueueItem>(std::move(item));
  }
  return std::optional<QueueItem>();
}

Result<bool> renewLease(Connection& connection, const QueueItem& item, double leaseSeconds) {
  KILN_ASSIGN_OR_RETURN(
      Rows renewed,
      connection.exec("UPDATE queue SET lease_until = now() + make_interval(secs => $4) WHERE id "
                      "= $1 AND worker = $2 AND attempts = $3 AND state = 'running'",
                      {std::to_string(item.id), item.worker, std::to_string(item.attempts),
                       fmt::format("{}", leaseSeconds)}));
  return renewed.affected == 1;
}

Status releaseItem(Connection& connection, const QueueItem& item) {
  return connection
      .exec(
          "UPDATE queue SET state = 'queued', worker = NULL, lease_until = NULL, attempts = "
          "attempts - 1 WHERE id = $1 AND worker = $2 AND attempts = $3 AND state = 'running'",
          {std::to_string(item.id), item.worker, std::to_string(item.attempts)})
      .status();
}

Status requeueItem(Connection& connection, const QueueItem& item, const std::string& error) {
  return connection
      .exec(
          "UPDATE queue SET state = 'queued', worker = NULL, last_worker = $2, last_error = $4, "
          "lease_until = NULL WHERE id = $1 AND worker = $2 AND attempts = $3 AND state = "
          "'running'",
          {std::to_string(item.id), item.worker, std::to_string(item.attempts), error})
      .status();
}

Result<bool> lockForCompletion(Connection& connection, const QueueItem& item) {
  KILN_RETURN_IF_ERROR(
      connection
          .exec("SELECT id FROM studies WHERE id = $1 FOR UPDATE", {std::to_string(item.study)})
          .status());
  KILN_ASSIGN_OR_RETURN(
      Rows mine,
      connection.exec("SELECT id FROM queue WHERE id = $1 AND worker = $2 AND attempts = $3 AND "
                      "state = 'running' FOR UPDATE",
                      {std::to_string(item.id), item.worker, std::to_string(item.attempts)}));
  return !mine.rows.empty();
}

Status finishItem(Connection& connection, const QueueItem& item, const std::string& state) {
  return connection
      .exec("UPDATE queue SET state = $2, lease_until = NULL WHERE id = $1",
            {std::to_string(item.id), state})
      .status();
}

Status enqueue(Connection& connection, int64_t study, const std::string& kind, int phase,
               const std::vector<std::string>& routes) {
  for (size_t i = 0; i < routes.size(); ++i) {
    KILN_RETURN_IF_ERROR(
        connection
            .exec(
                "INSERT INTO queue(study, kind, route, phase, position, state) VALUES ($1, $2, "
                "$3, $4, $5, 'queued')",
                {std::to_string(study), kind, routes[i], std::to_string(phase), std::to_string(i)})
            .status());
  }
  return Status::ok();
}

Result<std::map<std::string, int64_t>> countItems(Connection& connection, int64_t study) {
  KILN_ASSIGN_OR_RETURN(Rows rows,
                        connection.exec("SELECT kind, phase, state, count(*) FROM queue WHERE "
                                        "study = $1 GROUP BY kind, phase, state",
                                        {std::to_string(study)}));
  std::map<std::string, int64_t> counts;
  for (const auto& row : rows.rows) {
    counts[fmt::format("{}/{}/{}", text(row[0]), text(row[1]), text(row[2]))] = integer(row[3]);
  }
  return counts;
}

Result<bool> anyWorkLeft(Connection& connection, const std::string& target, int64_t onlyStudy,
                         const std::string& backend) {
  KILN_ASSIGN_OR_RETURN(
      Rows rows,
      connection.exec("SELECT count(*) AS n FROM queue q JOIN studies s ON s.id = q.study WHERE "
                      "s.backend = $3 AND (s.target IS NULL OR s.target = $1) AND ($2::bigint = 0 "
                      "OR q.study = $2::bigint) AND q.state IN ('queued', 'running')",
                      {target, std::to_string(onlyStudy), backend}));
  KILN_ASSIGN_OR_RETURN(const int64_t n, integerCell(rows, "n"));
  return n > 0;
}

}  // namespace kiln::tune::pg
