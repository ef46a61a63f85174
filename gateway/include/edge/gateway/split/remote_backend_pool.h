// The engines of `edgeinfer backend` processes, over HTTP (internal_protocol.h): the
// engine_client of a split gateway (`edgeinfer gateway --backend URL ...`).
//
// Per backend, a poller (a coroutine on the gateway's io_context, every poll_interval) asks
// /internal/v1/info until the backend is known to serve the gateway's model (same tokenizer
// fingerprint; then the same model id, chat template, context and block size as the first
// backend that matched), then /readyz (health) and /internal/v1/load (the router's load
// report). A backend that stops answering is marked down at once and verified again when it
// comes back (a restarted pod may serve something else).
//
// submit(): the router (backend_router.h) picks a backend; the request is POSTed and the
// response header read under request_timeout. A refused or failed connection, a 5xx, or a
// stream that breaks before its first event is a failure of that backend (consecutive failures
// eject it) and the request is tried on the next one, at most max_attempts backends in all;
// the client notices nothing. A 400 is the request's fault and is returned as is. Once a
// stream has delivered tokens, a broken stream (connection lost, or nothing at all for
// stream_idle_timeout: backends send heartbeats) ends the request with a finished event of
// reason error that names the backend: never a hang; its usage is what was relayed. Destroying
// the handle closes the connection, which cancels the request in the backend's engine.
//
// A backend's usage figures are its word only: the finished event's usage is held to what the
// gateway knows (usage_ledger.h's bounded_usage, the rule every request is charged by: the
// prompt it sent, completion tokens between those relayed and max_tokens, cached tokens within
// the prompt) before it goes on; each correction is counted
// (edgeinfer_backend_usage_corrections_total) and logged, at most every 10 s per backend. A
// stream that brings more tokens than max_tokens has failed.
//
// Each request has its own connection (closing it is the cancellation); pollers keep one
// keep-alive connection each.
#pragma once

#include <boost/asio/any_io_executor.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "edge/common/status.h"
#include "edge/common/time_source.h"
#include "edge/gateway/split/backend_router.h"
#include "edge/gateway/openai/engine_client.h"
#include "edge/gateway/split/internal_protocol.h"

namespace edge::monitoring {
struct gateway_metrics;
}

namespace edge::gateway {

struct backend_endpoint {
  std::string url;  // as given, without a trailing slash: the metrics label and the log name
  std::string host;
  std::string port;
};

// "http://HOST:PORT" (a trailing slash is fine). https and paths are refused: backends are
// reached on the cluster network directly.
result<backend_endpoint> parse_backend_url(std::string_view url);

struct remote_backend_options {
  std::vector<backend_endpoint> backends;
  std::string internal_token;  // sent as a Bearer token when not empty
  std::chrono::milliseconds poll_interval{std::chrono::milliseconds(200)};
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(2)};
  // A poll's whole exchange, and a generate request's response header.
  std::chrono::milliseconds request_timeout{std::chrono::seconds(10)};
  // A started stream that sends nothing (not even a heartbeat) this long has failed.
  std::chrono::milliseconds stream_idle_timeout{std::chrono::seconds(30)};
  int max_attempts = 3;  // backends tried per request at most
  router_options routing;
};

class remote_backend_pool final : public engine_client {
 public:
  // `tokenizer_fingerprint` is the gateway's own tokenizer's: a backend with another is never
  // used. `clock` and `metrics` (may be null) must outlive the pool.
  remote_backend_pool(remote_backend_options options, std::string tokenizer_fingerprint, const time_source& clock,
                      monitoring::gateway_metrics* metrics);
  ~remote_backend_pool() override;
  remote_backend_pool(const remote_backend_pool&) = delete;
  remote_backend_pool& operator=(const remote_backend_pool&) = delete;

  // Starts the pollers on `executor`. `on_model` is called once, from a poller, with the info
  // of the first backend that serves the gateway's model. The pool must outlive the executor's
  // io_context (its coroutines refer to it until they are destroyed).
  void start(boost::asio::any_io_executor executor, std::function<void(const backend_info&)> on_model);

  boost::asio::awaitable<result<backend::request_handle, backend::submit_error>> submit(backend::generate_request request,
                                                                 backend::event_sink sink,
                                                                 std::shared_ptr<const backend::grammar::grammar> grammar) override;

  // "ready" while some backend is available, else why not ("connecting": no backend has
  // confirmed the model yet; "no_backend": none is available now). Thread-safe.
  std::string readiness() const;

  struct impl;

 private:
  std::shared_ptr<impl> impl_;
};

}  // namespace edge::gateway
