// The usage ledger: increments buffered in memory, filed under their UTC hour, written to the
// store by flush(), by the background thread, and when the ledger stops; a failed write keeps
// them. Requests being served are checkpointed at every flush, and their daily-budget holds
// released with their last usage.
#include <doctest/doctest.h>

#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/usage_ledger.h"
#include "tenancy/sqlite.h"
#include "test_support.h"
#include "usage_fixtures.h"

namespace gw = edge::gateway;
using edge::testing::noon;
using edge::testing::noon_s;
using edge::testing::total_usage;
using namespace std::chrono_literals;

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
  CHECK(total_usage(*store, "beta") == gw::usage_counts{1, 1, 1, 0, 0});
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
  CHECK(total_usage(*store, "acme") == gw::usage_counts{10000, 30000, 20000, 10000, 0});
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
  for (int i = 0; i < 6000 && total_usage(*store, "acme") != expected; ++i) std::this_thread::sleep_for(5ms);
  CHECK(total_usage(*store, "acme") == expected);
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
  CHECK(total_usage(*store, "acme") == gw::usage_counts{1, 5, 5, 0, 0});
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
  CHECK(total_usage(*store, "acme") == gw::usage_counts{2, 11, 11, 0, 0});
}

TEST_CASE("a metered request is checkpointed at every flush and written in full when it ends") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = std::move(gw::tenant_store::open(tmp.path(), clock)).value();
  gw::usage_ledger ledger(*store, clock, 1h);
  gw::request_usage usage(/*prompt_tokens=*/40, /*max_tokens=*/100);
  {
    gw::usage_ledger::meter meter = ledger.open_meter("acme", usage);
    CHECK(ledger.open_meters() == 1);
    usage.add_completion(7);
    REQUIRE(ledger.flush().ok());
    CHECK(total_usage(*store, "acme") == gw::usage_counts{1, 40, 7, 0, 0});
    usage.add_completion(5);
    REQUIRE(ledger.flush().ok());  // only what grew since the last checkpoint
    CHECK(total_usage(*store, "acme") == gw::usage_counts{1, 40, 12, 0, 0});
    usage.add_completion(3);
    CHECK(usage.finish(/*completion_tokens=*/16, /*cached_tokens=*/32));
  }  // the meter ends: the rest is recorded
  CHECK(ledger.open_meters() == 0);
  REQUIRE(ledger.flush().ok());
  CHECK(total_usage(*store, "acme") == gw::usage_counts{1, 40, 16, 32, 0});
}

TEST_CASE("a metered request with an API key is also filed under its key, model and API for the spend view") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = std::move(gw::tenant_store::open(tmp.path(), clock)).value();
  gw::usage_ledger ledger(*store, clock, 1h);
  gw::request_usage chat(/*prompt_tokens=*/40, /*max_tokens=*/100);
  gw::request_usage other(/*prompt_tokens=*/10, /*max_tokens=*/100);
  {
    gw::usage_ledger::meter a = ledger.open_meter("acme", chat, {}, {"k1", "model-x", "chat_completions"});
    gw::usage_ledger::meter b = ledger.open_meter("acme", other, {}, {"k2", "model-x", "messages"});
    chat.add_completion(7);
    REQUIRE(ledger.flush().ok());  // a checkpoint: filed by labels too
    chat.add_completion(3);
    other.add_completion(2);
    ledger.record("acme", {.rejections = 1});  // a refusal: per tenant and hour only
  }
  REQUIRE(ledger.flush().ok());
  const auto spend = store->spend("acme", edge::testing::noon_s - 3600, edge::testing::noon_s + 3600);
  REQUIRE(spend.ok());
  REQUIRE(spend->size() == 2);
  CHECK((*spend)[0].labels == gw::usage_labels{"k1", "model-x", "chat_completions"});
  CHECK((*spend)[0].counts == gw::usage_counts{1, 40, 10, 0, 0});
  CHECK((*spend)[1].labels == gw::usage_labels{"k2", "model-x", "messages"});
  CHECK((*spend)[1].counts == gw::usage_counts{1, 10, 2, 0, 0});
  CHECK(total_usage(*store, "acme") == gw::usage_counts{2, 50, 12, 0, 1});
}

TEST_CASE("a request's usage is believed within what the gateway knows") {
  gw::request_usage usage(/*prompt_tokens=*/10, /*max_tokens=*/20);
  usage.add_completion(5);
  CHECK_FALSE(usage.finish(/*completion_tokens=*/-3, /*cached_tokens=*/-1));  // less than generated, negative
  CHECK(usage.counts() == gw::usage_counts{1, 10, 5, 0, 0});
  CHECK_FALSE(usage.finish(/*completion_tokens=*/1000, /*cached_tokens=*/50));  // past max_tokens, past the prompt
  CHECK(usage.counts() == gw::usage_counts{1, 10, 20, 10, 0});
  gw::request_usage flooded(/*prompt_tokens=*/10, /*max_tokens=*/3);
  flooded.add_completion(2);
  flooded.add_completion(2);
  CHECK(flooded.counts().completion_tokens == 3);
}

TEST_CASE("a hold is released by the flush that writes its request's last usage") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = std::move(gw::tenant_store::open(tmp.path(), clock)).value();
  gw::usage_ledger ledger(*store, clock, 1h);
  const std::int64_t day = noon_s / 86400;
  REQUIRE(store->add_hold({.id = "r1", .tenant_id = "acme", .day = day, .reserved_tokens = 500}).ok());
  REQUIRE(store->add_hold({.id = "old", .tenant_id = "acme", .day = day - 1, .reserved_tokens = 900}).ok());
  gw::request_usage usage(/*prompt_tokens=*/100, /*max_tokens=*/400);
  gw::usage_ledger::meter meter = ledger.open_meter("acme", usage, "r1");
  usage.add_completion(50);
  REQUIRE(ledger.flush().ok());
  // Were the server to crash now: 150 are in the ledger, 350 more may have been used.
  auto held = store->unreleased_hold_tokens(day);
  REQUIRE(held.ok());
  CHECK(*held == std::map<std::string, std::int64_t>{{"acme", 350}});  // yesterday's hold is gone
  meter.end();
  REQUIRE(ledger.flush().ok());
  CHECK(store->unreleased_hold_tokens(day)->empty());
  CHECK(total_usage(*store, "acme") == gw::usage_counts{1, 100, 50, 0, 0});
}

TEST_CASE("a failed flush keeps a meter's checkpoint and its hold's release for the next one") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = std::move(gw::tenant_store::open(tmp.path(), clock)).value();
  gw::usage_ledger ledger(*store, clock, 1h);
  REQUIRE(store->add_hold({.id = "r1", .tenant_id = "acme", .day = noon_s / 86400, .reserved_tokens = 50}).ok());
  gw::request_usage usage(/*prompt_tokens=*/10, /*max_tokens=*/40);
  {
    gw::usage_ledger::meter meter = ledger.open_meter("acme", usage, "r1");
    usage.add_completion(4);
  }
  auto side = gw::sqlite::database::open(tmp / "tenants.db");
  REQUIRE(side.ok());
  REQUIRE(side->exec("ALTER TABLE usage_hourly RENAME TO usage_hourly_away").ok());
  CHECK_FALSE(ledger.flush().ok());
  CHECK(store->unreleased_hold_tokens(noon_s / 86400)->size() == 1);  // the transaction rolled back whole
  REQUIRE(side->exec("ALTER TABLE usage_hourly_away RENAME TO usage_hourly").ok());
  REQUIRE(ledger.flush().ok());
  CHECK(total_usage(*store, "acme") == gw::usage_counts{1, 10, 4, 0, 0});
  CHECK(store->unreleased_hold_tokens(noon_s / 86400)->empty());
}
