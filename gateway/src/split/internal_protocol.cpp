#include "edge/gateway/split/internal_protocol.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>

#include <cmath>
#include <limits>

#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/gateway/http/http.h"
#include "edge/gateway/openai/openai_request.h"
#include "edge/gateway/tenancy/engine_limits.h"
#include "edge/gateway/tenancy/tenant.h"

namespace edge::gateway {
namespace {

namespace json = boost::json;

// The most top alternatives a delta may carry (the engine's own limit is lower).
constexpr std::size_t max_top_logprobs_on_wire = 64;

// JSON has no infinities: a token the model gave no probability at all is sent as the lowest
// finite float instead.
double finite_logprob(float logprob) {
  return std::isfinite(logprob) ? static_cast<double>(logprob) : static_cast<double>(std::numeric_limits<float>::lowest());
}

// ---- reading ---------------------------------------------------------------------------------

// What each reader answers: nothing, or the first problem, an error naming the field.
using field_error = std::optional<json_error>;

field_error read_token_ids(const json_value& v, std::vector<backend::token_id>& out) {
  EDGE_ASSIGN_OR_RETURN(const json_array items, v.as<json_array>("an array of token ids"));
  out.reserve(out.size() + items.size());
  for (const json_value item : items) {
    const auto id = item.as<std::int64_t>();
    if (!id.ok() || *id < 0 || *id > std::numeric_limits<backend::token_id>::max()) return item.must_be("a token id");
    out.push_back(static_cast<backend::token_id>(*id));
  }
  return std::nullopt;
}

json_error unknown_field(const json_value& value) {
  std::string param = value.path().str();
  std::string message = format("unknown field '{}'", param);
  return {std::move(message), std::move(param)};
}

field_error read_sampling(const json_value& v, backend::sampling_params& out) {
  EDGE_ASSIGN_OR_RETURN(const json_fields fields, v.as<json_fields>());
  for (const auto [key, value] : fields) {
    if (!is_sampling_field(key)) return unknown_field(value);
    if (auto error = read_sampling_field(key, value, out)) return error;
  }
  return std::nullopt;
}

// A cap on a lower KV tier: null (unlimited), or bytes within what the tenant admin accepts for
// its quota (a caller cannot claim more of a tier than any tenant may be given).
field_error read_tier_cap(const json_value& value, std::int64_t& out) {
  if (value.is_null()) {
    out = unlimited_tier_bytes;
    return std::nullopt;
  }
  const auto n = value.as<std::int64_t>();
  if (!n.ok() || *n < 0 || *n > max_quota_value) {
    return value.must_be(format("null (unlimited) or a whole number of bytes from 0 to {}", max_quota_value));
  }
  out = *n;
  return std::nullopt;
}

field_error read_fields(const json_fields& fields, backend::generate_request& r,
                        std::shared_ptr<const backend::grammar::grammar>& grammar) {
  bool has_prompt = false;
  bool has_max_tokens = false;
  for (const auto [key, value] : fields) {
    if (key == "id") {
      EDGE_ASSIGN_OR_RETURN(const std::string_view id, value.as<std::string_view>());
      // Empty: the backend names the request itself.
      if (!id.empty() && !is_valid_request_id(id)) return value.must_be(request_id_rule);
      r.id = std::string(id);
    } else if (key == "tenant") {
      EDGE_ASSIGN_OR_RETURN(const std::string_view tenant, value.as<std::string_view>());
      if (!is_valid_tenant_id(tenant)) return value.must_be(tenant_id_rule);
      r.tenant = std::string(tenant);
    } else if (key == "cache_salt") {
      // Gateways before the salt became the tenant's own sent it empty; a caller that names one
      // would read another tenant's prefix cache by timing.
      EDGE_ASSIGN_OR_RETURN(const std::string_view salt, value.as<std::string_view>());
      if (!salt.empty()) return value.error("is not accepted: the prefix cache is salted with the tenant's id");
    } else if (key == "weight") {
      // Bounded as the tenant admin bounds it: a weight beyond it would be served first for good.
      EDGE_ASSIGN_OR_RETURN(r.weight, value.as<double>());
      if (!is_valid_tenant_weight(r.weight)) return value.must_be(tenant_weight_rule());
    } else if (key == "priority") {
      const auto p = value.as<std::int64_t>();
      if (!p.ok() || *p != tenant_request_priority) {
        return value.must_be(format("{}: tenants have no priorities", tenant_request_priority));
      }
      r.priority = tenant_request_priority;
    } else if (key == "prompt") {
      r.prompt.clear();
      if (auto error = read_token_ids(value, r.prompt)) return error;
      has_prompt = true;
    } else if (key == "sampling") {
      if (auto error = read_sampling(value, r.sampling)) return error;
    } else if (key == "max_tokens") {
      EDGE_ASSIGN_OR_RETURN(r.max_tokens, read_max_tokens(value));
      has_max_tokens = true;
    } else if (key == "stop") {
      if (auto error = read_stop(value, r.stop)) return error;
    } else if (key == "stop_token_ids") {
      r.stop_token_ids.clear();
      if (auto error = read_token_ids(value, r.stop_token_ids)) return error;
    } else if (key == "ignore_eos") {
      EDGE_ASSIGN_OR_RETURN(r.ignore_eos, value.as<bool>());
    } else if (key == "skip_special_tokens") {
      EDGE_ASSIGN_OR_RETURN(r.skip_special_tokens, value.as<bool>());
    } else if (key == "session") {
      if (auto error = read_session_key(value, r.session)) return error;
    } else if (key == "host_tier_cap_bytes" || key == "disk_tier_cap_bytes") {
      std::int64_t& out = key == "host_tier_cap_bytes" ? r.host_tier_cap_bytes : r.disk_tier_cap_bytes;
      if (auto error = read_tier_cap(value, out)) return error;
    } else if (key == "logprobs" || key == "prompt_logprobs") {
      std::optional<std::int32_t>& out = key == "logprobs" ? r.logprobs : r.prompt_logprobs;
      if (value.is_null()) {
        out.reset();
        continue;
      }
      const auto n = value.as<std::int64_t>();
      if (!n.ok() || *n < 0 || *n > static_cast<std::int64_t>(max_top_logprobs_on_wire)) {
        return value.must_be(format("null or an integer from 0 to {}", max_top_logprobs_on_wire));
      }
      out = static_cast<std::int32_t>(*n);
    } else if (key == "n") {
      const auto n = value.as<std::int64_t>();
      if (!n.ok() || *n < 1 || *n > backend::max_choices) return value.must_be(format("from 1 to {}", backend::max_choices));
      r.n = static_cast<std::int32_t>(*n);
    } else if (key == "grammar") {
      EDGE_ASSIGN_OR_RETURN(const std::string_view text, value.as<std::string_view>());
      auto parsed = backend::grammar::parse_grammar(text);
      if (!parsed.ok()) return value.error(format("is not a grammar: {}", parsed.error().message()));
      grammar = std::make_shared<const backend::grammar::grammar>(std::move(parsed).value());
    } else {
      return unknown_field(value);
    }
  }
  if (!has_prompt) return fields.path().member("prompt").error("is required");
  if (!has_max_tokens) return fields.path().member("max_tokens").error("is required");
  return std::nullopt;
}

// `body` read as the JSON object `what` by `read`; every error names `what`.
template <class T>
result<T> read_object(std::string_view body, std::string_view what, result<T> (*read)(const json_fields&)) {
  simdjson::dom::parser parser;
  EDGE_ASSIGN_OR_RETURN(const auto object, parse_json_object(parser, body, what));
  auto value = read(json_fields(object));
  if (!value.ok()) return value.error().with_context(what);
  return value;
}

result<backend::token_logprob> token_logprob_from(const json_value& v) {
  EDGE_ASSIGN_OR_RETURN(const json_fields o, v.as<json_fields>());
  EDGE_ASSIGN_OR_RETURN(const std::int64_t id, o.required<std::int64_t>("id"));
  EDGE_ASSIGN_OR_RETURN(const double logprob, o.required<double>("logprob"));
  return backend::token_logprob{static_cast<backend::token_id>(id), static_cast<float>(logprob)};
}

std::optional<backend::finish_reason> parse_finish_reason(std::string_view text) {
  for (const auto reason : {backend::finish_reason::stop, backend::finish_reason::length, backend::finish_reason::abort,
                            backend::finish_reason::error, backend::finish_reason::content_filter}) {
    if (backend::to_string(reason) == text) return reason;
  }
  return std::nullopt;
}

// [{"id","logprob","top":[{"id","logprob"}]}]: what a delta's and the prompt's log
// probabilities are written as.
status read_sampled_logprobs(const json_array& items, std::vector<backend::sampled_logprobs>& out) {
  for (const json_value item : items) {
    backend::sampled_logprobs sampled;
    EDGE_ASSIGN_OR_RETURN(sampled.chosen, token_logprob_from(item));
    EDGE_ASSIGN_OR_RETURN(const json_fields entry, item.as<json_fields>());
    EDGE_ASSIGN_OR_RETURN(const auto top, entry.optional<json_array>("top"));
    if (top) {
      if (top->size() > max_top_logprobs_on_wire) return invalid_argument("too many top log probabilities");
      for (const json_value alternative : *top) {
        EDGE_ASSIGN_OR_RETURN(const backend::token_logprob other, token_logprob_from(alternative));
        sampled.top.push_back(other);
      }
    }
    out.push_back(std::move(sampled));
  }
  return {};
}

result<backend::engine_event> delta_from(const json_fields& o) {
  backend::delta_event delta;
  EDGE_ASSIGN_OR_RETURN(const std::int64_t index, o.value_or<std::int64_t>("index", 0));
  if (index < 0 || index >= backend::max_choices) return invalid_argument(format("choice index {} out of range", index));
  delta.index = static_cast<std::int32_t>(index);
  EDGE_ASSIGN_OR_RETURN(delta.text, o.required<std::string_view>("text"));
  EDGE_ASSIGN_OR_RETURN(const json_value tokens, o.required("tokens"));
  if (auto error = read_token_ids(tokens, delta.tokens)) return *error;
  EDGE_ASSIGN_OR_RETURN(const auto logprobs, o.optional<json_array>("logprobs"));
  if (logprobs) EDGE_RETURN_IF_ERROR(read_sampled_logprobs(*logprobs, delta.logprobs));
  EDGE_ASSIGN_OR_RETURN(const auto finish, o.optional<std::string_view>("finish"));
  if (finish) {
    const auto reason = parse_finish_reason(*finish);
    // A choice ends by itself; abort and error end the whole request (the finished event).
    if (!reason || *reason == backend::finish_reason::abort || *reason == backend::finish_reason::error) {
      return invalid_argument(format("a choice cannot finish with '{}'", *finish));
    }
    delta.finish = reason;
  }
  EDGE_ASSIGN_OR_RETURN(const auto stop_string, o.optional<std::string_view>("stop_string"));
  if (stop_string) {
    if (delta.finish != backend::finish_reason::stop) return invalid_argument("only a choice's stop names a stop string");
    delta.stop_string = *stop_string;
  }
  return backend::engine_event(std::move(delta));
}

result<backend::engine_event> prompt_logprobs_from(const json_fields& o) {
  backend::prompt_logprobs_event prompt;
  EDGE_ASSIGN_OR_RETURN(const json_array logprobs, o.required<json_array>("logprobs"));
  EDGE_RETURN_IF_ERROR(read_sampled_logprobs(logprobs, prompt.logprobs));
  return backend::engine_event(std::move(prompt));
}

result<backend::engine_event> finished_from(const json_fields& o) {
  backend::finished_event finished;
  EDGE_ASSIGN_OR_RETURN(const std::string_view reason, o.required<std::string_view>("reason"));
  const auto parsed = parse_finish_reason(reason);
  if (!parsed) return invalid_argument(format("unknown finish reason '{}'", reason));
  finished.reason = *parsed;
  EDGE_ASSIGN_OR_RETURN(finished.error, o.required<std::string_view>("error"));
  EDGE_ASSIGN_OR_RETURN(const json_fields usage, o.required<json_fields>("usage"));
  EDGE_ASSIGN_OR_RETURN(finished.usage.prompt_tokens, usage.required<std::int64_t>("prompt_tokens"));
  EDGE_ASSIGN_OR_RETURN(finished.usage.completion_tokens, usage.required<std::int64_t>("completion_tokens"));
  EDGE_ASSIGN_OR_RETURN(finished.usage.cached_tokens, usage.required<std::int64_t>("cached_tokens"));
  EDGE_ASSIGN_OR_RETURN(const json_fields timings, o.required<json_fields>("timings"));
  EDGE_ASSIGN_OR_RETURN(finished.timings.queued_seconds, timings.required<double>("queued_seconds"));
  EDGE_ASSIGN_OR_RETURN(finished.timings.time_to_first_token, timings.required<double>("time_to_first_token"));
  EDGE_ASSIGN_OR_RETURN(finished.timings.total_seconds, timings.required<double>("total_seconds"));
  EDGE_ASSIGN_OR_RETURN(finished.timings.preemptions, timings.required<std::int64_t>("preemptions"));
  return backend::engine_event(std::move(finished));
}

result<backend_info> info_from(const json_fields& o) {
  backend_info info;
  EDGE_ASSIGN_OR_RETURN(info.model, o.required<std::string_view>("model"));
  EDGE_ASSIGN_OR_RETURN(info.context_length, o.required<std::int64_t>("context_length"));
  EDGE_ASSIGN_OR_RETURN(const std::string_view chat, o.required<std::string_view>("chat_template"));
  if (chat == "jinja") {
    EDGE_ASSIGN_OR_RETURN(const json_fields jinja, o.required<json_fields>("chat_template_jinja"));
    backend::chat_template_spec& spec = info.chat_template;
    EDGE_ASSIGN_OR_RETURN(spec.jinja, jinja.required<std::string_view>("template"));
    EDGE_ASSIGN_OR_RETURN(spec.jinja_tool_use, jinja.value_or<std::string_view>("tool_use", ""));
    EDGE_ASSIGN_OR_RETURN(spec.bos_token, jinja.value_or<std::string_view>("bos_token", ""));
    EDGE_ASSIGN_OR_RETURN(spec.eos_token, jinja.value_or<std::string_view>("eos_token", ""));
    EDGE_ASSIGN_OR_RETURN(spec.origin, jinja.value_or<std::string_view>("origin", ""));
  } else {
    const auto kind = backend::parse_chat_template_name(chat);
    if (!kind) return invalid_argument(format("unknown chat template '{}'", chat));
    info.chat_template.builtin = *kind;
  }
  EDGE_ASSIGN_OR_RETURN(info.tokenizer_fingerprint, o.required<std::string_view>("tokenizer_fingerprint"));
  EDGE_ASSIGN_OR_RETURN(info.vocab_size, o.required<std::int64_t>("vocab_size"));
  EDGE_ASSIGN_OR_RETURN(info.block_size, o.required<std::int64_t>("block_size"));
  EDGE_ASSIGN_OR_RETURN(info.version, o.required<std::string_view>("version"));
  if (info.context_length < 1 || info.block_size < 1 || info.vocab_size < 1) {
    return invalid_argument("context_length, vocab_size and block_size must be positive");
  }
  return info;
}

result<backend_load_report> load_from(const json_fields& o) {
  backend_load_report load;
  EDGE_ASSIGN_OR_RETURN(load.waiting, o.required<std::int64_t>("waiting"));
  EDGE_ASSIGN_OR_RETURN(load.running, o.required<std::int64_t>("running"));
  EDGE_ASSIGN_OR_RETURN(load.in_flight, o.required<std::int64_t>("in_flight"));
  EDGE_ASSIGN_OR_RETURN(load.kv_blocks_total, o.required<std::int64_t>("kv_blocks_total"));
  EDGE_ASSIGN_OR_RETURN(load.kv_blocks_free, o.required<std::int64_t>("kv_blocks_free"));
  EDGE_ASSIGN_OR_RETURN(load.kv_usage, o.required<double>("kv_usage_ratio"));
  EDGE_ASSIGN_OR_RETURN(const json_fields prefix, o.required<json_fields>("prefix_cache"));
  EDGE_ASSIGN_OR_RETURN(load.block_size, prefix.required<std::int64_t>("block_size"));
  EDGE_ASSIGN_OR_RETURN(load.cached_blocks, prefix.required<std::int64_t>("cached_blocks"));
  EDGE_ASSIGN_OR_RETURN(load.prefix_cache_queries, prefix.required<std::int64_t>("queries"));
  EDGE_ASSIGN_OR_RETURN(load.prefix_cache_hits, prefix.required<std::int64_t>("hits"));
  return load;
}

json::object logprob_json(const backend::token_logprob& entry) {
  return json::object{{"id", entry.id}, {"logprob", finite_logprob(entry.logprob)}};
}

json::array sampled_logprobs_json(std::span<const backend::sampled_logprobs> entries) {
  json::array out;
  for (const backend::sampled_logprobs& sampled : entries) {
    json::object entry = logprob_json(sampled.chosen);
    json::array top;
    for (const backend::token_logprob& alternative : sampled.top) top.push_back(logprob_json(alternative));
    entry["top"] = std::move(top);
    out.push_back(std::move(entry));
  }
  return out;
}

json::object logit_bias_json(std::span<const kernels::logit_bias> bias) {
  json::object out;
  for (const kernels::logit_bias& b : bias) out[std::to_string(b.id)] = b.bias;
  return out;
}

}  // namespace

// ---- the generate request ---------------------------------------------------------------------

std::string encode_generate_request(const backend::generate_request& r, const backend::grammar::grammar* grammar) {
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
  if (!r.sampling.logit_bias.empty()) sampling["logit_bias"] = logit_bias_json(r.sampling.logit_bias);
  json::object body{{"id", r.id},
                    {"tenant", r.tenant},
                    {"weight", r.weight},
                    {"priority", r.priority},
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
  if (grammar != nullptr) body["grammar"] = grammar->text();
  body["n"] = r.n;
  if (r.prompt_logprobs) {
    body["prompt_logprobs"] = *r.prompt_logprobs;
  } else {
    body["prompt_logprobs"] = nullptr;
  }
  // Only when asked for: a backend that does not know the field then still serves the rest.
  if (!r.skip_special_tokens) body["skip_special_tokens"] = false;
  if (!r.session.empty()) body["session"] = r.session;
  // A tier cap travels only when the tenant has one (absent: unlimited), so a backend that does
  // not know the fields still serves the tenants without caps.
  if (r.host_tier_cap_bytes != unlimited_tier_bytes) body["host_tier_cap_bytes"] = r.host_tier_cap_bytes;
  if (r.disk_tier_cap_bytes != unlimited_tier_bytes) body["disk_tier_cap_bytes"] = r.disk_tier_cap_bytes;
  return json::serialize(body);
}

std::variant<parsed_generate_request, internal_request_error> parse_generate_request(std::string_view body) {
  simdjson::dom::parser parser;
  const auto document = parse_json_object(parser, body, "the body");
  if (!document.ok()) return internal_request_error{document.error().message(), ""};
  parsed_generate_request r;
  if (auto error = read_fields(json_fields(*document), r.request, r.grammar)) {
    return internal_request_error{error->message(), error->path()};
  }
  return r;
}

std::optional<internal_request_error> check_generate_request(const backend::generate_request& r,
                                                             const backend_info& model) {
  const auto refusal = [](request_error error, refusal_kind kind) {
    return internal_request_error{std::move(error.message), std::move(error.param), kind};
  };
  if (auto e = backend::find_token_outside_vocabulary(std::span(r.prompt), model.vocab_size, "prompt")) {
    return refusal(std::move(*e), refusal_kind::invalid_request);
  }
  if (auto e = backend::find_token_outside_vocabulary(std::span(r.stop_token_ids), model.vocab_size, "stop_token_ids")) {
    return refusal(std::move(*e), refusal_kind::invalid_request);
  }
  if (auto e = backend::find_logit_bias_error(r.sampling.logit_bias, model.vocab_size)) {
    e->param = "sampling.logit_bias";
    return refusal(std::move(*e), refusal_kind::invalid_request);
  }
  const auto prompt_length = static_cast<std::int64_t>(r.prompt.size());
  if (auto e = backend::prompt_does_not_fit(prompt_length, model.context_length, "prompt")) {
    return refusal(std::move(*e), refusal_kind::context_length);
  }
  if (auto e = backend::completion_does_not_fit(prompt_length, r.max_tokens, model.context_length, "prompt")) {
    return refusal(std::move(*e), refusal_kind::context_length);
  }
  return std::nullopt;
}

// ---- events -----------------------------------------------------------------------------------

std::string encode_event(const backend::engine_event& event) {
  json::object out;
  if (std::holds_alternative<backend::admitted_event>(event)) {
    out["type"] = "admitted";
  } else if (const auto* delta = std::get_if<backend::delta_event>(&event)) {
    out["type"] = "delta";
    out["index"] = delta->index;
    out["text"] = delta->text;
    out["tokens"] = json::array(delta->tokens.begin(), delta->tokens.end());
    if (!delta->logprobs.empty()) out["logprobs"] = sampled_logprobs_json(delta->logprobs);
    if (delta->finish) out["finish"] = backend::to_string(*delta->finish);
    if (!delta->stop_string.empty()) out["stop_string"] = delta->stop_string;
  } else if (const auto* prompt = std::get_if<backend::prompt_logprobs_event>(&event)) {
    out["type"] = "prompt_logprobs";
    out["logprobs"] = sampled_logprobs_json(prompt->logprobs);
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
  EDGE_ASSIGN_OR_RETURN(const auto document, parse_json_object(parser, line, "an event"));
  const json_fields o(document);
  EDGE_ASSIGN_OR_RETURN(const std::string_view type, o.required<std::string_view>("type"));
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
  if (type == "prompt_logprobs") {
    EDGE_ASSIGN_OR_RETURN(auto prompt, prompt_logprobs_from(o));
    return std::optional<backend::engine_event>(std::move(prompt));
  }
  return invalid_argument(format("unknown event type '{}'", type));
}

// ---- model identity ---------------------------------------------------------------------------

std::string encode_info(const backend_info& info) {
  const backend::chat_template_spec& chat = info.chat_template;
  json::object body{{"model", info.model},
                    {"context_length", info.context_length},
                    {"chat_template", chat.builtin ? backend::to_string(*chat.builtin) : std::string_view("jinja")},
                    {"tokenizer_fingerprint", info.tokenizer_fingerprint},
                    {"vocab_size", info.vocab_size},
                    {"block_size", info.block_size},
                    {"version", info.version}};
  if (!chat.builtin) {
    body["chat_template_jinja"] = json::object{{"template", chat.jinja},
                                               {"tool_use", chat.jinja_tool_use},
                                               {"bos_token", chat.bos_token},
                                               {"eos_token", chat.eos_token},
                                               {"origin", chat.origin}};
  }
  return json::serialize(body);
}

namespace {

// Whether two backends render prompts alike: the same template and special tokens (where each
// found its template may differ).
bool same_chat_template(const backend::chat_template_spec& a, const backend::chat_template_spec& b) {
  return a.builtin == b.builtin && a.jinja == b.jinja && a.jinja_tool_use == b.jinja_tool_use &&
         a.bos_token == b.bos_token && a.eos_token == b.eos_token;
}

std::string describe_chat_template(const backend::chat_template_spec& spec) {
  if (spec.builtin) return std::string(backend::to_string(*spec.builtin));
  return format("the Jinja template from {}", spec.origin);
}

}  // namespace

result<backend_info> parse_info(std::string_view body) { return read_object(body, "backend info", info_from); }

std::string info_mismatch(const backend_info& expected, const backend_info& other) {
  if (other.model != expected.model) return format("it serves model \"{}\", not \"{}\"", other.model, expected.model);
  if (other.tokenizer_fingerprint != expected.tokenizer_fingerprint) {
    return format("its tokenizer differs (fingerprint {}, expected {})", other.tokenizer_fingerprint,
                  expected.tokenizer_fingerprint);
  }
  if (!same_chat_template(other.chat_template, expected.chat_template)) {
    return format("its chat template ({}) differs from the first backend's ({})", describe_chat_template(other.chat_template),
                  describe_chat_template(expected.chat_template));
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

result<backend_load_report> parse_load(std::string_view body) { return read_object(body, "backend load", load_from); }

}  // namespace edge::gateway
