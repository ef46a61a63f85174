// Constrained generation on stories260K: the generator (the engine's scheduler and step driver)
// with a grammar gives valid JSON of the schema at temperature 1 (with penalties too, where the
// host samples), ends at EOS once the value is whole (ignore_eos or not; stop strings inside it
// cut nothing), and stops at max_tokens with "length" before; the engine refuses a grammar
// compiled for another tokenizer.
#include <doctest/doctest.h>
#include <simdjson.h>

#include "backend/grammar/grammar_test_support.h"
#include "edge/backend/engine.h"
#include "edge/backend/engine/generator.h"
#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/common/thread_pool.h"
#include "test_support.h"

namespace edge::testing {
namespace {

using namespace backend;

struct stories_runtime {
  std::unique_ptr<model> m;
  std::unique_ptr<kv_cache> cache;
  std::unique_ptr<kv_block_pool> blocks;
  std::unique_ptr<thread_pool> pool = std::make_unique<thread_pool>(1);
  std::unique_ptr<cpu_executor> exec;

  stories_runtime() {
    auto loaded = load_model({.path = stories260k_dir() / "stories260K.gguf"});
    REQUIRE_MESSAGE(loaded.ok(), loaded.error().message());
    m = std::move(loaded).value();
    auto c = kv_cache::create(kv_cache_layout::for_tokens(m->config, kernels::dtype::f32, 16, 16 * 1024));
    REQUIRE(c.ok());
    cache = std::move(c).value();
    blocks = std::make_unique<kv_block_pool>(cache->layout().num_blocks);
    auto e = cpu_executor::create(*m, *cache, pool.get(), {.max_batch_tokens = 512, .max_sequences = 32});
    REQUIRE(e.ok());
    exec = std::move(e).value();
  }
};

constexpr std::string_view schema =
    R"({"type":"object","properties":{"name":{"type":"string","maxLength":6},"n":{"type":"integer","minimum":-5,"maximum":300},)"
    R"("tags":{"type":"array","items":{"enum":["a","b"]},"maxItems":2}},"required":["name","n","tags"],"additionalProperties":false})";

TEST_CASE("the generator writes valid JSON of the schema at temperature 1, sampled on the executor and on the host") {
  stories_runtime rt;
  const auto grammar = compile_schema(schema, *rt.m->tok);
  std::vector<generate_request> requests(16);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    auto& r = requests[i];
    r.prompt = {1, 403, 407, 261, 378};
    r.max_tokens = 300;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 40 + i;
    if (i % 2 == 1) r.sampling.repetition_penalty = 1.3f;  // sampled on the host
    if (i % 4 == 3) r.ignore_eos = true;
    // Stop strings every value holds: the grammar decides the end, so they cut nothing.
    if (i % 3 == 2) r.stop = {"\"", ":", "name"};
    r.grammar = grammar;
  }
  generator gen(*rt.m, *rt.exec, *rt.blocks);
  auto outputs = gen.run(requests);
  REQUIRE_MESSAGE(outputs.ok(), outputs.error().message());
  for (const generation_output& out : *outputs) {
    CAPTURE(out.text);
    CHECK(out.reason == finish_reason::stop);
    simdjson::dom::parser parser;
    simdjson::dom::element e;
    REQUIRE(parser.parse(out.text).get(e) == simdjson::SUCCESS);
    const std::int64_t n = e["n"].get_int64().value();
    CHECK((n >= -5 && n <= 300));
    CHECK(e["tags"].get_array().value().size() <= 2);
  }
  // Too few tokens for the value: "length", the text a prefix of a value.
  requests.resize(1);
  requests[0].max_tokens = 4;
  auto short_outputs = gen.run(requests);
  REQUIRE(short_outputs.ok());
  CHECK((*short_outputs)[0].reason == finish_reason::length);
  CHECK((*short_outputs)[0].tokens.size() == 4);
  CHECK((*short_outputs)[0].text.starts_with("{"));
}

TEST_CASE("the engine refuses a grammar compiled for another tokenizer") {
  stories_runtime rt;
  const auto other = byte_tokenizer();
  const auto grammar = compile_schema(schema, *other);
  auto e = engine::create(*rt.m->tok, *rt.exec, *rt.blocks, rt.m->config.max_position,
                          {.scheduler = {.block_size = 16, .max_num_seqs = 32, .max_num_batched_tokens = 512}});
  REQUIRE_MESSAGE(e.ok(), e.error().message());
  generate_request r;
  r.prompt = {1, 403};
  r.max_tokens = 4;
  r.grammar = grammar;
  auto submitted = (*e)->submit(std::move(r), [](engine_event) {});
  REQUIRE_FALSE(submitted.ok());
  CHECK(submitted.error().code() == status_code::invalid_argument);
}

}  // namespace
}  // namespace edge::testing
