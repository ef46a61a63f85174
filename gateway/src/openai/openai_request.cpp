#include "edge/gateway/openai/openai_request.h"

#include <algorithm>
#include <limits>

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

// "hello" or [{"type":"text","text":"hel"}, {"type":"text","text":"lo"}]: parts are joined.
field_error read_content(const json_value& v, std::string& out) {
  if (v.type() == element_type::STRING) return read_string(v, out);
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

field_error read_message(const json_value& v, backend::chat_message& out) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>("an object with 'role' and 'content'"));
  EDGE_ASSIGN_OR_RETURN(const json_value role, fields.required("role"));
  EDGE_ASSIGN_OR_RETURN(const std::string_view name, role.as<std::string_view>());
  if (name == "system" || name == "developer") {
    // OpenAI's newer name for the system prompt; chat templates know only "system".
    out.role = "system";
  } else if (name == "user" || name == "assistant") {
    out.role = std::string(name);
  } else if (name == "tool" || name == "function") {
    return role.error(format("'{}' is not supported: tools are not served", name));
  } else {
    return role.error(format("must be 'system', 'developer', 'user' or 'assistant', not '{}'", name));
  }
  const auto content = fields.required("content");
  if (!content.ok()) {
    // An assistant turn may omit its content (OpenAI: when it made tool calls instead).
    if (out.role == "assistant") return std::nullopt;
    return content.error();
  }
  return read_content(*content, out.content);
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

// A string, an array of one string, or an array of token ids.
field_error read_prompt(const json_value& v, prompt_input& out) {
  if (v.type() == element_type::STRING) {
    out = std::string(*v.as<std::string_view>());
    return std::nullopt;
  }
  EDGE_ASSIGN_OR_RETURN(const json_array items,
                        v.as<json_array>("a string, an array of one string, or an array of token ids"));
  if (items.empty()) return v.error("must not be an empty array");
  const json_value first = items.front();
  if (first.type() == element_type::STRING) {
    if (items.size() != 1) return v.error("must be one string: batched prompts are not supported");
    out = std::string(*first.as<std::string_view>());
    return std::nullopt;
  }
  if (first.type() == element_type::ARRAY) return v.error("must be one prompt: batched prompts are not supported");
  std::vector<std::int64_t> ids;
  ids.reserve(items.size());
  for (const json_value item : items) {
    const auto id = item.as<std::int64_t>();
    if (!id.ok() || *id < 0) return item.must_be("a token id (an integer of 0 or more)");
    ids.push_back(*id);
  }
  out = std::move(ids);
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

field_error read_response_format(const json_value& v) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const json_value type, fields.required("type"));
  EDGE_ASSIGN_OR_RETURN(const std::string_view name, type.as<std::string_view>());
  if (name == "text") return std::nullopt;
  return type.error(format("'{}' is not supported: only 'text'", name));
}

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
    return read_prompt(v, r.prompt);
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
  } else if (key == "n" || (!chat && key == "best_of")) {
    EDGE_ASSIGN_OR_RETURN(const std::int64_t n, v.as<std::int64_t>());
    if (n != 1) return v.must_be("1: one choice per request is supported");
  } else if (key == "logprobs" || key == "echo" || key == "suffix" || key == "functions" ||
             key == "logit_bias" || (chat && key == "top_logprobs")) {
    if (key == "top_logprobs") {
      const auto alternatives = v.as<std::int64_t>();
      if (alternatives.ok() && *alternatives == 0) return std::nullopt;  // no alternatives: off
    }
    return refuse_unless_off(v);
  } else if (chat && key == "response_format") {
    return read_response_format(v);
  }
  return std::nullopt;
}

request_error to_request_error(const json_error& error) { return {error.message(), error.path()}; }

}  // namespace

bool is_sampling_field(std::string_view key) {
  return key == "temperature" || key == "top_p" || key == "top_k" || key == "min_p" || key == "presence_penalty" ||
         key == "frequency_penalty" || key == "repetition_penalty" || key == "seed";
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

json_result<std::int64_t> read_max_tokens(const json_value& v) {
  EDGE_ASSIGN_OR_RETURN(const std::int64_t n, v.as<std::int64_t>());
  if (n < 1) return v.must_be("at least 1");
  return n;
}

request_error token_outside_vocabulary(std::string_view what, std::size_t index, std::int64_t id,
                                       std::int64_t vocab_size) {
  std::string param = format("{}[{}]", what, index);
  std::string message = format("'{}' is token {}, outside the vocabulary of {} tokens", param, id, vocab_size);
  return {std::move(message), std::move(param)};
}

std::optional<request_error> prompt_does_not_fit(std::int64_t prompt_length, std::int64_t context,
                                                 std::string_view what) {
  if (prompt_length < context) return std::nullopt;
  return request_error{format("This model's maximum context length is {} tokens. However, your {} resulted in {} "
                              "tokens. Please reduce the length of the {}.",
                              context, what, prompt_length, what),
                       std::string(what)};
}

std::optional<request_error> completion_does_not_fit(std::int64_t prompt_length, std::int64_t max_tokens,
                                                     std::int64_t context, std::string_view what) {
  if (max_tokens <= context - prompt_length) return std::nullopt;
  // max_tokens may be as large as an int64: the sum is capped, not overflowed.
  const std::int64_t requested = max_tokens > std::numeric_limits<std::int64_t>::max() - prompt_length
                                     ? std::numeric_limits<std::int64_t>::max()
                                     : prompt_length + max_tokens;
  return request_error{format("This model's maximum context length is {} tokens. However, you requested {} tokens "
                              "({} in the {}, {} for the completion). Please reduce the length of the {} or the "
                              "completion.",
                              context, requested, prompt_length, what, max_tokens, what),
                       "max_tokens"};
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
  }
  if (api == openai_api::chat_completions && !has_messages) return request_error{"'messages' is required", "messages"};
  if (api == openai_api::completions && !has_prompt) return request_error{"'prompt' is required", "prompt"};
  if (has_stream_options && !r.stream) {
    return request_error{"'stream_options' is only allowed when 'stream' is true", "stream_options"};
  }
  return r;
}

}  // namespace edge::gateway
