// Runs a coroutine to its end on a private io_context, for tests of code that co_awaits.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>

#include <exception>
#include <optional>
#include <utility>

namespace edge::testing {

template <class T>
T await_now(boost::asio::awaitable<T> work) {
  boost::asio::io_context io;
  std::optional<T> out;
  boost::asio::co_spawn(io, std::move(work), [&](std::exception_ptr failure, T value) {
    if (failure) std::rethrow_exception(failure);
    out = std::move(value);
  });
  io.run();
  return std::move(*out);
}

}  // namespace edge::testing
