#include "edge/backend/model/model_plan.h"

#include <algorithm>
#include <cmath>

#include "kernels/mla_attention/mla_attention.h"
#include "model_checks.h"

namespace edge::backend {

std::string_view to_string(attention_kind kind) {
  switch (kind) {
    case attention_kind::gqa: return "gqa";
    case attention_kind::mla: return "mla";
  }
  return "unknown";
}

std::string_view to_string(mlp_kind kind) {
  switch (kind) {
    case mlp_kind::dense: return "dense";
    case mlp_kind::moe: return "moe";
  }
  return "unknown";
}

std::vector<float> rope_plan::inv_freq() const { return kernels::rope_inv_freq(rotary_dim, theta, scaling, yarn); }

namespace {

// The largest of `width(layer)` over the layers (0 without layers).
template <class F>
std::int64_t widest(const std::vector<layer_plan>& layers, F width) {
  std::int64_t out = 0;
  for (const layer_plan& l : layers) out = std::max(out, width(l));
  return out;
}

}  // namespace

std::int64_t model_plan::max_q_dim() const {
  return widest(layers, [](const layer_plan& l) { return l.attention.q_dim(); });
}
std::int64_t model_plan::max_qkv_dim() const {
  return widest(layers, [](const layer_plan& l) { return l.attention.qkv_dim(); });
}
std::int64_t model_plan::max_intermediate() const {
  return widest(layers, [](const layer_plan& l) { return l.mlp.intermediate; });
}
std::int64_t model_plan::max_experts() const {
  return widest(layers, [](const layer_plan& l) { return l.mlp.experts; });
}
std::int64_t model_plan::max_top_k() const {
  return widest(layers, [](const layer_plan& l) { return l.mlp.top_k; });
}
std::int64_t model_plan::max_expert_intermediate() const {
  return widest(layers, [](const layer_plan& l) { return l.mlp.expert_intermediate; });
}

namespace {

bool is_mla(const layer_plan& l) { return l.attention.kind == attention_kind::mla; }

}  // namespace

std::int64_t model_plan::max_mla_query() const {
  return widest(layers, [](const layer_plan& l) { return is_mla(l) ? l.attention.num_heads * l.attention.mla.qk_head() : 0; });
}
std::int64_t model_plan::max_mla_latents() const {
  return widest(layers,
                [](const layer_plan& l) { return is_mla(l) ? l.attention.num_heads * l.attention.mla.kv_lora_rank : 0; });
}
std::int64_t model_plan::max_index_query() const {
  return widest(layers, [](const layer_plan& l) {
    return is_mla(l) ? l.attention.mla.index_heads * l.attention.mla.index_head_dim : 0;
  });
}
std::int64_t model_plan::max_index_topk() const {
  return widest(layers, [](const layer_plan& l) { return is_mla(l) ? l.attention.mla.index_topk : 0; });
}

std::int64_t model_plan::max_mla_prefill_workspace(std::int64_t tokens) const {
  return widest(layers, [tokens](const layer_plan& l) {
    const mla_plan& m = l.attention.mla;
    return is_mla(l) ? kernels::mla_prefill_workspace_floats(tokens, l.attention.num_heads, m.kv_lora_rank, m.rope,
                                                              m.nope, m.v_head_dim)
                     : 0;
  });
}

std::int64_t model_plan::moe_layers() const {
  return std::count_if(layers.begin(), layers.end(), [](const layer_plan& l) { return l.mlp.kind == mlp_kind::moe; });
}

result<model_plan> plan_model(const model_config& c) {
  EDGE_RETURN_IF_ERROR(check_config(c));

  model_plan plan;
  plan.arch = c.arch;
  plan.vocab = c.vocab_size;
  plan.hidden = c.hidden_size;
  plan.norm_eps = static_cast<float>(c.rms_norm_eps);
  plan.tied_embeddings = c.tie_embeddings;
  plan.context = c.max_position;

  rope_plan rope;
  rope.pairs = c.rope == rope_layout::adjacent_pairs ? kernels::rope_pairs::adjacent : kernels::rope_pairs::half_split;
  rope.rotary_dim = c.rotated();
  rope.theta = c.rope_theta;
  if (c.rope_scaling) {
    rope.scaling = kernels::rope_llama3_scaling{c.rope_scaling->factor, c.rope_scaling->low_freq_factor,
                                                c.rope_scaling->high_freq_factor,
                                                static_cast<double>(c.rope_scaling->original_max_position)};
  }
  if (c.yarn) {
    rope.yarn = kernels::rope_yarn_scaling{c.yarn->factor, static_cast<double>(c.yarn->original_max_position),
                                           c.yarn->beta_fast, c.yarn->beta_slow, c.yarn->truncate};
  }
  const layer_plan dense_layer{
      .attention = {.kind = attention_kind::gqa,
                    .num_heads = c.num_heads,
                    .num_kv_heads = c.num_kv_heads,
                    .head_dim = c.head_dim,
                    .qkv_bias = c.qkv_bias,
                    .qk_norm = c.qk_norm,
                    .softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim)),
                    .rope = rope},
      .mlp = {.kind = mlp_kind::dense, .intermediate = c.intermediate_size}};
  layer_plan attention_layer = dense_layer;
  if (c.mla) {
    const mla_config& m = *c.mla;
    attention_plan& a = attention_layer.attention;
    a.kind = attention_kind::mla;
    a.qkv_bias = false;
    a.qk_norm = false;
    a.rope.rotary_dim = m.qk_rope_head_dim;
    a.mla = {.q_lora_rank = m.q_lora_rank,
             .kv_lora_rank = m.kv_lora_rank,
             .nope = m.qk_nope_head_dim,
             .rope = m.qk_rope_head_dim,
             .v_head_dim = m.v_head_dim,
             .rope_scale = c.yarn ? static_cast<float>(c.yarn->rotary_factor()) : 1.0f};
    a.softmax_scale = static_cast<float>((c.yarn ? c.yarn->softmax_factor() : 1.0) /
                                         std::sqrt(static_cast<double>(m.qk_head_dim())));
    if (c.dsa) {
      a.mla.index_topk = c.dsa->index_topk;
      a.mla.index_heads = c.dsa->index_heads;
      a.mla.index_head_dim = c.dsa->index_head_dim;
    }
  }
  layer_plan sparse_layer = attention_layer;
  if (c.moe) {
    const moe_config& moe = *c.moe;
    sparse_layer.mlp = {.kind = mlp_kind::moe,
                        .intermediate = moe.shared_intermediate(),
                        .experts = moe.num_experts,
                        .top_k = moe.experts_per_token,
                        .expert_intermediate = moe.expert_intermediate,
                        .router = {.scoring = moe.scoring,
                                   .correction_bias = moe.correction_bias,
                                   .groups = moe.groups,
                                   .top_groups = moe.top_groups,
                                   .normalize = moe.normalize_weights,
                                   .scaling = static_cast<float>(moe.routed_scaling)}};
  }
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    layer_plan layer = c.moe && c.moe->sparse(i) ? sparse_layer : dense_layer;
    layer.attention = attention_layer.attention;
    if (c.dsa) layer.attention.mla.shared_selection = c.dsa->shared(i);
    plan.layers.push_back(layer);
  }
  return plan;
}

}  // namespace edge::backend
