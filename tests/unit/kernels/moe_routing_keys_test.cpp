// The CUDA router's order and selection (moe_routing_keys.h) run on the host: the keys sort
// scores by the CPU router's rule, and the device's steps (repeated maxima of the keys, groups
// scored by group_score, weights by finish_weights) choose exactly what run_moe_routing
// chooses on the CPU, ties, NaNs and masked groups included.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/moe_routing/moe_routing.h"
#include "kernels/moe_routing/moe_routing_keys.h"

namespace {

namespace keys = edge::kernels::moe_routing_keys;
using edge::kernels::moe_routing_params;
using edge::kernels::router_scoring;

constexpr float not_a_number = std::numeric_limits<float>::quiet_NaN();
constexpr float infinity = std::numeric_limits<float>::infinity();

// The rule as moe_routing.h states it: larger first, lower id among equals, NaN last.
bool ranks_before(float a, std::int64_t a_id, float b, std::int64_t b_id) {
  if (std::isnan(a) != std::isnan(b)) return std::isnan(b);
  if (!std::isnan(a) && a != b) return a > b;
  return a_id < b_id;
}

// The id of the largest key not yet taken, which it then takes: one round of the device's
// block-wide maximum.
std::int32_t take_best(std::vector<std::uint64_t>& key) {
  const auto best = std::max_element(key.begin(), key.end());
  const std::int32_t id = keys::id_of(*best);
  *best = keys::taken;
  return id;
}

struct routed {
  std::vector<std::int32_t> experts;
  std::vector<float> weights;
};

// moe_routing.cu's steps for one token, one item at a time.
void device_route(const float* logits, const float* bias, const moe_routing_params& p, std::int32_t* experts,
                  float* weights) {
  const auto n = static_cast<std::size_t>(p.num_experts);
  std::vector<float> score(n), choice(n);
  if (p.scoring == router_scoring::softmax) {
    float m = -infinity;
    for (std::size_t e = 0; e < n; ++e) m = std::fmax(m, logits[e]);
    double total = 0.0;
    for (std::size_t e = 0; e < n; ++e) total += score[e] = std::exp(logits[e] - m);
    for (std::size_t e = 0; e < n; ++e) choice[e] = score[e] = static_cast<float>(score[e] / total);
  } else {
    for (std::size_t e = 0; e < n; ++e) {
      score[e] = 1.0f / (1.0f + std::exp(-logits[e]));
      choice[e] = score[e] + (bias != nullptr ? bias[e] : 0.0f);
    }
    if (p.groups > 1) {
      const auto size = n / static_cast<std::size_t>(p.groups);
      std::vector<std::uint64_t> group_key(static_cast<std::size_t>(p.groups));
      for (std::size_t g = 0; g < group_key.size(); ++g) {
        group_key[g] = keys::rank_key(keys::group_score(choice.data() + g * size, static_cast<std::int64_t>(size)),
                                      static_cast<std::int64_t>(g));
      }
      std::vector<bool> kept(group_key.size(), false);
      for (std::int64_t i = 0; i < p.top_groups; ++i) kept[static_cast<std::size_t>(take_best(group_key))] = true;
      for (std::size_t e = 0; e < n; ++e) {
        if (!kept[e / size]) choice[e] = 0.0f;
      }
    }
  }
  std::vector<std::uint64_t> key(n);
  for (std::size_t e = 0; e < n; ++e) key[e] = keys::rank_key(choice[e], static_cast<std::int64_t>(e));
  for (std::int64_t i = 0; i < p.top_k; ++i) {
    experts[i] = take_best(key);
    weights[i] = score[static_cast<std::size_t>(experts[i])];
  }
  keys::finish_weights(weights, p.top_k, p.normalize, p.scoring == router_scoring::sigmoid, p.scaling);
}

routed route(const std::vector<float>& logits, const std::vector<float>& bias, moe_routing_params p, bool device) {
  p.tokens = static_cast<std::int64_t>(logits.size()) / p.num_experts;
  p.logits_stride = p.num_experts;
  p.correction_bias = bias.empty() ? nullptr : bias.data();
  routed out{std::vector<std::int32_t>(static_cast<std::size_t>(p.tokens * p.top_k)),
             std::vector<float>(static_cast<std::size_t>(p.tokens * p.top_k))};
  if (device) {
    for (std::int64_t t = 0; t < p.tokens; ++t) {
      device_route(logits.data() + t * p.num_experts, p.correction_bias, p, out.experts.data() + t * p.top_k,
                   out.weights.data() + t * p.top_k);
    }
  } else {
    p.logits = logits.data();
    p.experts = out.experts.data();
    p.weights = out.weights.data();
    REQUIRE(edge::kernels::run_moe_routing(p, {}).ok());
  }
  return out;
}

}  // namespace

TEST_CASE("routing keys order scores by the router's rule: larger first, lower id among equals, NaN last") {
  const std::vector<float> values = {0.5f,          -0.0f,        0.0f,    not_a_number, infinity, -infinity, 0.5f,
                                     -not_a_number, 1e-45f,       -1e-45f, -2.0f,        0.25f,    infinity,  -infinity,
                                     1e-38f,        not_a_number, -0.125f, 0.0f,         3.0f,     -0.0f};
  std::vector<std::int64_t> by_key(values.size()), by_rule(values.size());
  std::iota(by_key.begin(), by_key.end(), 0);
  std::iota(by_rule.begin(), by_rule.end(), 0);
  std::sort(by_key.begin(), by_key.end(), [&](std::int64_t a, std::int64_t b) {
    return keys::rank_key(values[a], a) > keys::rank_key(values[b], b);
  });
  std::sort(by_rule.begin(), by_rule.end(),
            [&](std::int64_t a, std::int64_t b) { return ranks_before(values[a], a, values[b], b); });
  CHECK(by_key == by_rule);
  for (std::size_t i = 0; i < values.size(); ++i) {
    CHECK(keys::rank_key(values[i], static_cast<std::int64_t>(i)) != keys::taken);
    CHECK(keys::id_of(keys::rank_key(values[i], static_cast<std::int64_t>(i))) == static_cast<std::int32_t>(i));
  }
  // The ids the router can have, at both ends.
  CHECK(keys::id_of(keys::rank_key(not_a_number, edge::kernels::max_router_experts - 1)) ==
        edge::kernels::max_router_experts - 1);
  CHECK(keys::rank_key(-infinity, 5) > keys::rank_key(not_a_number, 0));
  CHECK(keys::rank_key(-0.0f, 3) < keys::rank_key(0.0f, 2));
  CHECK(keys::rank_key(-0.0f, 2) > keys::rank_key(0.0f, 3));
}

TEST_CASE("a group's score is the sum of its two best choice values, best first") {
  const std::vector<float> group = {0.25f, not_a_number, 0.75f, 0.5f, 0.75f};
  CHECK(keys::group_score(group.data(), 5) == 1.5f);
  CHECK(keys::group_score(group.data(), 1) == 0.25f);
  const std::vector<float> all_nan = {not_a_number, not_a_number};
  CHECK(std::isnan(keys::group_score(all_nan.data(), 2)));
  const std::vector<float> one_number = {not_a_number, -3.0f};
  CHECK(std::isnan(keys::group_score(one_number.data(), 2)));  // -3, then NaN
}

TEST_CASE("the CUDA router's steps choose what the CPU router chooses, ties and NaNs included") {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  // {experts, top_k, groups, top_groups}: Qwen3-MoE (128 / 8), DeepSeek-V3 (256 / 8 in 8 groups,
  // 4 kept), Kimi K2 (384 / 8), the largest router, and groups of one.
  for (const auto& [experts, top_k, groups, top_groups] : std::vector<std::array<std::int64_t, 4>>{
           {128, 8, 1, 1}, {256, 8, 8, 4}, {384, 8, 1, 1}, {1024, 16, 32, 3}, {16, 4, 16, 5}, {8, 8, 1, 1}}) {
    CAPTURE(experts);
    for (const bool coarse : {false, true}) {
      // Coarse logits (multiples of 1/4) tie often, in the scores and in the group sums.
      std::vector<float> logits(static_cast<std::size_t>(61 * experts));
      for (float& v : logits) v = coarse ? std::round(4.0f * normal(rng)) / 4.0f : normal(rng);
      for (std::size_t i = 3; i < logits.size(); i += 97) logits[i] = not_a_number;
      logits[5] = -infinity;
      logits[static_cast<std::size_t>(experts) + 2] = infinity;
      // A row of NaNs: every expert ties at the bottom.
      for (std::int64_t e = 0; e < experts; ++e) logits[static_cast<std::size_t>(7 * experts + e)] = not_a_number;
      std::vector<float> bias(static_cast<std::size_t>(experts));
      for (float& v : bias) v = coarse ? std::round(8.0f * normal(rng)) / 64.0f : 0.05f * normal(rng);
      // A bias that makes every choice negative: masked experts (ranked as 0) win.
      std::vector<float> negative(static_cast<std::size_t>(experts), -2.0f);
      for (const bool normalize : {false, true}) {
        if (groups == 1) {
          const moe_routing_params softmax{
              .num_experts = experts, .top_k = top_k, .scoring = router_scoring::softmax, .normalize = normalize};
          const routed cpu = route(logits, {}, softmax, false);
          const routed device = route(logits, {}, softmax, true);
          CHECK(device.experts == cpu.experts);
          CHECK(std::memcmp(device.weights.data(), cpu.weights.data(), cpu.weights.size() * sizeof(float)) == 0);
        }
        for (const auto* b : {&bias, &negative}) {
          const moe_routing_params sigmoid{.num_experts = experts,
                                           .top_k = top_k,
                                           .scoring = router_scoring::sigmoid,
                                           .groups = groups,
                                           .top_groups = top_groups,
                                           .normalize = normalize,
                                           .scaling = 2.5f};
          const routed cpu = route(logits, *b, sigmoid, false);
          const routed device = route(logits, *b, sigmoid, true);
          CHECK(device.experts == cpu.experts);
          // Bit for bit (NaN weights of the NaN row compare by their bits).
          CHECK(std::memcmp(device.weights.data(), cpu.weights.data(), cpu.weights.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}
