#include "quota_rules.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>

#include "edge/common/format.h"
#include "edge/gateway/tenancy/tenant_store.h"

namespace edge::gateway::quota_rules {
namespace {

using namespace std::chrono_literals;

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

// The refusals of one phase: every limit is checked; the first refusal is the one reported,
// and retry_after is when all of them would pass (none when one never can).
class refusals {
 public:
  void add(quota_limit limit, std::optional<std::chrono::milliseconds> after, std::string message) {
    if (!first_) first_ = refusal{limit, std::move(message)};
    if (!after) retry_after_.reset();
    else if (retry_after_) retry_after_ = std::max(*retry_after_, *after);
  }
  bool any() const { return first_.has_value(); }
  // Fills in a refused decision.
  void refuse(quota_decision& d) {
    d.allowed = false;
    d.limit = first_->limit;
    d.message = std::move(first_->message);
    d.retry_after = retry_after_;
  }

 private:
  struct refusal {
    quota_limit limit;
    std::string message;
  };
  std::optional<refusal> first_;
  std::optional<std::chrono::milliseconds> retry_after_{std::chrono::milliseconds(0)};
};

}  // namespace

std::int64_t gcra_interval_ns(std::int64_t limit) { return std::max<std::int64_t>(window_ns / limit, 1); }

std::optional<std::int64_t> request_interval_ns(const tenant_quotas& q) {
  if (!q.requests_per_minute) return std::nullopt;
  return gcra_interval_ns(*q.requests_per_minute);
}

std::optional<std::int64_t> bucket_capacity(const tenant_quotas& q) { return q.tokens_per_minute; }

std::int64_t utc_day(unix_time t) {
  return t >= 0 ? t / seconds_per_day : -((-t + seconds_per_day - 1) / seconds_per_day);
}

std::int64_t utc_month(unix_time t) {
  const std::chrono::year_month_day date{std::chrono::sys_days{std::chrono::days{utc_day(t)}}};
  return (static_cast<int>(date.year()) - 1970) * 12 + static_cast<int>(static_cast<unsigned>(date.month())) - 1;
}

unix_time month_start(std::int64_t month) {
  const std::int64_t year = 1970 + (month >= 0 ? month / 12 : -((-month + 11) / 12));
  const auto in_year = static_cast<unsigned>(month - (year - 1970) * 12);
  const std::chrono::sys_days first{std::chrono::year{static_cast<int>(year)} / std::chrono::month{in_year + 1} / 1};
  return static_cast<unix_time>(first.time_since_epoch().count()) * seconds_per_day;
}

quota_decision judge_admit(const admit_request& request, const admit_counters& seen) {
  const tenant_quotas& q = request.quotas;
  quota_decision d;
  refusals refused;

  if (q.max_concurrent && seen.in_flight >= *q.max_concurrent) {
    refused.add(quota_limit::max_concurrent, concurrency_retry_after,
                format("Too many concurrent requests for tenant '{}': the limit is {}. Please try again when one "
                       "finishes.",
                       request.tenant_id, *q.max_concurrent));
  }

  // Requests per minute (GCRA). `requests_idle` is the limit as it stands (what a refusal
  // reports); d.requests what is left once this request is admitted.
  rate_limit_status requests_idle{};
  if (q.requests_per_minute) {
    const std::int64_t limit = *q.requests_per_minute;
    const std::int64_t interval = gcra_interval_ns(limit);
    const std::int64_t backlog = seen.backlog_ns;
    const std::int64_t next = backlog + interval;  // the arrival time after this request, from now
    requests_idle = {limit, std::max<std::int64_t>((window_ns - backlog) / interval, 0), ceil_ms(backlog)};
    if (next <= window_ns) {
      d.requests = rate_limit_status{limit, (window_ns - next) / interval, ceil_ms(next)};
    } else {
      const auto wait = ceil_ms(next - window_ns);
      refused.add(quota_limit::requests_per_minute, wait,
                  format("Rate limit reached for requests per minute on tenant '{}': limit {}. Please try again in {}.",
                         request.tenant_id, limit, seconds_text(wait)));
    }
  }

  if (refused.any()) {
    // Nothing is taken: the headers describe the limit as it stands.
    if (q.requests_per_minute) d.requests = requests_idle;
    refused.refuse(d);
    return d;
  }
  d.allowed = true;
  d.reservation.tenant_id = std::string(request.tenant_id);
  d.reservation.id = std::string(request.reservation_id);
  d.reservation.holds_slot = holds_slot(q);
  return d;
}

quota_decision judge_reserve(const quota_reservation& held, const quota_request& request, const reserve_counters& seen,
                             std::int64_t today, unix_time now_s) {
  const tenant_quotas& q = request.quotas;
  const std::int64_t cost = request.cost();
  quota_decision d;
  refusals refused;

  if (!within_request_limits(request)) {
    refused.add(quota_limit::max_tokens_per_request, std::nullopt,
                format("max_tokens is too large: {}. Tenant '{}' may ask for at most {} tokens per request.",
                       request.max_tokens, request.tenant_id, *q.max_tokens_per_request));
  }

  // Daily budget.
  if (q.daily_tokens && seen.day_tokens + cost > *q.daily_tokens) {
    const unix_time midnight = (today + 1) * seconds_per_day;
    if (cost > *q.daily_tokens) {
      refused.add(quota_limit::daily_tokens, std::nullopt,
                  format("This request needs up to {} tokens, more than tenant '{}''s whole daily budget of {}.", cost,
                         request.tenant_id, *q.daily_tokens));
    } else {
      refused.add(quota_limit::daily_tokens, std::chrono::seconds(midnight - now_s),
                  format("Tenant '{}' has used its daily token budget: {} of {} tokens spent or reserved today, this "
                         "request needs up to {}. The budget resets at {}.",
                         request.tenant_id, seen.day_tokens, *q.daily_tokens, cost, format_utc(midnight)));
    }
  }

  // Monthly budget.
  const std::int64_t this_month = utc_month(now_s);
  if (q.monthly_tokens && seen.month_tokens + cost > *q.monthly_tokens) {
    const unix_time next_month = month_start(this_month + 1);
    if (cost > *q.monthly_tokens) {
      refused.add(quota_limit::monthly_tokens, std::nullopt,
                  format("This request needs up to {} tokens, more than tenant '{}''s whole monthly budget of {}.",
                         cost, request.tenant_id, *q.monthly_tokens));
    } else {
      refused.add(quota_limit::monthly_tokens, std::chrono::seconds(next_month - now_s),
                  format("Tenant '{}' has used its monthly token budget: {} of {} tokens spent or reserved this "
                         "month, this request needs up to {}. The budget resets at {}.",
                         request.tenant_id, seen.month_tokens, *q.monthly_tokens, cost, format_utc(next_month)));
    }
  }

  // Tokens per minute (token bucket).
  rate_limit_status tokens_idle{};
  if (q.tokens_per_minute) {
    const std::int64_t capacity = *q.tokens_per_minute;
    const double level = seen.bucket;
    const double full = static_cast<double>(capacity);
    tokens_idle = {capacity, static_cast<std::int64_t>(std::floor(std::max(level, 0.0))),
                   ceil_ms(refill_ns(full - level, capacity))};
    if (static_cast<double>(cost) <= level) {
      const double after = level - static_cast<double>(cost);
      d.tokens = rate_limit_status{capacity, static_cast<std::int64_t>(std::floor(after)),
                                   ceil_ms(refill_ns(full - after, capacity))};
    } else if (cost > capacity) {
      const std::string completion = request.choices > 1 ? format("{} choices × max_tokens {}", request.choices,
                                                                   request.max_tokens)
                                                            : format("max_tokens {}", request.max_tokens);
      refused.add(quota_limit::tokens_per_minute, std::nullopt,
                  format("Request too large for tokens per minute on tenant '{}': limit {}, requested {} (prompt {} + "
                         "{}). Lower max_tokens{} or shorten the prompt.",
                         request.tenant_id, capacity, cost, request.prompt_tokens, completion,
                         request.choices > 1 ? " or n" : ""));
    } else {
      const auto wait = ceil_ms(refill_ns(static_cast<double>(cost) - level, capacity));
      refused.add(quota_limit::tokens_per_minute, wait,
                  format("Rate limit reached for tokens per minute on tenant '{}': limit {}, available {}, requested "
                         "{}. Please try again in {}.",
                         request.tenant_id, capacity, tokens_idle.remaining, cost, seconds_text(wait)));
    }
  }

  if (refused.any()) {
    // Nothing more is taken: the headers describe the limit as it stands.
    if (q.tokens_per_minute) d.tokens = tokens_idle;
    refused.refuse(d);
    return d;
  }
  d.allowed = true;
  d.reservation = held;
  if (q.tokens_per_minute) d.reservation.bucket_tokens = cost;
  if (q.daily_tokens) {
    d.reservation.day_tokens = cost;
    d.reservation.day = today;
  }
  if (q.monthly_tokens) {
    d.reservation.month_tokens = cost;
    d.reservation.month = this_month;
  }
  return d;
}

bool holds_slot(const tenant_quotas& q) { return q.max_concurrent.has_value(); }

bool within_request_limits(const quota_request& request) {
  const tenant_quotas& q = request.quotas;
  return !q.max_tokens_per_request || request.max_tokens <= *q.max_tokens_per_request;
}

reserve_counters idle_reserve_counters(const tenant_quotas& q) {
  reserve_counters idle;
  if (const auto capacity = bucket_capacity(q)) idle.bucket = static_cast<double>(*capacity);
  return idle;
}

std::int64_t default_max_tokens(const tenant_quotas& q, std::int64_t prompt_tokens, std::int64_t room,
                                std::int64_t choices) {
  const std::int64_t n = std::max<std::int64_t>(choices, 1);
  std::int64_t limit = room;
  if (q.max_tokens_per_request) limit = std::min(limit, *q.max_tokens_per_request);
  // Prompt + n × max_tokens is what the token limits reserve.
  if (q.tokens_per_minute) limit = std::min(limit, (*q.tokens_per_minute - prompt_tokens) / n);
  if (q.daily_tokens) limit = std::min(limit, (*q.daily_tokens - prompt_tokens) / n);
  if (q.monthly_tokens) limit = std::min(limit, (*q.monthly_tokens - prompt_tokens) / n);
  return std::max<std::int64_t>(limit, 1);
}

}  // namespace edge::gateway::quota_rules
