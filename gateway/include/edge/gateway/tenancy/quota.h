// Per-tenant quotas, held exactly: a request reserves its worst case (prompt tokens + n ×
// max_tokens: every choice may run to max_tokens) when it is admitted, so a tenant can never
// overrun a limit by streaming, and the unused part is refunded when it ends. The kinds of
// quota, and what each one counts, are listed in quota_kinds.h.
//
// Admission has two phases, so that the cheap limits are judged before a request costs
// anything (its body parsed, its prompt tokenized):
//   1. try_admit, right after authentication: the kinds of quota_phase::admission (the request
//      rate and the requests in flight). The request counts against the rate from here on,
//      whatever happens to it later.
//   2. try_reserve, once prompt_tokens and max_tokens are known: the kinds of
//      quota_phase::reservation (the largest max_tokens, the daily budget, the tokens per minute).
// Within a phase a request is admitted by every limit at once or by none, and a refusal takes
// nothing (a phase-2 refusal leaves phase 1 held: the caller ends it with finish(held, 0)).
// The kinds of quota_phase::engine are in neither: no store judges or counts them, the engine
// applies them to the tenant's requests (engine_limits.h).
//
// quota_store is the seam between the gateway and where the counters live: in this process
// (in_memory_quota_store) or, for several gateway replicas, Redis (redis_quota_store.h; chosen
// by --quota-store, quota_stores.h). Both judge by the same rules (src/quota_rules.h). Time
// comes from an injected time_source: rates use its monotonic clock, the daily budget its
// calendar clock (Redis uses its own server clock for both, so every gateway agrees).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/tenant.h"

namespace edge::gateway {

// The quota kind's name (quota_kind::name); "none" and "quota_store_unavailable" for the
// others. Also the metric label.
std::string_view to_string(quota_limit limit);

// Phase 1: who is asking, before anything else is known of the request.
struct admit_request {
  std::string_view tenant_id;
  const tenant_quotas& quotas;      // the tenant's limits (from the tenant snapshot)
  std::string_view reservation_id;  // unique per request across gateways (reservation_ids makes them)
};

// Phase 2: what the request asks to be admitted with.
struct quota_request {
  std::string_view tenant_id;
  const tenant_quotas& quotas;  // the tenant's limits (from the tenant snapshot)
  std::int64_t prompt_tokens = 0;
  std::int64_t max_tokens = 0;  // the most completion tokens each choice may produce
  std::int64_t choices = 1;     // n
  // The most completion tokens of all choices, and with the prompt what the request reserves
  // (both capped rather than overflowed: max_tokens may be anything a client sent).
  std::int64_t completion_tokens() const {
    constexpr std::int64_t most = std::numeric_limits<std::int64_t>::max() / 2;
    return choices > 0 && max_tokens > most / choices ? most : choices * max_tokens;
  }
  std::int64_t cost() const {
    const std::int64_t completion = completion_tokens();
    return prompt_tokens > std::numeric_limits<std::int64_t>::max() - completion ? std::numeric_limits<std::int64_t>::max()
                                                                                 : prompt_tokens + completion;
  }
};

// What an admitted request holds until it is settled and released.
struct quota_reservation {
  std::string tenant_id;
  std::string id;                  // the reservation id of try_admit (a shared store's record of it)
  std::int64_t bucket_tokens = 0;  // taken from the tokens-per-minute bucket (0: unlimited)
  std::int64_t day_tokens = 0;     // taken from the daily budget (0: unlimited)
  std::int64_t day = 0;            // the UTC day (days since 1970-01-01) day_tokens belongs to
  std::int64_t month_tokens = 0;   // taken from the monthly budget (0: unlimited)
  std::int64_t month = 0;          // the UTC month (months since 1970-01) month_tokens belongs to
  bool holds_slot = false;         // counted against the limit of requests in flight

  // Whether it took tokens that its settlement gives back what was not used of.
  bool holds_tokens() const { return bucket_tokens > 0 || day_tokens > 0 || month_tokens > 0; }
  // The tokens a budget (daily, monthly) took: what a crash could leave spent.
  std::int64_t budget_tokens() const { return std::max(day_tokens, month_tokens); }
};

// Reservation ids unique across gateways: a random prefix drawn when this is made, and a
// counter. Thread-safe.
class reservation_ids {
 public:
  reservation_ids();
  std::string next();

 private:
  const std::string prefix_;
  std::atomic<std::uint64_t> next_{0};
};

// One rate limit's state, for the x-ratelimit-* headers.
struct rate_limit_status {
  std::int64_t limit = 0;
  std::int64_t remaining = 0;           // what can be admitted right now
  std::chrono::milliseconds reset{0};   // until the limit is back to its full allowance
};

struct quota_decision {
  bool allowed = false;
  quota_limit limit = quota_limit::none;  // the limit that refused (none when allowed)
  // When a refused request can be retried with success (everything else staying equal); absent
  // when retrying cannot help (the request alone exceeds the limit).
  std::optional<std::chrono::milliseconds> retry_after;
  std::optional<rate_limit_status> requests;  // phase 1 only; absent when requests per minute are unlimited
  std::optional<rate_limit_status> tokens;    // phase 2 only; absent when tokens per minute are unlimited
  std::string message;                        // a refusal's explanation, for the error body
  quota_reservation reservation;              // allowed only
};

class quota_store {
 public:
  virtual ~quota_store() = default;

  // Phase 1: the request rate (the request counts from here on, whatever happens to it later)
  // and the requests in flight (takes a slot). A refusal takes nothing. Thread-safe, as is
  // every call here.
  virtual quota_decision try_admit(const admit_request& request) = 0;

  // Phase 2: the largest max_tokens, the daily budget, the tokens per minute. `held` is the
  // reservation try_admit returned. On success the decision's reservation is `held` plus the
  // tokens taken; a refusal takes nothing more (the caller still holds phase 1 and ends it with
  // finish(held, 0)).
  virtual quota_decision try_reserve(const quota_reservation& held, const quota_request& request) = 0;

  // The request is over and used `used_tokens` (prompt + completion) of its reservation: the
  // rest goes back to the bucket and the day's budget. Call once per admitted request (a shared
  // store, whose calls may be repeated, ignores a repeat; the one in memory does not).
  virtual void settle(const quota_reservation& reservation, std::int64_t used_tokens) = 0;

  // Frees the request's slot among the requests in flight. Call once per admitted request (as settle).
  virtual void release(const quota_reservation& reservation) = 0;

  // settle() and release() together, for a request that is over, after either phase: a shared
  // store sends both in one round trip.
  virtual void finish(const quota_reservation& reservation, std::int64_t used_tokens) {
    settle(reservation, used_tokens);
    release(reservation);
  }

  // Whether calls may wait on I/O (Redis): callers on an I/O thread run them on another thread.
  virtual bool may_block() const { return false; }
};

// Counters in this process. The daily and monthly budgets survive a restart only through
// seed_day_tokens() and seed_month_tokens() (the server seeds them from the usage ledger when it
// starts).
class in_memory_quota_store final : public quota_store {
 public:
  explicit in_memory_quota_store(const time_source& clock) : clock_(clock) {}

  quota_decision try_admit(const admit_request& request) override;
  quota_decision try_reserve(const quota_reservation& held, const quota_request& request) override;
  void settle(const quota_reservation& reservation, std::int64_t used_tokens) override;
  void release(const quota_reservation& reservation) override;

  // Counts `tokens` as already spent today (this month) by the tenant (e.g. before a restart).
  void seed_day_tokens(std::string_view tenant_id, std::int64_t tokens);
  void seed_month_tokens(std::string_view tenant_id, std::int64_t tokens);

  // For tests and diagnostics.
  std::int64_t in_flight(std::string_view tenant_id) const;
  std::int64_t day_tokens_used(std::string_view tenant_id) const;
  std::int64_t month_tokens_used(std::string_view tenant_id) const;

 private:
  struct tenant_state {
    std::int64_t tat_ns = std::numeric_limits<std::int64_t>::min();  // GCRA theoretical arrival time
    double bucket = 0.0;                // tokens in the bucket after the last refill
    std::int64_t bucket_at_ns = 0;      // when `bucket` was last refilled
    bool bucket_started = false;        // false: full at first use
    std::int64_t in_flight = 0;
    std::int64_t day = std::numeric_limits<std::int64_t>::min();
    std::int64_t day_tokens = 0;        // reserved or spent during `day`
    std::int64_t month = std::numeric_limits<std::int64_t>::min();
    std::int64_t month_tokens = 0;      // reserved or spent during `month`
  };
  tenant_state& state_of(std::string_view tenant_id);  // mutex_ held
  // Starts the day's and the month's counts afresh when `now_s` is past their period. mutex_ held.
  static void start_budget_periods(tenant_state& state, unix_time now_s);
  std::int64_t now_ns() const;                         // the monotonic clock
  void refill(tenant_state& state, std::int64_t capacity, std::int64_t now_ns) const;

  const time_source& clock_;
  mutable std::mutex mutex_;
  std::map<std::string, tenant_state, std::less<>> tenants_;  // guarded by mutex_
};

// Go-style duration as OpenAI writes x-ratelimit-reset-*: "0s", "20ms", "1s", "6m0s", "1.5s",
// "1h2m3s".
std::string format_reset_duration(std::chrono::milliseconds d);

}  // namespace edge::gateway
