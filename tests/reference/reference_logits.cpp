// The C++ engine's side of the reference check (check_logits.py): the CPU forward pass's logits
// at every position of a prompt, teacher-forced one token at a time through the KV cache as
// decoding runs, and the greedy continuation after it.
//
//   edge_reference_logits MODEL OUT_FILE STEPS ID...
//
// Writes [len(ids), vocab] float32 logits (little-endian) to OUT_FILE and prints
// {"vocab": V, "greedy": [ids...], "moe_layers": [layer indices], "top_k": K} on stdout. For a
// Mixture-of-Experts model it also writes OUT_FILE.experts: [len(ids), moe layers, K] int32, the
// experts each prompt position chose in each MoE layer, in ascending order. Exit 1 on any
// error, with the reason on stderr.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/backend/runtime/kv_cache.h"

namespace {

using namespace edge::backend;

int fail(const std::string& why) {
  std::fprintf(stderr, "edge_reference_logits: %s\n", why.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) return fail("usage: edge_reference_logits MODEL OUT_FILE STEPS ID...");
  const int steps = std::atoi(argv[3]);
  std::vector<token_id> ids;
  for (int i = 4; i < argc; ++i) ids.push_back(static_cast<token_id>(std::atoi(argv[i])));
  auto loaded = load_model({.path = argv[1]});
  if (!loaded.ok()) return fail(loaded.error().message());
  const model& m = **loaded;
  const std::int64_t vocab = m.config.vocab_size;
  constexpr std::int64_t block_size = 16;
  const auto positions = static_cast<std::int64_t>(ids.size()) + steps;
  auto cache = kv_cache::create(kv_cache_layout::for_tokens(m.config, edge::kernels::dtype::f32, block_size, positions));
  if (!cache.ok()) return fail(cache.error().message());
  auto exec = cpu_executor::create(m, **cache, nullptr, {.max_batch_tokens = 1, .max_sequences = 1});
  if (!exec.ok()) return fail(exec.error().message());
  kv_block_pool pool((*cache)->layout().num_blocks);
  std::vector<std::int32_t> blocks;
  for (std::int64_t b = 0; b < (positions + block_size - 1) / block_size; ++b) blocks.push_back(*pool.allocate());

  // One token a step: each position's logits, then the continuation from the last.
  std::vector<float> row(static_cast<std::size_t>(vocab));
  std::vector<float> prompt_logits;
  std::vector<std::int32_t> prompt_experts;  // [prompt, moe layers, top_k]
  std::int64_t top_k = 0;
  std::vector<token_id> sequence = ids;
  std::vector<token_id> greedy;
  const auto prompt = static_cast<std::int64_t>(ids.size());
  // The prompt's positions, then one more for each continuation token but the last.
  const std::int64_t fed = std::max(prompt, prompt + steps - 1);
  for (std::int64_t p = 0; p < fed; ++p) {
    batch_plan plan;
    plan.entries.push_back({.tokens = {&sequence[static_cast<std::size_t>(p)], 1}, .start_position = p,
                            .block_table = blocks, .compute_logits = true});
    if (const auto s = (*exec)->forward(plan, row); !s.ok()) return fail(s.message());
    if (p < prompt) {
      prompt_logits.insert(prompt_logits.end(), row.begin(), row.end());
      const expert_routing routing = (*exec)->last_routing();
      top_k = routing.top_k;
      for (std::int64_t layer = 0; layer < routing.moe_layers; ++layer) {
        const auto first = routing.choices.begin() + layer * routing.top_k;  // one token a step
        std::vector<std::int32_t> chosen(first, first + routing.top_k);
        std::sort(chosen.begin(), chosen.end());
        prompt_experts.insert(prompt_experts.end(), chosen.begin(), chosen.end());
      }
    }
    if (p + 1 >= prompt && static_cast<int>(greedy.size()) < steps) {
      token_id best = 0;
      for (std::int64_t v = 1; v < vocab; ++v) {
        if (row[static_cast<std::size_t>(v)] > row[static_cast<std::size_t>(best)]) best = static_cast<token_id>(v);
      }
      greedy.push_back(best);
      sequence.push_back(best);
    }
  }
  std::ofstream out(argv[2], std::ios::binary);
  out.write(reinterpret_cast<const char*>(prompt_logits.data()),
            static_cast<std::streamsize>(prompt_logits.size() * sizeof(float)));
  if (!out) return fail(std::string("cannot write ") + argv[2]);
  if (!prompt_experts.empty()) {
    std::ofstream experts(std::string(argv[2]) + ".experts", std::ios::binary);
    experts.write(reinterpret_cast<const char*>(prompt_experts.data()),
                  static_cast<std::streamsize>(prompt_experts.size() * sizeof(std::int32_t)));
    if (!experts) return fail(std::string("cannot write ") + argv[2] + ".experts");
  }
  std::printf("{\"vocab\": %lld, \"greedy\": [", static_cast<long long>(vocab));
  for (std::size_t i = 0; i < greedy.size(); ++i) std::printf("%s%d", i == 0 ? "" : ", ", greedy[i]);
  std::printf("], \"moe_layers\": [");
  bool first_layer = true;
  for (std::int64_t layer = 0; layer < m.config.num_layers; ++layer) {
    if (!m.config.moe || !m.config.moe->sparse(layer)) continue;
    std::printf("%s%lld", first_layer ? "" : ", ", static_cast<long long>(layer));
    first_layer = false;
  }
  std::printf("], \"top_k\": %lld}\n", static_cast<long long>(top_k));
  return 0;
}
