// HTTP vocabulary of the gateway: the request/response types, the per-request exchange a
// handler answers through, and the router that maps (method, path) to handlers.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/verb.hpp>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace edge::gateway {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;

using request = http::request<http::string_body>;
using response = http::response<http::string_body>;

// What a request id (a client's x-request-id, the internal API's "id") may be: 1 to 128
// characters of A-Z, a-z, 0-9, '-', '_', '.' and ':', safe in headers and log lines. Inline,
// so that the internal protocol's parser checks ids without the server.
constexpr bool is_valid_request_id(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.' || c == ':';
    if (!ok) return false;
  }
  return true;
}
inline constexpr std::string_view request_id_rule = "1 to 128 characters of A-Z, a-z, 0-9, '-', '_', '.' and ':'";

// The credentials of an Authorization header's value after "Bearer " (the scheme in any case,
// surrounding spaces trimmed), or empty.
std::string_view bearer_token(std::string_view authorization);

// Path parameters captured by a route pattern such as "/v1/models/{id}".
using path_params = std::vector<std::pair<std::string, std::string>>;

struct exchange_settings {
  std::chrono::milliseconds write_timeout{};
  bool draining = false;  // the server is shutting down: answer, then close the connection
  std::chrono::steady_clock::time_point received;  // when the request's headers were read
  // How many bytes of the requests that follow this one (pipelined) the connection's input
  // buffer may hold while this one is answered: the header limit, so that the next request's
  // headers are never cut short.
  std::size_t max_read_ahead = 16 * 1024;
  // The end of the client's data was read before this request (see exchange::input_ended()).
  bool input_ended = false;
};

// What a handler tells the access log about its request, beyond method, path, status and
// duration. Filled in as the request goes (a client that leaves mid-stream still gets a line
// with what was served until then).
struct access_details {
  std::string tenant;                       // empty: not known
  std::optional<std::int64_t> prompt_tokens;
  std::optional<std::int64_t> completion_tokens;
  std::optional<std::int64_t> cached_tokens;
  std::optional<double> ttft_seconds;       // headers received to the first token generated
};

// One request and the means to answer it. Created and used on its connection's strand only.
class exchange {
 public:
  // The status recorded for a request whose client left before it was answered.
  static constexpr unsigned client_closed_request = 499;

  // `input` is the connection's read buffer, which the next request's parser reads first.
  exchange(beast::tcp_stream& stream, beast::flat_buffer& input, const request& req, std::string request_id,
           path_params params, exchange_settings settings);

  const request& req() const { return req_; }
  std::string_view path() const;   // the target without its query
  std::string_view query() const;  // after '?', or empty
  // The value captured for "{name}", or empty.
  std::string_view path_param(std::string_view name) const;
  const std::string& request_id() const { return request_id_; }
  // Whether the server was shutting down when this request arrived.
  bool server_draining() const { return settings_.draining; }
  std::chrono::steady_clock::time_point received() const { return settings_.received; }
  access_details& access() { return access_; }
  const access_details& access() const { return access_; }

  // Writes a complete response with the common headers (server, x-request-id, connection).
  // At most one response per exchange.
  asio::awaitable<void> respond(response res);

  // A response whose body is written as it is produced (Server-Sent Events and the like),
  // instead of respond(): begin_stream() once with the status and headers, then write_chunk()
  // per piece (each written at once, as one HTTP chunk, under the write timeout), then
  // end_stream(). HTTP/1.1 uses chunked transfer encoding; for HTTP/1.0 the body runs to the
  // connection's close. Each returns false once a write failed: the client is gone, and the
  // connection will not be reused.
  asio::awaitable<bool> begin_stream(http::response_header<> header);
  asio::awaitable<bool> write_chunk(std::string_view data);
  asio::awaitable<bool> end_stream();
  bool streaming() const { return streaming_; }

  // Completes only once the client is gone, so that a handler waiting for something else
  // notices at once that nobody is left to answer; await it with that other operation
  // (awaitable operator ||), which cancels it. Gone means the connection was closed or reset,
  // whatever the client sent before: bytes of pipelined requests are read into the input
  // buffer (up to settings.max_read_ahead bytes there) for the next request's parser, and
  // past that bound the socket is polled for a close without reading.
  //
  // The end of the client's data alone cannot tell a close from a half-close (shutdown of its
  // sending side only, after which it still reads the answer). For an HTTP/1.1 request whose
  // response has not begun, the exchange then sends an interim "100 Continue" (RFC 9110: a
  // client must accept 1xx responses it did not ask for), again every few seconds: a closed
  // socket answers it with a reset, a half-closed one does not. For HTTP/1.0 (which has no
  // interim responses) and for a response already streaming, the end of the client's data
  // counts as gone. Once gone, the exchange counts as answered with client_closed_request
  // unless it was, and the connection is not reused.
  //
  // It completes too once the server cut the request short (was_cut()).
  asio::awaitable<void> watch_disconnect();

  // The server's shutdown deadline passed with this request still being answered: a handler
  // that sees was_cut() ends its answer at once, with an error saying so (a 503, or for a
  // stream begun already its error event and end), and the connection closes after it. Wakes
  // watch_disconnect; a write stalled at that moment fails. Connection strand only.
  void cut_short();
  bool was_cut() const { return cut_; }

  // A stream that ends with an error event: the status that error stands for, which the
  // access log and the metrics record in place of the 200 the stream began with.
  void record_stream_failure(http::status status);

  unsigned status_code() const { return status_code_; }
  bool responded() const { return status_code_ != 0; }
  // Whether the connection may carry another request after this one.
  bool keep_alive() const { return keep_alive_; }
  // Whether watch_disconnect read the end of the client's data: the connection's next request,
  // if any, is whole in the input buffer, and no read on the socket would complete.
  bool input_ended() const { return input_ended_; }

 private:
  // What watch_disconnect saw when it could read no further.
  enum class peer_state { sending, done_sending, gone };
  peer_state poll_peer();
  // Sends what is left of the interim response, without blocking; false once the socket failed.
  bool send_interim();
  // Writes what send_interim left, so that a response never starts inside the interim one.
  asio::awaitable<bool> finish_interim();
  void mark_gone();

  beast::tcp_stream& stream_;
  beast::flat_buffer& input_;
  const request& req_;
  std::string request_id_;
  path_params params_;
  exchange_settings settings_;
  access_details access_;
  unsigned status_code_ = 0;
  bool keep_alive_ = false;
  bool streaming_ = false;
  bool chunked_ = false;
  bool cut_ = false;
  bool peer_done_sending_ = false;  // the client's data has ended (a close or a half-close)
  bool input_ended_ = false;        // and a read returned that end
  std::size_t interim_unsent_ = 0;  // bytes at the end of the interim response not written yet
  std::chrono::steady_clock::time_point next_interim_{};
};

using handler = std::function<asio::awaitable<void>(exchange&)>;
// An error response (OpenAI's shape, as json_response.h writes it) rewritten in a route's own
// API's shape.
using error_shape = response (*)(response);

class router {
 public:
  // `pattern` is made of literal segments and "{name}" captures, e.g. "/v1/models/{id}".
  // `shape`: how the route's API writes errors, which the server's own answers to the route's
  // requests (a body over the limit, a handler that failed) follow too; null: OpenAI's.
  void add(http::verb method, std::string pattern, handler h, error_shape shape = nullptr);

  struct match {
    const handler* target = nullptr;  // null: no route for this method and path
    std::string route;                // the matched pattern, for metrics; "unmatched" if none
    path_params params;
    std::string allow;                // when the path exists for other methods: "GET, POST"
    error_shape shape = nullptr;      // the route's error shape
    // `res` in the route's error shape.
    response shaped(response res) const { return shape != nullptr ? shape(std::move(res)) : res; }
  };
  match find(http::verb method, std::string_view path) const;

 private:
  struct entry {
    http::verb method;
    std::string pattern;
    std::vector<std::string> segments;
    handler h;
    error_shape shape;
  };
  std::vector<entry> routes_;
};

}  // namespace edge::gateway
