// What the quota store costs a request: the latency of try_admit + try_reserve + finish (settle +
// release; every limit set, so every counter is read and written) with the counters in memory and in Redis,
// in this process; and, against running servers, the latency of a whole non-streamed
// /v1/chat/completions with max_tokens 1 over one keep-alive connection. Prints p50 and p99,
// each the median over several runs. tests/bench/quota.sh starts Redis and the servers.
//
//   edge_bench_quota store --redis redis://127.0.0.1:6379/0 [--calls N] [--repeat R]
//   edge_bench_quota http memory=http://127.0.0.1:8080=ek-... redis=http://127.0.0.1:8081=ek-... [--calls N] [--repeat R]
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string_view>
#include <memory>
#include <string>
#include <vector>

#include "edge/common/format.h"
#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/quota.h"
#include "edge/gateway/tenancy/redis_quota_store.h"

namespace gw = edge::gateway;
namespace beast = boost::beast;
namespace http = beast::http;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::string mode;
  std::map<std::string, std::string> flags;
  int calls = 20000;
  int repeat = 5;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) o.flags[argv[i]] = argv[i + 1];
  if (o.flags.contains("--calls")) o.calls = std::max(1, std::atoi(o.flags["--calls"].c_str()));
  if (o.flags.contains("--repeat")) o.repeat = std::max(1, std::atoi(o.flags["--repeat"].c_str()));
  return o;
}

struct percentiles {
  double p50_us = 0;
  double p99_us = 0;
};

// p50 and p99 of one run's latencies (microseconds).
percentiles of_run(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  const auto at = [&](double q) { return us[std::min(us.size() - 1, static_cast<std::size_t>(q * static_cast<double>(us.size())))]; };
  return {at(0.50), at(0.99)};
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs `repeat` runs of `calls` timed calls of body() after a warm-up; medians of the runs' p50s and p99s.
template <class F>
percentiles measure(const options& o, F&& body) {
  for (int i = 0; i < std::min(o.calls, 1000); ++i) body();
  std::vector<double> p50s, p99s;
  for (int r = 0; r < o.repeat; ++r) {
    std::vector<double> us;
    us.reserve(static_cast<std::size_t>(o.calls));
    for (int i = 0; i < o.calls; ++i) {
      const auto start = clock_type::now();
      body();
      us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count());
    }
    const percentiles p = of_run(std::move(us));
    p50s.push_back(p.p50_us);
    p99s.push_back(p.p99_us);
  }
  return {median(p50s), median(p99s)};
}

int run_store(const options& o) {
  const auto url = o.flags.find("--redis");
  if (url == o.flags.end()) {
    std::fprintf(stderr, "store: --redis redis://HOST:PORT/DB is required\n");
    return 2;
  }
  auto address = gw::parse_redis_url(url->second);
  if (!address.ok()) {
    std::fprintf(stderr, "%s\n", address.error().message().c_str());
    return 2;
  }
  const edge::real_time_source clock;
  gw::in_memory_quota_store memory(clock);
  gw::redis_quota_options redis_options;
  redis_options.address = *address;
  redis_options.key_prefix = "edgeinfer-bench:";
  auto redis = gw::redis_quota_store::create(redis_options, nullptr);
  if (!redis->up()) {
    std::fprintf(stderr, "Redis at %s does not answer\n", address->to_string().c_str());
    return 1;
  }
  // Every limit set and never reached: each call reads and writes every counter.
  constexpr std::int64_t huge = std::int64_t{1} << 40;
  const gw::tenant_quotas quotas{.requests_per_minute = huge, .tokens_per_minute = huge, .max_concurrent = huge,
                                 .daily_tokens = huge, .max_tokens_per_request = huge};
  gw::reservation_ids ids;
  const auto cycle = [&](gw::quota_store& store) {
    return [&store, &quotas, &ids] {
      const std::string id = ids.next();
      const gw::quota_decision admitted = store.try_admit({"bench", quotas, id});
      const gw::quota_decision d =
          admitted.allowed ? store.try_reserve(admitted.reservation, {"bench", quotas, 100, 100}) : admitted;
      if (!d.allowed) {
        std::fprintf(stderr, "refused: %s\n", d.message.c_str());
        std::exit(1);
      }
      store.finish(d.reservation, 150);  // settle + release, as a request's end does
    };
  };
  const percentiles in_memory = measure(o, cycle(memory));
  const percentiles in_redis = measure(o, cycle(*redis));
  std::printf("try_admit + try_reserve + finish (settle + release), every limit set (median of %d runs of %d calls, one thread)\n",
              o.repeat, o.calls);
  std::printf("  %-8s %10s %10s\n", "store", "p50 us", "p99 us");
  std::printf("  %-8s %10.2f %10.2f\n", "memory", in_memory.p50_us, in_memory.p99_us);
  std::printf("  %-8s %10.2f %10.2f\n", "redis", in_redis.p50_us, in_redis.p99_us);
  std::printf("  redis / memory: p50 x%.0f, p99 x%.0f\n", in_redis.p50_us / in_memory.p50_us,
              in_redis.p99_us / in_memory.p99_us);
  return 0;
}

// One keep-alive connection to a server, sending the same small chat request.
class chat_client {
 public:
  chat_client(std::string label, const std::string& url, const std::string& key) : label_(std::move(label)), stream_(io_) {
    const auto colon = url.rfind(':');
    if (!url.starts_with("http://") || colon == std::string::npos || colon < 7) {
      throw std::runtime_error("a target's URL must be http://HOST:PORT");
    }
    const std::string host = url.substr(7, colon - 7);
    stream_.connect(boost::asio::ip::tcp::resolver(io_).resolve(host, url.substr(colon + 1)));
    req_ = {http::verb::post, "/v1/chat/completions", 11};
    req_.set(http::field::host, host);
    req_.set(http::field::authorization, "Bearer " + key);
    req_.set(http::field::content_type, "application/json");
    req_.keep_alive(true);
    req_.body() = R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":1,"temperature":0})";
    req_.prepare_payload();
  }

  void once() {
    http::write(stream_, req_);
    http::response<http::string_body> res;
    http::read(stream_, buffer_, res);
    if (res.result() != http::status::ok) {
      throw std::runtime_error(edge::format("{}: HTTP {}: {}", label_, res.result_int(), res.body()));
    }
  }
  const std::string& label() const { return label_; }

 private:
  std::string label_;
  boost::asio::io_context io_;
  beast::tcp_stream stream_;
  http::request<http::string_body> req_;
  beast::flat_buffer buffer_;
};

// Targets LABEL=URL=KEY, measured in turn, run after run, so that both see the same machine.
int run_http(const options& o, const std::vector<std::string>& targets) {
  std::vector<std::unique_ptr<chat_client>> clients;
  for (const std::string& t : targets) {
    const auto first = t.find('=');
    const auto second = t.find('=', first == std::string::npos ? first : first + 1);
    if (first == std::string::npos || second == std::string::npos) {
      std::fprintf(stderr, "http: a target is LABEL=URL=KEY, not \"%s\"\n", t.c_str());
      return 2;
    }
    clients.push_back(std::make_unique<chat_client>(t.substr(0, first), t.substr(first + 1, second - first - 1),
                                                    t.substr(second + 1)));
  }
  if (clients.empty()) {
    std::fprintf(stderr, "http: name at least one target LABEL=URL=KEY\n");
    return 2;
  }
  for (auto& c : clients) {
    for (int i = 0; i < std::min(o.calls, 200); ++i) c->once();
  }
  std::vector<std::vector<double>> p50s(clients.size()), p99s(clients.size());
  for (int r = 0; r < o.repeat; ++r) {
    for (std::size_t c = 0; c < clients.size(); ++c) {
      std::vector<double> us;
      for (int i = 0; i < o.calls; ++i) {
        const auto start = clock_type::now();
        clients[c]->once();
        us.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count());
      }
      const percentiles p = of_run(std::move(us));
      p50s[c].push_back(p.p50_us);
      p99s[c].push_back(p.p99_us);
    }
  }
  std::printf("/v1/chat/completions, max_tokens 1, non-streamed, one keep-alive connection (median of %d runs of %d)\n",
              o.repeat, o.calls);
  std::printf("  %-8s %10s %10s\n", "server", "p50 us", "p99 us");
  for (std::size_t c = 0; c < clients.size(); ++c) {
    std::printf("  %-8s %10.1f %10.1f\n", clients[c]->label().c_str(), median(p50s[c]), median(p99s[c]));
  }
  for (std::size_t c = 1; c < clients.size(); ++c) {
    std::printf("  %s - %s: p50 %+.1f us, p99 %+.1f us\n", clients[c]->label().c_str(), clients[0]->label().c_str(),
                median(p50s[c]) - median(p50s[0]), median(p99s[c]) - median(p99s[0]));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Flags come in pairs; the http mode's targets (LABEL=URL=KEY) are the words that are not.
  std::vector<std::string> words;
  std::vector<char*> flags{argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::string_view(argv[i]).starts_with("--") && i + 1 < argc) {
      flags.push_back(argv[i]);
      flags.push_back(argv[++i]);
    } else {
      words.emplace_back(argv[i]);
    }
  }
  options o = parse(static_cast<int>(flags.size()), flags.data());
  o.mode = words.empty() ? "" : words.front();
  try {
    if (o.mode == "store") return run_store(o);
    if (o.mode == "http") return run_http(o, {words.begin() + 1, words.end()});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::fprintf(stderr,
               "usage: edge_bench_quota store --redis URL [--calls N] [--repeat R]\n"
               "       edge_bench_quota http LABEL=URL=KEY... [--calls N] [--repeat R]\n");
  return 2;
}
