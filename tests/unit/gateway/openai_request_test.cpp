#include <doctest/doctest.h>

#include <string>

#include "edge/gateway/openai/openai_request.h"

namespace gw = edge::gateway;

namespace {

gw::openai_request chat_ok(std::string_view body) {
  auto parsed = gw::parse_openai_request(gw::openai_api::chat_completions, body);
  if (auto* error = std::get_if<gw::request_error>(&parsed)) FAIL("unexpected error: " << error->message);
  return std::get<gw::openai_request>(std::move(parsed));
}

gw::openai_request completion_ok(std::string_view body) {
  auto parsed = gw::parse_openai_request(gw::openai_api::completions, body);
  if (auto* error = std::get_if<gw::request_error>(&parsed)) FAIL("unexpected error: " << error->message);
  return std::get<gw::openai_request>(std::move(parsed));
}

gw::request_error error_of(gw::openai_api api, std::string_view body) {
  auto parsed = gw::parse_openai_request(api, body);
  if (!std::holds_alternative<gw::request_error>(parsed)) FAIL("accepted: " << body);
  return std::get<gw::request_error>(std::move(parsed));
}

gw::request_error completion_error(std::string_view body) { return error_of(gw::openai_api::completions, body); }

}  // namespace

TEST_CASE("a full chat request is read field by field") {
  const auto r = chat_ok(R"({
    "model": "stories260K",
    "messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Once upon"}, {"type": "text", "text": " a time"}]},
      {"role": "assistant", "content": "there was"},
      {"role": "developer", "content": "Say more."}
    ],
    "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 42,
    "stop": ["\n", "The end"], "presence_penalty": 0.5, "frequency_penalty": -0.5, "n": 1,
    "stream": true, "stream_options": {"include_usage": true}, "user": "u-1",
    "some_future_field": {"nested": [1, 2, 3]}
  })");
  CHECK(r.api == gw::openai_api::chat_completions);
  CHECK(r.model == "stories260K");
  REQUIRE(r.messages.size() == 4);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[1].content == "Once upon a time");
  CHECK(r.messages[2].role == "assistant");
  CHECK(r.messages[3].role == "system");  // developer is OpenAI's newer name for it
  CHECK(r.max_tokens == 7);
  CHECK(r.sampling.temperature == doctest::Approx(0.5));
  CHECK(r.sampling.top_p == doctest::Approx(0.9));
  CHECK(r.sampling.top_k == 40);
  CHECK(r.sampling.min_p == doctest::Approx(0.05));
  CHECK(r.sampling.seed == 42u);
  CHECK(r.stop == std::vector<std::string>{"\n", "The end"});
  CHECK(r.sampling.presence_penalty == doctest::Approx(0.5));
  CHECK(r.sampling.frequency_penalty == doctest::Approx(-0.5));
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.user == "u-1");
}

TEST_CASE("defaults: absent and null fields leave the defaults") {
  const auto r = completion_ok(R"({"prompt": "Hi", "max_tokens": null, "temperature": null, "stop": null})");
  CHECK_FALSE(r.model.has_value());
  CHECK(std::get<std::string>(r.prompt) == "Hi");
  CHECK_FALSE(r.max_tokens.has_value());
  CHECK(r.sampling.temperature == doctest::Approx(1.0));
  CHECK(r.stop.empty());
  CHECK_FALSE(r.stream);
  CHECK_FALSE(r.include_usage);
}

TEST_CASE("max_completion_tokens wins over max_tokens in either order") {
  CHECK(chat_ok(R"({"messages":[{"role":"user","content":"x"}],"max_tokens":5,"max_completion_tokens":9})").max_tokens == 9);
  CHECK(chat_ok(R"({"max_completion_tokens":9,"messages":[{"role":"user","content":"x"}],"max_tokens":5})").max_tokens == 9);
  // The completions API has no max_completion_tokens: it is an unknown field there.
  CHECK(completion_ok(R"({"prompt":"x","max_tokens":5,"max_completion_tokens":9})").max_tokens == 5);
}

TEST_CASE("prompts: a string, an array of one string, or token ids") {
  CHECK(std::get<std::string>(completion_ok(R"({"prompt": ["Once"]})").prompt) == "Once");
  CHECK(std::get<std::vector<std::int64_t>>(completion_ok(R"({"prompt": [1, 403, 407]})").prompt) ==
        std::vector<std::int64_t>{1, 403, 407});
  CHECK(std::get<std::string>(completion_ok(R"({"prompt": ""})").prompt).empty());
}

TEST_CASE("integers written as 3.0 are integers; 3.5 is not") {
  CHECK(completion_ok(R"({"prompt":"x","max_tokens":3.0})").max_tokens == 3);
  CHECK(completion_error(R"({"prompt":"x","max_tokens":3.5})").param == "max_tokens");
}

TEST_CASE("seeds take any 64-bit integer") {
  CHECK(completion_ok(R"({"prompt":"x","seed":-1})").sampling.seed == ~std::uint64_t{0});
  CHECK(completion_ok(R"({"prompt":"x","seed":18446744073709551615})").sampling.seed == ~std::uint64_t{0});
}

TEST_CASE("empty stop strings are dropped; top_k -1 means off") {
  const auto r = completion_ok(R"({"prompt":"x","stop":["", "END"],"top_k":-1})");
  CHECK(r.stop == std::vector<std::string>{"END"});
  CHECK(r.sampling.top_k == 0);
}

TEST_CASE("an assistant turn may come without content") {
  const auto r = chat_ok(R"({"messages":[{"role":"user","content":"a"},{"role":"assistant","content":null}]})");
  REQUIRE(r.messages.size() == 2);
  CHECK(r.messages[1].content.empty());
}

struct bad_case {
  gw::openai_api api;
  const char* body;
  const char* param;    // expected `param`
  const char* message;  // a part of the expected message
};

TEST_CASE("bad requests are refused with the field named") {
  using enum gw::openai_api;
  const bad_case cases[] = {
      {chat_completions, R"({"messages": [)", "", "not valid JSON"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}]} trailing)", "", "not valid JSON"},
      {chat_completions, R"([1, 2])", "", "must be a JSON object"},
      {chat_completions, R"("text")", "", "must be a JSON object"},
      {chat_completions, R"({})", "messages", "'messages' is required"},
      {chat_completions, R"({"messages": null})", "messages", "required"},
      {chat_completions, R"({"messages": []})", "messages", "at least one message"},
      {chat_completions, R"({"messages": "hi"})", "messages", "an array"},
      {chat_completions, R"({"messages": [42]})", "messages[0]", "an object"},
      {chat_completions, R"({"messages": [{"content": "x"}]})", "messages[0].role", "required"},
      {chat_completions, R"({"messages": [{"role": 1, "content": "x"}]})", "messages[0].role", "a string"},
      {chat_completions, R"({"messages": [{"role": "wizard", "content": "x"}]})", "messages[0].role", "'wizard'"},
      {chat_completions, R"({"messages": [{"role": "tool", "content": "x"}]})", "messages[0].role", "not supported"},
      {chat_completions, R"({"messages": [{"role": "user"}]})", "messages[0].content", "required"},
      {chat_completions, R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content", "a string or"},
      {chat_completions, R"({"messages": [{"role":"user","content":"a"},{"role":"user","content":[{"type":"image_url"}]}]})",
       "messages[1].content[0].type", "only text"},
      {chat_completions, R"({"messages": [{"role":"user","content":[{"text":"a"}]}]})", "messages[0].content[0].type",
       "required"},
      {chat_completions, R"({"messages": [{"role":"user","content":[{"type":"text","text":3}]}]})",
       "messages[0].content[0].text", "a string"},
      {completions, R"({})", "prompt", "'prompt' is required"},
      {completions, R"({"prompt": 5})", "prompt", "a string"},
      {completions, R"({"prompt": []})", "prompt", "empty array"},
      {completions, R"({"prompt": ["a", "b"]})", "prompt", "batched"},
      {completions, R"({"prompt": [[1, 2]]})", "prompt", "batched"},
      {completions, R"({"prompt": [1, -2]})", "prompt[1]", "token id"},
      {completions, R"({"prompt": [1, "a"]})", "prompt[1]", "token id"},
      {completions, R"({"prompt": "x", "model": 3})", "model", "a string"},
      {completions, R"({"prompt": "x", "max_tokens": "10"})", "max_tokens", "an integer"},
      {completions, R"({"prompt": "x", "max_tokens": 0})", "max_tokens", "at least 1"},
      {completions, R"({"prompt": "x", "max_tokens": 9223372036854775808})", "max_tokens", "an integer"},
      // Past 64 bits simdjson refuses the number itself.
      {completions, R"({"prompt": "x", "max_tokens": 99999999999999999999})", "", "parsing a number"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":-1})",
       "max_completion_tokens", "at least 1"},
      {completions, R"({"prompt": "x", "temperature": "hot"})", "temperature", "a number"},
      {completions, R"({"prompt": "x", "temperature": 2.5})", "temperature", "from 0 to 2"},
      {completions, R"({"prompt": "x", "temperature": -0.1})", "temperature", "from 0 to 2"},
      {completions, R"({"prompt": "x", "top_p": 0})", "top_p", "above 0"},
      {completions, R"({"prompt": "x", "top_p": 1.5})", "top_p", "from 0 to 1"},
      {completions, R"({"prompt": "x", "top_k": -2})", "top_k", "-1, 0"},
      {completions, R"({"prompt": "x", "top_k": 1.5})", "top_k", "an integer"},
      {completions, R"({"prompt": "x", "min_p": 2})", "min_p", "from 0 to 1"},
      {completions, R"({"prompt": "x", "presence_penalty": 3})", "presence_penalty", "from -2 to 2"},
      {completions, R"({"prompt": "x", "frequency_penalty": -2.5})", "frequency_penalty", "from -2 to 2"},
      {completions, R"({"prompt": "x", "repetition_penalty": 0})", "repetition_penalty", "above 0"},
      {completions, R"({"prompt": "x", "seed": "abc"})", "seed", "an integer"},
      {completions, R"({"prompt": "x", "seed": 1.5})", "seed", "an integer"},
      {completions, R"({"prompt": "x", "stop": 5})", "stop", "a string or an array"},
      {completions, R"({"prompt": "x", "stop": ["a", 5]})", "stop[1]", "a string"},
      {completions, R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", "stop", "at most 4"},
      {completions, R"({"prompt": "x", "n": 2})", "n", "must be 1"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"n":3})", "n", "must be 1"},
      {completions, R"({"prompt": "x", "n": "1"})", "n", "an integer"},
      {completions, R"({"prompt": "x", "best_of": 2})", "best_of", "must be 1"},
      {completions, R"({"prompt": "x", "stream": "yes"})", "stream", "true or false"},
      {completions, R"({"prompt": "x", "stream": true, "stream_options": 1})", "stream_options", "an object"},
      {completions, R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})",
       "stream_options.include_usage", "true or false"},
      {completions, R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options",
       "only allowed when 'stream' is true"},
      {completions, R"({"prompt": "x", "user": 7})", "user", "a string"},
      {completions, R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos", "true or false"},
      {completions, R"({"prompt": "x", "logprobs": 2})", "logprobs", "not supported"},
      {completions, R"({"prompt": "x", "echo": true})", "echo", "not supported"},
      {completions, R"({"prompt": "x", "suffix": "end"})", "suffix", "not supported"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})", "logprobs", "not supported"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":3})", "top_logprobs",
       "not supported"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}]})", "functions",
       "not supported"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})",
       "response_format.type", "only 'text'"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"50256":-100}})", "logit_bias",
       "not supported"},
  };
  for (const bad_case& c : cases) {
    const std::string body = c.body;
    CAPTURE(body);
    const gw::request_error e = error_of(c.api, c.body);
    CHECK(e.param == c.param);
    CHECK_MESSAGE(e.message.find(c.message) != std::string::npos, e.message);
  }
}

TEST_CASE("fields that are off are accepted: logprobs false, empty tools, text response_format") {
  const auto r = chat_ok(R"({"messages":[{"role":"user","content":"x"}],"logprobs":false,"top_logprobs":0,
                            "tools":[],"response_format":{"type":"text"},"logit_bias":{},"echo":false})");
  CHECK(r.messages.size() == 1);
  CHECK(completion_ok(R"({"prompt":"x","logprobs":null,"echo":false,"suffix":""})").messages.empty());
}

TEST_CASE("fields of the other API are ignored like any unknown field") {
  CHECK(completion_ok(R"({"prompt":"x","messages":5})").messages.empty());
  CHECK(chat_ok(R"({"messages":[{"role":"user","content":"x"}],"prompt":5,"best_of":7})").messages.size() == 1);
}

TEST_CASE("a repeated key counts once: the last one wins") {
  const auto r = completion_ok(R"({"prompt":"x","stop":["a","b","c"],"stop":["d","e","f"],"stop":"g"})");
  CHECK(r.stop == std::vector<std::string>{"g"});
  const auto chat = chat_ok(R"({"messages":[{"role":"user","content":"a"}],"messages":[{"role":"user","content":"b"}]})");
  REQUIRE(chat.messages.size() == 1);
  CHECK(chat.messages[0].content == "b");
}
