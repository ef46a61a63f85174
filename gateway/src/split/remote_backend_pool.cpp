#include "edge/gateway/split/remote_backend_pool.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <map>
#include <optional>

#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/common/log.h"
#include "edge/gateway/http/http.h"
#include "edge/gateway/openai/refusals.h"
#include "edge/gateway/tenancy/usage_ledger.h"
#include "edge/monitoring/gateway_metrics.h"

// GCC 12 reports a mismatched operator delete in the frames of Asio's awaitables: Asio
// allocates and frees them with its own matching pair, which the warning's inlining-based
// analysis does not see through (a known false positive; openai_routes.cpp does the same).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace edge::gateway {
namespace {

using tcp = asio::ip::tcp;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// A poll's answer or a refusal's body is small; more is a misbehaving peer.
constexpr std::uint32_t max_reply_body = 1 << 20;
// A stream may run for as long as generation does; this only guards against a runaway peer.
constexpr std::uint64_t max_stream_body = std::uint64_t{1} << 40;
constexpr std::size_t read_chunk = 16 * 1024;
// The longest retry-after taken from a backend's 429: a day.
constexpr std::int64_t max_retry_after_ms = std::int64_t{24} * 3600 * 1000;
// One event line at most (a delta with logprobs of a long burst stays far below).
constexpr std::size_t max_event_line = 16 << 20;

constexpr std::string_view readyz_path = "/readyz";
// A backend whose usage figures keep needing correction is logged about at most this often.
constexpr auto usage_correction_log_interval = std::chrono::seconds(10);

http::request<http::string_body> make_request(http::verb method, std::string_view target, const backend_endpoint& ep,
                                              const std::string& token, std::string body = {}) {
  http::request<http::string_body> req{method, target, 11};
  req.set(http::field::host, ep.host + ":" + ep.port);
  req.set(http::field::user_agent, "edgeinfer-gateway");
  if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
  if (method == http::verb::post) req.set(http::field::content_type, "application/json");
  req.keep_alive(true);
  req.body() = std::move(body);
  req.prepare_payload();
  return req;
}

asio::awaitable<result<std::unique_ptr<beast::tcp_stream>>> connect_to(asio::any_io_executor executor,
                                                                      const backend_endpoint& ep,
                                                                      std::chrono::milliseconds timeout) {
  tcp::resolver resolver(executor);
  auto [resolve_ec, endpoints] = co_await resolver.async_resolve(ep.host, ep.port, use_tuple);
  if (resolve_ec) co_return unavailable(format("cannot resolve {}: {}", ep.url, resolve_ec.message()));
  auto stream = std::make_unique<beast::tcp_stream>(executor);
  stream->expires_after(timeout);
  auto [ec, endpoint] = co_await stream->async_connect(endpoints, use_tuple);
  if (ec) co_return unavailable(format("cannot connect to {}: {}", ep.url, ec.message()));
  beast::error_code ignored;
  stream->socket().set_option(tcp::no_delay(true), ignored);
  co_return stream;
}

struct http_reply {
  unsigned status = 0;
  std::string body;
  bool keep_alive = false;
};

// One request and its whole (small) response on `stream`, under `timeout`.
asio::awaitable<result<http_reply>> round_trip(beast::tcp_stream& stream, const http::request<http::string_body>& req,
                                               std::chrono::milliseconds timeout, std::string_view url) {
  const std::string target(req.target());
  stream.expires_after(timeout);
  if (auto [ec, n] = co_await http::async_write(stream, req, use_tuple); ec) {
    co_return unavailable(format("{}: sending {}: {}", url, target, ec.message()));
  }
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(max_reply_body);
  if (auto [ec, n] = co_await http::async_read(stream, buffer, parser, use_tuple); ec) {
    co_return unavailable(format("{}: reading {}: {}", url, target, ec.message()));
  }
  http_reply reply;
  reply.status = parser.get().result_int();
  reply.keep_alive = parser.get().keep_alive();
  reply.body = std::move(parser.get().body());
  co_return reply;
}

struct error_body {
  std::string message;
  std::string type;
  std::string code;
  std::string param;  // a refused request's field at fault (engine::submit's submit_error::field)
};

// The message, code and param of {"error":{"message","code","param"}}, else the body's start.
error_body error_fields(std::string_view body) {
  constexpr std::size_t shown = 200;
  error_body out{.message = std::string(body.substr(0, shown))};
  simdjson::dom::parser parser;
  const auto document = parse_json_object(parser, body, "the answer");
  if (!document.ok()) return out;
  const auto error = json_fields(*document).optional<json_fields>("error");
  if (!error.ok() || !*error) return out;
  const auto read = [&](std::string_view name, std::string& into) {
    if (const auto value = (*error)->optional<std::string_view>(name); value.ok() && *value) into = **value;
  };
  read("message", out.message);
  read("type", out.type);
  read("code", out.code);
  read("param", out.param);
  return out;
}

// A 429's retry-after-ms (what a backend's tenant limit said to wait), at most a day; 0 without.
std::chrono::milliseconds retry_after_of(const http::response_header<>& header) {
  const auto field = header.find("retry-after-ms");
  if (field == header.end()) return std::chrono::milliseconds(0);
  std::int64_t value = 0;
  const std::string_view text = field->value();
  if (std::from_chars(text.data(), text.data() + text.size(), value).ec != std::errc{} || value < 0) {
    return std::chrono::milliseconds(0);
  }
  return std::chrono::milliseconds(std::min(value, max_retry_after_ms));
}

}  // namespace

result<backend_endpoint> parse_backend_url(std::string_view url) {
  constexpr std::string_view scheme = "http://";
  if (url.starts_with("https://")) {
    return invalid_argument(format("--backend {}: https is not supported; backends are reached over plain HTTP on "
                                   "the cluster network",
                                   url));
  }
  if (!url.starts_with(scheme)) return invalid_argument(format("--backend {}: expected http://HOST:PORT", url));
  std::string_view authority = url.substr(scheme.size());
  while (authority.ends_with('/')) authority.remove_suffix(1);
  if (authority.find('/') != std::string_view::npos) {
    return invalid_argument(format("--backend {}: expected http://HOST:PORT without a path", url));
  }
  backend_endpoint ep;
  ep.url = std::string(scheme) + std::string(authority);
  std::string_view port;
  if (authority.starts_with('[')) {  // [::1]:8081
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) return invalid_argument(format("--backend {}: unclosed '['", url));
    ep.host = std::string(authority.substr(1, close - 1));
    const std::string_view rest = authority.substr(close + 1);
    if (!rest.starts_with(':')) return invalid_argument(format("--backend {}: expected a port after the address", url));
    port = rest.substr(1);
  } else {
    const std::size_t colon = authority.rfind(':');
    if (colon == std::string_view::npos) return invalid_argument(format("--backend {}: expected http://HOST:PORT", url));
    ep.host = std::string(authority.substr(0, colon));
    port = authority.substr(colon + 1);
  }
  if (ep.host.empty()) return invalid_argument(format("--backend {}: no host", url));
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos ||
      std::stoi(std::string(port)) < 1 || std::stoi(std::string(port)) > 65535) {
    return invalid_argument(format("--backend {}: \"{}\" is not a port from 1 to 65535", url, port));
  }
  ep.port = std::string(port);
  return ep;
}

// ---- the pool's shared state ------------------------------------------------------------------

struct remote_backend_pool::impl : std::enable_shared_from_this<impl> {
  impl(remote_backend_options options_, std::string fingerprint_, const time_source& clock_,
       monitoring::gateway_metrics* metrics_)
      : options(std::move(options_)),
        fingerprint(std::move(fingerprint_)),
        clock(clock_),
        metrics(metrics_),
        router(names(options), options.routing, clock_),
        backends(options.backends.size()) {
    if (metrics == nullptr) return;
    for (std::size_t i = 0; i < backends.size(); ++i) {
      const std::map<std::string, std::string> label{{"backend", options.backends[i].url}};
      backends[i].requests = &metrics->backend_requests.Add(label);
      backends[i].up = &metrics->backend_up.Add(label);
      backends[i].in_flight = &metrics->backend_in_flight.Add(label);
      backends[i].kv_usage = &metrics->backend_kv_usage.Add(label);
      backends[i].waiting = &metrics->backend_waiting.Add(label);
      backends[i].ejections = &metrics->backend_ejections.Add(label);
      backends[i].stream_errors = &metrics->backend_stream_errors.Add(label);
      backends[i].usage_corrections = &metrics->backend_usage_corrections.Add(label);
    }
  }

  static std::vector<std::string> names(const remote_backend_options& o) {
    std::vector<std::string> out;
    for (const backend_endpoint& ep : o.backends) out.push_back(ep.url);
    return out;
  }

  // What the pool knows of one backend beyond the router's view; guarded by mutex.
  struct backend_status {
    bool verified = false;   // its info matched the gateway's model since it last answered
    bool was_up = false;     // for logging transitions
    std::string last_problem;  // logged once until it changes
    prometheus::Counter* requests = nullptr;
    prometheus::Gauge* up = nullptr;
    prometheus::Gauge* in_flight = nullptr;
    prometheus::Gauge* kv_usage = nullptr;
    prometheus::Gauge* waiting = nullptr;
    prometheus::Counter* ejections = nullptr;
    prometheus::Counter* stream_errors = nullptr;
    prometheus::Counter* usage_corrections = nullptr;
    // Usage corrections are logged once per usage_correction_log_interval; the others counted.
    std::optional<std::chrono::steady_clock::time_point> usage_logged_at;
    std::int64_t usage_corrections_unlogged = 0;
  };

  const remote_backend_options options;
  const std::string fingerprint;
  const time_source& clock;
  monitoring::gateway_metrics* metrics;
  logger log{"router"};
  std::function<void(const backend_info&)> on_model;
  std::atomic<bool> stopping{false};

  mutable std::mutex mutex;
  backend_router router;               // guarded by mutex
  std::vector<backend_status> backends;  // guarded by mutex
  std::optional<backend_info> model;   // guarded by mutex: what every backend must match

  const backend_endpoint& endpoint(std::size_t b) const { return options.backends[b]; }

  // ---- called by requests; each takes the lock ----

  std::optional<route_choice> choose(const route_keys& keys, std::span<const std::size_t> tried) {
    std::lock_guard lock(mutex);
    auto choice = router.choose(keys, tried);
    if (choice && tried.empty() && metrics != nullptr) {
      metrics->backend_routes.Add({{"reason", std::string(to_string(choice->reason))}}).Increment();
    }
    return choice;
  }

  std::optional<std::int64_t> block_size() const {
    std::lock_guard lock(mutex);
    if (!model) return std::nullopt;
    return model->block_size;
  }

  void dispatched(std::size_t b) {
    std::lock_guard lock(mutex);
    router.dispatched(b);
    if (backends[b].in_flight) backends[b].in_flight->Set(static_cast<double>(router.outstanding(b)));
  }

  void finished(std::size_t b) {
    std::lock_guard lock(mutex);
    router.finished(b);
    if (backends[b].in_flight) backends[b].in_flight->Set(static_cast<double>(router.outstanding(b)));
  }

  void accepted(std::size_t b, const std::optional<affinity_key>& key) {
    std::lock_guard lock(mutex);
    router.succeeded(b);
    if (key) router.remember(*key, b);
    if (backends[b].requests) backends[b].requests->Increment();
  }

  void failed(std::size_t b, std::string_view why) {
    std::lock_guard lock(mutex);
    if (!router.failed(b)) return;
    log.warn("backend {} ejected after {} consecutive failures (latest: {})", endpoint(b).url,
             options.routing.eject_after_failures, why);
    if (backends[b].ejections) backends[b].ejections->Increment();
    if (backends[b].up) backends[b].up->Set(0);
    backends[b].was_up = false;
  }

  void count_retry(std::string_view reason) {
    if (metrics != nullptr) metrics->backend_retries.Add({{"reason", std::string(reason)}}).Increment();
  }

  void count_stream_error(std::size_t b) {
    std::lock_guard lock(mutex);
    if (backends[b].stream_errors) backends[b].stream_errors->Increment();
  }

  // Backend b reported usage the gateway had to correct to `charged` before charging it.
  void corrected_usage(std::size_t b, const backend::token_usage& reported, const backend::token_usage& charged) {
    std::lock_guard lock(mutex);
    backend_status& s = backends[b];
    if (s.usage_corrections) s.usage_corrections->Increment();
    const auto now = clock.monotonic_time();
    if (s.usage_logged_at && now - *s.usage_logged_at < usage_correction_log_interval) {
      ++s.usage_corrections_unlogged;
      return;
    }
    const std::string also = s.usage_corrections_unlogged > 0
                                 ? format(" ({} more since the last such line)", s.usage_corrections_unlogged)
                                 : "";
    log.warn("backend {} reported usage prompt {}, completion {}, cached {}; charged {}, {}, {} instead{}",
             endpoint(b).url, reported.prompt_tokens, reported.completion_tokens, reported.cached_tokens,
             charged.prompt_tokens, charged.completion_tokens, charged.cached_tokens, also);
    s.usage_logged_at = now;
    s.usage_corrections_unlogged = 0;
  }

  std::size_t size() const { return options.backends.size(); }

  // ---- the pollers ----

  // Records what a poll found: healthy or the problem. Logs changes.
  void note(std::size_t b, bool healthy, std::string problem) {
    std::lock_guard lock(mutex);
    router.set_healthy(b, healthy);
    backend_status& s = backends[b];
    const bool up = router.available(b);
    if (s.up) s.up->Set(up ? 1 : 0);
    if (up && !s.was_up) log.info("backend {} is up", endpoint(b).url);
    if (!healthy && !problem.empty() && (s.was_up || problem != s.last_problem)) {
      log.warn("backend {} is down: {}", endpoint(b).url, problem);
    }
    s.was_up = up;
    if (!problem.empty()) s.last_problem = std::move(problem);
  }

  // Whether `info` (from backend b) is the gateway's model; the first match defines it.
  bool verify(std::size_t b, const backend_info& info) {
    std::function<void(const backend_info&)> announce;
    {
      std::lock_guard lock(mutex);
      std::string problem;
      if (info.tokenizer_fingerprint != fingerprint) {
        problem = format("its tokenizer (fingerprint {}) is not the gateway's ({}): it serves another model than "
                         "--model",
                         info.tokenizer_fingerprint, fingerprint);
      } else if (model) {
        problem = info_mismatch(*model, info);
      }
      backend_status& s = backends[b];
      if (!problem.empty()) {
        if (problem != s.last_problem) log.error("backend {} is not used: {}", endpoint(b).url, problem);
        s.last_problem = std::move(problem);
        s.verified = false;
        return false;
      }
      s.verified = true;
      log.info("backend {} serves \"{}\" (edgeinfer {}, context {}, KV blocks of {} tokens)", endpoint(b).url,
               info.model, info.version, info.context_length, info.block_size);
      if (!model) {
        model = info;
        announce = std::move(on_model);
      }
    }
    if (announce) announce(info);
    return true;
  }

  bool is_verified(std::size_t b) const {
    std::lock_guard lock(mutex);
    return backends[b].verified;
  }

  asio::awaitable<void> poll_loop(std::size_t b) {
    const auto self = shared_from_this();
    asio::steady_timer timer(co_await asio::this_coro::executor);
    std::unique_ptr<beast::tcp_stream> connection;
    while (!stopping.load(std::memory_order_acquire)) {
      co_await poll_once(b, connection);
      timer.expires_after(options.poll_interval);
      co_await timer.async_wait(use_tuple);
    }
  }

  asio::awaitable<void> poll_once(std::size_t b, std::unique_ptr<beast::tcp_stream>& connection) {
    const backend_endpoint& ep = endpoint(b);
    if (!connection) {
      const asio::any_io_executor executor = co_await asio::this_coro::executor;
      auto connected = co_await connect_to(executor, ep, options.connect_timeout);
      if (!connected.ok()) {
        note(b, false, connected.error().message());
        {
          std::lock_guard lock(mutex);
          backends[b].verified = false;  // whatever answers next may serve something else
        }
        co_return;
      }
      connection = std::move(connected).value();
    }
    const auto get = [&](std::string_view path) -> asio::awaitable<result<http_reply>> {
      // Held in a variable: `co_return co_await` has miscompiled with GCC 12 (sse_writer.cpp).
      auto reply = co_await round_trip(*connection, make_request(http::verb::get, path, ep, options.internal_token),
                                       options.request_timeout, ep.url);
      co_return reply;
    };
    const auto lost = [&](const status& why) {
      connection.reset();
      {
        std::lock_guard lock(mutex);
        backends[b].verified = false;
      }
      note(b, false, why.message());
    };

    if (!is_verified(b)) {
      auto reply = co_await get(internal_info_path);
      if (!reply.ok()) co_return lost(reply.error());
      if (!reply->keep_alive) connection.reset();
      if (reply->status != 200) {
        note(b, false, format("/internal/v1/info answered {}: {}", reply->status, error_fields(reply->body).message));
        co_return;
      }
      auto info = parse_info(reply->body);
      if (!info.ok()) {
        note(b, false, info.error().message());
        co_return;
      }
      if (!verify(b, *info)) {
        note(b, false, "");
        co_return;
      }
      if (!connection) co_return;  // polled again next time on a new connection
    }

    auto ready = co_await get(readyz_path);
    if (!ready.ok()) co_return lost(ready.error());
    if (!ready->keep_alive) connection.reset();
    if (ready->status != 200) {
      note(b, false, format("/readyz answered {}: {}", ready->status, ready->body));
      co_return;
    }
    if (connection) {
      auto load = co_await get(internal_load_path);
      if (!load.ok()) co_return lost(load.error());
      if (!load->keep_alive) connection.reset();
      if (load->status == 200) {
        if (auto report = parse_load(load->body); report.ok()) {
          std::lock_guard lock(mutex);
          router.report_load(b, *report);
          if (backends[b].kv_usage) backends[b].kv_usage->Set(report->kv_usage);
          if (backends[b].waiting) backends[b].waiting->Set(static_cast<double>(report->waiting));
        } else {
          log.warn("backend {}: {}", ep.url, report.error().message());
        }
      }
    }
    note(b, true, "");
  }
};

// ---- one request ------------------------------------------------------------------------------

namespace {

// How one attempt on one backend went.
struct attempt_outcome {
  enum class kind { accepted, rejected, failed } what = kind::failed;
  backend::submit_error error;  // rejected or failed: why (rejected: with the field at fault)
  std::string_view reason;    // failed: the retry metric's cause (connect, status)
};

// A request on its way through the backends. Lives on the strand of the connection that
// submitted it; the handle and the event reader share it.
class remote_call : public std::enable_shared_from_this<remote_call> {
 public:
  remote_call(std::shared_ptr<remote_backend_pool::impl> pool, asio::any_io_executor strand,
              const backend::generate_request& generate, const backend::grammar::grammar* grammar,
              backend::event_sink sink)
      : pool_(std::move(pool)), strand_(std::move(strand)), sink_(std::move(sink)) {
    prompt_tokens_ = static_cast<std::int64_t>(generate.prompt.size());
    choices_ = generate.n;
    // Every choice may run to max_tokens (capped rather than overflowed).
    max_tokens_ = generate.max_tokens > std::numeric_limits<std::int64_t>::max() / 2 / std::max(generate.n, 1)
                      ? std::numeric_limits<std::int64_t>::max() / 2
                      : generate.max_tokens * std::max(generate.n, 1);
    if (const auto block_size = pool_->block_size()) {
      keys_.prefix =
          prompt_affinity_key(generate.tenant, generate.prompt, *block_size, pool_->options.routing.affinity_blocks);
    }
    keys_.session = session_route_key(generate.tenant, generate.session);
    body_ = encode_generate_request(generate, grammar);
  }
  ~remote_call() { release(); }

  // Tries backends until one accepts the request (ok), the request is refused as the client's
  // fault, or no backend is left to try.
  asio::awaitable<backend::submit_error> place() {
    const auto self = shared_from_this();
    status last = unavailable(format("every backend tried failed ({} attempts at most)", pool_->options.max_attempts));
    bool overloaded = false;
    while (!cancelled_ && static_cast<int>(tried_.size()) < pool_->options.max_attempts) {
      const auto choice = pool_->choose(keys_, tried_);
      if (!choice) break;
      const std::size_t b = choice->backend;
      tried_.push_back(b);
      pool_->dispatched(b);
      current_ = b;
      attempt_outcome outcome = co_await attempt(b);
      if (outcome.what == attempt_outcome::kind::accepted && cancelled_) {
        // The client left while the backend accepted: closing the stream cancels it there.
        if (stream_) stream_->close();
        stream_.reset();
      } else if (outcome.what == attempt_outcome::kind::accepted) {
        pool_->accepted(b, keys_.prefix);
        co_return backend::submit_error{};
      }
      release();
      if (cancelled_) break;
      if (outcome.what == attempt_outcome::kind::rejected) co_return outcome.error;
      // A full queue is a healthy backend under load, not a failure: ejecting it would turn a
      // burst into minutes of "no backend ready".
      const bool full = outcome.error.code() == status_code::resource_exhausted;
      if (!full) pool_->failed(b, outcome.error.message());
      overloaded = overloaded || full;
      last = outcome.error;
      if (static_cast<int>(tried_.size()) < pool_->options.max_attempts) pool_->count_retry(outcome.reason);
    }
    if (cancelled_) co_return status(status_code::cancelled, "the request was cancelled");
    if (tried_.empty()) {
      co_return unavailable(format("no backend is available ({} configured, none ready)", pool_->size()));
    }
    if (overloaded) co_return resource_exhausted(format("every backend tried is overloaded: {}", last.message()));
    co_return unavailable(format("no backend could take the request: {}", last.message()));
  }

  // Relays the accepted stream's events to the sink until the request finishes, is
  // cancelled, or fails; a stream that breaks before its first delta is placed again.
  asio::awaitable<void> relay() {
    const auto self = shared_from_this();
    for (;;) {
      std::string problem;
      bool count_failure = true;
      const pump_result pumped = co_await pump(problem, count_failure);
      if (pumped != pump_result::broken) {
        release();
        co_return;
      }
      const std::size_t b = *current_;
      const std::string url = pool_->endpoint(b).url;
      stream_.reset();
      release();
      if (count_failure) pool_->failed(b, problem);
      if (!started_) {
        // Nothing reached the client yet: the request can start over elsewhere.
        if (static_cast<int>(tried_.size()) < pool_->options.max_attempts) pool_->count_retry("stream");
        status placed = co_await place();
        if (placed.ok()) continue;
        if (cancelled_) co_return;
        // Nothing was served: the client is charged nothing.
        prompt_tokens_ = 0;
        finish_with_error(format("backend {} failed before the request started ({}), and {}", url, problem,
                                 placed.message()));
        co_return;
      }
      pool_->count_stream_error(b);
      finish_with_error(format("backend {} failed during the request: {}", url, problem));
      co_return;
    }
  }

  // From the request handle (destroyed or cancelled), on the strand: closing the connection
  // cancels the request in the backend's engine.
  void cancel() {
    cancelled_ = true;
    if (stream_) stream_->close();
  }

 private:
  enum class pump_result { finished, cancelled, broken };

  asio::awaitable<attempt_outcome> attempt(std::size_t b) {
    const backend_endpoint& ep = pool_->endpoint(b);
    auto connected = co_await connect_to(strand_, ep, pool_->options.connect_timeout);
    if (!connected.ok()) co_return attempt_outcome{attempt_outcome::kind::failed, connected.error(), "connect"};
    stream_ = std::move(connected).value();

    const auto req = make_request(http::verb::post, internal_generate_path, ep, pool_->options.internal_token, body_);
    stream_->expires_after(pool_->options.request_timeout);
    if (auto [ec, n] = co_await http::async_write(*stream_, req, use_tuple); ec) {
      co_return attempt_outcome{attempt_outcome::kind::failed,
                                unavailable(format("{}: sending the request: {}", ep.url, ec.message())), "connect"};
    }
    buffer_.clear();
    parser_ = std::make_unique<http::response_parser<http::buffer_body>>();
    parser_->body_limit(max_stream_body);
    if (auto [ec, n] = co_await http::async_read_header(*stream_, buffer_, *parser_, use_tuple); ec) {
      co_return attempt_outcome{attempt_outcome::kind::failed,
                                unavailable(format("{}: no answer: {}", ep.url, ec.message())), "connect"};
    }
    const unsigned code = parser_->get().result_int();
    if (code == 200) co_return attempt_outcome{attempt_outcome::kind::accepted, status{}, ""};

    // A refusal: read its (small) body for the message.
    std::string body;
    std::array<char, read_chunk> chunk{};
    while (!parser_->is_done() && body.size() < max_reply_body) {
      parser_->get().body().data = chunk.data();
      parser_->get().body().size = chunk.size();
      auto [ec, n] = co_await http::async_read_some(*stream_, buffer_, *parser_, use_tuple);
      if (ec == http::error::need_buffer) ec = {};
      body.append(chunk.data(), chunk.size() - parser_->get().body().size);
      if (ec) break;
    }
    stream_.reset();
    const error_body refused_body = error_fields(body);
    const std::string& message = refused_body.message;
    const std::string& error_code = refused_body.code;
    // The backend's refusal read back with the table it answered from (refusals.h).
    const std::optional<refusal_kind> kind = refusal_kind_of(code, error_code);
    const split_handling handling = kind ? refusal_info(*kind).split : split_handling::backend_failed;
    if (handling == split_handling::final) {
      // The request's own fault (the same on every backend) or its tenant's limit there (its
      // grammar compiles: passed on with its retry-after): no other backend, no mark on this one.
      refusal refused{.kind = *kind, .message = message, .param = refused_body.param};
      if (*kind == refusal_kind::tenant_limit) {
        refused.limit = refused_body.type;
        refused.retry_after = retry_after_of(parser_->get());
      }
      if (*kind == refusal_kind::too_large) {
        refused.message = format("the request is too large for the backends: {}", message);
      }
      co_return attempt_outcome{attempt_outcome::kind::rejected, submit_error_of(refused), ""};
    }
    if (handling == split_handling::next_backend) {
      co_return attempt_outcome{attempt_outcome::kind::failed, resource_exhausted(format("{}: {}", ep.url, message)),
                                "status"};
    }
    co_return attempt_outcome{attempt_outcome::kind::failed,
                              unavailable(format("{} answered {}: {}", ep.url, code, message)), "status"};
  }

  // Reads the current stream's events until its finished event (forwarded), cancellation, or
  // a failure (`problem` says what; `count_failure` is false when the backend ended the
  // request itself because it is shutting down).
  asio::awaitable<pump_result> pump(std::string& problem, bool& count_failure) {
    std::array<char, read_chunk> chunk{};
    std::string pending;
    const auto timeout = pool_->options.stream_idle_timeout;
    while (!parser_->is_done()) {
      parser_->get().body().data = chunk.data();
      parser_->get().body().size = chunk.size();
      stream_->expires_after(timeout);
      auto [ec, n] = co_await http::async_read_some(*stream_, buffer_, *parser_, use_tuple);
      if (cancelled_) co_return pump_result::cancelled;
      if (ec == http::error::need_buffer) ec = {};
      pending.append(chunk.data(), chunk.size() - parser_->get().body().size);
      std::size_t start = 0;
      for (std::size_t end; (end = pending.find('\n', start)) != std::string::npos; start = end + 1) {
        const std::string_view line(pending.data() + start, end - start);
        if (line.empty()) continue;
        auto event = parse_event(line);
        if (!event.ok()) {
          problem = format("a malformed event: {}", event.error().message());
          co_return pump_result::broken;
        }
        if (!event->has_value()) continue;  // heartbeat
        backend::engine_event& e = **event;
        if (std::holds_alternative<backend::admitted_event>(e)) {
          if (admitted_) continue;  // admitted on an earlier backend already
          admitted_ = true;
        } else if (auto* delta = std::get_if<backend::delta_event>(&e)) {
          const auto tokens = static_cast<std::int64_t>(delta->tokens.size());
          if (tokens > max_tokens_ - completion_tokens_) {
            problem = format("it sent more than the {} tokens asked for", max_tokens_);
            co_return pump_result::broken;
          }
          if (delta->index >= choices_) {
            problem = format("it sent choice {} of a request for {}", delta->index, choices_);
            co_return pump_result::broken;
          }
          started_ = true;
          completion_tokens_ += tokens;
        } else if (std::holds_alternative<backend::prompt_logprobs_event>(e)) {
          // Relayed to the client: the request cannot start over elsewhere from here on.
          started_ = true;
        } else if (auto* finished = std::get_if<backend::finished_event>(&e)) {
          if (finished->reason == backend::finish_reason::abort && !started_) {
            // The backend is shutting down and dropped the request before it began.
            problem = "it is shutting down";
            count_failure = false;
            co_return pump_result::broken;
          }
          // Held to the rule the session charges by, here where the backend is known: the
          // correction is counted and logged against it (rate-limited), and charged as corrected.
          const backend::token_usage charged = bounded_usage(finished->usage, {.prompt_tokens = prompt_tokens_,
                                                                               .seen_completion_tokens = completion_tokens_,
                                                                               .max_tokens = max_tokens_});
          if (charged != finished->usage) {
            pool_->corrected_usage(*current_, finished->usage, charged);
            finished->usage = charged;
          }
        }
        const bool last = std::holds_alternative<backend::finished_event>(e);
        sink_(std::move(e));
        if (last) co_return pump_result::finished;
      }
      pending.erase(0, start);
      if (pending.size() > max_event_line) {
        problem = "an event line is too long";
        co_return pump_result::broken;
      }
      if (ec) {
        problem = ec == beast::error::timeout
                      ? format("it sent nothing for {} ms", timeout.count())
                      : format("the connection broke: {}", ec.message());
        co_return pump_result::broken;
      }
    }
    problem = "the stream ended without a finished event";
    co_return pump_result::broken;
  }

  void finish_with_error(std::string message) {
    backend::finished_event finished;
    finished.reason = backend::finish_reason::error;
    finished.usage.prompt_tokens = prompt_tokens_;
    finished.usage.completion_tokens = completion_tokens_;
    finished.error = std::move(message);
    sink_(std::move(finished));
  }

  // The backend holding the request no longer counts it.
  void release() {
    if (current_) pool_->finished(*current_);
    current_.reset();
  }

  std::shared_ptr<remote_backend_pool::impl> pool_;
  asio::any_io_executor strand_;
  backend::event_sink sink_;
  std::string body_;
  route_keys keys_;
  std::int64_t prompt_tokens_ = 0;
  std::int64_t max_tokens_ = 0;         // of all choices together
  std::int32_t choices_ = 1;
  std::int64_t completion_tokens_ = 0;  // relayed to the sink
  std::vector<std::size_t> tried_;
  std::optional<std::size_t> current_;  // the backend counting this request as in flight
  std::unique_ptr<beast::tcp_stream> stream_;
  beast::flat_buffer buffer_;
  std::unique_ptr<http::response_parser<http::buffer_body>> parser_;
  bool cancelled_ = false;
  bool admitted_ = false;  // the admitted event was forwarded
  bool started_ = false;   // a delta was forwarded: the request can no longer move
};

// Cancelling closes the connection to the backend (remote_call::cancel), on the strand that
// owns the handle.
class remote_canceller final : public backend::request_handle::canceller {
 public:
  explicit remote_canceller(std::shared_ptr<remote_call> call) : call_(std::move(call)) {}
  void cancel() override { call_->cancel(); }

 private:
  std::shared_ptr<remote_call> call_;
};

}  // namespace

// ---- the pool ---------------------------------------------------------------------------------

remote_backend_pool::remote_backend_pool(remote_backend_options options, std::string tokenizer_fingerprint,
                                         const time_source& clock, monitoring::gateway_metrics* metrics)
    : impl_(std::make_shared<impl>(std::move(options), std::move(tokenizer_fingerprint), clock, metrics)) {}

remote_backend_pool::~remote_backend_pool() { impl_->stopping.store(true, std::memory_order_release); }

void remote_backend_pool::start(asio::any_io_executor executor, std::function<void(const backend_info&)> on_model) {
  impl_->on_model = std::move(on_model);
  for (std::size_t b = 0; b < impl_->size(); ++b) {
    asio::co_spawn(asio::make_strand(executor), impl_->poll_loop(b), asio::detached);
  }
}

asio::awaitable<result<backend::request_handle, backend::submit_error>> remote_backend_pool::submit(
    backend::generate_request generate, backend::event_sink sink, std::shared_ptr<const backend::grammar::grammar> grammar) {
  const asio::any_io_executor strand = co_await asio::this_coro::executor;
  auto call = std::make_shared<remote_call>(impl_, strand, generate, grammar.get(), std::move(sink));
  backend::submit_error placed = co_await call->place();
  if (!placed.ok()) co_return placed;
  asio::co_spawn(strand, call->relay(), asio::detached);
  co_return backend::request_handle(std::make_unique<remote_canceller>(std::move(call)));
}

std::string remote_backend_pool::readiness() const {
  std::lock_guard lock(impl_->mutex);
  if (!impl_->model) return "connecting";
  return impl_->router.available_count() > 0 ? "ready" : "no_backend";
}

}  // namespace edge::gateway
