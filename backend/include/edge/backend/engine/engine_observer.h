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

  // The lower KV tiers (kv_tiers.h). Hits are also prefix_cache_hits; the rest found it in KV
  // memory.
  std::int64_t host_tier_hit_tokens = 0;  // copied back from host slots, those read from disk first included
  std::int64_t disk_tier_hit_tokens = 0;  // of those, read from disk first
  std::int64_t spilled_blocks = 0;        // copied from KV memory to host slots
  std::int64_t restored_blocks = 0;       // copied back
  std::int64_t disk_written = 0;          // blocks written to disk files
  std::int64_t disk_write_failures = 0;
  std::int64_t disk_not_kept = 0;         // blocks the disk tier turned away (write queue full, caps)
  std::int64_t disk_rejected = 0;         // files found short, damaged or foreign, and removed
  std::int64_t disk_evicted = 0;          // files removed for the capacity or a tenant's cap
  std::span<const double> copy_back_seconds;  // per step with copies back: how long they took
  // Gauges (0 without the tier).
  std::int64_t host_tier_used_bytes = 0;
  std::int64_t host_tier_capacity_bytes = 0;
  std::int64_t disk_tier_used_bytes = 0;
  std::int64_t disk_tier_capacity_bytes = 0;

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
