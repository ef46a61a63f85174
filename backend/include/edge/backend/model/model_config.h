// The hyperparameters of a decoder (grouped-query or multi-head latent attention, dense or
// Mixture-of-Experts MLPs), whatever file format they came from.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/moe_routing/moe_routing.h"

namespace edge::backend {

enum class architecture { llama, qwen2, mistral, qwen3, qwen3_moe, glm4_moe, deepseek_v3, glm_moe_dsa };

std::string_view to_string(architecture arch);

// Which elements of a head RoPE rotates together.
enum class rope_layout {
  adjacent_pairs,  // (0,1), (2,3), ...: GGUF "llama" and llama2.c checkpoints
  half_split,      // (i, i + head_dim/2): Hugging Face checkpoints
};

// rope_scaling of type "llama3" (Llama 3.1+): long wavelengths are slowed by `factor`, short
// ones kept, and the band between interpolated.
struct rope_scaling_llama3 {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  std::int64_t original_max_position = 8192;
};

// rope_scaling of type "yarn" (DeepSeek-V3, Kimi K2), as transformers' _compute_yarn_parameters
// reads it: the frequencies (kernels::rope_yarn_scaling) and two factors on attention.
struct rope_scaling_yarn {
  double factor = 1.0;
  std::int64_t original_max_position = 4096;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  bool truncate = true;
  double mscale = 0.0;           // 0: absent
  double mscale_all_dim = 0.0;   // 0: absent
  std::optional<double> attention_factor;  // given explicitly

  // What multiplies cos and sin (transformers' attention_scaling): attention_factor, else
  // mscale(factor, mscale) / mscale(factor, mscale_all_dim) when both are set, else mscale(factor).
  double rotary_factor() const;
  // What multiplies DeepSeek-V3's softmax scale: mscale(factor, mscale_all_dim)² when
  // mscale_all_dim is set, else 1. mscale(s, m) = 0.1 m ln(s) + 1 for s > 1, else 1.
  double softmax_factor() const;
};

// Multi-head Latent Attention (DeepSeek-V3, Kimi K2, GLM-5): queries through a low-rank
// q_lora_rank bottleneck (or one q_proj when it is 0), keys and values from one compressed
// latent of kv_lora_rank per token plus one shared rotated key of qk_rope_head_dim.
struct mla_config {
  std::int64_t q_lora_rank = 0;       // 0: q_proj
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_nope_head_dim = 0;
  std::int64_t qk_rope_head_dim = 0;
  std::int64_t v_head_dim = 0;

  std::int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // One cached row per token and layer: the latent, then the rotated key.
  std::int64_t cache_row() const { return kv_lora_rank + qk_rope_head_dim; }
};

// DeepSeek Sparse Attention's indexer (GLM-5): each query attends to the index_topk earlier
// tokens its indexer ranks highest (all of them while there are no more than that).
struct dsa_config {
  std::int64_t index_topk = 0;
  std::int64_t index_heads = 0;
  std::int64_t index_head_dim = 0;
  // [num_layers] whether a layer reuses the previous full layer's choice (indexer_types
  // "shared") instead of running its own indexer; empty: every layer runs its own.
  std::vector<bool> shared_layers;

  bool shared(std::int64_t layer) const {
    return layer < static_cast<std::int64_t>(shared_layers.size()) && shared_layers[static_cast<std::size_t>(layer)];
  }
};

// The MLPs of a Mixture-of-Experts model. A sparse layer routes each token to
// experts_per_token of num_experts SwiGLU experts of width expert_intermediate, weighted by the
// router, and adds shared_experts always-on experts (one SwiGLU block of width shared_experts ×
// expert_intermediate); the other layers are dense SwiGLU of model_config::intermediate_size.
struct moe_config {
  std::int64_t num_experts = 0;
  std::int64_t experts_per_token = 0;
  std::int64_t expert_intermediate = 0;  // moe_intermediate_size
  std::int64_t shared_experts = 0;       // n_shared_experts (GLM-4.5); 0 for Qwen3-MoE
  kernels::router_scoring scoring = kernels::router_scoring::softmax;  // softmax (Qwen3-MoE) or sigmoid (GLM-4.5)
  bool normalize_weights = false;  // norm_topk_prob: the chosen weights divided by their sum
  double routed_scaling = 1.0;     // routed_scaling_factor
  bool correction_bias = false;    // e_score_correction_bias steers the choice (sigmoid)
  std::int64_t groups = 1;         // n_group
  std::int64_t top_groups = 1;     // topk_group
  // Which layers are sparse: not among the first first_dense_layers (first_k_dense_replace),
  // not listed in dense_layers (mlp_only_layers), and (i + 1) a multiple of sparse_step
  // (decoder_sparse_step).
  std::int64_t first_dense_layers = 0;
  std::int64_t sparse_step = 1;
  std::vector<std::int64_t> dense_layers;

  bool sparse(std::int64_t layer) const;
  std::int64_t shared_intermediate() const { return shared_experts * expert_intermediate; }
};

struct model_config {
  architecture arch = architecture::llama;
  std::int64_t vocab_size = 0;
  std::int64_t hidden_size = 0;        // model width ("dim")
  std::int64_t intermediate_size = 0;  // feed-forward width
  std::int64_t num_layers = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;       // < num_heads: grouped-query attention
  std::int64_t head_dim = 0;           // usually hidden_size / num_heads
  std::int64_t max_position = 0;       // context length the model was trained for
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  rope_layout rope = rope_layout::adjacent_pairs;
  std::optional<rope_scaling_llama3> rope_scaling;
  bool tie_embeddings = false;  // the classifier is the token embedding
  bool qkv_bias = false;        // Qwen2: biases on the Q, K and V projections
  bool qk_norm = false;         // Qwen3: an RMSNorm over each head of Q and of K ([head_dim] weights), before RoPE
  std::int64_t rotary_dim = 0;  // leading elements of each head RoPE rotates (GLM-4.5: half); 0: all
  std::optional<moe_config> moe;
  std::optional<rope_scaling_yarn> yarn;
  // Multi-head latent attention in every layer (head_dim is then its qk_head_dim and
  // num_kv_heads its num_heads, as transformers' configs say); DSA on top for GLM-5.
  std::optional<mla_config> mla;
  std::optional<dsa_config> dsa;
  // Multi-token-prediction layers the checkpoint carries after the decoder's
  // (num_nextn_predict_layers): not part of the forward pass, and not loaded.
  std::int64_t nextn_layers = 0;

  std::int64_t rotated() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
};

}  // namespace edge::backend
