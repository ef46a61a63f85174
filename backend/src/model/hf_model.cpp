// Hugging Face folders: config.json and the transformers tensor names.
#include <string>

#include "edge/backend/model/formats.h"
#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/common/log.h"
#include "architecture_traits.h"
#include "hf_config_fields.h"
#include "model_checks.h"
#include "tensor_schema.h"
#include "weight_binding.h"

namespace edge::backend {
namespace {

constexpr double default_rope_theta = 10000.0;

// rope_scaling (or, in newer configs, rope_parameters, which also carries rope_theta): none,
// "default", "llama3" or "yarn".
status parse_rope(const json_fields& config, model_config& out) {
  EDGE_ASSIGN_OR_RETURN(const auto theta, config.optional<double>("rope_theta"));
  out.rope_theta = theta.value_or(default_rope_theta);
  EDGE_ASSIGN_OR_RETURN(auto object, config.optional<json_fields>("rope_scaling"));
  if (!object) {
    EDGE_ASSIGN_OR_RETURN(object, config.optional<json_fields>("rope_parameters"));
    if (object) {
      EDGE_ASSIGN_OR_RETURN(const auto nested_theta, object->optional<double>("rope_theta"));
      if (nested_theta && !theta) out.rope_theta = *nested_theta;
    }
  }
  if (!object) return {};
  const json_fields& fields = *object;
  // transformers renamed "type" to "rope_type"; files carry either.
  EDGE_ASSIGN_OR_RETURN(auto type, fields.optional<std::string_view>("rope_type"));
  if (!type) {
    EDGE_ASSIGN_OR_RETURN(type, fields.optional<std::string_view>("type"));
  }
  if (!type || *type == "default") return {};
  EDGE_ASSIGN_OR_RETURN(const auto factor, fields.optional<double>("factor"));
  EDGE_ASSIGN_OR_RETURN(const auto original, fields.optional<std::int64_t>("original_max_position_embeddings"));
  if (*type == "yarn") {
    if (traits_of(out.arch).attention != attention_fields::latent) {
      // Checked against the reference for latent attention only (DeepSeek's softmax factor is its own).
      return status(status_code::unimplemented, edge::format("rope_scaling type \"yarn\" is supported for {} only",
                                                             latent_attention_classes()));
    }
    rope_scaling_yarn yarn;
    if (!original) return invalid_argument("yarn rope_scaling needs \"original_max_position_embeddings\"");
    yarn.original_max_position = *original;
    // transformers: factor defaults to max_position_embeddings / original_max_position_embeddings.
    EDGE_ASSIGN_OR_RETURN(const auto max_position, config.optional<std::int64_t>("max_position_embeddings"));
    yarn.factor = factor ? *factor
                         : static_cast<double>(max_position.value_or(*original)) / static_cast<double>(*original);
    // beta_fast / beta_slow: `or 32` / `or 1` in transformers, so an explicit 0 takes the default too.
    EDGE_ASSIGN_OR_RETURN(const auto beta_fast, fields.optional<double>("beta_fast"));
    EDGE_ASSIGN_OR_RETURN(const auto beta_slow, fields.optional<double>("beta_slow"));
    if (beta_fast && *beta_fast != 0.0) yarn.beta_fast = *beta_fast;
    if (beta_slow && *beta_slow != 0.0) yarn.beta_slow = *beta_slow;
    EDGE_ASSIGN_OR_RETURN(yarn.truncate, fields.value_or<bool>("truncate", true));
    EDGE_ASSIGN_OR_RETURN(const auto mscale, fields.optional<double>("mscale"));
    EDGE_ASSIGN_OR_RETURN(const auto mscale_all_dim, fields.optional<double>("mscale_all_dim"));
    yarn.mscale = mscale.value_or(0.0);
    yarn.mscale_all_dim = mscale_all_dim.value_or(0.0);
    EDGE_ASSIGN_OR_RETURN(yarn.attention_factor, fields.optional<double>("attention_factor"));
    EDGE_RETURN_IF_ERROR(check_rope_scaling(yarn));
    out.yarn = yarn;
    return {};
  }
  if (*type != "llama3") {
    return status(status_code::unimplemented,
                  edge::format("rope_scaling type \"{}\" is not supported (llama3 and yarn are)", *type));
  }
  rope_scaling_llama3 scaling;
  EDGE_ASSIGN_OR_RETURN(const auto low, fields.optional<double>("low_freq_factor"));
  EDGE_ASSIGN_OR_RETURN(const auto high, fields.optional<double>("high_freq_factor"));
  if (!factor || !original) {
    return invalid_argument("llama3 rope_scaling needs \"factor\" and \"original_max_position_embeddings\"");
  }
  scaling.factor = *factor;
  scaling.low_freq_factor = low.value_or(scaling.low_freq_factor);
  scaling.high_freq_factor = high.value_or(scaling.high_freq_factor);
  scaling.original_max_position = *original;
  EDGE_RETURN_IF_ERROR(check_rope_scaling(scaling));
  out.rope_scaling = scaling;
  return {};
}

// compressed-tensors' quantization_config (what llm-compressor writes): symmetric INT4 weights
// in groups or channels ("pack-quantized"), or FP8 E4M3 weights per channel or tensor
// ("float-quantized"). Which projections are quantized is read from the tensors themselves
// (weight_binding.h); here the scheme is checked for what the loader cannot honour.
constexpr int int4_bits = 4;
constexpr int fp8_bits = 8;

status check_weight_scheme(std::string_view group_name, std::string_view format, const json_fields& weights) {
  EDGE_ASSIGN_OR_RETURN(const auto bits, weights.optional<std::int64_t>("num_bits"));
  EDGE_ASSIGN_OR_RETURN(const auto type, weights.optional<std::string_view>("type"));
  EDGE_ASSIGN_OR_RETURN(const auto symmetric, weights.optional<bool>("symmetric"));
  EDGE_ASSIGN_OR_RETURN(const auto strategy, weights.optional<std::string_view>("strategy"));
  const auto unsupported = [&](std::string_view what) {
    return status(status_code::unimplemented,
                  edge::format("quantization_config group \"{}\": {} is not supported (symmetric INT4 in groups or "
                               "channels, or FP8 E4M3 per channel or tensor, is)",
                               group_name, what));
  };
  if (!symmetric.value_or(true)) return unsupported("asymmetric quantization");
  if (format == "pack-quantized") {
    if (bits.value_or(0) != int4_bits || type.value_or("int") != "int") {
      return unsupported(edge::format("{}-bit {} weights", bits.value_or(0), type.value_or("int")));
    }
    if (strategy && *strategy != "group" && *strategy != "channel") return unsupported(edge::format("strategy {}", *strategy));
    return {};
  }
  if (bits.value_or(0) != fp8_bits || type.value_or("") != "float") {
    return unsupported(edge::format("{}-bit {} weights", bits.value_or(0), type.value_or("int")));
  }
  if (strategy && *strategy != "channel" && *strategy != "tensor") return unsupported(edge::format("strategy {}", *strategy));
  return {};
}

// quant_method "fp8" as DeepSeek-V3 and the FP8 releases after it write it: E4M3 weights, one
// weight_scale_inv per weight_block_size block, activations quantized at run time (which
// edgeinfer does not do: they stay in float).
status parse_fp8_blocks(const json_fields& fields, parsed_config& parsed) {
  EDGE_ASSIGN_OR_RETURN(const auto fmt, fields.optional<std::string_view>("fmt"));
  if (fmt && *fmt != "e4m3") {
    return status(status_code::unimplemented,
                  edge::format("quantization_config fmt \"{}\" is not supported (only \"e4m3\" is)", *fmt));
  }
  EDGE_ASSIGN_OR_RETURN(const auto block, fields.optional<json_array>("weight_block_size"));
  if (!block) {
    return status(status_code::unimplemented,
                  "quant_method \"fp8\" without weight_block_size (per-tensor FP8) is not supported");
  }
  std::vector<std::int64_t> sides;
  for (const json_value side : *block) {
    EDGE_ASSIGN_OR_RETURN(const std::int64_t n, side.as<std::int64_t>());
    sides.push_back(n);
  }
  if (sides.size() != 2 || sides[0] < 1 || sides[1] < 1) {
    return invalid_argument("quantization_config weight_block_size must be two positive integers");
  }
  EDGE_ASSIGN_OR_RETURN(const auto activations, fields.optional<std::string_view>("activation_scheme"));
  if (activations && *activations != "dynamic") {
    logger{"model"}.warn("the checkpoint's activation_scheme is \"{}\"; edgeinfer keeps activations in float and "
                         "uses only its quantized weights",
                         *activations);
  }
  parsed.quantized = kernels::weight_format::fp8_e4m3;
  parsed.fp8_block_rows = sides[0];
  parsed.fp8_block_cols = sides[1];
  return {};
}

status parse_quantization(const json_fields& config, parsed_config& parsed) {
  EDGE_ASSIGN_OR_RETURN(const auto object, config.optional<json_fields>("quantization_config"));
  if (!object) return {};
  const json_fields& fields = *object;
  EDGE_ASSIGN_OR_RETURN(const auto method, fields.optional<std::string_view>("quant_method"));
  if (method == "fp8") return parse_fp8_blocks(fields, parsed);
  if (method.value_or("") != "compressed-tensors") {
    return status(status_code::unimplemented,
                  edge::format("quantization method \"{}\" is not supported (compressed-tensors and fp8 with "
                               "weight_block_size are)",
                               method.value_or("")));
  }
  if (const auto sparsity = fields.find("sparsity_config")) {
    const auto sparsity_fields = sparsity->as<json_fields>();
    if (!sparsity_fields.ok() || sparsity_fields->size() != 0) {
      return status(status_code::unimplemented, "sparse compressed-tensors checkpoints are not supported");
    }
  }
  EDGE_ASSIGN_OR_RETURN(const auto format, fields.optional<std::string_view>("format"));
  std::optional<kernels::weight_format> quantized;
  if (format == "pack-quantized") {
    quantized = kernels::weight_format::int4;
  } else if (format == "float-quantized" || format == "naive-quantized") {
    quantized = kernels::weight_format::fp8_e4m3;
  } else {
    return status(status_code::unimplemented,
                  edge::format("compressed-tensors format \"{}\" is not supported (pack-quantized and float-quantized "
                               "are)",
                               format.value_or("")));
  }
  EDGE_ASSIGN_OR_RETURN(const json_fields groups, fields.required<json_fields>("config_groups"));
  bool activations = false;
  for (const auto [name, group] : groups) {
    EDGE_ASSIGN_OR_RETURN(const json_fields group_fields, group.as<json_fields>());
    EDGE_ASSIGN_OR_RETURN(const auto weights, group_fields.optional<json_fields>("weights"));
    if (weights) EDGE_RETURN_IF_ERROR(check_weight_scheme(name, *format, *weights));
    activations = activations || group_fields.find("input_activations").has_value();
  }
  if (activations) {
    logger{"model"}.warn("the checkpoint also quantizes activations; edgeinfer keeps activations in float and uses "
                         "only its quantized weights");
  }
  parsed.quantized = quantized;
  return {};
}

result<parsed_config> parse_config_object(const json_fields& fields) {
  constexpr std::string_view architectures_expected = "a list starting with the model class name";
  EDGE_ASSIGN_OR_RETURN(const json_value architectures, fields.required("architectures"));
  EDGE_ASSIGN_OR_RETURN(const json_array classes, architectures.as<json_array>(architectures_expected));
  if (classes.empty()) return architectures.must_be(architectures_expected);
  EDGE_ASSIGN_OR_RETURN(const std::string_view class_name, classes.front().as<std::string_view>());
  const architecture_traits* defaults = find_hf_class(class_name);
  if (defaults == nullptr) {
    return status(status_code::unimplemented,
                  edge::format("architecture {} is not supported ({} are)", class_name, supported_hf_classes()));
  }

  parsed_config parsed;
  model_config& config = parsed.config;
  config.arch = defaults->arch;
  config.rope = rope_layout::half_split;
  config.qkv_bias = defaults->default_qkv_bias;
  config.qk_norm = defaults->default_qk_norm;
  EDGE_ASSIGN_OR_RETURN(config.hidden_size, fields.required<std::int64_t>("hidden_size"));
  EDGE_ASSIGN_OR_RETURN(config.intermediate_size, fields.required<std::int64_t>("intermediate_size"));
  EDGE_ASSIGN_OR_RETURN(config.num_layers, fields.required<std::int64_t>("num_hidden_layers"));
  EDGE_ASSIGN_OR_RETURN(config.num_heads, fields.required<std::int64_t>("num_attention_heads"));
  EDGE_ASSIGN_OR_RETURN(config.vocab_size, fields.required<std::int64_t>("vocab_size"));
  EDGE_ASSIGN_OR_RETURN(const auto kv_heads, fields.optional<std::int64_t>("num_key_value_heads"));
  config.num_kv_heads = kv_heads.value_or(config.num_heads);
  EDGE_ASSIGN_OR_RETURN(const auto head_dim, fields.optional<std::int64_t>("head_dim"));
  if (head_dim) {
    config.head_dim = *head_dim;
  } else if (defaults->default_head_dim > 0) {
    config.head_dim = defaults->default_head_dim;
  } else if (config.num_heads > 0) {
    config.head_dim = config.hidden_size / config.num_heads;
  }
  EDGE_ASSIGN_OR_RETURN(const auto max_position, fields.optional<std::int64_t>("max_position_embeddings"));
  config.max_position = max_position.value_or(defaults->default_max_position);
  EDGE_ASSIGN_OR_RETURN(const auto eps, fields.optional<double>("rms_norm_eps"));
  config.rms_norm_eps = eps.value_or(defaults->default_rms_norm_eps);
  EDGE_RETURN_IF_ERROR(parse_rope(fields, config));
  // All three classes default to an untied classifier (Qwen2.5's small models say true).
  EDGE_ASSIGN_OR_RETURN(const auto tie, fields.optional<bool>("tie_word_embeddings"));
  config.tie_embeddings = tie.value_or(false);

  EDGE_ASSIGN_OR_RETURN(const auto activation, fields.optional<std::string_view>("hidden_act"));
  if (activation && *activation != "silu") {
    return status(status_code::unimplemented,
                  edge::format("hidden_act \"{}\" is not supported (only \"silu\" is)", *activation));
  }
  EDGE_RETURN_IF_ERROR(read_class_fields(fields, config));

  EDGE_ASSIGN_OR_RETURN(const auto synthetic, fields.optional<bool>("edgeinfer_synthetic"));
  parsed.synthetic = synthetic.value_or(false);
  EDGE_RETURN_IF_ERROR(parse_quantization(fields, parsed));

  EDGE_RETURN_IF_ERROR(check_config(config));
  return parsed;
}

}  // namespace

result<parsed_config> parse_hf_config(std::string_view config_json) {
  simdjson::dom::parser parser;
  EDGE_ASSIGN_OR_RETURN(const auto object, parse_json_object(parser, config_json));
  return parse_config_object(json_fields(object));
}

result<model_weights> weights_from_hf(std::span<const tensor_view> tensors, const model_config& config,
                                      const weight_options& options) {
  const tensor_names names = names_for(config, tensor_format::hf);
  return bind_weights(tensor_index(tensors, options.fp8_block_rows, options.fp8_block_cols), config, names, options);
}

}  // namespace edge::backend
