#include "edge/gateway/internal_protocol.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <simdjson.h>

#include <cmath>
#include <limits>

#include "edge/common/format.h"

namespace edge::gateway {
namespace {

namespace json = boost::json;
using element = simdjson::dom::element;
using element_type = simdjson::dom::element_type;

// The most top alternatives a delta may carry (the engine's own limit is lower).
constexpr std::size_t max_top_logprobs_on_wire = 64;

// JSON has no infinities: a token the model gave no probability at all is sent as the lowest
// finite float instead.
double finite_logprob(float logprob) {
  return std::isfinite(logprob) ? static_cast<double>(logprob) : static_cast<double>(std::numeric_limits<float>::lowest());
}

// ---- reading ---------------------------------------------------------------------------------

// A field that is absent, null or of the wrong type, named for the error.
internal_request_error bad(std::string_view param, std::string_view expected) {
  return {format("'{}' must be {}", param, expected), std::string(param)};
}

std::optional<std::int64_t> as_int64(element v) {
  if (v.type() == element_type::INT64) return v.get_int64().value_unsafe();
  if (v.type() == element_type::UINT64) {
    const std::uint64_t u = v.get_uint64().value_unsafe();
    if (u <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return static_cast<std::int64_t>(u);
  }
  return std::nullopt;
}

std::optional<double> as_double(element v) {
  const element_type t = v.type();
  if (t != element_type::INT64 && t != element_type::UINT64 && t != element_type::DOUBLE) return std::nullopt;
  const double d = v.get_double().value_unsafe();
  if (!std::isfinite(d)) return std::nullopt;
  return d;
}

std::optional<internal_request_error> read_token_ids(element v, std::string_view param,
                                                     std::vector<backend::token_id>& out) {
  if (v.type() != element_type::ARRAY) return bad(param, "an array of token ids");
  std::size_t index = 0;
  const simdjson::dom::array items = v.get_array().value_unsafe();
  for (element item : items) {
    const auto id = as_int64(item);
    if (!id || *id < 0 || *id > std::numeric_limits<backend::token_id>::max()) {
      return bad(format("{}[{}]", param, index), "a token id");
    }
    out.push_back(static_cast<backend::token_id>(*id));
    ++index;
  }
  return std::nullopt;
}

std::optional<internal_request_error> read_sampling(element v, backend::sampling_params& out) {
  if (v.type() != element_type::OBJECT) return bad("sampling", "an object");
  const simdjson::dom::object fields = v.get_object().value_unsafe();
  for (const auto field : fields) {
    const std::string param = format("sampling.{}", field.key);
    const element value = field.value;
    if (field.key == "seed") {
      if (value.type() == element_type::NULL_VALUE) continue;
      if (value.type() == element_type::UINT64) {
        out.seed = value.get_uint64().value_unsafe();
        continue;
      }
      const auto seed = as_int64(value);
      if (!seed || *seed < 0) return bad(param, "a non-negative integer");
      out.seed = static_cast<std::uint64_t>(*seed);
      continue;
    }
    if (field.key == "top_k") {
      const auto k = as_int64(value);
      if (!k || *k < 0 || *k > std::numeric_limits<std::int32_t>::max()) return bad(param, "a non-negative integer");
      out.top_k = static_cast<std::int32_t>(*k);
      continue;
    }
    const auto number = as_double(value);
    if (!number) return bad(param, "a number");
    const auto f = static_cast<float>(*number);
    if (field.key == "temperature") {
      out.temperature = f;
    } else if (field.key == "top_p") {
      out.top_p = f;
    } else if (field.key == "min_p") {
      out.min_p = f;
    } else if (field.key == "repetition_penalty") {
      out.repetition_penalty = f;
    } else if (field.key == "presence_penalty") {
      out.presence_penalty = f;
    } else if (field.key == "frequency_penalty") {
      out.frequency_penalty = f;
    } else {
      return internal_request_error{format("unknown field '{}'", param), param};
    }
  }
  return std::nullopt;
}

std::optional<internal_request_error> read_fields(simdjson::dom::object fields, backend::generate_request& r) {
  bool has_prompt = false;
  bool has_max_tokens = false;
  for (const auto field : fields) {
    const std::string_view key = field.key;
    const element value = field.value;
    const auto read_string = [&](std::string& out) -> std::optional<internal_request_error> {
      if (value.type() != element_type::STRING) return bad(key, "a string");
      out = std::string(value.get_string().value_unsafe());
      return std::nullopt;
    };
    std::optional<internal_request_error> error;
    if (key == "id") {
      error = read_string(r.id);
    } else if (key == "tenant") {
      error = read_string(r.tenant);
    } else if (key == "cache_salt") {
      error = read_string(r.cache_salt);
    } else if (key == "weight") {
      const auto w = as_double(value);
      if (!w) return bad(key, "a number");
      r.weight = *w;
    } else if (key == "priority") {
      const auto p = as_int64(value);
      if (!p || *p < std::numeric_limits<std::int32_t>::min() || *p > std::numeric_limits<std::int32_t>::max()) {
        return bad(key, "a 32-bit integer");
      }
      r.priority = static_cast<std::int32_t>(*p);
    } else if (key == "prompt") {
      r.prompt.clear();
      error = read_token_ids(value, key, r.prompt);
      has_prompt = true;
    } else if (key == "sampling") {
      error = read_sampling(value, r.sampling);
    } else if (key == "max_tokens") {
      const auto n = as_int64(value);
      if (!n || *n < 1) return bad(key, "a positive integer");
      r.max_tokens = *n;
      has_max_tokens = true;
    } else if (key == "stop") {
      if (value.type() != element_type::ARRAY) return bad(key, "an array of strings");
      r.stop.clear();
      std::size_t index = 0;
      const simdjson::dom::array items = value.get_array().value_unsafe();
      for (element item : items) {
        if (item.type() != element_type::STRING) return bad(format("stop[{}]", index), "a string");
        r.stop.emplace_back(item.get_string().value_unsafe());
        ++index;
      }
    } else if (key == "stop_token_ids") {
      r.stop_token_ids.clear();
      error = read_token_ids(value, key, r.stop_token_ids);
    } else if (key == "ignore_eos") {
      if (value.type() != element_type::BOOL) return bad(key, "true or false");
      r.ignore_eos = value.get_bool().value_unsafe();
    } else if (key == "logprobs") {
      if (value.type() == element_type::NULL_VALUE) {
        r.logprobs.reset();
      } else {
        const auto n = as_int64(value);
        if (!n || *n < 0 || *n > static_cast<std::int64_t>(max_top_logprobs_on_wire)) {
          return bad(key, format("null or an integer from 0 to {}", max_top_logprobs_on_wire));
        }
        r.logprobs = static_cast<std::int32_t>(*n);
      }
    } else {
      return internal_request_error{format("unknown field '{}'", key), std::string(key)};
    }
    if (error) return error;
  }
  if (!has_prompt) return internal_request_error{"'prompt' is required", "prompt"};
  if (!has_max_tokens) return internal_request_error{"'max_tokens' is required", "max_tokens"};
  return std::nullopt;
}

// Reads `body` into a DOM; the parser must outlive the element.
result<element> parse_document(simdjson::dom::parser& parser, std::string_view body, std::string_view what) {
  element document;
  if (const auto error = parser.parse(body.data(), body.size()).get(document); error != simdjson::SUCCESS) {
    return invalid_argument(format("{} is not valid JSON: {}", what, simdjson::error_message(error)));
  }
  if (document.type() != element_type::OBJECT) return invalid_argument(format("{} is not a JSON object", what));
  return document;
}

result<std::int64_t> required_integer(simdjson::dom::object o, std::string_view key, std::string_view what) {
  element v;
  if (o[key].get(v) != simdjson::SUCCESS) return invalid_argument(format("{}: '{}' is missing", what, key));
  const auto n = as_int64(v);
  if (!n) return invalid_argument(format("{}: '{}' is not an integer", what, key));
  return *n;
}

result<double> required_number(simdjson::dom::object o, std::string_view key, std::string_view what) {
  element v;
  if (o[key].get(v) != simdjson::SUCCESS) return invalid_argument(format("{}: '{}' is missing", what, key));
  const auto d = as_double(v);
  if (!d) return invalid_argument(format("{}: '{}' is not a number", what, key));
  return *d;
}

result<std::string> required_string(simdjson::dom::object o, std::string_view key, std::string_view what) {
  element v;
  if (o[key].get(v) != simdjson::SUCCESS || v.type() != element_type::STRING) {
    return invalid_argument(format("{}: '{}' is missing or not a string", what, key));
  }
  return std::string(v.get_string().value_unsafe());
}

result<simdjson::dom::object> required_object(simdjson::dom::object o, std::string_view key, std::string_view what) {
  element v;
  if (o[key].get(v) != simdjson::SUCCESS || v.type() != element_type::OBJECT) {
    return invalid_argument(format("{}: '{}' is missing or not an object", what, key));
  }
  return v.get_object().value_unsafe();
}

result<std::vector<backend::token_id>> token_list(element v, std::string_view what) {
  std::vector<backend::token_id> out;
  if (const auto error = read_token_ids(v, what, out)) return invalid_argument(error->message);
  return out;
}

result<backend::token_logprob> token_logprob_from(element v) {
  if (v.type() != element_type::OBJECT) return invalid_argument("a logprob is not an object");
  const simdjson::dom::object o = v.get_object().value_unsafe();
  EDGE_ASSIGN_OR_RETURN(const std::int64_t id, required_integer(o, "id", "logprob"));
  EDGE_ASSIGN_OR_RETURN(const double logprob, required_number(o, "logprob", "logprob"));
  return backend::token_logprob{static_cast<backend::token_id>(id), static_cast<float>(logprob)};
}

std::optional<backend::finish_reason> parse_finish_reason(std::string_view text) {
  for (const auto reason : {backend::finish_reason::stop, backend::finish_reason::length, backend::finish_reason::abort,
                            backend::finish_reason::error}) {
    if (backend::to_string(reason) == text) return reason;
  }
  return std::nullopt;
}

result<backend::engine_event> delta_from(simdjson::dom::object o) {
  backend::delta_event delta;
  EDGE_ASSIGN_OR_RETURN(delta.text, required_string(o, "text", "delta"));
  element tokens;
  if (o["tokens"].get(tokens) != simdjson::SUCCESS) return invalid_argument("delta: 'tokens' is missing");
  EDGE_ASSIGN_OR_RETURN(delta.tokens, token_list(tokens, "tokens"));
  element logprobs;
  if (o["logprobs"].get(logprobs) == simdjson::SUCCESS) {
    if (logprobs.type() != element_type::ARRAY) return invalid_argument("delta: 'logprobs' is not an array");
    const simdjson::dom::array items = logprobs.get_array().value_unsafe();
    for (element item : items) {
      backend::sampled_logprobs sampled;
      EDGE_ASSIGN_OR_RETURN(sampled.chosen, token_logprob_from(item));
      element top;
      if (item.get_object().value_unsafe()["top"].get(top) == simdjson::SUCCESS) {
        if (top.type() != element_type::ARRAY) return invalid_argument("delta: 'top' is not an array");
        const simdjson::dom::array alternatives = top.get_array().value_unsafe();
        for (element alternative : alternatives) {
          EDGE_ASSIGN_OR_RETURN(auto entry, token_logprob_from(alternative));
          sampled.top.push_back(entry);
        }
      }
      delta.logprobs.push_back(std::move(sampled));
    }
  }
  return backend::engine_event(std::move(delta));
}

result<backend::engine_event> finished_from(simdjson::dom::object o) {
  backend::finished_event finished;
  EDGE_ASSIGN_OR_RETURN(const std::string reason, required_string(o, "reason", "finished"));
  const auto parsed = parse_finish_reason(reason);
  if (!parsed) return invalid_argument(format("finished: unknown reason '{}'", reason));
  finished.reason = *parsed;
  EDGE_ASSIGN_OR_RETURN(finished.error, required_string(o, "error", "finished"));
  EDGE_ASSIGN_OR_RETURN(const auto usage, required_object(o, "usage", "finished"));
  EDGE_ASSIGN_OR_RETURN(finished.usage.prompt_tokens, required_integer(usage, "prompt_tokens", "usage"));
  EDGE_ASSIGN_OR_RETURN(finished.usage.completion_tokens, required_integer(usage, "completion_tokens", "usage"));
  EDGE_ASSIGN_OR_RETURN(finished.usage.cached_tokens, required_integer(usage, "cached_tokens", "usage"));
  EDGE_ASSIGN_OR_RETURN(const auto timings, required_object(o, "timings", "finished"));
  EDGE_ASSIGN_OR_RETURN(finished.timings.queued_seconds, required_number(timings, "queued_seconds", "timings"));
  EDGE_ASSIGN_OR_RETURN(finished.timings.time_to_first_token, required_number(timings, "time_to_first_token", "timings"));
  EDGE_ASSIGN_OR_RETURN(finished.timings.total_seconds, required_number(timings, "total_seconds", "timings"));
  EDGE_ASSIGN_OR_RETURN(finished.timings.preemptions, required_integer(timings, "preemptions", "timings"));
  return backend::engine_event(std::move(finished));
}

json::object logprob_json(const backend::token_logprob& entry) {
  return json::object{{"id", entry.id}, {"logprob", finite_logprob(entry.logprob)}};
}

}  // namespace

// ---- the generate request ---------------------------------------------------------------------

std::string encode_generate_request(const backend::generate_request& r) {
  json::object sampling{{"temperature", r.sampling.temperature},
                        {"top_k", r.sampling.top_k},
                        {"top_p", r.sampling.top_p},
                        {"min_p", r.sampling.min_p},
                        {"repetition_penalty", r.sampling.repetition_penalty},
                        {"presence_penalty", r.sampling.presence_penalty},
                        {"frequency_penalty", r.sampling.frequency_penalty}};
  if (r.sampling.seed) {
    sampling["seed"] = *r.sampling.seed;
  } else {
    sampling["seed"] = nullptr;
  }
  json::object body{{"id", r.id},
                    {"tenant", r.tenant},
                    {"weight", r.weight},
                    {"priority", r.priority},
                    {"cache_salt", r.cache_salt},
                    {"prompt", json::array(r.prompt.begin(), r.prompt.end())},
                    {"sampling", std::move(sampling)},
                    {"max_tokens", r.max_tokens},
                    {"stop", json::array(r.stop.begin(), r.stop.end())},
                    {"stop_token_ids", json::array(r.stop_token_ids.begin(), r.stop_token_ids.end())},
                    {"ignore_eos", r.ignore_eos}};
  if (r.logprobs) {
    body["logprobs"] = *r.logprobs;
  } else {
    body["logprobs"] = nullptr;
  }
  return json::serialize(body);
}

std::variant<backend::generate_request, internal_request_error> parse_generate_request(std::string_view body) {
  simdjson::dom::parser parser;
  element document;
  if (const auto error = parser.parse(body.data(), body.size()).get(document); error != simdjson::SUCCESS) {
    return internal_request_error{format("the body is not valid JSON: {}", simdjson::error_message(error)), ""};
  }
  if (document.type() != element_type::OBJECT) return internal_request_error{"the body must be a JSON object", ""};
  backend::generate_request r;
  if (auto error = read_fields(document.get_object().value_unsafe(), r)) return std::move(*error);
  return r;
}

// ---- events -----------------------------------------------------------------------------------

std::string encode_event(const backend::engine_event& event) {
  json::object out;
  if (std::holds_alternative<backend::admitted_event>(event)) {
    out["type"] = "admitted";
  } else if (const auto* delta = std::get_if<backend::delta_event>(&event)) {
    out["type"] = "delta";
    out["text"] = delta->text;
    out["tokens"] = json::array(delta->tokens.begin(), delta->tokens.end());
    if (!delta->logprobs.empty()) {
      json::array logprobs;
      for (const backend::sampled_logprobs& sampled : delta->logprobs) {
        json::object entry = logprob_json(sampled.chosen);
        json::array top;
        for (const backend::token_logprob& alternative : sampled.top) top.push_back(logprob_json(alternative));
        entry["top"] = std::move(top);
        logprobs.push_back(std::move(entry));
      }
      out["logprobs"] = std::move(logprobs);
    }
  } else {
    const auto& finished = std::get<backend::finished_event>(event);
    out["type"] = "finished";
    out["reason"] = backend::to_string(finished.reason);
    out["error"] = finished.error;
    out["usage"] = json::object{{"prompt_tokens", finished.usage.prompt_tokens},
                                {"completion_tokens", finished.usage.completion_tokens},
                                {"cached_tokens", finished.usage.cached_tokens}};
    out["timings"] = json::object{{"queued_seconds", finished.timings.queued_seconds},
                                  {"time_to_first_token", finished.timings.time_to_first_token},
                                  {"total_seconds", finished.timings.total_seconds},
                                  {"preemptions", finished.timings.preemptions}};
  }
  std::string line = json::serialize(out);
  line += '\n';
  return line;
}

std::string encode_heartbeat() { return json::serialize(json::object{{"type", "heartbeat"}}) + '\n'; }

result<std::optional<backend::engine_event>> parse_event(std::string_view line) {
  simdjson::dom::parser parser;
  EDGE_ASSIGN_OR_RETURN(const element document, parse_document(parser, line, "an event"));
  const simdjson::dom::object o = document.get_object().value_unsafe();
  EDGE_ASSIGN_OR_RETURN(const std::string type, required_string(o, "type", "event"));
  if (type == "heartbeat") return std::optional<backend::engine_event>();
  if (type == "admitted") return std::optional<backend::engine_event>(backend::admitted_event{});
  if (type == "delta") {
    EDGE_ASSIGN_OR_RETURN(auto delta, delta_from(o));
    return std::optional<backend::engine_event>(std::move(delta));
  }
  if (type == "finished") {
    EDGE_ASSIGN_OR_RETURN(auto finished, finished_from(o));
    return std::optional<backend::engine_event>(std::move(finished));
  }
  return invalid_argument(format("unknown event type '{}'", type));
}

// ---- model identity ---------------------------------------------------------------------------

std::string encode_info(const backend_info& info) {
  return json::serialize(json::object{{"model", info.model},
                                      {"context_length", info.context_length},
                                      {"chat_template", backend::to_string(info.chat_template)},
                                      {"tokenizer_fingerprint", info.tokenizer_fingerprint},
                                      {"vocab_size", info.vocab_size},
                                      {"block_size", info.block_size},
                                      {"version", info.version}});
}

result<backend_info> parse_info(std::string_view body) {
  constexpr std::string_view what = "backend info";
  simdjson::dom::parser parser;
  EDGE_ASSIGN_OR_RETURN(const element document, parse_document(parser, body, what));
  const simdjson::dom::object o = document.get_object().value_unsafe();
  backend_info info;
  EDGE_ASSIGN_OR_RETURN(info.model, required_string(o, "model", what));
  EDGE_ASSIGN_OR_RETURN(info.context_length, required_integer(o, "context_length", what));
  EDGE_ASSIGN_OR_RETURN(const std::string chat, required_string(o, "chat_template", what));
  const auto kind = backend::parse_chat_template_name(chat);
  if (!kind) return invalid_argument(format("{}: unknown chat template '{}'", what, chat));
  info.chat_template = *kind;
  EDGE_ASSIGN_OR_RETURN(info.tokenizer_fingerprint, required_string(o, "tokenizer_fingerprint", what));
  EDGE_ASSIGN_OR_RETURN(info.vocab_size, required_integer(o, "vocab_size", what));
  EDGE_ASSIGN_OR_RETURN(info.block_size, required_integer(o, "block_size", what));
  EDGE_ASSIGN_OR_RETURN(info.version, required_string(o, "version", what));
  if (info.context_length < 1 || info.block_size < 1 || info.vocab_size < 1) {
    return invalid_argument(format("{}: context_length, vocab_size and block_size must be positive", what));
  }
  return info;
}

std::string info_mismatch(const backend_info& expected, const backend_info& other) {
  if (other.model != expected.model) return format("it serves model \"{}\", not \"{}\"", other.model, expected.model);
  if (other.tokenizer_fingerprint != expected.tokenizer_fingerprint) {
    return format("its tokenizer differs (fingerprint {}, expected {})", other.tokenizer_fingerprint,
                  expected.tokenizer_fingerprint);
  }
  if (other.chat_template != expected.chat_template) {
    return format("its chat template is {}, not {}", backend::to_string(other.chat_template),
                  backend::to_string(expected.chat_template));
  }
  if (other.context_length != expected.context_length) {
    return format("its context is {} tokens, not {}", other.context_length, expected.context_length);
  }
  if (other.vocab_size != expected.vocab_size) {
    return format("its vocabulary has {} tokens, not {}", other.vocab_size, expected.vocab_size);
  }
  if (other.block_size != expected.block_size) {
    return format("its KV block size is {}, not {} (prefix affinity hashes whole blocks)", other.block_size,
                  expected.block_size);
  }
  return {};
}

// ---- load ------------------------------------------------------------------------------------

backend_load_report load_report_from(const backend::engine_stats& stats, std::int64_t block_size) {
  backend_load_report load;
  load.waiting = stats.waiting;
  load.running = stats.running;
  load.in_flight = stats.in_flight;
  load.kv_blocks_total = stats.blocks_total;
  load.kv_blocks_free = stats.blocks_free;
  load.kv_usage = stats.blocks_total > 0
                      ? static_cast<double>(stats.blocks_total - stats.blocks_free) / static_cast<double>(stats.blocks_total)
                      : 0.0;
  load.block_size = block_size;
  load.cached_blocks = stats.cached_blocks;
  load.prefix_cache_queries = stats.prefix_cache_queries;
  load.prefix_cache_hits = stats.prefix_cache_hits;
  return load;
}

std::string encode_load(const backend_load_report& load) {
  const double hit_rate = load.prefix_cache_queries > 0 ? static_cast<double>(load.prefix_cache_hits) /
                                                              static_cast<double>(load.prefix_cache_queries)
                                                        : 0.0;
  return json::serialize(json::object{{"waiting", load.waiting},
                                      {"running", load.running},
                                      {"in_flight", load.in_flight},
                                      {"kv_blocks_total", load.kv_blocks_total},
                                      {"kv_blocks_free", load.kv_blocks_free},
                                      {"kv_usage_ratio", load.kv_usage},
                                      {"prefix_cache", json::object{{"block_size", load.block_size},
                                                                    {"cached_blocks", load.cached_blocks},
                                                                    {"queries", load.prefix_cache_queries},
                                                                    {"hits", load.prefix_cache_hits},
                                                                    {"hit_rate", hit_rate}}}});
}

result<backend_load_report> parse_load(std::string_view body) {
  constexpr std::string_view what = "backend load";
  simdjson::dom::parser parser;
  EDGE_ASSIGN_OR_RETURN(const element document, parse_document(parser, body, what));
  const simdjson::dom::object o = document.get_object().value_unsafe();
  backend_load_report load;
  EDGE_ASSIGN_OR_RETURN(load.waiting, required_integer(o, "waiting", what));
  EDGE_ASSIGN_OR_RETURN(load.running, required_integer(o, "running", what));
  EDGE_ASSIGN_OR_RETURN(load.in_flight, required_integer(o, "in_flight", what));
  EDGE_ASSIGN_OR_RETURN(load.kv_blocks_total, required_integer(o, "kv_blocks_total", what));
  EDGE_ASSIGN_OR_RETURN(load.kv_blocks_free, required_integer(o, "kv_blocks_free", what));
  EDGE_ASSIGN_OR_RETURN(load.kv_usage, required_number(o, "kv_usage_ratio", what));
  EDGE_ASSIGN_OR_RETURN(const auto prefix, required_object(o, "prefix_cache", what));
  EDGE_ASSIGN_OR_RETURN(load.block_size, required_integer(prefix, "block_size", what));
  EDGE_ASSIGN_OR_RETURN(load.cached_blocks, required_integer(prefix, "cached_blocks", what));
  EDGE_ASSIGN_OR_RETURN(load.prefix_cache_queries, required_integer(prefix, "queries", what));
  EDGE_ASSIGN_OR_RETURN(load.prefix_cache_hits, required_integer(prefix, "hits", what));
  return load;
}

}  // namespace edge::gateway
