// The KV cache's memory and budget: scale bytes count, FP8 holds about twice the tokens of BF16,
// and the KV dtype names (auto included) resolve as documented.
#include <doctest/doctest.h>

#include <cstring>

#include "edge/backend/model/model.h"
#include "edge/backend/model/synthetic.h"
#include "edge/backend/runtime/kv_cache.h"
#include "edge/common/format.h"
#include "test_support.h"

namespace {

using namespace edge::backend;
using edge::kernels::dtype;

constexpr std::size_t two_gib = std::size_t{2} << 30;

const model_config& preset(const char* name) {
  const synthetic_preset* p = find_synthetic_preset(name);
  REQUIRE(p != nullptr);
  return p->config;
}

// stories260K's shape (the fixture's llama2.c header): 5 layers, 4 KV heads of 8 dims.
model_config stories260k_config() {
  model_config c;
  c.num_layers = 5;
  c.num_heads = 8;
  c.num_kv_heads = 4;
  c.head_dim = 8;
  c.hidden_size = 64;
  return c;
}

}  // namespace

TEST_CASE("FP8 KV holds at least 1.9x the tokens of bf16 in the same budget at head_dim 128") {
  const model_config& config = preset("llama-3-8b");
  REQUIRE(config.head_dim == 128);
  const kv_cache_capacity fp8 = kv_cache_capacity_for(config, dtype::fp8_e4m3, 16, two_gib);
  const kv_cache_capacity bf16 = kv_cache_capacity_for(config, dtype::bf16, 16, two_gib);
  CHECK(fp8.bf16_tokens == bf16.tokens);
  CHECK(fp8.tokens >= 1.9 * static_cast<double>(bf16.tokens));
  CHECK(fp8.ratio_to_bf16 == doctest::Approx(256.0 / 132.0));  // 2 bytes × 128 vs 128 + a 4-byte scale
  CHECK(fp8.used_bytes <= two_gib);
  CHECK(fp8.tokens == fp8.num_blocks * 16);
  // Whole blocks: one more would not fit.
  CHECK(fp8.used_bytes + fp8.bytes_per_token * 16 > two_gib);
}

TEST_CASE("the KV budget counts scale bytes: the real FP8 ratio at head_dim 64 and 8") {
  const model_config& llama = preset("llama-3.2-1b");
  kv_cache_layout layout = kv_cache_layout::for_budget(llama, dtype::fp8_e4m3, 16, two_gib);
  // K and V × 16 layers × 8 KV heads × (64 one-byte codes + one f32 scale).
  CHECK(layout.bytes_per_token() == 2 * 16 * 8 * (64 + 4));
  CHECK(kv_cache_layout::for_budget(llama, dtype::bf16, 16, two_gib).bytes_per_token() == 2 * 16 * 8 * 64 * 2);
  CHECK(kv_cache_capacity_for(llama, dtype::fp8_e4m3, 16, two_gib).ratio_to_bf16 == doctest::Approx(128.0 / 68.0));

  const model_config stories = stories260k_config();
  const kv_cache_capacity c = kv_cache_capacity_for(stories, dtype::fp8_e4m3, 16, std::size_t{64} << 20);
  CHECK(c.ratio_to_bf16 == doctest::Approx(16.0 / 12.0));
  CHECK(format_kv_cache_capacity(c) ==
        edge::format("KV cache: fp8_e4m3, {} blocks × 16 tokens = {} tokens, 1.33× bf16 ({} tokens) in 64 MiB",
                     c.num_blocks, c.tokens, c.bf16_tokens));
  CHECK(c.tokens == std::int64_t{64 << 20} / (2 * 5 * 4 * 12 * 16) * 16);

  const kv_cache_capacity f32 = kv_cache_capacity_for(stories, dtype::f32, 16, std::size_t{64} << 20);
  CHECK(f32.ratio_to_bf16 == 0.5);
}

TEST_CASE("an FP8 cache allocates disjoint K, V and scale regions per layer; others have no scales") {
  const model_config stories = stories260k_config();
  auto fp8 = kv_cache::create(kv_cache_layout::for_tokens(stories, dtype::fp8_e4m3, 16, 100));
  REQUIRE(fp8.ok());
  kv_cache& cache = **fp8;
  const std::int64_t rows = cache.layout().num_blocks * stories.num_kv_heads * 16;  // [blocks, kv heads, 16]
  // Fill each region with its own byte and check nothing overlaps.
  for (std::int64_t layer = 0; layer < stories.num_layers; ++layer) {
    std::memset(cache.keys(layer), 1, static_cast<std::size_t>(rows * stories.head_dim));
    std::memset(cache.values(layer), 2, static_cast<std::size_t>(rows * stories.head_dim));
    std::memset(cache.key_scales(layer), 3, static_cast<std::size_t>(rows) * sizeof(float));
    std::memset(cache.value_scales(layer), 4, static_cast<std::size_t>(rows) * sizeof(float));
  }
  for (std::int64_t layer = 0; layer < stories.num_layers; ++layer) {
    const auto* k = static_cast<const unsigned char*>(cache.keys(layer));
    const auto* v = static_cast<const unsigned char*>(cache.values(layer));
    const auto* ks = reinterpret_cast<const unsigned char*>(cache.key_scales(layer));
    const auto* vs = reinterpret_cast<const unsigned char*>(cache.value_scales(layer));
    CHECK((k[0] == 1 && k[rows * stories.head_dim - 1] == 1));
    CHECK((v[0] == 2 && v[rows * stories.head_dim - 1] == 2));
    CHECK((ks[0] == 3 && ks[rows * 4 - 1] == 3));
    CHECK((vs[0] == 4 && vs[rows * 4 - 1] == 4));
  }

  auto bf16 = kv_cache::create(kv_cache_layout::for_tokens(stories, dtype::bf16, 16, 100));
  REQUIRE(bf16.ok());
  CHECK((*bf16)->key_scales(0) == nullptr);
  CHECK((*bf16)->value_scales(0) == nullptr);
}

TEST_CASE("KV dtype names, and auto as the model's own dtype") {
  CHECK_FALSE(parse_kv_cache_dtype("auto")->has_value());
  CHECK(**parse_kv_cache_dtype("fp8") == dtype::fp8_e4m3);
  CHECK(**parse_kv_cache_dtype("fp8_e4m3") == dtype::fp8_e4m3);
  CHECK(**parse_kv_cache_dtype("bf16") == dtype::bf16);
  CHECK(**parse_kv_cache_dtype("f16") == dtype::f16);
  CHECK(**parse_kv_cache_dtype("f32") == dtype::f32);
  CHECK(parse_kv_cache_dtype("int4").error().code() == edge::status_code::invalid_argument);
  CHECK(parse_kv_cache_dtype("").error().code() == edge::status_code::invalid_argument);

  auto stories = load_model({.path = edge::testing::stories260k_dir() / "stories260K.gguf"});
  REQUIRE(stories.ok());
  CHECK(auto_kv_cache_dtype(**stories) == dtype::f32);
  CHECK(resolve_kv_cache_dtype(dtype::fp8_e4m3, **stories) == dtype::fp8_e4m3);

  edge::testing::temp_dir dir;
  for (dtype weights : {dtype::bf16, dtype::f16}) {
    CAPTURE(edge::kernels::to_string(weights));
    const auto path = dir / (std::string(edge::kernels::to_string(weights)) + ".gguf");
    REQUIRE(write_synthetic_model({.preset = "tiny", .format = synthetic_format::gguf, .seed = 1, .dtype = weights,
                                   .out = path})
                .ok());
    auto m = load_model({.path = path});
    REQUIRE(m.ok());
    CHECK(resolve_kv_cache_dtype(std::nullopt, **m) == weights);
  }
}

TEST_CASE("a latent cache at Kimi K2's shape: one row of latent + RoPE key per token and layer, FP8 >= 1.98x bf16") {
  const model_config& kimi = preset("kimi-k2");
  REQUIRE(kimi.mla.has_value());
  const kv_cache_layout rows = kv_cache_layout::rows_of(kimi);
  CHECK(rows.num_kv_heads == 1);
  CHECK(rows.head_dim == 512 + 64);
  CHECK(rows.value_dim == 0);  // no V pool: the values are the latents
  // 61 layers × (576 codes + one f32 scale) against 61 × 576 × 2 bytes.
  CHECK(kv_cache_layout::for_budget(kimi, dtype::fp8_e4m3, 16, two_gib).bytes_per_token() == 61 * (576 + 4));
  CHECK(kv_cache_layout::for_budget(kimi, dtype::bf16, 16, two_gib).bytes_per_token() == 61 * 576 * 2);
  const std::size_t budget = std::size_t{64} << 30;
  const kv_cache_capacity fp8 = kv_cache_capacity_for(kimi, dtype::fp8_e4m3, 16, budget);
  CHECK(fp8.ratio_to_bf16 == doctest::Approx(1152.0 / 580.0));
  CHECK(static_cast<double>(fp8.tokens) >= 1.98 * static_cast<double>(fp8.bf16_tokens));
  // Against the per-head K and V the same 64 heads would cache: the latent's whole point.
  model_config mha = kimi;
  mha.mla.reset();
  mha.num_kv_heads = 64;
  mha.head_dim = 192;
  CHECK(kv_cache_layout::for_budget(mha, dtype::bf16, 16, budget).bytes_per_token() / rows.num_layers ==
        2 * 64 * 192 * 2);
}

TEST_CASE("GLM-5's latent cache keeps the DSA indexer's key beside each row, with its own scale") {
  const model_config& glm = preset("glm-5");
  const kv_cache_layout rows = kv_cache_layout::rows_of(glm);
  CHECK(rows.head_dim == 576);
  CHECK(rows.value_dim == 128);
  CHECK(kv_cache_layout::for_budget(glm, dtype::fp8_e4m3, 16, two_gib).bytes_per_token() == 78 * (576 + 4 + 128 + 4));
  auto cache = kv_cache::create(kv_cache_layout::for_tokens(preset("glm-5-tiny"), dtype::fp8_e4m3, 16, 64));
  REQUIRE(cache.ok());
  kv_cache& c = **cache;
  for (std::int64_t layer = 0; layer < c.layout().num_layers; ++layer) {
    CHECK(c.keys(layer) != nullptr);
    CHECK(c.values(layer) != nullptr);
    CHECK(c.key_scales(layer) != nullptr);
    CHECK(c.value_scales(layer) != nullptr);
  }
  auto plain = kv_cache::create(kv_cache_layout::for_tokens(preset("deepseek-v3-tiny"), dtype::bf16, 16, 64));
  REQUIRE(plain.ok());
  CHECK((*plain)->values(0) == nullptr);
  CHECK((*plain)->value_scales(0) == nullptr);
}
