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
  mla,  // multi-head latent attention over one cached latent row per token
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
  std::optional<kernels::rope_yarn_scaling> yarn;

  // [rotary_dim / 2] the rotation frequencies, scaling applied.
  std::vector<float> inv_freq() const;

  friend bool operator==(const rope_plan&, const rope_plan&) = default;
};

// The widths of a latent attention layer (model_config's mla_config and dsa_config).
struct mla_plan {
  std::int64_t q_lora_rank = 0;      // 0: one q_proj
  std::int64_t kv_lora_rank = 0;     // the latent
  std::int64_t nope = 0;             // qk_nope_head_dim
  std::int64_t rope = 0;             // qk_rope_head_dim
  std::int64_t v_head_dim = 0;
  float rope_scale = 1.0f;           // YaRN's factor on cos and sin
  // DSA (GLM-5); index_topk 0 without an indexer.
  std::int64_t index_topk = 0;
  std::int64_t index_heads = 0;
  std::int64_t index_head_dim = 0;
  bool shared_selection = false;     // uses the previous indexer's choice rather than its own

  // transformers builds q_a_layernorm and kv_a_layernorm without an epsilon (RMSNorm's 1e-6),
  // whatever rms_norm_eps says, and the indexer's LayerNorm with 1e-6.
  static constexpr float lora_norm_eps = 1e-6f;
  static constexpr float index_norm_eps = 1e-6f;

  std::int64_t qk_head() const { return nope + rope; }
  std::int64_t cache_row() const { return kv_lora_rank + rope; }
  bool indexed() const { return index_topk > 0; }
  // The first projection's parts, side by side in one row per token: q_a (or q_proj for
  // `heads` heads), the latent and k_pe, then (an indexer's) index key and its head weights.
  std::int64_t q_width(std::int64_t heads) const { return q_lora_rank > 0 ? q_lora_rank : heads * qk_head(); }
  std::int64_t first_width(std::int64_t heads) const {
    return q_width(heads) + cache_row() + (indexed() && !shared_selection ? index_head_dim + index_heads : 0);
  }

  friend bool operator==(const mla_plan&, const mla_plan&) = default;
};

struct attention_plan {
  attention_kind kind = attention_kind::gqa;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  bool qkv_bias = false;       // biases on the Q, K and V projections (Qwen2)
  bool qk_norm = false;        // an RMSNorm over each head of Q and K before RoPE (Qwen3)
  float softmax_scale = 0.0f;  // 1 / sqrt(head_dim) (MLA: of qk_head, times YaRN's mscale²)
  rope_plan rope;
  mla_plan mla;                // attention_kind::mla only

  // The output projection's input: every head's attention output.
  std::int64_t q_dim() const { return num_heads * (kind == attention_kind::mla ? mla.v_head_dim : head_dim); }
  std::int64_t kv_dim() const { return num_kv_heads * head_dim; }
  // What the first projection writes per token: Q, K and V side by side (MLA: mla_plan's parts).
  std::int64_t qkv_dim() const {
    return kind == attention_kind::mla ? mla.first_width(num_heads) : num_heads * head_dim + 2 * kv_dim();
  }
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
  // Over the latent attention layers (0 without them): the query after q_b ([heads, qk_head]),
  // the per-head latents ([heads, kv_lora_rank]), the indexer's queries and its top_k.
  std::int64_t max_mla_query() const;
  std::int64_t max_mla_latents() const;
  std::int64_t max_index_query() const;
  std::int64_t max_index_topk() const;
  // The expanded prefill's workspace for runs of up to `tokens` tokens (kernels/mla_attention).
  std::int64_t max_mla_prefill_workspace(std::int64_t tokens) const;
};

// invalid_argument for a configuration that fails the loaders' plausibility checks (an empty or
// oversized dimension, heads that do not divide into KV groups, an odd head size for RoPE,
// experts that do not divide into their groups).
result<model_plan> plan_model(const model_config& config);

}  // namespace edge::backend
