// The quota rules apart from where the counters live. Given what a tenant's counters read at
// the moment of a request, the judges decide, explain and fill the reservation; they change
// nothing. in_memory_quota_store (counters in this process, under a mutex) and
// redis_quota_store (counters read and written atomically by a Lua script in Redis) both
// judge through here, so their decisions, x-ratelimit-* figures and messages are the same.
#pragma once

#include <cstdint>

#include "edge/gateway/tenancy/quota.h"
#include "edge/gateway/tenancy/tenant.h"

namespace edge::gateway::quota_rules {

inline constexpr std::int64_t window_ns = 60'000'000'000;  // requests and tokens are per minute

// Phase 1's counters as they read when a request arrives.
struct admit_counters {
  std::int64_t backlog_ns = 0;  // GCRA: how far the theoretical arrival time is ahead of now (>= 0)
  std::int64_t in_flight = 0;   // requests holding a max_concurrent slot
};

// Phase 2's counters as they read when a request is tokenized: the bucket already refilled up
// to now, the daily count already reset if the UTC day changed.
struct reserve_counters {
  double bucket = 0.0;          // tokens in the tokens-per-minute bucket now
  std::int64_t day_tokens = 0;  // reserved or spent during `today`
};

// GCRA's emission interval: one request every 60 s / limit (at least 1 ns).
std::int64_t gcra_interval_ns(std::int64_t limit);

// Days since 1970-01-01 (UTC) of a unix time, rounding down for times before 1970 too.
std::int64_t utc_day(unix_time t);

// Phase 1: admits the request or refuses it with the first limit that says no (in the order
// max_concurrent, requests_per_minute), the longest retry_after of all refusals, and the
// requests headers as the limit stands. An admission's reservation names what the caller must
// now take: GCRA's arrival time moves to now + backlog + interval, and a slot when holds_slot.
quota_decision judge_admit(const admit_request& request, const admit_counters& seen);

// Phase 2, for a request holding `held` from phase 1: admits it or refuses it with the first
// limit that says no (in the order max_tokens_per_request, daily_tokens, tokens_per_minute),
// the longest retry_after of all refusals (none when one of them can never pass), and the
// tokens headers as the limit stands. An admission's reservation is `held` plus what the
// caller must now take: bucket_tokens leave the bucket, daily_tokens join `today`'s count.
quota_decision judge_reserve(const quota_reservation& held, const quota_request& request, const reserve_counters& seen,
                             std::int64_t today, unix_time now_s);

}  // namespace edge::gateway::quota_rules
