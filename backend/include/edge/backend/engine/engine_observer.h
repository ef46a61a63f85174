// What the engine reports after each step, for metrics. The interface depends on the standard
// library alone, so the metrics library (monitoring/, which has prometheus-cpp) implements it
// without linking the backend, and the backend core never sees prometheus-cpp.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace edge::backend {

struct finished_request_report {
  std::string_view reason;         // "stop", "length", "abort", "error"
  double e2e_seconds = 0.0;        // submitted to finished
  std::int64_t prompt_tokens = 0;
  std::int64_t completion_tokens = 0;
};

// One engine step (or a round that only took commands, such as a cancellation). Counts are of
// this step alone; gauges are the state after it.
struct engine_step_report {
  // Gauges.
  std::int64_t running = 0;
  std::int64_t waiting = 0;  // submitted, not running (queued, or preempted and waiting again)
  std::int64_t blocks_total = 0;
  std::int64_t blocks_free = 0;  // not referenced by any sequence (cached prefixes included)

  // Counts.
  std::int64_t batch_tokens = 0;       // tokens the executor computed in this step
  std::int64_t prompt_tokens = 0;      // prompts of the requests that got their first token
  std::int64_t generation_tokens = 0;  // tokens sampled
  std::int64_t preemptions = 0;
  std::int64_t prefix_cache_queries = 0;  // tokens looked up
  std::int64_t prefix_cache_hits = 0;     // tokens found
  std::int64_t graph_capture_failures = 0;  // the executor's CUDA graph captures that failed

  // Per request.
  std::span<const double> time_to_first_token;  // seconds, submitted to first token
  std::span<const double> inter_token_latency;  // seconds between consecutive tokens of a request
  std::span<const double> queue_time;           // seconds from submission to first admission
  std::span<const finished_request_report> finished;

  // Mixture-of-Experts models, per MoE layer of this step.
  std::span<const double> expert_load_imbalance;  // busiest expert's tokens / mean over the layer's experts
  std::span<const std::int64_t> experts_touched;  // experts that ran
  std::int64_t routed_tokens = 0;                 // (token, expert) assignments, all layers
};

class engine_observer {
 public:
  virtual ~engine_observer() = default;
  // Called on the engine thread after every round that changed something. Must not block.
  virtual void on_step(const engine_step_report& report) = 0;
};

}  // namespace edge::backend
