#include "edge/gateway/openai_request.h"

#include <simdjson.h>

#include <cmath>
#include <limits>

#include "edge/common/format.h"

namespace edge::gateway {
namespace {

// The DOM parser, not the on-demand one: it validates the whole document before we read it,
// so malformed JSON anywhere (also inside a field we ignore) is a 400, never half a request.
using element = simdjson::dom::element;
using element_type = simdjson::dom::element_type;

request_error wrong_type(std::string_view param, std::string_view expected) {
  return {format("'{}' must be {}", param, expected), std::string(param)};
}

request_error out_of_range(std::string_view param, std::string_view what) {
  return {format("'{}' must be {}", param, what), std::string(param)};
}

bool is_number(element v) {
  const element_type t = v.type();
  return t == element_type::INT64 || t == element_type::UINT64 || t == element_type::DOUBLE;
}

// An integer, also when written as 3.0 (JSON does not tell them apart and clients written in
// languages with one number type send either).
std::optional<std::int64_t> as_int64(element v) {
  switch (v.type()) {
    case element_type::INT64: return v.get_int64().value_unsafe();
    case element_type::UINT64: return std::nullopt;  // beyond int64
    case element_type::DOUBLE: {
      const double d = v.get_double().value_unsafe();
      // 2^63 is exactly representable; anything at or past it does not fit.
      constexpr double limit = 9223372036854775808.0;
      if (d != std::floor(d) || d >= limit || d < -limit) return std::nullopt;
      return static_cast<std::int64_t>(d);
    }
    default: return std::nullopt;
  }
}

std::optional<request_error> read_integer(element v, std::string_view param, std::int64_t& out) {
  const auto n = as_int64(v);
  if (!n) return wrong_type(param, "an integer");
  out = *n;
  return std::nullopt;
}

std::optional<request_error> read_number(element v, std::string_view param, double low, double high, double& out) {
  if (!is_number(v)) return wrong_type(param, "a number");
  out = v.get_double().value_unsafe();
  if (!(out >= low && out <= high)) return out_of_range(param, format("from {} to {}", low, high));
  return std::nullopt;
}

std::optional<request_error> read_bool(element v, std::string_view param, bool& out) {
  if (v.type() != element_type::BOOL) return wrong_type(param, "true or false");
  out = v.get_bool().value_unsafe();
  return std::nullopt;
}

std::optional<request_error> read_string(element v, std::string_view param, std::string& out) {
  if (v.type() != element_type::STRING) return wrong_type(param, "a string");
  out = std::string(v.get_string().value_unsafe());
  return std::nullopt;
}

std::optional<request_error> read_stop(element v, std::vector<std::string>& out) {
  constexpr std::string_view param = "stop";
  constexpr std::string_view expected = "a string or an array of strings";
  out.clear();  // a repeated key: the last one counts, as for every other field
  const auto add = [&](std::string_view text) {
    // An empty stop string would end every completion before it began; OpenAI ignores it.
    if (!text.empty()) out.emplace_back(text);
  };
  if (v.type() == element_type::STRING) {
    add(v.get_string().value_unsafe());
    return std::nullopt;
  }
  if (v.type() != element_type::ARRAY) return wrong_type(param, expected);
  std::size_t index = 0;
  const simdjson::dom::array items = v.get_array().value_unsafe();
  for (element item : items) {
    if (item.type() != element_type::STRING) return wrong_type(format("stop[{}]", index), "a string");
    add(item.get_string().value_unsafe());
    ++index;
  }
  if (index > max_stop_strings) return out_of_range(param, format("at most {} strings", max_stop_strings));
  return std::nullopt;
}

// "hello" or [{"type":"text","text":"hel"}, {"type":"text","text":"lo"}]: parts are joined.
std::optional<request_error> read_content(element v, const std::string& param, std::string& out) {
  if (v.type() == element_type::STRING) {
    out = std::string(v.get_string().value_unsafe());
    return std::nullopt;
  }
  if (v.type() != element_type::ARRAY) return wrong_type(param, "a string or an array of content parts");
  std::size_t index = 0;
  const simdjson::dom::array parts = v.get_array().value_unsafe();
  for (element part : parts) {
    const std::string part_param = format("{}[{}]", param, index++);
    if (part.type() != element_type::OBJECT) return wrong_type(part_param, "an object");
    const simdjson::dom::object fields = part.get_object().value_unsafe();
    element type;
    if (fields["type"].get(type) != simdjson::SUCCESS) {
      return request_error{format("'{}.type' is required", part_param), part_param + ".type"};
    }
    if (type.type() != element_type::STRING) return wrong_type(part_param + ".type", "a string");
    const std::string_view kind = type.get_string().value_unsafe();
    if (kind != "text") {
      return request_error{format("'{}.type' is '{}': only text content parts are supported", part_param, kind),
                           part_param + ".type"};
    }
    element text;
    if (fields["text"].get(text) != simdjson::SUCCESS || text.type() != element_type::STRING) {
      return wrong_type(part_param + ".text", "a string");
    }
    out += text.get_string().value_unsafe();
  }
  return std::nullopt;
}

std::optional<request_error> read_message(element v, std::size_t index, backend::chat_message& out) {
  const std::string param = format("messages[{}]", index);
  if (v.type() != element_type::OBJECT) return wrong_type(param, "an object with 'role' and 'content'");
  const simdjson::dom::object fields = v.get_object().value_unsafe();

  element role;
  if (fields["role"].get(role) != simdjson::SUCCESS || role.is_null()) {
    return request_error{format("'{}.role' is required", param), param + ".role"};
  }
  if (role.type() != element_type::STRING) return wrong_type(param + ".role", "a string");
  const std::string_view name = role.get_string().value_unsafe();
  if (name == "system" || name == "developer") {
    // OpenAI's newer name for the system prompt; chat templates know only "system".
    out.role = "system";
  } else if (name == "user" || name == "assistant") {
    out.role = std::string(name);
  } else if (name == "tool" || name == "function") {
    return request_error{format("'{}.role' '{}' is not supported: tools are not served", param, name),
                         param + ".role"};
  } else {
    return request_error{format("'{}.role' must be 'system', 'developer', 'user' or 'assistant', not '{}'", param, name),
                         param + ".role"};
  }

  element content;
  const bool has_content = fields["content"].get(content) == simdjson::SUCCESS && !content.is_null();
  if (!has_content) {
    // An assistant turn may omit its content (OpenAI: when it made tool calls instead).
    if (out.role == "assistant") return std::nullopt;
    return request_error{format("'{}.content' is required", param), param + ".content"};
  }
  return read_content(content, param + ".content", out.content);
}

std::optional<request_error> read_messages(element v, std::vector<backend::chat_message>& out) {
  if (v.type() != element_type::ARRAY) return wrong_type("messages", "an array of messages");
  out.clear();  // a repeated key: the last one counts
  std::size_t index = 0;
  const simdjson::dom::array items = v.get_array().value_unsafe();
  for (element item : items) {
    backend::chat_message message;
    if (auto error = read_message(item, index, message)) return error;
    out.push_back(std::move(message));
    ++index;
  }
  if (out.empty()) return request_error{"'messages' must hold at least one message", "messages"};
  return std::nullopt;
}

// A string, an array of one string, or an array of token ids.
std::optional<request_error> read_prompt(element v, prompt_input& out) {
  constexpr std::string_view expected = "a string, an array of one string, or an array of token ids";
  if (v.type() == element_type::STRING) {
    out = std::string(v.get_string().value_unsafe());
    return std::nullopt;
  }
  if (v.type() != element_type::ARRAY) return wrong_type("prompt", expected);
  const simdjson::dom::array items = v.get_array().value_unsafe();
  if (items.size() == 0) return request_error{"'prompt' must not be an empty array", "prompt"};
  element first = items.at(0).value_unsafe();
  if (first.type() == element_type::STRING) {
    if (items.size() != 1) {
      return request_error{"'prompt' must be one string: batched prompts are not supported", "prompt"};
    }
    out = std::string(first.get_string().value_unsafe());
    return std::nullopt;
  }
  if (first.type() == element_type::ARRAY) {
    return request_error{"'prompt' must be one prompt: batched prompts are not supported", "prompt"};
  }
  std::vector<std::int64_t> ids;
  std::size_t index = 0;
  for (element item : items) {
    const auto id = as_int64(item);
    if (!id || *id < 0) return wrong_type(format("prompt[{}]", index), "a token id (an integer of 0 or more)");
    ids.push_back(*id);
    ++index;
  }
  out = std::move(ids);
  return std::nullopt;
}

std::optional<request_error> read_stream_options(element v, openai_request& r) {
  if (v.type() != element_type::OBJECT) return wrong_type("stream_options", "an object");
  const simdjson::dom::object options = v.get_object().value_unsafe();
  for (auto [key, value] : options) {
    if (key != "include_usage" || value.is_null()) continue;
    if (auto e = read_bool(value, "stream_options.include_usage", r.include_usage)) return e;
  }
  return std::nullopt;
}

// A field that asks for something not served: a 400 unless it is off (false, 0, empty).
std::optional<request_error> refuse_unless_off(std::string_view key, element v) {
  bool off = false;
  switch (v.type()) {
    case element_type::BOOL: off = !v.get_bool().value_unsafe(); break;
    case element_type::STRING: off = v.get_string().value_unsafe().empty(); break;
    case element_type::ARRAY: off = v.get_array().value_unsafe().size() == 0; break;
    case element_type::OBJECT: off = v.get_object().value_unsafe().size() == 0; break;
    default: break;
  }
  if (off) return std::nullopt;
  return request_error{format("'{}' is not supported by this server", key), std::string(key)};
}

std::optional<request_error> read_response_format(element v) {
  if (v.type() != element_type::OBJECT) return wrong_type("response_format", "an object");
  element type;
  if (v.get_object().value_unsafe()["type"].get(type) != simdjson::SUCCESS || type.type() != element_type::STRING) {
    return wrong_type("response_format.type", "a string");
  }
  if (type.get_string().value_unsafe() == "text") return std::nullopt;
  return request_error{format("'response_format.type' '{}' is not supported: only 'text'", type.get_string().value_unsafe()),
                       "response_format.type"};
}

std::optional<request_error> read_field(std::string_view key, element v, openai_request& r) {
  if (v.is_null()) return std::nullopt;  // null means "not given"
  const bool chat = r.api == openai_api::chat_completions;
  auto& s = r.sampling;

  if (key == "model") {
    std::string model;
    if (auto e = read_string(v, key, model)) return e;
    r.model = std::move(model);
  } else if (chat && key == "messages") {
    return read_messages(v, r.messages);
  } else if (!chat && key == "prompt") {
    return read_prompt(v, r.prompt);
  } else if (key == "max_tokens" || (chat && key == "max_completion_tokens")) {
    std::int64_t n = 0;
    if (auto e = read_integer(v, key, n)) return e;
    if (n < 1) return out_of_range(key, "at least 1");
    r.max_tokens = n;
  } else if (key == "temperature") {
    double t = 0;
    if (auto e = read_number(v, key, 0.0, max_temperature, t)) return e;
    s.temperature = static_cast<float>(t);
  } else if (key == "top_p") {
    double p = 0;
    if (auto e = read_number(v, key, 0.0, 1.0, p)) return e;
    if (p == 0.0) return out_of_range(key, "above 0 and at most 1");
    s.top_p = static_cast<float>(p);
  } else if (key == "top_k") {
    std::int64_t k = 0;
    if (auto e = read_integer(v, key, k)) return e;
    // vLLM spells "off" both 0 and -1.
    if (k < -1 || k > std::numeric_limits<std::int32_t>::max()) return out_of_range(key, "-1, 0 (off) or a positive integer");
    s.top_k = static_cast<std::int32_t>(std::max<std::int64_t>(k, 0));
  } else if (key == "min_p") {
    double p = 0;
    if (auto e = read_number(v, key, 0.0, 1.0, p)) return e;
    s.min_p = static_cast<float>(p);
  } else if (key == "presence_penalty" || key == "frequency_penalty") {
    double penalty = 0;
    if (auto e = read_number(v, key, -max_penalty, max_penalty, penalty)) return e;
    (key == "presence_penalty" ? s.presence_penalty : s.frequency_penalty) = static_cast<float>(penalty);
  } else if (key == "repetition_penalty") {
    double penalty = 0;
    // Up to the largest float: the engine's parameter is a float.
    if (auto e = read_number(v, key, 0.0, std::numeric_limits<float>::max(), penalty)) return e;
    if (penalty == 0.0) return out_of_range(key, "above 0");
    s.repetition_penalty = static_cast<float>(penalty);
  } else if (key == "seed") {
    // Any 64-bit integer: the bits are the seed.
    if (v.type() == element_type::UINT64) {
      s.seed = v.get_uint64().value_unsafe();
    } else {
      std::int64_t seed = 0;
      if (auto e = read_integer(v, key, seed)) return e;
      s.seed = static_cast<std::uint64_t>(seed);
    }
  } else if (key == "stop") {
    return read_stop(v, r.stop);
  } else if (key == "stream") {
    return read_bool(v, key, r.stream);
  } else if (key == "stream_options") {
    return read_stream_options(v, r);
  } else if (key == "ignore_eos") {
    return read_bool(v, key, r.ignore_eos);
  } else if (key == "user") {
    return read_string(v, key, r.user);
  } else if (key == "n" || (!chat && key == "best_of")) {
    std::int64_t n = 0;
    if (auto e = read_integer(v, key, n)) return e;
    if (n != 1) {
      return request_error{format("'{}' must be 1: one choice per request is supported", key), std::string(key)};
    }
  } else if (key == "logprobs" || key == "echo" || key == "suffix" || key == "tools" || key == "functions" ||
             key == "logit_bias" || (chat && key == "top_logprobs")) {
    if (key == "top_logprobs" && as_int64(v) == 0) return std::nullopt;  // no alternatives: off
    return refuse_unless_off(key, v);
  } else if (chat && key == "response_format") {
    return read_response_format(v);
  }
  return std::nullopt;
}

}  // namespace

std::variant<openai_request, request_error> parse_openai_request(openai_api api, std::string_view body) {
  // A parser per request: its buffers grow with the document, and a thread-local one would
  // keep the largest body's worth of memory per thread for good.
  simdjson::dom::parser parser;
  element document;
  if (const auto error = parser.parse(body.data(), body.size()).get(document); error != simdjson::SUCCESS) {
    return request_error{format("The body is not valid JSON: {}", simdjson::error_message(error)), ""};
  }
  if (document.type() != element_type::OBJECT) return request_error{"The body must be a JSON object", ""};

  openai_request r;
  r.api = api;
  const simdjson::dom::object fields = document.get_object().value_unsafe();
  bool has_prompt = false;
  bool has_messages = false;
  bool has_stream_options = false;
  for (auto [key, value] : fields) {
    if (key == "max_completion_tokens") continue;
    if (auto error = read_field(key, value, r)) return *error;
    has_prompt |= key == "prompt" && !value.is_null();
    has_messages |= key == "messages" && !value.is_null();
    has_stream_options |= key == "stream_options" && !value.is_null();
  }
  // max_completion_tokens replaces the deprecated max_tokens and wins when both are given.
  element max_completion_tokens;
  if (api == openai_api::chat_completions &&
      fields["max_completion_tokens"].get(max_completion_tokens) == simdjson::SUCCESS) {
    if (auto error = read_field("max_completion_tokens", max_completion_tokens, r)) return *error;
  }
  if (api == openai_api::chat_completions && !has_messages) return request_error{"'messages' is required", "messages"};
  if (api == openai_api::completions && !has_prompt) return request_error{"'prompt' is required", "prompt"};
  if (has_stream_options && !r.stream) {
    return request_error{"'stream_options' is only allowed when 'stream' is true", "stream_options"};
  }
  return r;
}

}  // namespace edge::gateway
