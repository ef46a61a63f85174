// Loading a model and running it through the CPU forward pass in a test, shared by the model
// tests.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <set>
#include <vector>

#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/backend/runtime/kv_cache.h"

namespace edge::testing {

inline std::unique_ptr<backend::model> load(const std::filesystem::path& path) {
  auto loaded = backend::load_model({.path = path});
  REQUIRE_MESSAGE(loaded.ok(), loaded.error().to_string());
  return std::move(loaded).value();
}

// What teacher-forcing a model through `tokens` gave: each step's logits and the experts each
// of its MoE layers chose for that step's token.
struct forced_run {
  std::vector<std::vector<float>> logits;           // [steps][vocab]
  std::vector<std::vector<std::int32_t>> choices;   // [steps][moe layers × top_k], best first
  std::int64_t moe_layers = 0;
};

// Feeds `tokens` one a step through an f32 KV cache of its own, as decoding runs.
inline forced_run force(const backend::model& m, const std::vector<backend::token_id>& tokens) {
  constexpr std::int64_t block_size = 16;
  const auto positions = static_cast<std::int64_t>(tokens.size());
  auto cache = backend::kv_cache::create(
      backend::kv_cache_layout::for_tokens(m.config, kernels::dtype::f32, block_size, positions));
  REQUIRE(cache.ok());
  auto exec = backend::cpu_executor::create(m, **cache, nullptr, {.max_batch_tokens = 1, .max_sequences = 1});
  REQUIRE(exec.ok());
  backend::kv_block_pool pool((*cache)->layout().num_blocks);
  std::vector<std::int32_t> blocks;
  for (std::int64_t b = 0; b < (positions + block_size - 1) / block_size; ++b) blocks.push_back(*pool.allocate());
  forced_run run;
  for (std::int64_t p = 0; p < positions; ++p) {
    backend::batch_plan plan;
    plan.entries.push_back({.tokens = {&tokens[static_cast<std::size_t>(p)], 1}, .start_position = p,
                            .block_table = blocks, .compute_logits = true});
    std::vector<float> row(static_cast<std::size_t>(m.config.vocab_size));
    REQUIRE((*exec)->forward(plan, row).ok());
    run.logits.push_back(std::move(row));
    const backend::expert_routing routing = (*exec)->last_routing();
    if (routing.moe_layers > 0) REQUIRE(routing.tokens == 1);
    run.moe_layers = routing.moe_layers;
    run.choices.emplace_back(routing.choices.begin(), routing.choices.end());
  }
  return run;
}

// The largest |a - b| over two runs' logits, as a share of the largest |logit| (at least 1).
inline float logit_difference(const forced_run& a, const forced_run& b) {
  float largest = 1.0f, difference = 0.0f;
  for (std::size_t p = 0; p < a.logits.size(); ++p) {
    for (std::size_t v = 0; v < a.logits[p].size(); ++v) {
      largest = std::max(largest, std::abs(a.logits[p][v]));
      difference = std::max(difference, std::abs(a.logits[p][v] - b.logits[p][v]));
    }
  }
  return difference / largest;
}

// Two forms of one model chose the same experts at every step, and the steps spread over at least
// `min_distinct` experts, so that a misplaced expert would show.
inline void check_same_experts(const forced_run& a, const forced_run& b, std::size_t min_distinct) {
  REQUIRE(a.choices.size() == b.choices.size());
  std::set<std::int32_t> chosen;
  for (std::size_t p = 0; p < a.choices.size(); ++p) {
    CAPTURE(p);
    CHECK(a.choices[p] == b.choices[p]);
    chosen.insert(a.choices[p].begin(), a.choices[p].end());
  }
  CHECK(chosen.size() >= min_distinct);
}

}  // namespace edge::testing
