// The split gateway's routing policy with injected load reports and a manual clock: the score
// (queue, KV usage, the gateway's own in-flight count), ties, stale reports, prefix affinity and
// its overload escape, rendezvous placement of new prefixes, health, outlier ejection with
// backoff, the exclusion of backends already tried (retries), and session affinity (rendezvous
// hashing with bounded loads, tenant-scoped keys, what moves when a backend leaves).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <string>
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
    const auto choice = router.choose({.prefix = key}, excluded);
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

  const auto held = f.router.choose({.prefix = key}, {});
  REQUIRE(held);
  CHECK(held->backend == 0);  // within the slack of the least loaded
  CHECK(held->reason == gw::route_reason::affinity);
  CHECK(f.pick() == 1);       // without a key: the least loaded

  // Backend 0 fills up: its score passes the best one by more than the slack.
  f.router.report_load(0, load(4, 2, 1.0));
  const auto moved = f.router.choose({.prefix = key}, {});
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
    const auto in_a = a.router.choose({.prefix = key}, {});
    const auto in_b = b.router.choose({.prefix = key}, {});
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
  CHECK(f.router.choose({.prefix = key_of(1)}, {})->reason == gw::route_reason::affinity);  // key 1 is now the most recent
  f.router.remember(key_of(3), 1);
  CHECK(f.router.remembered_keys() == 2);
  CHECK(f.router.choose({.prefix = key_of(1)}, {})->reason == gw::route_reason::affinity);
  CHECK(f.router.choose({.prefix = key_of(2)}, {})->reason != gw::route_reason::affinity);  // evicted
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
  CHECK_FALSE(f.router.choose({}, all).has_value());
}

TEST_CASE("unhealthy backends are never chosen") {
  fixture f;
  f.router.set_healthy(0, false);
  for (int i = 0; i < 4; ++i) CHECK(f.pick() == 1);
  f.router.set_healthy(1, false);
  CHECK(f.router.available_count() == 0);
  CHECK_FALSE(f.router.choose({}, {}).has_value());
}

// ---- session affinity -------------------------------------------------------------------------

namespace {

gw::session_key session_of(std::string_view session, std::string_view tenant = "tenant-a") {
  return *gw::session_route_key(tenant, session);
}

// Where a session's request goes now, and why.
gw::route_choice route(fixture& f, const gw::session_key& key, std::vector<std::size_t> excluded = {},
                       std::optional<gw::affinity_key> prefix = std::nullopt) {
  const auto choice = f.router.choose({.prefix = prefix, .session = key}, excluded);
  REQUIRE(choice.has_value());
  return *choice;
}

// The backends in a session's order of preference: the first choice, then the first choice
// with it excluded, and so on (all idle).
std::vector<std::size_t> ranking(fixture& f, const gw::session_key& key) {
  std::vector<std::size_t> order;
  while (order.size() < f.router.size()) order.push_back(route(f, key, order).backend);
  return order;
}

std::string session_name(int i) { return "conversation-" + std::to_string(i); }

}  // namespace

TEST_CASE("session keys: none without a session, scoped to the tenant, unambiguous") {
  CHECK_FALSE(gw::session_route_key("tenant-a", "").has_value());
  CHECK(session_of("s") == session_of("s"));
  CHECK(session_of("s", "tenant-a") != session_of("s", "tenant-b"));
  // The tenant's id and the session string cannot slide into each other.
  CHECK(session_of("bc", "a") != session_of("c", "ab"));
  // Not the prefix-cache hash of anything: its own domain.
  CHECK(session_of("s", "tenant-a") != edge::backend::prefix_root_hash("tenant-a"));
}

TEST_CASE("a session's requests all go to one backend, whatever the scores say") {
  fixture f(4);
  for (std::size_t i = 0; i < 4; ++i) f.router.report_load(i, load(0, 0, 0.0));
  const gw::session_key key = session_of("agent-run-17");
  const gw::route_choice first = route(f, key);
  CHECK(first.reason == gw::route_reason::session);
  // The session's backend looks the busiest by its report; the session stays (its cache is there).
  f.router.report_load(first.backend, load(6, 3, 0.9));
  for (int i = 0; i < 8; ++i) {
    const gw::route_choice again = route(f, key);
    CHECK(again.backend == first.backend);
    CHECK(again.reason == gw::route_reason::session);
    // Sequential requests: each ends before the next.
    f.router.dispatched(again.backend);
    f.router.finished(again.backend);
  }
  // Without a session the same router avoids that backend.
  CHECK(f.pick() != first.backend);
}

TEST_CASE("sessions spread over the backends, and every gateway places them alike") {
  fixture a(4);
  // Another gateway lists the same backends in another order and sees other loads.
  std::vector<std::string> reversed = fixture::names(4);
  std::reverse(reversed.begin(), reversed.end());
  edge::manual_time_source clock;
  gw::backend_router b(reversed, {}, clock);
  for (std::size_t i = 0; i < 4; ++i) {
    b.set_healthy(i, true);
    b.report_load(i, load(static_cast<std::int64_t>(i), 0, 0.2));
  }
  std::vector<int> placed(4);
  for (int i = 0; i < 200; ++i) {
    const gw::session_key key = session_of(session_name(i));
    const std::size_t in_a = route(a, key).backend;
    const auto in_b = b.choose({.session = key}, {});
    REQUIRE(in_b);
    CHECK(3 - in_b->backend == in_a);  // the same backend, by name
    ++placed[in_a];
  }
  for (const int n : placed) CHECK(n >= 25);  // about 50 each
}

TEST_CASE("two tenants' equal session strings are independent keys") {
  fixture f(4);
  int same_backend = 0;
  for (int i = 0; i < 64; ++i) {
    const std::size_t a = route(f, session_of(session_name(i), "tenant-a")).backend;
    const std::size_t b = route(f, session_of(session_name(i), "tenant-b")).backend;
    same_backend += a == b ? 1 : 0;
  }
  // Independent keys agree about a quarter of the time on 4 backends; one shared key always would.
  CHECK(same_backend < 32);

  // One tenant's session piling requests on its backend does not move the other's equal string
  // as long as the load stays within the bound.
  fixture g(2);
  const gw::session_key mine = session_of("shared-name", "tenant-a");
  const gw::session_key theirs = session_of("shared-name", "tenant-b");
  const std::size_t theirs_before = route(g, theirs).backend;
  g.router.dispatched(route(g, mine).backend);
  CHECK(route(g, theirs).backend == theirs_before);
}

TEST_CASE("bounded load: a hot session spills to the next backend in its own order, then returns") {
  fixture f(3);
  // Reports say nothing: the bound is on the gateway's own outstanding requests.
  const gw::session_key key = session_of("hot");
  const std::vector<std::size_t> order = ranking(f, key);
  REQUIRE(order.size() == 3);

  // capacity = ceil(1.25 × (total + 1) / 3), and a backend qualifies while its load with the
  // request stays within it.
  std::vector<std::size_t> placed;
  for (int i = 0; i < 3; ++i) {
    const gw::route_choice c = route(f, key);
    CHECK(c.reason == gw::route_reason::session);
    placed.push_back(c.backend);
    f.router.dispatched(c.backend);
  }
  // 1st: load 0 -> 1 <= 1. 2nd: total 1, capacity ceil(2.5/3) = 1: the first is full, so the
  // second in the session's order (not the least loaded: the third is as idle). 3rd: total 2,
  // capacity ceil(3.75/3) = 2: back to the first.
  CHECK(placed == std::vector<std::size_t>{order[0], order[1], order[0]});
  CHECK(f.router.outstanding(order[0]) == 2);

  // The next in the order is taken even when a later one is idler: loads 3, 2, 0, so capacity
  // ceil(1.25 × 6 / 3) = 3 turns the first away (4) and takes the second (3), not the third.
  f.router.dispatched(order[1]);
  f.router.dispatched(order[0]);
  CHECK(route(f, key).backend == order[1]);

  // Its requests end: the session is back on its first backend.
  for (int i = 0; i < 3; ++i) f.router.finished(order[0]);
  CHECK(route(f, key).backend == order[0]);
}

TEST_CASE("session_load_epsilon sets how far above the average a session's backend may go") {
  gw::router_options loose;
  loose.session_load_epsilon = 3.0;  // capacity 4 × the average: on 2 backends, all of 4 requests
  fixture f(2, loose);
  const gw::session_key key = session_of("hot");
  const std::size_t top = route(f, key).backend;
  for (int i = 0; i < 4; ++i) {
    CHECK(route(f, key).backend == top);
    f.router.dispatched(top);
  }
  gw::router_options tight;
  tight.session_load_epsilon = 0.0;  // never above the average, rounded up
  fixture g(2, tight);
  std::vector<int> per_backend(2);
  for (int i = 0; i < 6; ++i) {
    const std::size_t b = route(g, key).backend;
    ++per_backend[b];
    g.router.dispatched(b);
  }
  CHECK(per_backend == std::vector<int>{3, 3});
}

TEST_CASE("a backend that leaves moves only its sessions, and the same ones come back") {
  for (const bool eject : {false, true}) {
    CAPTURE(eject);
    fixture f(4);
    std::vector<std::size_t> before;
    for (int i = 0; i < 200; ++i) before.push_back(route(f, session_of(session_name(i))).backend);
    const std::size_t gone = before[0];
    if (eject) {
      for (int i = 0; i < f.options.eject_after_failures; ++i) f.router.failed(gone);
      REQUIRE(f.router.ejected(gone));
    } else {
      f.router.set_healthy(gone, false);
    }
    int moved = 0;
    for (int i = 0; i < 200; ++i) {
      const std::size_t now = route(f, session_of(session_name(i))).backend;
      CHECK(now != gone);
      if (before[i] == gone) {
        ++moved;
      } else {
        CHECK(now == before[i]);  // everyone else stays where their cache is
      }
    }
    CHECK(moved > 0);
    if (eject) {
      f.clock.advance(f.options.ejection_base);
    } else {
      f.router.set_healthy(gone, true);
    }
    for (int i = 0; i < 200; ++i) CHECK(route(f, session_of(session_name(i))).backend == before[i]);
  }
}

TEST_CASE("a session wins over prefix affinity; retries follow the session's order") {
  fixture f(3);
  for (std::size_t i = 0; i < 3; ++i) f.router.report_load(i, load(0, 0, 0.0));
  const gw::session_key key = session_of("with-a-prefix");
  const std::vector<std::size_t> order = ranking(f, key);
  const gw::affinity_key prefix = key_of(500);
  f.router.remember(prefix, order[2]);
  REQUIRE(f.pick(prefix) == order[2]);  // alone, the prefix goes to the backend holding it

  const gw::route_choice c = route(f, key, {}, prefix);
  CHECK(c.backend == order[0]);
  CHECK(c.reason == gw::route_reason::session);
  // A retry after the first backend failed: the second in the session's order.
  CHECK(route(f, key, {order[0]}, prefix).backend == order[1]);
  CHECK_FALSE(f.router.choose({.prefix = prefix, .session = key}, order).has_value());
  CHECK(gw::to_string(gw::route_reason::session) == "session");
}
