#include "hf_config_fields.h"

#include <span>
#include <string_view>
#include <type_traits>
#include <variant>

#include "edge/common/format.h"
#include "edge/common/json_text.h"
#include "edge/common/log.h"
#include "architecture_traits.h"

namespace edge::backend {
namespace {

// A number or switch of a configuration struct S: its name in config.json and its member,
// which also names its default in the architecture row's S.
template <typename S>
struct scalar_field {
  std::string_view name;
  std::variant<std::int64_t S::*, bool S::*, double S::*> member;
};

// Both routers' fields, then each router's own.
constexpr scalar_field<moe_config> router_fields_shared[] = {
    {"num_experts_per_tok", &moe_config::experts_per_token},
    {"moe_intermediate_size", &moe_config::expert_intermediate},
    {"norm_topk_prob", &moe_config::normalize_weights},
};
constexpr scalar_field<moe_config> softmax_router_fields[] = {
    {"num_experts", &moe_config::num_experts},
    {"decoder_sparse_step", &moe_config::sparse_step},
};
constexpr scalar_field<moe_config> grouped_router_fields[] = {
    {"n_routed_experts", &moe_config::num_experts},
    {"n_shared_experts", &moe_config::shared_experts},
    {"first_k_dense_replace", &moe_config::first_dense_layers},
    {"routed_scaling_factor", &moe_config::routed_scaling},
    {"n_group", &moe_config::groups},
    {"topk_group", &moe_config::top_groups},
};
// The grouped router's choice as DeepSeek-V3's configs name it (GLM's imply these values).
constexpr struct {
  std::string_view field, supported;
} grouped_router_fixed[] = {{"scoring_func", "sigmoid"}, {"topk_method", "noaux_tc"}};

// The latent attention's sizes (q_lora_rank, which may be null, is read on its own), and its
// DSA indexer's.
constexpr scalar_field<mla_config> latent_fields[] = {
    {"kv_lora_rank", &mla_config::kv_lora_rank},
    {"qk_nope_head_dim", &mla_config::qk_nope_head_dim},
    {"qk_rope_head_dim", &mla_config::qk_rope_head_dim},
    {"v_head_dim", &mla_config::v_head_dim},
};
constexpr scalar_field<dsa_config> indexer_fields[] = {
    {"index_topk", &dsa_config::index_topk},
    {"index_n_heads", &dsa_config::index_heads},
    {"index_head_dim", &dsa_config::index_head_dim},
};

// A table of fields (not deduced from the argument, so that an array converts to it).
template <typename S>
using field_table = std::type_identity_t<std::span<const scalar_field<S>>>;

template <typename S>
status read_scalars(const json_fields& fields, field_table<S> table, const S& defaults, S& out) {
  for (const scalar_field<S>& f : table) {
    const status read = std::visit(
        [&](auto member) -> status {
          using value = std::remove_cvref_t<decltype(out.*member)>;
          EDGE_ASSIGN_OR_RETURN(out.*member, fields.value_or<value>(f.name, defaults.*member));
          return {};
        },
        f.member);
    EDGE_RETURN_IF_ERROR(read);
  }
  return {};
}

std::string field(std::string_view name, std::string_view value) {
  return edge::format("  \"{}\": {},\n", name, value);
}

std::string boolean(bool b) { return b ? "true" : "false"; }

template <typename S>
std::string write_scalars(field_table<S> table, const S& value) {
  std::string out;
  for (const scalar_field<S>& f : table) {
    out += std::visit(
        [&](auto member) {
          const auto v = value.*member;
          using type = std::remove_cvref_t<decltype(v)>;
          if constexpr (std::is_same_v<type, bool>) {
            return field(f.name, boolean(v));
          } else if constexpr (std::is_same_v<type, double>) {
            return field(f.name, json_number(v));
          } else {
            return field(f.name, std::to_string(v));
          }
        },
        f.member);
  }
  return out;
}

field_table<moe_config> own_router_fields(router_fields router) {
  if (router == router_fields::softmax) return softmax_router_fields;
  return grouped_router_fields;
}

// The router's fields; nullopt for a dense model (Qwen3-MoE with num_experts 0).
result<std::optional<moe_config>> read_router(const json_fields& fields, const architecture_traits& traits) {
  const moe_config& defaults = traits.router_default;
  moe_config moe;
  EDGE_RETURN_IF_ERROR(read_scalars(fields, own_router_fields(traits.router), defaults, moe));
  EDGE_RETURN_IF_ERROR(read_scalars(fields, router_fields_shared, defaults, moe));
  if (traits.router == router_fields::softmax) {
    if (moe.num_experts == 0) return std::optional<moe_config>{};
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
  // The grouped router: sigmoid scores, a correction bias, group-limited choice, scaled weights.
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
  for (const auto& f : grouped_router_fixed) {
    EDGE_ASSIGN_OR_RETURN(const auto value, fields.optional<std::string_view>(f.field));
    if (value && *value != f.supported) {
      return status(status_code::unimplemented,
                    edge::format("{} \"{}\" is not supported (only \"{}\" is)", f.field, *value, f.supported));
    }
  }
  return std::optional<moe_config>{moe};
}

std::string write_router(const model_config& c, router_fields router) {
  if (router == router_fields::none) return {};
  if (router == router_fields::softmax && !c.moe) return field("num_experts", "0");
  const moe_config m = c.moe.value_or(moe_config{});
  std::string out = write_scalars(own_router_fields(router), m) + write_scalars(router_fields_shared, m);
  if (router == router_fields::softmax) {
    std::string dense = "[";
    for (std::size_t i = 0; i < m.dense_layers.size(); ++i) {
      dense += (i > 0 ? ", " : "") + std::to_string(m.dense_layers[i]);
    }
    return out + field("mlp_only_layers", dense + "]");
  }
  for (const auto& f : grouped_router_fixed) out += field(f.field, edge::format("\"{}\"", f.supported));
  return out;
}

// Which layers run their own DSA indexer: indexer_types, else index_topk_pattern ("F" full,
// "S" shared), else every index_topk_freq-th layer from index_skip_topk_offset on (with freq 1,
// the default, every layer), as GlmMoeDsaConfig computes it.
status read_shared_indexers(const json_fields& fields, std::int64_t num_layers, dsa_config& dsa) {
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
    for (std::int64_t i = 0; i < num_layers; ++i) {
      dsa.shared_layers.push_back(std::max<std::int64_t>(i - offset + 1, 0) % every != 0);
    }
  }
  return {};
}

// The latent attention (DeepseekV3ForCausalLM, kimi_k2 too, and GlmMoeDsaForCausalLM): its
// head_dim is the query/key head (qk_nope + qk_rope) and every head has its own key and value
// (num_key_value_heads = num_attention_heads).
status read_latent(const json_fields& fields, const architecture_traits& traits, model_config& config) {
  mla_config mla;
  EDGE_RETURN_IF_ERROR(read_scalars(fields, latent_fields, traits.latent_default, mla));
  // q_lora_rank: null means one q_proj; absent, the class's default (find() reads both as absent).
  const bool q_lora_given = fields.object().at_key("q_lora_rank").error() == simdjson::SUCCESS;
  EDGE_ASSIGN_OR_RETURN(const auto q_lora, fields.optional<std::int64_t>("q_lora_rank"));
  mla.q_lora_rank = q_lora.value_or(q_lora_given ? 0 : traits.latent_default.q_lora_rank);
  config.head_dim = mla.qk_head_dim();
  config.num_kv_heads = config.num_heads;
  // DeepSeek-V3's rope_interleave (default true) rotates pairs (2i, 2i+1) of q_pe and k_pe
  // (transformers permutes them to halves first, the same dot products).
  EDGE_ASSIGN_OR_RETURN(const bool interleave, fields.value_or<bool>("rope_interleave", true));
  config.rope = traits.latent_always_interleaved || interleave ? rope_layout::adjacent_pairs : rope_layout::half_split;
  config.mla = mla;
  if (traits.indexer_default.index_topk > 0) {
    dsa_config dsa;
    EDGE_RETURN_IF_ERROR(read_scalars(fields, indexer_fields, traits.indexer_default, dsa));
    EDGE_RETURN_IF_ERROR(read_shared_indexers(fields, config.num_layers, dsa));
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

std::string write_latent(const model_config& c) {
  const mla_config m = c.mla.value_or(mla_config{});
  std::string out = field("q_lora_rank", m.q_lora_rank > 0 ? std::to_string(m.q_lora_rank) : std::string("null")) +
                    write_scalars(latent_fields, m) +
                    field("rope_interleave", boolean(c.rope == rope_layout::adjacent_pairs)) +
                    field("num_nextn_predict_layers", std::to_string(c.nextn_layers));
  if (c.dsa) {
    const dsa_config& d = *c.dsa;
    std::string types = "[";
    for (std::int64_t i = 0; i < c.num_layers; ++i) {
      types += std::string(i > 0 ? ", " : "") + (d.shared(i) ? "\"shared\"" : "\"full\"");
    }
    out += write_scalars(indexer_fields, d) + field("indexer_types", types + "]");
  }
  return out;
}

// Sliding-window attention is not implemented; within the window the results are the same.
status warn_of_sliding_window(const json_fields& fields, const architecture_traits& traits, const model_config& config) {
  EDGE_ASSIGN_OR_RETURN(const auto use_sliding_window, fields.optional<bool>("use_sliding_window"));
  EDGE_ASSIGN_OR_RETURN(const auto sliding_window, fields.optional<std::int64_t>("sliding_window"));
  const bool sliding = traits.sliding_window_switch ? use_sliding_window.value_or(false) : sliding_window.has_value();
  if (sliding && sliding_window && *sliding_window < config.max_position) {
    logger{"model"}.warn("the model was trained with a {}-token sliding attention window; edgeinfer attends to the "
                         "whole context, so outputs differ from the reference past that length",
                         *sliding_window);
  }
  return {};
}

}  // namespace

status read_class_fields(const json_fields& fields, model_config& config) {
  const architecture_traits& traits = traits_of(config.arch);
  EDGE_ASSIGN_OR_RETURN(const auto attention_bias, fields.optional<bool>("attention_bias"));
  EDGE_ASSIGN_OR_RETURN(const auto mlp_bias, fields.optional<bool>("mlp_bias"));
  switch (traits.attention) {
    case attention_fields::glm45: {
      // GLM-4.5's attention_bias is on Q, K and V only; use_qk_norm adds Qwen3's per-head norms;
      // RoPE turns the leading partial_rotary_factor of each head.
      config.qkv_bias = attention_bias.value_or(false);
      EDGE_ASSIGN_OR_RETURN(config.qk_norm, fields.value_or<bool>("use_qk_norm", false));
      EDGE_ASSIGN_OR_RETURN(const double partial, fields.value_or<double>("partial_rotary_factor", 0.5));
      if (!(partial > 0.0 && partial <= 1.0)) {
        return invalid_argument(edge::format("partial_rotary_factor = {} must be in (0, 1]", partial));
      }
      config.rotary_dim = static_cast<std::int64_t>(static_cast<double>(config.head_dim) * partial);
      break;
    }
    case attention_fields::latent:
      if (attention_bias.value_or(false)) {
        return status(status_code::unimplemented, "attention_bias on the MLA projections is not supported");
      }
      EDGE_RETURN_IF_ERROR(read_latent(fields, traits, config));
      break;
    case attention_fields::llama:
    case attention_fields::qwen2:
    case attention_fields::qwen3:
      // The Llama and Qwen3 classes' attention_bias also puts a bias on o_proj, which
      // model_weights has no slot for.
      if (attention_bias.value_or(false) || mlp_bias.value_or(false)) {
        return status(status_code::unimplemented, "attention_bias / mlp_bias are not supported");
      }
      break;
  }
  if (traits.router != router_fields::none) {
    EDGE_ASSIGN_OR_RETURN(config.moe, read_router(fields, traits));
  }
  return warn_of_sliding_window(fields, traits, config);
}

std::string hf_config_class_fields(const model_config& c) {
  const architecture_traits& traits = traits_of(c.arch);
  std::string out;
  if (traits.sliding_window_switch) out += field("use_sliding_window", "false");
  switch (traits.attention) {
    case attention_fields::llama: out += field("attention_bias", "false") + field("mlp_bias", "false"); break;
    case attention_fields::qwen2: break;
    case attention_fields::qwen3: out += field("attention_bias", "false"); break;
    case attention_fields::glm45:
      out += field("attention_bias", boolean(c.qkv_bias)) + field("use_qk_norm", boolean(c.qk_norm)) +
             field("partial_rotary_factor",
                   json_number(static_cast<double>(c.rotated()) / static_cast<double>(c.head_dim)));
      break;
    case attention_fields::latent: out += field("attention_bias", "false") + write_latent(c); break;
  }
  return out + write_router(c, traits.router);
}

}  // namespace edge::backend
