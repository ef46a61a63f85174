#include "edge/gateway/openai/openai_request.h"

#include <algorithm>
#include <limits>

#include "edge/backend/engine/engine.h"
#include "edge/common/format.h"
#include "edge/common/json_fields.h"

namespace edge::gateway {
namespace {

// The DOM parser, not the on-demand one: it validates the whole document before we read it,
// so malformed JSON anywhere (also inside a field we ignore) is a 400, never half a request.
using element_type = simdjson::dom::element_type;

// What each reader answers: nothing, or the first problem, an error naming the field.
using field_error = std::optional<json_error>;

field_error read_number(const json_value& v, double low, double high, double& out) {
  EDGE_ASSIGN_OR_RETURN(out, v.as<double>());
  if (!(out >= low && out <= high)) return v.must_be(format("from {} to {}", low, high));
  return std::nullopt;
}

field_error read_string(const json_value& v, std::string& out) {
  EDGE_ASSIGN_OR_RETURN(const std::string_view text, v.as<std::string_view>());
  out = std::string(text);
  return std::nullopt;
}

// OpenAI's rule for a response format's name.
bool is_valid_format_name(std::string_view name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

}  // namespace

std::optional<json_error> read_content(const json_value& v, std::string& out) {
  if (v.type() == element_type::STRING) {
    out = std::string(*v.as<std::string_view>());
    return std::nullopt;
  }
  EDGE_ASSIGN_OR_RETURN(const json_array parts, v.as<json_array>("a string or an array of content parts"));
  for (const json_value part : parts) {
    EDGE_ASSIGN_OR_RETURN(const json_fields fields, part.as<json_fields>());
    EDGE_ASSIGN_OR_RETURN(const json_value type, fields.required("type"));
    EDGE_ASSIGN_OR_RETURN(const std::string_view kind, type.as<std::string_view>());
    if (kind != "text") return type.error(format("is '{}': only text content parts are supported", kind));
    EDGE_ASSIGN_OR_RETURN(const std::string_view text, fields.required<std::string_view>("text"));
    out += text;
  }
  return std::nullopt;
}

std::optional<json_error> read_output_format(const json_value& v, output_format_layout layout,
                                             std::shared_ptr<const backend::grammar::grammar>& out) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const json_value type, fields.required("type"));
  EDGE_ASSIGN_OR_RETURN(const std::string_view name, type.as<std::string_view>());
  backend::grammar::grammar_builder b;
  if (name == "text") {
    out.reset();
    return std::nullopt;
  }
  std::optional<backend::grammar::expr> root;
  if (name == "json_object") {
    root = b.json_object();
  } else if (name == "json_schema") {
    // Chat completions nest the schema's fields under "json_schema"; Responses has them beside "type".
    json_fields spec = fields;
    if (layout == output_format_layout::chat_completions) {
      EDGE_ASSIGN_OR_RETURN(spec, fields.required<json_fields>("json_schema"));
    }
    EDGE_ASSIGN_OR_RETURN(const std::string_view format_name, spec.required<std::string_view>("name"));
    if (!is_valid_format_name(format_name)) {
      return spec.path().member("name").error("must be 1 to 64 letters, digits, underscores or dashes");
    }
    EDGE_ASSIGN_OR_RETURN(const auto strict, spec.optional<bool>("strict"));
    EDGE_ASSIGN_OR_RETURN(const auto description, spec.optional<std::string_view>("description"));
    static_cast<void>(strict);  // strict or not, the schema is enforced (or refused)
    static_cast<void>(description);
    EDGE_ASSIGN_OR_RETURN(const json_value schema, spec.required("schema"));
    if (schema.type() != element_type::OBJECT && schema.type() != element_type::BOOL) {
      return schema.must_be("a JSON schema (an object)");
    }
    const std::string text = simdjson::minify(schema.element());
    auto built = b.json_schema(text, {.path = schema.path().str()});
    if (!built.ok()) return json_error(built.error().message(), built.error().path());
    root = std::move(built).value();
  } else {
    return type.error(format("'{}' is not supported: 'text', 'json_object' or 'json_schema'", name));
  }
  auto built = b.build(*root);
  if (!built.ok()) return v.error(built.error().message());
  out = std::make_shared<const backend::grammar::grammar>(std::move(built).value());
  return std::nullopt;
}

namespace {

// {"id", "type": "function", "function": {"name", "arguments"}}; arguments are JSON text (an
// object some clients send instead is taken as its text).
field_error read_tool_call(const json_value& v, backend::chat_tool_call& out) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const auto id, fields.optional<std::string_view>("id"));
  out.id = std::string(id.value_or(""));
  if (const auto type = fields.find("type")) {
    EDGE_ASSIGN_OR_RETURN(const std::string_view kind, type->as<std::string_view>());
    if (kind != "function") return type->error(format("is '{}': only 'function' tool calls exist", kind));
  }
  EDGE_ASSIGN_OR_RETURN(const json_fields function, fields.required<json_fields>("function"));
  EDGE_ASSIGN_OR_RETURN(const std::string_view name, function.required<std::string_view>("name"));
  out.name = std::string(name);
  EDGE_ASSIGN_OR_RETURN(const json_value arguments, function.required("arguments"));
  if (arguments.type() == element_type::OBJECT) {
    out.arguments = simdjson::minify(arguments.element());
  } else {
    EDGE_ASSIGN_OR_RETURN(const std::string_view text, arguments.as<std::string_view>("a string of JSON (or an object)"));
    out.arguments = std::string(text);
  }
  return std::nullopt;
}

field_error read_message(const json_value& v, backend::chat_message& out) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>("an object with 'role' and 'content'"));
  EDGE_ASSIGN_OR_RETURN(const json_value role, fields.required("role"));
  EDGE_ASSIGN_OR_RETURN(const std::string_view name, role.as<std::string_view>());
  if (name == "system" || name == "developer") {
    // OpenAI's newer name for the system prompt; chat templates know only "system".
    out.role = "system";
  } else if (name == "user" || name == "assistant" || name == "tool") {
    out.role = std::string(name);
  } else if (name == "function") {
    return role.error("'function' is not supported: send tool results with role 'tool'");
  } else {
    return role.error(format("must be 'system', 'developer', 'user', 'assistant' or 'tool', not '{}'", name));
  }
  const bool assistant = out.role == "assistant";
  if (const auto content = fields.find("content")) {
    std::string text;
    if (auto error = read_content(*content, text)) return error;
    out.content = std::move(text);
  } else if (!assistant) {
    // An assistant turn may omit its content (OpenAI: when it made tool calls instead).
    return fields.required("content").error();
  }
  if (const auto participant = fields.find("name")) {
    if (auto error = read_string(*participant, out.name)) return error;
  }
  if (const auto calls = fields.find("tool_calls")) {
    if (!assistant) return calls->error("is only allowed in assistant messages");
    EDGE_ASSIGN_OR_RETURN(const json_array items, calls->as<json_array>("an array of tool calls"));
    for (const json_value item : items) {
      backend::chat_tool_call call;
      if (auto error = read_tool_call(item, call)) return error;
      out.tool_calls.push_back(std::move(call));
    }
  }
  if (const auto reasoning = fields.find("reasoning_content")) {
    if (!assistant) return reasoning->error("is only allowed in assistant messages");
    if (auto error = read_string(*reasoning, out.reasoning_content)) return error;
  }
  if (out.role == "tool") {
    EDGE_ASSIGN_OR_RETURN(const json_value id, fields.required("tool_call_id"));
    if (auto error = read_string(id, out.tool_call_id)) return error;
  }
  return std::nullopt;
}

}  // namespace

std::optional<json_error> read_function_name(const json_value& v, std::string& out) {
  EDGE_ASSIGN_OR_RETURN(const std::string_view name, v.as<std::string_view>());
  const bool valid = !name.empty() && name.size() <= max_function_name_length &&
                     std::all_of(name.begin(), name.end(), [](char c) {
                       return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                              c == '-';
                     });
  if (!valid) return v.must_be(format("1 to {} letters, digits, '_' or '-'", max_function_name_length));
  out = std::string(name);
  return std::nullopt;
}

namespace {

// [{"type": "function", "function": {"name", "description", "parameters", "strict"}}]
field_error read_tools(const json_value& v, std::vector<tool_definition>& out) {
  EDGE_ASSIGN_OR_RETURN(const json_array items, v.as<json_array>("an array of tools"));
  out.clear();
  for (const json_value item : items) {
    EDGE_ASSIGN_OR_RETURN(const json_fields fields, item.as<json_fields>());
    tool_definition tool;
    EDGE_ASSIGN_OR_RETURN(const json_value type, fields.required("type"));
    EDGE_ASSIGN_OR_RETURN(const std::string_view kind, type.as<std::string_view>());
    if (kind != "function") return type.error(format("is '{}': only 'function' tools are supported", kind));
    EDGE_ASSIGN_OR_RETURN(const json_fields function, fields.required<json_fields>("function"));
    EDGE_ASSIGN_OR_RETURN(const json_value name, function.required("name"));
    if (auto error = read_function_name(name, tool.name)) return error;
    EDGE_ASSIGN_OR_RETURN(const auto description, function.optional<std::string_view>("description"));
    tool.description = std::string(description.value_or(""));
    if (const auto parameters = function.find("parameters")) {
      if (parameters->type() != element_type::OBJECT) return parameters->must_be("a JSON Schema object");
      tool.parameters = simdjson::minify(parameters->element());
    }
    EDGE_ASSIGN_OR_RETURN(tool.strict, function.value_or<bool>("strict", false));
    tool.json = simdjson::minify(item.element());
    out.push_back(std::move(tool));
  }
  return std::nullopt;
}

// "none" | "auto" | "required" | {"type": "function", "function": {"name"}}; a named function is
// checked against the tools once the whole body is read.
field_error read_tool_choice(const json_value& v, tool_choice& out) {
  if (v.type() == element_type::STRING) {
    const std::string_view mode = *v.as<std::string_view>();
    if (mode == "none") {
      out.mode = tool_choice_mode::none;
    } else if (mode == "auto") {
      out.mode = tool_choice_mode::auto_select;
    } else if (mode == "required") {
      out.mode = tool_choice_mode::required;
    } else {
      return v.must_be("'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    }
    return std::nullopt;
  }
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>("a string or an object naming a function"));
  EDGE_ASSIGN_OR_RETURN(const json_value type, fields.required("type"));
  EDGE_ASSIGN_OR_RETURN(const std::string_view kind, type.as<std::string_view>());
  if (kind != "function") return type.error(format("is '{}': only 'function' can be chosen", kind));
  EDGE_ASSIGN_OR_RETURN(const json_fields function, fields.required<json_fields>("function"));
  EDGE_ASSIGN_OR_RETURN(const json_value name, function.required("name"));
  if (auto error = read_function_name(name, out.name)) return error;
  out.mode = tool_choice_mode::named;
  return std::nullopt;
}

// An object whose keys become the chat template's variables; the template's own inputs
// (messages, tools, ...) cannot be replaced.
field_error read_chat_template_kwargs(const json_value& v, std::string& out) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>());
  for (const auto [key, value] : fields) {
    if (backend::is_reserved_template_variable(key)) {
      return value.error("cannot be set: the chat template gets it from the request itself");
    }
  }
  out = simdjson::minify(v.element());
  return std::nullopt;
}

field_error read_messages(const json_value& v, std::vector<backend::chat_message>& out) {
  EDGE_ASSIGN_OR_RETURN(const json_array items, v.as<json_array>("an array of messages"));
  out.clear();  // a repeated key: the last one counts
  out.reserve(items.size());
  for (const json_value item : items) {
    backend::chat_message message;
    if (auto error = read_message(item, message)) return error;
    out.push_back(std::move(message));
  }
  if (out.empty()) return v.error("must hold at least one message");
  return std::nullopt;
}

// A token id list's items, checked.
field_error read_token_ids(const json_array& items, std::vector<std::int64_t>& out) {
  out.reserve(items.size());
  for (const json_value item : items) {
    const auto id = item.as<std::int64_t>();
    if (!id.ok() || *id < 0) return item.must_be("a token id (an integer of 0 or more)");
    out.push_back(*id);
  }
  return std::nullopt;
}

// A string or an array of token ids; or a batch: an array of strings or of token id arrays.
field_error read_prompt(const json_value& v, std::vector<prompt_input>& out) {
  out.clear();  // a repeated key: the last one counts
  if (v.type() == element_type::STRING) {
    out.emplace_back(std::string(*v.as<std::string_view>()));
    return std::nullopt;
  }
  EDGE_ASSIGN_OR_RETURN(const json_array items,
                        v.as<json_array>("a string, an array of token ids, or an array of prompts (a batch)"));
  if (items.empty()) return v.error("must not be an empty array");
  const element_type first = items.front().type();
  if (first != element_type::STRING && first != element_type::ARRAY) {
    std::vector<std::int64_t> ids;
    if (auto error = read_token_ids(items, ids)) return error;
    out.emplace_back(std::move(ids));
    return std::nullopt;
  }
  if (items.size() > backend::max_choices) {
    return v.error(format("holds {} prompts: a batch holds at most {}", items.size(), backend::max_choices));
  }
  out.reserve(items.size());
  for (const json_value item : items) {
    if (item.type() == element_type::STRING) {
      out.emplace_back(std::string(*item.as<std::string_view>()));
      continue;
    }
    if (item.type() != element_type::ARRAY) return item.must_be("a prompt: a string or an array of token ids");
    EDGE_ASSIGN_OR_RETURN(const json_array ids_json, item.as<json_array>());
    if (ids_json.empty()) return item.error("must not be an empty array");
    std::vector<std::int64_t> ids;
    if (auto error = read_token_ids(ids_json, ids)) return error;
    out.emplace_back(std::move(ids));
  }
  return std::nullopt;
}

field_error read_stream_options(const json_value& v, openai_request& r) {
  EDGE_ASSIGN_OR_RETURN(const json_fields options, v.as<json_fields>());
  for (const auto [key, value] : options) {
    if (key != "include_usage" || value.is_null()) continue;
    EDGE_ASSIGN_OR_RETURN(r.include_usage, value.as<bool>());
  }
  return std::nullopt;
}

// A field that asks for something not served: a 400 unless it is off (false, 0, empty).
field_error refuse_unless_off(const json_value& v) {
  bool off = false;
  switch (v.type()) {
    case element_type::BOOL: off = !*v.as<bool>(); break;
    case element_type::STRING: off = v.as<std::string_view>()->empty(); break;
    case element_type::ARRAY: off = v.as<json_array>()->empty(); break;
    case element_type::OBJECT: off = v.as<json_fields>()->empty(); break;
    default: break;
  }
  if (off) return std::nullopt;
  return v.error("is not supported by this server");
}

// A second output constraint (response_format and guided_json, say): one per request.
field_error second_constraint(const json_value& v, const openai_request& r, std::string_view key) {
  if (r.grammar == nullptr || r.grammar_param == key) return std::nullopt;  // (a repeated key: the last counts)
  return v.error(format("cannot be combined with {}: one output constraint per request", r.grammar_param));
}

field_error read_response_format(const json_value& v, openai_request& r) {
  if (auto e = second_constraint(v, r, "response_format")) return e;
  r.grammar_param = "response_format";
  return read_output_format(v, output_format_layout::chat_completions, r.grammar);
}

// The other servers' fields that change what is generated, as vLLM and llama.cpp's server
// take them: served where this server can (an output constraint, a token limit), refused with
// a 400 naming the field where it cannot; never ignored. (Unknown fields are ignored, as
// OpenAI's clients send fields of their own.)
field_error read_peer_output_field(std::string_view key, const json_value& v, openai_request& r) {
  const auto constrain = [&](backend::grammar::grammar_builder& b, backend::grammar::expr root) -> field_error {
    if (auto e = second_constraint(v, r, key)) return e;
    auto built = b.build(root);
    if (!built.ok()) return v.error(built.error().message());
    r.grammar = std::make_shared<const backend::grammar::grammar>(std::move(built).value());
    r.grammar_param = std::string(key);
    return std::nullopt;
  };
  backend::grammar::grammar_builder b;
  if (key == "guided_json" || key == "json_schema") {
    // vLLM: a schema object or its JSON text; llama.cpp: a schema object.
    std::string text;
    if (v.type() == element_type::STRING && key == "guided_json") {
      text = std::string(*v.as<std::string_view>());
    } else if (v.type() == element_type::OBJECT || v.type() == element_type::BOOL) {
      text = simdjson::minify(v.element());
    } else {
      return v.must_be("a JSON schema (an object)");
    }
    auto built = b.json_schema(text, {.path = v.path().str()});
    if (!built.ok()) return json_error(built.error().message(), built.error().path());
    return constrain(b, std::move(built).value());
  }
  if (key == "guided_choice") {
    // One of the strings, exactly.
    EDGE_ASSIGN_OR_RETURN(const json_array choices, v.as<json_array>());
    std::vector<backend::grammar::expr> options;
    for (const json_value choice : choices) {
      EDGE_ASSIGN_OR_RETURN(const std::string_view text, choice.as<std::string_view>());
      if (text.empty()) return choice.must_be("a non-empty string");
      options.push_back(backend::grammar::literal(text));
    }
    if (options.empty()) return v.must_be("a non-empty array of strings");
    return constrain(b, backend::grammar::alt(std::move(options)));
  }
  if (key == "n_predict") {
    // llama.cpp's max_tokens; -1 (its default) is no limit.
    EDGE_ASSIGN_OR_RETURN(const std::int64_t n, v.as<std::int64_t>());
    if (n == -1) return std::nullopt;
    if (n < 1) return v.must_be("at least 1, or -1 for no limit");
    r.max_tokens = n;
    return std::nullopt;
  }
  if (key == "min_tokens") {
    EDGE_ASSIGN_OR_RETURN(const std::int64_t n, v.as<std::int64_t>());
    if (n == 0) return std::nullopt;
    return v.error("is not supported by this server (the end of text cannot be held back); use ignore_eos with max_tokens");
  }
  // guided_regex, guided_grammar, grammar (GBNF), stop_token_ids, structured_outputs: the
  // grammar engine takes JSON schemas and literal choices, not regular expressions or GBNF.
  return refuse_unless_off(v);
}

}  // namespace

bool is_peer_output_field(std::string_view key) {
  return key == "guided_json" || key == "json_schema" || key == "guided_choice" || key == "n_predict" ||
         key == "min_tokens" || key == "guided_regex" || key == "guided_grammar" || key == "grammar" ||
         key == "stop_token_ids" || key == "structured_outputs";
}

std::optional<request_error> peer_output_field_elsewhere(std::string_view key, bool null) {
  if (null || !is_peer_output_field(key)) return std::nullopt;
  return request_error{format("'{}' (vLLM's and llama.cpp's) is served on /v1/chat/completions and /v1/completions, "
                              "not on this API",
                              key),
                       std::string(key)};
}

namespace {

field_error read_field(std::string_view key, const json_value& v, openai_request& r) {
  if (v.is_null()) return std::nullopt;  // null means "not given"
  const bool chat = r.api == openai_api::chat_completions;

  if (key == "model") {
    std::string model;
    if (auto e = read_string(v, model)) return e;
    r.model = std::move(model);
  } else if (chat && key == "messages") {
    return read_messages(v, r.messages);
  } else if (!chat && key == "prompt") {
    return read_prompt(v, r.prompts);
  } else if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
    EDGE_ASSIGN_OR_RETURN(r.max_tokens, read_max_tokens(v));
  } else if (is_sampling_field(key)) {
    return read_sampling_field(key, v, r.sampling);
  } else if (key == "stop") {
    return read_stop(v, r.stop);
  } else if (key == "stream") {
    EDGE_ASSIGN_OR_RETURN(r.stream, v.as<bool>());
  } else if (key == "stream_options") {
    return read_stream_options(v, r);
  } else if (key == "ignore_eos") {
    EDGE_ASSIGN_OR_RETURN(r.ignore_eos, v.as<bool>());
  } else if (key == "user") {
    return read_string(v, r.user);
  } else if (key == "prompt_cache_key") {
    return read_session_key(v, r.session);
  } else if (key == "n") {
    EDGE_ASSIGN_OR_RETURN(const std::int64_t n, v.as<std::int64_t>());
    if (n < 1 || n > backend::max_choices) return v.must_be(format("from 1 to {}", backend::max_choices));
    r.n = static_cast<std::int32_t>(n);
  } else if (!chat && key == "best_of") {
    // Checked against n once every field is read.
    EDGE_ASSIGN_OR_RETURN(const std::int64_t best_of, v.as<std::int64_t>());
    if (best_of < 1) return v.must_be("at least 1");
  } else if (chat && key == "tools") {
    return read_tools(v, r.tools);
  } else if (chat && key == "tool_choice") {
    r.choice.name.clear();
    return read_tool_choice(v, r.choice);
  } else if (chat && key == "parallel_tool_calls") {
    EDGE_ASSIGN_OR_RETURN(r.parallel_tool_calls, v.as<bool>());
  } else if (chat && key == "chat_template_kwargs") {
    return read_chat_template_kwargs(v, r.chat_template_kwargs);
  } else if (chat && key == "add_generation_prompt") {
    EDGE_ASSIGN_OR_RETURN(r.add_generation_prompt, v.as<bool>());
  } else if (chat && key == "logprobs") {
    EDGE_ASSIGN_OR_RETURN(const bool on, v.as<bool>());
    // top_logprobs, read after every field, gives the alternatives.
    if (on && !r.logprobs) r.logprobs = 0;
    if (!on) r.logprobs.reset();
  } else if (chat && key == "top_logprobs") {
    EDGE_ASSIGN_OR_RETURN(const std::int64_t top, v.as<std::int64_t>());
    if (top < 0 || top > backend::max_top_logprobs) return v.must_be(format("from 0 to {}", backend::max_top_logprobs));
  } else if (!chat && key == "logprobs") {
    EDGE_ASSIGN_OR_RETURN(const std::int64_t top, v.as<std::int64_t>());
    if (top < 0 || top > max_completion_logprobs) return v.must_be(format("from 0 to {}", max_completion_logprobs));
    r.logprobs = static_cast<std::int32_t>(top);
  } else if (!chat && key == "echo") {
    EDGE_ASSIGN_OR_RETURN(r.echo, v.as<bool>());
  } else if (key == "suffix" || key == "functions") {
    return refuse_unless_off(v);
  } else if (key == "response_format") {
    return read_response_format(v, r);
  } else if (is_peer_output_field(key)) {
    return read_peer_output_field(key, v, r);
  }
  return std::nullopt;
}

request_error to_request_error(const json_error& error) { return {error.message(), error.path()}; }

}  // namespace

std::optional<request_error> check_tool_choice(openai_request& r, bool chosen, const tool_choice_names& names) {
  if (!chosen) {
    r.choice.mode = r.tools.empty() ? tool_choice_mode::none : tool_choice_mode::auto_select;
    return std::nullopt;
  }
  if (r.choice.mode == tool_choice_mode::auto_select && r.tools.empty()) r.choice.mode = tool_choice_mode::none;
  if ((r.choice.mode == tool_choice_mode::required || r.choice.mode == tool_choice_mode::named) && r.tools.empty()) {
    return request_error{"'tool_choice' is only allowed when 'tools' are specified", "tool_choice"};
  }
  // Both would constrain the whole answer: a tool call cannot also be the response format's value.
  if ((r.choice.mode == tool_choice_mode::required || r.choice.mode == tool_choice_mode::named) && r.grammar) {
    return request_error{format("'{}' json_object or json_schema cannot be combined with a 'tool_choice' that forces "
                                "calls: the answer is a tool call (use the tool's parameters schema for its arguments)",
                                names.format),
                         std::string(names.format)};
  }
  if (r.choice.mode == tool_choice_mode::named) {
    const bool known = std::any_of(r.tools.begin(), r.tools.end(), [&](const tool_definition& t) { return t.name == r.choice.name; });
    if (!known) {
      return request_error{format("'{}' is '{}', which is not among the tools", names.name, r.choice.name),
                           std::string(names.name)};
    }
  }
  return std::nullopt;
}

bool is_sampling_field(std::string_view key) {
  return key == "temperature" || key == "top_p" || key == "top_k" || key == "min_p" || key == "presence_penalty" ||
         key == "frequency_penalty" || key == "repetition_penalty" || key == "seed" || key == "logit_bias";
}

std::optional<json_error> read_logit_bias(const json_value& v, std::vector<kernels::logit_bias>& out) {
  EDGE_ASSIGN_OR_RETURN(const json_fields entries, v.as<json_fields>("an object of token ids to biases"));
  out.clear();  // a repeated key: the last one counts
  for (const auto [key, value] : entries) {
    // The key is a token id in decimal digits, as OpenAI's tokenizer ids are written.
    std::int64_t id = 0;
    bool digits = !key.empty() && key.size() <= 10;
    for (const char c : key) {
      digits = digits && c >= '0' && c <= '9';
      if (digits) id = id * 10 + (c - '0');
    }
    if (!digits || id > std::numeric_limits<std::int32_t>::max()) {
      return value.error(format("is not a token id: the keys of 'logit_bias' are token ids ('{}')", key));
    }
    double bias = 0;
    if (auto e = read_number(value, -backend::max_logit_bias, backend::max_logit_bias, bias)) return e;
    const auto token = static_cast<std::int32_t>(id);
    const auto same = std::find_if(out.begin(), out.end(), [&](const kernels::logit_bias& b) { return b.id == token; });
    if (same != out.end()) {
      same->bias = static_cast<float>(bias);
    } else {
      out.push_back({.id = token, .bias = static_cast<float>(bias)});
    }
  }
  if (static_cast<std::int64_t>(out.size()) > backend::max_logit_bias_entries) {
    return v.must_be(format("at most {} token ids", backend::max_logit_bias_entries));
  }
  return std::nullopt;
}

std::optional<json_error> read_sampling_field(std::string_view key, const json_value& v, backend::sampling_params& s) {
  if (v.is_null()) return std::nullopt;
  if (key == "temperature") {
    double t = 0;
    if (auto e = read_number(v, 0.0, max_temperature, t)) return e;
    s.temperature = static_cast<float>(t);
  } else if (key == "top_p") {
    double p = 0;
    if (auto e = read_number(v, 0.0, 1.0, p)) return e;
    if (p == 0.0) return v.must_be("above 0 and at most 1");
    s.top_p = static_cast<float>(p);
  } else if (key == "top_k") {
    EDGE_ASSIGN_OR_RETURN(const std::int64_t k, v.as<std::int64_t>());
    // vLLM spells "off" both 0 and -1.
    if (k < -1 || k > std::numeric_limits<std::int32_t>::max()) return v.must_be("-1, 0 (off) or a positive integer");
    s.top_k = static_cast<std::int32_t>(std::max<std::int64_t>(k, 0));
  } else if (key == "min_p") {
    double p = 0;
    if (auto e = read_number(v, 0.0, 1.0, p)) return e;
    s.min_p = static_cast<float>(p);
  } else if (key == "presence_penalty" || key == "frequency_penalty") {
    double penalty = 0;
    if (auto e = read_number(v, -max_penalty, max_penalty, penalty)) return e;
    (key == "presence_penalty" ? s.presence_penalty : s.frequency_penalty) = static_cast<float>(penalty);
  } else if (key == "repetition_penalty") {
    double penalty = 0;
    // Up to the largest float: the engine's parameter is a float.
    if (auto e = read_number(v, 0.0, std::numeric_limits<float>::max(), penalty)) return e;
    if (penalty == 0.0) return v.must_be("above 0");
    s.repetition_penalty = static_cast<float>(penalty);
  } else if (key == "logit_bias") {
    return read_logit_bias(v, s.logit_bias);
  } else if (key == "seed") {
    // Any 64-bit integer: the bits are the seed.
    if (v.type() == element_type::UINT64) {
      s.seed = *v.as<std::uint64_t>();
    } else {
      EDGE_ASSIGN_OR_RETURN(const std::int64_t seed, v.as<std::int64_t>());
      s.seed = static_cast<std::uint64_t>(seed);
    }
  } else {
    return v.error("is not a sampling parameter");
  }
  return std::nullopt;
}

std::optional<json_error> read_stop(const json_value& v, std::vector<std::string>& out) {
  out.clear();  // a repeated key: the last one counts, as for every other field
  const auto add = [&](std::string_view text) {
    // An empty stop string would end every completion before it began; OpenAI ignores it.
    if (!text.empty()) out.emplace_back(text);
  };
  if (v.type() == element_type::STRING) {
    add(*v.as<std::string_view>());
    return std::nullopt;
  }
  EDGE_ASSIGN_OR_RETURN(const json_array items, v.as<json_array>("a string or an array of strings"));
  for (const json_value item : items) {
    EDGE_ASSIGN_OR_RETURN(const std::string_view text, item.as<std::string_view>());
    add(text);
  }
  if (items.size() > max_stop_strings) return v.must_be(format("at most {} strings", max_stop_strings));
  return std::nullopt;
}

bool is_valid_session_key(std::string_view key) { return !key.empty() && key.size() <= max_session_key_bytes; }

std::optional<json_error> read_session_key(const json_value& v, std::string& out) {
  EDGE_ASSIGN_OR_RETURN(const std::string_view key, v.as<std::string_view>(session_key_rule));
  if (!is_valid_session_key(key)) return v.must_be(session_key_rule);
  out = std::string(key);
  return std::nullopt;
}

json_result<std::int64_t> read_max_tokens(const json_value& v) {
  EDGE_ASSIGN_OR_RETURN(const std::int64_t n, v.as<std::int64_t>());
  if (n < 1) return v.must_be("at least 1");
  return n;
}

std::variant<openai_request, request_error> parse_openai_request(openai_api api, std::string_view body) {
  // A parser per request: its buffers grow with the document, and a thread-local one would
  // keep the largest body's worth of memory per thread for good.
  simdjson::dom::parser parser;
  const auto document = parse_json_object(parser, body, "The body");
  if (!document.ok()) return to_request_error(document.error());

  openai_request r;
  r.api = api;
  const json_fields fields(*document);
  bool has_prompt = false;
  bool has_messages = false;
  bool has_stream_options = false;
  for (const auto [key, value] : fields) {
    if (key == "max_completion_tokens") continue;
    if (auto error = read_field(key, value, r)) return to_request_error(*error);
    has_prompt |= key == "prompt" && !value.is_null();
    has_messages |= key == "messages" && !value.is_null();
    has_stream_options |= key == "stream_options" && !value.is_null();
  }
  // max_completion_tokens replaces the deprecated max_tokens and wins when both are given.
  if (api == openai_api::chat_completions) {
    if (const auto max_completion_tokens = fields.find("max_completion_tokens")) {
      if (auto error = read_field("max_completion_tokens", *max_completion_tokens, r)) return to_request_error(*error);
    }
    // top_logprobs only with logprobs: true (OpenAI's rule).
    if (const auto top = fields.find("top_logprobs")) {
      if (!r.logprobs) {
        return request_error{"'top_logprobs' requires 'logprobs' to be true", "top_logprobs"};
      }
      r.logprobs = static_cast<std::int32_t>(*top->as<std::int64_t>());
    }
  } else if (const auto best_of = fields.find("best_of"); best_of && *best_of->as<std::int64_t>() != r.n) {
    return request_error{format("'best_of' must equal 'n' ({}): choosing the best of more completions is not supported",
                                r.n),
                         "best_of"};
  }
  if (api == openai_api::chat_completions && !has_messages) return request_error{"'messages' is required", "messages"};
  if (api == openai_api::chat_completions) {
    const tool_choice_names names{.name = "tool_choice.function.name", .format = "response_format"};
    if (auto error = check_tool_choice(r, fields.find("tool_choice").has_value(), names)) return *error;
  }
  if (api == openai_api::completions && !has_prompt) return request_error{"'prompt' is required", "prompt"};
  if (api == openai_api::completions && r.prompts.size() * static_cast<std::size_t>(r.n) > backend::max_choices) {
    return request_error{format("{} prompts with n {} make {} choices: a request makes at most {}", r.prompts.size(),
                                r.n, r.prompts.size() * static_cast<std::size_t>(r.n), backend::max_choices),
                         "n"};
  }
  if (has_stream_options && !r.stream) {
    return request_error{"'stream_options' is only allowed when 'stream' is true", "stream_options"};
  }
  return r;
}

}  // namespace edge::gateway
