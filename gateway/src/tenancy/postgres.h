// A thin layer over libpq for the PostgreSQL tenant store: a connection whose every wait has a
// deadline (connecting, sending, reading: a database that hangs costs a call its timeout, never
// a thread), parameterized statements in text form, result rows, transactions, LISTEN and
// waiting for notifications, and ordered schema migrations that several processes may run at
// once. Failures are statuses carrying the server's own message: a lost connection, a timeout
// or a refused connection is `unavailable`, a unique-key conflict `already_exists`, anything
// else the server refuses `internal`. Not thread-safe: the owner serializes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/common/status.h"

struct pg_conn;
struct pg_result;

namespace edge::gateway::postgres {

struct connection_options {
  std::string url;  // postgres://user:password@host:port/database?... or a key=value string
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds query_timeout{2000};
};

// A statement parameter in PostgreSQL's text form; nullopt is SQL NULL.
using param = std::optional<std::string>;
param text(std::string_view value);
param number(std::int64_t value);
param number(const std::optional<std::int64_t>& value);
param real(double value);
param bytea(std::span<const std::uint8_t> value);

// The rows of one statement.
class rows {
 public:
  int size() const;
  bool is_null(int row, int column) const;
  std::string text(int row, int column) const;
  std::int64_t int64(int row, int column) const;  // 0 for NULL or a malformed number
  std::optional<std::int64_t> optional_int64(int row, int column) const;
  double real(int row, int column) const;
  std::vector<std::uint8_t> bytea(int row, int column) const;  // from the hex form
  std::int64_t affected() const;  // rows an INSERT, UPDATE or DELETE touched

 private:
  friend class connection;
  struct clearer {
    void operator()(pg_result* r) const;
  };
  explicit rows(pg_result* r) : result_(r) {}
  std::unique_ptr<pg_result, clearer> result_;
};

class connection {
 public:
  // Connects within options.connect_timeout.
  static result<connection> open(const connection_options& options);
  connection(connection&&) noexcept = default;
  connection& operator=(connection&&) noexcept = default;

  // Runs one statement with $1, $2, ... bound to `params`, within the query timeout. On a
  // timeout or a lost connection the connection is closed (the server rolls back its open
  // transaction) and broken() is true from then on.
  result<rows> exec(std::string_view sql, std::span<const param> params = {});
  result<rows> exec(std::string_view sql, std::initializer_list<param> params) {
    return exec(sql, std::span<const param>(params.begin(), params.size()));
  }
  // exec() for a statement whose rows are not needed.
  status run(std::string_view sql, std::initializer_list<param> params = {});
  // Several statements without parameters (a migration step).
  status exec_script(std::string_view sql);

  bool broken() const;
  // "host:port/database", for logs.
  std::string describe() const;

  // Waits up to `timeout` for notifications on the channels this connection LISTENs to and
  // returns their channels (empty when none came). A lost connection is a status.
  result<std::vector<std::string>> wait_for_notifications(std::chrono::milliseconds timeout);

 private:
  struct finisher {
    void operator()(pg_conn* c) const;
  };
  connection(pg_conn* c, std::chrono::milliseconds query_timeout) : conn_(c), query_timeout_(query_timeout) {}
  // Waits for the socket to be readable (or writable) until `deadline`; false on timeout.
  bool wait_socket(bool for_write, std::chrono::steady_clock::time_point deadline) const;
  result<rows> collect(std::chrono::steady_clock::time_point deadline);
  status lost(std::string_view what);

  std::unique_ptr<pg_conn, finisher> conn_;
  std::chrono::milliseconds query_timeout_;
};

// A transaction that rolls back unless committed.
class transaction {
 public:
  enum class isolation { read_committed, repeatable_read_only };
  static result<transaction> begin(connection& c, isolation level = isolation::read_committed);
  transaction(transaction&& other) noexcept : c_(other.c_) { other.c_ = nullptr; }
  transaction& operator=(transaction&&) = delete;
  ~transaction();
  status commit();

 private:
  explicit transaction(connection* c) : c_(c) {}
  connection* c_;
};

// One step of the schema. Versions start at 1 and increase by one; each step runs once, in its
// own transaction, and the schema_version table records it.
struct migration {
  int version;
  std::string_view description;
  std::string_view sql;
};

// Applies the migrations newer than the database's version, in order, holding the session
// advisory lock `lock_key` throughout so that processes starting together apply each step once
// (the others wait, then find it done). Returns the version afterwards; a database newer than
// this build knows is refused.
result<int> migrate(connection& c, std::span<const migration> migrations, std::int64_t lock_key);

// The password in a connection URL replaced by "***", for logs and errors.
std::string redact_url(std::string_view url);

}  // namespace edge::gateway::postgres
