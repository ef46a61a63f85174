// redis_quota_store against a real redis-server started here: the same decisions as
// in_memory_quota_store on the same request sequence (a test clock drives both), one limit for
// two stores sharing Redis (the server's clock), reservations and refunds, concurrency slots and
// their leases, the daily budget, refusals taking nothing, keys that expire, a lost script
// cache, and an outage in both fail modes with recovery. Without redis-server every case fails.
#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <random>
#include <thread>

#include "edge/common/config.h"
#include "edge/common/format.h"
#include "edge/common/log.h"
#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/quota.h"
#include "edge/gateway/tenancy/quota_response.h"
#include "edge/gateway/tenancy/quota_stores.h"
#include "edge/gateway/tenancy/redis_quota_store.h"
#include "edge/gateway/tenancy/tenancy.h"
#include "edge/monitoring/gateway_metrics.h"
#include "await_now.h"
#include "quota_phases.h"
#include "await_now.h"
#include "redis_server.h"

namespace gw = edge::gateway;
using namespace std::chrono_literals;

namespace {

// 2026-05-01T12:00:00Z: noon, so a day boundary is 12 h away.
const auto noon = std::chrono::system_clock::time_point(std::chrono::seconds(1777636800));

edge::testing::redis_server* shared_redis() {
  static const std::unique_ptr<edge::testing::redis_server> server = edge::testing::redis_server::start();
  return server.get();
}

// No redis-server is a failure, not a pass: `make test` installs it (deploy/install-deps.sh).
#define REQUIRE_REDIS_SERVER(server) \
  REQUIRE_MESSAGE((server) != nullptr, "redis-server did not start (deploy/install-deps.sh installs it)")

// Keys of each test apart from every other's, in the one Redis they share.
std::string unique_prefix() {
  static std::atomic<int> next{0};
  return edge::format("edgeinfer-test:{}:{}:", ::getpid(), next++);
}

gw::redis_quota_options options_for(const edge::testing::redis_server& server, const edge::time_source* clock = nullptr) {
  gw::redis_quota_options o;
  o.address = gw::parse_redis_url(server.url()).value();
  o.key_prefix = unique_prefix();
  o.clock = clock;
  o.command_timeout = 2s;  // generous: a loaded test machine must not look like an outage
  return o;
}

// Tests on the Redis server's own clock (no injected one) must not straddle a UTC midnight, where
// the daily budget starts again: within a few seconds of one, they wait until it has passed.
void outside_midnight(edge::testing::redis_server& server) {
  constexpr std::int64_t margin_s = 10;
  const auto time = server.client()->command({"TIME"});
  REQUIRE(time.ok());
  REQUIRE(time->elements.size() == 2);
  const std::int64_t to_midnight = 86400 - std::stoll(time->elements[0].text) % 86400;
  if (to_midnight <= margin_s) std::this_thread::sleep_for(std::chrono::seconds(to_midnight + 1));
}

gw::quota_decision ask(gw::quota_store& store, const gw::tenant_quotas& q, std::int64_t prompt, std::int64_t max_tokens,
                       std::string_view tenant = "acme", std::int64_t choices = 1) {
  return edge::testing::admit_and_reserve(store, q, prompt, max_tokens, tenant, choices);
}

void check_same_status(const std::optional<gw::rate_limit_status>& memory,
                       const std::optional<gw::rate_limit_status>& redis) {
  REQUIRE(memory.has_value() == redis.has_value());
  if (!memory) return;
  CHECK(redis->limit == memory->limit);
  CHECK(redis->remaining == memory->remaining);
  CHECK(redis->reset == memory->reset);
}

void check_same(const gw::quota_decision& memory, const gw::quota_decision& redis) {
  CHECK(redis.allowed == memory.allowed);
  CHECK(redis.limit == memory.limit);
  CHECK(redis.retry_after == memory.retry_after);
  CHECK(redis.message == memory.message);
  check_same_status(memory.requests, redis.requests);
  check_same_status(memory.tokens, redis.tokens);
  CHECK(redis.reservation.tenant_id == memory.reservation.tenant_id);
  CHECK(redis.reservation.bucket_tokens == memory.reservation.bucket_tokens);
  CHECK(redis.reservation.day_tokens == memory.reservation.day_tokens);
  CHECK(redis.reservation.day == memory.reservation.day);
  CHECK(redis.reservation.holds_slot == memory.reservation.holds_slot);
}

// Every line logged while it lives.
struct captured_log {
  captured_log() {
    edge::log::set_sink([this](std::string_view line) {
      std::lock_guard lock(mutex);
      lines.emplace_back(line);
    });
  }
  ~captured_log() { edge::log::set_sink({}); }
  std::size_t count(std::string_view text) {
    std::lock_guard lock(mutex);
    std::size_t n = 0;
    for (const auto& line : lines) n += line.find(text) != std::string::npos ? 1 : 0;
    return n;
  }
  std::mutex mutex;
  std::vector<std::string> lines;
};

// What a store under test tells an operator: its log lines and its metrics.
struct observed {
  captured_log log;
  prometheus::Registry registry;
  edge::monitoring::gateway_metrics metrics{registry};
  std::string scrape() { return prometheus::TextSerializer().Serialize(registry.Collect()); }
};

}  // namespace

TEST_CASE("redis: a random sequence of requests is decided exactly as in memory, headers and messages included") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store memory(clock);
  auto options = options_for(*server, &clock);
  options.slot_lease = 1000h;  // the test clock jumps hours; in memory, slots never lapse
  auto redis = gw::redis_quota_store::create(options, nullptr);
  REQUIRE(redis->up());

  struct tenant {
    std::string id;
    gw::tenant_quotas quotas;
  };
  std::vector<tenant> tenants(5);
  tenants[0].id = "gcra";  // 60 s / 7 is no whole number of microseconds
  tenants[0].quotas.requests_per_minute = 7;
  tenants[1].id = "bucket";
  tenants[1].quotas.tokens_per_minute = 1000;
  tenants[2].id = "all";
  tenants[2].quotas = {.requests_per_minute = 30, .tokens_per_minute = 5000, .max_concurrent = 3, .daily_tokens = 20000,
                       .max_tokens_per_request = 400};
  tenants[3].id = "daily";
  tenants[3].quotas = {.max_concurrent = 2, .daily_tokens = 3000};
  tenants[4].id = "odd";
  tenants[4].quotas = {.requests_per_minute = 13, .tokens_per_minute = 777, .max_tokens_per_request = 100};

  struct held {
    gw::quota_reservation memory, redis;
    std::int64_t cost;
  };
  std::vector<held> open;
  std::mt19937_64 random(20260501);
  const auto uniform = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(random);
  };
  int admitted = 0, refused = 0;
  for (int step = 0; step < 3000; ++step) {
    INFO("step " << step);
    const std::int64_t op = uniform(0, 99);
    if (op < 55) {
      const tenant& t = tenants[static_cast<std::size_t>(uniform(0, 4))];
      const std::int64_t prompt = uniform(1, 300);
      const std::int64_t max_tokens = uniform(0, 500);
      const auto in_memory = ask(memory, t.quotas, prompt, max_tokens, t.id);
      const auto in_redis = ask(*redis, t.quotas, prompt, max_tokens, t.id);
      check_same(in_memory, in_redis);
      if (in_memory.allowed && in_redis.allowed) {
        open.push_back({in_memory.reservation, in_redis.reservation, prompt + max_tokens});
        ++admitted;
      } else {
        ++refused;
      }
    } else if (op < 85) {
      if (open.empty()) continue;
      const auto i = static_cast<std::size_t>(uniform(0, static_cast<std::int64_t>(open.size()) - 1));
      const std::int64_t used = uniform(0, open[i].cost);
      if (op % 2 == 0) {
        memory.settle(open[i].memory, used);
        redis->settle(open[i].redis, used);
        memory.release(open[i].memory);
        redis->release(open[i].redis);
      } else {
        memory.finish(open[i].memory, used);
        redis->finish(open[i].redis, used);  // both in one pipeline
      }
      open.erase(open.begin() + static_cast<std::ptrdiff_t>(i));
    } else if (op < 99) {
      // Odd nanoseconds, so that sub-microsecond parts are carried too.
      clock.advance(std::chrono::nanoseconds(op < 92 ? uniform(0, 2'000'000'000) : uniform(0, 20'000'000'000)));
    } else {
      clock.advance(13h + std::chrono::nanoseconds(uniform(0, 999)));  // across a UTC midnight, sometimes
    }
  }
  CHECK(admitted > 300);  // the sequence exercises both outcomes
  CHECK(refused > 300);
  CHECK(redis->up());
}

TEST_CASE("redis: two stores on one Redis enforce one requests-per-minute limit") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  edge::manual_time_source clock(noon);
  const auto options = options_for(*server, &clock);
  auto a = gw::redis_quota_store::create(options, nullptr);
  auto b = gw::redis_quota_store::create(options, nullptr);
  gw::tenant_quotas q;
  q.requests_per_minute = 10;  // one every 6 s

  int admitted = 0;
  std::optional<gw::quota_decision> refusal;
  for (int i = 0; i < 40; ++i) {
    auto d = ask(i % 2 == 0 ? *a : *b, q, 1, 1);
    if (d.allowed) ++admitted;
    else if (!refusal) refusal = d;
  }
  CHECK(admitted == 10);
  REQUIRE(refusal);
  CHECK(refusal->limit == gw::quota_limit::requests_per_minute);
  REQUIRE(refusal->retry_after);
  CHECK(*refusal->retry_after <= 6s);
  CHECK(*refusal->retry_after > 0ms);
  REQUIRE(refusal->requests);
  CHECK(refusal->requests->limit == 10);
  CHECK(refusal->requests->remaining == 0);

  // Once the wait it named has passed, one more request, through either store, and only one.
  clock.advance(*refusal->retry_after);
  CHECK(ask(*b, q, 1, 1).allowed);
  CHECK_FALSE(ask(*a, q, 1, 1).allowed);
  CHECK_FALSE(ask(*b, q, 1, 1).allowed);
}

TEST_CASE("redis: tokens per minute reserve prompt + max_tokens and refund the unused part, across stores") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  edge::manual_time_source clock(noon);
  const auto options = options_for(*server, &clock);
  auto a = gw::redis_quota_store::create(options, nullptr);
  auto b = gw::redis_quota_store::create(options, nullptr);
  gw::tenant_quotas q;
  q.tokens_per_minute = 600;  // refills 10 tokens a second

  const auto first = ask(*a, q, 100, 400);
  REQUIRE(first.allowed);
  CHECK(first.reservation.bucket_tokens == 500);
  REQUIRE(first.tokens);
  CHECK(first.tokens->remaining == 100);  // a full bucket less 500

  const auto second = ask(*b, q, 100, 400);  // the other gateway sees the same bucket
  CHECK_FALSE(second.allowed);
  CHECK(second.limit == gw::quota_limit::tokens_per_minute);
  REQUIRE(second.tokens);
  CHECK(second.tokens->remaining == 100);

  a->settle(first.reservation, 150);  // 350 come back
  const auto third = ask(*b, q, 100, 300);
  CHECK(third.allowed);
  REQUIRE(third.tokens);
  CHECK(third.tokens->remaining == 50);

  clock.advance(5s);  // 50 more
  const auto fourth = ask(*a, q, 50, 50);
  CHECK(fourth.allowed);
  REQUIRE(fourth.tokens);
  CHECK(fourth.tokens->remaining == 0);
}

TEST_CASE("redis: a request for n choices reserves n x max_tokens of the shared budget and refunds the rest") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  const auto options = options_for(*server);
  auto a = gw::redis_quota_store::create(options, nullptr);
  auto b = gw::redis_quota_store::create(options, nullptr);
  gw::tenant_quotas q;
  q.daily_tokens = 1000;

  const auto three = ask(*a, q, 100, 200, "acme", 3);
  REQUIRE(three.allowed);
  CHECK(three.reservation.day_tokens == 700);
  // The other gateway sees 300 left: 3 x 100 more and a prompt do not fit.
  const auto refused = ask(*b, q, 100, 100, "acme", 3);
  CHECK_FALSE(refused.allowed);
  CHECK(refused.limit == gw::quota_limit::daily_tokens);
  CHECK(refused.message.find("needs up to 400") != std::string::npos);
  a->settle(three.reservation, 250);  // the choices stopped early: 450 come back
  const auto fits = ask(*b, q, 100, 100, "acme", 3);
  CHECK(fits.allowed);
  // And in memory, the same decisions.
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store memory(clock);
  const auto m3 = ask(memory, q, 100, 200, "acme", 3);
  CHECK(m3.reservation.day_tokens == 700);
  CHECK_FALSE(ask(memory, q, 100, 100, "acme", 3).allowed);
}

TEST_CASE("redis: max_concurrent counts slots of every store; a release frees one for any of them") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  const auto options = options_for(*server);
  auto a = gw::redis_quota_store::create(options, nullptr);
  auto b = gw::redis_quota_store::create(options, nullptr);
  gw::tenant_quotas q;
  q.max_concurrent = 2;

  const auto first = ask(*a, q, 1, 1);
  const auto second = ask(*b, q, 1, 1);
  REQUIRE(first.allowed);
  REQUIRE(second.allowed);
  CHECK(first.reservation.holds_slot);
  CHECK(first.reservation.id != second.reservation.id);
  const auto third = ask(*a, q, 1, 1);
  CHECK_FALSE(third.allowed);
  CHECK(third.limit == gw::quota_limit::max_concurrent);
  CHECK(third.retry_after == std::optional<std::chrono::milliseconds>(1s));
  CHECK(third.message == "Too many concurrent requests for tenant 'acme': the limit is 2. Please try again when one "
                         "finishes.");

  b->release(second.reservation);
  const auto fourth = ask(*a, q, 1, 1);
  CHECK(fourth.allowed);
  CHECK_FALSE(ask(*b, q, 1, 1).allowed);
  a->release(first.reservation);
  a->release(fourth.reservation);
  CHECK(ask(*b, q, 1, 1).allowed);
}

TEST_CASE("redis: a slot is kept while its store renews the lease, and lapses when the store is gone") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  edge::manual_time_source clock(noon);
  auto options = options_for(*server, &clock);
  options.slot_lease = 10s;  // of the test clock, which moves only when told
  auto survivor = gw::redis_quota_store::create(options, nullptr);
  auto doomed = gw::redis_quota_store::create(options, nullptr);
  gw::tenant_quotas q;
  q.max_concurrent = 1;

  REQUIRE(ask(*doomed, q, 1, 1).allowed);
  clock.advance(9s);
  doomed->renew_slots();  // as its renewal thread does every lease / 3
  clock.advance(9s);      // 18 s after admission, 9 s after the renewal
  CHECK_FALSE(ask(*survivor, q, 1, 1).allowed);

  doomed.reset();  // a gateway that dies: nobody releases or renews its slot
  clock.advance(500ms);
  CHECK_FALSE(ask(*survivor, q, 1, 1).allowed);  // 9.5 s after the renewal: the lease still runs
  clock.advance(1s);
  CHECK(ask(*survivor, q, 1, 1).allowed);  // 10.5 s after it: lapsed, the slot is free again
}

// The one case on the server's clock (TIME), as in production: no limit in it refills within
// the test, so what it checks does not depend on how long the test takes.
TEST_CASE("redis: the daily budget is shared, reserved and refunded; a refusal says when it resets (the server's clock)") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  outside_midnight(*server);
  const auto options = options_for(*server);
  auto a = gw::redis_quota_store::create(options, nullptr);
  auto b = gw::redis_quota_store::create(options, nullptr);
  gw::tenant_quotas q;
  q.daily_tokens = 1000;

  const auto first = ask(*a, q, 100, 500);
  REQUIRE(first.allowed);
  CHECK(first.reservation.day_tokens == 600);
  const auto second = ask(*b, q, 100, 500);
  const auto third_too_big = ask(*b, q, 100, 1000);
  a->settle(first.reservation, 100);  // 500 come back
  const auto fourth = ask(*b, q, 100, 500);
  CHECK_FALSE(second.allowed);
  CHECK(second.limit == gw::quota_limit::daily_tokens);
  REQUIRE(second.retry_after);
  CHECK(*second.retry_after <= 86400s);
  CHECK(second.message.find("600 of 1000 tokens spent or reserved today") != std::string::npos);
  CHECK_FALSE(third_too_big.allowed);
  CHECK_FALSE(third_too_big.retry_after);  // no waiting makes it fit
  CHECK(fourth.allowed);
  CHECK(fourth.reservation.day == first.reservation.day);
}

TEST_CASE("redis: a refusal takes nothing from the limits of its phase; a body refused in phase 2 counts as a request") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  outside_midnight(*server);
  const auto options = options_for(*server);
  auto store = gw::redis_quota_store::create(options, nullptr);
  auto redis = server->client();
  // 10 a minute: one request's share of the window (6 s) is longer than the test takes, so the
  // remaining count it checks is not blurred by what the window gives back meanwhile.
  gw::tenant_quotas q{.requests_per_minute = 10, .tokens_per_minute = 100000, .max_concurrent = 1,
                      .daily_tokens = 5000, .max_tokens_per_request = 2000};
  const std::string rate = options.key_prefix + "{acme}:rate";
  const std::string slots = options.key_prefix + "{acme}:slots";
  const std::string daily = options.key_prefix + "{acme}:daily";
  const auto read = [&](const std::string& key, const std::string& field) {
    return redis->command({"HGET", key, field}).value().text;
  };
  const auto arrival = [&] { return read(rate, "tat_us") + "." + read(rate, "tat_ns"); };

  const auto first = ask(*store, q, 100, 100);
  REQUIRE(first.allowed);
  const std::string tat = arrival();
  CHECK(read(daily, "tokens") == "200");

  // Phase 1 refuses (max_concurrent): nothing is taken.
  const auto busy = store->try_admit({"acme", q, "busy"});
  CHECK(busy.limit == gw::quota_limit::max_concurrent);
  CHECK(redis->command({"ZCARD", slots}).value().integer == 1);
  CHECK(arrival() == tat);
  REQUIRE(busy.requests);
  CHECK(busy.requests->remaining == first.requests->remaining);  // still as the admission left it
  store->finish(first.reservation, 200);

  // Phase 2 refuses (max_tokens_per_request): the request counted, no tokens were taken, and
  // finishing phase 1 frees its slot.
  const auto too_long = store->try_admit({"acme", q, "too-long"});
  REQUIRE(too_long.allowed);
  const auto refused = store->try_reserve(too_long.reservation, {"acme", q, 100, 3000});
  CHECK(refused.limit == gw::quota_limit::max_tokens_per_request);
  REQUIRE(refused.tokens);
  CHECK(refused.tokens->remaining >= 100000 - 200);  // read, for the headers (it refills meanwhile)
  CHECK(arrival() != tat);
  CHECK(read(daily, "tokens") == "200");
  store->finish(too_long.reservation, 0);
  CHECK(redis->command({"ZCARD", slots}).value().integer == 0);

  const auto second = ask(*store, q, 100, 100);
  CHECK(second.allowed);
  CHECK(second.requests->remaining == first.requests->remaining - 2);  // three requests so far
  CHECK(redis->command({"ZCARD", slots}).value().integer == 1);
  CHECK(read(daily, "tokens") == "400");
}

TEST_CASE("redis: every key expires, so an idle tenant leaves nothing behind") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  auto options = options_for(*server);
  options.slot_lease = 20s;
  auto store = gw::redis_quota_store::create(options, nullptr);
  auto redis = server->client();
  gw::tenant_quotas q{.requests_per_minute = 100, .tokens_per_minute = 100000, .max_concurrent = 5,
                      .daily_tokens = 5000};
  const auto d = ask(*store, q, 10, 10);
  REQUIRE(d.allowed);
  const auto held = ask(*store, q, 10, 10);
  REQUIRE(held.allowed);
  store->settle(d.reservation, 5);
  store->release(d.reservation);

  // The settled request's record is gone with its tokens; the one still held keeps its own.
  const auto keys = redis->command({"KEYS", options.key_prefix + "*"}).value();
  REQUIRE(keys.elements.size() == 4);
  for (const auto& key : keys.elements) {
    INFO(key.text);
    const std::int64_t ttl = redis->command({"PTTL", key.text}).value().integer;
    CHECK(ttl > 0);  // -1 would be a key that never goes away
    if (key.text.ends_with(":rate")) CHECK(ttl <= 61'000);
    if (key.text.ends_with(":slots")) CHECK(ttl <= 20'000);
    if (key.text.ends_with(":daily")) CHECK(ttl <= (86'400 + 60) * 1000);
    if (key.text.find(":reservation:") != std::string::npos) {
      CHECK(key.text.ends_with(":reservation:" + held.reservation.id));
      CHECK(ttl <= 25 * 3'600'000);
      CHECK(ttl > 24 * 3'600'000);  // past the end of any day it was written in
    }
  }
}

TEST_CASE("redis: the scripts are loaded again when Redis lost them (NOSCRIPT)") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  const auto options = options_for(*server);
  auto store = gw::redis_quota_store::create(options, nullptr);
  gw::tenant_quotas q;
  q.requests_per_minute = 10;
  const auto first = ask(*store, q, 1, 1);
  REQUIRE(first.allowed);
  REQUIRE(server->client()->command({"SCRIPT", "FLUSH"}).ok());
  const auto second = ask(*store, q, 1, 1);
  CHECK(second.allowed);
  REQUIRE(second.requests);
  CHECK(second.requests->remaining == first.requests->remaining - 1);  // counted once, not twice
  CHECK(store->up());
}

TEST_CASE("redis outage, fail mode closed: 503-style refusals, errors counted, one log line each way, recovery") {
  const auto server = edge::testing::redis_server::start();
  REQUIRE_REDIS_SERVER(server);
  observed seen;
  auto options = options_for(*server);
  options.fail_mode = gw::quota_fail_mode::closed;
  options.command_timeout = 200ms;
  auto store = gw::redis_quota_store::create(options, &seen.metrics);
  gw::tenant_quotas q{.requests_per_minute = 100, .tokens_per_minute = 10000, .max_concurrent = 10,
                      .max_tokens_per_request = 500};
  const auto before = ask(*store, q, 10, 10);
  REQUIRE(before.allowed);
  const auto admitted_before = store->try_admit({"acme", q, "admitted-before"});
  REQUIRE(admitted_before.allowed);
  CHECK(seen.metrics.quota_store_up.Value() == 1);

  server->kill();
  for (int i = 0; i < 3; ++i) {
    const auto d = ask(*store, q, 10, 10);
    CHECK_FALSE(d.allowed);
    CHECK(d.limit == gw::quota_limit::quota_store_unavailable);
    CHECK(d.retry_after == std::optional<std::chrono::milliseconds>(1s));
    CHECK(d.message == "Quotas cannot be checked right now: the quota store is unavailable, so requests of tenant "
                       "'acme' are refused until it is back. Please try again in 1s.");
    CHECK_FALSE(d.requests);
    CHECK_FALSE(d.tokens);
  }
  // A request no counter could admit is refused for what it is (in phase 2: phase 1 alone
  // cannot tell).
  CHECK(store->try_reserve(admitted_before.reservation, {"acme", q, 10, 600}).limit ==
        gw::quota_limit::max_tokens_per_request);
  // Settling and releasing during the outage return (and change nothing anyone can see).
  store->settle(before.reservation, 5);
  store->release(before.reservation);
  store->finish(before.reservation, 5);

  CHECK_FALSE(store->up());
  CHECK(seen.metrics.quota_store_up.Value() == 0);
  const std::string text = seen.scrape();
  CHECK(text.find("edgeinfer_quota_store_up 0") != std::string::npos);
  CHECK(text.find("edgeinfer_quota_store_errors_total{operation=\"acquire\"}") != std::string::npos);
  CHECK(text.find("edgeinfer_quota_store_errors_total{operation=\"settle\"} 1") != std::string::npos);
  CHECK(text.find("edgeinfer_quota_store_errors_total{operation=\"release\"} 1") != std::string::npos);
  CHECK(text.find("edgeinfer_quota_store_errors_total{operation=\"finish\"} 1") != std::string::npos);
  CHECK(seen.log.count("is down") == 1);

  const auto response = gw::quota_refusal_response(ask(*store, q, 10, 10));
  CHECK(response.result() == boost::beast::http::status::service_unavailable);
  CHECK(response[boost::beast::http::field::retry_after] == "1");
  const auto body = boost::json::parse(response.body());
  CHECK(body.at("error").at("code").as_string() == "quota_store_unavailable");
  CHECK(body.at("error").at("type").as_string() == "server_error");

  server->restart();
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  gw::quota_decision after;
  while (!(after = ask(*store, q, 10, 10)).allowed && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(50ms);
  }
  CHECK(after.allowed);  // reconnected on its own
  CHECK(store->up());
  CHECK(seen.metrics.quota_store_up.Value() == 1);
  CHECK(seen.log.count("is down") == 1);
  CHECK(seen.log.count("is back up") == 1);
}

TEST_CASE("redis restarted between two requests: the next one is counted on a new connection, no outage") {
  const auto server = edge::testing::redis_server::start();
  REQUIRE_REDIS_SERVER(server);
  captured_log log;
  auto options = options_for(*server);
  options.fail_mode = gw::quota_fail_mode::closed;
  auto store = gw::redis_quota_store::create(options, nullptr);
  gw::tenant_quotas q{.requests_per_minute = 100};
  REQUIRE(ask(*store, q, 1, 1).allowed);  // leaves an idle connection in the pool

  server->kill();
  server->restart();
  // The pooled connection was closed by the old server: the call goes again on a new one.
  const auto after = ask(*store, q, 1, 1);
  CHECK(after.allowed);
  CHECK(after.limit == gw::quota_limit::none);
  REQUIRE(after.requests);
  CHECK(after.requests->remaining == 99);  // a fresh Redis: counted once, from a full minute
  CHECK(store->up());
  CHECK(log.count("is down") == 0);
}

TEST_CASE("redis outage, fail mode open: requests pass uncounted, and counting resumes after recovery") {
  const auto server = edge::testing::redis_server::start();
  REQUIRE_REDIS_SERVER(server);
  captured_log log;
  auto options = options_for(*server);
  options.fail_mode = gw::quota_fail_mode::open;
  options.command_timeout = 200ms;
  auto store = gw::redis_quota_store::create(options, nullptr);
  gw::tenant_quotas q{.requests_per_minute = 2, .max_concurrent = 1, .daily_tokens = 1000};
  REQUIRE(ask(*store, q, 10, 10).allowed);
  REQUIRE(ask(*store, q, 10, 10).limit == gw::quota_limit::max_concurrent);

  server->kill();
  for (int i = 0; i < 5; ++i) {  // past every limit: nothing is counted
    const auto d = ask(*store, q, 10, 10);
    CHECK(d.allowed);
    CHECK_FALSE(d.requests);
    CHECK(d.reservation.bucket_tokens == 0);
    CHECK(d.reservation.day_tokens == 0);
    CHECK_FALSE(d.reservation.holds_slot);
    store->settle(d.reservation, 20);
    store->release(d.reservation);
  }
  CHECK(ask(*store, q, 10, 2000).limit == gw::quota_limit::daily_tokens);  // could never fit
  CHECK(log.count("admitted without being counted (--quota-fail-mode open)") == 1);

  server->restart();  // empty: the counters start afresh
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!store->up() && std::chrono::steady_clock::now() < deadline) {
    gw::tenant_quotas probe{.daily_tokens = 1000000};
    (void)ask(*store, probe, 1, 1, "probe");
    std::this_thread::sleep_for(50ms);
  }
  REQUIRE(store->up());
  const auto first = ask(*store, q, 10, 10);
  CHECK(first.allowed);
  CHECK(first.reservation.holds_slot);
  CHECK(ask(*store, q, 10, 10).limit == gw::quota_limit::max_concurrent);  // counted again
}

namespace {

// A tenant's counters as Redis holds them, read with a client of the test's own.
struct held_counters {
  std::int64_t slots = 0;
  std::string day_tokens;
  std::string bucket;
};

held_counters read_counters(const edge::testing::redis_server& server, const gw::redis_quota_options& options,
                            std::string_view tenant = "acme") {
  auto redis = server.client();
  const std::string prefix = edge::format("{}{{{}}}:", options.key_prefix, tenant);
  return {redis->command({"ZCARD", prefix + "slots"}).value().integer,
          redis->command({"HGET", prefix + "daily", "tokens"}).value().text,
          redis->command({"HGET", prefix + "rate", "bucket"}).value().text};
}

// Waits (up to 30 s) until every store has applied what it queued.
bool drained(const std::vector<gw::redis_quota_store*>& stores) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  const auto all_done = [&] {
    return std::all_of(stores.begin(), stores.end(), [](const auto* s) { return s->pending() == 0; });
  };
  while (!all_done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(20ms);
  return all_done();
}

// A Redis stalled by SIGSTOP while requests are in both phases. Every call made during the
// stall waits out its timeout, is left unanswered and runs when Redis resumes; a gateway must
// give back what those calls took. Each stalled call goes through a gateway of its own, made
// before the stall, so that each is certainly sent (a gateway's client backs off after a
// timeout and would not send the next).
void check_stall_is_compensated(gw::quota_fail_mode mode) {
  const auto server = edge::testing::redis_server::start();
  REQUIRE_REDIS_SERVER(server);
  edge::manual_time_source clock(noon);  // the counters stay where the requests put them
  auto options = options_for(*server, &clock);
  options.fail_mode = mode;
  options.command_timeout = 200ms;
  options.slot_lease = 1000h;  // a slot must be given back, not lapse
  auto store = gw::redis_quota_store::create(options, nullptr);
  std::vector<std::unique_ptr<gw::redis_quota_store>> gateways;
  for (int i = 0; i < 6; ++i) gateways.push_back(gw::redis_quota_store::create(options, nullptr));
  const gw::tenant_quotas q{.requests_per_minute = 1000, .tokens_per_minute = 100000, .max_concurrent = 20,
                            .daily_tokens = 1000000};
  gw::reservation_ids ids;
  const bool open = mode == gw::quota_fail_mode::open;

  std::vector<gw::quota_reservation> served;  // hold a slot and 300 tokens each
  for (int i = 0; i < 2; ++i) {
    const auto d = ask(*store, q, 100, 200);
    REQUIRE(d.allowed);
    served.push_back(d.reservation);
  }
  std::vector<gw::quota_reservation> tokenizing;  // phase 1 passed; phase 2 comes during the stall
  for (int i = 0; i < 3; ++i) {
    const auto d = store->try_admit({"acme", q, ids.next()});
    REQUIRE(d.allowed);
    tokenizing.push_back(d.reservation);
  }

  server->stop();
  std::vector<gw::quota_reservation> running_uncounted;  // fail open: admitted while Redis did not answer
  const auto stalled = [&](gw::redis_quota_store& gateway, auto call) {
    gw::quota_decision d = call(gateway);
    CHECK_FALSE(gateway.up());  // sent, and unanswered until the timeout
    CHECK(d.allowed == open);
    if (!open) CHECK(d.limit == gw::quota_limit::quota_store_unavailable);
    return d;
  };
  for (std::size_t i = 0; i < tokenizing.size(); ++i) {
    const auto d = stalled(*gateways[i], [&](gw::redis_quota_store& g) {
      return g.try_reserve(tokenizing[i], {"acme", q, 100, 200});
    });
    if (d.allowed) running_uncounted.push_back(d.reservation);  // holds its phase-1 slot still
    else store->finish(tokenizing[i], 0);                       // queued: Redis does not answer
  }
  for (std::size_t i = tokenizing.size(); i < gateways.size(); ++i) {
    const auto d = stalled(*gateways[i], [&](gw::redis_quota_store& g) { return g.try_admit({"acme", q, ids.next()}); });
    if (d.allowed) running_uncounted.push_back(gateways[i]->try_reserve(d.reservation, {"acme", q, 100, 200}).reservation);
  }
  server->resume();

  std::vector<gw::redis_quota_store*> all{store.get()};
  for (const auto& g : gateways) all.push_back(g.get());
  REQUIRE(drained(all));
  // Exactly what the requests that hold something hold: the two served, and (fail open) the
  // three whose phase 1 had passed before the stall. No tokens of a stalled call remain.
  const std::int64_t slots_held = 2 + (open ? 3 : 0);
  auto now = read_counters(*server, options);
  CHECK(now.slots == slots_held);
  CHECK(now.day_tokens == "600");
  CHECK(now.bucket == std::to_string(100000 - 600));

  for (const auto& r : served) store->finish(r, 120);
  for (const auto& r : running_uncounted) store->finish(r, 250);  // counted nowhere: nothing to refund
  now = read_counters(*server, options);
  CHECK(now.slots == 0);
  CHECK(now.day_tokens == "240");  // what the counted requests used
  CHECK(now.bucket == std::to_string(100000 - 240));
  // And nothing lingers to run later: the marks stop the stalled calls for good.
  std::this_thread::sleep_for(100ms);
  CHECK(read_counters(*server, options).slots == 0);
}

}  // namespace

TEST_CASE("redis stalled (SIGSTOP), fail mode closed: calls that timed out and ran on SIGCONT take nothing for good") {
  check_stall_is_compensated(gw::quota_fail_mode::closed);
}

TEST_CASE("redis stalled (SIGSTOP), fail mode open: calls that timed out and ran on SIGCONT take nothing for good") {
  check_stall_is_compensated(gw::quota_fail_mode::open);
}

namespace {

// What the tests of a settlement queued during an outage start from: a Redis that keeps every
// command, a store on it (200 ms per command, `fail_mode`), and one request admitted (a prompt of
// 100, max_tokens 500) for a tenant with a minute's tokens, a concurrency limit and a daily budget.
struct admitted_before_an_outage {
  explicit admitted_before_an_outage(gw::quota_fail_mode fail_mode) {
    REQUIRE_REDIS_SERVER(server);
    options = options_for(*server, &clock);
    options.command_timeout = 200ms;
    options.fail_mode = fail_mode;
    store = gw::redis_quota_store::create(options, &seen.metrics);
    admitted = ask(*store, quotas, 100, 500);
    REQUIRE(admitted.allowed);
  }

  std::unique_ptr<edge::testing::redis_server> server =
      edge::testing::redis_server::start(edge::testing::redis_server::persistence::every_command);
  observed seen;
  edge::manual_time_source clock{noon};
  gw::redis_quota_options options;
  std::unique_ptr<gw::redis_quota_store> store;
  const gw::tenant_quotas quotas{.tokens_per_minute = 10000, .max_concurrent = 5, .daily_tokens = 1000};
  gw::quota_decision admitted;
};

}  // namespace

TEST_CASE("redis down: a settle made meanwhile is queued and lands once, when Redis is back") {
  admitted_before_an_outage f(gw::quota_fail_mode::open);
  auto& server = f.server;
  auto& store = f.store;
  CHECK(read_counters(*server, f.options).day_tokens == "600");

  server->kill();
  store->finish(f.admitted.reservation, 150);  // no Redis to take it
  CHECK(store->pending() == 1);
  CHECK(f.seen.metrics.quota_store_pending.Value() == 1);
  CHECK(f.seen.log.count("queued, with any that follow, until Redis answers") == 1);

  server->restart();  // with every counter it held
  REQUIRE(drained({store.get()}));
  const auto now = read_counters(*server, f.options);
  CHECK(now.day_tokens == "150");
  CHECK(now.bucket == std::to_string(10000 - 150));
  CHECK(now.slots == 0);
  CHECK(f.seen.metrics.quota_store_pending.Value() == 0);
  CHECK(f.seen.log.count("1 queued calls applied") == 1);
  store->finish(f.admitted.reservation, 150);  // once only
  CHECK(read_counters(*server, f.options).day_tokens == "150");
}

// A Redis with much data answers LOADING for a while after a restart. A settlement queued while
// it was down must wait that out, not be taken for a refusal and dropped; requests meanwhile
// follow the fail mode as in any outage.
TEST_CASE("redis restarted and still loading its data: a queued settle waits, then lands once") {
  admitted_before_an_outage f(gw::quota_fail_mode::closed);
  auto& server = f.server;
  auto& store = f.store;
  server->add_ballast(20000);

  server->kill();
  store->finish(f.admitted.reservation, 150);
  REQUIRE(store->pending() == 1);
  server->restart_loading_slowly(100us);  // 20,000 keys: about 2 s of answering LOADING

  // Retried while it loads (the first retry comes within 0.1 s), and kept.
  std::this_thread::sleep_for(500ms);
  CHECK(store->pending() == 1);
  CHECK_FALSE(store->up());
  CHECK(f.seen.log.count("refused by Redis and dropped") == 0);
  const auto meanwhile = ask(*store, f.quotas, 10, 10);  // an outage like any other: fail mode closed
  CHECK_FALSE(meanwhile.allowed);
  CHECK(meanwhile.limit == gw::quota_limit::quota_store_unavailable);

  REQUIRE(drained({store.get()}));
  const auto now = read_counters(*server, f.options);
  CHECK(now.day_tokens == "150");
  CHECK(now.slots == 0);
  CHECK(f.seen.log.count("1 queued calls applied") == 1);
  CHECK(store->up());
}

TEST_CASE("redis: the queue of calls waiting for Redis is bounded, and what it drops is counted") {
  const auto server = edge::testing::redis_server::start();
  REQUIRE_REDIS_SERVER(server);
  observed seen;
  auto options = options_for(*server);
  options.max_pending = 2;
  auto store = gw::redis_quota_store::create(options, &seen.metrics);
  const gw::tenant_quotas q{.daily_tokens = 100000};
  std::vector<gw::quota_reservation> held;
  for (int i = 0; i < 3; ++i) held.push_back(ask(*store, q, 10, 10).reservation);

  server->kill();
  for (const auto& r : held) store->settle(r, 5);
  CHECK(store->pending() == 2);
  CHECK(seen.metrics.quota_store_dropped.Value() == 1);
  CHECK(seen.log.count("calls are queued until Redis answers, the most kept") == 1);
}

TEST_CASE("redis: a repeated finish, settle or release gives nothing back twice, from any gateway") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  edge::manual_time_source clock(noon);
  auto options = options_for(*server, &clock);
  auto store = gw::redis_quota_store::create(options, nullptr);
  auto other_gateway = gw::redis_quota_store::create(options, nullptr);
  const gw::tenant_quotas q{.tokens_per_minute = 10000, .max_concurrent = 5, .daily_tokens = 10000};
  const auto a = ask(*store, q, 100, 500);
  const auto b = ask(*store, q, 100, 500);
  REQUIRE(a.allowed);
  REQUIRE(b.allowed);
  auto now = read_counters(*server, options);
  CHECK(now.slots == 2);
  CHECK(now.day_tokens == "1200");

  store->finish(a.reservation, 200);
  const auto once = read_counters(*server, options);
  CHECK(once.slots == 1);
  CHECK(once.day_tokens == "800");
  CHECK(once.bucket == std::to_string(10000 - 600 - 200));

  store->finish(a.reservation, 200);
  store->settle(a.reservation, 0);
  store->release(a.reservation);
  other_gateway->finish(a.reservation, 0);
  now = read_counters(*server, options);
  CHECK(now.slots == 1);  // b's slot stays
  CHECK(now.day_tokens == once.day_tokens);
  CHECK(now.bucket == once.bucket);
}

TEST_CASE("redis: a phase whose limits the tenant does not have makes no round trip") {
  const auto server = edge::testing::redis_server::start();
  REQUIRE_REDIS_SERVER(server);
  observed seen;
  auto options = options_for(*server);
  options.command_timeout = 300ms;
  auto store = gw::redis_quota_store::create(options, &seen.metrics);
  CHECK(store->may_block());
  const gw::tenant_quotas rpm_only{.requests_per_minute = 100};
  const gw::tenant_quotas daily_only{.daily_tokens = 100000};
  const gw::tenant_quotas local_only{.max_tokens_per_request = 100};
  const auto rpm_admitted = store->try_admit({"rpm", rpm_only, "rpm-1"});
  REQUIRE(rpm_admitted.allowed);

  server->stop();  // any call that reaches Redis would time out: the store would be down
  const auto rpm_reserved = store->try_reserve(rpm_admitted.reservation, {"rpm", rpm_only, 10, 10});
  CHECK(rpm_reserved.allowed);
  const auto daily_admitted = store->try_admit({"daily", daily_only, "daily-1"});
  CHECK(daily_admitted.allowed);
  CHECK_FALSE(daily_admitted.reservation.holds_slot);
  const auto local = ask(*store, local_only, 10, 100, "local");
  CHECK(local.allowed);
  store->finish(local.reservation, 20);
  store->finish(rpm_reserved.reservation, 20);
  CHECK(ask(*store, local_only, 10, 101, "local").limit == gw::quota_limit::max_tokens_per_request);
  CHECK(store->up());
  CHECK(seen.scrape().find("edgeinfer_quota_store_errors_total{") == std::string::npos);
  server->resume();
}

TEST_CASE("tenancy with a Redis quota store: the shared daily count is the truth, not each gateway's ledger") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  const edge::real_time_source clock;
  edge::testing::temp_dir first_dir, second_dir;
  gw::tenancy_options options;
  options.quota_store.redis = gw::parse_redis_url(server->url()).value();
  gw::tenant_record tenant;
  tenant.id = "ledger-vs-redis";
  tenant.quotas.daily_tokens = 1000;
  const gw::audit_context admin{"test", ""};
  // A request of `prompt` + `max_tokens` through a session: the refusal's limit, or none.
  const auto ask = [](gw::tenancy& tenants, std::int64_t prompt, std::int64_t max_tokens,
                      std::int64_t completion) -> gw::quota_limit {
    gw::request_session session = tenants.session_for({tenants.store().snapshot()->tenant("ledger-vs-redis"), "k"});
    if (auto refused = edge::testing::await_now(session.admit("chat_completions"))) return refused->limit;
    if (auto refused = edge::testing::await_now(session.reserve(prompt, max_tokens))) return refused->limit;
    session.metered([](edge::backend::engine_event) {})(
        edge::backend::delta_event{.tokens = std::vector<edge::backend::token_id>(static_cast<std::size_t>(completion), 1)});
    return gw::quota_limit::none;
  };
  {
    options.state_dir = first_dir.path();
    auto first = std::move(gw::tenancy::open(options, clock, nullptr)).value();
    REQUIRE(first->store().create_tenant(tenant, admin).ok());
    CHECK(ask(*first, 100, 800, 600) == gw::quota_limit::none);  // 700 spent, 200 refunded
  }
  // A second gateway, whose own ledger has never seen the tenant, sees the 700.
  options.state_dir = second_dir.path();
  auto second = std::move(gw::tenancy::open(options, clock, nullptr)).value();
  REQUIRE(second->store().create_tenant(tenant, admin).ok());
  CHECK(ask(*second, 100, 201, 0) == gw::quota_limit::daily_tokens);  // 700 + 301 > 1000
  CHECK(ask(*second, 100, 200, 200) == gw::quota_limit::none);
  second.reset();  // its settlement is sent before it closes
  // The first gateway restarted is not seeded from its ledger on top of Redis's count.
  options.state_dir = first_dir.path();
  auto restarted = std::move(gw::tenancy::open(options, clock, nullptr)).value();
  CHECK(ask(*restarted, 0, 1, 0) == gw::quota_limit::daily_tokens);  // 1000 of 1000
}

TEST_CASE("redis URLs: what --quota-store accepts, and clear errors for the rest") {
  const auto ok = gw::parse_redis_url("redis://10.0.0.5:6380/2");
  REQUIRE(ok.ok());
  CHECK(ok->host == "10.0.0.5");
  CHECK(ok->port == 6380);
  CHECK(ok->db == 2);
  const auto defaults = gw::parse_redis_url("redis://redis");
  REQUIRE(defaults.ok());
  CHECK(defaults->to_string() == "redis://redis:6379/0");

  for (const auto& [url, why] : std::vector<std::pair<std::string, std::string>>{
           {"http://localhost:6379", "the scheme is \"http\", not redis"},
           {"redis://:secret@localhost:6379", "a user or password is not supported"},
           {"redis://localhost:0", "the port must be a number from 1 to 65535"},
           {"redis://localhost:6379/x", "the database must be a number, as in /0"},
           {"redis:///0", "the host is missing"},
           {"redis://localhost?db=1", "a query or fragment is not supported"}}) {
    INFO(url);
    const auto bad = gw::parse_redis_url(url);
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.error().message() ==
          edge::format("invalid Redis URL \"{}\": {}; expected redis://HOST[:PORT][/DB]", url, why));
  }

  edge::config::schema schema;
  gw::add_quota_store_options(schema);
  const auto resolve = [&](std::map<std::string, std::string> flags) {
    return edge::config::resolve(schema, {.flags = std::move(flags), .getenv = [](const std::string&) {
                                            return std::optional<std::string>();
                                          }});
  };
  const auto defaults_settled = gw::quota_store_options_from(resolve({}).value());
  REQUIRE(defaults_settled.ok());
  CHECK_FALSE(defaults_settled->redis);  // memory
  CHECK(defaults_settled->fail_mode == gw::quota_fail_mode::open);
  const auto redis = gw::quota_store_options_from(
      resolve({{"quota-store", "redis://127.0.0.1:7000/1"}, {"quota-fail-mode", "closed"}}).value());
  REQUIRE(redis.ok());
  CHECK(redis->redis->port == 7000);
  CHECK(redis->fail_mode == gw::quota_fail_mode::closed);
  const auto wrong = gw::quota_store_options_from(resolve({{"quota-store", "memcached"}}).value());
  REQUIRE_FALSE(wrong.ok());
  CHECK(wrong.error().message() ==
        "--quota-store: invalid Redis URL \"memcached\": not a URL; expected redis://HOST[:PORT][/DB], or memory");
}

TEST_CASE("redis: the monthly budget decides as in memory across a month's end (the scripts' calendar)") {
  auto* server = shared_redis();
  REQUIRE_REDIS_SERVER(server);
  // 2026-12-31T23:00Z: the month and the year end within the hour.
  edge::manual_time_source clock(std::chrono::system_clock::time_point(std::chrono::seconds(1798758000)));
  gw::in_memory_quota_store memory(clock);
  auto options = options_for(*server, &clock);
  options.slot_lease = 1000h;
  auto redis = gw::redis_quota_store::create(options, nullptr);
  REQUIRE(redis->up());
  gw::tenant_quotas q;
  q.monthly_tokens = 1000;

  const auto both = [&](std::int64_t prompt, std::int64_t max_tokens) {
    auto in_memory = ask(memory, q, prompt, max_tokens);
    auto in_redis = ask(*redis, q, prompt, max_tokens);
    CHECK(in_memory.allowed == in_redis.allowed);
    CHECK(in_memory.limit == in_redis.limit);
    CHECK(in_memory.retry_after == in_redis.retry_after);
    CHECK(in_memory.message == in_redis.message);
    CHECK(in_memory.reservation.month_tokens == in_redis.reservation.month_tokens);
    CHECK(in_memory.reservation.month == in_redis.reservation.month);
    return std::pair(in_memory, in_redis);
  };
  auto [first_memory, first_redis] = both(100, 700);
  REQUIRE(first_redis.allowed);
  CHECK(first_redis.reservation.month == (2026 - 1970) * 12 + 11);
  const auto refused = both(100, 200).second;
  CHECK(refused.limit == gw::quota_limit::monthly_tokens);
  CHECK(refused.retry_after == std::optional<std::chrono::milliseconds>(1h));
  memory.settle(first_memory.reservation, 300);
  redis->settle(first_redis.reservation, 300);
  CHECK(both(100, 400).first.allowed);  // 500 came back: 300 + 500 of 1000
  CHECK_FALSE(both(0, 201).first.allowed);

  clock.advance(1h);  // 2027-01-01T00:00Z
  const auto january = both(100, 800).second;
  CHECK(january.allowed);
  CHECK(january.reservation.month == (2027 - 1970) * 12);
}
