#include "edge/common/thread_pool.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;

// A deadlock would otherwise hang the test binary in the pool's destructor; failing loudly and
// at once is more useful than waiting for the harness timeout.
template <class T>
T get_or_abort(std::future<T>& future, const char* what) {
  if (future.wait_for(10s) != std::future_status::ready) {
    std::fprintf(stderr, "thread_pool_test: %s did not finish (deadlock?)\n", what);
    std::abort();
  }
  return future.get();
}

// Runs parallel_for over [begin, begin + size) and checks that every index was visited
// exactly once, by chunks that are non-empty, inside the range and no larger than the grain.
void check_covers_once(edge::thread_pool& pool, std::size_t begin, std::size_t size, std::size_t grain) {
  CAPTURE(size);
  CAPTURE(grain);
  std::vector<std::atomic<int>> visits(size);
  std::atomic<int> bad_chunks{0};
  pool.parallel_for(begin, begin + size, grain, [&](std::size_t chunk_begin, std::size_t chunk_end) {
    if (chunk_begin >= chunk_end || chunk_begin < begin || chunk_end > begin + size ||
        (grain != 0 && chunk_end - chunk_begin > grain)) {
      bad_chunks.fetch_add(1);
      return;
    }
    for (std::size_t i = chunk_begin; i < chunk_end; ++i) visits[i - begin].fetch_add(1, std::memory_order_relaxed);
  });
  CHECK(bad_chunks.load() == 0);
  std::size_t wrong = 0;
  for (const std::atomic<int>& v : visits) wrong += v.load() != 1 ? 1 : 0;
  CHECK(wrong == 0);
}

}  // namespace

TEST_CASE("a pool has the requested number of threads") {
  CHECK(edge::thread_pool(1).size() == 1);
  CHECK(edge::thread_pool(3).size() == 3);
  const std::size_t hardware = std::max(1u, std::thread::hardware_concurrency());
  CHECK(edge::thread_pool(0).size() == hardware);
}

TEST_CASE("submit returns the task's value") {
  edge::thread_pool pool(2);
  std::future<int> answer = pool.submit([] { return 6 * 7; });
  std::future<std::string> text = pool.submit([] { return std::string("edge"); });
  std::atomic<bool> ran{false};
  std::future<void> done = pool.submit([&ran] { ran = true; });
  CHECK(answer.get() == 42);
  CHECK(text.get() == "edge");
  done.get();
  CHECK(ran.load());

  // Move-only captures are accepted.
  auto owned = std::make_unique<int>(5);
  CHECK(pool.submit([p = std::move(owned)] { return *p + 1; }).get() == 6);
}

TEST_CASE("submit propagates a task's exception through the future") {
  edge::thread_pool pool(1);
  std::future<int> failing = pool.submit([]() -> int { throw std::runtime_error("model file truncated"); });
  // Waiting on a later task first makes the worker release its share of the failed task before
  // get(): libstdc++ counts exception_ptr references in code ThreadSanitizer cannot see, so a
  // release on the worker racing the handler here would be reported as a false data race.
  CHECK(pool.submit([] { return 1; }).get() == 1);
  CHECK_THROWS_WITH_AS(failing.get(), "model file truncated", std::runtime_error);
  // The worker survived the exception.
  CHECK(pool.submit([] { return 2; }).get() == 2);
}

TEST_CASE("parallel_for covers every index exactly once") {
  edge::thread_pool pool(3);
  for (const std::size_t size : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
    for (const std::size_t grain : {std::size_t{0}, std::size_t{1}, std::size_t{3}, std::size_t{64},
                                    std::size_t{999}, std::size_t{1000}, std::size_t{5000}}) {
      check_covers_once(pool, 0, size, grain);
      check_covers_once(pool, 17, size, grain);
    }
  }
  for (const std::size_t grain : {std::size_t{0}, std::size_t{7}, std::size_t{4096}, std::size_t{2'000'000}}) {
    check_covers_once(pool, 0, 1'000'003, grain);
  }
}

TEST_CASE("parallel_for with an empty or inverted range calls nothing") {
  edge::thread_pool pool(2);
  std::atomic<int> calls{0};
  pool.parallel_for(5, 5, 1, [&](std::size_t, std::size_t) { calls.fetch_add(1); });
  pool.parallel_for(9, 3, 1, [&](std::size_t, std::size_t) { calls.fetch_add(1); });
  CHECK(calls.load() == 0);
}

TEST_CASE("parallel_for spreads chunks over the workers and the calling thread") {
  edge::thread_pool pool(2);
  std::mutex mutex;
  std::condition_variable changed;
  std::set<std::thread::id> threads;
  // Each chunk waits until three threads have taken one: it can end only if both workers and
  // the caller run chunks at once. The bound on the wait only keeps a broken pool from hanging.
  bool all_three = false;
  pool.parallel_for(0, 24, 1, [&](std::size_t, std::size_t) {
    std::unique_lock lock(mutex);
    threads.insert(std::this_thread::get_id());
    if (threads.size() == 3) changed.notify_all();
    all_three = changed.wait_for(lock, 60s, [&] { return threads.size() == 3; }) || all_three;
  });
  CHECK(all_three);
  CHECK(threads.size() == 3);
  CHECK(threads.count(std::this_thread::get_id()) == 1);
}

TEST_CASE("parallel_for called from several threads at once") {
  edge::thread_pool pool(2);
  constexpr std::size_t callers = 4;
  constexpr std::size_t rounds = 40;
  constexpr std::size_t size = 5000;
  std::vector<std::size_t> wrong_sums(callers, 0);
  std::vector<std::thread> threads;
  for (std::size_t c = 0; c < callers; ++c) {
    threads.emplace_back([&, c] {
      for (std::size_t round = 0; round < rounds; ++round) {
        std::atomic<std::size_t> sum{0};
        pool.parallel_for(0, size, 97 + c, [&](std::size_t b, std::size_t e) {
          std::size_t local = 0;
          for (std::size_t i = b; i < e; ++i) local += i + c;
          sum.fetch_add(local, std::memory_order_relaxed);
        });
        if (sum.load() != size * (size - 1) / 2 + size * c) ++wrong_sums[c];
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (std::size_t c = 0; c < callers; ++c) CHECK(wrong_sums[c] == 0);
}

TEST_CASE("parallel_for inside tasks that occupy every worker does not deadlock") {
  for (const std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
    CAPTURE(threads);
    edge::thread_pool pool(threads);
    std::vector<std::future<std::size_t>> results;
    for (std::size_t t = 0; t < 2 * threads; ++t) {
      results.push_back(pool.submit([&pool] {
        std::atomic<std::size_t> total{0};
        pool.parallel_for(0, 300, 7, [&](std::size_t b, std::size_t e) { total.fetch_add(e - b); });
        return total.load();
      }));
    }
    for (std::future<std::size_t>& result : results) CHECK(get_or_abort(result, "a loop inside a task") == 300);
  }
}

TEST_CASE("parallel_for nested two levels deep inside parallel_for bodies does not deadlock") {
  for (const std::size_t threads : {std::size_t{1}, std::size_t{2}}) {
    CAPTURE(threads);
    edge::thread_pool pool(threads);
    std::future<std::size_t> total = std::async(std::launch::async, [&pool] {
      std::atomic<std::size_t> cells{0};
      pool.parallel_for(0, 8, 1, [&](std::size_t, std::size_t) {
        pool.parallel_for(0, 16, 3, [&](std::size_t, std::size_t) {
          pool.parallel_for(0, 10, 2, [&](std::size_t b, std::size_t e) { cells.fetch_add(e - b); });
        });
      });
      return cells.load();
    });
    // 8 outer chunks x 6 middle chunks x 10 inner indices.
    CHECK(get_or_abort(total, "a doubly nested loop") == 8 * 6 * 10);
  }
}

TEST_CASE("an exception in a parallel_for body reaches the caller and the pool stays usable") {
  edge::thread_pool pool(2);
  constexpr std::size_t chunks = 500;
  std::atomic<std::size_t> started{0};
  std::atomic<std::size_t> finished{0};
  auto body = [&](std::size_t, std::size_t) {
    if (started.fetch_add(1) == 0) {
      finished.fetch_add(1);
      throw std::invalid_argument("bad row");
    }
    std::this_thread::sleep_for(200us);
    finished.fetch_add(1);
  };
  CHECK_THROWS_WITH_AS(pool.parallel_for(0, chunks, 1, body), "bad row", std::invalid_argument);
  // Chunks already running had finished before the exception reached the caller, so none can
  // touch the caller's state afterwards.
  CHECK(finished.load() == started.load());
  // Chunks not yet claimed when the first one threw were skipped. (Running them all would take
  // at least chunks x 200us / 3 threads, far longer than stopping takes.)
  CHECK(started.load() < chunks);

  std::atomic<std::size_t> covered{0};
  pool.parallel_for(0, 1000, 10, [&](std::size_t b, std::size_t e) { covered.fetch_add(e - b); });
  CHECK(covered.load() == 1000);
}

TEST_CASE("destroying the pool runs every pending task") {
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  std::vector<int> order;  // touched only by the single worker until the pool is gone
  std::atomic<int> nested_ran{0};
  std::thread opener;
  {
    edge::thread_pool pool(1);
    pool.submit([opened] { opened.wait(); });
    for (int i = 0; i < 100; ++i) pool.submit([&order, i] { order.push_back(i); });
    // A task queued by a task while the pool drains runs too.
    pool.submit([&pool, &nested_ran] { pool.submit([&nested_ran] { nested_ran = 1; }); });
    // Opened only after the destructor has begun, so the tasks are still queued when it starts.
    opener = std::thread([&gate] {
      std::this_thread::sleep_for(50ms);
      gate.set_value();
    });
  }
  opener.join();
  REQUIRE(order.size() == 100);
  bool in_order = true;
  for (int i = 0; i < 100; ++i) in_order = in_order && order[static_cast<std::size_t>(i)] == i;
  CHECK(in_order);
  CHECK(nested_ran.load() == 1);
}

TEST_CASE("a pool of one thread runs tasks and loops") {
  edge::thread_pool pool(1);
  CHECK(pool.size() == 1);
  CHECK(pool.submit([] { return 3; }).get() == 3);
  check_covers_once(pool, 0, 1000, 9);
  check_covers_once(pool, 0, 7, 0);
}
