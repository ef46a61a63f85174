// The shape fields of a Hugging Face config.json, written the same way by every writer of
// model folders (make-model's synthetic models, quantize's compressed-tensors folders).
#pragma once

#include <string>
#include <string_view>

#include "edge/backend/model/model_config.h"
#include "architecture_traits.h"
#include "edge/common/json_text.h"

namespace edge::backend {

// "architectures" through "rope_scaling", one field per line, each ending in ",\n".
inline std::string hf_config_shape_fields(const model_config& c) {
  std::string out;
  out += "  \"architectures\": [\"" + std::string(traits_of(c.arch).hf_class) + "\"],\n";
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
  } else if (c.yarn) {
    const auto& y = *c.yarn;
    out += "  \"rope_scaling\": {\"type\": \"yarn\", \"factor\": " + json_number(y.factor) +
           ", \"original_max_position_embeddings\": " + std::to_string(y.original_max_position) +
           ", \"beta_fast\": " + json_number(y.beta_fast) + ", \"beta_slow\": " + json_number(y.beta_slow) +
           ", \"mscale\": " + json_number(y.mscale) + ", \"mscale_all_dim\": " + json_number(y.mscale_all_dim) +
           (y.attention_factor ? ", \"attention_factor\": " + json_number(*y.attention_factor) : std::string()) + "},\n";
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
  // The sigmoid router GLM-4.5, DeepSeek-V3 and GLM-5 share.
  const auto grouped_router = [&] {
    const moe_config m = c.moe.value_or(moe_config{});
    return field("n_routed_experts", std::to_string(m.num_experts)) +
           field("n_shared_experts", std::to_string(m.shared_experts)) +
           field("num_experts_per_tok", std::to_string(m.experts_per_token)) +
           field("moe_intermediate_size", std::to_string(m.expert_intermediate)) +
           field("first_k_dense_replace", std::to_string(m.first_dense_layers)) +
           field("norm_topk_prob", boolean(m.normalize_weights)) +
           field("routed_scaling_factor", json_number(m.routed_scaling)) + field("n_group", std::to_string(m.groups)) +
           field("topk_group", std::to_string(m.top_groups));
  };
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
      return out + grouped_router();
    }
    case architecture::deepseek_v3:
    case architecture::glm_moe_dsa: {
      const mla_config m = c.mla.value_or(mla_config{});
      out = field("attention_bias", "false") +
            field("q_lora_rank", m.q_lora_rank > 0 ? std::to_string(m.q_lora_rank) : std::string("null")) +
            field("kv_lora_rank", std::to_string(m.kv_lora_rank)) +
            field("qk_nope_head_dim", std::to_string(m.qk_nope_head_dim)) +
            field("qk_rope_head_dim", std::to_string(m.qk_rope_head_dim)) +
            field("v_head_dim", std::to_string(m.v_head_dim)) +
            field("rope_interleave", boolean(c.rope == rope_layout::adjacent_pairs)) +
            field("scoring_func", "\"sigmoid\"") + field("topk_method", "\"noaux_tc\"") +
            field("num_nextn_predict_layers", std::to_string(c.nextn_layers));
      if (c.dsa) {
        const dsa_config& d = *c.dsa;
        std::string types = "[";
        for (std::int64_t i = 0; i < c.num_layers; ++i) {
          types += std::string(i > 0 ? ", " : "") + (d.shared(i) ? "\"shared\"" : "\"full\"");
        }
        types += "]";
        out += field("index_topk", std::to_string(d.index_topk)) + field("index_n_heads", std::to_string(d.index_heads)) +
               field("index_head_dim", std::to_string(d.index_head_dim)) + field("indexer_types", types);
      }
      return out + grouped_router();
    }
    case architecture::llama:
    case architecture::mistral: break;
  }
  return field("attention_bias", "false") + field("mlp_bias", "false");
}

}  // namespace edge::backend
