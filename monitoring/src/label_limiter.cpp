#include "edge/monitoring/label_limiter.h"

namespace edge::monitoring {

std::string label_limiter::label(std::string_view value) {
  std::lock_guard lock(mutex_);
  if (admitted_.find(value) != admitted_.end()) return std::string(value);
  if (admitted_.size() < capacity_) {
    admitted_.emplace(value);
    return std::string(value);
  }
  return std::string(overflow_value);
}

std::size_t label_limiter::tracked() const {
  std::lock_guard lock(mutex_);
  return admitted_.size();
}

}  // namespace edge::monitoring
