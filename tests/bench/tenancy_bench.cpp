// What tenancy costs a request on the hot path: authenticating an API key against the store's
// snapshot (SHA-256 + constant-time compare + expiry check), admitting and reserving it against
// the quotas and settling it (with a daily budget, also writing and releasing its hold), and
// recording usage in the ledger. Prints the median of several runs, per call, for one thread and
// for several threads at once (all tenants distinct, or all one).
//
//   edge_bench_tenancy [--calls N] [--repeat R] [--threads T]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <unistd.h>

#include "edge/common/format.h"
#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/tenancy.h"

namespace gw = edge::gateway;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  int calls = 200000;
  int repeat = 5;
  int threads = 4;
};

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int value = std::atoi(argv[i + 1]);
    if (flag == "--calls") o.calls = value;
    else if (flag == "--repeat") o.repeat = value;
    else if (flag == "--threads") o.threads = value;
  }
  return o;
}

// Median over `repeat` runs of `threads` threads each doing `calls` calls of body(thread, i):
// nanoseconds per call as one caller sees it.
template <class F>
double median_ns(const options& o, int threads, F&& body) {
  std::vector<double> runs;
  for (int r = 0; r < o.repeat; ++r) {
    const auto start = clock_type::now();
    std::vector<std::thread> workers;
    for (int t = 0; t < threads; ++t) {
      workers.emplace_back([&, t] {
        for (int i = 0; i < o.calls; ++i) body(t, i);
      });
    }
    for (auto& w : workers) w.join();
    runs.push_back(std::chrono::duration<double, std::nano>(clock_type::now() - start).count() / o.calls);
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// One request's whole admission and settlement, run to its end on this thread's io_context
// (with the counters in memory nothing in it waits).
void admit_and_settle(gw::tenancy& tenants, const gw::authenticated_tenant& who) {
  thread_local boost::asio::io_context io;
  boost::asio::co_spawn(
      io,
      [&]() -> boost::asio::awaitable<void> {
        gw::request_session session = tenants.session_for(who);
        if (co_await session.admit("chat_completions")) std::abort();
        if (co_await session.reserve(100, 100)) std::abort();
        session.metered([](edge::backend::engine_event) {})(edge::backend::delta_event{.tokens = std::vector<edge::backend::token_id>(50, 1)});
      },
      boost::asio::detached);
  io.restart();
  io.run();
}

}  // namespace

int main(int argc, char** argv) {
  const options o = parse(argc, argv);
  const auto dir = std::filesystem::temp_directory_path() / edge::format("edge_bench_tenancy_{}", ::getpid());
  const edge::real_time_source clock;
  auto opened = gw::tenancy::open({.state_dir = dir}, clock, nullptr);
  if (!opened.ok()) {
    std::fprintf(stderr, "%s\n", opened.error().to_string().c_str());
    return 1;
  }
  gw::tenancy& tenants = **opened;
  const gw::audit_context who{"bench", ""};
  std::vector<std::string> keys;
  std::vector<gw::authenticated_tenant> callers;  // rates and concurrency
  std::vector<gw::authenticated_tenant> budgeted;  // and a daily budget
  for (int t = 0; t < std::max(o.threads, 1); ++t) {
    gw::tenant_record tenant;
    tenant.id = edge::format("tenant-{}", t);
    // Limits far above what the benchmark sends, so every call is admitted and all are checked.
    tenant.quotas = {1'000'000'000, 1'000'000'000'000, 1'000'000, std::nullopt, 100000};
    (void)tenants.store().create_tenant(tenant, who);
    keys.push_back(std::move(tenants.store().create_key(tenant.id, std::nullopt, who)).value().key);
    callers.push_back({tenants.store().snapshot()->tenant(tenant.id), "bench"});
    tenant.id = edge::format("budgeted-{}", t);
    tenant.quotas.daily_tokens = 1'000'000'000'000'000;
    (void)tenants.store().create_tenant(tenant, who);
    budgeted.push_back({tenants.store().snapshot()->tenant(tenant.id), "bench"});
  }
  std::vector<gw::request> requests;
  for (const auto& key : keys) {
    gw::request req{gw::http::verb::post, "/v1/completions", 11};
    req.set(gw::http::field::authorization, "Bearer " + key);
    requests.push_back(std::move(req));
  }

  std::printf("tenancy hot path, ns per call (median of %d runs of %d calls per thread)\n", o.repeat, o.calls);
  std::printf("%-44s %10s %14s %14s\n", "", "1 thread", edge::format("{} tenants", o.threads).c_str(),
              edge::format("{} on 1", o.threads).c_str());
  std::fflush(stdout);
  // Each row takes a while (3 x repeat runs): say on stderr what is being measured, so a run that
  // takes minutes shows where it is; the table on stdout stays clean.
  const auto row = [&](const char* name, auto&& body) {
    std::fprintf(stderr, "measuring: %s (1 thread)\n", name);
    const double one = median_ns(o, 1, [&](int, int i) { body(0, i); });
    std::fprintf(stderr, "measuring: %s (%d threads, %d tenants)\n", name, o.threads, o.threads);
    const double many = median_ns(o, o.threads, body);
    std::fprintf(stderr, "measuring: %s (%d threads, one tenant)\n", name, o.threads);
    const double shared = median_ns(o, o.threads, [&](int, int i) { body(0, i); });
    std::printf("%-44s %10.0f %14.0f %14.0f\n", name, one, many, shared);
    std::fflush(stdout);
  };
  row("authenticate (Bearer ek-... -> tenant)", [&](int t, int) {
    auto caller = tenants.authenticate(requests[static_cast<std::size_t>(t)]);
    if (!caller.ok()) std::abort();
  });
  // The session's end also records the usage in the ledger.
  row("admit + reserve + settle (rates, concurrency)",
      [&](int t, int) { admit_and_settle(tenants, callers[static_cast<std::size_t>(t)]); });
  row("  + a daily budget (hold written to SQLite)",
      [&](int t, int) { admit_and_settle(tenants, budgeted[static_cast<std::size_t>(t)]); });
  row("ledger.record", [&](int t, int) {
    tenants.ledger().record(callers[static_cast<std::size_t>(t)].tenant->id, {1, 100, 50, 0, 0});
  });
  opened->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
