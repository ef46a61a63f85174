#include "edge/gateway/http.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/chunk_encode.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/write.hpp>

#include "edge/common/version.h"

namespace edge::gateway {
namespace {

std::vector<std::string> split_path(std::string_view path) {
  std::vector<std::string> segments;
  std::size_t start = 0;
  while (start <= path.size()) {
    const std::size_t slash = path.find('/', start);
    const std::size_t end = slash == std::string_view::npos ? path.size() : slash;
    if (end > start) segments.emplace_back(path.substr(start, end - start));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return segments;
}

bool is_capture(const std::string& segment) {
  return segment.size() >= 2 && segment.front() == '{' && segment.back() == '}';
}

}  // namespace

exchange::exchange(beast::tcp_stream& stream, const request& req, std::string request_id, path_params params,
                   exchange_settings settings)
    : stream_(stream), req_(req), request_id_(std::move(request_id)), params_(std::move(params)),
      settings_(settings) {}

std::string_view exchange::path() const {
  const std::string_view target = req_.target();
  return target.substr(0, target.find('?'));
}

std::string_view exchange::query() const {
  const std::string_view target = req_.target();
  const std::size_t q = target.find('?');
  return q == std::string_view::npos ? std::string_view{} : target.substr(q + 1);
}

std::string_view exchange::path_param(std::string_view name) const {
  for (const auto& [key, value] : params_) {
    if (key == name) return value;
  }
  return {};
}

asio::awaitable<void> exchange::respond(response res) {
  status_code_ = res.result_int();
  keep_alive_ = req_.keep_alive() && !settings_.draining;
  res.version(req_.version());
  res.keep_alive(keep_alive_);
  res.set(http::field::server, "edgeinfer/" + std::string(version_string()));
  res.set("x-request-id", request_id_);
  res.prepare_payload();
  stream_.expires_after(settings_.write_timeout);
  auto [ec, bytes] = co_await http::async_write(stream_, res, asio::as_tuple(asio::use_awaitable));
  if (ec) keep_alive_ = false;
}

asio::awaitable<bool> exchange::begin_stream(http::response_header<> header) {
  http::response<http::empty_body> res(std::move(header));
  status_code_ = res.result_int();
  streaming_ = true;
  chunked_ = req_.version() >= 11;
  // An HTTP/1.0 body without a length ends when the connection closes.
  keep_alive_ = chunked_ && req_.keep_alive() && !settings_.draining;
  res.version(req_.version());
  res.keep_alive(keep_alive_);
  res.set(http::field::server, "edgeinfer/" + std::string(version_string()));
  res.set("x-request-id", request_id_);
  if (chunked_) res.chunked(true);
  http::response_serializer<http::empty_body> serializer(res);
  stream_.expires_after(settings_.write_timeout);
  auto [ec, bytes] = co_await http::async_write_header(stream_, serializer, asio::as_tuple(asio::use_awaitable));
  if (ec) keep_alive_ = false;
  co_return !ec;
}

asio::awaitable<bool> exchange::write_chunk(std::string_view data) {
  if (data.empty()) co_return true;  // an empty chunk would end a chunked body
  stream_.expires_after(settings_.write_timeout);
  beast::error_code ec;
  if (chunked_) {
    std::tie(ec, std::ignore) = co_await asio::async_write(stream_, http::make_chunk(asio::buffer(data)),
                                                           asio::as_tuple(asio::use_awaitable));
  } else {
    std::tie(ec, std::ignore) =
        co_await asio::async_write(stream_, asio::buffer(data), asio::as_tuple(asio::use_awaitable));
  }
  if (ec) keep_alive_ = false;
  co_return !ec;
}

asio::awaitable<bool> exchange::end_stream() {
  if (!chunked_) co_return true;
  stream_.expires_after(settings_.write_timeout);
  auto [ec, bytes] = co_await asio::async_write(stream_, http::make_chunk_last(), asio::as_tuple(asio::use_awaitable));
  if (ec) keep_alive_ = false;
  co_return !ec;
}

asio::awaitable<bool> exchange::watch_disconnect() {
  auto& socket = stream_.socket();
  boost::system::error_code ec;
  std::size_t n = 0;
  for (;;) {
    std::tie(ec) = co_await socket.async_wait(asio::ip::tcp::socket::wait_read, asio::as_tuple(asio::use_awaitable));
    if (ec == asio::error::operation_aborted) {
      // Cancelled because the operation awaited alongside completed first: nothing happened here.
      const asio::cancellation_state cancellation = co_await asio::this_coro::cancellation_state;
      if (cancellation.cancelled() != asio::cancellation_type::none) co_return false;
    }
    if (ec) break;
    // Readable: the end of the stream (or an error), bytes of another request, or nothing at
    // all: the reactor may still deliver a readiness event whose bytes an earlier read already
    // took. So the peek must not block (a blocking one would hold this IO thread and the
    // connection until the client sends again); with nothing there, watch again.
    char byte = 0;
    const bool was_non_blocking = socket.non_blocking();
    socket.non_blocking(true, ec);
    if (!ec) n = socket.receive(asio::buffer(&byte, 1), asio::socket_base::message_peek, ec);
    boost::system::error_code restored;
    socket.non_blocking(was_non_blocking, restored);
    if (ec != asio::error::would_block && ec != asio::error::try_again) break;
  }
  if (!ec && n > 0) co_return false;
  keep_alive_ = false;
  // Nobody is left to answer. 499 is the status proxies log for "client closed request".
  if (status_code_ == 0) status_code_ = client_closed_request;
  co_return true;
}

void router::add(http::verb method, std::string pattern, handler h) {
  auto segments = split_path(pattern);
  routes_.push_back({method, std::move(pattern), std::move(segments), std::move(h)});
}

router::match router::find(http::verb method, std::string_view path) const {
  const auto segments = split_path(path);
  match found;
  found.route = "unmatched";
  for (const auto& route : routes_) {
    if (route.segments.size() != segments.size()) continue;
    path_params params;
    bool same = true;
    for (std::size_t i = 0; i < segments.size() && same; ++i) {
      if (is_capture(route.segments[i])) {
        params.emplace_back(route.segments[i].substr(1, route.segments[i].size() - 2), segments[i]);
      } else {
        same = route.segments[i] == segments[i];
      }
    }
    if (!same) continue;
    if (route.method == method) {
      found.target = &route.h;
      found.route = route.pattern;
      found.params = std::move(params);
      found.allow.clear();
      return found;
    }
    if (!found.allow.empty()) found.allow += ", ";
    found.allow += std::string(http::to_string(route.method));
    found.route = route.pattern;
  }
  return found;
}

}  // namespace edge::gateway
