#include "serving_setup.h"

#include "chat_template_options.h"

#include "weight_options.h"

#include <csignal>
#include <cstdlib>
#include <fstream>
#include <thread>

#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/runtime/cuda_executor.h"
#include "edge/backend/runtime/kv_disk_tier.h"
#include "edge/common/format.h"
#include "edge/gateway/openai/serving_model.h"
#include "edge/gateway/tenancy/admin_routes.h"
#include "edge/gateway/tenancy/quota_stores.h"

namespace edge::cli {
namespace {

using namespace std::chrono_literals;

// The KV cache a CPU host gets by default: room for a few hundred thousand tokens of a small
// model (stories260K: 838k; a 1B Llama in bf16: 32k) without taking much of the machine's memory.
constexpr std::string_view default_kv_cache_memory = "1GiB";
// Engine defaults, as vLLM's: blocks of 16 tokens, 256 running sequences; 2048 tokens per step
// keeps a CPU step short while prompts are chunk-prefilled.
constexpr std::int64_t default_block_size = 16;
constexpr std::int64_t default_max_num_seqs = 256;
constexpr std::int64_t default_max_batched_tokens = 2048;
constexpr std::int64_t default_max_queued_requests = 1024;
constexpr std::int64_t max_block_size = 256;
constexpr std::int64_t max_sequences_limit = 4096;
constexpr std::int64_t max_batched_tokens_limit = 1 << 20;
constexpr std::int64_t max_queue_limit = 1 << 20;


std::size_t resolve_threads(std::int64_t requested) {
  return requested > 0 ? static_cast<std::size_t>(requested) : std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

void add_http_options(config::schema& s, std::int64_t default_port) {
  s.add_string("host", "127.0.0.1", "Address to listen on");
  s.add_integer("port", default_port, 0, 65535, "Port to listen on; 0 picks a free port (the log line says which)");
  s.add_integer("http-threads", 0, 0, 1024, "HTTP server threads; 0 means one per hardware thread");
  s.add_bytes("max-body", "4MiB", 1024, std::int64_t{1} << 30, "Largest request body accepted (413 beyond)");
  s.add_integer("max-connections", 0, 0, std::int64_t{1} << 20,
                "Client connections open at once; past it a new one is answered 503 and closed. 0 means 4096, "
                "or less where the file-descriptor limit is lower");
  s.add_bytes("max-buffered-body-bytes", "256MiB", 1024, std::int64_t{1} << 40,
              "Request bodies still being received may hold this much, all connections together; the request "
              "that would pass it is answered 503 (keep it above --max-body)");
  s.add_duration("header-timeout", "10s", 100ms, 24h,
                 "A request's headers must arrive within this long of its first byte (408 beyond)");
  s.add_duration("body-timeout", "30s", 100ms, 24h,
                 "A request's body must arrive within this long of its headers (408 beyond)");
  s.add_duration("idle-timeout", "60s", 100ms, 24h,
                 "Close a keep-alive connection idle this long; no part of reading a request takes longer");
  s.add_duration("write-timeout", "60s", 100ms, 24h, "Give up on a client that accepts no data for this long");
  s.add_duration("shutdown-timeout", "30s", 0ms, 24h,
                 "On SIGTERM, how long requests in flight may take before they are cut short with an error");
  s.add_boolean("access-log", true, "Log one line per request (component \"access\"; JSON fields with --log-format json)");
  s.add_string("metrics-token", std::nullopt,
               "Bearer token scrapers must send to /metrics (16+ characters); without it (or --metrics-token-file) "
               "/metrics answers only when --host is a loopback address");
  s.add_boolean("engine-metrics-open", false,
                "Let anyone who reaches the server read /metrics/engine: the engine's metrics alone (queue, running "
                "requests, KV cache use, tokens, latencies; no tenant), which a Kubernetes endpoint picker scrapes "
                "without a token");
  s.add_path("metrics-token-file", std::nullopt,
             "File whose first line is the metrics token, instead of --metrics-token (a mounted secret, a systemd "
             "credential, the file Prometheus reads with credentials_file); read at start");
}

namespace {

// Whether only this host can reach a server listening on `host`.
bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  boost::system::error_code ec;
  const auto address = boost::asio::ip::make_address(host, ec);
  return !ec && address.is_loopback();
}

result<std::string> read_token_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return invalid_argument(format("--metrics-token-file {} cannot be read", path));
  std::string token;
  std::getline(in, token);
  while (!token.empty() && (token.back() == '\r' || token.back() == ' ' || token.back() == '\t')) token.pop_back();
  return token;
}

}  // namespace

result<gateway::metrics_access> metrics_access_from(const config::values& settings) {
  const auto token = settings.optional_string("metrics-token");
  const auto file = settings.optional_string("metrics-token-file");
  if (token && file) return invalid_argument("give --metrics-token or --metrics-token-file, not both");
  gateway::metrics_access access;
  if (token) access.token = *token;
  if (file) {
    EDGE_ASSIGN_OR_RETURN(access.token, read_token_file(*file));
  }
  if ((token || file) && access.token.size() < gateway::min_metrics_token_length) {
    return invalid_argument(format("the metrics token ({}) must be at least {} characters",
                                   token ? "--metrics-token" : "--metrics-token-file", gateway::min_metrics_token_length));
  }
  access.open = is_loopback_host(settings.string("host"));
  access.engine_open = settings.boolean("engine-metrics-open");
  return access;
}

gateway::metrics_access checked_metrics_access(const config::values& settings) {
  return metrics_access_from(settings).value_or(
      gateway::metrics_access{.token = "", .open = false, .engine_open = settings.boolean("engine-metrics-open")});
}

std::optional<int> announce_metrics_access(const config::values& settings, const logger& log) {
  const auto access = metrics_access_from(settings);
  if (!access.ok()) {
    log.error("{}", access.error().message());
    return 2;
  }
  if (!access->token.empty()) {
    log.info("/metrics: for scrapers with the metrics token");
  } else if (access->open) {
    log.info("/metrics: open on the loopback address {} (no --metrics-token)", settings.string("host"));
  } else {
    log.warn("/metrics: off: {} is not a loopback address and there is no --metrics-token (answers 403)",
             settings.string("host"));
  }
  if (access->engine_open) log.info("/metrics/engine: open to everyone (--engine-metrics-open)");
  return std::nullopt;
}

gateway::server_options http_server_options(const config::values& settings) {
  gateway::server_options options;
  options.host = settings.string("host");
  options.port = static_cast<std::uint16_t>(settings.integer("port"));
  options.threads = static_cast<std::size_t>(settings.integer("http-threads"));
  options.max_body_bytes = settings.bytes("max-body");
  options.max_connections = static_cast<std::size_t>(settings.integer("max-connections"));
  options.max_buffered_body_bytes = settings.bytes("max-buffered-body-bytes");
  options.header_timeout = settings.duration("header-timeout");
  options.body_timeout = settings.duration("body-timeout");
  options.idle_timeout = settings.duration("idle-timeout");
  options.write_timeout = settings.duration("write-timeout");
  options.shutdown_timeout = settings.duration("shutdown-timeout");
  options.access_log = settings.boolean("access-log");
  return options;
}

std::optional<std::string> http_options_conflict(const config::values& settings) {
  if (settings.bytes("max-buffered-body-bytes") < settings.bytes("max-body")) {
    return format("--max-buffered-body-bytes ({}) is below --max-body ({}): a body of the largest size allowed "
                  "could never be received",
                  format_bytes(settings.bytes("max-buffered-body-bytes")), format_bytes(settings.bytes("max-body")));
  }
  return std::nullopt;
}

std::optional<std::string> engine_options_conflict(const config::values& settings) {
  const bool host = settings.bytes("kv-host-cache-memory") > 0;
  const bool disk = settings.optional_string("kv-disk-cache").has_value();
  if (disk && !host) {
    return "--kv-disk-cache needs --kv-host-cache-memory: blocks reach the disk and come back through host memory";
  }
  if ((host || disk) && !settings.boolean("enable-prefix-caching")) {
    return "--kv-host-cache-memory and --kv-disk-cache keep prefix-cache blocks: they need --enable-prefix-caching";
  }
  return std::nullopt;
}

void add_model_options(config::schema& s) {
  s.add_path("model", std::nullopt,
             "Model file or folder to serve, also as the command's argument or -m (default: models/default, then the "
             "test fixture)")
      .also_positional()
      .also_short('m');
  s.add_string("served-model-name", std::nullopt, "Model id clients use (default: the file or folder name)");
}

void add_engine_options(config::schema& s) {
  s.add_integer("threads", 0, 0, 1024, "Compute threads of the engine; 0 means one per hardware thread");
  s.add_bytes("kv-cache-memory", std::string(default_kv_cache_memory), std::int64_t{1} << 16, std::int64_t{1} << 50,
              "Memory for the KV cache; it is divided into blocks for the chosen --kv-cache-dtype");
  s.add_choice("kv-cache-dtype", "auto", {"auto", "fp8", "fp8_e4m3", "bf16", "f16", "f32"},
               "KV cache element type; fp8 is E4M3 with a scale per token and KV head (about twice the tokens of "
               "bf16); auto is the model's own dtype");
  s.add_choice("weight-dtype", "auto", {"auto", "int4", "int8", "fp8", "bf16", "f16", "f32"},
               "What the projection weights become on load; auto keeps them as stored");
  add_quantize_on_load_options(s);
  s.add_integer("max-model-len", 0, 0, std::int64_t{1} << 24,
                "Context served: prompt + completion tokens at most (-c, as llama.cpp's server's context size); 0 "
                "means the model's own context length")
      .also_short('c');
  add_chat_template_option(s);
  s.add_integer("block-size", default_block_size, 1, max_block_size, "Tokens per KV cache block");
  s.add_integer("max-num-seqs", default_max_num_seqs, 1, max_sequences_limit, "Requests running at once at most");
  s.add_integer("max-num-batched-tokens", default_max_batched_tokens, 1, max_batched_tokens_limit,
                "Tokens computed per engine step at most; longer prompts are prefilled in chunks");
  s.add_choice("admission", "optimistic", {"optimistic", "reserve"},
               "optimistic: admit for the tokens a request has and preempt (recompute) when blocks run out; "
               "reserve: admit only when prompt + max_tokens fit, never preempt");
  s.add_integer("max-queued-requests", default_max_queued_requests, 1, max_queue_limit,
                "Requests waiting for admission at most; beyond it requests are refused with 503");
  s.add_duration("engine-stall-timeout", "60s", 1s, 24h,
                 "An engine step running this long stalls the engine: /readyz answers 503 engine_stalled until it "
                 "ends (new requests still queue)");
  s.add_boolean("enable-prefix-caching", true,
                "Reuse the KV blocks of earlier prompts that start the same way (per tenant)");
  s.add_bytes("kv-host-cache-memory", "0", 0, std::int64_t{1} << 50,
              "Host memory for a KV tier below the KV cache: cached prompt blocks the cache evicts are kept here "
              "and copied back for a later prompt that starts the same way (0: none)");
  s.add_path("kv-disk-cache", std::nullopt,
             "Folder for a KV tier on local disk below the host tier (needs --kv-host-cache-memory): blocks kept "
             "in host memory are also written here, survive restarts and are read back on a hit");
  s.add_bytes("kv-disk-cache-size", "16GiB", std::int64_t{1} << 20, std::int64_t{1} << 56,
              "The most --kv-disk-cache may hold; the least recently used blocks go beyond it");
  s.add_choice("device", "auto", {"auto", "cpu", "cuda"},
               "Where the engine runs: cuda (the first GPU), cpu, or auto (cuda when a GPU is present)");
  s.add_number("gpu-memory-utilization", 0.9, 0.01, backend::max_gpu_memory_utilization,
               "With CUDA: the share of the GPU's memory that weights, buffers and the KV cache may take; the KV "
               "cache gets what the weights leave (--kv-cache-memory, when given, sizes it instead)");
}

void add_output_parser_options(config::schema& s) {
  s.add_choice("tool-call-parser", "auto", {"auto", "none", "llama3_json", "hermes", "deepseek_v3", "kimi_k2", "glm45"},
               "How the model writes tool calls, for requests that offer tools; auto recognises it from the "
               "vocabulary (none: answers are plain content)");
  s.add_choice("reasoning-parser", "auto", {"auto", "none", "think", "kimi_k2"},
               "How the model writes its reasoning (<think>…</think>), returned as reasoning_content; auto "
               "recognises it from the vocabulary");
}

gateway::output_syntax choose_output_syntax(const config::values& settings, const backend::tokenizer& tok,
                                            const logger& log) {
  const gateway::detected_output_syntax detected = gateway::detect_output_syntax(tok);
  gateway::output_syntax syntax = detected.syntax;
  std::string tool_calls_why = format("auto: {}", detected.tool_calls_reason);
  std::string reasoning_why = format("auto: {}", detected.reasoning_reason);
  if (const std::string& name = settings.string("tool-call-parser"); name != "auto") {
    syntax.tool_calls = *gateway::parse_tool_call_parser_name(name);
    tool_calls_why = "--tool-call-parser";
  }
  if (const std::string& name = settings.string("reasoning-parser"); name != "auto") {
    syntax.reasoning = *gateway::parse_reasoning_parser_name(name);
    reasoning_why = "--reasoning-parser";
  }
  syntax = gateway::with_special_markers(syntax, tok);
  log.info("chat answers: tool calls {} ({}), reasoning {} ({})", gateway::to_string(syntax.tool_calls),
           tool_calls_why, gateway::to_string(syntax.reasoning), reasoning_why);
  return syntax;
}

void add_client_text_options(config::schema& s) {
  s.add_choice("client-special-tokens", "text", {"text", "parse"},
               "text: special-token text in what clients send (message contents, tool results, tool calls, tool "
               "definitions, completions prompts) is tokenized as ordinary text, so that only the chat template "
               "writes the model's markup; parse: it becomes the model's special tokens, as the template's own do "
               "(only for clients trusted to write the model's markup)");
}

client_text_rule choose_client_text_rule(const config::values& settings, const backend::tokenizer& tok,
                                         const backend::chat_template& chat, const gateway::output_syntax& output,
                                         const logger& log) {
  client_text_rule rule;
  rule.parse_client_special_tokens = settings.string("client-special-tokens") == "parse";
  if (rule.parse_client_special_tokens) {
    log.warn("--client-special-tokens parse: special-token text in requests becomes the model's special tokens, so "
             "a message or a tool result can write turns and tool calls of its own");
    return rule;
  }
  rule.markup_tokens = gateway::chat_markup_tokens(tok, chat, output);
  log.info("client text is text: {} special and markup tokens match only where the chat template writes them",
           rule.markup_tokens.size());
  return rule;
}

void add_grammar_options(config::schema& s) {
  s.add_integer("grammar-compile-threads", 0, 0, 256,
                "Threads compiling requests' grammars (response_format, tool_choice); 0 means a quarter of the "
                "hardware threads, from 1 to 4");
  s.add_bytes("grammar-cache-memory", "1GiB", 0, std::int64_t{1} << 44,
              "Memory the compiled grammars kept for reuse may hold (each tenant's own); past it the tenant holding "
              "the most gives up its least recently used one; 0 keeps none");
  const gateway::grammar_compiler_options defaults;
  s.add_integer("grammar-max-queued", static_cast<std::int64_t>(defaults.max_queued), 1, 1 << 20,
                "Grammar compiles waiting or running, all tenants together; past it a new grammar is answered 503");
  s.add_integer("grammar-max-queued-per-tenant", static_cast<std::int64_t>(defaults.max_queued_per_tenant), 1, 1 << 20,
                "Grammar compiles one tenant may have waiting or running; past it its new grammar is answered 429");
  s.add_number("grammar-compile-budget", 60.0, 0.0, 1e6,
               "Seconds of grammar compiling each tenant may spend per minute (up to a minute's worth at once); past "
               "it a new grammar is answered 429 until the budget refills, while cached ones still serve; 0: no limit");
}

gateway::grammar_compiler_options grammar_compiler_settings(const config::values& settings) {
  const std::int64_t threads = settings.integer("grammar-compile-threads");
  return {.threads = threads > 0 ? static_cast<std::size_t>(threads)
                                 : gateway::default_grammar_compile_threads(std::thread::hardware_concurrency()),
          .cache_bytes = static_cast<std::int64_t>(settings.bytes("grammar-cache-memory")),
          .max_queued = static_cast<std::size_t>(settings.integer("grammar-max-queued")),
          .max_queued_per_tenant = static_cast<std::size_t>(settings.integer("grammar-max-queued-per-tenant")),
          .compile_seconds_per_minute = settings.number("grammar-compile-budget")};
}

void add_tenancy_options(config::schema& s) {
  s.add_duration("sse-heartbeat", "15s", 10ms, 1h, "Send a `: ping` comment on a stream that wrote nothing for this long");
  s.add_bytes("stored-responses-size", "64MiB", 0, std::int64_t{1} << 40,
              "Responses API (store: true): the bytes of stored responses each tenant keeps in the tenant store; "
              "its oldest go first");
  s.add_duration("stored-responses-ttl", "30d", 1min, std::chrono::hours(24 * 3650),
                 "Responses API: how long a stored response is kept");
  s.add_path("state-dir", std::string(default_state_dir),
             "Folder of the tenant store (tenants, API keys, usage, audit log); created if missing");
  s.add_string("tenant-store", "sqlite",
               "Where tenants, API keys, usage and the audit log live: sqlite (in --state-dir, this process only), or "
               "a postgres:// URL shared by every gateway that names it");
  s.add_duration("tenant-store-timeout", "2s", 10ms, 1min,
                 "PostgreSQL tenant store: the longest a connection or statement may take before it counts as failed");
  s.add_string("admin-token", std::nullopt,
               "Bearer token of the admin API (/admin/v1/), at least 16 characters; without it the admin API is off");
  s.add_string("api-key", std::nullopt,
               "An API key clients may send, as vLLM's and llama.cpp's --api-key (repeat it for several; "
               "comma-separated in EDGE_API_KEY or the file): each is the default tenant's, kept only as a digest "
               "in memory and never written; keys the admin API makes work beside them")
      .also_repeatable();
  // Quota counters in this process, or in Redis when several gateways share them.
  gateway::add_quota_store_options(s);
}

gateway::openai_route_options openai_route_settings(const config::values& settings) {
  return {.sse_heartbeat = settings.duration("sse-heartbeat"),
          .stored_response_bytes = static_cast<std::int64_t>(settings.bytes("stored-responses-size")),
          .stored_response_ttl = std::chrono::duration_cast<std::chrono::seconds>(settings.duration("stored-responses-ttl"))};
}

result<backend::model_location> locate_served_model(const config::values& settings) {
  backend::locate_options where;
  if (auto model = settings.optional_string("model")) where.requested = *model;
  where.served_name = settings.optional_string("served-model-name");
  if (const char* test_models = std::getenv("EDGE_TEST_MODELS"); test_models && *test_models) {
    where.test_models = test_models;
  }
  return backend::locate_model(where);
}

namespace {

// The lower KV tiers (--kv-host-cache-memory, --kv-disk-cache) for an executor's KV layout.
status configure_kv_tiers(const config::values& settings, const backend::model& m, const backend::kv_cache_layout& kv,
                          backend::engine_options& options, const logger& log) {
  // engine_options_conflict() has refused the flags that do not go together.
  const std::uint64_t host_bytes = settings.bytes("kv-host-cache-memory");
  const auto disk = settings.optional_string("kv-disk-cache");
  if (host_bytes == 0) return {};
  const std::size_t block_bytes = kv.bytes_per_block();
  options.host_tier_blocks = static_cast<std::int64_t>(host_bytes / block_bytes);
  if (options.host_tier_blocks == 0) {
    return invalid_argument(format("--kv-host-cache-memory {} holds no KV block of {} ({} tokens of this model)",
                                   format_bytes(host_bytes), format_bytes(block_bytes), kv.block_size));
  }
  log.info("KV host tier: {} blocks ({} tokens) in {}", options.host_tier_blocks, options.host_tier_blocks * kv.block_size,
           format_bytes(static_cast<std::size_t>(options.host_tier_blocks) * block_bytes));
  if (!disk) return {};
  EDGE_ASSIGN_OR_RETURN(options.disk_tier,
                        backend::kv_disk_tier::open({.directory = *disk,
                                                     .capacity_bytes = static_cast<std::int64_t>(settings.bytes("kv-disk-cache-size")),
                                                     .identity = backend::kv_block_identity(m, kv),
                                                     .block_bytes = block_bytes}));
  log.info("KV disk tier: {} blocks ({}) found in {}, {} at most", options.disk_tier->blocks(),
           format_bytes(static_cast<std::size_t>(options.disk_tier->used_bytes())), options.disk_tier->folder().string(),
           format_bytes(settings.bytes("kv-disk-cache-size")));
  return {};
}

}  // namespace

result<std::unique_ptr<serving_runtime>> start_engine(const config::values& settings,
                                                       const backend::model_location& location,
                                                       monitoring::metrics_registry& registry, const logger& log,
                                                       std::function<void()> before_step) {
  auto rt = std::make_unique<serving_runtime>();
  backend::load_options load;
  load.path = location.path;
  if (const std::string& weights = settings.string("weight-dtype"); weights != "auto") {
    load.weight_dtype = kernels::parse_weight_format(weights);
  }
  apply_chat_template_choice(settings, load);
  apply_quantize_on_load(settings, load);
  // --device: cuda insists on a GPU, auto falls back to the CPU and says why. Known before the
  // model loads: the CPU executor's matrices load in its own layout.
  const std::string& device = settings.string("device");
  std::string no_gpu;
  const bool gpu = device != "cpu" && backend::cuda_available(&no_gpu);
  if (device == "cuda" && !gpu) return failed_precondition(format("--device cuda: {}", no_gpu));
  if (device == "auto" && !gpu) log.info("--device auto: {}; running on the CPU", no_gpu);
  load.cpu_tiles = !gpu;
  EDGE_ASSIGN_OR_RETURN(rt->model, backend::load_model(load));
  const backend::model& m = *rt->model;
  const backend::weight_footprint footprint = backend::footprint_of(m.config, m.weights);
  log.info("model \"{}\" loaded: {}, {} layers, hidden {}, context {}, weights {} ({}, {} read per token)",
           location.served_name, backend::describe_architecture(m.config), m.config.num_layers, m.config.hidden_size,
           m.config.max_position, kernels::to_string(backend::projection_format(m.weights)),
           format_bytes(footprint.total_bytes), format_bytes(footprint.active_bytes_per_token));

  EDGE_ASSIGN_OR_RETURN(const auto requested_kv, backend::parse_kv_cache_dtype(settings.string("kv-cache-dtype")));
  const kernels::dtype kv_dtype = backend::resolve_kv_cache_dtype(requested_kv, m);
  const std::int64_t block_size = settings.integer("block-size");
  rt->block_size = block_size;

  backend::engine_options options;
  options.scheduler.block_size = block_size;
  options.scheduler.max_num_seqs = settings.integer("max-num-seqs");
  options.scheduler.max_num_batched_tokens = settings.integer("max-num-batched-tokens");
  options.scheduler.admission = *backend::parse_admission_policy(settings.string("admission"));
  options.scheduler.enable_prefix_caching = settings.boolean("enable-prefix-caching");
  options.max_queued_requests = settings.integer("max-queued-requests");
  options.stall_timeout = settings.duration("engine-stall-timeout");
  options.before_step = std::move(before_step);

  std::size_t threads = 0;
  backend::kv_cache_capacity capacity;
  if (gpu) {
    backend::cuda_executor_options cuda_options{
        .max_batch_tokens = options.scheduler.max_num_batched_tokens,
        .max_sequences = options.scheduler.max_num_seqs,
        .kv_dtype = kv_dtype,
        .block_size = block_size,
        .gpu_memory_utilization = settings.number("gpu-memory-utilization")};
    if (settings.source_of("kv-cache-memory") != config::origin::default_value) {
      cuda_options.kv_cache_bytes = settings.bytes("kv-cache-memory");
    }
    EDGE_ASSIGN_OR_RETURN(auto cuda, backend::cuda_executor::create(m, cuda_options));
    capacity = cuda->kv_capacity();
    log.info("CUDA: {}", cuda->describe());
    rt->blocks = std::make_unique<backend::kv_block_pool>(cuda->kv_layout().num_blocks);
    rt->executor = std::move(cuda);
  } else {
    const std::size_t budget = settings.bytes("kv-cache-memory");
    capacity = backend::kv_cache_capacity_for(m.config, kv_dtype, block_size, budget);
    EDGE_ASSIGN_OR_RETURN(rt->cache, backend::kv_cache::create(
                                         backend::kv_cache_layout::for_budget(m.config, kv_dtype, block_size, budget)));
    rt->blocks = std::make_unique<backend::kv_block_pool>(rt->cache->layout().num_blocks);
    threads = resolve_threads(settings.integer("threads"));
    // The engine thread computes too, so the pool holds one worker fewer.
    if (threads > 1) rt->pool = std::make_unique<thread_pool>(threads - 1);
    EDGE_ASSIGN_OR_RETURN(rt->executor,
                          backend::cpu_executor::create(m, *rt->cache, rt->pool.get(),
                                                        {.max_batch_tokens = options.scheduler.max_num_batched_tokens,
                                                         .max_sequences = options.scheduler.max_num_seqs}));
  }
  log.info("{}", backend::format_kv_cache_capacity(capacity));
  EDGE_RETURN_IF_ERROR(configure_kv_tiers(settings, m, rt->executor->kv_layout(), options, log));
  if (capacity.tokens < m.config.max_position) {
    log.warn("the KV cache holds {} tokens, fewer than the model's context of {}: a request longer than the cache is "
             "refused",
             capacity.tokens, m.config.max_position);
  }

  rt->metrics = std::make_unique<monitoring::engine_metrics>(
      registry.engine_families(), monitoring::engine_cache_config{
                               .kv_dtype = std::string(kernels::to_string(kv_dtype)),
                               .weight_dtype = std::string(kernels::to_string(backend::projection_format(m.weights))),
                               .architecture = std::string(backend::to_string(m.config.arch)),
                               .attention = m.config.dsa ? "mla_dsa" : m.config.mla ? "mla" : "gqa",
                               .experts = m.config.moe ? m.config.moe->num_experts : 0,
                               .experts_per_token = m.config.moe ? m.config.moe->experts_per_token : 0,
                               .shared_experts = m.config.moe ? m.config.moe->shared_experts : 0,
                               .active_weight_bytes = footprint.active_bytes_per_token,
                               .block_size = block_size,
                               .num_blocks = capacity.num_blocks,
                               .capacity_tokens = capacity.tokens});
  options.observer = rt->metrics.get();
  rt->context = m.config.max_position;
  if (const std::int64_t limit = settings.integer("max-model-len"); limit > 0) rt->context = std::min(limit, rt->context);
  EDGE_ASSIGN_OR_RETURN(rt->engine, backend::engine::create(*m.tok, *rt->executor, *rt->blocks, rt->context, options));
  log.info("engine: {}, admission {}, max {} sequences and {} tokens per step, {} queued at most, "
           "prefix caching {}",
           gpu ? std::string("on CUDA") : format("{} compute threads", threads), settings.string("admission"), options.scheduler.max_num_seqs,
           options.scheduler.max_num_batched_tokens, options.max_queued_requests,
           options.scheduler.enable_prefix_caching ? "on" : "off");
  return rt;
}

engine_loader::engine_loader(bool will_load) : stage_(will_load ? stage::loading : stage::no_model) {}

engine_loader::~engine_loader() {
  if (thread_.joinable()) thread_.join();
}

void engine_loader::start(const config::values& settings, backend::model_location location,
                          monitoring::metrics_registry& metrics, const logger& log, gateway::http_server& server,
                          std::function<std::string(serving_runtime&)> publish, std::function<void()> before_step,
                          std::function<void()> on_ready) {
  thread_ = std::thread([this, &settings, location = std::move(location), &metrics, &log, &server,
                         publish = std::move(publish), before_step = std::move(before_step),
                         on_ready = std::move(on_ready)]() mutable {
    // Loading may also throw (memory exhausted, a file system error): this thread is its root.
    auto started = [&]() -> result<std::unique_ptr<serving_runtime>> {
      try {
        return start_engine(settings, location, metrics, log, std::move(before_step));
      } catch (const std::exception& e) {
        return internal_error(e.what());
      }
    }();
    if (!started.ok()) {
      log.error("cannot serve {}: {}", location.path.string(), started.error().message());
      stage_.store(stage::failed, std::memory_order_release);
      server.shutdown();
      return;
    }
    runtime_ = std::move(started).value();
    const std::string serving = publish(*runtime_);
    if (on_ready) on_ready();  // before readiness turns ready: a client that waits for it finds its result
    stage_.store(stage::ready, std::memory_order_release);
    log.info("ready: {}", serving);
  });
}

std::string engine_loader::readiness() const {
  switch (stage_.load(std::memory_order_acquire)) {
    case stage::loading: return "loading";
    case stage::no_model: return "no_model";
    case stage::failed: return "failed";
    case stage::ready: break;
  }
  const backend::engine_health health = runtime_->engine->health();
  return health.state == backend::engine_state::running ? "ready"
                                                        : format("engine_{}", backend::to_string(health.state));
}

bool engine_loader::engine_failed() const {
  return stage_.load(std::memory_order_acquire) == stage::ready &&
         runtime_->engine->health().state == backend::engine_state::failed;
}

std::string engine_loader::liveness() const { return engine_failed() ? "engine_failed" : "ok"; }

gateway::health_probes engine_probes(const engine_loader& engine) {
  return {.readiness = [&engine] { return engine.readiness(); }, .liveness = [&engine] { return engine.liveness(); }};
}

int engine_loader::stop(const logger& log) {
  if (thread_.joinable()) thread_.join();
  const bool failed_after_start = engine_failed();
  constexpr auto engine_drain_timeout = std::chrono::seconds(5);
  if (runtime_ && !runtime_->engine->drain(engine_drain_timeout)) {
    log.warn("requests still running after {}s are aborted", engine_drain_timeout.count());
  }
  runtime_.reset();
  return failed_after_start || stage_.load(std::memory_order_acquire) == stage::failed ? 1 : 0;
}

namespace {

// The keys of --api-key (EDGE_API_KEY, api_key): what is wrong with one names its place, never
// its text.
result<std::vector<std::string>> api_keys_from(const config::values& settings) {
  const auto text = settings.optional_string("api-key");
  if (!text) return std::vector<std::string>{};
  std::vector<std::string> keys;
  std::size_t place = 0;
  std::string current;
  const auto finish = [&]() -> status {
    ++place;
    if (current.empty()) return invalid_argument(format("--api-key: key {} is empty", place));
    for (const char c : current) {
      if (c <= ' ' || c > '~') {
        return invalid_argument(format("--api-key: key {} has a character that is not printable ASCII or is a space "
                                       "(a key travels in an HTTP header)",
                                       place));
      }
    }
    keys.push_back(std::exchange(current, {}));
    return {};
  };
  for (const char c : *text) {
    if (c == ',') {
      EDGE_RETURN_IF_ERROR(finish());
    } else {
      current += c;
    }
  }
  EDGE_RETURN_IF_ERROR(finish());
  return keys;
}

}  // namespace

std::variant<tenancy_setup, int> open_tenancy(const config::values& settings, const time_source& clock,
                                              monitoring::gateway_metrics& metrics, const logger& log) {
  tenancy_setup setup;
  setup.admin_token = settings.optional_string("admin-token").value_or("");
  if (!setup.admin_token.empty() && setup.admin_token.size() < gateway::min_admin_token_length) {
    log.error("--admin-token must be at least {} characters (it guards every tenant and key)",
              gateway::min_admin_token_length);
    return 2;
  }
  const std::string state_dir = settings.string("state-dir");
  auto quota_store = gateway::quota_store_options_from(settings);
  if (!quota_store.ok()) {
    log.error("{}", quota_store.error().message());
    return 2;
  }
  auto api_keys = api_keys_from(settings);
  if (!api_keys.ok()) {
    log.error("{}", api_keys.error().message());
    return 2;
  }
  setup.api_key_count = api_keys->size();
  const std::string tenant_store = settings.string("tenant-store");
  auto opened = gateway::tenancy::open({.state_dir = state_dir,
                                        .tenant_store_url = tenant_store,
                                        .tenant_store_timeout = settings.duration("tenant-store-timeout"),
                                        .quota_store = *quota_store,
                                        .api_keys = *std::move(api_keys)},
                                       clock, &metrics);
  if (!opened.ok()) {
    log.error("cannot open the tenant store: {}", opened.error().message());
    return opened.error().code() == status_code::invalid_argument ? 2 : 1;
  }
  setup.tenants = std::move(opened).value();
  const gateway::tenant_store& store = setup.tenants->store();
  // How to get another key, said on every start: the first one is shown only once.
  const std::string offline =
      tenant_store == "sqlite" ? format("`edgeinfer admin keys create default --state-dir {}` while the server is stopped",
                                        state_dir)
                               : "";
  const std::string online = "`edgeinfer admin keys create default --admin-token ...` while it runs";
  log.info("tenant store {} (schema {}): {} tenants, {} API keys; admin API {}; a new key: {}", store.description(),
           store.schema_version(), store.snapshot()->tenant_count(), store.snapshot()->key_count(),
           setup.admin_token.empty() ? "off (no --admin-token)" : "on",
           offline.empty() ? online : offline + (setup.admin_token.empty() ? "" : ", or " + online));
  return setup;
}

void create_first_key(const tenancy_setup& tenancy, const logger& log, std::string_view actor) {
  if (tenancy.api_key_count > 0) {
    // The keys are the user's own: no key is made; the tenant they belong to is.
    gateway::tenant_store& store = tenancy.tenants->store();
    const std::string_view id = gateway::tenant_store::default_tenant_id;
    auto existing = store.get_tenant(id);
    if (!existing.ok() && existing.error().code() == status_code::not_found) {
      existing = store.create_tenant(gateway::tenant_record{.id = std::string(id)},
                                     {.actor = std::string(actor), .request_id = ""});
    }
    // Another gateway sharing the store may have made it meanwhile.
    if (!existing.ok() && existing.error().code() != status_code::already_exists) {
      log.error("--api-key: cannot find or create the tenant \"{}\" the keys belong to: {}", id,
                existing.error().message());
      return;
    }
    log.info("--api-key: {} key{} for the tenant \"{}\" (usage under key ids api-key-1 and on)",
             tenancy.api_key_count, tenancy.api_key_count == 1 ? "" : "s", id);
    return;
  }
  auto bootstrapped =
      tenancy.tenants->store().bootstrap_default_tenant({.actor = std::string(actor), .request_id = ""});
  if (!bootstrapped.ok()) {
    log.error("cannot create the default tenant and its first API key: {}; with --admin-token, "
              "`edgeinfer admin tenants create default` and `edgeinfer admin keys create default` make them",
              bootstrapped.error().message());
    return;
  }
  if (*bootstrapped) {
    log_first_start_secret(log, format("tenant \"{}\" with API key", gateway::tenant_store::default_tenant_id),
                           (*bootstrapped)->key,
                           "another: `edgeinfer admin keys create default --state-dir DIR` on the stopped server's "
                           "--state-dir, or `edgeinfer admin keys create` with --admin-token while it runs");
  }
}

void log_first_start_secret(const logger& log, std::string_view what, std::string_view secret,
                            std::string_view advice) {
  log.info("first start: created {} {} (shown this once: keep it; {})", what, secret, advice);
}

void drain_on_signals(boost::asio::signal_set& signals, gateway::http_server& server, const logger& log) {
  signals.async_wait([&signals, &server, &log](const boost::system::error_code& ec, int signal_number) {
    if (ec) return;
    log.info("received {}", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
    server.shutdown();
    drain_on_signals(signals, server, log);  // the next one closes what is left
  });
}

bool listen_and_announce(gateway::http_server& server, const logger& log, const std::function<void()>& once_bound) {
  if (status listening = server.listen(); !listening.ok()) {
    log.error("{}", listening.message());
    return false;
  }
  if (once_bound) once_bound();
  const auto endpoint = server.local_endpoint();
  const std::string address = endpoint.address().is_v6() ? "[" + endpoint.address().to_string() + "]"
                                                         : endpoint.address().to_string();
  log.info("listening on http://{}:{}", address, endpoint.port());
  return true;
}

}  // namespace edge::cli
