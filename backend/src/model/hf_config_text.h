// The shape fields of a Hugging Face config.json, written the same way by every writer of
// model folders (make-model's synthetic models, quantize's compressed-tensors folders); the
// class's own fields are hf_config_fields.h's.
#pragma once

#include <string>
#include <string_view>

#include "edge/backend/model/model_config.h"
#include "architecture_traits.h"
#include "hf_config_fields.h"
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

}  // namespace edge::backend
