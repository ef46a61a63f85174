// The real-model fixture: stories260K in both of its formats must reproduce the reference
// outputs of its README (llama2.c's implementation, greedy, fp32).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/engine/generator.h"
#include "edge/common/thread_pool.h"
#include "test_support.h"

namespace {

using namespace edge::backend;

const std::vector<token_id> reference_prompt = {1, 403, 407, 261, 378};
// Positions 1..64: the 4 prompt tokens, then 60 greedy tokens.
const std::vector<token_id> reference_ids = {
    403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337, 410, 408,
    419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426,
    338, 391, 266, 267, 337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13, 438, 310};
const std::vector<float> reference_logits_bos = {-6.222911f, 8.404342f, -6.223737f, -6.222542f,
                                                 -6.221951f, -6.222875f, -6.221880f, -6.223416f};
const std::string reference_text =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a "
    "big, red ball. She wanted to play with it, but it was too high.\nLily";

// A model with its own cache, pool and executor.
struct runtime {
  std::unique_ptr<model> m;
  std::unique_ptr<kv_cache> cache;
  std::unique_ptr<kv_block_pool> blocks;
  std::unique_ptr<edge::thread_pool> pool = std::make_unique<edge::thread_pool>(1);
  std::unique_ptr<cpu_executor> exec;

  explicit runtime(const std::filesystem::path& path, edge::kernels::dtype kv = edge::kernels::dtype::f32,
                   std::int64_t max_batch_tokens = 512) {
    auto loaded = load_model({.path = path});
    REQUIRE_MESSAGE(loaded.ok(), loaded.error().message());
    m = std::move(loaded).value();
    auto c = kv_cache::create(kv_cache_layout::for_tokens(m->config, kv, 16, 16 * 1024));
    REQUIRE(c.ok());
    cache = std::move(c).value();
    blocks = std::make_unique<kv_block_pool>(cache->layout().num_blocks);
    auto e = cpu_executor::create(*m, *cache, pool.get(), {.max_batch_tokens = max_batch_tokens, .max_sequences = 64});
    REQUIRE_MESSAGE(e.ok(), e.error().message());
    exec = std::move(e).value();
  }

  std::vector<generation_output> generate(const std::vector<generate_request>& requests, generator_options options = {}) {
    generator gen(*m, *exec, *blocks, options);
    auto out = gen.run(requests);
    REQUIRE_MESSAGE(out.ok(), out.error().message());
    return std::move(out).value();
  }
};

generate_request greedy(std::vector<token_id> prompt, std::int64_t max_tokens) {
  generate_request r;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  r.ignore_eos = true;
  return r;
}

}  // namespace

TEST_CASE("stories260K reproduces the reference ids, logits and text in both formats") {
  const auto dir = edge::testing::stories260k_dir();
  for (const auto& file : {dir / "stories260K.gguf", dir / "stories260K.bin"}) {
    CAPTURE(file.string());
    runtime rt(file);
    CHECK(rt.m->tok->encode("Once upon a time", {.add_bos = true, .parse_special = false}) == reference_prompt);

    // Position 0: logits for the BOS token alone.
    const token_id bos = 1;
    const std::vector<std::int32_t> table = {*rt.blocks->allocate()};
    batch_plan plan;
    plan.entries.push_back({.tokens = {&bos, 1}, .start_position = 0, .block_table = table, .compute_logits = true});
    std::vector<float> logits(static_cast<std::size_t>(rt.m->config.vocab_size));
    REQUIRE(rt.exec->forward(plan, logits).ok());
    rt.blocks->free(table[0]);
    for (std::size_t i = 0; i < reference_logits_bos.size(); ++i) {
      CHECK(std::fabs(logits[i] - reference_logits_bos[i]) < 1e-4);
    }

    const auto out = rt.generate({greedy(reference_prompt, 60)});
    std::vector<token_id> all(reference_prompt.begin() + 1, reference_prompt.end());
    all.insert(all.end(), out[0].tokens.begin(), out[0].tokens.end());
    CHECK(all == reference_ids);
    CHECK("Once upon a time" + out[0].text == reference_text);
    CHECK(out[0].reason == finish_reason::length);
  }
}

TEST_CASE("sixteen prompts decoded in one ragged batch give exactly the ids each gives alone") {
  const std::vector<std::string> prompts = {
      "Once upon a time", "The little dog", "Tom and Sue went to the park", "She had a red ball",
      "One day", "The sun was hot and the sky was blue", "A big bird", "Mom said",
      "There was a cat named Kitty", "He liked to play", "The tree was tall", "In the garden",
      "Lily saw a bug", "They were happy", "Ben wanted to fly a kite", "The box was empty"};
  for (auto kv : {edge::kernels::dtype::f32, edge::kernels::dtype::bf16, edge::kernels::dtype::fp8_e4m3}) {
    CAPTURE(edge::kernels::to_string(kv));
    runtime rt(edge::testing::stories260k_dir() / "stories260K.gguf", kv);
    std::vector<generate_request> requests;
    for (const auto& p : prompts) {
      // Different lengths, so the batch mixes sequences at different positions.
      requests.push_back(greedy(rt.m->tok->encode(p, {.add_bos = true, .parse_special = false}), 40));
    }
    const auto together = rt.generate(requests);
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const auto alone = rt.generate({requests[i]});
      CHECK_MESSAGE(alone[0].tokens == together[i].tokens, "prompt: ", prompts[i]);
    }
  }
}

TEST_CASE("a prompt prefilled in chunks of 16 gives the same ids as one prefill") {
  // With an fp8 cache too: each row is quantized with its own scale when written, so how the
  // prompt was split cannot change what attention reads back.
  for (auto kv : {edge::kernels::dtype::f32, edge::kernels::dtype::fp8_e4m3}) {
    CAPTURE(edge::kernels::to_string(kv));
    runtime rt(edge::testing::stories260k_dir() / "stories260K.gguf", kv);
    const auto prompt = rt.m->tok->encode(
        "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she "
        "saw a big, red ball. She wanted to play with it, but it was too high. Lily asked her mom to help her.",
        {.add_bos = true, .parse_special = false});
    REQUIRE(prompt.size() > 40);
    const auto whole = rt.generate({greedy(prompt, 50)});
    const auto chunked = rt.generate({greedy(prompt, 50)}, {.max_num_batched_tokens = 16});
    CHECK(whole[0].tokens == chunked[0].tokens);
    // A step budget that is not a whole number of blocks (the scheduler cuts a partial prompt
    // chunk at a block boundary and gives the rest of the budget to the next sequence), and a
    // mix of chunked sequences in one batch.
    const auto odd = rt.generate({greedy(prompt, 50), greedy(prompt, 20)}, {.max_num_batched_tokens = 23});
    CHECK(odd[0].tokens == whole[0].tokens);
  }
}

TEST_CASE("a seed makes sampling reproducible; different seeds differ") {
  runtime rt(edge::testing::stories260k_dir() / "stories260K.gguf");
  generate_request r = greedy(reference_prompt, 40);
  r.sampling.temperature = 1.0f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 42;
  const auto a = rt.generate({r});
  const auto b = rt.generate({r, greedy(reference_prompt, 10)});  // other company in the batch
  CHECK(a[0].tokens == b[0].tokens);
  r.sampling.seed = 43;
  const auto c = rt.generate({r});
  CHECK(a[0].tokens != c[0].tokens);
}

TEST_CASE("generation ends at a stop string, at EOS and at max_tokens") {
  runtime rt(edge::testing::stories260k_dir() / "stories260K.gguf");
  generate_request r = greedy(reference_prompt, 60);
  r.stop = {"park"};
  const auto stopped = rt.generate({r});
  CHECK(stopped[0].reason == finish_reason::stop);
  CHECK(stopped[0].text == ", there was a little girl named Lily. She loved to play outside in the ");

  // A stop string spanning several tokens, released text never containing any of it.
  r.stop = {"red ball"};
  std::string streamed;
  generator gen(*rt.m, *rt.exec, *rt.blocks);
  auto out = gen.run({&r, 1}, [&](std::size_t, std::string_view t) { streamed += t; });
  REQUIRE(out.ok());
  CHECK(streamed == (*out)[0].text);
  CHECK(streamed.find("red") == std::string::npos);
  CHECK(streamed.ends_with("a big, "));

  generate_request shortest = greedy(reference_prompt, 3);
  CHECK(rt.generate({shortest})[0].tokens.size() == 3);

  // Without ignore_eos, generation ends at EOS (stories often end with "</s>").
  generate_request until_eos = greedy(reference_prompt, 400);
  until_eos.ignore_eos = false;
  const auto eos = rt.generate({until_eos});
  if (eos[0].reason == finish_reason::stop) {
    CHECK(eos[0].tokens.back() == 2);
  } else {
    CHECK(eos[0].tokens.size() == 400);
  }
}

TEST_CASE("the executor rejects batches it cannot run") {
  runtime rt(edge::testing::stories260k_dir() / "stories260K.gguf", edge::kernels::dtype::f32, 8);
  std::vector<token_id> tokens(9, 5);
  const std::vector<std::int32_t> table = {0};
  batch_plan plan;
  plan.entries.push_back({.tokens = tokens, .start_position = 0, .block_table = table, .compute_logits = false});
  CHECK(rt.exec->forward(plan, {}).code() == edge::status_code::invalid_argument);  // more than max_batch_tokens

  plan.entries[0].tokens = std::span<const token_id>(tokens).subspan(0, 4);
  plan.entries[0].start_position = 14;  // needs two blocks
  CHECK(rt.exec->forward(plan, {}).code() == edge::status_code::invalid_argument);

  plan.entries[0].start_position = 0;
  plan.entries[0].compute_logits = true;
  std::vector<float> small(3);
  CHECK(rt.exec->forward(plan, small).code() == edge::status_code::invalid_argument);
}
