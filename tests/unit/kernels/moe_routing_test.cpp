// The MoE routers (moe_routing.h) on hand-checked cases, and against a plain reference (every
// expert sorted, groups by enumerating their members) over random logits.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/moe_routing/moe_routing.h"

namespace {

using edge::kernels::moe_routing_params;
using edge::kernels::router_scoring;

struct routed {
  std::vector<std::int32_t> experts;
  std::vector<float> weights;
};

routed route(std::vector<float> logits, std::int64_t experts, std::int64_t top_k, moe_routing_params p) {
  const auto tokens = static_cast<std::int64_t>(logits.size()) / experts;
  routed out{std::vector<std::int32_t>(static_cast<std::size_t>(tokens * top_k)),
             std::vector<float>(static_cast<std::size_t>(tokens * top_k))};
  p.logits = logits.data();
  p.experts = out.experts.data();
  p.weights = out.weights.data();
  p.tokens = tokens;
  p.num_experts = experts;
  p.top_k = top_k;
  p.logits_stride = experts;
  REQUIRE(edge::kernels::run_moe_routing(p, {}).ok());
  return out;
}

float logit_of(double probability) { return static_cast<float>(std::log(probability / (1.0 - probability))); }

// The plain reference: scores computed directly, every expert (and group) sorted.
routed reference(const std::vector<float>& logits, std::int64_t n, std::int64_t top_k, const moe_routing_params& p,
                 const std::vector<float>& bias) {
  const auto tokens = static_cast<std::int64_t>(logits.size()) / n;
  routed out;
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<double> score(static_cast<std::size_t>(n)), choice(static_cast<std::size_t>(n));
    const float* row = logits.data() + t * n;
    if (p.scoring == router_scoring::softmax) {
      double total = 0.0;
      const float m = *std::max_element(row, row + n);
      for (std::int64_t e = 0; e < n; ++e) total += std::exp(static_cast<double>(row[e] - m));
      for (std::int64_t e = 0; e < n; ++e) choice[e] = score[e] = std::exp(static_cast<double>(row[e] - m)) / total;
    } else {
      for (std::int64_t e = 0; e < n; ++e) {
        score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(row[e])));
        choice[e] = score[e] + (bias.empty() ? 0.0 : bias[e]);
      }
      const std::int64_t size = n / p.groups;
      std::vector<std::pair<double, std::int64_t>> groups;
      for (std::int64_t g = 0; g < p.groups; ++g) {
        std::vector<double> members(choice.begin() + g * size, choice.begin() + (g + 1) * size);
        std::sort(members.begin(), members.end(), std::greater<>());
        groups.push_back({members[0] + (size > 1 ? members[1] : 0.0), g});
      }
      std::sort(groups.begin(), groups.end(),
                [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
      std::vector<bool> keep(static_cast<std::size_t>(p.groups), false);
      for (std::int64_t i = 0; i < p.top_groups; ++i) keep[static_cast<std::size_t>(groups[i].second)] = true;
      for (std::int64_t e = 0; e < n; ++e) {
        if (!keep[static_cast<std::size_t>(e / size)]) choice[e] = 0.0;
      }
    }
    std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    std::sort(ids.begin(), ids.end(), [&](std::int64_t a, std::int64_t b) {
      return choice[a] > choice[b] || (choice[a] == choice[b] && a < b);
    });
    double sum = 0.0;
    for (std::int64_t i = 0; i < top_k; ++i) sum += score[ids[i]];
    for (std::int64_t i = 0; i < top_k; ++i) {
      out.experts.push_back(static_cast<std::int32_t>(ids[i]));
      double w = score[ids[i]];
      if (p.normalize) w /= sum + (p.scoring == router_scoring::sigmoid ? 1e-20 : 0.0);
      if (p.scoring == router_scoring::sigmoid) w *= p.scaling;
      out.weights.push_back(static_cast<float>(w));
    }
  }
  return out;
}

}  // namespace

TEST_CASE("softmax routing picks the top-k probabilities and can renormalise them (Qwen3-MoE)") {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  const double total = std::exp(1.0) + std::exp(3.0) + std::exp(2.0) + 1.0;
  const routed plain = route(logits, 4, 2, {.scoring = router_scoring::softmax});
  CHECK(plain.experts == std::vector<std::int32_t>{1, 2});
  CHECK(plain.weights[0] == doctest::Approx(std::exp(3.0) / total));
  CHECK(plain.weights[1] == doctest::Approx(std::exp(2.0) / total));
  const routed normalised = route(logits, 4, 2, {.scoring = router_scoring::softmax, .normalize = true});
  CHECK(normalised.weights[0] == doctest::Approx(std::exp(3.0) / (std::exp(3.0) + std::exp(2.0))));
  CHECK(normalised.weights[0] + normalised.weights[1] == doctest::Approx(1.0));
  // Ties go to the lower id; a NaN logit is never preferred to a number.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(route({0.5f, 0.5f, 0.5f}, 3, 2, {.scoring = router_scoring::softmax}).experts == std::vector<std::int32_t>{0, 1});
  CHECK(route({nan, 0.5f, -9.0f}, 3, 1, {.scoring = router_scoring::sigmoid}).experts == std::vector<std::int32_t>{1});
}

TEST_CASE("sigmoid routing chooses by score plus correction bias and weighs by the score alone (DeepSeek-V3, GLM-4.5)") {
  const std::vector<float> bias = {0.0f, 0.1f, 0.0f, 0.2f};
  const routed r = route({0.0f, 0.0f, 0.0f, 0.0f}, 4, 2,
                         {.correction_bias = bias.data(), .scoring = router_scoring::sigmoid, .scaling = 2.5f});
  CHECK(r.experts == std::vector<std::int32_t>{3, 1});
  CHECK(r.weights[0] == doctest::Approx(0.5 * 2.5));  // sigmoid(0), never the bias
  const routed normalised = route({0.0f, 0.0f, 0.0f, 0.0f}, 4, 2,
                                  {.correction_bias = bias.data(), .scoring = router_scoring::sigmoid,
                                   .normalize = true, .scaling = 2.5f});
  CHECK(normalised.weights[0] == doctest::Approx(0.5 * 2.5));
  CHECK(normalised.weights[1] == doctest::Approx(0.5 * 2.5));
}

TEST_CASE("group-limited routing keeps only the best groups by the sum of their two best scores") {
  // 4 groups of 2: {0.9, 0.1} sums 1.0, {0.6, 0.6} 1.2, {0.55, 0.55} 1.1, {0.2, 0.2} 0.4. With two
  // groups kept, expert 0 (the best alone) is out, and the top 2 come from groups 1 and 2.
  std::vector<float> logits;
  for (const double p : {0.9, 0.1, 0.6, 0.6, 0.55, 0.55, 0.2, 0.2}) logits.push_back(logit_of(p));
  const routed r = route(logits, 8, 2, {.scoring = router_scoring::sigmoid, .groups = 4, .top_groups = 2});
  CHECK(r.experts == std::vector<std::int32_t>{2, 3});
  const routed one = route(logits, 8, 3, {.scoring = router_scoring::sigmoid, .groups = 4, .top_groups = 2});
  CHECK(one.experts == std::vector<std::int32_t>{2, 3, 4});
  // As transformers masks them, experts outside the kept groups rank as 0: with a bias that
  // makes every kept choice negative, a masked expert is chosen (with its own score as weight).
  const std::vector<float> negative(8, -2.0f);
  const routed masked = route(logits, 8, 2,
                              {.correction_bias = negative.data(), .scoring = router_scoring::sigmoid, .groups = 4,
                               .top_groups = 2});
  CHECK(masked.experts == std::vector<std::int32_t>{0, 1});
  CHECK(masked.weights[0] == doctest::Approx(0.9).epsilon(1e-5));
}

TEST_CASE("the routers agree with the plain reference over random logits") {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (const auto& [experts, top_k, groups, top_groups] :
       std::vector<std::array<std::int64_t, 4>>{{8, 2, 1, 1}, {64, 8, 8, 4}, {128, 8, 1, 1}, {256, 8, 8, 4}, {384, 8, 1, 1}}) {
    CAPTURE(experts);
    std::vector<float> logits(static_cast<std::size_t>(37 * experts));
    for (float& v : logits) v = normal(rng);
    std::vector<float> bias(static_cast<std::size_t>(experts));
    for (float& v : bias) v = 0.05f * normal(rng);
    for (const bool normalize : {false, true}) {
      const moe_routing_params softmax{.scoring = router_scoring::softmax, .normalize = normalize};
      if (groups == 1) {
        const routed got = route(logits, experts, top_k, softmax);
        const routed want = reference(logits, experts, top_k, softmax, {});
        CHECK(got.experts == want.experts);
        for (std::size_t i = 0; i < got.weights.size(); ++i) CHECK(got.weights[i] == doctest::Approx(want.weights[i]).epsilon(1e-5));
      }
      const moe_routing_params sigmoid{.correction_bias = bias.data(), .scoring = router_scoring::sigmoid,
                                       .groups = groups, .top_groups = top_groups, .normalize = normalize,
                                       .scaling = 2.5f};
      const routed got = route(logits, experts, top_k, sigmoid);
      const routed want = reference(logits, experts, top_k, sigmoid, bias);
      CHECK(got.experts == want.experts);
      for (std::size_t i = 0; i < got.weights.size(); ++i) CHECK(got.weights[i] == doctest::Approx(want.weights[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("moe routing refuses shapes outside its rules") {
  std::vector<float> logits(8);
  std::vector<std::int32_t> experts(8);
  std::vector<float> weights(8);
  const auto check = [&](moe_routing_params p) {
    p.logits = logits.data();
    p.experts = experts.data();
    p.weights = weights.data();
    p.tokens = 1;
    return edge::kernels::run_moe_routing(p, {});
  };
  CHECK(check({.num_experts = 8, .top_k = 2, .logits_stride = 8}).ok());
  CHECK_FALSE(check({.num_experts = 8, .top_k = 9, .logits_stride = 8}).ok());
  CHECK_FALSE(check({.num_experts = 8, .top_k = 0, .logits_stride = 8}).ok());
  CHECK_FALSE(check({.num_experts = 8, .top_k = 2, .logits_stride = 4}).ok());
  CHECK_FALSE(check({.num_experts = 8, .top_k = 2, .logits_stride = 8, .scoring = router_scoring::sigmoid, .groups = 3}).ok());
  CHECK_FALSE(check({.num_experts = 8, .top_k = 4, .logits_stride = 8, .scoring = router_scoring::sigmoid, .groups = 4,
                     .top_groups = 1})
                  .ok());  // one group of 2 cannot hold 4
  CHECK_FALSE(check({.num_experts = 8, .top_k = 2, .logits_stride = 8, .groups = 2, .top_groups = 1}).ok());  // softmax
}
