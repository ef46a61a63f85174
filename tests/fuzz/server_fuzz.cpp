// The whole-server fuzzer: the servers `edgeinfer serve` runs (serve_command.h), in this process
// on 127.0.0.1 port 0, driven over loopback HTTP with hostile requests (server_fuzz_requests.h)
// by several clients at once. The model is served twice: plainly and with
// --tool-call-parser hermes, each with a small KV cache and one engine thread, for two tenants
// (one without limits, one with tight quotas).
//
// After every request: the process lives (a crash ends this one, and the requests in flight are
// printed with the command that replays each), /readyz answers 200, and the answer is exactly
// one well-formed response of the API (server_fuzz_answers.h). At the end, once the servers are
// idle: no request still runs or waits, no stream is open, every KV block is free again, and
// each tenant is served (no concurrency slot was lost).
//
//   edge_server_fuzz [--requests N] [--seconds T] [--seed S] [--concurrency C] [--first K]
//                    [--replay K] [--findings DIR] [--max-findings M]
//                    [--timeout SECONDS] [--log-level LEVEL] [--quiet]
//
// A run ends after N requests or T seconds, whichever comes first (--requests 0: no limit).
// Request K of seed S is the same request in every run: `--seed S --replay K` sends it alone
// and judges its answer; --first K starts a run at request K (continuing an earlier one).
// The requests are made for stories260K (${EDGE_TEST_MODELS:-<source>/../shared/models}): its
// 512-token vocabulary, byte tokens from id 3, EOS 2, context 2048.
// Exit code: 0 without findings, 1 with, 2 for bad arguments or servers that did not start.
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif

#include "edge/common/log.h"
#include "edge/common/time_source.h"
#include "serve_command.h"
#include "server_fuzz_answers.h"
#include "server_fuzz_requests.h"

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace cli = edge::cli;
namespace config = edge::config;
namespace fz = edge::fuzz;
using namespace std::chrono_literals;
using steady = std::chrono::steady_clock;

// ---- options ----------------------------------------------------------------------------------

struct options {
  std::uint64_t requests = 1000;
  double seconds = 0;  // 0: no time limit
  std::uint64_t seed = 1;
  int concurrency = 4;
  std::uint64_t first = 0;
  std::optional<std::uint64_t> replay;
  std::filesystem::path findings;  // empty: findings are printed only
  int max_findings = 10;
  // Generous: a request with a schema waits for every compile queued before it.
  std::chrono::seconds timeout{300};
  edge::log::level log_level = edge::log::level::warn;
  bool quiet = false;
};

// The settings of the fuzzed servers: small body limit (bodies near it are cheap to make), a
// small KV cache (choices and long outputs preempt each other), one engine thread.
constexpr std::string_view max_body = "256KiB";
constexpr std::size_t max_body_bytes = 256 * 1024;
constexpr std::string_view kv_cache_memory = "2MiB";

std::filesystem::path stories260k() {
  std::filesystem::path dir;
  if (const char* env = std::getenv("EDGE_TEST_MODELS"); env != nullptr && *env != '\0') {
    dir = env;
  } else {
    dir = std::filesystem::path(EDGE_SOURCE_DIR) / ".." / "shared" / "models";
  }
  return dir / "stories260K" / "stories260K.gguf";
}

[[noreturn]] void usage(const std::string& why) {
  std::cerr << "edge_server_fuzz: " << why
            << "\nusage: edge_server_fuzz [--requests N] [--seconds T] [--seed S] [--concurrency C] [--first K]\n"
               "                        [--replay K] [--findings DIR] [--max-findings M]\n"
               "                        [--timeout SECONDS] [--log-level LEVEL] [--quiet]\n";
  std::exit(2);
}

std::uint64_t read_count(const std::string& flag, const std::string& text) {
  try {
    std::size_t used = 0;
    const unsigned long long value = std::stoull(text, &used, 0);
    if (used == text.size() && text.front() != '-') return value;
  } catch (const std::exception&) {
  }
  usage(flag + " wants a non-negative integer, not \"" + text + "\"");
}

options parse_options(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--quiet") {
      o.quiet = true;
      continue;
    }
    if (i + 1 >= argc) usage(flag + " wants a value");
    const std::string value = argv[++i];
    if (flag == "--requests") {
      o.requests = read_count(flag, value);
    } else if (flag == "--seconds") {
      o.seconds = static_cast<double>(read_count(flag, value));
    } else if (flag == "--seed") {
      o.seed = read_count(flag, value);
    } else if (flag == "--concurrency") {
      o.concurrency = static_cast<int>(std::clamp<std::uint64_t>(read_count(flag, value), 1, 64));
    } else if (flag == "--first") {
      o.first = read_count(flag, value);
    } else if (flag == "--replay") {
      o.replay = read_count(flag, value);
    } else if (flag == "--findings") {
      o.findings = value;
    } else if (flag == "--max-findings") {
      o.max_findings = static_cast<int>(std::max<std::uint64_t>(1, read_count(flag, value)));
    } else if (flag == "--timeout") {
      o.timeout = std::chrono::seconds(std::max<std::uint64_t>(1, read_count(flag, value)));
    } else if (flag == "--log-level") {
      const auto level = edge::log::parse_level(value);
      if (!level) usage("unknown --log-level " + value);
      o.log_level = *level;
    } else {
      usage("unknown option " + flag);
    }
  }
  if (o.requests == 0 && o.seconds == 0 && !o.replay) usage("--requests 0 wants --seconds");
  return o;
}

// ---- what a crash leaves ----------------------------------------------------------------------

// The request each client has in flight (none_in_flight: none), for the report of a crash.
constexpr std::uint64_t none_in_flight = ~std::uint64_t{0};
constexpr int max_clients = 64;
std::atomic<std::uint64_t> in_flight[max_clients];
std::uint64_t crash_seed = 0;
std::atomic<bool> crash_reported{false};

// Async-signal-safe: write(2) of digits, no allocation.
void write_text(const char* text) {
  const std::size_t length = std::char_traits<char>::length(text);
  if (::write(STDERR_FILENO, text, length) < 0) return;
}
void write_number(std::uint64_t value) {
  char digits[24];
  int at = 23;
  digits[at] = '\0';
  do {
    digits[--at] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0);
  write_text(digits + at);
}

void report_crash() {
  if (crash_reported.exchange(true)) return;
  write_text("\nedge_server_fuzz: FINDING: the process is dying; requests in flight (replay each alone):\n");
  for (int i = 0; i < max_clients; ++i) {
    const std::uint64_t index = in_flight[i].load();
    if (index == none_in_flight) continue;
    write_text("  edge_server_fuzz --seed ");
    write_number(crash_seed);
    write_text(" --replay ");
    write_number(index);
    write_text("\n");
  }
}

void on_fatal_signal(int signal) {
  report_crash();
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

void watch_for_crashes(std::uint64_t seed) {
  crash_seed = seed;
  for (auto& slot : in_flight) slot.store(none_in_flight);
#if defined(__SANITIZE_ADDRESS__)
  // The sanitizers report an error and exit without a signal.
  __sanitizer_set_death_callback(report_crash);
#endif
  for (const int signal : {SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL}) std::signal(signal, on_fatal_signal);
}

// ---- the client -------------------------------------------------------------------------------

// One exchange per connection, on this thread's io_context; every operation ends by `deadline`.
class loopback_client {
 public:
  fz::http_answer exchange(std::uint16_t port, const fz::fuzz_request& r, const std::string& key,
                           std::chrono::seconds timeout) {
    fz::http_answer a;
    beast::tcp_stream stream(io_);
    const steady::time_point deadline = steady::now() + timeout;
    stream.expires_at(deadline);
    beast::error_code ec;
    stream.async_connect(asio::ip::tcp::endpoint(asio::ip::make_address("127.0.0.1"), port),
                         [&](beast::error_code e) { ec = e; });
    run();
    if (ec) {
      a.failure = "connect: " + ec.message();
      return a;
    }
    http::request<http::string_body> req{r.method == "GET" ? http::verb::get : http::verb::post, r.target, 11};
    req.set(http::field::host, "127.0.0.1");
    if (!key.empty()) req.set(http::field::authorization, "Bearer " + key);
    if (req.method() == http::verb::post) req.set(http::field::content_type, "application/json");
    req.body() = r.body;
    req.keep_alive(false);
    req.prepare_payload();
    http::async_write(stream, req, [&](beast::error_code e, std::size_t) { ec = e; });
    run();
    a.sent = !ec;
    if (ec) {
      // The server may refuse a body it will not read (413) and close: its answer may be there.
      a.failure = "write: " + ec.message();
      stream.expires_after(5s);
    } else if (r.leave == fz::leaving::after_send) {
      return a;
    }

    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(std::uint64_t{1} << 30);
    http::async_read_header(stream, buffer, parser, [&](beast::error_code e, std::size_t) { ec = e; });
    run();
    if (ec) {
      if (a.failure.empty()) a.failure = "reading the headers: " + ec.message();
      return a;
    }
    a.headers = true;
    a.status = parser.get().result_int();
    a.content_type = std::string(parser.get()[http::field::content_type]);
    a.retry_after = std::string(parser.get()[http::field::retry_after]);
    if (r.leave == fz::leaving::after_headers) return a;
    while (!parser.is_done()) {
      http::async_read_some(stream, buffer, parser, [&](beast::error_code e, std::size_t) { ec = e; });
      run();
      if (ec) {
        a.failure = "reading the body: " + ec.message();
        a.body = parser.get().body();
        return a;
      }
      if (r.leave == fz::leaving::mid_body && parser.get().body().size() >= r.leave_after_bytes) return a;
    }
    a.complete = true;
    a.body = std::move(parser.get().body());
    return a;
  }

  // The status of a GET, 0 when none came back.
  unsigned get(std::uint16_t port, std::string_view target, std::string* body = nullptr) {
    fz::fuzz_request r;
    r.method = "GET";
    r.target = std::string(target);
    const fz::http_answer a = exchange(port, r, "", 30s);
    if (body != nullptr) *body = a.body;
    return a.complete ? a.status : 0;
  }

 private:
  void run() {
    io_.restart();
    io_.run();
  }

  asio::io_context io_;
};

// ---- the servers ------------------------------------------------------------------------------

class temp_folder {
 public:
  temp_folder() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("edge_server_fuzz_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~temp_folder() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  temp_folder(const temp_folder&) = delete;
  temp_folder& operator=(const temp_folder&) = delete;
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// One `serve` server on port 0, served on a thread of its own, with a key for each tenant.
class fuzzed_server {
 public:
  explicit fuzzed_server(fz::served_as kind) : log_{kind == fz::served_as::plain ? "plain" : "hermes"} {
    std::map<std::string, std::string> flags = {
        {"model", stories260k().string()},
        {"port", "0"},
        {"host", "127.0.0.1"},
        {"state-dir", state_.path().string()},
        {"device", "cpu"},
        {"threads", "1"},
        {"http-threads", "2"},
        {"kv-cache-memory", std::string(kv_cache_memory)},
        {"max-body", std::string(max_body)},
        {"access-log", "false"},
        {"tool-call-parser", kind == fz::served_as::plain ? "auto" : "hermes"},
    };
    // The hermes server keeps evicted prompt blocks in host memory and on disk, so that every
    // request there may spill, restore and write blocks through; the plain one has KV memory alone.
    if (kind == fz::served_as::hermes) {
      flags.emplace("kv-host-cache-memory", "1MiB");
      flags.emplace("kv-disk-cache", (state_.path() / "kv").string());
      flags.emplace("kv-disk-cache-size", "8MiB");
    }
    config::sources from{.flags = {}, .getenv = [](const std::string&) -> std::optional<std::string> { return std::nullopt; }};
    for (auto& [name, value] : flags) from.flags.emplace(name, value);
    auto resolved = config::resolve(cli::serve_options(), from);
    if (!resolved.ok()) throw std::runtime_error(resolved.error().message());
    settings_ = std::move(resolved).value();

    auto opened = cli::open_tenancy(settings_, clock_, families_, log_);
    if (!std::holds_alternative<cli::tenancy_setup>(opened)) throw std::runtime_error("the tenant store did not open");
    tenancy_ = std::move(std::get<cli::tenancy_setup>(opened));
    cli::create_first_key(tenancy_, log_, "server_fuzz");  // the default tenant
    edge::gateway::tenant_store& store = tenancy_.tenants->store();
    const edge::gateway::audit_context who{.actor = "server_fuzz", .request_id = ""};
    auto open_key = store.create_key(edge::gateway::tenant_store::default_tenant_id, std::nullopt, who);
    if (!open_key.ok()) throw std::runtime_error(open_key.error().message());
    keys_[0] = open_key->key;
    // One request at a time and a small budget per minute: its refusals are 429s, and a lost
    // concurrency slot shows in the end's check.
    edge::gateway::tenant_record tight{.id = "tight"};
    tight.quotas.max_concurrent = 1;
    tight.quotas.tokens_per_minute = 20000;
    tight.quotas.max_tokens_per_request = 512;
    // On the hermes server, a few blocks of the host and disk KV tiers: its blocks replace its own.
    tight.quotas.kv_host_cache_bytes = 64 * 1024;
    tight.quotas.kv_disk_cache_bytes = 128 * 1024;
    if (auto made = store.create_tenant(tight, who); !made.ok()) throw std::runtime_error(made.error().message());
    auto tight_key = store.create_key("tight", std::nullopt, who);
    if (!tight_key.ok()) throw std::runtime_error(tight_key.error().message());
    keys_[1] = tight_key->key;

    auto location = cli::locate_served_model(settings_);
    if (!location.ok()) throw std::runtime_error(location.error().message());
    model_id_ = location->served_name;
    server_ = std::make_unique<cli::serve_server>(settings_, *location, tenancy_, registry_, families_);
    if (auto listening = server_->http().listen(); !listening.ok()) throw std::runtime_error(listening.message());
    port_ = server_->http().local_endpoint().port();
    server_->load(log_);
    thread_ = std::thread([this] { server_->http().run(); });
  }
  ~fuzzed_server() {
    if (thread_.joinable()) stop();
  }
  fuzzed_server(const fuzzed_server&) = delete;
  fuzzed_server& operator=(const fuzzed_server&) = delete;

  std::uint16_t port() const { return port_; }
  const std::string& key(fz::tenant_kind tenant) const { return keys_[tenant == fz::tenant_kind::open ? 0 : 1]; }
  const std::string& model_id() const { return model_id_; }

  // The engine's exit code.
  int stop() {
    server_->http().shutdown();
    thread_.join();
    return server_->stop(log_);
  }

 private:
  temp_folder state_;
  const edge::logger log_;
  config::values settings_;
  const edge::real_time_source clock_;
  edge::monitoring::metrics_registry registry_;
  edge::monitoring::gateway_metrics families_{registry_.families()};
  cli::tenancy_setup tenancy_;
  std::string keys_[2];
  std::string model_id_;
  std::unique_ptr<cli::serve_server> server_;
  std::uint16_t port_ = 0;
  std::thread thread_;
};

// ---- the run ----------------------------------------------------------------------------------

// What the run saw; guarded by its mutex (the clients write, the summary reads at the end).
class run_record {
 public:
  void count(const fz::fuzz_request& r, const fz::http_answer& a, double seconds) {
    std::string outcome;
    if (r.leave != fz::leaving::stays && !a.complete) {
      outcome = "client left";
    } else if (!a.headers) {
      outcome = "no answer";
    } else {
      outcome = std::to_string(a.status);
    }
    std::string refusal;
    if (a.complete && a.status != 200) {
      // The message's start names the rule: which rules the requests reach, and how often.
      const std::size_t at = a.body.find("\"message\":\"");
      if (at != std::string::npos) refusal = std::to_string(a.status) + " " + a.body.substr(at + 11, 60);
    }
    std::lock_guard lock(mutex_);
    ++requests_;
    ++outcomes_[outcome];
    for (const std::string& f : r.features) {
      ++features_[f][outcome];
      feature_seconds_[f] += seconds;
    }
    if (!refusal.empty()) ++refusals_[refusal];
  }

  // Records and prints a finding; false once the run has as many as it may.
  bool finding(const options& o, const fz::fuzz_request& r, const std::string& what) {
    std::lock_guard lock(mutex_);
    ++findings_;
    std::string text = "FINDING " + std::to_string(findings_) + ": request " + std::to_string(r.index) + " of seed " +
                       std::to_string(o.seed) + ": " + what + "\n  replay: edge_server_fuzz --seed " +
                       std::to_string(o.seed) + " --replay " + std::to_string(r.index) + "\n  " + fz::describe(r, 4000) +
                       "\n";
    std::cerr << text << std::flush;
    if (!o.findings.empty()) {
      std::filesystem::create_directories(o.findings);
      const auto file = o.findings / ("seed-" + std::to_string(o.seed) + "-request-" + std::to_string(r.index) + ".txt");
      std::ofstream(file) << what << "\n" << fz::describe(r, r.body.size()) << "\n";
    }
    return findings_ < o.max_findings;
  }

  void end_finding(const std::string& what) {
    std::lock_guard lock(mutex_);
    ++findings_;
    std::cerr << "FINDING " << findings_ << ": at the end of the run: " << what << "\n" << std::flush;
  }

  int findings() const {
    std::lock_guard lock(mutex_);
    return findings_;
  }

  void print_summary(const options& o, double seconds) const {
    std::lock_guard lock(mutex_);
    std::printf("edge_server_fuzz: seed %llu, requests %llu..%llu, %llu requests in %.1f s (%.1f requests/s), "
                "concurrency %d\n",
                static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(o.first),
                static_cast<unsigned long long>(o.first + requests_ - (requests_ > 0 ? 1 : 0)),
                static_cast<unsigned long long>(requests_), seconds, seconds > 0 ? static_cast<double>(requests_) / seconds : 0.0,
                o.concurrency);
    std::printf("outcomes:");
    for (const auto& [outcome, n] : outcomes_) std::printf("  %s: %llu", outcome.c_str(), static_cast<unsigned long long>(n));
    std::printf("\n");
    if (!o.quiet) {
      std::printf("features (requests, mean time: outcomes):\n");
      for (const auto& [feature, outcomes] : features_) {
        std::uint64_t total = 0;
        for (const auto& [outcome, n] : outcomes) total += n;
        std::printf("  %-28s %8llu %7.0f ms:", feature.c_str(), static_cast<unsigned long long>(total),
                    1000.0 * feature_seconds_.at(feature) / static_cast<double>(total));
        for (const auto& [outcome, n] : outcomes) std::printf("  %s %llu", outcome.c_str(), static_cast<unsigned long long>(n));
        std::printf("\n");
      }
    }
    if (!o.quiet) {
      std::vector<std::pair<std::uint64_t, std::string>> common;
      for (const auto& [refusal, n] : refusals_) common.emplace_back(n, refusal);
      std::sort(common.rbegin(), common.rend());
      if (common.size() > 30) common.resize(30);
      std::printf("most common refusals:\n");
      for (const auto& [n, refusal] : common) std::printf("  %8llu  %s\n", static_cast<unsigned long long>(n), refusal.c_str());
    }
    std::printf("findings: %d\n", findings_);
    std::fflush(stdout);
  }

 private:
  mutable std::mutex mutex_;
  std::uint64_t requests_ = 0;
  std::map<std::string, std::uint64_t> outcomes_;
  std::map<std::string, std::map<std::string, std::uint64_t>> features_;
  std::map<std::string, std::uint64_t> refusals_;
  std::map<std::string, double> feature_seconds_;  // the time its requests took, together
  int findings_ = 0;
};

struct fleet {
  std::vector<std::unique_ptr<fuzzed_server>> servers;  // indexed by served_as
  fz::request_limits limits;
  fuzzed_server& of(fz::served_as kind) { return *servers[static_cast<std::size_t>(kind)]; }
};

// One request, its answer judged and /readyz asked after it; the finding, if any.
std::optional<std::string> try_request(loopback_client& client, fleet& f, const fz::fuzz_request& r, const options& o,
                                       run_record& record) {
  fuzzed_server& server = f.of(r.server);
  const steady::time_point sent = steady::now();
  const fz::http_answer a = client.exchange(server.port(), r, server.key(r.tenant), o.timeout);
  record.count(r, a, std::chrono::duration<double>(steady::now() - sent).count());
  std::optional<std::string> problem = fz::check_answer(r, a);
  std::string ready_body;
  const unsigned ready = client.get(server.port(), "/readyz", &ready_body);
  if (ready != 200) {
    const std::string what = "after it, /readyz answered " + std::to_string(ready) + " " + ready_body;
    problem = problem ? *problem + "; " + what : what;
  }
  return problem;
}

// Until the servers' figures say idle (or `patience` passes): what is still busy, or nothing.
std::optional<std::string> wait_idle(loopback_client& client, fuzzed_server& server, std::chrono::seconds patience) {
  const steady::time_point deadline = steady::now() + patience;
  std::string busy;
  for (;;) {
    std::string metrics;
    if (client.get(server.port(), "/metrics", &metrics) != 200) return "/metrics did not answer";
    std::map<std::string, double> values;
    std::size_t at = 0;
    while (at < metrics.size()) {
      const std::size_t end = std::min(metrics.find('\n', at), metrics.size());
      const std::string_view line(metrics.data() + at, end - at);
      at = end + 1;
      if (line.empty() || line.front() == '#') continue;
      const std::size_t name_end = line.find_first_of(" {");
      const std::size_t value_at = line.rfind(' ');
      if (name_end == std::string_view::npos || value_at == std::string_view::npos) continue;
      values[std::string(line.substr(0, name_end))] += std::strtod(std::string(line.substr(value_at + 1)).c_str(), nullptr);
    }
    busy.clear();
    for (const char* name : {"edgeinfer_num_requests_running", "edgeinfer_num_requests_waiting", "edgeinfer_active_streams"}) {
      if (values[name] != 0) busy += std::string(busy.empty() ? "" : ", ") + name + " " + std::to_string(values[name]);
    }
    if (values["edgeinfer_kv_cache_blocks_free"] != values["edgeinfer_kv_cache_blocks"]) {
      busy += std::string(busy.empty() ? "" : ", ") + "KV blocks free " +
              std::to_string(values["edgeinfer_kv_cache_blocks_free"]) + " of " +
              std::to_string(values["edgeinfer_kv_cache_blocks"]);
    }
    if (busy.empty()) return std::nullopt;
    if (steady::now() > deadline) return busy;
    std::this_thread::sleep_for(100ms);
  }
}

// Each tenant is served once the run is over: nothing the run did is still held.
std::optional<std::string> check_served(loopback_client& client, fuzzed_server& server, fz::tenant_kind tenant) {
  fz::fuzz_request r;
  r.target = "/v1/completions";
  r.body = R"({"prompt":"Once upon a time","max_tokens":4})";
  const fz::http_answer a = client.exchange(server.port(), r, server.key(tenant), 60s);
  if (a.complete && a.status == 200) return std::nullopt;
  return "an ordinary request of tenant " + std::string(tenant == fz::tenant_kind::open ? "default" : "tight") +
         " answered " + std::to_string(a.status) + " " + a.body + a.failure;
}

void wait_ready(loopback_client& client, fuzzed_server& server) {
  const steady::time_point deadline = steady::now() + 120s;
  while (client.get(server.port(), "/readyz") != 200) {
    if (steady::now() > deadline) throw std::runtime_error("a server was not ready within 120 s");
    std::this_thread::sleep_for(20ms);
  }
}

int run(const options& o) {
  edge::log::set_level(o.log_level);
  fleet f;
  f.servers.push_back(std::make_unique<fuzzed_server>(fz::served_as::plain));
  f.servers.push_back(std::make_unique<fuzzed_server>(fz::served_as::hermes));
  {
    loopback_client client;
    for (auto& server : f.servers) wait_ready(client, *server);
  }
  f.limits = {.max_body = max_body_bytes, .vocab_size = 512, .context = 2048, .model_id = f.servers[0]->model_id()};
  run_record record;

  if (o.replay) {
    const fz::fuzz_request r = fz::make_request(o.seed, *o.replay, f.limits);
    std::cout << "request " << *o.replay << " of seed " << o.seed << ": " << fz::describe(r, 4000) << "\n" << std::flush;
    loopback_client client;
    in_flight[0].store(r.index);
    const fz::http_answer a = client.exchange(f.of(r.server).port(), r, f.of(r.server).key(r.tenant), o.timeout);
    record.count(r, a, 0);
    std::cout << "answer: " << (a.headers ? std::to_string(a.status) : "none") << " " << a.content_type << " "
              << a.body.substr(0, 4000) << (a.failure.empty() ? "" : " (" + a.failure + ")") << "\n";
    if (auto problem = fz::check_answer(r, a)) record.finding(o, r, *problem);
    std::string ready_body;
    if (const unsigned ready = client.get(f.of(r.server).port(), "/readyz", &ready_body); ready != 200) {
      record.finding(o, r, "after it, /readyz answered " + std::to_string(ready) + " " + ready_body);
    }
    in_flight[0].store(none_in_flight);
  } else {
    const steady::time_point started = steady::now();
    const steady::time_point stop_at =
        o.seconds > 0 ? started + std::chrono::duration_cast<steady::duration>(std::chrono::duration<double>(o.seconds))
                      : steady::time_point::max();
    std::atomic<std::uint64_t> next{o.first};
    std::atomic<bool> stop{false};
    const std::uint64_t end = o.requests == 0 ? ~std::uint64_t{0} : o.first + o.requests;
    std::vector<std::thread> clients;
    for (int c = 0; c < o.concurrency; ++c) {
      clients.emplace_back([&, c] {
        loopback_client client;
        while (!stop.load() && steady::now() < stop_at) {
          const std::uint64_t index = next.fetch_add(1);
          if (index >= end) break;
          const fz::fuzz_request r = fz::make_request(o.seed, index, f.limits);
          in_flight[c].store(index);
          const std::optional<std::string> problem = try_request(client, f, r, o, record);
          in_flight[c].store(none_in_flight);
          if (problem && !record.finding(o, r, *problem)) stop.store(true);
        }
      });
    }
    for (std::thread& t : clients) t.join();
    const double seconds = std::chrono::duration<double>(steady::now() - started).count();

    loopback_client client;
    for (auto& server : f.servers) {
      if (auto busy = wait_idle(client, *server, 60s)) record.end_finding("a server is not idle a minute after the run: " + *busy);
      for (const fz::tenant_kind tenant : {fz::tenant_kind::open, fz::tenant_kind::tight}) {
        if (auto refused = check_served(client, *server, tenant)) record.end_finding(*refused);
      }
    }
    record.print_summary(o, seconds);
  }

  for (auto& server : f.servers) {
    if (server->stop() != 0) record.end_finding("the engine of a server failed");
  }
  if (o.replay) record.print_summary(o, 0);
  return record.findings() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse_options(argc, argv);
  watch_for_crashes(o.seed);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "edge_server_fuzz: " << e.what() << "\n";
    return 2;
  }
}
