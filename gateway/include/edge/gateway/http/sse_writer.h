// Server-Sent Events over one exchange:
//
//   HTTP/1.1 200 OK
//   content-type: text/event-stream
//   cache-control: no-cache
//   x-accel-buffering: no            (nginx and similar proxies: pass each event at once)
//
//   data: {json}\n\n                  one per event, each written (flushed) when sent (OpenAI's
//                                    chat and completions streams)
//   event: name\ndata: {json}\n\n     a named event (Anthropic's Messages, OpenAI's Responses)
//   : ping\n\n                        a comment: the heartbeat that keeps idle proxies open
//   data: [DONE]\n\n                  the end of OpenAI's chat and completions streams; the
//                                    others just end
//
// Each call writes one HTTP chunk under the server's write timeout and returns false once the
// client is gone. Counts itself in edgeinfer_active_streams while open. Connection strand only.
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <chrono>
#include <string>
#include <string_view>

#include "edge/gateway/http/http.h"

namespace prometheus {
class Gauge;
}

namespace edge::gateway {

// One event of a stream: a name ("event: <name>" before its data), or none for data alone.
struct named_event {
  std::string name;
  boost::json::object data;
};

class sse_writer {
 public:
  // `active_streams` may be null.
  sse_writer(exchange& ex, prometheus::Gauge* active_streams) : ex_(ex), active_streams_(active_streams) {}
  ~sse_writer();
  sse_writer(const sse_writer&) = delete;
  sse_writer& operator=(const sse_writer&) = delete;

  // The 200 with the event-stream headers added to `head` (which may carry others, such as
  // x-ratelimit-*).
  asio::awaitable<bool> open(http::response_header<> head);
  asio::awaitable<bool> event(const boost::json::value& data);
  asio::awaitable<bool> event(const named_event& event);
  asio::awaitable<bool> ping();
  // data: [DONE], then the end of the body.
  asio::awaitable<bool> done();
  // The end of the body.
  asio::awaitable<bool> end();

  bool is_open() const { return open_; }
  // When the latest bytes went out (the heartbeat is due an interval after it).
  std::chrono::steady_clock::time_point last_write() const { return last_write_; }

 private:
  asio::awaitable<bool> write(std::string_view bytes);

  exchange& ex_;
  prometheus::Gauge* active_streams_;
  bool open_ = false;
  std::chrono::steady_clock::time_point last_write_{};
};

}  // namespace edge::gateway
