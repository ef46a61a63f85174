// Routes for operators and orchestrators: liveness, readiness and Prometheus metrics.
//
//   GET /healthz  200 {"status":"ok"} while the process is worth keeping (liveness); 503 with
//                 what the liveness probe says (e.g. {"status":"engine_failed"}) once only a
//                 restart can help
//   GET /readyz   200 {"status":"ready"}; 503 {"status":"draining"} once shutdown began, or
//                 503 with what the readiness probe says (e.g. {"status":"loading"})
//   GET /health   vLLM's and llama.cpp's spelling of readiness: 200 {"status":"ok"} when /readyz
//                 would answer 200, else /readyz's 503 (their users' probes and scripts)
//   GET /version  {"version":"0.1.0","commit":"abc1234"} (vLLM's /version, with the build's commit)
//   GET /metrics  every metric family in the Prometheus text format, to whom metrics_access
//                 allows (it names every tenant with its traffic): 401 without the metrics
//                 token where one is set; 403 metrics_disabled where none is and the server
//                 does not listen on loopback only
//   GET /metrics/engine  the engine's families only (queue, running requests, KV cache use and
//                 size, tokens, latencies: no tenant, no key): what a Kubernetes endpoint picker
//                 reads (the model server protocol). Guarded as /metrics, or open to all with
//                 metrics_access::engine_open (the picker sends no token)
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "edge/common/sha256.h"
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

// Who may read /metrics.
struct metrics_access {
  std::string token;  // the bearer token scrapers must send; empty: none is asked for
  bool open = true;   // without a token: whether /metrics answers (a server on a loopback address)
  bool engine_open = false;  // /metrics/engine answers everyone (--engine-metrics-open)
};

// A metrics token is at least this long (as the admin token): guessing it must be hopeless.
inline constexpr std::size_t min_metrics_token_length = 16;

// Decides, per request, whether /metrics answers. Immutable; any thread.
class metrics_guard {
 public:
  explicit metrics_guard(const metrics_access& access);
  // Null when the caller may read; else the answer to send: 401 invalid_metrics_token (with
  // WWW-Authenticate: Bearer) or 403 metrics_disabled.
  std::optional<response> refusal(const request& req) const;

 private:
  bool open_;
  std::optional<sha256_digest> token_digest_;  // of the token; none when no token is asked for
};

// `metrics` must outlive the router.
void add_operational_routes(router& routes, monitoring::metrics_registry& metrics, health_probes probes = {},
                            metrics_access access = {});

}  // namespace edge::gateway
