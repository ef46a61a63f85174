// The engine's metric families, declared in one place, with vLLM's names (prefix edgeinfer_
// instead of vllm:), meanings and histogram buckets, so that vLLM dashboards port:
//
//   edgeinfer_num_requests_running / _waiting            gauges
//   edgeinfer_kv_cache_usage_ratio                       gauge, 0..1: blocks referenced / total
//   edgeinfer_kv_cache_blocks / _blocks_free             gauges (free includes cached prefixes)
//   edgeinfer_kv_cache_capacity_tokens                   gauge: blocks × block size
//   edgeinfer_prompt_tokens_total                        counter: prompts of requests that produced a first token
//   edgeinfer_generation_tokens_total                    counter: tokens sampled
//   edgeinfer_num_preemptions_total                      counter
//   edgeinfer_prefix_cache_queries_total / _hits_total   counters, in tokens
//
// The lower KV tiers below KV memory (host memory, disk), when configured:
//   edgeinfer_kv_tier_hit_tokens_total{tier}             counter: prompt tokens found, by where:
//                                                        memory, host or disk (they add up to
//                                                        prefix_cache_hits_total)
//   edgeinfer_kv_tier_used_bytes{tier} / _capacity_bytes{tier}   gauges: host, disk
//   edgeinfer_kv_tier_spilled_blocks_total               counter: blocks copied from KV memory to host
//   edgeinfer_kv_tier_restored_blocks_total              counter: blocks copied back
//   edgeinfer_kv_tier_copy_back_seconds                  histogram: a step's copies back
//   edgeinfer_kv_disk_tier_blocks_total{event}           counter: written, write_failed, not_kept
//                                                        (turned away: write queue full or a cap),
//                                                        rejected (a short, damaged or foreign file
//                                                        removed), evicted
//   edgeinfer_cuda_graph_capture_failures_total          counter: those decode batch sizes run eagerly
//   edgeinfer_request_success_total{finished_reason}     counter: stop, length, abort, error
//   edgeinfer_time_to_first_token_seconds                histogram
//   edgeinfer_inter_token_latency_seconds                histogram (vLLM's time_per_output_token buckets)
//   edgeinfer_e2e_request_latency_seconds                histogram
//   edgeinfer_request_queue_time_seconds                 histogram
//   edgeinfer_iteration_tokens                           histogram: tokens computed per engine step
//   edgeinfer_cache_config_info{kv_dtype, weight_dtype, block_size, num_gpu_blocks, architecture,
//     attention, experts, experts_per_token, shared_experts, active_weight_bytes_per_token}
//     gauge, always 1 (attention: "gqa", "mla" or "mla_dsa": what one cached token and layer
//     holds; num_gpu_blocks: the KV pool's blocks on any device, vLLM's label, which the
//     Kubernetes endpoint picker reads with block_size)
//
// Mixture-of-Experts models, summarised without one series per expert (per step and MoE layer):
//   edgeinfer_moe_expert_load_imbalance                  histogram: the busiest expert's tokens
//                                                        over the mean of all the layer's experts
//                                                        (1: perfectly even; experts / top_k for
//                                                        one token)
//   edgeinfer_moe_experts_touched                        histogram: experts that ran
//   edgeinfer_moe_routed_tokens_total                    counter: (token, expert) assignments
//
// The engine calls on_step() on its own thread; prometheus-cpp's metrics are thread-safe, so
// scrapes from the gateway's threads need no further locking.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <string>

#include "edge/backend/engine/engine_observer.h"

namespace edge::monitoring {

// What edgeinfer_cache_config_info and the capacity gauges describe; set once at start.
struct engine_cache_config {
  std::string kv_dtype;
  std::string weight_dtype;
  std::string architecture;
  std::string attention = "gqa";       // gqa, mla (latent attention) or mla_dsa (with DSA's indexer)
  std::int64_t experts = 0;            // routed experts per MoE layer (0: a dense model)
  std::int64_t experts_per_token = 0;
  std::int64_t shared_experts = 0;
  std::uint64_t active_weight_bytes = 0;  // weight bytes one token reads
  std::int64_t block_size = 0;
  std::int64_t num_blocks = 0;
  std::int64_t capacity_tokens = 0;
};

class engine_metrics final : public backend::engine_observer {
 public:
  engine_metrics(prometheus::Registry& registry, const engine_cache_config& cache);

  void on_step(const backend::engine_step_report& report) override;

  static const prometheus::Histogram::BucketBoundaries& time_to_first_token_buckets();
  static const prometheus::Histogram::BucketBoundaries& inter_token_latency_buckets();
  static const prometheus::Histogram::BucketBoundaries& request_latency_buckets();
  static const prometheus::Histogram::BucketBoundaries& iteration_tokens_buckets();
  static const prometheus::Histogram::BucketBoundaries& expert_load_imbalance_buckets();
  static const prometheus::Histogram::BucketBoundaries& experts_touched_buckets();
  static const prometheus::Histogram::BucketBoundaries& copy_back_buckets();

 private:
  // The reasons a request can finish with, in backend::finish_reason order.
  static constexpr std::array<const char*, 4> finished_reasons = {"stop", "length", "abort", "error"};

  prometheus::Gauge& running_;
  prometheus::Gauge& waiting_;
  prometheus::Gauge& usage_;
  prometheus::Gauge& blocks_total_;
  prometheus::Gauge& blocks_free_;
  prometheus::Gauge& capacity_tokens_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generation_tokens_;
  prometheus::Counter& preemptions_;
  prometheus::Counter& prefix_queries_;
  prometheus::Counter& prefix_hits_;
  prometheus::Counter& graph_capture_failures_;
  prometheus::Family<prometheus::Counter>& success_;
  std::array<prometheus::Counter*, finished_reasons.size()> success_by_reason_{};
  prometheus::Histogram& time_to_first_token_;
  prometheus::Histogram& inter_token_latency_;
  prometheus::Histogram& e2e_latency_;
  prometheus::Histogram& queue_time_;
  prometheus::Histogram& iteration_tokens_;
  prometheus::Histogram& expert_load_imbalance_;
  prometheus::Histogram& experts_touched_;
  prometheus::Counter& routed_tokens_;
  prometheus::Family<prometheus::Counter>& tier_hits_;
  prometheus::Counter& memory_hits_;
  prometheus::Counter& host_hits_;
  prometheus::Counter& disk_hits_;
  prometheus::Family<prometheus::Gauge>& tier_used_;
  prometheus::Family<prometheus::Gauge>& tier_capacity_;
  prometheus::Gauge& host_used_;
  prometheus::Gauge& disk_used_;
  prometheus::Gauge& host_capacity_;
  prometheus::Gauge& disk_capacity_;
  prometheus::Counter& spilled_blocks_;
  prometheus::Counter& restored_blocks_;
  prometheus::Histogram& copy_back_;
  prometheus::Family<prometheus::Counter>& disk_blocks_;
  prometheus::Counter& disk_written_;
  prometheus::Counter& disk_write_failed_;
  prometheus::Counter& disk_not_kept_;
  prometheus::Counter& disk_rejected_;
  prometheus::Counter& disk_evicted_;
};

}  // namespace edge::monitoring
