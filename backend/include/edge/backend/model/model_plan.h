// The model as data: what the forward pass computes, layer by layer, in words that do not
// depend on the file format or the architecture's name. plan_model() turns a configuration
// into a plan; the one forward pass (runtime/forward.h) walks it for every executor. A new
// architecture is a new way to fill this plan (and, for a new kind of layer, one new branch in
// the forward pass), not a new layer loop.
//
// Every layer today is pre-norm:
//   x += attention(rmsnorm(x))     attention_kind::gqa: per-head Q, K, V projections (optional
//                                  biases; optional RMSNorm over each head of Q and K, Qwen3),
//                                  RoPE on Q and K, paged attention over the KV cache
//                                  (grouped-query: num_heads / num_kv_heads query heads share a
//                                  K/V head), output projection
//   x += mlp(rmsnorm(x))           mlp_kind::dense: down(silu(gate(x)) * up(x))
//                                  mlp_kind::moe: the router's logits (a [experts, hidden]
//                                  matrix) choose top_k experts per token (moe_routing.h);
//                                  the chosen experts' SwiGLU outputs, weighted, plus the
//                                  shared experts' (a dense SwiGLU of width `intermediate`,
//                                  when there are any)
// then the final RMSNorm and the classifier (the token embedding when tied).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "edge/backend/model/model_config.h"
#include "edge/common/status.h"
#include "kernels/rope/rope.h"

namespace edge::backend {

enum class attention_kind {
  gqa,  // grouped-query attention over per-head K and V (multi-head when num_kv_heads == num_heads)
};

enum class mlp_kind {
  dense,  // SwiGLU: down(silu(gate(x)) * up(x))
  moe,    // routed experts (+ shared experts)
};

std::string_view to_string(attention_kind kind);
std::string_view to_string(mlp_kind kind);

struct rope_plan {
  kernels::rope_pairs pairs = kernels::rope_pairs::adjacent;
  std::int64_t rotary_dim = 0;  // leading elements of each head that rotate (the rest pass through)
  double theta = 10000.0;
  std::optional<kernels::rope_llama3_scaling> scaling;

  // [rotary_dim / 2] the rotation frequencies, scaling applied.
  std::vector<float> inv_freq() const;

  friend bool operator==(const rope_plan&, const rope_plan&) = default;
};

struct attention_plan {
  attention_kind kind = attention_kind::gqa;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  bool qkv_bias = false;       // biases on the Q, K and V projections (Qwen2)
  bool qk_norm = false;        // an RMSNorm over each head of Q and K before RoPE (Qwen3)
  float softmax_scale = 0.0f;  // 1 / sqrt(head_dim)
  rope_plan rope;

  std::int64_t q_dim() const { return num_heads * head_dim; }
  std::int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // Q, K and V of one token side by side: the width of the fused projection.
  std::int64_t qkv_dim() const { return q_dim() + 2 * kv_dim(); }
};

struct router_plan {
  kernels::router_scoring scoring = kernels::router_scoring::softmax;
  bool correction_bias = false;  // a [experts] bias added for the choice only (sigmoid)
  std::int64_t groups = 1;
  std::int64_t top_groups = 1;
  bool normalize = false;  // the chosen weights divided by their sum
  float scaling = 1.0f;    // the routed weights' factor

  friend bool operator==(const router_plan&, const router_plan&) = default;
};

struct mlp_plan {
  mlp_kind kind = mlp_kind::dense;
  // dense: the SwiGLU width; moe: the shared experts' width (0 without shared experts).
  std::int64_t intermediate = 0;
  std::int64_t experts = 0;              // moe: routed experts
  std::int64_t top_k = 0;                // moe: experts per token
  std::int64_t expert_intermediate = 0;  // moe: each routed expert's SwiGLU width
  router_plan router;
};

struct layer_plan {
  attention_plan attention;
  mlp_plan mlp;
};

struct model_plan {
  architecture arch = architecture::llama;
  std::int64_t vocab = 0;
  std::int64_t hidden = 0;
  float norm_eps = 1e-5f;       // every RMSNorm's epsilon
  bool tied_embeddings = false; // the classifier is the token embedding
  std::int64_t context = 0;     // positions the model was trained for
  std::vector<layer_plan> layers;

  // The widest of any layer, for buffers sized once for all layers.
  std::int64_t max_q_dim() const;
  std::int64_t max_qkv_dim() const;
  std::int64_t max_intermediate() const;
  // Over the MoE layers: how many, and their widest router and choice.
  std::int64_t moe_layers() const;
  std::int64_t max_experts() const;
  std::int64_t max_top_k() const;
  std::int64_t max_expert_intermediate() const;
};

// invalid_argument for a configuration that fails the loaders' plausibility checks (an empty or
// oversized dimension, heads that do not divide into KV groups, an odd head size for RoPE,
// experts that do not divide into their groups).
result<model_plan> plan_model(const model_config& config);

}  // namespace edge::backend
