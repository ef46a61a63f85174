// The Responses API's request read into the chat request: input items as chat messages, tools,
// tool_choice, text.format, and the errors that name their field.
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include "edge/common/format.h"
#include "edge/gateway/openai/responses_request.h"

namespace gw = edge::gateway;

namespace {

gw::openai_request parsed(std::string_view body) {
  auto r = gw::parse_responses_request(body);
  if (auto* error = std::get_if<gw::request_error>(&r)) FAIL(error->message);
  return std::get<gw::openai_request>(std::move(r));
}

void refused(std::string_view body, std::string_view param, std::string_view words) {
  auto r = gw::parse_responses_request(body);
  REQUIRE(std::holds_alternative<gw::request_error>(r));
  const auto& error = std::get<gw::request_error>(r);
  CHECK(error.param == param);
  CHECK_MESSAGE(error.message.find(words) != std::string::npos, error.message);
}

}  // namespace

TEST_CASE("input items become the chat turns a template reads") {
  const auto r = parsed(R"({"instructions": "Be brief.", "input": [
      {"role": "developer", "content": "Use tools."},
      {"role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Paris?"}]},
      {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "I should call it."}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
      {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
      {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "It is 18 C."}]},
      {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": " Sunny."}]}]})");
  CHECK(r.api == gw::openai_api::chat_completions);
  REQUIRE(r.messages.size() == 6);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[0].content == "Be brief.");
  CHECK(r.messages[1].role == "system");  // developer
  CHECK(r.messages[2].content == "Weather in Paris?");
  CHECK(r.messages[3].role == "assistant");
  CHECK(r.messages[3].reasoning_content == "I should call it.");
  CHECK(r.messages[3].content == "Looking.");
  REQUIRE(r.messages[3].tool_calls.size() == 1);
  CHECK(r.messages[3].tool_calls[0].id == "call_1");
  CHECK(r.messages[3].tool_calls[0].arguments == R"({"city":"Paris"})");
  CHECK(r.messages[4].role == "tool");
  CHECK(r.messages[4].tool_call_id == "call_1");
  // Two message items of one answer are one turn, neither text lost.
  CHECK(r.messages[5].content == "It is 18 C. Sunny.");
  REQUIRE(r.responses != nullptr);
  CHECK(r.responses->system_message);
  CHECK(r.responses->conversation.size() == 8);
  CHECK(r.responses->store);
  CHECK(r.responses->echo.at("instructions") == "Be brief.");
}

TEST_CASE("a string input is one user message; empty instructions are no system message") {
  const auto r = parsed(R"({"input": "Hello", "instructions": "", "store": false, "max_output_tokens": 7})");
  REQUIRE(r.messages.size() == 1);
  CHECK(r.messages[0].role == "user");
  CHECK_FALSE(r.responses->system_message);
  CHECK_FALSE(r.responses->store);
  CHECK(r.max_tokens == 7);
  CHECK(r.responses->conversation.at(0).at("role") == "user");
}

TEST_CASE("tools, tool_choice and text.format as chat completions reads them") {
  const auto r = parsed(R"({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"},
      "strict": true}], "tool_choice": {"type": "function", "name": "f"}, "parallel_tool_calls": false})");
  REQUIRE(r.tools.size() == 1);
  CHECK(r.tools[0].json == R"({"type":"function","function":{"name":"f","description":"","parameters":{"type":"object"}}})");
  CHECK(r.choice.mode == gw::tool_choice_mode::named);
  CHECK_FALSE(r.parallel_tool_calls);
  const auto formatted = parsed(R"({"input": "x", "text": {"format": {"type": "json_schema", "name": "a",
      "schema": {"type": "object", "properties": {"ok": {"type": "boolean"}}}}}})");
  CHECK(formatted.grammar != nullptr);
  CHECK(parsed(R"({"input": "x", "reasoning": {"effort": "none"}})").chat_template_kwargs == R"({"enable_thinking":false})");
}

TEST_CASE("what the Responses API refuses names its field") {
  refused(R"({"input": []})", "input", "required");
  refused(R"({"input": [{"type": "input_image", "image_url": "x"}]})", "input[0].type", "only message");
  refused(R"({"input": [{"role": "user", "content": [{"type": "input_image"}]}]})", "input[0].content[0].type",
          "input_text");
  refused(R"({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]})", "input[0].call_id", "string");
  refused(R"({"input": "x", "tools": [{"type": "web_search"}]})", "tools[0].type", "only function tools");
  refused(R"({"input": "x", "tool_choice": "required"})", "tool_choice", "only allowed when 'tools'");
  refused(R"({"input": "x", "tools": [{"type": "function", "name": "f"}], "tool_choice": "required",
      "text": {"format": {"type": "json_object"}}})", "text.format", "cannot be combined");
  refused(R"({"input": "x", "max_output_tokens": 0})", "max_output_tokens", "");
  refused(R"({"input": "x", "background": true})", "background", "not supported");
  refused(R"({"input": "x", "truncation": "middle"})", "truncation", "'auto' or 'disabled'");
  refused(R"({"input": "x", "metadata": {"k": 1}})", "metadata.k", "");
}

TEST_CASE("prompt_cache_key is read as chat completions reads it, and repeated in the response") {
  const auto r = parsed(R"({"input": "x", "prompt_cache_key": "run-7"})");
  CHECK(r.session == "run-7");
  CHECK(r.responses->echo.at("prompt_cache_key") == "run-7");
  const auto none = parsed(R"({"input": "x"})");
  CHECK(none.session.empty());
  CHECK(none.responses->echo.at("prompt_cache_key").is_null());
  refused(R"({"input": "x", "prompt_cache_key": ""})", "prompt_cache_key", "a non-empty string of at most 256 bytes");
  refused(R"({"input": "x", "prompt_cache_key": 7})", "prompt_cache_key", "a non-empty string of at most 256 bytes");
  refused(R"({"input": "x", "prompt_cache_key": ")" + std::string(257, 'k') + "\"}", "prompt_cache_key",
          "a non-empty string of at most 256 bytes");
}

TEST_CASE("vLLM's and llama.cpp's output fields are a 400 here, never ignored; null is no field") {
  for (const char* field : {"guided_json", "guided_choice", "json_schema", "n_predict", "min_tokens", "stop_token_ids",
                            "grammar", "guided_regex", "guided_grammar", "structured_outputs"}) {
    refused(edge::format(R"({{"input": "hi", "{}": ["x"]}})", field), field, "served on /v1/chat/completions");
    CHECK(parsed(edge::format(R"({{"input": "hi", "{}": null}})", field)).messages.size() == 1);
  }
}
