#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <optional>
#include <vector>

#include "edge/gateway/openai/openai_response.h"
#include "edge/gateway/openai/output_parser.h"

namespace gw = edge::gateway;
namespace backend = edge::backend;

namespace {

std::string text(const boost::json::object& o) { return boost::json::serialize(o); }

const backend::token_usage usage{.prompt_tokens = 5, .completion_tokens = 3, .cached_tokens = 2};

}  // namespace

TEST_CASE("a whole chat answer has OpenAI's shape and usage") {
  const gw::response_meta meta{gw::openai_api::chat_completions, "chatcmpl-req_1", 1700000000, "m"};
  const gw::choice_result choice{
      .message = {.content = "Hi \"there\""}, .reason = backend::finish_reason::stop, .logprobs = "null"};
  CHECK(gw::completion_body(meta, std::span(&choice, 1), usage) ==
        R"({"id":"chatcmpl-req_1","object":"chat.completion","created":1700000000,"model":"m",)"
        R"("choices":[{"index":0,"message":{"role":"assistant","content":"Hi \"there\"","refusal":null},)"
        R"("logprobs":null,"finish_reason":"stop"}],)"
        R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST_CASE("a whole completions answer is a text_completion") {
  const gw::response_meta meta{gw::openai_api::completions, gw::response_id(gw::openai_api::completions, "req_2"), 1, "m"};
  const gw::choice_result choice{.text = "abc", .reason = backend::finish_reason::length, .logprobs = "null"};
  CHECK(gw::completion_body(meta, std::span(&choice, 1), usage) ==
        R"({"id":"cmpl-req_2","object":"text_completion","created":1,"model":"m",)"
        R"("choices":[{"index":0,"text":"abc","logprobs":null,"finish_reason":"length"}],)"
        R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST_CASE("chat chunks: role first, content deltas, the finish, then usage; usage null before it when asked") {
  const gw::chunk_builder chunks({gw::openai_api::chat_completions, "chatcmpl-x", 7, "m"}, /*include_usage=*/true);
  const std::string head = R"({"id":"chatcmpl-x","object":"chat.completion.chunk","created":7,"model":"m",)";
  CHECK(text(chunks.role()) == head + R"("choices":[{"index":0,"delta":{"role":"assistant","content":""},)"
                                      R"("logprobs":null,"finish_reason":null}],"usage":null})");
  CHECK(text(chunks.content("Once")) ==
        head + R"("choices":[{"index":0,"delta":{"content":"Once"},"logprobs":null,"finish_reason":null}],"usage":null})");
  CHECK(text(chunks.finish(backend::finish_reason::stop)) ==
        head + R"("choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}],"usage":null})");
  CHECK(text(chunks.usage(usage)) ==
        head + R"("choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,)"
               R"("prompt_tokens_details":{"cached_tokens":2}}})");
}

TEST_CASE("completion chunks carry text and no usage member unless asked") {
  const gw::chunk_builder chunks({gw::openai_api::completions, "cmpl-x", 7, "m"}, /*include_usage=*/false);
  CHECK(text(chunks.content("a")) == R"({"id":"cmpl-x","object":"text_completion","created":7,"model":"m",)"
                                     R"("choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":null}]})");
  CHECK(text(chunks.finish(backend::finish_reason::length)) ==
        R"({"id":"cmpl-x","object":"text_completion","created":7,"model":"m",)"
        R"("choices":[{"index":0,"text":"","logprobs":null,"finish_reason":"length"}]})");
}

TEST_CASE("several choices: each with its index, reason and logprobs; chunks name their choice") {
  const gw::response_meta meta{gw::openai_api::chat_completions, "chatcmpl-n", 3, "m"};
  const std::vector<gw::choice_result> choices = {
      {.message = {.content = "a"},
       .reason = backend::finish_reason::stop,
       .logprobs = R"({"content":[]})"},
      {.message = {.content = "bc"}, .reason = backend::finish_reason::length, .logprobs = "null"}};
  CHECK(gw::completion_body(meta, choices, usage) ==
        R"({"id":"chatcmpl-n","object":"chat.completion","created":3,"model":"m","choices":[)"
        R"({"index":0,"message":{"role":"assistant","content":"a","refusal":null},"logprobs":{"content":[]},)"
        R"("finish_reason":"stop"},)"
        R"({"index":1,"message":{"role":"assistant","content":"bc","refusal":null},"logprobs":null,)"
        R"("finish_reason":"length"}],)"
        R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
  const gw::chunk_builder chunks(meta, /*include_usage=*/false);
  const std::string head = R"({"id":"chatcmpl-n","object":"chat.completion.chunk","created":3,"model":"m",)";
  CHECK(text(chunks.role(2)) == head + R"("choices":[{"index":2,"delta":{"role":"assistant","content":""},)"
                                       R"("logprobs":null,"finish_reason":null}]})");
  CHECK(text(chunks.content("x", 1, boost::json::object{{"content", boost::json::array{}}})) ==
        head + R"("choices":[{"index":1,"delta":{"content":"x"},"logprobs":{"content":[]},"finish_reason":null}]})");
  CHECK(text(chunks.finish(backend::finish_reason::length, 1)) ==
        head + R"("choices":[{"index":1,"delta":{},"logprobs":null,"finish_reason":"length"}]})");
}

TEST_CASE("the models API lists the served model") {
  gw::serving_model model;
  model.id = "stories260K";
  model.created = 1700000000;
  model.context_length = 512;
  CHECK(text(gw::model_list(model)) ==
        R"({"object":"list","data":[{"id":"stories260K","object":"model","created":1700000000,)"
        R"("owned_by":"edgeinfer","max_model_len":512}]})");
}

// ---- tool calls and reasoning -----------------------------------------------------------------

namespace {

gw::choice_result calls_only(backend::finish_reason reason) {
  gw::choice_result result{.reason = reason};
  result.message.tool_calls = {{"call_1", "get_weather", R"({"city":"Paris"})"}, {"functions.f:1", "f", "{}"}};
  return result;
}

boost::json::object answer_of(const gw::response_meta& meta, const gw::choice_result& choice,
                              std::optional<std::int64_t> reasoning_tokens = std::nullopt) {
  return boost::json::parse(gw::completion_body(meta, std::span(&choice, 1), usage, reasoning_tokens)).as_object();
}

}  // namespace

TEST_CASE("a whole answer with only tool calls: content null, tool_calls, finish_reason tool_calls") {
  const gw::response_meta meta{gw::openai_api::chat_completions, "chatcmpl-t", 3, "m"};
  CHECK(text(answer_of(meta, calls_only(backend::finish_reason::stop))) ==
        R"({"id":"chatcmpl-t","object":"chat.completion","created":3,"model":"m","choices":[{"index":0,"message":)"
        R"({"role":"assistant","content":null,"refusal":null,"tool_calls":[)"
        R"({"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}},)"
        R"({"id":"functions.f:1","type":"function","function":{"name":"f","arguments":"{}"}}]},)"
        R"("logprobs":null,"finish_reason":"tool_calls"}],)"
        R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2}}})");
  // Cut short by max_tokens, it stays "length".
  const auto cut = answer_of(meta, calls_only(backend::finish_reason::length));
  CHECK(cut.at("choices").as_array()[0].as_object().at("finish_reason") == "length");
}

TEST_CASE("a whole answer with reasoning: reasoning_content and reasoning_tokens") {
  const gw::response_meta meta{gw::openai_api::chat_completions, "chatcmpl-r", 3, "m"};
  gw::choice_result result;
  result.message.reasoning = "thought";
  result.message.content = "answer";
  CHECK(text(answer_of(meta, result, 2)) ==
        R"({"id":"chatcmpl-r","object":"chat.completion","created":3,"model":"m","choices":[{"index":0,"message":)"
        R"({"role":"assistant","content":"answer","refusal":null,"reasoning_content":"thought"},)"
        R"("logprobs":null,"finish_reason":"stop"}],)"
        R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2},)"
        R"("completion_tokens_details":{"reasoning_tokens":2}}})");
  // Reasoning only (cut short inside the block): content null; no reasoning: null.
  result.message.content.clear();
  result.reason = backend::finish_reason::length;
  auto whole = answer_of(meta, result, 2);
  CHECK(whole.at("choices").as_array()[0].as_object().at("message").as_object().at("content").is_null());
  result = {.message = {.content = "hi"}};
  whole = answer_of(meta, result, 0);
  CHECK(whole.at("choices").as_array()[0].as_object().at("message").as_object().at("reasoning_content").is_null());
}

TEST_CASE("chat chunks of reasoning and tool calls have OpenAI's delta shapes") {
  const gw::chunk_builder chunks({gw::openai_api::chat_completions, "chatcmpl-x", 7, "m"}, /*include_usage=*/false);
  const std::string head = R"({"id":"chatcmpl-x","object":"chat.completion.chunk","created":7,"model":"m",)";
  const std::string tail = R"(,"logprobs":null,"finish_reason":null}]})";
  CHECK(text(chunks.event(gw::reasoning_delta{"hmm"})) ==
        head + R"("choices":[{"index":0,"delta":{"reasoning_content":"hmm"})" + tail);
  CHECK(text(chunks.event(gw::content_delta{"Hi"})) == head + R"("choices":[{"index":0,"delta":{"content":"Hi"})" + tail);
  CHECK(text(chunks.event(gw::tool_call_begin{1, "call_9", "get_weather"})) ==
        head + R"("choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_9","type":"function",)"
               R"("function":{"name":"get_weather","arguments":""}}]})" + tail);
  CHECK(text(chunks.event(gw::tool_call_arguments{1, R"({"ci)"})) ==
        head + R"("choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"{\"ci"}}]})" + tail);
  CHECK(text(chunks.finish(backend::finish_reason::stop, 0, nullptr, /*made_tool_calls=*/true)) ==
        head + R"("choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"tool_calls"}]})");
  CHECK(text(chunks.usage(usage, 4)) ==
        head + R"("choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,)"
               R"("prompt_tokens_details":{"cached_tokens":2},"completion_tokens_details":{"reasoning_tokens":4}}})");
}

TEST_CASE("several chat choices: each its own message, reasoning and finish_reason; chunks name their choice") {
  const gw::response_meta meta{gw::openai_api::chat_completions, "chatcmpl-m", 3, "m"};
  std::vector<gw::choice_result> choices(2);
  choices[0].message = {.content = "", .reasoning = "r", .tool_calls = {{"call_1", "f", "{}"}}};
  choices[0].logprobs = R"({"content":[],"refusal":null})";
  choices[1] = {.message = {.content = "plain"}, .reason = backend::finish_reason::length, .logprobs = "null"};
  CHECK(gw::completion_body(meta, choices, usage, 5) ==
        R"({"id":"chatcmpl-m","object":"chat.completion","created":3,"model":"m","choices":[)"
        R"({"index":0,"message":{"role":"assistant","content":null,"refusal":null,"reasoning_content":"r",)"
        R"("tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},)"
        R"("logprobs":{"content":[],"refusal":null},"finish_reason":"tool_calls"},)"
        R"({"index":1,"message":{"role":"assistant","content":"plain","refusal":null,"reasoning_content":null},)"
        R"("logprobs":null,"finish_reason":"length"}],)"
        R"("usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":2},)"
        R"("completion_tokens_details":{"reasoning_tokens":5}}})");

  const gw::chunk_builder chunks(meta, /*include_usage=*/false);
  const std::string head = R"({"id":"chatcmpl-m","object":"chat.completion.chunk","created":3,"model":"m",)";
  const boost::json::value logprobs = boost::json::object{{"content", boost::json::array{}}, {"refusal", nullptr}};
  CHECK(text(chunks.event(gw::reasoning_delta{"r"}, 1, logprobs)) ==
        head + R"("choices":[{"index":1,"delta":{"reasoning_content":"r"},"logprobs":{"content":[],"refusal":null},)"
               R"("finish_reason":null}]})");
  CHECK(text(chunks.event(gw::tool_call_begin{0, "call_1", "f"}, 2)) ==
        head + R"("choices":[{"index":2,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function",)"
               R"("function":{"name":"f","arguments":""}}]},"logprobs":null,"finish_reason":null}]})");
  CHECK(text(chunks.event(gw::tool_call_arguments{0, "{}"}, 2, logprobs)) ==
        head + R"("choices":[{"index":2,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]},)"
               R"("logprobs":{"content":[],"refusal":null},"finish_reason":null}]})");
  CHECK(text(chunks.finish(backend::finish_reason::stop, 2, logprobs, /*made_tool_calls=*/true)) ==
        head + R"("choices":[{"index":2,"delta":{},"logprobs":{"content":[],"refusal":null},)"
               R"("finish_reason":"tool_calls"}]})");
  // Completions have no tool calls: the engine's reason stands.
  const gw::chunk_builder text_chunks({gw::openai_api::completions, "cmpl-m", 3, "m"}, false);
  CHECK(text(text_chunks.finish(backend::finish_reason::stop, 1, nullptr, true)) ==
        R"({"id":"cmpl-m","object":"text_completion","created":3,"model":"m",)"
        R"("choices":[{"index":1,"text":"","logprobs":null,"finish_reason":"stop"}]})");
}

TEST_CASE("the streamed chunks add up to the whole answer") {
  // One parse of an answer with reasoning, content and two calls, sent as chunks and assembled
  // the way OpenAI's clients do (content and arguments appended, a call's fields taken from its
  // first delta), against the whole answer built from the same events.
  gw::output_parser_options options;
  options.reasoning = gw::reasoning_parser_kind::think;
  options.tool_calls = gw::tool_call_parser_kind::hermes;
  options.tools = {{"get_weather", ""}, {"get_time", ""}};
  int next_id = 0;
  options.make_id = [&] { return "call_" + std::to_string(++next_id); };
  gw::output_parser parser(std::move(options));
  const std::string output =
      "<think>\nweather and time\n</think>\n\nBoth:\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
  std::vector<gw::output_event> events;
  for (std::size_t i = 0; i < output.size(); i += 3) {
    for (auto& e : parser.feed(output.substr(i, 3), 1)) events.push_back(std::move(e));
  }
  for (auto& e : parser.finish(false)) events.push_back(std::move(e));

  const gw::chunk_builder chunks({gw::openai_api::chat_completions, "chatcmpl-s", 1, "m"}, false);
  boost::json::object message{{"role", "assistant"}};
  std::string content;
  std::string reasoning;
  boost::json::array calls;
  for (const auto& event : events) {
    const auto chunk = boost::json::parse(text(chunks.event(event))).as_object();
    const auto& delta = chunk.at("choices").as_array()[0].as_object().at("delta").as_object();
    if (const auto* c = delta.if_contains("content")) content += c->as_string();
    if (const auto* r = delta.if_contains("reasoning_content")) reasoning += r->as_string();
    if (const auto* tc = delta.if_contains("tool_calls")) {
      for (const auto& piece : tc->as_array()) {
        const auto& p = piece.as_object();
        const auto index = static_cast<std::size_t>(p.at("index").as_int64());
        if (index == calls.size()) {
          calls.push_back(boost::json::object{{"id", p.at("id")}, {"type", p.at("type")}, {"function", p.at("function")}});
        } else {
          auto& arguments = calls[index].as_object()["function"].as_object()["arguments"].as_string();
          arguments.append(p.at("function").as_object().at("arguments").as_string());
        }
      }
    }
  }
  message["content"] = content.empty() ? boost::json::value(nullptr) : boost::json::value(content);
  message["refusal"] = nullptr;
  message["reasoning_content"] = reasoning;
  message["tool_calls"] = calls;

  gw::choice_result whole;
  for (const auto& e : events) whole.message.add(e);
  const auto answer =
      answer_of({gw::openai_api::chat_completions, "chatcmpl-s", 1, "m"}, whole, parser.reasoning_tokens());
  CHECK(boost::json::value(message) == answer.at("choices").as_array()[0].as_object().at("message"));
  CHECK(calls.size() == 2);
  CHECK(content == "Both:");
  CHECK(reasoning == "weather and time");
}
