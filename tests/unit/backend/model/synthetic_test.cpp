// make-model's writer, read back with the parsers (no tokenizer needed).
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

#include "edge/backend/io/safetensors.h"
#include "edge/backend/model/formats.h"
#include "edge/backend/model/synthetic.h"
#include "model_test_support.h"
#include "synthetic_test_support.h"
#include "weight_test_support.h"
#include "test_support.h"

using namespace edge::backend;
using edge::status_code;
namespace t = edge::testing;
namespace fs = std::filesystem;

namespace {

struct hf_folder {
  parsed_config config;
  std::vector<std::shared_ptr<const mapped_file>> files;
  std::vector<tensor_view> tensors;
  model_weights weights;
};

hf_folder read_folder(const fs::path& folder) {
  hf_folder f;
  auto config = parse_hf_config(t::read_text(folder / "config.json"));
  REQUIRE_MESSAGE(config.ok(), config.error().to_string());
  f.config = *config;
  auto tensors = load_safetensors_folder(folder, f.files);
  REQUIRE_MESSAGE(tensors.ok(), tensors.error().to_string());
  f.tensors = *tensors;
  auto weights = weights_from_hf(f.tensors, f.config.config);
  REQUIRE_MESSAGE(weights.ok(), weights.error().to_string());
  f.weights = *weights;
  return f;
}

struct gguf_model_parts {
  gguf_file file;
  parsed_config config;
  model_weights weights;
};

gguf_model_parts read_gguf(const fs::path& path) {
  gguf_model_parts g;
  auto file = load_gguf(path);
  REQUIRE_MESSAGE(file.ok(), file.error().to_string());
  g.file = std::move(*file);
  auto config = config_from_gguf(g.file);
  REQUIRE_MESSAGE(config.ok(), config.error().to_string());
  g.config = *config;
  auto weights = weights_from_gguf(g.file, g.config.config);
  REQUIRE_MESSAGE(weights.ok(), weights.error().to_string());
  g.weights = *weights;
  return g;
}

// Row r of a [rows, cols] tensor as floats.
std::vector<float> row_of(const edge::backend::weight_matrix& v, std::int64_t r) {
  std::vector<float> values;
  for (std::int64_t c = 0; c < v.cols(); ++c) values.push_back(t::element(v, r * v.cols() + c));
  return values;
}

}  // namespace

TEST_CASE("presets have the shapes of the models they are named after") {
  const auto* llama = find_synthetic_preset("llama-3.2-1b");
  REQUIRE(llama != nullptr);
  CHECK(llama->config.hidden_size == 2048);
  CHECK(llama->config.intermediate_size == 8192);
  CHECK(llama->config.num_layers == 16);
  CHECK(llama->config.num_heads == 32);
  CHECK(llama->config.num_kv_heads == 8);
  CHECK(llama->config.head_dim == 64);
  CHECK(llama->config.vocab_size == 128256);
  CHECK(llama->config.tie_embeddings);
  CHECK(llama->config.rope_theta == 500000.0);
  CHECK(llama->config.max_position == 131072);
  REQUIRE(llama->config.rope_scaling);
  CHECK(llama->config.rope_scaling->factor == 32.0);
  CHECK(llama->config.rope_scaling->original_max_position == 8192);
  const auto* big = find_synthetic_preset("llama-3-8b");
  REQUIRE(big != nullptr);
  CHECK(big->config.intermediate_size == 14336);
  CHECK(!big->config.tie_embeddings);
  const auto* qwen = find_synthetic_preset("qwen2.5-0.5b");
  REQUIRE(qwen != nullptr);
  CHECK(qwen->config.vocab_size == 151936);
  CHECK(qwen->config.qkv_bias);
  CHECK(qwen->config.num_heads == 14);
  CHECK(qwen->config.rope_theta == 1000000.0);
  CHECK(find_synthetic_preset("tiny") != nullptr);
  const auto* hd128 = find_synthetic_preset("tiny-hd128");
  REQUIRE(hd128 != nullptr);
  CHECK(hd128->config.head_dim == 128);
  CHECK(hd128->config.num_heads * hd128->config.head_dim == hd128->config.hidden_size);
  const auto* moe = find_synthetic_preset("qwen3-30b-a3b");
  REQUIRE(moe != nullptr);
  REQUIRE(moe->config.moe);
  CHECK(moe->config.moe->num_experts == 128);
  CHECK(moe->config.moe->experts_per_token == 8);
  CHECK(moe->config.moe->expert_intermediate == 768);
  // What a GGUF qwen3moe holds: every layer sparse, the chosen weights renormalised.
  for (const auto* name : {"qwen3-30b-a3b", "tiny-qwen3-moe-sparse"}) {
    const auto& c = find_synthetic_preset(name)->config;
    CHECK(c.moe->normalize_weights);
    for (std::int64_t l = 0; l < c.num_layers; ++l) CHECK(c.moe->sparse(l));
  }
  CHECK(!find_synthetic_preset("tiny-qwen3-moe")->config.moe->sparse(1));
  CHECK(find_synthetic_preset("gpt-5") == nullptr);
  CHECK(synthetic_presets().size() >= 5);
  CHECK(parse_synthetic_format("gguf") == synthetic_format::gguf);
  CHECK(!parse_synthetic_format("onnx"));
}

TEST_CASE("a tiny safetensors folder reads back with its configuration, marker and weights") {
  t::temp_dir dir;
  const auto folder = t::make_synthetic(dir / "tiny", "tiny", synthetic_format::safetensors, 7);
  for (const char* name : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
    CHECK_MESSAGE(fs::exists(folder / name), name);
  }
  CHECK(!fs::exists(folder / "model.safetensors.index.json"));
  const auto f = read_folder(folder);
  const auto& preset = find_synthetic_preset("tiny")->config;
  const auto& c = f.config.config;
  CHECK(f.config.synthetic);
  CHECK(c.arch == architecture::llama);
  CHECK(c.vocab_size == preset.vocab_size);
  CHECK(c.hidden_size == preset.hidden_size);
  CHECK(c.intermediate_size == preset.intermediate_size);
  CHECK(c.num_layers == preset.num_layers);
  CHECK(c.num_heads == preset.num_heads);
  CHECK(c.num_kv_heads == preset.num_kv_heads);
  CHECK(c.head_dim == preset.head_dim);
  CHECK(c.rms_norm_eps == preset.rms_norm_eps);
  CHECK(c.tie_embeddings == preset.tie_embeddings);
  CHECK(c.rope == rope_layout::half_split);

  std::vector<std::shared_ptr<const mapped_file>> keep;
  auto mapping = mapped_file::open(folder / "model.safetensors");
  REQUIRE(mapping.ok());
  auto parsed = parse_safetensors((*mapping)->bytes());
  REQUIRE(parsed.ok());
  CHECK(parsed->metadata.at("edgeinfer_synthetic") == "true");

  const auto& w = f.weights;
  CHECK(w.token_embedding.type == edge::kernels::dtype::bf16);
  CHECK(w.lm_head.data != w.token_embedding.data);
  CHECK(t::element(w.layers[1].ffn_norm, 5) == 1.0f);
  CHECK(t::element(w.final_norm, 0) == 1.0f);
  // Random weights: centred, with a standard deviation near 0.02, and every value finite.
  double sum = 0, sum_squares = 0;
  const auto n = w.layers[0].w_gate.elements();
  for (std::int64_t i = 0; i < n; ++i) {
    const double v = t::element(w.layers[0].w_gate, i);
    REQUIRE(std::isfinite(v));
    CHECK(std::abs(v) < 0.035);
    sum += v;
    sum_squares += v * v;
  }
  CHECK(std::abs(sum / n) < 0.002);
  CHECK(std::sqrt(sum_squares / n) == doctest::Approx(0.02).epsilon(0.05));
}

TEST_CASE("make-model is deterministic for a seed and different for another") {
  t::temp_dir dir;
  for (const auto format : {synthetic_format::safetensors, synthetic_format::gguf}) {
    const bool gguf = format == synthetic_format::gguf;
    const auto a = t::make_synthetic(dir / (gguf ? "a.gguf" : "a"), "tiny", format, 1);
    const auto b = t::make_synthetic(dir / (gguf ? "b.gguf" : "b"), "tiny", format, 1);
    const auto c = t::make_synthetic(dir / (gguf ? "c.gguf" : "c"), "tiny", format, 2);
    const auto weights_file = [&](const fs::path& p) { return gguf ? p : p / "model.safetensors"; };
    CHECK(t::read_bytes(weights_file(a)) == t::read_bytes(weights_file(b)));
    CHECK(t::read_bytes(weights_file(a)) != t::read_bytes(weights_file(c)));
    CHECK(t::read_bytes(weights_file(a)).size() == t::read_bytes(weights_file(c)).size());
    if (!gguf) {
      // The tokenizer is the family's, whatever the seed.
      CHECK(t::read_text(a / "tokenizer.json") == t::read_text(c / "tokenizer.json"));
      CHECK(t::read_text(a / "config.json") == t::read_text(b / "config.json"));
    }
  }
}

TEST_CASE("sharded safetensors: an index, every tensor once, the same values as one file") {
  t::temp_dir dir;
  const auto whole = t::make_synthetic(dir / "whole", "tiny", synthetic_format::safetensors, 3);
  const auto sharded = t::make_synthetic(dir / "sharded", "tiny", synthetic_format::safetensors, 3, edge::kernels::dtype::bf16, 40000);
  CHECK(!fs::exists(sharded / "model.safetensors"));
  REQUIRE(fs::exists(sharded / "model.safetensors.index.json"));
  int shards = 0;
  for (const auto& entry : fs::directory_iterator(sharded)) {
    if (entry.path().filename().string().starts_with("model-")) ++shards;
  }
  CHECK(shards >= 3);
  CHECK(fs::exists(sharded / ("model-00001-of-0000" + std::to_string(shards) + ".safetensors")));

  const auto a = read_folder(whole);
  const auto b = read_folder(sharded);
  REQUIRE(a.tensors.size() == b.tensors.size());
  CHECK(b.files.size() == static_cast<std::size_t>(shards));
  CHECK(t::same_bytes(a.weights.token_embedding, b.weights.token_embedding));
  CHECK(t::same_bytes(a.weights.lm_head, b.weights.lm_head));
  for (std::size_t i = 0; i < a.weights.layers.size(); ++i) {
    CHECK(t::same_bytes(a.weights.layers[i].wq, b.weights.layers[i].wq));
    CHECK(t::same_bytes(a.weights.layers[i].w_down, b.weights.layers[i].w_down));
  }

  // Writing again over an earlier output replaces it, stale shards included.
  t::make_synthetic(sharded, "tiny", synthetic_format::safetensors, 3);
  CHECK(fs::exists(sharded / "model.safetensors"));
  CHECK(!fs::exists(sharded / "model.safetensors.index.json"));
  for (const auto& entry : fs::directory_iterator(sharded)) {
    CHECK(!entry.path().filename().string().starts_with("model-"));
  }
}

TEST_CASE("the GGUF and safetensors forms of a seed hold the same network") {
  t::temp_dir dir;
  const auto folder = t::make_synthetic(dir / "hf", "tiny", synthetic_format::safetensors, 11);
  const auto file = t::make_synthetic(dir / "tiny.gguf", "tiny", synthetic_format::gguf, 11);
  const auto hf = read_folder(folder);
  const auto g = read_gguf(file);

  CHECK(g.config.synthetic);
  CHECK(g.file.find("edgeinfer.synthetic")->as_bool() == true);
  CHECK(*g.file.find("tokenizer.ggml.model")->as_string() == "gpt2");
  CHECK(*g.file.find("tokenizer.ggml.pre")->as_string() == "llama-bpe");
  CHECK(g.file.find("tokenizer.ggml.tokens")->as_array()->size() == 512);
  CHECK(g.file.find("tokenizer.ggml.token_type")->as_array()->size() == 512);
  CHECK(!g.file.find("tokenizer.ggml.merges")->as_array()->empty());
  CHECK(g.file.find("tokenizer.chat_template")->as_string()->find("<|start_header_id|>") != std::string::npos);
  const auto& gc = g.config.config;
  const auto& hc = hf.config.config;
  CHECK(gc.rope == rope_layout::adjacent_pairs);
  CHECK(hc.rope == rope_layout::half_split);
  CHECK(gc.vocab_size == hc.vocab_size);
  CHECK(gc.num_layers == hc.num_layers);
  CHECK(gc.head_dim == hc.head_dim);
  CHECK(gc.rope_theta == hc.rope_theta);
  CHECK(gc.rms_norm_eps == doctest::Approx(hc.rms_norm_eps));
  CHECK(gc.tie_embeddings == hc.tie_embeddings);
  CHECK(gc.max_position == hc.max_position);

  const auto& gw = g.weights;
  const auto& hw = hf.weights;
  CHECK(t::same_bytes(gw.token_embedding, hw.token_embedding));
  CHECK(t::same_bytes(gw.lm_head, hw.lm_head));
  // llama.cpp keeps vectors in F32; the values are the same.
  CHECK(gw.final_norm.type == edge::kernels::dtype::f32);
  CHECK(t::element(gw.final_norm, 3) == t::element(hw.final_norm, 3));
  for (std::size_t l = 0; l < gw.layers.size(); ++l) {
    CHECK(t::same_bytes(gw.layers[l].wv, hw.layers[l].wv));
    CHECK(t::same_bytes(gw.layers[l].wo, hw.layers[l].wo));
    CHECK(t::same_bytes(gw.layers[l].w_gate, hw.layers[l].w_gate));
    CHECK(t::same_bytes(gw.layers[l].w_up, hw.layers[l].w_up));
    CHECK(t::same_bytes(gw.layers[l].w_down, hw.layers[l].w_down));
    // Q and K rows are interleaved per head: HF row h*d + i*(d/2) + j is GGUF row h*d + 2j + i.
    CHECK(!t::same_bytes(gw.layers[l].wq, hw.layers[l].wq));
    const std::int64_t d = gc.head_dim;
    for (const auto& [gv, hv] : {std::pair{&gw.layers[l].wq, &hw.layers[l].wq}, std::pair{&gw.layers[l].wk, &hw.layers[l].wk}}) {
      const std::int64_t heads = gv->rows() / d;
      for (std::int64_t h = 0; h < heads; ++h) {
        for (std::int64_t j = 0; j < d / 2; ++j) {
          for (std::int64_t i = 0; i < 2; ++i) {
            REQUIRE(row_of(*gv, h * d + 2 * j + i) == row_of(*hv, h * d + i * (d / 2) + j));
          }
        }
      }
    }
  }
}

TEST_CASE("tiny-qwen2 in both formats: biases, tied classifier, no Q/K permutation") {
  t::temp_dir dir;
  const auto hf = read_folder(t::make_synthetic(dir / "hf", "tiny-qwen2", synthetic_format::safetensors, 5, edge::kernels::dtype::f16));
  const auto g = read_gguf(t::make_synthetic(dir / "q.gguf", "tiny-qwen2", synthetic_format::gguf, 5, edge::kernels::dtype::f16));
  CHECK(hf.config.config.arch == architecture::qwen2);
  CHECK(g.config.config.arch == architecture::qwen2);
  CHECK(g.config.config.rope == rope_layout::half_split);
  CHECK(g.config.config.qkv_bias);
  CHECK(g.config.config.tie_embeddings);
  CHECK(hf.config.config.tie_embeddings);
  CHECK(g.file.find_tensor("output.weight") == nullptr);
  CHECK(g.file.find("tokenizer.chat_template")->as_string()->find("<|im_start|>") != std::string::npos);
  CHECK(hf.weights.token_embedding.type == edge::kernels::dtype::f16);
  for (std::size_t l = 0; l < hf.weights.layers.size(); ++l) {
    CHECK(t::same_bytes(g.weights.layers[l].wq, hf.weights.layers[l].wq));
    CHECK(t::same_bytes(g.weights.layers[l].wk, hf.weights.layers[l].wk));
    REQUIRE(hf.weights.layers[l].bk.present());
    CHECK(g.weights.layers[l].bk.type == edge::kernels::dtype::f32);
    for (std::int64_t i = 0; i < hf.weights.layers[l].bk.elements(); ++i) {
      // f16 in the folder, f32 in the GGUF: the f16 value widened, as llama.cpp's converter does.
      CHECK(t::element(hf.weights.layers[l].bk, i) == t::element(g.weights.layers[l].bk, i));
    }
  }
}

TEST_CASE("Llama 3 RoPE scaling is recovered from a rope_freqs.weight tensor") {
  const auto bytes = t::read_bytes(t::stories260k_dir() / "stories260K.gguf");
  auto file = parse_gguf(bytes);
  REQUIRE(file.ok());
  // The divisors Llama 3 scaling (factor 32, low 1, high 4, original 8192) gives stories260K's
  // RoPE (head_dim 8, theta 10000), from the published formula.
  const double factor = 32, low = 1, high = 4, original = 8192;
  std::vector<float> factors;
  for (int i = 0; i < 4; ++i) {
    const double wavelength = 2 * std::numbers::pi * std::pow(10000.0, 2.0 * i / 8);
    if (wavelength < original / high) {
      factors.push_back(1.0f);
    } else if (wavelength > original / low) {
      factors.push_back(static_cast<float>(factor));
    } else {
      const double smooth = (original / wavelength - low) / (high - low);
      factors.push_back(static_cast<float>(1 / ((1 - smooth) / factor + smooth)));
    }
  }
  CHECK(factors[3] > 1.0f);
  CHECK(factors[3] < 32.0f);
  tensor_view freqs;
  freqs.name = "rope_freqs.weight";
  freqs.shape = {4};
  freqs.data = reinterpret_cast<const std::byte*>(factors.data());
  file->tensors.push_back(freqs);
  auto config = config_from_gguf(*file);
  REQUIRE_MESSAGE(config.ok(), config.error().to_string());
  REQUIRE(config->config.rope_scaling);
  CHECK(config->config.rope_scaling->factor == doctest::Approx(32.0).epsilon(1e-3));
  CHECK(config->config.rope_scaling->original_max_position == 8192);

  factors[2] = 2.0f;  // not Llama 3 scaling any more
  CHECK(config_from_gguf(*file).error().code() == edge::status_code::unimplemented);
}

TEST_CASE("MoE presets: the published shapes, and --layers keeps the first layers at full size") {
  const auto* qwen = find_synthetic_preset("qwen3-30b-a3b");
  REQUIRE(qwen != nullptr);
  REQUIRE(qwen->config.moe);
  CHECK(qwen->config.num_layers == 48);
  CHECK(qwen->config.hidden_size == 2048);
  CHECK(qwen->config.moe->num_experts == 128);
  CHECK(qwen->config.moe->experts_per_token == 8);
  CHECK(qwen->config.moe->expert_intermediate == 768);
  CHECK(qwen->config.moe->shared_experts == 0);
  CHECK(qwen->config.moe->normalize_weights);
  const auto* glm = find_synthetic_preset("glm-4.5-air");
  REQUIRE(glm != nullptr);
  REQUIRE(glm->config.moe);
  CHECK(glm->config.num_layers == 46);
  CHECK(glm->config.hidden_size == 4096);
  CHECK(glm->config.num_heads == 96);
  CHECK(glm->config.head_dim == 128);
  CHECK(glm->config.rotary_dim == 64);
  CHECK(glm->config.qkv_bias);
  CHECK(glm->config.moe->num_experts == 128);
  CHECK(glm->config.moe->shared_experts == 1);
  CHECK(glm->config.moe->expert_intermediate == 1408);
  CHECK(glm->config.moe->first_dense_layers == 1);
  CHECK(glm->config.moe->scoring == edge::kernels::router_scoring::sigmoid);

  t::temp_dir dir;
  synthetic_options options;
  options.preset = "tiny-glm4-moe";
  options.layers = 2;
  options.out = dir / "two";
  REQUIRE(write_synthetic_model(options).ok());
  auto parsed = parse_hf_config(t::read_text(dir / "two" / "config.json"));
  REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
  CHECK(parsed->config.num_layers == 2);
  REQUIRE(parsed->config.moe);
  CHECK(!parsed->config.moe->sparse(0));
  CHECK(parsed->config.moe->sparse(1));
  CHECK(parsed->config.moe->groups == 4);
  CHECK(parsed->config.moe->routed_scaling == 2.5);
  options.layers = 4;  // more than the preset has
  options.out = dir / "four";
  CHECK(write_synthetic_model(options).error().code() == status_code::invalid_argument);
}

TEST_CASE("--context-length declares a context other than the preset's, in both formats") {
  t::temp_dir dir;
  synthetic_options options;
  options.preset = "tiny";
  options.context_length = 65536;
  options.out = dir / "long";
  REQUIRE(write_synthetic_model(options).ok());
  auto parsed = parse_hf_config(t::read_text(dir / "long" / "config.json"));
  REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
  CHECK(find_synthetic_preset("tiny")->config.max_position == 2048);
  CHECK(parsed->config.max_position == 65536);
  CHECK(parsed->config.hidden_size == 64);  // the preset's shapes otherwise
  CHECK(t::read_text(dir / "long" / "tokenizer_config.json").find("\"model_max_length\": 65536") != std::string::npos);
  options.format = synthetic_format::gguf;
  options.out = dir / "long.gguf";
  REQUIRE(write_synthetic_model(options).ok());
  const auto gguf = read_gguf(dir / "long.gguf");
  CHECK(gguf.config.config.max_position == 65536);
  options.context_length = 8;
  options.out = dir / "short.gguf";
  auto refused = write_synthetic_model(options);
  CHECK(refused.error().code() == status_code::invalid_argument);
  CHECK(refused.error().message().find("--context-length 8") != std::string::npos);
}

TEST_CASE("make-model refuses what it cannot write") {
  t::temp_dir dir;
  synthetic_options options;
  options.out = dir / "x";
  options.preset = "no-such-model";
  auto unknown = write_synthetic_model(options);
  CHECK(unknown.error().code() == status_code::invalid_argument);
  CHECK(unknown.error().message().find("llama-3.2-1b") != std::string::npos);

  options.preset = "tiny";
  fs::create_directories(dir / "busy");
  t::write_text(dir / "busy" / "notes.txt", "mine");
  options.out = dir / "busy";
  auto busy = write_synthetic_model(options);
  CHECK(busy.error().code() == status_code::failed_precondition);
  CHECK(fs::exists(dir / "busy" / "notes.txt"));

  options.format = synthetic_format::gguf;
  auto folder = write_synthetic_model(options);
  CHECK(folder.error().code() == status_code::invalid_argument);

  // GGUF holds no GLM-4.5, and a qwen3moe GGUF no dense layer (llama.cpp makes every layer sparse).
  options.out = dir / "moe.gguf";
  options.preset = "tiny-glm4-moe";
  auto glm = write_synthetic_model(options);
  CHECK(glm.error().code() == status_code::unimplemented);
  CHECK(glm.error().message().find("Glm4MoeForCausalLM") != std::string::npos);
  options.preset = "tiny-qwen3-moe";
  auto dense = write_synthetic_model(options);
  CHECK(dense.error().code() == status_code::unimplemented);
  CHECK(dense.error().message().find("dense layer (1") != std::string::npos);
  CHECK(!fs::exists(options.out));
  // Its first layer alone is sparse.
  options.layers = 1;
  CHECK(write_synthetic_model(options).ok());
}
