// exchange::watch_disconnect on a real loopback connection: it reports a client that closes or
// resets, whatever it sent before (bytes of pipelined requests are kept for the next request's
// parser, up to the read-ahead bound and past it), tells a half-closed HTTP/1.1 client (which
// still gets its answer) from a closed one, never holds the connection's strand, and ends when
// the server cuts the request short.
#include <doctest/doctest.h>

#include <sys/socket.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>

#include "edge/gateway/http/http.h"

namespace asio = boost::asio;
namespace beast = boost::beast;
using edge::gateway::exchange;
using namespace std::chrono_literals;

namespace {

constexpr std::string_view interim = "HTTP/1.1 100 Continue\r\n\r\n";

// A server-side stream (on a strand of a 2-thread io_context) connected to a blocking client,
// and an exchange for a request of HTTP `version` on it.
struct connection {
  asio::io_context ioc;
  asio::executor_work_guard<asio::io_context::executor_type> work = asio::make_work_guard(ioc);
  std::thread threads[2];
  asio::io_context client_ioc;
  asio::ip::tcp::socket client{client_ioc};
  beast::tcp_stream stream{asio::make_strand(ioc)};
  beast::flat_buffer input;
  edge::gateway::request req;
  std::unique_ptr<exchange> ex;
  asio::cancellation_signal stop_watching;

  explicit connection(unsigned version = 11, std::size_t read_ahead = 16 * 1024) {
    req.version(version);
    edge::gateway::exchange_settings settings;
    settings.write_timeout = 5s;
    settings.received = std::chrono::steady_clock::now();
    settings.max_read_ahead = read_ahead;
    ex = std::make_unique<exchange>(stream, input, req, "req_test", edge::gateway::path_params{}, settings);
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

  // Runs a coroutine of the exchange on the strand; the future is ready when it has finished.
  std::future<void> spawn(asio::awaitable<void> work_to_do, bool cancellable = false) {
    auto result = std::make_shared<std::promise<void>>();
    auto future = result->get_future();
    const auto done = [result](std::exception_ptr e) {
      if (e) result->set_exception(e);
      else result->set_value();
    };
    if (cancellable) {
      asio::co_spawn(stream.get_executor(), std::move(work_to_do),
                     asio::bind_cancellation_slot(stop_watching.slot(), done));
    } else {
      asio::co_spawn(stream.get_executor(), std::move(work_to_do), done);
    }
    on_strand([] {});  // the coroutine has started and waits
    return future;
  }

  std::future<void> watch() { return spawn(ex->watch_disconnect(), /*cancellable=*/true); }
  // What the operation awaited alongside the watch does when it completes first.
  void cancel_watch() { on_strand([&] { stop_watching.emit(asio::cancellation_type::terminal); }); }

  std::string buffered() {
    std::string text;
    on_strand([&] { text = beast::buffers_to_string(input.data()); });
    return text;
  }

  // Answers through the exchange with `status` and `body`; returns what the client received.
  std::string answer(boost::beast::http::status status, std::string body) {
    edge::gateway::response res{status, 11};
    res.body() = std::move(body);
    auto answered = spawn(ex->respond(std::move(res)));
    REQUIRE(answered.wait_for(5s) == std::future_status::ready);
    return receive(4096, 500ms);
  }

  // What the client receives within `timeout`, up to `want` bytes.
  std::string receive(std::size_t want, std::chrono::milliseconds timeout) {
    std::string got;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (got.size() < want && std::chrono::steady_clock::now() < deadline) {
      if (client.available() == 0) {
        std::this_thread::sleep_for(5ms);
        continue;
      }
      char bytes[4096];
      got.append(bytes, client.read_some(asio::buffer(bytes, std::min(sizeof(bytes), want - got.size()))));
    }
    return got;
  }
};

asio::awaitable<void> begin_stream(exchange& ex, boost::beast::http::response_header<> head) {
  co_await ex.begin_stream(std::move(head));
}

bool finished(std::future<void>& f, std::chrono::milliseconds within) {
  return f.wait_for(within) == std::future_status::ready;
}

}  // namespace

TEST_CASE("watch_disconnect reports a client that closes the connection") {
  connection c;
  auto watched = c.watch();
  c.client.close();
  REQUIRE(finished(watched, 5s));
  watched.get();
  CHECK(c.ex->status_code() == exchange::client_closed_request);
  CHECK_FALSE(c.ex->keep_alive());
}

TEST_CASE("watch_disconnect reports a client that resets the connection") {
  connection c;
  auto watched = c.watch();
  c.client.set_option(asio::socket_base::linger(true, 0));
  c.client.close();
  REQUIRE(finished(watched, 5s));
  CHECK(c.ex->status_code() == exchange::client_closed_request);
}

TEST_CASE("a client that sends a byte of another request and closes is still reported; the byte is kept") {
  connection c;
  auto watched = c.watch();
  asio::write(c.client, asio::buffer("G", 1));
  CHECK_FALSE(finished(watched, 300ms));  // a pipelined request: the client is still there
  CHECK(c.buffered() == "G");             // read for the next request's parser
  c.client.close();
  REQUIRE(finished(watched, 5s));
  CHECK(c.ex->status_code() == exchange::client_closed_request);
  CHECK(c.buffered() == "G");
}

TEST_CASE("past the read-ahead bound the rest stays in the socket, a close is still reported, the strand stays free") {
  connection c(11, /*read_ahead=*/8);
  auto watched = c.watch();
  const std::string pipelined(100, 'x');
  asio::write(c.client, asio::buffer(pipelined));
  CHECK_FALSE(finished(watched, 300ms));
  CHECK(c.buffered() == pipelined.substr(0, 8));
  // The strand must stay free for the request's other work (its events, its writes).
  std::promise<void> ran;
  asio::post(c.stream.get_executor(), [&] { ran.set_value(); });
  CHECK(ran.get_future().wait_for(5s) == std::future_status::ready);
  std::size_t in_socket = 0;
  c.on_strand([&] { in_socket = c.stream.socket().available(); });
  CHECK(in_socket == pipelined.size() - 8);
  c.client.close();
  REQUIRE(finished(watched, 5s));
  CHECK(c.ex->status_code() == exchange::client_closed_request);
}

TEST_CASE("a client that half-closes (HTTP/1.1) is not gone: it gets an interim 100 Continue, then its answer") {
  connection c;
  auto watched = c.watch();
  c.client.shutdown(asio::socket_base::shutdown_send);
  CHECK(c.receive(interim.size(), 5s) == interim);
  CHECK_FALSE(finished(watched, 300ms));
  CHECK(c.ex->status_code() == 0);
  CHECK(c.ex->input_ended());  // what follows this request is in the input buffer, or nothing
  c.cancel_watch();
  REQUIRE(finished(watched, 5s));

  const std::string reply = c.answer(boost::beast::http::status::ok, "answer");
  CHECK(reply.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(reply.find("\r\n\r\nanswer") != std::string::npos);
  CHECK(c.ex->status_code() == 200);
}

TEST_CASE("a half-closed client that then closes is reported at the next interim response") {
  connection c;
  auto watched = c.watch();
  c.client.shutdown(asio::socket_base::shutdown_send);
  CHECK(c.receive(interim.size(), 5s) == interim);
  c.client.close();
  // The next interim response is due within seconds: the closed socket resets it.
  REQUIRE(finished(watched, 15s));
  CHECK(c.ex->status_code() == exchange::client_closed_request);
}

TEST_CASE("an HTTP/1.0 client that half-closes counts as gone, and is sent no interim response") {
  connection c(10);
  auto watched = c.watch();
  c.client.shutdown(asio::socket_base::shutdown_send);
  REQUIRE(finished(watched, 5s));
  CHECK(c.ex->status_code() == exchange::client_closed_request);
  CHECK(c.receive(1, 200ms).empty());
}

TEST_CASE("a client that half-closes while its response streams counts as gone") {
  connection c;
  boost::beast::http::response_header<> head;
  head.result(boost::beast::http::status::ok);
  auto begun = c.spawn(begin_stream(*c.ex, std::move(head)));
  REQUIRE(finished(begun, 5s));
  auto watched = c.watch();
  c.client.shutdown(asio::socket_base::shutdown_send);
  REQUIRE(finished(watched, 5s));
  CHECK(c.ex->status_code() == 200);
  CHECK_FALSE(c.ex->keep_alive());
  CHECK(c.receive(4096, 200ms).find("100 Continue") == std::string::npos);
}

TEST_CASE("a watch cancelled by the operation awaited alongside it reports nothing") {
  connection c;
  auto watched = c.watch();
  asio::write(c.client, asio::buffer("GET", 3));
  CHECK_FALSE(finished(watched, 200ms));
  c.cancel_watch();
  REQUIRE(finished(watched, 5s));
  CHECK(c.ex->status_code() == 0);
  CHECK(c.buffered() == "GET");
}

TEST_CASE("a request cut short by the server ends the watch, the client still there, and its connection is not reused") {
  connection c;
  c.req.keep_alive(true);
  auto watched = c.watch();
  asio::write(c.client, asio::buffer("GET", 3));
  CHECK_FALSE(finished(watched, 200ms));
  c.on_strand([&] { c.ex->cut_short(); });
  REQUIRE(finished(watched, 5s));
  CHECK(c.ex->was_cut());
  CHECK(c.ex->status_code() == 0);  // not counted as a client that left: the handler answers
  CHECK(c.buffered() == "GET");

  // A watch begun after the cut ends at once.
  auto again = c.watch();
  REQUIRE(finished(again, 5s));

  const std::string reply = c.answer(boost::beast::http::status::service_unavailable, "shutting down");
  CHECK(reply.rfind("HTTP/1.1 503 Service Unavailable\r\n", 0) == 0);
  CHECK(reply.find("Connection: close\r\n") != std::string::npos);
  CHECK_FALSE(c.ex->keep_alive());
}

TEST_CASE("a stream that ends with an error event is recorded under the error's status") {
  connection c;
  boost::beast::http::response_header<> head;
  head.result(boost::beast::http::status::ok);
  auto begun = c.spawn(begin_stream(*c.ex, std::move(head)));
  REQUIRE(finished(begun, 5s));
  CHECK(c.ex->status_code() == 200);
  c.on_strand([&] { c.ex->record_stream_failure(boost::beast::http::status::service_unavailable); });
  CHECK(c.ex->status_code() == 503);
}
