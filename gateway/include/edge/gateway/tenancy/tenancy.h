// Tenancy on the request path: who is calling, may they, and what they used. One object that
// owns the tenant store, the quota counters and the usage ledger, and hands each request a
// session (request_session) that the OpenAI routes drive:
//
//   auto session = tenants.authenticate(ex.req());         // snapshot lookup, no SQLite
//   if (!session.ok()) { ... 401 ... }
//   if (auto refused = co_await session->admit()) { ... 429 ... }       // before the body is parsed
//   ... parse the body, tokenize the prompt, resolve max_tokens (default_max_tokens) ...
//   if (auto refused = co_await session->reserve(prompt, max_tokens, n)) { ... 429 / 400 ... }
//   session->add_headers(response);                        // x-ratelimit-* on every answer
//   engine->submit(request, session->metered(sink));       // the engine's events count the tokens
//
// admit() judges the cheap limits (requests per minute, concurrency) right after
// authentication, so a request refused later for its body or its tokens still counts as a
// request; reserve() judges the token limits once the prompt is tokenized, reserving prompt +
// n × max_tokens (a request for n choices may generate max_tokens for each). Quota store calls that may wait on I/O (Redis) run on a small pool of their own,
// never on the calling (HTTP) thread: the coroutine waits, the thread serves others.
//
// The request is settled when both the session and the engine's sink have let go, so tokens the
// engine computed after the client left are charged too: the quota store refunds the unused
// reservation and frees the slot, the usage ledger records the rest of the usage (it has
// checkpointed the usage every flush interval while the request ran), the metrics count the
// request. With the counters in this process and a daily budget, the reservation is first written
// to the store as a hold, so that a crash cannot let the tenant overrun the budget after a
// restart (usage_ledger.h).
//
// Thread-safe. Must outlive every session and every engine sink a session metered.
#pragma once

#include <boost/asio/awaitable.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "edge/backend/engine/engine.h"
#include "edge/common/status.h"
#include "edge/common/thread_pool.h"
#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/auth.h"
#include "edge/gateway/tenancy/quota.h"
#include "edge/gateway/tenancy/quota_response.h"
#include "edge/gateway/tenancy/quota_stores.h"
#include "edge/gateway/tenancy/tenant_store.h"
#include "edge/gateway/tenancy/usage_ledger.h"

namespace edge::monitoring {
struct gateway_metrics;
}
namespace prometheus {
class Gauge;
}

namespace edge::gateway {

class tenancy;

// How a request ended, as edgeinfer_tenant_requests_total{outcome} counts it.
enum class request_outcome {
  cancelled,  // the client left before the end (the default until the route says otherwise)
  completed,  // stop or length
  failed,     // the engine refused or failed it
};

// One request's hold on its tenant: identity, admission, reservation, usage, settlement.
// Move-only; connection strand only (what metered() hands the engine is thread-safe).
class request_session {
 public:
  request_session(request_session&&) noexcept;
  request_session& operator=(request_session&&) noexcept;
  ~request_session();

  const tenant_record& tenant() const { return *who_.tenant; }
  const std::string& key_id() const { return who_.key_id; }

  // Phase 1: requests per minute (the request is counted from here on) and a concurrency slot.
  // Nothing when admitted; else the refusal, already counted in the ledger and the metrics.
  // `api`: the API the request speaks, the metrics' api label (a name the routes fix:
  // chat_completions, completions, messages, count_tokens, responses).
  boost::asio::awaitable<std::optional<quota_decision>> admit(std::string_view api);

  // The completion limit (per choice) of a request for `choices` choices that did not ask for
  // one: `room` (what the context leaves after the prompt) within the tenant's limits, so that
  // the default alone never refuses it.
  std::int64_t default_max_tokens(std::int64_t prompt_tokens, std::int64_t room, std::int64_t choices = 1) const;

  // Phase 2, after admit(): the largest max_tokens, tokens per minute and the daily budget,
  // reserving prompt + choices × max_tokens. Nothing when admitted; else the refusal (counted).
  // The request's usage may then count up to choices × max_tokens completion tokens.
  // `model`: the served model's id, which the spend view files the usage under (with the key and
  // the API).
  boost::asio::awaitable<std::optional<quota_decision>> reserve(std::int64_t prompt_tokens, std::int64_t max_tokens,
                                                                std::int64_t choices = 1, std::string_view model = {});

  // The x-ratelimit-* headers of both phases, for every answer to the request.
  void add_headers(http::response_header<>& header) const;

  // After reserve(): `sink` wrapped so that the request's usage counts every token the engine
  // reports (including those no client reads) and the settlement waits for the engine's last
  // event. Thread-safe to call from the producer's thread, as sinks are.
  backend::event_sink metered(backend::event_sink sink) const;
  // After reserve(): the request's usage so far (the one record; see usage_ledger.h).
  const request_usage& usage() const;
  void set_outcome(request_outcome outcome);

 private:
  friend class tenancy;
  struct served;  // what the session and the engine's sink share until both let go
  request_session(tenancy& owner, authenticated_tenant who);

  tenancy* owner_;
  authenticated_tenant who_;
  std::optional<rate_limit_status> requests_;  // phase 1's header figures
  std::optional<rate_limit_status> tokens_;    // phase 2's
  bool uncounted_ = false;                     // admitted while the store could not be asked
  std::string api_;                            // admit()'s
  std::shared_ptr<served> served_;             // engaged from admit() on
};

struct tenancy_options {
  std::filesystem::path state_dir;
  std::string tenant_store_url;  // empty: SQLite in state_dir; else tenant_store_options::url
  std::chrono::milliseconds tenant_store_timeout{2000};  // tenant_store_options::query_timeout
  std::chrono::milliseconds ledger_flush_interval = usage_ledger::default_flush_interval;
  quota_store_options quota_store;  // in memory unless it names Redis
  // Threads for quota store calls that may wait on I/O, and how many calls may wait for them at
  // once; past that, a call is answered as if the store were down (--quota-fail-mode).
  std::size_t quota_call_threads = 4;
  std::size_t max_queued_quota_calls = 256;
  // Keys given at start (--api-key), the default tenant's: only their digests are kept (auth.h).
  std::vector<std::string> api_keys;
};

class tenancy {
 public:
  // Opens (or creates) the tenant store (tenant_store_options), makes the quota store, seeds today's
  // daily budgets when the counters are in memory (from the ledger, plus the holds a crash left
  // behind, so that a restart hands out neither a second budget nor a share of one a crashed
  // request may have used; in Redis the shared counter is the truth), and starts the ledger's
  // flushing.
  // `clock` and `metrics` (may be null) must outlive the result.
  static result<std::unique_ptr<tenancy>> open(const tenancy_options& options, const time_source& clock,
                                               monitoring::gateway_metrics* metrics);
  // Finishes the quota calls still queued, stops the ledger and flushes it.
  ~tenancy();

  // The request's session, or why its key is refused (401). Thread-safe; no I/O.
  result<request_session> authenticate(const request& req);
  // The session of a caller already authenticated.
  request_session session_for(authenticated_tenant who) { return request_session(*this, std::move(who)); }

  tenant_store& store() { return *store_; }
  quota_store& quotas() { return *quotas_; }
  usage_ledger& ledger() { return *ledger_; }
  const time_source& clock() const { return clock_; }

  // Waits until no store call is queued or running: call it after the HTTP server's threads
  // stopped and before the server is destroyed, as a finished call resumes its request there.
  void drain_quota_calls() const;

  // Runs `call` (a tenant store call: SQLite may wait on the disk) on the store threads and
  // resumes the caller on its own executor once it has run; false, without running it, when
  // max_queued_quota_calls are queued already.
  boost::asio::awaitable<bool> store_call(std::function<void()> call);

 private:
  // Runs `call` on the pool; the awaiting coroutine resumes on its own executor. nullopt when
  // max_queued_quota_calls are queued already.
  template <class Call>
  boost::asio::awaitable<std::optional<std::invoke_result_t<Call>>> off_thread(Call call);

  friend class request_session;
  tenancy(const tenancy_options& options, std::unique_ptr<tenant_store> store, std::unique_ptr<quota_store> quotas,
          const time_source& clock, monitoring::gateway_metrics* metrics);

  // Whether a phase's quota call may wait on I/O: the store may block and the phase uses counters.
  bool store_may_wait(bool uses_counters) const;
  // The answer when the store cannot be asked: --quota-fail-mode open admits uncounted (when
  // `may_admit`), closed refuses with quota_store_unavailable.
  quota_decision store_unavailable(bool may_admit) const;
  // Runs `finish` on the pool when the store may block, else here. Never waits.
  void finish_later(quota_reservation reservation, std::int64_t used_tokens);
  // A refusal by one of the tenant's limits: a rejection in the ledger and the metrics.
  void count_refusal(const tenant_record& tenant, quota_limit limit, std::string_view api);
  // The tenant store's health and the ledger's backlog into the metrics, and the tenants' budget
  // shares every budget_refresh_interval or when the tenants changed (the ledger's thread, after
  // each flush).
  void report_store_health();
  void report_budgets();

  const time_source& clock_;
  monitoring::gateway_metrics* metrics_;
  std::unique_ptr<tenant_store> store_;
  std::unique_ptr<quota_store> quotas_;
  std::unique_ptr<usage_ledger> ledger_;
  authenticator auth_;
  const bool holds_daily_budget_;  // counters in memory: daily reservations are written as holds
  const quota_fail_mode fail_mode_;
  reservation_ids reservation_ids_;
  std::uint64_t reported_store_failures_ = 0;  // ledger thread only: tenant_store_health::failures counted so far
  std::chrono::steady_clock::time_point budgets_reported_at_{};  // ledger thread only
  std::uint64_t budgets_reported_version_ = 0;                   // ledger thread only: the snapshot's
  std::map<std::pair<std::string, std::string>, prometheus::Gauge*> budget_gauges_;  // ledger thread only: by (label, budget)
  const std::size_t max_queued_calls_;
  std::atomic<std::size_t> queued_calls_{0};
  std::unique_ptr<thread_pool> calls_;  // declared last, destroyed first: what is queued runs while the rest exists
};

}  // namespace edge::gateway
