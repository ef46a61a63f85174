// The gateway ↔ backend wire format: requests and events survive the trip, bad input is
// refused naming the field, and the identity check says why a backend cannot be used.
#include <doctest/doctest.h>

#include <string>
#include <variant>

#include "edge/gateway/internal_protocol.h"
#include "edge/gateway/remote_backend_pool.h"

namespace gw = edge::gateway;
namespace be = edge::backend;

TEST_CASE("a generate request survives encoding and parsing") {
  be::generate_request r;
  r.id = "req_1";
  r.tenant = "acme";
  r.weight = 2.5;
  r.priority = -3;
  r.cache_salt = "salt";
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
  const auto parsed = gw::parse_generate_request(gw::encode_generate_request(r));
  REQUIRE(std::holds_alternative<be::generate_request>(parsed));
  const auto& back = std::get<be::generate_request>(parsed);
  CHECK(back.id == r.id);
  CHECK(back.tenant == r.tenant);
  CHECK(back.weight == r.weight);
  CHECK(back.priority == r.priority);
  CHECK(back.cache_salt == r.cache_salt);
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
  REQUIRE(std::holds_alternative<be::generate_request>(largest));
  CHECK(std::get<be::generate_request>(largest).sampling.repetition_penalty == doctest::Approx(3.4e38f));
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

TEST_CASE("info and load round-trip, and a mismatch says what differs") {
  gw::backend_info info{.model = "stories260K",
                        .context_length = 512,
                        .chat_template = be::chat_template_kind::llama2,
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
