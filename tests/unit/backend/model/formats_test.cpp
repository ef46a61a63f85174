// Hyperparameters and weights from each format, without a tokenizer.
#include <doctest/doctest.h>

#include <cmath>

#include "edge/backend/io/safetensors.h"
#include "edge/backend/model/formats.h"
#include "edge/backend/model/model_plan.h"
#include "model_test_support.h"
#include "weight_test_support.h"
#include "test_support.h"

using namespace edge::backend;
using edge::status_code;
namespace t = edge::testing;

namespace {

// Every weight of a model, as (name, comparison with the same weight of another model).
struct weight_pair {
  std::string name;
  bool same;
};
std::vector<weight_pair> compare_weights(const model_weights& a, const model_weights& b) {
  std::vector<weight_pair> out;
  auto vec = [&](const tensor_view& x, const tensor_view& y) { out.push_back({y.name, t::same_bytes(x, y)}); };
  auto mat = [&](const edge::backend::weight_matrix& x, const edge::backend::weight_matrix& y) {
    out.push_back({y.name, t::same_bytes(x, y)});
  };
  vec(a.token_embedding, b.token_embedding);
  vec(a.final_norm, b.final_norm);
  mat(a.lm_head, b.lm_head);
  if (a.layers.size() != b.layers.size()) return {};
  for (std::size_t i = 0; i < a.layers.size(); ++i) {
    const auto& l = a.layers[i];
    const auto& m = b.layers[i];
    vec(l.attn_norm, m.attn_norm);
    vec(l.ffn_norm, m.ffn_norm);
    mat(l.wq, m.wq);
    mat(l.wk, m.wk);
    mat(l.wv, m.wv);
    mat(l.wo, m.wo);
    mat(l.w_gate, m.w_gate);
    mat(l.w_up, m.w_up);
    mat(l.w_down, m.w_down);
  }
  return out;
}

// A minimal config.json; `extra` is spliced in before the closing brace.
std::string config_json(std::string_view architecture, std::string_view extra = "") {
  return std::string(R"({"architectures": [")") + std::string(architecture) +
         R"("], "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,)"
         R"( "vocab_size": 512)" +
         std::string(extra) + "}";
}

// A config.json of `layers` layers (config_json's fields, which cannot be given twice).
std::string layered_config_json(std::string_view architecture, int layers, std::string_view extra) {
  return std::string(R"({"architectures": [")") + std::string(architecture) +
         R"("], "hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4, "vocab_size": 512,)" +
         R"( "num_hidden_layers": )" + std::to_string(layers) + std::string(extra) + "}";
}

}  // namespace

TEST_CASE("the stories260K llama2.c checkpoint holds the GGUF's model, bit for bit") {
  const auto bin = t::read_bytes(t::stories260k_dir() / "stories260K.bin");
  auto checkpoint = parse_llama2c(bin);
  REQUIRE_MESSAGE(checkpoint.ok(), checkpoint.error().to_string());
  const auto gguf_bytes = t::read_bytes(t::stories260k_dir() / "stories260K.gguf");
  auto gguf = parse_gguf(gguf_bytes);
  REQUIRE(gguf.ok());
  auto gguf_config = config_from_gguf(*gguf);
  REQUIRE_MESSAGE(gguf_config.ok(), gguf_config.error().to_string());
  auto gguf_weights = weights_from_gguf(*gguf, gguf_config->config);
  REQUIRE_MESSAGE(gguf_weights.ok(), gguf_weights.error().to_string());

  const model_config& a = checkpoint->config;
  const model_config& b = gguf_config->config;
  CHECK(a.arch == architecture::llama);
  CHECK(a.vocab_size == 512);
  CHECK(a.hidden_size == 64);
  CHECK(a.intermediate_size == 172);
  CHECK(a.num_layers == 5);
  CHECK(a.num_heads == 8);
  CHECK(a.num_kv_heads == 4);
  CHECK(a.head_dim == 8);
  CHECK(a.rope == rope_layout::adjacent_pairs);
  CHECK(a.rope_theta == 10000.0);
  CHECK(a.max_position == 512);
  CHECK(a.tie_embeddings);
  CHECK(!a.rope_scaling);
  for (const auto* config : {&a, &b}) {
    CHECK(config->vocab_size == a.vocab_size);
    CHECK(config->hidden_size == a.hidden_size);
    CHECK(config->intermediate_size == a.intermediate_size);
    CHECK(config->num_layers == a.num_layers);
    CHECK(config->num_heads == a.num_heads);
    CHECK(config->num_kv_heads == a.num_kv_heads);
    CHECK(config->head_dim == a.head_dim);
    CHECK(config->rope == a.rope);
    CHECK(config->rope_theta == a.rope_theta);
    CHECK(config->rms_norm_eps == doctest::Approx(1e-5));
    CHECK(!config->qkv_bias);
  }
  // Where the two files differ, as the fixture's README says: the GGUF's context length is a
  // converter default, and it stores the shared classifier as a separate (equal) tensor.
  CHECK(b.max_position == 2048);
  CHECK(!b.tie_embeddings);
  CHECK(!gguf_config->synthetic);

  // llama.cpp's llama2.c converter does not permute Q/K: llama2.c already uses adjacent-pair
  // RoPE, so every tensor, Q and K included, is the same bytes in both files.
  const auto pairs = compare_weights(checkpoint->weights, *gguf_weights);
  REQUIRE(pairs.size() == 3 + 5 * 9);
  for (const auto& pair : pairs) {
    CAPTURE(pair.name);
    CHECK(pair.same);
  }
  CHECK(checkpoint->weights.lm_head.data == checkpoint->weights.token_embedding.data);
  CHECK(gguf_weights->layers[2].wq.name == "blk.2.attn_q.weight");
  CHECK(gguf_weights->layers[2].w_gate.name == "blk.2.ffn_gate.weight");
}

TEST_CASE("llama2.c: unshared classifiers, implausible headers and wrong sizes") {
  // dim 8, hidden 16, 1 layer, 2 heads, 1 KV head, vocab -4 (own classifier), seq_len 3.
  const std::int32_t header[7] = {8, 16, 1, 2, 1, -4, 3};
  const std::size_t head_dim = 4, kv_dim = 4;
  const std::size_t floats = 4 * 8 + (2 * 8 + 2 * 8 * 8 + 2 * kv_dim * 8 + 3 * 8 * 16) + 8 + 2 * 3 * head_dim / 2 + 4 * 8;
  t::byte_writer w;
  for (const auto field : header) w.put(field);
  for (std::size_t i = 0; i < floats; ++i) w.put(static_cast<float>(i));
  auto checkpoint = parse_llama2c(w.bytes());
  REQUIRE_MESSAGE(checkpoint.ok(), checkpoint.error().to_string());
  CHECK(!checkpoint->config.tie_embeddings);
  CHECK(checkpoint->config.vocab_size == 4);
  CHECK(checkpoint->weights.lm_head.data != checkpoint->weights.token_embedding.data);
  // wcls is the last array of the file.
  CHECK(t::element(checkpoint->weights.lm_head, 31) == static_cast<float>(floats - 1));
  // w1 = gate, w3 = up, w2 = down.
  CHECK(checkpoint->weights.layers[0].w_gate.name == "w1");
  CHECK(checkpoint->weights.layers[0].w_up.name == "w3");
  CHECK(checkpoint->weights.layers[0].w_down.shape == std::vector<std::int64_t>{8, 16});

  auto short_file = w.bytes();
  short_file.pop_back();
  CHECK(parse_llama2c(short_file).error().code() == status_code::invalid_argument);
  auto long_file = w.bytes();
  long_file.push_back(std::byte{0});
  CHECK(parse_llama2c(long_file).error().message().find("implies") != std::string::npos);

  const std::int32_t implausible[][7] = {
      {0, 16, 1, 2, 1, 4, 3},   {8, 16, 1, 3, 1, 4, 3},  {8, 16, 1, 2, 3, 4, 3},  {8, 16, 0, 2, 1, 4, 3},
      {8, 16, 1, 2, 1, 0, 3},   {8, 16, 1, 2, 1, 4, -1}, {-8, 16, 1, 2, 1, 4, 3}, {8, 16, 1, 8, 1, 4, 3},
      {1 << 30, 1 << 30, 1 << 30, 1, 1, 1 << 30, 1 << 30}, {8, 16, 1, 2, 1, INT32_MIN, 3},
  };
  for (const auto& fields : implausible) {
    t::byte_writer bad;
    for (const auto field : fields) bad.put(field);
    bad.raw(std::vector<std::byte>(4096));
    CHECK(parse_llama2c(bad.bytes()).error().code() == status_code::invalid_argument);
  }
  CHECK(parse_llama2c(std::vector<std::byte>(27)).error().code() == status_code::invalid_argument);
}

TEST_CASE("config.json: Llama, Mistral and Qwen2") {
  SUBCASE("Llama defaults") {
    auto parsed = parse_hf_config(config_json("LlamaForCausalLM"));
    REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
    const auto& c = parsed->config;
    CHECK(c.arch == architecture::llama);
    CHECK(c.num_kv_heads == 4);
    CHECK(c.head_dim == 16);
    CHECK(c.rope == rope_layout::half_split);
    CHECK(c.rope_theta == 10000.0);
    CHECK(c.rms_norm_eps == 1e-6);
    CHECK(c.max_position == 2048);
    CHECK(!c.tie_embeddings);
    CHECK(!c.qkv_bias);
    CHECK(!c.rope_scaling);
    CHECK(!parsed->synthetic);
  }
  SUBCASE("Llama 3.2 with llama3 rope_scaling, GQA, explicit head_dim, tied, synthetic") {
    auto parsed = parse_hf_config(config_json(
        "LlamaForCausalLM",
        R"(, "num_key_value_heads": 2, "head_dim": 32, "rope_theta": 500000.0, "rms_norm_eps": 1e-05,)"
        R"( "max_position_embeddings": 131072, "tie_word_embeddings": true, "torch_dtype": "bfloat16",)"
        R"( "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,)"
        R"( "original_max_position_embeddings": 8192, "rope_type": "llama3"}, "edgeinfer_synthetic": true)"));
    REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
    const auto& c = parsed->config;
    CHECK(c.num_kv_heads == 2);
    CHECK(c.head_dim == 32);
    CHECK(c.rope_theta == 500000.0);
    CHECK(c.rms_norm_eps == 1e-5);
    CHECK(c.max_position == 131072);
    CHECK(c.tie_embeddings);
    REQUIRE(c.rope_scaling);
    CHECK(c.rope_scaling->factor == 32.0);
    CHECK(c.rope_scaling->low_freq_factor == 1.0);
    CHECK(c.rope_scaling->high_freq_factor == 4.0);
    CHECK(c.rope_scaling->original_max_position == 8192);
    CHECK(parsed->synthetic);
  }
  SUBCASE("the older \"type\" spelling and the default type") {
    auto old = parse_hf_config(config_json(
        "LlamaForCausalLM", R"(, "rope_scaling": {"type": "llama3", "factor": 8, "original_max_position_embeddings": 8192})"));
    REQUIRE(old.ok());
    CHECK(old->config.rope_scaling->factor == 8.0);
    CHECK(old->config.rope_scaling->high_freq_factor == 4.0);
    auto plain = parse_hf_config(config_json("LlamaForCausalLM", R"(, "rope_scaling": {"rope_type": "default"})"));
    REQUIRE(plain.ok());
    CHECK(!plain->config.rope_scaling);
  }
  SUBCASE("Qwen2 has Q/K/V biases and may tie") {
    auto parsed = parse_hf_config(config_json(
        "Qwen2ForCausalLM",
        R"(, "num_key_value_heads": 1, "tie_word_embeddings": true, "rope_theta": 1000000.0, "use_sliding_window": false, "sliding_window": 32768)"));
    REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
    CHECK(parsed->config.arch == architecture::qwen2);
    CHECK(parsed->config.qkv_bias);
    CHECK(parsed->config.tie_embeddings);
    CHECK(parsed->config.num_kv_heads == 1);
    CHECK(parsed->config.max_position == 32768);
    auto untied = parse_hf_config(config_json("Qwen2ForCausalLM"));
    REQUIRE(untied.ok());
    CHECK(!untied->config.tie_embeddings);
  }
  SUBCASE("Mistral") {
    auto parsed = parse_hf_config(config_json("MistralForCausalLM", R"(, "num_key_value_heads": 2, "sliding_window": null)"));
    REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
    CHECK(parsed->config.arch == architecture::mistral);
    CHECK(parsed->config.num_kv_heads == 2);
    CHECK(parsed->config.rope == rope_layout::half_split);
  }
}

TEST_CASE("config.json: what is refused, and how") {
  const auto code_of = [](std::string_view json) { return parse_hf_config(json).error().code(); };
  CHECK(code_of("not json") == status_code::invalid_argument);
  CHECK(code_of("[]") == status_code::invalid_argument);
  CHECK(code_of(R"({"hidden_size": 64})") == status_code::invalid_argument);
  CHECK(code_of(config_json("GPT2LMHeadModel")) == status_code::unimplemented);
  CHECK(code_of(config_json("LlamaForCausalLM", R"(, "rope_scaling": {"rope_type": "yarn", "factor": 4})")) ==
        status_code::unimplemented);
  CHECK(parse_hf_config(config_json("LlamaForCausalLM", R"(, "rope_scaling": {"rope_type": "linear", "factor": 4})"))
            .error()
            .message()
            .find("\"linear\"") != std::string::npos);
  CHECK(code_of(config_json("LlamaForCausalLM", R"(, "rope_scaling": {"rope_type": "llama3"})")) ==
        status_code::invalid_argument);
  CHECK(code_of(config_json("LlamaForCausalLM", R"(, "hidden_act": "gelu")")) == status_code::unimplemented);
  CHECK(code_of(config_json("LlamaForCausalLM", R"(, "attention_bias": true)")) == status_code::unimplemented);
  CHECK(code_of(config_json("LlamaForCausalLM", R"(, "num_key_value_heads": 3)")) == status_code::invalid_argument);
  CHECK(code_of(config_json("LlamaForCausalLM", R"(, "head_dim": 15)")) == status_code::invalid_argument);
  CHECK(code_of(config_json("LlamaForCausalLM", R"(, "rms_norm_eps": -1)")) == status_code::invalid_argument);
  CHECK(code_of(config_json("LlamaForCausalLM", R"(, "tie_word_embeddings": "yes")")) == status_code::invalid_argument);
  CHECK(code_of(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 176,)"
                R"( "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": -5})") == status_code::invalid_argument);
  CHECK(code_of(R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 176,)"
                R"( "num_hidden_layers": 2, "num_attention_heads": 4})") == status_code::invalid_argument);
}

TEST_CASE("config.json: Qwen3-MoE and GLM-4.5 experts, their defaults and their sparse layers") {
  SUBCASE("Qwen3-MoE: softmax router, sparse step and dense layers as listed") {
    auto parsed = parse_hf_config(layered_config_json(
        "Qwen3MoeForCausalLM", 6,
        R"(, "head_dim": 32, "num_experts": 16, "num_experts_per_tok": 4,)"
        R"( "moe_intermediate_size": 24, "norm_topk_prob": true, "decoder_sparse_step": 2, "mlp_only_layers": [3])"));
    REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
    const auto& c = parsed->config;
    CHECK(c.arch == architecture::qwen3_moe);
    CHECK(c.qk_norm);
    CHECK(!c.qkv_bias);
    REQUIRE(c.moe);
    CHECK(c.moe->num_experts == 16);
    CHECK(c.moe->experts_per_token == 4);
    CHECK(c.moe->expert_intermediate == 24);
    CHECK(c.moe->normalize_weights);
    CHECK(c.moe->scoring == edge::kernels::router_scoring::softmax);
    CHECK(!c.moe->correction_bias);
    CHECK(c.moe->shared_experts == 0);
    // (i + 1) % 2 == 0 and not listed: layers 1 and 5; 3 is in mlp_only_layers.
    std::vector<std::int64_t> sparse;
    for (std::int64_t i = 0; i < 6; ++i) {
      if (c.moe->sparse(i)) sparse.push_back(i);
    }
    CHECK(sparse == std::vector<std::int64_t>{1, 5});
    auto plan = plan_model(c);
    REQUIRE(plan.ok());
    CHECK(plan->layers[1].mlp.kind == mlp_kind::moe);
    CHECK(plan->layers[1].mlp.intermediate == 0);  // no shared experts
    CHECK(plan->layers[3].mlp.kind == mlp_kind::dense);
    CHECK(plan->layers[3].mlp.intermediate == 176);
    CHECK(plan->moe_layers() == 2);
  }
  SUBCASE("Qwen3-MoE's defaults, and num_experts 0 is a dense model") {
    auto parsed = parse_hf_config(config_json("Qwen3MoeForCausalLM", R"(, "head_dim": 16)"));
    REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
    REQUIRE(parsed->config.moe);
    CHECK(parsed->config.moe->num_experts == 128);
    CHECK(parsed->config.moe->experts_per_token == 8);
    CHECK(parsed->config.moe->expert_intermediate == 768);
    CHECK(!parsed->config.moe->normalize_weights);
    auto dense = parse_hf_config(config_json("Qwen3MoeForCausalLM", R"(, "num_experts": 0)"));
    REQUIRE(dense.ok());
    CHECK(!dense->config.moe);
  }
  SUBCASE("GLM-4.5: Q/K/V biases, half-rotary heads, first dense layers, grouped sigmoid router, shared experts") {
    auto parsed = parse_hf_config(layered_config_json(
        "Glm4MoeForCausalLM", 4,
        R"(, "head_dim": 32, "attention_bias": true, "partial_rotary_factor": 0.5,)"
        R"( "n_routed_experts": 16, "n_shared_experts": 2, "num_experts_per_tok": 4, "moe_intermediate_size": 24,)"
        R"( "first_k_dense_replace": 2, "routed_scaling_factor": 2.5, "n_group": 4, "topk_group": 2)"));
    REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
    const auto& c = parsed->config;
    CHECK(c.arch == architecture::glm4_moe);
    CHECK(c.qkv_bias);
    CHECK(!c.qk_norm);
    CHECK(c.rotary_dim == 16);
    REQUIRE(c.moe);
    CHECK(c.moe->scoring == edge::kernels::router_scoring::sigmoid);
    CHECK(c.moe->correction_bias);
    CHECK(c.moe->normalize_weights);  // GLM's default
    CHECK(c.moe->routed_scaling == 2.5);
    CHECK(c.moe->groups == 4);
    CHECK(c.moe->top_groups == 2);
    CHECK(c.moe->shared_intermediate() == 48);
    CHECK(!c.moe->sparse(1));
    CHECK(c.moe->sparse(2));
    auto plan = plan_model(c);
    REQUIRE(plan.ok());
    CHECK(plan->layers[0].attention.rope.rotary_dim == 16);
    CHECK(plan->layers[3].mlp.kind == mlp_kind::moe);
    CHECK(plan->layers[3].mlp.intermediate == 48);  // the shared experts
    CHECK(plan->layers[3].mlp.router.scaling == 2.5f);
    CHECK(plan->layers[3].mlp.router.groups == 4);
  }
}

TEST_CASE("config.json: MoE fields we cannot honour are refused, naming the field and the value") {
  const auto error_of = [](std::string_view json) { return parse_hf_config(json).error(); };
  const auto glm = [](std::string_view extra) {
    return config_json("Glm4MoeForCausalLM", std::string(R"(, "head_dim": 16, "n_routed_experts": 8)") + std::string(extra));
  };
  const auto scoring = error_of(glm(R"(, "scoring_func": "softmax")"));
  CHECK(scoring.code() == status_code::unimplemented);
  CHECK(scoring.message() == "scoring_func \"softmax\" is not supported (only \"sigmoid\" is)");
  CHECK(error_of(glm(R"(, "topk_method": "greedy")")).message().find("topk_method \"greedy\"") != std::string::npos);
  CHECK(error_of(glm(R"(, "rope_scaling": {"rope_type": "dynamic", "factor": 2})")).message().find("\"dynamic\"") !=
        std::string::npos);
  const auto groups = error_of(glm(R"(, "n_group": 3)"));
  CHECK(groups.code() == status_code::invalid_argument);
  CHECK(groups.message() == "n_group = 3 does not divide num_experts = 8");
  CHECK(error_of(glm(R"(, "num_experts_per_tok": 9)")).message() == "num_experts_per_tok = 9 is outside [1, 8]");
  CHECK(error_of(glm(R"(, "n_group": 4, "topk_group": 1, "num_experts_per_tok": 4)")).message().find("topk_group") !=
        std::string::npos);
  CHECK(error_of(glm(R"(, "partial_rotary_factor": 0)")).message().find("partial_rotary_factor") != std::string::npos);
  CHECK(error_of(glm(R"(, "partial_rotary_factor": 0.1)")).message().find("rotary dimension") != std::string::npos);
  CHECK(error_of(glm(R"(, "routed_scaling_factor": -1)")).message().find("routed_scaling_factor") != std::string::npos);
  CHECK(error_of(config_json("Qwen3MoeForCausalLM", R"(, "head_dim": 16, "mlp_only_layers": [7])"))
            .message()
            .find("mlp_only_layers") != std::string::npos);
  CHECK(error_of(config_json("Qwen3MoeForCausalLM", R"(, "head_dim": 16, "mlp_only_layers": ["one"])")).code() ==
        status_code::invalid_argument);
  // Qwen3-MoE's attention_bias would put a bias on o_proj too.
  CHECK(error_of(config_json("Qwen3MoeForCausalLM", R"(, "head_dim": 16, "attention_bias": true)")).code() ==
        status_code::unimplemented);
  CHECK(error_of(config_json("Qwen3MoeForCausalLM", R"(, "head_dim": 16, "quantization_config": {"quant_method": "awq"})"))
            .message()
            .find("quantization method \"awq\"") != std::string::npos);
  CHECK(error_of(config_json("Qwen3MoeForCausalLM", R"(, "head_dim": 16, "quantization_config": {"quant_method": "fp8"})"))
            .message()
            .find("without weight_block_size") != std::string::npos);
  CHECK(error_of(config_json("Qwen3MoeForCausalLM", R"(, "head_dim": 16, "quantization_config": {"quant_method": "fp8", )"
                                                    R"("fmt": "e5m2", "weight_block_size": [128, 128]})"))
            .message()
            .find("fmt \"e5m2\"") != std::string::npos);
  const auto blocks = parse_hf_config(config_json(
      "Glm4MoeForCausalLM", R"(, "head_dim": 16, "n_routed_experts": 8, "quantization_config": {"quant_method": "fp8", )"
                            R"("fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 64]})"));
  REQUIRE_MESSAGE(blocks.ok(), blocks.error().to_string());
  CHECK(blocks->fp8_block_rows == 128);
  CHECK(blocks->fp8_block_cols == 64);
  CHECK(blocks->quantized == edge::kernels::weight_format::fp8_e4m3);
}

TEST_CASE("Hugging Face weights: the router, its bias and each expert by name and shape") {
  model_config c;
  c.arch = architecture::glm4_moe;
  c.vocab_size = 8;
  c.hidden_size = 4;
  c.intermediate_size = 6;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.max_position = 16;
  c.tie_embeddings = true;
  moe_config moe;
  moe.num_experts = 2;
  moe.experts_per_token = 1;
  moe.expert_intermediate = 3;
  moe.shared_experts = 1;
  moe.scoring = edge::kernels::router_scoring::sigmoid;
  moe.correction_bias = true;
  c.moe = moe;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> names = {
      {"model.embed_tokens.weight", {8, 4}},
      {"model.norm.weight", {4}},
      {"model.layers.0.input_layernorm.weight", {4}},
      {"model.layers.0.self_attn.q_proj.weight", {4, 4}},
      {"model.layers.0.self_attn.k_proj.weight", {2, 4}},
      {"model.layers.0.self_attn.v_proj.weight", {2, 4}},
      {"model.layers.0.self_attn.o_proj.weight", {4, 4}},
      {"model.layers.0.post_attention_layernorm.weight", {4}},
      {"model.layers.0.mlp.gate.weight", {2, 4}},
      {"model.layers.0.mlp.gate.e_score_correction_bias", {2}},
      {"model.layers.0.mlp.shared_experts.gate_proj.weight", {3, 4}},
      {"model.layers.0.mlp.shared_experts.up_proj.weight", {3, 4}},
      {"model.layers.0.mlp.shared_experts.down_proj.weight", {4, 3}},
  };
  for (int e = 0; e < 2; ++e) {
    const std::string prefix = "model.layers.0.mlp.experts." + std::to_string(e) + ".";
    names.push_back({prefix + "gate_proj.weight", {3, 4}});
    names.push_back({prefix + "up_proj.weight", {3, 4}});
    names.push_back({prefix + "down_proj.weight", {4, 3}});
  }
  static const std::byte storage[256] = {};
  const auto tensors_of = [&](const auto& list) {
    std::vector<tensor_view> tensors;
    for (const auto& [name, shape] : list) {
      tensor_view v;
      v.name = name;
      v.shape = shape;
      v.type = edge::kernels::dtype::bf16;
      v.data = storage;
      tensors.push_back(v);
    }
    return tensors;
  };
  const auto tensors = tensors_of(names);
  auto weights = weights_from_hf(tensors, c);
  REQUIRE_MESSAGE(weights.ok(), weights.error().to_string());
  const layer_weights& l = weights->layers[0];
  CHECK(l.router.shape == std::vector<std::int64_t>{2, 4});
  CHECK(l.router_bias.present());
  REQUIRE(l.experts.size() == 2);
  CHECK(l.experts[1].w_down.name == "model.layers.0.mlp.experts.1.down_proj.weight");
  CHECK(l.w_gate.name == "model.layers.0.mlp.shared_experts.gate_proj.weight");
  const weight_footprint f = footprint_of(c, *weights);
  CHECK(f.routed_expert_bytes == 2 * 3 * 12 * 2);  // two experts of three 12-element bf16 matrices
  CHECK(f.active_bytes_per_token == f.total_bytes - f.routed_expert_bytes / 2);  // one of two experts per token

  SUBCASE("a missing expert matrix is named") {
    auto without = names;
    std::erase_if(without, [](const auto& n) { return n.first == "model.layers.0.mlp.experts.1.up_proj.weight"; });
    const auto missing = weights_from_hf(tensors_of(without), c);
    CHECK(missing.error().code() == status_code::invalid_argument);
    CHECK(missing.error().message() ==
          "missing tensor \"model.layers.0.mlp.experts.1.up_proj.weight\" (expected shape [3, 4])");
  }
  SUBCASE("an expert of the wrong shape is named with both shapes") {
    auto wrong = names;
    for (auto& n : wrong) {
      if (n.first == "model.layers.0.mlp.experts.0.down_proj.weight") n.second = {4, 2};
    }
    CHECK(weights_from_hf(tensors_of(wrong), c).error().message() ==
          "tensor \"model.layers.0.mlp.experts.0.down_proj.weight\" has shape [4, 2], expected [4, 3]");
  }
  SUBCASE("a sigmoid router without its correction bias") {
    auto without = names;
    std::erase_if(without, [](const auto& n) { return n.first.ends_with("e_score_correction_bias"); });
    CHECK(weights_from_hf(tensors_of(without), c).error().message().find("e_score_correction_bias") != std::string::npos);
  }
}

TEST_CASE("Hugging Face weights: names, Qwen2 biases and shape checks") {
  // A hand-made folder's tensors: every name of a 1-layer Qwen2 at tiny sizes.
  model_config c;
  c.arch = architecture::qwen2;
  c.vocab_size = 8;
  c.hidden_size = 4;
  c.intermediate_size = 6;
  c.num_layers = 1;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.max_position = 16;
  c.qkv_bias = true;
  c.tie_embeddings = true;
  const std::vector<std::pair<std::string, std::vector<std::int64_t>>> names = {
      {"model.embed_tokens.weight", {8, 4}},
      {"model.norm.weight", {4}},
      {"model.layers.0.input_layernorm.weight", {4}},
      {"model.layers.0.self_attn.q_proj.weight", {4, 4}},
      {"model.layers.0.self_attn.k_proj.weight", {2, 4}},
      {"model.layers.0.self_attn.v_proj.weight", {2, 4}},
      {"model.layers.0.self_attn.o_proj.weight", {4, 4}},
      {"model.layers.0.self_attn.q_proj.bias", {4}},
      {"model.layers.0.self_attn.k_proj.bias", {2}},
      {"model.layers.0.self_attn.v_proj.bias", {2}},
      {"model.layers.0.post_attention_layernorm.weight", {4}},
      {"model.layers.0.mlp.gate_proj.weight", {6, 4}},
      {"model.layers.0.mlp.up_proj.weight", {6, 4}},
      {"model.layers.0.mlp.down_proj.weight", {4, 6}},
  };
  static const std::byte storage[256] = {};
  std::vector<tensor_view> tensors;
  for (const auto& [name, shape] : names) {
    tensor_view v;
    v.name = name;
    v.shape = shape;
    v.type = edge::kernels::dtype::bf16;
    v.data = storage;
    tensors.push_back(v);
  }
  auto weights = weights_from_hf(tensors, c);
  REQUIRE_MESSAGE(weights.ok(), weights.error().to_string());
  CHECK(weights->layers[0].bq.present());
  CHECK(weights->layers[0].bv.shape == std::vector<std::int64_t>{2});
  CHECK(weights->lm_head.name == "model.embed_tokens.weight");

  SUBCASE("a missing bias") {
    auto without = tensors;
    std::erase_if(without, [](const tensor_view& v) { return v.name == "model.layers.0.self_attn.k_proj.bias"; });
    auto missing = weights_from_hf(without, c);
    CHECK(missing.error().code() == status_code::invalid_argument);
    CHECK(missing.error().message().find("missing tensor \"model.layers.0.self_attn.k_proj.bias\"") != std::string::npos);
  }
  SUBCASE("untied needs lm_head") {
    c.tie_embeddings = false;
    CHECK(weights_from_hf(tensors, c).error().message().find("lm_head.weight") != std::string::npos);
  }
  SUBCASE("a shape mismatch names tensor, expected and actual shape") {
    c.intermediate_size = 5;
    auto mismatch = weights_from_hf(tensors, c);
    CHECK(mismatch.error().code() == status_code::invalid_argument);
    CHECK(mismatch.error().message() ==
          "tensor \"model.layers.0.mlp.gate_proj.weight\" has shape [6, 4], expected [5, 4]");
  }
}

TEST_CASE("GGUF metadata: required keys, unsupported features") {
  const auto gguf_bytes = t::read_bytes(t::stories260k_dir() / "stories260K.gguf");
  auto file = parse_gguf(gguf_bytes);
  REQUIRE(file.ok());

  SUBCASE("missing keys") {
    auto copy = *file;
    copy.metadata.erase("llama.block_count");
    CHECK(config_from_gguf(copy).error().message().find("llama.block_count") != std::string::npos);
    copy = *file;
    copy.metadata.erase("general.architecture");
    CHECK(config_from_gguf(copy).error().code() == status_code::invalid_argument);
  }
  SUBCASE("other architectures and partial RoPE") {
    auto copy = *file;
    copy.metadata["general.architecture"] = gguf_value{std::string("gemma")};
    CHECK(config_from_gguf(copy).error().code() == status_code::unimplemented);
    copy = *file;
    copy.metadata["llama.rope.dimension_count"] = gguf_value{std::uint64_t{4}};
    CHECK(config_from_gguf(copy).error().code() == status_code::unimplemented);
    copy = *file;
    copy.metadata["llama.rope.scaling.type"] = gguf_value{std::string("linear")};
    CHECK(config_from_gguf(copy).error().code() == status_code::unimplemented);
    copy = *file;
    copy.metadata["llama.attention.head_count"] = gguf_value{std::string("eight")};
    CHECK(config_from_gguf(copy).error().code() == status_code::invalid_argument);
  }
  SUBCASE("freq_base and a missing classifier") {
    auto copy = *file;
    copy.metadata["llama.rope.freq_base"] = gguf_value{500000.0};
    std::erase_if(copy.tensors, [](const tensor_view& v) { return v.name == "output.weight"; });
    auto config = config_from_gguf(copy);
    REQUIRE(config.ok());
    CHECK(config->config.rope_theta == 500000.0);
    CHECK(config->config.tie_embeddings);
    auto weights = weights_from_gguf(copy, config->config);
    REQUIRE(weights.ok());
    CHECK(weights->lm_head.data == weights->token_embedding.data);
  }
  SUBCASE("a tensor of the wrong shape") {
    auto copy = *file;
    for (auto& v : copy.tensors) {
      if (v.name == "blk.3.attn_k.weight") v.shape = {64, 32};
    }
    auto config = config_from_gguf(copy);
    REQUIRE(config.ok());
    auto weights = weights_from_gguf(copy, config->config);
    CHECK(weights.error().code() == status_code::invalid_argument);
    CHECK(weights.error().message() == "tensor \"blk.3.attn_k.weight\" has shape [64, 32], expected [32, 64]");
  }
}

TEST_CASE("config.json: DeepSeek-V3 / Kimi K2 and GLM-5, latent attention, YaRN and the DSA indexer") {
  constexpr std::string_view latent =
      R"(, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 24, "n_routed_experts": 8,)"
      R"( "n_group": 1, "topk_group": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": 1)";
  SUBCASE("DeepSeek-V3: q_lora, YaRN's frequencies and both of its attention factors") {
    auto parsed = parse_hf_config(layered_config_json(
        "DeepseekV3ForCausalLM", 3,
        std::string(latent) + R"(, "q_lora_rank": 48, "max_position_embeddings": 163840, "rope_theta": 10000,)"
                              R"( "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096,)"
                              R"( "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8})"));
    REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
    const auto& c = parsed->config;
    CHECK(c.arch == architecture::deepseek_v3);
    REQUIRE(c.mla);
    CHECK(c.mla->q_lora_rank == 48);
    CHECK(c.head_dim == 24);          // qk_nope + qk_rope
    CHECK(c.num_kv_heads == 4);       // every head its own key and value
    CHECK(c.rope == rope_layout::adjacent_pairs);  // rope_interleave's default
    CHECK(c.rms_norm_eps == 1e-6);
    REQUIRE(c.yarn);
    const auto mscale = [](double m) { return 0.1 * m * std::log(40.0) + 1.0; };
    CHECK(c.yarn->softmax_factor() == doctest::Approx(mscale(0.8) * mscale(0.8)));
    CHECK(c.yarn->rotary_factor() == doctest::Approx(mscale(1.0) / mscale(0.8)));
    auto plan = plan_model(c);
    REQUIRE(plan.ok());
    const attention_plan& a = plan->layers[0].attention;
    CHECK(a.kind == attention_kind::mla);
    CHECK(a.q_dim() == 4 * 24);                    // o_proj's input: heads × v_head_dim
    CHECK(a.qkv_dim() == 48 + 32 + 8);             // q_a, the latent, k_pe
    CHECK(a.softmax_scale == doctest::Approx(mscale(0.8) * mscale(0.8) / std::sqrt(24.0)));
    CHECK(a.mla.rope_scale == doctest::Approx(mscale(1.0) / mscale(0.8)));
    // Worked by hand: over 4096 positions at theta 10^4, pair i (frequency 10^-i) turns
    // 4096 · 10^-i / 2π times. beta_fast 32 falls at pair 8 ln(4096 / 64π) / (2 ln 10^4) = 1.31
    // (floor 1), beta_slow 1 at 2.81 (ceil 3): pairs 0 and 1 keep their frequency, pair 2 is
    // half interpolated, pair 3 divided by the factor.
    const auto freq = a.rope.inv_freq();
    REQUIRE(freq.size() == 4);
    CHECK(freq[0] == doctest::Approx(1.0));
    CHECK(freq[1] == doctest::Approx(0.1));
    CHECK(freq[2] == doctest::Approx(0.01 * (0.5 + 0.5 / 40.0)));
    CHECK(freq[3] == doctest::Approx(0.001 / 40.0));
    CHECK(plan->layers[0].mlp.kind == mlp_kind::dense);
    CHECK(plan->layers[1].mlp.kind == mlp_kind::moe);
  }
  SUBCASE("YaRN over a long original context interpolates the slow pairs and keeps the fast ones") {
    auto kimi = parse_hf_config(layered_config_json(
        "DeepseekV3ForCausalLM", 2,
        R"(, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 64, "v_head_dim": 24, "n_routed_experts": 8,)"
        R"( "n_group": 1, "topk_group": 1, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "q_lora_rank": null,)"
        R"( "first_k_dense_replace": 1, "rope_parameters": {"rope_type": "yarn", "rope_theta": 50000, "factor": 32,)"
        R"( "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1})"));
    REQUIRE_MESSAGE(kimi.ok(), kimi.error().to_string());
    CHECK(kimi->config.mla->q_lora_rank == 0);  // null: one q_proj
    CHECK(kimi->config.rope_theta == 50000.0);  // from rope_parameters
    auto plan = plan_model(kimi->config);
    REQUIRE(plan.ok());
    CHECK(plan->layers[0].attention.qkv_dim() == 4 * 80 + 32 + 64);
    const auto freq = plan->layers[0].attention.rope.inv_freq();
    REQUIRE(freq.size() == 32);
    const auto plain = [](std::size_t i) { return std::pow(50000.0, -2.0 * static_cast<double>(i) / 64.0); };
    CHECK(freq.front() == doctest::Approx(plain(0)));            // the fastest pair: extrapolated
    CHECK(freq.back() == doctest::Approx(plain(31) / 32.0));     // the slowest: interpolated by the factor
    for (std::size_t i = 1; i < freq.size(); ++i) CHECK(freq[i] < freq[i - 1]);
  }
  SUBCASE("GLM-5: the indexer, its per-layer modes, mlp_layer_types, and the multi-token-prediction layer count") {
    auto parsed = parse_hf_config(layered_config_json(
        "GlmMoeDsaForCausalLM", 4,
        R"(, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 24, "n_routed_experts": 8,)"
        R"( "num_experts_per_tok": 2, "moe_intermediate_size": 32, "q_lora_rank": 48, "index_topk": 8,)"
        R"( "index_n_heads": 4, "index_head_dim": 16, "index_topk_pattern": "FSFS", "num_nextn_predict_layers": 1,)"
        R"( "mlp_layer_types": ["dense", "sparse", "dense", "sparse"])"));
    REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
    const auto& c = parsed->config;
    CHECK(c.arch == architecture::glm_moe_dsa);
    CHECK(c.rms_norm_eps == 1e-5);  // GlmMoeDsaConfig's default
    REQUIRE(c.dsa);
    CHECK(c.dsa->shared_layers == std::vector<bool>{false, true, false, true});
    CHECK(c.nextn_layers == 1);
    CHECK(!c.moe->sparse(0));
    CHECK(c.moe->sparse(1));
    CHECK(!c.moe->sparse(2));
    auto plan = plan_model(c);
    REQUIRE(plan.ok());
    CHECK(plan->layers[0].attention.mla.indexed());
    CHECK(!plan->layers[0].attention.mla.shared_selection);
    CHECK(plan->layers[1].attention.mla.shared_selection);
    CHECK(plan->layers[0].attention.qkv_dim() == 48 + 32 + 8 + 16 + 4);  // + the index key and head weights
    CHECK(plan->layers[1].attention.qkv_dim() == 48 + 32 + 8);           // a shared layer has no indexer
    // index_topk_freq 2 from offset 2: layers 0 and 1 full, then every other.
    auto freq = parse_hf_config(layered_config_json(
        "GlmMoeDsaForCausalLM", 5,
        std::string(latent) + R"(, "q_lora_rank": 48, "index_topk_freq": 2, "index_skip_topk_offset": 2)"));
    REQUIRE_MESSAGE(freq.ok(), freq.error().to_string());
    CHECK(freq->config.dsa->shared_layers == std::vector<bool>{false, false, true, false, true});
  }
  SUBCASE("what latent attention cannot honour is refused, naming the field") {
    const auto error_of = [&](std::string_view arch, std::string_view extra) {
      auto parsed = parse_hf_config(layered_config_json(arch, 2, std::string(latent) + std::string(extra)));
      REQUIRE_FALSE(parsed.ok());
      return parsed.error();
    };
    CHECK(error_of("DeepseekV3ForCausalLM", R"(, "moe_layer_freq": 2)").message().find("moe_layer_freq 2") !=
          std::string::npos);
    CHECK(error_of("DeepseekV3ForCausalLM", R"(, "attention_bias": true)").code() == status_code::unimplemented);
    CHECK(error_of("GlmMoeDsaForCausalLM", R"(, "q_lora_rank": null)").message().find("q_lora_rank") !=
          std::string::npos);
    CHECK(error_of("GlmMoeDsaForCausalLM", R"(, "q_lora_rank": 48, "indexer_types": ["shared", "full"])")
              .message()
              .find("first layer") != std::string::npos);
    CHECK(error_of("DeepseekV3ForCausalLM", R"(, "q_lora_rank": 48, "rope_scaling": {"type": "yarn", "factor": 4})")
              .message()
              .find("original_max_position_embeddings") != std::string::npos);
    // An odd rotated width, and a cached row wider than the attention kernels hold.
    const auto widths = [](std::string_view rope, std::string_view rank) {
      return parse_hf_config(layered_config_json(
          "DeepseekV3ForCausalLM", 2,
          std::string(R"(, "q_lora_rank": null, "qk_nope_head_dim": 16, "v_head_dim": 24, "n_routed_experts": 8,)") +
              R"( "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "qk_rope_head_dim": )" + std::string(rope) +
              R"(, "kv_lora_rank": )" + std::string(rank)));
    };
    REQUIRE(widths("8", "32").ok());
    CHECK(widths("7", "32").error().message().find("qk_rope_head_dim = 7 is odd") != std::string::npos);
    CHECK(widths("64", "1000").error().message().find("kv_lora_rank + qk_rope_head_dim") != std::string::npos);
  }
}
