#include "edge/gateway/openai/openai_response.h"

#include <boost/json/array.hpp>
#include <boost/json/serialize.hpp>

namespace edge::gateway {
namespace {

namespace json = boost::json;

// Who owns the served model, in the models API.
constexpr std::string_view owner = "edgeinfer";

bool is_chat(const response_meta& meta) { return meta.api == openai_api::chat_completions; }

json::object header(const response_meta& meta, bool chunk) {
  json::object out;
  out["id"] = meta.id;
  out["object"] = is_chat(meta) ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  out["created"] = meta.created;
  out["model"] = meta.model;
  return out;
}

json::object message_json(const assistant_message& m, bool reasoning_on) {
  json::object message;
  message["role"] = "assistant";
  const bool nothing_but_calls_or_reasoning = m.content.empty() && (!m.tool_calls.empty() || !m.reasoning.empty());
  message["content"] = nothing_but_calls_or_reasoning ? json::value(nullptr) : json::value(m.content);
  message["refusal"] = nullptr;
  if (reasoning_on) message["reasoning_content"] = m.reasoning.empty() ? json::value(nullptr) : json::value(m.reasoning);
  if (!m.tool_calls.empty()) {
    json::array calls;
    for (const assembled_tool_call& call : m.tool_calls) {
      calls.push_back(json::object{{"id", call.id},
                                   {"type", "function"},
                                   {"function", json::object{{"name", call.name}, {"arguments", call.arguments}}}});
    }
    message["tool_calls"] = std::move(calls);
  }
  return message;
}

}  // namespace

std::string response_id(openai_api api, std::string_view request_id) {
  return std::string(api == openai_api::chat_completions ? "chatcmpl-" : "cmpl-") + std::string(request_id);
}

json::object usage_json(const backend::token_usage& usage, std::optional<std::int64_t> reasoning_tokens) {
  json::object details;
  details["cached_tokens"] = usage.cached_tokens;
  json::object out;
  out["prompt_tokens"] = usage.prompt_tokens;
  out["completion_tokens"] = usage.completion_tokens;
  out["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  out["prompt_tokens_details"] = std::move(details);
  if (reasoning_tokens) out["completion_tokens_details"] = json::object{{"reasoning_tokens", *reasoning_tokens}};
  return out;
}

std::string_view chat_finish_reason(backend::finish_reason reason, bool made_tool_calls) {
  return made_tool_calls && reason == backend::finish_reason::stop ? "tool_calls" : backend::to_string(reason);
}

std::string completion_body(const response_meta& meta, std::span<const choice_result> choices,
                            const backend::token_usage& usage, std::optional<std::int64_t> reasoning_tokens) {
  // An object's text without its closing brace, for members to follow it.
  const auto open = [](const json::object& o) {
    std::string text = json::serialize(o);
    text.pop_back();
    return text;
  };
  std::string body = open(header(meta, /*chunk=*/false));
  body += R"(,"choices":[)";
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const choice_result& c = choices[i];
    json::object choice;
    choice["index"] = i;
    if (is_chat(meta)) {
      choice["message"] = message_json(c.message, reasoning_tokens.has_value());
    } else {
      choice["text"] = c.text;
    }
    const std::string_view reason =
        is_chat(meta) ? chat_finish_reason(c.reason, !c.message.tool_calls.empty()) : backend::to_string(c.reason);
    if (i > 0) body += ',';
    body += open(choice);
    body += R"(,"logprobs":)";
    body += c.logprobs;
    body += R"(,"finish_reason":)";
    body += json::serialize(json::value(reason));
    body += '}';
  }
  body += R"(],"usage":)";
  body += json::serialize(usage_json(usage, is_chat(meta) ? reasoning_tokens : std::nullopt));
  body += '}';
  return body;
}

json::object chunk_builder::chunk(json::object choice) const {
  json::object out = header(meta_, /*chunk=*/true);
  out["choices"] = json::array{std::move(choice)};
  if (include_usage_) out["usage"] = nullptr;
  return out;
}

json::object chunk_builder::delta(json::object delta, std::int32_t index, json::value logprobs) const {
  json::object choice;
  choice["index"] = index;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = nullptr;
  return chunk(std::move(choice));
}

json::object chunk_builder::role(std::int32_t index) const {
  return delta(json::object{{"role", "assistant"}, {"content", ""}}, index, nullptr);
}

json::object chunk_builder::content(std::string_view text, std::int32_t index, json::value logprobs) const {
  if (is_chat(meta_)) return delta(json::object{{"content", text}}, index, std::move(logprobs));
  json::object choice;
  choice["index"] = index;
  choice["text"] = text;
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = nullptr;
  return chunk(std::move(choice));
}

json::object chunk_builder::event(const output_event& event, std::int32_t index, json::value logprobs) const {
  if (const auto* c = std::get_if<content_delta>(&event)) return content(c->text, index, std::move(logprobs));
  if (const auto* r = std::get_if<reasoning_delta>(&event)) {
    return delta(json::object{{"reasoning_content", r->text}}, index, std::move(logprobs));
  }
  json::object call;
  if (const auto* begin = std::get_if<tool_call_begin>(&event)) {
    call["index"] = begin->index;
    call["id"] = begin->id;
    call["type"] = "function";
    call["function"] = json::object{{"name", begin->name}, {"arguments", ""}};
  } else {
    const auto& arguments = std::get<tool_call_arguments>(event);
    call["index"] = arguments.index;
    call["function"] = json::object{{"arguments", arguments.text}};
  }
  return delta(json::object{{"tool_calls", json::array{std::move(call)}}}, index, std::move(logprobs));
}

json::object chunk_builder::finish(backend::finish_reason reason, std::int32_t index, json::value logprobs,
                                   bool made_tool_calls) const {
  json::object choice;
  choice["index"] = index;
  if (is_chat(meta_)) {
    choice["delta"] = json::object{};
  } else {
    choice["text"] = "";
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = is_chat(meta_) ? chat_finish_reason(reason, made_tool_calls) : backend::to_string(reason);
  return chunk(std::move(choice));
}

json::object chunk_builder::usage(const backend::token_usage& usage, std::optional<std::int64_t> reasoning_tokens) const {
  json::object out = header(meta_, /*chunk=*/true);
  out["choices"] = json::array{};
  out["usage"] = usage_json(usage, reasoning_tokens);
  return out;
}

json::object model_object(const serving_model& model) {
  json::object out;
  out["id"] = model.id;
  out["object"] = "model";
  out["created"] = model.created;
  out["owned_by"] = owner;
  out["max_model_len"] = model.context_length;
  return out;
}

json::object model_list(const serving_model& model) {
  json::object out;
  out["object"] = "list";
  out["data"] = json::array{model_object(model)};
  return out;
}

}  // namespace edge::gateway
