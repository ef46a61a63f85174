#include "edge/bench/client.h"

#include <sys/socket.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <array>
#include <optional>
#include <tuple>
#include <cerrno>

#include "edge/common/format.h"

// GCC 12 reports a mismatched operator delete in the frames of Asio's awaitables: Asio
// allocates and frees them with its own matching pair, which the warning's inlining-based
// analysis does not see through (a known false positive; the gateway does the same).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace edge::bench {
namespace {

namespace http = beast::http;
namespace json = boost::json;
using clock = std::chrono::steady_clock;
constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);

// The header naming a request's session, which a split gateway routes by (as the gateway reads it).
constexpr std::string_view session_header = "x-session-affinity";
// An error body is read for its message, up to this much.
constexpr std::size_t max_error_body = 64 * 1024;
// A streamed response may run long; this only guards against a runaway server.
constexpr std::uint64_t max_stream_body = std::uint64_t{1} << 32;
constexpr std::size_t read_chunk = 16 * 1024;

double seconds(clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string failure_category(const beast::error_code& ec) {
  return ec == beast::error::timeout ? "timeout" : "connection";
}

// The message of an OpenAI-shaped error body, else the body's start.
std::string error_message(std::string_view body) {
  boost::system::error_code ec;
  const json::value v = json::parse(body, ec);
  if (!ec && v.is_object()) {
    if (const json::value* error = v.as_object().if_contains("error")) {
      if (error->is_object()) {
        if (const json::value* message = error->as_object().if_contains("message"); message && message->is_string()) {
          return std::string(message->as_string());
        }
      } else if (error->is_string()) {
        return std::string(error->as_string());
      }
    }
  }
  constexpr std::size_t shown = 200;
  return std::string(body.substr(0, shown));
}

// Whether an idle keep-alive connection is still usable: the server may have closed it (idle
// timeout) while it sat in the pool, which a non-blocking peek sees as end of stream.
bool still_open(beast::tcp_stream& stream) {
  std::array<char, 1> byte{};
  const ssize_t n = ::recv(stream.socket().native_handle(), byte.data(), byte.size(), MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

result<server_url> parse_base_url(std::string_view url) {
  constexpr std::string_view http_scheme = "http://";
  if (url.starts_with("https://")) {
    return invalid_argument(format("--base-url {}: https is not supported; point the benchmark at the server's "
                                   "plain HTTP address",
                                   url));
  }
  if (!url.starts_with(http_scheme)) {
    return invalid_argument(format("--base-url {}: expected http://HOST[:PORT][/PATH]", url));
  }
  std::string_view rest = url.substr(http_scheme.size());
  const std::size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string path = slash == std::string_view::npos ? "" : std::string(rest.substr(slash));
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (path.ends_with("/v1")) path.resize(path.size() - 3);
  server_url out;
  out.base_path = path;
  if (authority.starts_with('[')) {  // [::1]:8080
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos) return invalid_argument(format("--base-url {}: unclosed '['", url));
    out.host = std::string(authority.substr(1, close - 1));
    authority = authority.substr(close + 1);
    out.port = authority.starts_with(':') ? std::string(authority.substr(1)) : "80";
  } else {
    const std::size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    out.port = colon == std::string_view::npos ? "80" : std::string(authority.substr(colon + 1));
  }
  if (out.host.empty()) return invalid_argument(format("--base-url {}: no host", url));
  if (out.port.empty() || out.port.find_first_not_of("0123456789") != std::string::npos || out.port.size() > 5 ||
      std::stoi(out.port) > 65535) {
    return invalid_argument(format("--base-url {}: \"{}\" is not a port", url, out.port));
  }
  return out;
}

std::string request_path(const server_url& url, api_endpoint endpoint) {
  return url.base_path + (endpoint == api_endpoint::completions ? "/v1/completions" : "/v1/chat/completions");
}

namespace {

// One exchange with the server outside a run (its model list, its tokenizer): the answer's JSON
// when it is a 200, else nothing. Gives up after a few seconds, whatever the server does.
std::optional<json::value> ask_server(const client_options& options, http::verb method, const std::string& path,
                                      std::string body) {
  std::optional<json::value> out;
  asio::io_context context;
  const auto exchange = [&]() -> asio::awaitable<void> {
    asio::ip::tcp::resolver resolver(context);
    beast::tcp_stream stream(context);
    auto [resolve_ec, endpoints] = co_await resolver.async_resolve(options.url.host, options.url.port,
                                                                   asio::as_tuple(asio::use_awaitable));
    if (resolve_ec) co_return;
    auto [connect_ec, endpoint] = co_await stream.async_connect(endpoints, asio::as_tuple(asio::use_awaitable));
    if (connect_ec) co_return;
    http::request<http::string_body> req{method, options.url.base_path + path, 11};
    req.set(http::field::host, options.url.host);
    if (!options.api_key.empty()) req.set(http::field::authorization, "Bearer " + options.api_key);
    if (!body.empty()) {
      req.set(http::field::content_type, "application/json");
      req.body() = std::move(body);
      req.prepare_payload();
    }
    auto [write_ec, written] = co_await http::async_write(stream, req, asio::as_tuple(asio::use_awaitable));
    if (write_ec) co_return;
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::size_t{1} << 22);
    auto [read_ec, read] = co_await http::async_read(stream, buffer, parser, asio::as_tuple(asio::use_awaitable));
    if (read_ec || parser.get().result() != http::status::ok) co_return;
    boost::system::error_code parse_ec;
    json::value answer = json::parse(parser.get().body(), parse_ec);
    if (!parse_ec) out = std::move(answer);
  };
  asio::co_spawn(context, exchange, asio::detached);
  context.run_for(std::chrono::seconds(5));
  return out;
}

}  // namespace

std::optional<std::int64_t> served_context(const client_options& options) {
  const auto models = ask_server(options, http::verb::get, "/v1/models", "");
  const json::object* list = models ? models->if_object() : nullptr;
  const json::value* data = list != nullptr ? list->if_contains("data") : nullptr;
  if (data == nullptr || !data->is_array()) return std::nullopt;
  for (const json::value& entry : data->as_array()) {
    const json::object* model = entry.if_object();
    if (model == nullptr) continue;
    const json::value* id = model->if_contains("id");
    const json::value* length = model->if_contains("max_model_len");
    if (id == nullptr || !id->is_string() || id->as_string() != options.model) continue;
    if (length != nullptr && length->is_int64() && length->as_int64() > 0) return length->as_int64();
  }
  return std::nullopt;
}

std::optional<std::int64_t> served_token_count(const client_options& options, const std::string& text) {
  const auto counted = ask_server(options, http::verb::post, "/tokenize",
                                  json::serialize(json::object{{"model", options.model}, {"prompt", text}}));
  const json::object* o = counted ? counted->if_object() : nullptr;
  if (o == nullptr) return std::nullopt;
  if (const json::value* count = o->if_contains("count"); count != nullptr && count->is_int64()) return count->as_int64();
  if (const json::value* tokens = o->if_contains("tokens"); tokens != nullptr && tokens->is_array()) {
    return static_cast<std::int64_t>(tokens->as_array().size());
  }
  return std::nullopt;
}

std::string request_body(const client_options& options, const request_spec& spec) {
  json::object body;
  body["model"] = options.model;
  if (options.endpoint == api_endpoint::completions) {
    body["prompt"] = completions_prompt(spec);
  } else {
    json::array messages;
    if (spec.messages.empty()) {
      messages.push_back(json::object{{"role", "user"}, {"content", spec.prompt}});
    } else {
      for (const chat_message& m : spec.messages) messages.push_back(json::object{{"role", m.role}, {"content", m.content}});
    }
    body["messages"] = std::move(messages);
  }
  body["max_tokens"] = spec.max_tokens;
  body["temperature"] = options.temperature;
  body["stream"] = true;
  body["stream_options"] = json::object{{"include_usage", true}};
  if (options.ignore_eos) body["ignore_eos"] = true;
  return json::serialize(body);
}

void sse_parser::feed(std::string_view bytes, const std::function<void(std::string_view data)>& on_data) {
  pending_.append(bytes);
  std::size_t start = 0;
  for (;;) {
    // An event ends at a blank line; servers may use "\n" or "\r\n" line ends.
    std::size_t end = std::string::npos;
    std::size_t separator = 0;
    for (std::size_t i = start; i + 1 < pending_.size(); ++i) {
      if (pending_[i] != '\n') continue;
      if (pending_[i + 1] == '\n') { end = i; separator = 2; break; }
      if (pending_[i + 1] == '\r' && i + 2 < pending_.size() && pending_[i + 2] == '\n') { end = i; separator = 3; break; }
    }
    if (end == std::string::npos) break;
    std::string_view event(pending_.data() + start, end - start);
    std::string data;
    bool has_data = false;
    while (!event.empty()) {
      const std::size_t nl = event.find('\n');
      std::string_view line = event.substr(0, nl);
      event = nl == std::string_view::npos ? std::string_view{} : event.substr(nl + 1);
      if (line.ends_with('\r')) line.remove_suffix(1);
      if (!line.starts_with("data:")) continue;  // comments (": ping"), event:, id:, retry:
      line.remove_prefix(5);
      if (line.starts_with(' ')) line.remove_prefix(1);
      if (has_data) data += '\n';
      data.append(line);
      has_data = true;
    }
    if (has_data) on_data(data);
    start = end + separator;
  }
  pending_.erase(0, start);
}

connection_pool::connection_pool(asio::any_io_executor executor, server_url url)
    : executor_(std::move(executor)), url_(std::move(url)) {}

asio::awaitable<std::unique_ptr<beast::tcp_stream>> connection_pool::acquire(clock::time_point deadline,
                                                                             beast::error_code& error, bool fresh,
                                                                             bool& reused) {
  reused = false;
  while (!fresh && !idle_.empty()) {
    std::unique_ptr<beast::tcp_stream> stream = std::move(idle_.back());
    idle_.pop_back();
    if (still_open(*stream)) {
      reused = true;
      co_return stream;
    }
  }
  if (!resolved_) {
    asio::ip::tcp::resolver resolver(executor_);
    auto [ec, results] = co_await resolver.async_resolve(url_.host, url_.port, use_tuple);
    if (ec) {
      error = ec;
      co_return nullptr;
    }
    endpoints_ = std::move(results);
    resolved_ = true;
  }
  auto stream = std::make_unique<beast::tcp_stream>(executor_);
  stream->expires_at(deadline);
  auto [ec, endpoint] = co_await stream->async_connect(endpoints_, use_tuple);
  if (ec) {
    error = ec;
    co_return nullptr;
  }
  stream->socket().set_option(asio::ip::tcp::no_delay(true));
  ++opened_;
  co_return stream;
}

void connection_pool::release(std::unique_ptr<beast::tcp_stream> stream) { idle_.push_back(std::move(stream)); }

asio::awaitable<request_record> send_request(connection_pool& pool, const client_options& options,
                                             const request_spec& spec, clock::time_point origin) {
  request_record rec;
  rec.expected_prompt_tokens = spec.expected_prompt_tokens;
  rec.turn = spec.turn;
  const clock::time_point started = clock::now();
  rec.start_s = seconds(started - origin);
  const clock::time_point deadline = started + options.timeout;
  const auto fail = [&](std::string category, std::string detail) {
    rec.success = false;
    rec.error = std::move(category);
    rec.error_detail = std::move(detail);
    rec.latency_s = seconds(clock::now() - started);
    return rec;
  };

  http::request<http::string_body> req{http::verb::post, request_path(options.url, options.endpoint), 11};
  req.set(http::field::host, options.url.host + ":" + options.url.port);
  req.set(http::field::user_agent, "edgeinfer-bench");
  req.set(http::field::content_type, "application/json");
  req.set(http::field::accept, "text/event-stream");
  if (!options.api_key.empty()) req.set(http::field::authorization, "Bearer " + options.api_key);
  if (!spec.session.empty()) req.set(session_header, spec.session);
  req.keep_alive(true);
  req.body() = request_body(options, spec);
  req.prepare_payload();

  std::unique_ptr<beast::tcp_stream> stream;
  beast::flat_buffer buffer;
  std::optional<http::response_parser<http::buffer_body>> reading;
  for (bool fresh = false;; fresh = true) {
    beast::error_code ec;
    bool reused = false;
    stream = co_await pool.acquire(deadline, ec, fresh, reused);
    if (!stream) co_return fail(failure_category(ec), format("connect: {}", ec.message()));
    stream->expires_at(deadline);
    buffer.clear();
    reading.emplace();
    reading->body_limit(max_stream_body);
    auto [write_ec, written] = co_await http::async_write(*stream, req, use_tuple);
    beast::error_code read_ec;
    if (!write_ec) std::tie(read_ec, std::ignore) = co_await http::async_read_header(*stream, buffer, *reading, use_tuple);
    if (!write_ec && !read_ec) break;
    const bool closed_before_answering = !reading->got_some() && (write_ec || read_ec == http::error::end_of_stream ||
                                                                read_ec == asio::error::connection_reset);
    if (reused && closed_before_answering) continue;
    if (write_ec) co_return fail(failure_category(write_ec), format("sending the request: {}", write_ec.message()));
    co_return fail(failure_category(read_ec), format("reading the response: {}", read_ec.message()));
  }
  http::response_parser<http::buffer_body>& parser = *reading;

  std::array<char, read_chunk> chunk{};
  const unsigned status_code = parser.get().result_int();
  if (status_code != 200) {
    std::string body;
    while (!parser.is_done() && body.size() < max_error_body) {
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      auto [read_ec, n] = co_await http::async_read_some(*stream, buffer, parser, use_tuple);
      if (read_ec == http::error::need_buffer) read_ec = {};
      body.append(chunk.data(), chunk.size() - parser.get().body().size);
      if (read_ec) break;
    }
    if (parser.is_done() && parser.keep_alive()) pool.release(std::move(stream));
    co_return fail(format("http_{}", status_code), error_message(body));
  }

  sse_parser events;
  bool done = false;
  std::optional<std::string> stream_error;
  clock::time_point last_delta{};
  clock::time_point now{};
  const bool chat = options.endpoint == api_endpoint::chat_completions;
  const auto on_event = [&](std::string_view data) {
    if (done || stream_error) return;
    if (data == "[DONE]") {
      done = true;
      rec.latency_s = seconds(now - started);
      return;
    }
    boost::system::error_code parse_ec;
    const json::value chunk_json = json::parse(data, parse_ec);
    if (parse_ec || !chunk_json.is_object()) {
      stream_error = format("a chunk is not a JSON object: {}", data.substr(0, 200));
      return;
    }
    const json::object& o = chunk_json.as_object();
    if (o.contains("error")) {
      stream_error = error_message(data);
      return;
    }
    if (const json::value* usage = o.if_contains("usage"); usage && usage->is_object()) {
      const json::object& u = usage->as_object();
      if (const json::value* p = u.if_contains("prompt_tokens"); p && p->is_int64()) rec.usage_prompt_tokens = p->as_int64();
      if (const json::value* c = u.if_contains("completion_tokens"); c && c->is_int64()) {
        rec.usage_completion_tokens = c->as_int64();
      }
      if (const json::value* details = u.if_contains("prompt_tokens_details"); details && details->is_object()) {
        if (const json::value* cached = details->as_object().if_contains("cached_tokens"); cached && cached->is_int64()) {
          rec.usage_cached_tokens = cached->as_int64();
        }
      }
    }
    const json::value* choices = o.if_contains("choices");
    if (choices == nullptr || !choices->is_array() || choices->as_array().empty()) return;
    const json::object* first = choices->as_array()[0].if_object();
    if (first == nullptr) return;
    const json::value* text = nullptr;
    if (chat) {
      if (const json::value* delta = first->if_contains("delta"); delta && delta->is_object()) {
        text = delta->as_object().if_contains("content");
      }
    } else {
      text = first->if_contains("text");
    }
    if (text == nullptr || !text->is_string() || text->as_string().empty()) return;
    if (options.keep_output_text) rec.output_text.append(text->as_string());
    if (rec.content_deltas == 0) {
      rec.ttft_s = seconds(now - started);
    } else {
      rec.itl_s.push_back(seconds(now - last_delta));
    }
    last_delta = now;
    ++rec.content_deltas;
  };

  while (!parser.is_done()) {
    parser.get().body().data = chunk.data();
    parser.get().body().size = chunk.size();
    auto [read_ec, n] = co_await http::async_read_some(*stream, buffer, parser, use_tuple);
    if (read_ec == http::error::need_buffer) read_ec = {};
    now = clock::now();
    events.feed(std::string_view(chunk.data(), chunk.size() - parser.get().body().size), on_event);
    if (stream_error) co_return fail("stream_error", *stream_error);
    if (read_ec) {
      if (done) break;  // everything needed arrived; the connection is not reused
      co_return fail(failure_category(read_ec),
                     format("the stream broke after {} deltas: {}", rec.content_deltas, read_ec.message()));
    }
  }
  if (!done) co_return fail("incomplete_stream", format("the response ended after {} deltas without data: [DONE]",
                                                        rec.content_deltas));
  if (rec.content_deltas == 0) rec.ttft_s = rec.latency_s;
  rec.success = true;
  if (parser.is_done() && parser.keep_alive()) pool.release(std::move(stream));
  co_return rec;
}

}  // namespace edge::bench
