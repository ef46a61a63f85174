// The engine's metric families: vLLM's names (prefix edgeinfer_ for vllm:), types, histogram
// buckets and meanings, so that vLLM dashboards and alerts port.
#include <doctest/doctest.h>

#include <sstream>
#include <string>
#include <vector>

#include "edge/monitoring/engine_metrics.h"
#include "edge/monitoring/metrics_registry.h"

namespace {

using edge::monitoring::engine_metrics;

bool has(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// The `le` values of a histogram's buckets in a scrape, in order, +Inf left out.
std::vector<double> bucket_bounds(const std::string& text, const std::string& name) {
  std::vector<double> out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(name + "_bucket{", 0) != 0) continue;
    const auto le = line.find("le=\"");
    const auto end = line.find('"', le + 4);
    const std::string value = line.substr(le + 4, end - le - 4);
    if (value != "+Inf") out.push_back(std::stod(value));
  }
  return out;
}

}  // namespace

TEST_CASE("engine metric families have vLLM's names, types and buckets") {
  edge::monitoring::metrics_registry registry;
  engine_metrics metrics(registry.families(), {.kv_dtype = "fp8_e4m3",
                                                .weight_dtype = "int4",
                                                .architecture = "qwen3_moe",
                                                .experts = 128,
                                                .experts_per_token = 8,
                                                .active_weight_bytes = 12345,
                                                .block_size = 16,
                                                .num_blocks = 100,
                                                .capacity_tokens = 1600});
  const std::string text = registry.scrape();

  for (const char* gauge : {"num_requests_running", "num_requests_waiting", "kv_cache_usage_ratio",
                            "kv_cache_blocks", "kv_cache_blocks_free", "kv_cache_capacity_tokens",
                            "cache_config_info"}) {
    CHECK_MESSAGE(has(text, std::string("# TYPE edgeinfer_") + gauge + " gauge"), gauge);
  }
  for (const char* counter : {"prompt_tokens_total", "generation_tokens_total", "num_preemptions_total",
                              "prefix_cache_queries_total", "prefix_cache_hits_total", "request_success_total"}) {
    CHECK_MESSAGE(has(text, std::string("# TYPE edgeinfer_") + counter + " counter"), counter);
  }
  for (const char* histogram : {"time_to_first_token_seconds", "inter_token_latency_seconds",
                                "e2e_request_latency_seconds", "request_queue_time_seconds", "iteration_tokens",
                                "moe_expert_load_imbalance", "moe_experts_touched"}) {
    CHECK_MESSAGE(has(text, std::string("# TYPE edgeinfer_") + histogram + " histogram"), histogram);
  }

  // vLLM's buckets (vllm/v1/metrics/loggers.py), written out here so that a change shows.
  const std::vector<double> ttft = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
                                    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
  const std::vector<double> itl = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                   0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
  const std::vector<double> latency = {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                       30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  const std::vector<double> iteration = {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
  CHECK(bucket_bounds(text, "edgeinfer_time_to_first_token_seconds") == ttft);
  CHECK(bucket_bounds(text, "edgeinfer_inter_token_latency_seconds") == itl);
  CHECK(bucket_bounds(text, "edgeinfer_e2e_request_latency_seconds") == latency);
  CHECK(bucket_bounds(text, "edgeinfer_request_queue_time_seconds") == latency);
  CHECK(bucket_bounds(text, "edgeinfer_iteration_tokens") == iteration);

  // Set at start: capacity and configuration; every finish reason present from the start.
  CHECK(has(text, "edgeinfer_kv_cache_blocks 100"));
  CHECK(has(text, "edgeinfer_kv_cache_blocks_free 100"));
  CHECK(has(text, "edgeinfer_kv_cache_capacity_tokens 1600"));
  CHECK(has(text, "edgeinfer_cache_config_info{active_weight_bytes_per_token=\"12345\",architecture=\"qwen3_moe\",attention=\"gqa\","
                  "block_size=\"16\",experts=\"128\",experts_per_token=\"8\",kv_dtype=\"fp8_e4m3\","
                  "num_gpu_blocks=\"100\",shared_experts=\"0\",weight_dtype=\"int4\"} 1"));
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    CHECK(has(text, std::string("edgeinfer_request_success_total{finished_reason=\"") + reason + "\"} 0"));
  }
}

TEST_CASE("engine steps update the gauges, counters and histograms") {
  edge::monitoring::metrics_registry registry;
  engine_metrics metrics(registry.families(), {.kv_dtype = "bf16", .weight_dtype = "bf16", .block_size = 16,
                                                .num_blocks = 100, .capacity_tokens = 1600});
  const std::vector<double> ttft = {0.003};
  const std::vector<double> itl = {0.02, 0.03};
  const std::vector<double> queued = {0.7};
  const std::vector<double> imbalance = {1.5, 4.0};  // two MoE layers
  const std::vector<std::int64_t> touched = {6, 3};
  const std::vector<edge::backend::finished_request_report> finished = {
      {.reason = "length", .e2e_seconds = 1.2, .prompt_tokens = 5, .completion_tokens = 3},
      {.reason = "abort", .e2e_seconds = 0.4, .prompt_tokens = 9, .completion_tokens = 1}};
  metrics.on_step({.running = 3,
                   .waiting = 2,
                   .blocks_total = 100,
                   .blocks_free = 75,
                   .batch_tokens = 40,
                   .prompt_tokens = 14,
                   .generation_tokens = 4,
                   .preemptions = 1,
                   .prefix_cache_queries = 32,
                   .prefix_cache_hits = 16,
                   .graph_capture_failures = 1,
                   .time_to_first_token = ttft,
                   .inter_token_latency = itl,
                   .queue_time = queued,
                   .finished = finished,
                   .expert_load_imbalance = imbalance,
                   .experts_touched = touched,
                   .routed_tokens = 640});
  // A round that ran no step (a cancellation) observes no iteration.
  metrics.on_step({.running = 2, .waiting = 2, .blocks_total = 100, .blocks_free = 80});
  const std::string text = registry.scrape();
  CHECK(has(text, "edgeinfer_num_requests_running 2"));
  CHECK(has(text, "edgeinfer_num_requests_waiting 2"));
  CHECK(has(text, "edgeinfer_kv_cache_blocks_free 80"));
  CHECK(has(text, "edgeinfer_kv_cache_usage_ratio 0.2"));
  CHECK(has(text, "edgeinfer_prompt_tokens_total 14"));
  CHECK(has(text, "edgeinfer_generation_tokens_total 4"));
  CHECK(has(text, "edgeinfer_num_preemptions_total 1"));
  CHECK(has(text, "edgeinfer_prefix_cache_queries_total 32"));
  CHECK(has(text, "edgeinfer_prefix_cache_hits_total 16"));
  CHECK(has(text, "edgeinfer_cuda_graph_capture_failures_total 1"));
  CHECK(has(text, "edgeinfer_request_success_total{finished_reason=\"length\"} 1"));
  CHECK(has(text, "edgeinfer_request_success_total{finished_reason=\"abort\"} 1"));
  CHECK(has(text, "edgeinfer_request_success_total{finished_reason=\"stop\"} 0"));
  CHECK(has(text, "edgeinfer_iteration_tokens_count 1"));
  CHECK(has(text, "edgeinfer_iteration_tokens_bucket{le=\"32\"} 0"));
  CHECK(has(text, "edgeinfer_iteration_tokens_bucket{le=\"64\"} 1"));
  CHECK(has(text, "edgeinfer_time_to_first_token_seconds_bucket{le=\"0.005\"} 1"));
  CHECK(has(text, "edgeinfer_inter_token_latency_seconds_count 2"));
  CHECK(has(text, "edgeinfer_request_queue_time_seconds_bucket{le=\"0.5\"} 0"));
  CHECK(has(text, "edgeinfer_request_queue_time_seconds_bucket{le=\"0.8\"} 1"));
  CHECK(has(text, "edgeinfer_e2e_request_latency_seconds_count 2"));
  CHECK(has(text, "edgeinfer_e2e_request_latency_seconds_bucket{le=\"0.5\"} 1"));
  CHECK(has(text, "edgeinfer_moe_routed_tokens_total 640"));
  CHECK(has(text, "edgeinfer_moe_expert_load_imbalance_count 2"));
  CHECK(has(text, "edgeinfer_moe_expert_load_imbalance_bucket{le=\"1.5\"} 1"));
  CHECK(has(text, "edgeinfer_moe_expert_load_imbalance_bucket{le=\"4\"} 2"));
  CHECK(has(text, "edgeinfer_moe_experts_touched_sum 9"));
  CHECK(has(text, "edgeinfer_moe_experts_touched_bucket{le=\"4\"} 1"));
}
