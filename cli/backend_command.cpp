// `edgeinfer backend`: the engine alone, behind the internal streaming API that split gateways
// (`edgeinfer gateway --backend URL ...`) send token ids to. No tenants, API keys or quotas:
// the gateway has checked those; an optional --internal-token keeps anything else out.
//
// As serve does, it listens at once (/healthz answers, /readyz says "loading") while another
// thread loads the model and starts the engine; /metrics has the engine's metrics.
#include <boost/asio/signal_set.hpp>

#include <atomic>
#include <csignal>
#include <thread>

#include "commands.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/log.h"
#include "edge/common/version.h"
#include "edge/gateway/http_server.h"
#include "edge/gateway/internal_routes.h"
#include "edge/gateway/operational_routes.h"
#include "edge/monitoring/gateway_metrics.h"
#include "edge/monitoring/metrics_registry.h"
#include "serving_setup.h"

namespace edge::cli {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t default_backend_port = 8081;
// As the admin token: long enough that guessing it is hopeless.
constexpr std::size_t min_internal_token_length = 16;

config::schema backend_options() {
  config::schema s;
  add_http_options(s, default_backend_port);
  add_model_options(s);
  add_engine_options(s);
  s.add_string("internal-token", std::nullopt,
               "Bearer token gateways must send to /internal/v1/ (at least 16 characters); without it the internal "
               "API is open to whoever reaches the port");
  s.add_duration("heartbeat", "5s", 10ms, 1h,
                 "Send a heartbeat line on a generation stream that wrote nothing for this long (keep it well under "
                 "the gateway's --backend-stream-timeout)");
  return s;
}

int run_backend(const config::values& settings) {
  const logger log{"backend"};
  log.info("edgeinfer {} (commit {}), CUDA {}", version_string(), git_commit(),
           cuda_compiled() ? "built" : "not built");
  log.debug("settings: {}", settings.describe());

  const std::string token = settings.optional_string("internal-token").value_or("");
  if (!token.empty() && token.size() < min_internal_token_length) {
    log.error("--internal-token must be at least {} characters", min_internal_token_length);
    return 2;
  }
  auto location = locate_served_model(settings);
  if (!location.ok()) {
    log.error("{}", location.error().message());
    return 1;
  }
  log.info("model \"{}\" from {} (chosen by {})", location->served_name, location->path.string(), location->chosen_by);

  monitoring::metrics_registry metrics;
  monitoring::gateway_metrics http_families(metrics.families());
  std::atomic<readiness> state{readiness::loading};
  gateway::internal_backend_slot engines;

  gateway::router routes;
  gateway::add_operational_routes(routes, metrics,
                                  [&state]() -> std::string { return to_string(state.load(std::memory_order_acquire)); });
  gateway::add_internal_routes(routes, engines, {.token = token, .heartbeat = settings.duration("heartbeat")});

  gateway::http_server server(http_server_options(settings), std::move(routes), &http_families);
  boost::asio::signal_set signals(server.context(), SIGINT, SIGTERM);
  drain_on_signals(signals, server, log);
  if (!listen_and_announce(server, log)) return 1;
  log.info("internal API {}", token.empty() ? "open (no --internal-token)" : "guarded by --internal-token");

  // Destroyed before the server: the engine stops (its last events are posted to the server's
  // io_context, which still exists) before the server's connections and handlers go away.
  std::unique_ptr<serving_runtime> runtime;
  std::thread loader([&] {
    auto started = start_engine(settings, *location, metrics, log);
    if (!started.ok()) {
      log.error("cannot serve {}: {}", location->path.string(), started.error().message());
      state.store(readiness::failed, std::memory_order_release);
      server.shutdown();
      return;
    }
    runtime = std::move(started).value();
    const backend::tokenizer& tok = *runtime->model->tok;
    gateway::backend_info info{.model = location->served_name,
                               .context_length = runtime->context,
                               .chat_template = runtime->model->chat_template,
                               .tokenizer_fingerprint = backend::tokenizer_fingerprint(tok),
                               .vocab_size = tok.vocab_size(),
                               .block_size = runtime->block_size,
                               .version = std::string(version_string())};
    log.info("ready: serving \"{}\" to gateways (tokenizer fingerprint {})", info.model, info.tokenizer_fingerprint);
    engines.publish(std::make_shared<gateway::internal_backend>(
        gateway::internal_backend{.info = std::move(info), .engine = runtime->engine.get()}));
    state.store(readiness::ready, std::memory_order_release);
  });

  server.run();
  loader.join();
  return stop_engine(runtime, state.load(), log);
}

}  // namespace

command make_backend_command(CLI::App& app) {
  return command(app, "backend", "Run the engine alone behind the internal API that `edgeinfer gateway` routes to",
                 backend_options(), run_backend);
}

}  // namespace edge::cli
