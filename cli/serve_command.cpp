#include "commands.h"

#include <boost/asio/signal_set.hpp>

#include <csignal>
#include <cstdlib>

#include "edge/backend/model_locator.h"
#include "edge/common/log.h"
#include "edge/common/version.h"
#include "edge/gateway/http_server.h"
#include "edge/gateway/operational_routes.h"
#include "edge/monitoring/gateway_metrics.h"
#include "edge/monitoring/metrics_registry.h"

namespace edge::cli {
namespace {

using namespace std::chrono_literals;

config::schema serve_options() {
  config::schema s;
  s.add_string("host", "127.0.0.1", "Address to listen on");
  s.add_integer("port", 8080, 0, 65535, "Port to listen on; 0 picks a free port (the log line says which)");
  s.add_integer("threads", 0, 0, 1024, "HTTP server threads; 0 means one per hardware thread");
  s.add_bytes("max-body", "4MiB", 1024, std::int64_t{1} << 30, "Largest request body accepted (413 beyond)");
  s.add_duration("idle-timeout", "60s", 100ms, 24h, "Close a keep-alive connection idle this long");
  s.add_duration("write-timeout", "60s", 100ms, 24h, "Give up on a client that accepts no data for this long");
  s.add_duration("shutdown-timeout", "30s", 0ms, 24h,
                 "On SIGTERM, how long requests in flight may take before their connections are closed");
  s.add_path("model", std::nullopt, "Model file or folder to serve (default: models/default, then the test fixture)");
  s.add_string("served-model-name", std::nullopt, "Model id clients use (default: the file or folder name)");
  return s;
}

int run_serve(const config::values& settings) {
  const logger log{"serve"};
  log.info("edgeinfer {} (commit {}), CUDA {}", version_string(), git_commit(),
           cuda_compiled() ? "built" : "not built");
  log.debug("settings: {}", settings.describe());

  backend::locate_options where;
  if (auto model = settings.optional_string("model")) where.requested = *model;
  where.served_name = settings.optional_string("served-model-name");
  if (const char* test_models = std::getenv("EDGE_TEST_MODELS"); test_models && *test_models) {
    where.test_models = test_models;
  }
  auto model = backend::locate_model(where);
  if (!model.ok()) {
    if (where.requested) {
      log.error("{}", model.error().message());
      return 1;
    }
    log.warn("{}", model.error().message());
  } else {
    log.info("model \"{}\" from {} (chosen by {})", model->served_name, model->path.string(), model->chosen_by);
  }

  monitoring::metrics_registry metrics;
  monitoring::gateway_metrics gateway_families(metrics.families());

  gateway::router routes;
  gateway::add_operational_routes(routes, metrics);

  gateway::server_options options;
  options.host = settings.string("host");
  options.port = static_cast<std::uint16_t>(settings.integer("port"));
  options.threads = static_cast<std::size_t>(settings.integer("threads"));
  options.max_body_bytes = settings.bytes("max-body");
  options.idle_timeout = settings.duration("idle-timeout");
  options.write_timeout = settings.duration("write-timeout");
  options.shutdown_timeout = settings.duration("shutdown-timeout");

  gateway::http_server server(options, std::move(routes), &gateway_families);
  // The first SIGINT/SIGTERM drains; a second one closes what is left at once.
  boost::asio::signal_set signals(server.context(), SIGINT, SIGTERM);
  std::function<void(const boost::system::error_code&, int)> on_signal =
      [&](const boost::system::error_code& ec, int signal_number) {
        if (ec) return;
        log.info("received {}", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
        server.shutdown();
        signals.async_wait(on_signal);
      };
  signals.async_wait(on_signal);

  if (status listening = server.listen(); !listening.ok()) {
    log.error("{}", listening.message());
    return 1;
  }
  const auto endpoint = server.local_endpoint();
  const std::string address = endpoint.address().is_v6() ? "[" + endpoint.address().to_string() + "]"
                                                         : endpoint.address().to_string();
  log.info("listening on http://{}:{}", address, endpoint.port());

  server.run();
  return 0;
}

}  // namespace

command make_serve_command(CLI::App& app) {
  return command(app, "serve", "Serve the OpenAI-compatible API with the engine in this process", serve_options(),
                 run_serve);
}

}  // namespace edge::cli
