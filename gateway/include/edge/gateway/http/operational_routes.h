// Routes for operators and orchestrators: liveness, readiness and Prometheus metrics.
//
//   GET /healthz  200 {"status":"ok"} while the process is worth keeping (liveness); 503 with
//                 what the liveness probe says (e.g. {"status":"engine_failed"}) once only a
//                 restart can help
//   GET /readyz   200 {"status":"ready"}; 503 {"status":"draining"} once shutdown began, or
//                 503 with what the readiness probe says (e.g. {"status":"loading"})
//   GET /metrics  every metric family in the Prometheus text format
#pragma once

#include <functional>
#include <string>

#include "edge/gateway/http/http.h"

namespace edge::monitoring {
class metrics_registry;
}

namespace edge::gateway {

// "ready" (readiness) or "ok" (liveness), or a word saying why not ("loading",
// "engine_stalled", "engine_failed"). Called on connection strands.
using health_probe = std::function<std::string()>;

struct health_probes {
  health_probe readiness;  // empty: ready while the server serves
  health_probe liveness;   // empty: alive while the server serves
};

// `metrics` must outlive the router.
void add_operational_routes(router& routes, monitoring::metrics_registry& metrics, health_probes probes = {});

}  // namespace edge::gateway
