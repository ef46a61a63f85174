#include "architecture_traits.h"

#include <array>

namespace edge::backend {
namespace {

constexpr std::array architectures{
    architecture_traits{.arch = architecture::llama,
                        .model_type = "llama",
                        .hf_class = "LlamaForCausalLM",
                        .default_max_position = 2048,
                        .gguf_name = "llama",
                        .gguf_rope = rope_layout::adjacent_pairs,
                        .attention = attention_fields::llama},
    architecture_traits{.arch = architecture::qwen2,
                        .model_type = "qwen2",
                        .hf_class = "Qwen2ForCausalLM",
                        .default_max_position = 32768,
                        .default_qkv_bias = true,
                        .gguf_name = "qwen2",
                        .gguf_qkv_bias = true,
                        .sliding_window_switch = true,
                        .synthetic_chatml = true,
                        .attention = attention_fields::qwen2},
    architecture_traits{.arch = architecture::mistral,
                        .model_type = "mistral",
                        .hf_class = "MistralForCausalLM",
                        .default_max_position = 4096 * 32,
                        .attention = attention_fields::llama},
    architecture_traits{.arch = architecture::qwen3,
                        .model_type = "qwen3",
                        .hf_class = "Qwen3ForCausalLM",
                        .default_max_position = 32768,
                        .default_qk_norm = true,
                        .default_head_dim = 128,
                        .gguf_name = "qwen3",
                        .gguf_qk_norm = true,
                        .sliding_window_switch = true,
                        .synthetic_chatml = true,
                        .attention = attention_fields::qwen3},
    architecture_traits{.arch = architecture::qwen3_moe,
                        .model_type = "qwen3_moe",
                        .hf_class = "Qwen3MoeForCausalLM",
                        .default_max_position = 32768,
                        .default_qk_norm = true,
                        .gguf_name = "qwen3moe",
                        .gguf_qk_norm = true,
                        .sliding_window_switch = true,
                        .synthetic_chatml = true,
                        .attention = attention_fields::qwen3,
                        .router = router_fields::softmax,
                        .router_default = {.num_experts = 128,
                                           .experts_per_token = 8,
                                           .expert_intermediate = 768}},
    architecture_traits{.arch = architecture::glm4_moe,
                        .model_type = "glm4_moe",
                        .hf_class = "Glm4MoeForCausalLM",
                        .default_max_position = 131072,
                        .synthetic_chatml = true,
                        .default_rms_norm_eps = 1e-5,
                        .attention = attention_fields::glm45,
                        .router = router_fields::grouped,
                        .router_default = {.num_experts = 128,
                                           .experts_per_token = 8,
                                           .expert_intermediate = 1408,
                                           .shared_experts = 1,
                                           .normalize_weights = true,
                                           .first_dense_layers = 1}},
    // deepseek2's own keys say the rest (gguf_model.cpp's deepseek2_from_gguf).
    architecture_traits{.arch = architecture::deepseek_v3,
                        .model_type = "deepseek_v3",
                        .hf_class = "DeepseekV3ForCausalLM",
                        .default_max_position = 4096,
                        .gguf_name = "deepseek2",
                        .gguf_rope = rope_layout::adjacent_pairs,
                        .attention = attention_fields::latent,
                        .router = router_fields::grouped,
                        .router_default = {.num_experts = 256,
                                           .experts_per_token = 8,
                                           .expert_intermediate = 2048,
                                           .shared_experts = 1,
                                           .normalize_weights = true,
                                           .routed_scaling = 2.5,
                                           .groups = 8,
                                           .top_groups = 4,
                                           .first_dense_layers = 3},
                        .latent_default = {.q_lora_rank = 1536,
                                           .kv_lora_rank = 512,
                                           .qk_nope_head_dim = 128,
                                           .qk_rope_head_dim = 64,
                                           .v_head_dim = 128}},
    architecture_traits{.arch = architecture::glm_moe_dsa,
                        .model_type = "glm_moe_dsa",
                        .hf_class = "GlmMoeDsaForCausalLM",
                        .default_max_position = 202752,
                        .default_rms_norm_eps = 1e-5,
                        .attention = attention_fields::latent,
                        .router = router_fields::grouped,
                        .router_default = {.num_experts = 256,
                                           .experts_per_token = 8,
                                           .expert_intermediate = 2048,
                                           .shared_experts = 1,
                                           .normalize_weights = true,
                                           .routed_scaling = 2.5,
                                           .first_dense_layers = 3},
                        .latent_default = {.q_lora_rank = 2048,
                                           .kv_lora_rank = 512,
                                           .qk_nope_head_dim = 192,
                                           .qk_rope_head_dim = 64,
                                           .v_head_dim = 256},
                        .indexer_default = {.index_topk = 2048, .index_heads = 32, .index_head_dim = 128},
                        .latent_always_interleaved = true},
};

constexpr bool rows_in_order() {
  for (std::size_t i = 0; i < architectures.size(); ++i) {
    if (static_cast<std::size_t>(architectures[i].arch) != i) return false;
  }
  return true;
}
static_assert(rows_in_order(), "the architecture table lists the architectures in the enum's order");

// "A, B and C": the names `name_of` gives the rows, empty ones left out.
template <typename name_fn>
std::string listed(name_fn name_of) {
  std::string names;
  std::size_t count = 0;
  for (const architecture_traits& t : architectures) count += name_of(t).empty() ? 0 : 1;
  std::size_t i = 0;
  for (const architecture_traits& t : architectures) {
    const std::string_view name = name_of(t);
    if (name.empty()) continue;
    if (i > 0) names += i + 1 == count ? " and " : ", ";
    names += name;
    ++i;
  }
  return names;
}

}  // namespace

std::span<const architecture_traits> architecture_table() { return architectures; }

const architecture_traits& traits_of(architecture arch) { return architectures[static_cast<std::size_t>(arch)]; }

const architecture_traits* find_hf_class(std::string_view name) {
  for (const architecture_traits& t : architectures) {
    if (t.hf_class == name) return &t;
  }
  return nullptr;
}

const architecture_traits* find_gguf_architecture(std::string_view name) {
  if (name.empty()) return nullptr;
  for (const architecture_traits& t : architectures) {
    if (t.gguf_name == name) return &t;
  }
  return nullptr;
}

std::string supported_hf_classes() {
  return listed([](const architecture_traits& t) { return t.hf_class; });
}
std::string supported_gguf_architectures() {
  return listed([](const architecture_traits& t) { return t.gguf_name; });
}
std::string latent_attention_classes() {
  return listed([](const architecture_traits& t) {
    return t.attention == attention_fields::latent ? t.hf_class : std::string_view();
  });
}

std::string_view to_string(architecture arch) { return traits_of(arch).model_type; }

}  // namespace edge::backend
