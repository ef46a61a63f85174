#include "edge/gateway/openai/responses_response.h"

#include "edge/common/format.h"

namespace edge::gateway {
namespace {

namespace json = boost::json;

// An item's id prefix, after the API's own ids.
std::string_view id_prefix(std::string_view type) {
  if (type == "reasoning") return "rs_";
  if (type == "message") return "msg_";
  return "fc_";
}

}  // namespace

responses_answer::responses_answer(std::string id, std::string model, std::int64_t created_at, json::object echo)
    : id_(std::move(id)), model_(std::move(model)), created_at_(created_at), echo_(std::move(echo)) {}

named_event responses_answer::event(std::string_view type, json::object data) {
  data["type"] = type;
  data["sequence_number"] = sequence_++;
  return {std::string(type), std::move(data)};
}

json::object responses_answer::item_json(const item& i) const {
  json::object o{{"id", i.id}, {"type", i.type}, {"status", i.status}};
  if (i.type == "reasoning") {
    o["summary"] = json::array();
    o["content"] = json::array{json::object{{"type", "reasoning_text"}, {"text", i.text}}};
  } else if (i.type == "message") {
    o["role"] = "assistant";
    o["content"] = json::array{
        json::object{{"type", "output_text"}, {"text", i.text}, {"annotations", json::array()}, {"logprobs", json::array()}}};
  } else {
    o["call_id"] = i.call_id;
    o["name"] = i.name;
    o["arguments"] = i.text;
  }
  return o;
}

json::object responses_answer::response() const {
  json::array output;
  for (const item& i : items_) output.push_back(item_json(i));
  json::object r{{"id", id_},
                 {"object", "response"},
                 {"created_at", created_at_},
                 {"status", status_},
                 {"error", error_},
                 {"incomplete_details", incomplete_details_},
                 {"model", model_},
                 {"output", std::move(output)},
                 {"usage", usage_}};
  for (const auto& [key, value] : echo_) r[key] = value;
  return r;
}

void responses_answer::start(std::vector<named_event>& out) {
  out.push_back(event("response.created", {{"response", response()}}));
  out.push_back(event("response.in_progress", {{"response", response()}}));
}

void responses_answer::close(std::vector<named_event>& out) {
  if (!open_) return;
  open_ = false;
  item& i = items_.back();
  if (i.status == "in_progress") i.status = "completed";
  const auto index = static_cast<std::int64_t>(items_.size()) - 1;
  if (i.type == "function_call") {
    out.push_back(event("response.function_call_arguments.done",
                        {{"item_id", i.id}, {"output_index", index}, {"arguments", i.text}, {"name", i.name}}));
  } else {
    const bool text = i.type == "message";
    json::object part = text ? json::object{{"type", "output_text"}, {"text", i.text}, {"annotations", json::array()}, {"logprobs", json::array()}}
                             : json::object{{"type", "reasoning_text"}, {"text", i.text}};
    json::object done{{"item_id", i.id}, {"output_index", index}, {"content_index", 0}, {"text", i.text}};
    if (text) done["logprobs"] = json::array();
    out.push_back(event(text ? "response.output_text.done" : "response.reasoning_text.done", std::move(done)));
    out.push_back(event("response.content_part.done",
                        {{"item_id", i.id}, {"output_index", index}, {"content_index", 0}, {"part", std::move(part)}}));
  }
  out.push_back(event("response.output_item.done", {{"output_index", index}, {"item", item_json(i)}}));
}

void responses_answer::add(const output_event& e, std::vector<named_event>& out) {
  std::string type;
  std::string_view piece;
  const tool_call_begin* call = std::get_if<tool_call_begin>(&e);
  if (const auto* content = std::get_if<content_delta>(&e)) {
    type = "message";
    piece = content->text;
  } else if (const auto* reasoning = std::get_if<reasoning_delta>(&e)) {
    type = "reasoning";
    piece = reasoning->text;
  } else if (call != nullptr) {
    type = "function_call";
  } else {
    type = "function_call";
    piece = std::get<tool_call_arguments>(e).text;
  }
  const bool same_item = open_ && items_.back().type == type && call == nullptr;
  if (!same_item) {
    if (piece.empty() && call == nullptr) return;
    close(out);
    item opened{.type = type,
                .id = format("{}{}_{}", id_prefix(type), id_.substr(id_.find('_') + 1), items_.size()),
                .text = {},
                .call_id = call != nullptr ? call->id : "",
                .name = call != nullptr ? call->name : ""};
    items_.push_back(std::move(opened));
    open_ = true;
    const item& i = items_.back();
    const auto index = static_cast<std::int64_t>(items_.size()) - 1;
    // The item as added: nothing of its content yet.
    json::object added = item_json(i);
    if (type != "function_call") added["content"] = json::array();
    out.push_back(event("response.output_item.added", {{"output_index", index}, {"item", std::move(added)}}));
    if (type != "function_call") {
      json::object part = type == "message" ? json::object{{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}}
                                            : json::object{{"type", "reasoning_text"}, {"text", ""}};
      out.push_back(event("response.content_part.added",
                          {{"item_id", i.id}, {"output_index", index}, {"content_index", 0}, {"part", std::move(part)}}));
    }
  }
  if (piece.empty()) return;
  item& i = items_.back();
  i.text += piece;
  const auto index = static_cast<std::int64_t>(items_.size()) - 1;
  if (type == "function_call") {
    out.push_back(event("response.function_call_arguments.delta", {{"item_id", i.id}, {"output_index", index}, {"delta", piece}}));
  } else if (type == "message") {
    out.push_back(event("response.output_text.delta", {{"item_id", i.id},
                                                        {"output_index", index},
                                                        {"content_index", 0},
                                                        {"delta", piece},
                                                        {"logprobs", json::array()}}));
  } else {
    out.push_back(event("response.reasoning_text.delta",
                        {{"item_id", i.id}, {"output_index", index}, {"content_index", 0}, {"delta", piece}}));
  }
}

void responses_answer::finish(backend::finish_reason reason, const backend::token_usage& usage,
                              std::optional<std::int64_t> reasoning_tokens, std::vector<named_event>& out) {
  const bool cut = reason == backend::finish_reason::length || reason == backend::finish_reason::content_filter;
  // What the answer was writing when it was cut is unfinished.
  if (cut && open_) items_.back().status = "incomplete";
  close(out);
  usage_ = json::object{{"input_tokens", usage.prompt_tokens},
                        {"input_tokens_details", {{"cached_tokens", usage.cached_tokens}}},
                        {"output_tokens", usage.completion_tokens},
                        {"output_tokens_details", {{"reasoning_tokens", reasoning_tokens.value_or(0)}}},
                        {"total_tokens", usage.prompt_tokens + usage.completion_tokens}};
  if (cut) {
    status_ = "incomplete";
    incomplete_details_ =
        json::object{{"reason", reason == backend::finish_reason::length ? "max_output_tokens" : "content_filter"}};
  } else {
    status_ = "completed";
  }
  out.push_back(event(cut ? "response.incomplete" : "response.completed", {{"response", response()}}));
}

named_event responses_answer::failure(std::string_view code, std::string_view message) {
  status_ = "failed";
  error_ = json::object{{"code", code}, {"message", message}};
  return event("response.failed", {{"response", response()}});
}

}  // namespace edge::gateway
