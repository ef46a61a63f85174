// Keeps a label's values bounded: the first `capacity` distinct values seen keep their own
// series and every later one is reported as "other". Used for tenant labels, so that a
// deployment with thousands of tenants cannot blow up the number of series a scrape returns.
//
// Tenants usually get their first traffic in about the order of how much they send, and a
// Prometheus counter cannot move to another label once it exists, so "first seen" is the one
// stable approximation of "top N by traffic" that a process can keep.
#pragma once

#include <cstddef>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

namespace edge::monitoring {

class label_limiter {
 public:
  static constexpr std::string_view overflow_value = "other";

  explicit label_limiter(std::size_t capacity) : capacity_(capacity) {}

  // `value` itself while it is one of the first `capacity` distinct values, else "other".
  // Thread-safe.
  std::string label(std::string_view value);

  std::size_t tracked() const;

 private:
  std::size_t capacity_;
  mutable std::mutex mutex_;
  std::set<std::string, std::less<>> admitted_;  // guarded by mutex_
};

}  // namespace edge::monitoring
