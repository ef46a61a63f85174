#include "edge/gateway/openai/openai_response.h"

#include <boost/json/array.hpp>

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

json::value reason_json(std::optional<backend::finish_reason> reason) {
  return reason ? json::value(backend::to_string(*reason)) : json::value(nullptr);
}

}  // namespace

std::string response_id(openai_api api, std::string_view request_id) {
  return std::string(api == openai_api::chat_completions ? "chatcmpl-" : "cmpl-") + std::string(request_id);
}

json::object usage_json(const backend::token_usage& usage) {
  json::object details;
  details["cached_tokens"] = usage.cached_tokens;
  json::object out;
  out["prompt_tokens"] = usage.prompt_tokens;
  out["completion_tokens"] = usage.completion_tokens;
  out["total_tokens"] = usage.prompt_tokens + usage.completion_tokens;
  out["prompt_tokens_details"] = std::move(details);
  return out;
}

json::object completion_response(const response_meta& meta, std::span<const choice_result> choices,
                                 const backend::token_usage& usage) {
  json::array out_choices;
  for (std::size_t i = 0; i < choices.size(); ++i) {
    const choice_result& c = choices[i];
    json::object choice;
    choice["index"] = i;
    if (is_chat(meta)) {
      json::object message;
      message["role"] = "assistant";
      message["content"] = c.text;
      message["refusal"] = nullptr;
      choice["message"] = std::move(message);
    } else {
      choice["text"] = c.text;
    }
    choice["logprobs"] = c.logprobs;
    choice["finish_reason"] = reason_json(c.reason);
    out_choices.push_back(std::move(choice));
  }
  json::object out = header(meta, /*chunk=*/false);
  out["choices"] = std::move(out_choices);
  out["usage"] = usage_json(usage);
  return out;
}

json::object chunk_builder::chunk(json::object choice) const {
  json::object out = header(meta_, /*chunk=*/true);
  out["choices"] = json::array{std::move(choice)};
  if (include_usage_) out["usage"] = nullptr;
  return out;
}

json::object chunk_builder::role(std::int32_t index) const {
  json::object delta;
  delta["role"] = "assistant";
  delta["content"] = "";
  json::object choice;
  choice["index"] = index;
  choice["delta"] = std::move(delta);
  choice["logprobs"] = nullptr;
  choice["finish_reason"] = nullptr;
  return chunk(std::move(choice));
}

json::object chunk_builder::content(std::string_view text, std::int32_t index, json::value logprobs) const {
  json::object choice;
  choice["index"] = index;
  if (is_chat(meta_)) {
    json::object delta;
    delta["content"] = text;
    choice["delta"] = std::move(delta);
  } else {
    choice["text"] = text;
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = nullptr;
  return chunk(std::move(choice));
}

json::object chunk_builder::finish(backend::finish_reason reason, std::int32_t index, json::value logprobs) const {
  json::object choice;
  choice["index"] = index;
  if (is_chat(meta_)) {
    choice["delta"] = json::object{};
  } else {
    choice["text"] = "";
  }
  choice["logprobs"] = std::move(logprobs);
  choice["finish_reason"] = reason_json(reason);
  return chunk(std::move(choice));
}

json::object chunk_builder::usage(const backend::token_usage& usage) const {
  json::object out = header(meta_, /*chunk=*/true);
  out["choices"] = json::array{};
  out["usage"] = usage_json(usage);
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
