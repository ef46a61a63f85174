// The shape fields of a Hugging Face config.json, written the same way by every writer of
// model folders (make-model's synthetic models, quantize's compressed-tensors folders).
#pragma once

#include <string>
#include <string_view>

#include "edge/backend/model/model_config.h"
#include "edge/common/json_text.h"

namespace edge::backend {

inline std::string_view hf_architecture_class(architecture arch) {
  switch (arch) {
    case architecture::llama: return "LlamaForCausalLM";
    case architecture::qwen2: return "Qwen2ForCausalLM";
    case architecture::mistral: return "MistralForCausalLM";
    case architecture::qwen3: return "Qwen3ForCausalLM";
    case architecture::qwen3_moe: return "Qwen3MoeForCausalLM";
    case architecture::glm4_moe: return "Glm4MoeForCausalLM";
  }
  return "LlamaForCausalLM";
}

// "architectures" through "rope_scaling", one field per line, each ending in ",\n".
inline std::string hf_config_shape_fields(const model_config& c) {
  std::string out;
  out += "  \"architectures\": [\"" + std::string(hf_architecture_class(c.arch)) + "\"],\n";
  out += "  \"model_type\": \"" + std::string(to_string(c.arch)) + "\",\n";
  out += "  \"hidden_size\": " + std::to_string(c.hidden_size) + ",\n";
  out += "  \"intermediate_size\": " + std::to_string(c.intermediate_size) + ",\n";
  out += "  \"num_hidden_layers\": " + std::to_string(c.num_layers) + ",\n";
  out += "  \"num_attention_heads\": " + std::to_string(c.num_heads) + ",\n";
  out += "  \"num_key_value_heads\": " + std::to_string(c.num_kv_heads) + ",\n";
  out += "  \"head_dim\": " + std::to_string(c.head_dim) + ",\n";
  out += "  \"vocab_size\": " + std::to_string(c.vocab_size) + ",\n";
  out += "  \"max_position_embeddings\": " + std::to_string(c.max_position) + ",\n";
  out += "  \"rms_norm_eps\": " + json_number(c.rms_norm_eps) + ",\n";
  out += "  \"rope_theta\": " + json_number(c.rope_theta) + ",\n";
  if (c.rope_scaling) {
    const auto& s = *c.rope_scaling;
    out += "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": " + json_number(s.factor) +
           ", \"low_freq_factor\": " + json_number(s.low_freq_factor) +
           ", \"high_freq_factor\": " + json_number(s.high_freq_factor) +
           ", \"original_max_position_embeddings\": " + std::to_string(s.original_max_position) + "},\n";
  } else {
    out += "  \"rope_scaling\": null,\n";
  }
  return out;
}

// The class's own fields about biases, windows, rotary width and experts, as the class spells
// them: Qwen2 has neither attention_bias nor mlp_bias, Qwen3 and Qwen3-MoE have attention_bias,
// the Llama classes have both, GLM-4.5's attention_bias means Q/K/V biases.
inline std::string hf_config_class_fields(const model_config& c) {
  const auto field = [](std::string_view name, const std::string& value) {
    return "  \"" + std::string(name) + "\": " + value + ",\n";
  };
  const auto boolean = [](bool b) { return std::string(b ? "true" : "false"); };
  std::string out;
  switch (c.arch) {
    case architecture::qwen2: return field("use_sliding_window", "false");
    case architecture::qwen3: return field("use_sliding_window", "false") + field("attention_bias", "false");
    case architecture::qwen3_moe: {
      out = field("use_sliding_window", "false") + field("attention_bias", "false");
      if (!c.moe) return out + field("num_experts", "0");
      const moe_config& m = *c.moe;
      std::string dense = "[";
      for (std::size_t i = 0; i < m.dense_layers.size(); ++i) {
        dense += (i > 0 ? ", " : "") + std::to_string(m.dense_layers[i]);
      }
      dense += "]";
      return out + field("num_experts", std::to_string(m.num_experts)) +
             field("num_experts_per_tok", std::to_string(m.experts_per_token)) +
             field("moe_intermediate_size", std::to_string(m.expert_intermediate)) +
             field("norm_topk_prob", boolean(m.normalize_weights)) +
             field("decoder_sparse_step", std::to_string(m.sparse_step)) + field("mlp_only_layers", dense);
    }
    case architecture::glm4_moe: {
      out = field("attention_bias", boolean(c.qkv_bias)) + field("use_qk_norm", boolean(c.qk_norm)) +
            field("partial_rotary_factor",
                  json_number(static_cast<double>(c.rotated()) / static_cast<double>(c.head_dim)));
      const moe_config m = c.moe.value_or(moe_config{});
      return out + field("n_routed_experts", std::to_string(m.num_experts)) +
             field("n_shared_experts", std::to_string(m.shared_experts)) +
             field("num_experts_per_tok", std::to_string(m.experts_per_token)) +
             field("moe_intermediate_size", std::to_string(m.expert_intermediate)) +
             field("first_k_dense_replace", std::to_string(m.first_dense_layers)) +
             field("norm_topk_prob", boolean(m.normalize_weights)) +
             field("routed_scaling_factor", json_number(m.routed_scaling)) + field("n_group", std::to_string(m.groups)) +
             field("topk_group", std::to_string(m.top_groups));
    }
    case architecture::llama:
    case architecture::mistral: break;
  }
  return field("attention_bias", "false") + field("mlp_bias", "false");
}

}  // namespace edge::backend
