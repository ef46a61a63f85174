// The servers of `edgeinfer serve` and `edgeinfer backend`, as those commands build them
// (serve_server, backend_server), on port 0 with stories260K on the CPU, and an engine whose
// loop a test makes fail (engine_options::before_step): what a client and an orchestrator see
// over HTTP once the engine has failed.
#include <doctest/doctest.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <simdjson.h>

#include <atomic>
#include <map>
#include <stdexcept>
#include <thread>

#include "backend_command.h"
#include "edge/common/time_source.h"
#include "edge/gateway/split/internal_protocol.h"
#include "serve_command.h"
#include "test_support.h"

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace cli = edge::cli;
namespace config = edge::config;
using namespace std::chrono_literals;

// The settings a command would resolve from these flags (and nothing in the environment).
config::values settings_for(const config::schema& schema, const std::filesystem::path& state_dir) {
  const std::map<std::string, std::string> flags = {
      {"model", (edge::testing::stories260k_dir() / "stories260K.gguf").string()},
      {"port", "0"},
      {"state-dir", state_dir.string()},
      {"device", "cpu"},
      {"threads", "1"},
      {"http-threads", "2"},
      {"kv-cache-memory", "8MiB"},
      {"access-log", "false"},
  };
  config::sources from{.flags = {}, .getenv = [](const std::string&) -> std::optional<std::string> { return std::nullopt; }};
  for (const auto& [name, value] : flags) {
    if (schema.find(name) != nullptr) from.flags.emplace(name, value);
  }
  auto resolved = config::resolve(schema, from);
  REQUIRE_MESSAGE(resolved.ok(), resolved.error().message());
  return std::move(resolved).value();
}

struct reply {
  unsigned status = 0;
  std::string body;
  std::string retry_after;
};

// One request on a fresh connection; a server that does not answer within 30 s fails the test.
reply send(std::uint16_t port, http::verb method, std::string_view target, std::string body = {},
           std::string_view key = {}) {
  asio::io_context io;
  beast::tcp_stream stream(io);
  http::request<http::string_body> req{method, target, 11};
  req.set(http::field::host, "127.0.0.1");
  if (!key.empty()) req.set(http::field::authorization, "Bearer " + std::string(key));
  if (!body.empty()) req.set(http::field::content_type, "application/json");
  req.body() = std::move(body);
  req.keep_alive(false);
  req.prepare_payload();
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  beast::error_code failure;
  stream.expires_after(30s);
  stream.async_connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), [&](beast::error_code ec) {
    if (ec) {
      failure = ec;
      return;
    }
    http::async_write(stream, req, [&](beast::error_code write_ec, std::size_t) {
      if (write_ec) {
        failure = write_ec;
        return;
      }
      http::async_read(stream, buffer, res, [&](beast::error_code read_ec, std::size_t) { failure = read_ec; });
    });
  });
  io.run();
  REQUIRE_MESSAGE(!failure, target, ": ", failure.message());
  return {res.result_int(), res.body(), std::string(res[http::field::retry_after])};
}

reply get(std::uint16_t port, std::string_view target) { return send(port, http::verb::get, target); }

std::string json_field(const std::string& body, std::initializer_list<std::string_view> path) {
  simdjson::dom::parser parser;
  simdjson::dom::element e;
  REQUIRE_MESSAGE(parser.parse(body).get(e) == simdjson::SUCCESS, body);
  for (const std::string_view key : path) REQUIRE_MESSAGE(e[key].get(e) == simdjson::SUCCESS, key, " in ", body);
  std::string_view text;
  REQUIRE_MESSAGE(e.get(text) == simdjson::SUCCESS, body);
  return std::string(text);
}

// Until /readyz answers 200: the model is loaded and the engine runs.
void wait_ready(std::uint16_t port) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (get(port, "/readyz").status != 200) {
    REQUIRE(std::chrono::steady_clock::now() < deadline);
    std::this_thread::sleep_for(10ms);
  }
}

// Throws from the engine thread's next step once armed: a bug ending the engine loop.
struct engine_bug {
  std::atomic<bool> armed{false};
  std::function<void()> hook() {
    return [this] {
      if (armed.load()) throw std::runtime_error("injected engine bug");
    };
  }
};

// A serve_server or backend_server listening on port 0 with its model loading, served on a
// thread of its own until stop().
template <class Server>
class running_server {
 public:
  running_server(Server& server, const edge::logger& log) : server_(server), log_(log) {
    REQUIRE(server_.http().listen().ok());
    port_ = server_.http().local_endpoint().port();
    server_.load(log_);
    thread_ = std::thread([this] { server_.http().run(); });
  }
  ~running_server() {
    if (thread_.joinable()) stop();
  }
  running_server(const running_server&) = delete;
  running_server& operator=(const running_server&) = delete;

  std::uint16_t port() const { return port_; }

  // Shuts the server down and stops its engine; the command's exit code.
  int stop() {
    server_.http().shutdown();
    thread_.join();
    return server_.stop(log_);
  }

 private:
  Server& server_;
  const edge::logger& log_;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

// What a command's metrics are: the registry and the HTTP families in it.
struct command_metrics {
  edge::monitoring::metrics_registry registry;
  edge::monitoring::gateway_metrics families{registry.families()};
};

const std::string chat_body = R"({"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":4})";

}  // namespace

TEST_CASE("serve: once a bug ends the engine loop, /readyz and /healthz answer 503 and new chat requests 503") {
  edge::testing::temp_dir state;
  const config::values settings = settings_for(cli::serve_options(), state.path());
  const edge::logger log{"test"};
  command_metrics metrics;
  const edge::real_time_source clock;
  auto opened = cli::open_tenancy(settings, clock, metrics.families, log);
  REQUIRE(std::holds_alternative<cli::tenancy_setup>(opened));
  cli::tenancy_setup& tenancy = std::get<cli::tenancy_setup>(opened);
  cli::create_first_key(tenancy, log, "test");  // the default tenant
  auto key = tenancy.tenants->store().create_key(edge::gateway::tenant_store::default_tenant_id, std::nullopt,
                                                 {.actor = "test", .request_id = ""});
  REQUIRE(key.ok());
  auto location = cli::locate_served_model(settings);
  REQUIRE(location.ok());

  engine_bug bug;
  cli::serve_server serve(settings, *location, tenancy, metrics.registry, metrics.families, bug.hook());
  running_server running(serve, log);
  const std::uint16_t port = running.port();

  wait_ready(port);
  CHECK(get(port, "/healthz").status == 200);
  const reply served = send(port, http::verb::post, "/v1/chat/completions", chat_body, key->key);
  CHECK(served.status == 200);

  bug.armed = true;
  // The request in flight when the loop fails ends with the engine's error.
  const reply failed = send(port, http::verb::post, "/v1/chat/completions", chat_body, key->key);
  CHECK(failed.status == 500);
  CHECK(json_field(failed.body, {"error", "message"}).find("injected engine bug") != std::string::npos);

  const reply ready = get(port, "/readyz");
  CHECK(ready.status == 503);
  CHECK(json_field(ready.body, {"status"}) == "engine_failed");
  const reply alive = get(port, "/healthz");
  CHECK(alive.status == 503);
  CHECK(json_field(alive.body, {"status"}) == "engine_failed");

  // A new request is refused at once, as OpenAI clients expect of an unavailable server.
  const reply refused = send(port, http::verb::post, "/v1/chat/completions", chat_body, key->key);
  CHECK(refused.status == 503);
  CHECK(refused.retry_after == "1");
  CHECK(json_field(refused.body, {"error", "type"}) == "server_error");
  CHECK(json_field(refused.body, {"error", "code"}) == "backend_unavailable");
  CHECK(json_field(refused.body, {"error", "message"}).find("the engine failed: injected engine bug") !=
        std::string::npos);

  CHECK(running.stop() == 1);
}

TEST_CASE("backend: once a bug ends the engine loop, /readyz answers 503 and generate refuses with 503") {
  edge::testing::temp_dir state;
  const config::values settings = settings_for(cli::backend_options(), state.path());
  const edge::logger log{"test"};
  command_metrics metrics;
  auto location = cli::locate_served_model(settings);
  REQUIRE(location.ok());

  engine_bug bug;
  const std::string token = "internal-token-0123456789";
  cli::backend_server backend(settings, token, *location, metrics.registry, metrics.families, bug.hook());
  running_server running(backend, log);
  const std::uint16_t port = running.port();

  wait_ready(port);
  edge::backend::generate_request request;
  request.prompt = {1, 403, 404};
  request.max_tokens = 4;
  const std::string body = edge::gateway::encode_generate_request(request, nullptr);
  const std::string target(edge::gateway::internal_generate_path);
  CHECK(send(port, http::verb::post, target, body, token).status == 200);

  bug.armed = true;
  // The stream in flight ends with a finished event of reason error.
  const reply failed = send(port, http::verb::post, target, body, token);
  CHECK(failed.status == 200);
  const std::string last_line = failed.body.substr(failed.body.rfind('\n', failed.body.size() - 2) + 1);
  auto event = edge::gateway::parse_event(last_line.substr(0, last_line.size() - 1));
  REQUIRE_MESSAGE(event.ok(), failed.body);
  REQUIRE(event->has_value());
  const auto* finished = std::get_if<edge::backend::finished_event>(&**event);
  REQUIRE(finished != nullptr);
  CHECK(finished->reason == edge::backend::finish_reason::error);

  // What a split gateway's health check and its next attempt see: this backend is out.
  const reply ready = get(port, "/readyz");
  CHECK(ready.status == 503);
  CHECK(json_field(ready.body, {"status"}) == "engine_failed");
  const reply refused = send(port, http::verb::post, target, body, token);
  CHECK(refused.status == 503);
  CHECK(json_field(refused.body, {"error", "code"}) == "backend_unavailable");

  CHECK(running.stop() == 1);
}
