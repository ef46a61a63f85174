#include "edge/gateway/http/http.h"

#include <poll.h>

#include <tuple>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
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

using namespace std::chrono_literals;

constexpr auto use_tuple = asio::as_tuple(asio::use_awaitable);
// Sent to a client whose data has ended, to learn whether it still reads (see watch_disconnect).
constexpr std::string_view interim_response = "HTTP/1.1 100 Continue\r\n\r\n";
// How often a connection that cannot be read any further is polled for a close, and how often
// a client that stopped sending gets another interim response.
constexpr auto peer_poll_interval = 50ms;
constexpr auto interim_interval = 5s;

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

bool is_space(char c) { return c == ' ' || c == '\t'; }

}  // namespace

std::string_view bearer_token(std::string_view authorization) {
  constexpr std::string_view bearer_scheme = "bearer";
  while (!authorization.empty() && is_space(authorization.front())) authorization.remove_prefix(1);
  if (authorization.size() <= bearer_scheme.size() || !is_space(authorization[bearer_scheme.size()])) return {};
  for (std::size_t i = 0; i < bearer_scheme.size(); ++i) {
    const char c = authorization[i];
    if ((c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c) != bearer_scheme[i]) return {};
  }
  authorization.remove_prefix(bearer_scheme.size());
  while (!authorization.empty() && is_space(authorization.front())) authorization.remove_prefix(1);
  while (!authorization.empty() && is_space(authorization.back())) authorization.remove_suffix(1);
  return authorization;
}

exchange::exchange(beast::tcp_stream& stream, beast::flat_buffer& input, const request& req, std::string request_id,
                   path_params params, exchange_settings settings)
    : stream_(stream), input_(input), req_(req), request_id_(std::move(request_id)), params_(std::move(params)),
      settings_(settings), peer_done_sending_(settings.input_ended), input_ended_(settings.input_ended) {}

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
  if (!co_await finish_interim()) {
    mark_gone();
    co_return;
  }
  status_code_ = res.result_int();
  keep_alive_ = req_.keep_alive() && !settings_.draining && !cut_;
  res.version(req_.version());
  res.keep_alive(keep_alive_);
  res.set(http::field::server, "edgeinfer/" + std::string(version_string()));
  res.set("x-request-id", request_id_);
  res.prepare_payload();
  stream_.expires_after(settings_.write_timeout);
  auto [ec, bytes] = co_await http::async_write(stream_, res, use_tuple);
  if (ec) keep_alive_ = false;
}

asio::awaitable<bool> exchange::begin_stream(http::response_header<> header) {
  if (!co_await finish_interim()) {
    mark_gone();
    co_return false;
  }
  http::response<http::empty_body> res(std::move(header));
  status_code_ = res.result_int();
  streaming_ = true;
  chunked_ = req_.version() >= 11;
  // An HTTP/1.0 body without a length ends when the connection closes.
  keep_alive_ = chunked_ && req_.keep_alive() && !settings_.draining && !cut_;
  res.version(req_.version());
  res.keep_alive(keep_alive_);
  res.set(http::field::server, "edgeinfer/" + std::string(version_string()));
  res.set("x-request-id", request_id_);
  if (chunked_) res.chunked(true);
  http::response_serializer<http::empty_body> serializer(res);
  stream_.expires_after(settings_.write_timeout);
  auto [ec, bytes] = co_await http::async_write_header(stream_, serializer, use_tuple);
  if (ec) keep_alive_ = false;
  co_return !ec;
}

asio::awaitable<bool> exchange::write_chunk(std::string_view data) {
  if (data.empty()) co_return true;  // an empty chunk would end a chunked body
  stream_.expires_after(settings_.write_timeout);
  beast::error_code ec;
  if (chunked_) {
    std::tie(ec, std::ignore) = co_await asio::async_write(stream_, http::make_chunk(asio::buffer(data)), use_tuple);
  } else {
    std::tie(ec, std::ignore) = co_await asio::async_write(stream_, asio::buffer(data), use_tuple);
  }
  if (ec) keep_alive_ = false;
  co_return !ec;
}

asio::awaitable<bool> exchange::end_stream() {
  if (!chunked_) co_return true;
  stream_.expires_after(settings_.write_timeout);
  auto [ec, bytes] = co_await asio::async_write(stream_, http::make_chunk_last(), use_tuple);
  if (ec) keep_alive_ = false;
  co_return !ec;
}

asio::awaitable<void> exchange::watch_disconnect() {
  auto& socket = stream_.socket();
  asio::steady_timer tick(stream_.get_executor());
  for (;;) {
    // Cancelled because the operation awaited alongside completed first: nothing happened here.
    // (Checked before each wait: a cancellation requested earlier does not reach a new one.)
    if ((co_await asio::this_coro::cancellation_state).cancelled() != asio::cancellation_type::none) co_return;
    if (cut_) co_return;
    if (!peer_done_sending_ && input_.size() < settings_.max_read_ahead) {
      const auto room = input_.prepare(settings_.max_read_ahead - input_.size());
      auto [ec, n] = co_await socket.async_read_some(room, use_tuple);
      input_.commit(n);
      if (ec == asio::error::eof) peer_done_sending_ = input_ended_ = true;
      else if (ec && ec != asio::error::operation_aborted) break;
      // Aborted: cancelled or cut (seen at the top), or the socket was closed under us (the
      // next read says so).
      continue;
    }
    if (peer_done_sending_) {
      const bool can_ask = req_.version() >= 11 && !streaming_ && status_code_ == 0;
      if (!can_ask) break;
      if (std::chrono::steady_clock::now() >= next_interim_ && !send_interim()) break;
    }
    // Polled at once, not only after the tick: a handler woken often (a token at a time)
    // cancels every watch before its tick is due.
    const peer_state peer = poll_peer();
    if (peer == peer_state::gone) break;
    if (peer == peer_state::done_sending && !peer_done_sending_) {
      peer_done_sending_ = true;
      continue;
    }
    tick.expires_after(peer_poll_interval);
    co_await tick.async_wait(use_tuple);
  }
  mark_gone();
}

void exchange::cut_short() {
  if (cut_) return;
  cut_ = true;
  keep_alive_ = false;
  beast::error_code ignored;
  stream_.socket().cancel(ignored);  // the pending read of watch_disconnect completes
}

void exchange::record_stream_failure(http::status status) {
  if (streaming_) status_code_ = static_cast<unsigned>(status);
}

exchange::peer_state exchange::poll_peer() {
  // Asks the kernel what it knows of the connection without taking any of its bytes: POLLRDHUP
  // is the client's FIN, POLLHUP and POLLERR a reset or a connection closed both ways.
  pollfd watched{stream_.socket().native_handle(), POLLRDHUP, 0};
  if (::poll(&watched, 1, 0) <= 0) return peer_done_sending_ ? peer_state::done_sending : peer_state::sending;
  if ((watched.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) return peer_state::gone;
  if ((watched.revents & POLLRDHUP) != 0) return peer_state::done_sending;
  return peer_state::sending;
}

bool exchange::send_interim() {
  if (interim_unsent_ == 0) interim_unsent_ = interim_response.size();
  auto& socket = stream_.socket();
  // Never blocks the strand: what a client that reads nothing leaves unsent goes later.
  boost::system::error_code ec;
  const bool was_non_blocking = socket.non_blocking();
  socket.non_blocking(true, ec);
  std::size_t sent = 0;
  if (!ec) {
    const std::string_view rest = interim_response.substr(interim_response.size() - interim_unsent_);
    sent = socket.send(asio::buffer(rest.data(), rest.size()), 0, ec);
  }
  boost::system::error_code restore_ignored;
  socket.non_blocking(was_non_blocking, restore_ignored);
  if (ec && ec != asio::error::would_block && ec != asio::error::try_again) return false;
  interim_unsent_ -= sent;
  if (interim_unsent_ == 0) next_interim_ = std::chrono::steady_clock::now() + interim_interval;
  return true;
}

asio::awaitable<bool> exchange::finish_interim() {
  if (interim_unsent_ == 0) co_return true;
  const std::string_view rest = interim_response.substr(interim_response.size() - interim_unsent_);
  stream_.expires_after(settings_.write_timeout);
  auto [ec, written] = co_await asio::async_write(stream_, asio::buffer(rest.data(), rest.size()), use_tuple);
  interim_unsent_ = 0;
  co_return !ec;
}

void exchange::mark_gone() {
  keep_alive_ = false;
  // Nobody is left to answer. 499 is the status proxies log for "client closed request".
  if (status_code_ == 0) status_code_ = client_closed_request;
}

void router::add(http::verb method, std::string pattern, handler h, error_shape shape) {
  auto segments = split_path(pattern);
  routes_.push_back({method, std::move(pattern), std::move(segments), std::move(h), shape});
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
      found.shape = route.shape;
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
