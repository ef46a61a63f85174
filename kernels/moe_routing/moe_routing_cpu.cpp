#include "kernels/moe_routing/moe_routing.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <numeric>

#include "edge/common/format.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cuda/launchers.h"
#include "kernels/moe_routing/moe_routing_keys.h"

namespace edge::kernels {
namespace {

// Larger first, lower id first among equals, NaN last.
bool ranks_before(float a, std::int64_t a_id, float b, std::int64_t b_id) {
  const bool a_nan = std::isnan(a);
  const bool b_nan = std::isnan(b);
  if (a_nan != b_nan) return b_nan;
  if (!a_nan && a != b) return a > b;
  return a_id < b_id;
}

// The `k` best of `scores` [n], best first, into `out`; `order` is scratch [n].
void best_k(const float* scores, std::int64_t n, std::int64_t k, std::int32_t* order, std::int32_t* out) {
  std::iota(order, order + n, 0);
  std::partial_sort(order, order + k, order + n, [&](std::int32_t a, std::int32_t b) {
    return ranks_before(scores[a], a, scores[b], b);
  });
  std::copy(order, order + k, out);
}

void route_token(const moe_routing_params& p, std::int64_t t) {
  const float* logits = p.logits + t * p.logits_stride;
  std::int32_t* experts = p.experts + t * p.top_k;
  float* weights = p.weights + t * p.top_k;
  const auto n = p.num_experts;
  std::array<float, max_router_experts> score{};   // the weights' source: p or s
  std::array<float, max_router_experts> choice{};  // what ranks the choice
  std::array<std::int32_t, max_router_experts> order{};

  if (p.scoring == router_scoring::softmax) {
    float max_logit = -std::numeric_limits<float>::infinity();
    for (std::int64_t e = 0; e < n; ++e) max_logit = std::max(max_logit, logits[e]);
    double total = 0.0;
    for (std::int64_t e = 0; e < n; ++e) total += score[e] = std::exp(logits[e] - max_logit);
    for (std::int64_t e = 0; e < n; ++e) choice[e] = score[e] = static_cast<float>(score[e] / total);
  } else {
    for (std::int64_t e = 0; e < n; ++e) {
      score[e] = 1.0f / (1.0f + std::exp(-logits[e]));
      choice[e] = score[e] + (p.correction_bias != nullptr ? p.correction_bias[e] : 0.0f);
    }
    if (p.groups > 1) {
      const std::int64_t size = n / p.groups;
      std::array<float, max_router_experts> group_score{};
      for (std::int64_t g = 0; g < p.groups; ++g) {
        group_score[g] = moe_routing_keys::group_score(choice.data() + g * size, size);
      }
      std::array<std::int32_t, max_router_experts> kept{};
      best_k(group_score.data(), p.groups, p.top_groups, order.data(), kept.data());
      std::array<bool, max_router_experts> eligible{};
      for (std::int64_t i = 0; i < p.top_groups; ++i) eligible[kept[i]] = true;
      for (std::int64_t e = 0; e < n; ++e) {
        if (!eligible[e / size]) choice[e] = 0.0f;
      }
    }
  }

  best_k(choice.data(), n, p.top_k, order.data(), experts);
  for (std::int64_t i = 0; i < p.top_k; ++i) weights[i] = score[experts[i]];
  moe_routing_keys::finish_weights(weights, p.top_k, p.normalize, p.scoring == router_scoring::sigmoid, p.scaling);
}

}  // namespace

namespace detail {

status check_moe_routing(const moe_routing_params& p) {
  if (p.num_experts < 1 || p.num_experts > max_router_experts || p.top_k < 1 || p.top_k > p.num_experts ||
      p.logits_stride < p.num_experts || p.tokens < 0) {
    return invalid_argument(format("moe routing: {} of {} experts (at most {}) in rows of {}", p.top_k, p.num_experts,
                                   max_router_experts, p.logits_stride));
  }
  if (p.scoring == router_scoring::softmax && (p.correction_bias != nullptr || p.groups != 1)) {
    return invalid_argument("moe routing: a correction bias and expert groups go with sigmoid scoring");
  }
  if (p.groups < 1 || p.num_experts % p.groups != 0 || p.top_groups < 1 || p.top_groups > p.groups ||
      p.top_groups * (p.num_experts / p.groups) < p.top_k) {
    return invalid_argument(format("moe routing: {} of {} groups of {} experts cannot hold the top {}", p.top_groups,
                                   p.groups, p.groups > 0 ? p.num_experts / p.groups : 0, p.top_k));
  }
  return {};
}

}  // namespace detail

status run_moe_routing(const moe_routing_params& p, const stream& s) {
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_moe_routing(p, s);
  EDGE_RETURN_IF_ERROR(detail::check_moe_routing(p));
  cpu::parallel_for(s, p.tokens, 4, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) route_token(p, t);
  });
  return {};
}

}  // namespace edge::kernels
