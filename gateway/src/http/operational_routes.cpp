#include "edge/gateway/http/operational_routes.h"

#include <boost/json/object.hpp>

#include <optional>

#include "edge/common/sha256.h"
#include "edge/common/version.h"
#include "edge/gateway/http/json_response.h"
#include "edge/monitoring/metrics_registry.h"

namespace edge::gateway {
namespace {

constexpr std::string_view ready_state = "ready";
constexpr std::string_view alive_state = "ok";

response status_response(http::status code, std::string_view state) {
  boost::json::object body;
  body["status"] = state;
  return json_response(code, body);
}

// 200 when the probe (or, without one, the fact of answering) says `good`, else 503 with its word.
response probe_response(const health_probe& probe, std::string_view good) {
  const std::string state = probe ? probe() : std::string(good);
  return status_response(state == good ? http::status::ok : http::status::service_unavailable, state);
}

}  // namespace

metrics_guard::metrics_guard(const metrics_access& access) : open_(access.open) {
  if (!access.token.empty()) token_digest_ = sha256(access.token);
}

std::optional<response> metrics_guard::refusal(const request& req) const {
  if (!token_digest_) {
    if (open_) return std::nullopt;
    return error_response(http::status::forbidden,
                          "/metrics is off: this server listens beyond loopback and has no metrics token; start it "
                          "with --metrics-token or --metrics-token-file (EDGE_METRICS_TOKEN) and give Prometheus the "
                          "same token",
                          "invalid_request_error", std::nullopt, "metrics_disabled");
  }
  const std::string_view header = req[http::field::authorization];
  const std::string_view token = bearer_token(header);
  // Digests, so that neither the contents nor the length of the token leak by timing.
  if (!token.empty() && constant_time_equal(sha256(token), *token_digest_)) return std::nullopt;
  response res = error_response(http::status::unauthorized,
                                header.empty() ? "/metrics needs the metrics token: \"Authorization: Bearer <token>\""
                                               : "Incorrect metrics token",
                                "invalid_request_error", std::nullopt, "invalid_metrics_token");
  res.set(http::field::www_authenticate, "Bearer");
  return res;
}

void add_operational_routes(router& routes, monitoring::metrics_registry& metrics, health_probes probes,
                            metrics_access access) {
  routes.add(http::verb::get, "/healthz", [liveness = std::move(probes.liveness)](exchange& ex) -> asio::awaitable<void> {
    co_await ex.respond(probe_response(liveness, alive_state));
  });

  // /readyz, and /health as other servers' users expect it: "ok" where /readyz says "ready".
  const auto readiness_route = [readiness = std::move(probes.readiness)](std::string_view good) {
    return [readiness, good](exchange& ex) -> asio::awaitable<void> {
      if (ex.server_draining()) {
        co_await ex.respond(status_response(http::status::service_unavailable, "draining"));
        co_return;
      }
      const std::string state = readiness ? readiness() : std::string(ready_state);
      response answer = state == ready_state ? status_response(http::status::ok, good)
                                             : status_response(http::status::service_unavailable, state);
      co_await ex.respond(std::move(answer));
    };
  };
  routes.add(http::verb::get, "/readyz", readiness_route(ready_state));
  routes.add(http::verb::get, "/health", readiness_route(alive_state));

  routes.add(http::verb::get, "/version", [](exchange& ex) -> asio::awaitable<void> {
    boost::json::object body;
    body["version"] = version_string();
    body["commit"] = git_commit();
    co_await ex.respond(json_response(http::status::ok, body));
  });

  // /metrics, and the engine's families alone (open to everyone when engine_open).
  const auto metrics_route = [&metrics, guard = metrics_guard(access)](bool engine, bool open) {
    return [&metrics, guard, engine, open](exchange& ex) -> asio::awaitable<void> {
      std::optional<response> refused = open ? std::nullopt : guard.refusal(ex.req());
      if (refused) {
        co_await ex.respond(std::move(*refused));
        co_return;
      }
      response res{http::status::ok, 11};
      res.set(http::field::content_type, monitoring::text_content_type);
      res.body() = engine ? metrics.scrape_engine() : metrics.scrape();
      co_await ex.respond(std::move(res));
    };
  };
  routes.add(http::verb::get, "/metrics", metrics_route(/*engine=*/false, /*open=*/false));
  routes.add(http::verb::get, "/metrics/engine", metrics_route(/*engine=*/true, access.engine_open));
}

}  // namespace edge::gateway
