// exchange::watch_disconnect on a real loopback connection: it reports a client that closes, a
// client that sends more bytes, and never holds the connection's strand while it watches, even
// when the reactor reports a readiness whose bytes someone else has already read.
#include <doctest/doctest.h>

#include <chrono>
#include <future>
#include <thread>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include "edge/gateway/http.h"

namespace asio = boost::asio;
namespace beast = boost::beast;
using edge::gateway::exchange;
using namespace std::chrono_literals;

namespace {

// A server-side stream (on a strand of a 2-thread io_context) connected to a blocking client.
struct connection {
  asio::io_context ioc;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(ioc);
  std::thread threads[2];
  asio::io_context client_ioc;
  asio::ip::tcp::socket client{client_ioc};
  beast::tcp_stream stream{asio::make_strand(ioc)};
  edge::gateway::request req;
  exchange ex{stream, req, "req_test", {}, {}};

  connection() {
    asio::ip::tcp::acceptor acceptor(ioc, {asio::ip::make_address("127.0.0.1"), 0});
    client.connect(acceptor.local_endpoint());
    acceptor.accept(stream.socket());
    for (auto& t : threads) t = std::thread([this] { ioc.run(); });
  }
  ~connection() {
    work.reset();
    ioc.stop();
    for (auto& t : threads) t.join();
  }

  // Runs fn on the connection's strand and waits for it.
  template <class F>
  void on_strand(F fn) {
    std::promise<void> done;
    asio::post(stream.get_executor(), [&] {
      fn();
      done.set_value();
    });
    done.get_future().wait();
  }

  std::future<bool> watch() {
    auto result = std::make_shared<std::promise<bool>>();
    auto future = result->get_future();
    asio::co_spawn(stream.get_executor(), ex.watch_disconnect(), [result](std::exception_ptr e, bool closed) {
      if (e) result->set_exception(e);
      else result->set_value(closed);
    });
    on_strand([] {});  // the coroutine has started and waits for the socket
    return future;
  }
};

}  // namespace

TEST_CASE("watch_disconnect reports a client that closes the connection") {
  connection c;
  auto watched = c.watch();
  c.client.close();
  REQUIRE(watched.wait_for(5s) == std::future_status::ready);
  CHECK(watched.get());
  CHECK(c.ex.status_code() == exchange::client_closed_request);
  CHECK_FALSE(c.ex.keep_alive());
}

TEST_CASE("watch_disconnect reports bytes of another request without reading them") {
  connection c;
  auto watched = c.watch();
  asio::write(c.client, asio::buffer("G", 1));
  REQUIRE(watched.wait_for(5s) == std::future_status::ready);
  CHECK_FALSE(watched.get());
  // The byte is still there for the next request's parser.
  char byte = 0;
  c.on_strand([&] { c.stream.socket().receive(asio::buffer(&byte, 1)); });
  CHECK(byte == 'G');
}

TEST_CASE("a readiness whose bytes were already read does not hold the connection's strand") {
  connection c;
  auto watched = c.watch();
  // On the strand: the client sends a byte, the reactor (the other thread) sees it and queues the
  // watcher's wake-up behind this handler, which then reads the byte itself. The watcher wakes
  // to a socket with nothing to read.
  c.on_strand([&] {
    asio::write(c.client, asio::buffer("x", 1));
    std::this_thread::sleep_for(100ms);
    char byte = 0;
    c.stream.socket().receive(asio::buffer(&byte, 1));
  });
  // The strand must stay free for the request's other work (its events, its writes).
  std::promise<void> ran;
  asio::post(c.stream.get_executor(), [&] { ran.set_value(); });
  CHECK(ran.get_future().wait_for(5s) == std::future_status::ready);
  CHECK(watched.wait_for(0s) == std::future_status::timeout);  // still watching
  c.client.close();
  REQUIRE(watched.wait_for(5s) == std::future_status::ready);
  CHECK(watched.get());
}
