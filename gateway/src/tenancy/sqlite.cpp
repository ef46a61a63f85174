#include "sqlite.h"

#include "edge/common/format.h"

namespace edge::gateway::sqlite {
namespace {

constexpr int busy_timeout_ms = 5000;

status error_status(sqlite3* db, int code, std::string_view what) {
  const char* message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(code);
  const status_code kind = (code & 0xFF) == SQLITE_CORRUPT || (code & 0xFF) == SQLITE_NOTADB ? status_code::data_loss
                           : (code & 0xFF) == SQLITE_CONSTRAINT                              ? status_code::already_exists
                           : (code & 0xFF) == SQLITE_BUSY || (code & 0xFF) == SQLITE_LOCKED ? status_code::unavailable
                                                                                            : status_code::internal;
  return status(kind, format("sqlite: {}: {}", what, message));
}

}  // namespace

result<database> database::open(const std::filesystem::path& file) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(file.c_str(), &raw, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  database db(raw);  // closes even on failure
  if (rc != SQLITE_OK) return error_status(raw, rc, format("cannot open {}", file.string()));
  sqlite3_extended_result_codes(raw, 1);
  sqlite3_busy_timeout(raw, busy_timeout_ms);
  EDGE_RETURN_IF_ERROR(db.exec("PRAGMA foreign_keys = ON"));
  EDGE_ASSIGN_OR_RETURN(statement wal, db.prepare("PRAGMA journal_mode = WAL"));
  EDGE_ASSIGN_OR_RETURN(const bool row, wal.step());
  if (!row || wal.text(0) != "wal") {
    return failed_precondition(format("sqlite: {} cannot use a write-ahead log (journal mode {})", file.string(),
                                      row ? wal.text(0) : std::string("unknown")));
  }
  EDGE_RETURN_IF_ERROR(db.exec("PRAGMA synchronous = NORMAL"));
  return db;
}

status database::exec(std::string_view sql) {
  const std::string text(sql);
  char* message = nullptr;
  const int rc = sqlite3_exec(db_.get(), text.c_str(), nullptr, nullptr, &message);
  if (rc == SQLITE_OK) return {};
  std::string what = message != nullptr ? message : sqlite3_errstr(rc);
  sqlite3_free(message);
  return error_status(nullptr, rc, what);
}

result<statement> database::prepare(std::string_view sql) {
  sqlite3_stmt* raw = nullptr;
  const int rc = sqlite3_prepare_v2(db_.get(), sql.data(), static_cast<int>(sql.size()), &raw, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(raw);
    return error_status(db_.get(), rc, "prepare");
  }
  return statement(db_.get(), raw);
}

std::int64_t database::changes() const { return sqlite3_changes64(db_.get()); }
std::int64_t database::last_insert_rowid() const { return sqlite3_last_insert_rowid(db_.get()); }

std::string database::journal_mode() {
  auto stmt = prepare("PRAGMA journal_mode");
  if (!stmt.ok()) return {};
  auto row = stmt->step();
  return row.ok() && *row ? stmt->text(0) : std::string{};
}

statement& statement::bind(int index, std::int64_t value) {
  const int rc = sqlite3_bind_int64(stmt_.get(), index, value);
  if (rc != SQLITE_OK && bind_error_ == SQLITE_OK) bind_error_ = rc;
  return *this;
}

statement& statement::bind(int index, double value) {
  const int rc = sqlite3_bind_double(stmt_.get(), index, value);
  if (rc != SQLITE_OK && bind_error_ == SQLITE_OK) bind_error_ = rc;
  return *this;
}

statement& statement::bind(int index, std::string_view value) {
  const int rc = sqlite3_bind_text64(stmt_.get(), index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
  if (rc != SQLITE_OK && bind_error_ == SQLITE_OK) bind_error_ = rc;
  return *this;
}

statement& statement::bind(int index, std::span<const std::uint8_t> blob) {
  const int rc = sqlite3_bind_blob64(stmt_.get(), index, blob.data(), blob.size(), SQLITE_TRANSIENT);
  if (rc != SQLITE_OK && bind_error_ == SQLITE_OK) bind_error_ = rc;
  return *this;
}

statement& statement::bind(int index, const std::optional<std::int64_t>& value) {
  return value ? bind(index, *value) : bind_null(index);
}

statement& statement::bind_null(int index) {
  const int rc = sqlite3_bind_null(stmt_.get(), index);
  if (rc != SQLITE_OK && bind_error_ == SQLITE_OK) bind_error_ = rc;
  return *this;
}

status statement::failure(int code) const { return error_status(db_, code, sqlite3_sql(stmt_.get())); }

result<bool> statement::step() {
  if (bind_error_ != SQLITE_OK) return failure(bind_error_);
  const int rc = sqlite3_step(stmt_.get());
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return failure(rc);
}

status statement::run() {
  EDGE_ASSIGN_OR_RETURN(const bool row, step());
  (void)row;
  return {};
}

void statement::reset() {
  sqlite3_reset(stmt_.get());
  sqlite3_clear_bindings(stmt_.get());
  bind_error_ = SQLITE_OK;
}

bool statement::is_null(int column) const { return sqlite3_column_type(stmt_.get(), column) == SQLITE_NULL; }
std::int64_t statement::int64(int column) const { return sqlite3_column_int64(stmt_.get(), column); }
std::optional<std::int64_t> statement::optional_int64(int column) const {
  if (is_null(column)) return std::nullopt;
  return int64(column);
}
double statement::real(int column) const { return sqlite3_column_double(stmt_.get(), column); }

std::string statement::text(int column) const {
  const auto* p = sqlite3_column_text(stmt_.get(), column);
  const int n = sqlite3_column_bytes(stmt_.get(), column);
  return p != nullptr ? std::string(reinterpret_cast<const char*>(p), static_cast<std::size_t>(n)) : std::string{};
}

std::vector<std::uint8_t> statement::blob(int column) const {
  const auto* p = static_cast<const std::uint8_t*>(sqlite3_column_blob(stmt_.get(), column));
  const int n = sqlite3_column_bytes(stmt_.get(), column);
  return p != nullptr ? std::vector<std::uint8_t>(p, p + n) : std::vector<std::uint8_t>{};
}

result<transaction> transaction::begin(database& db) {
  EDGE_RETURN_IF_ERROR(db.exec("BEGIN IMMEDIATE"));
  return transaction(&db);
}

transaction::~transaction() {
  if (db_ != nullptr) (void)db_->exec("ROLLBACK");
}

status transaction::commit() {
  database* db = db_;
  db_ = nullptr;
  return db->exec("COMMIT");
}

result<int> schema_version(database& db) {
  EDGE_RETURN_IF_ERROR(db.exec("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"));
  EDGE_ASSIGN_OR_RETURN(statement query, db.prepare("SELECT max(version) FROM schema_version"));
  EDGE_ASSIGN_OR_RETURN(const bool row, query.step());
  return row && !query.is_null(0) ? static_cast<int>(query.int64(0)) : 0;
}

result<int> migrate(database& db, std::span<const migration> migrations) {
  for (std::size_t i = 0; i < migrations.size(); ++i) {
    if (migrations[i].version != static_cast<int>(i) + 1) {
      return internal_error(format("migration {} is numbered {}: versions must run 1, 2, 3, ...", i + 1,
                                   migrations[i].version));
    }
  }
  EDGE_ASSIGN_OR_RETURN(int version, schema_version(db));
  const int known = static_cast<int>(migrations.size());
  if (version > known) {
    return failed_precondition(format("the state database is at schema version {}, newer than this build knows ({}): "
                                      "it was written by a newer edgeinfer",
                                      version, known));
  }
  for (const migration& step : migrations.subspan(static_cast<std::size_t>(version))) {
    EDGE_ASSIGN_OR_RETURN(transaction tx, transaction::begin(db));
    if (status applied = db.exec(step.sql); !applied.ok()) {
      return applied.with_context(format("schema migration {} ({})", step.version, step.description));
    }
    EDGE_ASSIGN_OR_RETURN(statement record, db.prepare("INSERT INTO schema_version (version) VALUES (?)"));
    EDGE_RETURN_IF_ERROR(record.bind(1, std::int64_t{step.version}).run());
    EDGE_RETURN_IF_ERROR(tx.commit());
    version = step.version;
  }
  return version;
}

}  // namespace edge::gateway::sqlite
