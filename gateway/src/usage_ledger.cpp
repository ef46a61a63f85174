#include "edge/gateway/usage_ledger.h"

#include <vector>

namespace edge::gateway {

usage_ledger::usage_ledger(tenant_store& store, const time_source& clock, std::chrono::milliseconds flush_interval)
    : store_(store), clock_(clock), interval_(flush_interval) {}

usage_ledger::~usage_ledger() {
  if (status stopped = stop(); !stopped.ok()) {
    log_.error("usage not written on shutdown ({} rows lost): {}", pending_rows(), stopped.message());
  }
}

void usage_ledger::start() {
  if (thread_.joinable()) return;
  thread_ = std::jthread([this](std::stop_token stop) { run(std::move(stop)); });
}

status usage_ledger::stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    wake_.notify_all();
    thread_.join();
  }
  return flush();
}

void usage_ledger::run(std::stop_token stop) {
  while (!stop.stop_requested()) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, stop, interval_, [] { return false; });
    }
    if (stop.stop_requested()) break;  // stop() flushes
    if (status flushed = flush(); !flushed.ok()) {
      log_.warn("usage flush failed, retrying in {}ms: {}", interval_.count(), flushed.message());
    }
  }
}

void usage_ledger::record(std::string_view tenant_id, const usage_counts& counts) {
  if (counts.empty()) return;
  const unix_time hour = hour_start_of(to_unix_seconds(clock_.system_time()));
  std::lock_guard lock(mutex_);
  auto it = pending_.find(tenant_id);
  if (it == pending_.end()) it = pending_.emplace(std::string(tenant_id), std::map<unix_time, usage_counts>{}).first;
  it->second[hour] += counts;
}

status usage_ledger::flush() {
  std::lock_guard flushing(flush_mutex_);
  pending_map taken;
  {
    std::lock_guard lock(mutex_);
    taken.swap(pending_);
  }
  if (taken.empty()) return {};
  std::vector<usage_row> rows;
  for (const auto& [tenant, hours] : taken) {
    for (const auto& [hour, counts] : hours) rows.push_back({tenant, hour, counts});
  }
  status written = store_.add_usage(rows);
  if (!written.ok()) {
    // Put the increments back (adding to anything recorded meanwhile) for the next attempt.
    std::lock_guard lock(mutex_);
    for (const auto& [tenant, hours] : taken) {
      auto& into = pending_[tenant];
      for (const auto& [hour, counts] : hours) into[hour] += counts;
    }
  }
  return written;
}

std::size_t usage_ledger::pending_rows() const {
  std::lock_guard lock(mutex_);
  std::size_t rows = 0;
  for (const auto& [tenant, hours] : pending_) rows += hours.size();
  return rows;
}

}  // namespace edge::gateway
