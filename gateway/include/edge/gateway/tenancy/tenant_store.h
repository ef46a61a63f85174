// The tenant store: tenants, API keys, the hourly usage ledger, the admin audit log and the
// Responses API's stored responses, kept in SQLite in the server's state directory
// (`<state-dir>/tenants.db`, write-ahead log, ordered schema migrations recorded in a
// schema_version table).
//
// The request path never waits on SQLite: it reads snapshot(), an immutable copy of every tenant
// and key that is replaced (one shared_ptr swap) after each change, so a revoked key is refused
// by the next request that presents it; stored responses are read and written on the tenancy's
// store threads (tenancy::off_thread). Admin changes and their audit entry are written in one
// transaction.
//
// Thread-safe: the connection is used under one mutex (admin calls and the ledger's flushes are
// short); snapshot() takes no lock that a writer holds for long.
//
// One process owns a state directory at a time: open() takes an exclusive lock on
// `<state-dir>/lock` and refuses a directory that another edgeinfer holds, so two servers can
// never count the same tenant's usage or disagree about its keys.
#pragma once

#include <array>
#include <atomic>
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
  std::vector<usage_row> rows;  // added to their (tenant, hour) rows
  // hold id -> prompt + completion tokens its request has been charged so far (in rows now or before)
  std::vector<std::pair<std::string, std::int64_t>> hold_progress;
  std::vector<std::string> released_holds;  // requests that ended: everything they used is in rows
  bool empty() const { return rows.empty() && hold_progress.empty() && released_holds.empty(); }
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
  std::size_t tenant_count() const { return tenants_.size(); }
  std::size_t key_count() const { return keys_.size(); }
  // Increases with every change the store makes.
  std::uint64_t version() const { return version_; }

 private:
  std::map<std::string, std::shared_ptr<const tenant_record>, std::less<>> tenants_;
  std::map<std::string, api_key_record, std::less<>> keys_;
  std::uint64_t version_ = 0;
};

class tenant_store {
 public:
  static constexpr std::string_view database_name = "tenants.db";
  static constexpr std::string_view default_tenant_id = "default";

  // Creates the directory if missing, locks it, opens or creates the database and brings its
  // schema up to date.
  static result<std::unique_ptr<tenant_store>> open(const std::filesystem::path& state_dir, const time_source& clock);
  ~tenant_store();
  tenant_store(const tenant_store&) = delete;
  tenant_store& operator=(const tenant_store&) = delete;

  std::shared_ptr<const tenant_snapshot> snapshot() const;
  std::filesystem::path database_file() const;
  int schema_version() const;

  // On the very first start of a state directory, creates the tenant "default" (weight 1, no
  // limits) and an API key for it, and returns the key: the only time it can be shown. Returns
  // nullopt on every later start, even if "default" has been deleted since.
  result<std::optional<issued_api_key>> bootstrap_default_tenant(const audit_context& who);

  // Tenants. Ids are checked with is_valid_tenant_id(); created_at/updated_at are set here.
  result<tenant_record> create_tenant(tenant_record tenant, const audit_context& who);
  result<std::vector<tenant_record>> list_tenants() const;
  result<tenant_record> get_tenant(std::string_view id) const;
  result<tenant_record> update_tenant(std::string_view id, const tenant_patch& patch, const audit_context& who);
  // Deletes the tenant and its keys; its usage rows and audit entries stay as history.
  status delete_tenant(std::string_view id, const audit_context& who);

  // Keys.
  result<issued_api_key> create_key(std::string_view tenant_id, std::optional<unix_time> expires_at,
                                    const audit_context& who);
  result<std::vector<api_key_record>> list_keys(std::string_view tenant_id) const;
  // Marks the key revoked (kept for the record). Revoking a revoked key changes nothing.
  result<api_key_record> revoke_key(std::string_view key_id, const audit_context& who);

  // Usage ledger. add_usage() adds the counts to their (tenant, hour) rows and records the holds'
  // progress and releases, in one transaction.
  status add_usage(const usage_batch& batch);
  // Writes a hold (usage_hold); it stays until a batch releases it.
  status add_hold(const usage_hold& hold);
  // For each tenant, the tokens that holds still in the store for `day` may have spent beyond
  // what the ledger has charged: reserved - charged. Called when a server starts, when every
  // hold left is one a crash kept from being released. Holds of earlier days are deleted.
  result<std::map<std::string, std::int64_t>> unreleased_hold_tokens(std::int64_t day);
  // Rows of hours that start in [hour_start_of(from), to), oldest first.
  result<std::vector<usage_row>> usage(std::string_view tenant_id, unix_time from, unix_time to) const;
  // Prompt + completion tokens per tenant in hours starting at or after `from` (a UTC midnight:
  // what each tenant has spent of its daily budget today).
  result<std::map<std::string, std::int64_t>> tokens_since(unix_time from) const;

  // Stored responses. put_response() stores `r` for the tenant (replacing one of the same id),
  // created now and expiring `ttl_seconds` later, then removes every expired response and the
  // tenant's oldest ones until what it keeps is at most `max_bytes`; false, and nothing changed,
  // when `r` alone is larger than that.
  result<bool> put_response(std::string_view tenant_id, stored_response r, std::int64_t ttl_seconds,
                            std::int64_t max_bytes);
  // The tenant's response `id`, unless there is none or it has expired.
  result<std::optional<stored_response>> get_response(std::string_view tenant_id, std::string_view id) const;
  // Whether the tenant had such a response (expired ones count as gone).
  result<bool> delete_response(std::string_view tenant_id, std::string_view id);
  // The bytes of the tenant's stored responses that have not expired.
  result<std::int64_t> stored_response_bytes(std::string_view tenant_id) const;

  // Audit log, newest first: at most `limit` entries with ids below `before` (all when absent).
  result<std::vector<audit_entry>> audit(std::size_t limit, std::optional<std::int64_t> before = std::nullopt) const;

 private:
  struct impl;
  explicit tenant_store(std::unique_ptr<impl> state);
  std::unique_ptr<impl> impl_;
};

}  // namespace edge::gateway
