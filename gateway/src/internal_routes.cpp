#include "edge/gateway/internal_routes.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "edge/common/format.h"
#include "edge/common/sha256.h"
#include "edge/gateway/event_relay.h"
#include "edge/gateway/json_response.h"

namespace edge::gateway {
namespace {

using namespace boost::asio::experimental::awaitable_operators;
using clock = std::chrono::steady_clock;

response text_response(http::status code, std::string body, std::string_view content_type) {
  response res{code, 11};
  res.set(http::field::content_type, content_type);
  res.body() = std::move(body);
  return res;
}

response refusal(http::status code, std::string_view message, std::string_view type, std::string_view error_code) {
  return error_response(code, message, type, std::nullopt, error_code);
}

// What engine::submit() refusing a request means to the gateway (it maps these back: a 503
// other than overloaded is this backend's failure, and the request goes to another one).
response submit_refusal(const status& failure) {
  switch (failure.code()) {
    case status_code::out_of_range:
      return refusal(http::status::bad_request, failure.message(), "invalid_request_error", "context_length_exceeded");
    case status_code::resource_exhausted:
      return refusal(http::status::service_unavailable, failure.message(), "server_error", "overloaded");
    case status_code::failed_precondition:
      return refusal(http::status::service_unavailable, failure.message(), "server_error", "shutting_down");
    case status_code::unavailable:
      return refusal(http::status::service_unavailable, failure.message(), "server_error", "backend_unavailable");
    default: return refusal(http::status::bad_request, failure.message(), "invalid_request_error", "invalid_request");
  }
}

class internal_service {
 public:
  internal_service(const internal_backend_slot& backends, internal_route_options options)
      : backends_(backends), options_(std::move(options)) {}

  asio::awaitable<void> info(exchange& ex);
  asio::awaitable<void> load(exchange& ex);
  asio::awaitable<void> generate(exchange& ex);

 private:
  // The engine, or nothing when a refusal (401, 503) was answered.
  asio::awaitable<std::shared_ptr<const internal_backend>> admit(exchange& ex);

  const internal_backend_slot& backends_;
  internal_route_options options_;
};

asio::awaitable<std::shared_ptr<const internal_backend>> internal_service::admit(exchange& ex) {
  if (!options_.token.empty()) {
    const std::string_view header = ex.req()[http::field::authorization];
    constexpr std::string_view bearer = "Bearer ";
    const std::string_view presented = header.starts_with(bearer) ? header.substr(bearer.size()) : std::string_view{};
    // Digests compared, so neither the token's length nor its contents leak by timing.
    const sha256_digest expected = sha256(options_.token);
    const sha256_digest got = sha256(presented);
    if (!constant_time_equal(expected, got)) {
      co_await ex.respond(refusal(http::status::unauthorized, "The internal token is missing or wrong",
                                  "invalid_request_error", "invalid_internal_token"));
      co_return nullptr;
    }
  }
  auto backend = backends_.get();
  if (backend == nullptr) {
    response res = refusal(http::status::service_unavailable, "The model is still loading", "server_error",
                           "model_not_ready");
    res.set(http::field::retry_after, "1");
    co_await ex.respond(std::move(res));
  }
  co_return backend;
}

asio::awaitable<void> internal_service::info(exchange& ex) {
  const auto backend = co_await admit(ex);
  if (backend == nullptr) co_return;
  co_await ex.respond(text_response(http::status::ok, encode_info(backend->info), "application/json"));
}

asio::awaitable<void> internal_service::load(exchange& ex) {
  const auto backend = co_await admit(ex);
  if (backend == nullptr) co_return;
  const backend_load_report report = load_report_from(backend->engine->stats(), backend->info.block_size);
  co_await ex.respond(text_response(http::status::ok, encode_load(report), "application/json"));
}

// GCC 12 reports a mismatched operator delete inside the coroutine frames that Asio's awaitable
// operators create (a known false positive; openai_routes.cpp explains).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

asio::awaitable<void> internal_service::generate(exchange& ex) {
  const auto backend = co_await admit(ex);
  if (backend == nullptr) co_return;
  auto parsed = parse_generate_request(ex.req().body());
  if (auto* error = std::get_if<internal_request_error>(&parsed)) {
    co_await ex.respond(error_response(http::status::bad_request, error->message, "invalid_request_error",
                                       error->param.empty() ? std::nullopt : std::optional<std::string_view>(error->param),
                                       "invalid_request"));
    co_return;
  }
  backend::generate_request& request = std::get<backend::generate_request>(parsed);
  if (request.id.empty()) request.id = ex.request_id();
  ex.access().tenant = request.tenant;
  ex.access().prompt_tokens = static_cast<std::int64_t>(request.prompt.size());

  const asio::any_io_executor strand = co_await asio::this_coro::executor;
  auto events = std::make_shared<event_relay>(strand);
  auto submitted = backend->engine->submit(std::move(request), relay_sink(events, strand));
  if (!submitted.ok()) {
    co_await ex.respond(submit_refusal(submitted.error()));
    co_return;
  }
  // Destroying the handle (leaving this coroutine in any way, the gateway gone included)
  // cancels the request.
  const backend::request_handle handle = std::move(submitted).value();

  http::response_header<> head;
  head.result(http::status::ok);
  head.set(http::field::content_type, ndjson_content_type);
  head.set(http::field::cache_control, "no-cache");
  head.set("x-accel-buffering", "no");
  if (!co_await ex.begin_stream(std::move(head))) co_return;
  clock::time_point last_write = clock::now();
  std::int64_t completion_tokens = 0;

  for (;;) {
    // Everything queued goes out as one chunk.
    std::string lines;
    bool finished = false;
    while (!events->events.empty()) {
      const backend::engine_event event = std::move(events->events.front());
      events->events.pop_front();
      if (const auto* delta = std::get_if<backend::delta_event>(&event)) {
        completion_tokens += static_cast<std::int64_t>(delta->tokens.size());
      }
      if (const auto* done = std::get_if<backend::finished_event>(&event)) {
        ex.access().cached_tokens = done->usage.cached_tokens;
        finished = true;
      }
      lines += encode_event(event);
    }
    if (!lines.empty()) {
      ex.access().completion_tokens = completion_tokens;
      if (!co_await ex.write_chunk(lines)) co_return;
      last_write = clock::now();
    }
    if (finished) {
      co_await ex.end_stream();
      co_return;
    }

    // Sleep until an event arrives, the heartbeat is due, or the gateway leaves.
    events->wake.expires_at(last_write + options_.heartbeat);
    const auto woken = co_await (events->wake.async_wait(asio::as_tuple(asio::use_awaitable)) || ex.watch_disconnect());
    if (woken.index() == 1) co_return;  // the gateway is gone: the handle cancels the request
    if (events->events.empty() && clock::now() >= last_write + options_.heartbeat) {
      if (!co_await ex.write_chunk(encode_heartbeat())) co_return;
      last_write = clock::now();
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace

void internal_backend_slot::publish(std::shared_ptr<const internal_backend> backend) {
  std::lock_guard lock(mutex_);
  backend_ = std::move(backend);
}

std::shared_ptr<const internal_backend> internal_backend_slot::get() const {
  std::lock_guard lock(mutex_);
  return backend_;
}

void add_internal_routes(router& routes, const internal_backend_slot& backends, internal_route_options options) {
  auto service = std::make_shared<internal_service>(backends, std::move(options));
  routes.add(http::verb::post, std::string(internal_generate_path), [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->generate(ex);
  });
  routes.add(http::verb::get, std::string(internal_info_path), [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->info(ex);
  });
  routes.add(http::verb::get, std::string(internal_load_path), [service](exchange& ex) -> asio::awaitable<void> {
    co_await service->load(ex);
  });
}

}  // namespace edge::gateway
