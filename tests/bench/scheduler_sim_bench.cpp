// Trace-driven simulation of the engine's scheduler at the scale of a real deployment, without
// model weights: the real scheduler and block pool, sized for the KV budget a large model
// leaves on one 141 GB GPU, run on a synthetic trace with long-tailed prompt and output lengths,
// with each step's time from a roofline cost model. It compares admission policies (optimistic
// vs reserve) and KV dtypes (fp8 vs bf16) on:
//   * KV utilisation: tokens whose K/V are stored ÷ the cache's token capacity (time-weighted);
//   * internal waste: slots in allocated blocks that hold no token of their sequence ÷ slots
//     allocated (time-weighted): the last block's slack, and with reserve the room kept for
//     tokens not generated yet;
//   * throughput (generated tokens per simulated second), preemptions and recomputed tokens;
//   * queueing: arrival to first admission, median and 99th percentile; time to first token.
//
//   edge_bench_scheduler_sim [--requests N] [--rate R] [--seed S] [--prompt-median T] [--output-median T]
//                            [--max-tokens N]
//
// Deterministic: the same arguments print the same figures on any machine. A benchmark: it
// prints, it asserts nothing.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <string_view>

#include "sim/scheduler_sim.h"

namespace {

using namespace edge::backend;

// ---- the deployment -------------------------------------------------------------------------

// Llama-3-70B: 80 layers, hidden 8192, 64 query heads, 8 KV heads of 128, 70.6 B parameters.
constexpr double layers = 80;
constexpr double kv_heads = 8;
constexpr double head_dim = 128;
constexpr double hidden = 8192;
constexpr double parameters = 70.6e9;
// INT4 weights (W4A16, groups of 128 with a 16-bit scale): 68.5 B quantized parameters at
// 0.5 byte + 1.07 GB of scales, plus the bf16 embedding and output matrices (2 × 1.05 B × 2
// bytes): 34.3 + 1.1 + 4.2 = 39.6 GB.
constexpr double weight_bytes = 39.6e9;
// H200: 141 GB of HBM3e at 4.8 TB/s, 989 TFLOP/s dense bf16.
constexpr double gpu_bytes = 141e9;
constexpr double bandwidth = 4.8e12 * 0.8;  // what streaming kernels reach
constexpr double flops = 989e12 * 0.5;      // what W4A16 GEMMs and attention reach
constexpr double step_overhead = 1e-3;      // scheduling, launches, sampling per step
// 90% of the GPU (vLLM's --gpu-memory-utilization default), less the weights and 5 GB of
// activations, CUDA graphs and workspace.
constexpr double kv_budget = gpu_bytes * 0.9 - weight_bytes - 5e9;

constexpr std::int64_t block_size = 16;

// K and V of one token in every layer; fp8 adds one f32 scale per token, KV head and K or V.
double bytes_per_token(bool fp8) { return 2 * layers * kv_heads * (fp8 ? head_dim + 4 : head_dim * 2); }

// One step: the weights stream once, attention reads every K/V entry its queries see; the
// matmuls and attention cost their FLOPs; the slower of the two bounds the step (a roofline).
// An fp8 cache reads half the bytes but dequantizes them: 10% more attention arithmetic.
edge::sim::cost_model roofline(bool fp8) {
  return [fp8](const edge::sim::step_work& w) {
    const double memory = (weight_bytes + static_cast<double>(w.context_tokens) * bytes_per_token(fp8)) / bandwidth;
    const double attention_flops = 4.0 * layers * hidden * static_cast<double>(w.attended) * (fp8 ? 1.1 : 1.0);
    const double compute = (2.0 * parameters * static_cast<double>(w.tokens) + attention_flops) / flops;
    return step_overhead + std::max(memory, compute);
  };
}

// ---- the trace ------------------------------------------------------------------------------

struct trace_options {
  std::int64_t requests = 4000;
  double rate = 12.0;  // arrivals per second (Poisson)
  std::uint64_t seed = 1;
  std::int64_t max_tokens = 2048;  // what clients ask for; most stop well before
  double prompt_median = 512;
  double output_median = 256;
};

// Log-normal lengths (ShareGPT-like long tails), clipped.
std::int64_t lognormal(std::mt19937_64& rng, double median, double sigma, std::int64_t lo, std::int64_t hi) {
  std::lognormal_distribution<double> d(std::log(median), sigma);
  return std::clamp<std::int64_t>(static_cast<std::int64_t>(d(rng)), lo, hi);
}

std::vector<edge::sim::request> make_trace(const trace_options& o) {
  std::mt19937_64 rng(o.seed);
  std::exponential_distribution<double> gap(o.rate);
  std::vector<edge::sim::request> out;
  double t = 0.0;
  for (std::int64_t i = 0; i < o.requests; ++i) {
    edge::sim::request r;
    r.id = static_cast<edge::sim::sequence_id>(i + 1);
    t += gap(rng);
    r.arrival = t;
    const std::int64_t prompt = lognormal(rng, o.prompt_median, 1.0, 16, 32768);
    r.prompt.resize(static_cast<std::size_t>(prompt));
    // Distinct tokens per request: no prefix is shared, so the cache holds each token once.
    for (std::int64_t k = 0; k < prompt; ++k) {
      r.prompt[static_cast<std::size_t>(k)] = static_cast<std::int32_t>((r.id * 7919 + static_cast<std::uint64_t>(k)) % 100000);
    }
    r.output_tokens = lognormal(rng, o.output_median, 1.0, 8, o.max_tokens);
    r.max_tokens = o.max_tokens;
    out.push_back(std::move(r));
  }
  return out;
}

// ---- one run --------------------------------------------------------------------------------

struct run_result {
  std::int64_t blocks = 0;
  double seconds = 0.0;
  std::int64_t generated = 0;
  std::int64_t computed = 0;
  std::int64_t preemptions = 0;
  double utilisation = 0.0;  // time-weighted
  double waste = 0.0;        // time-weighted
  double mean_running = 0.0;
  double queue_p50 = 0.0, queue_p99 = 0.0;
  double ttft_p50 = 0.0, ttft_p99 = 0.0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(std::min<double>(static_cast<double>(v.size() - 1), p * static_cast<double>(v.size())))];
}

run_result simulate(const std::vector<edge::sim::request>& trace, bool fp8, admission_policy policy) {
  run_result out;
  out.blocks = static_cast<std::int64_t>(kv_budget / (bytes_per_token(fp8) * block_size));
  scheduler_config config{.block_size = block_size,
                          .max_num_seqs = 256,
                          .max_num_batched_tokens = 8192,
                          .admission = policy,
                          .enable_prefix_caching = true};
  auto created = edge::sim::simulation::create(config, out.blocks, roofline(fp8));
  if (!created.ok()) {
    std::fprintf(stderr, "%s\n", created.error().message().c_str());
    std::exit(1);
  }
  auto& sim = **created;
  const double capacity = static_cast<double>(out.blocks * block_size);
  double last = 0.0;
  double stored_time = 0.0, allocated_time = 0.0, held_time = 0.0, running_time = 0.0;
  const auto ran = sim.run(trace, 50'000'000, [&](const edge::sim::simulation& s, const step_plan&) {
    const double dt = s.now() - last;
    last = s.now();
    double stored = 0.0, allocated = 0.0, held = 0.0, running = 0.0;
    for (const auto id : s.live()) {
      if (s.scheduler().state_of(id) != sequence_state::running) continue;
      running += 1;
      stored += static_cast<double>(s.scheduler().computed_tokens(id));
      held += static_cast<double>(s.scheduler().sequence_length(id));
      allocated += static_cast<double>(s.scheduler().block_table(id).size() * block_size);
    }
    stored_time += stored * dt;
    held_time += held * dt;
    allocated_time += allocated * dt;
    running_time += running * dt;
    return edge::status{};
  });
  if (!ran.ok()) {
    std::fprintf(stderr, "%s\n", ran.message().c_str());
    std::exit(1);
  }
  out.seconds = sim.now();
  out.computed = sim.tokens_computed();
  out.preemptions = sim.scheduler().counters().preemptions;
  out.utilisation = stored_time / (capacity * out.seconds);
  out.waste = allocated_time > 0 ? 1.0 - held_time / allocated_time : 0.0;
  out.mean_running = running_time / out.seconds;
  std::vector<double> queue, ttft;
  for (const auto& r : trace) {
    const auto& o = sim.outcome_of(r.id);
    out.generated += o.generated;
    if (o.admitted) queue.push_back(*o.admitted - r.arrival);
    if (o.first_token) ttft.push_back(*o.first_token - r.arrival);
  }
  out.queue_p50 = percentile(queue, 0.5);
  out.queue_p99 = percentile(queue, 0.99);
  out.ttft_p50 = percentile(ttft, 0.5);
  out.ttft_p99 = percentile(ttft, 0.99);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  trace_options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--requests") o.requests = std::atoll(argv[i + 1]);
    else if (flag == "--rate") o.rate = std::atof(argv[i + 1]);
    else if (flag == "--seed") o.seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (flag == "--prompt-median") o.prompt_median = std::atof(argv[i + 1]);
    else if (flag == "--output-median") o.output_median = std::atof(argv[i + 1]);
    else if (flag == "--max-tokens") o.max_tokens = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr,
                   "usage: %s [--requests N] [--rate PER_SECOND] [--seed S] [--prompt-median TOKENS] "
                   "[--output-median TOKENS] [--max-tokens N]\n",
                   argv[0]);
      return 2;
    }
  }
  const auto trace = make_trace(o);
  double prompt_sum = 0, output_sum = 0;
  std::vector<double> prompts, outputs;
  for (const auto& r : trace) {
    prompts.push_back(static_cast<double>(r.prompt.size()));
    outputs.push_back(static_cast<double>(r.output_tokens));
    prompt_sum += prompts.back();
    output_sum += outputs.back();
  }
  std::printf("model: Llama-3-70B shape (80 layers, 8 KV heads x 128), INT4 weights %.1f GB, on an H200 (141 GB, "
              "4.8 TB/s)\n",
              weight_bytes / 1e9);
  std::printf("KV budget: 0.9 x 141 GB - weights - 5 GB = %.1f GB; bf16 %.0f B/token, fp8 %.0f B/token (%.3fx)\n",
              kv_budget / 1e9, bytes_per_token(false), bytes_per_token(true),
              bytes_per_token(false) / bytes_per_token(true));
  std::printf("trace: %lld requests, Poisson %.1f/s, seed %llu; prompt tokens median %.0f mean %.0f p99 %.0f; output "
              "median %.0f mean %.0f p99 %.0f; max_tokens %lld\n",
              static_cast<long long>(o.requests), o.rate, static_cast<unsigned long long>(o.seed),
              percentile(prompts, 0.5), prompt_sum / static_cast<double>(trace.size()), percentile(prompts, 0.99),
              percentile(outputs, 0.5), output_sum / static_cast<double>(trace.size()), percentile(outputs, 0.99),
              static_cast<long long>(o.max_tokens));
  std::printf("scheduler: blocks of %lld, max_num_seqs 256, max_num_batched_tokens 8192, prefix caching on\n\n",
              static_cast<long long>(block_size));
  std::printf("| admission | KV | capacity (tokens) | KV utilisation | internal waste | mean running | generated tok/s "
              "| preemptions | recomputed tokens | queue p50 / p99 (s) | TTFT p50 / p99 (s) |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const auto policy : {admission_policy::optimistic, admission_policy::reserve}) {
    for (const bool fp8 : {true, false}) {
      const run_result r = simulate(trace, fp8, policy);
      const double prompt_and_output = prompt_sum + output_sum;
      std::printf("| %s | %s | %lld | %.1f%% | %.2f%% | %.1f | %.0f | %lld | %lld | %.2f / %.2f | %.2f / %.2f |\n",
                  std::string(to_string(policy)).c_str(), fp8 ? "fp8" : "bf16",
                  static_cast<long long>(r.blocks * block_size), 100.0 * r.utilisation, 100.0 * r.waste,
                  r.mean_running, static_cast<double>(r.generated) / r.seconds, static_cast<long long>(r.preemptions),
                  // Tokens computed beyond each prompt and output once: the cost of recomputation.
                  static_cast<long long>(static_cast<double>(r.computed) - (prompt_and_output - static_cast<double>(trace.size()))),
                  r.queue_p50, r.queue_p99, r.ttft_p50, r.ttft_p99);
      std::fflush(stdout);
    }
  }
  return 0;
}
