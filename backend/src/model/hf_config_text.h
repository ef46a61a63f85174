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

// The class's own fields about biases and windows, as the class spells them: Qwen2 has neither
// attention_bias nor mlp_bias, Qwen3 has attention_bias, the Llama classes have both.
inline std::string hf_config_class_fields(const model_config& c) {
  switch (c.arch) {
    case architecture::qwen2: return "  \"use_sliding_window\": false,\n";
    case architecture::qwen3: return "  \"use_sliding_window\": false,\n  \"attention_bias\": false,\n";
    case architecture::llama:
    case architecture::mistral: break;
  }
  return "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n";
}

}  // namespace edge::backend
