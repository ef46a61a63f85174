// Routes for operators and orchestrators: liveness, readiness and Prometheus metrics.
//
//   GET /healthz  200 {"status":"ok"} while the process serves at all (liveness)
//   GET /readyz   200 {"status":"ready"}, or 503 {"status":"draining"} once shutdown began
//   GET /metrics  every metric family in the Prometheus text format
#pragma once

#include "edge/gateway/http.h"

namespace edge::monitoring {
class metrics_registry;
}

namespace edge::gateway {

// `metrics` must outlive the router.
void add_operational_routes(router& routes, monitoring::metrics_registry& metrics);

}  // namespace edge::gateway
