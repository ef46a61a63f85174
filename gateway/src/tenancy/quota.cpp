#include "edge/gateway/tenancy/quota.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "edge/common/format.h"
#include "edge/gateway/tenancy/tenant_store.h"
#include "quota_rules.h"

namespace edge::gateway {
std::string_view to_string(quota_limit limit) {
  if (const quota_kind* kind = find_quota_kind(limit)) return kind->name;
  return limit == quota_limit::quota_store_unavailable ? "quota_store_unavailable" : "none";
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

namespace {

std::string random_hex_id() {
  std::random_device device;
  std::uint64_t value = (static_cast<std::uint64_t>(device()) << 32) | device();
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, value >>= 4) out[static_cast<std::size_t>(i)] = "0123456789abcdef"[value & 0xf];
  return out;
}

}  // namespace

reservation_ids::reservation_ids() : prefix_(random_hex_id() + ":") {}

std::string reservation_ids::next() { return prefix_ + std::to_string(next_.fetch_add(1, std::memory_order_relaxed)); }

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
    state.bucket +=
        static_cast<double>(now_ns - state.bucket_at_ns) * cap / static_cast<double>(quota_rules::window_ns);
  }
  // A lowered limit lowers what is already in the bucket.
  state.bucket = std::min(state.bucket, cap);
  state.bucket_at_ns = std::max(state.bucket_at_ns, now_ns);
}

std::int64_t in_memory_quota_store::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_.monotonic_time().time_since_epoch()).count();
}

quota_decision in_memory_quota_store::try_admit(const admit_request& request) {
  const tenant_quotas& q = request.quotas;
  const std::int64_t now = now_ns();
  std::lock_guard lock(mutex_);
  tenant_state& st = state_of(request.tenant_id);
  const std::optional<std::int64_t> interval = quota_rules::request_interval_ns(q);
  quota_rules::admit_counters seen{.in_flight = st.in_flight};
  if (interval) seen.backlog_ns = std::max(st.tat_ns, now) - now;

  quota_decision d = quota_rules::judge_admit(request, seen);
  if (!d.allowed) return d;  // a refusal takes nothing
  if (interval) st.tat_ns = now + seen.backlog_ns + *interval;
  if (d.reservation.holds_slot) ++st.in_flight;
  return d;
}

quota_decision in_memory_quota_store::try_reserve(const quota_reservation& held, const quota_request& request) {
  const tenant_quotas& q = request.quotas;
  const std::int64_t now = now_ns();
  const unix_time now_s = to_unix_seconds(clock_.system_time());
  const std::int64_t today = quota_rules::utc_day(now_s);


  std::lock_guard lock(mutex_);
  tenant_state& st = state_of(request.tenant_id);
  start_budget_periods(st, now_s);
  quota_rules::reserve_counters seen{.day_tokens = st.day_tokens, .month_tokens = st.month_tokens};
  if (const std::optional<std::int64_t> capacity = quota_rules::bucket_capacity(q)) {
    refill(st, *capacity, now);
    seen.bucket = st.bucket;
  }

  quota_decision d = quota_rules::judge_reserve(held, request, seen, today, now_s);
  if (!d.allowed) return d;  // a refusal takes nothing more
  st.bucket -= static_cast<double>(d.reservation.bucket_tokens);
  st.day_tokens += d.reservation.day_tokens;
  st.month_tokens += d.reservation.month_tokens;
  return d;
}

void in_memory_quota_store::settle(const quota_reservation& reservation, std::int64_t used_tokens) {
  std::lock_guard lock(mutex_);
  tenant_state& st = state_of(reservation.tenant_id);
  if (reservation.bucket_tokens > 0) {
    // Refunds past a full bucket are lost, as refills are: it never holds more than a minute's worth.
    st.bucket += static_cast<double>(reservation.bucket_tokens - used_tokens);
  }
  if (reservation.day_tokens > 0 && st.day == reservation.day) {
    st.day_tokens = std::max<std::int64_t>(st.day_tokens - (reservation.day_tokens - used_tokens), 0);
  }
  if (reservation.month_tokens > 0 && st.month == reservation.month) {
    st.month_tokens = std::max<std::int64_t>(st.month_tokens - (reservation.month_tokens - used_tokens), 0);
  }
}

void in_memory_quota_store::release(const quota_reservation& reservation) {
  if (!reservation.holds_slot) return;
  std::lock_guard lock(mutex_);
  tenant_state& st = state_of(reservation.tenant_id);
  st.in_flight = std::max<std::int64_t>(st.in_flight - 1, 0);
}

void in_memory_quota_store::seed_day_tokens(std::string_view tenant_id, std::int64_t tokens) {
  const unix_time now_s = to_unix_seconds(clock_.system_time());
  std::lock_guard lock(mutex_);
  tenant_state& st = state_of(tenant_id);
  start_budget_periods(st, now_s);
  st.day_tokens += tokens;
}

void in_memory_quota_store::seed_month_tokens(std::string_view tenant_id, std::int64_t tokens) {
  const unix_time now_s = to_unix_seconds(clock_.system_time());
  std::lock_guard lock(mutex_);
  tenant_state& st = state_of(tenant_id);
  start_budget_periods(st, now_s);
  st.month_tokens += tokens;
}

void in_memory_quota_store::start_budget_periods(tenant_state& st, unix_time now_s) {
  if (const std::int64_t today = quota_rules::utc_day(now_s); st.day != today) {
    st.day = today;
    st.day_tokens = 0;
  }
  if (const std::int64_t this_month = quota_rules::utc_month(now_s); st.month != this_month) {
    st.month = this_month;
    st.month_tokens = 0;
  }
}

std::int64_t in_memory_quota_store::in_flight(std::string_view tenant_id) const {
  std::lock_guard lock(mutex_);
  const auto it = tenants_.find(tenant_id);
  return it == tenants_.end() ? 0 : it->second.in_flight;
}

std::int64_t in_memory_quota_store::day_tokens_used(std::string_view tenant_id) const {
  const unix_time now_s = to_unix_seconds(clock_.system_time());
  std::lock_guard lock(mutex_);
  const auto it = tenants_.find(tenant_id);
  if (it == tenants_.end() || it->second.day != quota_rules::utc_day(now_s)) return 0;
  return it->second.day_tokens;
}

std::int64_t in_memory_quota_store::month_tokens_used(std::string_view tenant_id) const {
  const unix_time now_s = to_unix_seconds(clock_.system_time());
  std::lock_guard lock(mutex_);
  const auto it = tenants_.find(tenant_id);
  if (it == tenants_.end() || it->second.month != quota_rules::utc_month(now_s)) return 0;
  return it->second.month_tokens;
}

}  // namespace edge::gateway
