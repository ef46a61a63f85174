#include "edge/gateway/http/operational_routes.h"

#include <boost/json/object.hpp>

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

void add_operational_routes(router& routes, monitoring::metrics_registry& metrics, health_probes probes) {
  routes.add(http::verb::get, "/healthz", [liveness = std::move(probes.liveness)](exchange& ex) -> asio::awaitable<void> {
    co_await ex.respond(probe_response(liveness, alive_state));
  });

  routes.add(http::verb::get, "/readyz", [readiness = std::move(probes.readiness)](exchange& ex) -> asio::awaitable<void> {
    if (ex.server_draining()) {
      co_await ex.respond(status_response(http::status::service_unavailable, "draining"));
      co_return;
    }
    co_await ex.respond(probe_response(readiness, ready_state));
  });

  routes.add(http::verb::get, "/metrics", [&metrics](exchange& ex) -> asio::awaitable<void> {
    response res{http::status::ok, 11};
    res.set(http::field::content_type, monitoring::text_content_type);
    res.body() = metrics.scrape();
    co_await ex.respond(std::move(res));
  });
}

}  // namespace edge::gateway
