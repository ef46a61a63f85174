#include "edge/gateway/tenancy/tenant_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <boost/json/serialize.hpp>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "edge/common/format.h"
#include "edge/gateway/tenancy/tenant_json.h"
#include "sqlite.h"
#include "tenant_stores.h"

namespace edge::gateway {
namespace {

using namespace store_rows;

constexpr std::string_view lock_file_name = "lock";

// The schema, one step per version; never edit a released step, add the next one. The tenants
// table has a column per quota kind, named as the kind (quota_kinds.h): a new kind adds its
// column (INTEGER, NULL for unlimited) in a step of its own.
constexpr sqlite::migration schema_migrations[] = {
    {1, "tenants, keys, usage ledger, audit log", R"sql(
CREATE TABLE meta (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE tenants (
  id                     TEXT PRIMARY KEY,
  weight                 REAL NOT NULL CHECK (weight > 0),
  requests_per_minute    INTEGER,
  tokens_per_minute      INTEGER,
  max_concurrent         INTEGER,
  daily_tokens           INTEGER,
  max_tokens_per_request INTEGER,
  created_at             INTEGER NOT NULL,
  updated_at             INTEGER NOT NULL
);
CREATE TABLE api_keys (
  id            TEXT PRIMARY KEY,
  tenant_id     TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
  secret_sha256 BLOB NOT NULL CHECK (length(secret_sha256) = 32),
  created_at    INTEGER NOT NULL,
  expires_at    INTEGER,
  revoked_at    INTEGER
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id);
CREATE TABLE usage_hourly (
  tenant_id         TEXT NOT NULL,
  hour_start        INTEGER NOT NULL,
  requests          INTEGER NOT NULL DEFAULT 0,
  prompt_tokens     INTEGER NOT NULL DEFAULT 0,
  completion_tokens INTEGER NOT NULL DEFAULT 0,
  cached_tokens     INTEGER NOT NULL DEFAULT 0,
  rejections        INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant_id, hour_start)
) WITHOUT ROWID;
CREATE INDEX usage_hourly_by_hour ON usage_hourly (hour_start);
CREATE TABLE audit_log (
  id         INTEGER PRIMARY KEY AUTOINCREMENT,
  at         INTEGER NOT NULL,
  actor      TEXT NOT NULL,
  action     TEXT NOT NULL,
  target     TEXT NOT NULL,
  request_id TEXT NOT NULL,
  details    TEXT NOT NULL
);
)sql"},
    {2, "daily-budget holds of requests being served", R"sql(
CREATE TABLE usage_holds (
  id              TEXT PRIMARY KEY,
  tenant_id       TEXT NOT NULL,
  day             INTEGER NOT NULL,
  reserved_tokens INTEGER NOT NULL CHECK (reserved_tokens >= 0),
  charged_tokens  INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
)sql"},
    {3, "the Responses API's stored responses", R"sql(
CREATE TABLE stored_responses (
  tenant_id    TEXT NOT NULL,
  id           TEXT NOT NULL,
  created_at   INTEGER NOT NULL,
  expires_at   INTEGER NOT NULL,
  bytes        INTEGER NOT NULL CHECK (bytes >= 0),
  response     TEXT NOT NULL,
  conversation TEXT NOT NULL,
  UNIQUE (tenant_id, id)
);
CREATE INDEX stored_responses_by_expiry ON stored_responses (expires_at);
)sql"},
    {4, "the tenants' caps on the host-memory and disk KV tiers", R"sql(
ALTER TABLE tenants ADD COLUMN kv_host_cache_bytes INTEGER;
ALTER TABLE tenants ADD COLUMN kv_disk_cache_bytes INTEGER;
)sql"},
    {5, "the ids of the usage batches added, so that a retried batch is added once", R"sql(
CREATE TABLE ledger_batches (
  id TEXT PRIMARY KEY,
  at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX ledger_batches_by_time ON ledger_batches (at);
)sql"},
    {6, "served usage by API key, model and API, for the spend view", R"sql(
CREATE TABLE usage_by_key (
  tenant_id         TEXT NOT NULL,
  hour_start        INTEGER NOT NULL,
  key_id            TEXT NOT NULL,
  model             TEXT NOT NULL,
  api               TEXT NOT NULL,
  requests          INTEGER NOT NULL DEFAULT 0,
  prompt_tokens     INTEGER NOT NULL DEFAULT 0,
  completion_tokens INTEGER NOT NULL DEFAULT 0,
  cached_tokens     INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant_id, hour_start, key_id, model, api)
) WITHOUT ROWID;
)sql"},
    {7, "the tenants' monthly token budgets", R"sql(
ALTER TABLE tenants ADD COLUMN monthly_tokens INTEGER;
)sql"},
};

tenant_record read_tenant(const sqlite::statement& row) {
  tenant_record t;
  t.id = row.text(0);
  t.weight = row.real(1);
  for (const quota_kind& kind : quota_kinds) {
    kind.of(t.quotas) = row.optional_int64(first_quota_column + static_cast<int>(quota_kind_index(kind)));
  }
  t.created_at = row.int64(created_at_column);
  t.updated_at = row.int64(created_at_column + 1);
  return t;
}

result<api_key_record> read_key(const sqlite::statement& row) {
  api_key_record k;
  k.id = row.text(0);
  k.tenant_id = row.text(1);
  const std::vector<std::uint8_t> digest = row.blob(2);
  if (digest.size() != k.secret_sha256.size()) return data_loss(format("key {} has a malformed digest", k.id));
  std::copy(digest.begin(), digest.end(), k.secret_sha256.begin());
  k.created_at = row.int64(3);
  k.expires_at = row.optional_int64(4);
  k.revoked_at = row.optional_int64(5);
  return k;
}

status insert_tenant(sqlite::database& db, const tenant_record& t) {
  std::string placeholders = "?";
  for (int i = 1; i < tenant_column_count; ++i) placeholders += ", ?";
  EDGE_ASSIGN_OR_RETURN(sqlite::statement insert,
                        db.prepare(format("INSERT INTO tenants ({}) VALUES ({})", tenant_columns(), placeholders)));
  int column = 1;
  insert.bind(column++, std::string_view(t.id));
  insert.bind(column++, t.weight);
  for (const quota_kind& kind : quota_kinds) insert.bind(column++, kind.of(t.quotas));
  insert.bind(column++, t.created_at);
  insert.bind(column++, t.updated_at);
  return insert.run();
}

// Adds each row to its (tenant, hour, key, model, api) row.
status add_details(sqlite::database& db, const std::vector<usage_detail_row>& rows) {
  EDGE_ASSIGN_OR_RETURN(
      sqlite::statement upsert,
      db.prepare("INSERT INTO usage_by_key (tenant_id, hour_start, key_id, model, api, requests, prompt_tokens, "
                 "completion_tokens, cached_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                 "ON CONFLICT (tenant_id, hour_start, key_id, model, api) DO UPDATE SET "
                 "requests = requests + excluded.requests, prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
                 "completion_tokens = completion_tokens + excluded.completion_tokens, "
                 "cached_tokens = cached_tokens + excluded.cached_tokens"));
  for (const usage_detail_row& row : rows) {
    upsert.reset();
    EDGE_RETURN_IF_ERROR(upsert.bind(1, std::string_view(row.tenant_id))
                             .bind(2, hour_start_of(row.hour_start))
                             .bind(3, std::string_view(row.labels.key_id))
                             .bind(4, std::string_view(row.labels.model))
                             .bind(5, std::string_view(row.labels.api))
                             .bind(6, row.counts.requests)
                             .bind(7, row.counts.prompt_tokens)
                             .bind(8, row.counts.completion_tokens)
                             .bind(9, row.counts.cached_tokens)
                             .run());
  }
  return {};
}

// Writes `r` as the tenant's response of its id (replacing one), times as they are.
status put_stored_response(sqlite::database& db, std::string_view tenant_id, const stored_response& r) {
  EDGE_ASSIGN_OR_RETURN(sqlite::statement insert,
                        db.prepare("INSERT OR REPLACE INTO stored_responses (tenant_id, id, created_at, expires_at, "
                                   "bytes, response, conversation) VALUES (?, ?, ?, ?, ?, ?, ?)"));
  return insert.bind(1, tenant_id)
      .bind(2, std::string_view(r.id))
      .bind(3, r.created_at)
      .bind(4, r.expires_at)
      .bind(5, r.bytes())
      .bind(6, std::string_view(r.response))
      .bind(7, std::string_view(r.conversation))
      .run();
}

// Holds an exclusive flock on a file for the store's life.
class directory_lock {
 public:
  static result<directory_lock> acquire(const std::filesystem::path& file) {
    const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) return unavailable(format("cannot open {}: {}", file.string(), std::strerror(errno)));
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const int error = errno;
      ::close(fd);
      if (error == EWOULDBLOCK) {
        return failed_precondition(format("the state directory {} is in use by another edgeinfer process",
                                          file.parent_path().string()));
      }
      return unavailable(format("cannot lock {}: {}", file.string(), std::strerror(error)));
    }
    return directory_lock(fd);
  }
  directory_lock(directory_lock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  directory_lock& operator=(directory_lock&&) = delete;
  ~directory_lock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }

 private:
  explicit directory_lock(int fd) : fd_(fd) {}
  int fd_;
};

}  // namespace

// SQLite in a state directory this process owns.
class sqlite_tenant_store final : public tenant_store {
 public:
  struct impl;
  explicit sqlite_tenant_store(std::unique_ptr<impl> state);
  ~sqlite_tenant_store() override;

  std::shared_ptr<const tenant_snapshot> snapshot() const override;
  std::string description() const override;
  int schema_version() const override;
  tenant_store_health health() const override;
  result<std::optional<issued_api_key>> bootstrap_default_tenant(const audit_context& who) override;
  result<tenant_record> create_tenant(tenant_record tenant, const audit_context& who) override;
  result<std::vector<tenant_record>> list_tenants() const override;
  result<tenant_record> get_tenant(std::string_view id) const override;
  result<tenant_record> update_tenant(std::string_view id, const tenant_patch& patch,
                                      const audit_context& who) override;
  status delete_tenant(std::string_view id, const audit_context& who) override;
  result<issued_api_key> create_key(std::string_view tenant_id, std::optional<unix_time> expires_at,
                                    const audit_context& who) override;
  result<std::vector<api_key_record>> list_keys(std::string_view tenant_id) const override;
  result<api_key_record> revoke_key(std::string_view key_id, const audit_context& who) override;
  status add_usage(const usage_batch& batch) override;
  status add_hold(const usage_hold& hold) override;
  result<std::map<std::string, std::int64_t>> unreleased_hold_tokens(std::int64_t day) override;
  result<std::vector<usage_row>> usage(std::string_view tenant_id, unix_time from, unix_time to) const override;
  result<std::map<std::string, std::int64_t>> tokens_since(unix_time from) const override;
  result<std::vector<spend_row>> spend(std::string_view tenant_id, unix_time from, unix_time to,
                                       std::optional<std::string_view> key_id) const override;
  result<bool> put_response(std::string_view tenant_id, stored_response r, std::int64_t ttl_seconds,
                            std::int64_t max_bytes) override;
  result<std::optional<stored_response>> get_response(std::string_view tenant_id,
                                                      std::string_view id) const override;
  result<bool> delete_response(std::string_view tenant_id, std::string_view id) override;
  result<std::int64_t> stored_response_bytes(std::string_view tenant_id) const override;
  result<std::vector<audit_entry>> audit(std::size_t limit, std::optional<std::int64_t> before) const override;
  result<store_contents> contents() const override;
  status import_contents(const store_contents& contents) override;

 private:
  std::unique_ptr<impl> impl_;
};

struct sqlite_tenant_store::impl {
  impl(directory_lock lock_, sqlite::database db_, std::filesystem::path file_, const time_source& clock_, int version_)
      : lock(std::move(lock_)), db(std::move(db_)), file(std::move(file_)), clock(clock_), version(version_) {}

  directory_lock lock;
  mutable std::mutex mutex;
  mutable sqlite::database db;  // guarded by mutex
  std::filesystem::path file;
  const time_source& clock;
  int version;
  std::uint64_t snapshot_version = 0;  // guarded by mutex
  std::atomic<std::shared_ptr<const tenant_snapshot>> current{std::make_shared<const tenant_snapshot>()};

  unix_time now() const { return to_unix_seconds(clock.system_time()); }

  // Both require mutex held.
  result<std::optional<tenant_record>> find_tenant(std::string_view id) const;
  status write_audit(std::string_view action, std::string_view target, const boost::json::object& details,
                     const audit_context& who);
  status refresh_snapshot();
};

result<std::optional<tenant_record>> sqlite_tenant_store::impl::find_tenant(std::string_view id) const {
  EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                        db.prepare(format("SELECT {} FROM tenants WHERE id = ?", tenant_columns())));
  q.bind(1, id);
  EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
  if (!row) return std::optional<tenant_record>{};
  return std::optional<tenant_record>(read_tenant(q));
}

status sqlite_tenant_store::impl::write_audit(std::string_view action, std::string_view target,
                                       const boost::json::object& details, const audit_context& who) {
  EDGE_ASSIGN_OR_RETURN(sqlite::statement insert,
                        db.prepare("INSERT INTO audit_log (at, actor, action, target, request_id, details) "
                                   "VALUES (?, ?, ?, ?, ?, ?)"));
  return insert.bind(1, now())
      .bind(2, std::string_view(who.actor))
      .bind(3, action)
      .bind(4, target)
      .bind(5, std::string_view(who.request_id))
      .bind(6, std::string_view(boost::json::serialize(details)))
      .run();
}

status sqlite_tenant_store::impl::refresh_snapshot() {
  std::vector<tenant_record> tenants;
  std::vector<api_key_record> keys;
  {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement q, db.prepare(format("SELECT {} FROM tenants", tenant_columns())));
    for (;;) {
      EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
      if (!row) break;
      tenants.push_back(read_tenant(q));
    }
  }
  {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement q, db.prepare(format("SELECT {} FROM api_keys", key_columns)));
    for (;;) {
      EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
      if (!row) break;
      EDGE_ASSIGN_OR_RETURN(api_key_record key, read_key(q));
      keys.push_back(std::move(key));
    }
  }
  current.store(std::make_shared<const tenant_snapshot>(std::move(tenants), std::move(keys), ++snapshot_version));
  return {};
}

sqlite_tenant_store::sqlite_tenant_store(std::unique_ptr<impl> state) : impl_(std::move(state)) {}
sqlite_tenant_store::~sqlite_tenant_store() = default;

result<std::unique_ptr<tenant_store>> open_sqlite_tenant_store(const std::filesystem::path& state_dir,
                                                               const time_source& clock) {
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) return unavailable(format("cannot create the state directory {}: {}", state_dir.string(), ec.message()));
  EDGE_ASSIGN_OR_RETURN(directory_lock lock, directory_lock::acquire(state_dir / lock_file_name));
  const std::filesystem::path file = state_dir / tenant_store::database_name;
  EDGE_ASSIGN_OR_RETURN(sqlite::database db, sqlite::database::open(file));
  EDGE_ASSIGN_OR_RETURN(const int version, sqlite::migrate(db, schema_migrations));
  auto state = std::make_unique<sqlite_tenant_store::impl>(std::move(lock), std::move(db), file, clock, version);
  {
    std::lock_guard guard(state->mutex);
    EDGE_RETURN_IF_ERROR(state->refresh_snapshot());
  }
  return std::unique_ptr<tenant_store>(new sqlite_tenant_store(std::move(state)));
}

std::shared_ptr<const tenant_snapshot> sqlite_tenant_store::snapshot() const { return impl_->current.load(); }
std::string sqlite_tenant_store::description() const { return "SQLite " + impl_->file.string(); }
int sqlite_tenant_store::schema_version() const { return impl_->version; }
tenant_store_health sqlite_tenant_store::health() const {
  return {.reachable = true, .checked_at = impl_->now(), .failures = 0};
}

result<std::optional<issued_api_key>> sqlite_tenant_store::bootstrap_default_tenant(const audit_context& who) {
  std::lock_guard guard(impl_->mutex);
  auto& db = impl_->db;
  EDGE_ASSIGN_OR_RETURN(sqlite::transaction tx, sqlite::transaction::begin(db));
  EDGE_ASSIGN_OR_RETURN(sqlite::statement done, db.prepare("SELECT value FROM meta WHERE key = ?"));
  done.bind(1, bootstrapped_key);
  EDGE_ASSIGN_OR_RETURN(const bool already, done.step());
  if (already) return std::optional<issued_api_key>{};

  const unix_time now = impl_->now();
  EDGE_ASSIGN_OR_RETURN(sqlite::statement mark, db.prepare("INSERT INTO meta (key, value) VALUES (?, ?)"));
  EDGE_RETURN_IF_ERROR(mark.bind(1, bootstrapped_key).bind(2, std::string_view(std::to_string(now))).run());

  // A store that already has tenants (made by hand before the first start) is left as it is.
  EDGE_ASSIGN_OR_RETURN(sqlite::statement count, db.prepare("SELECT count(*) FROM tenants"));
  EDGE_ASSIGN_OR_RETURN(const bool counted, count.step());
  if (counted && count.int64(0) > 0) {
    EDGE_RETURN_IF_ERROR(tx.commit());
    return std::optional<issued_api_key>{};
  }
  EDGE_ASSIGN_OR_RETURN(sqlite::statement insert,
                        db.prepare("INSERT INTO tenants (id, weight, created_at, updated_at) VALUES (?, 1.0, ?, ?)"));
  EDGE_RETURN_IF_ERROR(insert.bind(1, default_tenant_id).bind(2, now).bind(3, now).run());
  const tenant_record created{std::string(default_tenant_id), 1.0, {}, now, now};
  EDGE_RETURN_IF_ERROR(impl_->write_audit("tenant.create", default_tenant_id, to_json(created), who));
  issued_api_key issued = generate_api_key(default_tenant_id, now, std::nullopt);
  EDGE_ASSIGN_OR_RETURN(sqlite::statement key,
                        db.prepare("INSERT INTO api_keys (id, tenant_id, secret_sha256, created_at) VALUES (?, ?, ?, ?)"));
  EDGE_RETURN_IF_ERROR(key.bind(1, std::string_view(issued.record.id))
                           .bind(2, default_tenant_id)
                           .bind(3, std::span<const std::uint8_t>(issued.record.secret_sha256))
                           .bind(4, now)
                           .run());
  boost::json::object details = to_json(issued.record, now);
  EDGE_RETURN_IF_ERROR(impl_->write_audit("key.create", issued.record.id, details, who));
  EDGE_RETURN_IF_ERROR(tx.commit());
  EDGE_RETURN_IF_ERROR(impl_->refresh_snapshot());
  return std::optional<issued_api_key>(std::move(issued));
}

result<tenant_record> sqlite_tenant_store::create_tenant(tenant_record tenant, const audit_context& who) {
  if (!is_valid_tenant_id(tenant.id)) return invalid_argument(format("'{}' is not a valid tenant id", tenant.id));
  std::lock_guard guard(impl_->mutex);
  auto& db = impl_->db;
  EDGE_ASSIGN_OR_RETURN(sqlite::transaction tx, sqlite::transaction::begin(db));
  EDGE_ASSIGN_OR_RETURN(auto existing, impl_->find_tenant(tenant.id));
  if (existing) return store_rows::tenant_exists(tenant.id);
  tenant.created_at = tenant.updated_at = impl_->now();
  EDGE_RETURN_IF_ERROR(insert_tenant(db, tenant));
  EDGE_RETURN_IF_ERROR(impl_->write_audit("tenant.create", tenant.id, to_json(tenant), who));
  EDGE_RETURN_IF_ERROR(tx.commit());
  EDGE_RETURN_IF_ERROR(impl_->refresh_snapshot());
  return tenant;
}

result<std::vector<tenant_record>> sqlite_tenant_store::list_tenants() const {
  std::lock_guard guard(impl_->mutex);
  EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                        impl_->db.prepare(format("SELECT {} FROM tenants ORDER BY id", tenant_columns())));
  std::vector<tenant_record> out;
  for (;;) {
    EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
    if (!row) break;
    out.push_back(read_tenant(q));
  }
  return out;
}

result<tenant_record> sqlite_tenant_store::get_tenant(std::string_view id) const {
  std::lock_guard guard(impl_->mutex);
  EDGE_ASSIGN_OR_RETURN(auto found, impl_->find_tenant(id));
  if (!found) return store_rows::no_such_tenant(id);
  return std::move(*found);
}

result<tenant_record> sqlite_tenant_store::update_tenant(std::string_view id, const tenant_patch& patch,
                                                  const audit_context& who) {
  std::lock_guard guard(impl_->mutex);
  auto& db = impl_->db;
  EDGE_ASSIGN_OR_RETURN(sqlite::transaction tx, sqlite::transaction::begin(db));
  EDGE_ASSIGN_OR_RETURN(auto found, impl_->find_tenant(id));
  if (!found) return store_rows::no_such_tenant(id);
  const tenant_record before = *found;
  tenant_record after = before;
  patch.apply_to(after);
  after.updated_at = impl_->now();
  EDGE_ASSIGN_OR_RETURN(sqlite::statement update,
                        db.prepare(format("UPDATE tenants SET weight = ?, {}updated_at = ? WHERE id = ?",
                                          quota_columns(" = ?"))));
  int column = 1;
  update.bind(column++, after.weight);
  for (const quota_kind& kind : quota_kinds) update.bind(column++, kind.of(after.quotas));
  update.bind(column++, after.updated_at);
  update.bind(column++, id);
  EDGE_RETURN_IF_ERROR(update.run());
  boost::json::object details;
  details["before"] = to_json(before);
  details["after"] = to_json(after);
  EDGE_RETURN_IF_ERROR(impl_->write_audit("tenant.update", id, details, who));
  EDGE_RETURN_IF_ERROR(tx.commit());
  EDGE_RETURN_IF_ERROR(impl_->refresh_snapshot());
  return after;
}

status sqlite_tenant_store::delete_tenant(std::string_view id, const audit_context& who) {
  std::lock_guard guard(impl_->mutex);
  auto& db = impl_->db;
  EDGE_ASSIGN_OR_RETURN(sqlite::transaction tx, sqlite::transaction::begin(db));
  EDGE_ASSIGN_OR_RETURN(auto found, impl_->find_tenant(id));
  if (!found) return store_rows::no_such_tenant(id);
  EDGE_ASSIGN_OR_RETURN(sqlite::statement keys, db.prepare("DELETE FROM api_keys WHERE tenant_id = ?"));
  EDGE_RETURN_IF_ERROR(keys.bind(1, id).run());
  const std::int64_t keys_deleted = db.changes();
  EDGE_ASSIGN_OR_RETURN(sqlite::statement remove, db.prepare("DELETE FROM tenants WHERE id = ?"));
  EDGE_RETURN_IF_ERROR(remove.bind(1, id).run());
  EDGE_ASSIGN_OR_RETURN(sqlite::statement responses, db.prepare("DELETE FROM stored_responses WHERE tenant_id = ?"));
  EDGE_RETURN_IF_ERROR(responses.bind(1, id).run());
  boost::json::object details;
  details["tenant"] = to_json(*found);
  details["keys_deleted"] = keys_deleted;
  EDGE_RETURN_IF_ERROR(impl_->write_audit("tenant.delete", id, details, who));
  EDGE_RETURN_IF_ERROR(tx.commit());
  return impl_->refresh_snapshot();
}

result<issued_api_key> sqlite_tenant_store::create_key(std::string_view tenant_id, std::optional<unix_time> expires_at,
                                                const audit_context& who) {
  std::lock_guard guard(impl_->mutex);
  auto& db = impl_->db;
  const unix_time now = impl_->now();
  if (expires_at && *expires_at <= now) {
    return invalid_argument(format("the expiry {} is not in the future", format_utc(*expires_at)));
  }
  EDGE_ASSIGN_OR_RETURN(sqlite::transaction tx, sqlite::transaction::begin(db));
  EDGE_ASSIGN_OR_RETURN(auto found, impl_->find_tenant(tenant_id));
  if (!found) return store_rows::no_such_tenant(tenant_id);
  issued_api_key issued = generate_api_key(tenant_id, now, expires_at);
  EDGE_ASSIGN_OR_RETURN(sqlite::statement insert,
                        db.prepare(format("INSERT INTO api_keys ({}) VALUES (?, ?, ?, ?, ?, NULL)", key_columns)));
  EDGE_RETURN_IF_ERROR(insert.bind(1, std::string_view(issued.record.id))
                           .bind(2, tenant_id)
                           .bind(3, std::span<const std::uint8_t>(issued.record.secret_sha256))
                           .bind(4, now)
                           .bind(5, expires_at)
                           .run());
  EDGE_RETURN_IF_ERROR(impl_->write_audit("key.create", issued.record.id, to_json(issued.record, now), who));
  EDGE_RETURN_IF_ERROR(tx.commit());
  EDGE_RETURN_IF_ERROR(impl_->refresh_snapshot());
  return issued;
}

result<std::vector<api_key_record>> sqlite_tenant_store::list_keys(std::string_view tenant_id) const {
  std::lock_guard guard(impl_->mutex);
  EDGE_ASSIGN_OR_RETURN(auto found, impl_->find_tenant(tenant_id));
  if (!found) return store_rows::no_such_tenant(tenant_id);
  EDGE_ASSIGN_OR_RETURN(sqlite::statement q, impl_->db.prepare(format(
                                                 "SELECT {} FROM api_keys WHERE tenant_id = ? ORDER BY created_at, id",
                                                 key_columns)));
  q.bind(1, tenant_id);
  std::vector<api_key_record> out;
  for (;;) {
    EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
    if (!row) break;
    EDGE_ASSIGN_OR_RETURN(api_key_record key, read_key(q));
    out.push_back(std::move(key));
  }
  return out;
}

result<api_key_record> sqlite_tenant_store::revoke_key(std::string_view key_id, const audit_context& who) {
  std::lock_guard guard(impl_->mutex);
  auto& db = impl_->db;
  EDGE_ASSIGN_OR_RETURN(sqlite::transaction tx, sqlite::transaction::begin(db));
  EDGE_ASSIGN_OR_RETURN(sqlite::statement q, db.prepare(format("SELECT {} FROM api_keys WHERE id = ?", key_columns)));
  q.bind(1, key_id);
  EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
  if (!row) return store_rows::no_such_key(key_id);
  EDGE_ASSIGN_OR_RETURN(api_key_record key, read_key(q));
  if (key.revoked_at) return key;
  const unix_time now = impl_->now();
  key.revoked_at = now;
  EDGE_ASSIGN_OR_RETURN(sqlite::statement update, db.prepare("UPDATE api_keys SET revoked_at = ? WHERE id = ?"));
  EDGE_RETURN_IF_ERROR(update.bind(1, now).bind(2, key_id).run());
  EDGE_RETURN_IF_ERROR(impl_->write_audit("key.revoke", key_id, to_json(key, now), who));
  EDGE_RETURN_IF_ERROR(tx.commit());
  EDGE_RETURN_IF_ERROR(impl_->refresh_snapshot());
  return key;
}

status sqlite_tenant_store::add_usage(const usage_batch& batch) {
  if (batch.empty()) return {};
  std::lock_guard guard(impl_->mutex);
  auto& db = impl_->db;
  EDGE_ASSIGN_OR_RETURN(sqlite::transaction tx, sqlite::transaction::begin(db));
  if (!batch.id.empty()) {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement seen,
                          db.prepare("INSERT INTO ledger_batches (id, at) VALUES (?, ?) ON CONFLICT (id) DO NOTHING"));
    EDGE_RETURN_IF_ERROR(seen.bind(1, std::string_view(batch.id)).bind(2, impl_->now()).run());
    if (db.changes() == 0) return {};  // added before: its commit's answer was lost
    EDGE_ASSIGN_OR_RETURN(sqlite::statement old, db.prepare("DELETE FROM ledger_batches WHERE at < ?"));
    EDGE_RETURN_IF_ERROR(old.bind(1, impl_->now() - ledger_batch_memory_seconds).run());
  }
  if (!batch.rows.empty()) {
    EDGE_ASSIGN_OR_RETURN(
        sqlite::statement upsert,
        db.prepare("INSERT INTO usage_hourly (tenant_id, hour_start, requests, prompt_tokens, completion_tokens, "
                   "cached_tokens, rejections) VALUES (?, ?, ?, ?, ?, ?, ?) "
                   "ON CONFLICT (tenant_id, hour_start) DO UPDATE SET "
                   "requests = requests + excluded.requests, prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
                   "completion_tokens = completion_tokens + excluded.completion_tokens, "
                   "cached_tokens = cached_tokens + excluded.cached_tokens, "
                   "rejections = rejections + excluded.rejections"));
    for (const usage_row& row : batch.rows) {
      upsert.reset();
      EDGE_RETURN_IF_ERROR(upsert.bind(1, std::string_view(row.tenant_id))
                               .bind(2, hour_start_of(row.hour_start))
                               .bind(3, row.counts.requests)
                               .bind(4, row.counts.prompt_tokens)
                               .bind(5, row.counts.completion_tokens)
                               .bind(6, row.counts.cached_tokens)
                               .bind(7, row.counts.rejections)
                               .run());
    }
  }
  if (!batch.details.empty()) EDGE_RETURN_IF_ERROR(add_details(db, batch.details));
  if (!batch.hold_progress.empty()) {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement update,
                          db.prepare("UPDATE usage_holds SET charged_tokens = ? WHERE id = ?"));
    for (const auto& [id, charged] : batch.hold_progress) {
      update.reset();
      EDGE_RETURN_IF_ERROR(update.bind(1, charged).bind(2, std::string_view(id)).run());
    }
  }
  if (!batch.released_holds.empty()) {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement erase, db.prepare("DELETE FROM usage_holds WHERE id = ?"));
    for (const std::string& id : batch.released_holds) {
      erase.reset();
      EDGE_RETURN_IF_ERROR(erase.bind(1, std::string_view(id)).run());
    }
  }
  return tx.commit();
}

status sqlite_tenant_store::add_hold(const usage_hold& hold) {
  std::lock_guard guard(impl_->mutex);
  EDGE_ASSIGN_OR_RETURN(sqlite::statement insert,
                        impl_->db.prepare("INSERT OR REPLACE INTO usage_holds (id, tenant_id, day, reserved_tokens) "
                                          "VALUES (?, ?, ?, ?)"));
  return insert.bind(1, std::string_view(hold.id))
      .bind(2, std::string_view(hold.tenant_id))
      .bind(3, hold.day)
      .bind(4, hold.reserved_tokens)
      .run();
}

namespace {

// The rows of a "SELECT tenant_id, sum(...) ... GROUP BY tenant_id" query.
result<std::map<std::string, std::int64_t>> per_tenant_sums(sqlite::statement& q) {
  std::map<std::string, std::int64_t> out;
  for (;;) {
    EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
    if (!row) break;
    out[q.text(0)] = q.int64(1);
  }
  return out;
}

}  // namespace

result<std::map<std::string, std::int64_t>> sqlite_tenant_store::unreleased_hold_tokens(std::int64_t day) {
  std::lock_guard guard(impl_->mutex);
  auto& db = impl_->db;
  EDGE_ASSIGN_OR_RETURN(sqlite::statement stale, db.prepare("DELETE FROM usage_holds WHERE day < ?"));
  EDGE_RETURN_IF_ERROR(stale.bind(1, day).run());
  EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                        db.prepare("SELECT tenant_id, sum(max(reserved_tokens - charged_tokens, 0)) FROM usage_holds "
                                   "WHERE day = ? GROUP BY tenant_id"));
  q.bind(1, day);
  return per_tenant_sums(q);
}

result<std::vector<usage_row>> sqlite_tenant_store::usage(std::string_view tenant_id, unix_time from,
                                                   unix_time to) const {
  std::lock_guard guard(impl_->mutex);
  EDGE_ASSIGN_OR_RETURN(
      sqlite::statement q,
      impl_->db.prepare("SELECT hour_start, requests, prompt_tokens, completion_tokens, cached_tokens, rejections "
                        "FROM usage_hourly WHERE tenant_id = ? AND hour_start >= ? AND hour_start < ? "
                        "ORDER BY hour_start"));
  q.bind(1, tenant_id).bind(2, hour_start_of(from)).bind(3, to);
  std::vector<usage_row> out;
  for (;;) {
    EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
    if (!row) break;
    usage_row r;
    r.tenant_id = std::string(tenant_id);
    r.hour_start = q.int64(0);
    r.counts = {q.int64(1), q.int64(2), q.int64(3), q.int64(4), q.int64(5)};
    out.push_back(std::move(r));
  }
  return out;
}

result<bool> sqlite_tenant_store::put_response(std::string_view tenant_id, stored_response r, std::int64_t ttl_seconds,
                                        std::int64_t max_bytes) {
  if (r.bytes() > max_bytes) return false;
  std::lock_guard guard(impl_->mutex);
  r.created_at = impl_->now();
  r.expires_at = r.created_at + ttl_seconds;
  auto& db = impl_->db;
  EDGE_ASSIGN_OR_RETURN(sqlite::transaction tx, sqlite::transaction::begin(db));
  EDGE_ASSIGN_OR_RETURN(sqlite::statement expired, db.prepare("DELETE FROM stored_responses WHERE expires_at <= ?"));
  EDGE_RETURN_IF_ERROR(expired.bind(1, impl_->now()).run());
  EDGE_RETURN_IF_ERROR(put_stored_response(db, tenant_id, r));
  // Newest first (a replaced row is new again: its rowid is the highest; the server never runs
  // VACUUM, which could renumber rows), keep while the running total fits.
  EDGE_ASSIGN_OR_RETURN(sqlite::statement evict,
                        db.prepare("DELETE FROM stored_responses WHERE rowid IN (SELECT rowid FROM (SELECT rowid, "
                                   "sum(bytes) OVER (ORDER BY rowid DESC) AS kept FROM stored_responses "
                                   "WHERE tenant_id = ?) WHERE kept > ?)"));
  EDGE_RETURN_IF_ERROR(evict.bind(1, tenant_id).bind(2, max_bytes).run());
  EDGE_RETURN_IF_ERROR(tx.commit());
  return true;
}

result<std::optional<stored_response>> sqlite_tenant_store::get_response(std::string_view tenant_id, std::string_view id) const {
  std::lock_guard guard(impl_->mutex);
  EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                        impl_->db.prepare("SELECT created_at, expires_at, response, conversation FROM stored_responses "
                                          "WHERE tenant_id = ? AND id = ? AND expires_at > ?"));
  q.bind(1, tenant_id).bind(2, id).bind(3, impl_->now());
  EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
  if (!row) return std::optional<stored_response>();
  return std::optional<stored_response>(
      stored_response{.id = std::string(id), .created_at = q.int64(0), .expires_at = q.int64(1), .response = q.text(2),
                      .conversation = q.text(3)});
}

result<bool> sqlite_tenant_store::delete_response(std::string_view tenant_id, std::string_view id) {
  std::lock_guard guard(impl_->mutex);
  auto& db = impl_->db;
  EDGE_ASSIGN_OR_RETURN(sqlite::statement remove,
                        db.prepare("DELETE FROM stored_responses WHERE tenant_id = ? AND id = ? AND expires_at > ?"));
  EDGE_RETURN_IF_ERROR(remove.bind(1, tenant_id).bind(2, id).bind(3, impl_->now()).run());
  return db.changes() > 0;
}

result<std::int64_t> sqlite_tenant_store::stored_response_bytes(std::string_view tenant_id) const {
  std::lock_guard guard(impl_->mutex);
  EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                        impl_->db.prepare("SELECT coalesce(sum(bytes), 0) FROM stored_responses WHERE tenant_id = ? "
                                          "AND expires_at > ?"));
  q.bind(1, tenant_id).bind(2, impl_->now());
  EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
  return row ? q.int64(0) : std::int64_t{0};
}

result<std::vector<spend_row>> sqlite_tenant_store::spend(std::string_view tenant_id, unix_time from, unix_time to,
                                                          std::optional<std::string_view> key_id) const {
  std::lock_guard guard(impl_->mutex);
  EDGE_ASSIGN_OR_RETURN(
      sqlite::statement q,
      impl_->db.prepare(format("SELECT key_id, model, api, sum(requests), sum(prompt_tokens), sum(completion_tokens), "
                               "sum(cached_tokens) FROM usage_by_key WHERE tenant_id = ? AND hour_start >= ? AND "
                               "hour_start < ?{} GROUP BY key_id, model, api "
                               "ORDER BY sum(prompt_tokens + completion_tokens) DESC, key_id, model, api",
                               key_id ? " AND key_id = ?" : "")));
  q.bind(1, tenant_id).bind(2, hour_start_of(from)).bind(3, to);
  if (key_id) q.bind(4, *key_id);
  std::vector<spend_row> out;
  for (;;) {
    EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
    if (!row) break;
    out.push_back({{q.text(0), q.text(1), q.text(2)}, {q.int64(3), q.int64(4), q.int64(5), q.int64(6), 0}});
  }
  return out;
}

result<std::map<std::string, std::int64_t>> sqlite_tenant_store::tokens_since(unix_time from) const {
  std::lock_guard guard(impl_->mutex);
  EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                        impl_->db.prepare("SELECT tenant_id, sum(prompt_tokens + completion_tokens) FROM usage_hourly "
                                          "WHERE hour_start >= ? GROUP BY tenant_id"));
  q.bind(1, from);
  return per_tenant_sums(q);
}

result<std::vector<audit_entry>> sqlite_tenant_store::audit(std::size_t limit, std::optional<std::int64_t> before) const {
  std::lock_guard guard(impl_->mutex);
  EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                        impl_->db.prepare("SELECT id, at, actor, action, target, request_id, details FROM audit_log "
                                          "WHERE id < ? ORDER BY id DESC LIMIT ?"));
  q.bind(1, before.value_or(std::numeric_limits<std::int64_t>::max())).bind(2, static_cast<std::int64_t>(limit));
  std::vector<audit_entry> out;
  for (;;) {
    EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
    if (!row) break;
    out.push_back({q.int64(0), q.int64(1), q.text(2), q.text(3), q.text(4), q.text(5), q.text(6)});
  }
  return out;
}

result<store_contents> sqlite_tenant_store::contents() const {
  std::lock_guard guard(impl_->mutex);
  auto& db = impl_->db;
  store_contents out;
  EDGE_ASSIGN_OR_RETURN(sqlite::transaction tx, sqlite::transaction::begin(db));
  {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement q, db.prepare("SELECT value FROM meta WHERE key = ?"));
    q.bind(1, bootstrapped_key);
    EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
    if (row) out.bootstrapped_at = q.text(0);
  }
  {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                          db.prepare(format("SELECT {} FROM tenants ORDER BY id", tenant_columns())));
    for (;;) {
      EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
      if (!row) break;
      out.tenants.push_back(read_tenant(q));
    }
  }
  {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                          db.prepare(format("SELECT {} FROM api_keys ORDER BY created_at, id", key_columns)));
    for (;;) {
      EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
      if (!row) break;
      EDGE_ASSIGN_OR_RETURN(api_key_record key, read_key(q));
      out.keys.push_back(std::move(key));
    }
  }
  {
    EDGE_ASSIGN_OR_RETURN(
        sqlite::statement q,
        db.prepare("SELECT tenant_id, hour_start, requests, prompt_tokens, completion_tokens, cached_tokens, "
                   "rejections FROM usage_hourly ORDER BY tenant_id, hour_start"));
    for (;;) {
      EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
      if (!row) break;
      out.usage.push_back({q.text(0), q.int64(1), {q.int64(2), q.int64(3), q.int64(4), q.int64(5), q.int64(6)}});
    }
  }
  {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                          db.prepare("SELECT tenant_id, hour_start, key_id, model, api, requests, prompt_tokens, "
                                     "completion_tokens, cached_tokens FROM usage_by_key "
                                     "ORDER BY tenant_id, hour_start, key_id, model, api"));
    for (;;) {
      EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
      if (!row) break;
      out.usage_details.push_back({q.text(0), q.int64(1), {q.text(2), q.text(3), q.text(4)},
                                   {q.int64(5), q.int64(6), q.int64(7), q.int64(8), 0}});
    }
  }
  {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                          db.prepare("SELECT id, at, actor, action, target, request_id, details FROM audit_log "
                                     "ORDER BY id"));
    for (;;) {
      EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
      if (!row) break;
      out.audit.push_back({q.int64(0), q.int64(1), q.text(2), q.text(3), q.text(4), q.text(5), q.text(6)});
    }
  }
  {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                          db.prepare("SELECT tenant_id, id, created_at, expires_at, response, conversation "
                                     "FROM stored_responses WHERE expires_at > ? ORDER BY rowid"));
    q.bind(1, impl_->now());
    for (;;) {
      EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
      if (!row) break;
      out.responses.push_back({q.text(0), stored_response{.id = q.text(1),
                                                          .created_at = q.int64(2),
                                                          .expires_at = q.int64(3),
                                                          .response = q.text(4),
                                                          .conversation = q.text(5)}});
    }
  }
  EDGE_RETURN_IF_ERROR(tx.commit());
  return out;
}

status sqlite_tenant_store::import_contents(const store_contents& contents) {
  std::lock_guard guard(impl_->mutex);
  auto& db = impl_->db;
  EDGE_ASSIGN_OR_RETURN(sqlite::transaction tx, sqlite::transaction::begin(db));
  {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement q,
                          db.prepare("SELECT (SELECT count(*) FROM tenants) + (SELECT count(*) FROM api_keys) + "
                                     "(SELECT count(*) FROM usage_hourly) + (SELECT count(*) FROM audit_log)"));
    EDGE_ASSIGN_OR_RETURN(const bool row, q.step());
    if (row && q.int64(0) > 0) {
      return failed_precondition(format("{} is not empty: it has tenants, keys, usage or audit entries already",
                                        description()));
    }
  }
  if (contents.bootstrapped_at) {
    EDGE_ASSIGN_OR_RETURN(sqlite::statement mark, db.prepare("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)"));
    EDGE_RETURN_IF_ERROR(mark.bind(1, bootstrapped_key).bind(2, std::string_view(*contents.bootstrapped_at)).run());
  }
  for (const tenant_record& t : contents.tenants) EDGE_RETURN_IF_ERROR(insert_tenant(db, t));
  EDGE_ASSIGN_OR_RETURN(sqlite::statement key,
                        db.prepare(format("INSERT INTO api_keys ({}) VALUES (?, ?, ?, ?, ?, ?)", key_columns)));
  for (const api_key_record& k : contents.keys) {
    key.reset();
    EDGE_RETURN_IF_ERROR(key.bind(1, std::string_view(k.id))
                             .bind(2, std::string_view(k.tenant_id))
                             .bind(3, std::span<const std::uint8_t>(k.secret_sha256))
                             .bind(4, k.created_at)
                             .bind(5, k.expires_at)
                             .bind(6, k.revoked_at)
                             .run());
  }
  EDGE_ASSIGN_OR_RETURN(sqlite::statement usage,
                        db.prepare("INSERT INTO usage_hourly (tenant_id, hour_start, requests, prompt_tokens, "
                                   "completion_tokens, cached_tokens, rejections) VALUES (?, ?, ?, ?, ?, ?, ?)"));
  for (const usage_row& row : contents.usage) {
    usage.reset();
    EDGE_RETURN_IF_ERROR(usage.bind(1, std::string_view(row.tenant_id))
                             .bind(2, row.hour_start)
                             .bind(3, row.counts.requests)
                             .bind(4, row.counts.prompt_tokens)
                             .bind(5, row.counts.completion_tokens)
                             .bind(6, row.counts.cached_tokens)
                             .bind(7, row.counts.rejections)
                             .run());
  }
  EDGE_RETURN_IF_ERROR(add_details(db, contents.usage_details));
  EDGE_ASSIGN_OR_RETURN(sqlite::statement audit,
                        db.prepare("INSERT INTO audit_log (at, actor, action, target, request_id, details) "
                                   "VALUES (?, ?, ?, ?, ?, ?)"));
  for (const audit_entry& e : contents.audit) {
    audit.reset();
    EDGE_RETURN_IF_ERROR(audit.bind(1, e.at)
                             .bind(2, std::string_view(e.actor))
                             .bind(3, std::string_view(e.action))
                             .bind(4, std::string_view(e.target))
                             .bind(5, std::string_view(e.request_id))
                             .bind(6, std::string_view(e.details))
                             .run());
  }
  for (const auto& [tenant_id, r] : contents.responses) EDGE_RETURN_IF_ERROR(put_stored_response(db, tenant_id, r));
  EDGE_RETURN_IF_ERROR(tx.commit());
  return impl_->refresh_snapshot();
}

}  // namespace edge::gateway
