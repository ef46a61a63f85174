// The grammar compile queue shared by tenants (docs/performance.md): another tenant's wait for
// one small schema while one tenant has N distinct schemas queued, through the real
// grammar_compiler and the served model's tokenizer.
//
//   edge_bench_grammar_queue --model DIR [--schemas 64] [--runs 3] [--threads N]
//
// Three arrangements, each on a fresh compiler (its vocabulary built before the clock starts):
//   * one queue: every request under one tenant name, so the compiler's turns degenerate to
//     first in, first out: how the compiler queued before it had per-tenant turns (one thread);
//   * turns, 1 thread: the busy tenant and the other one under their own names;
//   * turns, N threads: the same with --threads workers (default: what a server on this machine
//     picks, default_grammar_compile_threads).
// The waits of the turns are medians (with the range) of --runs runs; the single queue waits for
// all N compiles, so it runs once. The busy tenant's compiles left queued once the other tenant
// is answered are dropped with the compiler.
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/format.h"
#include "edge/common/time_source.h"
#include "edge/gateway/openai/grammar_compiler.h"

namespace {

namespace asio = boost::asio;
namespace g = edge::backend::grammar;
namespace gw = edge::gateway;
using clock_type = std::chrono::steady_clock;

std::shared_ptr<const g::grammar> schema_grammar(const std::string& schema) {
  g::grammar_builder b;
  auto root = b.json_schema(schema);
  if (!root.ok()) {
    std::fprintf(stderr, "schema %s: %s\n", schema.c_str(), root.error().message().c_str());
    std::exit(1);
  }
  auto built = b.build(*root);
  if (!built.ok()) {
    std::fprintf(stderr, "schema %s: %s\n", schema.c_str(), built.error().message().c_str());
    std::exit(1);
  }
  return std::make_shared<const g::grammar>(std::move(built).value());
}

// The busy tenant's i-th schema: an object with one bounded string property of its own name
// (about 0.2 s to compile at a 152k-token vocabulary, at the compile cost of this writing).
std::string busy_schema(int i) {
  return edge::format(
      R"({{"type":"object","properties":{{"f{}":{{"type":"string","maxLength":16}}}},"required":["f{}"]}})", i, i);
}
const std::string other_schema = R"({"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]})";

struct options {
  std::string model;
  int schemas = 64;
  int runs = 3;
  std::size_t threads = 0;
};

struct outcome {
  double wait_s = 0.0;     // the other tenant's, from its request to its answer
  double compile_s = 0.0;  // its own compile's share of it
  int busy_done = 0;       // the busy tenant's compiles answered before it
};

// One run: the busy tenant's schemas queued, then the other tenant's; ends once the other is
// answered (and, with one queue, everything before it).
outcome run_once(const edge::backend::tokenizer& tok, std::size_t threads, bool one_queue, int schemas) {
  const edge::real_time_source clock;
  asio::io_context io;
  outcome out;
  bool answered = false;
  {
    gw::grammar_compiler compiler(tok,
                                  {.threads = threads,
                                   .max_queued = static_cast<std::size_t>(schemas) + 8,
                                   .max_queued_per_tenant = static_cast<std::size_t>(schemas) + 8},
                                  nullptr, clock);
    // The vocabulary, built by a first compile before the clock starts.
    asio::co_spawn(
        io,
        [&compiler]() -> asio::awaitable<void> {
          const auto made = co_await compiler.compile("warm-up", schema_grammar(R"({"type":"boolean"})"));
          if (!made.ok()) std::fprintf(stderr, "warm-up: %s\n", made.error().message().c_str());
        },
        asio::detached);
    io.run();
    io.restart();

    const std::string busy = "busy";
    const std::string other = one_queue ? busy : "other";
    for (int i = 0; i < schemas; ++i) {
      asio::co_spawn(
          io,
          [&compiler, &out, &answered, busy, i]() -> asio::awaitable<void> {
            const auto made = co_await compiler.compile(busy, schema_grammar(busy_schema(i)));
            if (made.ok() && !answered) ++out.busy_done;
          },
          asio::detached);
    }
    io.poll();
    // Sent once every worker is busy with one of them, the rest queued.
    const std::size_t running = std::min<std::size_t>(threads, static_cast<std::size_t>(schemas));
    while (compiler.compiles_waiting() > static_cast<std::size_t>(schemas) - running) {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    const auto sent = clock_type::now();
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          const auto made = co_await compiler.compile(other, schema_grammar(other_schema));
          out.wait_s = std::chrono::duration<double>(clock_type::now() - sent).count();
          if (!made.ok()) {
            std::fprintf(stderr, "the other tenant's schema failed: %s\n", made.error().message().c_str());
            std::exit(1);
          }
          out.compile_s = made.value()->stats().seconds;
          answered = true;
          io.stop();
        },
        asio::detached);
    io.run();
  }  // the compiler drops what is still queued and finishes what runs
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void report(const char* what, const std::vector<outcome>& runs) {
  std::vector<double> waits;
  for (const outcome& o : runs) waits.push_back(o.wait_s);
  const auto [lo, hi] = std::minmax_element(waits.begin(), waits.end());
  std::printf("%-22s %10.3f %10.3f %10.3f %12.3f %14d\n", what, median(waits), *lo, *hi, runs.front().compile_s,
              runs.front().busy_done);
}

int run(const options& opt) {
  auto tok = edge::backend::load_model_tokenizer(opt.model);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.error().message().c_str());
    return 1;
  }
  const std::size_t threads =
      opt.threads > 0 ? opt.threads : gw::default_grammar_compile_threads(std::thread::hardware_concurrency());
  std::printf("== another tenant's wait while one tenant has %d distinct schemas queued (%lld-token vocabulary) ==\n",
              opt.schemas, static_cast<long long>((*tok)->vocab_size()));
  std::printf("%-22s %10s %10s %10s %12s %14s\n", "queue", "wait s", "min", "max", "own compile", "busy before");

  const std::vector<outcome> fifo = {run_once(**tok, 1, true, opt.schemas)};
  report("one queue (FIFO)", fifo);
  std::vector<outcome> turns;
  for (int r = 0; r < opt.runs; ++r) turns.push_back(run_once(**tok, 1, false, opt.schemas));
  report("turns, 1 thread", turns);
  if (threads > 1) {
    std::vector<outcome> wide;
    for (int r = 0; r < opt.runs; ++r) wide.push_back(run_once(**tok, threads, false, opt.schemas));
    report(edge::format("turns, {} threads", threads).c_str(), wide);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string key = argv[i];
    const std::string value = argv[i + 1];
    if (key == "--model") opt.model = value;
    else if (key == "--schemas") opt.schemas = std::max(1, std::atoi(value.c_str()));
    else if (key == "--runs") opt.runs = std::max(1, std::atoi(value.c_str()));
    else if (key == "--threads") opt.threads = static_cast<std::size_t>(std::max(0, std::atoi(value.c_str())));
  }
  if (opt.model.empty()) {
    std::fprintf(stderr, "usage: edge_bench_grammar_queue --model DIR [--schemas 64] [--runs 3] [--threads N]\n");
    return 2;
  }
  return run(opt);
}
