// The split gateway's routing policy with injected load reports and a manual clock: the score
// (queue, KV usage, the gateway's own in-flight count), ties, stale reports, prefix affinity and
// its overload escape, rendezvous placement of new prefixes, health, outlier ejection with
// backoff, and the exclusion of backends already tried (retries).
#include <doctest/doctest.h>

#include <chrono>
#include <vector>

#include "edge/common/time_source.h"
#include "edge/gateway/split/backend_router.h"

namespace gw = edge::gateway;
using namespace std::chrono_literals;

namespace {

gw::backend_load_report load(std::int64_t running, std::int64_t waiting, double kv_usage) {
  gw::backend_load_report r;
  r.running = running;
  r.waiting = waiting;
  r.in_flight = running + waiting;
  r.kv_blocks_total = 100;
  r.kv_blocks_free = static_cast<std::int64_t>(100 * (1.0 - kv_usage));
  r.kv_usage = kv_usage;
  r.block_size = 16;
  return r;
}

struct fixture {
  edge::manual_time_source clock;
  gw::router_options options;
  gw::backend_router router;

  explicit fixture(std::size_t n = 2, gw::router_options o = {})
      : options(o), router(names(n), o, clock) {
    for (std::size_t i = 0; i < n; ++i) router.set_healthy(i, true);
  }

  static std::vector<std::string> names(std::size_t n) {
    std::vector<std::string> out;
    for (std::size_t i = 0; i < n; ++i) out.push_back("http://10.0.0." + std::to_string(i + 1) + ":8081");
    return out;
  }

  std::size_t pick(const std::optional<gw::affinity_key>& key = std::nullopt, std::vector<std::size_t> excluded = {}) {
    const auto choice = router.choose(key, excluded);
    REQUIRE(choice.has_value());
    return choice->backend;
  }
};

gw::affinity_key key_of(std::int32_t first_token) {
  std::vector<std::int32_t> prompt(64);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = first_token + static_cast<std::int32_t>(i);
  return *gw::prompt_affinity_key("tenant-a", prompt, 16, 4);
}

}  // namespace

TEST_CASE("the backend with the emptier KV cache wins when queues are equal") {
  fixture f;
  f.router.report_load(0, load(2, 0, 0.95));
  f.router.report_load(1, load(2, 0, 0.10));
  for (int i = 0; i < 4; ++i) CHECK(f.pick() == 1);
  CHECK(f.router.score(0) > f.router.score(1));
}

TEST_CASE("a waiting queue counts more than the same number running") {
  fixture f;
  f.router.report_load(0, load(0, 3, 0.2));
  f.router.report_load(1, load(3, 0, 0.2));
  CHECK(f.pick() == 1);
  CHECK(f.router.score(0) == doctest::Approx(f.router.score(1) + 3.0));
}

TEST_CASE("requests sent since the last report count at once") {
  fixture f;
  f.router.report_load(0, load(0, 0, 0.0));
  f.router.report_load(1, load(0, 0, 0.0));
  // Requests go where the gateway sent fewer, without waiting for the next report.
  std::vector<int> per_backend(2);
  for (int i = 0; i < 6; ++i) {
    const std::size_t b = f.pick();
    f.router.dispatched(b);
    ++per_backend[b];
  }
  CHECK(per_backend[0] == 3);
  CHECK(per_backend[1] == 3);
  CHECK(f.router.outstanding(0) == 3);

  // A report that already counts them does not count them twice.
  f.router.report_load(0, load(3, 0, 0.0));
  CHECK(f.router.score(0) == doctest::Approx(3.0));
  f.router.dispatched(0);
  CHECK(f.router.score(0) == doctest::Approx(4.0));
  f.router.finished(0);
  f.router.finished(0);
  CHECK(f.router.outstanding(0) == 2);
}

TEST_CASE("equal scores rotate, so idle backends share sequential requests") {
  fixture f(3);
  for (std::size_t i = 0; i < 3; ++i) f.router.report_load(i, load(0, 0, 0.0));
  std::vector<int> per_backend(3);
  for (int i = 0; i < 9; ++i) ++per_backend[f.pick()];
  CHECK(per_backend == std::vector<int>{3, 3, 3});
}

TEST_CASE("a report older than report_max_age is ignored") {
  fixture f;
  f.router.report_load(0, load(10, 10, 1.0));
  f.router.report_load(1, load(0, 0, 0.0));
  CHECK(f.pick() == 1);
  f.clock.advance(f.options.report_max_age + 1ms);
  CHECK(f.router.score(0) == doctest::Approx(0.0));  // unknown load: only the gateway's own count
  f.router.dispatched(1);
  CHECK(f.pick() == 0);
}

TEST_CASE("prefix affinity: a remembered prefix goes back to its backend unless that one is overloaded") {
  fixture f;
  f.router.report_load(0, load(1, 0, 0.3));
  f.router.report_load(1, load(0, 0, 0.0));
  const gw::affinity_key key = key_of(100);
  f.router.remember(key, 0);

  const auto held = f.router.choose(key, {});
  REQUIRE(held);
  CHECK(held->backend == 0);  // within the slack of the least loaded
  CHECK(held->reason == gw::route_reason::affinity);
  CHECK(f.pick() == 1);       // without a key: the least loaded

  // Backend 0 fills up: its score passes the best one by more than the slack.
  f.router.report_load(0, load(4, 2, 1.0));
  const auto moved = f.router.choose(key, {});
  REQUIRE(moved);
  CHECK(moved->backend == 1);
  CHECK(moved->reason == gw::route_reason::least_loaded);

  // An unhealthy backend loses its prefixes too.
  f.router.report_load(0, load(0, 0, 0.0));
  f.router.set_healthy(0, false);
  CHECK(f.pick(key) == 1);
}

TEST_CASE("a new prefix is placed by rendezvous hashing, the same way by every gateway") {
  fixture a(4);
  fixture b(4);
  for (std::size_t i = 0; i < 4; ++i) {
    a.router.report_load(i, load(0, 0, 0.0));
    b.router.report_load(i, load(1, 0, 0.1));
  }
  std::vector<int> placed(4);
  for (std::int32_t t = 0; t < 64; ++t) {
    const gw::affinity_key key = key_of(t * 1000);
    const auto in_a = a.router.choose(key, {});
    const auto in_b = b.router.choose(key, {});
    REQUIRE(in_a);
    REQUIRE(in_b);
    CHECK(in_a->reason == gw::route_reason::rendezvous);
    CHECK(in_a->backend == in_b->backend);
    ++placed[in_a->backend];
  }
  // Spread over every backend rather than piled on one.
  for (const int n : placed) CHECK(n > 0);

  // Without the prefix's backend, rendezvous picks among the others.
  const gw::affinity_key key = key_of(7);
  const std::size_t first = a.pick(key);
  const std::size_t second = a.pick(key, {first});
  CHECK(second != first);
}

TEST_CASE("affinity keys: whole blocks only, the first K of them, salted by tenant") {
  std::vector<std::int32_t> prompt(100);
  for (std::size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<std::int32_t>(i);
  const std::span<const std::int32_t> all(prompt);
  CHECK_FALSE(gw::prompt_affinity_key("t", all.first(15), 16, 4).has_value());  // no full block
  CHECK(gw::prompt_affinity_key("t", all.first(16), 16, 4).has_value());
  // Past K blocks the rest of the prompt does not matter.
  CHECK(*gw::prompt_affinity_key("t", all.first(64), 16, 4) == *gw::prompt_affinity_key("t", all, 16, 4));
  CHECK(*gw::prompt_affinity_key("t", all.first(48), 16, 4) != *gw::prompt_affinity_key("t", all, 16, 4));
  CHECK(*gw::prompt_affinity_key("t", all, 16, 4) != *gw::prompt_affinity_key("u", all, 16, 4));
  // The key is the backend's own prefix-cache hash of the last block hashed.
  auto chained = edge::backend::prefix_root_hash("t");
  chained = edge::backend::chain_block_hash(chained, all.first(16));
  CHECK(*gw::prompt_affinity_key("t", all.first(20), 16, 4) == chained);
}

TEST_CASE("the affinity map is bounded: the least recently used key goes first") {
  gw::router_options o;
  o.affinity_capacity = 2;
  fixture f(2, o);
  f.router.report_load(0, load(0, 0, 0.0));
  f.router.report_load(1, load(0, 0, 0.0));
  f.router.remember(key_of(1), 0);
  f.router.remember(key_of(2), 0);
  CHECK(f.router.choose(key_of(1), {})->reason == gw::route_reason::affinity);  // key 1 is now the most recent
  f.router.remember(key_of(3), 1);
  CHECK(f.router.remembered_keys() == 2);
  CHECK(f.router.choose(key_of(1), {})->reason == gw::route_reason::affinity);
  CHECK(f.router.choose(key_of(2), {})->reason != gw::route_reason::affinity);  // evicted
}

TEST_CASE("consecutive failures eject a backend for a backoff that doubles, and success resets it") {
  fixture f;
  f.router.report_load(0, load(0, 0, 0.0));
  f.router.report_load(1, load(5, 5, 0.9));
  CHECK(f.pick() == 0);
  CHECK_FALSE(f.router.failed(0));
  CHECK_FALSE(f.router.failed(0));
  CHECK(f.router.failed(0));  // the third in a row
  CHECK(f.router.ejected(0));
  CHECK_FALSE(f.router.available(0));
  CHECK(f.pick() == 1);
  CHECK_FALSE(f.router.failed(0));  // while ejected, late failures do not extend it

  f.clock.advance(f.options.ejection_base);
  CHECK(f.router.available(0));
  CHECK(f.pick() == 0);
  f.router.failed(0);
  f.router.failed(0);
  CHECK(f.router.failed(0));
  f.clock.advance(f.options.ejection_base);
  CHECK(f.router.ejected(0));  // the second ejection in a row lasts twice as long
  f.clock.advance(f.options.ejection_base);
  CHECK_FALSE(f.router.ejected(0));

  // A success ends the run: the next ejection is short again, and a failure between
  // successes never ejects.
  f.router.succeeded(0);
  f.router.failed(0);
  f.router.failed(0);
  f.router.succeeded(0);
  CHECK_FALSE(f.router.failed(0));
  CHECK_FALSE(f.router.failed(0));
  CHECK(f.router.failed(0));
  f.clock.advance(f.options.ejection_base);
  CHECK_FALSE(f.router.ejected(0));
}

TEST_CASE("the backoff is capped at ejection_max") {
  gw::router_options o;
  o.eject_after_failures = 1;
  o.ejection_base = 1s;
  o.ejection_max = 3s;
  fixture f(1, o);
  for (int round = 0; round < 5; ++round) {
    CHECK(f.router.failed(0));
    f.clock.advance(o.ejection_max);
    CHECK_FALSE(f.router.ejected(0));
  }
}

TEST_CASE("retries skip the backends already tried; nothing is left when all were") {
  fixture f(3);
  for (std::size_t i = 0; i < 3; ++i) f.router.report_load(i, load(0, 0, 0.0));
  const std::size_t first = f.pick();
  const std::size_t second = f.pick(std::nullopt, {first});
  CHECK(second != first);
  const std::size_t third = f.pick(std::nullopt, {first, second});
  CHECK(third != first);
  CHECK(third != second);
  const std::vector<std::size_t> all{0, 1, 2};
  CHECK_FALSE(f.router.choose(std::nullopt, all).has_value());
}

TEST_CASE("unhealthy backends are never chosen") {
  fixture f;
  f.router.set_healthy(0, false);
  for (int i = 0; i < 4; ++i) CHECK(f.pick() == 1);
  f.router.set_healthy(1, false);
  CHECK(f.router.available_count() == 0);
  CHECK_FALSE(f.router.choose(std::nullopt, {}).has_value());
}
