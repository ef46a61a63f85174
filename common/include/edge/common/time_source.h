// Time, injected. Code that measures or schedules by time (rate limiters, daily budgets, the
// usage ledger's hourly buckets) takes a `const time_source&` instead of calling the clocks,
// so tests drive it with a manual_time_source and never wait for, or depend on, the wall clock.
// (Envoy's TimeSource, with the same two clocks.)
#pragma once

#include <atomic>
#include <chrono>

namespace edge {

class time_source {
 public:
  virtual ~time_source() = default;
  // Calendar time (UTC): for day and hour boundaries and timestamps that are stored.
  virtual std::chrono::system_clock::time_point system_time() const = 0;
  // Never goes backwards: for intervals and rates.
  virtual std::chrono::steady_clock::time_point monotonic_time() const = 0;
};

// The process's real clocks.
class real_time_source final : public time_source {
 public:
  std::chrono::system_clock::time_point system_time() const override { return std::chrono::system_clock::now(); }
  std::chrono::steady_clock::time_point monotonic_time() const override { return std::chrono::steady_clock::now(); }
};

// The process's real clocks, for code given no clock of its own.
inline const time_source& process_time() {
  static const real_time_source clock;
  return clock;
}

// A clock that moves only when told to; both clocks advance together. Thread-safe.
class manual_time_source final : public time_source {
 public:
  explicit manual_time_source(std::chrono::system_clock::time_point start = std::chrono::system_clock::time_point{})
      : system_(start.time_since_epoch().count()) {}

  std::chrono::system_clock::time_point system_time() const override {
    return std::chrono::system_clock::time_point(std::chrono::system_clock::duration(system_.load()));
  }
  std::chrono::steady_clock::time_point monotonic_time() const override {
    return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(monotonic_.load()));
  }

  void advance(std::chrono::nanoseconds by) {
    system_ += std::chrono::duration_cast<std::chrono::system_clock::duration>(by).count();
    monotonic_ += std::chrono::duration_cast<std::chrono::steady_clock::duration>(by).count();
  }
  // Moves calendar time only (as when the wall clock is set), not the monotonic clock.
  void set_system_time(std::chrono::system_clock::time_point at) { system_ = at.time_since_epoch().count(); }

 private:
  std::atomic<std::chrono::system_clock::rep> system_;
  std::atomic<std::chrono::steady_clock::rep> monotonic_{0};
};

}  // namespace edge
