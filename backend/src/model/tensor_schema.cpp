#include "tensor_schema.h"

#include <utility>

#include "edge/common/format.h"

namespace edge::backend {
namespace {

constexpr std::string_view classifier_gguf = "output.weight";
constexpr std::string_view rope_factors_gguf = "rope_freqs.weight";
constexpr std::string_view router_bias_gguf = "exp_probs_b.bias";

std::string hf_prefix(std::int64_t layer) { return edge::format("model.layers.{}.", layer); }
std::string gguf_prefix(std::int64_t layer) { return edge::format("blk.{}.", layer); }

// A layer's tensors: the prefix of each format and the entries so far.
class layer_builder {
 public:
  layer_builder(std::vector<schema_tensor>& out, std::int64_t layer)
      : out_(out), layer_(layer), hf_(hf_prefix(layer)), gguf_(gguf_prefix(layer)) {}

  // A matrix of the layer (a projection unless said otherwise).
  schema_tensor& matrix(std::string_view hf, std::string_view gguf, std::vector<std::int64_t> shape,
                        std::string layer_tensor_names::* slot, weight_matrix layer_weights::* held,
                        bool projection = true) {
    schema_tensor& t = add(hf, gguf, std::move(shape), tensor_fill::random);
    t.layer_slot = slot;
    t.layer_matrix = held;
    t.projection = projection;
    return t;
  }
  // A norm or bias of the layer.
  schema_tensor& vector(std::string_view hf, std::string_view gguf, std::int64_t length, tensor_fill fill,
                        std::string layer_tensor_names::* slot, tensor_view layer_weights::* held) {
    schema_tensor& t = add(hf, gguf, {length}, fill);
    t.layer_slot = slot;
    t.layer_vector = held;
    return t;
  }
  // Expert `e`'s matrix; in a GGUF, matrix e of the layer's stack `gguf`.
  void expert(std::int64_t e, std::string_view projection, std::string_view gguf, std::vector<std::int64_t> shape,
              std::string expert_tensor_names::* slot, weight_matrix expert_weights::* held) {
    schema_tensor& t = add(edge::format("mlp.experts.{}.{}.weight", e, projection), gguf, std::move(shape),
                           tensor_fill::random);
    t.expert = e;
    t.expert_slot = slot;
    t.expert_matrix = held;
    t.projection = true;
  }
  // A tensor the loaders skip (its HF name only).
  void skipped(std::string_view hf, std::vector<std::int64_t> shape, tensor_fill fill) { add(hf, "", std::move(shape), fill); }

 private:
  schema_tensor& add(std::string_view hf, std::string_view gguf, std::vector<std::int64_t> shape, tensor_fill fill) {
    schema_tensor t;
    t.hf = hf_ + std::string(hf);
    t.gguf = gguf.empty() ? std::string() : gguf_ + std::string(gguf);
    t.shape = std::move(shape);
    t.layer = layer_;
    t.fill = fill;
    out_.push_back(std::move(t));
    return out_.back();
  }

  std::vector<schema_tensor>& out_;
  std::int64_t layer_;
  std::string hf_, gguf_;
};

using ln = layer_tensor_names;
using lw = layer_weights;

// Latent attention (mla_config, model.h's shapes), and a DSA layer's own indexer.
void latent_attention(const model_config& c, layer_builder& l, std::int64_t layer) {
  const mla_config& m = *c.mla;
  const std::int64_t heads = c.num_heads;
  if (m.q_lora_rank > 0) {
    l.matrix("self_attn.q_a_proj.weight", "attn_q_a.weight", {m.q_lora_rank, c.hidden_size}, &ln::wq, &lw::wq);
    l.vector("self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight", m.q_lora_rank, tensor_fill::ones, &ln::q_a_norm,
             &lw::q_a_norm);
    l.matrix("self_attn.q_b_proj.weight", "attn_q_b.weight", {heads * m.qk_head_dim(), m.q_lora_rank}, &ln::wq_b,
             &lw::wq_b);
  } else {
    l.matrix("self_attn.q_proj.weight", "attn_q.weight", {heads * m.qk_head_dim(), c.hidden_size}, &ln::wq, &lw::wq);
  }
  l.matrix("self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight", {m.cache_row(), c.hidden_size}, &ln::wk,
           &lw::wk);
  l.vector("self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight", m.kv_lora_rank, tensor_fill::ones, &ln::kv_a_norm,
           &lw::kv_a_norm);
  l.matrix("self_attn.kv_b_proj.weight", "attn_kv_b.weight", {heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank},
           &ln::wkv_b, &lw::wkv_b);
  l.matrix("self_attn.o_proj.weight", "attn_output.weight", {c.hidden_size, heads * m.v_head_dim}, &ln::wo, &lw::wo);
  if (!c.dsa || c.dsa->shared(layer)) return;
  const dsa_config& d = *c.dsa;
  l.matrix("self_attn.indexer.wq_b.weight", "indexer.attn_q_b.weight", {d.index_heads * d.index_head_dim, m.q_lora_rank},
           &ln::index_wq, &lw::index_wq);
  l.matrix("self_attn.indexer.wk.weight", "indexer.attn_k.weight", {d.index_head_dim, c.hidden_size}, &ln::index_wk,
           &lw::index_wk);
  l.vector("self_attn.indexer.k_norm.weight", "indexer.k_norm.weight", d.index_head_dim, tensor_fill::ones,
           &ln::index_k_norm, &lw::index_k_norm);
  l.vector("self_attn.indexer.k_norm.bias", "indexer.k_norm.bias", d.index_head_dim, tensor_fill::random,
           &ln::index_k_norm_bias, &lw::index_k_norm_bias);
  l.matrix("self_attn.indexer.weights_proj.weight", "indexer.proj.weight", {d.index_heads, c.hidden_size},
           &ln::index_weights, &lw::index_weights, false);
}

void grouped_attention(const model_config& c, layer_builder& l) {
  const std::int64_t q_width = c.num_heads * c.head_dim;
  const std::int64_t kv_width = c.num_kv_heads * c.head_dim;
  l.matrix("self_attn.q_proj.weight", "attn_q.weight", {q_width, c.hidden_size}, &ln::wq, &lw::wq).rope_rows = true;
  l.matrix("self_attn.k_proj.weight", "attn_k.weight", {kv_width, c.hidden_size}, &ln::wk, &lw::wk).rope_rows = true;
  l.matrix("self_attn.v_proj.weight", "attn_v.weight", {kv_width, c.hidden_size}, &ln::wv, &lw::wv);
  if (c.qkv_bias) {
    l.vector("self_attn.q_proj.bias", "attn_q.bias", q_width, tensor_fill::random, &ln::bq, &lw::bq).rope_rows = true;
    l.vector("self_attn.k_proj.bias", "attn_k.bias", kv_width, tensor_fill::random, &ln::bk, &lw::bk).rope_rows = true;
    l.vector("self_attn.v_proj.bias", "attn_v.bias", kv_width, tensor_fill::random, &ln::bv, &lw::bv);
  }
  if (c.qk_norm) {
    l.vector("self_attn.q_norm.weight", "attn_q_norm.weight", c.head_dim, tensor_fill::random, &ln::q_norm, &lw::q_norm);
    l.vector("self_attn.k_norm.weight", "attn_k_norm.weight", c.head_dim, tensor_fill::random, &ln::k_norm, &lw::k_norm);
  }
  l.matrix("self_attn.o_proj.weight", "attn_output.weight", {c.hidden_size, q_width}, &ln::wo, &lw::wo);
}

// A dense layer's SwiGLU, or a sparse layer's router, routed experts and shared experts.
void mlp(const model_config& c, layer_builder& l, std::int64_t layer) {
  if (!(c.moe && c.moe->sparse(layer))) {
    const std::int64_t width = c.intermediate_size;
    l.matrix("mlp.gate_proj.weight", "ffn_gate.weight", {width, c.hidden_size}, &ln::w_gate, &lw::w_gate);
    l.matrix("mlp.up_proj.weight", "ffn_up.weight", {width, c.hidden_size}, &ln::w_up, &lw::w_up);
    l.matrix("mlp.down_proj.weight", "ffn_down.weight", {c.hidden_size, width}, &ln::w_down, &lw::w_down);
    return;
  }
  const moe_config& moe = *c.moe;
  l.matrix("mlp.gate.weight", "ffn_gate_inp.weight", {moe.num_experts, c.hidden_size}, &ln::router, &lw::router, false)
      .router = true;
  if (moe.correction_bias) {
    l.vector("mlp.gate.e_score_correction_bias", router_bias_gguf, moe.num_experts, tensor_fill::random,
             &ln::router_bias, &lw::router_bias);
  }
  // A GGUF stacks the experts' matrices in expert order.
  const std::int64_t width = moe.expert_intermediate;
  for (std::int64_t e = 0; e < moe.num_experts; ++e) {
    l.expert(e, "gate_proj", "ffn_gate_exps.weight", {width, c.hidden_size}, &expert_tensor_names::w_gate,
             &expert_weights::w_gate);
  }
  for (std::int64_t e = 0; e < moe.num_experts; ++e) {
    l.expert(e, "up_proj", "ffn_up_exps.weight", {width, c.hidden_size}, &expert_tensor_names::w_up,
             &expert_weights::w_up);
  }
  for (std::int64_t e = 0; e < moe.num_experts; ++e) {
    l.expert(e, "down_proj", "ffn_down_exps.weight", {c.hidden_size, width}, &expert_tensor_names::w_down,
             &expert_weights::w_down);
  }
  if (const std::int64_t shared = moe.shared_intermediate(); shared > 0) {
    l.matrix("mlp.shared_experts.gate_proj.weight", "ffn_gate_shexp.weight", {shared, c.hidden_size}, &ln::w_gate,
             &lw::w_gate);
    l.matrix("mlp.shared_experts.up_proj.weight", "ffn_up_shexp.weight", {shared, c.hidden_size}, &ln::w_up, &lw::w_up);
    l.matrix("mlp.shared_experts.down_proj.weight", "ffn_down_shexp.weight", {c.hidden_size, shared}, &ln::w_down,
             &lw::w_down);
  }
}

schema_tensor model_tensor(std::string hf, std::string_view gguf, std::vector<std::int64_t> shape, tensor_fill fill,
                           std::string tensor_names::* slot) {
  schema_tensor t;
  t.hf = std::move(hf);
  t.gguf = gguf;
  t.shape = std::move(shape);
  t.fill = fill;
  t.model_slot = slot;
  return t;
}

}  // namespace

std::vector<schema_tensor> tensor_schema(const model_config& c) {
  std::vector<schema_tensor> out;
  if (c.rope_scaling) {
    schema_tensor t;
    t.gguf = rope_factors_gguf;
    t.shape = {c.head_dim / 2};
    t.fill = tensor_fill::rope_factors;
    out.push_back(std::move(t));
  }
  out.push_back(model_tensor("model.embed_tokens.weight", "token_embd.weight", {c.vocab_size, c.hidden_size},
                             tensor_fill::random, &tensor_names::token_embedding));
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    layer_builder l(out, i);
    l.vector("input_layernorm.weight", "attn_norm.weight", c.hidden_size, tensor_fill::ones, &ln::attn_norm,
             &lw::attn_norm);
    if (c.mla) {
      latent_attention(c, l, i);
    } else {
      grouped_attention(c, l);
    }
    l.vector("post_attention_layernorm.weight", "ffn_norm.weight", c.hidden_size, tensor_fill::ones, &ln::ffn_norm,
             &lw::ffn_norm);
    mlp(c, l, i);
  }
  // Multi-token-prediction layers after the decoder's (DeepSeek-V3's layout: the embedding and
  // hidden-state norms, their projection, and the layer's own head norm), which the loader skips
  // and llama.cpp's converter leaves out of a GGUF.
  for (std::int64_t i = c.num_layers; i < c.num_layers + c.nextn_layers; ++i) {
    layer_builder l(out, i);
    l.skipped("enorm.weight", {c.hidden_size}, tensor_fill::ones);
    l.skipped("hnorm.weight", {c.hidden_size}, tensor_fill::ones);
    l.skipped("eh_proj.weight", {c.hidden_size, 2 * c.hidden_size}, tensor_fill::random);
    l.skipped("shared_head.norm.weight", {c.hidden_size}, tensor_fill::ones);
  }
  out.push_back(model_tensor("model.norm.weight", "output_norm.weight", {c.hidden_size}, tensor_fill::ones,
                             &tensor_names::final_norm));
  if (!c.tie_embeddings) {
    out.push_back(model_tensor("lm_head.weight", classifier_gguf, {c.vocab_size, c.hidden_size}, tensor_fill::random,
                               &tensor_names::lm_head));
  }
  return out;
}

tensor_names names_for(const model_config& c, tensor_format format) {
  const bool gguf = format == tensor_format::gguf;
  std::vector<layer_tensor_names> layers(static_cast<std::size_t>(c.num_layers));
  // Per layer, each expert's names.
  std::vector<std::vector<expert_tensor_names>> experts(static_cast<std::size_t>(c.num_layers));
  tensor_names names;
  for (const schema_tensor& t : tensor_schema(c)) {
    const std::string& name = gguf ? t.gguf : t.hf;
    if (name.empty()) continue;
    if (t.model_slot != nullptr) names.*t.model_slot = name;
    if (t.layer < 0 || t.layer >= c.num_layers) continue;
    const auto layer = static_cast<std::size_t>(t.layer);
    if (t.layer_slot != nullptr) layers[layer].*t.layer_slot = name;
    if (t.expert_slot != nullptr) {
      auto& of_layer = experts[layer];
      if (of_layer.size() <= static_cast<std::size_t>(t.expert)) of_layer.resize(static_cast<std::size_t>(t.expert) + 1);
      expert_tensor_names& e = of_layer[static_cast<std::size_t>(t.expert)];
      e.*t.expert_slot = name;
      if (gguf) e.stacked_index = t.expert;
    }
  }
  names.layer = [layers = std::move(layers), experts = std::move(experts)](std::int64_t i) {
    layer_tensor_names layer = layers.at(static_cast<std::size_t>(i));
    layer.expert = [of_layer = experts.at(static_cast<std::size_t>(i))](std::int64_t e) {
      return of_layer.at(static_cast<std::size_t>(e));
    };
    return layer;
  };
  return names;
}

std::string_view gguf_classifier_name() { return classifier_gguf; }
std::string_view gguf_rope_factors_name() { return rope_factors_gguf; }
std::string gguf_router_bias_name(std::int64_t layer) { return gguf_prefix(layer) + std::string(router_bias_gguf); }

}  // namespace edge::backend
