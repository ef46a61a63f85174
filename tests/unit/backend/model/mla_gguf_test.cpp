// GGUF deepseek2 (DeepSeek-V3, Kimi K2), as llama.cpp's converter writes it in the layout with
// attn_kv_b whole: make-model's GGUF and safetensors forms of a seed load as the same network
// and compute the same logits with the same experts; metadata is read as llama.cpp reads it;
// what deepseek2 cannot say is refused by make-model, and what edgeinfer does not read is named.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "edge/backend/io/gguf.h"
#include "edge/backend/model/formats.h"
#include "edge/backend/model/model.h"
#include "edge/backend/model/synthetic.h"
#include "forward_test_support.h"
#include "model_test_support.h"
#include "synthetic_test_support.h"
#include "test_support.h"
#include "weight_test_support.h"

using namespace edge::backend;
using edge::status_code;
namespace t = edge::testing;
namespace fs = std::filesystem;

namespace {

constexpr std::string_view preset = "deepseek-v3-tiny-gguf";

fs::path make(const fs::path& out, synthetic_format format, std::uint64_t seed, edge::kernels::dtype dtype) {
  return t::make_synthetic(out, std::string(preset), format, seed, dtype);
}

std::vector<std::int64_t> shape_of(const gguf_file& file, const std::string& name) {
  const auto* tensor = file.find_tensor(name);
  REQUIRE_MESSAGE(tensor != nullptr, name);
  return tensor->shape;
}

bool same_elements(const tensor_view& a, const tensor_view& b) {
  if (a.shape != b.shape) return false;
  for (std::int64_t i = 0; i < a.elements(); ++i) {
    if (t::element(a, i) != t::element(b, i)) return false;
  }
  return true;
}

bool same_elements(const weight_matrix& a, const weight_matrix& b) {
  if (a.shape != b.shape) return false;
  for (std::int64_t i = 0; i < a.elements(); ++i) {
    if (t::element(a, i) != t::element(b, i)) return false;
  }
  return true;
}

}  // namespace

TEST_CASE("GGUF deepseek2: llama.cpp's keys and tensor names, and the safetensors folder's weights") {
  t::temp_dir dir;
  const auto hf = t::load(make(dir / "hf", synthetic_format::safetensors, 21, edge::kernels::dtype::bf16));
  const auto gguf = t::load(make(dir / "ds.gguf", synthetic_format::gguf, 21, edge::kernels::dtype::bf16));
  auto file = load_gguf(dir / "ds.gguf");
  REQUIRE(file.ok());

  const auto key = [&](std::string_view name) {
    const auto* value = file->find("deepseek2." + std::string(name));
    REQUIRE_MESSAGE(value != nullptr, name);
    return *value;
  };
  CHECK(*file->find("general.architecture")->as_string() == "deepseek2");
  CHECK(key("block_count").as_int() == 3);
  CHECK(key("attention.head_count").as_int() == 4);
  CHECK(key("attention.head_count_kv").as_int() == 4);
  CHECK(key("attention.key_length").as_int() == 24);    // qk_nope 16 + qk_rope 8
  CHECK(key("attention.value_length").as_int() == 16);  // v_head_dim
  CHECK(key("rope.dimension_count").as_int() == 8);     // qk_rope_head_dim
  CHECK(key("attention.q_lora_rank").as_int() == 48);
  CHECK(key("attention.kv_lora_rank").as_int() == 32);
  CHECK(key("feed_forward_length").as_int() == 176);
  CHECK(key("leading_dense_block_count").as_int() == 1);
  CHECK(key("expert_count").as_int() == 8);
  CHECK(key("expert_used_count").as_int() == 2);
  CHECK(key("expert_feed_forward_length").as_int() == 32);
  CHECK(key("expert_shared_count").as_int() == 1);
  CHECK(key("expert_weights_scale").as_number() == doctest::Approx(2.5));
  CHECK(key("expert_weights_norm").as_bool() == true);
  CHECK(key("expert_gating_func").as_int() == 2);  // sigmoid
  CHECK(*key("rope.scaling.type").as_string() == "yarn");
  CHECK(key("rope.scaling.factor").as_number() == doctest::Approx(32.0));
  CHECK(key("rope.scaling.original_context_length").as_int() == 64);
  CHECK(key("rope.scaling.yarn_log_multiplier").as_number() == doctest::Approx(0.1 * 0.8));
  CHECK(key("attention.layer_norm_rms_epsilon").as_number() == doctest::Approx(1e-6));

  // Hugging Face's names under llama.cpp's, kv_b_proj whole; shapes row-major.
  CHECK(shape_of(*file, "blk.0.attn_q_a.weight") == std::vector<std::int64_t>{48, 64});
  CHECK(shape_of(*file, "blk.0.attn_q_a_norm.weight") == std::vector<std::int64_t>{48});
  CHECK(shape_of(*file, "blk.0.attn_q_b.weight") == std::vector<std::int64_t>{4 * 24, 48});
  CHECK(shape_of(*file, "blk.0.attn_kv_a_mqa.weight") == std::vector<std::int64_t>{32 + 8, 64});
  CHECK(shape_of(*file, "blk.0.attn_kv_a_norm.weight") == std::vector<std::int64_t>{32});
  CHECK(shape_of(*file, "blk.0.attn_kv_b.weight") == std::vector<std::int64_t>{4 * (16 + 16), 32});
  CHECK(shape_of(*file, "blk.0.attn_output.weight") == std::vector<std::int64_t>{64, 4 * 16});
  CHECK(shape_of(*file, "blk.0.ffn_gate.weight") == std::vector<std::int64_t>{176, 64});
  CHECK(shape_of(*file, "blk.1.ffn_gate_inp.weight") == std::vector<std::int64_t>{8, 64});
  CHECK(shape_of(*file, "blk.1.exp_probs_b.bias") == std::vector<std::int64_t>{8});
  CHECK(shape_of(*file, "blk.1.ffn_gate_exps.weight") == std::vector<std::int64_t>{8, 32, 64});
  CHECK(shape_of(*file, "blk.1.ffn_down_exps.weight") == std::vector<std::int64_t>{8, 64, 32});
  CHECK(shape_of(*file, "blk.2.ffn_up_shexp.weight") == std::vector<std::int64_t>{32, 64});
  CHECK(shape_of(*file, "output.weight") == std::vector<std::int64_t>{512, 64});
  CHECK(file->find_tensor("blk.1.exp_probs_b.bias")->type == edge::kernels::dtype::f32);
  CHECK(file->find_tensor("blk.1.ffn_gate_inp.weight")->type == edge::kernels::dtype::f32);
  for (const char* absent : {"blk.0.attn_q.weight", "blk.0.attn_k_b.weight", "blk.0.attn_v_b.weight",
                             "blk.1.ffn_gate.weight", "blk.0.exp_probs_b.bias"}) {
    CHECK_MESSAGE(file->find_tensor(absent) == nullptr, absent);
  }

  const model_config& c = gguf->config;
  const model_config& h = hf->config;
  CHECK(c.arch == architecture::deepseek_v3);
  CHECK(c.rope == rope_layout::adjacent_pairs);
  CHECK(c.head_dim == h.head_dim);
  CHECK(c.num_kv_heads == c.num_heads);
  CHECK(c.rms_norm_eps == doctest::Approx(h.rms_norm_eps));
  REQUIRE(c.mla);
  CHECK(c.mla->q_lora_rank == h.mla->q_lora_rank);
  CHECK(c.mla->kv_lora_rank == h.mla->kv_lora_rank);
  CHECK(c.mla->qk_nope_head_dim == h.mla->qk_nope_head_dim);
  CHECK(c.mla->qk_rope_head_dim == h.mla->qk_rope_head_dim);
  CHECK(c.mla->v_head_dim == h.mla->v_head_dim);
  REQUIRE(c.moe);
  CHECK(c.moe->scoring == edge::kernels::router_scoring::sigmoid);
  CHECK(c.moe->correction_bias);
  CHECK(c.moe->normalize_weights);
  CHECK(c.moe->routed_scaling == doctest::Approx(2.5));
  CHECK(c.moe->groups == 1);
  CHECK(c.moe->top_groups == 1);
  CHECK(c.moe->shared_experts == 1);
  CHECK(c.moe->first_dense_layers == 1);
  CHECK(!c.moe->sparse(0));
  CHECK(c.moe->sparse(1));
  CHECK(c.moe->sparse(2));
  REQUIRE(c.yarn);
  CHECK(c.yarn->factor == 32.0);
  CHECK(c.yarn->original_max_position == 64);
  CHECK(c.yarn->beta_fast == 32.0);
  CHECK(c.yarn->beta_slow == 1.0);
  CHECK(c.yarn->rotary_factor() == 1.0);
  CHECK(c.yarn->softmax_factor() == doctest::Approx(h.yarn->softmax_factor()).epsilon(1e-7));
  CHECK(c.yarn->softmax_factor() > 1.5);  // mscale(32, 0.8)² = (1 + 0.08 ln 32)²

  REQUIRE(gguf->weights.layers.size() == 3);
  for (std::size_t l = 0; l < 3; ++l) {
    CAPTURE(l);
    const layer_weights& g = gguf->weights.layers[l];
    const layer_weights& w = hf->weights.layers[l];
    for (const auto& [a, b] : {std::pair{&g.wq, &w.wq}, std::pair{&g.wq_b, &w.wq_b}, std::pair{&g.wk, &w.wk},
                               std::pair{&g.wkv_b, &w.wkv_b}, std::pair{&g.w_uk_t, &w.w_uk_t},
                               std::pair{&g.wo, &w.wo}, std::pair{&g.w_gate, &w.w_gate},
                               std::pair{&g.w_up, &w.w_up}, std::pair{&g.w_down, &w.w_down}}) {
      CAPTURE(a->name);
      CHECK(t::same_bytes(*a, *b));
    }
    CHECK(same_elements(g.q_a_norm, w.q_a_norm));
    CHECK(same_elements(g.kv_a_norm, w.kv_a_norm));
    if (l == 0) {
      CHECK(g.experts.empty());
      continue;
    }
    // llama.cpp keeps routers and the correction bias in F32, holding the checkpoint's values.
    CHECK(g.router.format == edge::kernels::weight_format::f32);
    CHECK(same_elements(g.router, w.router));
    CHECK(same_elements(g.router_bias, w.router_bias));
    REQUIRE(g.experts.size() == 8);
    for (std::size_t e = 0; e < 8; ++e) {
      CAPTURE(e);
      CHECK(t::same_bytes(g.experts[e].w_gate, w.experts[e].w_gate));
      CHECK(t::same_bytes(g.experts[e].w_up, w.experts[e].w_up));
      CHECK(t::same_bytes(g.experts[e].w_down, w.experts[e].w_down));
    }
  }
  CHECK(t::same_bytes(gguf->weights.lm_head, hf->weights.lm_head));
}

TEST_CASE("GGUF deepseek2: the same logits and the same chosen experts as the safetensors folder") {
  t::temp_dir dir;
  const auto hf = t::load(make(dir / "hf", synthetic_format::safetensors, 4, edge::kernels::dtype::f32));
  const auto gguf = t::load(make(dir / "ds.gguf", synthetic_format::gguf, 4, edge::kernels::dtype::f32));
  // Past YaRN's original 64 positions.
  std::string text;
  for (int i = 0; i < 12; ++i) text += "Latent attention, one row per token. ";
  const auto tokens = hf->tok->encode(text, {});
  REQUIRE(tokens.size() > 64);
  CHECK(gguf->tok->encode(text, {}) == tokens);

  const t::forced_run a = t::force(*hf, tokens);
  const t::forced_run b = t::force(*gguf, tokens);
  CHECK(a.moe_layers == 2);
  CHECK(t::logit_difference(a, b) <= 1e-5f);
  t::check_same_experts(a, b, 6);
}

TEST_CASE("make-model refuses a DeepSeek-V3 that GGUF deepseek2 would run differently") {
  t::temp_dir dir;
  synthetic_options options;
  options.format = synthetic_format::gguf;
  options.out = dir / "ds.gguf";
  const auto refusal = [&](const std::string& name, std::int64_t layers = 0) {
    options.preset = name;
    options.layers = layers;
    auto written = write_synthetic_model(options);
    REQUIRE(!written.ok());
    CHECK(written.error().code() == status_code::unimplemented);
    CHECK(!fs::exists(options.out));
    return written.error().message();
  };
  // Expert groups: llama.cpp takes a plain top-k. The preset names its twin.
  const auto grouped = refusal("deepseek-v3-tiny");
  CHECK(grouped.find("n_group 2") != std::string::npos);
  CHECK(grouped.find("deepseek-v3-tiny-gguf") != std::string::npos);
  // rope_interleave false, and queries without q_lora at a layer count other than 27.
  CHECK(refusal("deepseek-v3-tiny-qproj").find("rope_interleave false") != std::string::npos);
  // Kimi K2's beta_fast 1: llama.cpp's YaRN has 32.
  CHECK(refusal("kimi-k2", 1).find("beta_fast 1") != std::string::npos);
  // GLM-5's indexer: no GGUF architecture.
  CHECK(refusal("glm-5-tiny").find("GlmMoeDsaForCausalLM") != std::string::npos);

  options.preset = std::string(preset);
  options.layers = 0;
  CHECK(write_synthetic_model(options).ok());
}

TEST_CASE("GGUF deepseek2 metadata is read as llama.cpp reads it, and the later layout is named") {
  t::temp_dir dir;
  const auto path = make(dir / "ds.gguf", synthetic_format::gguf, 2, edge::kernels::dtype::bf16);
  auto file = load_gguf(path);
  REQUIRE(file.ok());
  auto parsed = config_from_gguf(*file);
  REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());

  SUBCASE("without attention.q_lora_rank, queries are one attn_q") {
    auto copy = *file;
    copy.metadata.erase("deepseek2.attention.q_lora_rank");
    auto config = config_from_gguf(copy);
    REQUIRE(config.ok());
    CHECK(config->config.mla->q_lora_rank == 0);
    const auto weights = weights_from_gguf(copy, config->config);
    REQUIRE(!weights.ok());
    CHECK(weights.error().message() == "missing tensor \"blk.0.attn_q.weight\" (expected shape [96, 64])");
  }
  SUBCASE("without YaRN, or with a zero log multiplier, the softmax keeps its scale") {
    auto copy = *file;
    copy.metadata["deepseek2.rope.scaling.type"] = gguf_value{std::string("none")};
    CHECK(!config_from_gguf(copy)->config.yarn);
    copy.metadata.erase("deepseek2.rope.scaling.type");
    CHECK(!config_from_gguf(copy)->config.yarn);
    copy = *file;
    copy.metadata["deepseek2.rope.scaling.yarn_log_multiplier"] = gguf_value{0.0};
    auto config = config_from_gguf(copy);
    REQUIRE(config.ok());
    REQUIRE(config->config.yarn);
    CHECK(config->config.yarn->softmax_factor() == 1.0);
    CHECK(config->config.yarn->rotary_factor() == 1.0);
    copy.metadata["deepseek2.rope.scaling.type"] = gguf_value{std::string("linear")};
    CHECK(config_from_gguf(copy).error().code() == status_code::unimplemented);
  }
  SUBCASE("expert groups, when the file has them") {
    auto copy = *file;
    copy.metadata["deepseek2.expert_group_count"] = gguf_value{std::uint64_t{2}};
    copy.metadata["deepseek2.expert_group_used_count"] = gguf_value{std::uint64_t{1}};
    auto config = config_from_gguf(copy);
    REQUIRE(config.ok());
    CHECK(config->config.moe->groups == 2);
    CHECK(config->config.moe->top_groups == 1);
  }
  SUBCASE("a softmax router: DeepSeek-V2's, without a correction bias") {
    auto copy = *file;
    copy.metadata.erase("deepseek2.expert_gating_func");  // files older than the key are softmax
    const auto biased = config_from_gguf(copy);
    CHECK(biased.error().code() == status_code::unimplemented);
    CHECK(biased.error().message().find("blk.1.exp_probs_b.bias") != std::string::npos);
    std::erase_if(copy.tensors, [](const tensor_view& v) { return v.name.ends_with("exp_probs_b.bias"); });
    auto config = config_from_gguf(copy);
    REQUIRE(config.ok());
    CHECK(config->config.moe->scoring == edge::kernels::router_scoring::softmax);
    CHECK(!config->config.moe->correction_bias);
    copy.metadata["deepseek2.expert_gating_func"] = gguf_value{std::uint64_t{3}};
    CHECK(config_from_gguf(copy).error().code() == status_code::unimplemented);
  }
  SUBCASE("missing latent sizes are named; the split attn_k_b / attn_v_b layout is unimplemented") {
    auto copy = *file;
    copy.metadata.erase("deepseek2.attention.kv_lora_rank");
    const auto missing = config_from_gguf(copy);
    CHECK(missing.error().code() == status_code::invalid_argument);
    CHECK(missing.error().message() == "metadata deepseek2.attention.kv_lora_rank is missing");
    copy = *file;
    copy.metadata["deepseek2.attention.key_length_mla"] = gguf_value{std::uint64_t{24}};
    const auto later = config_from_gguf(copy);
    CHECK(later.error().code() == status_code::unimplemented);
    CHECK(later.error().message().find("attn_k_b") != std::string::npos);
  }
}
