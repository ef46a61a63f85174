// `edgeinfer serve`: the HTTP server with the engine in this process, on the CPU executor or
// the CUDA executor (--device).
//
// The server listens at once (/healthz answers, /readyz says "loading") while another thread
// loads the model, sizes the KV cache from --kv-cache-memory, and starts the engine; then the
// model is published to the OpenAI routes and /readyz turns 200. A model that fails to
// load stops the server with exit code 1. An engine that fails later (a bug ended its loop)
// turns /readyz and /healthz to 503 engine_failed; one whose step hangs turns /readyz to 503
// engine_stalled (--engine-stall-timeout).
//
// Tenants, API keys, quotas and usage live in --state-dir (created if missing). On its first
// start the server creates the tenant "default" and logs an API key for it, once. Quota
// counters live in this process, or in Redis when several gateways share them (--quota-store).
#include "serve_command.h"

#include <boost/asio/signal_set.hpp>

#include <csignal>

#include "commands.h"
#include "edge/common/format.h"
#include "edge/common/time_source.h"
#include "edge/common/version.h"
#include "edge/gateway/tenancy/admin_routes.h"
#include "edge/gateway/openai/openai_routes.h"
#include "edge/gateway/http/operational_routes.h"

namespace edge::cli {
namespace {

gateway::router serve_routes(const config::values& settings, tenancy_setup& tenancy,
                             monitoring::metrics_registry& metrics, monitoring::gateway_metrics& families,
                             const engine_loader& engine, const gateway::model_slot& models) {
  gateway::router routes;
  gateway::add_operational_routes(routes, metrics, engine_probes(engine), checked_metrics_access(settings));
  // API keys and quotas from the tenant store guard every /v1/ route.
  gateway::add_openai_routes(routes, models, *tenancy.tenants, &families, openai_route_settings(settings));
  gateway::add_admin_routes(routes, *tenancy.tenants, {.admin_token = tenancy.admin_token});
  return routes;
}

int run_serve(const config::values& settings) {
  const logger log{"serve"};
  log.info("edgeinfer {} (commit {}), CUDA {}", version_string(), git_commit(),
           cuda_compiled() ? "built" : "not built");
  log.debug("settings: {}", settings.describe());
  for (const auto& conflict : {http_options_conflict(settings), engine_options_conflict(settings)}) {
    if (!conflict) continue;
    log.error("{}", *conflict);
    return 2;
  }
  if (const auto exit_code = announce_metrics_access(settings, log)) return *exit_code;

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
  auto opened = open_tenancy(settings, clock, gateway_families, log);
  if (const int* exit_code = std::get_if<int>(&opened)) return *exit_code;
  tenancy_setup& tenancy = std::get<tenancy_setup>(opened);

  serve_server serve(settings, location.ok() ? std::optional(*location) : std::nullopt, tenancy, metrics,
                     gateway_families);
  boost::asio::signal_set signals(serve.http().context(), SIGINT, SIGTERM);
  drain_on_signals(signals, serve.http(), log);
  if (!listen_and_announce(serve.http(), log)) return 1;
  // The first key once the server serves: its model running, or listening without one.
  const auto first_key = [&tenancy, &log] { create_first_key(tenancy, log, "serve"); };
  if (location.ok()) {
    serve.load(log, first_key);
  } else {
    first_key();
  }
  serve.http().run();
  return serve.stop(log);
}

}  // namespace

config::schema serve_options() {
  config::schema s;
  add_http_options(s, 8080);
  add_tenancy_options(s);
  add_model_options(s);
  add_engine_options(s);
  add_output_parser_options(s);
  add_client_text_options(s);
  add_grammar_options(s);
  return s;
}

serve_server::serve_server(const config::values& settings, std::optional<backend::model_location> location,
                           tenancy_setup& tenancy, monitoring::metrics_registry& metrics,
                           monitoring::gateway_metrics& families, std::function<void()> before_step)
    : settings_(settings),
      location_(std::move(location)),
      tenants_(*tenancy.tenants),
      metrics_(metrics),
      families_(families),
      before_step_(std::move(before_step)),
      server_(http_server_options(settings), serve_routes(settings, tenancy, metrics, families, engine_, models_),
              &families),
      engine_(location_.has_value()) {}

serve_server::~serve_server() { tenants_.drain_quota_calls(); }

void serve_server::load(const logger& log, std::function<void()> on_ready) {
  if (!location_) return;
  engine_.start(
      settings_, *location_, metrics_, log, server_,
      [this, &log](serving_runtime& rt) {
        client_ = std::make_unique<gateway::local_engine_client>(*rt.engine);
        grammars_ = std::make_unique<gateway::grammar_compiler>(*rt.model->tok, grammar_compiler_settings(settings_),
                                                                &families_, clock_);
        const gateway::output_syntax output = choose_output_syntax(settings_, *rt.model->tok, log);
        client_text_rule client_text =
            choose_client_text_rule(settings_, *rt.model->tok, rt.model->chat_template, output, log);
        models_.publish(std::make_shared<gateway::serving_model>(gateway::serving_model{
            .id = location_->served_name,
            .created = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count(),
            .context_length = rt.context,
            .chat_template = rt.model->chat_template,
            .tokenizer = rt.model->tok.get(),
            .engine = client_.get(),
            .grammars = grammars_.get(),
            .output = output,
            .parse_client_special_tokens = client_text.parse_client_special_tokens,
            .markup_tokens = std::move(client_text.markup_tokens)}));
        return format("serving \"{}\"", location_->served_name);
      },
      before_step_, std::move(on_ready));
}

command make_serve_command(CLI::App& app) {
  return command(app, "serve", "Serve the OpenAI-compatible API with the engine in this process", serve_options(),
                 run_serve);
}

}  // namespace edge::cli
