#include "edge/gateway/openai/anthropic_request.h"

#include <algorithm>

#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/common/json_text.h"

namespace edge::gateway {
namespace {

using element_type = simdjson::dom::element_type;
using field_error = std::optional<json_error>;

// {"type": "tool_use", "id", "name", "input": {...}}: an assistant's call.
field_error read_tool_use(const json_fields& block, backend::chat_tool_call& out) {
  EDGE_ASSIGN_OR_RETURN(const std::string_view id, block.required<std::string_view>("id"));
  out.id = std::string(id);
  EDGE_ASSIGN_OR_RETURN(const json_value name, block.required("name"));
  if (auto error = read_function_name(name, out.name)) return error;
  EDGE_ASSIGN_OR_RETURN(const json_value input, block.required("input"));
  if (input.type() != element_type::OBJECT) return input.must_be("an object (the tool's arguments)");
  out.arguments = simdjson::minify(input.element());
  return std::nullopt;
}

// {"type": "tool_result", "tool_use_id", "content": string or text blocks, "is_error"}: a
// message of role "tool", as chat templates take a tool's answer.
field_error read_tool_result(const json_fields& block, backend::chat_message& out) {
  out.role = "tool";
  EDGE_ASSIGN_OR_RETURN(const std::string_view id, block.required<std::string_view>("tool_use_id"));
  out.tool_call_id = std::string(id);
  std::string text;
  if (const auto content = block.find("content"); content && !content->is_null()) {
    if (auto error = read_content(*content, text)) return error;
  }
  EDGE_ASSIGN_OR_RETURN(const bool failed, block.value_or<bool>("is_error", false));
  // Templates have no field for a failed call: the model reads it in the text.
  out.content = failed ? "Error: " + text : std::move(text);
  return std::nullopt;
}

// One entry of "messages", appended to `out` as one or more chat messages: a user turn's tool
// results become "tool" messages ahead of its text.
field_error read_message(const json_value& v, std::string& system, std::vector<backend::chat_message>& out) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>("an object with 'role' and 'content'"));
  EDGE_ASSIGN_OR_RETURN(const json_value role, fields.required("role"));
  EDGE_ASSIGN_OR_RETURN(const std::string_view name, role.as<std::string_view>());
  EDGE_ASSIGN_OR_RETURN(const json_value content, fields.required("content"));
  if (name == "system") {
    // Some clients send later system prompts among the messages.
    std::string text;
    if (auto error = read_content(content, text)) return error;
    system += (system.empty() ? "" : "\n\n") + text;
    return std::nullopt;
  }
  if (name != "user" && name != "assistant") return role.error(format("must be 'user' or 'assistant', not '{}'", name));
  const bool assistant = name == "assistant";
  backend::chat_message message;
  message.role = std::string(name);
  std::string text;
  if (content.type() == element_type::STRING) {
    text = std::string(*content.as<std::string_view>());
  } else {
    EDGE_ASSIGN_OR_RETURN(const json_array blocks, content.as<json_array>("a string or an array of content blocks"));
    for (const json_value item : blocks) {
      EDGE_ASSIGN_OR_RETURN(const json_fields block, item.as<json_fields>());
      EDGE_ASSIGN_OR_RETURN(const json_value type, block.required("type"));
      EDGE_ASSIGN_OR_RETURN(const std::string_view kind, type.as<std::string_view>());
      if (kind == "text") {
        EDGE_ASSIGN_OR_RETURN(const std::string_view piece, block.required<std::string_view>("text"));
        text += piece;
      } else if (kind == "tool_use" && assistant) {
        backend::chat_tool_call call;
        if (auto error = read_tool_use(block, call)) return error;
        message.tool_calls.push_back(std::move(call));
      } else if (kind == "tool_result" && !assistant) {
        backend::chat_message result;
        if (auto error = read_tool_result(block, result)) return error;
        out.push_back(std::move(result));
      } else if (kind == "thinking" && assistant) {
        EDGE_ASSIGN_OR_RETURN(const std::string_view thought, block.required<std::string_view>("thinking"));
        message.reasoning_content += thought;
      } else if (kind == "redacted_thinking" && assistant) {
        continue;
      } else if (kind == "tool_use" || kind == "tool_result" || kind == "thinking" || kind == "redacted_thinking") {
        return type.error(format("is '{}', which a{} message cannot hold", kind, assistant ? "n assistant" : " user"));
      } else {
        return type.error(format("is '{}': only text, tool_use, tool_result and thinking blocks are supported", kind));
      }
    }
  }
  // A user turn of tool results alone has no text of its own.
  const bool only_results = !assistant && text.empty() && content.type() != element_type::STRING;
  if (only_results) return std::nullopt;
  message.content = std::move(text);
  out.push_back(std::move(message));
  return std::nullopt;
}

field_error read_messages(const json_value& v, std::string& system, std::vector<backend::chat_message>& out) {
  EDGE_ASSIGN_OR_RETURN(const json_array items, v.as<json_array>("an array of messages"));
  out.clear();
  for (const json_value item : items) {
    if (auto error = read_message(item, system, out)) return error;
  }
  if (out.empty()) return v.error("must hold at least one message");
  return std::nullopt;
}

// [{"name", "description", "input_schema"}]: each becomes the function tool a chat template
// reads ({"type": "function", "function": {...}}).
field_error read_tools(const json_value& v, std::vector<tool_definition>& out) {
  EDGE_ASSIGN_OR_RETURN(const json_array items, v.as<json_array>("an array of tools"));
  out.clear();
  for (const json_value item : items) {
    EDGE_ASSIGN_OR_RETURN(const json_fields fields, item.as<json_fields>());
    if (const auto type = fields.find("type"); type && !type->is_null()) {
      EDGE_ASSIGN_OR_RETURN(const std::string_view kind, type->as<std::string_view>());
      if (kind != "custom") return type->error(format("is '{}': only client tools (with an input_schema) are supported", kind));
    }
    tool_definition tool;
    EDGE_ASSIGN_OR_RETURN(const json_value name, fields.required("name"));
    if (auto error = read_function_name(name, tool.name)) return error;
    EDGE_ASSIGN_OR_RETURN(const auto description, fields.optional<std::string_view>("description"));
    tool.description = std::string(description.value_or(""));
    EDGE_ASSIGN_OR_RETURN(const json_value schema, fields.required("input_schema"));
    if (schema.type() != element_type::OBJECT) return schema.must_be("a JSON Schema object");
    tool.parameters = simdjson::minify(schema.element());
    tool.json = "{\"type\":\"function\",\"function\":{\"name\":" + json_string(tool.name) +
                ",\"description\":" + json_string(tool.description) + ",\"parameters\":" + tool.parameters + "}}";
    out.push_back(std::move(tool));
  }
  return std::nullopt;
}

// {"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}
field_error read_tool_choice(const json_value& v, openai_request& r) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const json_value type, fields.required("type"));
  EDGE_ASSIGN_OR_RETURN(const std::string_view kind, type.as<std::string_view>());
  r.choice.name.clear();
  if (kind == "auto") {
    r.choice.mode = tool_choice_mode::auto_select;
  } else if (kind == "any") {
    r.choice.mode = tool_choice_mode::required;
  } else if (kind == "none") {
    r.choice.mode = tool_choice_mode::none;
  } else if (kind == "tool") {
    r.choice.mode = tool_choice_mode::named;
    EDGE_ASSIGN_OR_RETURN(const json_value name, fields.required("name"));
    if (auto error = read_function_name(name, r.choice.name)) return error;
  } else {
    return type.error(format("is '{}': 'auto', 'any', 'tool' or 'none'", kind));
  }
  EDGE_ASSIGN_OR_RETURN(const bool serial, fields.value_or<bool>("disable_parallel_tool_use", false));
  r.parallel_tool_calls = !serial;
  return std::nullopt;
}

// {"type": "enabled", "budget_tokens"} or {"type": "disabled"}: the template's enable_thinking
// (Qwen3's and GLM's switch; a template without it ignores it).
field_error read_thinking(const json_value& v, openai_request& r) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const json_value type, fields.required("type"));
  EDGE_ASSIGN_OR_RETURN(const std::string_view kind, type.as<std::string_view>());
  if (kind != "enabled" && kind != "disabled") return type.error(format("is '{}': 'enabled' or 'disabled'", kind));
  r.chat_template_kwargs = kind == "enabled" ? R"({"enable_thinking":true})" : R"({"enable_thinking":false})";
  return std::nullopt;
}

field_error read_field(std::string_view key, const json_value& v, openai_request& r, std::string& system) {
  if (v.is_null()) return std::nullopt;
  if (key == "model") {
    EDGE_ASSIGN_OR_RETURN(const std::string_view model, v.as<std::string_view>());
    r.model = std::string(model);
  } else if (key == "system") {
    return read_content(v, system);
  } else if (key == "messages") {
    return read_messages(v, system, r.messages);
  } else if (key == "max_tokens") {
    EDGE_ASSIGN_OR_RETURN(r.max_tokens, read_max_tokens(v));
  } else if (key == "temperature" || key == "top_p" || key == "top_k") {
    return read_sampling_field(key, v, r.sampling);
  } else if (key == "stop_sequences") {
    if (v.type() != element_type::ARRAY) return v.must_be("an array of strings");
    return read_stop(v, r.stop);
  } else if (key == "stream") {
    EDGE_ASSIGN_OR_RETURN(r.stream, v.as<bool>());
  } else if (key == "tools") {
    return read_tools(v, r.tools);
  } else if (key == "tool_choice") {
    return read_tool_choice(v, r);
  } else if (key == "thinking") {
    return read_thinking(v, r);
  } else if (key == "metadata") {
    EDGE_ASSIGN_OR_RETURN(const json_fields metadata, v.as<json_fields>());
    EDGE_ASSIGN_OR_RETURN(const auto user, metadata.optional<std::string_view>("user_id"));
    r.user = std::string(user.value_or(""));
  }
  return std::nullopt;
}

}  // namespace

std::variant<openai_request, request_error> parse_anthropic_request(anthropic_route route, std::string_view body) {
  simdjson::dom::parser parser;
  const auto document = parse_json_object(parser, body, "The body");
  if (!document.ok()) return request_error{document.error().message(), document.error().path()};
  openai_request r;
  r.api = openai_api::chat_completions;
  const json_fields fields(*document);
  // The system field first, wherever it stands in the body: system entries among the messages
  // follow it.
  std::string system;
  for (const auto [key, value] : fields) {
    if (key != "system") continue;
    if (auto error = read_field(key, value, r, system)) return request_error{error->message(), error->path()};
  }
  for (const auto [key, value] : fields) {
    if (key == "system") continue;
    if (auto refused = peer_output_field_elsewhere(key, value.is_null())) return *refused;
    if (auto error = read_field(key, value, r, system)) return request_error{error->message(), error->path()};
  }
  if (!fields.find("messages")) return request_error{"'messages' is required", "messages"};
  if (route == anthropic_route::messages && !r.max_tokens) return request_error{"'max_tokens' is required", "max_tokens"};
  if (!system.empty()) {
    backend::chat_message prompt;
    prompt.role = "system";
    prompt.content = std::move(system);
    r.messages.insert(r.messages.begin(), std::move(prompt));
  }
  // Messages has no output format of its own here: nothing to combine with forced calls.
  const tool_choice_names names{.name = "tool_choice.name", .format = "tool_choice"};
  if (auto error = check_tool_choice(r, fields.find("tool_choice").has_value(), names)) return *error;
  return r;
}

}  // namespace edge::gateway
