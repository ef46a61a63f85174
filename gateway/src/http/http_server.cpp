#include "edge/gateway/http/http_server.h"

#include <sys/resource.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <array>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_set>

#include "edge/common/format.h"
#include "edge/common/log.h"
#include "edge/gateway/http/json_response.h"
#include "edge/monitoring/gateway_metrics.h"

namespace edge::gateway {

using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

namespace {

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
// How often a draining server checks whether its connections have all closed.
constexpr auto drain_poll_interval = 25ms;
// Past the shutdown deadline, how long requests cut short have to write their error and end,
// before their connections are closed by force.
constexpr auto cut_grace = 2s;
// After a forced close, how long to wait for connections to notice before stopping anyway.
constexpr auto forced_close_grace = 2s;
// An error response is followed by a half-close; this long is given to the client to read it.
constexpr auto linger_timeout = 1s;
constexpr std::size_t linger_max_bytes = 1 << 20;
// A connection refused at the cap gets its 503 within this long, or is closed without it.
constexpr auto refusal_write_timeout = 1s;
// Refusals being written at once; past this many, a connection over the cap is closed at once
// (each refusal holds a descriptor for up to a couple of seconds).
constexpr std::size_t max_refusals_in_flight = 64;
// A body up to this size is never refused for the budget of bodies being received: so that
// ordinary requests are still served while large stalled bodies hold the budget. What such
// bodies hold together is bounded by the connection cap.
constexpr std::size_t budget_exempt_body_bytes = 64 * 1024;
// What an idle connection reads first: a small read, so that waiting holds no large buffer.
constexpr std::size_t first_read_bytes = 1024;
constexpr std::size_t default_connection_cap = 4096;
constexpr std::size_t max_reserved_descriptors = 256;
// How long a client told "overloaded" should wait before trying again.
constexpr std::string_view retry_after_seconds = "1";

// Errors that mean the client went away or the connection was closed under us: nothing to
// answer, nobody to answer to.
bool is_disconnect(const beast::error_code& ec) {
  return ec == http::error::end_of_stream || ec == http::error::partial_message || ec == asio::error::eof ||
         ec == asio::error::connection_reset || ec == asio::error::connection_aborted ||
         ec == asio::error::broken_pipe || ec == asio::error::operation_aborted ||
         ec == asio::error::bad_descriptor || ec == asio::error::not_connected;
}

std::string new_request_id() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  static constexpr char hex[] = "0123456789abcdef";
  std::string id = "req_";
  for (int word = 0; word < 2; ++word) {
    std::uint64_t bits = generator();
    for (int i = 0; i < 16; ++i, bits >>= 4) id += hex[bits & 0xF];
  }
  return id;
}

}  // namespace

// Shared between a connection's coroutine and the server's shutdown logic. Every field is
// touched on the connection's strand only; the registry holds the pointer under its mutex.
struct connection_state {
  explicit connection_state(asio::any_io_executor ex) : executor(std::move(ex)) {}
  asio::any_io_executor executor;
  beast::tcp_stream* stream = nullptr;  // valid while alive
  bool alive = true;
  bool busy = false;  // a request's headers have arrived and it is not answered yet
  exchange* current = nullptr;  // the request being answered, once its handler runs
  // The read deadline (see arm_read_deadline): which read it belongs to, and whether it fired.
  std::uint64_t read_generation = 0;
  bool read_timed_out = false;
};

namespace {

// Reads have their own deadline rather than Beast's stream timeout: that one closes the socket
// when it fires, which leaves no way to tell a slow client 408. This one cancels the pending
// read and leaves the socket open. Connection strand only (the timer runs on the strand); the
// handler holds the state, never the stream, once the connection is gone.
void arm_read_deadline(asio::steady_timer& timer, const std::shared_ptr<connection_state>& state,
                       std::chrono::milliseconds timeout) {
  state->read_timed_out = false;
  timer.expires_after(timeout);
  timer.async_wait([state, generation = ++state->read_generation](const beast::error_code& ec) {
    if (ec || !state->alive || state->read_generation != generation) return;
    state->read_timed_out = true;
    beast::error_code ignored;
    state->stream->socket().cancel(ignored);
  });
}

void disarm_read_deadline(asio::steady_timer& timer, connection_state& state) {
  ++state.read_generation;  // a handler already queued with success is now stale
  timer.cancel();
}

// One request body's share of the server-wide budget for bodies being received: charged as
// the body grows, given back when it is complete or the connection ends. Connection strand
// only; the total is shared by every connection.
class body_charge {
 public:
  body_charge(std::atomic<std::size_t>& total, prometheus::Gauge* gauge) : total_(total), gauge_(gauge) {}
  ~body_charge() { update(0); }
  body_charge(const body_charge&) = delete;
  body_charge& operator=(const body_charge&) = delete;

  // Charges `held` bytes in all for this body. Returns the total of every body charged now.
  std::size_t update(std::size_t held) {
    std::size_t total = 0;
    if (held >= charged_) {
      total = total_.fetch_add(held - charged_, std::memory_order_relaxed) + (held - charged_);
      if (gauge_ != nullptr) gauge_->Increment(static_cast<double>(held - charged_));
    } else {
      total = total_.fetch_sub(charged_ - held, std::memory_order_relaxed) - (charged_ - held);
      if (gauge_ != nullptr) gauge_->Decrement(static_cast<double>(charged_ - held));
    }
    charged_ = held;
    return total;
  }

 private:
  std::atomic<std::size_t>& total_;
  prometheus::Gauge* gauge_;
  std::size_t charged_ = 0;
};

using request_parser = http::request_parser<http::string_body>;

struct read_outcome {
  beast::error_code ec;
  bool over_budget = false;   // the body would have taken the budget of bodies being received past its limit
  bool write_failed = false;  // the interim 100 Continue could not be written
};

struct dispatch_outcome {
  bool keep_alive = false;           // the connection may carry another request
  bool client_done_sending = false;  // the end of the client's data has been read
};

// The next request from what `buffer` holds, once the end of the client's data has been read
// (no read would complete): a request cut short by that end is a partial message.
read_outcome parse_buffered(request_parser& parser, beast::flat_buffer& buffer) {
  read_outcome out;
  while (!parser.is_done()) {
    const std::size_t used = parser.put(buffer.data(), out.ec);
    buffer.consume(used);
    if (out.ec == http::error::need_more || (!out.ec && used == 0)) break;
    if (out.ec) return out;
  }
  out.ec = {};
  if (!parser.is_done()) parser.put_eof(out.ec);
  return out;
}

response overloaded_response(std::string_view message) {
  response res = error_response(http::status::service_unavailable, message, "server_error", std::nullopt, "overloaded");
  res.set(http::field::retry_after, retry_after_seconds);
  return res;
}

}  // namespace

struct http_server::impl {
  impl(http_server& owner_, server_options options_, router routes_, monitoring::gateway_metrics* metrics_)
      : owner(owner_),
        options(std::move(options_)),
        routes(std::move(routes_)),
        metrics(metrics_),
        ioc(static_cast<int>(options.threads)),
        control(asio::make_strand(ioc)),
        acceptor(control) {}

  http_server& owner;
  server_options options;
  router routes;
  monitoring::gateway_metrics* metrics;
  asio::io_context ioc;
  asio::strand<asio::io_context::executor_type> control;  // acceptor and shutdown
  tcp::acceptor acceptor;
  logger log{"gateway"};
  logger access_logger{"access"};

  std::mutex connections_mutex;
  std::unordered_set<std::shared_ptr<connection_state>> connections;  // guarded by connections_mutex
  // Connections accepted and not closed yet, and refusals being written (refuse_connection).
  std::atomic<std::size_t> accepted{0};
  std::atomic<std::size_t> refusals{0};
  bool at_cap = false;  // the last connection accepted was refused (control strand only)
  std::atomic<std::size_t> buffered_body_bytes{0};  // every body_charge together

  asio::awaitable<void> accept_loop();
  void refuse_connection(tcp::socket socket);
  asio::awaitable<void> serve_connection(tcp::socket socket);
  // Reads the next request from the connection, its body charged against the budget.
  asio::awaitable<read_outcome> read_request(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                             request_parser& parser, body_charge& charge,
                                             const std::shared_ptr<connection_state>& state,
                                             asio::steady_timer& read_deadline);
  asio::awaitable<dispatch_outcome> dispatch(beast::tcp_stream& stream, beast::flat_buffer& input, const request& req,
                                             connection_state& state, std::chrono::steady_clock::time_point started,
                                             bool input_ended);
  // Answers a request that could not be read, then closes; returns the request id it sent.
  asio::awaitable<std::string> reply_and_close(beast::tcp_stream& stream, response res,
                                               std::chrono::milliseconds write_timeout);
  asio::awaitable<void> drain();
  // Which connections close_connections() ends.
  enum class closing {
    idle,  // those between requests; requests being answered finish first
    cut,   // those between requests, and the requests being answered are cut short
    all,   // every one, at once
  };
  void close_connections(closing which);
  // Waits until every connection closed or `deadline` passed.
  asio::awaitable<void> wait_closed(std::chrono::steady_clock::time_point deadline);
  std::size_t open_connections();
  void record(const std::string& route, unsigned code, std::chrono::steady_clock::time_point started);
  void log_access(std::string_view method, std::string_view path, unsigned code, std::string_view request_id,
                  std::chrono::steady_clock::time_point started, const access_details& details);
};

namespace {

void log_exception(const logger& log, std::string_view where, std::exception_ptr error) {
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    log.error("{}: {}", where, e.what());
  } catch (...) {
    log.error("{}: unknown exception", where);
  }
}

}  // namespace

std::size_t default_max_connections() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return default_connection_cap;
  const auto descriptors = static_cast<std::size_t>(limit.rlim_cur);
  const std::size_t reserved = std::min(max_reserved_descriptors, descriptors / 4);
  return std::clamp<std::size_t>(descriptors - reserved, 1, default_connection_cap);
}

http_server::http_server(server_options options, router routes, monitoring::gateway_metrics* metrics)
    : impl_(std::make_unique<impl>(*this, std::move(options), std::move(routes), metrics)) {
  if (impl_->options.threads == 0) {
    impl_->options.threads = std::max(1u, std::thread::hardware_concurrency());
  }
  if (impl_->options.max_connections == 0) impl_->options.max_connections = default_max_connections();
}

http_server::~http_server() = default;

asio::io_context& http_server::context() { return impl_->ioc; }

status http_server::listen() {
  auto& acceptor = impl_->acceptor;
  const auto& options = impl_->options;
  beast::error_code ec;
  tcp::resolver resolver(impl_->ioc);
  auto endpoints = resolver.resolve(options.host, std::to_string(options.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty()) {
    return invalid_argument(format("cannot resolve listen address {}: {}", options.host, ec.message()));
  }
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  const auto fail = [&](std::string_view step) {
    return unavailable(format("cannot listen on {}:{} ({}): {}", options.host, options.port, step, ec.message()));
  };
  if (acceptor.open(endpoint.protocol(), ec); ec) return fail("open");
  if (acceptor.set_option(asio::socket_base::reuse_address(true), ec); ec) return fail("reuse_address");
  if (acceptor.bind(endpoint, ec); ec) return fail("bind");
  if (acceptor.listen(asio::socket_base::max_listen_connections, ec); ec) return fail("listen");
  asio::co_spawn(impl_->control, impl_->accept_loop(),
                 [this](std::exception_ptr e) { log_exception(impl_->log, "accept loop", e); });
  return {};
}

tcp::endpoint http_server::local_endpoint() const {
  beast::error_code ec;
  return impl_->acceptor.local_endpoint(ec);
}

void http_server::run() {
  std::vector<std::thread> workers;
  workers.reserve(impl_->options.threads - 1);
  for (std::size_t i = 1; i < impl_->options.threads; ++i) {
    workers.emplace_back([this] { impl_->ioc.run(); });
  }
  impl_->ioc.run();
  for (auto& worker : workers) worker.join();
}

void http_server::shutdown() {
  const bool again = draining_.exchange(true, std::memory_order_acq_rel);
  asio::post(impl_->control, [this, again] {
    if (again) {
      impl_->log.warn("second shutdown request: closing {} connections now", impl_->open_connections());
      impl_->close_connections(impl::closing::all);
      return;
    }
    beast::error_code ec;
    impl_->acceptor.close(ec);
    impl_->log.info("shutting down: stopped accepting; {} connections open, waiting up to {}ms",
                    impl_->open_connections(), impl_->options.shutdown_timeout.count());
    impl_->close_connections(impl::closing::idle);
    asio::co_spawn(impl_->control, impl_->drain(),
                   [this](std::exception_ptr e) { log_exception(impl_->log, "drain", e); });
  });
}

std::size_t http_server::impl::open_connections() {
  std::lock_guard lock(connections_mutex);
  return connections.size();
}

void http_server::impl::close_connections(closing which) {
  std::vector<std::shared_ptr<connection_state>> targets;
  {
    std::lock_guard lock(connections_mutex);
    targets.assign(connections.begin(), connections.end());
  }
  for (auto& state : targets) {
    asio::post(state->executor, [state, which] {
      if (!state->alive) return;
      if (state->busy && which == closing::idle) return;
      if (state->busy && which == closing::cut && state->current != nullptr) {
        state->current->cut_short();
        return;
      }
      beast::error_code ec;
      state->stream->socket().shutdown(tcp::socket::shutdown_both, ec);
      state->stream->close();
    });
  }
}

asio::awaitable<void> http_server::impl::wait_closed(std::chrono::steady_clock::time_point deadline) {
  asio::steady_timer timer(control);
  while (open_connections() > 0 && std::chrono::steady_clock::now() < deadline) {
    timer.expires_after(drain_poll_interval);
    co_await timer.async_wait(use_tuple);
  }
}

asio::awaitable<void> http_server::impl::drain() {
  co_await wait_closed(std::chrono::steady_clock::now() + options.shutdown_timeout);
  if (const std::size_t left = open_connections(); left > 0) {
    log.warn("shutdown timeout: {} connections still open: cutting short the requests being answered, closing the rest",
             left);
    close_connections(closing::cut);
    co_await wait_closed(std::chrono::steady_clock::now() + cut_grace);
  }
  if (const std::size_t left = open_connections(); left > 0) {
    log.warn("closing {} connections that did not end within {}ms of being cut short", left,
             std::chrono::duration_cast<std::chrono::milliseconds>(cut_grace).count());
    close_connections(closing::all);
    co_await wait_closed(std::chrono::steady_clock::now() + forced_close_grace);
  }
  log.info("shutdown complete");
  ioc.stop();
}

asio::awaitable<void> http_server::impl::accept_loop() {
  asio::steady_timer backoff(control);
  for (;;) {
    auto [ec, socket] = co_await acceptor.async_accept(asio::make_strand(ioc), use_tuple);
    if (ec) {
      if (!acceptor.is_open() || ec == asio::error::operation_aborted) co_return;
      // Out of file descriptors or similar: wait instead of spinning on the error.
      log.warn("accept failed: {}", ec.message());
      backoff.expires_after(100ms);
      co_await backoff.async_wait(use_tuple);
      continue;
    }
    if (accepted.load(std::memory_order_acquire) >= options.max_connections) {
      if (!at_cap) {
        log.warn("{} connections open, the limit (--max-connections): refusing new ones", options.max_connections);
      }
      at_cap = true;
      refuse_connection(std::move(socket));
      continue;
    }
    if (at_cap) log.info("accepting connections again");
    at_cap = false;
    accepted.fetch_add(1, std::memory_order_acq_rel);
    beast::error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto executor = socket.get_executor();
    asio::co_spawn(executor, serve_connection(std::move(socket)),
                   [this](std::exception_ptr e) { log_exception(log, "connection", e); });
  }
}

void http_server::impl::refuse_connection(tcp::socket socket) {
  if (metrics) metrics->http_overload_rejections.Add({{"limit", "max_connections"}}).Increment();
  // Past the refusals already being written, close at once: a refusal must cost little more
  // than the connection it turns away.
  if (refusals.fetch_add(1, std::memory_order_acq_rel) >= max_refusals_in_flight) {
    refusals.fetch_sub(1, std::memory_order_acq_rel);
    return;
  }
  auto executor = socket.get_executor();
  asio::co_spawn(
      executor,
      [this, socket = std::move(socket)]() mutable -> asio::awaitable<void> {
        beast::tcp_stream stream(std::move(socket));
        const std::string message =
            format("The server is overloaded: {} connections are open, its limit", options.max_connections);
        co_await reply_and_close(stream, overloaded_response(message), refusal_write_timeout);
      },
      [this](std::exception_ptr e) {
        refusals.fetch_sub(1, std::memory_order_acq_rel);
        log_exception(log, "refused connection", e);
      });
}

asio::awaitable<void> http_server::impl::serve_connection(tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  auto state = std::make_shared<connection_state>(stream.get_executor());
  state->stream = &stream;
  {
    std::lock_guard lock(connections_mutex);
    connections.insert(state);
  }
  if (metrics) metrics->open_connections.Increment();
  struct unregister {
    impl& server;
    std::shared_ptr<connection_state>& state;
    ~unregister() {
      state->alive = false;
      if (server.metrics) server.metrics->open_connections.Decrement();
      server.accepted.fetch_sub(1, std::memory_order_acq_rel);
      std::lock_guard lock(server.connections_mutex);
      server.connections.erase(state);
    }
  } guard{*this, state};

  beast::flat_buffer buffer;
  asio::steady_timer read_deadline(stream.get_executor());
  // The end of the client's data was read while a request was answered: what is left of its
  // requests is in the buffer. (Asio reads a socket again only once it signals more, which after
  // its end it never does: a read would wait for its deadline.)
  bool client_done_sending = false;
  for (;;) {
    if (owner.draining()) break;
    if (client_done_sending && buffer.size() == 0) break;
    state->busy = false;
    // A keep-alive connection waiting for its next request holds no read buffer.
    if (buffer.size() == 0) buffer.shrink_to_fit();
    request_parser parser;
    parser.header_limit(static_cast<std::uint32_t>(options.max_header_bytes));
    parser.body_limit(options.max_body_bytes);
    body_charge charge(buffered_body_bytes, metrics ? &metrics->buffered_body_bytes : nullptr);

    read_outcome read;
    if (client_done_sending) {
      read = parse_buffered(parser, buffer);
    } else {
      read = co_await read_request(stream, buffer, parser, charge, state, read_deadline);
    }
    const beast::error_code ec = read.ec;
    const bool over_budget = read.over_budget;
    const auto started = std::chrono::steady_clock::now();
    if (read.write_failed) break;
    if (!ec) state->busy = true;
    if (over_budget) {
      if (metrics) metrics->http_overload_rejections.Add({{"limit", "max_buffered_body_bytes"}}).Increment();
      charge.update(0);
      const std::string id = co_await reply_and_close(
          stream,
          overloaded_response(format("The server is overloaded: request bodies being received hold {}, its limit",
                                     format_bytes(options.max_buffered_body_bytes))),
          options.write_timeout);
      record("unmatched", 503, started);
      log_access("-", "-", 503, id, started, {});
      break;
    }
    if (ec) {
      if (state->read_timed_out) {
        // Bytes of a start line or headers that never completed sit in the buffer unparsed.
        if (parser.got_some() || buffer.size() > 0) {
          const std::string id = co_await reply_and_close(
              stream,
              error_response(http::status::request_timeout, "Timed out reading the request", "invalid_request_error",
                             std::nullopt, "timeout"),
              options.write_timeout);
          record("unmatched", 408, started);
          log_access("-", "-", 408, id, started, {});
        }
        break;
      }
      if (is_disconnect(ec)) break;
      response res;
      if (ec == http::error::header_limit) {
        res = error_response(http::status::request_header_fields_too_large,
                             format("Request headers are larger than {} bytes", options.max_header_bytes),
                             "invalid_request_error", std::nullopt, "headers_too_large");
      } else if (ec == http::error::body_limit) {
        res = error_response(http::status::payload_too_large,
                             format("Request body is larger than the limit of {}", format_bytes(options.max_body_bytes)),
                             "invalid_request_error", std::nullopt, "request_too_large");
      } else {
        res = error_response(http::status::bad_request, format("Malformed HTTP request: {}", ec.message()),
                             "invalid_request_error", std::nullopt, "malformed_request");
      }
      // Once its start line is read, the request's route says how its errors are written (a
      // Content-Length over the limit stops the parser before its headers are done).
      if (!parser.get().target().empty()) {
        const std::string_view target = parser.get().target();
        res = routes.find(parser.get().method(), target.substr(0, target.find('?'))).shaped(std::move(res));
      }
      const unsigned code = res.result_int();
      charge.update(0);
      const std::string id = co_await reply_and_close(stream, std::move(res), options.write_timeout);
      record("unmatched", code, started);
      log_access("-", "-", code, id, started, {});
      break;
    }

    charge.update(0);  // complete: the request owns its body now
    const request req = parser.release();
    const dispatch_outcome answered = co_await dispatch(stream, buffer, req, *state, started, client_done_sending);
    if (!answered.keep_alive) break;
    client_done_sending = answered.client_done_sending;
  }

  if (state->alive) {
    beast::error_code ec;
    stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  }
}

asio::awaitable<read_outcome> http_server::impl::read_request(beast::tcp_stream& stream, beast::flat_buffer& buffer,
                                                             request_parser& parser, body_charge& charge,
                                                             const std::shared_ptr<connection_state>& state,
                                                             asio::steady_timer& read_deadline) {
  // Each phase of reading a request ends at its own deadline, and at the idle timeout if that
  // is shorter.
  const auto header_deadline = std::min(options.header_timeout, options.idle_timeout);
  const auto body_deadline = std::min(options.body_timeout, options.idle_timeout);
  read_outcome out;
  auto& ec = out.ec;
  stream.expires_never();
  if (buffer.size() == 0) {
    // The request's first bytes: the header deadline starts once they are here.
    arm_read_deadline(read_deadline, state, options.idle_timeout);
    std::size_t n = 0;
    std::tie(ec, n) = co_await stream.async_read_some(buffer.prepare(first_read_bytes), use_tuple);
    buffer.commit(n);
    disarm_read_deadline(read_deadline, *state);
    if (ec) co_return out;
  }
  arm_read_deadline(read_deadline, state, header_deadline);
  std::tie(ec, std::ignore) = co_await http::async_read_header(stream, buffer, parser, use_tuple);
  disarm_read_deadline(read_deadline, *state);
  if (ec) co_return out;
  state->busy = true;
  if (parser.get()[http::field::expect] == "100-continue") {
    http::response<http::empty_body> go_on{http::status::continue_, parser.get().version()};
    stream.expires_after(options.write_timeout);
    std::tie(ec, std::ignore) = co_await http::async_write(stream, go_on, use_tuple);
    out.write_failed = static_cast<bool>(ec);
    if (ec) co_return out;
  }
  stream.expires_never();
  arm_read_deadline(read_deadline, state, body_deadline);
  while (!ec && !parser.is_done()) {
    std::tie(ec, std::ignore) = co_await http::async_read_some(stream, buffer, parser, use_tuple);
    // Charged as it arrives: a body that stalls halfway holds what it has sent.
    const std::size_t held = parser.get().body().size();
    out.over_budget = !ec && charge.update(held) > options.max_buffered_body_bytes && held > budget_exempt_body_bytes;
    if (out.over_budget) break;
  }
  disarm_read_deadline(read_deadline, *state);
  co_return out;
}

asio::awaitable<dispatch_outcome> http_server::impl::dispatch(beast::tcp_stream& stream, beast::flat_buffer& input,
                                                              const request& req, connection_state& state,
                                                              std::chrono::steady_clock::time_point started,
                                                              bool input_ended) {
  const std::string_view target = req.target();
  const std::string_view path = target.substr(0, target.find('?'));
  router::match found = routes.find(req.method(), path);

  const auto id_header = req["x-request-id"];
  std::string request_id = is_valid_request_id(id_header) ? std::string(id_header) : new_request_id();
  exchange ex(stream, input, req, std::move(request_id), std::move(found.params),
              {options.write_timeout, owner.draining(), started, options.max_header_bytes, input_ended});
  state.current = &ex;
  struct forget_exchange {
    connection_state& state;
    ~forget_exchange() { state.current = nullptr; }
  } forget{state};

  if (found.target == nullptr) {
    if (!found.allow.empty()) {
      response res = error_response(http::status::method_not_allowed,
                                    format("Method {} is not allowed for {} (allowed: {})", req.method_string(),
                                           path, found.allow),
                                    "invalid_request_error", std::nullopt, "method_not_allowed");
      res.set(http::field::allow, found.allow);
      co_await ex.respond(std::move(res));
    } else {
      co_await ex.respond(error_response(http::status::not_found,
                                         format("Invalid URL ({} {})", req.method_string(), path),
                                         "invalid_request_error", std::nullopt, "unknown_url"));
    }
  } else {
    std::exception_ptr failure;
    try {
      co_await (*found.target)(ex);
    } catch (...) {
      failure = std::current_exception();
    }
    if (failure) log_exception(log, format("handler for {} {}", req.method_string(), found.route), failure);
    if (!ex.responded()) {
      response failed = found.shaped(error_response(http::status::internal_server_error,
                                                    "The server had an error while processing the request",
                                                    "server_error"));
      co_await ex.respond(std::move(failed));
    }
  }
  record(found.route, ex.status_code(), started);
  log_access(req.method_string(), path, ex.status_code(), ex.request_id(), started, ex.access());
  co_return dispatch_outcome{ex.keep_alive(), ex.input_ended()};
}

asio::awaitable<std::string> http_server::impl::reply_and_close(beast::tcp_stream& stream, response res,
                                                                std::chrono::milliseconds write_timeout) {
  std::string request_id = new_request_id();
  res.version(11);
  res.keep_alive(false);
  res.set(http::field::server, "edgeinfer");
  res.set("x-request-id", request_id);
  res.prepare_payload();
  stream.expires_after(write_timeout);
  auto [ec, n] = co_await http::async_write(stream, res, use_tuple);
  if (ec) co_return request_id;
  // Half-close, then read and discard what the client is still sending, so that closing does
  // not reset the connection before the client has read the error.
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  std::array<char, 16 * 1024> sink{};
  std::size_t discarded = 0;
  stream.expires_after(linger_timeout);
  while (discarded < linger_max_bytes) {
    auto [read_ec, read] = co_await stream.async_read_some(asio::buffer(sink), use_tuple);
    if (read_ec) break;
    discarded += read;
  }
  co_return request_id;
}

void http_server::impl::record(const std::string& route, unsigned code,
                               std::chrono::steady_clock::time_point started) {
  if (metrics == nullptr) return;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  metrics->http_requests.Add({{"route", route}, {"code", std::to_string(code)}}).Increment();
  metrics->http_request_duration.Add({{"route", route}}, monitoring::gateway_metrics::duration_buckets())
      .Observe(seconds);
}

void http_server::impl::log_access(std::string_view method, std::string_view path, unsigned code,
                                   std::string_view request_id, std::chrono::steady_clock::time_point started,
                                   const access_details& details) {
  if (!options.access_log || !edge::log::enabled(edge::log::level::info)) return;
  const auto millis = [](double seconds) { return format("{:.1f}", seconds * 1000.0); };
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::vector<edge::log::field> fields;
  fields.reserve(9);
  fields.push_back({"status", std::to_string(code), true});
  fields.push_back({"request_id", std::string(request_id)});
  fields.push_back({"duration_ms", millis(seconds), true});
  if (!details.tenant.empty()) fields.push_back({"tenant", details.tenant});
  const auto count = [&](std::string_view key, const std::optional<std::int64_t>& value) {
    if (value) fields.push_back({key, std::to_string(*value), true});
  };
  count("prompt_tokens", details.prompt_tokens);
  count("completion_tokens", details.completion_tokens);
  count("cached_tokens", details.cached_tokens);
  if (details.ttft_seconds) fields.push_back({"ttft_ms", millis(*details.ttft_seconds), true});
  edge::log::emit(edge::log::level::info, access_logger.component(), format("{} {}", method, path), fields);
}

}  // namespace edge::gateway
