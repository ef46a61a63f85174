// A thin RAII layer over the SQLite C API for the tenant store: a connection, prepared
// statements with typed binds and columns, transactions, and ordered schema migrations.
// Failures are statuses carrying SQLite's own message. Not thread-safe: the owner serializes.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/common/status.h"

namespace edge::gateway::sqlite {

class statement;

class database {
 public:
  // Opens (creating) the file and applies the connection settings: WAL journal, synchronous
  // NORMAL (a committed transaction survives a process crash; only a power cut can take the
  // last ones), foreign keys on, and a busy timeout.
  static result<database> open(const std::filesystem::path& file);

  database(database&&) noexcept = default;
  database& operator=(database&&) noexcept = default;

  // Runs one or more statements without results.
  status exec(std::string_view sql);
  result<statement> prepare(std::string_view sql);

  std::int64_t changes() const;
  std::int64_t last_insert_rowid() const;
  std::string journal_mode();
  sqlite3* handle() const { return db_.get(); }

 private:
  struct closer {
    void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
  };
  explicit database(sqlite3* db) : db_(db) {}
  std::unique_ptr<sqlite3, closer> db_;
};

class statement {
 public:
  statement(statement&&) noexcept = default;
  statement& operator=(statement&&) noexcept = default;

  // Binds by 1-based position. Text and blobs are copied.
  statement& bind(int index, std::int64_t value);
  statement& bind(int index, double value);
  statement& bind(int index, std::string_view value);
  statement& bind(int index, std::span<const std::uint8_t> blob);
  statement& bind(int index, const std::optional<std::int64_t>& value);
  statement& bind_null(int index);

  // Advances: true with a row to read, false when done; a failure is a status.
  result<bool> step();
  // Runs a statement that returns no rows.
  status run();
  void reset();

  // Columns of the current row, 0-based.
  bool is_null(int column) const;
  std::int64_t int64(int column) const;
  std::optional<std::int64_t> optional_int64(int column) const;
  double real(int column) const;
  std::string text(int column) const;
  std::vector<std::uint8_t> blob(int column) const;

 private:
  friend class database;
  struct finalizer {
    void operator()(sqlite3_stmt* s) const { sqlite3_finalize(s); }
  };
  statement(sqlite3* db, sqlite3_stmt* s) : db_(db), stmt_(s) {}
  status failure(int code) const;
  sqlite3* db_;
  std::unique_ptr<sqlite3_stmt, finalizer> stmt_;
  int bind_error_ = SQLITE_OK;  // the first failed bind, reported by step()
};

// A transaction that rolls back unless committed.
class transaction {
 public:
  static result<transaction> begin(database& db);  // BEGIN IMMEDIATE: takes the write lock now
  transaction(transaction&& other) noexcept : db_(other.db_) { other.db_ = nullptr; }
  transaction& operator=(transaction&&) = delete;
  ~transaction();
  status commit();

 private:
  explicit transaction(database* db) : db_(db) {}
  database* db_;
};

// One step of the schema. Versions start at 1 and increase by one; each step runs once, in its
// own transaction, and the schema_version table records the last one applied.
struct migration {
  int version;
  std::string_view description;
  std::string_view sql;
};

// Applies the migrations newer than the database's version, in order. Returns the version the
// database is at afterwards. A database newer than the last migration known is refused (it was
// written by a newer build, whose data this one could misread); a failing step rolls back and
// leaves the database at the previous version.
result<int> migrate(database& db, std::span<const migration> migrations);
result<int> schema_version(database& db);

}  // namespace edge::gateway::sqlite
