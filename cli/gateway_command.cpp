// `edgeinfer gateway --backend URL [--backend URL ...]`: the OpenAI-compatible API with
// tenants, API keys, quotas and the admin API, as `serve` has them, in front of `edgeinfer
// backend` processes instead of an engine of its own.
//
// --model names the same model files the backends serve; the gateway loads only their
// tokenizer (no weights) and tokenizes here. A backend is used once its /internal/v1/info shows
// the same tokenizer (and, after the first one, the same model id, chat template, context and
// KV block size); the chat template and context come from the backends, which own them: the
// gateway renders every prompt with the template its backends loaded (internal_protocol.h).
// /readyz turns 200 when a backend is available. The backends' internal token is required
// (--internal-token, or EDGE_INTERNAL_TOKEN).
#include <boost/asio/signal_set.hpp>

#include <csignal>

#include "commands.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/format.h"
#include "edge/common/log.h"
#include "edge/common/version.h"
#include "edge/gateway/tenancy/admin_routes.h"
#include "edge/gateway/http/http_server.h"
#include "edge/gateway/openai/openai_routes.h"
#include "edge/gateway/http/operational_routes.h"
#include "edge/gateway/split/remote_backend_pool.h"
#include "edge/gateway/openai/serving_model.h"
#include "edge/monitoring/gateway_metrics.h"
#include "edge/monitoring/metrics_registry.h"
#include "serving_setup.h"

namespace edge::cli {
namespace {

using namespace std::chrono_literals;

constexpr std::int64_t max_backend_attempts = 16;
constexpr std::int64_t max_affinity_blocks = 1 << 16;

config::schema gateway_options() {
  config::schema s;
  add_http_options(s, 8080);
  add_tenancy_options(s);
  add_output_parser_options(s);
  add_client_text_options(s);
  s.add_path("model", std::nullopt,
             "The model files the backends serve: only the tokenizer is loaded (default: models/default, then the "
             "test fixture)");
  s.add_string("backend", std::nullopt,
               "A backend's URL, http://HOST:PORT (repeat the flag, or separate URLs with commas)");
  s.add_string("internal-token", std::nullopt,
               "Bearer token sent to the backends' internal API (required): their --internal-token, or the token a "
               "backend made on its first start (in its --state-dir, file internal_token)");
  s.add_duration("backend-poll-interval", "200ms", 10ms, 1min, "How often each backend's health and load are read");
  s.add_duration("backend-connect-timeout", "2s", 10ms, 1min, "Give up connecting to a backend after this long");
  s.add_duration("backend-timeout", "10s", 10ms, 1h,
                 "How long a backend may take to answer a poll, or to accept a generation request");
  s.add_duration("backend-stream-timeout", "30s", 100ms, 24h,
                 "A generation stream that brings nothing (backends send heartbeats) this long has failed");
  s.add_integer("backend-attempts", 3, 1, max_backend_attempts,
                "Backends tried per request at most, when the first fails before the request started");
  s.add_integer("affinity-blocks", 4, 1, max_affinity_blocks,
                "Full KV blocks of the prompt that name its prefix for affinity routing");
  s.add_number("session-load-epsilon", 0.25, 0.0, 100.0,
               "Sessions (x-session-affinity, prompt_cache_key) stay on their backend while it has at most (1 + this) "
               "times the average of this gateway's requests in flight per backend; beyond it a session's request "
               "goes to its next backend (bounded-load consistent hashing). Larger keeps sessions together under "
               "uneven load, smaller spreads the load");
  s.add_integer("eject-after-failures", 3, 1, 1000, "Consecutive failures that take a backend out of rotation");
  s.add_duration("eject-time", "5s", 10ms, 1h,
                 "How long an ejected backend stays out; doubled for each ejection in a row, up to 12 times this");
  return s;
}

result<gateway::remote_backend_options> pool_options(const config::values& settings) {
  gateway::remote_backend_options options;
  const auto urls = settings.optional_string("backend");
  if (!urls || split_list(*urls).empty()) {
    return invalid_argument("at least one --backend URL is needed, e.g. --backend http://127.0.0.1:8081");
  }
  for (const std::string& url : split_list(*urls)) {
    EDGE_ASSIGN_OR_RETURN(auto endpoint, gateway::parse_backend_url(url));
    for (const auto& known : options.backends) {
      if (known.url == endpoint.url) return invalid_argument(format("--backend {} is given twice", url));
    }
    options.backends.push_back(std::move(endpoint));
  }
  options.internal_token = settings.optional_string("internal-token").value_or("");
  if (options.internal_token.size() < gateway::min_internal_token_length) {
    return invalid_argument(format(
        "--internal-token (or EDGE_INTERNAL_TOKEN) must name the backends' token, at least {} characters: their "
        "--internal-token, or the one a backend logs on its first start and keeps in its --state-dir (file {})",
        gateway::min_internal_token_length, gateway::internal_token_file_name));
  }
  options.poll_interval = settings.duration("backend-poll-interval");
  options.connect_timeout = settings.duration("backend-connect-timeout");
  options.request_timeout = settings.duration("backend-timeout");
  options.stream_idle_timeout = settings.duration("backend-stream-timeout");
  options.max_attempts = static_cast<int>(settings.integer("backend-attempts"));
  options.routing.affinity_blocks = settings.integer("affinity-blocks");
  options.routing.session_load_epsilon = settings.number("session-load-epsilon");
  options.routing.eject_after_failures = static_cast<int>(settings.integer("eject-after-failures"));
  options.routing.ejection_base = settings.duration("eject-time");
  constexpr int max_doublings = 12;
  options.routing.ejection_max = options.routing.ejection_base * max_doublings;
  return options;
}

int run_gateway(const config::values& settings) {
  const logger log{"gateway"};
  log.info("edgeinfer {} (commit {})", version_string(), git_commit());
  log.debug("settings: {}", settings.describe());
  if (const auto conflict = http_options_conflict(settings)) {
    log.error("{}", *conflict);
    return 2;
  }
  if (const auto exit_code = announce_metrics_access(settings, log)) return *exit_code;

  auto options = pool_options(settings);
  if (!options.ok()) {
    log.error("{}", options.error().message());
    return 2;
  }
  auto location = locate_served_model(settings);
  if (!location.ok()) {
    log.error("{} (the gateway tokenizes with the model's tokenizer: name it with --model)", location.error().message());
    return 1;
  }
  auto loaded = backend::load_model_tokenizer(location->path);
  if (!loaded.ok()) {
    log.error("cannot load the tokenizer of {}: {}", location->path.string(), loaded.error().message());
    return 1;
  }
  const std::unique_ptr<backend::tokenizer> tok = std::move(loaded).value();
  const std::string fingerprint = backend::tokenizer_fingerprint(*tok);
  log.info("tokenizer of {} loaded (vocabulary {}, fingerprint {}); {} backends", location->path.string(),
           tok->vocab_size(), fingerprint, options->backends.size());
  const gateway::output_syntax output = choose_output_syntax(settings, *tok, log);

  monitoring::metrics_registry metrics;
  monitoring::gateway_metrics gateway_families(metrics.families());
  // Tenancy outlives the server: requests still holding quota leases when the server goes away
  // settle into it, and its destructor flushes the usage ledger last.
  const real_time_source clock;
  auto opened = open_tenancy(settings, clock, gateway_families, log);
  if (const int* exit_code = std::get_if<int>(&opened)) return *exit_code;
  tenancy_setup& tenancy = std::get<tenancy_setup>(opened);

  gateway::model_slot models;
  // Outlives the server: requests in flight hold handles into it.
  gateway::remote_backend_pool pool(std::move(options).value(), fingerprint, clock, &gateway_families);

  gateway::router routes;
  gateway::add_operational_routes(routes, metrics, {.readiness = [&pool] { return pool.readiness(); }},
                                  checked_metrics_access(settings));
  gateway::add_openai_routes(routes, models, *tenancy.tenants, &gateway_families, openai_route_settings(settings));
  gateway::add_admin_routes(routes, *tenancy.tenants, {.admin_token = tenancy.admin_token});

  gateway::http_server server(http_server_options(settings), std::move(routes), &gateway_families);
  boost::asio::signal_set signals(server.context(), SIGINT, SIGTERM);
  drain_on_signals(signals, server, log);
  if (!listen_and_announce(server, log, [&] { create_first_key(tenancy, log, "gateway"); })) return 1;

  pool.start(server.context().get_executor(), [&](const gateway::backend_info& info) {
    // The gateway renders every prompt, with the template the backends load.
    auto chat = backend::chat_template::compile(info.chat_template);
    if (!chat.ok()) {
      log.error("the backends' chat template does not parse here: {}", chat.error().message());
      return;
    }
    log.info("chat template (from the backends): {}", chat->describe());
    // The gateway tokenizes, so client text is kept text here; backends only get token ids.
    client_text_rule client_text = choose_client_text_rule(settings, *tok, *chat, output, log);
    models.publish(std::make_shared<gateway::serving_model>(gateway::serving_model{
        .id = info.model,
        .created =
            std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count(),
        .context_length = info.context_length,
        .chat_template = std::move(chat).value(),
        .tokenizer = tok.get(),
        .engine = &pool,
        .output = output,
        .parse_client_special_tokens = client_text.parse_client_special_tokens,
        .markup_tokens = std::move(client_text.markup_tokens)}));
    log.info("ready: serving \"{}\" through the backends", info.model);
  });

  server.run();
  // Store calls still running resume their requests on the server's io_context: let them land first.
  tenancy.tenants->drain_quota_calls();
  return 0;
}

}  // namespace

command make_gateway_command(CLI::App& app) {
  command gateway(app, "gateway",
                  "Serve the OpenAI-compatible API with tenants and quotas in front of `edgeinfer backend` processes",
                  gateway_options(), run_gateway);
  // Several backends: `--backend URL --backend URL`, or `--backend URL URL`.
  gateway.app()
      .get_option("--backend")
      ->expected(1, CLI::detail::expected_max_vector_size)
      ->allow_extra_args(true)
      ->multi_option_policy(CLI::MultiOptionPolicy::Join);
  return gateway;
}

}  // namespace edge::cli
