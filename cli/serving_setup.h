// What the commands that run an HTTP server share: `serve` (tenancy + the engine in this
// process), `backend` (the engine alone, internal API) and `gateway` (tenancy + remote
// backends). Each command builds its schema from these groups of options and its server from
// these steps, so the three cannot drift apart.
#pragma once

#include <boost/asio/signal_set.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <variant>

#include "edge/backend/engine/engine.h"
#include "edge/backend/model/model.h"
#include "edge/backend/model_locator.h"
#include "edge/backend/runtime/executor.h"
#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/backend/runtime/kv_cache.h"
#include "edge/common/config.h"
#include "edge/common/log.h"
#include "edge/common/status.h"
#include "edge/common/thread_pool.h"
#include "edge/common/time_source.h"
#include "edge/gateway/http/http_server.h"
#include "edge/gateway/http/operational_routes.h"
#include "edge/gateway/openai/grammar_compiler.h"
#include "edge/gateway/openai/openai_routes.h"
#include "edge/gateway/openai/output_parser.h"
#include "edge/gateway/tenancy/tenancy.h"
#include "edge/monitoring/engine_metrics.h"
#include "edge/monitoring/gateway_metrics.h"
#include "edge/monitoring/metrics_registry.h"

namespace edge::cli {

// --host, --port (default `default_port`), --http-threads, --max-body, --max-connections,
// --max-buffered-body-bytes, --header-timeout, --body-timeout, --idle-timeout,
// --write-timeout, --shutdown-timeout, --access-log, --metrics-token, --metrics-token-file,
// --engine-metrics-open.
void add_http_options(config::schema& s, std::int64_t default_port);
gateway::server_options http_server_options(const config::values& settings);
// Settings of add_http_options that contradict each other (a body budget below the largest
// body), as a message naming them; the serving commands exit 2 with it.
std::optional<std::string> http_options_conflict(const config::values& settings);
// What is wrong with the engine options taken together (the KV tiers' flags), or nothing.
std::optional<std::string> engine_options_conflict(const config::values& settings);

// Who may read /metrics: with --metrics-token (or the first line of --metrics-token-file) the
// scrapers that send it; without, everyone when --host is a loopback address and no one
// otherwise. Errors (both given, an unreadable file, a token under 16 characters) are
// invalid_argument naming the option; the commands exit 2 with them.
result<gateway::metrics_access> metrics_access_from(const config::values& settings);
// The same for building routes, after the command has checked it: a failure (the file gone
// since) leaves /metrics closed.
gateway::metrics_access checked_metrics_access(const config::values& settings);
// Logs who may read /metrics, or why the settings cannot say; the exit code (2) on an error.
std::optional<int> announce_metrics_access(const config::values& settings, const logger& log);

// --model, --served-model-name.
void add_model_options(config::schema& s);
// The engine's options: --threads, the KV cache, weights, scheduler, --device.
void add_engine_options(config::schema& s);
// --tool-call-parser, --reasoning-parser: how chat answers are read (output_parser.h).
void add_output_parser_options(config::schema& s);
// The syntaxes of the served model's answers: the vocabulary's (detect_output_syntax) unless the
// flags name them; logged with why each was chosen.
gateway::output_syntax choose_output_syntax(const config::values& settings, const backend::tokenizer& tok,
                                            const logger& log);

// --client-special-tokens: whether special-token text in what clients send stays text (the
// default) or becomes the model's special tokens.
void add_client_text_options(config::schema& s);
// Whether the served model parses special-token text in requests (serving_model), and the markup
// tokens it guards otherwise; logged.
struct client_text_rule {
  bool parse_client_special_tokens = false;
  backend::markup_tokens markup_tokens;
};
client_text_rule choose_client_text_rule(const config::values& settings, const backend::tokenizer& tok,
                                         const backend::chat_template& chat, const gateway::output_syntax& output,
                                         const logger& log);
// The grammar compiler of `serve` and `backend` (grammar_compiler.h): --grammar-compile-threads,
// --grammar-cache-memory, --grammar-max-queued, --grammar-max-queued-per-tenant,
// --grammar-compile-budget.
void add_grammar_options(config::schema& s);
gateway::grammar_compiler_options grammar_compiler_settings(const config::values& settings);

// --state-dir, --admin-token, --api-key, --sse-heartbeat, --stored-responses-size, --stored-responses-ttl:
// what the generating and admin routes need.
void add_tenancy_options(config::schema& s);
// The generating routes' options (openai_routes.h) from those settings.
gateway::openai_route_options openai_route_settings(const config::values& settings);
// What --state-dir is unless given: the tenant store of `serve` and `gateway`, the internal
// token of `backend`.
inline constexpr std::string_view default_state_dir = "state";

// The model --model names, else models/default, else the test fixture (model_locator.h).
result<backend::model_location> locate_served_model(const config::values& settings);

// Everything the engine needs, built by a loader thread. Members are destroyed in reverse
// order: the engine (which stops its thread) before what it uses.
struct serving_runtime {
  std::unique_ptr<backend::model> model;
  std::unique_ptr<backend::kv_cache> cache;
  std::unique_ptr<backend::kv_block_pool> blocks;
  std::unique_ptr<thread_pool> pool;
  std::unique_ptr<backend::executor> executor;
  std::unique_ptr<monitoring::engine_metrics> metrics;
  std::unique_ptr<backend::engine> engine;
  std::int64_t context = 0;     // tokens per request at most: the model's, or --max-model-len
  std::int64_t block_size = 0;  // tokens per KV block
};

// Loads the model, sizes the KV cache and starts the engine, as the engine options say.
// `before_step` becomes engine_options::before_step (tests only; empty otherwise).
result<std::unique_ptr<serving_runtime>> start_engine(const config::values& settings,
                                                       const backend::model_location& location,
                                                       monitoring::metrics_registry& registry, const logger& log,
                                                       std::function<void()> before_step = {});

// The engine of `serve` and `backend`: loaded on a thread of its own while the server already
// answers, then handed to the routes; and what /readyz and /healthz say of it all along.
class engine_loader {
 public:
  // `will_load` false: nothing will be loaded (serve without a model; /readyz says no_model).
  explicit engine_loader(bool will_load);
  ~engine_loader();  // waits for the loader thread
  engine_loader(const engine_loader&) = delete;
  engine_loader& operator=(const engine_loader&) = delete;

  // Starts the loader thread: start_engine(), then `publish` hands the running engine to the
  // routes, `on_ready` runs (on the loader thread), readiness turns ready and "ready: " + what
  // publish returned is logged. An engine that cannot start is logged, readiness says failed
  // and `server` shuts down. `before_step` as start_engine's. `settings`, `metrics`, `log` and
  // `server` must outlive the loader.
  void start(const config::values& settings, backend::model_location location, monitoring::metrics_registry& metrics,
             const logger& log, gateway::http_server& server, std::function<std::string(serving_runtime&)> publish,
             std::function<void()> before_step = {}, std::function<void()> on_ready = {});

  // "ready" while the engine runs and steps; else loading, no_model, failed (it did not
  // start), engine_stalled (engine_options::stall_timeout) or engine_failed. Any thread.
  std::string readiness() const;
  // "ok", or engine_failed once the engine's loop has ended: it never comes back, so only a
  // restart helps. Any thread.
  std::string liveness() const;

  // Once the HTTP server has stopped: waits for the loader, lets the engine finish what it
  // accepted (for a few seconds, then aborts the rest) and stops it. The command's exit code:
  // 1 when the engine failed to start or failed later, else 0.
  int stop(const logger& log);

 private:
  enum class stage { loading, ready, no_model, failed };
  // The engine ran, and a bug has ended its loop since.
  bool engine_failed() const;

  std::atomic<stage> stage_;
  std::unique_ptr<serving_runtime> runtime_;  // written by the loader thread before stage_ turns ready
  std::thread thread_;
};

// /readyz and /healthz as `engine` says (add_operational_routes). Only probing uses `engine`,
// so a server may take these before its engine_loader member is constructed; the loader must
// outlive the router.
gateway::health_probes engine_probes(const engine_loader& engine);

struct tenancy_setup {
  std::unique_ptr<gateway::tenancy> tenants;
  std::string admin_token;        // empty: the admin API is off
  std::size_t api_key_count = 0;  // keys of --api-key
};

// Checks --admin-token, opens the tenant store in --state-dir and logs what it found. On
// failure it logs why and gives the exit code: 2 for a bad option, 1 otherwise.
std::variant<tenancy_setup, int> open_tenancy(const config::values& settings, const time_source& clock,
                                              monitoring::gateway_metrics& metrics, const logger& log);

// On the first start, creates the default tenant and its first API key and logs the key, the
// one time it is shown; later starts do nothing. With --api-key, makes no key: it creates the
// default tenant if it is missing (the keys are its) and logs how many keys there are. Called once the server can serve (it listens,
// and its model, if any, runs), so that a start that fails (a port in use, a model that does
// not load, no GPU) never uses the key up unseen. A failure is logged with what to do instead;
// the server goes on (the admin API can make tenants and keys). `actor` names the command in
// the audit log. Any thread.
void create_first_key(const tenancy_setup& tenancy, const logger& log, std::string_view actor);

// Logs a secret made on the first start, the one time it is shown: "first start: created
// {what} {secret} (shown this once: keep it; {advice})".
void log_first_start_secret(const logger& log, std::string_view what, std::string_view secret,
                            std::string_view advice);

// The first SIGINT/SIGTERM drains the server; a second one closes what is left at once.
// `signals` must live until the server has stopped.
void drain_on_signals(boost::asio::signal_set& signals, gateway::http_server& server, const logger& log);

// Listens and logs "listening on http://HOST:PORT" (what tests and scripts wait for); false,
// logged, when the address cannot be bound. `once_bound` runs between the bind and that line
// (the gateway makes its first key there, so that whoever waits for the line finds the key
// before it in the log).
bool listen_and_announce(gateway::http_server& server, const logger& log,
                         const std::function<void()>& once_bound = {});

}  // namespace edge::cli
