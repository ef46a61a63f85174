// Constrained generation on stories260K: the generator (the engine's scheduler and step driver)
// with a grammar gives valid JSON of the schema at temperature 1 (with penalties too, where the
// host samples), ends at EOS once the value is whole (ignore_eos or not; stop strings inside it
// cut nothing), and stops at max_tokens with "length" before; the engine refuses a grammar
// compiled for another tokenizer, and the generator refuses what the engine refuses.
#include <doctest/doctest.h>
#include <simdjson.h>

#include "backend/grammar/grammar_test_support.h"
#include "edge/backend/engine/engine.h"
#include "edge/backend/engine/generator.h"
#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/common/thread_pool.h"

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
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

// Every token of stories260K whose bytes hold `c` (its byte token included).
std::vector<kernels::logit_bias> bans_of(const tokenizer& tok, char c) {
  std::vector<kernels::logit_bias> bans;
  std::string bytes;
  for (token_id id = 0; id < tok.vocab_size(); ++id) {
    bytes.clear();
    if (tok.is_special(id)) continue;
    tok.append_token_bytes(id, false, false, bytes);
    if (bytes.find(c) != std::string::npos) bans.push_back({.id = id, .bias = kernels::logit_ban});
  }
  return bans;
}

struct engine_events {
  std::mutex mutex;
  std::condition_variable done;
  std::map<std::int32_t, finish_reason> choice_ends;
  std::map<std::int32_t, std::string> texts;
  std::vector<finished_event> ends;
  event_sink sink() {
    return [this](engine_event e) {
      std::lock_guard lock(mutex);
      if (auto* d = std::get_if<delta_event>(&e)) {
        texts[d->index] += d->text;
        if (d->finish) choice_ends[d->index] = *d->finish;
      } else if (auto* f = std::get_if<finished_event>(&e)) {
        ends.push_back(*f);
        done.notify_all();
      }
    };
  }
  bool wait() {
    std::unique_lock lock(mutex);
    return done.wait_for(lock, std::chrono::seconds(60), [&] { return !ends.empty(); });
  }
};

TEST_CASE("bans that leave a grammar no way to begin are refused at submission, naming logit_bias") {
  stories_runtime rt;
  auto e = engine::create(*rt.m->tok, *rt.exec, *rt.blocks, rt.m->config.max_position,
                          {.scheduler = {.block_size = 16, .max_num_seqs = 32, .max_num_batched_tokens = 512}});
  REQUIRE_MESSAGE(e.ok(), e.error().message());
  grammar::grammar_builder b;
  auto object = b.build(b.json_object());
  REQUIRE(object.ok());
  const auto json_object = compile_or_fail(*object, *rt.m->tok);
  generate_request r;
  r.prompt = {1, 403};
  r.max_tokens = 16;
  r.n = 2;
  r.grammar = json_object;
  r.sampling.logit_bias = bans_of(*rt.m->tok, '{');
  auto refused = (*e)->submit(r, [](engine_event) {});
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().code() == status_code::invalid_argument);
  CHECK(refused.error().field() == "logit_bias");
  // Without the bans the same request runs, and the engine is as good as before.
  r.sampling.logit_bias.clear();
  engine_events events;
  auto accepted = (*e)->submit(r, events.sink());
  REQUIRE_MESSAGE(accepted.ok(), accepted.error().message());
  REQUIRE(events.wait());
  CHECK(events.ends.size() == 1);
  CHECK((*e)->health().state == engine_state::running);
}

TEST_CASE("a dead end in the middle of the output ends each choice with content_filter, and the engine goes on") {
  stories_runtime rt;
  auto e = engine::create(*rt.m->tok, *rt.exec, *rt.blocks, rt.m->config.max_position,
                          {.scheduler = {.block_size = 16, .max_num_seqs = 32, .max_num_batched_tokens = 512}});
  REQUIRE_MESSAGE(e.ok(), e.error().message());
  // A free string first (too many ways on to search up front), then a "q" no token may write.
  const auto grammar = compile_schema(
      R"({"type":"object","properties":{"s":{"type":"string","maxLength":6},"e":{"const":"q"}},"required":["s","e"],)"
      R"("additionalProperties":false})",
      *rt.m->tok);
  for (const bool host : {false, true}) {
    CAPTURE(host);
    generate_request r;
    r.prompt = {1, 403, 407, 261, 378};
    r.max_tokens = 64;
    r.n = 2;
    r.grammar = grammar;
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 11;
    if (host) r.sampling.presence_penalty = 0.5f;  // sampled on the host
    r.sampling.logit_bias = bans_of(*rt.m->tok, 'q');
    engine_events events;
    auto accepted = (*e)->submit(r, events.sink());
    REQUIRE_MESSAGE(accepted.ok(), accepted.error().message());
    REQUIRE(events.wait());
    REQUIRE(events.ends.size() == 1);
    CHECK(events.ends[0].reason == finish_reason::content_filter);
    for (std::int32_t i = 0; i < 2; ++i) {
      CAPTURE(events.texts[i]);
      CHECK(events.choice_ends[i] == finish_reason::content_filter);
      CHECK(events.texts[i].ends_with("\""));
      CHECK(events.texts[i].find("\"e\"") != std::string::npos);
    }
    CHECK((*e)->health().state == engine_state::running);
  }
}

TEST_CASE("the generator refuses what the engine refuses, naming the same field") {
  stories_runtime rt;
  auto e = engine::create(*rt.m->tok, *rt.exec, *rt.blocks, rt.m->config.max_position,
                          {.scheduler = {.block_size = 16, .max_num_seqs = 32, .max_num_batched_tokens = 512}});
  REQUIRE_MESSAGE(e.ok(), e.error().message());
  generator gen(*rt.m, *rt.exec, *rt.blocks);
  grammar::grammar_builder b;
  auto object = b.build(b.json_object());
  REQUIRE(object.ok());
  const auto json_object = compile_or_fail(*object, *rt.m->tok);
  const token_id vocab = rt.m->tok->vocab_size();

  struct bad_request {
    const char* what;
    const char* field;
    std::function<void(generate_request&)> spoil;
  };
  const std::vector<bad_request> cases{
      {"a prompt token outside the vocabulary", "prompt[2]", [&](generate_request& r) { r.prompt.push_back(vocab); }},
      {"a logit_bias key outside the vocabulary", "logit_bias",
       [&](generate_request& r) { r.sampling.logit_bias = {{.id = vocab + 3, .bias = 1.0f}}; }},
      {"logprobs past the limit", "logprobs", [](generate_request& r) { r.logprobs = max_top_logprobs + 1; }},
      {"no choices", "n", [](generate_request& r) { r.n = 0; }},
      {"longer than the context", "prompt",
       [&](generate_request& r) { r.prompt.assign(static_cast<std::size_t>(rt.m->config.max_position) + 1, 403); }},
      {"bans that close the grammar", "logit_bias",
       [&](generate_request& r) {
         r.grammar = json_object;
         r.sampling.logit_bias = bans_of(*rt.m->tok, '{');
       }},
  };
  for (const bad_request& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    generate_request r;
    r.prompt = {1, 403};
    r.max_tokens = 4;
    c.spoil(r);
    auto refused = (*e)->submit(r, [](engine_event) {});
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().field() == c.field);
    const std::vector<generate_request> one{r};
    auto ran = gen.run(one);
    REQUIRE_FALSE(ran.ok());
    CHECK(ran.error().code() == refused.error().code());
    CHECK(ran.error().message().find(refused.error().message()) != std::string::npos);
  }
  // n > 1 is the engine's (choices), not the generator's: one output per request.
  generate_request two;
  two.prompt = {1, 403};
  two.max_tokens = 4;
  two.n = 2;
  const std::vector<generate_request> one{two};
  CHECK(gen.run(one).error().code() == status_code::invalid_argument);
}

}  // namespace
}  // namespace edge::testing
