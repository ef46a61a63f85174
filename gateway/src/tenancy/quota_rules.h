// The quota rules apart from where the counters live. Given what a tenant's counters read at
// the moment of a request, the judges decide, explain and fill the reservation; they change
// nothing. in_memory_quota_store (counters in this process, under a mutex) and
// redis_quota_store (counters read and written atomically by a Lua script in Redis) both
// judge through here, so their decisions, x-ratelimit-* figures and messages are the same.
// The kinds of quota_phase::engine (the KV tier caps) are judged by neither: the engine applies
// them (engine_limits.h), and no request is refused for them.
#pragma once

#include <cstdint>
#include <optional>

#include "edge/gateway/tenancy/quota.h"
#include "edge/gateway/tenancy/tenant.h"

namespace edge::gateway::quota_rules {

inline constexpr std::int64_t window_ns = 60'000'000'000;  // requests and tokens are per minute

// Phase 1's counters as they read when a request arrives.
struct admit_counters {
  std::int64_t backlog_ns = 0;  // GCRA: how far the theoretical arrival time is ahead of now (>= 0)
  std::int64_t in_flight = 0;   // requests holding a slot among the requests in flight
};

// Phase 2's counters as they read when a request is tokenized: the bucket already refilled up
// to now, the daily count already reset if the UTC day changed.
struct reserve_counters {
  double bucket = 0.0;          // tokens in the tokens-per-minute bucket now
  std::int64_t day_tokens = 0;  // reserved or spent during `today`
  std::int64_t month_tokens = 0;  // reserved or spent during this UTC month
};

// GCRA's emission interval: one request every 60 s / limit (at least 1 ns).
std::int64_t gcra_interval_ns(std::int64_t limit);

// The counters a tenant's limits call for: GCRA's interval for its request rate, and the
// capacity of its token bucket; nullopt for a limit it does not have.
std::optional<std::int64_t> request_interval_ns(const tenant_quotas& q);
std::optional<std::int64_t> bucket_capacity(const tenant_quotas& q);

// Days since 1970-01-01 (UTC) of a unix time, rounding down for times before 1970 too.
std::int64_t utc_day(unix_time t);
// Calendar months since 1970-01 (UTC) of a unix time, and the unix time a month starts at.
std::int64_t utc_month(unix_time t);
unix_time month_start(std::int64_t month);

// Phase 1: admits the request or refuses it with the first limit that says no (the requests in
// flight before the request rate), the longest retry_after of all refusals, and the requests
// headers as the limit stands. An admission's reservation names what the caller must
// now take: GCRA's arrival time moves to now + backlog + interval, and a slot when holds_slot.
quota_decision judge_admit(const admit_request& request, const admit_counters& seen);

// Phase 2, for a request holding `held` from phase 1: admits it or refuses it with the first
// limit that says no (the largest max_tokens, then the daily budget, then the tokens per
// minute), the longest retry_after of all refusals (none when one of them can never pass), and
// the tokens headers as the limit stands. An admission's reservation is `held` plus what the
// caller must now take: bucket_tokens leave the bucket, day_tokens join `today`'s count.
quota_decision judge_reserve(const quota_reservation& held, const quota_request& request, const reserve_counters& seen,
                             std::int64_t today, unix_time now_s);

// Whether an admission of a tenant with these limits takes a slot among its requests in flight.
bool holds_slot(const tenant_quotas& q);

// Whether the request is within the limits that judge it alone, whatever the counters say (a
// request outside them is refused for good).
bool within_request_limits(const quota_request& request);

// Phase 2's counters of a tenant nobody has counted yet: a full bucket, nothing spent today.
reserve_counters idle_reserve_counters(const tenant_quotas& q);

// The max_tokens a request that names none gets: `room` (what the context leaves), lowered to
// what the tenant's limits could ever admit for a prompt of `prompt_tokens` and `choices`
// choices (a default above that would be refused for good), and at least 1 (a prompt that
// alone exceeds a limit is refused by that limit, which says so).
std::int64_t default_max_tokens(const tenant_quotas& q, std::int64_t prompt_tokens, std::int64_t room,
                                std::int64_t choices);

}  // namespace edge::gateway::quota_rules
