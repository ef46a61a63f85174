// The usage ledger: increments buffered in memory, filed under their UTC hour, written to the
// store by flush(), by the background thread, and when the ledger stops; a failed write keeps
// them. And the tenancy facade's leases, which settle quotas and write the ledger when a
// request ends however it ends.
#include <doctest/doctest.h>

#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <thread>
#include <vector>

#include "edge/common/time_source.h"
#include "edge/gateway/tenancy.h"
#include "edge/gateway/usage_ledger.h"
#include "edge/monitoring/gateway_metrics.h"
#include "sqlite.h"
#include "test_support.h"

namespace gw = edge::gateway;
using namespace std::chrono_literals;

namespace {

const auto noon = std::chrono::system_clock::time_point(std::chrono::seconds(1777636800));  // 2026-05-01T12:00Z
constexpr gw::unix_time noon_s = 1777636800;
const gw::audit_context admin{"admin", "req_test"};

gw::usage_counts total(const gw::tenant_store& store, std::string_view tenant) {
  auto rows = store.usage(tenant, noon_s - 86400, noon_s + 86400);
  REQUIRE(rows.ok());
  gw::usage_counts sum;
  for (const auto& row : *rows) sum += row.counts;
  return sum;
}

}  // namespace

TEST_CASE("record() buffers; flush() writes each tenant's hours") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = std::move(gw::tenant_store::open(tmp.path(), clock)).value();
  gw::usage_ledger ledger(*store, clock);

  ledger.record("acme", {1, 100, 20, 10, 0});
  ledger.record("acme", {1, 50, 5, 0, 0});
  ledger.record("acme", {0, 0, 0, 0, 1});
  ledger.record("beta", {1, 1, 1, 0, 0});
  clock.advance(1h);
  ledger.record("acme", {1, 7, 7, 0, 0});
  ledger.record("acme", {});  // nothing: no row
  CHECK(ledger.pending_rows() == 3);
  CHECK(store->usage("acme", noon_s, noon_s + 7200)->empty());  // nothing written yet

  REQUIRE(ledger.flush().ok());
  CHECK(ledger.pending_rows() == 0);
  auto rows = store->usage("acme", noon_s, noon_s + 7200);
  REQUIRE(rows->size() == 2);
  CHECK((*rows)[0].hour_start == noon_s);
  CHECK((*rows)[0].counts == gw::usage_counts{2, 150, 25, 10, 1});
  CHECK((*rows)[1].hour_start == noon_s + 3600);
  CHECK((*rows)[1].counts == gw::usage_counts{1, 7, 7, 0, 0});
  CHECK(total(*store, "beta") == gw::usage_counts{1, 1, 1, 0, 0});
}

TEST_CASE("records from many threads all arrive, exactly once") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = std::move(gw::tenant_store::open(tmp.path(), clock)).value();
  gw::usage_ledger ledger(*store, clock, 1ms);
  ledger.start();  // flushing all along, racing the writers
  std::vector<std::thread> writers;
  for (int t = 0; t < 4; ++t) {
    writers.emplace_back([&] {
      for (int i = 0; i < 2500; ++i) ledger.record("acme", {1, 3, 2, 1, 0});
    });
  }
  for (auto& w : writers) w.join();
  REQUIRE(ledger.stop().ok());
  CHECK(total(*store, "acme") == gw::usage_counts{10000, 30000, 20000, 10000, 0});
}

TEST_CASE("the background thread flushes without being asked") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = std::move(gw::tenant_store::open(tmp.path(), clock)).value();
  gw::usage_ledger ledger(*store, clock, 10ms);
  ledger.start();
  ledger.record("acme", {1, 2, 3, 0, 0});
  // Waits for the row however long a loaded machine takes; the interval itself is not what is
  // tested. Nothing but the thread writes it: flush() is never called here.
  const gw::usage_counts expected{1, 2, 3, 0, 0};
  for (int i = 0; i < 6000 && total(*store, "acme") != expected; ++i) std::this_thread::sleep_for(5ms);
  CHECK(total(*store, "acme") == expected);
  CHECK(ledger.pending_rows() == 0);
}

TEST_CASE("the destructor flushes what is left") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = std::move(gw::tenant_store::open(tmp.path(), clock)).value();
  {
    gw::usage_ledger ledger(*store, clock, 1h);  // the thread would not flush in time
    ledger.start();
    ledger.record("acme", {1, 5, 5, 0, 0});
  }
  CHECK(total(*store, "acme") == gw::usage_counts{1, 5, 5, 0, 0});
}

TEST_CASE("a failed write keeps the increments for the next flush") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = std::move(gw::tenant_store::open(tmp.path(), clock)).value();
  gw::usage_ledger ledger(*store, clock);
  auto side = gw::sqlite::database::open(tmp / "tenants.db");
  REQUIRE(side.ok());
  REQUIRE(side->exec("ALTER TABLE usage_hourly RENAME TO usage_hourly_away").ok());

  ledger.record("acme", {1, 10, 10, 0, 0});
  CHECK_FALSE(ledger.flush().ok());
  CHECK(ledger.pending_rows() == 1);
  ledger.record("acme", {1, 1, 1, 0, 0});

  REQUIRE(side->exec("ALTER TABLE usage_hourly_away RENAME TO usage_hourly").ok());
  REQUIRE(ledger.flush().ok());
  CHECK(total(*store, "acme") == gw::usage_counts{2, 11, 11, 0, 0});
}

TEST_CASE("a lease settles the quotas and writes the ledger when the request ends") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  prometheus::Registry registry;
  edge::monitoring::gateway_metrics metrics(registry);
  auto opened = gw::tenancy::open({.state_dir = tmp.path(), .ledger_flush_interval = 1h}, clock, &metrics);
  REQUIRE(opened.ok());
  gw::tenancy& tenants = **opened;

  gw::tenant_record acme;
  acme.id = "acme";
  acme.quotas.tokens_per_minute = 1000;
  acme.quotas.max_concurrent = 1;
  acme.quotas.daily_tokens = 100000;
  REQUIRE(tenants.store().create_tenant(acme, admin).ok());
  const gw::authenticated_tenant who{tenants.store().snapshot()->tenant("acme"), "k"};

  {
    gw::admission first = tenants.admit(who, 100, 400);
    REQUIRE(first.allowed());
    REQUIRE(first.lease);
    CHECK(first.decision.tokens->remaining == 500);
    // The concurrency slot is taken: a second request waits.
    gw::admission second = tenants.admit(who, 1, 1);
    CHECK_FALSE(second.allowed());
    CHECK(second.decision.limit == gw::quota_limit::max_concurrent);
    first.lease->record({.prompt_tokens = 100, .completion_tokens = 20, .cached_tokens = 64});
  }  // the request ends: 380 tokens come back, the slot is free

  gw::admission third = tenants.admit(who, 0, 880);
  REQUIRE(third.allowed());
  CHECK(third.decision.tokens->remaining == 0);
  third.lease->finish();  // nothing was used (the engine refused it, say): all 880 come back
  third.lease->finish();  // idempotent
  CHECK(tenants.admit(who, 0, 880).allowed());

  REQUIRE(tenants.ledger().flush().ok());
  // Three admitted requests (two used nothing), one rejection; tokens as recorded.
  CHECK(total(tenants.store(), "acme") == gw::usage_counts{3, 100, 20, 64, 1});

  const std::string scrape = prometheus::TextSerializer().Serialize(registry.Collect());
  CHECK(scrape.find("edgeinfer_quota_rejections_total{limit=\"max_concurrent\",tenant=\"acme\"} 1") !=
        std::string::npos);
}

TEST_CASE("a restart keeps today's spent budget (seeded from the ledger)") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  gw::tenant_record acme;
  acme.id = "acme";
  acme.quotas.daily_tokens = 1000;
  {
    auto tenants = std::move(gw::tenancy::open({.state_dir = tmp.path()}, clock, nullptr)).value();
    REQUIRE(tenants->store().create_tenant(acme, admin).ok());
    const gw::authenticated_tenant who{tenants->store().snapshot()->tenant("acme"), "k"};
    gw::admission a = tenants->admit(who, 100, 800);
    REQUIRE(a.allowed());
    a.lease->record({.prompt_tokens = 100, .completion_tokens = 600});
  }  // stopping flushes the ledger
  auto tenants = std::move(gw::tenancy::open({.state_dir = tmp.path()}, clock, nullptr)).value();
  const gw::authenticated_tenant who{tenants->store().snapshot()->tenant("acme"), "k"};
  CHECK_FALSE(tenants->admit(who, 100, 201).allowed());  // 700 + 301 > 1000
  CHECK(tenants->admit(who, 100, 200).allowed());
}
