// `edgeinfer backend` as objects a test can build: its options, and its server (the internal
// API over the engine in this process, which loads on a thread of its own while the server
// answers). The command runs one server until a signal; tests run one on port 0.
#pragma once

#include <functional>
#include <string>

#include "edge/backend/model_locator.h"
#include "edge/common/config.h"
#include "edge/common/log.h"
#include "edge/common/time_source.h"
#include "edge/gateway/openai/grammar_compiler.h"
#include "edge/gateway/http/http_server.h"
#include "edge/gateway/split/internal_routes.h"
#include "edge/monitoring/gateway_metrics.h"
#include "edge/monitoring/metrics_registry.h"
#include "serving_setup.h"

namespace edge::cli {

config::schema backend_options();

// /healthz, /readyz and /metrics, and the internal API (internal_routes.h) over the engine of
// `location` once it runs.
class backend_server {
 public:
  // `settings` and the metrics must outlive the server. The internal routes want
  // `internal_token` (not empty). `before_step` as start_engine's (tests only).
  backend_server(const config::values& settings, std::string internal_token, backend::model_location location,
                 monitoring::metrics_registry& metrics, monitoring::gateway_metrics& families,
                 std::function<void()> before_step = {});
  backend_server(const backend_server&) = delete;
  backend_server& operator=(const backend_server&) = delete;

  gateway::http_server& http() { return server_; }

  // Once the server listens: starts loading the model.
  void load(const logger& log);

  // Once http().run() has returned: stops the engine; the exit code (engine_loader::stop).
  int stop(const logger& log) { return engine_.stop(log); }

 private:
  const config::values& settings_;
  backend::model_location location_;
  monitoring::metrics_registry& metrics_;
  monitoring::gateway_metrics& families_;
  std::function<void()> before_step_;
  gateway::internal_backend_slot engines_;
  gateway::http_server server_;
  // Destroyed before the server: the engine stops (its last events are posted to the server's
  // io_context, which still exists) before the server's connections and handlers go away.
  engine_loader engine_;
  const real_time_source clock_;  // the grammar compile budget's
  // Declared after the server and destroyed before it: compiles still running resume their
  // requests on the server's io_context. Set by the loader thread before the model is published.
  std::unique_ptr<gateway::grammar_compiler> grammars_;
};

}  // namespace edge::cli
