// The tenant store: tenants, API keys, the hourly usage ledger, the admin audit log and the
// Responses API's stored responses. Two implementations of one interface:
//
// * SQLite in the server's state directory (`<state-dir>/tenants.db`, write-ahead log), the
//   embedded default. One process owns a state directory at a time: opening it takes an
//   exclusive lock on `<state-dir>/lock` and refuses a directory that another edgeinfer holds,
//   so two servers can never count the same tenant's usage or disagree about its keys.
// * PostgreSQL (`--tenant-store postgres://…`), shared by every gateway that names it: a tenant
//   created, a quota changed or a key revoked through one gateway is seen by all of them within
//   a second (LISTEN/NOTIFY, with a check every refresh interval when notifications are lost);
//   ledger rows from many gateways are added to, never overwritten.
//
// Both keep ordered schema migrations recorded in a schema_version table. The request path
// never waits on the database: it reads snapshot(), an immutable copy of every tenant and key
// that is replaced (one shared_ptr swap) after each change, so a revoked key is refused by the
// next request that presents it, and a database that is down leaves the last snapshot serving.
// Stored responses are read and written on the tenancy's store threads (tenancy::off_thread).
// Admin changes and their audit entry are written in one transaction.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/common/status.h"
#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/tenant.h"

namespace edge::gateway {

// Who made an admin change: recorded with it in the audit log.
struct audit_context {
  std::string actor = "admin";  // one admin token today; named for when there are more
  std::string request_id;       // the HTTP request's x-request-id
};

struct audit_entry {
  std::int64_t id = 0;  // increasing: newer entries have larger ids
  unix_time at = 0;
  std::string actor;
  std::string action;   // "tenant.create", "tenant.update", "tenant.delete", "key.create", "key.revoke"
  std::string target;   // the tenant or key id
  std::string request_id;
  std::string details;  // a JSON object: what changed
};

// Counts of the usage ledger; one hour of one tenant, or a sum.
struct usage_counts {
  std::int64_t requests = 0;           // requests admitted and served (to the end or until cancelled)
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
  std::int64_t cached_tokens = 0;      // prompt tokens served from the prefix cache
  std::int64_t rejections = 0;         // requests refused by a quota

  usage_counts& operator+=(const usage_counts& other);
  bool empty() const;
  friend bool operator==(const usage_counts&, const usage_counts&) = default;
};

struct usage_row {
  std::string tenant_id;
  unix_time hour_start = 0;  // a multiple of 3600
  usage_counts counts;
};

// What served usage is filed under besides its tenant and hour, for the spend view: the API key
// that made the request, the model that served it and the API it spoke (chat_completions,
// completions, messages, responses, ...).
struct usage_labels {
  std::string key_id;
  std::string model;
  std::string api;
  friend auto operator<=>(const usage_labels&, const usage_labels&) = default;
};

// Served usage of one tenant, hour and labels (rejections are counted per tenant and hour only).
struct usage_detail_row {
  std::string tenant_id;
  unix_time hour_start = 0;
  usage_labels labels;
  usage_counts counts;
};

// A tenant's spend over a window, summed per labels.
struct spend_row {
  usage_labels labels;
  usage_counts counts;
};

// The daily-budget reservation of a request being served, written before the request is served:
// a restart after a crash counts what it had not yet been charged as spent (it may have been),
// so a crash can never let a tenant overrun its daily budget.
struct usage_hold {
  std::string id;  // the reservation's id
  std::string tenant_id;
  std::int64_t day = 0;              // UTC day (days since 1970-01-01) the tokens were reserved on
  std::int64_t reserved_tokens = 0;  // prompt + max_tokens
};

// What one flush of the usage ledger writes, in one transaction: a hold is released in the same
// transaction that adds the last of its request's usage.
struct usage_batch {
  std::string id;  // unique per batch (the ledger's instance and a sequence number); a retry keeps it
  std::vector<usage_row> rows;
  std::vector<usage_detail_row> details;  // the served part of `rows`, by labels  // added to their (tenant, hour) rows
  // hold id -> prompt + completion tokens its request has been charged so far (in rows now or before)
  std::vector<std::pair<std::string, std::int64_t>> hold_progress;
  std::vector<std::string> released_holds;  // requests that ended: everything they used is in rows
  bool empty() const { return rows.empty() && details.empty() && hold_progress.empty() && released_holds.empty(); }
};

inline constexpr unix_time seconds_per_hour = 3600;
inline constexpr unix_time seconds_per_day = 86400;
inline constexpr unix_time hour_start_of(unix_time t) {
  return t >= 0 ? t - t % seconds_per_hour : t - ((t % seconds_per_hour) + seconds_per_hour) % seconds_per_hour;
}

// A response the Responses API stored (store: true) for a tenant.
struct stored_response {
  std::string id;
  unix_time created_at = 0;   // set by the store
  unix_time expires_at = 0;   // gone from then on (set by the store)
  std::string response;      // the response object, JSON
  std::string conversation;  // the input items before its output (instructions aside), a JSON array
  std::int64_t bytes() const { return static_cast<std::int64_t>(response.size() + conversation.size()); }
};

// A change to a tenant. Absent members stay as they are; for a quota, an engaged outer optional
// holding nullopt makes that limit unlimited.
struct tenant_patch {
  using quota_change = std::optional<std::optional<std::int64_t>>;

  std::optional<double> weight;
  std::array<quota_change, quota_kinds.size()> quotas{};  // one per row of quota_kinds, in its order

  quota_change& quota(const quota_kind& kind) { return quotas[quota_kind_index(kind)]; }
  const quota_change& quota(const quota_kind& kind) const { return quotas[quota_kind_index(kind)]; }
  void apply_to(tenant_record& tenant) const;
};

// Every tenant and key at one moment. Immutable; shared by the requests that read it.
class tenant_snapshot {
 public:
  tenant_snapshot() = default;
  tenant_snapshot(std::vector<tenant_record> tenants, std::vector<api_key_record> keys, std::uint64_t version);

  // Null when there is no such tenant (or key). The pointers live as long as the snapshot; a
  // request that keeps a tenant beyond it holds the shared_ptr.
  std::shared_ptr<const tenant_record> tenant(std::string_view id) const;
  const api_key_record* key(std::string_view id) const;
  const std::map<std::string, std::shared_ptr<const tenant_record>, std::less<>>& tenants() const { return tenants_; }
  std::size_t tenant_count() const { return tenants_.size(); }
  std::size_t key_count() const { return keys_.size(); }
  // Increases with every change the store makes.
  std::uint64_t version() const { return version_; }

 private:
  std::map<std::string, std::shared_ptr<const tenant_record>, std::less<>> tenants_;
  std::map<std::string, api_key_record, std::less<>> keys_;
  std::uint64_t version_ = 0;
};

// Everything a store keeps beyond the requests in flight, for copying one store into another
// (`edgeinfer admin migrate-store`). Holds of requests in flight are not part of it: a store is
// copied with its servers stopped.
struct store_contents {
  std::optional<std::string> bootstrapped_at;  // the first-start mark, when set
  std::vector<tenant_record> tenants;
  std::vector<api_key_record> keys;
  std::vector<usage_row> usage;
  std::vector<usage_detail_row> usage_details;
  std::vector<audit_entry> audit;  // oldest first
  struct tenant_response {
    std::string tenant_id;
    stored_response response;
  };
  std::vector<tenant_response> responses;  // oldest first, expired ones left out
};

// Where the tenant store lives.
struct tenant_store_options {
  // Empty: SQLite, `<state_dir>/tenants.db`, owned by this process. "postgres://…" or
  // "postgresql://…" (libpq's URL, or its key=value form after "postgres:"): PostgreSQL, shared
  // by every gateway that names it.
  std::string url;
  std::filesystem::path state_dir;
  // PostgreSQL: the most a call may wait on the database (connecting, or one statement), and how
  // often the snapshot is checked against the database when no change notification arrives.
  std::chrono::milliseconds query_timeout{2000};
  std::chrono::milliseconds refresh_interval{500};
};

// Whether the store can be reached, for /metrics and the logs.
struct tenant_store_health {
  bool reachable = true;        // the last call or check reached the database
  unix_time checked_at = 0;     // when the snapshot was last confirmed current (0: not since start)
  std::uint64_t failures = 0;   // calls and checks that could not reach the database, since start
};

// Whether `url` names PostgreSQL (postgres:// or postgresql://).
bool is_postgres_url(std::string_view url);

// The store: SQLite (one process) or PostgreSQL (shared). Every method is thread-safe.
class tenant_store {
 public:
  static constexpr std::string_view database_name = "tenants.db";
  static constexpr std::string_view default_tenant_id = "default";

  // SQLite in `state_dir`: creates the directory if missing, locks it, opens or creates the
  // database and brings its schema up to date.
  static result<std::unique_ptr<tenant_store>> open(const std::filesystem::path& state_dir, const time_source& clock);
  // The store `options` name. PostgreSQL: connects, brings the schema up to date (several
  // gateways may start at once) and loads the snapshot; from then on a thread of its own keeps
  // the snapshot current (LISTEN/NOTIFY, and a check every refresh_interval).
  static result<std::unique_ptr<tenant_store>> open(const tenant_store_options& options, const time_source& clock);
  virtual ~tenant_store() = default;
  tenant_store(const tenant_store&) = delete;
  tenant_store& operator=(const tenant_store&) = delete;

  // Never waits on the database: the snapshot in memory.
  virtual std::shared_ptr<const tenant_snapshot> snapshot() const = 0;
  // "SQLite /path/tenants.db" or "PostgreSQL host:port/database", for logs.
  virtual std::string description() const = 0;
  virtual int schema_version() const = 0;
  virtual tenant_store_health health() const = 0;

  // On the very first start of a store, creates the tenant "default" (weight 1, no limits) and
  // an API key for it, and returns the key: the only time it can be shown. Returns nullopt on
  // every later start (of any gateway sharing the store), even if "default" has been deleted
  // since.
  virtual result<std::optional<issued_api_key>> bootstrap_default_tenant(const audit_context& who) = 0;

  // Tenants. Ids are checked with is_valid_tenant_id(); created_at/updated_at are set here.
  virtual result<tenant_record> create_tenant(tenant_record tenant, const audit_context& who) = 0;
  virtual result<std::vector<tenant_record>> list_tenants() const = 0;
  virtual result<tenant_record> get_tenant(std::string_view id) const = 0;
  virtual result<tenant_record> update_tenant(std::string_view id, const tenant_patch& patch,
                                              const audit_context& who) = 0;
  // Deletes the tenant and its keys; its usage rows and audit entries stay as history.
  virtual status delete_tenant(std::string_view id, const audit_context& who) = 0;

  // Keys.
  virtual result<issued_api_key> create_key(std::string_view tenant_id, std::optional<unix_time> expires_at,
                                            const audit_context& who) = 0;
  virtual result<std::vector<api_key_record>> list_keys(std::string_view tenant_id) const = 0;
  // Marks the key revoked (kept for the record). Revoking a revoked key changes nothing.
  virtual result<api_key_record> revoke_key(std::string_view key_id, const audit_context& who) = 0;

  // Usage ledger. add_usage() adds the counts to their (tenant, hour) rows and records the holds'
  // progress and releases, in one transaction, once per batch id: a batch whose id the store has
  // seen is acknowledged without adding it again (a retry after an answer that was lost).
  virtual status add_usage(const usage_batch& batch) = 0;
  // Writes a hold (usage_hold); it stays until a batch releases it.
  virtual status add_hold(const usage_hold& hold) = 0;
  // For each tenant, the tokens that holds still in the store for `day` may have spent beyond
  // what the ledger has charged: reserved - charged. Called when a server starts, to count the
  // holds a crash kept from being released (PostgreSQL: those of gateways no longer running).
  // Holds of earlier days are deleted.
  virtual result<std::map<std::string, std::int64_t>> unreleased_hold_tokens(std::int64_t day) = 0;
  // Rows of hours that start in [hour_start_of(from), to), oldest first.
  virtual result<std::vector<usage_row>> usage(std::string_view tenant_id, unix_time from, unix_time to) const = 0;
  // The tenant's served usage in hours that start in [hour_start_of(from), to), summed per key,
  // model and API (only for `key_id` when given), largest total tokens first.
  virtual result<std::vector<spend_row>> spend(std::string_view tenant_id, unix_time from, unix_time to,
                                               std::optional<std::string_view> key_id = std::nullopt) const = 0;
  // Prompt + completion tokens per tenant in hours starting at or after `from` (a UTC midnight:
  // what each tenant has spent of its daily budget today).
  virtual result<std::map<std::string, std::int64_t>> tokens_since(unix_time from) const = 0;

  // Stored responses. put_response() stores `r` for the tenant (replacing one of the same id),
  // created now and expiring `ttl_seconds` later, then removes every expired response and the
  // tenant's oldest ones until what it keeps is at most `max_bytes`; false, and nothing changed,
  // when `r` alone is larger than that.
  virtual result<bool> put_response(std::string_view tenant_id, stored_response r, std::int64_t ttl_seconds,
                                    std::int64_t max_bytes) = 0;
  // The tenant's response `id`, unless there is none or it has expired.
  virtual result<std::optional<stored_response>> get_response(std::string_view tenant_id,
                                                              std::string_view id) const = 0;
  // Whether the tenant had such a response (expired ones count as gone).
  virtual result<bool> delete_response(std::string_view tenant_id, std::string_view id) = 0;
  // The bytes of the tenant's stored responses that have not expired.
  virtual result<std::int64_t> stored_response_bytes(std::string_view tenant_id) const = 0;

  // Audit log, newest first: at most `limit` entries with ids below `before` (all when absent).
  virtual result<std::vector<audit_entry>> audit(std::size_t limit,
                                                 std::optional<std::int64_t> before = std::nullopt) const = 0;

  // Everything, read in one transaction.
  virtual result<store_contents> contents() const = 0;
  // Writes `contents` in one transaction into a store that has no tenants, keys, usage or audit
  // entries yet (failed_precondition otherwise), keeping every time, digest and count as it is;
  // audit entries get new ids in the same order.
  virtual status import_contents(const store_contents& contents) = 0;

 protected:
  tenant_store() = default;
};

}  // namespace edge::gateway
