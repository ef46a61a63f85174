#include "model_checks.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <numbers>

#include "edge/common/format.h"
#include "kernels/mla_attention/mla_attention.h"
#include "kernels/moe_routing/moe_routing.h"

namespace edge::backend {
namespace {

// Upper bounds well beyond any released model, low enough that products of two stay exact.
constexpr std::int64_t max_vocab_size = std::int64_t{1} << 24;
constexpr std::int64_t max_width = std::int64_t{1} << 20;  // hidden, intermediate, heads × head_dim
constexpr std::int64_t max_layers = 4096;
constexpr std::int64_t max_heads = 4096;
constexpr std::int64_t max_positions = std::int64_t{1} << 30;
constexpr std::int64_t max_experts = kernels::max_router_experts;

status out_of_bounds(std::string_view name, std::int64_t value, std::int64_t low, std::int64_t high) {
  return invalid_argument(edge::format("{} = {} is outside [{}, {}]", name, value, low, high));
}

struct bounded {
  std::string_view name;
  std::int64_t value;
  std::int64_t low;
  std::int64_t high;
};

// The first size outside its bounds, named.
status check_bounds(std::initializer_list<bounded> sizes) {
  for (const bounded& size : sizes) {
    if (size.value < size.low || size.value > size.high) return out_of_bounds(size.name, size.value, size.low, size.high);
  }
  return {};
}

}  // namespace

status check_config(const model_config& config) {
  EDGE_RETURN_IF_ERROR(check_bounds({
      {"vocab_size", config.vocab_size, 1, max_vocab_size},
      {"hidden_size", config.hidden_size, 1, max_width},
      {"intermediate_size", config.intermediate_size, 1, max_width},
      {"num_layers", config.num_layers, 1, max_layers},
      {"num_heads", config.num_heads, 1, max_heads},
      {"num_kv_heads", config.num_kv_heads, 1, config.num_heads},
      {"head_dim", config.head_dim, 1, max_width},
      {"max_position", config.max_position, 1, max_positions},
  }));
  if (config.num_heads % config.num_kv_heads != 0) {
    return invalid_argument(edge::format("num_heads = {} is not a multiple of num_kv_heads = {}", config.num_heads,
                                         config.num_kv_heads));
  }
  if (!config.mla && config.head_dim % 2 != 0) {  // latent attention rotates qk_rope_head_dim (check_mla)
    return invalid_argument(edge::format("head_dim = {} is odd; RoPE rotates pairs", config.head_dim));
  }
  if (config.num_heads * config.head_dim > max_width) {
    return invalid_argument(edge::format("num_heads × head_dim = {} is over {}", config.num_heads * config.head_dim,
                                         max_width));
  }
  if (!(config.rms_norm_eps > 0.0) || !std::isfinite(config.rms_norm_eps)) {
    return invalid_argument(edge::format("rms_norm_eps = {} must be positive", config.rms_norm_eps));
  }
  if (!(config.rope_theta > 0.0) || !std::isfinite(config.rope_theta)) {
    return invalid_argument(edge::format("rope_theta = {} must be positive", config.rope_theta));
  }
  if (config.rope_scaling) EDGE_RETURN_IF_ERROR(check_rope_scaling(*config.rope_scaling));
  if (config.rotary_dim != 0 && (config.rotary_dim < 2 || config.rotary_dim > config.head_dim || config.rotary_dim % 2 != 0)) {
    return invalid_argument(edge::format("the rotary dimension {} (head_dim × partial_rotary_factor) must be even and "
                                         "within head_dim = {}",
                                         config.rotary_dim, config.head_dim));
  }
  if (config.moe) EDGE_RETURN_IF_ERROR(check_moe(*config.moe, config.num_layers));
  if (config.yarn) EDGE_RETURN_IF_ERROR(check_rope_scaling(*config.yarn));
  if (config.yarn && config.rope_scaling) return invalid_argument("a model has one rope_scaling, not two");
  if (config.mla) EDGE_RETURN_IF_ERROR(check_mla(config));
  if (config.dsa && !config.mla) return invalid_argument("DeepSeek Sparse Attention needs latent attention");
  if (config.nextn_layers < 0 || config.nextn_layers > max_layers) {
    return out_of_bounds("num_nextn_predict_layers", config.nextn_layers, 0, max_layers);
  }
  return {};
}

status check_mla(const model_config& config) {
  const mla_config& m = *config.mla;
  EDGE_RETURN_IF_ERROR(check_bounds({
      {"q_lora_rank", m.q_lora_rank, 0, max_width},
      {"kv_lora_rank", m.kv_lora_rank, 1, kernels::max_mla_row},
      {"qk_nope_head_dim", m.qk_nope_head_dim, 1, max_width},
      {"qk_rope_head_dim", m.qk_rope_head_dim, 2, kernels::max_mla_row},
      {"v_head_dim", m.v_head_dim, 1, max_width},
      {"num_attention_heads", config.num_heads, 1, kernels::max_mla_heads},
  }));
  if (m.qk_rope_head_dim % 2 != 0) {
    return invalid_argument(edge::format("qk_rope_head_dim = {} is odd; RoPE rotates pairs", m.qk_rope_head_dim));
  }
  if (m.cache_row() > kernels::max_mla_row) {
    return out_of_bounds("kv_lora_rank + qk_rope_head_dim", m.cache_row(), 1, kernels::max_mla_row);
  }
  if (config.num_heads * std::max(m.qk_head_dim(), m.v_head_dim) > max_width ||
      config.num_heads * m.kv_lora_rank > max_width) {
    return invalid_argument(edge::format("{} heads of latent attention are over {} wide", config.num_heads, max_width));
  }
  if (config.dsa) {
    const dsa_config& d = *config.dsa;
    if (m.q_lora_rank == 0) return invalid_argument("the DSA indexer reads the q_lora_rank bottleneck, which this model lacks");
    if (d.index_topk < 1 || d.index_topk > max_positions) return out_of_bounds("index_topk", d.index_topk, 1, max_positions);
    if (d.index_heads < 1 || d.index_heads > max_heads) return out_of_bounds("index_n_heads", d.index_heads, 1, max_heads);
    if (d.index_head_dim < m.qk_rope_head_dim || d.index_head_dim > kernels::max_mla_row) {
      return out_of_bounds("index_head_dim", d.index_head_dim, m.qk_rope_head_dim, kernels::max_mla_row);
    }
    if (!d.shared_layers.empty()) {
      if (static_cast<std::int64_t>(d.shared_layers.size()) < config.num_layers) {
        return invalid_argument(edge::format("indexer_types lists {} layers of {}", d.shared_layers.size(), config.num_layers));
      }
      if (d.shared_layers.front()) return invalid_argument("the first layer cannot reuse a previous layer's indexer");
    }
  }
  return {};
}

status check_rope_scaling(const rope_scaling_yarn& scaling) {
  if (!(scaling.factor >= 1.0) || !std::isfinite(scaling.factor)) {
    return invalid_argument(edge::format("yarn rope_scaling factor = {} must be at least 1", scaling.factor));
  }
  if (scaling.original_max_position < 1 || scaling.original_max_position > max_positions) {
    return out_of_bounds("original_max_position_embeddings", scaling.original_max_position, 1, max_positions);
  }
  if (!(scaling.beta_fast > 0.0) || !(scaling.beta_slow > 0.0) || !std::isfinite(scaling.beta_fast) ||
      !std::isfinite(scaling.beta_slow)) {
    return invalid_argument(edge::format("yarn beta_fast ({}) and beta_slow ({}) must be positive", scaling.beta_fast,
                                         scaling.beta_slow));
  }
  for (const double m : {scaling.mscale, scaling.mscale_all_dim, scaling.attention_factor.value_or(1.0)}) {
    if (!std::isfinite(m) || m < 0.0) return invalid_argument(edge::format("yarn mscale {} must be finite and >= 0", m));
  }
  return {};
}

status check_moe(const moe_config& moe, std::int64_t num_layers) {
  EDGE_RETURN_IF_ERROR(check_bounds({
      {"num_experts", moe.num_experts, 1, max_experts},
      {"num_experts_per_tok", moe.experts_per_token, 1, moe.num_experts},
      {"moe_intermediate_size", moe.expert_intermediate, 1, max_width},
      {"n_shared_experts", moe.shared_experts, 0, max_width / std::max<std::int64_t>(moe.expert_intermediate, 1)},
      {"n_group", moe.groups, 1, moe.num_experts},
      {"topk_group", moe.top_groups, 1, moe.groups},
      {"first_k_dense_replace", moe.first_dense_layers, 0, num_layers},
      {"decoder_sparse_step", moe.sparse_step, 1, num_layers},
  }));
  if (moe.num_experts % moe.groups != 0) {
    return invalid_argument(edge::format("n_group = {} does not divide num_experts = {}", moe.groups, moe.num_experts));
  }
  if (moe.top_groups * (moe.num_experts / moe.groups) < moe.experts_per_token) {
    return invalid_argument(edge::format("topk_group = {} groups of {} experts cannot hold num_experts_per_tok = {}",
                                         moe.top_groups, moe.num_experts / moe.groups, moe.experts_per_token));
  }
  if (moe.scoring == kernels::router_scoring::softmax && (moe.correction_bias || moe.groups > 1)) {
    return invalid_argument("a softmax router has no correction bias and no expert groups");
  }
  if (!(moe.routed_scaling > 0.0) || !std::isfinite(moe.routed_scaling)) {
    return invalid_argument(edge::format("routed_scaling_factor = {} must be positive", moe.routed_scaling));
  }
  for (const std::int64_t layer : moe.dense_layers) {
    if (layer < 0 || layer >= num_layers) return out_of_bounds("an mlp_only_layers entry", layer, 0, num_layers - 1);
  }
  return {};
}

status check_rope_scaling(const rope_scaling_llama3& scaling) {
  if (!(scaling.factor >= 1.0) || !std::isfinite(scaling.factor)) {
    return invalid_argument(edge::format("rope_scaling factor = {} must be at least 1", scaling.factor));
  }
  if (!(scaling.low_freq_factor > 0.0) || !(scaling.high_freq_factor > scaling.low_freq_factor) ||
      !std::isfinite(scaling.high_freq_factor)) {
    return invalid_argument(edge::format("rope_scaling needs 0 < low_freq_factor ({}) < high_freq_factor ({})",
                                         scaling.low_freq_factor, scaling.high_freq_factor));
  }
  if (scaling.original_max_position < 1 || scaling.original_max_position > max_positions) {
    return out_of_bounds("original_max_position_embeddings", scaling.original_max_position, 1, max_positions);
  }
  return {};
}

std::vector<float> llama3_rope_factors(const rope_scaling_llama3& scaling, double rope_theta, std::int64_t head_dim) {
  const double original = static_cast<double>(scaling.original_max_position);
  const double low_freq_wavelength = original / scaling.low_freq_factor;
  const double high_freq_wavelength = original / scaling.high_freq_factor;
  std::vector<float> factors;  // [head_dim / 2]
  factors.reserve(static_cast<std::size_t>(head_dim / 2));
  for (std::int64_t i = 0; i < head_dim / 2; ++i) {
    const double frequency = std::pow(rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    const double wavelength = 2.0 * std::numbers::pi / frequency;
    double factor = 1.0;
    if (wavelength > low_freq_wavelength) {
      factor = scaling.factor;
    } else if (wavelength >= high_freq_wavelength) {
      // Between the bands the scaled and unscaled frequencies are blended.
      const double smooth = (original / wavelength - scaling.low_freq_factor) /
                            (scaling.high_freq_factor - scaling.low_freq_factor);
      factor = 1.0 / ((1.0 - smooth) / scaling.factor + smooth);
    }
    factors.push_back(static_cast<float>(factor));
  }
  return factors;
}

}  // namespace edge::backend
