// The tenant store, both of them: SQLite on a real file in a temporary folder, and PostgreSQL
// on a real server (a database of its own per test): migrations, CRUD, keys, the snapshot the
// request path reads, the usage ledger's rows and the audit log. The tests that only one store
// can have (SQLite's folder lock and file; PostgreSQL's sharing, outages and concurrent starts)
// come after the shared ones.
#include <doctest/doctest.h>

#include <boost/json/parse.hpp>

#include <chrono>
#include <filesystem>
#include <numeric>
#include <thread>
#include <vector>

#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/tenant_store.h"
#include "edge/gateway/tenancy/usage_ledger.h"
#include "postgres_server.h"
#include "tenancy/postgres.h"
#include "tenancy/sqlite.h"
#include "test_support.h"
#include "usage_fixtures.h"

namespace gw = edge::gateway;
using namespace std::chrono_literals;

namespace {

const auto noon = std::chrono::system_clock::time_point(std::chrono::seconds(1777636800));  // 2026-05-01T12:00Z

std::unique_ptr<gw::tenant_store> open_store(const std::filesystem::path& dir, const edge::time_source& clock) {
  auto store = gw::tenant_store::open(dir, clock);
  REQUIRE_MESSAGE(store.ok(), store.error().to_string());
  return std::move(store).value();
}

gw::tenant_record tenant(std::string id, std::optional<std::int64_t> rpm = std::nullopt) {
  gw::tenant_record t;
  t.id = std::move(id);
  t.quotas.requests_per_minute = rpm;
  return t;
}

const gw::audit_context admin{"admin", "req_test"};

std::unique_ptr<gw::tenant_store> require_store(edge::result<std::unique_ptr<gw::tenant_store>> store) {
  REQUIRE_MESSAGE(store.ok(), store.error().to_string());
  return std::move(store).value();
}

// Where a test's store lives; open() may be called again to reopen it.
struct sqlite_place {
  edge::testing::temp_dir dir;
  std::unique_ptr<gw::tenant_store> open(const edge::time_source& clock) {
    return require_store(gw::tenant_store::open(dir.path(), clock));
  }
  // Rows of api_keys whose digest column holds `digest`, or whose digest column reads as `text`.
  std::int64_t keys_matching(std::span<const std::uint8_t> digest, std::string_view text) {
    auto db = gw::sqlite::database::open(dir / "tenants.db");
    REQUIRE(db.ok());
    auto q = db->prepare("SELECT count(*) FROM api_keys WHERE secret_sha256 = ? OR CAST(secret_sha256 AS TEXT) = ?");
    REQUIRE(q.ok());
    q->bind(1, digest).bind(2, text);
    REQUIRE(*q->step());
    return q->int64(0);
  }
};

struct postgres_place {
  std::string url = edge::testing::postgres_server::shared().fresh_database();
  std::unique_ptr<gw::tenant_store> open(const edge::time_source& clock) {
    return require_store(gw::tenant_store::open({.url = url}, clock));
  }
  std::int64_t keys_matching(std::span<const std::uint8_t> digest, std::string_view text) {
    auto c = gw::postgres::connection::open({.url = url});
    REQUIRE(c.ok());
    auto rows = c->exec("SELECT count(*) FROM api_keys WHERE secret_sha256 = $1::bytea OR "
                        "encode(secret_sha256, 'escape') = $2",
                        {gw::postgres::bytea(digest), gw::postgres::text(text)});
    REQUIRE_MESSAGE(rows.ok(), rows.error().to_string());
    return rows->int64(0, 0);
  }
};

}  // namespace

TEST_CASE("open creates the folder and a WAL database at the latest schema version") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  const auto dir = tmp / "nested" / "state";
  {
    auto store = open_store(dir, clock);
    CHECK(std::filesystem::exists(dir / "tenants.db"));
    CHECK(store->schema_version() == 7);
    CHECK(store->snapshot()->tenant_count() == 0);
    auto db = gw::sqlite::database::open(dir / "tenants.db");
    REQUIRE(db.ok());
    CHECK(db->journal_mode() == "wal");
  }
  // Reopening finds the schema in place and runs nothing again.
  auto again = open_store(dir, clock);
  CHECK(again->schema_version() == 7);
}

TEST_CASE("a version-3 database gains the KV tier caps' columns and keeps its tenants and keys") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  std::string key_id;
  {
    auto store = open_store(tmp.path(), clock);
    gw::tenant_record acme = tenant("acme", 600);
    acme.weight = 2.5;
    acme.quotas.daily_tokens = 5000000;
    REQUIRE(store->create_tenant(acme, admin).ok());
    auto issued = store->create_key("acme", std::nullopt, admin);
    REQUIRE(issued.ok());
    key_id = issued->record.id;
  }
  {
    // What a version-3 store left: steps 4 to 7 undone. Step 4's columns were added last, so
    // dropping them gives back the table as version 3 made it.
    auto db = gw::sqlite::database::open(tmp / "tenants.db");
    REQUIRE(db.ok());
    REQUIRE(db->exec("ALTER TABLE tenants DROP COLUMN kv_host_cache_bytes; "
                     "ALTER TABLE tenants DROP COLUMN kv_disk_cache_bytes; "
                     "DROP TABLE ledger_batches; DROP TABLE usage_by_key; "
                     "ALTER TABLE tenants DROP COLUMN monthly_tokens; "
                     "DELETE FROM schema_version WHERE version >= 4;")
                .ok());
    CHECK(*gw::sqlite::schema_version(*db) == 3);
    CHECK_FALSE(db->prepare("SELECT kv_host_cache_bytes FROM tenants").ok());
  }

  auto store = open_store(tmp.path(), clock);
  CHECK(store->schema_version() == 7);
  auto acme = store->get_tenant("acme");
  REQUIRE(acme.ok());
  CHECK(acme->weight == 2.5);
  CHECK(acme->quotas.requests_per_minute == 600);
  CHECK(acme->quotas.daily_tokens == 5000000);
  CHECK_FALSE(acme->quotas.kv_host_cache_bytes);  // unlimited, as before
  CHECK_FALSE(acme->quotas.kv_disk_cache_bytes);
  CHECK(store->snapshot()->tenant_count() == 1);
  CHECK(store->snapshot()->key_count() == 1);
  auto keys = store->list_keys("acme");
  REQUIRE(keys.ok());
  REQUIRE(keys->size() == 1);
  CHECK((*keys)[0].id == key_id);

  gw::tenant_patch patch;
  patch.quota(*gw::find_quota_kind(gw::quota_limit::kv_host_cache_bytes)) = 1 << 30;
  patch.quota(*gw::find_quota_kind(gw::quota_limit::kv_disk_cache_bytes)) = 0;
  auto updated = store->update_tenant("acme", patch, admin);
  REQUIRE_MESSAGE(updated.ok(), updated.error().to_string());
  CHECK(updated->quotas.kv_host_cache_bytes == 1 << 30);
  CHECK(updated->quotas.kv_disk_cache_bytes == 0);
  CHECK(updated->quotas.requests_per_minute == 600);
}

TEST_CASE("a state folder is used by one store at a time") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto first = open_store(tmp.path(), clock);
  auto second = gw::tenant_store::open(tmp.path(), clock);
  REQUIRE_FALSE(second.ok());
  CHECK(second.error().code() == edge::status_code::failed_precondition);
  CHECK(second.error().message().find("in use by another edgeinfer") != std::string::npos);
  first.reset();
  CHECK(gw::tenant_store::open(tmp.path(), clock).ok());
}

TEST_CASE("migrations run once each, in order, and a failing one leaves the previous version") {
  edge::testing::temp_dir tmp;
  auto db = gw::sqlite::database::open(tmp / "m.db");
  REQUIRE(db.ok());
  const gw::sqlite::migration v1{1, "one", "CREATE TABLE a (x INTEGER); INSERT INTO a VALUES (1);"};
  const gw::sqlite::migration v2{2, "two", "INSERT INTO a VALUES (2);"};
  const gw::sqlite::migration bad{3, "bad", "INSERT INTO a VALUES (3); INSERT INTO missing VALUES (1);"};

  const gw::sqlite::migration first[] = {v1};
  CHECK(*gw::sqlite::migrate(*db, first) == 1);
  const gw::sqlite::migration both[] = {v1, v2};
  CHECK(*gw::sqlite::migrate(*db, both) == 2);
  CHECK(*gw::sqlite::migrate(*db, both) == 2);  // nothing left to do
  auto rows = db->prepare("SELECT count(*), sum(x) FROM a");
  REQUIRE(rows.ok());
  REQUIRE(*rows->step());
  CHECK(rows->int64(0) == 2);  // v1 ran once, v2 once
  CHECK(rows->int64(1) == 3);

  const gw::sqlite::migration failing[] = {v1, v2, bad};
  auto failed = gw::sqlite::migrate(*db, failing);
  REQUIRE_FALSE(failed.ok());
  CHECK(failed.error().message().find("schema migration 3 (bad)") != std::string::npos);
  CHECK(*gw::sqlite::schema_version(*db) == 2);
  auto after = db->prepare("SELECT count(*) FROM a");
  REQUIRE(after.ok());
  REQUIRE(*after->step());
  CHECK(after->int64(0) == 2);  // the failed step's first insert was rolled back

  // A database from a newer build is refused rather than misread.
  const gw::sqlite::migration older[] = {v1};
  auto refused = gw::sqlite::migrate(*db, older);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message().find("newer") != std::string::npos);

  // Versions must run 1, 2, 3.
  const gw::sqlite::migration gap[] = {v1, bad};
  CHECK_FALSE(gw::sqlite::migrate(*db, gap).ok());
}

TEST_CASE_TEMPLATE("tenants: create, list, get, update, delete", place, sqlite_place, postgres_place) {
  place where;
  edge::manual_time_source clock(noon);
  std::unique_ptr<gw::tenant_store> store = where.open(clock);

  gw::tenant_record acme = tenant("acme", 600);
  acme.weight = 2.5;
  acme.quotas.daily_tokens = 5000000;
  auto created = store->create_tenant(acme, admin);
  REQUIRE(created.ok());
  CHECK(created->created_at == 1777636800);
  CHECK(created->updated_at == 1777636800);
  REQUIRE(store->create_tenant(tenant("beta"), admin).ok());

  auto duplicate = store->create_tenant(tenant("acme"), admin);
  REQUIRE_FALSE(duplicate.ok());
  CHECK(duplicate.error().code() == edge::status_code::already_exists);
  CHECK(store->create_tenant(tenant("no spaces"), admin).error().code() == edge::status_code::invalid_argument);

  auto listed = store->list_tenants();
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 2);
  CHECK((*listed)[0].id == "acme");
  CHECK((*listed)[0].weight == 2.5);
  CHECK((*listed)[0].quotas.requests_per_minute == 600);
  CHECK((*listed)[0].quotas.daily_tokens == 5000000);
  CHECK_FALSE((*listed)[0].quotas.tokens_per_minute);  // absent: unlimited
  CHECK((*listed)[1].id == "beta");

  clock.advance(1h);
  gw::tenant_patch patch;
  patch.quota(*gw::find_quota_kind(gw::quota_limit::requests_per_minute)) = std::optional<std::int64_t>{};  // unlimited
  patch.quota(*gw::find_quota_kind(gw::quota_limit::tokens_per_minute)) = 1000;
  patch.weight = 1.0;
  auto updated = store->update_tenant("acme", patch, admin);
  REQUIRE(updated.ok());
  CHECK_FALSE(updated->quotas.requests_per_minute);
  CHECK(updated->quotas.tokens_per_minute == 1000);
  CHECK(updated->quotas.daily_tokens == 5000000);  // untouched
  CHECK(updated->weight == 1.0);
  CHECK(updated->updated_at == 1777636800 + 3600);
  CHECK(*store->get_tenant("acme") == *updated);
  CHECK(*store->snapshot()->tenant("acme") == *updated);
  CHECK(store->update_tenant("ghost", patch, admin).error().code() == edge::status_code::not_found);

  REQUIRE(store->delete_tenant("beta", admin).ok());
  CHECK(store->get_tenant("beta").error().code() == edge::status_code::not_found);
  CHECK(store->delete_tenant("beta", admin).code() == edge::status_code::not_found);
  CHECK(store->snapshot()->tenant("beta") == nullptr);
}

TEST_CASE_TEMPLATE("keys: only the secret's digest is stored; list, revoke and the snapshot follow", place, sqlite_place, postgres_place) {
  place where;
  edge::manual_time_source clock(noon);
  std::unique_ptr<gw::tenant_store> store = where.open(clock);
  REQUIRE(store->create_tenant(tenant("acme"), admin).ok());

  auto issued = store->create_key("acme", std::nullopt, admin);
  REQUIRE(issued.ok());
  const auto parts = gw::split_api_key(issued->key);
  REQUIRE(parts);
  CHECK(parts->id == issued->record.id);
  CHECK(parts->id.size() == 16);
  CHECK(parts->secret.size() == 43);
  CHECK(issued->record.secret_sha256 == edge::sha256(parts->secret));
  CHECK(store->create_key("ghost", std::nullopt, admin).error().code() == edge::status_code::not_found);
  CHECK(store->create_key("acme", 1777636800 - 1, admin).error().code() == edge::status_code::invalid_argument);

  // The secret appears nowhere in the database: the key is found by digest only.
  CHECK(where.keys_matching(edge::sha256(parts->secret), parts->secret) == 1);

  auto second = store->create_key("acme", 1777636800 + 60, admin);
  REQUIRE(second.ok());
  CHECK(second->record.expires_at == 1777636800 + 60);
  CHECK(second->record.id != issued->record.id);

  auto keys = store->list_keys("acme");
  REQUIRE(keys.ok());
  CHECK(keys->size() == 2);
  CHECK(store->snapshot()->key(issued->record.id) != nullptr);

  const auto before = store->snapshot();
  auto revoked = store->revoke_key(issued->record.id, admin);
  REQUIRE(revoked.ok());
  CHECK(revoked->revoked_at == 1777636800);
  CHECK(revoked->state(1777636800) == "revoked");
  CHECK(store->snapshot()->version() > before->version());
  CHECK(store->snapshot()->key(issued->record.id)->revoked_at);
  CHECK_FALSE(before->key(issued->record.id)->revoked_at);  // old snapshots are immutable
  // Revoking again is not an error and changes nothing.
  CHECK(store->revoke_key(issued->record.id, admin)->revoked_at == 1777636800);
  CHECK(store->revoke_key("0000000000000000", admin).error().code() == edge::status_code::not_found);

  CHECK(second->record.state(1777636800 + 59) == "active");
  CHECK(second->record.state(1777636800 + 60) == "expired");

  // Deleting the tenant deletes its keys.
  REQUIRE(store->delete_tenant("acme", admin).ok());
  CHECK(store->snapshot()->key(second->record.id) == nullptr);
  CHECK(store->snapshot()->key_count() == 0);
}

TEST_CASE_TEMPLATE("everything survives reopening the store", place, sqlite_place, postgres_place) {
  place where;
  edge::manual_time_source clock(noon);
  std::string key_id;
  {
    std::unique_ptr<gw::tenant_store> store = where.open(clock);
    REQUIRE(store->create_tenant(tenant("acme", 60), admin).ok());
    key_id = store->create_key("acme", std::nullopt, admin)->record.id;
    REQUIRE(store->add_usage({.rows = {{"acme", 1777636800, {1, 10, 20, 5, 0}}}}).ok());
  }
  std::unique_ptr<gw::tenant_store> store = where.open(clock);
  CHECK(store->snapshot()->tenant("acme")->quotas.requests_per_minute == 60);
  CHECK(store->snapshot()->key(key_id) != nullptr);
  CHECK(store->usage("acme", 1777636800, 1777636800 + 3600)->size() == 1);
  CHECK(store->audit(10)->size() == 2);
}

TEST_CASE_TEMPLATE("stored responses: per tenant, newest kept within the byte bound, gone when expired or deleted", place, sqlite_place, postgres_place) {
  using namespace std::chrono_literals;
  place where;
  edge::manual_time_source clock(noon);
  std::unique_ptr<gw::tenant_store> store = where.open(clock);
  const auto response = [](std::string id, std::size_t size) {
    return gw::stored_response{.id = std::move(id), .response = std::string(size, 'r'), .conversation = "[]"};
  };
  // Each is 102 bytes: three fit in 310, the fourth pushes the oldest out.
  for (const char* id : {"resp_1", "resp_2", "resp_3"}) CHECK(*store->put_response("acme", response(id, 100), 3600, 310));
  CHECK(*store->put_response("other", response("resp_1", 100), 3600, 310));
  CHECK(*store->stored_response_bytes("acme") == 306);
  CHECK(*store->put_response("acme", response("resp_4", 100), 3600, 310));
  CHECK_FALSE(store->get_response("acme", "resp_1")->has_value());
  CHECK(store->get_response("acme", "resp_2")->has_value());
  CHECK(*store->stored_response_bytes("acme") == 306);
  // Another tenant's response of the same id is its own, untouched.
  CHECK(store->get_response("other", "resp_1")->has_value());
  CHECK_FALSE(store->get_response("other", "resp_2")->has_value());
  // One larger than the bound alone is not kept, and takes nothing else with it.
  CHECK_FALSE(*store->put_response("acme", response("resp_big", 400), 3600, 310));
  CHECK(*store->stored_response_bytes("acme") == 306);
  const auto got = store->get_response("acme", "resp_3");
  REQUIRE(got->has_value());
  CHECK((*got)->response.size() == 100);
  CHECK((*got)->conversation == "[]");
  CHECK((*got)->created_at == 1777636800);
  CHECK((*got)->expires_at == 1777636800 + 3600);
  // Deleted, and expired.
  CHECK(*store->delete_response("acme", "resp_3"));
  CHECK_FALSE(*store->delete_response("acme", "resp_3"));
  CHECK(*store->put_response("acme", response("resp_short", 10), 60, 310));
  clock.advance(61s);
  CHECK_FALSE(store->get_response("acme", "resp_short")->has_value());
  CHECK_FALSE(*store->delete_response("acme", "resp_short"));
  CHECK(store->get_response("acme", "resp_4")->has_value());
}

TEST_CASE_TEMPLATE("usage rows add up per tenant and hour; queries by time range", place, sqlite_place, postgres_place) {
  place where;
  edge::manual_time_source clock(noon);
  std::unique_ptr<gw::tenant_store> store = where.open(clock);
  const gw::unix_time h0 = 1777636800;  // 12:00
  std::vector<gw::usage_row> rows = {
      {"acme", h0 + 10, {1, 100, 50, 0, 0}},
      {"acme", h0 + 3599, {2, 10, 5, 4, 1}},   // same hour
      {"acme", h0 + 3600, {1, 1, 1, 0, 0}},    // next hour
      {"beta", h0, {7, 7, 7, 7, 7}},
  };
  REQUIRE(store->add_usage({.rows = rows}).ok());
  REQUIRE(store->add_usage({.rows = {{"acme", h0, {0, 0, 0, 0, 3}}}}).ok());

  auto all = store->usage("acme", h0 - 86400, h0 + 86400);
  REQUIRE(all.ok());
  REQUIRE(all->size() == 2);
  CHECK((*all)[0].hour_start == h0);
  CHECK((*all)[0].counts == gw::usage_counts{3, 110, 55, 4, 4});
  CHECK((*all)[1].hour_start == h0 + 3600);
  // `from` inside an hour includes that hour; `to` excludes hours starting at or after it.
  CHECK(store->usage("acme", h0 + 1800, h0 + 3600)->size() == 1);
  CHECK(store->usage("acme", h0 + 3600, h0 + 3601)->front().counts.requests == 1);
  CHECK(store->usage("nobody", h0, h0 + 86400)->empty());

  auto today = store->tokens_since(h0 - 12 * 3600);
  REQUIRE(today.ok());
  CHECK(today->at("acme") == 110 + 55 + 2);
  CHECK(today->at("beta") == 14);
  CHECK(store->tokens_since(h0 + 3600)->at("acme") == 2);
}

TEST_CASE_TEMPLATE("the audit log records each admin change with its request id, newest first", place, sqlite_place, postgres_place) {
  place where;
  edge::manual_time_source clock(noon);
  std::unique_ptr<gw::tenant_store> store = where.open(clock);
  REQUIRE(store->create_tenant(tenant("acme"), {"admin", "req_1"}).ok());
  gw::tenant_patch patch;
  patch.weight = 3.0;
  REQUIRE(store->update_tenant("acme", patch, {"admin", "req_2"}).ok());
  auto key = store->create_key("acme", std::nullopt, {"admin", "req_3"});
  REQUIRE(key.ok());
  REQUIRE(store->revoke_key(key->record.id, {"admin", "req_4"}).ok());
  REQUIRE(store->delete_tenant("acme", {"admin", "req_5"}).ok());
  // Failed changes leave no entry.
  CHECK_FALSE(store->delete_tenant("acme", {"admin", "req_6"}).ok());

  auto log = store->audit(100);
  REQUIRE(log.ok());
  REQUIRE(log->size() == 5);
  const char* actions[] = {"tenant.delete", "key.revoke", "key.create", "tenant.update", "tenant.create"};
  for (std::size_t i = 0; i < 5; ++i) {
    CHECK((*log)[i].action == actions[i]);
    CHECK((*log)[i].request_id == "req_" + std::to_string(5 - i));
    CHECK((*log)[i].actor == "admin");
  }
  CHECK((*log)[1].target == key->record.id);
  const auto update = boost::json::parse((*log)[3].details).as_object();
  CHECK(update.at("before").at("weight").to_number<double>() == 1.0);
  CHECK(update.at("after").at("weight").to_number<double>() == 3.0);
  // The secret is never in the log.
  const std::string secret(gw::split_api_key(key->key)->secret);
  for (const auto& entry : *log) CHECK(entry.details.find(secret) == std::string::npos);

  auto page = store->audit(2, (*log)[1].id);
  REQUIRE(page.ok());
  REQUIRE(page->size() == 2);
  CHECK((*page)[0].action == "key.create");
  CHECK((*page)[1].action == "tenant.update");
}

TEST_CASE_TEMPLATE("first start creates tenant \"default\" and one key, once", place, sqlite_place, postgres_place) {
  place where;
  edge::manual_time_source clock(noon);
  {
    std::unique_ptr<gw::tenant_store> store = where.open(clock);
    auto first = store->bootstrap_default_tenant({"serve", ""});
    REQUIRE(first.ok());
    REQUIRE(*first);
    CHECK((*first)->record.tenant_id == "default");
    const auto snapshot = store->snapshot();
    REQUIRE(snapshot->tenant("default"));
    CHECK(snapshot->tenant("default")->quotas == gw::tenant_quotas{});
    CHECK(snapshot->key((*first)->record.id) != nullptr);
    CHECK_FALSE(*store->bootstrap_default_tenant({"serve", ""}));
    REQUIRE(store->delete_tenant("default", admin).ok());
  }
  // Not even after "default" was deleted and the server restarted.
  std::unique_ptr<gw::tenant_store> store = where.open(clock);
  CHECK_FALSE(*store->bootstrap_default_tenant({"serve", ""}));
  CHECK(store->snapshot()->tenant_count() == 0);
}

TEST_CASE_TEMPLATE("a store that already has tenants is not bootstrapped", place, sqlite_place, postgres_place) {
  place where;
  edge::manual_time_source clock(noon);
  std::unique_ptr<gw::tenant_store> store = where.open(clock);
  REQUIRE(store->create_tenant(tenant("acme"), admin).ok());
  CHECK_FALSE(*store->bootstrap_default_tenant({"serve", ""}));
  CHECK(store->snapshot()->tenant("default") == nullptr);
}

TEST_CASE_TEMPLATE("a usage batch is added once, however often it is written", place, sqlite_place, postgres_place) {
  place where;
  edge::manual_time_source clock(noon);
  std::unique_ptr<gw::tenant_store> store = where.open(clock);
  const gw::usage_batch batch{.id = "ledger-1", .rows = {{"acme", 1777636800, {1, 10, 20, 5, 0}}}};
  REQUIRE(store->add_usage(batch).ok());
  REQUIRE(store->add_usage(batch).ok());  // a retry whose first answer was lost
  REQUIRE(store->add_usage({.id = "ledger-2", .rows = batch.rows}).ok());
  const auto rows = store->usage("acme", 1777636800, 1777636800 + 3600);
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == 1);
  CHECK(rows->front().counts == gw::usage_counts{2, 20, 40, 10, 0});
}

namespace {

// Waits up to `limit` for `seen` and returns how long it took (limit + 1 ms when it never held).
template <class Predicate>
std::chrono::milliseconds time_until(Predicate seen, std::chrono::milliseconds limit) {
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
    if (seen()) return waited;
    if (waited > limit) return limit + 1ms;
    std::this_thread::sleep_for(5ms);
  }
}

}  // namespace

TEST_CASE("PostgreSQL: a change made through one gateway is in every other gateway's snapshot within a second") {
  const std::string url = edge::testing::postgres_server::shared().fresh_database();
  edge::manual_time_source clock(noon);
  auto a = require_store(gw::tenant_store::open({.url = url}, clock));
  auto b = require_store(gw::tenant_store::open({.url = url}, clock));
  auto c = require_store(gw::tenant_store::open({.url = url}, clock));

  REQUIRE(a->create_tenant(tenant("acme", 60), admin).ok());
  auto key = a->create_key("acme", std::nullopt, admin);
  REQUIRE(key.ok());
  const std::string id = key->record.id;
  CHECK(a->snapshot()->key(id) != nullptr);  // the gateway that made it: at once
  const auto created = time_until([&] { return b->snapshot()->key(id) && c->snapshot()->key(id); }, 1s);
  MESSAGE("a new key reached the other gateways in " << created.count() << " ms");
  CHECK(created <= 1s);

  REQUIRE(b->revoke_key(id, admin).ok());
  const auto revoked = time_until(
      [&] {
        const auto* in_a = a->snapshot()->key(id);
        const auto* in_c = c->snapshot()->key(id);
        return in_a && in_a->revoked_at && in_c && in_c->revoked_at;
      },
      1s);
  MESSAGE("a revocation reached the other gateways in " << revoked.count() << " ms");
  CHECK(revoked <= 1s);

  // A change whose notification never came (made behind the gateways' backs): the periodic
  // check of the change counter finds it.
  {
    auto direct = gw::postgres::connection::open({.url = url});
    REQUIRE(direct.ok());
    REQUIRE(direct->run("UPDATE tenants SET requests_per_minute = 7 WHERE id = 'acme'").ok());
    REQUIRE(direct->run("UPDATE tenancy_version SET version = version + 1").ok());
  }
  const auto polled = time_until(
      [&] {
        return a->snapshot()->tenant("acme")->quotas.requests_per_minute == 7 &&
               b->snapshot()->tenant("acme")->quotas.requests_per_minute == 7;
      },
      1s);
  MESSAGE("an unannounced change was found in " << polled.count() << " ms");
  CHECK(polled <= 1s);
}

TEST_CASE("PostgreSQL: gateways starting together migrate once and make one default key") {
  const std::string url = edge::testing::postgres_server::shared().fresh_database();
  edge::manual_time_source clock(noon);
  constexpr int gateways = 4;
  std::vector<std::unique_ptr<gw::tenant_store>> stores(gateways);
  std::vector<std::string> errors(gateways);
  std::vector<int> keys_made(gateways, 0);
  {
    std::vector<std::jthread> starting;
    for (int i = 0; i < gateways; ++i) {
      starting.emplace_back([&, i] {
        auto opened = gw::tenant_store::open({.url = url}, clock);
        if (!opened.ok()) {
          errors[i] = opened.error().to_string();
          return;
        }
        stores[i] = std::move(opened).value();
        auto made = stores[i]->bootstrap_default_tenant({"serve", ""});
        if (!made.ok()) errors[i] = made.error().to_string();
        else if (*made) keys_made[i] = 1;
      });
    }
  }
  for (int i = 0; i < gateways; ++i) {
    CHECK_MESSAGE(errors[i].empty(), errors[i]);
    REQUIRE(stores[i]);
    CHECK(stores[i]->schema_version() == 3);
  }
  CHECK(std::accumulate(keys_made.begin(), keys_made.end(), 0) == 1);
  auto tenants = stores[0]->list_tenants();
  REQUIRE(tenants.ok());
  CHECK(tenants->size() == 1);
  CHECK(stores[0]->list_keys("default")->size() == 1);
}

TEST_CASE("PostgreSQL down: the snapshot keeps serving, calls fail fast, the ledger's batch lands once when it is back") {
  auto server = edge::testing::postgres_server::start();
  const std::string url = server->fresh_database();
  edge::manual_time_source clock(noon);
  auto store = require_store(gw::tenant_store::open({.url = url, .query_timeout = 500ms}, clock));
  REQUIRE(store->create_tenant(tenant("acme", 60), admin).ok());
  auto key = store->create_key("acme", std::nullopt, admin);
  REQUIRE(key.ok());
  gw::usage_ledger ledger(*store, clock, std::chrono::hours(1));
  ledger.record("acme", {.requests = 1, .prompt_tokens = 10, .completion_tokens = 20});
  REQUIRE(ledger.flush().ok());

  server->kill();
  // Requests still find their tenant and key.
  CHECK(store->snapshot()->key(key->record.id) != nullptr);
  CHECK(store->snapshot()->tenant("acme")->quotas.requests_per_minute == 60);
  // A call fails within the timeout, and the next ones, until a reconnection is due, at once.
  const auto started = std::chrono::steady_clock::now();
  auto failed = store->get_tenant("acme");
  CHECK(failed.error().code() == edge::status_code::unavailable);
  auto again = store->list_tenants();
  CHECK(again.error().code() == edge::status_code::unavailable);
  CHECK(std::chrono::steady_clock::now() - started < 2s);
  CHECK_FALSE(store->health().reachable);

  ledger.record("acme", {.requests = 1, .prompt_tokens = 1, .completion_tokens = 2});
  CHECK_FALSE(ledger.flush().ok());
  ledger.record("acme", {.requests = 1, .prompt_tokens = 100, .completion_tokens = 200});
  CHECK(ledger.pending_rows() == 2);  // the failed batch's row, and the one recorded since

  server->restart();
  const auto back = time_until([&] { return ledger.flush().ok(); }, 5s);
  CHECK(back <= 5s);
  CHECK(ledger.pending_rows() == 0);
  CHECK(edge::testing::total_usage(*store, "acme") == gw::usage_counts{3, 111, 222, 0, 0});
  CHECK(store->health().reachable);
}

TEST_CASE("PostgreSQL hung: a call gives up after the store's timeout, and the store recovers when it answers") {
  auto server = edge::testing::postgres_server::start();
  const std::string url = server->fresh_database();
  edge::manual_time_source clock(noon);
  auto store = require_store(gw::tenant_store::open({.url = url, .query_timeout = 300ms}, clock));
  REQUIRE(store->create_tenant(tenant("acme"), admin).ok());
  server->stop();
  const auto started = std::chrono::steady_clock::now();
  auto stalled = store->get_tenant("acme");
  const auto waited = std::chrono::steady_clock::now() - started;
  server->resume();
  CHECK(stalled.error().code() == edge::status_code::unavailable);
  CHECK(waited < 2s);
  CHECK(store->snapshot()->tenant("acme") != nullptr);
  const auto recovered = time_until([&] { return store->get_tenant("acme").ok(); }, 5s);
  CHECK(recovered <= 5s);
}

TEST_CASE("PostgreSQL: the daily-budget holds of a running gateway are its own; a gone gateway's count as spent") {
  const std::string url = edge::testing::postgres_server::shared().fresh_database();
  edge::manual_time_source clock(noon);
  const std::int64_t day = edge::testing::noon_s / 86400;
  auto later = require_store(gw::tenant_store::open({.url = url}, clock));
  {
    auto running = require_store(gw::tenant_store::open({.url = url}, clock));
    REQUIRE(running->add_hold({.id = "hold-1", .tenant_id = "acme", .day = day, .reserved_tokens = 1000}).ok());
    REQUIRE(running->add_usage({.id = "b1", .hold_progress = {{"hold-1", 300}}}).ok());
    // While it runs, another gateway starting leaves its hold alone.
    auto counted = later->unreleased_hold_tokens(day);
    REQUIRE(counted.ok());
    CHECK(counted->empty());
  }
  // Gone (it stopped being seen): what its request may have spent beyond its charge counts.
  clock.advance(std::chrono::seconds(60));
  auto counted = later->unreleased_hold_tokens(day);
  REQUIRE(counted.ok());
  CHECK(counted->at("acme") == 700);
}

TEST_CASE("migrate-store: a SQLite store's contents copy into an empty PostgreSQL store, and back, as they were") {
  using namespace std::chrono_literals;
  sqlite_place from;
  edge::manual_time_source clock(noon);
  auto sqlite_store = from.open(clock);
  REQUIRE(*sqlite_store->bootstrap_default_tenant({"serve", ""}));
  gw::tenant_record acme = tenant("acme", 600);
  acme.weight = 2.5;
  acme.quotas.kv_host_cache_bytes = 1 << 20;
  REQUIRE(sqlite_store->create_tenant(acme, admin).ok());
  auto key = sqlite_store->create_key("acme", 1777636800 + 86400, admin);
  REQUIRE(key.ok());
  clock.advance(1h);
  auto revoked = sqlite_store->create_key("acme", std::nullopt, admin);
  REQUIRE(sqlite_store->revoke_key(revoked->record.id, admin).ok());
  REQUIRE(sqlite_store->add_usage({.rows = {{"acme", 1777636800, {3, 30, 60, 12, 1}},
                                            {"gone", 1777636800 - 3600, {1, 1, 1, 0, 0}}},
                                   .details = {{"acme", 1777636800, {key->record.id, "m", "completions"},
                                                {3, 30, 60, 12, 0}}}})
              .ok());
  REQUIRE(*sqlite_store->put_response("acme", {.id = "resp_1", .response = "{}", .conversation = "[]"}, 3600, 1000));
  const auto original = sqlite_store->contents();
  REQUIRE(original.ok());

  postgres_place to;
  auto pg_store = to.open(clock);
  REQUIRE(pg_store->import_contents(*original).ok());
  // The key works from the snapshot, as it did.
  REQUIRE(pg_store->snapshot()->key(key->record.id) != nullptr);
  CHECK(pg_store->snapshot()->key(key->record.id)->secret_sha256 == key->record.secret_sha256);
  CHECK(pg_store->snapshot()->key(revoked->record.id)->revoked_at);
  CHECK(*pg_store->get_tenant("acme") == *sqlite_store->get_tenant("acme"));
  CHECK_FALSE(*pg_store->bootstrap_default_tenant({"serve", ""}));  // the first start happened
  CHECK(pg_store->get_response("acme", "resp_1")->has_value());
  const auto copied = pg_store->contents();
  REQUIRE(copied.ok());
  CHECK(copied->tenants == original->tenants);
  CHECK(copied->usage.size() == original->usage.size());
  CHECK(copied->usage.front().counts == original->usage.front().counts);
  REQUIRE(copied->usage_details.size() == 1);
  CHECK(copied->usage_details.front().labels == original->usage_details.front().labels);
  CHECK(copied->usage_details.front().counts == original->usage_details.front().counts);
  REQUIRE(copied->audit.size() == original->audit.size());
  for (std::size_t i = 0; i < copied->audit.size(); ++i) {
    CHECK(copied->audit[i].action == original->audit[i].action);
    CHECK(copied->audit[i].at == original->audit[i].at);
    CHECK(copied->audit[i].details == original->audit[i].details);
  }
  CHECK(copied->bootstrapped_at == original->bootstrapped_at);

  // Not into a store that has something already.
  CHECK(pg_store->import_contents(*original).code() == edge::status_code::failed_precondition);
  // And back into an empty SQLite store.
  sqlite_place back;
  auto again = back.open(clock);
  REQUIRE(again->import_contents(*copied).ok());
  CHECK(again->contents()->tenants == original->tenants);
  CHECK(again->snapshot()->key(key->record.id) != nullptr);
}

TEST_CASE_TEMPLATE("spend: served usage summed per key, model and API over a window", place, sqlite_place,
                   postgres_place) {
  place where;
  edge::manual_time_source clock(noon);
  std::unique_ptr<gw::tenant_store> store = where.open(clock);
  const gw::unix_time h0 = 1777636800;
  const gw::usage_labels chat_a{"keyA", "m1", "chat_completions"};
  const gw::usage_labels chat_b{"keyB", "m1", "chat_completions"};
  const gw::usage_labels messages_a{"keyA", "m1", "messages"};
  REQUIRE(store->add_usage({.id = "d1",
                            .details = {{"acme", h0 + 5, chat_a, {1, 100, 10, 40, 0}},
                                        {"acme", h0 + 3600, chat_a, {2, 200, 20, 0, 0}},
                                        {"acme", h0, chat_b, {1, 5, 5, 0, 0}},
                                        {"acme", h0, messages_a, {1, 50, 50, 0, 0}},
                                        {"other", h0, chat_a, {9, 9, 9, 9, 0}}}})
              .ok());
  REQUIRE(store->add_usage({.id = "d2", .details = {{"acme", h0 + 10, chat_a, {1, 1, 1, 1, 0}}}}).ok());

  const auto all = store->spend("acme", h0, h0 + 7200);
  REQUIRE(all.ok());
  REQUIRE(all->size() == 3);
  // Largest first.
  CHECK((*all)[0].labels == chat_a);
  CHECK((*all)[0].counts == gw::usage_counts{4, 301, 31, 41, 0});
  CHECK((*all)[1].labels == messages_a);
  CHECK((*all)[2].labels == chat_b);
  // A window of the first hour, one key.
  const auto first_hour = store->spend("acme", h0, h0 + 3600, "keyA");
  REQUIRE(first_hour.ok());
  REQUIRE(first_hour->size() == 2);
  CHECK((*first_hour)[0].labels == chat_a);
  CHECK((*first_hour)[0].counts == gw::usage_counts{2, 101, 11, 41, 0});
  CHECK((*first_hour)[1].labels == messages_a);
  CHECK(store->spend("nobody", h0, h0 + 7200)->empty());
}
