// The gateway's HTTP/1.1 server: Boost.Beast over Asio C++20 coroutines.
//
// One io_context runs on `threads` threads; every connection is a coroutine on its own strand,
// so a connection's state is touched by one thread at a time without locks. Each read and
// write has a deadline. A request's headers are limited to 16 KiB and its body to max_body
// bytes; anything malformed or too large is answered with an OpenAI-shaped JSON error.
//
// Hostile or careless clients are bounded: at most max_connections connections (past it a new
// one is answered 503 and closed), at most max_buffered_body_bytes of request bodies being
// received by all of them together (the request that would pass it is answered 503, unless
// its body is small: up to 64 KiB, bounded by the connection cap instead), and each
// request has header_timeout for its headers from its first byte and body_timeout for its body
// (408 past either), so that a client trickling bytes holds neither a connection nor memory
// for long.
//
// Shutdown (shutdown(), or the first SIGINT/SIGTERM the owner forwards): stop accepting,
// /readyz turns 503, idle keep-alive connections close, requests in flight finish and close.
// Requests still being answered after shutdown_timeout are cut short (exchange::cut_short():
// each ends with an error saying so, a stream with its error event), and what is still open
// two seconds after that is closed by force. run() then returns.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "edge/common/status.h"
#include "edge/gateway/http/http.h"

namespace edge::monitoring {
struct gateway_metrics;
}

namespace edge::gateway {

struct server_options {
  std::string host = "127.0.0.1";
  std::uint16_t port = 8080;  // 0: the system picks a free port (see local_endpoint())
  std::size_t threads = 0;    // 0: one per hardware thread
  std::size_t max_header_bytes = 16 * 1024;
  std::size_t max_body_bytes = 4 * 1024 * 1024;
  std::size_t max_connections = 0;  // 0: default_max_connections()
  std::size_t max_buffered_body_bytes = 256 * 1024 * 1024;
  std::chrono::milliseconds idle_timeout{std::chrono::seconds(60)};    // keep-alive, and reading a request
  std::chrono::milliseconds header_timeout{std::chrono::seconds(10)};  // a request's first byte to its headers' end
  std::chrono::milliseconds body_timeout{std::chrono::seconds(30)};    // its headers' end to its body's end
  std::chrono::milliseconds write_timeout{std::chrono::seconds(60)};   // each write
  std::chrono::milliseconds shutdown_timeout{std::chrono::seconds(30)};
  // One info line per request answered (component "access"; JSON fields with --log-format
  // json): method, path, status, request id, duration, and the tenant, tokens and time to
  // first token that the handler reported.
  bool access_log = true;
};

// The connection cap when none is set: 4096, or less where the file-descriptor limit
// (RLIMIT_NOFILE) is lower, keeping a quarter of it (256 at most) for everything else the
// process opens: model files, the state store, Redis, backends.
std::size_t default_max_connections();

class http_server {
 public:
  // `metrics` may be null (no metrics recorded). Both must outlive the server.
  http_server(server_options options, router routes, monitoring::gateway_metrics* metrics);
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  // Binds and listens. Fails with a readable status (address in use, bad host).
  status listen();
  boost::asio::ip::tcp::endpoint local_endpoint() const;

  // Serves on options.threads threads (the caller's among them) until shutdown completes.
  void run();

  // Begins a graceful shutdown; safe from any thread and more than once. A second call while
  // draining closes every connection at once.
  void shutdown();

  bool draining() const { return draining_.load(std::memory_order_acquire); }
  boost::asio::io_context& context();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
  std::atomic<bool> draining_{false};
};

}  // namespace edge::gateway
