// Per-tenant quota counters in Redis, so that every gateway replica using the same Redis
// enforces one limit: a tenant with 60 requests/min gets 60 through two gateways, not 120.
//
// Each phase is one atomic Lua script (EVALSHA; on NOSCRIPT the script is loaded again with
// SCRIPT LOAD in the same pipeline) that reads, judges and writes a tenant's counters, and a
// phase whose limits the tenant does not have makes no round trip (a tenant without
// Redis-held limits never touches Redis). Rates and the UTC day come from the Redis server's
// clock (TIME), never a gateway's, so gateways with skewed clocks still agree. The decisions,
// x-ratelimit-* figures and messages are those of in_memory_quota_store (both judge with
// src/quota_rules.h).
//
// Keys, per tenant (the {tenant} hash tag keeps them in one Redis Cluster slot; each quota kind
// names the key of its counters in quota_kinds.h):
//   <prefix>{tenant}:rate    hash: GCRA arrival time, token bucket level and refill time;
//                            expires a minute after its last write (a minute idle = full)
//   <prefix>{tenant}:daily   hash: UTC day and tokens reserved or spent; expires after that day
//   <prefix>{tenant}:slots   sorted set: one member per request in flight, the reservation id,
//                            scored by its lease deadline (server ms). The gateway holding a slot
//                            renews its lease every slot_lease / 3 while the request runs; a
//                            gateway that dies stops renewing, and its slots are dropped by the
//                            next admission check after slot_lease. The set expires slot_lease
//                            after its last write.
//   <prefix>{tenant}:reservation:<id>
//                            hash: the tokens one request reserved (bucket, daily, day), taken
//                            atomically with them; settling gives them back and deletes them, so
//                            a repeated settle or finish is a no-op. Expires a day and an hour
//                            after its last write (past any day it refers to).
//
// Calls that may still run. A call that fails after it was sent (a timeout, or a Redis stopped
// with SIGSTOP that executes it when it resumes) may have taken a slot or tokens that no
// request holds. Each such admission is compensated: a close of its reservation id is queued,
// giving back whatever the id took and leaving a mark that stops the call from taking anything
// if it runs later. A settle, release or finish that fails is queued too. A background thread
// applies the queue as soon as Redis answers (retrying with a backoff, 50 ms doubling to 1 s);
// the queue is bounded (max_pending; past it calls are dropped, counted and logged; a slot then
// lapses with its lease), edgeinfer_quota_store_pending shows its length, and a log line says
// when it starts to fill and when it has been applied.
//
// Outage: when Redis cannot be reached within the timeouts, try_admit and try_reserve follow
// fail_mode: open admits without counting (no x-ratelimit-* headers), closed refuses with
// quota_limit::quota_store_unavailable (503, retry-after 1 s). Either way a request that no
// counter could ever admit (over the per-request limits, more than the whole tokens/min or daily
// budget) is still refused. One log line when Redis goes down and one when it is back;
// edgeinfer_quota_store_up and edgeinfer_quota_store_errors_total{operation}. Reconnection is
// automatic, on use, with a backoff.
//
// Every call may block its thread for about connect_timeout + 2 x command_timeout (may_block()).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "edge/common/status.h"
#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/quota.h"

namespace edge::monitoring {
struct gateway_metrics;
}

namespace edge::gateway {

class redis_client;
struct redis_reply;

enum class quota_fail_mode {
  open,    // admit without counting while the store is down
  closed,  // refuse with 503 while the store is down
};
std::string_view to_string(quota_fail_mode mode);

// redis://HOST[:PORT][/DB], as --quota-store takes it.
struct redis_address {
  std::string host;
  std::uint16_t port = 6379;
  std::int64_t db = 0;
  std::string to_string() const;  // redis://HOST:PORT/DB
};
// Parses a redis:// URL; anything else (a password, rediss://, a query) is a clear error.
result<redis_address> parse_redis_url(std::string_view url);

struct redis_quota_options {
  redis_address address;
  quota_fail_mode fail_mode = quota_fail_mode::open;
  std::chrono::milliseconds connect_timeout{200};
  std::chrono::milliseconds command_timeout{100};
  std::size_t max_connections = 16;
  // Calls queued at most while Redis does not answer (settlements, compensations).
  std::size_t max_pending = 100'000;
  // How long a slot of a request in flight outlives a gateway that stopped renewing it (died, hung).
  std::chrono::milliseconds slot_lease{std::chrono::seconds(30)};
  // Prepended to every key, so that several deployments (or tests) can share one Redis.
  std::string key_prefix = "edgeinfer:quota:";
  // Null (production): the Redis server's clock. Tests may pass a clock to drive the scripts'
  // idea of now (monotonic for rates, calendar for the day), which must then outlive the store.
  // The store's own waits (lease renewals, retries while Redis is down) are real waits on a
  // condition variable, timed by the process's clock (process_time()) whatever is passed here.
  const time_source* clock = nullptr;
};

class redis_quota_store final : public quota_store {
 public:
  // Connects once to say in the log whether Redis answers; a Redis that is down is not an
  // error here (the fail mode applies until it is back). `metrics` may be null.
  static std::unique_ptr<redis_quota_store> create(redis_quota_options options, monitoring::gateway_metrics* metrics);
  // Stops the background thread after one more attempt at what is queued; what Redis does not
  // take then is lost (a slot so lost lapses with its lease).
  ~redis_quota_store() override;

  quota_decision try_admit(const admit_request& request) override;
  quota_decision try_reserve(const quota_reservation& held, const quota_request& request) override;
  void settle(const quota_reservation& reservation, std::int64_t used_tokens) override;
  void release(const quota_reservation& reservation) override;
  void finish(const quota_reservation& reservation, std::int64_t used_tokens) override;  // one round trip
  bool may_block() const override { return true; }

  // Whether the last call reached Redis.
  bool up() const { return up_.load(std::memory_order_acquire); }
  // Calls queued until Redis answers.
  std::size_t pending() const;
  // Renews the leases of the slots this store holds now (the background thread does this every
  // slot_lease / 3). Exposed for tests.
  void renew_slots();
  const redis_quota_options& options() const { return options_; }

 private:
  redis_quota_store(redis_quota_options options, monitoring::gateway_metrics* metrics);

  struct script {
    std::string_view body;
    std::string sha;  // SHA1 of body, learned from SCRIPT LOAD; guarded by scripts_mutex_
  };
  // A close script call waiting for Redis to answer.
  struct pending_call {
    bool compensation = false;  // true: undoes a call that may have run; false: a settlement that failed
    std::vector<std::string> call;
  };
  // Runs `calls` (each: keys, then arguments) of one script in one pipeline: their replies in
  // that order. On NOSCRIPT the script is loaded and the calls that missed it are sent again.
  result<std::vector<redis_reply>> eval(script& s, const std::vector<std::vector<std::string>>& calls,
                                        std::size_t keys_per_call);
  // A close script call for reservation `id` of `tenant_id` (see redis_quota_scripts.h).
  std::vector<std::string> close_call(std::string_view tenant_id, std::string_view id, std::string used_tokens,
                                      bool release_slot, std::string_view cancel) const;
  // Runs a close call now; queued if it fails.
  void close_now(std::string_view operation, std::vector<std::string> call);
  void enqueue(pending_call call);
  bool apply_pending();  // one batch of the queue, false when none was applied; background thread only
  void forget_slot(const quota_reservation& reservation);  // no longer renewed
  std::string key(std::string_view tenant_id, std::string_view part) const;
  std::string record_key(std::string_view tenant_id, std::string_view id) const;
  // The keys a script is given: the tenant's counter keys of `phase` (of every phase when
  // absent; redis_scripts::counter_keys), then the record of reservation `id`.
  std::vector<std::string> script_keys(std::string_view tenant_id, std::optional<quota_phase> phase,
                                       std::string_view id) const;
  // The scripts' idea of now: "" (server TIME) or, with a test clock, its readings.
  std::vector<std::string> now_arguments() const;
  void succeeded();  // Redis answered: up again if it was down
  void failed(std::string_view operation, const status& why);  // counted; down if it was up
  // What a phase answers while Redis cannot be reached: `idle` (the phase judged against
  // counters that allow everything a counter could) refused for what it is, else admitted
  // holding `uncounted` (fail mode open) or refused as unavailable (closed).
  quota_decision unavailable_decision(quota_decision idle, quota_reservation uncounted) const;
  void background_loop();

  const redis_quota_options options_;
  monitoring::gateway_metrics* const metrics_;
  std::unique_ptr<redis_client> redis_;
  std::mutex scripts_mutex_;
  script admit_script_;
  script reserve_script_;
  script close_script_;
  script renew_script_;

  std::atomic<bool> up_{true};
  std::mutex state_mutex_;  // orders the down / up log lines
  std::chrono::steady_clock::time_point down_since_;  // guarded by state_mutex_
  std::int64_t failures_while_down_ = 0;              // guarded by state_mutex_

  // The background thread's work: renewing held slots, applying queued calls.
  mutable std::mutex background_mutex_;
  std::map<std::string, std::set<std::string>, std::less<>> held_slots_;  // tenant -> reservation ids; guarded
  std::deque<pending_call> pending_;                                      // guarded by background_mutex_
  std::chrono::steady_clock::time_point retry_at_;      // next attempt at pending_; guarded
  std::chrono::milliseconds retry_backoff_{0};          // guarded by background_mutex_
  std::chrono::steady_clock::time_point pending_since_; // when pending_ stopped being empty; guarded
  std::int64_t applied_ = 0;      // queued calls applied since pending_since_; guarded
  std::int64_t compensated_ = 0;  // of which compensations; guarded
  std::int64_t dropped_ = 0;      // calls dropped since pending_since_ (the queue was full); guarded
  std::condition_variable background_wakeup_;
  bool stopping_ = false;  // guarded by background_mutex_
  std::thread background_;
};

}  // namespace edge::gateway
