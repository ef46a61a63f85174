// Each API's answer writer: the events of a stream add up to the answer the same calls write
// whole, and a stream that fails ends with the API's error event.
#include <doctest/doctest.h>

#include <boost/json.hpp>

#include <map>

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
  auto whole_writer = gw::make_openai_writer(meta, chat_request(false), {""});
  const json::value whole = drive(*whole_writer, false).whole;
  auto stream_writer = gw::make_openai_writer(meta, chat_request(true), {""});
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
  CHECK(streamed.events.at(1).name == "ping");
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
                                           chat_request(true), {""});
  const gw::named_event openai_error = chat->failure(shutdown);
  CHECK(openai_error.name.empty());
  CHECK(openai_error.data == gw::refusal_body(shutdown));
}

TEST_CASE("Responses events: numbered from 0, items opened and closed in order, adding up to the response") {
  json::object echo{{"instructions", nullptr}, {"store", true}, {"tools", json::array()}};
  auto whole_writer = gw::make_responses_writer("resp_req_1", "tiny", 7, echo, true);
  const json::value whole = drive(*whole_writer, false).whole;
  auto stream_writer = gw::make_responses_writer("resp_req_1", "tiny", 7, echo, true);
  const written streamed = drive(*stream_writer, true);

  std::vector<std::string> names;
  std::map<std::int64_t, std::string> deltas;  // per output index: text, reasoning or arguments
  for (std::size_t i = 0; i < streamed.events.size(); ++i) {
    const gw::named_event& e = streamed.events[i];
    CHECK(e.name == json::value_to<std::string>(e.data.at("type")));
    CHECK(e.data.at("sequence_number") == static_cast<std::int64_t>(i));
    names.push_back(e.name);
    if (e.data.contains("delta")) deltas[e.data.at("output_index").as_int64()] += e.data.at("delta").as_string();
  }
  const std::vector<std::string> opening{"response.created", "response.in_progress", "response.output_item.added",
                                         "response.content_part.added", "response.reasoning_text.delta"};
  CHECK(std::vector<std::string>(names.begin(), names.begin() + 5) == opening);
  CHECK(names.back() == "response.completed");
  CHECK(streamed.events.front().data.at("response").at("output").as_array().empty());

  const json::object& last = streamed.events.back().data.at("response").as_object();
  CHECK(json::value(last) == whole);
  const json::array& output = whole.at("output").as_array();
  REQUIRE(output.size() == 4);
  CHECK(output[0].at("type") == "reasoning");
  CHECK(output[0].at("content").at(0).at("text") == "Paris, so weather.");
  CHECK(output[1].at("type") == "message");
  CHECK(output[1].at("content").at(0).at("text") == "Looking.");
  CHECK(output[2].at("type") == "function_call");
  CHECK(output[2].at("call_id") == "id_a");
  CHECK(output[2].at("arguments") == R"({"city":"Paris"})");
  CHECK(output[3].at("name") == "get_time");
  for (std::size_t i = 0; i < output.size(); ++i) {
    CHECK(output[i].at("status") == "completed");
    const json::value& content = output[i].as_object().contains("content") ? output[i].at("content").at(0).at("text")
                                                                           : output[i].at("arguments");
    CHECK(deltas[static_cast<std::int64_t>(i)] == content.as_string());
  }
  CHECK(whole.at("status") == "completed");
  CHECK(whole.at("usage").at("output_tokens_details").at("reasoning_tokens") == 5);
  CHECK(whole.at("usage").at("input_tokens_details").at("cached_tokens") == 16);
  CHECK(whole.at("store") == true);
  REQUIRE(stream_writer->kept().has_value());
  CHECK(json::value(*stream_writer->kept()) == whole);
  CHECK_FALSE(stream_writer->ends_with_done());
}

TEST_CASE("a Responses answer cut by its length is incomplete, and one that fails ends with response.failed") {
  auto writer = gw::make_responses_writer("resp_req_2", "tiny", 7, {}, false);
  std::vector<gw::named_event> events;
  writer->open(events);
  writer->output(0, gw::content_delta{"Once"}, nullptr, events);
  writer->choice_end(0, finish_reason::length, {}, nullptr, events);
  writer->end({.prompt_tokens = 3, .completion_tokens = 1}, std::nullopt, events);
  CHECK(events.back().name == "response.incomplete");
  const json::object& response = events.back().data.at("response").as_object();
  CHECK(response.at("status") == "incomplete");
  CHECK(response.at("incomplete_details") == json::parse(R"({"reason":"max_output_tokens"})"));
  CHECK(response.at("output").at(0).at("status") == "incomplete");
  CHECK_FALSE(writer->kept().has_value());  // store false

  auto failing = gw::make_responses_writer("resp_req_3", "tiny", 7, {}, true);
  events.clear();
  failing->open(events);
  const gw::named_event failed =
      failing->failure({.kind = gw::refusal_kind::shutting_down, .message = "The server is shutting down"});
  CHECK(failed.name == "response.failed");
  CHECK(failed.data.at("sequence_number") == 2);
  CHECK(failed.data.at("response").at("status") == "failed");
  CHECK(failed.data.at("response").at("error") ==
        json::parse(R"({"code":"shutting_down","message":"The server is shutting down"})"));
  CHECK_FALSE(failing->kept().has_value());  // never ended
}
