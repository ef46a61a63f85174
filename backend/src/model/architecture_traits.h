// What each architecture is called by each side that names it, and the defaults the names
// imply: one row per architecture, read by the Hugging Face reader (class -> architecture and
// transformers' defaults), the GGUF reader (general.architecture and what its converter keeps),
// the writers of config.json (architecture -> class), the synthetic vocabulary's format and
// to_string(architecture).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "edge/backend/model/model_config.h"

namespace edge::backend {

// The attention fields a class's config.json carries besides the shape (hf_config_fields.cpp
// reads and writes them).
enum class attention_fields : std::uint8_t {
  llama,  // attention_bias and mlp_bias: biases on o_proj and the MLP, which edgeinfer has no slot for
  qwen2,  // none: its Q/K/V biases are always there
  qwen3,  // attention_bias (with o_proj, as Llama's)
  glm45,  // attention_bias on Q/K/V only, use_qk_norm, partial_rotary_factor
  latent, // DeepSeek's latent attention (q_lora_rank ... v_head_dim, rope_interleave)
};

// The router fields of a Mixture-of-Experts class.
enum class router_fields : std::uint8_t {
  none,
  softmax,  // Qwen3-MoE's: num_experts (0: a dense model), decoder_sparse_step, mlp_only_layers
  grouped,  // the sigmoid router of GLM-4.5 and DeepSeek-V3: n_routed_experts, groups, scaling
};

// A row names what differs from the members' defaults.
struct architecture_traits {
  architecture arch;
  std::string_view model_type;  // config.json's model_type, and the name edgeinfer gives it
  std::string_view hf_class;    // transformers' class, config.json's architectures[0]
  // transformers' defaults for the fields a config.json may leave out.
  std::int64_t default_max_position = 0;
  bool default_qkv_bias = false;
  bool default_qk_norm = false;
  std::int64_t default_head_dim = 0;  // 0: hidden_size / num_attention_heads
  // llama.cpp's general.architecture ("" where edgeinfer reads no GGUF of it), and the RoPE
  // layout and per-head Q/K norms its converter leaves such a file with.
  std::string_view gguf_name;
  rope_layout gguf_rope = rope_layout::half_split;
  bool gguf_qkv_bias = false;
  bool gguf_qk_norm = false;
  // config.json turns a sliding attention window on with use_sliding_window (Qwen's classes);
  // for the others a sliding_window value does.
  bool sliding_window_switch = false;
  // The vocabulary make-model writes for it speaks ChatML (Qwen's; GLM's, whose own special
  // tokens are not made), else Llama 3's format.
  bool synthetic_chatml = false;
  double default_rms_norm_eps = 1e-6;
  attention_fields attention = attention_fields::llama;
  router_fields router = router_fields::none;
  // transformers' defaults for the router's fields, and for the latent attention's and its DSA
  // indexer's (index_topk 0: the class has no indexer).
  moe_config router_default{};
  mla_config latent_default{};
  dsa_config indexer_default{};
  // The latent attention rotates adjacent pairs whatever rope_interleave says (GLM-5).
  bool latent_always_interleaved = false;
};

std::span<const architecture_traits> architecture_table();
const architecture_traits& traits_of(architecture arch);
// The rows whose hf_class or gguf_name is `name`; null for none.
const architecture_traits* find_hf_class(std::string_view name);
const architecture_traits* find_gguf_architecture(std::string_view name);
// "A, B and C": the names the readers take, for their errors.
std::string supported_hf_classes();
// "A and B": the classes with latent attention.
std::string latent_attention_classes();
std::string supported_gguf_architectures();

}  // namespace edge::backend
