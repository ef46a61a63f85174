// The tensor schema: in every preset's configuration each tensor has one name per format that
// no other tensor has, each weight the binding reads is named in both formats, a GGUF stacks
// every routed expert's matrix in expert order; the two RoPE row orders are each other's inverse;
// each architecture has one row of names; each preset's config.json fields read back as written,
// and fields left out take the row's defaults.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>

#include "edge/backend/model/synthetic.h"
#include "architecture_traits.h"
#include "edge/backend/model/formats.h"
#include "hf_config_text.h"
#include "rope_row_order.h"
#include "tensor_schema.h"

namespace be = edge::backend;

TEST_CASE("the two RoPE row orders of a head are each other's inverse") {
  for (const std::int64_t head_dim : {2, 8, 64, 128}) {
    for (std::int64_t row = 0; row < 3 * head_dim; ++row) {
      CAPTURE(head_dim);
      CAPTURE(row);
      CHECK(be::half_split_row(be::adjacent_pair_row(row, head_dim), head_dim) == row);
      CHECK(be::adjacent_pair_row(be::half_split_row(row, head_dim), head_dim) == row);
      CHECK(be::adjacent_pair_row(row, head_dim) / head_dim == row / head_dim);  // within its head
    }
  }
  // Half-split row i (first half) goes to 2i, row d/2 + i (second half) to 2i + 1.
  CHECK(be::adjacent_pair_row(3, 8) == 6);
  CHECK(be::adjacent_pair_row(4 + 3, 8) == 7);
}

TEST_CASE("every preset's tensors have one name per format, and the binding finds each weight by it") {
  for (const be::synthetic_preset& preset : be::synthetic_presets()) {
    CAPTURE(preset.name);
    be::model_config c = preset.config;
    c.num_layers = std::min<std::int64_t>(c.num_layers, 4);  // the layers' kinds repeat past the first few
    if (c.moe) c.moe->num_experts = std::min<std::int64_t>(c.moe->num_experts, 4);
    const auto schema = be::tensor_schema(c);
    std::set<std::string> hf_names;
    std::map<std::string, std::int64_t> gguf_stacks;  // a stack's name -> experts seen in order
    for (const be::schema_tensor& t : schema) {
      CAPTURE(t.hf);
      if (!t.hf.empty()) CHECK(hf_names.insert(t.hf).second);
      if (t.expert >= 0) {
        // The experts of a stack come in expert order, one matrix each.
        CHECK(gguf_stacks[t.gguf]++ == t.expert);
      }
      const bool bound = t.model_slot != nullptr || t.layer_slot != nullptr || t.expert_slot != nullptr;
      if (bound) CHECK(!t.hf.empty());
    }
    std::set<std::string> gguf_names;
    for (const be::schema_tensor& t : schema) {
      if (t.gguf.empty() || t.expert > 0) continue;
      CAPTURE(t.gguf);
      CHECK(gguf_names.insert(t.gguf).second);
    }
    // The readers' names: each layer's matrices and norms, under both formats.
    for (const be::tensor_format format : {be::tensor_format::hf, be::tensor_format::gguf}) {
      const be::tensor_names names = be::names_for(c, format);
      CHECK_FALSE(names.token_embedding.empty());
      CHECK_FALSE(names.final_norm.empty());
      CHECK(names.lm_head.empty() == c.tie_embeddings);
      for (std::int64_t i = 0; i < c.num_layers; ++i) {
        const be::layer_tensor_names layer = names.layer(i);
        CHECK_FALSE(layer.attn_norm.empty());
        CHECK_FALSE(layer.wq.empty());
        CHECK_FALSE(layer.wk.empty());
        CHECK_FALSE(layer.wo.empty());
        CHECK(layer.wv.empty() == c.mla.has_value());
        const bool sparse = c.moe && c.moe->sparse(i);
        CHECK(layer.router.empty() == !sparse);
        if (!sparse) continue;
        for (std::int64_t e = 0; e < c.moe->num_experts; ++e) {
          const be::expert_tensor_names expert = layer.expert(e);
          CHECK_FALSE(expert.w_gate.empty());
          CHECK(expert.stacked_index.has_value() == (format == be::tensor_format::gguf));
        }
      }
    }
  }
}

TEST_CASE("each architecture has one row: its class, model_type and GGUF name lead back to it") {
  std::set<std::string_view> classes, types, gguf;
  for (const be::architecture_traits& t : be::architecture_table()) {
    CAPTURE(t.model_type);
    CHECK(&be::traits_of(t.arch) == &t);
    CHECK(be::to_string(t.arch) == t.model_type);
    CHECK(be::find_hf_class(t.hf_class) == &t);
    CHECK(classes.insert(t.hf_class).second);
    CHECK(types.insert(t.model_type).second);
    if (!t.gguf_name.empty()) {
      CHECK(be::find_gguf_architecture(t.gguf_name) == &t);
      CHECK(gguf.insert(t.gguf_name).second);
    }
  }
  CHECK(be::find_hf_class("GPT2LMHeadModel") == nullptr);
  CHECK(be::find_gguf_architecture("") == nullptr);
  CHECK(be::supported_hf_classes().ends_with(" and GlmMoeDsaForCausalLM"));
}

TEST_CASE("every preset's config.json fields read back as the configuration they were written from") {
  for (const be::synthetic_preset& preset : be::synthetic_presets()) {
    CAPTURE(preset.name);
    const be::model_config& c = preset.config;
    const std::string json = "{\n" + be::hf_config_shape_fields(c) + be::hf_config_class_fields(c) +
                             "  \"tie_word_embeddings\": " + (c.tie_embeddings ? "true" : "false") + "\n}";
    const auto parsed = be::parse_hf_config(json);
    REQUIRE_MESSAGE(parsed.ok(), parsed.error().message());
    const be::model_config& r = parsed->config;
    CHECK(r.arch == c.arch);
    CHECK(r.head_dim == c.head_dim);
    CHECK(r.num_kv_heads == c.num_kv_heads);
    CHECK(r.rms_norm_eps == c.rms_norm_eps);
    CHECK(r.qkv_bias == c.qkv_bias);
    CHECK(r.qk_norm == c.qk_norm);
    CHECK(r.rotated() == c.rotated());
    CHECK(r.nextn_layers == c.nextn_layers);
    REQUIRE(r.moe.has_value() == c.moe.has_value());
    if (c.moe) {
      const be::moe_config& a = *r.moe;
      const be::moe_config& b = *c.moe;
      CHECK(a.num_experts == b.num_experts);
      CHECK(a.experts_per_token == b.experts_per_token);
      CHECK(a.expert_intermediate == b.expert_intermediate);
      CHECK(a.shared_experts == b.shared_experts);
      CHECK(a.scoring == b.scoring);
      CHECK(a.normalize_weights == b.normalize_weights);
      CHECK(a.routed_scaling == b.routed_scaling);
      CHECK(a.correction_bias == b.correction_bias);
      CHECK(a.groups == b.groups);
      CHECK(a.top_groups == b.top_groups);
      CHECK(a.first_dense_layers == b.first_dense_layers);
      CHECK(a.sparse_step == b.sparse_step);
      CHECK(a.dense_layers == b.dense_layers);
    }
    REQUIRE(r.mla.has_value() == c.mla.has_value());
    if (c.mla) {
      CHECK(r.mla->q_lora_rank == c.mla->q_lora_rank);
      CHECK(r.mla->kv_lora_rank == c.mla->kv_lora_rank);
      CHECK(r.mla->qk_nope_head_dim == c.mla->qk_nope_head_dim);
      CHECK(r.mla->qk_rope_head_dim == c.mla->qk_rope_head_dim);
      CHECK(r.mla->v_head_dim == c.mla->v_head_dim);
      CHECK(r.rope == c.rope);
    }
    REQUIRE(r.dsa.has_value() == c.dsa.has_value());
    if (c.dsa) {
      CHECK(r.dsa->index_topk == c.dsa->index_topk);
      CHECK(r.dsa->index_heads == c.dsa->index_heads);
      CHECK(r.dsa->index_head_dim == c.dsa->index_head_dim);
      for (std::int64_t i = 0; i < c.num_layers; ++i) CHECK(r.dsa->shared(i) == c.dsa->shared(i));
    }
  }
}

TEST_CASE("a class's fields left out take the defaults of its architecture row") {
  for (const be::architecture_traits& t : be::architecture_table()) {
    CAPTURE(t.model_type);
    std::string json = R"({"architectures": [")" + std::string(t.hf_class) +
                       R"("], "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                           "num_attention_heads": 4, "vocab_size": 256})";
    const auto parsed = be::parse_hf_config(json);
    REQUIRE_MESSAGE(parsed.ok(), parsed.error().message());
    const be::model_config& r = parsed->config;
    CHECK(r.rms_norm_eps == t.default_rms_norm_eps);
    CHECK(r.moe.has_value() == (t.router != be::router_fields::none));
    if (r.moe) {
      CHECK(r.moe->num_experts == t.router_default.num_experts);
      CHECK(r.moe->expert_intermediate == t.router_default.expert_intermediate);
      CHECK(r.moe->routed_scaling == t.router_default.routed_scaling);
      CHECK(r.moe->groups == t.router_default.groups);
      CHECK(r.moe->first_dense_layers == t.router_default.first_dense_layers);
    }
    CHECK(r.mla.has_value() == (t.attention == be::attention_fields::latent));
    if (r.mla) {
      CHECK(r.mla->q_lora_rank == t.latent_default.q_lora_rank);
      CHECK(r.mla->qk_nope_head_dim == t.latent_default.qk_nope_head_dim);
      CHECK(r.mla->v_head_dim == t.latent_default.v_head_dim);
    }
    CHECK(r.dsa.has_value() == (t.indexer_default.index_topk > 0));
  }
}
