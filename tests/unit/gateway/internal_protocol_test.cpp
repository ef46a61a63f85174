// The gateway ↔ backend wire format: requests and events survive the trip, bad input is
// refused naming the field, and the identity check says why a backend cannot be used; and the
// token a backend makes for its internal API when it is given none.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "edge/backend/grammar/grammar.h"
#include "edge/gateway/split/internal_protocol.h"
#include "edge/gateway/split/internal_routes.h"
#include "edge/gateway/openai/openai_request.h"
#include "edge/gateway/split/remote_backend_pool.h"
#include "edge/gateway/tenancy/engine_limits.h"
#include "edge/gateway/tenancy/tenant.h"
#include "edge/gateway/tenancy/usage_ledger.h"
#include "test_support.h"

namespace gw = edge::gateway;
namespace be = edge::backend;

TEST_CASE("a generate request survives encoding and parsing") {
  be::generate_request r;
  r.id = "req_1";
  r.tenant = "acme";
  r.weight = 2.5;
  r.prompt = {1, 2, 300};
  r.sampling.temperature = 0.5f;
  r.sampling.top_k = 40;
  r.sampling.top_p = 0.9f;
  r.sampling.seed = 18446744073709551615ull;
  r.max_tokens = 77;
  r.stop = {"\n\n", "END"};
  r.stop_token_ids = {2};
  r.ignore_eos = true;
  r.logprobs = 3;
  r.n = 4;
  r.prompt_logprobs = 2;
  r.sampling.logit_bias = {{.id = 7, .bias = -100.0f}, {.id = 300, .bias = 2.5f}};
  const auto parsed = gw::parse_generate_request(gw::encode_generate_request(r, nullptr));
  REQUIRE(std::holds_alternative<gw::parsed_generate_request>(parsed));
  const auto& back = std::get<gw::parsed_generate_request>(parsed).request;
  CHECK(back.id == r.id);
  CHECK(back.tenant == r.tenant);
  CHECK(back.weight == r.weight);
  CHECK(back.priority == r.priority);
  CHECK(back.prompt == r.prompt);
  CHECK(back.sampling.temperature == r.sampling.temperature);
  CHECK(back.sampling.top_k == r.sampling.top_k);
  CHECK(back.sampling.top_p == r.sampling.top_p);
  CHECK(back.sampling.seed == r.sampling.seed);
  CHECK(back.max_tokens == r.max_tokens);
  CHECK(back.stop == r.stop);
  CHECK(back.stop_token_ids == r.stop_token_ids);
  CHECK(back.ignore_eos);
  CHECK(back.logprobs == 3);
  CHECK(back.n == 4);
  CHECK(back.prompt_logprobs == 2);
  REQUIRE(back.sampling.logit_bias.size() == 2);
  CHECK(back.sampling.logit_bias[0].id == 7);
  CHECK(back.sampling.logit_bias[0].bias == -100.0f);
  CHECK(back.sampling.logit_bias[1].id == 300);
  CHECK(back.sampling.logit_bias[1].bias == 2.5f);
  CHECK(back.skip_special_tokens);
  // Left out, they are what a plain request asks.
  const auto plain = gw::parse_generate_request(R"({"prompt":[1],"max_tokens":4})");
  REQUIRE(std::holds_alternative<gw::parsed_generate_request>(plain));
  CHECK(std::get<gw::parsed_generate_request>(plain).request.n == 1);
  CHECK(!std::get<gw::parsed_generate_request>(plain).request.prompt_logprobs);
  CHECK(std::get<gw::parsed_generate_request>(plain).request.sampling.logit_bias.empty());
  CHECK(std::get<gw::parsed_generate_request>(parsed).grammar == nullptr);
}

TEST_CASE("a generate request carries its grammar as text, and a malformed one is refused naming the field") {
  be::generate_request r;
  r.prompt = {1, 2};
  r.max_tokens = 8;
  edge::backend::grammar::grammar_builder b;
  auto schema = b.json_schema(R"({"type":"object","properties":{"n":{"type":"integer","minimum":1}},"required":["n"]})");
  REQUIRE(schema.ok());
  auto g = b.build(*schema);
  REQUIRE(g.ok());
  const auto parsed = gw::parse_generate_request(gw::encode_generate_request(r, &*g));
  REQUIRE(std::holds_alternative<gw::parsed_generate_request>(parsed));
  const auto& grammar = std::get<gw::parsed_generate_request>(parsed).grammar;
  REQUIRE(grammar != nullptr);
  CHECK(grammar->text() == g->text());
  const auto bad = gw::parse_generate_request(R"json({"prompt":[1],"max_tokens":4,"grammar":"(grammar (root (ref 9)))"})json");
  REQUIRE(std::holds_alternative<gw::internal_request_error>(bad));
  CHECK(std::get<gw::internal_request_error>(bad).param == "grammar");
}

TEST_CASE("skip_special_tokens travels only when it is off") {
  be::generate_request r;
  r.prompt = {1};
  CHECK(gw::encode_generate_request(r, nullptr).find("skip_special_tokens") == std::string::npos);
  r.skip_special_tokens = false;
  const std::string body = gw::encode_generate_request(r, nullptr);
  CHECK(body.find(R"("skip_special_tokens":false)") != std::string::npos);
  const auto parsed = gw::parse_generate_request(body);
  REQUIRE(std::holds_alternative<gw::parsed_generate_request>(parsed));
  CHECK_FALSE(std::get<gw::parsed_generate_request>(parsed).request.skip_special_tokens);
  const auto bad = gw::parse_generate_request(R"({"prompt":[1],"max_tokens":4,"skip_special_tokens":"no"})");
  REQUIRE(std::holds_alternative<gw::internal_request_error>(bad));
  CHECK(std::get<gw::internal_request_error>(bad).param == "skip_special_tokens");
}

TEST_CASE("the session key travels only when there is one, held to the public API's bound") {
  be::generate_request r;
  r.prompt = {1};
  CHECK(gw::encode_generate_request(r, nullptr).find("session") == std::string::npos);
  r.session = "run-7";
  const auto parsed = gw::parse_generate_request(gw::encode_generate_request(r, nullptr));
  REQUIRE(std::holds_alternative<gw::parsed_generate_request>(parsed));
  CHECK(std::get<gw::parsed_generate_request>(parsed).request.session == "run-7");
  for (const std::string& value : {std::string(R"("")"), std::string("7"), "\"" + std::string(257, 'k') + "\""}) {
    CAPTURE(value);
    const auto bad = gw::parse_generate_request(R"({"prompt":[1],"max_tokens":4,"session":)" + value + "}");
    REQUIRE(std::holds_alternative<gw::internal_request_error>(bad));
    CHECK(std::get<gw::internal_request_error>(bad).param == "session");
  }
}

TEST_CASE("the tenant's KV tier caps travel when it has them, within the tenant admin's bounds") {
  be::generate_request r;
  r.prompt = {1};
  const std::string unlimited_body = gw::encode_generate_request(r, nullptr);
  CHECK(unlimited_body.find("tier_cap") == std::string::npos);
  const auto unlimited = gw::parse_generate_request(unlimited_body);
  REQUIRE(std::holds_alternative<gw::parsed_generate_request>(unlimited));
  CHECK(std::get<gw::parsed_generate_request>(unlimited).request.host_tier_cap_bytes == gw::unlimited_tier_bytes);
  CHECK(std::get<gw::parsed_generate_request>(unlimited).request.disk_tier_cap_bytes == gw::unlimited_tier_bytes);

  // Each alone, and both, with 0 (keep nothing) and the largest a quota may be.
  const std::pair<std::int64_t, std::int64_t> caps[] = {{0, gw::unlimited_tier_bytes},
                                                        {gw::unlimited_tier_bytes, 3 << 20},
                                                        {64 << 20, 0},
                                                        {gw::max_quota_value, gw::max_quota_value}};
  for (const auto& [host, disk] : caps) {
    CAPTURE(host);
    CAPTURE(disk);
    r.host_tier_cap_bytes = host;
    r.disk_tier_cap_bytes = disk;
    const auto parsed = gw::parse_generate_request(gw::encode_generate_request(r, nullptr));
    REQUIRE(std::holds_alternative<gw::parsed_generate_request>(parsed));
    CHECK(std::get<gw::parsed_generate_request>(parsed).request.host_tier_cap_bytes == host);
    CHECK(std::get<gw::parsed_generate_request>(parsed).request.disk_tier_cap_bytes == disk);
  }

  const auto read = [](std::string_view field, std::string_view value) {
    return gw::parse_generate_request(R"({"prompt":[1],"max_tokens":4,")" + std::string(field) + "\":" +
                                      std::string(value) + "}");
  };
  for (const std::string_view field : {"host_tier_cap_bytes", "disk_tier_cap_bytes"}) {
    CAPTURE(field);
    const auto null = read(field, "null");
    REQUIRE(std::holds_alternative<gw::parsed_generate_request>(null));
    const be::generate_request& got = std::get<gw::parsed_generate_request>(null).request;
    CHECK((field == "host_tier_cap_bytes" ? got.host_tier_cap_bytes : got.disk_tier_cap_bytes) ==
          gw::unlimited_tier_bytes);
    for (const std::string& value : {std::string("-1"), std::to_string(gw::max_quota_value + 1), std::string("1.5"),
                                    std::string(R"("1GiB")"), std::string("9223372036854775807")}) {
      CAPTURE(value);
      const auto bad = read(field, value);
      REQUIRE(std::holds_alternative<gw::internal_request_error>(bad));
      CHECK(std::get<gw::internal_request_error>(bad).param == field);
    }
  }
}

TEST_CASE("a bad generate request names the field") {
  const auto error_of = [](std::string_view body) {
    const auto parsed = gw::parse_generate_request(body);
    REQUIRE(std::holds_alternative<gw::internal_request_error>(parsed));
    return std::get<gw::internal_request_error>(parsed);
  };
  CHECK(error_of("{").param.empty());
  CHECK(error_of("[]").param.empty());
  CHECK(error_of(R"({"max_tokens":4})").param == "prompt");
  CHECK(error_of(R"({"prompt":[1]})").param == "max_tokens");
  CHECK(error_of(R"({"prompt":[1,-2],"max_tokens":4})").param == "prompt[1]");
  CHECK(error_of(R"({"prompt":[1],"max_tokens":0})").param == "max_tokens");
  CHECK(error_of(R"({"prompt":[1],"max_tokens":4,"sampling":{"temprature":1}})").param == "sampling.temprature");
  CHECK(error_of(R"({"prompt":[1],"max_tokens":4,"beam_width":2})").param == "beam_width");
  CHECK(error_of(R"({"prompt":[1],"max_tokens":4,"stop":["a",3]})").param == "stop[1]");
}

TEST_CASE("the internal API holds every field to the public API's rules") {
  const auto error_of = [](std::string_view body) {
    const auto parsed = gw::parse_generate_request(body);
    REQUIRE_MESSAGE(std::holds_alternative<gw::internal_request_error>(parsed), body);
    return std::get<gw::internal_request_error>(parsed);
  };
  const auto with = [](std::string_view fields) { return std::string(R"({"prompt":[1,2],"max_tokens":4,)") + std::string(fields) + "}"; };
  for (const auto& [fields, param] : std::vector<std::pair<std::string, std::string>>{
           {R"("sampling":{"temperature":1e9})", "sampling.temperature"},
           {R"("sampling":{"temperature":-0.5})", "sampling.temperature"},
           {R"("sampling":{"top_p":0})", "sampling.top_p"},
           {R"("sampling":{"top_p":1.5})", "sampling.top_p"},
           {R"("sampling":{"top_k":-2})", "sampling.top_k"},
           {R"("sampling":{"min_p":2})", "sampling.min_p"},
           {R"("sampling":{"presence_penalty":3})", "sampling.presence_penalty"},
           {R"("sampling":{"frequency_penalty":-1e300})", "sampling.frequency_penalty"},
           {R"("sampling":{"repetition_penalty":0})", "sampling.repetition_penalty"},
           {R"("stop":["a","b","c","d","e"])", "stop"},
           {R"("tenant":"acme\nmallory")", "tenant"},
           {R"("tenant":"")", "tenant"},
           {R"("tenant":"-acme")", "tenant"},
           {R"("id":"req 1\r\nforged")", "id"},
           {R"("n":0)", "n"},
           {R"("n":129)", "n"},
           {R"("n":"2")", "n"},
           {R"("prompt_logprobs":-1)", "prompt_logprobs"},
           {R"("prompt_logprobs":65)", "prompt_logprobs"},
           {R"("sampling":{"logit_bias":{"x":1}})", "sampling.logit_bias.x"},
           {R"("sampling":{"logit_bias":{"5":101}})", "sampling.logit_bias.5"},
           {R"("sampling":{"logit_bias":[1]})", "sampling.logit_bias"},
       }) {
    CAPTURE(fields);
    const gw::internal_request_error error = error_of(with(fields));
    CHECK(error.param == param);
    CHECK(error.kind == gw::refusal_kind::invalid_request);
  }
  // The very rule of the public API, in its words.
  const auto public_error = gw::parse_openai_request(gw::openai_api::completions, R"({"prompt":"x","temperature":9})");
  REQUIRE(std::holds_alternative<gw::request_error>(public_error));
  CHECK(std::get<gw::request_error>(public_error).message == "'temperature' must be from 0 to 2");
  CHECK(error_of(with(R"("sampling":{"temperature":9})")).message == "'sampling.temperature' must be from 0 to 2");

  // As in the public API, an empty stop string is dropped and one string is a list of one.
  const auto parsed = gw::parse_generate_request(with(R"("stop":["","END"],"sampling":{"top_k":-1,"seed":null})"));
  REQUIRE(std::holds_alternative<gw::parsed_generate_request>(parsed));
  CHECK(std::get<gw::parsed_generate_request>(parsed).request.stop == std::vector<std::string>{"END"});
  CHECK(std::get<gw::parsed_generate_request>(parsed).request.sampling.top_k == 0);
  const auto one = gw::parse_generate_request(with(R"("stop":"END")"));
  REQUIRE(std::holds_alternative<gw::parsed_generate_request>(one));
  CHECK(std::get<gw::parsed_generate_request>(one).request.stop == std::vector<std::string>{"END"});
}

TEST_CASE("weight, priority and prefix-cache salt are never taken beyond what the tenant admin allows") {
  const auto refused = [](std::string_view fields) {
    const auto parsed = gw::parse_generate_request(std::string(R"({"prompt":[1,2],"max_tokens":4,)") +
                                                   std::string(fields) + "}");
    if (std::holds_alternative<gw::parsed_generate_request>(parsed)) return std::string();
    return std::get<gw::internal_request_error>(parsed).param;
  };
  // A weight past the tenant admin's bound would be served first for good.
  CHECK(refused(R"("weight":1.7e308)") == "weight");
  CHECK(refused(R"("weight":1001)") == "weight");
  CHECK(refused(R"("weight":0)") == "weight");
  CHECK(refused(R"("weight":-1)") == "weight");
  CHECK(refused(R"("weight":1000)").empty());
  CHECK(refused(R"("weight":0.25)").empty());
  // Tenants have no priorities: a request that claims one would never be preempted.
  CHECK(refused(R"("priority":2147483647)") == "priority");
  CHECK(refused(R"("priority":-1)") == "priority");
  CHECK(refused(R"("priority":0)").empty());
  // Another tenant's salt would read its prefix cache by timing; "" is what older gateways send.
  CHECK(refused(R"("tenant":"mallory","cache_salt":"victim")") == "cache_salt");
  CHECK(refused(R"("cache_salt":"")").empty());
  // What a gateway sends passes.
  be::generate_request r;
  r.tenant = "acme";
  r.weight = gw::max_tenant_weight;
  r.prompt = {1, 2};
  CHECK(std::holds_alternative<gw::parsed_generate_request>(gw::parse_generate_request(gw::encode_generate_request(r, nullptr))));
}

TEST_CASE("the internal API checks token ids against the vocabulary and lengths against the context") {
  const gw::backend_info model{.model = "m", .context_length = 512, .vocab_size = 512, .block_size = 16};
  be::generate_request r;
  r.prompt = {1, 2, 3};
  r.max_tokens = 16;
  CHECK_FALSE(gw::check_generate_request(r, model));

  r.prompt = {1, 512, 3};
  auto refused = gw::check_generate_request(r, model);
  REQUIRE(refused);
  CHECK(refused->param == "prompt[1]");
  CHECK(refused->kind == gw::refusal_kind::invalid_request);
  CHECK(refused->message == "'prompt[1]' is token 512, outside the vocabulary of 512 tokens");

  r.prompt = {1, 2, 3};
  r.stop_token_ids = {2, 70000};
  refused = gw::check_generate_request(r, model);
  REQUIRE(refused);
  CHECK(refused->param == "stop_token_ids[1]");
  r.stop_token_ids.clear();

  r.sampling.logit_bias = {{.id = 3, .bias = 1.0f}, {.id = 512, .bias = -100.0f}};
  refused = gw::check_generate_request(r, model);
  REQUIRE(refused);
  CHECK(refused->param == "sampling.logit_bias");
  CHECK(refused->kind == gw::refusal_kind::invalid_request);
  CHECK(refused->message.find("token 512") != std::string::npos);
  r.sampling.logit_bias.clear();

  r.prompt.assign(512, 7);
  refused = gw::check_generate_request(r, model);
  REQUIRE(refused);
  CHECK(refused->param == "prompt");
  CHECK(refused->kind == gw::refusal_kind::context_length);

  // prompt + max_tokens beyond the context: refused, as the public API refuses it, not clipped.
  r.prompt.assign(500, 7);
  r.max_tokens = 13;
  refused = gw::check_generate_request(r, model);
  REQUIRE(refused);
  CHECK(refused->param == "max_tokens");
  CHECK(refused->kind == gw::refusal_kind::context_length);
  r.max_tokens = 12;
  CHECK_FALSE(gw::check_generate_request(r, model));
  r.max_tokens = std::numeric_limits<std::int64_t>::max();
  refused = gw::check_generate_request(r, model);
  REQUIRE(refused);
  CHECK(refused->message.find(std::to_string(std::numeric_limits<std::int64_t>::max())) != std::string::npos);
}

TEST_CASE("sampling values a float cannot hold are refused, not read as infinity") {
  for (const std::string key :
       {"temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"}) {
    for (const std::string number : {"1e300", "-1e39"}) {
      const std::string body = R"({"prompt":[1],"max_tokens":4,"sampling":{")" + key + "\":" + number + "}}";
      const auto parsed = gw::parse_generate_request(body);
      REQUIRE_MESSAGE(std::holds_alternative<gw::internal_request_error>(parsed), body);
      CHECK(std::get<gw::internal_request_error>(parsed).param == "sampling." + key);
    }
  }
  const auto largest =
      gw::parse_generate_request(R"({"prompt":[1],"max_tokens":4,"sampling":{"repetition_penalty":3.4e38}})");
  REQUIRE(std::holds_alternative<gw::parsed_generate_request>(largest));
  CHECK(std::get<gw::parsed_generate_request>(largest).request.sampling.repetition_penalty == doctest::Approx(3.4e38f));
}

TEST_CASE("events survive the trip; heartbeats are recognised; garbage is refused") {
  be::delta_event delta;
  delta.text = "caf\u00e9 \"quoted\"\n";
  delta.tokens = {5, 6};
  delta.logprobs.push_back({{5, -0.25f}, {{5, -0.25f}, {9, -2.0f}}});
  delta.logprobs.push_back({{6, -std::numeric_limits<float>::infinity()}, {}});
  const std::string line = gw::encode_event(delta);
  CHECK(line.back() == '\n');
  CHECK(line.find('\n') == line.size() - 1);  // one line, whatever the text holds
  auto parsed = gw::parse_event(std::string_view(line).substr(0, line.size() - 1));
  REQUIRE(parsed.ok());
  REQUIRE(parsed->has_value());
  const auto& d = std::get<be::delta_event>(**parsed);
  CHECK(d.text == delta.text);
  CHECK(d.tokens == delta.tokens);
  REQUIRE(d.logprobs.size() == 2);
  CHECK(d.logprobs[0].top.size() == 2);
  CHECK(d.logprobs[0].top[1].id == 9);
  CHECK(d.logprobs[1].chosen.logprob == std::numeric_limits<float>::lowest());

  be::finished_event finished;
  finished.reason = be::finish_reason::length;
  finished.usage = {12, 7, 4};
  finished.timings.total_seconds = 1.5;
  finished.timings.preemptions = 1;
  const std::string done = gw::encode_event(finished);
  parsed = gw::parse_event(std::string_view(done).substr(0, done.size() - 1));
  REQUIRE(parsed.ok());
  const auto& f = std::get<be::finished_event>(**parsed);
  CHECK(f.reason == be::finish_reason::length);
  CHECK(f.usage.completion_tokens == 7);
  CHECK(f.usage.cached_tokens == 4);
  CHECK(f.timings.preemptions == 1);

  const std::string beat = gw::encode_heartbeat();
  parsed = gw::parse_event(std::string_view(beat).substr(0, beat.size() - 1));
  REQUIRE(parsed.ok());
  CHECK_FALSE(parsed->has_value());

  CHECK_FALSE(gw::parse_event("not json").ok());
  CHECK_FALSE(gw::parse_event(R"({"type":"teleported"})").ok());
  CHECK_FALSE(gw::parse_event(R"({"type":"finished","reason":"bored"})").ok());
}

TEST_CASE("a choice's index and finish, and the prompt's log probabilities, survive the trip") {
  be::delta_event delta;
  delta.index = 3;
  delta.text = "end";
  delta.tokens = {9};
  delta.finish = be::finish_reason::length;
  std::string line = gw::encode_event(delta);
  auto parsed = gw::parse_event(std::string_view(line).substr(0, line.size() - 1));
  REQUIRE(parsed.ok());
  const auto& d = std::get<be::delta_event>(**parsed);
  CHECK(d.index == 3);
  CHECK(d.finish == be::finish_reason::length);
  // An older backend's delta has neither: choice 0, not its last.
  parsed = gw::parse_event(R"({"type":"delta","text":"a","tokens":[1]})");
  REQUIRE(parsed.ok());
  CHECK(std::get<be::delta_event>(**parsed).index == 0);
  CHECK(!std::get<be::delta_event>(**parsed).finish);
  // The stop string that ended a choice.
  delta.finish = be::finish_reason::stop;
  delta.stop_string = "END";
  line = gw::encode_event(delta);
  parsed = gw::parse_event(std::string_view(line).substr(0, line.size() - 1));
  REQUIRE(parsed.ok());
  CHECK(std::get<be::delta_event>(**parsed).stop_string == "END");
  CHECK_FALSE(gw::parse_event(R"({"type":"delta","text":"","tokens":[],"finish":"length","stop_string":"x"})").ok());

  be::prompt_logprobs_event prompt;
  prompt.logprobs.push_back({{4, -1.5f}, {{2, -0.5f}, {4, -1.5f}}});
  prompt.logprobs.push_back({{8, -0.25f}, {}});
  line = gw::encode_event(prompt);
  parsed = gw::parse_event(std::string_view(line).substr(0, line.size() - 1));
  REQUIRE(parsed.ok());
  const auto& p = std::get<be::prompt_logprobs_event>(**parsed);
  REQUIRE(p.logprobs.size() == 2);
  CHECK(p.logprobs[0].chosen.id == 4);
  CHECK(p.logprobs[0].top.size() == 2);
  CHECK(p.logprobs[1].chosen.logprob == -0.25f);

  // A choice cannot end with abort or error (the request does), nor have a negative index.
  CHECK_FALSE(gw::parse_event(R"({"type":"delta","text":"","tokens":[],"finish":"abort"})").ok());
  CHECK_FALSE(gw::parse_event(R"({"type":"delta","text":"","tokens":[],"finish":"later"})").ok());
  CHECK_FALSE(gw::parse_event(R"({"type":"delta","index":-1,"text":"","tokens":[]})").ok());
  CHECK_FALSE(gw::parse_event(R"({"type":"prompt_logprobs"})").ok());
}

TEST_CASE("a backend's usage is charged only within what the gateway sent, relayed and asked for") {
  const gw::usage_bounds bounds{.prompt_tokens = 12, .seen_completion_tokens = 5, .max_tokens = 20};
  const auto charged = [&](be::token_usage reported) { return gw::bounded_usage(reported, bounds); };
  // Figures within the bounds are charged as reported.
  CHECK(charged({12, 9, 4}) == be::token_usage{12, 9, 4});
  CHECK(charged({12, 5, 0}) == be::token_usage{12, 5, 0});
  CHECK(charged({12, 20, 12}) == be::token_usage{12, 20, 12});
  // Zero or negative counts never reach the ledger: the prompt is what was sent, the completion
  // at least what the client received.
  CHECK(charged({0, 0, 0}) == be::token_usage{12, 5, 0});
  CHECK(charged({-100, -7, -3}) == be::token_usage{12, 5, 0});
  // Nor does more than was asked for, or a cache hit larger than the prompt.
  CHECK(charged({1'000'000, 1'000'000, 1'000'000}) == be::token_usage{12, 20, 12});
  CHECK(charged({3, std::numeric_limits<std::int64_t>::max(), std::numeric_limits<std::int64_t>::min()}) ==
        be::token_usage{12, 20, 0});
  // Everything asked for was relayed: that is the charge.
  CHECK(gw::bounded_usage({12, 0, 0}, {.prompt_tokens = 12, .seen_completion_tokens = 20, .max_tokens = 20}) ==
        be::token_usage{12, 20, 0});
}

TEST_CASE("info and load round-trip, and a mismatch says what differs") {
  gw::backend_info info{.model = "stories260K",
                        .context_length = 512,
                        .chat_template = {.builtin = be::chat_template_kind::llama2},
                        .tokenizer_fingerprint = "ab12",
                        .vocab_size = 512,
                        .block_size = 16,
                        .version = "0.1.0"};
  const auto back = gw::parse_info(gw::encode_info(info));
  REQUIRE(back.ok());
  CHECK(gw::info_mismatch(info, *back).empty());
  gw::backend_info other = info;
  other.block_size = 32;
  CHECK(gw::info_mismatch(info, other).find("block size") != std::string::npos);
  other = info;
  other.model = "tiny";
  CHECK(gw::info_mismatch(info, other).find("tiny") != std::string::npos);
  other = info;
  other.version = "0.2.0";
  CHECK(gw::info_mismatch(info, other).empty());

  // A Jinja template travels whole (the gateway renders the prompts); where each backend found
  // it may differ, the template may not.
  gw::backend_info jinja = info;
  jinja.chat_template = {.jinja = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}",
                         .jinja_tool_use = "{{ tools | tojson }}",
                         .bos_token = "<s>",
                         .eos_token = "</s>",
                         .origin = "/models/a/tokenizer_config.json"};
  const auto jinja_back = gw::parse_info(gw::encode_info(jinja));
  REQUIRE(jinja_back.ok());
  CHECK(jinja_back->chat_template == jinja.chat_template);
  CHECK(gw::info_mismatch(jinja, info).find("chat template") != std::string::npos);
  other = jinja;
  other.chat_template.origin = "/elsewhere/tokenizer_config.json";
  CHECK(gw::info_mismatch(jinja, other).empty());
  other.chat_template.eos_token = "<|eot_id|>";
  CHECK(gw::info_mismatch(jinja, other).find("chat template") != std::string::npos);
  CHECK(!gw::parse_info(R"({"model":"m","context_length":8,"chat_template":"jinja","tokenizer_fingerprint":"a",)"
                        R"("vocab_size":8,"block_size":16,"version":"x"})").ok());

  be::engine_stats stats;
  stats.running = 2;
  stats.waiting = 1;
  stats.in_flight = 3;
  stats.blocks_total = 8;
  stats.blocks_free = 2;
  stats.cached_blocks = 5;
  stats.prefix_cache_queries = 100;
  stats.prefix_cache_hits = 40;
  const gw::backend_load_report report = gw::load_report_from(stats, 16);
  CHECK(report.kv_usage == doctest::Approx(0.75));
  const auto load = gw::parse_load(gw::encode_load(report));
  REQUIRE(load.ok());
  CHECK(load->running == 2);
  CHECK(load->waiting == 1);
  CHECK(load->kv_usage == doctest::Approx(0.75));
  CHECK(load->cached_blocks == 5);
  CHECK(load->prefix_cache_hits == 40);
  CHECK_FALSE(gw::parse_load(R"({"waiting":1})").ok());
}

TEST_CASE("backend URLs: http://HOST:PORT only, with a clear error otherwise") {
  const auto ok = gw::parse_backend_url("http://edgeinfer-backend-0.edgeinfer-backend:8081/");
  REQUIRE(ok.ok());
  CHECK(ok->host == "edgeinfer-backend-0.edgeinfer-backend");
  CHECK(ok->port == "8081");
  CHECK(ok->url == "http://edgeinfer-backend-0.edgeinfer-backend:8081");
  const auto v6 = gw::parse_backend_url("http://[::1]:9000");
  REQUIRE(v6.ok());
  CHECK(v6->host == "::1");
  for (const char* bad : {"https://a:1", "a:1", "http://a", "http://a:0", "http://a:70000", "http://a:1/v1", "http://:1"}) {
    CAPTURE(bad);
    const auto parsed = gw::parse_backend_url(bad);
    REQUIRE_FALSE(parsed.ok());
    CHECK(parsed.error().message().find("--backend") != std::string::npos);
  }
}

TEST_CASE("a backend without --internal-token makes a token on its first start and keeps it, owner-only") {
  edge::testing::temp_dir state;
  const auto folder = state / "backend-state";  // created if missing
  const auto first = gw::load_or_create_internal_token(folder);
  REQUIRE_MESSAGE(first.ok(), first.error().message());
  CHECK(first->created);
  CHECK(first->token.size() >= gw::min_internal_token_length);
  CHECK(first->file == folder / gw::internal_token_file_name);
  struct stat st {};
  REQUIRE(::stat(first->file.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);
  // Only the token file is left behind.
  CHECK(std::distance(std::filesystem::directory_iterator(folder), std::filesystem::directory_iterator()) == 1);

  // Every later start reads the same token and makes none.
  const auto again = gw::load_or_create_internal_token(folder);
  REQUIRE(again.ok());
  CHECK_FALSE(again->created);
  CHECK(again->token == first->token);

  // Another folder, another token.
  const auto other = gw::load_or_create_internal_token(state / "other");
  REQUIRE(other.ok());
  CHECK(other->token != first->token);

  // A token file others may read guards nothing: refused, saying how to fix it.
  REQUIRE(::chmod(first->file.c_str(), 0644) == 0);
  const auto loose = gw::load_or_create_internal_token(folder);
  REQUIRE_FALSE(loose.ok());
  CHECK(loose.error().message().find("chmod 600") != std::string::npos);

  // So is one that holds no usable token.
  REQUIRE(::chmod(first->file.c_str(), 0600) == 0);
  std::ofstream(first->file) << "short\n";
  const auto bad = gw::load_or_create_internal_token(folder);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message().find("at least 16 characters") != std::string::npos);
}
