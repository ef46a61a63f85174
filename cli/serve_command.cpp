// `edgeinfer serve`: the HTTP server with the engine in this process, on the CPU executor or
// the CUDA executor (--device).
//
// The server listens at once (/healthz answers, /readyz says "loading") while another thread
// loads the model, sizes the KV cache from --kv-cache-memory, and starts the engine; then the
// model is published to the OpenAI routes and /readyz turns 200. A model that fails to
// load stops the server with exit code 1.
//
// Tenants, API keys, quotas and usage live in --state-dir (created if missing). On its first
// start the server creates the tenant "default" and logs an API key for it, once. Quota
// counters live in this process, or in Redis when several gateways share them (--quota-store).
#include <boost/asio/signal_set.hpp>

#include <atomic>
#include <csignal>
#include <thread>

#include "commands.h"
#include "edge/common/log.h"
#include "edge/common/time_source.h"
#include "edge/common/version.h"
#include "edge/gateway/admin_routes.h"
#include "edge/gateway/engine_client.h"
#include "edge/gateway/http_server.h"
#include "edge/gateway/openai_routes.h"
#include "edge/gateway/operational_routes.h"
#include "edge/gateway/request_gate.h"
#include "edge/gateway/serving_model.h"
#include "edge/gateway/tenancy.h"
#include "edge/gateway/tenancy_gate.h"
#include "edge/monitoring/gateway_metrics.h"
#include "edge/monitoring/metrics_registry.h"
#include "serving_setup.h"

namespace edge::cli {
namespace {

config::schema serve_options() {
  config::schema s;
  add_http_options(s, 8080);
  add_tenancy_options(s);
  add_model_options(s);
  add_engine_options(s);
  return s;
}

int run_serve(const config::values& settings) {
  const logger log{"serve"};
  log.info("edgeinfer {} (commit {}), CUDA {}", version_string(), git_commit(),
           cuda_compiled() ? "built" : "not built");
  log.debug("settings: {}", settings.describe());

  auto location = locate_served_model(settings);
  if (!location.ok()) {
    if (settings.optional_string("model")) {
      log.error("{}", location.error().message());
      return 1;
    }
    log.warn("{}; serving without a model (/readyz answers 503)", location.error().message());
  } else {
    log.info("model \"{}\" from {} (chosen by {})", location->served_name, location->path.string(),
             location->chosen_by);
  }

  monitoring::metrics_registry metrics;
  monitoring::gateway_metrics gateway_families(metrics.families());

  // Tenancy outlives the server: requests still holding quota leases when the server goes away
  // settle into it, and its destructor flushes the usage ledger last.
  const real_time_source clock;
  auto opened = open_tenancy(settings, clock, gateway_families, log, "serve");
  if (const int* exit_code = std::get_if<int>(&opened)) return *exit_code;
  tenancy_setup& tenancy = std::get<tenancy_setup>(opened);

  // What /readyz reports; written by the loader thread.
  std::atomic<readiness> state{location.ok() ? readiness::loading : readiness::no_model};
  gateway::model_slot models;

  gateway::router routes;
  gateway::add_operational_routes(routes, metrics,
                                  [&state]() -> std::string { return to_string(state.load(std::memory_order_acquire)); });
  // API keys and quotas from the tenant store guard every /v1/ route.
  gateway::tenancy_gate gate(*tenancy.tenants);
  gateway::add_openai_routes(routes, models, gate, &gateway_families,
                             {.sse_heartbeat = settings.duration("sse-heartbeat")});
  gateway::add_admin_routes(routes, *tenancy.tenants, {.admin_token = tenancy.admin_token});

  gateway::http_server server(http_server_options(settings), std::move(routes), &gateway_families);
  boost::asio::signal_set signals(server.context(), SIGINT, SIGTERM);
  drain_on_signals(signals, server, log);
  if (!listen_and_announce(server, log)) return 1;

  // Destroyed before the server: the engine stops (its last events are posted to the server's
  // io_context, which still exists) before the server's connections and handlers go away.
  std::unique_ptr<serving_runtime> runtime;
  std::unique_ptr<gateway::local_engine_client> local;
  std::thread loader;
  if (location.ok()) {
    loader = std::thread([&] {
      auto started = start_engine(settings, *location, metrics, log);
      if (!started.ok()) {
        log.error("cannot serve {}: {}", location->path.string(), started.error().message());
        state.store(readiness::failed, std::memory_order_release);
        server.shutdown();
        return;
      }
      runtime = std::move(started).value();
      local = std::make_unique<gateway::local_engine_client>(*runtime->engine);
      models.publish(std::make_shared<gateway::serving_model>(gateway::serving_model{
          .id = location->served_name,
          .created = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count(),
          .context_length = runtime->context,
          .chat_template = runtime->model->chat_template,
          .tokenizer = runtime->model->tok.get(),
          .engine = local.get()}));
      state.store(readiness::ready, std::memory_order_release);
      log.info("ready: serving \"{}\"", location->served_name);
    });
  }

  server.run();
  if (loader.joinable()) loader.join();
  return stop_engine(runtime, state.load(), log);
}

}  // namespace

command make_serve_command(CLI::App& app) {
  return command(app, "serve", "Serve the OpenAI-compatible API with the engine in this process", serve_options(),
                 run_serve);
}

}  // namespace edge::cli
