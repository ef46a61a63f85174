// Each API's answer writer: the events of a stream add up to the answer the same calls write
// whole, and a stream that fails ends with the API's error event.
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include "edge/gateway/openai/answer_writer.h"

namespace gw = edge::gateway;
namespace json = boost::json;
using edge::backend::finish_reason;
using edge::backend::token_usage;

namespace {

// One choice's output as the parser hands it over: reasoning, text, two tool calls.
const std::vector<gw::output_event> parsed{
    gw::reasoning_delta{"Paris, "}, gw::reasoning_delta{"so weather."}, gw::content_delta{"Looking."},
    gw::tool_call_begin{0, "id_a", "get_weather"}, gw::tool_call_arguments{0, R"({"city":)"},
    gw::tool_call_arguments{0, R"("Paris"})"}, gw::tool_call_begin{1, "id_b", "get_time"},
    gw::tool_call_arguments{1, "{}"}};
const token_usage final_usage{.prompt_tokens = 30, .completion_tokens = 12, .cached_tokens = 16};

// Drives a writer through one answer, as the relay does; the stream's events, or the whole answer.
struct written {
  std::vector<gw::named_event> events;
  json::value whole;
};
written drive(gw::answer_writer& writer, bool stream) {
  written out;
  if (stream) writer.open(out.events);
  for (const auto& event : parsed) writer.output(0, event, nullptr, out.events);
  writer.choice_end(0, finish_reason::stop, {}, nullptr, out.events);
  if (stream) {
    writer.end(final_usage, 5, out.events);
  } else {
    out.whole = json::parse(writer.whole({"null"}, final_usage, 5));
  }
  return out;
}

gw::openai_request chat_request(bool stream) {
  gw::openai_request r;
  r.api = gw::openai_api::chat_completions;
  r.stream = stream;
  r.include_usage = stream;
  return r;
}

}  // namespace

TEST_CASE("OpenAI's chat chunks add up to the whole answer's message, reasoning, calls and usage") {
  const gw::response_meta meta{gw::openai_api::chat_completions, "chatcmpl-1", 7, "tiny"};
  auto whole_writer = gw::make_openai_writer(meta, chat_request(false), "");
  const json::value whole = drive(*whole_writer, false).whole;
  auto stream_writer = gw::make_openai_writer(meta, chat_request(true), "");
  const written streamed = drive(*stream_writer, true);

  std::string content;
  std::string reasoning;
  json::array calls;
  std::string finish;
  json::value usage;
  for (const auto& event : streamed.events) {
    CHECK(event.name.empty());
    if (event.data.at("choices").as_array().empty()) {
      usage = event.data.at("usage");
      continue;
    }
    const json::object& choice = event.data.at("choices").at(0).as_object();
    if (!choice.at("finish_reason").is_null()) finish = json::value_to<std::string>(choice.at("finish_reason"));
    const json::object& delta = choice.at("delta").as_object();
    if (const auto* text = delta.if_contains("content"); text && text->is_string()) content += text->as_string();
    if (const auto* text = delta.if_contains("reasoning_content")) reasoning += text->as_string();
    if (const auto* list = delta.if_contains("tool_calls")) {
      const json::object& call = list->at(0).as_object();
      const auto index = json::value_to<std::size_t>(call.at("index"));
      if (index == calls.size()) {
        calls.push_back({{"id", call.at("id")},
                         {"type", "function"},
                         {"function", {{"name", call.at("function").at("name")}, {"arguments", ""}}}});
      }
      json::string& arguments = calls[index].at("function").at("arguments").as_string();
      arguments += call.at("function").at("arguments").as_string();
    }
  }
  const json::object& message = whole.at("choices").at(0).at("message").as_object();
  CHECK(content == json::value_to<std::string>(message.at("content")));
  CHECK(reasoning == json::value_to<std::string>(message.at("reasoning_content")));
  CHECK(json::value(calls) == message.at("tool_calls"));
  CHECK(finish == "tool_calls");
  CHECK(whole.at("choices").at(0).at("finish_reason") == "tool_calls");
  CHECK(usage == whole.at("usage"));
  CHECK(stream_writer->ends_with_done());
}

TEST_CASE("Anthropic's events add up to the whole message: blocks, stop reason and usage") {
  auto whole_writer = gw::make_messages_writer("msg_1", "tiny", {.prompt_tokens = 30});
  const json::value whole = drive(*whole_writer, false).whole;
  auto stream_writer = gw::make_messages_writer("msg_1", "tiny", {.prompt_tokens = 30});
  const written streamed = drive(*stream_writer, true);

  REQUIRE(streamed.events.front().name == "message_start");
  json::object message = streamed.events.front().data.at("message").as_object();
  json::array& content = message["content"].as_array();
  for (const auto& event : streamed.events) {
    CHECK(event.name == json::value_to<std::string>(event.data.at("type")));
    if (event.name == "content_block_start") content.push_back(event.data.at("content_block"));
    if (event.name == "content_block_delta") {
      json::object& block = content.at(json::value_to<std::size_t>(event.data.at("index"))).as_object();
      const json::object& delta = event.data.at("delta").as_object();
      if (delta.at("type") == "text_delta") block["text"].as_string() += delta.at("text").as_string();
      if (delta.at("type") == "thinking_delta") block["thinking"].as_string() += delta.at("thinking").as_string();
      if (delta.at("type") == "input_json_delta") {
        std::string partial = block.contains("partial") ? json::value_to<std::string>(block["partial"]) : "";
        partial += delta.at("partial_json").as_string();
        block["partial"] = partial;
      }
    }
    if (event.name == "content_block_stop") {
      json::object& block = content.at(json::value_to<std::size_t>(event.data.at("index"))).as_object();
      if (block.contains("partial")) {
        block["input"] = json::parse(block["partial"].as_string());
        block.erase("partial");
      }
    }
    if (event.name == "message_delta") {
      message["stop_reason"] = event.data.at("delta").at("stop_reason");
      message["stop_sequence"] = event.data.at("delta").at("stop_sequence");
      message["usage"] = event.data.at("usage");
    }
  }
  CHECK(streamed.events.back().name == "message_stop");
  CHECK(json::value(message) == whole);
  CHECK(whole.at("stop_reason") == "tool_use");
  CHECK(whole.at("content").as_array().size() == 4);
  CHECK_FALSE(stream_writer->ends_with_done());
}

TEST_CASE("a stream that fails ends with the API's error event") {
  const gw::refusal shutdown{.kind = gw::refusal_kind::shutting_down, .message = "The server is shutting down"};
  const auto messages = gw::make_messages_writer("msg_1", "tiny", {});
  const gw::named_event error = messages->failure(shutdown);
  CHECK(error.name == "error");
  CHECK(json::value(error.data) ==
        json::parse(R"({"type":"error","error":{"type":"overloaded_error","message":"The server is shutting down"}})"));
  const gw::refusal failed{.kind = gw::refusal_kind::engine_failed, .message = "The engine failed: x"};
  CHECK(messages->failure(failed).data.at("error").at("type") == "api_error");

  const auto chat = gw::make_openai_writer({gw::openai_api::chat_completions, "chatcmpl-1", 7, "tiny"},
                                           chat_request(true), "");
  const gw::named_event openai_error = chat->failure(shutdown);
  CHECK(openai_error.name.empty());
  CHECK(openai_error.data == gw::refusal_body(shutdown));
}
