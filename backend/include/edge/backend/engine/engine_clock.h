// Where the engine reads the time: the process's steady clock in production, a clock the test
// advances by hand in tests, so that queueing times and latencies are exact and tests never
// depend on how fast the machine is.
#pragma once

#include <chrono>

namespace edge::backend {

class engine_clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;

  virtual ~engine_clock() = default;
  // Called from the engine thread and from submitting threads: must be thread-safe.
  virtual time_point now() const = 0;
};

// std::chrono::steady_clock.
engine_clock& steady_engine_clock();

}  // namespace edge::backend
