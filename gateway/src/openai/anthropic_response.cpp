#include "edge/gateway/openai/anthropic_response.h"

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <string>

#include "edge/common/json_fields.h"
#include "edge/gateway/http/json_response.h"

namespace edge::gateway {

std::string_view anthropic_error_type(http::status status) {
  switch (status) {
    case http::status::bad_request: return "invalid_request_error";
    case http::status::unauthorized: return "authentication_error";
    case http::status::forbidden: return "permission_error";
    case http::status::not_found: return "not_found_error";
    case http::status::payload_too_large: return "request_too_large";
    case http::status::too_many_requests: return "rate_limit_error";
    case http::status::service_unavailable: return "overloaded_error";
    default: break;
  }
  return static_cast<unsigned>(status) >= 500 ? "api_error" : "invalid_request_error";
}

boost::json::object anthropic_error_body(http::status status, std::string_view message) {
  return {{"type", "error"}, {"error", {{"type", anthropic_error_type(status)}, {"message", message}}}};
}

response anthropic_error(response res) {
  std::string message = res.body();
  boost::system::error_code failed;
  const boost::json::value body = boost::json::parse(res.body(), failed);
  if (!failed && body.is_object()) {
    const boost::json::value* error = body.get_object().if_contains("error");
    const boost::json::value* text = error != nullptr && error->is_object() ? error->get_object().if_contains("message") : nullptr;
    if (text != nullptr && text->is_string()) message = std::string(text->get_string());
  }
  res.body() = boost::json::serialize(anthropic_error_body(res.result(), message));
  res.set(http::field::content_type, "application/json");
  return res;
}

std::string_view anthropic_stop_reason(backend::finish_reason reason, bool made_tool_calls,
                                       std::string_view stop_string) {
  switch (reason) {
    case backend::finish_reason::length: return "max_tokens";
    case backend::finish_reason::content_filter: return "refusal";
    case backend::finish_reason::stop:
    // A failed answer ends with an error event, not a stop reason: these two are never asked.
    case backend::finish_reason::abort:
    case backend::finish_reason::error: break;
  }
  if (made_tool_calls) return "tool_use";
  return stop_string.empty() ? "end_turn" : "stop_sequence";
}

messages_answer::messages_answer(std::string id, std::string model, const backend::token_usage& usage)
    : id_(std::move(id)), model_(std::move(model)), usage_(usage) {}

boost::json::object messages_answer::usage_json() const {
  // Anthropic counts the prompt's tokens read from its cache apart from the others.
  return {{"input_tokens", usage_.prompt_tokens - usage_.cached_tokens},
          {"cache_creation_input_tokens", 0},
          {"cache_read_input_tokens", usage_.cached_tokens},
          {"output_tokens", usage_.completion_tokens}};
}

named_event messages_answer::start() const {
  boost::json::object message = this->message();
  message["content"] = boost::json::array();
  return {"message_start", {{"type", "message_start"}, {"message", std::move(message)}}};
}

void messages_answer::close(std::vector<named_event>& out) {
  if (!open_) return;
  open_ = false;
  const auto index = static_cast<std::int64_t>(blocks_.size()) - 1;
  out.push_back({"content_block_stop", {{"type", "content_block_stop"}, {"index", index}}});
}

void messages_answer::add(const output_event& event, std::vector<named_event>& out) {
  // The block the event belongs to, and the text it adds.
  std::string type;
  std::string_view piece;
  const tool_call_begin* call = std::get_if<tool_call_begin>(&event);
  if (const auto* content = std::get_if<content_delta>(&event)) {
    type = "text";
    piece = content->text;
  } else if (const auto* reasoning = std::get_if<reasoning_delta>(&event)) {
    type = "thinking";
    piece = reasoning->text;
  } else if (call != nullptr) {
    type = "tool_use";
  } else {
    type = "tool_use";
    piece = std::get<tool_call_arguments>(event).text;
  }
  const bool same_block = open_ && blocks_.back().type == type && call == nullptr;
  if (!same_block) {
    if (piece.empty() && call == nullptr) return;
    close(out);
    block opened{.type = type, .text = {}, .id = call != nullptr ? call->id : "", .name = call != nullptr ? call->name : ""};
    boost::json::object content{{"type", type}};
    if (type == "text") content["text"] = "";
    if (type == "thinking") {
      content["thinking"] = "";
      content["signature"] = "";
    }
    if (type == "tool_use") {
      content["id"] = opened.id;
      content["name"] = opened.name;
      content["input"] = boost::json::object();
    }
    blocks_.push_back(std::move(opened));
    open_ = true;
    out.push_back({"content_block_start",
                   {{"type", "content_block_start"},
                    {"index", static_cast<std::int64_t>(blocks_.size()) - 1},
                    {"content_block", std::move(content)}}});
  }
  if (piece.empty()) return;
  blocks_.back().text += piece;
  boost::json::object delta;
  if (type == "text") {
    delta = {{"type", "text_delta"}, {"text", piece}};
  } else if (type == "thinking") {
    delta = {{"type", "thinking_delta"}, {"thinking", piece}};
  } else {
    delta = {{"type", "input_json_delta"}, {"partial_json", piece}};
  }
  out.push_back({"content_block_delta",
                 {{"type", "content_block_delta"},
                  {"index", static_cast<std::int64_t>(blocks_.size()) - 1},
                  {"delta", std::move(delta)}}});
}

void messages_answer::finish(backend::finish_reason reason, std::string_view stop_string,
                             const backend::token_usage& usage, std::vector<named_event>& out) {
  close(out);
  usage_ = usage;
  const bool calls = std::any_of(blocks_.begin(), blocks_.end(), [](const block& b) { return b.type == "tool_use"; });
  stop_reason_ = std::string(anthropic_stop_reason(reason, calls, stop_string));
  if (*stop_reason_ == "stop_sequence") stop_sequence_ = std::string(stop_string);
  boost::json::value sequence = nullptr;
  if (stop_sequence_) sequence = *stop_sequence_;
  out.push_back({"message_delta",
                 {{"type", "message_delta"},
                  {"delta", {{"stop_reason", *stop_reason_}, {"stop_sequence", sequence}}},
                  {"usage", usage_json()}}});
  out.push_back({"message_stop", {{"type", "message_stop"}}});
}

boost::json::object messages_answer::message() const {
  boost::json::array content;
  for (const block& b : blocks_) {
    if (b.type == "text") {
      content.push_back(boost::json::object{{"type", "text"}, {"text", b.text}});
    } else if (b.type == "thinking") {
      content.push_back(boost::json::object{{"type", "thinking"}, {"thinking", b.text}, {"signature", ""}});
    } else {
      // The call's arguments as the object they spell; a model's call that is not a JSON object
      // (its syntax unconstrained) is given as {} rather than as text the schema does not allow.
      boost::system::error_code failed;
      boost::json::value input =
          boost::json::parse(b.text.empty() ? std::string_view("{}") : b.text, failed, {}, {.max_depth = max_json_depth + 1});
      if (failed || !input.is_object()) input = boost::json::object();
      content.push_back(boost::json::object{{"type", "tool_use"}, {"id", b.id}, {"name", b.name}, {"input", std::move(input)}});
    }
  }
  boost::json::object message{{"id", id_},
                              {"type", "message"},
                              {"role", "assistant"},
                              {"model", model_},
                              {"content", std::move(content)},
                              {"stop_reason", nullptr},
                              {"stop_sequence", nullptr},
                              {"usage", usage_json()}};
  if (stop_reason_) message["stop_reason"] = *stop_reason_;
  if (stop_sequence_) message["stop_sequence"] = *stop_sequence_;
  return message;
}

response count_tokens_response(std::int64_t input_tokens) {
  return json_response(http::status::ok, boost::json::object{{"input_tokens", input_tokens}});
}

}  // namespace edge::gateway
