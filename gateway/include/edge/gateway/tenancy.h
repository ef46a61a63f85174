// Tenancy on the request path: who is calling, may they, and what they used. One object that
// owns the tenant store, the quota counters and the usage ledger, and the small API the OpenAI
// routes call:
//
//   auto who = tenants.authenticate(ex.req());                  // snapshot lookup, no SQLite
//   if (!who.ok()) { co_await ex.respond(unauthorized_response(who.error())); co_return; }
//   ... parse the body, tokenize the prompt ...
//   admission admitted = tenants.admit(*who, prompt_tokens, max_tokens);
//   if (!admitted.allowed()) {                                 // counted as a rejection already
//     co_await ex.respond(quota_refusal_response(admitted.decision)); co_return;
//   }
//   set_rate_limit_headers(res_or_stream_header, admitted.decision);
//   request.tenant = who->tenant->id; request.weight = who->tenant->weight;
//   ... on each engine event: admitted.lease->record(usage so far) ...
//   // When the lease is destroyed (the request ended in any way, the client included), the
//   // unused reservation is refunded, the max_concurrent slot released, and the usage written
//   // to the ledger (requests +1, prompt/completion/cached tokens).
//
// The parts stay reachable (store(), quotas(), ledger()) for the admin API and for routes that
// need finer control: quotas().try_admit / try_reserve / settle / release, ledger().record(tenant, counts).
//
// Thread-safe. Must outlive every request that holds a lease.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>

#include "edge/common/status.h"
#include "edge/common/time_source.h"
#include "edge/gateway/auth.h"
#include "edge/gateway/quota.h"
#include "edge/gateway/quota_response.h"
#include "edge/gateway/quota_stores.h"
#include "edge/gateway/tenant_store.h"
#include "edge/gateway/usage_ledger.h"

namespace edge::monitoring {
struct gateway_metrics;
}

namespace edge::gateway {

// An admitted request's hold on its tenant's quotas. Move-only; settles when destroyed.
class quota_lease {
 public:
  quota_lease(quota_store& quotas, usage_ledger& ledger, quota_reservation reservation);
  quota_lease(quota_lease&& other) noexcept;
  quota_lease& operator=(quota_lease&&) = delete;
  quota_lease(const quota_lease&) = delete;
  quota_lease& operator=(const quota_lease&) = delete;
  ~quota_lease();

  // What the request has used so far (replaces what was recorded before): prompt, completion and
  // cached tokens. The request is charged prompt + completion; `requests` and `rejections` are
  // ignored.
  void record(const usage_counts& used);
  const usage_counts& used() const { return used_; }
  const quota_reservation& reservation() const { return reservation_; }

  // Settles now instead of at destruction. Idempotent.
  void finish();

 private:
  quota_store* quotas_;
  usage_ledger* ledger_;
  quota_reservation reservation_;
  usage_counts used_;
  bool finished_ = false;
};

struct admission {
  quota_decision decision;          // headers for the response, or why it was refused
  std::optional<quota_lease> lease; // engaged when admitted
  bool allowed() const { return decision.allowed; }
};

struct tenancy_options {
  std::filesystem::path state_dir;
  std::chrono::milliseconds ledger_flush_interval = usage_ledger::default_flush_interval;
  quota_store_options quota_store;  // in memory unless it names Redis
};

class tenancy {
 public:
  // Opens (or creates) the store in options.state_dir, makes the quota store, seeds today's
  // daily budgets from the ledger when the counters are in memory (so a restart does not hand
  // out a second budget; in Redis the shared counter is the truth), and starts the ledger's
  // flushing.
  // `clock` and `metrics` (may be null) must outlive the result.
  static result<std::unique_ptr<tenancy>> open(const tenancy_options& options, const time_source& clock,
                                               monitoring::gateway_metrics* metrics);
  // Stops the ledger and flushes it.
  ~tenancy();

  result<authenticated_tenant> authenticate(const request& req) const { return auth_.authenticate(req); }

  // Admits a request that will read `prompt_tokens` and may write up to `max_tokens`. A refusal
  // by a limit is recorded in the ledger (rejections) and in edgeinfer_quota_rejections_total;
  // one because the quota store is down only in the store's own metrics.
  admission admit(const authenticated_tenant& who, std::int64_t prompt_tokens, std::int64_t max_tokens);

  tenant_store& store() { return *store_; }
  quota_store& quotas() { return *quotas_; }
  usage_ledger& ledger() { return *ledger_; }
  const time_source& clock() const { return clock_; }

 private:
  tenancy(std::unique_ptr<tenant_store> store, std::unique_ptr<quota_store> quotas, const time_source& clock,
          monitoring::gateway_metrics* metrics, std::chrono::milliseconds flush_interval);

  const time_source& clock_;
  monitoring::gateway_metrics* metrics_;
  std::unique_ptr<tenant_store> store_;
  std::unique_ptr<quota_store> quotas_;
  reservation_ids reservation_ids_;
  std::unique_ptr<usage_ledger> ledger_;
  authenticator auth_;
};

}  // namespace edge::gateway
