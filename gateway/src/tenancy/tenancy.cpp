#include "edge/gateway/tenancy/tenancy.h"

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <prometheus/gauge.h>

#include <algorithm>
#include <thread>

#include "edge/common/format.h"
#include "edge/common/log.h"
#include "edge/monitoring/gateway_metrics.h"
#include "quota_rules.h"

namespace edge::gateway {
namespace {

namespace asio = boost::asio;

// How long drain_quota_calls() sleeps between looks.
constexpr auto drain_poll_interval = std::chrono::milliseconds(5);
// How often the budget gauges are read from the tenant store (one query of today's usage rows).
constexpr auto budget_refresh_interval = std::chrono::seconds(10);

std::string_view to_string(request_outcome outcome) {
  switch (outcome) {
    case request_outcome::cancelled: return "cancelled";
    case request_outcome::completed: return "completed";
    case request_outcome::failed: return "failed";
  }
  return "cancelled";
}

std::int64_t today(const time_source& clock) { return to_unix_seconds(clock.system_time()) / seconds_per_day; }

}  // namespace

// What a session and the engine's sink share: settled when both have let go.
struct request_session::served {
  served(tenancy& t, std::string tenant, std::string request_api)
      : owner(t), tenant_id(std::move(tenant)), api(std::move(request_api)) {}
  served(const served&) = delete;
  served& operator=(const served&) = delete;

  ~served() {
    // The ledger first: when the counters in memory refund the reservation, the hold that
    // guards it after a crash is on its way out in the same flush as the last usage.
    meter.end();
    const std::int64_t used = usage ? usage->charged_tokens() : 0;
    owner.finish_later(std::move(reservation), used);
    if (owner.metrics_ == nullptr || !usage) return;
    const usage_counts counts = usage->counts();
    auto& m = *owner.metrics_;
    const std::string label = m.tenant_labels.label(tenant_id);
    m.tenant_requests.Add({{"tenant", label}, {"api", api}, {"outcome", std::string(to_string(outcome.load()))}})
        .Increment();
    m.tenant_tokens.Add({{"tenant", label}, {"api", api}, {"kind", "prompt"}})
        .Increment(static_cast<double>(counts.prompt_tokens));
    m.tenant_tokens.Add({{"tenant", label}, {"api", api}, {"kind", "completion"}})
        .Increment(static_cast<double>(counts.completion_tokens));
    m.tenant_tokens.Add({{"tenant", label}, {"api", api}, {"kind", "cached"}})
        .Increment(static_cast<double>(counts.cached_tokens));
  }

  tenancy& owner;
  const std::string tenant_id;
  const std::string api;                    // the metrics' api label
  quota_reservation reservation;            // phase 1, then both phases
  std::optional<request_usage> usage;       // from reserve() on
  usage_ledger::meter meter;                // from reserve() on
  std::atomic<request_outcome> outcome{request_outcome::cancelled};
};

request_session::request_session(tenancy& owner, authenticated_tenant who) : owner_(&owner), who_(std::move(who)) {}
request_session::request_session(request_session&&) noexcept = default;
request_session& request_session::operator=(request_session&&) noexcept = default;
request_session::~request_session() = default;

// GCC 12 reports a mismatched operator delete inside the coroutine frames Asio allocates and
// frees with its own matching pair (a known false positive; see openai_routes.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

asio::awaitable<std::optional<quota_decision>> request_session::admit(std::string_view api) {
  tenancy& t = *owner_;
  api_ = api;
  const tenant_record& tenant = *who_.tenant;
  const std::string id = t.reservation_ids_.next();
  const admit_request asked{.tenant_id = tenant.id, .quotas = tenant.quotas, .reservation_id = id};
  const auto call = [&t, &asked] { return t.quotas_->try_admit(asked); };
  // (No co_await inside ?: — GCC 12 mishandles the temporaries of such operands.)
  std::optional<quota_decision> decided;
  if (t.store_may_wait(uses_counters(tenant.quotas, quota_phase::admission))) {
    decided = co_await t.off_thread(call);
  } else {
    decided = call();
  }
  quota_decision decision = decided ? std::move(*decided) : t.store_unavailable(/*may_admit=*/true);
  uncounted_ = !decided;
  requests_ = decision.requests;
  if (!decision.allowed) {
    if (decision.limit != quota_limit::quota_store_unavailable) t.count_refusal(tenant, decision.limit, api_);
    co_return decision;
  }
  served_ = std::make_shared<served>(t, tenant.id, api_);
  served_->reservation = std::move(decision.reservation);
  co_return std::nullopt;
}

std::int64_t request_session::default_max_tokens(std::int64_t prompt_tokens, std::int64_t room,
                                                 std::int64_t choices) const {
  return quota_rules::default_max_tokens(who_.tenant->quotas, prompt_tokens, room, choices);
}

asio::awaitable<std::optional<quota_decision>> request_session::reserve(std::int64_t prompt_tokens,
                                                                       std::int64_t max_tokens, std::int64_t choices,
                                                                       std::string_view model) {
  tenancy& t = *owner_;
  const tenant_record& tenant = *who_.tenant;
  const quota_request asked{tenant.id, tenant.quotas, prompt_tokens, max_tokens, choices};
  const quota_reservation held = served_->reservation;
  const auto call = [&t, &held, &asked] { return t.quotas_->try_reserve(held, asked); };
  // A request admitted uncounted stays uncounted: the store holds no record of it to add to.
  std::optional<quota_decision> decided;
  if (!uncounted_ && t.store_may_wait(uses_counters(tenant.quotas, quota_phase::reservation))) {
    decided = co_await t.off_thread(call);
  } else if (!uncounted_) {
    decided = call();
  }
  quota_decision decision = decided ? std::move(*decided) : t.store_unavailable(/*may_admit=*/true);
  tokens_ = decision.tokens;
  if (!decision.allowed) {
    if (decision.limit != quota_limit::quota_store_unavailable) t.count_refusal(tenant, decision.limit, api_);
    co_return decision;
  }
  served_->reservation = std::move(decision.reservation);

  std::string hold_id;
  if (t.holds_daily_budget_ && served_->reservation.budget_tokens() > 0) {
    const usage_hold hold{.id = served_->reservation.id,
                          .tenant_id = tenant.id,
                          .day = today(t.clock_),
                          .reserved_tokens = served_->reservation.budget_tokens()};
    // A store write (SQLite behind the store's mutex, or PostgreSQL): off this thread.
    std::optional<status> written = co_await t.off_thread([&t, &hold] { return t.store_->add_hold(hold); });
    if (written && written->ok()) {
      hold_id = hold.id;
    } else if (t.fail_mode_ == quota_fail_mode::closed) {
      logger("usage").error("cannot write the daily-budget hold of a request of tenant {}: {}", tenant.id,
                            written ? written->message() : "too many store calls queued");
      co_return t.store_unavailable(/*may_admit=*/false);
    } else if (t.store_->health().reachable) {
      // Fail open, as the quota store does: the budget still holds in this process; only a crash
      // while this request runs could hand its reservation out again. An outage of the store is
      // logged once, by the store; a failure of a store that answers is logged here.
      logger("usage").warn("serving a request of tenant {} without its daily-budget hold: {}", tenant.id,
                           written ? written->message() : "too many store calls queued");
    }
  }
  served_->usage.emplace(prompt_tokens, asked.completion_tokens());
  served_->meter = t.ledger_->open_meter(tenant.id, *served_->usage, std::move(hold_id),
                                         usage_labels{.key_id = who_.key_id, .model = std::string(model), .api = api_});
  co_return std::nullopt;
}

#pragma GCC diagnostic pop

void request_session::add_headers(http::response_header<>& header) const {
  quota_decision figures;
  figures.allowed = true;
  figures.requests = requests_;
  figures.tokens = tokens_;
  set_rate_limit_headers(header, figures);
}

backend::event_sink request_session::metered(backend::event_sink sink) const {
  return [state = served_, sink = std::move(sink)](backend::engine_event event) {
    if (const auto* delta = std::get_if<backend::delta_event>(&event)) {
      state->usage->add_completion(static_cast<std::int64_t>(delta->tokens.size()));
    } else if (const auto* finished = std::get_if<backend::finished_event>(&event)) {
      if (!state->usage->finish(finished->usage.completion_tokens, finished->usage.cached_tokens)) {
        logger("usage").warn("request of tenant {}: the engine reported {} completion and {} cached tokens; charged {} "
                             "and {} (what was generated, within max_tokens and the prompt)",
                             state->tenant_id, finished->usage.completion_tokens, finished->usage.cached_tokens,
                             state->usage->counts().completion_tokens, state->usage->counts().cached_tokens);
      }
    }
    sink(std::move(event));
  };
}

const request_usage& request_session::usage() const { return *served_->usage; }

void request_session::set_outcome(request_outcome outcome) {
  if (served_) served_->outcome.store(outcome);
}

tenancy::tenancy(const tenancy_options& options, std::unique_ptr<tenant_store> store,
                 std::unique_ptr<quota_store> quotas, const time_source& clock, monitoring::gateway_metrics* metrics)
    : clock_(clock),
      metrics_(metrics),
      store_(std::move(store)),
      quotas_(std::move(quotas)),
      ledger_(std::make_unique<usage_ledger>(*store_, clock, options.ledger_flush_interval)),
      auth_(*store_, clock,
            configured_api_keys::of(std::string(tenant_store::default_tenant_id), options.api_keys)),
      holds_daily_budget_(dynamic_cast<in_memory_quota_store*>(quotas_.get()) != nullptr),
      fail_mode_(options.quota_store.fail_mode),
      max_queued_calls_(std::max<std::size_t>(options.max_queued_quota_calls, 1)),
      calls_(std::make_unique<thread_pool>(std::max<std::size_t>(options.quota_call_threads, 1))) {}

tenancy::~tenancy() {
  calls_.reset();  // what is queued (settlements among it) runs while the store and ledger exist
  if (status stopped = ledger_->stop(); !stopped.ok()) {
    logger("usage").error("could not write the usage ledger on shutdown: {}", stopped.message());
  }
}

result<std::unique_ptr<tenancy>> tenancy::open(const tenancy_options& options, const time_source& clock,
                                               monitoring::gateway_metrics* metrics) {
  EDGE_ASSIGN_OR_RETURN(auto store,
                        tenant_store::open({.url = options.tenant_store_url,
                                            .state_dir = options.state_dir,
                                            .query_timeout = options.tenant_store_timeout},
                                           clock));
  std::unique_ptr<tenancy> t(new tenancy(options, std::move(store), make_quota_store(options.quota_store, clock, metrics),
                                         clock, metrics));
  if (auto* memory = dynamic_cast<in_memory_quota_store*>(t->quotas_.get()); memory != nullptr) {
    const std::int64_t day = today(clock);
    EDGE_ASSIGN_OR_RETURN(const auto spent_today, t->store_->tokens_since(day * seconds_per_day));
    for (const auto& [tenant, tokens] : spent_today) memory->seed_day_tokens(tenant, tokens);
    const unix_time month_began = quota_rules::month_start(quota_rules::utc_month(day * seconds_per_day));
    EDGE_ASSIGN_OR_RETURN(const auto spent_this_month, t->store_->tokens_since(month_began));
    for (const auto& [tenant, tokens] : spent_this_month) memory->seed_month_tokens(tenant, tokens);
    EDGE_ASSIGN_OR_RETURN(const auto held_today, t->store_->unreleased_hold_tokens(day));
    for (const auto& [tenant, tokens] : held_today) {
      logger("usage").warn("tenant {}: {} tokens of today's budget were reserved by requests cut short by a crash; "
                           "they count as spent today and this month",
                           tenant, tokens);
      memory->seed_day_tokens(tenant, tokens);
      memory->seed_month_tokens(tenant, tokens);
    }
  }
  t->report_store_health();
  t->ledger_->start([tenancy = t.get()](const status&) { tenancy->report_store_health(); });
  return t;
}

void tenancy::report_store_health() {
  if (metrics_ == nullptr) return;
  report_budgets();
  const tenant_store_health health = store_->health();
  metrics_->tenant_store_up.Set(health.reachable ? 1 : 0);
  const unix_time now = to_unix_seconds(clock_.system_time());
  const unix_time age = health.checked_at > 0 ? std::max<unix_time>(now - health.checked_at, 0) : 0;
  metrics_->tenant_store_snapshot_age.Set(static_cast<double>(age));
  if (health.failures > reported_store_failures_) {
    metrics_->tenant_store_errors.Increment(static_cast<double>(health.failures - reported_store_failures_));
    reported_store_failures_ = health.failures;
  }
  metrics_->usage_ledger_pending_rows.Set(static_cast<double>(ledger_->pending_rows()));
}

void tenancy::report_budgets() {
  const auto now = std::chrono::steady_clock::now();
  const auto snapshot = store_->snapshot();
  // Every refresh interval, and at once when a tenant or its quotas changed.
  if (now - budgets_reported_at_ < budget_refresh_interval && snapshot->version() == budgets_reported_version_) return;
  budgets_reported_at_ = now;
  budgets_reported_version_ = snapshot->version();
  const unix_time midnight = today(clock_) * seconds_per_day;
  // The budgets: the quota kind, and since when its spend counts.
  const std::pair<const quota_kind*, unix_time> budgets[] = {
      {find_quota_kind(quota_limit::daily_tokens), midnight},
      {find_quota_kind(quota_limit::monthly_tokens), quota_rules::month_start(quota_rules::utc_month(midnight))},
  };
  // Per label: several tenants past the label limit share "other", which shows the largest share.
  std::map<std::pair<std::string, std::string>, double> shares;
  for (const auto& [kind, since] : budgets) {
    auto spent = store_->tokens_since(since);
    if (!spent.ok()) return;  // the store is down: the gauges keep their last values
    const std::string budget(kind->name);
    for (const auto& [tenant, tokens] : *spent) {
      const auto record = snapshot->tenant(tenant);
      const std::optional<std::int64_t> limit = record ? kind->of(record->quotas) : std::nullopt;
      if (!limit || *limit <= 0) continue;
      double& shown = shares[{metrics_->tenant_labels.label(tenant), budget}];
      shown = std::max(shown, static_cast<double>(tokens) / static_cast<double>(*limit));
    }
    // Tenants with the budget and nothing spent show 0; gauges of tenants without one go.
    for (const auto& [id, record] : snapshot->tenants()) {
      if (kind->of(record->quotas)) shares.try_emplace({metrics_->tenant_labels.label(id), budget}, 0.0);
    }
  }
  for (auto it = budget_gauges_.begin(); it != budget_gauges_.end();) {
    if (shares.contains(it->first)) {
      ++it;
      continue;
    }
    metrics_->tenant_budget_used.Remove(it->second);
    it = budget_gauges_.erase(it);
  }
  for (const auto& [labels, share] : shares) {
    prometheus::Gauge*& gauge = budget_gauges_[labels];
    if (gauge == nullptr) gauge = &metrics_->tenant_budget_used.Add({{"tenant", labels.first}, {"budget", labels.second}});
    gauge->Set(share);
  }
}

result<request_session> tenancy::authenticate(const request& req) {
  EDGE_ASSIGN_OR_RETURN(authenticated_tenant who, auth_.authenticate(req));
  return session_for(std::move(who));
}

bool tenancy::store_may_wait(bool uses_counters) const { return uses_counters && quotas_->may_block(); }

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

template <class Call>
asio::awaitable<std::optional<std::invoke_result_t<Call>>> tenancy::off_thread(Call call) {
  using answer = std::invoke_result_t<Call>;
  if (queued_calls_.fetch_add(1, std::memory_order_relaxed) >= max_queued_calls_) {
    queued_calls_.fetch_sub(1, std::memory_order_relaxed);
    co_return std::nullopt;
  }
  answer out = co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(answer)>(
      [this, &call](auto resume) {
        calls_->submit([this, call = std::move(call), resume = std::move(resume)]() mutable {
          answer result = call();
          const auto executor = asio::get_associated_executor(resume);
          asio::post(executor, [resume = std::move(resume), result = std::move(result)]() mutable {
            std::move(resume)(std::move(result));
          });
          queued_calls_.fetch_sub(1, std::memory_order_release);
        });
      },
      asio::use_awaitable);
  co_return out;
}

asio::awaitable<bool> tenancy::store_call(std::function<void()> call) {
  auto run = [call = std::move(call)] {
    call();
    return true;
  };
  const std::optional<bool> ran = co_await off_thread(std::move(run));
  co_return ran.has_value();
}

#pragma GCC diagnostic pop

void tenancy::drain_quota_calls() const {
  while (queued_calls_.load(std::memory_order_acquire) > 0) std::this_thread::sleep_for(drain_poll_interval);
}

quota_decision tenancy::store_unavailable(bool may_admit) const {
  quota_decision d;
  if (may_admit && fail_mode_ == quota_fail_mode::open) {
    d.allowed = true;  // uncounted: the reservation takes nothing, so its settlement gives nothing back
    return d;
  }
  d.limit = quota_limit::quota_store_unavailable;
  d.retry_after = std::chrono::seconds(1);
  d.message = "Quotas cannot be checked right now: too many quota store calls are waiting for the store. Please try "
              "again in 1s.";
  return d;
}

void tenancy::finish_later(quota_reservation reservation, std::int64_t used_tokens) {
  if (!quotas_->may_block()) {
    quotas_->finish(reservation, used_tokens);
    return;
  }
  calls_->submit([this, reservation = std::move(reservation), used_tokens] { quotas_->finish(reservation, used_tokens); });
}

void tenancy::count_refusal(const tenant_record& tenant, quota_limit limit, std::string_view api) {
  ledger_->record(tenant.id, usage_counts{.rejections = 1});
  if (metrics_ == nullptr) return;
  const std::string label = metrics_->tenant_labels.label(tenant.id);
  metrics_->quota_rejections.Add({{"tenant", label}, {"api", std::string(api)}, {"limit", std::string(to_string(limit))}})
      .Increment();
  metrics_->tenant_requests.Add({{"tenant", label}, {"api", std::string(api)}, {"outcome", "rejected"}}).Increment();
}

}  // namespace edge::gateway
