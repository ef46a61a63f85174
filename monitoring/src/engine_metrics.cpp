#include "edge/monitoring/engine_metrics.h"

#include <string>

#include "edge/monitoring/metrics_registry.h"

namespace edge::monitoring {
namespace {

std::string name(const char* suffix) { return std::string(metric_prefix) + suffix; }

prometheus::Gauge& gauge(prometheus::Registry& registry, const char* suffix, const char* help) {
  return prometheus::BuildGauge().Name(name(suffix)).Help(help).Register(registry).Add({});
}

prometheus::Counter& counter(prometheus::Registry& registry, const char* suffix, const char* help) {
  return prometheus::BuildCounter().Name(name(suffix)).Help(help).Register(registry).Add({});
}

prometheus::Histogram& histogram(prometheus::Registry& registry, const char* suffix, const char* help,
                                 const prometheus::Histogram::BucketBoundaries& buckets) {
  return prometheus::BuildHistogram().Name(name(suffix)).Help(help).Register(registry).Add({}, buckets);
}

}  // namespace

// The bucket boundaries are vLLM's (vllm/v1/metrics/loggers.py), so that the same dashboards
// and alert thresholds apply.
const prometheus::Histogram::BucketBoundaries& engine_metrics::time_to_first_token_buckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
  return buckets;
}

const prometheus::Histogram::BucketBoundaries& engine_metrics::inter_token_latency_buckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {
      0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
  return buckets;
}

const prometheus::Histogram::BucketBoundaries& engine_metrics::request_latency_buckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {
      0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
      30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return buckets;
}

const prometheus::Histogram::BucketBoundaries& engine_metrics::iteration_tokens_buckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {1,   8,    16,   32,   64,   128, 256,
                                                                   512, 1024, 2048, 4096, 8192, 16384};
  return buckets;
}

const prometheus::Histogram::BucketBoundaries& engine_metrics::expert_load_imbalance_buckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {1.0, 1.1,  1.25, 1.5,  2.0,   3.0,  4.0,
                                                                   6.0, 8.0,  16.0, 32.0, 64.0, 128.0, 1024.0};
  return buckets;
}

const prometheus::Histogram::BucketBoundaries& engine_metrics::experts_touched_buckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 1024};
  return buckets;
}

// From a block or two (tens of microseconds) to a long prompt's thousands of blocks from host
// memory (a good part of a second).
const prometheus::Histogram::BucketBoundaries& engine_metrics::copy_back_buckets() {
  static const prometheus::Histogram::BucketBoundaries buckets = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                                                   0.005,   0.01,   0.025,   0.05,   0.1,   0.25,
                                                                   0.5,     1.0,    2.5};
  return buckets;
}

engine_metrics::engine_metrics(prometheus::Registry& registry, const engine_cache_config& cache)
    : running_(gauge(registry, "num_requests_running", "Requests the engine is running (holding KV blocks)")),
      waiting_(gauge(registry, "num_requests_waiting", "Requests waiting for admission, preempted ones included")),
      usage_(gauge(registry, "kv_cache_usage_ratio", "Share of KV cache blocks referenced by requests, 0 to 1")),
      blocks_total_(gauge(registry, "kv_cache_blocks", "KV cache blocks in the pool")),
      blocks_free_(gauge(registry, "kv_cache_blocks_free",
                         "KV cache blocks no request references (free cached prefixes included)")),
      capacity_tokens_(gauge(registry, "kv_cache_capacity_tokens", "Tokens the KV cache holds: blocks times block size")),
      prompt_tokens_(counter(registry, "prompt_tokens_total", "Prompt tokens of requests that produced a first token")),
      generation_tokens_(counter(registry, "generation_tokens_total", "Tokens generated")),
      preemptions_(counter(registry, "num_preemptions_total", "Requests preempted to free KV blocks (recomputed later)")),
      prefix_queries_(counter(registry, "prefix_cache_queries_total", "Tokens looked up in the prefix cache")),
      prefix_hits_(counter(registry, "prefix_cache_hits_total", "Tokens found in the prefix cache")),
      graph_capture_failures_(counter(registry, "cuda_graph_capture_failures_total",
                                      "CUDA graph captures that failed; those decode batch sizes run eagerly")),
      success_(prometheus::BuildCounter()
                   .Name(name("request_success_total"))
                   .Help("Requests finished, by reason: stop, length, abort or error")
                   .Register(registry)),
      time_to_first_token_(histogram(registry, "time_to_first_token_seconds",
                                     "Time from submission to a request's first token", time_to_first_token_buckets())),
      inter_token_latency_(histogram(registry, "inter_token_latency_seconds",
                                     "Time between consecutive tokens of a request", inter_token_latency_buckets())),
      e2e_latency_(histogram(registry, "e2e_request_latency_seconds", "Time from submission to a request's end",
                             request_latency_buckets())),
      queue_time_(histogram(registry, "request_queue_time_seconds",
                            "Time from submission to a request's first admission", request_latency_buckets())),
      iteration_tokens_(histogram(registry, "iteration_tokens", "Tokens computed per engine step",
                                  iteration_tokens_buckets())),
      expert_load_imbalance_(histogram(registry, "moe_expert_load_imbalance",
                                       "Per step and MoE layer: the busiest expert's tokens over the mean of the "
                                       "layer's experts",
                                       expert_load_imbalance_buckets())),
      experts_touched_(histogram(registry, "moe_experts_touched", "Per step and MoE layer: experts that ran",
                                 experts_touched_buckets())),
      routed_tokens_(counter(registry, "moe_routed_tokens_total", "Tokens routed to experts, once per expert chosen")),
      tier_hits_(prometheus::BuildCounter()
                     .Name(name("kv_tier_hit_tokens_total"))
                     .Help("Prompt tokens found in the prefix cache, by the tier they were found in: memory (KV "
                           "memory), host or disk")
                     .Register(registry)),
      memory_hits_(tier_hits_.Add({{"tier", "memory"}})),
      host_hits_(tier_hits_.Add({{"tier", "host"}})),
      disk_hits_(tier_hits_.Add({{"tier", "disk"}})),
      tier_used_(prometheus::BuildGauge()
                     .Name(name("kv_tier_used_bytes"))
                     .Help("Bytes of cached KV blocks held in a lower tier: host or disk")
                     .Register(registry)),
      tier_capacity_(prometheus::BuildGauge()
                         .Name(name("kv_tier_capacity_bytes"))
                         .Help("Bytes a lower KV tier may hold (0: not configured)")
                         .Register(registry)),
      host_used_(tier_used_.Add({{"tier", "host"}})),
      disk_used_(tier_used_.Add({{"tier", "disk"}})),
      host_capacity_(tier_capacity_.Add({{"tier", "host"}})),
      disk_capacity_(tier_capacity_.Add({{"tier", "disk"}})),
      spilled_blocks_(counter(registry, "kv_tier_spilled_blocks_total",
                              "Cached KV blocks copied from KV memory to the host tier when evicted")),
      restored_blocks_(counter(registry, "kv_tier_restored_blocks_total",
                               "KV blocks copied back from the host tier for a prompt that starts with them")),
      copy_back_(histogram(registry, "kv_tier_copy_back_seconds", "How long a step's copies back from the host tier took",
                           copy_back_buckets())),
      disk_blocks_(prometheus::BuildCounter()
                       .Name(name("kv_disk_tier_blocks_total"))
                       .Help("Disk KV tier blocks by event: written, write_failed, not_kept (turned away: write queue "
                             "full or a cap), rejected (a short, damaged or foreign file removed), evicted")
                       .Register(registry)),
      disk_written_(disk_blocks_.Add({{"event", "written"}})),
      disk_write_failed_(disk_blocks_.Add({{"event", "write_failed"}})),
      disk_not_kept_(disk_blocks_.Add({{"event", "not_kept"}})),
      disk_rejected_(disk_blocks_.Add({{"event", "rejected"}})),
      disk_evicted_(disk_blocks_.Add({{"event", "evicted"}})) {
  for (std::size_t i = 0; i < finished_reasons.size(); ++i) {
    success_by_reason_[i] = &success_.Add({{"finished_reason", finished_reasons[i]}});
  }
  prometheus::BuildGauge()
      .Name(name("cache_config_info"))
      .Help("KV cache and model configuration; the value is always 1")
      .Register(registry)
      .Add({{"kv_dtype", cache.kv_dtype},
            {"weight_dtype", cache.weight_dtype},
            {"block_size", std::to_string(cache.block_size)},
            {"num_gpu_blocks", std::to_string(cache.num_blocks)},
            {"architecture", cache.architecture},
            {"attention", cache.attention},
            {"experts", std::to_string(cache.experts)},
            {"experts_per_token", std::to_string(cache.experts_per_token)},
            {"shared_experts", std::to_string(cache.shared_experts)},
            {"active_weight_bytes_per_token", std::to_string(cache.active_weight_bytes)}})
      .Set(1);
  blocks_total_.Set(static_cast<double>(cache.num_blocks));
  blocks_free_.Set(static_cast<double>(cache.num_blocks));
  capacity_tokens_.Set(static_cast<double>(cache.capacity_tokens));
}

void engine_metrics::on_step(const backend::engine_step_report& report) {
  running_.Set(static_cast<double>(report.running));
  waiting_.Set(static_cast<double>(report.waiting));
  blocks_total_.Set(static_cast<double>(report.blocks_total));
  blocks_free_.Set(static_cast<double>(report.blocks_free));
  if (report.blocks_total > 0) {
    usage_.Set(1.0 - static_cast<double>(report.blocks_free) / static_cast<double>(report.blocks_total));
  }
  prompt_tokens_.Increment(static_cast<double>(report.prompt_tokens));
  generation_tokens_.Increment(static_cast<double>(report.generation_tokens));
  preemptions_.Increment(static_cast<double>(report.preemptions));
  prefix_queries_.Increment(static_cast<double>(report.prefix_cache_queries));
  prefix_hits_.Increment(static_cast<double>(report.prefix_cache_hits));
  graph_capture_failures_.Increment(static_cast<double>(report.graph_capture_failures));
  if (report.batch_tokens > 0) iteration_tokens_.Observe(static_cast<double>(report.batch_tokens));
  for (const double s : report.time_to_first_token) time_to_first_token_.Observe(s);
  for (const double s : report.inter_token_latency) inter_token_latency_.Observe(s);
  for (const double s : report.queue_time) queue_time_.Observe(s);
  for (const double r : report.expert_load_imbalance) expert_load_imbalance_.Observe(r);
  for (const std::int64_t n : report.experts_touched) experts_touched_.Observe(static_cast<double>(n));
  routed_tokens_.Increment(static_cast<double>(report.routed_tokens));
  memory_hits_.Increment(static_cast<double>(report.prefix_cache_hits - report.host_tier_hit_tokens));
  host_hits_.Increment(static_cast<double>(report.host_tier_hit_tokens - report.disk_tier_hit_tokens));
  disk_hits_.Increment(static_cast<double>(report.disk_tier_hit_tokens));
  host_used_.Set(static_cast<double>(report.host_tier_used_bytes));
  host_capacity_.Set(static_cast<double>(report.host_tier_capacity_bytes));
  disk_used_.Set(static_cast<double>(report.disk_tier_used_bytes));
  disk_capacity_.Set(static_cast<double>(report.disk_tier_capacity_bytes));
  spilled_blocks_.Increment(static_cast<double>(report.spilled_blocks));
  restored_blocks_.Increment(static_cast<double>(report.restored_blocks));
  for (const double s : report.copy_back_seconds) copy_back_.Observe(s);
  disk_written_.Increment(static_cast<double>(report.disk_written));
  disk_write_failed_.Increment(static_cast<double>(report.disk_write_failures));
  disk_not_kept_.Increment(static_cast<double>(report.disk_not_kept));
  disk_rejected_.Increment(static_cast<double>(report.disk_rejected));
  disk_evicted_.Increment(static_cast<double>(report.disk_evicted));
  for (const auto& f : report.finished) {
    e2e_latency_.Observe(f.e2e_seconds);
    for (std::size_t i = 0; i < finished_reasons.size(); ++i) {
      if (f.reason == finished_reasons[i]) success_by_reason_[i]->Increment();
    }
  }
}

}  // namespace edge::monitoring
