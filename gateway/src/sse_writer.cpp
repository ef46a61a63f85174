#include "edge/gateway/sse_writer.h"

#include <boost/json/serialize.hpp>
#include <prometheus/gauge.h>

namespace edge::gateway {
namespace {

constexpr std::string_view data_prefix = "data: ";
constexpr std::string_view event_end = "\n\n";
constexpr std::string_view ping_comment = ": ping\n\n";
constexpr std::string_view done_event = "data: [DONE]\n\n";

}  // namespace

sse_writer::~sse_writer() {
  if (open_ && active_streams_ != nullptr) active_streams_->Decrement();
}

asio::awaitable<bool> sse_writer::open(const header_list& extra) {
  http::response_header<> head;
  head.result(http::status::ok);
  head.set(http::field::content_type, "text/event-stream");
  head.set(http::field::cache_control, "no-cache");
  head.set("x-accel-buffering", "no");
  for (const auto& [name, value] : extra) head.set(name, value);
  open_ = true;
  if (active_streams_ != nullptr) active_streams_->Increment();
  last_write_ = std::chrono::steady_clock::now();
  co_return co_await ex_.begin_stream(std::move(head));
}

asio::awaitable<bool> sse_writer::write(std::string_view bytes) {
  last_write_ = std::chrono::steady_clock::now();
  co_return co_await ex_.write_chunk(bytes);
}

asio::awaitable<bool> sse_writer::event(const boost::json::value& data) {
  std::string text(data_prefix);
  text += boost::json::serialize(data);
  text += event_end;
  co_return co_await write(text);
}

asio::awaitable<bool> sse_writer::ping() { co_return co_await write(ping_comment); }

asio::awaitable<bool> sse_writer::done() {
  if (!co_await write(done_event)) co_return false;
  co_return co_await ex_.end_stream();
}

}  // namespace edge::gateway
