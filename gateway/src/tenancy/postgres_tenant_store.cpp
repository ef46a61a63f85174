// The tenant store in PostgreSQL, shared by every gateway that names the same database.
//
// Calls go through one connection under a mutex; each waits at most the query timeout, and a
// database that cannot be reached is tried again at most once per reconnect interval, calls in
// between failing at once: a dead database costs a call an error, never a thread for long. A
// thread of its own keeps the snapshot current: it LISTENs on the change channel, and every
// refresh interval (or at once when notified) compares the database's change counter with the
// snapshot's version and reloads on a difference. Every change bumps that counter and notifies in
// the transaction that makes it, so the notification and the counter say the same thing, and a
// lost notification costs at most one refresh interval. The same thread records that this
// gateway is alive (gateway_instances), so that a gateway starting later can tell the
// daily-budget holds of a crashed gateway from those of a running one.
#include <boost/json/serialize.hpp>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stop_token>
#include <thread>

#include "edge/common/format.h"
#include "edge/common/log.h"
#include "edge/gateway/tenancy/tenant_json.h"
#include "postgres.h"
#include "tenant_stores.h"

namespace edge::gateway {
namespace {

using namespace store_rows;
namespace pg = postgres;
using steady = std::chrono::steady_clock;

// The advisory lock that serializes migrations across gateways starting together ("edgetena").
constexpr std::int64_t migration_lock_key = 0x6564676574656e61;
constexpr std::string_view change_channel = "edgeinfer_tenancy";
// A gateway not seen for this long is taken for gone: its daily-budget holds were cut short.
constexpr unix_time instance_stale_seconds = 15;
constexpr unix_time heartbeat_seconds = 2;
constexpr auto reconnect_interval = std::chrono::seconds(1);

// The schema, one step per version; never edit a released step, add the next one. As in
// SQLite's, the tenants table has a column per quota kind, named as the kind: a new kind adds its
// column (BIGINT, NULL for unlimited) in a step of its own, in both stores.
constexpr pg::migration schema_migrations[] = {
    {1, "tenants, keys, usage ledger, audit log, holds, stored responses, change counter", R"sql(
CREATE TABLE meta (
  key   TEXT PRIMARY KEY,
  value TEXT NOT NULL
);
CREATE TABLE tenancy_version (
  id      INTEGER PRIMARY KEY CHECK (id = 1),
  version BIGINT NOT NULL
);
INSERT INTO tenancy_version (id, version) VALUES (1, 1);
CREATE TABLE tenants (
  id                     TEXT PRIMARY KEY,
  weight                 DOUBLE PRECISION NOT NULL CHECK (weight > 0),
  requests_per_minute    BIGINT,
  tokens_per_minute      BIGINT,
  max_concurrent         BIGINT,
  daily_tokens           BIGINT,
  max_tokens_per_request BIGINT,
  kv_host_cache_bytes    BIGINT,
  kv_disk_cache_bytes    BIGINT,
  created_at             BIGINT NOT NULL,
  updated_at             BIGINT NOT NULL
);
CREATE TABLE api_keys (
  id            TEXT PRIMARY KEY,
  tenant_id     TEXT NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
  secret_sha256 BYTEA NOT NULL CHECK (length(secret_sha256) = 32),
  created_at    BIGINT NOT NULL,
  expires_at    BIGINT,
  revoked_at    BIGINT
);
CREATE INDEX api_keys_by_tenant ON api_keys (tenant_id);
CREATE TABLE usage_hourly (
  tenant_id         TEXT NOT NULL,
  hour_start        BIGINT NOT NULL,
  requests          BIGINT NOT NULL DEFAULT 0,
  prompt_tokens     BIGINT NOT NULL DEFAULT 0,
  completion_tokens BIGINT NOT NULL DEFAULT 0,
  cached_tokens     BIGINT NOT NULL DEFAULT 0,
  rejections        BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant_id, hour_start)
);
CREATE INDEX usage_hourly_by_hour ON usage_hourly (hour_start);
CREATE TABLE ledger_batches (
  id TEXT PRIMARY KEY,
  at BIGINT NOT NULL
);
CREATE INDEX ledger_batches_by_time ON ledger_batches (at);
CREATE TABLE audit_log (
  id         BIGSERIAL PRIMARY KEY,
  at         BIGINT NOT NULL,
  actor      TEXT NOT NULL,
  action     TEXT NOT NULL,
  target     TEXT NOT NULL,
  request_id TEXT NOT NULL,
  details    TEXT NOT NULL
);
CREATE TABLE gateway_instances (
  id         TEXT PRIMARY KEY,
  started_at BIGINT NOT NULL,
  last_seen  BIGINT NOT NULL
);
CREATE TABLE usage_holds (
  id              TEXT PRIMARY KEY,
  tenant_id       TEXT NOT NULL,
  day             BIGINT NOT NULL,
  reserved_tokens BIGINT NOT NULL CHECK (reserved_tokens >= 0),
  charged_tokens  BIGINT NOT NULL DEFAULT 0,
  owner           TEXT NOT NULL
);
CREATE TABLE stored_responses (
  seq          BIGSERIAL PRIMARY KEY,
  tenant_id    TEXT NOT NULL,
  id           TEXT NOT NULL,
  created_at   BIGINT NOT NULL,
  expires_at   BIGINT NOT NULL,
  bytes        BIGINT NOT NULL CHECK (bytes >= 0),
  response     TEXT NOT NULL,
  conversation TEXT NOT NULL,
  UNIQUE (tenant_id, id)
);
CREATE INDEX stored_responses_by_expiry ON stored_responses (expires_at);
)sql"},
    {2, "served usage by API key, model and API, for the spend view", R"sql(
CREATE TABLE usage_by_key (
  tenant_id         TEXT NOT NULL,
  hour_start        BIGINT NOT NULL,
  key_id            TEXT NOT NULL,
  model             TEXT NOT NULL,
  api               TEXT NOT NULL,
  requests          BIGINT NOT NULL DEFAULT 0,
  prompt_tokens     BIGINT NOT NULL DEFAULT 0,
  completion_tokens BIGINT NOT NULL DEFAULT 0,
  cached_tokens     BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant_id, hour_start, key_id, model, api)
);
)sql"},
    {3, "the tenants' monthly token budgets", R"sql(
ALTER TABLE tenants ADD COLUMN monthly_tokens BIGINT;
)sql"},
};

tenant_record read_tenant(const pg::rows& r, int row) {
  tenant_record t;
  t.id = r.text(row, 0);
  t.weight = r.real(row, 1);
  for (const quota_kind& kind : quota_kinds) {
    kind.of(t.quotas) = r.optional_int64(row, first_quota_column + static_cast<int>(quota_kind_index(kind)));
  }
  t.created_at = r.int64(row, created_at_column);
  t.updated_at = r.int64(row, created_at_column + 1);
  return t;
}

result<api_key_record> read_key(const pg::rows& r, int row) {
  api_key_record k;
  k.id = r.text(row, 0);
  k.tenant_id = r.text(row, 1);
  const std::vector<std::uint8_t> digest = r.bytea(row, 2);
  if (digest.size() != k.secret_sha256.size()) return data_loss(format("key {} has a malformed digest", k.id));
  std::copy(digest.begin(), digest.end(), k.secret_sha256.begin());
  k.created_at = r.int64(row, 3);
  k.expires_at = r.optional_int64(row, 4);
  k.revoked_at = r.optional_int64(row, 5);
  return k;
}

// "$1, $2, ..., $n".
std::string placeholders(int n, int first = 1) {
  std::string out;
  for (int i = 0; i < n; ++i) out += format("{}${}", i == 0 ? "" : ", ", first + i);
  return out;
}

// The tenant's row values in tenant_columns() order.
std::vector<pg::param> tenant_params(const tenant_record& t) {
  std::vector<pg::param> out{pg::text(t.id), pg::real(t.weight)};
  for (const quota_kind& kind : quota_kinds) out.push_back(pg::number(kind.of(t.quotas)));
  out.push_back(pg::number(t.created_at));
  out.push_back(pg::number(t.updated_at));
  return out;
}

const status& status_of(const status& s) { return s; }
template <class T>
const status& status_of(const result<T>& r) {
  return r.error();
}

result<std::map<std::string, std::int64_t>> per_tenant_sums(const pg::rows& r) {
  std::map<std::string, std::int64_t> out;
  for (int i = 0; i < r.size(); ++i) out[r.text(i, 0)] = r.int64(i, 1);
  return out;
}

}  // namespace

class postgres_tenant_store final : public tenant_store {
 public:
  postgres_tenant_store(tenant_store_options options, const time_source& clock, pg::connection c, int version)
      : options_(std::move(options)),
        clock_(clock),
        instance_(generate_secret_text(12)),
        where_(c.describe()),
        version_(version),
        conn_(std::move(c)) {}

  // Listens for changes, loads the first snapshot, registers this gateway, and starts the
  // watcher: from the moment open() returns, a change anywhere reaches this snapshot.
  status start() {
    EDGE_ASSIGN_OR_RETURN(pg::connection listening, listen());
    {
      std::lock_guard guard(mutex_);
      EDGE_RETURN_IF_ERROR(load_snapshot(*conn_));
      EDGE_RETURN_IF_ERROR(heartbeat(*conn_));
    }
    watcher_ = std::jthread([this, w = std::move(listening)](std::stop_token stop) mutable {
      watch(std::move(stop), std::move(w));
    });
    return {};
  }

  ~postgres_tenant_store() override {
    watcher_.request_stop();
    if (watcher_.joinable()) watcher_.join();
  }

  std::shared_ptr<const tenant_snapshot> snapshot() const override { return current_.load(); }
  std::string description() const override { return "PostgreSQL " + where_; }
  int schema_version() const override { return version_; }
  tenant_store_health health() const override {
    return {.reachable = reachable_.load(), .checked_at = checked_at_.load(), .failures = failures_.load()};
  }

  result<std::optional<issued_api_key>> bootstrap_default_tenant(const audit_context& who) override {
    return with_connection([&](pg::connection& c) -> result<std::optional<issued_api_key>> {
      EDGE_ASSIGN_OR_RETURN(pg::transaction tx, pg::transaction::begin(c));
      const unix_time now = this->now();
      // Gateways starting together: one inserts the mark, the others wait for its commit and find it.
      EDGE_ASSIGN_OR_RETURN(pg::rows marked,
                            c.exec("INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO NOTHING",
                                   {pg::text(bootstrapped_key), pg::text(std::to_string(now))}));
      if (marked.affected() == 0) return std::optional<issued_api_key>{};
      EDGE_ASSIGN_OR_RETURN(pg::rows count, c.exec("SELECT count(*) FROM tenants"));
      if (count.int64(0, 0) > 0) {
        EDGE_RETURN_IF_ERROR(tx.commit());
        return std::optional<issued_api_key>{};
      }
      const tenant_record created{std::string(default_tenant_id), 1.0, {}, now, now};
      EDGE_RETURN_IF_ERROR(insert_tenant(c, created));
      EDGE_RETURN_IF_ERROR(write_audit(c, "tenant.create", default_tenant_id, to_json(created), who));
      issued_api_key issued = generate_api_key(default_tenant_id, now, std::nullopt);
      EDGE_RETURN_IF_ERROR(insert_key(c, issued.record));
      EDGE_RETURN_IF_ERROR(write_audit(c, "key.create", issued.record.id, to_json(issued.record, now), who));
      EDGE_RETURN_IF_ERROR(commit_change(c, tx));
      return std::optional<issued_api_key>(std::move(issued));
    });
  }

  result<tenant_record> create_tenant(tenant_record tenant, const audit_context& who) override {
    if (!is_valid_tenant_id(tenant.id)) return invalid_argument(format("'{}' is not a valid tenant id", tenant.id));
    return with_connection([&](pg::connection& c) -> result<tenant_record> {
      EDGE_ASSIGN_OR_RETURN(pg::transaction tx, pg::transaction::begin(c));
      tenant.created_at = tenant.updated_at = now();
      if (status inserted = insert_tenant(c, tenant); !inserted.ok()) {
        if (inserted.code() == status_code::already_exists) return tenant_exists(tenant.id);
        return inserted;
      }
      EDGE_RETURN_IF_ERROR(write_audit(c, "tenant.create", tenant.id, to_json(tenant), who));
      EDGE_RETURN_IF_ERROR(commit_change(c, tx));
      return tenant;
    });
  }

  result<std::vector<tenant_record>> list_tenants() const override {
    return with_connection([&](pg::connection& c) -> result<std::vector<tenant_record>> {
      EDGE_ASSIGN_OR_RETURN(pg::rows r, c.exec(format("SELECT {} FROM tenants ORDER BY id", tenant_columns())));
      std::vector<tenant_record> out;
      for (int i = 0; i < r.size(); ++i) out.push_back(read_tenant(r, i));
      return out;
    });
  }

  result<tenant_record> get_tenant(std::string_view id) const override {
    return with_connection([&](pg::connection& c) -> result<tenant_record> {
      EDGE_ASSIGN_OR_RETURN(auto found, find_tenant(c, id, /*for_update=*/false));
      if (!found) return no_such_tenant(id);
      return std::move(*found);
    });
  }

  result<tenant_record> update_tenant(std::string_view id, const tenant_patch& patch,
                                      const audit_context& who) override {
    return with_connection([&](pg::connection& c) -> result<tenant_record> {
      EDGE_ASSIGN_OR_RETURN(pg::transaction tx, pg::transaction::begin(c));
      EDGE_ASSIGN_OR_RETURN(auto found, find_tenant(c, id, /*for_update=*/true));
      if (!found) return no_such_tenant(id);
      const tenant_record before = *found;
      tenant_record after = before;
      patch.apply_to(after);
      after.updated_at = now();
      std::vector<pg::param> params{pg::real(after.weight)};
      for (const quota_kind& kind : quota_kinds) params.push_back(pg::number(kind.of(after.quotas)));
      params.push_back(pg::number(after.updated_at));
      params.push_back(pg::text(id));
      std::string sets = "weight = $1";
      int n = 2;
      for (const quota_kind& kind : quota_kinds) sets += format(", {} = ${}", kind.name, n++);
      sets += format(", updated_at = ${}", n++);
      EDGE_RETURN_IF_ERROR(c.exec(format("UPDATE tenants SET {} WHERE id = ${}", sets, n), params).error());
      boost::json::object details;
      details["before"] = to_json(before);
      details["after"] = to_json(after);
      EDGE_RETURN_IF_ERROR(write_audit(c, "tenant.update", id, details, who));
      EDGE_RETURN_IF_ERROR(commit_change(c, tx));
      return after;
    });
  }

  status delete_tenant(std::string_view id, const audit_context& who) override {
    return with_connection([&](pg::connection& c) -> status {
      EDGE_ASSIGN_OR_RETURN(pg::transaction tx, pg::transaction::begin(c));
      EDGE_ASSIGN_OR_RETURN(auto found, find_tenant(c, id, /*for_update=*/true));
      if (!found) return no_such_tenant(id);
      EDGE_ASSIGN_OR_RETURN(pg::rows keys, c.exec("DELETE FROM api_keys WHERE tenant_id = $1", {pg::text(id)}));
      EDGE_RETURN_IF_ERROR(c.run("DELETE FROM tenants WHERE id = $1", {pg::text(id)}));
      EDGE_RETURN_IF_ERROR(c.run("DELETE FROM stored_responses WHERE tenant_id = $1", {pg::text(id)}));
      boost::json::object details;
      details["tenant"] = to_json(*found);
      details["keys_deleted"] = keys.affected();
      EDGE_RETURN_IF_ERROR(write_audit(c, "tenant.delete", id, details, who));
      return commit_change(c, tx);
    });
  }

  result<issued_api_key> create_key(std::string_view tenant_id, std::optional<unix_time> expires_at,
                                    const audit_context& who) override {
    const unix_time at = now();
    if (expires_at && *expires_at <= at) {
      return invalid_argument(format("the expiry {} is not in the future", format_utc(*expires_at)));
    }
    return with_connection([&](pg::connection& c) -> result<issued_api_key> {
      EDGE_ASSIGN_OR_RETURN(pg::transaction tx, pg::transaction::begin(c));
      EDGE_ASSIGN_OR_RETURN(auto found, find_tenant(c, tenant_id, /*for_update=*/true));
      if (!found) return no_such_tenant(tenant_id);
      issued_api_key issued = generate_api_key(tenant_id, at, expires_at);
      EDGE_RETURN_IF_ERROR(insert_key(c, issued.record));
      EDGE_RETURN_IF_ERROR(write_audit(c, "key.create", issued.record.id, to_json(issued.record, at), who));
      EDGE_RETURN_IF_ERROR(commit_change(c, tx));
      return issued;
    });
  }

  result<std::vector<api_key_record>> list_keys(std::string_view tenant_id) const override {
    return with_connection([&](pg::connection& c) -> result<std::vector<api_key_record>> {
      EDGE_ASSIGN_OR_RETURN(auto found, find_tenant(c, tenant_id, /*for_update=*/false));
      if (!found) return no_such_tenant(tenant_id);
      EDGE_ASSIGN_OR_RETURN(pg::rows r, c.exec(format("SELECT {} FROM api_keys WHERE tenant_id = $1 "
                                                      "ORDER BY created_at, id",
                                                      key_columns),
                                               {pg::text(tenant_id)}));
      std::vector<api_key_record> out;
      for (int i = 0; i < r.size(); ++i) {
        EDGE_ASSIGN_OR_RETURN(api_key_record key, read_key(r, i));
        out.push_back(std::move(key));
      }
      return out;
    });
  }

  result<api_key_record> revoke_key(std::string_view key_id, const audit_context& who) override {
    return with_connection([&](pg::connection& c) -> result<api_key_record> {
      EDGE_ASSIGN_OR_RETURN(pg::transaction tx, pg::transaction::begin(c));
      EDGE_ASSIGN_OR_RETURN(pg::rows r, c.exec(format("SELECT {} FROM api_keys WHERE id = $1 FOR UPDATE", key_columns),
                                               {pg::text(key_id)}));
      if (r.size() == 0) return no_such_key(key_id);
      EDGE_ASSIGN_OR_RETURN(api_key_record key, read_key(r, 0));
      if (key.revoked_at) return key;
      const unix_time at = now();
      key.revoked_at = at;
      EDGE_RETURN_IF_ERROR(
          c.run("UPDATE api_keys SET revoked_at = $1 WHERE id = $2", {pg::number(at), pg::text(key_id)}));
      EDGE_RETURN_IF_ERROR(write_audit(c, "key.revoke", key_id, to_json(key, at), who));
      EDGE_RETURN_IF_ERROR(commit_change(c, tx));
      return key;
    });
  }

  status add_usage(const usage_batch& batch) override {
    if (batch.empty()) return {};
    return with_connection([&](pg::connection& c) -> status {
      EDGE_ASSIGN_OR_RETURN(pg::transaction tx, pg::transaction::begin(c));
      if (!batch.id.empty()) {
        EDGE_ASSIGN_OR_RETURN(pg::rows seen, c.exec("INSERT INTO ledger_batches (id, at) VALUES ($1, $2) "
                                                    "ON CONFLICT (id) DO NOTHING",
                                                    {pg::text(batch.id), pg::number(now())}));
        if (seen.affected() == 0) return {};  // added before: its commit's answer was lost
      }
      for (const usage_row& row : batch.rows) {
        EDGE_RETURN_IF_ERROR(c.run(
            "INSERT INTO usage_hourly (tenant_id, hour_start, requests, prompt_tokens, completion_tokens, "
            "cached_tokens, rejections) VALUES ($1, $2, $3, $4, $5, $6, $7) "
            "ON CONFLICT (tenant_id, hour_start) DO UPDATE SET "
            "requests = usage_hourly.requests + excluded.requests, "
            "prompt_tokens = usage_hourly.prompt_tokens + excluded.prompt_tokens, "
            "completion_tokens = usage_hourly.completion_tokens + excluded.completion_tokens, "
            "cached_tokens = usage_hourly.cached_tokens + excluded.cached_tokens, "
            "rejections = usage_hourly.rejections + excluded.rejections",
            {pg::text(row.tenant_id), pg::number(hour_start_of(row.hour_start)), pg::number(row.counts.requests),
             pg::number(row.counts.prompt_tokens), pg::number(row.counts.completion_tokens),
             pg::number(row.counts.cached_tokens), pg::number(row.counts.rejections)}));
      }
      EDGE_RETURN_IF_ERROR(add_details(c, batch.details));
      for (const auto& [id, charged] : batch.hold_progress) {
        EDGE_RETURN_IF_ERROR(
            c.run("UPDATE usage_holds SET charged_tokens = $1 WHERE id = $2", {pg::number(charged), pg::text(id)}));
      }
      for (const std::string& id : batch.released_holds) {
        EDGE_RETURN_IF_ERROR(c.run("DELETE FROM usage_holds WHERE id = $1", {pg::text(id)}));
      }
      return tx.commit();
    });
  }

  status add_hold(const usage_hold& hold) override {
    return with_connection([&](pg::connection& c) -> status {
      return c.run(
          "INSERT INTO usage_holds (id, tenant_id, day, reserved_tokens, owner) VALUES ($1, $2, $3, $4, $5) "
          "ON CONFLICT (id) DO UPDATE SET tenant_id = excluded.tenant_id, day = excluded.day, "
          "reserved_tokens = excluded.reserved_tokens, charged_tokens = 0, owner = excluded.owner",
          {pg::text(hold.id), pg::text(hold.tenant_id), pg::number(hold.day), pg::number(hold.reserved_tokens),
           pg::text(instance_)});
    });
  }

  result<std::map<std::string, std::int64_t>> unreleased_hold_tokens(std::int64_t day) override {
    return with_connection([&](pg::connection& c) -> result<std::map<std::string, std::int64_t>> {
      EDGE_RETURN_IF_ERROR(c.run("DELETE FROM usage_holds WHERE day < $1", {pg::number(day)}));
      EDGE_RETURN_IF_ERROR(
          c.run("DELETE FROM ledger_batches WHERE at < $1", {pg::number(now() - ledger_batch_memory_seconds)}));
      // Holds of gateways still running are theirs to release.
      EDGE_ASSIGN_OR_RETURN(
          pg::rows r,
          c.exec("SELECT tenant_id, sum(greatest(reserved_tokens - charged_tokens, 0)) FROM usage_holds h "
                 "WHERE day = $1 AND owner <> $2 AND NOT EXISTS (SELECT 1 FROM gateway_instances g "
                 "WHERE g.id = h.owner AND g.last_seen >= $3) GROUP BY tenant_id",
                 {pg::number(day), pg::text(instance_), pg::number(now() - instance_stale_seconds)}));
      return per_tenant_sums(r);
    });
  }

  result<std::vector<usage_row>> usage(std::string_view tenant_id, unix_time from, unix_time to) const override {
    return with_connection([&](pg::connection& c) -> result<std::vector<usage_row>> {
      EDGE_ASSIGN_OR_RETURN(
          pg::rows r, c.exec("SELECT hour_start, requests, prompt_tokens, completion_tokens, cached_tokens, rejections "
                             "FROM usage_hourly WHERE tenant_id = $1 AND hour_start >= $2 AND hour_start < $3 "
                             "ORDER BY hour_start",
                             {pg::text(tenant_id), pg::number(hour_start_of(from)), pg::number(to)}));
      std::vector<usage_row> out;
      for (int i = 0; i < r.size(); ++i) {
        usage_row row;
        row.tenant_id = std::string(tenant_id);
        row.hour_start = r.int64(i, 0);
        row.counts = {r.int64(i, 1), r.int64(i, 2), r.int64(i, 3), r.int64(i, 4), r.int64(i, 5)};
        out.push_back(std::move(row));
      }
      return out;
    });
  }

  result<std::vector<spend_row>> spend(std::string_view tenant_id, unix_time from, unix_time to,
                                       std::optional<std::string_view> key_id) const override {
    return with_connection([&](pg::connection& c) -> result<std::vector<spend_row>> {
      std::vector<pg::param> params{pg::text(tenant_id), pg::number(hour_start_of(from)), pg::number(to)};
      if (key_id) params.push_back(pg::text(*key_id));
      EDGE_ASSIGN_OR_RETURN(
          pg::rows r, c.exec(format("SELECT key_id, model, api, sum(requests), sum(prompt_tokens), "
                                    "sum(completion_tokens), sum(cached_tokens) FROM usage_by_key WHERE tenant_id = $1 "
                                    "AND hour_start >= $2 AND hour_start < $3{} GROUP BY key_id, model, api "
                                    "ORDER BY sum(prompt_tokens + completion_tokens) DESC, key_id, model, api",
                                    key_id ? " AND key_id = $4" : ""),
                             params));
      std::vector<spend_row> out;
      for (int i = 0; i < r.size(); ++i) {
        out.push_back({{r.text(i, 0), r.text(i, 1), r.text(i, 2)},
                       {r.int64(i, 3), r.int64(i, 4), r.int64(i, 5), r.int64(i, 6), 0}});
      }
      return out;
    });
  }

  result<std::map<std::string, std::int64_t>> tokens_since(unix_time from) const override {
    return with_connection([&](pg::connection& c) -> result<std::map<std::string, std::int64_t>> {
      EDGE_ASSIGN_OR_RETURN(pg::rows r, c.exec("SELECT tenant_id, sum(prompt_tokens + completion_tokens) "
                                               "FROM usage_hourly WHERE hour_start >= $1 GROUP BY tenant_id",
                                               {pg::number(from)}));
      return per_tenant_sums(r);
    });
  }

  result<bool> put_response(std::string_view tenant_id, stored_response r, std::int64_t ttl_seconds,
                            std::int64_t max_bytes) override {
    if (r.bytes() > max_bytes) return false;
    return with_connection([&](pg::connection& c) -> result<bool> {
      r.created_at = now();
      r.expires_at = r.created_at + ttl_seconds;
      EDGE_ASSIGN_OR_RETURN(pg::transaction tx, pg::transaction::begin(c));
      EDGE_RETURN_IF_ERROR(c.run("DELETE FROM stored_responses WHERE expires_at <= $1", {pg::number(r.created_at)}));
      // A replaced response takes a new sequence number: it is the newest again.
      EDGE_RETURN_IF_ERROR(c.run(
          "INSERT INTO stored_responses (tenant_id, id, created_at, expires_at, bytes, response, conversation) "
          "VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (tenant_id, id) DO UPDATE SET "
          "seq = nextval(pg_get_serial_sequence('stored_responses', 'seq')), created_at = excluded.created_at, "
          "expires_at = excluded.expires_at, bytes = excluded.bytes, response = excluded.response, "
          "conversation = excluded.conversation",
          {pg::text(tenant_id), pg::text(r.id), pg::number(r.created_at), pg::number(r.expires_at),
           pg::number(r.bytes()), pg::text(r.response), pg::text(r.conversation)}));
      EDGE_RETURN_IF_ERROR(c.run("DELETE FROM stored_responses WHERE seq IN (SELECT seq FROM (SELECT seq, "
                                 "sum(bytes) OVER (ORDER BY seq DESC) AS kept FROM stored_responses "
                                 "WHERE tenant_id = $1) newest WHERE kept > $2)",
                                 {pg::text(tenant_id), pg::number(max_bytes)}));
      EDGE_RETURN_IF_ERROR(tx.commit());
      return true;
    });
  }

  result<std::optional<stored_response>> get_response(std::string_view tenant_id,
                                                      std::string_view id) const override {
    return with_connection([&](pg::connection& c) -> result<std::optional<stored_response>> {
      EDGE_ASSIGN_OR_RETURN(pg::rows r, c.exec("SELECT created_at, expires_at, response, conversation "
                                               "FROM stored_responses WHERE tenant_id = $1 AND id = $2 "
                                               "AND expires_at > $3",
                                               {pg::text(tenant_id), pg::text(id), pg::number(now())}));
      if (r.size() == 0) return std::optional<stored_response>();
      return std::optional<stored_response>(stored_response{.id = std::string(id),
                                                            .created_at = r.int64(0, 0),
                                                            .expires_at = r.int64(0, 1),
                                                            .response = r.text(0, 2),
                                                            .conversation = r.text(0, 3)});
    });
  }

  result<bool> delete_response(std::string_view tenant_id, std::string_view id) override {
    return with_connection([&](pg::connection& c) -> result<bool> {
      EDGE_ASSIGN_OR_RETURN(pg::rows r, c.exec("DELETE FROM stored_responses WHERE tenant_id = $1 AND id = $2 "
                                               "AND expires_at > $3",
                                               {pg::text(tenant_id), pg::text(id), pg::number(now())}));
      return r.affected() > 0;
    });
  }

  result<std::int64_t> stored_response_bytes(std::string_view tenant_id) const override {
    return with_connection([&](pg::connection& c) -> result<std::int64_t> {
      EDGE_ASSIGN_OR_RETURN(pg::rows r, c.exec("SELECT coalesce(sum(bytes), 0) FROM stored_responses "
                                               "WHERE tenant_id = $1 AND expires_at > $2",
                                               {pg::text(tenant_id), pg::number(now())}));
      return r.int64(0, 0);
    });
  }

  result<std::vector<audit_entry>> audit(std::size_t limit, std::optional<std::int64_t> before) const override {
    return with_connection([&](pg::connection& c) -> result<std::vector<audit_entry>> {
      EDGE_ASSIGN_OR_RETURN(
          pg::rows r, c.exec("SELECT id, at, actor, action, target, request_id, details FROM audit_log "
                             "WHERE id < $1 ORDER BY id DESC LIMIT $2",
                             {pg::number(before.value_or(std::numeric_limits<std::int64_t>::max())),
                              pg::number(static_cast<std::int64_t>(limit))}));
      std::vector<audit_entry> out;
      for (int i = 0; i < r.size(); ++i) {
        out.push_back({r.int64(i, 0), r.int64(i, 1), r.text(i, 2), r.text(i, 3), r.text(i, 4), r.text(i, 5),
                       r.text(i, 6)});
      }
      return out;
    });
  }

  result<store_contents> contents() const override {
    return with_connection([&](pg::connection& c) -> result<store_contents> {
      store_contents out;
      EDGE_ASSIGN_OR_RETURN(pg::transaction tx,
                            pg::transaction::begin(c, pg::transaction::isolation::repeatable_read_only));
      EDGE_ASSIGN_OR_RETURN(pg::rows mark, c.exec("SELECT value FROM meta WHERE key = $1", {pg::text(bootstrapped_key)}));
      if (mark.size() > 0) out.bootstrapped_at = mark.text(0, 0);
      EDGE_ASSIGN_OR_RETURN(pg::rows t, c.exec(format("SELECT {} FROM tenants ORDER BY id", tenant_columns())));
      for (int i = 0; i < t.size(); ++i) out.tenants.push_back(read_tenant(t, i));
      EDGE_ASSIGN_OR_RETURN(pg::rows k,
                            c.exec(format("SELECT {} FROM api_keys ORDER BY created_at, id", key_columns)));
      for (int i = 0; i < k.size(); ++i) {
        EDGE_ASSIGN_OR_RETURN(api_key_record key, read_key(k, i));
        out.keys.push_back(std::move(key));
      }
      EDGE_ASSIGN_OR_RETURN(pg::rows u, c.exec("SELECT tenant_id, hour_start, requests, prompt_tokens, "
                                               "completion_tokens, cached_tokens, rejections FROM usage_hourly "
                                               "ORDER BY tenant_id, hour_start"));
      for (int i = 0; i < u.size(); ++i) {
        out.usage.push_back(
            {u.text(i, 0), u.int64(i, 1), {u.int64(i, 2), u.int64(i, 3), u.int64(i, 4), u.int64(i, 5), u.int64(i, 6)}});
      }
      EDGE_ASSIGN_OR_RETURN(pg::rows d, c.exec("SELECT tenant_id, hour_start, key_id, model, api, requests, "
                                               "prompt_tokens, completion_tokens, cached_tokens FROM usage_by_key "
                                               "ORDER BY tenant_id, hour_start, key_id, model, api"));
      for (int i = 0; i < d.size(); ++i) {
        out.usage_details.push_back({d.text(i, 0), d.int64(i, 1), {d.text(i, 2), d.text(i, 3), d.text(i, 4)},
                                     {d.int64(i, 5), d.int64(i, 6), d.int64(i, 7), d.int64(i, 8), 0}});
      }
      EDGE_ASSIGN_OR_RETURN(pg::rows a, c.exec("SELECT id, at, actor, action, target, request_id, details "
                                               "FROM audit_log ORDER BY id"));
      for (int i = 0; i < a.size(); ++i) {
        out.audit.push_back({a.int64(i, 0), a.int64(i, 1), a.text(i, 2), a.text(i, 3), a.text(i, 4), a.text(i, 5),
                             a.text(i, 6)});
      }
      EDGE_ASSIGN_OR_RETURN(pg::rows r, c.exec("SELECT tenant_id, id, created_at, expires_at, response, conversation "
                                               "FROM stored_responses WHERE expires_at > $1 ORDER BY seq",
                                               {pg::number(now())}));
      for (int i = 0; i < r.size(); ++i) {
        out.responses.push_back({r.text(i, 0), stored_response{.id = r.text(i, 1),
                                                               .created_at = r.int64(i, 2),
                                                               .expires_at = r.int64(i, 3),
                                                               .response = r.text(i, 4),
                                                               .conversation = r.text(i, 5)}});
      }
      EDGE_RETURN_IF_ERROR(tx.commit());
      return out;
    });
  }

  status import_contents(const store_contents& contents) override {
    return with_connection([&](pg::connection& c) -> status {
      EDGE_ASSIGN_OR_RETURN(pg::transaction tx, pg::transaction::begin(c));
      EDGE_ASSIGN_OR_RETURN(pg::rows held, c.exec("SELECT (SELECT count(*) FROM tenants) + (SELECT count(*) FROM "
                                                  "api_keys) + (SELECT count(*) FROM usage_hourly) + "
                                                  "(SELECT count(*) FROM audit_log)"));
      if (held.int64(0, 0) > 0) {
        return failed_precondition(
            format("{} is not empty: it has tenants, keys, usage or audit entries already", description()));
      }
      if (contents.bootstrapped_at) {
        EDGE_RETURN_IF_ERROR(c.run("INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE "
                                   "SET value = excluded.value",
                                   {pg::text(bootstrapped_key), pg::text(*contents.bootstrapped_at)}));
      }
      for (const tenant_record& t : contents.tenants) EDGE_RETURN_IF_ERROR(insert_tenant(c, t));
      for (const api_key_record& k : contents.keys) {
        EDGE_RETURN_IF_ERROR(c.run(format("INSERT INTO api_keys ({}) VALUES ($1, $2, $3, $4, $5, $6)", key_columns),
                                   {pg::text(k.id), pg::text(k.tenant_id), pg::bytea(k.secret_sha256),
                                    pg::number(k.created_at), pg::number(k.expires_at), pg::number(k.revoked_at)}));
      }
      for (const usage_row& row : contents.usage) {
        EDGE_RETURN_IF_ERROR(c.run("INSERT INTO usage_hourly (tenant_id, hour_start, requests, prompt_tokens, "
                                   "completion_tokens, cached_tokens, rejections) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                                   {pg::text(row.tenant_id), pg::number(row.hour_start),
                                    pg::number(row.counts.requests), pg::number(row.counts.prompt_tokens),
                                    pg::number(row.counts.completion_tokens), pg::number(row.counts.cached_tokens),
                                    pg::number(row.counts.rejections)}));
      }
      EDGE_RETURN_IF_ERROR(add_details(c, contents.usage_details));
      for (const audit_entry& e : contents.audit) {
        EDGE_RETURN_IF_ERROR(c.run("INSERT INTO audit_log (at, actor, action, target, request_id, details) "
                                   "VALUES ($1, $2, $3, $4, $5, $6)",
                                   {pg::number(e.at), pg::text(e.actor), pg::text(e.action), pg::text(e.target),
                                    pg::text(e.request_id), pg::text(e.details)}));
      }
      for (const auto& [tenant_id, r] : contents.responses) {
        EDGE_RETURN_IF_ERROR(c.run("INSERT INTO stored_responses (tenant_id, id, created_at, expires_at, bytes, "
                                   "response, conversation) VALUES ($1, $2, $3, $4, $5, $6, $7)",
                                   {pg::text(tenant_id), pg::text(r.id), pg::number(r.created_at),
                                    pg::number(r.expires_at), pg::number(r.bytes()), pg::text(r.response),
                                    pg::text(r.conversation)}));
      }
      return commit_change(c, tx);
    });
  }

 private:
  unix_time now() const { return to_unix_seconds(clock_.system_time()); }

  // Runs `call` on the calls' connection, under the mutex, (re)connecting first when needed.
  template <class Call>
  auto with_connection(Call call) const -> std::invoke_result_t<Call, pg::connection&> {
    using answer = std::invoke_result_t<Call, pg::connection&>;
    std::lock_guard guard(mutex_);
    if (!conn_ || conn_->broken()) {
      conn_.reset();
      if (steady::now() - last_attempt_ < reconnect_interval) {
        return answer(unavailable(format("the tenant store ({}) cannot be reached: {}", description(), last_error_)));
      }
      last_attempt_ = steady::now();
      auto opened = pg::connection::open(connection_options());
      if (!opened.ok()) {
        last_error_ = opened.error().message();
        note_failure();
        return answer(opened.error());
      }
      conn_.emplace(std::move(opened).value());
    }
    answer out = call(*conn_);
    if (conn_->broken()) {
      last_error_ = status_of(out).ok() ? "connection lost" : std::string(status_of(out).message());
      last_attempt_ = steady::now();
      note_failure();
    } else {
      reachable_.store(true);
    }
    return out;
  }

  pg::connection_options connection_options() const {
    return {.url = options_.url, .connect_timeout = options_.query_timeout, .query_timeout = options_.query_timeout};
  }

  void note_failure() const {
    reachable_.store(false);
    failures_.fetch_add(1);
  }

  static result<std::optional<tenant_record>> find_tenant(pg::connection& c, std::string_view id, bool for_update) {
    EDGE_ASSIGN_OR_RETURN(pg::rows r, c.exec(format("SELECT {} FROM tenants WHERE id = $1{}", tenant_columns(),
                                                    for_update ? " FOR UPDATE" : ""),
                                             {pg::text(id)}));
    if (r.size() == 0) return std::optional<tenant_record>{};
    return std::optional<tenant_record>(read_tenant(r, 0));
  }

  static status insert_tenant(pg::connection& c, const tenant_record& t) {
    return c.exec(format("INSERT INTO tenants ({}) VALUES ({})", tenant_columns(), placeholders(tenant_column_count)),
                  tenant_params(t))
        .error();
  }

  // Adds each row to its (tenant, hour, key, model, api) row.
  static status add_details(pg::connection& c, const std::vector<usage_detail_row>& rows) {
    for (const usage_detail_row& row : rows) {
      EDGE_RETURN_IF_ERROR(c.run(
          "INSERT INTO usage_by_key (tenant_id, hour_start, key_id, model, api, requests, prompt_tokens, "
          "completion_tokens, cached_tokens) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
          "ON CONFLICT (tenant_id, hour_start, key_id, model, api) DO UPDATE SET "
          "requests = usage_by_key.requests + excluded.requests, "
          "prompt_tokens = usage_by_key.prompt_tokens + excluded.prompt_tokens, "
          "completion_tokens = usage_by_key.completion_tokens + excluded.completion_tokens, "
          "cached_tokens = usage_by_key.cached_tokens + excluded.cached_tokens",
          {pg::text(row.tenant_id), pg::number(hour_start_of(row.hour_start)), pg::text(row.labels.key_id),
           pg::text(row.labels.model), pg::text(row.labels.api), pg::number(row.counts.requests),
           pg::number(row.counts.prompt_tokens), pg::number(row.counts.completion_tokens),
           pg::number(row.counts.cached_tokens)}));
    }
    return {};
  }

  static status insert_key(pg::connection& c, const api_key_record& k) {
    return c.run(format("INSERT INTO api_keys ({}) VALUES ($1, $2, $3, $4, $5, NULL)", key_columns),
                 {pg::text(k.id), pg::text(k.tenant_id), pg::bytea(k.secret_sha256), pg::number(k.created_at),
                  pg::number(k.expires_at)});
  }

  status write_audit(pg::connection& c, std::string_view action, std::string_view target,
                     const boost::json::object& details, const audit_context& who) const {
    return c.run("INSERT INTO audit_log (at, actor, action, target, request_id, details) "
                 "VALUES ($1, $2, $3, $4, $5, $6)",
                 {pg::number(now()), pg::text(who.actor), pg::text(action), pg::text(target), pg::text(who.request_id),
                  pg::text(boost::json::serialize(details))});
  }

  // Commits a change to tenants or keys: the change counter moves and every gateway is notified
  // in the same transaction; then this gateway's snapshot is reloaded, so that the next request
  // here sees the change.
  status commit_change(pg::connection& c, pg::transaction& tx) {
    EDGE_ASSIGN_OR_RETURN(pg::rows bumped,
                          c.exec("UPDATE tenancy_version SET version = version + 1 WHERE id = 1 RETURNING version"));
    EDGE_RETURN_IF_ERROR(c.run("SELECT pg_notify($1, $2)", {pg::text(change_channel), pg::text(bumped.text(0, 0))}));
    EDGE_RETURN_IF_ERROR(tx.commit());
    return load_snapshot(c);
  }

  // Reads every tenant and key as of one moment and installs them unless a newer snapshot is in
  // (a reload that read before a change this gateway made must not undo it), or, with
  // `even_older`, whatever was read (the database was restored to an earlier state).
  status load_snapshot(pg::connection& c, bool even_older = false) const {
    EDGE_ASSIGN_OR_RETURN(pg::transaction tx,
                          pg::transaction::begin(c, pg::transaction::isolation::repeatable_read_only));
    EDGE_ASSIGN_OR_RETURN(pg::rows v, c.exec("SELECT version FROM tenancy_version WHERE id = 1"));
    EDGE_ASSIGN_OR_RETURN(pg::rows t, c.exec(format("SELECT {} FROM tenants", tenant_columns())));
    EDGE_ASSIGN_OR_RETURN(pg::rows k, c.exec(format("SELECT {} FROM api_keys", key_columns)));
    EDGE_RETURN_IF_ERROR(tx.commit());
    const auto version = static_cast<std::uint64_t>(v.size() > 0 ? v.int64(0, 0) : 0);
    std::vector<tenant_record> tenants;
    for (int i = 0; i < t.size(); ++i) tenants.push_back(read_tenant(t, i));
    std::vector<api_key_record> keys;
    for (int i = 0; i < k.size(); ++i) {
      EDGE_ASSIGN_OR_RETURN(api_key_record key, read_key(k, i));
      keys.push_back(std::move(key));
    }
    auto loaded = std::make_shared<const tenant_snapshot>(std::move(tenants), std::move(keys), version);
    {
      std::lock_guard guard(install_mutex_);
      if (current_.load()->version() < version || even_older) current_.store(std::move(loaded));
    }
    checked_at_.store(now());
    return {};
  }

  status heartbeat(pg::connection& c) const {
    const unix_time at = now();
    return c.run("INSERT INTO gateway_instances (id, started_at, last_seen) VALUES ($1, $2, $2) "
                 "ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen",
                 {pg::text(instance_), pg::number(at)});
  }

  // A connection of its own that LISTENs on the change channel.
  result<pg::connection> listen() const {
    EDGE_ASSIGN_OR_RETURN(pg::connection c, pg::connection::open(connection_options()));
    EDGE_RETURN_IF_ERROR(c.run(format("LISTEN {}", change_channel)));
    return c;
  }

  // The watcher thread: reloads the snapshot when the change counter moved (notified, or found
  // at the periodic check); records that this gateway is alive; reconnects when the connection
  // is lost.
  void watch(std::stop_token stop, pg::connection first) {
    logger log("tenancy");
    std::optional<pg::connection> w(std::move(first));
    unix_time beaten_at = now();
    bool reported_down = false;
    while (!stop.stop_requested()) {
      if (!w || w->broken()) {
        w.reset();
        auto opened = listen();
        if (!opened.ok()) {
          note_failure();
          if (!reported_down) {
            log.warn("the tenant store ({}) cannot be reached; serving the tenants and keys known at {}: {}",
                     description(), format_utc(checked_at_.load()), opened.error().message());
          }
          reported_down = true;
          std::mutex idle;
          std::unique_lock lock(idle);
          std::condition_variable_any().wait_for(lock, stop, options_.refresh_interval, [] { return false; });
          continue;
        }
        w.emplace(std::move(opened).value());
        if (reported_down) log.info("the tenant store ({}) is reachable again", description());
        reported_down = false;
      }
      if (!w->wait_for_notifications(options_.refresh_interval).ok()) continue;  // reconnects above
      auto v = w->exec("SELECT version FROM tenancy_version WHERE id = 1");
      if (!v.ok()) continue;
      const auto version = static_cast<std::uint64_t>(v->int64(0, 0));
      if (version != current_.load()->version()) {
        if (status loaded = load_snapshot(*w, /*even_older=*/version < current_.load()->version()); !loaded.ok()) {
          log.warn("cannot reload the tenants and keys from {}: {}", description(), loaded.message());
          continue;
        }
      } else {
        checked_at_.store(now());
      }
      reachable_.store(true);
      if (now() - beaten_at >= heartbeat_seconds && heartbeat(*w).ok()) beaten_at = now();
    }
  }

  const tenant_store_options options_;
  const time_source& clock_;
  const std::string instance_;  // this gateway's id in gateway_instances and on its holds
  const std::string where_;
  const int version_;

  mutable std::mutex mutex_;
  mutable std::optional<pg::connection> conn_;  // guarded by mutex_
  mutable steady::time_point last_attempt_{};   // guarded by mutex_: the last (re)connection attempt
  mutable std::string last_error_;              // guarded by mutex_

  mutable std::mutex install_mutex_;  // orders snapshot installs
  mutable std::atomic<std::shared_ptr<const tenant_snapshot>> current_{std::make_shared<const tenant_snapshot>()};
  mutable std::atomic<bool> reachable_{true};
  mutable std::atomic<unix_time> checked_at_{0};
  mutable std::atomic<std::uint64_t> failures_{0};
  std::jthread watcher_;  // declared last: stopped before the rest goes
};

result<std::unique_ptr<tenant_store>> open_postgres_tenant_store(const tenant_store_options& options,
                                                                 const time_source& clock) {
  EDGE_ASSIGN_OR_RETURN(pg::connection c,
                        pg::connection::open({.url = options.url,
                                              .connect_timeout = options.query_timeout,
                                              .query_timeout = std::max(options.query_timeout,
                                                                        std::chrono::milliseconds(30000))}));
  // Migrations may wait for another gateway's: a longer timeout for them than for calls.
  EDGE_ASSIGN_OR_RETURN(const int version, pg::migrate(c, schema_migrations, migration_lock_key));
  EDGE_ASSIGN_OR_RETURN(pg::connection calls, pg::connection::open({.url = options.url,
                                                                    .connect_timeout = options.query_timeout,
                                                                    .query_timeout = options.query_timeout}));
  auto store = std::make_unique<postgres_tenant_store>(options, clock, std::move(calls), version);
  EDGE_RETURN_IF_ERROR(store->start());
  return std::unique_ptr<tenant_store>(std::move(store));
}

}  // namespace edge::gateway
