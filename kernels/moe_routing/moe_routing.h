// Choosing each token's experts from its router logits, the two ways Mixture-of-Experts
// architectures do it (read from transformers' modeling code):
//
//   softmax (Qwen3-MoE): p = softmax(logits) over all experts; the top_k largest p; with
//     `normalize` (norm_topk_prob) the chosen p divided by their sum.
//   sigmoid (DeepSeek-V3, Kimi K2, GLM-4.5): s = sigmoid(logits); the choice ranks c = s +
//     correction_bias (e_score_correction_bias: it steers the choice and never the weights);
//     with groups > 1 the experts fall in `groups` equal groups, each group scored by the sum
//     of its two largest c, and only the `top_groups` best groups stay eligible (an expert
//     outside them ranks as c = 0, as transformers masks it); the top_k eligible c are chosen,
//     weighted by their s; with `normalize` divided by their sum (+ 1e-20); then multiplied
//     by `scaling` (routed_scaling_factor).
//
// Ties go to the lower expert (or group) id, and a NaN score ranks below every number, so the
// choice is deterministic. Experts come out best first.
//
// On a CUDA stream (moe_routing.cu) one block routes each token, with the same order as integer
// keys (moe_routing_keys.h) and the same group score and weight arithmetic, so it makes the
// CPU's choice; the scores go through the device's expf, so a choice between two experts whose
// scores lie within a few ulp of each other may differ, and weights agree to float rounding.
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/stream.h"

namespace edge::kernels {

enum class router_scoring { softmax, sigmoid };

// The most experts a router may have (Kimi K2 has 384).
inline constexpr std::int64_t max_router_experts = 1024;

struct moe_routing_params {
  const float* logits;                     // [tokens, num_experts], row stride logits_stride
  const float* correction_bias = nullptr;  // [num_experts] (sigmoid only), or null
  std::int32_t* experts;                   // [tokens, top_k] the chosen experts, best first
  float* weights;                          // [tokens, top_k] their weights
  std::int64_t tokens = 0;
  std::int64_t num_experts = 0;
  std::int64_t top_k = 0;
  std::int64_t logits_stride = 0;
  router_scoring scoring = router_scoring::softmax;
  std::int64_t groups = 1;      // sigmoid: n_group, dividing num_experts
  std::int64_t top_groups = 1;  // sigmoid: topk_group, at most groups
  bool normalize = false;       // norm_topk_prob
  float scaling = 1.0f;         // routed_scaling_factor (sigmoid)
};

// invalid_argument for shapes outside these rules (top_k of 1..num_experts, groups dividing the
// experts, top_groups of 1..groups holding at least top_k experts, a bias only with sigmoid).
status run_moe_routing(const moe_routing_params& p, const stream& s);

namespace detail {
// The shape checks of run_moe_routing, the same for either device.
status check_moe_routing(const moe_routing_params& p);
}  // namespace detail

}  // namespace edge::kernels
