// Decode throughput of the CPU executor, and how close batch-1 decode comes to the memory
// bandwidth limit.
//
// Batch-1 decode reads every weight once per token, so its ceiling is (read bandwidth) /
// (weight bytes). This program measures the machine's bandwidth first (a large memcpy, and a
// pure read pass), then decodes with batches of several sequences and prints tokens/s and the
// ratio of the weight bytes it streamed per second to the measured bandwidth. Bandwidths are the
// best of several runs (a ceiling), decode rates the median of --repeat runs after a warm-up.
//
// --context N measures decode at a long context without paying for its prefill: each sequence
// decodes --tokens steps from position N over a cache whose first N positions are left as
// allocated (zeros). Attention does the same work whatever the values, so the rate is that of
// decoding after an N-token prompt.
//
//   edge_bench_decode --model PATH [--batches 1,8,32] [--prompt 32] [--tokens 64] [--repeat 3]
//                     [--kv-cache-dtype bf16|fp8|f16|f32|auto[,...]] [--context N]
//                     [--weight-dtype int4|int8|fp8|bf16|f16|f32|auto[,...]] [--int4-group-size N]
//                     [--quantize-layers all|experts|all-and-classifier]
//
// --weight-dtype quantizes (or converts) the projection matrices on load; "weight GB/s" counts
// the bytes actually stored (values and scales) that a step read: for a Mixture-of-Experts model
// only the experts that ran (the last step's, from the executor's routing). Both dtype flags take a list: every weight
// dtype is measured with the first KV dtype, and the first weight dtype with every other KV
// dtype. All models stay loaded and, for each batch size, the configurations take turns run by
// run, so that the drifting load of a shared machine slows them alike. With more than one
// configuration the program ends with the comparison tables in the published layout (rows:
// batch; columns: configurations and their ratios).
#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/engine/generator.h"
#include "edge/common/format.h"
#include "edge/common/thread_pool.h"

namespace {

using clock_type = std::chrono::steady_clock;

struct options {
  std::string model;
  std::vector<std::int64_t> batches = {1, 8, 32};
  std::int64_t prompt = 32;
  std::int64_t tokens = 64;
  int repeat = 3;
  std::size_t threads = 0;
  std::vector<std::string> kv_cache_dtypes = {"bf16"};
  std::vector<std::string> weight_dtypes = {"auto"};
  std::int64_t context = 0;  // > 0: decode from this position without a prefill
  std::int64_t int4_group_size = edge::kernels::int4_traits::max_group_size;
  bool experts_only = false;  // --quantize-layers experts
  bool classifier = false;    // --quantize-layers all-and-classifier
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A ceiling is the best of several runs: noise on a shared machine only ever lowers it.
double best(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// Runs of each bandwidth measurement.
constexpr int bandwidth_runs = 7;

// Bytes of one large buffer: well past every cache level.
constexpr std::size_t bandwidth_buffer_bytes = std::size_t{1} << 30;

// memcpy across the pool's threads; bytes read plus bytes written per second.
double copy_bandwidth(edge::thread_pool* pool) {
  std::vector<char> src(bandwidth_buffer_bytes, 1), dst(bandwidth_buffer_bytes, 0);
  std::vector<double> rates;
  const std::size_t chunks = 64;
  for (int r = 0; r < bandwidth_runs + 1; ++r) {
    const auto start = clock_type::now();
    const auto copy = [&](std::size_t begin, std::size_t end) {
      for (std::size_t c = begin; c < end; ++c) {
        const std::size_t size = bandwidth_buffer_bytes / chunks;
        std::memcpy(dst.data() + c * size, src.data() + c * size, size);
      }
    };
    if (pool) pool->parallel_for(0, chunks, 1, copy); else copy(0, chunks);
    const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    if (r > 0) rates.push_back(2.0 * bandwidth_buffer_bytes / seconds);
  }
  return best(rates);
}

// Sum of n floats read as eight interleaved streams with a software prefetch 1 KiB ahead: the
// access pattern of the matmul kernel, and the fastest plain read pattern measured on this
// kind of machine (one stream reaches about 15% less).
constexpr int read_streams = 8;

// Written once for a vector of `lanes` floats; the two entry points below compile it for AVX-512
// (16 floats a load) and AVX2 (8), and sum_floats picks the one the CPU has.
template <int lanes>
struct float_vector;
template <>
struct float_vector<8> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct float_vector<16> {
  typedef float type __attribute__((vector_size(64)));
};

template <int lanes>
[[gnu::always_inline]] inline float sum_streams(const float* p, std::size_t n) {
  using vec = typename float_vector<lanes>::type;
  vec acc[read_streams] = {};
  const float* stream[read_streams];
  const std::size_t per_stream = n / read_streams;
  for (int s = 0; s < read_streams; ++s) stream[s] = p + static_cast<std::size_t>(s) * per_stream;
  for (std::size_t i = 0; i + lanes <= per_stream; i += lanes) {
#pragma GCC unroll 8
    for (int s = 0; s < read_streams; ++s) {
      _mm_prefetch(reinterpret_cast<const char*>(stream[s] + i) + 1024, _MM_HINT_T0);
      vec v;
      std::memcpy(&v, stream[s] + i, sizeof v);
      acc[s] += v;
    }
  }
  vec total = acc[0];
  for (int s = 1; s < read_streams; ++s) total += acc[s];
  return total[0];
}

__attribute__((target("avx512f"))) float sum_floats_avx512(const float* p, std::size_t n) {
  return sum_streams<16>(p, n);
}
__attribute__((target("avx2"))) float sum_floats_avx2(const float* p, std::size_t n) { return sum_streams<8>(p, n); }

float sum_floats(const float* p, std::size_t n) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  return avx512 ? sum_floats_avx512(p, n) : sum_floats_avx2(p, n);
}

// Bytes read per second summing a large buffer across the pool's threads.
double read_bandwidth(edge::thread_pool* pool) {
  std::vector<float> data(bandwidth_buffer_bytes / sizeof(float), 1.0f);
  std::vector<double> rates;
  const std::size_t chunks = 64;
  const std::size_t per_chunk = data.size() / chunks;
  volatile float sink = 0.0f;
  for (int r = 0; r < bandwidth_runs + 1; ++r) {
    std::vector<float> partial(chunks, 0.0f);
    const auto start = clock_type::now();
    const auto sum = [&](std::size_t begin, std::size_t end) {
      for (std::size_t c = begin; c < end; ++c) partial[c] = sum_floats(data.data() + c * per_chunk, per_chunk);
    };
    if (pool) pool->parallel_for(0, chunks, 1, sum); else sum(0, chunks);
    const double seconds = std::chrono::duration<double>(clock_type::now() - start).count();
    for (float x : partial) sink = sink + x;
    if (r > 0) rates.push_back(bandwidth_buffer_bytes / seconds);
  }
  return best(rates);
}

// Bytes of weights the executor's last decode step read: every matrix, except that of a
// Mixture-of-Experts layer's routed experts only those that ran (average expert size). At batch
// 1 that is footprint_of's active bytes per token.
double weight_bytes_of_step(const edge::backend::model& m, const edge::backend::executor& exec) {
  const edge::backend::weight_footprint f = edge::backend::footprint_of(m.config, m.weights);
  const edge::backend::expert_routing routing = exec.last_routing();
  if (routing.moe_layers == 0) return static_cast<double>(f.total_bytes);
  const double per_expert =
      static_cast<double>(f.routed_expert_bytes) / static_cast<double>(routing.moe_layers * routing.experts);
  const auto touched = std::count_if(routing.expert_tokens.begin(), routing.expert_tokens.end(),
                                     [](std::int32_t n) { return n > 0; });
  return static_cast<double>(f.total_bytes - f.routed_expert_bytes) + static_cast<double>(touched) * per_expert;
}

// Decodes `steps` tokens for each of `batch` sequences from position `context` on, one forward
// pass per step: the executor's step alone (the generator's runs time the whole serving step).
// The tokens fed are fixed rather than sampled: only the steps' time counts.
edge::result<edge::backend::generation_timing> decode_at_context(edge::backend::executor& exec, std::int64_t block_size,
                                                                 std::int64_t batch, std::int64_t context,
                                                                 std::int64_t steps) {
  const std::int64_t per_sequence = (context + steps + block_size - 1) / block_size;
  std::vector<std::int32_t> tables(static_cast<std::size_t>(batch * per_sequence));  // [batch, per_sequence]
  std::iota(tables.begin(), tables.end(), 0);
  std::vector<edge::backend::token_id> ids(static_cast<std::size_t>(batch));
  for (std::size_t b = 0; b < ids.size(); ++b) {
    ids[b] = static_cast<edge::backend::token_id>((7 + 101 * static_cast<std::int64_t>(b)) % exec.vocab_size());
  }
  std::vector<float> logits(static_cast<std::size_t>(batch * exec.vocab_size()));
  edge::backend::batch_plan plan;
  const auto start = clock_type::now();
  for (std::int64_t s = 0; s < steps; ++s) {
    plan.entries.clear();
    for (std::int64_t b = 0; b < batch; ++b) {
      plan.entries.push_back({.tokens = {&ids[static_cast<std::size_t>(b)], 1},
                              .start_position = context + s,
                              .block_table = std::span<const std::int32_t>(tables).subspan(
                                  static_cast<std::size_t>(b * per_sequence), static_cast<std::size_t>(per_sequence)),
                              .compute_logits = true});
    }
    if (auto st = exec.forward(plan, logits); !st.ok()) return st;
  }
  return edge::backend::generation_timing{.decode_seconds = std::chrono::duration<double>(clock_type::now() - start).count(),
                                          .decode_tokens = batch * steps,
                                          .decode_steps = steps};
}

std::vector<std::string> parse_names(const char* text) {
  std::vector<std::string> out;
  std::string item;
  for (const char* p = text;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!item.empty()) out.push_back(item);
      item.clear();
      if (*p == '\0') break;
    } else {
      item += *p;
    }
  }
  return out;
}

// One configuration: a model (weights as loaded) and a KV cache dtype, and its results.
struct measured_config {
  const edge::backend::model* m = nullptr;
  edge::kernels::dtype kv{};
  std::string weights;        // the projections' format as loaded
  std::vector<double> rates;  // [batches] median decode tokens/s
  std::vector<double> steps;  // [batches] median steps/s
  std::vector<double> step_bytes;  // [batches] weight bytes a decode step read
};

// A configuration ready to decode one batch size.
struct session {
  std::unique_ptr<edge::backend::kv_cache> cache;
  std::unique_ptr<edge::backend::cpu_executor> exec;
  std::unique_ptr<edge::backend::kv_block_pool> blocks;
  std::unique_ptr<edge::backend::generator> gen;
  std::vector<edge::backend::generate_request> requests;
  std::vector<double> rates, step_rates;
};

edge::result<session> open_session(const options& opt, const measured_config& c, std::int64_t batch,
                                   edge::thread_pool* pool) {
  const edge::backend::model& m = *c.m;
  session s;
  const std::int64_t positions = (std::max(opt.prompt, opt.context) + opt.tokens + 16) * batch;
  const auto layout = edge::backend::kv_cache_layout::for_tokens(m.config, c.kv, 16, positions + 16 * batch);
  EDGE_ASSIGN_OR_RETURN(s.cache, edge::backend::kv_cache::create(layout));
  EDGE_ASSIGN_OR_RETURN(s.exec, edge::backend::cpu_executor::create(
                                    m, *s.cache, pool,
                                    // At least a block: the generator's scheduler prefills whole blocks.
                                    {.max_batch_tokens = std::max({opt.prompt * batch, batch, layout.block_size}),
                                     .max_sequences = batch}));
  s.blocks = std::make_unique<edge::backend::kv_block_pool>(layout.num_blocks);
  s.gen = std::make_unique<edge::backend::generator>(m, *s.exec, *s.blocks);
  s.requests.resize(static_cast<std::size_t>(batch));
  for (std::size_t i = 0; i < s.requests.size(); ++i) {
    auto& r = s.requests[i];
    for (std::int64_t t = 0; t < opt.prompt; ++t) {
      r.prompt.push_back(static_cast<edge::backend::token_id>((7 + 13 * t + 101 * static_cast<std::int64_t>(i)) %
                                                              m.config.vocab_size));
    }
    r.max_tokens = opt.tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0.0f;
  }
  return s;
}

edge::result<edge::backend::generation_timing> run_once(const options& opt, session& s, std::int64_t batch) {
  if (opt.context > 0) return decode_at_context(*s.exec, s.cache->layout().block_size, batch, opt.context, opt.tokens);
  edge::backend::generation_timing timing;
  if (auto run = s.gen->run(s.requests, {}, &timing); !run.ok()) return run.error();
  return timing;
}

// Every batch size for every configuration. Within a batch size the configurations take turns
// run by run, so that a machine whose load drifts slows them alike and their ratios hold.
bool measure(const options& opt, std::vector<measured_config>& configs, edge::thread_pool* pool) {
  for (std::int64_t batch : opt.batches) {
    std::vector<session> sessions;
    for (const auto& c : configs) {
      auto s = open_session(opt, c, batch, pool);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.error().message().c_str());
        return false;
      }
      sessions.push_back(std::move(s).value());
    }
    for (int rep = 0; rep < opt.repeat + 1; ++rep) {
      for (std::size_t i = 0; i < configs.size(); ++i) {
        auto timing = run_once(opt, sessions[i], batch);
        if (!timing.ok()) {
          std::fprintf(stderr, "%s\n", timing.error().message().c_str());
          return false;
        }
        if (rep == 0) continue;  // warm-up
        sessions[i].rates.push_back(static_cast<double>(timing->decode_tokens) / timing->decode_seconds);
        sessions[i].step_rates.push_back(static_cast<double>(timing->decode_steps) / timing->decode_seconds);
      }
    }
    std::printf("batch %lld:", static_cast<long long>(batch));
    for (std::size_t i = 0; i < configs.size(); ++i) {
      configs[i].rates.push_back(median(sessions[i].rates));
      configs[i].steps.push_back(median(sessions[i].step_rates));
      configs[i].step_bytes.push_back(weight_bytes_of_step(*configs[i].m, *sessions[i].exec));
      std::printf("  %s/%s %.2f tok/s", configs[i].weights.c_str(), std::string(edge::kernels::to_string(configs[i].kv)).c_str(),
                  configs[i].rates.back());
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return true;
}

// One configuration's rows: tokens/s, steps/s and the weight bandwidth against the ceilings.
void print_details(const options& opt, const measured_config& c, double copy_bw, double read_bw) {
  const edge::backend::weight_footprint f = edge::backend::footprint_of(c.m->config, c.m->weights);
  std::printf("\nmodel %s (%s weights: %s in all, %s read per token at batch 1), KV cache %s\n", c.m->name.c_str(),
              c.weights.c_str(), edge::format_bytes(f.total_bytes).c_str(),
              edge::format_bytes(f.active_bytes_per_token).c_str(), std::string(edge::kernels::to_string(c.kv)).c_str());
  std::printf("%6s %12s %14s %14s %16s %12s %12s\n", "batch", "decode tok/s", "steps/s", "MB per step", "weight GB/s",
              "÷ copy bw", "÷ read bw");
  for (std::size_t i = 0; i < opt.batches.size(); ++i) {
    const double weight_bw = c.steps[i] * c.step_bytes[i];
    std::printf("%6lld %12.2f %14.2f %14.1f %16.2f %12.2f %12.2f\n", static_cast<long long>(opt.batches[i]), c.rates[i],
                c.steps[i], c.step_bytes[i] / 1e6, weight_bw / 1e9, weight_bw / copy_bw, weight_bw / read_bw);
  }
}

// Rows: batch; columns: each configuration's tokens/s, then each one's ratio to the first (and,
// with three columns, the last to the second: int4 against fp8).
void print_comparison(const std::string& title, const std::vector<std::int64_t>& batches,
                      const std::vector<std::string>& names, const std::vector<const std::vector<double>*>& columns) {
  std::printf("\n%s\n%6s", title.c_str(), "batch");
  for (const auto& name : names) std::printf(" %12s", name.c_str());
  std::vector<std::pair<std::size_t, std::size_t>> ratios;
  for (std::size_t c = 1; c < names.size(); ++c) ratios.push_back({c, 0});
  if (names.size() == 3) ratios.push_back({2, 1});
  for (const auto& [a, b] : ratios) std::printf(" %16s", (names[a] + " vs " + names[b]).c_str());
  std::printf("\n");
  for (std::size_t i = 0; i < batches.size(); ++i) {
    std::printf("%6lld", static_cast<long long>(batches[i]));
    for (const auto* column : columns) std::printf(" %12.2f", (*column)[i]);
    for (const auto& [a, b] : ratios) {
      std::printf(" %15.0f%%", 100.0 * ((*columns[a])[i] / (*columns[b])[i] - 1.0));
    }
    std::printf("\n");
  }
}

std::vector<std::int64_t> parse_list(const char* text) {
  std::vector<std::int64_t> out;
  for (const char* p = text; *p;) {
    out.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--model") opt.model = argv[i + 1];
    else if (flag == "--batches") opt.batches = parse_list(argv[i + 1]);
    else if (flag == "--prompt") opt.prompt = std::atoll(argv[i + 1]);
    else if (flag == "--tokens") opt.tokens = std::atoll(argv[i + 1]);
    else if (flag == "--repeat") opt.repeat = std::atoi(argv[i + 1]);
    else if (flag == "--threads") opt.threads = static_cast<std::size_t>(std::atoll(argv[i + 1]));
    else if (flag == "--kv-cache-dtype") opt.kv_cache_dtypes = parse_names(argv[i + 1]);
    else if (flag == "--weight-dtype") opt.weight_dtypes = parse_names(argv[i + 1]);
    else if (flag == "--context") opt.context = std::atoll(argv[i + 1]);
    else if (flag == "--int4-group-size") opt.int4_group_size = std::atoll(argv[i + 1]);
    else if (flag == "--quantize-layers") {
      opt.experts_only = std::string_view(argv[i + 1]) == "experts";
      opt.classifier = std::string_view(argv[i + 1]) == "all-and-classifier";
    }
    else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (opt.model.empty() || opt.weight_dtypes.empty() || opt.kv_cache_dtypes.empty()) {
    std::fprintf(stderr, "usage: edge_bench_decode --model PATH [--batches 1,8,32] [--prompt N] [--tokens N] [--repeat N] "
                         "[--threads N] [--kv-cache-dtype bf16|fp8|f16|f32|auto[,...]] [--context N] "
                         "[--weight-dtype int4|int8|fp8|bf16|f16|f32|auto[,...]] [--int4-group-size N] "
                         "[--quantize-layers all|experts|all-and-classifier]\n");
    return 2;
  }
  std::vector<std::optional<edge::kernels::dtype>> kv_choices;
  for (const auto& name : opt.kv_cache_dtypes) {
    const auto choice = edge::backend::parse_kv_cache_dtype(name);
    if (!choice.ok()) {
      std::fprintf(stderr, "%s\n", choice.error().message().c_str());
      return 2;
    }
    kv_choices.push_back(*choice);
  }
  for (const auto& name : opt.weight_dtypes) {
    if (!edge::kernels::parse_weight_format(name) && name != "auto") {
      std::fprintf(stderr, "unknown weight dtype %s: expected int4, fp8, bf16, f16, f32 or auto\n", name.c_str());
      return 2;
    }
  }
  const std::size_t threads = opt.threads ? opt.threads : std::max(1u, std::thread::hardware_concurrency());
  std::unique_ptr<edge::thread_pool> pool = threads > 1 ? std::make_unique<edge::thread_pool>(threads - 1) : nullptr;

  const double copy_bw = copy_bandwidth(pool.get());
  const double read_bw = read_bandwidth(pool.get());
  std::printf("%zu threads; memory bandwidth (best of %d): memcpy %.1f GB/s (bytes read + written), read %.1f GB/s\n",
              threads, bandwidth_runs, copy_bw / 1e9, read_bw / 1e9);
  if (opt.context > 0) {
    std::printf("decode from position %lld (no prefill), %lld steps, median of %d runs\n",
                static_cast<long long>(opt.context), static_cast<long long>(opt.tokens), opt.repeat);
  } else {
    std::printf("prompt %lld tokens, %lld generated, median of %d runs\n", static_cast<long long>(opt.prompt),
                static_cast<long long>(opt.tokens), opt.repeat);
  }

  // Every weight dtype with the first KV dtype; the first weight dtype with the other KV dtypes.
  // All models stay loaded, so that configurations can take turns.
  std::vector<std::unique_ptr<edge::backend::model>> models;
  std::vector<measured_config> configs;
  std::vector<std::size_t> by_weights, by_kv;  // indices into configs
  for (std::size_t w = 0; w < opt.weight_dtypes.size(); ++w) {
    auto loaded = edge::backend::load_model(
        {.path = opt.model, .weight_dtype = edge::kernels::parse_weight_format(opt.weight_dtypes[w]),
         .int4_group_size = opt.int4_group_size, .quantize_experts_only = opt.experts_only,
         .quantize_classifier = opt.classifier, .cpu_tiles = true});
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", loaded.error().message().c_str());
      return 1;
    }
    models.push_back(std::move(loaded).value());
    const edge::backend::model& m = *models.back();
    const std::string weights(edge::kernels::to_string(edge::backend::projection_format(m.weights)));
    for (std::size_t k = 0; k < kv_choices.size(); ++k) {
      if (w > 0 && k > 0) break;
      if (k == 0) by_weights.push_back(configs.size());
      if (w == 0) by_kv.push_back(configs.size());
      configs.push_back({.m = &m, .kv = edge::backend::resolve_kv_cache_dtype(kv_choices[k], m), .weights = weights});
    }
  }
  if (!measure(opt, configs, pool.get())) return 1;
  for (const auto& c : configs) print_details(opt, c, copy_bw, read_bw);
  const std::string model_name = models.front()->name;

  const auto compare = [&](const std::string& title, const std::vector<std::size_t>& chosen, bool kv) {
    if (chosen.size() < 2) return;
    std::vector<std::string> names;
    std::vector<const std::vector<double>*> columns;
    for (std::size_t i : chosen) {
      names.push_back(kv ? "KV " + std::string(edge::kernels::to_string(configs[i].kv)) : configs[i].weights);
      columns.push_back(&configs[i].rates);
    }
    print_comparison(title, opt.batches, names, columns);
  };
  compare(edge::format("decode tokens/s by weight dtype: {}, KV cache {}", model_name,
                       edge::kernels::to_string(configs[by_weights.front()].kv)),
          by_weights, false);
  compare(edge::format("decode tokens/s by KV cache dtype: {}, {} weights", model_name, configs[by_kv.front()].weights),
          by_kv, true);
  return 0;
}
