// Anthropic's Messages API read into the chat request: system prompts, content blocks, tool use
// and results, tools and tool_choice, the fields that map to sampling; what it refuses; errors
// rewritten in Anthropic's shape; the answer as its stream's events and as a whole message.
#include <doctest/doctest.h>

#include <boost/json/parse.hpp>

#include <string>

#include "edge/common/format.h"
#include "edge/gateway/http/json_response.h"
#include "edge/gateway/openai/anthropic_request.h"
#include "edge/gateway/openai/anthropic_response.h"

namespace gw = edge::gateway;

namespace {

gw::openai_request messages_ok(std::string_view body, gw::anthropic_route route = gw::anthropic_route::messages) {
  auto parsed = gw::parse_anthropic_request(route, body);
  if (auto* error = std::get_if<gw::request_error>(&parsed)) FAIL("unexpected error: " << error->message);
  return std::get<gw::openai_request>(std::move(parsed));
}

gw::request_error messages_error(std::string_view body, gw::anthropic_route route = gw::anthropic_route::messages) {
  auto parsed = gw::parse_anthropic_request(route, body);
  if (!std::holds_alternative<gw::request_error>(parsed)) FAIL("accepted: " << body);
  return std::get<gw::request_error>(std::move(parsed));
}

}  // namespace

TEST_CASE("a Messages request becomes the chat request the template renders") {
  const auto r = messages_ok(R"({
    "model": "stories260K", "max_tokens": 64, "temperature": 0.5, "top_p": 0.9, "top_k": 20,
    "stop_sequences": ["END"], "stream": true, "metadata": {"user_id": "u-7"},
    "messages": [
      {"role": "user", "content": "What is the weather in Paris?"},
      {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "The user wants weather.", "signature": "abc"},
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18 C"}]},
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "no such city", "is_error": true},
        {"type": "text", "text": "And tomorrow?"}]}
    ],
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": " Use tools."}],
    "tools": [{"name": "get_weather", "description": "Weather now", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "auto", "disable_parallel_tool_use": true}
  })");
  CHECK(r.api == gw::openai_api::chat_completions);
  CHECK(r.model == "stories260K");
  CHECK(r.max_tokens == 64);
  CHECK(r.sampling.temperature == 0.5f);
  CHECK(r.sampling.top_p == 0.9f);
  CHECK(r.sampling.top_k == 20);
  CHECK(r.stop == std::vector<std::string>{"END"});
  CHECK(r.stream);
  CHECK(r.user == "u-7");
  REQUIRE(r.messages.size() == 6);
  CHECK(r.messages[0].role == "system");
  CHECK(r.messages[0].content == "Be brief. Use tools.");
  CHECK(r.messages[1].role == "user");
  CHECK(r.messages[2].role == "assistant");
  CHECK(r.messages[2].content == "Let me look.");
  CHECK(r.messages[2].reasoning_content == "The user wants weather.");
  REQUIRE(r.messages[2].tool_calls.size() == 1);
  CHECK(r.messages[2].tool_calls[0].id == "toolu_1");
  CHECK(r.messages[2].tool_calls[0].name == "get_weather");
  CHECK(r.messages[2].tool_calls[0].arguments == R"({"city":"Paris"})");
  // The user turn's tool results come first, as tool messages; then its text.
  CHECK(r.messages[3].role == "tool");
  CHECK(r.messages[3].tool_call_id == "toolu_1");
  CHECK(r.messages[3].content == "18 C");
  CHECK(r.messages[4].role == "tool");
  CHECK(r.messages[4].content == "Error: no such city");
  CHECK(r.messages[5].role == "user");
  CHECK(r.messages[5].content == "And tomorrow?");
  REQUIRE(r.tools.size() == 1);
  CHECK(r.tools[0].name == "get_weather");
  CHECK(r.tools[0].parameters == R"({"type":"object","properties":{"city":{"type":"string"}}})");
  // The template reads tools in OpenAI's function shape.
  const auto tool = boost::json::parse(r.tools[0].json);
  CHECK(tool.at("type") == "function");
  CHECK(tool.at("function").at("name") == "get_weather");
  CHECK(tool.at("function").at("description") == "Weather now");
  CHECK(tool.at("function").at("parameters").at("type") == "object");
  CHECK(r.choice.mode == gw::tool_choice_mode::auto_select);
  CHECK_FALSE(r.parallel_tool_calls);
}

TEST_CASE("tool_choice any, tool and none; thinking; system entries among the messages") {
  const std::string tools = R"("tools": [{"name": "f", "input_schema": {"type": "object"}}])";
  auto r = messages_ok(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], )" + tools +
                       R"(, "tool_choice": {"type": "any"}})");
  CHECK(r.choice.mode == gw::tool_choice_mode::required);
  CHECK(r.parallel_tool_calls);
  r = messages_ok(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], )" + tools +
                  R"(, "tool_choice": {"type": "tool", "name": "f"}})");
  CHECK(r.choice.mode == gw::tool_choice_mode::named);
  CHECK(r.choice.name == "f");
  r = messages_ok(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], )" + tools +
                  R"(, "tool_choice": {"type": "none"}})");
  CHECK(r.choice.mode == gw::tool_choice_mode::none);
  r = messages_ok(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], )" + tools + "}");
  CHECK(r.choice.mode == gw::tool_choice_mode::auto_select);

  r = messages_ok(R"({"max_tokens": 1, "thinking": {"type": "enabled", "budget_tokens": 1024},
                      "messages": [{"role": "user", "content": "x"}]})");
  CHECK(r.chat_template_kwargs == R"({"enable_thinking":true})");
  r = messages_ok(R"({"max_tokens": 1, "thinking": {"type": "disabled"}, "messages": [{"role": "user", "content": "x"}]})");
  CHECK(r.chat_template_kwargs == R"({"enable_thinking":false})");

  // The system field leads, whether it stands before or after the messages; entries follow.
  r = messages_ok(R"({"max_tokens": 1, "messages": [{"role": "system", "content": "Later."},
                      {"role": "user", "content": "x"}], "system": "First."})");
  REQUIRE(r.messages.size() == 2);
  CHECK(r.messages[0].content == "First.\n\nLater.");

  // count_tokens needs no max_tokens.
  r = messages_ok(R"({"messages": [{"role": "user", "content": "x"}]})", gw::anthropic_route::count_tokens);
  CHECK_FALSE(r.max_tokens);
}

TEST_CASE("what a Messages request may not hold is a 400 naming the field") {
  const auto refused = [](std::string_view body, std::string_view param, std::string_view says) {
    const auto e = messages_error(body);
    CHECK_MESSAGE(e.param == param, e.param);
    CHECK_MESSAGE(e.message.find(says) != std::string::npos, e.message);
  };
  refused(R"({"messages": [{"role": "user", "content": "x"}]})", "max_tokens", "required");
  refused(R"({"max_tokens": 1})", "messages", "required");
  refused(R"({"max_tokens": 0, "messages": [{"role": "user", "content": "x"}]})", "max_tokens", "at least 1");
  refused(R"({"max_tokens": 1, "messages": []})", "messages", "at least one");
  refused(R"({"max_tokens": 1, "messages": [{"role": "tool", "content": "x"}]})", "messages[0].role", "'user' or 'assistant'");
  refused(R"({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})",
          "messages[0].content[0].type", "only text, tool_use");
  refused(R"({"max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]})",
          "messages[0].content[0].type", "a user message cannot hold");
  refused(R"({"max_tokens": 1, "messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": "{}"}]}]})",
          "messages[0].content[0].input", "an object");
  refused(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "web_search"}]})",
          "tools[0].type", "only client tools");
  refused(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]})",
          "tools[0].input_schema", "required");
  refused(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "any"}})",
          "tool_choice", "only allowed when 'tools' are specified");
  refused(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f", "input_schema": {}}],
              "tool_choice": {"type": "tool", "name": "g"}})",
          "tool_choice.name", "not among the tools");
  refused(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "stop_sequences": "END"})", "stop_sequences",
          "an array");
  refused(R"({"max_tokens": 1, "messages": [{"role": "user", "content": "x"}], "thinking": {"type": "sometimes"}})",
          "thinking.type", "'enabled' or 'disabled'");
  refused("{", "", "not valid JSON");
}

TEST_CASE("an error answer is rewritten in Anthropic's shape, its status and headers kept") {
  gw::response res = gw::error_response(edge::gateway::http::status::too_many_requests, "Slow down", "rate_limit_error",
                                        std::nullopt, "rate_limit_exceeded");
  res.set(edge::gateway::http::field::retry_after, "3");
  const gw::response out = gw::anthropic_error(std::move(res));
  CHECK(out.result() == edge::gateway::http::status::too_many_requests);
  CHECK(out[edge::gateway::http::field::retry_after] == "3");
  const auto body = boost::json::parse(out.body());
  CHECK(body.at("type") == "error");
  CHECK(body.at("error").at("type") == "rate_limit_error");
  CHECK(body.at("error").at("message") == "Slow down");
  CHECK(gw::anthropic_error_type(edge::gateway::http::status::unauthorized) == "authentication_error");
  CHECK(gw::anthropic_error_type(edge::gateway::http::status::not_found) == "not_found_error");
  CHECK(gw::anthropic_error_type(edge::gateway::http::status::service_unavailable) == "overloaded_error");
  CHECK(gw::anthropic_error_type(edge::gateway::http::status::internal_server_error) == "api_error");
  CHECK(gw::anthropic_error_type(edge::gateway::http::status::payload_too_large) == "request_too_large");
}

TEST_CASE("a Messages answer opens a block per kind of output, and its whole message is the same fold") {
  gw::messages_answer answer("msg_1", "tiny", {.prompt_tokens = 30, .completion_tokens = 0, .cached_tokens = 16});
  const auto start = answer.start();
  CHECK(start.name == "message_start");
  CHECK(start.data.at("message").at("content").as_array().empty());
  CHECK(start.data.at("message").at("usage").at("input_tokens") == 14);
  CHECK(start.data.at("message").at("usage").at("cache_read_input_tokens") == 16);
  CHECK(start.data.at("message").at("stop_reason").is_null());

  std::vector<gw::named_event> events;
  const std::vector<gw::output_event> parsed{
      gw::reasoning_delta{"Paris, "}, gw::reasoning_delta{"so weather."}, gw::content_delta{""},
      gw::content_delta{"Looking."},  gw::tool_call_begin{0, "toolu_a", "get_weather"},
      gw::tool_call_arguments{0, R"({"city":)"}, gw::tool_call_arguments{0, R"("Paris"})"},
      gw::tool_call_begin{1, "toolu_b", "get_time"}, gw::tool_call_arguments{1, "{}"}};
  for (const auto& e : parsed) answer.add(e, events);
  answer.finish(edge::backend::finish_reason::stop, {}, {.prompt_tokens = 30, .completion_tokens = 12, .cached_tokens = 16},
                events);
  std::vector<std::string> names;
  for (const auto& e : events) names.push_back(e.name + (e.data.contains("index") ? std::to_string(e.data.at("index").as_int64()) : ""));
  const std::vector<std::string> expected{
      "content_block_start0", "content_block_delta0", "content_block_delta0", "content_block_stop0",
      "content_block_start1", "content_block_delta1", "content_block_stop1",
      "content_block_start2", "content_block_delta2", "content_block_delta2", "content_block_stop2",
      "content_block_start3", "content_block_delta3", "content_block_stop3", "message_delta", "message_stop"};
  CHECK(names == expected);
  CHECK(events[0].data.at("content_block").at("type") == "thinking");
  CHECK(events[1].data.at("delta").at("type") == "thinking_delta");
  CHECK(events[5].data.at("delta") == boost::json::parse(R"({"type":"text_delta","text":"Looking."})"));
  CHECK(events[7].data.at("content_block") ==
        boost::json::parse(R"({"type":"tool_use","id":"toolu_a","name":"get_weather","input":{}})"));
  CHECK(events[8].data.at("delta") == boost::json::parse(R"({"type":"input_json_delta","partial_json":"{\"city\":"})"));
  CHECK(events[14].data.at("delta").at("stop_reason") == "tool_use");
  CHECK(events[14].data.at("usage").at("output_tokens") == 12);

  const auto message = answer.message();
  CHECK(message.at("id") == "msg_1");
  CHECK(message.at("type") == "message");
  CHECK(message.at("role") == "assistant");
  CHECK(message.at("stop_reason") == "tool_use");
  CHECK(message.at("content") == boost::json::parse(R"([
    {"type":"thinking","thinking":"Paris, so weather.","signature":""},
    {"type":"text","text":"Looking."},
    {"type":"tool_use","id":"toolu_a","name":"get_weather","input":{"city":"Paris"}},
    {"type":"tool_use","id":"toolu_b","name":"get_time","input":{}}])"));
  CHECK(message.at("usage") == boost::json::parse(
      R"({"input_tokens":14,"cache_creation_input_tokens":0,"cache_read_input_tokens":16,"output_tokens":12})"));
}

TEST_CASE("Anthropic's stop reasons") {
  using edge::backend::finish_reason;
  CHECK(gw::anthropic_stop_reason(finish_reason::stop, false) == "end_turn");
  CHECK(gw::anthropic_stop_reason(finish_reason::stop, true) == "tool_use");
  CHECK(gw::anthropic_stop_reason(finish_reason::length, true) == "max_tokens");
  CHECK(gw::anthropic_stop_reason(finish_reason::content_filter, false) == "refusal");
  // An answer cut by its length with text only, and one with nothing at all.
  gw::messages_answer text("msg_2", "tiny", {});
  std::vector<gw::named_event> events;
  text.add(gw::content_delta{"Once"}, events);
  text.finish(finish_reason::length, {}, {.prompt_tokens = 3, .completion_tokens = 1}, events);
  CHECK(text.message().at("stop_reason") == "max_tokens");
  gw::messages_answer empty("msg_3", "tiny", {});
  events.clear();
  empty.finish(finish_reason::stop, {}, {}, events);
  REQUIRE(events.size() == 2);
  CHECK(empty.message().at("content").as_array().empty());
  CHECK(empty.message().at("stop_sequence").is_null());
  // A stop sequence names itself, in the stream's message_delta and in the message.
  CHECK(gw::anthropic_stop_reason(finish_reason::stop, false, "END") == "stop_sequence");
  CHECK(gw::anthropic_stop_reason(finish_reason::stop, true, "END") == "tool_use");
  gw::messages_answer stopped("msg_4", "tiny", {});
  events.clear();
  stopped.add(gw::content_delta{"Once"}, events);
  stopped.finish(finish_reason::stop, "END", {}, events);
  CHECK(events.at(events.size() - 2).data.at("delta") ==
        boost::json::parse(R"({"stop_reason":"stop_sequence","stop_sequence":"END"})"));
  CHECK(stopped.message().at("stop_reason") == "stop_sequence");
  CHECK(stopped.message().at("stop_sequence") == "END");
}

TEST_CASE("vLLM's and llama.cpp's output fields are a 400 on the Messages API, never ignored; null is no field") {
  for (const char* field : {"guided_json", "guided_choice", "json_schema", "n_predict", "min_tokens", "stop_token_ids",
                            "grammar", "guided_regex", "guided_grammar", "structured_outputs"}) {
    const auto error = messages_error(edge::format(
        R"({{"max_tokens": 8, "messages": [{{"role": "user", "content": "hi"}}], "{}": 1}})", field));
    CHECK(error.param == field);
    CHECK(error.message.find("served on /v1/chat/completions") != std::string::npos);
    messages_ok(edge::format(R"({{"max_tokens": 8, "messages": [{{"role": "user", "content": "hi"}}], "{}": null}})", field));
  }
}
