// Hands a request's events from whoever produces them (the engine thread, or a remote
// backend's stream) to the connection strand that answers the request: the producer's sink
// posts each event to the strand, where it is queued and the waiting handler is woken.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include <chrono>
#include <deque>
#include <memory>

#include "edge/backend/engine/engine.h"

namespace edge::gateway {

// The events of one request. Every member is touched on the connection's strand only (the
// sink posts there).
struct event_relay {
  explicit event_relay(const boost::asio::any_io_executor& executor)
      : wake(executor, std::chrono::steady_clock::time_point::max()) {}
  std::deque<backend::engine_event> events;
  boost::asio::steady_timer wake;  // cancelled when an event arrives
};

// A sink that queues each event on `relay` from `strand` and wakes its handler. Never blocks.
inline backend::event_sink relay_sink(std::shared_ptr<event_relay> relay, boost::asio::any_io_executor strand) {
  return [relay = std::move(relay), strand = std::move(strand)](backend::engine_event event) {
    boost::asio::post(strand, [relay, event = std::move(event)]() mutable {
      relay->events.push_back(std::move(event));
      relay->wake.cancel();
    });
  };
}

}  // namespace edge::gateway
