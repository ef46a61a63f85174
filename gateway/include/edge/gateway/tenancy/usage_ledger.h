// The usage ledger's write side: counts are recorded here (a map update under a mutex, no I/O),
// and a background thread adds what has accumulated to the tenant store's hourly rows at least
// every flush interval (1 s by default) and once more when the ledger stops.
//
// A request being served is metered (meter()): every flush also writes what its usage grew by
// since the previous one, and the rest when its meter ends. So a crash (kill -9) loses at most
// the last interval of any request's usage, however long the request runs; SIGTERM loses
// nothing. A meter may carry a daily-budget hold (usage_hold), which the flush that writes the
// meter's last usage releases in the same transaction.
//
// Each increment is filed under the UTC hour in which it was recorded (or, for a request's
// usage, checkpointed).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "edge/backend/engine/engine.h"
#include "edge/common/log.h"
#include "edge/common/status.h"
#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/tenant_store.h"

namespace edge::gateway {

// What the gateway knows of a request, to hold an engine's usage figures to.
struct usage_bounds {
  std::int64_t prompt_tokens = 0;           // the prompt as it tokenized it
  std::int64_t seen_completion_tokens = 0;  // completion tokens it saw generated
  std::int64_t max_tokens = 0;              // the most it asked for
};

// The usage to charge for `reported`: the prompt as the gateway tokenized it, completion tokens
// at least those it saw and at most max_tokens, cached tokens within the prompt. An engine's
// figures, a remote backend's above all, are its word only: a zero or negative count would let
// a tenant past its quotas.
backend::token_usage bounded_usage(const backend::token_usage& reported, const usage_bounds& bounds);

// One request's usage while it is served: the one record of it that the ledger's checkpoints,
// the quota settlement, the access log and the metrics all read. Written by whoever sees the
// request's tokens (the engine's event sink); thread-safe.
class request_usage {
 public:
  // The prompt as the gateway tokenized it, and the most completion tokens it may produce.
  request_usage(std::int64_t prompt_tokens, std::int64_t max_tokens);

  // `tokens` more completion tokens were generated.
  void add_completion(std::int64_t tokens);
  // The engine's figures when the request finished. They are taken within what the gateway
  // knows: the prompt is what it tokenized, completion tokens are at least those it saw
  // generated and at most max_tokens, cached tokens at most the prompt. Returns false when a
  // figure had to be corrected.
  bool finish(std::int64_t completion_tokens, std::int64_t cached_tokens);

  // requests = 1 and the tokens so far.
  usage_counts counts() const;
  std::int64_t charged_tokens() const;  // prompt + completion so far

 private:
  const std::int64_t prompt_;
  const std::int64_t max_tokens_;
  std::atomic<std::int64_t> completion_{0};
  std::atomic<std::int64_t> cached_{0};
};

class usage_ledger {
 public:
  static constexpr std::chrono::milliseconds default_flush_interval{1000};

  // `store` and `clock` must outlive the ledger. Nothing is flushed until start() or flush().
  usage_ledger(tenant_store& store, const time_source& clock,
               std::chrono::milliseconds flush_interval = default_flush_interval);
  // Stops the flushing thread and flushes what is left.
  ~usage_ledger();
  usage_ledger(const usage_ledger&) = delete;
  usage_ledger& operator=(const usage_ledger&) = delete;

  // Starts the background thread that flushes every interval, calling `after_flush` (if any)
  // with each periodic flush's outcome.
  void start(std::function<void(const status&)> after_flush = {});
  // Stops the thread (if started) and flushes. Idempotent; record() still works afterwards and
  // the next flush() or the destructor writes it.
  status stop();

  // Adds `counts` to the tenant's row for the current hour. Thread-safe, never blocks on I/O.
  void record(std::string_view tenant_id, const usage_counts& counts);

  // A request's usage, checkpointed at every flush until the meter ends (end(), or its
  // destruction), which records the rest and releases its hold. Move-only; `usage` must outlive
  // the meter's end.
  class meter {
   public:
    meter() = default;
    meter(meter&& other) noexcept;
    meter& operator=(meter&& other) noexcept;
    meter(const meter&) = delete;
    meter& operator=(const meter&) = delete;
    ~meter() { end(); }
    void end();

   private:
    friend class usage_ledger;
    meter(usage_ledger* ledger, std::uint64_t id) : ledger_(ledger), id_(id) {}
    usage_ledger* ledger_ = nullptr;
    std::uint64_t id_ = 0;
  };
  // `hold_id` names a hold already written to the store (add_hold), or is empty. With `labels`
  // (an API key), the usage is also filed under them for the spend view.
  meter open_meter(std::string tenant_id, const request_usage& usage, std::string hold_id = {},
                   usage_labels labels = {});
  // Requests being metered now.
  std::size_t open_meters() const;

  // Writes everything recorded so far to the store now; when it returns ok, the store's rows
  // include every record() that happened before the call. On failure the batch is kept and
  // written first, unchanged and under the same id, by the next flush (the store adds a batch
  // once, so a write whose answer was lost is not counted twice); what is recorded meanwhile
  // waits behind it. What is kept lives in memory only: a crash while the store is unreachable
  // loses the usage recorded since it became unreachable.
  status flush();

  // Buffered (tenant, hour) rows not yet written to the store: recorded since the last flush, and
  // those of a batch whose write failed (a flush in progress holds its own).
  std::size_t pending_rows() const;

 private:
  void run(std::stop_token stop, const std::function<void(const status&)>& after_flush);

  tenant_store& store_;
  const time_source& clock_;
  std::chrono::milliseconds interval_;
  logger log_{"usage"};

  using pending_map = std::map<std::string, std::map<unix_time, usage_counts>, std::less<>>;
  struct detail_key {
    std::string tenant_id;
    unix_time hour_start;
    usage_labels labels;
    friend auto operator<=>(const detail_key&, const detail_key&) = default;
  };
  using detail_map = std::map<detail_key, usage_counts>;
  struct open_request {
    std::string tenant_id;
    const request_usage* usage;
    usage_counts recorded;  // what earlier checkpoints recorded of it
    std::string hold_id;
    usage_labels labels;
  };
  // Adds what `request` grew by since it was last recorded to `into` (and, with labels, to
  // `details`), under `hour`.
  static void checkpoint(open_request& request, unix_time hour, pending_map& into, detail_map& details);
  static void add(pending_map& into, std::string_view tenant_id, unix_time hour, const usage_counts& counts);
  void end_meter(std::uint64_t id);

  mutable std::mutex mutex_;
  // tenant -> hour start -> counts not yet written
  pending_map pending_;                               // guarded by mutex_
  detail_map pending_details_;                        // guarded by mutex_: the served part of pending_, by labels
  std::map<std::uint64_t, open_request> open_;        // guarded by mutex_
  std::uint64_t next_meter_id_ = 1;                   // guarded by mutex_
  std::vector<std::string> released_holds_;           // guarded by mutex_: not yet written
  std::mutex flush_mutex_;  // one flush at a time, so a flush returns only after earlier ones landed
  std::optional<usage_batch> unacknowledged_;       // guarded by flush_mutex_: written first by the next flush
  std::atomic<std::size_t> unacknowledged_rows_{0};  // its rows, for pending_rows()
  const std::string batch_prefix_;                   // random: batch ids differ across processes
  std::uint64_t batches_ = 0;                        // guarded by flush_mutex_
  std::condition_variable_any wake_;
  std::jthread thread_;
};

}  // namespace edge::gateway
