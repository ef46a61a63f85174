// Admin API bodies and query strings: what is accepted, and a 400 naming the field or
// parameter for everything else.
#include <doctest/doctest.h>

#include <variant>

#include "edge/gateway/tenancy/admin_request.h"

namespace gw = edge::gateway;

namespace {

// The change a patch makes to one quota kind.
const gw::tenant_patch::quota_change& change(const gw::tenant_patch& p, gw::quota_limit limit) {
  return p.quota(*gw::find_quota_kind(limit));
}

template <class T>
std::string error_param(const std::variant<T, gw::admin_request_error>& parsed) {
  REQUIRE(std::holds_alternative<gw::admin_request_error>(parsed));
  return std::get<gw::admin_request_error>(parsed).param;
}

}  // namespace

TEST_CASE("a tenant body with every field") {
  auto parsed = gw::parse_tenant_create(R"({"id":"acme","weight":2,"quotas":{"requests_per_minute":600,
      "tokens_per_minute":200000,"max_concurrent":16,"daily_tokens":5000000,"max_tokens_per_request":4096}})");
  REQUIRE(std::holds_alternative<gw::tenant_record>(parsed));
  const auto& t = std::get<gw::tenant_record>(parsed);
  CHECK(t.id == "acme");
  CHECK(t.weight == 2.0);
  CHECK(t.quotas.requests_per_minute == 600);
  CHECK(t.quotas.tokens_per_minute == 200000);
  CHECK(t.quotas.max_concurrent == 16);
  CHECK(t.quotas.daily_tokens == 5000000);
  CHECK(t.quotas.max_tokens_per_request == 4096);
  CHECK(std::holds_alternative<gw::tenant_record>(gw::parse_tenant_create(" {\"id\":\"a\"}\n\t ")));
}

TEST_CASE("absent and null quotas are unlimited; weight defaults to 1") {
  auto parsed = gw::parse_tenant_create(R"({"id":"acme","quotas":{"daily_tokens":null}})");
  REQUIRE(std::holds_alternative<gw::tenant_record>(parsed));
  CHECK(std::get<gw::tenant_record>(parsed).quotas == gw::tenant_quotas{});
  CHECK(std::get<gw::tenant_record>(parsed).weight == 1.0);
}

TEST_CASE("bad tenant bodies name the field") {
  CHECK(error_param(gw::parse_tenant_create("{")).empty());            // not JSON
  for (const char* broken : {"{", R"({"id": "x",)", R"({"id":"x"} trailing)", R"({"id" "x"})"}) {
    auto parsed = gw::parse_tenant_create(broken);
    REQUIRE(std::holds_alternative<gw::admin_request_error>(parsed));
    CHECK_MESSAGE(std::get<gw::admin_request_error>(parsed).message == "The body is not valid JSON", broken);
  }
  CHECK(std::get<gw::admin_request_error>(gw::parse_tenant_create("[1]")).message == "The body must be a JSON object");
  CHECK(error_param(gw::parse_tenant_create("[1]")).empty());          // not an object
  CHECK(error_param(gw::parse_tenant_create("")).empty());
  CHECK(error_param(gw::parse_tenant_create(R"({"weight":1})")) == "id");
  CHECK(error_param(gw::parse_tenant_create(R"({"id":7})")) == "id");
  CHECK(error_param(gw::parse_tenant_create(R"({"id":"a b"})")) == "id");
  CHECK(error_param(gw::parse_tenant_create(R"({"id":"acme","weight":"2"})")) == "weight");
  CHECK(error_param(gw::parse_tenant_create(R"({"id":"acme","weight":0})")) == "weight");
  CHECK(error_param(gw::parse_tenant_create(R"({"id":"acme","weight":1e9})")) == "weight");
  CHECK(error_param(gw::parse_tenant_create(R"({"id":"acme","quotas":[]})")) == "quotas");
  CHECK(error_param(gw::parse_tenant_create(R"({"id":"acme","quotas":{"requests_per_minute":"600"}})")) ==
        "quotas.requests_per_minute");
  CHECK(error_param(gw::parse_tenant_create(R"({"id":"acme","quotas":{"tokens_per_minute":1.5}})")) ==
        "quotas.tokens_per_minute");
  CHECK(error_param(gw::parse_tenant_create(R"({"id":"acme","quotas":{"max_concurrent":0}})")) ==
        "quotas.max_concurrent");
  CHECK(error_param(gw::parse_tenant_create(R"({"id":"acme","quotas":{"daily_tokens":-5}})")) ==
        "quotas.daily_tokens");
  CHECK(error_param(gw::parse_tenant_create(R"({"id":"acme","quotas":{"request_per_minute":5}})")) ==
        "quotas.request_per_minute");
  CHECK(error_param(gw::parse_tenant_create(R"({"id":"acme","name":"Acme"})")) == "name");
}

TEST_CASE("a patch changes what it names: absent stays, null is unlimited") {
  auto parsed = gw::parse_tenant_patch(R"({"id":"acme","quotas":{"requests_per_minute":null,"daily_tokens":10}})",
                                       "acme");
  REQUIRE(std::holds_alternative<gw::tenant_patch>(parsed));
  const auto& p = std::get<gw::tenant_patch>(parsed);
  CHECK_FALSE(p.weight);
  REQUIRE(change(p, gw::quota_limit::requests_per_minute));
  CHECK_FALSE(*change(p, gw::quota_limit::requests_per_minute));
  CHECK(change(p, gw::quota_limit::daily_tokens) == std::optional<std::optional<std::int64_t>>(10));
  CHECK_FALSE(change(p, gw::quota_limit::tokens_per_minute));

  gw::tenant_record t;
  t.quotas.requests_per_minute = 5;
  t.quotas.tokens_per_minute = 7;
  p.apply_to(t);
  CHECK_FALSE(t.quotas.requests_per_minute);
  CHECK(t.quotas.tokens_per_minute == 7);
  CHECK(t.quotas.daily_tokens == 10);

  CHECK(error_param(gw::parse_tenant_patch(R"({"id":"other"})", "acme")) == "id");
  CHECK(error_param(gw::parse_tenant_patch(R"({"weight":null})", "acme")) == "weight");
  CHECK(error_param(gw::parse_tenant_patch(R"({"quotas":{"max_concurrent":true}})", "acme")) ==
        "quotas.max_concurrent");
  CHECK(error_param(gw::parse_tenant_patch(R"({"colour":"red"})", "acme")) == "colour");
}

TEST_CASE("key bodies: empty, expires_in, expires_at as unix seconds or UTC text") {
  auto empty = gw::parse_key_create("");
  REQUIRE(std::holds_alternative<gw::key_create_params>(empty));
  CHECK_FALSE(std::get<gw::key_create_params>(empty).expires_at);
  CHECK_FALSE(std::get<gw::key_create_params>(empty).expires_in);

  CHECK(std::get<gw::key_create_params>(gw::parse_key_create(R"({"expires_in":3600})")).expires_in == 3600);
  CHECK(std::get<gw::key_create_params>(gw::parse_key_create(R"({"expires_at":1777636800})")).expires_at == 1777636800);
  CHECK(std::get<gw::key_create_params>(gw::parse_key_create(R"({"expires_at":"2026-05-01T12:00:00Z"})")).expires_at ==
        1777636800);

  CHECK(error_param(gw::parse_key_create(R"({"expires_in":"soon"})")) == "expires_in");
  CHECK(error_param(gw::parse_key_create(R"({"expires_in":0})")) == "expires_in");
  CHECK(error_param(gw::parse_key_create(R"({"expires_at":"tomorrow"})")) == "expires_at");
  CHECK(error_param(gw::parse_key_create(R"({"expires_at":[]})")) == "expires_at");
  CHECK(error_param(gw::parse_key_create(R"({"expires_in":60,"expires_at":1777636800})")) == "expires_at");
  CHECK(error_param(gw::parse_key_create(R"({"name":"ci"})")) == "name");
}

TEST_CASE("usage query: from and to as unix seconds or UTC text, today by default") {
  const gw::unix_time now = 1777641600;  // 2026-05-01T13:20:00Z
  const auto window = [&](std::string_view query) {
    return std::get<gw::usage_window>(gw::parse_usage_query(query, now));
  };
  CHECK(window("").from == 1777593600);  // 2026-05-01T00:00:00Z
  CHECK(window("").to == now + 1);
  CHECK(window("from=1777600000").from == 1777600000);
  CHECK(window("from=2026-04-30&to=2026-05-01T12:00:00Z").from == 1777507200);
  CHECK(window("from=2026-04-30&to=2026-05-01T12:00:00Z").to == 1777636800);
  // Percent-encoding and '+' for a space are decoded before the time is read.
  CHECK(window("to=2026-05-01%2012:00:00%2B00:00").to == 1777636800);
  CHECK(window("to=2026-05-01+12:00").to == 1777636800);
  CHECK(window("fr%6Fm=1").from == 1);

  CHECK(error_param(gw::parse_usage_query("from=yesterday", now)) == "from");
  CHECK(error_param(gw::parse_usage_query("from=2026-05-02&to=2026-05-01", now)) == "from");
  CHECK(error_param(gw::parse_usage_query("tenant=acme", now)) == "tenant");
}

TEST_CASE("audit query: limit from 1 to 1000, before an entry id") {
  const auto page = [](std::string_view query) { return std::get<gw::audit_page>(gw::parse_audit_query(query)); };
  CHECK(page("").limit == gw::default_audit_limit);
  CHECK_FALSE(page("").before);
  CHECK(page("limit=1000&before=7").limit == 1000);
  CHECK(page("limit=1000&before=7").before == 7);
  for (const std::string_view bad : {"limit=0", "limit=1001", "limit=5x", "limit=", "limit=-1", "limit=1e3"}) {
    CHECK_MESSAGE(error_param(gw::parse_audit_query(bad)) == "limit", bad);
  }
  CHECK(error_param(gw::parse_audit_query("before=0")) == "before");
  CHECK(error_param(gw::parse_audit_query("after=3")) == "after");
}
