#include "edge/backend/runtime/stop_checker.h"

#include <algorithm>

namespace edge::backend {

stop_checker::stop_checker(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
}

stop_checker::step stop_checker::push(std::string_view text) {
  held_.append(text);
  if (stops_.empty()) {
    step out{std::move(held_), false, {}};
    held_.clear();
    return out;
  }
  // The earliest complete stop string wins; of those that begin there, the first listed.
  std::size_t first = std::string::npos;
  const std::string* matched = nullptr;
  for (const auto& s : stops_) {
    const std::size_t at = held_.find(s);
    if (at < first) {
      first = at;
      matched = &s;
    }
  }
  if (matched != nullptr) {
    step out{held_.substr(0, first), true, *matched};
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  std::size_t keep = 0;
  for (const auto& s : stops_) {
    for (std::size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n) {
      if (std::string_view(held_).substr(held_.size() - n) == std::string_view(s).substr(0, n)) {
        keep = n;
        break;
      }
    }
  }
  step out{held_.substr(0, held_.size() - keep), false, {}};
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string stop_checker::flush() {
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace edge::backend
