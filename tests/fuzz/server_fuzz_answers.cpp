#include "server_fuzz_answers.h"

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <map>
#include <optional>
#include <string_view>
#include <vector>

namespace edge::fuzz {
namespace {

namespace json = boost::json;

// A finding's words; the first problem found is the one reported.
using problem = std::optional<std::string>;

std::string shorten(std::string_view text, std::size_t most = 600) {
  if (text.size() <= most) return std::string(text);
  return std::string(text.substr(0, most)) + "... (" + std::to_string(text.size()) + " bytes)";
}

std::optional<json::value> parse_json(std::string_view text) {
  boost::system::error_code ec;
  // As deep as a request may nest (the Responses API repeats its tools' schemas).
  json::value v = json::parse(text, ec, {}, {.max_depth = 2048});
  if (ec) return std::nullopt;
  return v;
}

bool is_string_or_null(const json::value* v) { return v != nullptr && (v->is_string() || v->is_null()); }

problem check_error(const json::value& body) {
  const json::object* root = body.if_object();
  const json::object* error = root != nullptr && root->contains("error") ? root->at("error").if_object() : nullptr;
  if (error == nullptr) return "an error without an \"error\" object: " + shorten(json::serialize(body));
  const json::value* message = error->if_contains("message");
  if (message == nullptr || !message->is_string() || message->as_string().empty()) {
    return "an error without a message: " + shorten(json::serialize(body));
  }
  const json::value* type = error->if_contains("type");
  if (type == nullptr || !type->is_string()) return "an error without a type: " + shorten(json::serialize(body));
  if (!is_string_or_null(error->if_contains("param")) || !is_string_or_null(error->if_contains("code"))) {
    return "an error whose param or code is missing or not a string or null: " + shorten(json::serialize(body));
  }
  return std::nullopt;
}

bool known_finish_reason(std::string_view reason) {
  return reason == "stop" || reason == "length" || reason == "tool_calls" || reason == "content_filter";
}

// A choice's output, whether read whole or assembled from a stream.
struct tool_call_seen {
  std::string name;
  std::string arguments;
};
struct choice_output {
  std::string content;
  std::vector<tool_call_seen> calls;
  std::string finish_reason;
};

// What the request asked of the output (the header's last paragraph).
problem check_output(const fuzz_request& r, const choice_output& c, std::size_t index) {
  const std::string where = "choice " + std::to_string(index) + ": ";
  if (!known_finish_reason(c.finish_reason)) return where + "finish_reason \"" + c.finish_reason + "\"";
  if (c.finish_reason == "tool_calls" && c.calls.empty()) return where + "finish_reason tool_calls without a call";
  if (!c.calls.empty() && !r.chat) return where + "tool calls in a completions answer";
  if (!r.named_tool.empty()) {
    if (c.calls.size() > 1) return where + std::to_string(c.calls.size()) + " calls where tool_choice names one function";
    for (const tool_call_seen& call : c.calls) {
      if (call.name != r.named_tool) return where + "a call to \"" + call.name + "\" where tool_choice names \"" + r.named_tool + "\"";
    }
  }
  if (!r.parallel_calls && c.calls.size() > 1) {
    return where + std::to_string(c.calls.size()) + " calls with parallel_tool_calls false";
  }
  if (c.finish_reason == "tool_calls") {
    for (const tool_call_seen& call : c.calls) {
      if (call.name.empty()) return where + "a call without a name";
      if (!parse_json(call.arguments)) return where + "a call's arguments are not JSON: " + shorten(call.arguments);
    }
  }
  if (r.calls_forced && c.content.find("<tool_call>") != std::string::npos) {
    return where + "tool-call markup left in the content: " + shorten(c.content);
  }
  // A stop string ends the output where it begins and is not part of it (an unconstrained
  // output's: stop strings leave a constrained answer whole).
  if (!r.json_output && !r.calls_forced && !r.tools_offered && !r.echo) {
    for (const std::string& stop : r.stop) {
      if (c.content.find(stop) != std::string::npos) {
        return where + "the output holds the stop string \"" + shorten(stop, 40) + "\": " + shorten(c.content);
      }
    }
  }
  // The output of a response_format that ended by itself is one JSON value (an object for
  // json_object); stop strings and the echoed prompt are text around it.
  if (r.json_output && !r.calls_forced && !r.has_stop && !r.echo && c.finish_reason == "stop") {
    const auto value = parse_json(c.content);
    if (!value) return where + "a response_format answer that ended by itself is not JSON: " + shorten(c.content);
  }
  return std::nullopt;
}

// A log probability as the API writes one: a number, at most 0, at least the floor for -inf.
bool is_logprob(const json::value* v) {
  if (v == nullptr || !(v->is_double() || v->is_int64())) return false;
  const double x = v->to_number<double>();
  return x <= 1e-4 && x >= -9999.0;
}

// The log probabilities of a choice or a chunk, in the shape of the request's API.
problem check_logprobs(const fuzz_request& r, const json::value& v) {
  const json::object* o = v.if_object();
  if (o == nullptr) return "logprobs that are not an object: " + shorten(json::serialize(v));
  if (r.chat) {
    const json::value* content = o->if_contains("content");
    if (content == nullptr || !content->is_array()) return "chat logprobs without content: " + shorten(json::serialize(v));
    for (const json::value& item : content->as_array()) {
      const json::object* e = item.if_object();
      const json::value* top = e != nullptr ? e->if_contains("top_logprobs") : nullptr;
      if (e == nullptr || !e->contains("token") || !e->at("token").is_string() || !is_logprob(e->if_contains("logprob")) ||
          top == nullptr || !top->is_array()) {
        return "a malformed chat logprobs entry: " + shorten(json::serialize(item));
      }
      if (r.top_logprobs && top->as_array().size() != static_cast<std::size_t>(*r.top_logprobs)) {
        return std::to_string(top->as_array().size()) + " top_logprobs where " + std::to_string(*r.top_logprobs) +
               " were asked for: " + shorten(json::serialize(item));
      }
      for (const json::value& alternative : top->as_array()) {
        const json::object* a = alternative.if_object();
        if (a == nullptr || !a->contains("token") || !is_logprob(a->if_contains("logprob"))) {
          return "a malformed alternative: " + shorten(json::serialize(item));
        }
      }
    }
    return std::nullopt;
  }
  const json::value* tokens = o->if_contains("tokens");
  const json::value* logprobs = o->if_contains("token_logprobs");
  const json::value* top = o->if_contains("top_logprobs");
  const json::value* offsets = o->if_contains("text_offset");
  if (tokens == nullptr || logprobs == nullptr || top == nullptr || offsets == nullptr || !tokens->is_array() ||
      !logprobs->is_array() || !top->is_array() || !offsets->is_array()) {
    return "completions logprobs without their four arrays: " + shorten(json::serialize(v));
  }
  const std::size_t size = tokens->as_array().size();
  if (logprobs->as_array().size() != size || top->as_array().size() != size || offsets->as_array().size() != size) {
    return "completions logprobs whose arrays differ in length: " + shorten(json::serialize(v));
  }
  for (std::size_t i = 0; i < size; ++i) {
    const json::value& logprob = logprobs->as_array()[i];
    if (!logprob.is_null() && !is_logprob(&logprob)) return "a malformed token logprob: " + shorten(json::serialize(v));
    const json::value& alternatives = top->as_array()[i];
    if (alternatives.is_null()) continue;
    if (!alternatives.is_object() || (r.top_logprobs && alternatives.as_object().size() >
                                                            static_cast<std::size_t>(*r.top_logprobs) + 1)) {
      return "malformed top_logprobs: " + shorten(json::serialize(alternatives));
    }
    for (const auto& alternative : alternatives.as_object()) {
      if (!is_logprob(&alternative.value())) return "a malformed alternative: " + shorten(json::serialize(alternatives));
    }
    if (!offsets->as_array()[i].is_int64()) return "a text_offset that is not an integer";
  }
  return std::nullopt;
}

problem check_usage(const fuzz_request& r, const json::value* usage) {
  if (usage == nullptr || !usage->is_object()) return "no usage object";
  const json::object& u = usage->as_object();
  const json::value* prompt = u.if_contains("prompt_tokens");
  const json::value* completion = u.if_contains("completion_tokens");
  const json::value* total = u.if_contains("total_tokens");
  if (prompt == nullptr || completion == nullptr || total == nullptr || !prompt->is_int64() || !completion->is_int64() ||
      !total->is_int64()) {
    return "usage without integer token counts: " + shorten(json::serialize(*usage));
  }
  if (prompt->as_int64() + completion->as_int64() != total->as_int64() || completion->as_int64() < 0 ||
      prompt->as_int64() <= 0) {
    return "usage that does not add up: " + shorten(json::serialize(*usage));
  }
  if (r.max_tokens && completion->as_int64() > r.n * r.prompts * *r.max_tokens) {
    return "more completion tokens than n x max_tokens: " + shorten(json::serialize(*usage));
  }
  return std::nullopt;
}

problem check_header(const fuzz_request& r, const json::object& o, bool chunk) {
  const std::string_view object = r.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  const json::value* kind = o.if_contains("object");
  if (kind == nullptr || !kind->is_string() || kind->as_string() != object) {
    return "an answer whose object is not \"" + std::string(object) + "\": " + shorten(json::serialize(o));
  }
  const json::value* id = o.if_contains("id");
  const json::value* created = o.if_contains("created");
  const json::value* model = o.if_contains("model");
  if (id == nullptr || !id->is_string() || created == nullptr || !created->is_int64() || model == nullptr || !model->is_string()) {
    return "an answer without id, created or model: " + shorten(json::serialize(o));
  }
  return std::nullopt;
}

// A tool call as a message carries it.
problem read_call(const json::value& v, tool_call_seen& out) {
  const json::object* call = v.if_object();
  const json::object* function = call != nullptr && call->contains("function") ? call->at("function").if_object() : nullptr;
  if (function == nullptr || !call->contains("id") || !call->at("id").is_string() || !call->contains("type") ||
      call->at("type") != "function") {
    return "a malformed tool call: " + shorten(json::serialize(v));
  }
  const json::value* name = function->if_contains("name");
  const json::value* arguments = function->if_contains("arguments");
  if (name == nullptr || !name->is_string() || arguments == nullptr || !arguments->is_string()) {
    return "a tool call without a name or arguments string: " + shorten(json::serialize(v));
  }
  out.name = name->as_string();
  out.arguments = arguments->as_string();
  return std::nullopt;
}

problem check_completion(const fuzz_request& r, const json::value& body) {
  const json::object* o = body.if_object();
  if (o == nullptr) return "an answer that is not an object: " + shorten(json::serialize(body));
  if (auto p = check_header(r, *o, false)) return p;
  const json::value* choices = o->if_contains("choices");
  if (choices == nullptr || !choices->is_array()) return "an answer without choices";
  if (choices->as_array().size() != static_cast<std::size_t>(r.n * r.prompts)) {
    return std::to_string(choices->as_array().size()) + " choices for n " + std::to_string(r.n) + " and " +
           std::to_string(r.prompts) + " prompts";
  }
  std::size_t index = 0;
  for (const json::value& v : choices->as_array()) {
    const json::object* choice = v.if_object();
    if (choice == nullptr) return "a choice that is not an object";
    const json::value* at = choice->if_contains("index");
    if (at == nullptr || !at->is_int64() || at->as_int64() != static_cast<std::int64_t>(index)) {
      return "choice " + std::to_string(index) + " has index " + (at != nullptr ? json::serialize(*at) : "none");
    }
    choice_output out;
    const json::value* reason = choice->if_contains("finish_reason");
    if (reason == nullptr || !reason->is_string()) return "choice " + std::to_string(index) + " without a finish_reason";
    out.finish_reason = reason->as_string();
    const json::value* logprobs = choice->if_contains("logprobs");
    if (logprobs == nullptr || !(logprobs->is_null() || logprobs->is_object())) {
      return "choice " + std::to_string(index) + ": logprobs neither null nor an object";
    }
    if (r.top_logprobs && logprobs->is_null()) return "choice " + std::to_string(index) + ": no logprobs where they were asked for";
    if (!logprobs->is_null()) {
      if (auto p = check_logprobs(r, *logprobs)) return "choice " + std::to_string(index) + ": " + *p;
    }
    if (r.chat) {
      const json::value* message = choice->if_contains("message");
      if (message == nullptr || !message->is_object()) return "choice " + std::to_string(index) + " without a message";
      const json::object& m = message->as_object();
      if (!m.contains("role") || m.at("role") != "assistant") return "a message whose role is not assistant";
      const json::value* content = m.if_contains("content");
      if (!is_string_or_null(content)) return "a message whose content is neither a string nor null";
      if (content->is_string()) out.content = content->as_string();
      if (const json::value* calls = m.if_contains("tool_calls")) {
        if (!calls->is_array()) return "tool_calls that is not an array";
        for (const json::value& call : calls->as_array()) {
          tool_call_seen seen;
          if (auto p = read_call(call, seen)) return p;
          out.calls.push_back(std::move(seen));
        }
      }
    } else {
      const json::value* text = choice->if_contains("text");
      if (text == nullptr || !text->is_string()) return "choice " + std::to_string(index) + " without text";
      out.content = text->as_string();
    }
    if (auto p = check_output(r, out, index)) return p;
    ++index;
  }
  return check_usage(r, o->if_contains("usage"));
}

// One event of a stream: its name (none for OpenAI's chat and completions) and data.
struct stream_event {
  std::string name;
  std::string data;
};

// The events of a stream, in order; a malformed stream is the problem.
problem read_events(std::string_view body, std::vector<stream_event>& events) {
  std::string data;
  std::string name;
  bool has_data = false;
  std::size_t at = 0;
  while (at < body.size()) {
    const std::size_t end = body.find('\n', at);
    if (end == std::string_view::npos) return "a stream whose last line does not end: " + shorten(body.substr(at));
    const std::string_view line = body.substr(at, end - at);
    at = end + 1;
    if (line.empty()) {
      if (has_data) events.push_back({std::move(name), std::move(data)});
      if (!has_data && !name.empty()) return "a named event without data: " + name;
      data.clear();
      name.clear();
      has_data = false;
      continue;
    }
    if (line.front() == ':') continue;  // a comment: the heartbeat
    if (line.starts_with("event: ")) {
      if (has_data || !name.empty()) return "an event name after its data or name: " + shorten(line);
      name = line.substr(7);
      continue;
    }
    if (!line.starts_with("data: ")) return "a stream line that is neither data, a name nor a comment: " + shorten(line);
    if (has_data) return "an event of more than one data line";
    data = line.substr(6);
    has_data = true;
  }
  if (has_data) return "a stream whose last event does not end with a blank line";
  return std::nullopt;
}

problem check_stream(const fuzz_request& r, const std::string& body) {
  std::vector<stream_event> named;
  if (auto p = read_events(body, named)) return p;
  std::vector<std::string> events;
  for (stream_event& e : named) {
    if (!e.name.empty()) return "a named event in an OpenAI chat or completions stream: " + e.name;
    events.push_back(std::move(e.data));
  }
  if (events.empty() || events.back() != "[DONE]") return "a stream that does not end with [DONE]: " + shorten(body);
  std::map<std::int64_t, choice_output> outputs;
  // Per choice and tool call index, the call being assembled.
  std::map<std::int64_t, std::map<std::int64_t, tool_call_seen>> calls;
  bool failed = false;
  bool usage_seen = false;
  for (std::size_t e = 0; e + 1 < events.size(); ++e) {
    if (events[e] == "[DONE]") return "[DONE] before the stream's end";
    if (failed) return "an event after the stream's error event: " + shorten(events[e]);
    const auto parsed = parse_json(events[e]);
    if (!parsed || !parsed->is_object()) return "a stream event that is not a JSON object: " + shorten(events[e]);
    const json::object& o = parsed->as_object();
    if (o.contains("error")) {
      if (auto p = check_error(*parsed)) return p;
      failed = true;
      continue;
    }
    if (auto p = check_header(r, o, true)) return p;
    if (usage_seen) return "a chunk after the usage chunk";
    const json::value* choices = o.if_contains("choices");
    if (choices == nullptr || !choices->is_array()) return "a chunk without choices: " + shorten(events[e]);
    if (choices->as_array().empty()) {
      if (auto p = check_usage(r, o.if_contains("usage"))) return "the usage chunk: " + *p;
      usage_seen = true;
      continue;
    }
    for (const json::value& v : choices->as_array()) {
      const json::object* choice = v.if_object();
      const json::value* at = choice != nullptr ? choice->if_contains("index") : nullptr;
      if (at == nullptr || !at->is_int64() || at->as_int64() < 0 || at->as_int64() >= r.n * r.prompts) {
        return "a chunk of no choice of the request: " + shorten(events[e]);
      }
      choice_output& out = outputs[at->as_int64()];
      if (!out.finish_reason.empty()) return "a chunk of choice " + std::to_string(at->as_int64()) + " after it finished";
      if (r.chat) {
        const json::value* delta = choice->if_contains("delta");
        if (delta == nullptr || !delta->is_object()) return "a chat chunk without a delta: " + shorten(events[e]);
        if (const json::value* content = delta->as_object().if_contains("content"); content != nullptr && content->is_string()) {
          out.content += content->as_string();
        }
        if (const json::value* deltas = delta->as_object().if_contains("tool_calls")) {
          if (!deltas->is_array()) return "tool_calls in a delta that is not an array";
          for (const json::value& d : deltas->as_array()) {
            const json::object* call = d.if_object();
            const json::value* call_index = call != nullptr ? call->if_contains("index") : nullptr;
            const json::object* function =
                call != nullptr && call->contains("function") ? call->at("function").if_object() : nullptr;
            if (call_index == nullptr || !call_index->is_int64() || function == nullptr) {
              return "a malformed tool call delta: " + shorten(json::serialize(d));
            }
            auto& calls_of_choice = calls[at->as_int64()];
            const bool first = !calls_of_choice.contains(call_index->as_int64());
            tool_call_seen& seen = calls_of_choice[call_index->as_int64()];
            if (first) {
              const json::value* name = function->if_contains("name");
              if (!call->contains("id") || name == nullptr || !name->is_string()) {
                return "a tool call's first delta without id and name: " + shorten(json::serialize(d));
              }
              seen.name = name->as_string();
            }
            if (const json::value* arguments = function->if_contains("arguments")) {
              if (!arguments->is_string()) return "tool call arguments that are not a string";
              seen.arguments += arguments->as_string();
            }
          }
        }
      } else {
        const json::value* text = choice->if_contains("text");
        if (text == nullptr || !text->is_string()) return "a completions chunk without text: " + shorten(events[e]);
        out.content += text->as_string();
      }
      if (const json::value* logprobs = choice->if_contains("logprobs"); logprobs != nullptr && !logprobs->is_null()) {
        if (auto p = check_logprobs(r, *logprobs)) return "a chunk's " + *p;
      }
      const json::value* reason = choice->if_contains("finish_reason");
      if (reason == nullptr || !(reason->is_null() || reason->is_string())) return "a chunk's finish_reason is malformed";
      if (reason->is_string()) {
        out.finish_reason = reason->as_string();
        if (out.finish_reason.empty()) return "an empty finish_reason";
      }
    }
  }
  if (failed) return std::nullopt;
  for (std::int64_t i = 0; i < r.n * r.prompts; ++i) {
    auto found = outputs.find(i);
    if (found == outputs.end() || found->second.finish_reason.empty()) {
      return "choice " + std::to_string(i) + " of the stream never finished";
    }
    for (auto& [call_index, call] : calls[i]) found->second.calls.push_back(std::move(call));
    if (auto p = check_output(r, found->second, static_cast<std::size_t>(i))) return p;
  }
  return std::nullopt;
}

// ---- Anthropic's Messages ----------------------------------------------------------------------

problem check_anthropic_error(const json::value& body) {
  const json::object* root = body.if_object();
  const json::object* error = root != nullptr && root->contains("error") ? root->at("error").if_object() : nullptr;
  if (error == nullptr || !root->contains("type") || root->at("type") != "error") {
    return "a Messages error not of Anthropic's shape: " + shorten(json::serialize(body));
  }
  const json::value* type = error->if_contains("type");
  const json::value* message = error->if_contains("message");
  if (type == nullptr || !type->is_string() || message == nullptr || !message->is_string() || message->as_string().empty()) {
    return "a Messages error without type and message: " + shorten(json::serialize(body));
  }
  return std::nullopt;
}

// Anthropic's stop_reason as the finish_reason check_output judges.
std::string finish_of_stop_reason(std::string_view reason) {
  if (reason == "end_turn" || reason == "stop_sequence") return "stop";
  if (reason == "max_tokens") return "length";
  if (reason == "tool_use") return "tool_calls";
  if (reason == "refusal") return "content_filter";
  return "unknown stop_reason " + std::string(reason);
}

problem check_messages_usage(const fuzz_request& r, const json::value* usage) {
  const json::object* u = usage != nullptr ? usage->if_object() : nullptr;
  if (u == nullptr) return "a message without usage";
  for (const char* key : {"input_tokens", "output_tokens", "cache_read_input_tokens"}) {
    const json::value* v = u->if_contains(key);
    if (v == nullptr || !v->is_int64() || v->as_int64() < 0) return "a message's usage without " + std::string(key);
  }
  if (u->at("input_tokens").as_int64() + u->at("cache_read_input_tokens").as_int64() <= 0) return "a message of no prompt";
  if (r.max_tokens && u->at("output_tokens").as_int64() > *r.max_tokens) {
    return "more output tokens than max_tokens: " + shorten(json::serialize(*usage));
  }
  return std::nullopt;
}

problem check_message(const fuzz_request& r, const json::value& body) {
  const json::object* o = body.if_object();
  if (o == nullptr || !o->contains("type") || o->at("type") != "message" || !o->contains("role") ||
      o->at("role") != "assistant" || !o->contains("id") || !o->at("id").is_string()) {
    return "not a Messages message: " + shorten(json::serialize(body));
  }
  const json::value* content = o->if_contains("content");
  if (content == nullptr || !content->is_array()) return "a message without content blocks";
  choice_output out;
  for (const json::value& v : content->as_array()) {
    const json::object* block = v.if_object();
    const json::value* type = block != nullptr ? block->if_contains("type") : nullptr;
    if (type == nullptr || !type->is_string()) return "a content block without a type: " + shorten(json::serialize(v));
    if (*type == "text") {
      if (!block->contains("text") || !block->at("text").is_string()) return "a text block without text";
      out.content += block->at("text").as_string();
    } else if (*type == "tool_use") {
      if (!block->contains("id") || !block->contains("name") || !block->at("name").is_string() || !block->contains("input") ||
          !block->at("input").is_object()) {
        return "a malformed tool_use block: " + shorten(json::serialize(v));
      }
      out.calls.push_back({std::string(block->at("name").as_string()), json::serialize(block->at("input"))});
    } else if (*type != "thinking") {
      return "a content block of type " + json::serialize(*type);
    }
  }
  const json::value* reason = o->if_contains("stop_reason");
  if (reason == nullptr || !reason->is_string()) return "a message without a stop_reason";
  out.finish_reason = finish_of_stop_reason(reason->as_string());
  if (*reason == "stop_sequence") {
    const json::value* sequence = o->if_contains("stop_sequence");
    if (sequence == nullptr || !sequence->is_string()) return "stop_reason stop_sequence without its stop_sequence";
  }
  if (auto p = check_output(r, out, 0)) return p;
  return check_messages_usage(r, o->if_contains("usage"));
}

problem check_messages_stream(const fuzz_request& r, const std::vector<stream_event>& events) {
  if (events.empty() || events.front().name != "message_start") return "a Messages stream that does not open with message_start";
  choice_output out;
  std::map<std::int64_t, tool_call_seen> calls;
  std::int64_t blocks = 0;
  std::optional<std::int64_t> open;
  bool delta_seen = false;
  bool stopped = false;
  for (std::size_t e = 0; e < events.size(); ++e) {
    const stream_event& event = events[e];
    if (stopped) return "an event after message_stop: " + event.name;
    const auto parsed = parse_json(event.data);
    if (!parsed || !parsed->is_object()) return "a Messages event that is not a JSON object: " + shorten(event.data);
    const json::object& o = parsed->as_object();
    if (event.name == "error") {
      if (auto p = check_anthropic_error(*parsed)) return p;
      if (e + 1 != events.size()) return "an event after the stream's error event";
      return std::nullopt;
    }
    if (!o.contains("type") || o.at("type") != json::value(event.name)) return "an event whose type is not its name: " + shorten(event.data);
    if (event.name == "ping" || event.name == "message_start") continue;
    if (event.name == "content_block_start") {
      if (open) return "a block opened while block " + std::to_string(*open) + " is open";
      if (!o.contains("index") || o.at("index") != blocks) return "content_block_start out of order: " + shorten(event.data);
      const json::object& block = o.at("content_block").as_object();
      if (block.at("type") == "tool_use") calls[blocks].name = block.at("name").as_string();
      open = blocks++;
    } else if (event.name == "content_block_delta") {
      if (!open || o.at("index") != *open) return "a delta of a block that is not open: " + shorten(event.data);
      const json::object& delta = o.at("delta").as_object();
      if (delta.at("type") == "text_delta") {
        out.content += delta.at("text").as_string();
      } else if (delta.at("type") == "input_json_delta") {
        if (!calls.contains(*open)) return "input_json_delta in a block that is not tool_use";
        calls[*open].arguments += delta.at("partial_json").as_string();
      } else if (delta.at("type") != "thinking_delta") {
        return "a delta of type " + json::serialize(delta.at("type"));
      }
    } else if (event.name == "content_block_stop") {
      if (!open || o.at("index") != *open) return "content_block_stop of a block that is not open";
      open.reset();
    } else if (event.name == "message_delta") {
      if (open) return "message_delta while a block is open";
      if (delta_seen) return "a second message_delta";
      delta_seen = true;
      const json::value& reason = o.at("delta").at("stop_reason");
      if (!reason.is_string()) return "message_delta without a stop_reason";
      out.finish_reason = finish_of_stop_reason(reason.as_string());
      if (auto p = check_messages_usage(r, o.if_contains("usage"))) return "message_delta: " + *p;
    } else if (event.name == "message_stop") {
      if (!delta_seen) return "message_stop before message_delta";
      stopped = true;
    } else {
      return "a Messages event named " + event.name;
    }
  }
  if (!stopped) return "a Messages stream that does not end with message_stop";
  for (auto& [index, call] : calls) out.calls.push_back(std::move(call));
  return check_output(r, out, 0);
}

// ---- OpenAI's Responses -----------------------------------------------------------------------

// The response's output as check_output judges it, and its finish_reason.
problem read_response(const json::value& v, choice_output& out) {
  const json::object* o = v.if_object();
  if (o == nullptr || !o->contains("object") || o->at("object") != "response" || !o->contains("id") ||
      !o->at("id").is_string() || !o->contains("status") || !o->at("status").is_string()) {
    return "not a response object: " + shorten(json::serialize(v));
  }
  const json::value* output = o->if_contains("output");
  if (output == nullptr || !output->is_array()) return "a response without output";
  for (const json::value& item : output->as_array()) {
    const json::object* i = item.if_object();
    const json::value* type = i != nullptr ? i->if_contains("type") : nullptr;
    if (type == nullptr || !type->is_string() || !i->contains("id")) return "an output item without type or id";
    if (*type == "message") {
      for (const json::value& part : i->at("content").as_array()) out.content += part.at("text").as_string();
    } else if (*type == "function_call") {
      if (!i->contains("call_id") || !i->contains("name") || !i->at("name").is_string() || !i->contains("arguments") ||
          !i->at("arguments").is_string()) {
        return "a malformed function_call item: " + shorten(json::serialize(item));
      }
      out.calls.push_back({std::string(i->at("name").as_string()), std::string(i->at("arguments").as_string())});
    } else if (*type != "reasoning") {
      return "an output item of type " + json::serialize(*type);
    }
  }
  const std::string_view status = o->at("status").as_string();
  if (status == "completed") {
    out.finish_reason = out.calls.empty() ? "stop" : "tool_calls";
  } else if (status == "incomplete") {
    const json::value& details = o->at("incomplete_details");
    out.finish_reason = details.at("reason") == "max_output_tokens" ? "length" : "content_filter";
  } else {
    out.finish_reason = "status " + std::string(status);
  }
  return std::nullopt;
}

problem check_responses_usage(const fuzz_request& r, const json::value* usage) {
  const json::object* u = usage != nullptr ? usage->if_object() : nullptr;
  if (u == nullptr) return "a response without usage";
  const json::value* input = u->if_contains("input_tokens");
  const json::value* output = u->if_contains("output_tokens");
  const json::value* total = u->if_contains("total_tokens");
  if (input == nullptr || output == nullptr || total == nullptr || !input->is_int64() || !output->is_int64() ||
      !total->is_int64() || input->as_int64() <= 0 || input->as_int64() + output->as_int64() != total->as_int64()) {
    return "a response's usage that does not add up: " + shorten(json::serialize(*usage));
  }
  if (r.max_tokens && output->as_int64() > *r.max_tokens) return "more output tokens than max_output_tokens";
  return std::nullopt;
}

problem check_response(const fuzz_request& r, const json::value& body) {
  choice_output out;
  if (auto p = read_response(body, out)) return p;
  if (auto p = check_output(r, out, 0)) return p;
  return check_responses_usage(r, body.as_object().if_contains("usage"));
}

problem check_responses_stream(const fuzz_request& r, const std::vector<stream_event>& events) {
  if (events.empty() || events.front().name != "response.created") return "a Responses stream that does not open with response.created";
  // What the deltas add up to, per output index.
  std::map<std::int64_t, std::string> text;
  std::map<std::int64_t, std::string> arguments;
  for (std::size_t e = 0; e < events.size(); ++e) {
    const stream_event& event = events[e];
    const auto parsed = parse_json(event.data);
    if (!parsed || !parsed->is_object()) return "a Responses event that is not a JSON object: " + shorten(event.data);
    const json::object& o = parsed->as_object();
    if (!o.contains("type") || o.at("type") != json::value(event.name)) return "an event whose type is not its name: " + shorten(event.data);
    const json::value* sequence = o.if_contains("sequence_number");
    if (sequence == nullptr || *sequence != static_cast<std::int64_t>(e)) return "sequence_number out of order: " + shorten(event.data);
    const bool terminal = event.name == "response.completed" || event.name == "response.incomplete" || event.name == "response.failed";
    if (terminal != (e + 1 == events.size())) return "a terminal event that is not the last, or a last that is not terminal";
    if (event.name == "response.output_text.delta") text[o.at("output_index").as_int64()] += o.at("delta").as_string();
    if (event.name == "response.function_call_arguments.delta") {
      arguments[o.at("output_index").as_int64()] += o.at("delta").as_string();
    }
    if (!terminal) continue;
    if (event.name == "response.failed") {
      const json::value& error = o.at("response").at("error");
      if (!error.is_object() || !error.as_object().contains("message")) return "response.failed without an error";
      return std::nullopt;
    }
    choice_output out;
    if (auto p = read_response(o.at("response"), out)) return p;
    // The stream says what the response it ends with holds.
    const json::array& output = o.at("response").at("output").as_array();
    for (std::size_t i = 0; i < output.size(); ++i) {
      const json::object& item = output[i].as_object();
      const auto index = static_cast<std::int64_t>(i);
      if (item.at("type") == "message") {
        std::string whole;
        for (const json::value& part : item.at("content").as_array()) whole += part.at("text").as_string();
        if (whole != text[index]) return "a message item that is not what its deltas said: " + shorten(whole);
      } else if (item.at("type") == "function_call" && item.at("arguments").as_string() != arguments[index]) {
        return "a function_call item whose arguments are not what its deltas said";
      }
    }
    if (auto p = check_output(r, out, 0)) return p;
    return check_responses_usage(r, o.at("response").as_object().if_contains("usage"));
  }
  return "a Responses stream without its terminal event";
}

}  // namespace

bool documented_status(unsigned status) {
  return status == 200 || status == 400 || status == 404 || status == 413 || status == 429 || status == 503;
}

namespace {

problem judge(const fuzz_request& r, const http_answer& a) {
  if (!a.headers) {
    // A request that was not written whole may be cut off by the server's refusal (413).
    if (!a.sent || r.leave == leaving::after_send) return std::nullopt;
    return "no answer: " + a.failure;
  }
  if (!documented_status(a.status)) return "status " + std::to_string(a.status) + ": " + shorten(a.body);
  if ((a.status == 429 || a.status == 503) && a.retry_after.empty()) {
    return "status " + std::to_string(a.status) + " without retry-after: " + shorten(a.body);
  }
  if (r.expect == expectation::refused_400) {
    const bool tight_refusal = a.status == 429 && r.tenant == tenant_kind::tight;
    if (a.status != 400 && a.status != 413 && !tight_refusal) {
      return "status " + std::to_string(a.status) + " for a body that must be refused with 400: " + shorten(a.body);
    }
  }
  if (r.leave != leaving::stays) return std::nullopt;
  if (!a.complete) {
    if (!a.sent) return std::nullopt;
    return "the answer ended early: " + a.failure + " after " + std::to_string(a.body.size()) + " bytes";
  }
  const bool agent_api = r.api == api_kind::messages || r.api == api_kind::responses;
  const bool generation = r.target == "/v1/chat/completions" || r.target == "/v1/completions" || agent_api;
  if (a.status == 200 && generation && r.stream) {
    if (!a.content_type.starts_with("text/event-stream")) return "a stream answered as " + a.content_type;
    if (!agent_api) return check_stream(r, a.body);
    std::vector<stream_event> events;
    if (auto p = read_events(a.body, events)) return p;
    for (const stream_event& e : events) {
      if (e.name.empty()) return "an unnamed event in a " + r.target + " stream: " + shorten(e.data);
    }
    return r.api == api_kind::messages ? check_messages_stream(r, events) : check_responses_stream(r, events);
  }
  if (!a.content_type.starts_with("application/json")) {
    return "status " + std::to_string(a.status) + " answered as \"" + a.content_type + "\": " + shorten(a.body);
  }
  const auto body = parse_json(a.body);
  if (!body) return "status " + std::to_string(a.status) + " with a body that is not JSON: " + shorten(a.body);
  if (a.status != 200) return r.api == api_kind::messages ? check_anthropic_error(*body) : check_error(*body);
  if (!generation) {
    const json::object* o = body->if_object();
    if (o == nullptr) return "an answer that is not an object: " + shorten(a.body);
    if (r.target == "/tokenize") {
      const json::value* tokens = o->if_contains("tokens");
      const json::value* count = o->if_contains("count");
      if (tokens == nullptr || !tokens->is_array() || count == nullptr || !count->is_int64() ||
          count->as_int64() != static_cast<std::int64_t>(tokens->as_array().size())) {
        return "a /tokenize answer without tokens and their count: " + shorten(a.body);
      }
      return std::nullopt;
    }
    if (r.target == "/detokenize") {
      const json::value* text = o->if_contains("prompt");
      if (text == nullptr || !text->is_string()) return "a /detokenize answer without its text: " + shorten(a.body);
      return std::nullopt;
    }
    if (!o->contains("object")) return "a models answer without object: " + shorten(a.body);
    return std::nullopt;
  }
  if (r.api == api_kind::messages) return check_message(r, *body);
  if (r.api == api_kind::responses) return check_response(r, *body);
  return check_completion(r, *body);
}

}  // namespace

std::optional<std::string> check_answer(const fuzz_request& r, const http_answer& a) {
  // The checks read the answer with Boost.JSON's throwing accessors where its shape was not
  // checked first: a member missing or of another type is the answer's fault.
  try {
    return judge(r, a);
  } catch (const std::exception& e) {
    return std::string("a malformed answer (") + e.what() + "): " + shorten(a.body);
  }
}

}  // namespace edge::fuzz
