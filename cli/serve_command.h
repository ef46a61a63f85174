// `edgeinfer serve` as objects a test can build: its options, and its server (the routes over
// the engine in this process, which loads on a thread of its own while the server answers).
// The command runs one server until a signal; tests run one on port 0.
#pragma once

#include <functional>
#include <memory>
#include <optional>

#include "edge/backend/model_locator.h"
#include "edge/common/config.h"
#include "edge/common/log.h"
#include "edge/common/time_source.h"
#include "edge/gateway/openai/grammar_compiler.h"
#include "edge/gateway/openai/engine_client.h"
#include "edge/gateway/http/http_server.h"
#include "edge/gateway/openai/serving_model.h"
#include "edge/gateway/tenancy/tenancy.h"
#include "edge/monitoring/gateway_metrics.h"
#include "edge/monitoring/metrics_registry.h"
#include "serving_setup.h"

namespace edge::cli {

config::schema serve_options();

// /healthz, /readyz and /metrics, the OpenAI API (API keys and quotas from `tenancy`) and the
// admin API, with the engine of `location` behind the OpenAI routes once it runs. Without a
// location it serves without a model (/readyz answers 503 no_model).
class serve_server {
 public:
  // `settings`, `tenancy` and the metrics must outlive the server. `before_step` as
  // start_engine's (tests only).
  serve_server(const config::values& settings, std::optional<backend::model_location> location, tenancy_setup& tenancy,
               monitoring::metrics_registry& metrics, monitoring::gateway_metrics& families,
               std::function<void()> before_step = {});
  // Waits for the quota store calls still running: they resume their requests on the server's
  // io_context, which must outlive them.
  ~serve_server();
  serve_server(const serve_server&) = delete;
  serve_server& operator=(const serve_server&) = delete;

  gateway::http_server& http() { return server_; }

  // Once the server listens: starts loading the model (nothing without a location);
  // `on_ready` runs once it serves (engine_loader::start).
  void load(const logger& log, std::function<void()> on_ready = {});

  // Once http().run() has returned: stops the engine; the exit code (engine_loader::stop).
  int stop(const logger& log) { return engine_.stop(log); }

 private:
  const config::values& settings_;
  std::optional<backend::model_location> location_;
  gateway::tenancy& tenants_;
  monitoring::metrics_registry& metrics_;
  monitoring::gateway_metrics& families_;
  std::function<void()> before_step_;
  gateway::model_slot models_;
  std::unique_ptr<gateway::local_engine_client> client_;  // set by the loader thread before models_ names it
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
