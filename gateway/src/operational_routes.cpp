#include "edge/gateway/operational_routes.h"

#include <boost/json/object.hpp>

#include "edge/gateway/json_response.h"
#include "edge/monitoring/metrics_registry.h"

namespace edge::gateway {
namespace {

constexpr std::string_view ready_state = "ready";

response status_response(http::status code, std::string_view state) {
  boost::json::object body;
  body["status"] = state;
  return json_response(code, body);
}

}  // namespace

void add_operational_routes(router& routes, monitoring::metrics_registry& metrics, readiness_probe readiness) {
  routes.add(http::verb::get, "/healthz", [](exchange& ex) -> asio::awaitable<void> {
    co_await ex.respond(status_response(http::status::ok, "ok"));
  });

  routes.add(http::verb::get, "/readyz", [readiness = std::move(readiness)](exchange& ex) -> asio::awaitable<void> {
    if (ex.server_draining()) {
      co_await ex.respond(status_response(http::status::service_unavailable, "draining"));
      co_return;
    }
    const std::string state = readiness ? readiness() : std::string(ready_state);
    co_await ex.respond(status_response(state == ready_state ? http::status::ok : http::status::service_unavailable, state));
  });

  routes.add(http::verb::get, "/metrics", [&metrics](exchange& ex) -> asio::awaitable<void> {
    response res{http::status::ok, 11};
    res.set(http::field::content_type, monitoring::text_content_type);
    res.body() = metrics.scrape();
    co_await ex.respond(std::move(res));
  });
}

}  // namespace edge::gateway
