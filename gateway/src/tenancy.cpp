#include "edge/gateway/tenancy.h"

#include "edge/common/log.h"
#include "edge/monitoring/gateway_metrics.h"

namespace edge::gateway {

quota_lease::quota_lease(quota_store& quotas, usage_ledger& ledger, quota_reservation reservation)
    : quotas_(&quotas), ledger_(&ledger), reservation_(std::move(reservation)) {}

quota_lease::quota_lease(quota_lease&& other) noexcept
    : quotas_(other.quotas_),
      ledger_(other.ledger_),
      reservation_(std::move(other.reservation_)),
      used_(other.used_),
      finished_(std::exchange(other.finished_, true)) {}

quota_lease::~quota_lease() { finish(); }

void quota_lease::record(const usage_counts& used) {
  used_.prompt_tokens = used.prompt_tokens;
  used_.completion_tokens = used.completion_tokens;
  used_.cached_tokens = used.cached_tokens;
}

void quota_lease::finish() {
  if (finished_) return;
  finished_ = true;
  quotas_->finish(reservation_, used_.prompt_tokens + used_.completion_tokens);
  usage_counts served = used_;
  served.requests = 1;
  served.rejections = 0;
  ledger_->record(reservation_.tenant_id, served);
}

tenancy::tenancy(std::unique_ptr<tenant_store> store, std::unique_ptr<quota_store> quotas, const time_source& clock,
                 monitoring::gateway_metrics* metrics, std::chrono::milliseconds flush_interval)
    : clock_(clock),
      metrics_(metrics),
      store_(std::move(store)),
      quotas_(std::move(quotas)),
      ledger_(std::make_unique<usage_ledger>(*store_, clock, flush_interval)),
      auth_(*store_, clock) {}

tenancy::~tenancy() {
  if (status stopped = ledger_->stop(); !stopped.ok()) {
    logger("usage").error("could not write the usage ledger on shutdown: {}", stopped.message());
  }
}

result<std::unique_ptr<tenancy>> tenancy::open(const tenancy_options& options, const time_source& clock,
                                               monitoring::gateway_metrics* metrics) {
  EDGE_ASSIGN_OR_RETURN(auto store, tenant_store::open(options.state_dir, clock));
  std::unique_ptr<tenancy> t(new tenancy(std::move(store), make_quota_store(options.quota_store, clock, metrics), clock,
                                         metrics, options.ledger_flush_interval));
  if (auto* memory = dynamic_cast<in_memory_quota_store*>(t->quotas_.get()); memory != nullptr) {
    const unix_time now = to_unix_seconds(clock.system_time());
    const unix_time midnight = now - ((now % seconds_per_day) + seconds_per_day) % seconds_per_day;
    EDGE_ASSIGN_OR_RETURN(const auto spent_today, t->store_->tokens_since(midnight));
    for (const auto& [tenant, tokens] : spent_today) memory->seed_daily_tokens(tenant, tokens);
  }
  t->ledger_->start();
  return t;
}

admission tenancy::admit(const authenticated_tenant& who, std::int64_t prompt_tokens, std::int64_t max_tokens) {
  const tenant_record& tenant = *who.tenant;
  admission out;
  const std::string reservation_id = reservation_ids_.next();
  out.decision = quotas_->try_admit({tenant.id, tenant.quotas, reservation_id});
  if (out.decision.allowed) {
    const quota_reservation held = out.decision.reservation;
    quota_decision reserved = quotas_->try_reserve(held, {tenant.id, tenant.quotas, prompt_tokens, max_tokens});
    reserved.requests = out.decision.requests;
    out.decision = std::move(reserved);
    if (!out.decision.allowed) quotas_->finish(held, 0);
  }
  if (out.decision.allowed) {
    out.lease.emplace(*quotas_, *ledger_, out.decision.reservation);
    return out;
  }
  if (out.decision.limit == quota_limit::quota_store_unavailable) return out;  // no limit of the tenant's refused it
  ledger_->record(tenant.id, usage_counts{.rejections = 1});
  if (metrics_ != nullptr) {
    metrics_->quota_rejections
        .Add({{"tenant", metrics_->tenant_labels.label(tenant.id)}, {"limit", std::string(to_string(out.decision.limit))}})
        .Increment();
  }
  return out;
}

}  // namespace edge::gateway
