#include "edge/gateway/http/sse_writer.h"

#include <boost/json/serialize.hpp>
#include <prometheus/gauge.h>

namespace edge::gateway {
namespace {

constexpr std::string_view name_prefix = "event: ";
constexpr std::string_view data_prefix = "data: ";
constexpr std::string_view event_end = "\n\n";
constexpr std::string_view ping_comment = ": ping\n\n";
constexpr std::string_view done_event = "data: [DONE]\n\n";

}  // namespace

sse_writer::~sse_writer() {
  if (open_ && active_streams_ != nullptr) active_streams_->Decrement();
}

asio::awaitable<bool> sse_writer::open(http::response_header<> head) {
  head.result(http::status::ok);
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  head.set("x-accel-buffering", "no");
  open_ = true;
  if (active_streams_ != nullptr) active_streams_->Increment();
  last_write_ = std::chrono::steady_clock::now();
  const bool ok = co_await ex_.begin_stream(std::move(head));
  co_return ok;
}

asio::awaitable<bool> sse_writer::write(std::string_view bytes) {
  last_write_ = std::chrono::steady_clock::now();
  const bool ok = co_await ex_.write_chunk(bytes);
  co_return ok;
}

asio::awaitable<bool> sse_writer::event(const boost::json::value& data) {
  std::string text(data_prefix);
  text += boost::json::serialize(data);
  text += event_end;
  const bool ok = co_await write(text);
  co_return ok;
}

asio::awaitable<bool> sse_writer::event(const named_event& event) {
  std::string text;
  if (!event.name.empty()) {
    text += name_prefix;
    text += event.name;
    text += '\n';
  }
  text += data_prefix;
  text += boost::json::serialize(event.data);
  text += event_end;
  const bool ok = co_await write(text);
  co_return ok;
}

asio::awaitable<bool> sse_writer::ping() {
  const bool ok = co_await write(ping_comment);
  co_return ok;
}

asio::awaitable<bool> sse_writer::done() {
  // Each result is held in a variable: written as `co_return co_await` after an earlier co_await,
  // this coroutine resumed into an invalid state (SIGILL) when built with GCC 12.
  bool ok = co_await write(done_event);
  if (ok) ok = co_await ex_.end_stream();
  co_return ok;
}

asio::awaitable<bool> sse_writer::end() {
  const bool ok = co_await ex_.end_stream();
  co_return ok;
}

}  // namespace edge::gateway
