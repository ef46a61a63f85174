#include "edge/gateway/completions_route.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <simdjson.h>

#include <chrono>
#include <deque>
#include <limits>

#include "edge/common/format.h"
#include "edge/gateway/json_response.h"
#include "edge/gateway/tenancy.h"

namespace edge::gateway {

void model_slot::publish(std::shared_ptr<const serving_model> model) {
  std::lock_guard lock(mutex_);
  model_ = std::move(model);
}

std::shared_ptr<const serving_model> model_slot::get() const {
  std::lock_guard lock(mutex_);
  return model_;
}

namespace {

using namespace boost::asio::experimental::awaitable_operators;
namespace json = boost::json;

// OpenAI's limits on the completions API.
constexpr std::size_t max_stop_strings = 4;
constexpr double max_temperature = 2.0;
constexpr double max_penalty = 2.0;
// How long a client should wait before retrying when the engine is full or not ready.
constexpr std::string_view retry_after_seconds = "1";

// ---- parsing ----------------------------------------------------------------------------------

using parse_error = completion_request_error;

parse_error wrong_type(std::string_view param, std::string_view expected) {
  return {format("'{}' must be {}", param, expected), std::string(param)};
}

bool is_null(simdjson::ondemand::value& v) {
  simdjson::ondemand::json_type type;
  return v.type().get(type) == simdjson::SUCCESS && type == simdjson::ondemand::json_type::null;
}

std::optional<parse_error> read_number(simdjson::ondemand::value& v, std::string_view param, double low, double high,
                                       double& out) {
  if (v.get_double().get(out) != simdjson::SUCCESS) return wrong_type(param, "a number");
  if (!(out >= low && out <= high)) return parse_error{format("'{}' must be from {} to {}", param, low, high), std::string(param)};
  return std::nullopt;
}

std::optional<parse_error> read_string_list(simdjson::ondemand::value& v, std::string_view param, std::size_t most,
                                            std::vector<std::string>& out) {
  std::string_view single;
  if (v.get_string().get(single) == simdjson::SUCCESS) {
    out.emplace_back(single);
    return std::nullopt;
  }
  simdjson::ondemand::array items;
  if (v.get_array().get(items) != simdjson::SUCCESS) return wrong_type(param, "a string or an array of strings");
  for (auto item : items) {
    std::string_view text;
    if (item.get_string().get(text) != simdjson::SUCCESS) return wrong_type(param, "a string or an array of strings");
    out.emplace_back(text);
  }
  if (out.size() > most) return parse_error{format("'{}' holds at most {} strings", param, most), std::string(param)};
  return std::nullopt;
}

std::optional<parse_error> read_field(std::string_view key, simdjson::ondemand::value& v, completion_params& p) {
  if (is_null(v)) return std::nullopt;  // null means "not given", as in OpenAI's API
  if (key == "model") {
    std::string_view model;
    if (v.get_string().get(model) != simdjson::SUCCESS) return wrong_type(key, "a string");
    p.model = std::string(model);
  } else if (key == "prompt") {
    std::vector<std::string> prompts;
    if (auto e = read_string_list(v, key, std::numeric_limits<std::size_t>::max(), prompts)) {
      return parse_error{"'prompt' must be a string (arrays of token ids are not supported)", "prompt"};
    }
    if (prompts.size() != 1) return parse_error{"'prompt' must be one string: batched prompts are not supported", "prompt"};
    p.prompt = std::move(prompts.front());
  } else if (key == "max_tokens") {
    if (v.get_int64().get(p.max_tokens) != simdjson::SUCCESS) return wrong_type(key, "an integer");
    if (p.max_tokens < 1) return parse_error{"'max_tokens' must be at least 1", "max_tokens"};
  } else if (key == "temperature") {
    double t = 0;
    if (auto e = read_number(v, key, 0.0, max_temperature, t)) return e;
    p.sampling.temperature = static_cast<float>(t);
  } else if (key == "top_p") {
    double top_p = 0;
    if (auto e = read_number(v, key, 0.0, 1.0, top_p)) return e;
    if (top_p == 0.0) return parse_error{"'top_p' must be above 0", "top_p"};
    p.sampling.top_p = static_cast<float>(top_p);
  } else if (key == "top_k") {
    std::int64_t top_k = 0;
    if (v.get_int64().get(top_k) != simdjson::SUCCESS) return wrong_type(key, "an integer");
    // vLLM spells "off" both 0 and -1.
    if (top_k < -1 || top_k > std::numeric_limits<std::int32_t>::max()) {
      return parse_error{"'top_k' must be -1, 0 (off) or a positive integer", "top_k"};
    }
    p.sampling.top_k = static_cast<std::int32_t>(std::max<std::int64_t>(top_k, 0));
  } else if (key == "min_p") {
    double min_p = 0;
    if (auto e = read_number(v, key, 0.0, 1.0, min_p)) return e;
    p.sampling.min_p = static_cast<float>(min_p);
  } else if (key == "presence_penalty" || key == "frequency_penalty") {
    double penalty = 0;
    if (auto e = read_number(v, key, -max_penalty, max_penalty, penalty)) return e;
    (key == "presence_penalty" ? p.sampling.presence_penalty : p.sampling.frequency_penalty) = static_cast<float>(penalty);
  } else if (key == "repetition_penalty") {
    double penalty = 0;
    if (auto e = read_number(v, key, 0.0, std::numeric_limits<double>::max(), penalty)) return e;
    if (penalty == 0.0) return parse_error{"'repetition_penalty' must be above 0", "repetition_penalty"};
    p.sampling.repetition_penalty = static_cast<float>(penalty);
  } else if (key == "seed") {
    std::int64_t seed = 0;
    if (v.get_int64().get(seed) != simdjson::SUCCESS) return wrong_type(key, "an integer");
    p.sampling.seed = static_cast<std::uint64_t>(seed);
  } else if (key == "stop") {
    if (auto e = read_string_list(v, key, max_stop_strings, p.stop)) return e;
  } else if (key == "stream") {
    if (v.get_bool().get(p.stream) != simdjson::SUCCESS) return wrong_type(key, "true or false");
  } else if (key == "stream_options") {
    simdjson::ondemand::object options;
    if (v.get_object().get(options) != simdjson::SUCCESS) return wrong_type(key, "an object");
    for (auto option : options) {
      std::string_view name;
      if (option.unescaped_key().get(name) != simdjson::SUCCESS) return wrong_type(key, "an object");
      if (name != "include_usage") continue;
      simdjson::ondemand::value value;
      if (option.value().get(value) != simdjson::SUCCESS) return wrong_type("stream_options.include_usage", "true or false");
      if (is_null(value)) continue;
      if (value.get_bool().get(p.include_usage) != simdjson::SUCCESS) {
        return wrong_type("stream_options.include_usage", "true or false");
      }
    }
  } else if (key == "ignore_eos") {
    if (v.get_bool().get(p.ignore_eos) != simdjson::SUCCESS) return wrong_type(key, "true or false");
  } else if (key == "n" || key == "best_of") {
    std::int64_t n = 0;
    if (v.get_int64().get(n) != simdjson::SUCCESS) return wrong_type(key, "an integer");
    if (n != 1) return parse_error{format("only one completion per request is supported ('{}' must be 1)", key), std::string(key)};
  } else if (key == "echo") {
    bool echo = false;
    if (v.get_bool().get(echo) != simdjson::SUCCESS) return wrong_type(key, "true or false");
    if (echo) return parse_error{"'echo' is not supported", "echo"};
  } else if (key == "logprobs" || key == "suffix") {
    return parse_error{format("'{}' is not supported", key), std::string(key)};
  }
  return std::nullopt;
}

// ---- events from the engine thread to the connection's strand ---------------------------------

// The events of one request, handed from the engine thread to the connection's strand. Every
// member is touched on that strand only (the sink posts there).
struct event_relay {
  explicit event_relay(const asio::any_io_executor& executor)
      : wake(executor, std::chrono::steady_clock::time_point::max()) {}
  std::deque<backend::engine_event> events;
  asio::steady_timer wake;  // cancelled when an event arrives
};

backend::event_sink relay_sink(std::shared_ptr<event_relay> relay, asio::any_io_executor strand) {
  return [relay = std::move(relay), strand = std::move(strand)](backend::engine_event event) {
    asio::post(strand, [relay, event = std::move(event)]() mutable {
      relay->events.push_back(std::move(event));
      relay->wake.cancel();
    });
  };
}

// ---- response bodies --------------------------------------------------------------------------

std::int64_t unix_seconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
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

struct completion_header {
  std::string id;
  std::int64_t created = 0;
  std::string model;
};

json::object completion_object(const completion_header& h) {
  json::object out;
  out["id"] = h.id;
  out["object"] = "text_completion";
  out["created"] = h.created;
  out["model"] = h.model;
  return out;
}

json::object choice(std::string_view text, std::optional<backend::finish_reason> reason) {
  json::object c;
  c["index"] = 0;
  c["text"] = text;
  c["logprobs"] = nullptr;
  c["finish_reason"] = reason ? json::value(backend::to_string(*reason)) : json::value(nullptr);
  return c;
}

std::string sse(const json::value& body) { return "data: " + json::serialize(body) + "\n\n"; }

constexpr std::string_view sse_done = "data: [DONE]\n\n";

json::object error_body(std::string_view message, std::string_view type, std::string_view code) {
  json::object error;
  error["message"] = message;
  error["type"] = type;
  error["param"] = nullptr;
  error["code"] = code;
  json::object body;
  body["error"] = std::move(error);
  return body;
}

response overloaded(std::string_view message, std::string_view code) {
  response res = error_response(http::status::service_unavailable, message, "server_error", std::nullopt, code);
  res.set(http::field::retry_after, retry_after_seconds);
  return res;
}

response submit_failure(const status& failure) {
  switch (failure.code()) {
    case status_code::resource_exhausted: return overloaded(failure.message(), "overloaded");
    case status_code::failed_precondition: return overloaded(failure.message(), "shutting_down");
    case status_code::out_of_range:
      return error_response(http::status::bad_request, failure.message(), "invalid_request_error", "prompt",
                            "context_length_exceeded");
    default:
      return error_response(http::status::bad_request, failure.message(), "invalid_request_error");
  }
}

// ---- the handler ------------------------------------------------------------------------------

// GCC 12 reports a mismatched operator delete inside the coroutine frames that Asio's awaitable
// operators create: Asio allocates and frees those frames with its own matching pair, which
// the warning's inlining-based analysis does not see through (a known false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

asio::awaitable<void> complete(exchange& ex, const model_slot& models, tenancy* tenants) {
  std::optional<authenticated_tenant> who;
  if (tenants != nullptr) {
    auto authenticated = tenants->authenticate(ex.req());
    if (!authenticated.ok()) {
      co_await ex.respond(unauthorized_response(authenticated.error()));
      co_return;
    }
    who = std::move(authenticated).value();
  }
  const std::shared_ptr<const serving_model> model = models.get();
  if (model == nullptr) {
    co_await ex.respond(overloaded("The model is still loading", "model_not_ready"));
    co_return;
  }
  auto parsed = parse_completion_request(ex.req().body());
  if (auto* error = std::get_if<completion_request_error>(&parsed)) {
    // A body that is not JSON names no field: param is null then, as in OpenAI's errors.
    const auto param = error->param.empty() ? std::nullopt : std::optional<std::string_view>(error->param);
    co_await ex.respond(error_response(http::status::bad_request, error->message, "invalid_request_error", param));
    co_return;
  }
  completion_params& params = std::get<completion_params>(parsed);
  if (params.model && *params.model != model->id) {
    co_await ex.respond(error_response(http::status::not_found,
                                       format("The model '{}' does not exist; this server serves '{}'", *params.model,
                                              model->id),
                                       "invalid_request_error", "model", "model_not_found"));
    co_return;
  }

  backend::generate_request request;
  request.id = ex.request_id();
  request.prompt = model->tokenizer->encode(params.prompt, {.add_bos = true, .parse_special = false});
  // Quotas hold the request's worst case, prompt + max_tokens, until it ends (the lease).
  std::optional<admission> admitted;
  if (who) {
    admitted.emplace(tenants->admit(*who, static_cast<std::int64_t>(request.prompt.size()), params.max_tokens));
    if (!admitted->allowed()) {
      co_await ex.respond(quota_refusal_response(admitted->decision));
      co_return;
    }
    request.tenant = who->tenant->id;
    request.weight = who->tenant->weight;
  } else if (const auto tenant = ex.req()[tenant_header]; !tenant.empty()) {
    request.tenant = std::string(tenant);
  }
  const auto prompt_tokens = static_cast<std::int64_t>(request.prompt.size());
  request.sampling = params.sampling;
  request.max_tokens = params.max_tokens;
  request.stop = params.stop;
  request.ignore_eos = params.ignore_eos;

  const asio::any_io_executor strand = co_await asio::this_coro::executor;
  auto relay = std::make_shared<event_relay>(strand);
  auto submitted = model->engine->submit(std::move(request), relay_sink(relay, strand));
  if (!submitted.ok()) {
    co_await ex.respond(submit_failure(submitted.error()));
    co_return;
  }
  // Destroying the handle (leaving this coroutine in any way) cancels the request.
  backend::request_handle handle = std::move(submitted).value();
  // Charged from here on: the prompt, and each token as it is produced (a client that leaves
  // pays for what was generated until then).
  std::int64_t completion_tokens = 0;
  if (admitted) admitted->lease->record({.prompt_tokens = prompt_tokens});

  const completion_header header{"cmpl-" + ex.request_id(), unix_seconds(), model->id};
  if (params.stream) {
    http::response_header<> head;
    head.result(http::status::ok);
    head.set(http::field::content_type, "text/event-stream");
    head.set(http::field::cache_control, "no-cache");
    if (admitted) set_rate_limit_headers(head, admitted->decision);
    if (!co_await ex.begin_stream(std::move(head))) co_return;
  }

  std::string text;  // non-streaming: the whole completion
  bool watching = true;
  for (;;) {
    while (!relay->events.empty()) {
      backend::engine_event event = std::move(relay->events.front());
      relay->events.pop_front();
      if (auto* delta = std::get_if<backend::delta_event>(&event)) {
        completion_tokens += static_cast<std::int64_t>(delta->tokens.size());
        if (admitted) admitted->lease->record({.prompt_tokens = prompt_tokens, .completion_tokens = completion_tokens});
        if (delta->text.empty()) continue;
        if (!params.stream) {
          text += delta->text;
          continue;
        }
        json::object chunk = completion_object(header);
        chunk["choices"] = json::array{choice(delta->text, std::nullopt)};
        if (!co_await ex.write_chunk(sse(chunk))) co_return;
        continue;
      }
      const auto* finished = std::get_if<backend::finished_event>(&event);
      if (finished == nullptr) continue;  // admitted
      if (admitted) {
        admitted->lease->record({.prompt_tokens = finished->usage.prompt_tokens,
                                 .completion_tokens = finished->usage.completion_tokens,
                                 .cached_tokens = finished->usage.cached_tokens});
      }
      const bool failed = finished->reason == backend::finish_reason::error ||
                          finished->reason == backend::finish_reason::abort;
      if (!params.stream) {
        if (failed) {
          co_await ex.respond(finished->reason == backend::finish_reason::abort
                                  ? overloaded("The request was aborted: the server is shutting down", "shutting_down")
                                  : error_response(http::status::internal_server_error,
                                                   format("The engine failed: {}", finished->error), "server_error"));
          co_return;
        }
        json::object body = completion_object(header);
        body["choices"] = json::array{choice(text, finished->reason)};
        body["usage"] = usage_json(finished->usage);
        response res = json_response(http::status::ok, body);
        if (admitted) set_rate_limit_headers(res, admitted->decision);
        co_await ex.respond(std::move(res));
        co_return;
      }
      if (failed) {
        const bool aborted = finished->reason == backend::finish_reason::abort;
        if (!co_await ex.write_chunk(sse(error_body(
                aborted ? "The request was aborted: the server is shutting down" : "The engine failed: " + finished->error,
                "server_error", aborted ? "shutting_down" : "engine_error")))) {
          co_return;
        }
      } else {
        json::object last = completion_object(header);
        last["choices"] = json::array{choice("", finished->reason)};
        if (!co_await ex.write_chunk(sse(last))) co_return;
        if (params.include_usage) {
          json::object usage = completion_object(header);
          usage["choices"] = json::array{};
          usage["usage"] = usage_json(finished->usage);
          if (!co_await ex.write_chunk(sse(usage))) co_return;
        }
      }
      if (co_await ex.write_chunk(sse_done)) co_await ex.end_stream();
      co_return;
    }

    relay->wake.expires_at(std::chrono::steady_clock::time_point::max());
    if (watching) {
      auto woken = co_await (relay->wake.async_wait(asio::as_tuple(asio::use_awaitable)) || ex.watch_disconnect());
      if (woken.index() == 1) {
        if (std::get<1>(woken)) co_return;  // the client is gone: the handle cancels the request
        watching = false;
      }
    } else {
      co_await relay->wake.async_wait(asio::as_tuple(asio::use_awaitable));
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace

std::variant<completion_params, completion_request_error> parse_completion_request(std::string_view body) {
  simdjson::ondemand::parser parser;
  const simdjson::padded_string padded(body);
  simdjson::ondemand::document document;
  const auto invalid_json = [] { return completion_request_error{"The body is not valid JSON", ""}; };
  if (parser.iterate(padded).get(document) != simdjson::SUCCESS) return invalid_json();
  simdjson::ondemand::object object;
  if (document.get_object().get(object) != simdjson::SUCCESS) {
    return completion_request_error{"The body must be a JSON object", ""};
  }
  completion_params params;
  for (auto field : object) {
    std::string_view key;
    simdjson::ondemand::value value;
    if (field.unescaped_key().get(key) != simdjson::SUCCESS || field.value().get(value) != simdjson::SUCCESS) {
      return invalid_json();
    }
    // A copy: the key's storage is reused by the parser as it moves on.
    const std::string name(key);
    if (auto error = read_field(name, value, params)) return *error;
  }
  if (params.prompt.empty()) return completion_request_error{"'prompt' is required and must not be empty", "prompt"};
  return params;
}

void add_completions_route(router& routes, const model_slot& models, tenancy* tenants) {
  routes.add(http::verb::post, "/v1/completions", [&models, tenants](exchange& ex) -> asio::awaitable<void> {
    co_await complete(ex, models, tenants);
  });
}

}  // namespace edge::gateway
