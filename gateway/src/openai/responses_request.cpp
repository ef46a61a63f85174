#include "edge/gateway/openai/responses_request.h"

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>

#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/common/json_text.h"

namespace edge::gateway {
namespace {

namespace json = boost::json;
using element_type = simdjson::dom::element_type;
using field_error = std::optional<json_error>;

// A value of the body as Boost.JSON holds it (the response repeats it, a stored response keeps
// it), in `out`: as deep as the body may nest.
field_error to_boost(const json_value& v, json::value& out) {
  boost::system::error_code failed;
  out = json::parse(simdjson::minify(v.element()), failed, {}, {.max_depth = max_json_depth + 1});
  if (failed) return v.error(format("could not be read: {}", failed.message()));
  return std::nullopt;
}

// ---- items ------------------------------------------------------------------------------------

// Reads one item of `input` at `path` ("input[3]").
class item_reader {
 public:
  explicit item_reader(std::vector<backend::chat_message>& out) : out_(out) {}

  std::optional<request_error> item(const json::value& v, const std::string& path) {
    const json::object* o = v.if_object();
    if (o == nullptr) return request_error{format("'{}' must be an object (an input item)", path), path};
    const std::string type = string_or(*o, "type", "message");
    if (type == "message") return message(*o, path);
    if (type == "function_call") return function_call(*o, path);
    if (type == "function_call_output") return function_call_output(*o, path);
    if (type == "reasoning") return reasoning(*o, path);
    return request_error{format("'{}.type' is '{}': only message, function_call, function_call_output and reasoning "
                                "items are supported",
                                path, type),
                         path + ".type"};
  }

 private:
  static std::string string_or(const json::object& o, std::string_view key, std::string_view fallback) {
    const json::value* v = o.if_contains(key);
    if (v == nullptr || !v->is_string()) return std::string(fallback);
    return std::string(v->get_string());
  }

  static std::optional<request_error> required_string(const json::object& o, std::string_view key,
                                                      const std::string& path, std::string& out) {
    const json::value* v = o.if_contains(key);
    if (v == nullptr || !v->is_string()) {
      return request_error{format("'{}.{}' must be a string", path, key), format("{}.{}", path, key)};
    }
    out = std::string(v->get_string());
    return std::nullopt;
  }

  // A string, or parts whose text is joined: input_text, output_text (a replayed answer), refusal.
  static std::optional<request_error> content_text(const json::value& v, const std::string& path, std::string& out) {
    if (v.is_string()) {
      out = std::string(v.get_string());
      return std::nullopt;
    }
    const json::array* parts = v.if_array();
    if (parts == nullptr) return request_error{format("'{}' must be a string or an array of content parts", path), path};
    for (std::size_t i = 0; i < parts->size(); ++i) {
      const std::string at = format("{}[{}]", path, i);
      const json::object* part = (*parts)[i].if_object();
      if (part == nullptr) return request_error{format("'{}' must be an object (a content part)", at), at};
      const std::string type = string_or(*part, "type", "");
      const char* key = type == "refusal" ? "refusal" : "text";
      if (type != "input_text" && type != "output_text" && type != "text" && type != "refusal") {
        return request_error{format("'{}.type' is '{}': only input_text and output_text parts are supported", at, type),
                             at + ".type"};
      }
      std::string text;
      if (auto error = required_string(*part, key, at, text)) return error;
      out += text;
    }
    return std::nullopt;
  }

  // The assistant turn that a call or an answer belongs to: the last message when it is the
  // assistant's and has no text after its calls, else a new one.
  backend::chat_message& assistant_turn() {
    if (out_.empty() || out_.back().role != "assistant") {
      backend::chat_message turn;
      turn.role = "assistant";
      turn.reasoning_content = std::exchange(reasoning_, {});
      out_.push_back(std::move(turn));
    }
    return out_.back();
  }

  std::optional<request_error> message(const json::object& o, const std::string& path) {
    std::string role;
    if (auto error = required_string(o, "role", path, role)) return error;
    if (role == "developer") role = "system";
    if (role != "user" && role != "assistant" && role != "system") {
      return request_error{format("'{}.role' is '{}': user, assistant, system or developer", path, role), path + ".role"};
    }
    const json::value* content = o.if_contains("content");
    if (content == nullptr) return request_error{format("'{}.content' is required", path), path + ".content"};
    std::string text;
    if (auto error = content_text(*content, path + ".content", text)) return error;
    if (role == "assistant") {
      // An answer's text follows its reasoning and comes before its calls.
      backend::chat_message& turn = assistant_turn();
      if (!turn.tool_calls.empty()) {
        backend::chat_message next;
        next.role = "assistant";
        out_.push_back(std::move(next));
      }
      std::optional<std::string>& existing = out_.back().content;
      if (!existing) existing.emplace();
      *existing += text;
      return std::nullopt;
    }
    backend::chat_message m;
    m.role = std::move(role);
    m.content = std::move(text);
    out_.push_back(std::move(m));
    return std::nullopt;
  }

  std::optional<request_error> function_call(const json::object& o, const std::string& path) {
    backend::chat_tool_call call;
    if (auto error = required_string(o, "call_id", path, call.id)) return error;
    if (auto error = required_string(o, "name", path, call.name)) return error;
    if (auto error = required_string(o, "arguments", path, call.arguments)) return error;
    assistant_turn().tool_calls.push_back(std::move(call));
    return std::nullopt;
  }

  std::optional<request_error> function_call_output(const json::object& o, const std::string& path) {
    backend::chat_message m;
    m.role = "tool";
    std::string id;
    if (auto error = required_string(o, "call_id", path, id)) return error;
    m.tool_call_id = std::move(id);
    const json::value* output = o.if_contains("output");
    if (output == nullptr) return request_error{format("'{}.output' is required", path), path + ".output"};
    std::string text;
    if (auto error = content_text(*output, path + ".output", text)) return error;
    m.content = std::move(text);
    out_.push_back(std::move(m));
    return std::nullopt;
  }

  // The reasoning of the assistant turn that follows: its reasoning_text, else its summary.
  std::optional<request_error> reasoning(const json::object& o, const std::string& path) {
    std::string text;
    for (const char* key : {"content", "summary"}) {
      const json::value* parts = o.if_contains(key);
      if (parts == nullptr || parts->is_null()) continue;
      const json::array* list = parts->if_array();
      if (list == nullptr) return request_error{format("'{}.{}' must be an array", path, key), format("{}.{}", path, key)};
      for (std::size_t i = 0; i < list->size(); ++i) {
        const std::string at = format("{}.{}[{}]", path, key, i);
        const json::object* part = (*list)[i].if_object();
        if (part == nullptr) return request_error{format("'{}' must be an object", at), at};
        std::string piece;
        if (auto error = required_string(*part, "text", at, piece)) return error;
        text += piece;
      }
      if (!text.empty()) break;
    }
    reasoning_ += text;
    return std::nullopt;
  }

  std::vector<backend::chat_message>& out_;
  std::string reasoning_;  // a reasoning item's text, waiting for its assistant turn
};

// ---- fields -----------------------------------------------------------------------------------

// [{"type": "function", "name", "description", "parameters", "strict"}]: each becomes the
// function tool a chat template reads ({"type": "function", "function": {...}}).
field_error read_tools(const json_value& v, std::vector<tool_definition>& out) {
  EDGE_ASSIGN_OR_RETURN(const json_array items, v.as<json_array>("an array of tools"));
  out.clear();
  for (const json_value item : items) {
    EDGE_ASSIGN_OR_RETURN(const json_fields fields, item.as<json_fields>());
    EDGE_ASSIGN_OR_RETURN(const json_value type, fields.required("type"));
    EDGE_ASSIGN_OR_RETURN(const std::string_view kind, type.as<std::string_view>());
    if (kind != "function") return type.error(format("is '{}': only function tools are supported", kind));
    tool_definition tool;
    EDGE_ASSIGN_OR_RETURN(const json_value name, fields.required("name"));
    if (auto error = read_function_name(name, tool.name)) return error;
    EDGE_ASSIGN_OR_RETURN(const auto description, fields.optional<std::string_view>("description"));
    tool.description = std::string(description.value_or(""));
    EDGE_ASSIGN_OR_RETURN(const auto strict, fields.optional<bool>("strict"));
    tool.strict = strict.value_or(false);
    tool.parameters = "{}";
    if (const auto schema = fields.find("parameters"); schema && !schema->is_null()) {
      if (schema->type() != element_type::OBJECT) return schema->must_be("a JSON Schema object");
      tool.parameters = simdjson::minify(schema->element());
    }
    tool.json = "{\"type\":\"function\",\"function\":{\"name\":" + json_string(tool.name) +
                ",\"description\":" + json_string(tool.description) + ",\"parameters\":" + tool.parameters + "}}";
    out.push_back(std::move(tool));
  }
  return std::nullopt;
}

// "auto" | "none" | "required" | {"type": "function", "name"}
field_error read_tool_choice(const json_value& v, tool_choice& out) {
  out.name.clear();
  if (v.type() == element_type::STRING) {
    const std::string_view mode = *v.as<std::string_view>();
    if (mode == "auto") {
      out.mode = tool_choice_mode::auto_select;
    } else if (mode == "none") {
      out.mode = tool_choice_mode::none;
    } else if (mode == "required") {
      out.mode = tool_choice_mode::required;
    } else {
      return v.error(format("is '{}': 'auto', 'none', 'required' or {{\"type\": \"function\", \"name\"}}", mode));
    }
    return std::nullopt;
  }
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>("a string or an object"));
  EDGE_ASSIGN_OR_RETURN(const json_value type, fields.required("type"));
  EDGE_ASSIGN_OR_RETURN(const std::string_view kind, type.as<std::string_view>());
  if (kind != "function") return type.error(format("is '{}': only function tool choices are supported", kind));
  EDGE_ASSIGN_OR_RETURN(const json_value name, fields.required("name"));
  if (auto error = read_function_name(name, out.name)) return error;
  out.mode = tool_choice_mode::named;
  return std::nullopt;
}

// {"effort": "none" | "minimal" | "low" | "medium" | "high" | ..., "summary"}: the template's
// enable_thinking (Qwen3's and GLM's switch; a template without it ignores it).
field_error read_reasoning(const json_value& v, openai_request& r) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const auto effort, fields.optional<std::string_view>("effort"));
  if (effort) r.chat_template_kwargs = *effort == "none" ? R"({"enable_thinking":false})" : R"({"enable_thinking":true})";
  return std::nullopt;
}

// {"format": {...}, "verbosity"}
field_error read_text(const json_value& v, openai_request& r) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>());
  if (const auto format = fields.find("format"); format && !format->is_null()) {
    return read_output_format(*format, output_format_layout::responses, r.grammar);
  }
  return std::nullopt;
}

// Metadata: at most 16 string values (OpenAI's limits: keys of 64 characters, values of 512).
field_error read_metadata(const json_value& v) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>("an object of strings"));
  std::size_t count = 0;
  for (const auto [key, value] : fields) {
    if (++count > 16) return v.error("holds at most 16 entries");
    if (key.size() > 64) return v.error("has a key longer than 64 characters");
    EDGE_ASSIGN_OR_RETURN(const std::string_view text, value.as<std::string_view>());
    if (text.size() > 512) return value.error("is longer than 512 characters");
  }
  return std::nullopt;
}

field_error read_field(std::string_view key, const json_value& v, openai_request& r, responses_fields& extra,
                       std::string& instructions) {
  if (v.is_null()) return std::nullopt;
  if (key == "model") {
    EDGE_ASSIGN_OR_RETURN(const std::string_view model, v.as<std::string_view>());
    r.model = std::string(model);
  } else if (key == "input") {
    if (v.type() != element_type::STRING && v.type() != element_type::ARRAY) return v.must_be("a string or an array of items");
    if (v.type() == element_type::STRING) {
      extra.conversation = {json::object{{"type", "message"}, {"role", "user"}, {"content", *v.as<std::string_view>()}}};
    } else {
      json::value items;
      if (auto error = to_boost(v, items)) return error;
      extra.conversation = std::move(items.as_array());
    }
  } else if (key == "instructions") {
    EDGE_ASSIGN_OR_RETURN(const std::string_view text, v.as<std::string_view>());
    instructions = std::string(text);
    extra.echo["instructions"] = instructions;
  } else if (key == "max_output_tokens") {
    EDGE_ASSIGN_OR_RETURN(r.max_tokens, read_max_tokens(v));
    extra.echo["max_output_tokens"] = *r.max_tokens;
  } else if (key == "temperature" || key == "top_p") {
    if (auto error = read_sampling_field(key, v, r.sampling)) return error;
    if (auto error = to_boost(v, extra.echo[key])) return error;
  } else if (key == "stream") {
    EDGE_ASSIGN_OR_RETURN(r.stream, v.as<bool>());
  } else if (key == "tools") {
    if (auto error = read_tools(v, r.tools)) return error;
    if (auto error = to_boost(v, extra.echo["tools"])) return error;
  } else if (key == "tool_choice") {
    if (auto error = read_tool_choice(v, r.choice)) return error;
    if (auto error = to_boost(v, extra.echo["tool_choice"])) return error;
  } else if (key == "parallel_tool_calls") {
    EDGE_ASSIGN_OR_RETURN(r.parallel_tool_calls, v.as<bool>());
    extra.echo["parallel_tool_calls"] = r.parallel_tool_calls;
  } else if (key == "text") {
    if (auto error = read_text(v, r)) return error;
    if (auto error = to_boost(v, extra.echo["text"])) return error;
  } else if (key == "reasoning") {
    if (auto error = read_reasoning(v, r)) return error;
    if (auto error = to_boost(v, extra.echo["reasoning"])) return error;
  } else if (key == "store") {
    EDGE_ASSIGN_OR_RETURN(extra.store, v.as<bool>());
  } else if (key == "previous_response_id") {
    EDGE_ASSIGN_OR_RETURN(const std::string_view id, v.as<std::string_view>());
    extra.previous_response_id = std::string(id);
    extra.echo["previous_response_id"] = id;
  } else if (key == "metadata") {
    if (auto error = read_metadata(v)) return error;
    if (auto error = to_boost(v, extra.echo["metadata"])) return error;
  } else if (key == "user" || key == "safety_identifier") {
    EDGE_ASSIGN_OR_RETURN(const std::string_view user, v.as<std::string_view>());
    r.user = std::string(user);
    extra.echo[key] = user;
  } else if (key == "prompt_cache_key") {
    if (auto error = read_session_key(v, r.session)) return error;
    extra.echo["prompt_cache_key"] = r.session;
  } else if (key == "truncation") {
    EDGE_ASSIGN_OR_RETURN(const std::string_view mode, v.as<std::string_view>());
    if (mode != "auto" && mode != "disabled") return v.error(format("is '{}': 'auto' or 'disabled'", mode));
    extra.echo["truncation"] = mode;
  } else if (key == "top_logprobs") {
    EDGE_ASSIGN_OR_RETURN(const std::int64_t top, v.as<std::int64_t>());
    if (top != 0) return v.error("is not supported by this server's Responses API: ask chat completions for logprobs");
  } else if (key == "background") {
    EDGE_ASSIGN_OR_RETURN(const bool background, v.as<bool>());
    if (background) return v.error("is not supported: this server answers while the client waits");
  } else if (key == "conversation" || key == "prompt") {
    return v.error("is not supported by this server: send the conversation as input, or previous_response_id");
  }
  return std::nullopt;
}

}  // namespace

std::optional<request_error> read_response_items(const json::array& items, std::string_view param,
                                                 std::vector<backend::chat_message>& out) {
  item_reader reader(out);
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (auto error = reader.item(items[i], format("{}[{}]", param, i))) return error;
  }
  return std::nullopt;
}

std::variant<openai_request, request_error> parse_responses_request(std::string_view body) {
  simdjson::dom::parser parser;
  const auto document = parse_json_object(parser, body, "The body");
  if (!document.ok()) return request_error{document.error().message(), document.error().path()};
  openai_request r;
  r.api = openai_api::chat_completions;
  auto extra = std::make_shared<responses_fields>();
  extra->echo = {{"instructions", nullptr},      {"max_output_tokens", nullptr},    {"metadata", json::object()},
                 {"parallel_tool_calls", true},   {"previous_response_id", nullptr}, {"prompt_cache_key", nullptr},
                 {"reasoning", nullptr},          {"temperature", 1.0},              {"text", {{"format", {{"type", "text"}}}}},
                 {"tool_choice", "auto"},         {"tools", json::array()},          {"top_p", 1.0},
                 {"truncation", "disabled"},      {"user", nullptr}};
  const json_fields fields(*document);
  std::string instructions;
  for (const auto [key, value] : fields) {
    if (auto refused = peer_output_field_elsewhere(key, value.is_null())) return *refused;
    if (auto error = read_field(key, value, r, *extra, instructions)) return request_error{error->message(), error->path()};
  }
  if (!fields.find("input") || extra->conversation.empty()) return request_error{"'input' is required and must not be empty", "input"};
  extra->echo["store"] = extra->store;
  if (!instructions.empty()) {
    extra->system_message = true;
    backend::chat_message prompt;
    prompt.role = "system";
    prompt.content = std::move(instructions);
    r.messages.push_back(std::move(prompt));
  }
  if (auto error = read_response_items(extra->conversation, "input", r.messages)) return *error;
  const tool_choice_names names{.name = "tool_choice.name", .format = "text.format"};
  if (auto error = check_tool_choice(r, fields.find("tool_choice").has_value(), names)) return *error;
  r.responses = std::move(extra);
  return r;
}

}  // namespace edge::gateway
