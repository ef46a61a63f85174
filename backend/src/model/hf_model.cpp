// Hugging Face folders: config.json and the transformers tensor names.
#include <string>

#include "edge/backend/model/formats.h"
#include "edge/common/format.h"
#include "edge/common/log.h"
#include "json_fields.h"
#include "model_checks.h"
#include "weight_binding.h"

namespace edge::backend {
namespace {

struct architecture_defaults {
  std::string_view class_name;
  architecture arch;
  // transformers' defaults for fields a config.json may leave out.
  std::int64_t max_position;
  bool qkv_bias;
};

constexpr architecture_defaults known_architectures[] = {
    {"LlamaForCausalLM", architecture::llama, 2048, false},
    {"MistralForCausalLM", architecture::mistral, 4096 * 32, false},
    {"Qwen2ForCausalLM", architecture::qwen2, 32768, true},
};

// Defaults shared by the three configuration classes.
constexpr double default_rms_norm_eps = 1e-6;
constexpr double default_rope_theta = 10000.0;

result<std::optional<rope_scaling_llama3>> parse_rope_scaling(const json_fields& config) {
  const auto element = config.find("rope_scaling");
  if (!element) return std::optional<rope_scaling_llama3>{};
  simdjson::dom::object object;
  if (element->get_object().get(object) != simdjson::SUCCESS) {
    return invalid_argument("\"rope_scaling\" must be an object or null");
  }
  const json_fields fields(object);
  // transformers renamed "type" to "rope_type"; files carry either.
  EDGE_ASSIGN_OR_RETURN(auto type, fields.optional_string("rope_type"));
  if (!type) {
    EDGE_ASSIGN_OR_RETURN(type, fields.optional_string("type"));
  }
  if (!type || *type == "default") return std::optional<rope_scaling_llama3>{};
  if (*type != "llama3") {
    return status(status_code::unimplemented,
                  edge::format("rope_scaling type \"{}\" is not supported (only \"llama3\" is)", *type));
  }
  rope_scaling_llama3 scaling;
  EDGE_ASSIGN_OR_RETURN(const auto factor, fields.optional_number("factor"));
  EDGE_ASSIGN_OR_RETURN(const auto low, fields.optional_number("low_freq_factor"));
  EDGE_ASSIGN_OR_RETURN(const auto high, fields.optional_number("high_freq_factor"));
  EDGE_ASSIGN_OR_RETURN(const auto original, fields.optional_int("original_max_position_embeddings"));
  if (!factor || !original) {
    return invalid_argument("llama3 rope_scaling needs \"factor\" and \"original_max_position_embeddings\"");
  }
  scaling.factor = *factor;
  scaling.low_freq_factor = low.value_or(scaling.low_freq_factor);
  scaling.high_freq_factor = high.value_or(scaling.high_freq_factor);
  scaling.original_max_position = *original;
  EDGE_RETURN_IF_ERROR(check_rope_scaling(scaling));
  return std::optional<rope_scaling_llama3>{scaling};
}

result<parsed_config> parse_config_object(const json_fields& fields) {
  simdjson::dom::array architectures;
  std::string_view class_name;
  const auto architectures_element = fields.find("architectures");
  if (!architectures_element || architectures_element->get_array().get(architectures) != simdjson::SUCCESS ||
      architectures.size() == 0 || architectures.at(0).get_string().get(class_name) != simdjson::SUCCESS) {
    return invalid_argument("\"architectures\" must be a list starting with the model class name");
  }
  const architecture_defaults* defaults = nullptr;
  for (const auto& known : known_architectures) {
    if (known.class_name == class_name) defaults = &known;
  }
  if (defaults == nullptr) {
    return status(status_code::unimplemented,
                  edge::format("architecture {} is not supported (LlamaForCausalLM, Qwen2ForCausalLM and "
                               "MistralForCausalLM are)",
                               class_name));
  }

  parsed_config parsed;
  model_config& config = parsed.config;
  config.arch = defaults->arch;
  config.rope = rope_layout::half_split;
  config.qkv_bias = defaults->qkv_bias;
  EDGE_ASSIGN_OR_RETURN(config.hidden_size, fields.required_int("hidden_size"));
  EDGE_ASSIGN_OR_RETURN(config.intermediate_size, fields.required_int("intermediate_size"));
  EDGE_ASSIGN_OR_RETURN(config.num_layers, fields.required_int("num_hidden_layers"));
  EDGE_ASSIGN_OR_RETURN(config.num_heads, fields.required_int("num_attention_heads"));
  EDGE_ASSIGN_OR_RETURN(config.vocab_size, fields.required_int("vocab_size"));
  EDGE_ASSIGN_OR_RETURN(const auto kv_heads, fields.optional_int("num_key_value_heads"));
  config.num_kv_heads = kv_heads.value_or(config.num_heads);
  EDGE_ASSIGN_OR_RETURN(const auto head_dim, fields.optional_int("head_dim"));
  if (head_dim) {
    config.head_dim = *head_dim;
  } else if (config.num_heads > 0) {
    config.head_dim = config.hidden_size / config.num_heads;
  }
  EDGE_ASSIGN_OR_RETURN(const auto max_position, fields.optional_int("max_position_embeddings"));
  config.max_position = max_position.value_or(defaults->max_position);
  EDGE_ASSIGN_OR_RETURN(const auto eps, fields.optional_number("rms_norm_eps"));
  config.rms_norm_eps = eps.value_or(default_rms_norm_eps);
  EDGE_ASSIGN_OR_RETURN(const auto theta, fields.optional_number("rope_theta"));
  config.rope_theta = theta.value_or(default_rope_theta);
  EDGE_ASSIGN_OR_RETURN(config.rope_scaling, parse_rope_scaling(fields));
  // All three classes default to an untied classifier (Qwen2.5's small models say true).
  EDGE_ASSIGN_OR_RETURN(const auto tie, fields.optional_bool("tie_word_embeddings"));
  config.tie_embeddings = tie.value_or(false);

  EDGE_ASSIGN_OR_RETURN(const auto activation, fields.optional_string("hidden_act"));
  if (activation && *activation != "silu") {
    return status(status_code::unimplemented,
                  edge::format("hidden_act \"{}\" is not supported (only \"silu\" is)", *activation));
  }
  // Llama's attention_bias also puts a bias on o_proj, which model_weights has no slot for.
  EDGE_ASSIGN_OR_RETURN(const auto attention_bias, fields.optional_bool("attention_bias"));
  EDGE_ASSIGN_OR_RETURN(const auto mlp_bias, fields.optional_bool("mlp_bias"));
  if (attention_bias.value_or(false) || mlp_bias.value_or(false)) {
    return status(status_code::unimplemented, "attention_bias / mlp_bias are not supported");
  }

  // Sliding-window attention is not implemented; within the window the results are the same.
  const logger log{"model"};
  EDGE_ASSIGN_OR_RETURN(const auto use_sliding_window, fields.optional_bool("use_sliding_window"));
  EDGE_ASSIGN_OR_RETURN(const auto sliding_window, fields.optional_int("sliding_window"));
  const bool sliding = config.arch == architecture::qwen2 ? use_sliding_window.value_or(false)
                                                          : sliding_window.has_value();
  if (sliding && sliding_window && *sliding_window < config.max_position) {
    log.warn("the model was trained with a {}-token sliding attention window; edgeinfer attends to the whole "
             "context, so outputs differ from the reference past that length",
             *sliding_window);
  }

  EDGE_ASSIGN_OR_RETURN(const auto synthetic, fields.optional_bool("edgeinfer_synthetic"));
  parsed.synthetic = synthetic.value_or(false);

  EDGE_RETURN_IF_ERROR(check_config(config));
  return parsed;
}

}  // namespace

result<parsed_config> parse_hf_config(std::string_view config_json) {
  simdjson::dom::parser parser;
  EDGE_ASSIGN_OR_RETURN(const auto object, parse_json_object(parser, config_json));
  return parse_config_object(json_fields(object));
}

result<model_weights> weights_from_hf(std::span<const tensor_view> tensors, const model_config& config) {
  tensor_names names;
  names.token_embedding = "model.embed_tokens.weight";
  names.final_norm = "model.norm.weight";
  names.lm_head = "lm_head.weight";
  names.layer = [](std::int64_t i) {
    const std::string prefix = edge::format("model.layers.{}.", i);
    layer_tensor_names layer;
    layer.attn_norm = prefix + "input_layernorm.weight";
    layer.wq = prefix + "self_attn.q_proj.weight";
    layer.wk = prefix + "self_attn.k_proj.weight";
    layer.wv = prefix + "self_attn.v_proj.weight";
    layer.wo = prefix + "self_attn.o_proj.weight";
    layer.bq = prefix + "self_attn.q_proj.bias";
    layer.bk = prefix + "self_attn.k_proj.bias";
    layer.bv = prefix + "self_attn.v_proj.bias";
    layer.ffn_norm = prefix + "post_attention_layernorm.weight";
    layer.w_gate = prefix + "mlp.gate_proj.weight";
    layer.w_up = prefix + "mlp.up_proj.weight";
    layer.w_down = prefix + "mlp.down_proj.weight";
    return layer;
  };
  return bind_weights(tensor_index(tensors), config, names);
}

}  // namespace edge::backend
