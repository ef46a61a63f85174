// A one-line progress bar on stderr, drawn only when stderr is a terminal.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace edge::cli {

class progress_bar {
 public:
  explicit progress_bar(std::string label);
  ~progress_bar();  // ends the line if anything was drawn

  // Redraws at most every few tens of milliseconds, and always at done == total.
  void update(std::uint64_t done, std::uint64_t total);

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace edge::cli
