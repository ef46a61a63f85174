// What the gateway adds to a streamed request: the same completion (the same prompt token ids,
// greedy, ignore_eos, max_tokens fixed) sent alternately
//   * straight to the engine in this process (engine::submit, events on the engine thread), and
//   * through the gateway in this process: HTTP over loopback with an API key, auth and quotas
//     (tenancy on a temporary SQLite store), the OpenAI routes, SSE, read by a blocking client,
// so both see the same engine, the same machine load and the same caches. Prints p50 and p99 of
// the time to the first token and of the whole request for each path, and the difference.
//
//   edge_bench_gateway_overhead MODEL [--requests N] [--max-tokens T] [--prompt-tokens P] [--threads K]
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>

#include "edge/backend/engine/engine.h"
#include "edge/backend/model/model.h"
#include "edge/backend/runtime/cpu_executor.h"
#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/backend/runtime/kv_cache.h"
#include "edge/common/format.h"
#include "edge/common/log.h"
#include "edge/common/thread_pool.h"
#include "edge/common/time_source.h"
#include "edge/gateway/openai/engine_client.h"
#include "edge/gateway/http/http_server.h"
#include "edge/gateway/openai/openai_routes.h"
#include "edge/gateway/openai/serving_model.h"
#include "edge/gateway/tenancy/tenancy.h"

namespace be = edge::backend;
namespace gw = edge::gateway;
namespace asio = boost::asio;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::string model;
  int requests = 200;
  int max_tokens = 16;
  int prompt_tokens = 32;
  int threads = 1;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag.rfind("--", 0) != 0) {
      o.model = flag;
      continue;
    }
    if (i + 1 >= argc) break;
    const int value = std::atoi(argv[++i]);
    if (flag == "--requests") o.requests = value;
    else if (flag == "--max-tokens") o.max_tokens = value;
    else if (flag == "--prompt-tokens") o.prompt_tokens = value;
    else if (flag == "--threads") o.threads = value;
  }
  return o;
}

struct sample {
  double first_token_ms = 0.0;
  double total_ms = 0.0;
};

double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const std::size_t index = std::min(values.size() - 1, static_cast<std::size_t>(p * static_cast<double>(values.size())));
  return values[index];
}

double ms_since(clock_type::time_point start) {
  return std::chrono::duration<double, std::milli>(clock_type::now() - start).count();
}

// One request straight into the engine, waited for on this thread.
sample run_direct(be::engine& eng, const std::vector<be::token_id>& prompt, int max_tokens) {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool done = false;
  double first_ms = 0.0;
  be::generate_request request;
  request.id = "direct";
  request.prompt = prompt;
  request.max_tokens = max_tokens;
  request.ignore_eos = true;
  request.sampling.temperature = 0.0f;
  const auto start = clock_type::now();
  auto handle = eng.submit(std::move(request), [&](be::engine_event event) {
    std::lock_guard lock(mutex);
    if (std::holds_alternative<be::delta_event>(event) && first_ms == 0.0) first_ms = ms_since(start);
    if (std::holds_alternative<be::finished_event>(event)) {
      done = true;
      done_cv.notify_one();
    }
  });
  if (!handle.ok()) {
    std::fprintf(stderr, "submit: %s\n", handle.error().message().c_str());
    std::exit(1);
  }
  std::unique_lock lock(mutex);
  done_cv.wait(lock, [&] { return done; });
  return {first_ms, ms_since(start)};
}

// A keep-alive HTTP/1.1 connection that sends streamed completions and reads the SSE answer.
class stream_client {
 public:
  stream_client(asio::ip::tcp::endpoint server, std::string body, std::string key)
      : socket_(io_), body_(std::move(body)), key_(std::move(key)), port_(server.port()) {
    socket_.connect(server);
    socket_.set_option(asio::ip::tcp::no_delay(true));
  }

  sample run() {
    const std::string request = edge::format(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nAuthorization: Bearer {}\r\n"
        "Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
        port_, key_, body_.size(), body_);
    std::string received;
    char buffer[16384];
    double first_ms = 0.0;
    const auto start = clock_type::now();
    asio::write(socket_, asio::buffer(request));
    // The answer is chunked: it ends with the [DONE] event followed by the last (empty) chunk.
    while (true) {
      const std::size_t n = socket_.read_some(asio::buffer(buffer));
      received.append(buffer, n);
      if (first_ms == 0.0 && received.find("data: {") != std::string::npos) first_ms = ms_since(start);
      const std::size_t done = received.find("data: [DONE]");
      if (done != std::string::npos && received.find("\r\n0\r\n\r\n", done) != std::string::npos) break;
    }
    if (received.rfind("HTTP/1.1 200", 0) != 0) {
      std::fprintf(stderr, "gateway answered: %.200s\n", received.c_str());
      std::exit(1);
    }
    return {first_ms, ms_since(start)};
  }

 private:
  asio::io_context io_;
  asio::ip::tcp::socket socket_;
  std::string body_;
  std::string key_;
  std::uint16_t port_;
};

void print_row(const char* name, const std::vector<sample>& samples) {
  std::vector<double> first;
  std::vector<double> total;
  for (const sample& s : samples) {
    first.push_back(s.first_token_ms);
    total.push_back(s.total_ms);
  }
  std::printf("%-22s %10.3f %10.3f %10.3f %10.3f\n", name, percentile(first, 0.5), percentile(first, 0.99),
              percentile(total, 0.5), percentile(total, 0.99));
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  if (o.model.empty()) {
    std::fprintf(stderr, "usage: %s MODEL [--requests N] [--max-tokens T] [--prompt-tokens P] [--threads K]\n", argv[0]);
    return 2;
  }
  edge::log::set_level(edge::log::level::warn);

  auto loaded = be::load_model({.path = o.model, .cpu_tiles = true});
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.error().message().c_str());
    return 1;
  }
  const be::model& m = **loaded;
  constexpr std::int64_t block_size = 16;
  auto cache = be::kv_cache::create(
      be::kv_cache_layout::for_tokens(m.config, edge::kernels::dtype::fp8_e4m3, block_size, 64 * m.config.max_position));
  if (!cache.ok()) {
    std::fprintf(stderr, "%s\n", cache.error().message().c_str());
    return 1;
  }
  be::kv_block_pool blocks((*cache)->layout().num_blocks);
  std::unique_ptr<edge::thread_pool> pool;
  if (o.threads > 1) pool = std::make_unique<edge::thread_pool>(static_cast<std::size_t>(o.threads - 1));
  auto exec = be::cpu_executor::create(m, **cache, pool.get(), {.max_batch_tokens = 2048, .max_sequences = 8});
  if (!exec.ok()) {
    std::fprintf(stderr, "%s\n", exec.error().message().c_str());
    return 1;
  }
  be::engine_options engine_options;
  engine_options.scheduler.block_size = block_size;
  engine_options.scheduler.max_num_seqs = 8;
  // The prefix cache would turn every request after the first into a cache hit on one path
  // and not the other; off, both compute the same prompt every time.
  engine_options.scheduler.enable_prefix_caching = false;
  auto eng = be::engine::create(*m.tok, **exec, blocks, m.config.max_position, engine_options);
  if (!eng.ok()) {
    std::fprintf(stderr, "%s\n", eng.error().message().c_str());
    return 1;
  }

  // The prompt: token ids cycling through the vocabulary after BOS, the same for both paths.
  std::vector<be::token_id> prompt;
  if (auto bos = m.tok->bos_id()) prompt.push_back(*bos);
  while (static_cast<int>(prompt.size()) < o.prompt_tokens) {
    prompt.push_back(static_cast<be::token_id>(3 + (prompt.size() * 7) % (m.tok->vocab_size() - 3)));
  }
  std::string ids;
  for (be::token_id id : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(id);

  // The gateway in this process, as serve builds it: tenancy on a fresh SQLite store.
  const std::filesystem::path state_dir =
      std::filesystem::temp_directory_path() / edge::format("edge-gateway-bench-{}", ::getpid());
  const edge::real_time_source clock;
  auto tenants = gw::tenancy::open({.state_dir = state_dir}, clock, nullptr);
  if (!tenants.ok()) {
    std::fprintf(stderr, "%s\n", tenants.error().message().c_str());
    return 1;
  }
  auto key = (*tenants)->store().bootstrap_default_tenant({.actor = "bench", .request_id = ""});
  if (!key.ok() || !*key) {
    std::fprintf(stderr, "cannot create the default tenant\n");
    return 1;
  }
  gw::local_engine_client local(**eng);
  gw::model_slot models;
  models.publish(std::make_shared<gw::serving_model>(gw::serving_model{.id = "bench",
                                                                       .created = 0,
                                                                       .context_length = m.config.max_position,
                                                                       .chat_template = m.chat_template,
                                                                       .tokenizer = m.tok.get(),
                                                                       .engine = &local}));
  gw::router routes;
  gw::add_openai_routes(routes, models, **tenants, nullptr);
  gw::server_options server_options;
  server_options.port = 0;
  server_options.threads = 1;
  server_options.access_log = false;
  gw::http_server server(server_options, std::move(routes), nullptr);
  if (auto listening = server.listen(); !listening.ok()) {
    std::fprintf(stderr, "%s\n", listening.message().c_str());
    return 1;
  }
  std::thread io([&] { server.run(); });

  const std::string body = edge::format(
      R"({{"model":"bench","prompt":[{}],"max_tokens":{},"temperature":0,"ignore_eos":true,"stream":true}})", ids,
      o.max_tokens);
  stream_client client(server.local_endpoint(), body, (*key)->key);

  // Warm both paths (page faults, first allocations), then alternate.
  for (int i = 0; i < 5; ++i) {
    run_direct(**eng, prompt, o.max_tokens);
    client.run();
  }
  std::vector<sample> direct;
  std::vector<sample> gateway;
  std::vector<double> overhead;  // per pair: gateway total - direct total
  for (int i = 0; i < o.requests; ++i) {
    const sample d = run_direct(**eng, prompt, o.max_tokens);
    const sample g = client.run();
    direct.push_back(d);
    gateway.push_back(g);
    overhead.push_back(g.total_ms - d.total_ms);
  }

  std::printf("model %s: %zu prompt tokens, %d completion tokens, %d requests per path, %d compute threads\n",
              o.model.c_str(), prompt.size(), o.max_tokens, o.requests, o.threads);
  std::printf("%-22s %10s %10s %10s %10s\n", "path (ms)", "ttft p50", "ttft p99", "e2e p50", "e2e p99");
  print_row("engine in-process", direct);
  print_row("gateway (HTTP + SSE)", gateway);
  std::vector<double> first_overhead;
  for (std::size_t i = 0; i < direct.size(); ++i) first_overhead.push_back(gateway[i].first_token_ms - direct[i].first_token_ms);
  std::printf("%-22s %10.3f %10.3f %10.3f %10.3f\n", "gateway overhead", percentile(first_overhead, 0.5),
              percentile(first_overhead, 0.99), percentile(overhead, 0.5), percentile(overhead, 0.99));

  server.shutdown();
  io.join();
  std::error_code ignored;
  std::filesystem::remove_all(state_dir, ignored);
  return 0;
}
