// 64 concurrent streams on a small KV budget, fp8 against bf16, on the real engine with the CPU
// executor: the budget holds exactly 64 streams' worth of blocks in fp8; the same bytes in
// bf16 hold fewer blocks, by the ratio the capacity arithmetic predicts (bf16 bytes per token
// ÷ fp8's, scales included). For each dtype and admission policy it prints the blocks, how many
// streams ran at once, how many completed, preemptions and the wall time.
//
//   edge_bench_kv_admission --model PATH [--model PATH ...] [--prompt N] [--tokens N]
//
// A benchmark: it prints, it asserts nothing (tests/unit/backend/engine checks the same effect).
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/engine/engine.h"
#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/runtime/kv_cache.h"
#include "edge/common/thread_pool.h"

namespace {

using namespace edge::backend;
namespace kernels = edge::kernels;

constexpr int streams = 64;
constexpr std::int64_t block_size = 16;

class peak_observer final : public engine_observer {
 public:
  void on_step(const engine_step_report& report) override {
    std::lock_guard lock(mutex_);
    peak_running_ = std::max(peak_running_, report.running);
  }
  std::int64_t peak() {
    std::lock_guard lock(mutex_);
    return peak_running_;
  }

 private:
  std::mutex mutex_;
  std::int64_t peak_running_ = 0;
};

struct finish_counter {
  std::mutex mutex;
  std::condition_variable done;
  int finished = 0;
  int completed = 0;  // finished with length
  std::int64_t preempted = 0;
};

struct run_result {
  std::int64_t blocks = 0;
  std::int64_t peak_running = 0;
  int completed = 0;
  std::int64_t preemptions = 0;
  double seconds = 0.0;
};

run_result run(const model& m, kernels::dtype kv, std::size_t budget, admission_policy policy, std::int64_t prompt_tokens,
               std::int64_t max_tokens, edge::thread_pool* pool) {
  const kv_cache_layout layout = kv_cache_layout::for_budget(m.config, kv, block_size, budget);
  auto cache = kv_cache::create(layout);
  if (!cache.ok()) {
    std::fprintf(stderr, "%s\n", cache.error().message().c_str());
    std::exit(1);
  }
  kv_block_pool blocks(layout.num_blocks);
  engine_options options;
  options.scheduler = {.block_size = block_size, .max_num_seqs = streams, .max_num_batched_tokens = 2048,
                       .admission = policy, .enable_prefix_caching = false, .watermark = 0.0};
  peak_observer peaks;
  options.observer = &peaks;
  auto exec = cpu_executor::create(m, **cache, pool, {.max_batch_tokens = 2048, .max_sequences = streams});
  if (!exec.ok()) {
    std::fprintf(stderr, "%s\n", exec.error().message().c_str());
    std::exit(1);
  }
  finish_counter counter;
  auto eng = engine::create(*m.tok, **exec, blocks, m.config.max_position, options);
  if (!eng.ok()) {
    std::fprintf(stderr, "%s\n", eng.error().message().c_str());
    std::exit(1);
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<request_handle> handles;
  for (int i = 0; i < streams; ++i) {
    generate_request r;
    r.prompt.resize(static_cast<std::size_t>(prompt_tokens));
    for (std::int64_t k = 0; k < prompt_tokens; ++k) {
      // Byte tokens and up, different per stream: nothing is shared.
      r.prompt[static_cast<std::size_t>(k)] = static_cast<token_id>(3 + (i * 31 + k * 7) % (m.config.vocab_size - 3));
    }
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0.0f;
    auto h = (*eng)->submit(std::move(r), [&counter](engine_event e) {
      if (auto* f = std::get_if<finished_event>(&e)) {
        {
          std::lock_guard lock(counter.mutex);
          ++counter.finished;
          counter.completed += f->reason == finish_reason::length ? 1 : 0;
          counter.preempted += f->timings.preemptions;
        }
        counter.done.notify_all();
      }
    });
    if (!h.ok()) {
      std::fprintf(stderr, "submit: %s\n", h.error().message().c_str());
      std::exit(1);
    }
    handles.push_back(std::move(h).value());
  }
  {
    std::unique_lock lock(counter.mutex);
    counter.done.wait(lock, [&] { return counter.finished == streams; });
  }
  run_result out;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  out.blocks = layout.num_blocks;
  out.peak_running = peaks.peak();
  out.completed = counter.completed;
  out.preemptions = (*eng)->stats().preemptions;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> models;
  std::int64_t prompt_tokens = 16;
  std::int64_t max_tokens = 48;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--model") models.emplace_back(argv[i + 1]);
    else if (flag == "--prompt") prompt_tokens = std::atoll(argv[i + 1]);
    else if (flag == "--tokens") max_tokens = std::atoll(argv[i + 1]);
    else {
      std::fprintf(stderr, "usage: %s --model PATH [--model PATH ...] [--prompt N] [--tokens N]\n", argv[0]);
      return 2;
    }
  }
  if (models.empty()) {
    std::fprintf(stderr, "usage: %s --model PATH [--model PATH ...] [--prompt N] [--tokens N]\n", argv[0]);
    return 2;
  }
  edge::thread_pool pool(1);
  for (const auto& path : models) {
    auto loaded = load_model({.path = path, .cpu_tiles = true});
    if (!loaded.ok()) {
      std::fprintf(stderr, "%s\n", loaded.error().message().c_str());
      return 1;
    }
    const model& m = **loaded;
    // fp8 blocks for every stream's prompt + max_tokens, exactly.
    const std::int64_t per_stream = (prompt_tokens + max_tokens + block_size - 1) / block_size;
    const kv_cache_layout fp8 =
        kv_cache_layout::for_tokens(m.config, kernels::dtype::fp8_e4m3, block_size, streams * per_stream * block_size);
    const std::size_t budget = fp8.bytes_per_block() * static_cast<std::size_t>(fp8.num_blocks);
    const kv_cache_capacity capacity = kv_cache_capacity_for(m.config, kernels::dtype::fp8_e4m3, block_size, budget);
    // What one token caches per layer: K and V rows of each KV head, or a latent row (and an index key).
    const kv_cache_layout rows = kv_cache_layout::rows_of(m.config);
    std::printf("== %s: %lld layers, %lld cached rows of %lld + %lld per token and layer; %d streams of %lld prompt + "
                "%lld generated tokens ==\n",
                path.c_str(), static_cast<long long>(rows.num_layers), static_cast<long long>(rows.num_kv_heads),
                static_cast<long long>(rows.head_dim), static_cast<long long>(rows.value_dim), streams,
                static_cast<long long>(prompt_tokens), static_cast<long long>(max_tokens));
    std::printf("budget %zu bytes: %s\n", budget, format_kv_cache_capacity(capacity).c_str());
    std::printf("| admission | KV | blocks | streams at once | completed | preemptions | wall s |\n|---|---|---|---|---|---|---|\n");
    std::int64_t fp8_peak = 0, bf16_peak = 0;
    for (const auto policy : {admission_policy::reserve, admission_policy::optimistic}) {
      for (const auto kv : {kernels::dtype::fp8_e4m3, kernels::dtype::bf16}) {
        const run_result r = run(m, kv, budget, policy, prompt_tokens, max_tokens, &pool);
        std::printf("| %s | %s | %lld | %lld | %d/%d | %lld | %.2f |\n", std::string(to_string(policy)).c_str(),
                    std::string(kernels::to_string(kv)).c_str(), static_cast<long long>(r.blocks),
                    static_cast<long long>(r.peak_running), r.completed, streams, static_cast<long long>(r.preemptions),
                    r.seconds);
        if (policy == admission_policy::reserve) (kv == kernels::dtype::fp8_e4m3 ? fp8_peak : bf16_peak) = r.peak_running;
      }
    }
    std::printf("streams at once under reserve, fp8 / bf16: %lld / %lld = %.3f; capacity arithmetic predicts %.3f\n\n",
                static_cast<long long>(fp8_peak), static_cast<long long>(bf16_peak),
                static_cast<double>(fp8_peak) / static_cast<double>(bf16_peak), capacity.ratio_to_bf16);
    std::fflush(stdout);
  }
  return 0;
}
