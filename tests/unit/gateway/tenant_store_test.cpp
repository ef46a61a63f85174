// The tenant store on a real SQLite file in a temporary folder: migrations, CRUD, keys, the
// snapshot the request path reads, the usage ledger's rows and the audit log.
#include <doctest/doctest.h>

#include <boost/json/parse.hpp>

#include <chrono>
#include <filesystem>

#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/tenant_store.h"
#include "tenancy/sqlite.h"
#include "test_support.h"

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

}  // namespace

TEST_CASE("open creates the folder and a WAL database at the latest schema version") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  const auto dir = tmp / "nested" / "state";
  {
    auto store = open_store(dir, clock);
    CHECK(std::filesystem::exists(dir / "tenants.db"));
    CHECK(store->schema_version() == 4);
    CHECK(store->snapshot()->tenant_count() == 0);
    auto db = gw::sqlite::database::open(dir / "tenants.db");
    REQUIRE(db.ok());
    CHECK(db->journal_mode() == "wal");
  }
  // Reopening finds the schema in place and runs nothing again.
  auto again = open_store(dir, clock);
  CHECK(again->schema_version() == 4);
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
    // What a version-3 store left: step 4 undone. Its columns were added last, so dropping them
    // gives back the table as version 3 made it.
    auto db = gw::sqlite::database::open(tmp / "tenants.db");
    REQUIRE(db.ok());
    REQUIRE(db->exec("ALTER TABLE tenants DROP COLUMN kv_host_cache_bytes; "
                     "ALTER TABLE tenants DROP COLUMN kv_disk_cache_bytes; "
                     "DELETE FROM schema_version WHERE version = 4;")
                .ok());
    CHECK(*gw::sqlite::schema_version(*db) == 3);
    CHECK_FALSE(db->prepare("SELECT kv_host_cache_bytes FROM tenants").ok());
  }

  auto store = open_store(tmp.path(), clock);
  CHECK(store->schema_version() == 4);
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

TEST_CASE("tenants: create, list, get, update, delete") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = open_store(tmp.path(), clock);

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

TEST_CASE("keys: only the secret's digest is stored; list, revoke and the snapshot follow") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = open_store(tmp.path(), clock);
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

  // The secret appears nowhere in the database file.
  {
    auto db = gw::sqlite::database::open(tmp / "tenants.db");
    REQUIRE(db.ok());
    auto q = db->prepare("SELECT count(*) FROM api_keys WHERE secret_sha256 = ? OR CAST(secret_sha256 AS TEXT) = ?");
    REQUIRE(q.ok());
    q->bind(1, std::span<const std::uint8_t>(edge::sha256(parts->secret))).bind(2, parts->secret);
    REQUIRE(*q->step());
    CHECK(q->int64(0) == 1);  // found by digest only
  }

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

TEST_CASE("everything survives reopening the store") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  std::string key_id;
  {
    auto store = open_store(tmp.path(), clock);
    REQUIRE(store->create_tenant(tenant("acme", 60), admin).ok());
    key_id = store->create_key("acme", std::nullopt, admin)->record.id;
    REQUIRE(store->add_usage({.rows = {{"acme", 1777636800, {1, 10, 20, 5, 0}}}}).ok());
  }
  auto store = open_store(tmp.path(), clock);
  CHECK(store->snapshot()->tenant("acme")->quotas.requests_per_minute == 60);
  CHECK(store->snapshot()->key(key_id) != nullptr);
  CHECK(store->usage("acme", 1777636800, 1777636800 + 3600)->size() == 1);
  CHECK(store->audit(10)->size() == 2);
}

TEST_CASE("stored responses: per tenant, newest kept within the byte bound, gone when expired or deleted") {
  using namespace std::chrono_literals;
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = open_store(tmp.path(), clock);
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

TEST_CASE("usage rows add up per tenant and hour; queries by time range") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = open_store(tmp.path(), clock);
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

TEST_CASE("the audit log records each admin change with its request id, newest first") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = open_store(tmp.path(), clock);
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

TEST_CASE("first start creates tenant \"default\" and one key, once") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  {
    auto store = open_store(tmp.path(), clock);
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
  auto store = open_store(tmp.path(), clock);
  CHECK_FALSE(*store->bootstrap_default_tenant({"serve", ""}));
  CHECK(store->snapshot()->tenant_count() == 0);
}

TEST_CASE("a store that already has tenants is not bootstrapped") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  auto store = open_store(tmp.path(), clock);
  REQUIRE(store->create_tenant(tenant("acme"), admin).ok());
  CHECK_FALSE(*store->bootstrap_default_tenant({"serve", ""}));
  CHECK(store->snapshot()->tenant("default") == nullptr);
}
