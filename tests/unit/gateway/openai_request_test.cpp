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
  REQUIRE(r.prompts.size() == 1);
  CHECK(std::get<std::string>(r.prompts[0]) == "Hi");
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

TEST_CASE("prompts: a string, token ids, or a batch of either (OpenAI's list of prompts)") {
  const auto one = [](std::string_view body) {
    auto r = completion_ok(body);
    REQUIRE(r.prompts.size() == 1);
    return r.prompts[0];
  };
  CHECK(std::get<std::string>(one(R"({"prompt": ["Once"]})")) == "Once");
  CHECK(std::get<std::vector<std::int64_t>>(one(R"({"prompt": [1, 403, 407]})")) == std::vector<std::int64_t>{1, 403, 407});
  CHECK(std::get<std::string>(one(R"({"prompt": ""})")).empty());
  // A batch: strings, token id lists, or both, in order; a repeated key's last value counts.
  const auto batch = completion_ok(R"({"prompt": "x", "prompt": ["Once", [5, 6], ""], "n": 2})");
  REQUIRE(batch.prompts.size() == 3);
  CHECK(std::get<std::string>(batch.prompts[0]) == "Once");
  CHECK(std::get<std::vector<std::int64_t>>(batch.prompts[1]) == std::vector<std::int64_t>{5, 6});
  CHECK(std::get<std::string>(batch.prompts[2]).empty());
  // n x prompts choices at most max_choices (128).
  std::string many = R"({"prompt": [)";
  for (int i = 0; i < 64; ++i) many += std::string(i > 0 ? "," : "") + "\"p\"";
  CHECK(completion_ok(many + R"(], "n": 2})").prompts.size() == 64);
  CHECK(completion_error(many + R"(], "n": 3})").param == "n");
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
  CHECK(!r.messages[1].content.has_value());
  CHECK(!chat_ok(R"({"messages":[{"role":"assistant"}]})").messages[0].content.has_value());
}

TEST_CASE("an agent's request: tools, tool_choice, tool calls and their results, template variables") {
  const auto r = chat_ok(R"({
    "messages": [
      {"role": "system", "content": "Use tools."},
      {"role": "user", "content": "Weather in Paris?", "name": "ann"},
      {"role": "assistant", "content": null, "reasoning_content": "I should call the tool.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "21 C"}]},
      {"role": "tool", "tool_call_id": "call_2", "content": "25 C"}
    ],
    "tools": [
      {"type": "function", "function": {"name": "get_weather", "description": "Weather now.", "strict": true,
       "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "noop"}}
    ],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "parallel_tool_calls": false,
    "chat_template_kwargs": {"enable_thinking": false, "custom": [1, 2]},
    "add_generation_prompt": false
  })");
  REQUIRE(r.messages.size() == 5);
  CHECK(r.messages[1].name == "ann");
  CHECK(!r.messages[2].content.has_value());
  CHECK(r.messages[2].reasoning_content == "I should call the tool.");
  REQUIRE(r.messages[2].tool_calls.size() == 2);
  CHECK(r.messages[2].tool_calls[0].id == "call_1");
  CHECK(r.messages[2].tool_calls[0].name == "get_weather");
  CHECK(r.messages[2].tool_calls[0].arguments == R"({"city": "Paris"})");
  CHECK(r.messages[2].tool_calls[1].arguments == R"({"city":"Rome"})");  // an object: its text
  CHECK(r.messages[3].role == "tool");
  CHECK(r.messages[3].tool_call_id == "call_1");
  CHECK(r.messages[3].content == "21 C");
  REQUIRE(r.tools.size() == 2);
  CHECK(r.tools[0].name == "get_weather");
  CHECK(r.tools[0].description == "Weather now.");
  CHECK(r.tools[0].strict);
  CHECK(r.tools[0].parameters == R"({"type":"object","properties":{"city":{"type":"string"}},"required":["city"]})");
  CHECK(r.tools[1].json == R"({"type":"function","function":{"name":"noop"}})");
  CHECK(r.tools[1].parameters.empty());
  CHECK(r.choice.mode == gw::tool_choice_mode::named);
  CHECK(r.choice.name == "get_weather");
  CHECK(!r.parallel_tool_calls);
  CHECK(r.chat_template_kwargs == R"({"enable_thinking":false,"custom":[1,2]})");
  CHECK(!r.add_generation_prompt);
}

TEST_CASE("tool_choice: auto with tools, none without, as given otherwise") {
  const std::string tools = R"("tools":[{"type":"function","function":{"name":"f"}}])";
  const std::string user = R"("messages":[{"role":"user","content":"x"}])";
  CHECK(chat_ok("{" + user + "}").choice.mode == gw::tool_choice_mode::none);
  CHECK(chat_ok("{" + user + "," + tools + "}").choice.mode == gw::tool_choice_mode::auto_select);
  CHECK(chat_ok("{" + user + "," + tools + R"(,"tool_choice":"none"})").choice.mode == gw::tool_choice_mode::none);
  CHECK(chat_ok("{" + user + "," + tools + R"(,"tool_choice":"required"})").choice.mode == gw::tool_choice_mode::required);
  CHECK(chat_ok("{" + user + R"(,"tool_choice":"auto"})").choice.mode == gw::tool_choice_mode::none);
  CHECK(chat_ok("{" + user + "}").parallel_tool_calls);
  CHECK(chat_ok("{" + user + "}").add_generation_prompt);
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
      {chat_completions, R"({"messages": [{"role": "tool", "content": "x"}]})", "messages[0].tool_call_id", "required"},
      {chat_completions, R"({"messages": [{"role": "function", "content": "x"}]})", "messages[0].role", "role 'tool'"},
      {chat_completions, R"({"messages": [{"role": "tool", "tool_call_id": 3, "content": "x"}]})",
       "messages[0].tool_call_id", "a string"},
      {chat_completions, R"({"messages": [{"role": "tool", "tool_call_id": "c"}]})", "messages[0].content", "required"},
      {chat_completions, R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})", "messages[0].tool_calls",
       "only allowed in assistant messages"},
      {chat_completions, R"({"messages": [{"role": "user", "content": "x", "reasoning_content": "r"}]})",
       "messages[0].reasoning_content", "only allowed in assistant messages"},
      {chat_completions, R"({"messages": [{"role": "user", "content": "x", "name": 5}]})", "messages[0].name", "a string"},
      {chat_completions, R"({"messages": [{"role": "assistant", "tool_calls": {}}]})", "messages[0].tool_calls",
       "an array of tool calls"},
      {chat_completions, R"({"messages": [{"role": "assistant", "tool_calls": [{"type": "code", "function": {}}]}]})",
       "messages[0].tool_calls[0].type", "only 'function'"},
      {chat_completions, R"({"messages": [{"role": "assistant", "tool_calls": [{"id": "c"}]}]})",
       "messages[0].tool_calls[0].function", "required"},
      {chat_completions, R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]})",
       "messages[0].tool_calls[0].function.name", "required"},
      {chat_completions, R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "required"},
      {chat_completions, R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 1}}]}]})",
       "messages[0].tool_calls[0].function.arguments", "a string of JSON"},
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
      {completions, R"({"prompt": ["a", 5]})", "prompt[1]", "a string or an array of token ids"},
      {completions, R"({"prompt": [[1, 2], []]})", "prompt[1]", "empty array"},
      {completions, R"({"prompt": [[1, -2]]})", "prompt[0][1]", "token id"},
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
      {completions, R"({"prompt": "x", "n": 0})", "n", "from 1 to 128"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"n":129})", "n", "from 1 to 128"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"n":-3})", "n", "from 1 to 128"},
      {completions, R"({"prompt": "x", "n": "1"})", "n", "an integer"},
      {completions, R"({"prompt": "x", "best_of": 2})", "best_of", "must equal 'n' (1)"},
      {completions, R"({"prompt": "x", "n": 3, "best_of": 4})", "best_of", "must equal 'n' (3)"},
      {completions, R"({"prompt": "x", "best_of": 0})", "best_of", "at least 1"},
      {completions, R"({"prompt": "x", "stream": "yes"})", "stream", "true or false"},
      {completions, R"({"prompt": "x", "stream": true, "stream_options": 1})", "stream_options", "an object"},
      {completions, R"({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}})",
       "stream_options.include_usage", "true or false"},
      {completions, R"({"prompt": "x", "stream_options": {"include_usage": true}})", "stream_options",
       "only allowed when 'stream' is true"},
      {completions, R"({"prompt": "x", "user": 7})", "user", "a string"},
      {completions, R"({"prompt": "x", "ignore_eos": 1})", "ignore_eos", "true or false"},
      {completions, R"({"prompt": "x", "logprobs": 6})", "logprobs", "from 0 to 5"},
      {completions, R"({"prompt": "x", "logprobs": -1})", "logprobs", "from 0 to 5"},
      {completions, R"({"prompt": "x", "logprobs": true})", "logprobs", "an integer"},
      {completions, R"({"prompt": "x", "echo": "yes"})", "echo", "true or false"},
      {completions, R"({"prompt": "x", "suffix": "end"})", "suffix", "not supported"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"logprobs":1})", "logprobs", "true or false"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":3})", "top_logprobs",
       "requires 'logprobs' to be true"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
       "tools[0].function", "required"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"tools":{}})", "tools", "an array of tools"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"tools":[{"function":{"name":"f"}}]})",
       "tools[0].type", "required"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"retrieval"}]})", "tools[0].type",
       "only 'function' tools"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{}}]})",
       "tools[0].function.name", "required"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"a b"}}]})",
       "tools[0].function.name", "1 to 64 letters"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":""}}]})",
       "tools[0].function.name", "1 to 64 letters"},
      {chat_completions,
       R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":[]}}]})",
       "tools[0].function.parameters", "a JSON Schema object"},
      {chat_completions,
       R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","description":1}}]})",
       "tools[0].function.description", "a string"},
      {chat_completions,
       R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","strict":"yes"}}]})",
       "tools[0].function.strict", "true or false"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"always"})", "tool_choice",
       "'none', 'auto', 'required'"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})", "tool_choice",
       "only allowed when 'tools' are specified"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":5})", "tool_choice",
       "a string or an object"},
      {chat_completions,
       R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}})",
       "tool_choice.function.name", "not among the tools"},
      {chat_completions,
       R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function"}})",
       "tool_choice.function", "required"},
      {chat_completions,
       R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"x","function":{"name":"f"}}})",
       "tool_choice.type", "only 'function'"},
      {chat_completions,
       R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"required","response_format":{"type":"json_object"}})",
       "response_format", "cannot be combined with a 'tool_choice' that forces"},
      {chat_completions,
       R"({"response_format":{"type":"json_schema","json_schema":{"name":"s","schema":{}}},"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"f"}}})",
       "response_format", "the answer is a tool call"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"parallel_tool_calls":"yes"})",
       "parallel_tool_calls", "true or false"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[]})",
       "chat_template_kwargs", "an object"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"messages":[]}})",
       "chat_template_kwargs.messages", "cannot be set"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"bos_token":""}})",
       "chat_template_kwargs.bos_token", "cannot be set"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":1})",
       "add_generation_prompt", "true or false"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"functions":[{"name":"f"}]})", "functions",
       "not supported"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"xml"}})",
       "response_format.type", "'text', 'json_object' or 'json_schema'"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema"}})",
       "response_format.json_schema", "is required"},
      {chat_completions,
       R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"a b","schema":{}}}})",
       "response_format.json_schema.name", "letters"},
      {chat_completions,
       R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"object","properties":{"a":{"type":"string","pattern":"x"}}}}}})",
       "response_format.json_schema.schema.properties.a.pattern", "pattern"},
      {completions, R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"n","schema":7}}})",
       "response_format.json_schema.schema", "a JSON schema"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":0,"logprobs":false})",
       "top_logprobs", "requires 'logprobs' to be true"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21})",
       "top_logprobs", "from 0 to 20"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":-1})",
       "top_logprobs", "from 0 to 20"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":"3"})",
       "top_logprobs", "an integer"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"logit_bias":[5]})", "logit_bias",
       "an object of token ids to biases"},
      {chat_completions, R"({"messages":[{"role":"user","content":"x"}],"logit_bias":{"abc":1}})", "logit_bias.abc",
       "not a token id"},
      {completions, R"({"prompt":"x","logit_bias":{"-5":1}})", "logit_bias.-5", "not a token id"},
      {completions, R"({"prompt":"x","logit_bias":{"99999999999":1}})", "logit_bias.99999999999", "not a token id"},
      {completions, R"({"prompt":"x","logit_bias":{"":1}})", "logit_bias.", "not a token id"},
      {completions, R"({"prompt":"x","logit_bias":{"5":101}})", "logit_bias.5", "from -100 to 100"},
      {completions, R"({"prompt":"x","logit_bias":{"5":-100.5}})", "logit_bias.5", "from -100 to 100"},
      {completions, R"({"prompt":"x","logit_bias":{"5":"ban"}})", "logit_bias.5", "a number"},
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
  const auto r = chat_ok(R"({"messages":[{"role":"user","content":"x"}],"logprobs":false,"top_logprobs":null,
                            "tools":[],"response_format":{"type":"text"},"logit_bias":{},"echo":false})");
  CHECK(r.messages.size() == 1);
  CHECK(!r.logprobs);
  CHECK(r.sampling.logit_bias.empty());
  const auto c = completion_ok(R"({"prompt":"x","logprobs":null,"echo":false,"suffix":""})");
  CHECK(!c.logprobs);
  CHECK(!c.echo);
}

TEST_CASE("chat logprobs: true alone asks for the sampled token's, top_logprobs for alternatives") {
  CHECK(chat_ok(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true})").logprobs == 0);
  // In either order.
  CHECK(chat_ok(R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":5,"logprobs":true})").logprobs == 5);
  CHECK(chat_ok(R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":20})").logprobs == 20);
  CHECK(!chat_ok(R"({"messages":[{"role":"user","content":"x"}],"logprobs":false})").logprobs);
}

TEST_CASE("completions logprobs and echo, n and best_of") {
  const auto r = completion_ok(R"({"prompt":"x","logprobs":5,"echo":true,"n":3,"best_of":3})");
  CHECK(r.logprobs == 5);
  CHECK(r.echo);
  CHECK(r.n == 3);
  CHECK(completion_ok(R"({"prompt":"x","logprobs":0})").logprobs == 0);
  CHECK(completion_ok(R"({"prompt":"x","best_of":1})").n == 1);
  CHECK(chat_ok(R"({"messages":[{"role":"user","content":"x"}],"n":128})").n == 128);
}

TEST_CASE("logit_bias: token ids as keys, a repeated id counts once with its last bias") {
  const auto r = chat_ok(R"({"messages":[{"role":"user","content":"x"}],
                             "logit_bias":{"50256":-100,"7":2.5,"7":100,"0":-0.5}})");
  REQUIRE(r.sampling.logit_bias.size() == 3);
  CHECK(r.sampling.logit_bias[0].id == 50256);
  CHECK(r.sampling.logit_bias[0].bias == -100.0f);
  CHECK(r.sampling.logit_bias[1].id == 7);
  CHECK(r.sampling.logit_bias[1].bias == 100.0f);
  CHECK(r.sampling.logit_bias[2].id == 0);
  // At most 300 ids.
  std::string many = R"({"prompt":"x","logit_bias":{)";
  for (int i = 0; i < 301; ++i) many += (i > 0 ? "," : "") + ("\"" + std::to_string(i) + "\":1");
  many += "}}";
  const auto e = completion_error(many);
  CHECK(e.param == "logit_bias");
  CHECK(e.message.find("at most 300") != std::string::npos);
  // Ids outside the vocabulary are the routes' to refuse (request_rules.h), naming the field.
  const auto outside = edge::backend::find_logit_bias_error(r.sampling.logit_bias, 512);
  REQUIRE(outside);
  CHECK(outside->param == "logit_bias");
  CHECK(outside->message.find("50256") != std::string::npos);
  CHECK(!edge::backend::find_logit_bias_error(r.sampling.logit_bias, 50257));
}

TEST_CASE("response_format json_object and json_schema become the grammar the output must match") {
  const auto object = chat_ok(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"}})");
  REQUIRE(object.grammar != nullptr);
  const auto schema = completion_ok(
      R"({"prompt":"x","response_format":{"type":"json_schema","json_schema":{"name":"p","strict":true,"description":"d",)"
      R"("schema":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}}}})");
  REQUIRE(schema.grammar != nullptr);
  CHECK(schema.grammar->text() != object.grammar->text());
  CHECK(chat_ok(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":"text"}})").grammar == nullptr);
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

TEST_CASE("prompt_cache_key is the session key: a non-empty string of at most 256 bytes") {
  CHECK(chat_ok(R"({"messages":[{"role":"user","content":"hi"}]})").session.empty());
  CHECK(chat_ok(R"({"messages":[{"role":"user","content":"hi"}],"prompt_cache_key":"run-7"})").session == "run-7");
  CHECK(completion_ok(R"({"prompt":"x","prompt_cache_key":"run-7"})").session == "run-7");
  CHECK(completion_ok(R"({"prompt":"x","prompt_cache_key":null})").session.empty());
  const std::string longest(gw::max_session_key_bytes, 'k');
  CHECK(completion_ok(R"({"prompt":"x","prompt_cache_key":")" + longest + "\"}").session == longest);
  // Bytes, not characters: 128 two-byte characters fit, 129 do not.
  std::string wide;
  for (int i = 0; i < 128; ++i) wide += "\xc3\xa9";
  CHECK(completion_ok(R"({"prompt":"x","prompt_cache_key":")" + wide + "\"}").session == wide);

  for (const gw::openai_api api : {gw::openai_api::chat_completions, gw::openai_api::completions}) {
    CAPTURE(static_cast<int>(api));
    const std::string start = api == gw::openai_api::chat_completions ? R"({"messages":[{"role":"user","content":"hi"}],)"
                                                                      : R"({"prompt":"x",)";
    for (const std::string& value : {std::string(R"(42)"), std::string(R"(["a"])"), std::string(R"("")"),
                                     "\"" + longest + "k\"", "\"" + wide + "\xc3\xa9\""}) {
      CAPTURE(value);
      const gw::request_error error = error_of(api, start + R"("prompt_cache_key":)" + value + "}");
      CHECK(error.param == "prompt_cache_key");
      CHECK(error.message == "'prompt_cache_key' must be a non-empty string of at most 256 bytes");
    }
  }
}
