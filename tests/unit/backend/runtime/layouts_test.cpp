// One network in two layouts: make-model writes the same seeded weights as a Hugging Face
// folder (half-split RoPE, Q/K rows as trained) and as a GGUF (adjacent-pair RoPE, Q/K rows
// permuted as llama.cpp's converter does; Qwen2 GGUFs keep half-split). The forward pass must
// give the same logits for both, which checks both RoPE layouts, the permutation and (for
// Qwen2) the Q/K/V biases end to end.
#include <doctest/doctest.h>

#include <cmath>

#include "edge/backend/model/model.h"
#include "edge/backend/model/synthetic.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/engine/generator.h"
#include "test_support.h"

namespace {

using namespace edge::backend;

struct loaded {
  std::unique_ptr<model> m;
  std::unique_ptr<kv_cache> cache;
  std::unique_ptr<cpu_executor> exec;
};

loaded load(const std::filesystem::path& path) {
  loaded l;
  auto m = load_model({.path = path});
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

// Logits for every position of the prompt, one forward pass per position.
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

}  // namespace

TEST_CASE("the Hugging Face and GGUF forms of one synthetic model compute the same logits") {
  edge::testing::temp_dir dir;
  for (const char* preset : {"tiny", "tiny-qwen2"}) {
    CAPTURE(preset);
    const auto hf_path = dir / (std::string(preset) + "-hf");
    const auto gguf_path = dir / (std::string(preset) + ".gguf");
    for (auto [format, out] : {std::pair{synthetic_format::safetensors, hf_path}, std::pair{synthetic_format::gguf, gguf_path}}) {
      auto written = write_synthetic_model({.preset = preset, .format = format, .seed = 5,
                                            .dtype = edge::kernels::dtype::f32, .out = out});
      REQUIRE_MESSAGE(written.ok(), written.error().message());
    }
    loaded hf = load(hf_path);
    loaded gguf = load(gguf_path);
    CHECK(hf.m->config.rope == rope_layout::half_split);
    CHECK(gguf.m->config.rope == (std::string(preset) == "tiny" ? rope_layout::adjacent_pairs : rope_layout::half_split));
    const std::vector<token_id> prompt = {1, 17, 42, 99, 7, 250, 3, 64, 128, 5, 11, 300};
    const auto a = logits_along(hf, prompt);
    const auto b = logits_along(gguf, prompt);
    REQUIRE(a.size() == b.size());
    double max_diff = 0, max_value = 0;
    for (std::size_t i = 0; i < a.size(); ++i) {
      max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
      max_value = std::max(max_value, double(std::fabs(a[i])));
    }
    CHECK(max_value > 0.0);
    CHECK(max_diff <= 1e-5 * std::max(1.0, max_value));
  }
}
