// What the commands that run an HTTP server share: `serve` (tenancy + the engine in this
// process), `backend` (the engine alone, internal API) and `gateway` (tenancy + remote
// backends). Each command builds its schema from these groups of options and its server from
// these steps, so the three cannot drift apart.
#pragma once

#include <boost/asio/signal_set.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <variant>

#include "edge/backend/engine.h"
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
#include "edge/gateway/http_server.h"
#include "edge/gateway/tenancy.h"
#include "edge/monitoring/engine_metrics.h"
#include "edge/monitoring/gateway_metrics.h"
#include "edge/monitoring/metrics_registry.h"

namespace edge::cli {

// --host, --port (default `default_port`), --http-threads, --max-body, --idle-timeout,
// --write-timeout, --shutdown-timeout, --access-log.
void add_http_options(config::schema& s, std::int64_t default_port);
gateway::server_options http_server_options(const config::values& settings);

// --model, --served-model-name.
void add_model_options(config::schema& s);
// The engine's options: --threads, the KV cache, weights, scheduler, --device.
void add_engine_options(config::schema& s);
// --state-dir, --admin-token, --sse-heartbeat: what the OpenAI and admin routes need.
void add_tenancy_options(config::schema& s);

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
result<std::unique_ptr<serving_runtime>> start_engine(const config::values& settings,
                                                       const backend::model_location& location,
                                                       monitoring::metrics_registry& registry, const logger& log);

// What /readyz reports while a loader thread starts the engine.
enum class readiness { loading, ready, no_model, failed };
std::string to_string(readiness state);

// Once the HTTP server has stopped: lets the engine finish what it accepted (for a few seconds,
// then aborts the rest), stops it, and gives the command's exit code (1 when the engine failed
// to start).
int stop_engine(std::unique_ptr<serving_runtime>& runtime, readiness final_state, const logger& log);

struct tenancy_setup {
  std::unique_ptr<gateway::tenancy> tenants;
  std::string admin_token;  // empty: the admin API is off
};

// Checks --admin-token, opens the tenant store in --state-dir, creates the default tenant on
// the first start (logging its key once) and logs what it found. On failure it logs why and
// gives the exit code: 2 for a bad option, 1 otherwise. `actor` names the command in the
// audit log.
std::variant<tenancy_setup, int> open_tenancy(const config::values& settings, const time_source& clock,
                                              monitoring::gateway_metrics& metrics, const logger& log,
                                              std::string_view actor);

// The first SIGINT/SIGTERM drains the server; a second one closes what is left at once.
// `signals` must live until the server has stopped.
void drain_on_signals(boost::asio::signal_set& signals, gateway::http_server& server, const logger& log);

// Listens and logs "listening on http://HOST:PORT" (what tests and scripts wait for); false,
// logged, when the address cannot be bound.
bool listen_and_announce(gateway::http_server& server, const logger& log);

}  // namespace edge::cli
