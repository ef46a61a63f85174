#include "edge/gateway/quota.h"

#include <algorithm>
#include <cmath>

#include "edge/common/format.h"
#include "edge/gateway/tenant_store.h"

namespace edge::gateway {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t window_ns = 60'000'000'000;  // requests and tokens are per minute
constexpr std::int64_t ns_per_ms = 1'000'000;
// A request refused by max_concurrent can go as soon as another finishes; nobody knows when,
// so clients are told to try again after this.
constexpr std::chrono::milliseconds concurrency_retry_after = 1s;

std::chrono::milliseconds ceil_ms(std::int64_t ns) {
  return std::chrono::milliseconds(ns <= 0 ? 0 : (ns + ns_per_ms - 1) / ns_per_ms);
}

// Time for the bucket to gain `tokens` at capacity / minute.
std::int64_t refill_ns(double tokens, std::int64_t capacity) {
  return static_cast<std::int64_t>(std::ceil(tokens * static_cast<double>(window_ns) / static_cast<double>(capacity)));
}

std::string seconds_text(std::chrono::milliseconds d) { return format_reset_duration(d); }

// Days since 1970-01-01 (UTC) of a unix time, rounding down for times before 1970 too.
std::int64_t utc_day(unix_time t) { return t >= 0 ? t / seconds_per_day : -((-t + seconds_per_day - 1) / seconds_per_day); }

}  // namespace

std::string_view to_string(quota_limit limit) {
  switch (limit) {
    case quota_limit::none: return "none";
    case quota_limit::requests_per_minute: return "requests_per_minute";
    case quota_limit::tokens_per_minute: return "tokens_per_minute";
    case quota_limit::max_concurrent: return "max_concurrent";
    case quota_limit::daily_tokens: return "daily_tokens";
    case quota_limit::max_tokens_per_request: return "max_tokens_per_request";
  }
  return "none";
}

std::string format_reset_duration(std::chrono::milliseconds d) {
  std::int64_t ms = std::max<std::int64_t>(d.count(), 0);
  if (ms == 0) return "0s";
  if (ms < 1000) return format("{}ms", ms);
  std::string out;
  const std::int64_t hours = ms / 3'600'000;
  ms %= 3'600'000;
  const std::int64_t minutes = ms / 60'000;
  ms %= 60'000;
  if (hours > 0) out += format("{}h", hours);
  if (hours > 0 || minutes > 0) out += format("{}m", minutes);
  out += format("{}", ms / 1000);
  if (std::int64_t fraction = ms % 1000; fraction > 0) {
    std::string digits = format("{}", fraction + 1000).substr(1);  // three digits, leading zeros kept
    while (digits.back() == '0') digits.pop_back();
    out += "." + digits;
  }
  out += "s";
  return out;
}

in_memory_quota_store::tenant_state& in_memory_quota_store::state_of(std::string_view tenant_id) {
  auto it = tenants_.find(tenant_id);
  if (it == tenants_.end()) it = tenants_.emplace(std::string(tenant_id), tenant_state{}).first;
  return it->second;
}

void in_memory_quota_store::refill(tenant_state& state, std::int64_t capacity, std::int64_t now_ns) const {
  const double cap = static_cast<double>(capacity);
  if (!state.bucket_started) {
    state.bucket = cap;
    state.bucket_started = true;
  } else if (now_ns > state.bucket_at_ns) {
    state.bucket += static_cast<double>(now_ns - state.bucket_at_ns) * cap / static_cast<double>(window_ns);
  }
  // A lowered limit lowers what is already in the bucket.
  state.bucket = std::min(state.bucket, cap);
  state.bucket_at_ns = std::max(state.bucket_at_ns, now_ns);
}

quota_decision in_memory_quota_store::try_acquire(const quota_request& request) {
  const tenant_quotas& q = request.quotas;
  const std::int64_t cost = request.cost();
  const std::int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(clock_.monotonic_time().time_since_epoch()).count();
  const unix_time now_s = to_unix_seconds(clock_.system_time());
  const std::int64_t today = utc_day(now_s);

  std::lock_guard lock(mutex_);
  tenant_state& st = state_of(request.tenant_id);

  quota_decision d;
  // Each limit is checked against the state as it is; a refused request changes nothing, so
  // the new values are only written once every limit has said yes.
  struct refusal {
    quota_limit limit;
    std::optional<std::chrono::milliseconds> retry_after;
    std::string message;
  };
  std::optional<refusal> first;  // the one reported, in the order the limits are checked
  std::optional<std::chrono::milliseconds> retry_after{std::chrono::milliseconds(0)};
  const auto refuse = [&](quota_limit limit, std::optional<std::chrono::milliseconds> after, std::string message) {
    if (!first) first = refusal{limit, after, std::move(message)};
    if (!after) retry_after.reset();
    else if (retry_after) retry_after = std::max(*retry_after, *after);
  };

  if (q.max_tokens_per_request && request.max_tokens > *q.max_tokens_per_request) {
    refuse(quota_limit::max_tokens_per_request, std::nullopt,
           format("max_tokens is too large: {}. Tenant '{}' may ask for at most {} tokens per request.",
                  request.max_tokens, request.tenant_id, *q.max_tokens_per_request));
  }

  // Daily budget.
  if (st.day != today) {
    st.day = today;
    st.day_tokens = 0;
  }
  if (q.daily_tokens && st.day_tokens + cost > *q.daily_tokens) {
    const unix_time midnight = (today + 1) * seconds_per_day;
    if (cost > *q.daily_tokens) {
      refuse(quota_limit::daily_tokens, std::nullopt,
             format("This request needs up to {} tokens, more than tenant '{}''s whole daily budget of {}.", cost,
                    request.tenant_id, *q.daily_tokens));
    } else {
      refuse(quota_limit::daily_tokens, std::chrono::seconds(midnight - now_s),
             format("Tenant '{}' has used its daily token budget: {} of {} tokens spent or reserved today, this "
                    "request needs up to {}. The budget resets at {}.",
                    request.tenant_id, st.day_tokens, *q.daily_tokens, cost, format_utc(midnight)));
    }
  }

  if (q.max_concurrent && st.in_flight >= *q.max_concurrent) {
    refuse(quota_limit::max_concurrent, concurrency_retry_after,
           format("Too many concurrent requests for tenant '{}': the limit is {}. Please try again when one finishes.",
                  request.tenant_id, *q.max_concurrent));
  }

  // Requests per minute (GCRA). `requests_idle` is the limit as it stands (what a refusal
  // reports); d.requests what is left once this request is admitted.
  std::int64_t new_tat = st.tat_ns;
  rate_limit_status requests_idle{};
  if (q.requests_per_minute) {
    const std::int64_t limit = *q.requests_per_minute;
    const std::int64_t interval = std::max<std::int64_t>(window_ns / limit, 1);
    const std::int64_t tat = std::max(st.tat_ns, now_ns);
    new_tat = tat + interval;
    requests_idle = {limit, std::max<std::int64_t>((window_ns - (tat - now_ns)) / interval, 0), ceil_ms(tat - now_ns)};
    if (new_tat - now_ns <= window_ns) {
      d.requests = rate_limit_status{limit, (window_ns - (new_tat - now_ns)) / interval, ceil_ms(new_tat - now_ns)};
    } else {
      const auto wait = ceil_ms(new_tat - now_ns - window_ns);
      refuse(quota_limit::requests_per_minute, wait,
             format("Rate limit reached for requests per minute on tenant '{}': limit {}. Please try again in {}.",
                    request.tenant_id, limit, seconds_text(wait)));
    }
  }

  // Tokens per minute (token bucket).
  rate_limit_status tokens_idle{};
  if (q.tokens_per_minute) {
    const std::int64_t capacity = *q.tokens_per_minute;
    refill(st, capacity, now_ns);
    const double level = st.bucket;
    const double full = static_cast<double>(capacity);
    tokens_idle = {capacity, static_cast<std::int64_t>(std::floor(std::max(level, 0.0))),
                   ceil_ms(refill_ns(full - level, capacity))};
    if (static_cast<double>(cost) <= level) {
      const double after = level - static_cast<double>(cost);
      d.tokens = rate_limit_status{capacity, static_cast<std::int64_t>(std::floor(after)),
                                   ceil_ms(refill_ns(full - after, capacity))};
    } else if (cost > capacity) {
      refuse(quota_limit::tokens_per_minute, std::nullopt,
             format("Request too large for tokens per minute on tenant '{}': limit {}, requested {} (prompt {} + "
                    "max_tokens {}). Lower max_tokens or shorten the prompt.",
                    request.tenant_id, capacity, cost, request.prompt_tokens, request.max_tokens));
    } else {
      const auto wait = ceil_ms(refill_ns(static_cast<double>(cost) - level, capacity));
      refuse(quota_limit::tokens_per_minute, wait,
             format("Rate limit reached for tokens per minute on tenant '{}': limit {}, available {}, requested {}. "
                    "Please try again in {}.",
                    request.tenant_id, capacity, tokens_idle.remaining, cost, seconds_text(wait)));
    }
  }

  if (first) {
    // Nothing is taken: the headers describe the limits as they stand.
    if (q.requests_per_minute) d.requests = requests_idle;
    if (q.tokens_per_minute) d.tokens = tokens_idle;
    d.allowed = false;
    d.limit = first->limit;
    d.message = std::move(first->message);
    d.retry_after = retry_after;
    return d;
  }

  // Admitted: commit every limit.
  d.allowed = true;
  d.reservation.tenant_id = std::string(request.tenant_id);
  if (q.requests_per_minute) st.tat_ns = new_tat;
  if (q.tokens_per_minute) {
    st.bucket -= static_cast<double>(cost);
    d.reservation.bucket_tokens = cost;
  }
  if (q.daily_tokens) {
    st.day_tokens += cost;
    d.reservation.daily_tokens = cost;
  }
  d.reservation.day = today;
  if (q.max_concurrent) {
    ++st.in_flight;
    d.reservation.holds_slot = true;
  }
  return d;
}

void in_memory_quota_store::settle(const quota_reservation& reservation, std::int64_t used_tokens) {
  std::lock_guard lock(mutex_);
  tenant_state& st = state_of(reservation.tenant_id);
  if (reservation.bucket_tokens > 0) {
    // Refunds past a full bucket are lost, as refills are: it never holds more than a minute's worth.
    st.bucket += static_cast<double>(reservation.bucket_tokens - used_tokens);
  }
  if (reservation.daily_tokens > 0 && st.day == reservation.day) {
    st.day_tokens = std::max<std::int64_t>(st.day_tokens - (reservation.daily_tokens - used_tokens), 0);
  }
}

void in_memory_quota_store::release(const quota_reservation& reservation) {
  if (!reservation.holds_slot) return;
  std::lock_guard lock(mutex_);
  tenant_state& st = state_of(reservation.tenant_id);
  st.in_flight = std::max<std::int64_t>(st.in_flight - 1, 0);
}

void in_memory_quota_store::seed_daily_tokens(std::string_view tenant_id, std::int64_t tokens) {
  const unix_time now_s = to_unix_seconds(clock_.system_time());
  std::lock_guard lock(mutex_);
  tenant_state& st = state_of(tenant_id);
  const std::int64_t today = utc_day(now_s);
  if (st.day != today) {
    st.day = today;
    st.day_tokens = 0;
  }
  st.day_tokens += tokens;
}

std::int64_t in_memory_quota_store::in_flight(std::string_view tenant_id) const {
  std::lock_guard lock(mutex_);
  const auto it = tenants_.find(tenant_id);
  return it == tenants_.end() ? 0 : it->second.in_flight;
}

std::int64_t in_memory_quota_store::daily_tokens_used(std::string_view tenant_id) const {
  const unix_time now_s = to_unix_seconds(clock_.system_time());
  std::lock_guard lock(mutex_);
  const auto it = tenants_.find(tenant_id);
  if (it == tenants_.end() || it->second.day != utc_day(now_s)) return 0;
  return it->second.day_tokens;
}

}  // namespace edge::gateway
