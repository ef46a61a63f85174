// The tensor schema: in every preset's configuration each tensor has one name per format that
// no other tensor has, each weight the binding reads is named in both formats, a GGUF stacks
// every routed expert's matrix in expert order; the two RoPE row orders are each other's inverse;
// each architecture has one row of names.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>

#include "edge/backend/model/synthetic.h"
#include "architecture_traits.h"
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
