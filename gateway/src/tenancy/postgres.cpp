#include "postgres.h"

#include <libpq-fe.h>
#include <poll.h>

#include <charconv>
#include <cstdio>

#include "edge/common/format.h"

namespace edge::gateway::postgres {
namespace {

using clock_type = std::chrono::steady_clock;

constexpr std::string_view unique_violation = "23505";

std::string trimmed(const char* message) {
  std::string out = message != nullptr ? message : "";
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

param text(std::string_view value) { return std::string(value); }
param number(std::int64_t value) { return std::to_string(value); }
param number(const std::optional<std::int64_t>& value) {
  return value ? param(std::to_string(*value)) : param(std::nullopt);
}
param real(double value) {
  char buffer[32];
  const int n = std::snprintf(buffer, sizeof buffer, "%.17g", value);
  return std::string(buffer, static_cast<std::size_t>(n));
}
param bytea(std::span<const std::uint8_t> value) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string out = "\\x";
  out.reserve(2 + 2 * value.size());
  for (const std::uint8_t b : value) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

void rows::clearer::operator()(pg_result* r) const { PQclear(r); }

int rows::size() const { return PQntuples(result_.get()); }
bool rows::is_null(int row, int column) const { return PQgetisnull(result_.get(), row, column) != 0; }

std::string rows::text(int row, int column) const {
  return std::string(PQgetvalue(result_.get(), row, column),
                     static_cast<std::size_t>(PQgetlength(result_.get(), row, column)));
}

std::int64_t rows::int64(int row, int column) const {
  const char* p = PQgetvalue(result_.get(), row, column);
  const char* end = p + PQgetlength(result_.get(), row, column);
  std::int64_t value = 0;
  std::from_chars(p, end, value);
  return value;
}

std::optional<std::int64_t> rows::optional_int64(int row, int column) const {
  if (is_null(row, column)) return std::nullopt;
  return int64(row, column);
}

double rows::real(int row, int column) const {
  // strtod reads the shortest round-trip text the server writes (extra_float_digits is 1 by default).
  return std::strtod(PQgetvalue(result_.get(), row, column), nullptr);
}

std::vector<std::uint8_t> rows::bytea(int row, int column) const {
  const std::string hex = text(row, column);
  std::vector<std::uint8_t> out;
  if (hex.size() < 2 || hex[0] != '\\' || hex[1] != 'x') return out;
  out.reserve((hex.size() - 2) / 2);
  for (std::size_t i = 2; i + 1 < hex.size(); i += 2) {
    const int high = hex_value(hex[i]);
    const int low = hex_value(hex[i + 1]);
    if (high < 0 || low < 0) return {};
    out.push_back(static_cast<std::uint8_t>(high * 16 + low));
  }
  return out;
}

std::int64_t rows::affected() const {
  const char* n = PQcmdTuples(result_.get());
  std::int64_t value = 0;
  if (n != nullptr) std::from_chars(n, n + std::char_traits<char>::length(n), value);
  return value;
}

void connection::finisher::operator()(pg_conn* c) const { PQfinish(c); }

result<connection> connection::open(const connection_options& options) {
  // The URL first (expanded), then settings of ours that a URL parameter cannot loosen.
  const char* keywords[] = {"dbname", "application_name", "keepalives", "keepalives_idle", nullptr};
  const char* values[] = {options.url.c_str(), "edgeinfer", "1", "10", nullptr};
  pg_conn* raw = PQconnectStartParams(keywords, values, /*expand_dbname=*/1);
  if (raw == nullptr) return unavailable("cannot allocate a PostgreSQL connection");
  connection c(raw, options.query_timeout);
  if (PQstatus(raw) == CONNECTION_BAD) {
    return unavailable(format("cannot connect to PostgreSQL at {}: {}", redact_url(options.url),
                              trimmed(PQerrorMessage(raw))));
  }
  const auto deadline = clock_type::now() + options.connect_timeout;
  for (PostgresPollingStatusType state = PGRES_POLLING_WRITING;;) {
    if (state == PGRES_POLLING_OK) break;
    if (state == PGRES_POLLING_FAILED) {
      return unavailable(format("cannot connect to PostgreSQL at {}: {}", redact_url(options.url),
                                trimmed(PQerrorMessage(raw))));
    }
    if (!c.wait_socket(state == PGRES_POLLING_WRITING, deadline)) {
      return unavailable(format("cannot connect to PostgreSQL at {}: no answer within {} ms", redact_url(options.url),
                                options.connect_timeout.count()));
    }
    state = PQconnectPoll(raw);
  }
  if (PQsetnonblocking(raw, 1) != 0) return unavailable("cannot make the PostgreSQL connection non-blocking");
  // The server's notices ("relation already exists, skipping") are not errors; nobody reads them.
  PQsetNoticeProcessor(raw, [](void*, const char*) {}, nullptr);
  return c;
}

bool connection::broken() const { return !conn_ || PQstatus(conn_.get()) != CONNECTION_OK; }

std::string connection::describe() const {
  if (!conn_) return "(closed)";
  return format("{}:{}/{}", PQhost(conn_.get()), PQport(conn_.get()), PQdb(conn_.get()));
}

bool connection::wait_socket(bool for_write, clock_type::time_point deadline) const {
  const int fd = PQsocket(conn_.get());
  if (fd < 0) return false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
    if (left.count() <= 0) return false;
    pollfd p{.fd = fd, .events = static_cast<short>(for_write ? POLLOUT : POLLIN), .revents = 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) return false;
  }
}

status connection::lost(std::string_view what) {
  const std::string message =
      format("PostgreSQL at {}: {}{}", describe(), what,
             conn_ && PQerrorMessage(conn_.get())[0] != '\0' ? ": " + trimmed(PQerrorMessage(conn_.get())) : "");
  conn_.reset();  // the server rolls back whatever this connection had open
  return unavailable(message);
}

result<rows> connection::collect(clock_type::time_point deadline) {
  pg_conn* c = conn_.get();
  // Send what libpq buffered.
  for (;;) {
    const int flushed = PQflush(c);
    if (flushed == 0) break;
    if (flushed < 0) return lost("cannot send");
    if (!wait_socket(/*for_write=*/true, deadline)) return lost("no room to send within the query timeout");
  }
  std::optional<rows> last;
  std::optional<status> failure;
  for (;;) {
    // PQgetResult blocks while the next result's input has not been read: read it first, within
    // the deadline (a script has one result per statement).
    while (PQisBusy(c) != 0) {
      if (!wait_socket(/*for_write=*/false, deadline)) {
        return lost(format("no answer within the query timeout ({} ms)", query_timeout_.count()));
      }
      if (PQconsumeInput(c) == 0) return lost("connection lost");
    }
    pg_result* r = PQgetResult(c);
    if (r == nullptr) break;
    rows held(r);
    const ExecStatusType state = PQresultStatus(r);
    if (state == PGRES_FATAL_ERROR || state == PGRES_BAD_RESPONSE || state == PGRES_NONFATAL_ERROR) {
      if (!failure) {
        const char* sqlstate = PQresultErrorField(r, PG_DIAG_SQLSTATE);
        const std::string message = trimmed(PQresultErrorMessage(r));
        failure = sqlstate != nullptr && std::string_view(sqlstate) == unique_violation
                      ? status(status_code::already_exists, message)
                      : internal_error(format("PostgreSQL: {}", message));
      }
    } else {
      last.emplace(std::move(held));
    }
  }
  if (PQstatus(c) != CONNECTION_OK) return lost("connection lost");
  if (failure) return *failure;
  if (!last) return internal_error("PostgreSQL returned no result");
  return std::move(*last);
}

result<rows> connection::exec(std::string_view sql, std::span<const param> params) {
  if (broken()) return unavailable("the PostgreSQL connection is closed");
  const auto deadline = clock_type::now() + query_timeout_;
  const std::string statement(sql);
  std::vector<const char*> values;
  values.reserve(params.size());
  for (const param& p : params) values.push_back(p ? p->c_str() : nullptr);
  if (PQsendQueryParams(conn_.get(), statement.c_str(), static_cast<int>(values.size()), nullptr, values.data(),
                        nullptr, nullptr, 0) == 0) {
    return lost("cannot send a statement");
  }
  return collect(deadline);
}

status connection::run(std::string_view sql, std::initializer_list<param> params) {
  auto done = exec(sql, params);
  return done.ok() ? status{} : done.error();
}

status connection::exec_script(std::string_view sql) {
  if (broken()) return unavailable("the PostgreSQL connection is closed");
  const auto deadline = clock_type::now() + query_timeout_;
  const std::string script(sql);
  if (PQsendQuery(conn_.get(), script.c_str()) == 0) return lost("cannot send a statement");
  auto done = collect(deadline);
  return done.ok() ? status{} : done.error();
}

result<std::vector<std::string>> connection::wait_for_notifications(std::chrono::milliseconds timeout) {
  if (broken()) return unavailable("the PostgreSQL connection is closed");
  std::vector<std::string> channels;
  const auto take = [&] {
    while (PGnotify* n = PQnotifies(conn_.get())) {
      channels.emplace_back(n->relname);
      PQfreemem(n);
    }
  };
  take();
  if (!channels.empty()) return channels;
  if (wait_socket(/*for_write=*/false, clock_type::now() + timeout)) {
    if (PQconsumeInput(conn_.get()) == 0) return lost("connection lost");
    take();
  }
  if (PQstatus(conn_.get()) != CONNECTION_OK) return lost("connection lost");
  return channels;
}

result<transaction> transaction::begin(connection& c, isolation level) {
  EDGE_RETURN_IF_ERROR(
      c.run(level == isolation::read_committed ? "BEGIN" : "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"));
  return transaction(&c);
}

transaction::~transaction() {
  if (c_ != nullptr && !c_->broken()) (void)c_->exec("ROLLBACK");
}

status transaction::commit() {
  connection* c = std::exchange(c_, nullptr);
  return c->run("COMMIT");
}

result<int> migrate(connection& c, std::span<const migration> migrations, std::int64_t lock_key) {
  for (std::size_t i = 0; i < migrations.size(); ++i) {
    if (migrations[i].version != static_cast<int>(i) + 1) {
      return internal_error(format("migration {} is numbered {}: versions must run 1, 2, 3, ...", i + 1,
                                   migrations[i].version));
    }
  }
  // A session lock: held across the steps' transactions, released at the end (or when the
  // connection drops).
  EDGE_RETURN_IF_ERROR(c.run("SELECT pg_advisory_lock($1)", {number(lock_key)}));
  auto run = [&]() -> result<int> {
    EDGE_RETURN_IF_ERROR(c.run("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)"));
    EDGE_ASSIGN_OR_RETURN(rows found, c.exec("SELECT coalesce(max(version), 0) FROM schema_version"));
    int version = static_cast<int>(found.int64(0, 0));
    const int known = static_cast<int>(migrations.size());
    if (version > known) {
      return failed_precondition(format("the tenant database is at schema version {}, newer than this build knows "
                                        "({}): it was written by a newer edgeinfer",
                                        version, known));
    }
    for (const migration& step : migrations.subspan(static_cast<std::size_t>(version))) {
      EDGE_ASSIGN_OR_RETURN(transaction tx, transaction::begin(c));
      if (status applied = c.exec_script(step.sql); !applied.ok()) {
        return applied.with_context(format("schema migration {} ({})", step.version, step.description));
      }
      EDGE_RETURN_IF_ERROR(c.run("INSERT INTO schema_version (version) VALUES ($1)", {number(std::int64_t{step.version})}));
      EDGE_RETURN_IF_ERROR(tx.commit());
      version = step.version;
    }
    return version;
  };
  result<int> version = run();
  if (!c.broken()) (void)c.exec("SELECT pg_advisory_unlock($1)", {number(lock_key)});
  return version;
}

std::string redact_url(std::string_view url) {
  const std::size_t scheme = url.find("://");
  if (scheme == std::string_view::npos) return std::string(url);
  const std::size_t start = scheme + 3;
  const std::size_t end = url.find_first_of("/?", start);
  const std::string_view authority = url.substr(start, end == std::string_view::npos ? url.npos : end - start);
  const std::size_t at = authority.rfind('@');
  if (at == std::string_view::npos) return std::string(url);
  const std::size_t colon = authority.find(':');
  if (colon == std::string_view::npos || colon > at) return std::string(url);
  std::string out(url.substr(0, start + colon + 1));
  out += "***";
  out += url.substr(start + at);
  return out;
}

}  // namespace edge::gateway::postgres
