// `edgeinfer quantize`'s writer: a model quantized on load, written as compressed-tensors and
// loaded back as stored, holds the same codes and scales and computes the same logits. From a
// Hugging Face source the logits are bit-identical; from GGUF / llama2.c sources the Q/K rows go
// back to the half-split order, which sums attention's dot products in another order, so the
// logits agree to rounding.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <iterator>

#include "edge/backend/model/model.h"
#include "edge/backend/model/quantized_checkpoint.h"
#include "edge/backend/model/synthetic.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/engine/generator.h"
#include "test_support.h"

namespace {

using namespace edge::backend;
using edge::kernels::weight_format;

struct loaded {
  std::unique_ptr<model> m;
  std::unique_ptr<kv_cache> cache;
  std::unique_ptr<cpu_executor> exec;
};

loaded load(const load_options& options) {
  loaded l;
  auto m = load_model(options);
  REQUIRE_MESSAGE(m.ok(), m.error().message());
  l.m = std::move(m).value();
  auto c = kv_cache::create(kv_cache_layout::for_tokens(l.m->config, edge::kernels::dtype::f32, 16, 512));
  REQUIRE(c.ok());
  l.cache = std::move(c).value();
  auto e = cpu_executor::create(*l.m, *l.cache, nullptr, {.max_batch_tokens = 64, .max_sequences = 4});
  REQUIRE_MESSAGE(e.ok(), e.error().message());
  l.exec = std::move(e).value();
  return l;
}

// Logits for every position of the prompt ([prompt, vocab]), one forward pass per position.
std::vector<float> logits_along(loaded& l, const std::vector<token_id>& prompt) {
  const std::int64_t vocab = l.m->config.vocab_size;
  kv_block_pool pool(l.cache->layout().num_blocks);
  std::vector<std::int32_t> blocks;
  for (int i = 0; i < 4; ++i) blocks.push_back(*pool.allocate());
  std::vector<float> all;
  for (std::size_t p = 0; p < prompt.size(); ++p) {
    batch_plan plan;
    plan.entries.push_back({.tokens = {&prompt[p], 1}, .start_position = static_cast<std::int64_t>(p),
                            .block_table = blocks, .compute_logits = true});
    std::vector<float> row(static_cast<std::size_t>(vocab));
    REQUIRE(l.exec->forward(plan, row).ok());
    all.insert(all.end(), row.begin(), row.end());
  }
  return all;
}

std::filesystem::path write(const model& m, const load_options& source, const std::filesystem::path& out) {
  auto written = write_quantized_checkpoint(m, {.source = source, .out = out});
  REQUIRE_MESSAGE(written.ok(), written.error().message());
  return *written;
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool same_matrix(const weight_matrix& a, const weight_matrix& b) {
  const auto values = edge::kernels::weight_values_bytes(a.format, a.rows(), a.cols());
  const auto scales = edge::kernels::weight_scale_count(a.format, a.rows(), a.cols(), a.group_size);
  return a.format == b.format && a.shape == b.shape && a.group_size == b.group_size &&
         std::memcmp(a.data, b.data, static_cast<std::size_t>(values)) == 0 &&
         (scales == 0 || std::memcmp(a.scales, b.scales, static_cast<std::size_t>(scales) * sizeof(float)) == 0);
}

const std::vector<token_id> prompt = {1, 17, 42, 99, 7, 250, 3, 64, 128, 5, 11, 300};

}  // namespace

TEST_CASE("a quantized Hugging Face model written and loaded back has the same weights and logits, bit for bit") {
  edge::testing::temp_dir dir;
  for (const char* preset : {"tiny", "tiny-qwen2"}) {
    const auto source = dir / (std::string(preset) + "-bf16");
    REQUIRE(write_synthetic_model({.preset = preset, .seed = 3, .out = source}).ok());
    for (const weight_format format : {weight_format::int4, weight_format::fp8_e4m3}) {
      CAPTURE(preset);
      CAPTURE(edge::kernels::to_string(format));
      const load_options options{.path = source, .weight_dtype = format};
      loaded on_load = load(options);
      const auto out = write(*on_load.m, options, dir / (std::string(preset) + "-" + std::string(to_string(format))));
      loaded stored = load({.path = out});

      CHECK(projection_format(stored.m->weights) == format);
      CHECK(stored.m->synthetic);
      for (std::size_t i = 0; i < stored.m->weights.layers.size(); ++i) {
        const auto& a = on_load.m->weights.layers[i];
        const auto& b = stored.m->weights.layers[i];
        for (auto [x, y] : {std::pair{&a.wq, &b.wq}, {&a.wk, &b.wk}, {&a.wv, &b.wv}, {&a.wo, &b.wo},
                            {&a.w_gate, &b.w_gate}, {&a.w_up, &b.w_up}, {&a.w_down, &b.w_down}}) {
          CAPTURE(x->name);
          CHECK(same_matrix(*x, *y));
        }
      }
      const auto expected = logits_along(on_load, prompt);
      const auto got = logits_along(stored, prompt);
      REQUIRE(expected.size() == got.size());
      CHECK(std::memcmp(expected.data(), got.data(), expected.size() * sizeof(float)) == 0);

      const std::string config = read_text(out / "config.json");
      CHECK(config.find("\"quant_method\": \"compressed-tensors\"") != std::string::npos);
      CHECK(config.find(format == weight_format::int4 ? "\"format\": \"pack-quantized\"" : "\"format\": \"float-quantized\"") !=
            std::string::npos);
      CHECK(std::filesystem::exists(out / "tokenizer.json"));
      // The tokenizer came along: the same ids for the same text.
      CHECK(stored.m->tok->encode("a small test", {}) == on_load.m->tok->encode("a small test", {}));
    }
  }
}

TEST_CASE("stories260K quantized from GGUF and llama2.c: Q/K rows back in half-split order, the same logits") {
  edge::testing::temp_dir dir;
  for (const char* file : {"stories260K.gguf", "stories260K.bin"}) {
    for (const weight_format format : {weight_format::int4, weight_format::fp8_e4m3}) {
      CAPTURE(file);
      CAPTURE(edge::kernels::to_string(format));
      const load_options options{.path = edge::testing::stories260k_dir() / file, .weight_dtype = format};
      loaded on_load = load(options);
      const auto out = write(*on_load.m, options, dir / (std::string(file) + std::string(to_string(format))));
      loaded stored = load({.path = out});
      CHECK(stored.m->config.rope == rope_layout::half_split);
      CHECK(projection_format(stored.m->weights) == format);
      CHECK(stored.m->tok->encode("Once upon a time", {}) == on_load.m->tok->encode("Once upon a time", {}));
      // V, O and the feed-forward rows keep their order: the same bytes.
      CHECK(same_matrix(on_load.m->weights.layers[0].wv, stored.m->weights.layers[0].wv));
      CHECK(same_matrix(on_load.m->weights.layers[0].w_down, stored.m->weights.layers[0].w_down));

      const auto story = on_load.m->tok->encode("Once upon a time, there was a little girl named Lily.", {});
      const auto expected = logits_along(on_load, story);
      const auto got = logits_along(stored, story);
      REQUIRE(expected.size() == got.size());
      double max_diff = 0, max_value = 0;
      for (std::size_t i = 0; i < expected.size(); ++i) {
        max_diff = std::max(max_diff, double(std::fabs(expected[i] - got[i])));
        max_value = std::max(max_value, double(std::fabs(expected[i])));
      }
      CHECK(max_value > 1.0);
      CHECK(max_diff <= 1e-5 * max_value);
    }
  }
}

TEST_CASE("the writer refuses unquantized models and folders that are not empty") {
  edge::testing::temp_dir dir;
  const load_options plain{.path = edge::testing::stories260k_dir() / "stories260K.gguf"};
  auto m = load_model(plain);
  REQUIRE(m.ok());
  auto refused = write_quantized_checkpoint(**m, {.source = plain, .out = dir / "plain"});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code() == edge::status_code::invalid_argument);
  CHECK(refused.error().message().find("f32") != std::string::npos);

  const load_options int4{.path = plain.path, .weight_dtype = weight_format::int4};
  auto q = load_model(int4);
  REQUIRE(q.ok());
  std::ofstream(dir / "busy.txt") << "mine";
  auto busy = write_quantized_checkpoint(**q, {.source = int4, .out = dir.path()});
  REQUIRE_FALSE(busy.ok());
  CHECK(busy.error().code() == edge::status_code::failed_precondition);
  CHECK(read_text(dir / "busy.txt") == "mine");
}
