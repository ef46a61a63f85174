// The table of quota kinds (quota_kinds.h) against everything that reads it: every kind, named
// by the table alone, goes through the admin API's JSON, its body parsers and the SQLite store
// and comes back as it went in, and every kind of the engine phase reaches the generate request
// and is refused by no store, so a kind added to the table is checked here without a word of
// this file changing, and one that any of them leaves out fails.
#include <doctest/doctest.h>

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <set>
#include <string>
#include <variant>

#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/admin_request.h"
#include "edge/gateway/tenancy/engine_limits.h"
#include "edge/gateway/tenancy/quota.h"
#include "edge/gateway/tenancy/quota_response.h"
#include "edge/gateway/tenancy/tenant_json.h"
#include "edge/gateway/tenancy/tenant_store.h"
#include "tenancy/redis_quota_scripts.h"
#include "quota_phases.h"
#include "postgres_server.h"
#include "tenancy/postgres.h"
#include "tenancy/sqlite.h"
#include "test_support.h"

namespace gw = edge::gateway;

namespace {

const auto noon = std::chrono::system_clock::time_point(std::chrono::seconds(1777636800));  // 2026-05-01T12:00Z
const gw::audit_context admin{"admin", "req_kinds"};
constexpr gw::quota_phase phases[] = {gw::quota_phase::admission, gw::quota_phase::reservation,
                                      gw::quota_phase::engine};

// A value per kind, different for each kind and each round (so a value that lands in another
// kind's place is seen).
std::int64_t value_of(const gw::quota_kind& kind, std::int64_t round) {
  return 1000 * round + 7 * static_cast<std::int64_t>(gw::quota_kind_index(kind)) + 1;
}

// Limits with only `kind` set.
gw::tenant_quotas only(const gw::quota_kind& kind, std::int64_t value) {
  gw::tenant_quotas q;
  kind.of(q) = value;
  return q;
}

// Limits with every kind set.
gw::tenant_quotas every(std::int64_t round) {
  gw::tenant_quotas q;
  for (const gw::quota_kind& kind : gw::quota_kinds) kind.of(q) = value_of(kind, round);
  return q;
}

gw::tenant_record parsed_create(const std::string& body) {
  auto parsed = gw::parse_tenant_create(body);
  if (const auto* error = std::get_if<gw::admin_request_error>(&parsed)) FAIL(body << ": " << error->message);
  return std::get<gw::tenant_record>(parsed);
}

gw::tenant_patch parsed_patch(const std::string& body) {
  auto parsed = gw::parse_tenant_patch(body, "acme");
  if (const auto* error = std::get_if<gw::admin_request_error>(&parsed)) FAIL(body << ": " << error->message);
  return std::get<gw::tenant_patch>(parsed);
}

std::unique_ptr<gw::tenant_store> open_store(const std::filesystem::path& dir, const edge::time_source& clock) {
  auto store = gw::tenant_store::open(dir, clock);
  REQUIRE_MESSAGE(store.ok(), store.error().to_string());
  return std::move(store).value();
}

}  // namespace

TEST_CASE("the table: one row per kind, named and judged in one phase") {
  std::set<std::string_view> names;
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    CAPTURE(kind.name);
    CHECK(names.insert(kind.name).second);
    CHECK(gw::find_quota_kind(kind.name) == &kind);
    CHECK(gw::find_quota_kind(kind.limit) == &kind);
    CHECK(gw::to_string(kind.limit) == kind.name);  // the metric label
    CHECK_FALSE(kind.help.empty());
    CHECK(kind.counted() == !kind.lua_limit.empty());
    // Every limit, alone, is enough for its phase to call the store when it keeps counters, and
    // no other phase calls it.
    for (const gw::quota_phase phase : phases) {
      CHECK(gw::uses_counters(only(kind, 1), phase) == (phase == kind.phase && kind.counted()));
    }
    // A judged kind refuses, and 0 would refuse everything; the engine's never refuse, keep no
    // counters, and 0 keeps nothing.
    CHECK(kind.judged() == (kind.phase != gw::quota_phase::engine));
    CHECK((kind.refusal.status != 0) == kind.judged());
    CHECK(kind.least == (kind.judged() ? 1 : 0));
    if (!kind.judged()) CHECK_FALSE(kind.counted());
  }
  CHECK(gw::find_quota_kind("no_such_quota") == nullptr);
  CHECK(gw::find_quota_kind(gw::quota_limit::none) == nullptr);
  CHECK(gw::find_quota_kind(gw::quota_limit::quota_store_unavailable) == nullptr);
}

TEST_CASE("every kind round-trips through the tenant JSON and the create body") {
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    CAPTURE(kind.name);
    gw::tenant_record tenant;
    tenant.id = "acme";
    tenant.quotas = only(kind, value_of(kind, 1));

    // Shown: one field per kind, this one with its value, the others null (unlimited).
    const boost::json::object shown = gw::to_json(tenant.quotas);
    CHECK(shown.size() == gw::quota_kinds.size());
    for (const gw::quota_kind& each : gw::quota_kinds) {
      CAPTURE(each.name);
      REQUIRE(shown.contains(each.name));
      if (&each == &kind) CHECK(shown.at(each.name).as_int64() == value_of(kind, 1));
      else CHECK(shown.at(each.name).is_null());
    }

    // Sent back as the API shows it, read as the same tenant.
    boost::json::object body;
    body["id"] = tenant.id;
    body["quotas"] = gw::to_json(tenant).at("quotas");
    CHECK(parsed_create(boost::json::serialize(body)) == tenant);

    // Named alone in a create body.
    const std::string alone = "{\"id\":\"acme\",\"quotas\":{\"" + std::string(kind.name) + "\":" +
                              std::to_string(value_of(kind, 2)) + "}}";
    CHECK(parsed_create(alone).quotas == only(kind, value_of(kind, 2)));

    // Its least value is taken; out of range, it is refused with the field's path.
    const auto with = [&](std::int64_t value) {
      return gw::parse_tenant_create("{\"id\":\"acme\",\"quotas\":{\"" + std::string(kind.name) +
                                     "\":" + std::to_string(value) + "}}");
    };
    CHECK(parsed_create("{\"id\":\"acme\",\"quotas\":{\"" + std::string(kind.name) + "\":" +
                        std::to_string(kind.least) + "}}")
              .quotas == only(kind, kind.least));
    for (const std::int64_t bad : {kind.least - 1, gw::max_quota_value + 1}) {
      CAPTURE(bad);
      auto refused = with(bad);
      REQUIRE(std::holds_alternative<gw::admin_request_error>(refused));
      CHECK(std::get<gw::admin_request_error>(refused).param == "quotas." + std::string(kind.name));
      CHECK(std::get<gw::admin_request_error>(refused).message.find("from " + std::to_string(kind.least) + " to") !=
            std::string::npos);
    }
  }

  // All at once, each in its own place.
  gw::tenant_record all;
  all.id = "acme";
  all.quotas = every(3);
  boost::json::object body;
  body["id"] = all.id;
  body["quotas"] = gw::to_json(all.quotas);
  CHECK(parsed_create(boost::json::serialize(body)) == all);
}

TEST_CASE("every kind can be patched: set, made unlimited, or left alone") {
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    CAPTURE(kind.name);
    const std::string field = "\"" + std::string(kind.name) + "\"";
    const gw::tenant_patch set = parsed_patch("{\"quotas\":{" + field + ":" + std::to_string(value_of(kind, 4)) + "}}");
    const gw::tenant_patch lifted = parsed_patch("{\"quotas\":{" + field + ":null}}");
    for (const gw::quota_kind& each : gw::quota_kinds) {
      CAPTURE(each.name);
      if (&each == &kind) {
        CHECK(set.quota(each) == gw::tenant_patch::quota_change(value_of(kind, 4)));
        CHECK(lifted.quota(each) == gw::tenant_patch::quota_change(std::optional<std::int64_t>()));
      } else {
        CHECK_FALSE(set.quota(each));
        CHECK_FALSE(lifted.quota(each));
      }
    }

    gw::tenant_record tenant;
    tenant.quotas = every(1);
    set.apply_to(tenant);
    gw::tenant_quotas expected = every(1);
    kind.of(expected) = value_of(kind, 4);
    CHECK(tenant.quotas == expected);
    lifted.apply_to(tenant);
    kind.of(expected).reset();
    CHECK(tenant.quotas == expected);
  }
}

TEST_CASE("every kind round-trips through the SQLite store, in a column named as the kind") {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock(noon);
  {
    auto store = open_store(tmp.path(), clock);
    for (const gw::quota_kind& kind : gw::quota_kinds) {
      CAPTURE(kind.name);
      gw::tenant_record tenant;
      tenant.id = std::string(kind.name);  // snake_case names are valid tenant ids
      tenant.quotas = only(kind, value_of(kind, 5));
      auto created = store->create_tenant(tenant, admin);
      REQUIRE_MESSAGE(created.ok(), created.error().to_string());
      CHECK(store->get_tenant(tenant.id)->quotas == tenant.quotas);
      CHECK(store->snapshot()->tenant(tenant.id)->quotas == tenant.quotas);

      // Changed, then lifted, through a patch.
      gw::tenant_patch patch;
      patch.quota(kind) = value_of(kind, 6);
      auto updated = store->update_tenant(tenant.id, patch, admin);
      REQUIRE_MESSAGE(updated.ok(), updated.error().to_string());
      CHECK(updated->quotas == only(kind, value_of(kind, 6)));
      CHECK(store->get_tenant(tenant.id)->quotas == only(kind, value_of(kind, 6)));
      patch.quota(kind) = std::optional<std::int64_t>();
      REQUIRE(store->update_tenant(tenant.id, patch, admin).ok());
      CHECK(store->get_tenant(tenant.id)->quotas == gw::tenant_quotas{});
      patch.quota(kind) = value_of(kind, 7);
      REQUIRE(store->update_tenant(tenant.id, patch, admin).ok());
    }
    gw::tenant_record all;
    all.id = "all";
    all.quotas = every(8);
    REQUIRE(store->create_tenant(all, admin).ok());
  }

  // Read back by a store opened afresh on the same file.
  auto reopened = open_store(tmp.path(), clock);
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    CAPTURE(kind.name);
    CHECK(reopened->snapshot()->tenant(std::string(kind.name))->quotas == only(kind, value_of(kind, 7)));
  }
  CHECK(reopened->get_tenant("all")->quotas == every(8));
  reopened.reset();

  // The column of each kind is the kind's name, holding the value as an integer.
  auto db = gw::sqlite::database::open(tmp / "tenants.db");
  REQUIRE(db.ok());
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    CAPTURE(kind.name);
    auto q = db->prepare("SELECT " + std::string(kind.name) + " FROM tenants WHERE id = 'all'");
    REQUIRE_MESSAGE(q.ok(), q.error().to_string());
    REQUIRE(*q->step());
    CHECK(q->optional_int64(0) == value_of(kind, 8));
  }
}

TEST_CASE("every kind round-trips through the PostgreSQL store, in a column named as the kind") {
  const std::string url = edge::testing::postgres_server::shared().fresh_database();
  edge::manual_time_source clock(noon);
  {
    auto store = gw::tenant_store::open({.url = url}, clock);
    REQUIRE_MESSAGE(store.ok(), store.error().to_string());
    for (const gw::quota_kind& kind : gw::quota_kinds) {
      CAPTURE(kind.name);
      gw::tenant_record tenant;
      tenant.id = std::string(kind.name);
      tenant.quotas = only(kind, value_of(kind, 5));
      REQUIRE((*store)->create_tenant(tenant, admin).ok());
      gw::tenant_patch patch;
      patch.quota(kind) = value_of(kind, 7);
      REQUIRE((*store)->update_tenant(tenant.id, patch, admin).ok());
    }
    gw::tenant_record all;
    all.id = "all";
    all.quotas = every(8);
    REQUIRE((*store)->create_tenant(all, admin).ok());
  }
  auto reopened = gw::tenant_store::open({.url = url}, clock);
  REQUIRE(reopened.ok());
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    CAPTURE(kind.name);
    CHECK((*reopened)->snapshot()->tenant(std::string(kind.name))->quotas == only(kind, value_of(kind, 7)));
  }
  CHECK((*reopened)->get_tenant("all")->quotas == every(8));

  auto db = gw::postgres::connection::open({.url = url});
  REQUIRE(db.ok());
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    CAPTURE(kind.name);
    auto q = db->exec("SELECT " + std::string(kind.name) + " FROM tenants WHERE id = 'all'");
    REQUIRE_MESSAGE(q.ok(), q.error().to_string());
    CHECK(q->optional_int64(0, 0) == value_of(kind, 8));
  }
}

TEST_CASE("every judged kind's refusal is answered as its row says") {
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    if (!kind.judged()) continue;
    CAPTURE(kind.name);
    gw::quota_decision refused;
    refused.limit = kind.limit;
    refused.message = "no";
    const gw::response res = gw::quota_refusal_response(refused);
    CHECK(static_cast<unsigned>(res.result_int()) == kind.refusal.status);
    CHECK((kind.refusal.status == 429 || kind.refusal.status == 400));
    const auto error = boost::json::parse(res.body()).as_object().at("error").as_object();
    CHECK(error.at("type").as_string() == kind.refusal.type);
    CHECK(error.at("code").as_string() == kind.refusal.code);
    if (kind.refusal.param.empty()) CHECK(error.at("param").is_null());
    else CHECK(error.at("param").as_string() == kind.refusal.param);
  }
}

TEST_CASE("the Redis scripts bind each counted kind's key and limit where the store passes them") {
  namespace scripts = gw::redis_scripts;
  CHECK(scripts::bind_keys(gw::quota_phase::admission) ==
        "local rate_key, slots_key, record_key = KEYS[1], KEYS[2], KEYS[3]\n");
  CHECK(scripts::bind_keys(gw::quota_phase::reservation) ==
        "local rate_key, daily_key, monthly_key, record_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]\n");
  CHECK(scripts::bind_keys(std::nullopt) ==
        "local rate_key, slots_key, daily_key, monthly_key, record_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4], "
        "KEYS[5]\n");
  CHECK(scripts::close_keys == 5);
  CHECK(scripts::bind_limits(gw::quota_phase::admission, scripts::admit_arguments) ==
        "local rpm, concurrent = tonumber(ARGV[7]), tonumber(ARGV[8])\n");
  CHECK(scripts::bind_limits(gw::quota_phase::reservation, scripts::reserve_arguments) ==
        "local tpm, daily, monthly = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])\n");

  // Whatever the table holds: each counted kind's limit is read by its phase's script and its
  // key is bound there and in close.
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    if (!kind.counted()) continue;
    CAPTURE(kind.name);
    const std::string& script = kind.phase == gw::quota_phase::admission ? scripts::admit : scripts::reserve;
    const std::string key = std::string(kind.redis_key) + "_key";
    CHECK(scripts::bind_limits(kind.phase, 0).find(std::string(kind.lua_limit)) != std::string::npos);
    CHECK(script.find(key + ",") != std::string::npos);
    CHECK(scripts::close.find(key + ",") != std::string::npos);
  }
}

TEST_CASE("the engine's kinds reach the generate request, one field each; absent is unlimited") {
  // The request's fields that carry a tenant's limits to the engine.
  const auto engine_fields = [](const edge::backend::generate_request& r) {
    return std::array<std::int64_t, 2>{r.host_tier_cap_bytes, r.disk_tier_cap_bytes};
  };
  const std::array<std::int64_t, 2> unlimited{gw::unlimited_tier_bytes, gw::unlimited_tier_bytes};

  gw::tenant_record tenant;
  tenant.id = "acme";
  tenant.weight = 2.5;
  tenant.quotas = every(1);
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    if (!kind.judged()) kind.of(tenant.quotas).reset();
  }
  edge::backend::generate_request judged_only;
  gw::set_tenant_fields(judged_only, tenant);
  CHECK(judged_only.tenant == "acme");
  CHECK(judged_only.weight == 2.5);
  CHECK(judged_only.priority == gw::tenant_request_priority);
  CHECK(engine_fields(judged_only) == unlimited);  // the judged kinds are none of the engine's

  std::set<std::size_t> fields_set;
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    if (kind.judged()) continue;
    CAPTURE(kind.name);
    for (const std::int64_t value : {std::int64_t{0}, value_of(kind, 1), gw::max_quota_value}) {
      CAPTURE(value);
      tenant.quotas = only(kind, value);
      edge::backend::generate_request r;
      gw::set_tenant_fields(r, tenant);
      const auto fields = engine_fields(r);
      std::size_t set = 0;
      for (std::size_t i = 0; i < fields.size(); ++i) {
        if (fields[i] == unlimited[i]) continue;
        CHECK(fields[i] == value);
        fields_set.insert(i);
        ++set;
      }
      CHECK(set == 1);
    }
  }
  // Each kind has a field of its own.
  CHECK(fields_set.size() == static_cast<std::size_t>(std::count_if(
                                 gw::quota_kinds.begin(), gw::quota_kinds.end(),
                                 [](const gw::quota_kind& k) { return !k.judged(); })));

  // By name: the host tier's cap and the disk tier's.
  edge::backend::generate_request r;
  tenant.quotas = {};
  tenant.quotas.kv_host_cache_bytes = 3 << 20;
  tenant.quotas.kv_disk_cache_bytes = 0;
  gw::set_tenant_fields(r, tenant);
  CHECK(r.host_tier_cap_bytes == 3 << 20);
  CHECK(r.disk_tier_cap_bytes == 0);
}

TEST_CASE("no store refuses by a kind of the engine phase, even at 0") {
  edge::manual_time_source clock(noon);
  gw::in_memory_quota_store store(clock);
  gw::tenant_quotas caps;
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    if (!kind.judged()) kind.of(caps) = 0;
  }
  // No phase needs the store for them (a Redis store makes no call, and judges as here).
  for (const gw::quota_phase phase : phases) CHECK_FALSE(gw::uses_counters(caps, phase));
  for (int i = 0; i < 3; ++i) {
    const gw::quota_decision d = edge::testing::admit_and_reserve(store, caps, 1'000'000, 1'000'000);
    CHECK(d.allowed);
    CHECK(d.limit == gw::quota_limit::none);
    CHECK_FALSE(d.requests);
    CHECK_FALSE(d.tokens);
  }
  CHECK(store.in_flight("acme") == 0);  // nothing counted: no slot held
}
