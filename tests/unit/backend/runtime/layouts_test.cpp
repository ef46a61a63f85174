// One network in two layouts: make-model writes the same seeded weights as a Hugging Face
// folder (half-split RoPE, Q/K rows as trained) and as a GGUF (adjacent-pair RoPE, Q/K rows
// permuted as llama.cpp's converter does; Qwen2 GGUFs keep half-split). The forward pass must
// give the same logits for both, which checks both RoPE layouts, the permutation and (for
// Qwen2) the Q/K/V biases end to end. Likewise one GLM-5 network with and without its DSA
// indexer, and one latent attention network prefilled at once or a token at a time. Also: how
// stage_step pads a CUDA-graph batch, what stage_sampling writes, and how the forward buffers
// are carved.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <sstream>

#include "edge/backend/model/model.h"
#include "edge/backend/model/synthetic.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/runtime/forward.h"
#include "kernels/mla_attention/mla_attention.h"
#include "edge/backend/engine/generator.h"
#include "backend/model/synthetic_test_support.h"
#include "test_support.h"

namespace {

using namespace edge::backend;

struct loaded {
  std::unique_ptr<model> m;
  std::unique_ptr<kv_cache> cache;
  std::unique_ptr<cpu_executor> exec;
};

loaded load(const std::filesystem::path& path, load_options options = {},
            edge::kernels::dtype kv = edge::kernels::dtype::f32) {
  loaded l;
  options.path = path;
  auto m = load_model(options);
  REQUIRE_MESSAGE(m.ok(), m.error().message());
  l.m = std::move(m).value();
  auto c = kv_cache::create(kv_cache_layout::for_tokens(l.m->config, kv, 16, 512));
  REQUIRE(c.ok());
  l.cache = std::move(c).value();
  auto e = cpu_executor::create(*l.m, *l.cache, nullptr, {.max_batch_tokens = 64, .max_sequences = 4});
  REQUIRE_MESSAGE(e.ok(), e.error().message());
  l.exec = std::move(e).value();
  return l;
}

// The synthetic "tiny" model (f32, seed 4) written under `dir` and loaded.
loaded load_tiny(const edge::testing::temp_dir& dir) {
  const auto path = dir / "tiny";
  REQUIRE(write_synthetic_model({.preset = "tiny", .seed = 4, .dtype = edge::kernels::dtype::f32, .out = path}).ok());
  return load(path);
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

// Largest difference relative to the largest value (at least 1).
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double max_diff = 0, max_value = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, double(std::fabs(a[i] - b[i])));
    max_value = std::max(max_value, double(std::fabs(a[i])));
  }
  REQUIRE(max_value > 0.0);
  return max_diff / std::max(1.0, max_value);
}

}  // namespace

TEST_CASE("the stacked Q/K/V and gate/up layout computes the logits of the separate matrices") {
  edge::testing::temp_dir dir;
  const std::vector<token_id> prompt = {1, 17, 42, 99, 7, 250, 3, 64, 128, 5, 11, 300};
  for (const char* preset : {"tiny", "tiny-qwen2", "tiny-qwen3"}) {
    CAPTURE(preset);
    const auto path = dir / preset;
    auto written = write_synthetic_model({.preset = preset, .format = synthetic_format::safetensors, .seed = 9,
                                          .dtype = edge::kernels::dtype::bf16, .out = path});
    REQUIRE_MESSAGE(written.ok(), written.error().message());
    for (const auto weights : {edge::kernels::weight_format::f32, edge::kernels::weight_format::int4,
                               edge::kernels::weight_format::fp8_e4m3}) {
      CAPTURE(edge::kernels::to_string(weights));
      loaded stacked = load(path, {.weight_dtype = weights});
      REQUIRE(stacked.m->weights.layers[0].wqkv.present());
      // The same weights with the stacked matrices hidden: the parts (views of the same rows)
      // run one by one.
      loaded separate = load(path, {.weight_dtype = weights});
      for (layer_weights& l : separate.m->weights.layers) {
        l.wqkv = {};
        l.w_gate_up = {};
      }
      auto exec = cpu_executor::create(*separate.m, *separate.cache, nullptr, {.max_batch_tokens = 64, .max_sequences = 4});
      REQUIRE(exec.ok());
      separate.exec = std::move(exec).value();
      CHECK(relative_difference(logits_along(stacked, prompt), logits_along(separate, prompt)) <= 1e-5);
    }
  }
}

TEST_CASE("forward_sample samples on the executor and copies only the rows asked for") {
  edge::testing::temp_dir dir;
  loaded l = load_tiny(dir);
  const std::int64_t vocab = l.m->config.vocab_size;
  const std::vector<token_id> a = {1, 5, 9}, b = {2, 8}, c = {3};
  const std::vector<std::int32_t> ta = {0}, tb = {1}, tc = {2}, td = {3};
  batch_plan plan;
  plan.entries.push_back({.tokens = a, .start_position = 0, .block_table = ta, .compute_logits = true});
  plan.entries.push_back({.tokens = b, .start_position = 0, .block_table = tb, .compute_logits = false});
  plan.entries.push_back({.tokens = b, .start_position = 0, .block_table = tc, .compute_logits = true});
  plan.entries.push_back({.tokens = c, .start_position = 0, .block_table = td, .compute_logits = true});
  std::vector<float> expected(static_cast<std::size_t>(3 * vocab));
  REQUIRE(l.exec->forward(plan, expected).ok());
  const auto row = [&](std::size_t r) {
    return std::vector<float>(expected.begin() + static_cast<std::ptrdiff_t>(r * vocab),
                              expected.begin() + static_cast<std::ptrdiff_t>((r + 1) * vocab));
  };

  // Row 0 greedy on the executor; row 1 sampled with a draw and copied; row 2 left to the caller.
  const std::vector<row_sampling> rows = {
      {.sample = true, .config = {.temperature = 0.0f}},
      {.sample = true, .config = {.temperature = 1.0f, .top_k = 5, .uniform = 0.3f}, .copy_logits = true},
      {.sample = false, .copy_logits = true}};
  std::vector<std::int32_t> tokens(3, -7);
  std::vector<float> copied(static_cast<std::size_t>(2 * vocab));
  REQUIRE(l.exec->forward_sample(plan, rows, tokens, copied, {}).ok());
  CHECK(tokens[0] == edge::kernels::argmax(row(0)));
  CHECK(tokens[2] == -7);
  CHECK(std::vector<float>(copied.begin(), copied.begin() + vocab) == row(1));
  CHECK(std::vector<float>(copied.begin() + vocab, copied.end()) == row(2));
  // The draw is the sampling kernel's on that row with that config.
  std::vector<float> scratch = row(1);
  std::int32_t reference = -1;
  REQUIRE(edge::kernels::run_sampling({.logits = scratch.data(), .config = &rows[1].config, .out = &reference,
                                       .rows = 1, .vocab = vocab},
                                      {})
              .ok());
  CHECK(tokens[1] == reference);

  // Arguments that do not fit the plan are refused.
  std::vector<float> short_buffer(static_cast<std::size_t>(vocab));
  CHECK(l.exec->forward_sample(plan, rows, tokens, short_buffer, {}).code() == edge::status_code::invalid_argument);
  CHECK(l.exec->forward_sample(plan, std::span(rows).first(2), std::span(tokens).first(2), copied, {}).code() ==
        edge::status_code::invalid_argument);
}

TEST_CASE("the Hugging Face and GGUF forms of one synthetic model compute the same logits") {
  edge::testing::temp_dir dir;
  for (const char* preset : {"tiny", "tiny-qwen2", "tiny-qwen3"}) {
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
    CHECK(relative_difference(logits_along(hf, prompt), logits_along(gguf, prompt)) <= 1e-5);
  }
}

TEST_CASE("stage_step: padding entries of a graph batch read the pad block and write nothing") {
  const kv_cache_layout kv{.num_layers = 1, .num_kv_heads = 1, .head_dim = 4, .block_size = 16, .num_blocks = 8};
  const std::int64_t pad_block = kv.num_blocks;
  const std::int64_t table_blocks = 4;
  const std::vector<std::int32_t> ids = {5};
  const std::vector<std::int32_t> table = {3};
  batch_plan plan;
  plan.entries.push_back({.tokens = ids, .start_position = 2, .block_table = table, .compute_logits = true});
  constexpr std::int64_t seqs = 4;  // one entry padded to a graph batch of 4
  std::vector<std::int32_t> out_ids(seqs), positions(seqs), seq(seqs), tables(seqs * table_blocks), table_begin(seqs + 1),
      seq_begin(seqs + 1);
  std::vector<std::int64_t> slots(seqs), last_token(seqs);
  const auto staged = stage_step(plan, seqs, 32, kv, table_blocks, pad_block,
                                 {.ids = out_ids.data(), .positions = positions.data(), .seq = seq.data(),
                                  .slots = slots.data(), .block_tables = tables.data(), .table_begin = table_begin.data(),
                                  .seq_begin = seq_begin.data(), .last_token = last_token.data()});
  REQUIRE_MESSAGE(staged.ok(), staged.error().message());
  CHECK(staged->tokens == seqs);
  CHECK(staged->table_entries == seqs);
  CHECK(slots[0] == 3 * kv.block_size + 2);
  for (std::int64_t t = 1; t < seqs; ++t) {
    CAPTURE(t);
    CHECK(slots[static_cast<std::size_t>(t)] == -1);
    CHECK(positions[static_cast<std::size_t>(t)] == 0);
    CHECK(tables[static_cast<std::size_t>(table_begin[static_cast<std::size_t>(t)])] == pad_block);
  }
}

TEST_CASE("stage_step: block tables are ragged, each entry's blocks up to its last position, one after another") {
  const kv_cache_layout kv{.num_layers = 1, .num_kv_heads = 1, .head_dim = 4, .block_size = 4, .num_blocks = 16};
  const std::int64_t table_blocks = 8;  // a context of 32 positions
  // A decode token at position 9 (3 blocks of a 5-block table: only 3 are staged), a prefill
  // chunk of 5 tokens from position 0 (2 blocks), and a decode token at position 0 (1 block).
  const std::vector<std::int32_t> one = {7};
  const std::vector<std::int32_t> five = {1, 2, 3, 4, 5};
  const std::vector<std::int32_t> long_table = {9, 2, 11, 14, 6};
  const std::vector<std::int32_t> short_table = {12, 13};
  const std::vector<std::int32_t> single = {0};
  batch_plan plan;
  plan.entries.push_back({.tokens = one, .start_position = 9, .block_table = long_table, .compute_logits = true});
  plan.entries.push_back({.tokens = five, .start_position = 0, .block_table = short_table, .compute_logits = true});
  plan.entries.push_back({.tokens = one, .start_position = 0, .block_table = single, .compute_logits = true});
  constexpr std::int64_t seqs = 3;
  const std::int64_t tokens = plan.total_tokens();
  std::vector<std::int32_t> ids(static_cast<std::size_t>(tokens)), positions(ids.size()), seq(ids.size());
  std::vector<std::int32_t> tables(seqs * table_blocks, -7), table_begin(seqs + 1), seq_begin(seqs + 1);
  std::vector<std::int64_t> slots(ids.size()), last_token(seqs);
  const auto staged = stage_step(plan, 0, 32, kv, table_blocks, kv.num_blocks,
                                 {.ids = ids.data(), .positions = positions.data(), .seq = seq.data(),
                                  .slots = slots.data(), .block_tables = tables.data(), .table_begin = table_begin.data(),
                                  .seq_begin = seq_begin.data(), .last_token = last_token.data()});
  REQUIRE_MESSAGE(staged.ok(), staged.error().message());
  CHECK(table_begin == std::vector<std::int32_t>{0, 3, 5, 6});
  CHECK(staged->table_entries == 6);
  CHECK(std::vector<std::int32_t>(tables.begin(), tables.begin() + 6) == std::vector<std::int32_t>{9, 2, 11, 12, 13, 0});
  CHECK(tables[6] == -7);  // nothing written past the last entry's blocks
  CHECK(slots[0] == 11 * kv.block_size + 1);
  CHECK(slots[5] == 13 * kv.block_size + 0);

  // An entry whose positions reach past the limit is refused, whatever its table holds.
  const std::vector<std::int32_t> nine(9, 1);
  batch_plan too_long;
  too_long.entries.push_back({.tokens = one, .start_position = 32, .block_table = nine, .compute_logits = true});
  CHECK_FALSE(stage_step(too_long, 0, 32, kv, table_blocks, kv.num_blocks,
                         {.ids = ids.data(), .positions = positions.data(), .seq = seq.data(), .slots = slots.data(),
                          .block_tables = tables.data(), .table_begin = table_begin.data(),
                          .seq_begin = seq_begin.data(), .last_token = last_token.data()})
                  .ok());
}

namespace {

// A copy of `folder` whose config.json has each `from` replaced by its `to`.
std::filesystem::path edited_copy(const std::filesystem::path& folder, const std::filesystem::path& to_folder,
                                  const std::vector<std::pair<std::string, std::string>>& edits) {
  std::filesystem::copy(folder, to_folder, std::filesystem::copy_options::recursive);
  std::ifstream in(to_folder / "config.json");
  std::stringstream text;
  text << in.rdbuf();
  std::string config = text.str();
  for (const auto& [from, to] : edits) {
    const auto at = config.find(from);
    REQUIRE_MESSAGE(at != std::string::npos, from);
    config.replace(at, from.size(), to);
  }
  std::ofstream(to_folder / "config.json", std::ios::trunc) << config;
  return to_folder;
}

const std::vector<token_id> twelve = {1, 17, 42, 99, 7, 250, 3, 64, 128, 5, 11, 300};

}  // namespace

TEST_CASE("DSA: up to index_topk positions GLM-5 is dense latent attention exactly; past it the indexer's choice counts") {
  edge::testing::temp_dir dir;
  const auto glm = edge::testing::make_synthetic(dir / "glm-5-tiny", "glm-5-tiny", synthetic_format::safetensors, 5,
                                                 edge::kernels::dtype::f32);
  // The same weights read as DeepSeek-V3 (the indexer's tensors left unread), and as GLM-5 with
  // an indexer that keeps more positions than the prompt has.
  const auto dense_path = edited_copy(glm, dir / "as-deepseek", {{"GlmMoeDsaForCausalLM", "DeepseekV3ForCausalLM"}});
  const auto wide_path = edited_copy(glm, dir / "wide", {{"\"index_topk\": 8", "\"index_topk\": 64"}});
  loaded sparse = load(glm);
  loaded dense = load(dense_path);
  loaded wide = load(wide_path);
  REQUIRE(sparse.m->config.dsa.has_value());
  REQUIRE_FALSE(dense.m->config.dsa.has_value());
  const std::vector<float> s = logits_along(sparse, twelve);
  const std::vector<float> d = logits_along(dense, twelve);
  CHECK(logits_along(wide, twelve) == d);
  const auto vocab = static_cast<std::size_t>(sparse.m->config.vocab_size);
  constexpr std::size_t top_k = 8;
  CHECK(std::vector<float>(s.begin(), s.begin() + top_k * vocab) == std::vector<float>(d.begin(), d.begin() + top_k * vocab));
  CHECK(relative_difference(std::vector<float>(s.begin() + top_k * vocab, s.end()),
                            std::vector<float>(d.begin() + top_k * vocab, d.end())) > 1e-6);
}

TEST_CASE("latent attention: a prompt prefilled at once (expanded) gives the logits of a token at a time (absorbed), over f32, bf16 and FP8 latents") {
  edge::testing::temp_dir dir;
  for (const char* preset : {"deepseek-v3-tiny", "deepseek-v3-tiny-qproj", "glm-5-tiny"}) {
    CAPTURE(preset);
    const auto path = edge::testing::make_synthetic(dir / preset, preset, synthetic_format::safetensors, 5,
                                                    edge::kernels::dtype::f32);
    std::vector<float> reference;
    for (const auto kv : {edge::kernels::dtype::f32, edge::kernels::dtype::bf16, edge::kernels::dtype::fp8_e4m3}) {
      CAPTURE(edge::kernels::to_string(kv));
      loaded l = load(path, {}, kv);
      // The prompt at once takes the expanded form, a token at a time the absorbed one.
      const mla_plan m = plan_model(l.m->config)->layers[0].attention.mla;  // a copy: the plan is a temporary
      REQUIRE(edge::kernels::mla_expanded_pays(12, 12, m.kv_lora_rank, m.rope, m.nope, m.v_head_dim));
      REQUIRE_FALSE(edge::kernels::mla_expanded_pays(1, 12, m.kv_lora_rank, m.rope, m.nope, m.v_head_dim));
      const std::vector<float> stepwise = logits_along(l, twelve);
      // The whole prompt as one entry (a fresh cache): its last row.
      loaded once = load(path, {}, kv);
      kv_block_pool pool(once.cache->layout().num_blocks);
      batch_plan plan;
      const std::vector<std::int32_t> blocks = {*pool.allocate()};
      plan.entries.push_back({.tokens = twelve, .start_position = 0, .block_table = blocks, .compute_logits = true});
      const auto vocab = static_cast<std::size_t>(l.m->config.vocab_size);
      std::vector<float> last(vocab);
      REQUIRE(once.exec->forward(plan, last).ok());
      CHECK(relative_difference(last, std::vector<float>(stepwise.end() - static_cast<std::ptrdiff_t>(vocab), stepwise.end())) <= 1e-5);
      if (kv == edge::kernels::dtype::f32) {
        reference = stepwise;
      } else {
        // 16-bit and FP8 latents move the logits a little (measured: bf16 0.8-1.5e-3, FP8 1.0-1.3e-2
        // of the largest logit), not the model; GLM-5's FP8 index keys may also change which of
        // two near-equal positions the indexer keeps (6.7e-2 here).
        const bool indexed = l.m->config.dsa.has_value();
        CHECK(relative_difference(stepwise, reference) <=
              (kv == edge::kernels::dtype::bf16 ? 0.005 : (indexed ? 0.1 : 0.025)));
      }
    }
  }
}

TEST_CASE("forward_sample reads the token masks its mask filler writes, filled once before any draw") {
  edge::testing::temp_dir dir;
  loaded l = load_tiny(dir);
  const std::int64_t vocab = l.m->config.vocab_size;
  const std::vector<token_id> a = {1, 5, 9}, c = {3};
  const std::vector<std::int32_t> ta = {0}, tc = {1};
  batch_plan plan;
  plan.entries.push_back({.tokens = a, .start_position = 0, .block_table = ta, .compute_logits = true});
  plan.entries.push_back({.tokens = c, .start_position = 0, .block_table = tc, .compute_logits = true});
  std::vector<float> logits(static_cast<std::size_t>(2 * vocab));
  REQUIRE(l.exec->forward(plan, logits).ok());
  const std::span<const float> row0 = std::span<const float>(logits).first(static_cast<std::size_t>(vocab));
  // The one token row 0's mask allows: the least likely, which greedy would never pick unmasked.
  const auto least = static_cast<std::int32_t>(std::min_element(row0.begin(), row0.end()) - row0.begin());
  REQUIRE(least != edge::kernels::argmax(row0));

  // Until the filler runs, the mask bans every token.
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(edge::kernels::allowed_words(vocab)), 0u);
  const std::vector<row_sampling> rows = {{.sample = true, .config = {.temperature = 0.0f}, .allowed = mask},
                                          {.sample = true, .config = {.temperature = 0.0f}}};
  int fills = 0;
  const edge::backend::mask_filler fill = [&] {
    ++fills;
    mask[static_cast<std::size_t>(least) / 32] |= 1u << (least % 32);
  };
  std::vector<std::int32_t> tokens(2, -7);
  REQUIRE(l.exec->forward_sample(plan, rows, tokens, {}, fill).ok());
  CHECK(fills == 1);
  CHECK(tokens[0] == least);
  CHECK(tokens[1] == edge::kernels::argmax(std::span<const float>(logits).subspan(static_cast<std::size_t>(vocab))));
}

TEST_CASE("stage_sampling: sampled rows get their settings, biases one after another and mask rows; the rest a greedy draw") {
  constexpr std::int64_t vocab = 40;  // two mask words
  const std::vector<edge::kernels::logit_bias> first = {{.id = 3, .bias = 1.0f}, {.id = 7, .bias = -2.0f}};
  const std::vector<edge::kernels::logit_bias> third = {{.id = 9, .bias = 0.5f}};
  const std::vector<std::uint32_t> mask(2, 5u);
  const std::vector<row_sampling> rows = {
      {.sample = true, .config = {.temperature = 0.7f, .top_k = 5}, .allowed = mask, .bias = first},
      {.sample = false, .config = {.temperature = 0.9f}, .bias = third},
      {.sample = true, .config = {.temperature = 1.0f}, .bias = third}};
  std::vector<edge::kernels::sampling_row> config(4);
  std::vector<edge::kernels::logit_bias> biases(4 * static_cast<std::size_t>(max_logit_bias_entries));
  const auto staged = stage_sampling(rows, 4, vocab, {.config = config.data(), .biases = biases.data()});
  REQUIRE_MESSAGE(staged.ok(), staged.error().message());
  CHECK(staged->bias_entries == 3);
  REQUIRE(staged->masks.size() == 1);
  CHECK(staged->masks[0].data() == mask.data());
  CHECK(config[0].temperature == 0.7f);
  CHECK(config[0].top_k == 5);
  CHECK(config[0].allowed_row == 0);
  CHECK(config[0].bias_begin == 0);
  CHECK(config[0].bias_count == 2);
  CHECK(config[2].allowed_row == -1);
  CHECK(config[2].bias_begin == 2);
  CHECK(config[2].bias_count == 1);
  CHECK(biases[1].id == 7);
  CHECK(biases[2].id == 9);
  // Row 1 is the caller's and row 3 has no settings: greedy, without biases or a mask.
  for (const std::size_t r : {std::size_t{1}, std::size_t{3}}) {
    CAPTURE(r);
    CHECK(config[r].temperature == 0.0f);
    CHECK(config[r].allowed_row == -1);
    CHECK(config[r].bias_count == 0);
  }

  const std::vector<std::uint32_t> short_mask(1, 0u);
  const std::vector<row_sampling> bad_mask = {{.sample = true, .allowed = short_mask}};
  CHECK_FALSE(stage_sampling(bad_mask, 1, vocab, {.config = config.data(), .biases = biases.data()}).ok());
  const std::vector<edge::kernels::logit_bias> too_many(static_cast<std::size_t>(max_logit_bias_entries) + 1);
  const std::vector<row_sampling> bad_bias = {{.sample = true, .bias = too_many}};
  CHECK_FALSE(stage_sampling(bad_bias, 1, vocab, {.config = config.data(), .biases = biases.data()}).ok());
}

TEST_CASE("forward buffers: one allocation holds every array, aligned and apart; each device's workspaces only on it") {
  edge::testing::temp_dir dir;
  const auto path = edge::testing::make_synthetic(dir / "glm-5-tiny", "glm-5-tiny", synthetic_format::safetensors, 5,
                                                  edge::kernels::dtype::f32);
  auto m = load_model({.path = path});
  REQUIRE_MESSAGE(m.ok(), m.error().message());
  auto plan = plan_model((*m)->config);
  REQUIRE(plan.ok());
  REQUIRE(plan->moe_layers() > 0);
  REQUIRE(plan->max_index_topk() > 0);
  for (const auto where : {edge::kernels::device::cpu, edge::kernels::device::cuda}) {
    const bool cuda = where == edge::kernels::device::cuda;
    CAPTURE(cuda);
    const forward_buffer_shape shape{.tokens = 24, .logits_rows = 6, .context = 256, .where = where};
    const std::size_t bytes = forward_buffer_bytes(*plan, shape);
    std::vector<std::byte> memory(bytes + forward_buffer_alignment);
    auto* base = memory.data() + (forward_buffer_alignment -
                                  reinterpret_cast<std::uintptr_t>(memory.data()) % forward_buffer_alignment);
    const forward_buffers b = carve_forward_buffers(*plan, shape, base);
    // Each array with its length in bytes, as forward.h's shape comments give them.
    const std::int64_t tokens = shape.tokens, rows = shape.logits_rows;
    const std::vector<std::pair<const void*, std::int64_t>> arrays = {
        {b.x, 4 * tokens * plan->hidden},
        {b.xn, 4 * tokens * plan->hidden},
        {b.qkv, 4 * tokens * plan->max_qkv_dim()},
        {b.attn, 4 * tokens * plan->max_q_dim()},
        {b.gate_up, 4 * tokens * 2 * plan->max_intermediate()},
        {b.last, 4 * rows * plan->hidden},
        {b.logits, 4 * rows * plan->vocab},
        {b.matmul_workspace, 4 * b.matmul_workspace_floats},
        {b.attention_workspace, 4 * b.attention_workspace_floats},
        {b.index_scores, 4 * b.index_scores_floats},
        {b.router_logits, 4 * tokens * plan->max_experts()},
        {b.route_weights, 4 * tokens * plan->max_top_k()},
        {b.route_experts, 4 * plan->moe_layers() * tokens * plan->max_top_k()},
        {b.expert_tokens, 4 * plan->moe_layers() * plan->max_experts()},
        {b.moe_workspace, 4 * b.moe_workspace_floats},
        {b.mla_query, 4 * tokens * plan->max_mla_query()},
        {b.latents, 4 * tokens * plan->max_mla_latents()},
        {b.index_query, 4 * tokens * plan->max_index_query()},
        {b.selected, 4 * tokens * plan->max_index_topk()},
        {b.selected_count, 4 * tokens},
        {b.mla_workspace, 4 * b.mla_workspace_floats}};
    std::vector<std::pair<const std::byte*, const std::byte*>> spans;
    for (std::size_t i = 0; i < arrays.size(); ++i) {
      CAPTURE(i);
      const auto* p = static_cast<const std::byte*>(arrays[i].first);
      CHECK((p == nullptr) == (arrays[i].second == 0));
      if (p == nullptr) continue;
      CHECK(reinterpret_cast<std::uintptr_t>(p) % forward_buffer_alignment == 0);
      CHECK(p >= base);
      CHECK(p + arrays[i].second <= base + bytes);
      spans.emplace_back(p, p + arrays[i].second);
    }
    std::sort(spans.begin(), spans.end());
    for (std::size_t i = 1; i < spans.size(); ++i) CHECK(spans[i - 1].second <= spans[i].first);
    // The split workspaces and the indexer's scores are the CUDA kernels'; the expanded
    // prefill's workspace is the CPU's.
    CHECK((b.matmul_workspace_floats > 0) == cuda);
    CHECK((b.attention_workspace_floats > 0) == cuda);
    CHECK((b.index_scores_floats > 0) == cuda);
    CHECK((b.mla_workspace_floats > 0) == !cuda);
    CHECK(b.moe_workspace_floats > 0);
  }
}
