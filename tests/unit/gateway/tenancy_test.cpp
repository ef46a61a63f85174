// Tenancy's request sessions: the cheap limits judged first and counted even when the body is
// refused later, tokens reserved once the prompt is known, a default max_tokens within the
// tenant's limits, settlement only when the engine's sink lets go too (tokens computed for a
// client that left are charged), and the usage and daily budget a kill -9 leaves behind.
#include <doctest/doctest.h>

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <csignal>
#include <optional>
#include <thread>

#include <sys/wait.h>
#include <unistd.h>

#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/tenancy.h"
#include "edge/monitoring/gateway_metrics.h"
#include "await_now.h"
#include "postgres_server.h"
#include "test_support.h"
#include "usage_fixtures.h"

namespace gw = edge::gateway;
using edge::testing::noon;
using edge::testing::noon_s;
using edge::testing::total_usage;
using edge::testing::await_now;

namespace {

const gw::audit_context admin{"admin", "req_test"};

gw::request_session session(gw::tenancy& tenants, std::string_view id) {
  return tenants.session_for({tenants.store().snapshot()->tenant(id), "k"});
}

bool admitted(gw::request_session& s) { return !await_now(s.admit("chat_completions")); }
bool reserved(gw::request_session& s, std::int64_t prompt, std::int64_t max_tokens) {
  return !await_now(s.reserve(prompt, max_tokens));
}

edge::backend::delta_event tokens(std::size_t n) {
  edge::backend::delta_event d;
  d.tokens.assign(n, 7);
  return d;
}

edge::backend::finished_event finished(std::int64_t prompt, std::int64_t completion, std::int64_t cached) {
  edge::backend::finished_event f;
  f.reason = edge::backend::finish_reason::length;
  f.usage = {prompt, completion, cached};
  return f;
}

}  // namespace

TEST_CASE("a session settles once both it and the engine's sink have let go") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  prometheus::Registry registry;
  edge::monitoring::gateway_metrics metrics(registry);
  auto tenants = std::move(gw::tenancy::open({.state_dir = tmp.path(), .ledger_flush_interval = std::chrono::hours(1)},
                                             clock, &metrics))
                     .value();
  gw::tenant_record acme;
  acme.id = "acme";
  acme.quotas.tokens_per_minute = 1000;
  acme.quotas.max_concurrent = 1;
  acme.quotas.daily_tokens = 100000;
  REQUIRE(tenants->store().create_tenant(acme, admin).ok());

  edge::backend::event_sink sink;
  int delivered = 0;
  {
    gw::request_session first = session(*tenants, "acme");
    REQUIRE(admitted(first));
    REQUIRE(reserved(first, 100, 400));
    gw::http::response_header<> head;
    first.add_headers(head);
    CHECK(head["x-ratelimit-remaining-tokens"] == "500");
    // The concurrency slot is taken: a second request is refused before its body is read.
    gw::request_session second = session(*tenants, "acme");
    const auto refused = await_now(second.admit("chat_completions"));
    REQUIRE(refused);
    CHECK(refused->limit == gw::quota_limit::max_concurrent);

    sink = first.metered([&](edge::backend::engine_event) { ++delivered; });
    sink(tokens(15));
  }  // the client left; the engine still runs the request
  gw::request_session third = session(*tenants, "acme");
  CHECK(await_now(third.admit("chat_completions"))->limit == gw::quota_limit::max_concurrent);

  sink(tokens(5));  // computed after the client left: charged all the same
  sink(finished(100, 20, 64));
  CHECK(delivered == 3);
  sink = nullptr;  // the engine's last event: 380 tokens come back, the slot is free

  REQUIRE(admitted(third));
  REQUIRE(reserved(third, 0, 880));
  gw::http::response_header<> head;
  third.add_headers(head);
  CHECK(head["x-ratelimit-remaining-tokens"] == "0");
  third = session(*tenants, "acme");  // the request used nothing (the engine refused it, say): 880 come back
  REQUIRE(admitted(third));
  CHECK(reserved(third, 0, 880));

  REQUIRE(tenants->ledger().flush().ok());
  // Three requests reserved tokens (the last one still runs: its checkpoint counts it), two were refused.
  CHECK(total_usage(tenants->store(), "acme") == gw::usage_counts{3, 100, 20, 64, 2});
  const std::string scrape = prometheus::TextSerializer().Serialize(registry.Collect());
  CHECK(scrape.find("edgeinfer_quota_rejections_total{api=\"chat_completions\",limit=\"max_concurrent\",tenant=\"acme\"} 2") !=
        std::string::npos);
  CHECK(scrape.find("edgeinfer_tenant_tokens_total{api=\"chat_completions\",kind=\"completion\",tenant=\"acme\"} 20") != std::string::npos);
}

TEST_CASE("requests per minute are judged at admission: a request refused later for its body still counted") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto tenants = std::move(gw::tenancy::open({.state_dir = tmp.path()}, clock, nullptr)).value();
  gw::tenant_record slow;
  slow.id = "slow";
  slow.quotas.requests_per_minute = 1;
  REQUIRE(tenants->store().create_tenant(slow, admin).ok());
  {
    gw::request_session first = session(*tenants, "slow");
    REQUIRE(admitted(first));
  }  // refused for its body (never reserved)
  gw::request_session second = session(*tenants, "slow");
  const auto refused = await_now(second.admit("chat_completions"));
  REQUIRE(refused);
  CHECK(refused->limit == gw::quota_limit::requests_per_minute);
  CHECK(refused->retry_after);
}

TEST_CASE("a missing max_tokens defaults to what the tenant's limits leave") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto tenants = std::move(gw::tenancy::open({.state_dir = tmp.path()}, clock, nullptr)).value();
  gw::tenant_record t;
  t.id = "capped";
  t.quotas.max_tokens_per_request = 100;
  REQUIRE(tenants->store().create_tenant(t, admin).ok());
  t.id = "per-minute";
  t.quotas = {.tokens_per_minute = 1000};
  REQUIRE(tenants->store().create_tenant(t, admin).ok());
  t.id = "daily";
  t.quotas = {.daily_tokens = 300};
  REQUIRE(tenants->store().create_tenant(t, admin).ok());
  t.id = "free";
  t.quotas = {};
  REQUIRE(tenants->store().create_tenant(t, admin).ok());

  CHECK(session(*tenants, "capped").default_max_tokens(30, 2000) == 100);
  CHECK(session(*tenants, "per-minute").default_max_tokens(30, 2000) == 970);
  CHECK(session(*tenants, "daily").default_max_tokens(30, 2000) == 270);
  CHECK(session(*tenants, "daily").default_max_tokens(500, 2000) == 1);  // the prompt alone is over: refused by the budget
  CHECK(session(*tenants, "free").default_max_tokens(30, 2000) == 2000);
  CHECK(session(*tenants, "capped").default_max_tokens(30, 50) == 50);  // the context is the first limit
}

TEST_CASE("kill -9: the ledger keeps the last checkpoint, and the budget counts the cut requests' reservations") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // The server that crashes: two requests of 10 + 2000 tokens running, 300 tokens each
    // checkpointed, 100 more each generated since.
    auto opened = gw::tenancy::open({.state_dir = tmp.path(), .ledger_flush_interval = std::chrono::hours(1)}, clock,
                                    nullptr);
    if (!opened.ok()) ::_exit(2);
    gw::tenancy& tenants = **opened;
    gw::tenant_record t;
    t.id = "crashy";
    t.quotas.daily_tokens = 5000;
    if (!tenants.store().create_tenant(t, admin).ok()) ::_exit(3);
    std::vector<gw::request_session> running;
    std::vector<edge::backend::event_sink> sinks;
    for (int i = 0; i < 2; ++i) {
      running.push_back(session(tenants, "crashy"));
      if (!admitted(running.back()) || !reserved(running.back(), 10, 2000)) ::_exit(4);
      sinks.push_back(running.back().metered([](edge::backend::engine_event) {}));
      sinks.back()(tokens(300));
    }
    if (!tenants.ledger().flush().ok()) ::_exit(5);
    for (auto& sink : sinks) sink(tokens(100));
    ::raise(SIGKILL);
    ::_exit(6);
  }
  int wait_status = 0;
  REQUIRE(::waitpid(child, &wait_status, 0) == child);
  REQUIRE(WIFSIGNALED(wait_status));
  CHECK(WTERMSIG(wait_status) == SIGKILL);

  auto tenants = std::move(gw::tenancy::open({.state_dir = tmp.path()}, clock, nullptr)).value();
  // At most the last interval is lost: the 100 + 100 generated after the checkpoint.
  CHECK(total_usage(tenants->store(), "crashy") == gw::usage_counts{2, 20, 600, 0, 0});
  // Both reservations count as spent: 5000 - 2 x 2010 = 980 left, whatever the cut requests used.
  gw::request_session over = session(*tenants, "crashy");
  REQUIRE(admitted(over));
  const auto refused = await_now(over.reserve(10, 971));
  REQUIRE(refused);
  CHECK(refused->limit == gw::quota_limit::daily_tokens);
  gw::request_session within = session(*tenants, "crashy");
  REQUIRE(admitted(within));
  CHECK(reserved(within, 10, 970));
}

TEST_CASE("PostgreSQL down, counters in memory: a tenant with a budget is served (fail open) or refused (fail closed)") {
  auto server = edge::testing::postgres_server::start();
  const std::string url = server->fresh_database();
  edge::manual_time_source clock(noon);
  const auto open = [&](gw::quota_fail_mode mode) {
    gw::tenancy_options options{.tenant_store_url = url, .tenant_store_timeout = std::chrono::milliseconds(300)};
    options.quota_store.fail_mode = mode;
    auto opened = gw::tenancy::open(options, clock, nullptr);
    REQUIRE_MESSAGE(opened.ok(), opened.error().to_string());
    return std::move(opened).value();
  };
  auto fail_open = open(gw::quota_fail_mode::open);
  auto fail_closed = open(gw::quota_fail_mode::closed);
  gw::tenant_record budgeted;
  budgeted.id = "budgeted";
  budgeted.quotas.daily_tokens = 1000;
  budgeted.quotas.monthly_tokens = 10000;
  REQUIRE(fail_open->store().create_tenant(budgeted, admin).ok());
  for (int i = 0; i < 200 && !fail_closed->store().snapshot()->tenant("budgeted"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(fail_closed->store().snapshot()->tenant("budgeted"));

  server->kill();
  gw::request_session open_session = session(*fail_open, "budgeted");
  REQUIRE(admitted(open_session));
  CHECK(reserved(open_session, 10, 100));  // the budget holds in memory; the hold could not be written
  gw::request_session closed_session = session(*fail_closed, "budgeted");
  REQUIRE(admitted(closed_session));
  const auto refused = await_now(closed_session.reserve(10, 100));
  REQUIRE(refused);
  CHECK(refused->limit == gw::quota_limit::quota_store_unavailable);
}
