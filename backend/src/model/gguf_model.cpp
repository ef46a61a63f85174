// GGUF files of llama.cpp's "llama", "qwen2", "qwen3", "qwen3moe" and "deepseek2" architectures:
// metadata keys and tensor names, as llama.cpp's convert_hf_to_gguf.py writes them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <numbers>
#include <string>

#include "edge/backend/model/formats.h"
#include "edge/common/format.h"
#include "architecture_traits.h"
#include "model_checks.h"
#include "tensor_schema.h"
#include "weight_binding.h"

namespace edge::backend {
namespace {

constexpr double default_rope_theta = 10000.0;
// rope_freqs.weight is stored as F32 values computed in double precision.
constexpr double rope_factor_tolerance = 1e-4;

// deepseek2.expert_gating_func (llama.cpp's llama_expert_gating_func_type); files written before
// the key existed (DeepSeek-V2, V2.5) are softmax.
constexpr std::int64_t gating_none = 0;
constexpr std::int64_t gating_softmax = 1;
constexpr std::int64_t gating_sigmoid = 2;

class metadata_reader {
 public:
  metadata_reader(const gguf_file& file, std::string prefix) : file_(file), prefix_(std::move(prefix)) {}

  result<std::optional<std::int64_t>> optional_int(std::string_view key) const {
    const auto full = prefix_ + std::string(key);
    const auto* value = file_.find(full);
    if (value == nullptr) return std::optional<std::int64_t>{};
    const auto number = value->as_int();
    if (!number) return invalid_argument(edge::format("metadata {} must be an integer", full));
    return std::optional<std::int64_t>{*number};
  }

  result<std::int64_t> required_int(std::string_view key) const {
    EDGE_ASSIGN_OR_RETURN(const auto value, optional_int(key));
    if (!value) return invalid_argument(edge::format("metadata {}{} is missing", prefix_, key));
    return *value;
  }

  result<std::optional<double>> optional_number(std::string_view key) const {
    const auto full = prefix_ + std::string(key);
    const auto* value = file_.find(full);
    if (value == nullptr) return std::optional<double>{};
    const auto number = value->as_number();
    if (!number) return invalid_argument(edge::format("metadata {} must be a number", full));
    return std::optional<double>{*number};
  }

  result<double> required_number(std::string_view key) const {
    EDGE_ASSIGN_OR_RETURN(const auto value, optional_number(key));
    if (!value) return invalid_argument(edge::format("metadata {}{} is missing", prefix_, key));
    return *value;
  }

  const gguf_value* find(std::string_view key) const { return file_.find(prefix_ + std::string(key)); }

 private:
  const gguf_file& file_;
  std::string prefix_;
};

// llama.cpp keeps Llama 3 RoPE scaling as a tensor of per-frequency divisors rather than as
// parameters; the parameters are recovered by checking the divisors against the formula with
// the values every Llama 3.x release uses.
result<std::optional<rope_scaling_llama3>> rope_scaling_from_factors(const tensor_view& tensor,
                                                                     const model_config& config,
                                                                     const metadata_reader& keys) {
  if (tensor.encoding != tensor_encoding::elements || tensor.type != kernels::dtype::f32 ||
      tensor.shape != std::vector<std::int64_t>{config.head_dim / 2}) {
    return invalid_argument(edge::format("{} must be F32 {}, not {} {}", gguf_rope_factors_name(),
                                         shape_to_string(std::vector<std::int64_t>{config.head_dim / 2}),
                                         type_name(tensor), shape_to_string(tensor.shape)));
  }
  std::vector<float> stored(static_cast<std::size_t>(config.head_dim / 2));  // [head_dim / 2]
  std::memcpy(stored.data(), tensor.data, stored.size() * sizeof(float));

  rope_scaling_llama3 scaling;
  EDGE_ASSIGN_OR_RETURN(const auto original, keys.optional_int("rope.scaling.original_context_length"));
  scaling.original_max_position = original.value_or(scaling.original_max_position);
  // The lowest frequency has the largest divisor: the factor itself when its wavelength is past
  // the low-frequency band, else a blend from which the factor is solved.
  const double last = static_cast<double>(stored.back());
  if (last == 1.0) return std::optional<rope_scaling_llama3>{};
  const double head_dim = static_cast<double>(config.head_dim);
  const double frequency = std::pow(config.rope_theta, -(head_dim - 2.0) / head_dim);
  const double wavelength = 2.0 * std::numbers::pi / frequency;
  const double original_length = static_cast<double>(scaling.original_max_position);
  scaling.factor = last;
  if (wavelength <= original_length / scaling.low_freq_factor) {
    const double smooth = (original_length / wavelength - scaling.low_freq_factor) /
                          (scaling.high_freq_factor - scaling.low_freq_factor);
    if (smooth < 1.0 && 1.0 / last > smooth) scaling.factor = (1.0 - smooth) / (1.0 / last - smooth);
  }
  EDGE_RETURN_IF_ERROR(check_rope_scaling(scaling));

  const auto expected = llama3_rope_factors(scaling, config.rope_theta, config.head_dim);
  for (std::size_t i = 0; i < stored.size(); ++i) {
    const double tolerance = rope_factor_tolerance * std::max(1.0, std::abs(static_cast<double>(expected[i])));
    if (!(std::abs(static_cast<double>(stored[i]) - static_cast<double>(expected[i])) <= tolerance)) {
      return status(status_code::unimplemented,
                    edge::format("{} does not hold Llama 3 RoPE scaling (factor {}, low 1, high 4, original {}): "
                                 "element {} is {}, expected {}",
                                 gguf_rope_factors_name(), scaling.factor, scaling.original_max_position, i, stored[i],
                                 expected[i]));
    }
  }
  return std::optional<rope_scaling_llama3>{scaling};
}

// llama.cpp's qwen3moe: every layer routes each token to expert_used_count of expert_count
// experts, weighting them by a softmax over the router's logits renormalised over the chosen ones.
// The converter stores neither norm_topk_prob nor mlp_only_layers / decoder_sparse_step: llama.cpp
// builds every layer sparse and always renormalises, and so does this reader.
result<moe_config> qwen3_moe_from_gguf(const metadata_reader& keys, std::string_view arch) {
  moe_config moe;
  moe.scoring = kernels::router_scoring::softmax;
  moe.normalize_weights = true;
  EDGE_ASSIGN_OR_RETURN(moe.num_experts, keys.required_int("expert_count"));
  EDGE_ASSIGN_OR_RETURN(moe.experts_per_token, keys.required_int("expert_used_count"));
  EDGE_ASSIGN_OR_RETURN(const auto width, keys.optional_int("expert_feed_forward_length"));
  if (width) {
    moe.expert_intermediate = *width;
  } else {
    // llama.cpp's fallback for files written before the key existed.
    EDGE_ASSIGN_OR_RETURN(const auto ffn, keys.required_int("feed_forward_length"));
    moe.expert_intermediate = moe.experts_per_token > 0 ? ffn / moe.experts_per_token : 0;
  }
  if (const auto* norm = keys.find("expert_weights_norm"); norm && norm->as_bool() == false) {
    return status(status_code::unimplemented,
                  edge::format("metadata {}.expert_weights_norm is false; llama.cpp's qwen3moe always renormalises "
                               "the chosen experts' weights",
                               arch));
  }
  return moe;
}

// llama.cpp's deepseek2 (DeepSeek-V2/V3, Kimi K2): latent attention, the first
// leading_dense_block_count layers dense and the rest Mixture-of-Experts with shared experts.
// The keys are those of llama.cpp's converter before it split attn_kv_b into attn_k_b / attn_v_b
// (key_length is qk_nope + qk_rope, value_length v_head_dim, rope.dimension_count qk_rope;
// attention.q_lora_rank only when queries have the bottleneck). RoPE turns adjacent pairs (no
// Q/K permutation). What the file does not say is what llama.cpp assumes: no expert groups unless
// expert_group_count says so, and the q_a / kv_a norms at 1e-6 as transformers has them (llama.cpp
// uses rms_norm_eps there, the same for every released model).
status deepseek2_from_gguf(const gguf_file& file, const metadata_reader& keys, std::string_view arch,
                           model_config& config) {
  if (keys.find("attention.key_length_mla") != nullptr || keys.find("attention.value_length_mla") != nullptr) {
    return status(status_code::unimplemented,
                  edge::format("metadata {}.attention.key_length_mla: this GGUF has llama.cpp's later deepseek2 layout "
                               "(attn_kv_b split into attn_k_b and attn_v_b); edgeinfer reads the layout with attn_kv_b",
                               arch));
  }
  config.rope = rope_layout::adjacent_pairs;
  mla_config mla;
  EDGE_ASSIGN_OR_RETURN(const auto q_lora, keys.optional_int("attention.q_lora_rank"));
  mla.q_lora_rank = q_lora.value_or(0);
  EDGE_ASSIGN_OR_RETURN(mla.kv_lora_rank, keys.required_int("attention.kv_lora_rank"));
  EDGE_ASSIGN_OR_RETURN(const auto key_length, keys.required_int("attention.key_length"));
  EDGE_ASSIGN_OR_RETURN(mla.v_head_dim, keys.required_int("attention.value_length"));
  EDGE_ASSIGN_OR_RETURN(mla.qk_rope_head_dim, keys.required_int("rope.dimension_count"));
  mla.qk_nope_head_dim = key_length - mla.qk_rope_head_dim;
  if (mla.qk_nope_head_dim < 1) {
    return invalid_argument(edge::format("metadata {}.rope.dimension_count {} leaves nothing of key_length {} unrotated",
                                         arch, mla.qk_rope_head_dim, key_length));
  }
  config.head_dim = key_length;
  // Every head reads the one latent: transformers' configs say num_key_value_heads = heads.
  config.num_kv_heads = config.num_heads;
  config.mla = mla;

  moe_config moe;
  EDGE_ASSIGN_OR_RETURN(moe.num_experts, keys.required_int("expert_count"));
  EDGE_ASSIGN_OR_RETURN(moe.experts_per_token, keys.required_int("expert_used_count"));
  EDGE_ASSIGN_OR_RETURN(moe.expert_intermediate, keys.required_int("expert_feed_forward_length"));
  EDGE_ASSIGN_OR_RETURN(moe.shared_experts, keys.required_int("expert_shared_count"));
  EDGE_ASSIGN_OR_RETURN(moe.first_dense_layers, keys.required_int("leading_dense_block_count"));
  EDGE_ASSIGN_OR_RETURN(const auto scale, keys.optional_number("expert_weights_scale"));
  moe.routed_scaling = scale.value_or(1.0);
  if (const auto* norm = keys.find("expert_weights_norm")) {
    const auto value = norm->as_bool();
    if (!value) return invalid_argument(edge::format("metadata {}.expert_weights_norm must be a boolean", arch));
    moe.normalize_weights = *value;
  }
  EDGE_ASSIGN_OR_RETURN(const auto gating, keys.optional_int("expert_gating_func"));
  switch (gating.value_or(gating_none)) {
    case gating_none:
    case gating_softmax: moe.scoring = kernels::router_scoring::softmax; break;
    case gating_sigmoid: moe.scoring = kernels::router_scoring::sigmoid; break;
    default:
      return status(status_code::unimplemented, edge::format("metadata {}.expert_gating_func {} is neither softmax (1) "
                                                             "nor sigmoid (2)",
                                                             arch, *gating));
  }
  // Later llama.cpp's group keys (0 or absent: none).
  EDGE_ASSIGN_OR_RETURN(const auto groups, keys.optional_int("expert_group_count"));
  EDGE_ASSIGN_OR_RETURN(const auto top_groups, keys.optional_int("expert_group_used_count"));
  moe.groups = groups.value_or(0) > 0 ? *groups : 1;
  moe.top_groups = top_groups.value_or(0) > 0 ? *top_groups : moe.groups;
  // The correction bias is optional in llama.cpp: the first sparse layer says
  // whether the router has one.
  const std::string bias = gguf_router_bias_name(moe.first_dense_layers);
  moe.correction_bias = file.find_tensor(bias) != nullptr;
  if (moe.correction_bias && moe.scoring != kernels::router_scoring::sigmoid) {
    return status(status_code::unimplemented,
                  edge::format("tensor \"{}\": a correction bias on a softmax router is not supported", bias));
  }
  config.moe = moe;

  if (const auto* scaling_type = keys.find("rope.scaling.type")) {
    const auto* text = scaling_type->as_string();
    if (text != nullptr && *text == "none") return {};
    if (text == nullptr || *text != "yarn") {
      return status(status_code::unimplemented, edge::format("RoPE scaling type \"{}\" is not supported for {} (yarn is)",
                                                             text ? *text : "(not a string)", arch));
    }
    // llama.cpp's YaRN: frequencies blended between beta_fast 32 and beta_slow 1 (its defaults;
    // the file holds neither), cos and sin left unscaled (its attn_factor cancels YaRN's
    // magnitude factor), and the softmax scale times mscale² with mscale = 1 +
    // yarn_log_multiplier · ln(factor): the converter writes 0.1 · mscale_all_dim, so this is
    // transformers' mscale(factor, mscale_all_dim)², and cos and sin are unscaled in
    // transformers too exactly when mscale = mscale_all_dim.
    rope_scaling_yarn yarn;
    EDGE_ASSIGN_OR_RETURN(yarn.factor, keys.required_number("rope.scaling.factor"));
    EDGE_ASSIGN_OR_RETURN(const auto original, keys.optional_int("rope.scaling.original_context_length"));
    yarn.original_max_position = original.value_or(config.max_position);
    EDGE_ASSIGN_OR_RETURN(const auto log_multiplier, keys.optional_number("rope.scaling.yarn_log_multiplier"));
    yarn.mscale_all_dim = log_multiplier.value_or(0.0) / gguf_yarn_log_multiplier_per_mscale;
    yarn.mscale = yarn.mscale_all_dim;
    yarn.attention_factor = 1.0;
    config.yarn = yarn;
  }
  return {};
}

}  // namespace

std::optional<std::string_view> gguf_architecture_name(architecture arch) {
  const std::string_view name = traits_of(arch).gguf_name;
  if (name.empty()) return std::nullopt;
  return name;
}

result<parsed_config> config_from_gguf(const gguf_file& file) {
  const auto* arch_value = file.find("general.architecture");
  if (arch_value == nullptr || arch_value->as_string() == nullptr) {
    return invalid_argument("metadata general.architecture is missing");
  }
  const std::string& arch = *arch_value->as_string();
  const architecture_traits* known = find_gguf_architecture(arch);
  if (known == nullptr) {
    return status(status_code::unimplemented, edge::format("GGUF architecture \"{}\" is not supported ({} are)", arch,
                                                           supported_gguf_architectures()));
  }
  parsed_config parsed;
  model_config& config = parsed.config;
  config.arch = known->arch;
  // What llama.cpp's converter leaves the file with: Llama's Q/K rows permuted so that RoPE
  // rotates adjacent pairs, Qwen's in the HF order ("NEOX" RoPE, half_split), Qwen2's Q/K/V
  // biases, Qwen3's per-head Q/K RMSNorms (attn_q_norm, attn_k_norm); deepseek2's own keys say
  // the rest (deepseek2_from_gguf).
  config.rope = known->gguf_rope;
  config.qkv_bias = known->gguf_qkv_bias;
  config.qk_norm = known->gguf_qk_norm;

  const metadata_reader keys(file, arch + ".");
  EDGE_ASSIGN_OR_RETURN(config.hidden_size, keys.required_int("embedding_length"));
  EDGE_ASSIGN_OR_RETURN(config.intermediate_size, keys.required_int("feed_forward_length"));
  EDGE_ASSIGN_OR_RETURN(config.num_layers, keys.required_int("block_count"));
  EDGE_ASSIGN_OR_RETURN(config.num_heads, keys.required_int("attention.head_count"));
  EDGE_ASSIGN_OR_RETURN(config.max_position, keys.required_int("context_length"));
  EDGE_ASSIGN_OR_RETURN(config.rms_norm_eps, keys.required_number("attention.layer_norm_rms_epsilon"));
  EDGE_ASSIGN_OR_RETURN(const auto theta, keys.optional_number("rope.freq_base"));
  config.rope_theta = theta.value_or(default_rope_theta);
  if (known->attention == attention_fields::latent) {
    EDGE_RETURN_IF_ERROR(deepseek2_from_gguf(file, keys, arch, config));
  } else {
    EDGE_ASSIGN_OR_RETURN(const auto kv_heads, keys.optional_int("attention.head_count_kv"));
    config.num_kv_heads = kv_heads.value_or(config.num_heads);
    EDGE_ASSIGN_OR_RETURN(const auto key_length, keys.optional_int("attention.key_length"));
    EDGE_ASSIGN_OR_RETURN(const auto value_length, keys.optional_int("attention.value_length"));
    if (key_length) {
      config.head_dim = *key_length;
    } else if (config.num_heads > 0) {
      config.head_dim = config.hidden_size / config.num_heads;
    }
    if (value_length && *value_length != config.head_dim) {
      return status(status_code::unimplemented, edge::format("attention.value_length {} differs from key_length {}",
                                                             *value_length, config.head_dim));
    }
    EDGE_ASSIGN_OR_RETURN(const auto rope_dims, keys.optional_int("rope.dimension_count"));
    if (rope_dims && *rope_dims != config.head_dim) {
      return status(status_code::unimplemented,
                    edge::format("RoPE over {} of {} head dimensions is not supported", *rope_dims, config.head_dim));
    }
    if (const auto* scaling_type = keys.find("rope.scaling.type")) {
      const auto* text = scaling_type->as_string();
      if (text == nullptr || *text != "none") {
        return status(status_code::unimplemented,
                      edge::format("RoPE scaling type \"{}\" is not supported", text ? *text : "(not a string)"));
      }
    }
  }

  // The vocabulary is the tokenizer's token list; the embedding's rows must agree with it.
  if (const auto* tokens = file.find("tokenizer.ggml.tokens"); tokens && tokens->as_array()) {
    config.vocab_size = static_cast<std::int64_t>(tokens->as_array()->size());
  } else {
    EDGE_ASSIGN_OR_RETURN(const auto vocab, keys.optional_int("vocab_size"));
    if (!vocab) return invalid_argument("the GGUF has neither tokenizer.ggml.tokens nor a vocab_size");
    config.vocab_size = *vocab;
  }
  config.tie_embeddings = file.find_tensor(gguf_classifier_name()) == nullptr;
  if (known->router == router_fields::softmax) {
    EDGE_ASSIGN_OR_RETURN(config.moe, qwen3_moe_from_gguf(keys, arch));
  }

  EDGE_RETURN_IF_ERROR(check_config(config));
  if (const auto* factors = file.find_tensor(gguf_rope_factors_name())) {
    EDGE_ASSIGN_OR_RETURN(config.rope_scaling, rope_scaling_from_factors(*factors, config, keys));
  }

  if (const auto* synthetic = file.find("edgeinfer.synthetic")) parsed.synthetic = synthetic->as_bool().value_or(false);
  return parsed;
}

result<model_weights> weights_from_gguf(const gguf_file& file, const model_config& config,
                                        const weight_options& options) {
  const tensor_names names = names_for(config, tensor_format::gguf);
  return bind_weights(tensor_index(file.tensors), config, names, options);
}

}  // namespace edge::backend
