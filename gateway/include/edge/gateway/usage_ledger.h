// The usage ledger's write side: requests record their usage here (a map update under a
// mutex, no I/O), and a background thread adds what has accumulated to the tenant store's
// hourly rows at least every flush interval (1 s by default) and once more when the ledger
// stops. A crash loses at most the last interval; SIGTERM loses nothing.
//
// Each increment is filed under the UTC hour in which it was recorded.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>

#include "edge/common/log.h"
#include "edge/common/status.h"
#include "edge/common/time_source.h"
#include "edge/gateway/tenant_store.h"

namespace edge::gateway {

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

  // Starts the background thread that flushes every interval.
  void start();
  // Stops the thread (if started) and flushes. Idempotent; record() still works afterwards and
  // the next flush() or the destructor writes it.
  status stop();

  // Adds `counts` to the tenant's row for the current hour. Thread-safe, never blocks on I/O.
  void record(std::string_view tenant_id, const usage_counts& counts);

  // Writes everything recorded so far to the store now; when it returns ok, the store's rows
  // include every record() that happened before the call. On failure the increments are kept
  // for the next flush.
  status flush();

  // Buffered (tenant, hour) rows not yet handed to the store (a flush in progress holds its own).
  std::size_t pending_rows() const;

 private:
  void run(std::stop_token stop);

  tenant_store& store_;
  const time_source& clock_;
  std::chrono::milliseconds interval_;
  logger log_{"usage"};

  mutable std::mutex mutex_;
  // tenant -> hour start -> counts not yet written
  using pending_map = std::map<std::string, std::map<unix_time, usage_counts>, std::less<>>;
  pending_map pending_;  // guarded by mutex_
  std::mutex flush_mutex_;  // one flush at a time, so a flush returns only after earlier ones landed
  std::condition_variable_any wake_;
  std::jthread thread_;
};

}  // namespace edge::gateway
