// Every kind of quota a tenant can have, described once. The tenant store's columns, the admin
// API's "quotas" object, the CLI's flags, the metric label, the refusal's HTTP answer and the
// limits the Redis scripts are given are all read from quota_kinds below; what a kind means is
// judged in one place, src/quota_rules.cpp (for both stores), and counted where the counters
// live (src/quota.cpp in memory, src/redis_quota_scripts.h in Redis). A kind of the engine
// phase is judged by no store: it is a limit the engine applies, set on each of the tenant's
// generate requests by engine_limits.h.
//
// Adding a kind (docs/architecture.md, "Quota kinds", has the steps): a member of tenant_quotas,
// an enumerator of quota_limit and a row of quota_kinds, all three in the same order; a schema
// step adding its column (src/tenant_store.cpp); its rule in quota_rules; and, for a kind that
// keeps counters, the counting in both stores. The unit test quota_kinds_test walks the table
// through the admin API's JSON, its parser and the SQLite store.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace edge::gateway {

// Limits of one tenant, one member per row of quota_kinds. An absent limit is unlimited.
struct tenant_quotas {
  std::optional<std::int64_t> requests_per_minute;
  std::optional<std::int64_t> tokens_per_minute;
  std::optional<std::int64_t> max_concurrent;
  std::optional<std::int64_t> daily_tokens;
  std::optional<std::int64_t> max_tokens_per_request;
  std::optional<std::int64_t> kv_host_cache_bytes;
  std::optional<std::int64_t> kv_disk_cache_bytes;
  std::optional<std::int64_t> monthly_tokens;

  friend bool operator==(const tenant_quotas&, const tenant_quotas&) = default;
};

// A quota kind (in the order of quota_kinds), as the limit that refused a request, or none.
// The kinds of quota_phase::engine have an enumerator too, and never refuse.
enum class quota_limit {
  none,
  requests_per_minute,
  tokens_per_minute,
  max_concurrent,
  daily_tokens,
  max_tokens_per_request,
  kv_host_cache_bytes,
  kv_disk_cache_bytes,
  monthly_tokens,
  // Not a quota kind: the shared quota store could not be reached and --quota-fail-mode is
  // closed, so the request is refused (503) without being counted.
  quota_store_unavailable,
};

// When a kind is judged (quota.h): admission right after authentication, before the request
// costs anything; reservation once its prompt is tokenized and its max_tokens known. A kind of
// the engine phase is never judged and never refuses: it is passed to the engine with each of
// the tenant's requests (engine_limits.h), which holds the tenant to it, so it has no counters,
// no Redis key and no refusal.
enum class quota_phase { admission, reservation, engine };

// What a kind's values count: a number of requests or tokens, or bytes (which the CLI also
// takes with a unit, as "512MiB").
enum class quota_unit { count, bytes };

// How a refusal by the kind is answered, in OpenAI's error shape (quota_response.h).
struct quota_refusal {
  unsigned status = 0;         // HTTP status
  std::string_view type;       // error.type
  std::string_view param;      // error.param; empty: null
  std::string_view code;       // error.code
};

struct quota_kind {
  quota_limit limit;
  // The kind's one external name: its field in the admin API's "quotas" object, its column of
  // the tenants table, its `limit` label on edgeinfer_quota_rejections_total, and, as
  // `--` + the name with '-' for '_', its flag of `edgeinfer admin tenants create|update`.
  std::string_view name;
  std::optional<std::int64_t> tenant_quotas::*member;
  quota_phase phase;
  quota_unit unit;
  // The smallest limit the admin API accepts: 1 for a kind that refuses (at 0 it would refuse
  // every request: such a tenant is deleted, or its keys revoked), 0 for a byte cap of the
  // engine (the tenant keeps nothing there).
  std::int64_t least;
  // The per-tenant Redis key (`<prefix>{tenant}:<key>`) holding its counters; empty for a kind
  // judged from the request alone, which no store counts.
  std::string_view redis_key;
  // The Lua local the Redis script of its phase reads its limit into (0 = unlimited).
  std::string_view lua_limit;
  // How a refusal is answered; all zero for a kind of the engine phase, which never refuses.
  quota_refusal refusal;
  std::string_view help;  // what the limit counts, for the CLI's help

  constexpr bool counted() const { return !redis_key.empty(); }
  // Whether a quota store judges the kind (and so may refuse a request by it).
  constexpr bool judged() const { return phase != quota_phase::engine; }
  std::optional<std::int64_t>& of(tenant_quotas& q) const { return q.*member; }
  const std::optional<std::int64_t>& of(const tenant_quotas& q) const { return q.*member; }
};

// A refusal for the rate or the number of requests.
inline constexpr quota_refusal requests_refusal{429, "requests", "", "rate_limit_exceeded"};

inline constexpr std::array<quota_kind, 8> quota_kinds{{
    // GCRA (generic cell rate algorithm): one request every 60 s / limit, with bursts of up to
    // the whole minute's worth after a quiet minute. A request counts from its admission on,
    // whatever happens to it later.
    {quota_limit::requests_per_minute, "requests_per_minute", &tenant_quotas::requests_per_minute,
     quota_phase::admission, quota_unit::count, 1, "rate", "rpm", requests_refusal, "Requests per minute"},
    // A token bucket of `limit` tokens refilled at limit / 60 s per second: a request reserves
    // prompt + n × max_tokens, and the unused part is refunded when it ends.
    {quota_limit::tokens_per_minute, "tokens_per_minute", &tenant_quotas::tokens_per_minute,
     quota_phase::reservation, quota_unit::count, 1, "rate", "tpm", {429, "tokens", "", "rate_limit_exceeded"},
     "Prompt + max_tokens per minute (unused tokens are refunded)"},
    // Requests admitted and not yet released (in Redis, slots leased by the gateway serving them).
    {quota_limit::max_concurrent, "max_concurrent", &tenant_quotas::max_concurrent, quota_phase::admission,
     quota_unit::count, 1, "slots", "concurrent", requests_refusal, "Requests in flight at once"},
    // Prompt + completion tokens per UTC day, reserved and refunded like the bucket; the budget
    // starts afresh at 00:00 UTC.
    {quota_limit::daily_tokens, "daily_tokens", &tenant_quotas::daily_tokens, quota_phase::reservation,
     quota_unit::count, 1, "daily", "daily", {429, "insufficient_quota", "", "insufficient_quota"},
     "Prompt + completion tokens per UTC day"},
    // The largest max_tokens one request may ask for (per choice).
    {quota_limit::max_tokens_per_request, "max_tokens_per_request", &tenant_quotas::max_tokens_per_request,
     quota_phase::reservation, quota_unit::count, 1, "", "",
     {400, "invalid_request_error", "max_tokens", "max_tokens_per_request_exceeded"},
     "The largest max_tokens one request may ask for"},
    // The lower KV tiers (serve's --kv-host-cache-memory and --kv-disk-cache): the cached prompt
    // blocks evicted from KV memory that a tier keeps for the tenant take at most this many bytes
    // there; at the cap a new block of the tenant replaces its own least recently used one, never
    // another tenant's. The engine applies them (generate_request's host_tier_cap_bytes and
    // disk_tier_cap_bytes); a backend without the tier ignores them.
    {quota_limit::kv_host_cache_bytes, "kv_host_cache_bytes", &tenant_quotas::kv_host_cache_bytes,
     quota_phase::engine, quota_unit::bytes, 0, "", "", {},
     "Bytes of the host-memory KV tier the tenant's cached prompt blocks may take at most; at the cap its blocks "
     "replace its own"},
    {quota_limit::kv_disk_cache_bytes, "kv_disk_cache_bytes", &tenant_quotas::kv_disk_cache_bytes,
     quota_phase::engine, quota_unit::bytes, 0, "", "", {},
     "Bytes of the disk KV tier the tenant's cached prompt blocks may take at most; at the cap its blocks replace "
     "its own"},
    // Prompt + completion tokens per UTC calendar month, reserved and refunded like the daily
    // budget; the budget starts afresh on the 1st at 00:00 UTC.
    {quota_limit::monthly_tokens, "monthly_tokens", &tenant_quotas::monthly_tokens, quota_phase::reservation,
     quota_unit::count, 1, "monthly", "monthly", {429, "insufficient_quota", "", "insufficient_quota"},
     "Prompt + completion tokens per UTC calendar month"},
}};

// The row of a quota kind; null for none and quota_store_unavailable.
constexpr const quota_kind* find_quota_kind(quota_limit limit) {
  for (const quota_kind& k : quota_kinds) {
    if (k.limit == limit) return &k;
  }
  return nullptr;
}

// The row named `name` in the admin API; null for a name that is no quota kind.
constexpr const quota_kind* find_quota_kind(std::string_view name) {
  for (const quota_kind& k : quota_kinds) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

// The position of a kind's row in quota_kinds.
constexpr std::size_t quota_kind_index(const quota_kind& kind) {
  return static_cast<std::size_t>(&kind - quota_kinds.data());
}

// Whether a phase reads or writes the tenant's counters: whether the tenant has a counted kind
// of that phase (a phase without one needs no store call, so it never waits on one).
constexpr bool uses_counters(const tenant_quotas& q, quota_phase phase) {
  for (const quota_kind& k : quota_kinds) {
    if (k.phase == phase && k.counted() && k.of(q)) return true;
  }
  return false;
}

namespace detail {
// The table, the enum and the struct agree: rows in the enum's order, one per enumerator of a
// kind, and as many members as rows (tenant_quotas is an aggregate of optionals, nothing else).
constexpr bool quota_kinds_are_consistent() {
  for (std::size_t i = 0; i < quota_kinds.size(); ++i) {
    if (quota_kinds[i].limit != static_cast<quota_limit>(i + 1)) return false;
    for (std::size_t j = 0; j < i; ++j) {
      if (quota_kinds[i].member == quota_kinds[j].member || quota_kinds[i].name == quota_kinds[j].name) return false;
    }
  }
  return static_cast<std::size_t>(quota_limit::quota_store_unavailable) == quota_kinds.size() + 1 &&
         sizeof(tenant_quotas) == quota_kinds.size() * sizeof(std::optional<std::int64_t>);
}

// A judged kind refuses (a status to answer with) and accepts no limit of 0, which would refuse
// every request; a kind of the engine phase keeps no counters and has no refusal.
constexpr bool quota_phases_are_consistent() {
  for (const quota_kind& k : quota_kinds) {
    if (k.judged() != (k.refusal.status != 0) || k.least < (k.judged() ? 1 : 0)) return false;
    if (!k.judged() && (k.counted() || !k.lua_limit.empty())) return false;
  }
  return true;
}
}  // namespace detail
static_assert(detail::quota_kinds_are_consistent(),
              "tenant_quotas, quota_limit and quota_kinds must name the same kinds in the same order");
static_assert(detail::quota_phases_are_consistent(),
              "a judged quota kind refuses and starts at 1; an engine kind keeps no counters and never refuses");

}  // namespace edge::gateway
