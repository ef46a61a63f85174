// `edgeinfer backend`: the engine alone, behind the internal streaming API that split gateways
// (`edgeinfer gateway --backend URL ...`) send token ids to. No tenants, API keys or quotas:
// the gateway has checked those; a bearer token keeps anything else out: --internal-token, or
// without it a token made on the first start, kept in --state-dir and logged that once (as
// `serve` logs the first tenant's API key).
//
// As serve does, it listens at once (/healthz answers, /readyz says "loading") while another
// thread loads the model and starts the engine; /metrics has the engine's metrics. /readyz and
// /healthz follow the engine's health as serve's do, and split gateways poll /readyz: a backend
// whose engine failed or stalled gets no more requests.
#include "backend_command.h"

#include <boost/asio/signal_set.hpp>

#include <csignal>
#include <variant>

#include "commands.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/format.h"
#include "edge/common/version.h"
#include "edge/gateway/http/operational_routes.h"

namespace edge::cli {
namespace {

constexpr std::int64_t default_backend_port = 8081;

gateway::router backend_routes(const config::values& settings, std::string internal_token,
                               monitoring::metrics_registry& metrics, const engine_loader& engine,
                               const gateway::internal_backend_slot& engines) {
  gateway::router routes;
  gateway::add_operational_routes(routes, metrics, engine_probes(engine), checked_metrics_access(settings));
  gateway::add_internal_routes(routes, engines,
                               {.token = std::move(internal_token), .heartbeat = settings.duration("heartbeat")});
  return routes;
}

// --internal-token, else the token kept in --state-dir (made and logged on the first start);
// else, logged, the exit code: 2 for a bad option, 1 otherwise.
std::variant<std::string, int> internal_token(const config::values& settings, const logger& log) {
  if (auto given = settings.optional_string("internal-token")) {
    if (given->size() < gateway::min_internal_token_length) {
      log.error("--internal-token must be at least {} characters", gateway::min_internal_token_length);
      return 2;
    }
    log.info("internal API guarded by --internal-token");
    return std::move(*given);
  }
  auto stored = gateway::load_or_create_internal_token(settings.string("state-dir"));
  if (!stored.ok()) {
    log.error("no --internal-token, and the token of the state directory is not usable: {}",
              stored.error().message());
    return 1;
  }
  if (stored->created) {
    log_first_start_secret(log, "internal token", stored->token,
                           format("it is kept in {}; gateways send it with --internal-token or EDGE_INTERNAL_TOKEN",
                                  stored->file.string()));
  } else {
    log.info("internal API guarded by the token in {}", stored->file.string());
  }
  return std::move(stored->token);
}

int run_backend(const config::values& settings) {
  const logger log{"backend"};
  log.info("edgeinfer {} (commit {}), CUDA {}", version_string(), git_commit(),
           cuda_compiled() ? "built" : "not built");
  log.debug("settings: {}", settings.describe());
  for (const auto& conflict : {http_options_conflict(settings), engine_options_conflict(settings)}) {
    if (!conflict) continue;
    log.error("{}", *conflict);
    return 2;
  }
  if (const auto exit_code = announce_metrics_access(settings, log)) return *exit_code;

  auto token = internal_token(settings, log);
  if (const int* exit_code = std::get_if<int>(&token)) return *exit_code;
  auto location = locate_served_model(settings);
  if (!location.ok()) {
    log.error("{}", location.error().message());
    return 1;
  }
  log.info("model \"{}\" from {} (chosen by {})", location->served_name, location->path.string(), location->chosen_by);

  monitoring::metrics_registry metrics;
  monitoring::gateway_metrics http_families(metrics.families());
  backend_server backend(settings, std::get<std::string>(std::move(token)), *location, metrics, http_families);
  boost::asio::signal_set signals(backend.http().context(), SIGINT, SIGTERM);
  drain_on_signals(signals, backend.http(), log);
  if (!listen_and_announce(backend.http(), log)) return 1;
  backend.load(log);
  backend.http().run();
  return backend.stop(log);
}

}  // namespace

config::schema backend_options() {
  using namespace std::chrono_literals;
  config::schema s;
  add_http_options(s, default_backend_port);
  add_model_options(s);
  add_engine_options(s);
  add_grammar_options(s);
  s.add_string("internal-token", std::nullopt,
               "Bearer token gateways must send to /internal/v1/ (at least 16 characters); without it the backend "
               "makes one on its first start, keeps it in --state-dir and logs it that once");
  s.add_path("state-dir", std::string(default_state_dir),
             "Folder of the internal token made when no --internal-token is given; created if missing");
  s.add_duration("heartbeat", "5s", 10ms, 1h,
                 "Send a heartbeat line on a generation stream that wrote nothing for this long (keep it well under "
                 "the gateway's --backend-stream-timeout)");
  return s;
}

backend_server::backend_server(const config::values& settings, std::string internal_token,
                               backend::model_location location, monitoring::metrics_registry& metrics,
                               monitoring::gateway_metrics& families, std::function<void()> before_step)
    : settings_(settings),
      location_(std::move(location)),
      metrics_(metrics),
      families_(families),
      before_step_(std::move(before_step)),
      server_(http_server_options(settings),
              backend_routes(settings, std::move(internal_token), metrics, engine_, engines_), &families),
      engine_(true) {}

void backend_server::load(const logger& log) {
  engine_.start(
      settings_, location_, metrics_, log, server_,
      [this](serving_runtime& rt) {
        const backend::tokenizer& tok = *rt.model->tok;
        gateway::backend_info info{.model = location_.served_name,
                                   .context_length = rt.context,
                                   .chat_template = rt.model->chat_template.spec(),
                                   .tokenizer_fingerprint = backend::tokenizer_fingerprint(tok),
                                   .vocab_size = tok.vocab_size(),
                                   .block_size = rt.block_size,
                                   .version = std::string(version_string())};
        std::string serving = format("serving \"{}\" to gateways (tokenizer fingerprint {})", info.model,
                                     info.tokenizer_fingerprint);
        grammars_ = std::make_unique<gateway::grammar_compiler>(tok, grammar_compiler_settings(settings_), &families_,
                                                                clock_);
        engines_.publish(std::make_shared<gateway::internal_backend>(gateway::internal_backend{
            .info = std::move(info), .engine = rt.engine.get(), .grammars = grammars_.get()}));
        return serving;
      },
      before_step_);
}

command make_backend_command(CLI::App& app) {
  return command(app, "backend", "Run the engine alone behind the internal API that `edgeinfer gateway` routes to",
                 backend_options(), run_backend);
}

}  // namespace edge::cli
