// Hugging Face folders: config.json and the transformers tensor names.
#include <string>

#include "edge/backend/model/formats.h"
#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/common/log.h"
#include "architecture_traits.h"
#include "model_checks.h"
#include "tensor_schema.h"
#include "weight_binding.h"

namespace edge::backend {
namespace {

// transformers' defaults for the Mixture-of-Experts fields (Qwen3MoeConfig, Glm4MoeConfig,
// DeepseekV3Config, GlmMoeDsaConfig).
struct moe_defaults {
  std::int64_t num_experts, experts_per_token, expert_intermediate, shared_experts, first_dense_layers;
  bool normalize_weights;
  double routed_scaling;
  std::int64_t groups, top_groups;
};
constexpr moe_defaults qwen3_moe_defaults{128, 8, 768, 0, 0, false, 1.0, 1, 1};
constexpr moe_defaults glm4_moe_defaults{128, 8, 1408, 1, 1, true, 1.0, 1, 1};
constexpr moe_defaults deepseek_v3_defaults{256, 8, 2048, 1, 3, true, 2.5, 8, 4};
constexpr moe_defaults glm_moe_dsa_defaults{256, 8, 2048, 1, 3, true, 2.5, 1, 1};

// The Mixture-of-Experts fields of a Qwen3-MoE or GLM-4.5 config.json; nullopt for a dense one
// (Qwen3-MoE with num_experts 0).
result<std::optional<moe_config>> parse_moe(const json_fields& fields, architecture arch) {
  moe_config moe;
  if (arch == architecture::qwen3_moe) {
    const moe_defaults& d = qwen3_moe_defaults;
    EDGE_ASSIGN_OR_RETURN(moe.num_experts, fields.value_or<std::int64_t>("num_experts", d.num_experts));
    if (moe.num_experts == 0) return std::optional<moe_config>{};
    EDGE_ASSIGN_OR_RETURN(moe.experts_per_token, fields.value_or<std::int64_t>("num_experts_per_tok", d.experts_per_token));
    EDGE_ASSIGN_OR_RETURN(moe.expert_intermediate,
                          fields.value_or<std::int64_t>("moe_intermediate_size", d.expert_intermediate));
    EDGE_ASSIGN_OR_RETURN(moe.normalize_weights, fields.value_or<bool>("norm_topk_prob", d.normalize_weights));
    EDGE_ASSIGN_OR_RETURN(moe.sparse_step, fields.value_or<std::int64_t>("decoder_sparse_step", 1));
    EDGE_ASSIGN_OR_RETURN(const auto dense, fields.optional<json_array>("mlp_only_layers"));
    if (dense) {
      for (const json_value layer : *dense) {
        EDGE_ASSIGN_OR_RETURN(const std::int64_t index, layer.as<std::int64_t>());
        moe.dense_layers.push_back(index);
      }
    }
    moe.scoring = kernels::router_scoring::softmax;
    return std::optional<moe_config>{moe};
  }
  // GLM-4.5, DeepSeek-V3 and GLM-5 share one router: sigmoid scores, a correction bias,
  // group-limited choice, scaled weights.
  const moe_defaults& d = arch == architecture::deepseek_v3   ? deepseek_v3_defaults
                          : arch == architecture::glm_moe_dsa ? glm_moe_dsa_defaults
                                                              : glm4_moe_defaults;
  EDGE_ASSIGN_OR_RETURN(moe.num_experts, fields.value_or<std::int64_t>("n_routed_experts", d.num_experts));
  EDGE_ASSIGN_OR_RETURN(moe.experts_per_token, fields.value_or<std::int64_t>("num_experts_per_tok", d.experts_per_token));
  EDGE_ASSIGN_OR_RETURN(moe.expert_intermediate,
                        fields.value_or<std::int64_t>("moe_intermediate_size", d.expert_intermediate));
  EDGE_ASSIGN_OR_RETURN(moe.shared_experts, fields.value_or<std::int64_t>("n_shared_experts", d.shared_experts));
  EDGE_ASSIGN_OR_RETURN(moe.first_dense_layers,
                        fields.value_or<std::int64_t>("first_k_dense_replace", d.first_dense_layers));
  EDGE_ASSIGN_OR_RETURN(moe.normalize_weights, fields.value_or<bool>("norm_topk_prob", d.normalize_weights));
  EDGE_ASSIGN_OR_RETURN(moe.routed_scaling, fields.value_or<double>("routed_scaling_factor", d.routed_scaling));
  EDGE_ASSIGN_OR_RETURN(moe.groups, fields.value_or<std::int64_t>("n_group", d.groups));
  EDGE_ASSIGN_OR_RETURN(moe.top_groups, fields.value_or<std::int64_t>("topk_group", d.top_groups));
  // DeepSeek's own code makes every moe_layer_freq-th layer sparse; transformers (and every
  // release) has 1.
  EDGE_ASSIGN_OR_RETURN(const std::int64_t frequency, fields.value_or<std::int64_t>("moe_layer_freq", 1));
  if (frequency != 1) {
    return status(status_code::unimplemented, edge::format("moe_layer_freq {} is not supported (only 1 is)", frequency));
  }
  // GLM-5's newer configs list each layer's MLP ("dense" or "sparse") instead.
  EDGE_ASSIGN_OR_RETURN(const auto types, fields.optional<json_array>("mlp_layer_types"));
  if (types) {
    moe.first_dense_layers = 0;
    std::int64_t layer = 0;
    for (const json_value type : *types) {
      EDGE_ASSIGN_OR_RETURN(const std::string_view name, type.as<std::string_view>());
      if (name != "dense" && name != "sparse") {
        return invalid_argument(edge::format("mlp_layer_types entry \"{}\" is neither \"dense\" nor \"sparse\"", name));
      }
      if (name == "dense") moe.dense_layers.push_back(layer);
      ++layer;
    }
  }
  moe.scoring = kernels::router_scoring::sigmoid;
  moe.correction_bias = true;
  // DeepSeek-V3's configs name the scoring and the choice; GLM's imply these values.
  const struct {
    std::string_view field, supported;
  } fixed[] = {{"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"}};
  for (const auto& f : fixed) {
    EDGE_ASSIGN_OR_RETURN(const auto value, fields.optional<std::string_view>(f.field));
    if (value && *value != f.supported) {
      return status(status_code::unimplemented,
                    edge::format("{} \"{}\" is not supported (only \"{}\" is)", f.field, *value, f.supported));
    }
  }
  return std::optional<moe_config>{moe};
}

// Defaults shared by the three configuration classes.
constexpr double default_rms_norm_eps = 1e-6;
constexpr double glm_rms_norm_eps = 1e-5;
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
    if (out.arch != architecture::deepseek_v3 && out.arch != architecture::glm_moe_dsa) {
      // Checked against the reference for latent attention only (DeepSeek's softmax factor is its own).
      return status(status_code::unimplemented,
                    edge::format("rope_scaling type \"yarn\" is supported for {} and {} only",
                                 traits_of(architecture::deepseek_v3).hf_class,
                                 traits_of(architecture::glm_moe_dsa).hf_class));
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

// The attention of DeepseekV3ForCausalLM (kimi_k2 too) and GlmMoeDsaForCausalLM: MLA, and for
// GLM-5 the DSA indexer. Their head_dim is the query/key head (qk_nope + qk_rope) and every
// head has its own key and value (num_key_value_heads = num_attention_heads).
status parse_mla(const json_fields& fields, model_config& config) {
  const bool glm = config.arch == architecture::glm_moe_dsa;
  mla_config mla;
  // q_lora_rank: null means one q_proj; absent, the class's default (find() reads both as absent).
  const bool q_lora_given = fields.object().at_key("q_lora_rank").error() == simdjson::SUCCESS;
  EDGE_ASSIGN_OR_RETURN(const auto q_lora, fields.optional<std::int64_t>("q_lora_rank"));
  mla.q_lora_rank = q_lora.value_or(q_lora_given ? 0 : (glm ? 2048 : 1536));
  EDGE_ASSIGN_OR_RETURN(mla.kv_lora_rank, fields.value_or<std::int64_t>("kv_lora_rank", 512));
  EDGE_ASSIGN_OR_RETURN(mla.qk_nope_head_dim, fields.value_or<std::int64_t>("qk_nope_head_dim", glm ? 192 : 128));
  EDGE_ASSIGN_OR_RETURN(mla.qk_rope_head_dim, fields.value_or<std::int64_t>("qk_rope_head_dim", 64));
  EDGE_ASSIGN_OR_RETURN(mla.v_head_dim, fields.value_or<std::int64_t>("v_head_dim", glm ? 256 : 128));
  config.head_dim = mla.qk_head_dim();
  config.num_kv_heads = config.num_heads;
  // DeepSeek-V3's rope_interleave (default true) rotates pairs (2i, 2i+1) of q_pe and k_pe
  // (transformers permutes them to halves first, the same dot products); GLM-5 always does.
  EDGE_ASSIGN_OR_RETURN(const bool interleave, fields.value_or<bool>("rope_interleave", true));
  config.rope = glm || interleave ? rope_layout::adjacent_pairs : rope_layout::half_split;
  config.mla = mla;
  if (glm) {
    dsa_config dsa;
    EDGE_ASSIGN_OR_RETURN(dsa.index_topk, fields.value_or<std::int64_t>("index_topk", 2048));
    EDGE_ASSIGN_OR_RETURN(dsa.index_heads, fields.value_or<std::int64_t>("index_n_heads", 32));
    EDGE_ASSIGN_OR_RETURN(dsa.index_head_dim, fields.value_or<std::int64_t>("index_head_dim", 128));
    // Which layers run their own indexer: indexer_types, else index_topk_pattern ("F" full,
    // "S" shared), else every index_topk_freq-th layer from index_skip_topk_offset on (with
    // freq 1, the default, every layer), as GlmMoeDsaConfig computes it.
    EDGE_ASSIGN_OR_RETURN(const auto types, fields.optional<json_array>("indexer_types"));
    EDGE_ASSIGN_OR_RETURN(const auto pattern, fields.optional<std::string_view>("index_topk_pattern"));
    if (types) {
      for (const json_value type : *types) {
        EDGE_ASSIGN_OR_RETURN(const std::string_view name, type.as<std::string_view>());
        if (name != "full" && name != "shared") {
          return invalid_argument(edge::format("indexer_types entry \"{}\" is neither \"full\" nor \"shared\"", name));
        }
        dsa.shared_layers.push_back(name == "shared");
      }
    } else if (pattern) {
      for (const char c : *pattern) {
        if (c != 'F' && c != 'S') return invalid_argument(edge::format("index_topk_pattern \"{}\" is not F/S", *pattern));
        dsa.shared_layers.push_back(c == 'S');
      }
    } else {
      EDGE_ASSIGN_OR_RETURN(const std::int64_t freq, fields.value_or<std::int64_t>("index_topk_freq", 1));
      EDGE_ASSIGN_OR_RETURN(const std::int64_t offset, fields.value_or<std::int64_t>("index_skip_topk_offset", 2));
      const std::int64_t every = std::max<std::int64_t>(freq, 1);
      for (std::int64_t i = 0; i < config.num_layers; ++i) {
        dsa.shared_layers.push_back(std::max<std::int64_t>(i - offset + 1, 0) % every != 0);
      }
    }
    config.dsa = dsa;
  }
  EDGE_ASSIGN_OR_RETURN(config.nextn_layers, fields.value_or<std::int64_t>("num_nextn_predict_layers", 0));
  if (config.nextn_layers > 0) {
    logger{"model"}.info("skipping the checkpoint's {} multi-token-prediction layer{} (model.layers.{}{}): edgeinfer "
                         "decodes one token per step and does not load them",
                         config.nextn_layers, config.nextn_layers == 1 ? "" : "s", config.num_layers,
                         config.nextn_layers == 1 ? "" : edge::format("-{}", config.num_layers + config.nextn_layers - 1));
  }
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
  // Glm4MoeConfig and GlmMoeDsaConfig default to 1e-5, the others to 1e-6.
  const bool glm = config.arch == architecture::glm4_moe || config.arch == architecture::glm_moe_dsa;
  config.rms_norm_eps = eps.value_or(glm ? glm_rms_norm_eps : default_rms_norm_eps);
  EDGE_RETURN_IF_ERROR(parse_rope(fields, config));
  // All three classes default to an untied classifier (Qwen2.5's small models say true).
  EDGE_ASSIGN_OR_RETURN(const auto tie, fields.optional<bool>("tie_word_embeddings"));
  config.tie_embeddings = tie.value_or(false);

  EDGE_ASSIGN_OR_RETURN(const auto activation, fields.optional<std::string_view>("hidden_act"));
  if (activation && *activation != "silu") {
    return status(status_code::unimplemented,
                  edge::format("hidden_act \"{}\" is not supported (only \"silu\" is)", *activation));
  }
  EDGE_ASSIGN_OR_RETURN(const auto attention_bias, fields.optional<bool>("attention_bias"));
  EDGE_ASSIGN_OR_RETURN(const auto mlp_bias, fields.optional<bool>("mlp_bias"));
  if (config.arch == architecture::glm4_moe) {
    // GLM-4.5's attention_bias is on Q, K and V only; use_qk_norm adds Qwen3's per-head norms;
    // RoPE turns the leading partial_rotary_factor of each head.
    config.qkv_bias = attention_bias.value_or(false);
    EDGE_ASSIGN_OR_RETURN(config.qk_norm, fields.value_or<bool>("use_qk_norm", false));
    EDGE_ASSIGN_OR_RETURN(const double partial, fields.value_or<double>("partial_rotary_factor", 0.5));
    if (!(partial > 0.0 && partial <= 1.0)) {
      return invalid_argument(edge::format("partial_rotary_factor = {} must be in (0, 1]", partial));
    }
    config.rotary_dim = static_cast<std::int64_t>(static_cast<double>(config.head_dim) * partial);
  } else if (config.arch == architecture::deepseek_v3 || config.arch == architecture::glm_moe_dsa) {
    if (attention_bias.value_or(false)) {
      return status(status_code::unimplemented, "attention_bias on the MLA projections is not supported");
    }
    EDGE_RETURN_IF_ERROR(parse_mla(fields, config));
  } else if (attention_bias.value_or(false) || mlp_bias.value_or(false)) {
    // The Llama and Qwen3 classes' attention_bias also puts a bias on o_proj, which
    // model_weights has no slot for.
    return status(status_code::unimplemented, "attention_bias / mlp_bias are not supported");
  }
  if (config.arch == architecture::qwen3_moe || config.arch == architecture::glm4_moe ||
      config.arch == architecture::deepseek_v3 || config.arch == architecture::glm_moe_dsa) {
    EDGE_ASSIGN_OR_RETURN(config.moe, parse_moe(fields, config.arch));
  }

  // Sliding-window attention is not implemented; within the window the results are the same.
  const logger log{"model"};
  EDGE_ASSIGN_OR_RETURN(const auto use_sliding_window, fields.optional<bool>("use_sliding_window"));
  EDGE_ASSIGN_OR_RETURN(const auto sliding_window, fields.optional<std::int64_t>("sliding_window"));
  const bool sliding = traits_of(config.arch).sliding_window_switch ? use_sliding_window.value_or(false)
                                                                      : sliding_window.has_value();
  if (sliding && sliding_window && *sliding_window < config.max_position) {
    log.warn("the model was trained with a {}-token sliding attention window; edgeinfer attends to the whole "
             "context, so outputs differ from the reference past that length",
             *sliding_window);
  }

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
