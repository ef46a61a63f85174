#include "edge/gateway/tenancy/usage_ledger.h"

#include <algorithm>
#include <vector>

#include "edge/common/format.h"

namespace edge::gateway {

request_usage::request_usage(std::int64_t prompt_tokens, std::int64_t max_tokens)
    : prompt_(std::max<std::int64_t>(prompt_tokens, 0)), max_tokens_(std::max<std::int64_t>(max_tokens, 0)) {}

void request_usage::add_completion(std::int64_t tokens) {
  if (tokens <= 0) return;
  // Never past max_tokens: a producer that reports more is not believed.
  std::int64_t seen = completion_.load(std::memory_order_relaxed);
  while (!completion_.compare_exchange_weak(seen, std::min(seen + tokens, max_tokens_), std::memory_order_relaxed)) {
  }
}

backend::token_usage bounded_usage(const backend::token_usage& reported, const usage_bounds& bounds) {
  const std::int64_t seen = bounds.seen_completion_tokens;
  return {.prompt_tokens = bounds.prompt_tokens,
          .completion_tokens = std::clamp(reported.completion_tokens, seen, std::max(seen, bounds.max_tokens)),
          .cached_tokens = std::clamp<std::int64_t>(reported.cached_tokens, 0, bounds.prompt_tokens)};
}

bool request_usage::finish(std::int64_t completion_tokens, std::int64_t cached_tokens) {
  const backend::token_usage charged =
      bounded_usage({.prompt_tokens = prompt_, .completion_tokens = completion_tokens, .cached_tokens = cached_tokens},
                    {.prompt_tokens = prompt_,
                     .seen_completion_tokens = completion_.load(std::memory_order_relaxed),
                     .max_tokens = max_tokens_});
  completion_.store(charged.completion_tokens, std::memory_order_relaxed);
  cached_.store(charged.cached_tokens, std::memory_order_relaxed);
  return charged.completion_tokens == completion_tokens && charged.cached_tokens == cached_tokens;
}

usage_counts request_usage::counts() const {
  return {.requests = 1,
          .prompt_tokens = prompt_,
          .completion_tokens = completion_.load(std::memory_order_relaxed),
          .cached_tokens = cached_.load(std::memory_order_relaxed)};
}

std::int64_t request_usage::charged_tokens() const { return prompt_ + completion_.load(std::memory_order_relaxed); }

usage_ledger::meter::meter(meter&& other) noexcept
    : ledger_(std::exchange(other.ledger_, nullptr)), id_(other.id_) {}

usage_ledger::meter& usage_ledger::meter::operator=(meter&& other) noexcept {
  if (this != &other) {
    end();
    ledger_ = std::exchange(other.ledger_, nullptr);
    id_ = other.id_;
  }
  return *this;
}

void usage_ledger::meter::end() {
  if (ledger_ == nullptr) return;
  std::exchange(ledger_, nullptr)->end_meter(id_);
}

usage_ledger::usage_ledger(tenant_store& store, const time_source& clock, std::chrono::milliseconds flush_interval)
    : store_(store), clock_(clock), interval_(flush_interval), batch_prefix_(generate_secret_text(9)) {}

usage_ledger::~usage_ledger() {
  if (status stopped = stop(); !stopped.ok()) {
    log_.error("usage not written on shutdown ({} rows lost): {}", pending_rows(), stopped.message());
  }
}

void usage_ledger::start(std::function<void(const status&)> after_flush) {
  if (thread_.joinable()) return;
  thread_ = std::jthread(
      [this, after_flush = std::move(after_flush)](std::stop_token stop) { run(std::move(stop), after_flush); });
}

status usage_ledger::stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    wake_.notify_all();
    thread_.join();
  }
  return flush();
}

void usage_ledger::run(std::stop_token stop, const std::function<void(const status&)>& after_flush) {
  while (!stop.stop_requested()) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait_for(lock, stop, interval_, [] { return false; });
    }
    if (stop.stop_requested()) break;  // stop() flushes
    const status flushed = flush();
    if (!flushed.ok()) log_.warn("usage flush failed, retrying in {}ms: {}", interval_.count(), flushed.message());
    if (after_flush) after_flush(flushed);
  }
}

void usage_ledger::add(pending_map& into, std::string_view tenant_id, unix_time hour, const usage_counts& counts) {
  if (counts.empty()) return;
  auto it = into.find(tenant_id);
  if (it == into.end()) it = into.emplace(std::string(tenant_id), std::map<unix_time, usage_counts>{}).first;
  it->second[hour] += counts;
}

void usage_ledger::record(std::string_view tenant_id, const usage_counts& counts) {
  const unix_time hour = hour_start_of(to_unix_seconds(clock_.system_time()));
  std::lock_guard lock(mutex_);
  add(pending_, tenant_id, hour, counts);
}

void usage_ledger::checkpoint(open_request& request, unix_time hour, pending_map& into, detail_map& details) {
  const usage_counts now = request.usage->counts();
  // Counts only grow; a figure that moved down (a corrected report) is not taken back here.
  const auto grown = [](std::int64_t now_value, std::int64_t& recorded) {
    const std::int64_t delta = std::max<std::int64_t>(now_value - recorded, 0);
    recorded += delta;
    return delta;
  };
  usage_counts delta;
  delta.requests = grown(now.requests, request.recorded.requests);
  delta.prompt_tokens = grown(now.prompt_tokens, request.recorded.prompt_tokens);
  delta.completion_tokens = grown(now.completion_tokens, request.recorded.completion_tokens);
  delta.cached_tokens = grown(now.cached_tokens, request.recorded.cached_tokens);
  add(into, request.tenant_id, hour, delta);
  if (!delta.empty() && !request.labels.key_id.empty()) details[{request.tenant_id, hour, request.labels}] += delta;
}

usage_ledger::meter usage_ledger::open_meter(std::string tenant_id, const request_usage& usage, std::string hold_id,
                                             usage_labels labels) {
  std::lock_guard lock(mutex_);
  const std::uint64_t id = next_meter_id_++;
  open_.emplace(id, open_request{std::move(tenant_id), &usage, {}, std::move(hold_id), std::move(labels)});
  return meter(this, id);
}

void usage_ledger::end_meter(std::uint64_t id) {
  const unix_time hour = hour_start_of(to_unix_seconds(clock_.system_time()));
  std::lock_guard lock(mutex_);
  const auto it = open_.find(id);
  if (it == open_.end()) return;
  checkpoint(it->second, hour, pending_, pending_details_);
  if (!it->second.hold_id.empty()) released_holds_.push_back(std::move(it->second.hold_id));
  open_.erase(it);
}

std::size_t usage_ledger::open_meters() const {
  std::lock_guard lock(mutex_);
  return open_.size();
}

status usage_ledger::flush() {
  std::lock_guard flushing(flush_mutex_);
  // A batch whose write failed goes again as it was, under its id: the store adds it once, even
  // when the earlier attempt landed and only its answer was lost.
  if (unacknowledged_) {
    if (status written = store_.add_usage(*unacknowledged_); !written.ok()) return written;
    unacknowledged_.reset();
    unacknowledged_rows_.store(0, std::memory_order_relaxed);
  }
  const unix_time hour = hour_start_of(to_unix_seconds(clock_.system_time()));
  pending_map taken;
  detail_map taken_details;
  usage_batch batch;
  {
    std::lock_guard lock(mutex_);
    for (auto& [id, request] : open_) {
      checkpoint(request, hour, pending_, pending_details_);
      if (!request.hold_id.empty()) {
        batch.hold_progress.emplace_back(request.hold_id,
                                         request.recorded.prompt_tokens + request.recorded.completion_tokens);
      }
    }
    taken.swap(pending_);
    taken_details.swap(pending_details_);
    batch.released_holds.swap(released_holds_);
  }
  for (const auto& [tenant, hours] : taken) {
    for (const auto& [hour_start, counts] : hours) batch.rows.push_back({tenant, hour_start, counts});
  }
  for (const auto& [where, counts] : taken_details) {
    batch.details.push_back({where.tenant_id, where.hour_start, where.labels, counts});
  }
  if (batch.empty()) return {};
  batch.id = format("{}-{}", batch_prefix_, ++batches_);
  status written = store_.add_usage(batch);
  if (!written.ok()) {
    unacknowledged_rows_.store(batch.rows.size(), std::memory_order_relaxed);
    unacknowledged_ = std::move(batch);
  }
  return written;
}

std::size_t usage_ledger::pending_rows() const {
  std::lock_guard lock(mutex_);
  std::size_t rows = unacknowledged_rows_.load(std::memory_order_relaxed);
  for (const auto& [tenant, hours] : pending_) rows += hours.size();
  return rows;
}

}  // namespace edge::gateway
