// GGUF files of llama.cpp's "llama", "qwen2", "qwen3" and "qwen3moe" architectures: metadata keys
// and tensor names, as llama.cpp's convert_hf_to_gguf.py writes them.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <numbers>
#include <string>

#include "edge/backend/model/formats.h"
#include "edge/common/format.h"
#include "model_checks.h"
#include "weight_binding.h"

namespace edge::backend {
namespace {

constexpr double default_rope_theta = 10000.0;
constexpr std::string_view rope_freqs_tensor = "rope_freqs.weight";
// rope_freqs.weight is stored as F32 values computed in double precision.
constexpr double rope_factor_tolerance = 1e-4;

struct gguf_architecture_entry {
  architecture arch;
  std::string_view name;  // general.architecture
};
constexpr gguf_architecture_entry gguf_architectures[] = {
    {architecture::llama, "llama"},
    {architecture::qwen2, "qwen2"},
    {architecture::qwen3, "qwen3"},
    {architecture::qwen3_moe, "qwen3moe"},
};

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
    return invalid_argument(edge::format("{} must be F32 {}, not {} {}", rope_freqs_tensor,
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
                                 rope_freqs_tensor, scaling.factor, scaling.original_max_position, i, stored[i],
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

}  // namespace

std::optional<std::string_view> gguf_architecture_name(architecture arch) {
  for (const auto& [known, name] : gguf_architectures) {
    if (known == arch) return name;
  }
  return std::nullopt;
}

result<parsed_config> config_from_gguf(const gguf_file& file) {
  const auto* arch_value = file.find("general.architecture");
  if (arch_value == nullptr || arch_value->as_string() == nullptr) {
    return invalid_argument("metadata general.architecture is missing");
  }
  const std::string& arch = *arch_value->as_string();
  const auto* known = std::find_if(std::begin(gguf_architectures), std::end(gguf_architectures),
                                   [&](const gguf_architecture_entry& entry) { return entry.name == arch; });
  if (known == std::end(gguf_architectures)) {
    std::string names;
    for (const auto& entry : gguf_architectures) names += (names.empty() ? "" : ", ") + std::string(entry.name);
    return status(status_code::unimplemented,
                  edge::format("GGUF architecture \"{}\" is not supported ({} are)", arch, names));
  }
  parsed_config parsed;
  model_config& config = parsed.config;
  config.arch = known->arch;
  switch (config.arch) {
    case architecture::llama:
      // llama.cpp's converter permutes HF Q/K rows so that RoPE rotates adjacent pairs.
      config.rope = rope_layout::adjacent_pairs;
      break;
    case architecture::qwen2:
      // Qwen2 GGUFs keep the HF row order and use llama.cpp's "NEOX" RoPE, which is half_split.
      config.rope = rope_layout::half_split;
      config.qkv_bias = true;
      break;
    case architecture::qwen3:
    case architecture::qwen3_moe:
      // NEOX RoPE as Qwen2's, and per-head Q/K RMSNorms (attn_q_norm, attn_k_norm).
      config.rope = rope_layout::half_split;
      config.qk_norm = true;
      break;
    case architecture::mistral:
    case architecture::glm4_moe:
    case architecture::deepseek_v3:
    case architecture::glm_moe_dsa: break;  // not in gguf_architectures
  }

  const metadata_reader keys(file, arch + ".");
  EDGE_ASSIGN_OR_RETURN(config.hidden_size, keys.required_int("embedding_length"));
  EDGE_ASSIGN_OR_RETURN(config.intermediate_size, keys.required_int("feed_forward_length"));
  EDGE_ASSIGN_OR_RETURN(config.num_layers, keys.required_int("block_count"));
  EDGE_ASSIGN_OR_RETURN(config.num_heads, keys.required_int("attention.head_count"));
  EDGE_ASSIGN_OR_RETURN(config.max_position, keys.required_int("context_length"));
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
  EDGE_ASSIGN_OR_RETURN(const auto eps, keys.optional_number("attention.layer_norm_rms_epsilon"));
  if (!eps) return invalid_argument(edge::format("metadata {}.attention.layer_norm_rms_epsilon is missing", arch));
  config.rms_norm_eps = *eps;
  EDGE_ASSIGN_OR_RETURN(const auto theta, keys.optional_number("rope.freq_base"));
  config.rope_theta = theta.value_or(default_rope_theta);

  if (const auto* scaling_type = keys.find("rope.scaling.type")) {
    const auto* text = scaling_type->as_string();
    if (text == nullptr || *text != "none") {
      return status(status_code::unimplemented,
                    edge::format("RoPE scaling type \"{}\" is not supported", text ? *text : "(not a string)"));
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
  config.tie_embeddings = file.find_tensor("output.weight") == nullptr;
  if (config.arch == architecture::qwen3_moe) {
    EDGE_ASSIGN_OR_RETURN(config.moe, qwen3_moe_from_gguf(keys, arch));
  }

  EDGE_RETURN_IF_ERROR(check_config(config));
  if (const auto* factors = file.find_tensor(rope_freqs_tensor)) {
    EDGE_ASSIGN_OR_RETURN(config.rope_scaling, rope_scaling_from_factors(*factors, config, keys));
  }

  if (const auto* synthetic = file.find("edgeinfer.synthetic")) parsed.synthetic = synthetic->as_bool().value_or(false);
  return parsed;
}

result<model_weights> weights_from_gguf(const gguf_file& file, const model_config& config,
                                        const weight_options& options) {
  tensor_names names;
  names.token_embedding = "token_embd.weight";
  names.final_norm = "output_norm.weight";
  names.lm_head = "output.weight";
  names.layer = [](std::int64_t i) {
    const std::string prefix = edge::format("blk.{}.", i);
    layer_tensor_names layer;
    layer.attn_norm = prefix + "attn_norm.weight";
    layer.wq = prefix + "attn_q.weight";
    layer.wk = prefix + "attn_k.weight";
    layer.wv = prefix + "attn_v.weight";
    layer.wo = prefix + "attn_output.weight";
    layer.bq = prefix + "attn_q.bias";
    layer.bk = prefix + "attn_k.bias";
    layer.bv = prefix + "attn_v.bias";
    layer.q_norm = prefix + "attn_q_norm.weight";
    layer.k_norm = prefix + "attn_k_norm.weight";
    layer.ffn_norm = prefix + "ffn_norm.weight";
    layer.w_gate = prefix + "ffn_gate.weight";
    layer.w_up = prefix + "ffn_up.weight";
    layer.w_down = prefix + "ffn_down.weight";
    layer.router = prefix + "ffn_gate_inp.weight";
    // Each layer stacks its experts: ffn_gate_exps and ffn_up_exps [experts, width, hidden],
    // ffn_down_exps [experts, hidden, width] (ggml lists the dimensions the other way round).
    layer.expert = [prefix](std::int64_t e) {
      return expert_tensor_names{prefix + "ffn_gate_exps.weight", prefix + "ffn_up_exps.weight",
                                 prefix + "ffn_down_exps.weight", e};
    };
    return layer;
  };
  return bind_weights(tensor_index(file.tensors), config, names, options);
}

}  // namespace edge::backend
