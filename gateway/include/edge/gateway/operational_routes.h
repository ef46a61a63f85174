// Routes for operators and orchestrators: liveness, readiness and Prometheus metrics.
//
//   GET /healthz  200 {"status":"ok"} while the process serves at all (liveness)
//   GET /readyz   200 {"status":"ready"}; 503 {"status":"draining"} once shutdown began, or
//                 503 with what the readiness probe says (e.g. {"status":"loading"})
//   GET /metrics  every metric family in the Prometheus text format
#pragma once

#include <functional>
#include <string>

#include "edge/gateway/http.h"

namespace edge::monitoring {
class metrics_registry;
}

namespace edge::gateway {

// "ready", or a word saying why not ("loading", "failed"). Called on connection strands.
using readiness_probe = std::function<std::string()>;

// `metrics` must outlive the router. Without a probe the server is ready while it serves.
void add_operational_routes(router& routes, monitoring::metrics_registry& metrics, readiness_probe readiness = {});

}  // namespace edge::gateway
