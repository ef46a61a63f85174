// When a decode batch of a padded size runs as a CUDA graph. A size's first step runs eagerly
// (it sets every kernel attribute a capture must not change), its second runs eagerly and is
// then captured, and every later one replays the graph. A size whose capture failed runs
// eagerly from then on and is never captured again: a failed capture costs only the graph,
// never a step. Host code without CUDA, so that the rule is tested where no GPU is.
// Owned by the executor (the engine thread).
#pragma once

#include <cstdint>
#include <set>

namespace edge::backend {

class cuda_graph_policy {
 public:
  enum class action {
    eager,          // run the step without a graph
    eager_capture,  // run it without one, then capture its graph
    replay,         // launch the size's graph
  };

  action next(std::int64_t size) const {
    if (captured_.contains(size)) return action::replay;
    if (failed_.contains(size) || !warmed_.contains(size)) return action::eager;
    return action::eager_capture;
  }
  // Record what became of the step next() was asked about.
  void ran_eagerly(std::int64_t size) { warmed_.insert(size); }
  void captured(std::int64_t size) { captured_.insert(size); }
  void capture_failed(std::int64_t size) {
    failed_.insert(size);
    ++capture_failures_;
  }

  std::int64_t capture_failures() const { return capture_failures_; }

 private:
  std::set<std::int64_t> warmed_;    // sizes that ran eagerly once
  std::set<std::int64_t> captured_;  // sizes with a graph
  std::set<std::int64_t> failed_;    // sizes whose capture failed
  std::int64_t capture_failures_ = 0;
};

}  // namespace edge::backend
