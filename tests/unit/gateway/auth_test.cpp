// API keys on the request path: parsing, hashing, and the store's snapshot as the authority,
// so that revocation and expiry take effect on the very next request.
#include <doctest/doctest.h>

#include <boost/json/parse.hpp>

#include <chrono>
#include <set>

#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/auth.h"
#include "edge/gateway/tenancy/tenant.h"
#include "edge/gateway/tenancy/tenant_store.h"
#include "test_support.h"

namespace gw = edge::gateway;
using namespace std::chrono_literals;

namespace {

const auto noon = std::chrono::system_clock::time_point(std::chrono::seconds(1777636800));  // 2026-05-01T12:00Z
const gw::audit_context admin{"admin", "req_test"};

struct fixture {
  edge::testing::temp_dir tmp;
  edge::manual_time_source clock{noon};
  std::unique_ptr<gw::tenant_store> store = std::move(gw::tenant_store::open(tmp.path(), clock)).value();
  gw::authenticator auth{*store, clock};

  fixture() {
    gw::tenant_record acme;
    acme.id = "acme";
    acme.weight = 3.0;
    REQUIRE(store->create_tenant(acme, admin).ok());
  }
  std::string key(std::optional<gw::unix_time> expires = std::nullopt) {
    auto issued = store->create_key("acme", expires, admin);
    REQUIRE(issued.ok());
    return issued->key;
  }
  edge::result<gw::authenticated_tenant> check(const std::string& authorization) const {
    return auth.authenticate_header(authorization);
  }
};

}  // namespace

TEST_CASE("generated keys are ek-<16 hex>.<43 base64url>, all different") {
  std::set<std::string> seen;
  for (int i = 0; i < 200; ++i) {
    const auto issued = gw::generate_api_key("acme", 0, std::nullopt);
    const auto parts = gw::split_api_key(issued.key);
    REQUIRE(parts);
    CHECK(parts->id.find_first_not_of("0123456789abcdef") == std::string_view::npos);
    CHECK(parts->secret.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_") ==
          std::string_view::npos);
    CHECK(gw::secret_matches(parts->secret, issued.record.secret_sha256));
    CHECK(seen.insert(issued.key).second);
  }
}

TEST_CASE("split_api_key takes ek-<id>.<secret> and nothing else") {
  CHECK(gw::split_api_key("ek-abc.def"));
  CHECK(gw::split_api_key("ek-abc.def")->id == "abc");
  CHECK(gw::split_api_key("ek-abc.def")->secret == "def");
  CHECK_FALSE(gw::split_api_key("sk-abc.def"));
  CHECK_FALSE(gw::split_api_key("ek-abcdef"));
  CHECK_FALSE(gw::split_api_key("ek-.def"));
  CHECK_FALSE(gw::split_api_key("ek-abc."));
  CHECK_FALSE(gw::split_api_key(""));
}

TEST_CASE("bearer_token reads the Authorization header") {
  CHECK(gw::bearer_token("Bearer ek-1.2") == "ek-1.2");
  CHECK(gw::bearer_token("bearer   ek-1.2  ") == "ek-1.2");
  CHECK(gw::bearer_token("BEARER ek-1.2") == "ek-1.2");
  CHECK(gw::bearer_token("Basic dXNlcjpwYXNz").empty());
  CHECK(gw::bearer_token("Bearer").empty());
  CHECK(gw::bearer_token("Bearerek-1.2").empty());
}

TEST_CASE("a valid key names its tenant") {
  fixture f;
  const std::string key = f.key();
  auto who = f.check("Bearer " + key);
  REQUIRE_MESSAGE(who.ok(), who.error().to_string());
  CHECK(who->tenant->id == "acme");
  CHECK(who->tenant->weight == 3.0);
  CHECK(who->key_id == gw::split_api_key(key)->id);
}

TEST_CASE("a key in x-api-key (Anthropic's header) is taken when there is no Authorization header") {
  fixture f;
  const std::string key = f.key();
  gw::request req;
  req.set("x-api-key", key);
  auto who = f.auth.authenticate(req);
  REQUIRE_MESSAGE(who.ok(), who.error().to_string());
  CHECK(who->tenant->id == "acme");
  std::string wrong(key);
  wrong.back() = wrong.back() == 'A' ? 'B' : 'A';
  req.set("x-api-key", wrong);
  CHECK_FALSE(f.auth.authenticate(req).ok());
  // Authorization, when both are sent, is the one judged.
  req.set(boost::beast::http::field::authorization, "Bearer " + key);
  CHECK(f.auth.authenticate(req).ok());
  req.set("x-api-key", key);
  req.set(boost::beast::http::field::authorization, "Bearer " + wrong);
  CHECK_FALSE(f.auth.authenticate(req).ok());
  CHECK(f.auth.authenticate(gw::request{}).error().message().find("x-api-key") != std::string::npos);
}

TEST_CASE("missing, malformed, unknown and wrong keys are refused as unauthenticated") {
  fixture f;
  const std::string key = f.key();
  const auto parts = *gw::split_api_key(key);
  std::string wrong_secret(key);
  wrong_secret.back() = wrong_secret.back() == 'A' ? 'B' : 'A';

  const auto refused = [&](const std::string& header, std::string_view says) {
    auto who = f.check(header);
    REQUIRE_FALSE(who.ok());
    CHECK(who.error().code() == edge::status_code::unauthenticated);
    CHECK_MESSAGE(who.error().message().find(says) != std::string::npos, who.error().message());
    // The secret is never echoed back.
    CHECK(who.error().message().find(std::string(parts.secret)) == std::string::npos);
  };
  refused("", "didn't provide an API key");
  refused("Basic abc", "must be \"Bearer <API key>\"");
  refused("Bearer sk-not-ours", "Incorrect API key");
  refused("Bearer " + wrong_secret, "Incorrect API key");
  refused("Bearer ek-0000000000000000." + std::string(parts.secret), "Incorrect API key");
  refused("Bearer ek-" + std::string(parts.id), "Incorrect API key");
}

TEST_CASE("keys given at start (--api-key) are the default tenant's, beside the store's keys") {
  fixture f;
  gw::tenant_record fallback;
  fallback.id = std::string(gw::tenant_store::default_tenant_id);
  REQUIRE(f.store->create_tenant(fallback, admin).ok());
  // The second looks like a key of the store (ek-<id>.<secret>) and is taken as the configured one.
  const std::vector<std::string> keys = {"sk-local-one", "ek-0000000000000000.abcdefabcdefabcdefabcdef"};
  const gw::authenticator auth{*f.store, f.clock, gw::configured_api_keys::of(fallback.id, keys)};
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto who = auth.authenticate_header("Bearer " + keys[i]);
    REQUIRE_MESSAGE(who.ok(), who.error().to_string());
    CHECK(who->tenant->id == fallback.id);
    CHECK(who->key_id == "api-key-" + std::to_string(i + 1));
  }
  // A store key still names its own tenant.
  const std::string stored = f.key();
  auto who = auth.authenticate_header("Bearer " + stored);
  REQUIRE(who.ok());
  CHECK(who->tenant->id == "acme");
  // Near misses are refused, and the configured text is not kept anywhere in the authenticator.
  for (const std::string wrong : {"sk-local-on", "sk-local-one ", "SK-LOCAL-ONE", ""}) {
    CHECK_FALSE(auth.authenticate_key(wrong).ok());
  }
  const auto* bytes = reinterpret_cast<const char*>(&auth);
  CHECK(std::string_view(bytes, sizeof auth).find("sk-local") == std::string_view::npos);
  // Without the tenant the keys belong to, they are refused like any unknown key.
  REQUIRE(f.store->delete_tenant(fallback.id, admin).ok());
  CHECK(auth.authenticate_key(keys[0]).error().message().find("Incorrect API key") != std::string::npos);
}

TEST_CASE("revocation takes effect on the next request") {
  fixture f;
  const std::string key = f.key();
  REQUIRE(f.check("Bearer " + key).ok());
  REQUIRE(f.store->revoke_key(gw::split_api_key(key)->id, admin).ok());
  auto who = f.check("Bearer " + key);
  REQUIRE_FALSE(who.ok());
  CHECK(who.error().message().find("revoked") != std::string::npos);
}

TEST_CASE("expiry takes effect the second it passes, with no change to the store") {
  fixture f;
  const std::string key = f.key(1777636800 + 60);
  const auto version = f.store->snapshot()->version();
  f.clock.advance(59s);
  CHECK(f.check("Bearer " + key).ok());
  f.clock.advance(1s);
  auto who = f.check("Bearer " + key);
  REQUIRE_FALSE(who.ok());
  CHECK(who.error().message().find("expired at 2026-05-01T12:01:00Z") != std::string::npos);
  CHECK(f.store->snapshot()->version() == version);
}

TEST_CASE("keys of a deleted tenant stop working at once") {
  fixture f;
  const std::string key = f.key();
  REQUIRE(f.store->delete_tenant("acme", admin).ok());
  CHECK_FALSE(f.check("Bearer " + key).ok());
}

TEST_CASE("a refusal is a 401 invalid_api_key in OpenAI's shape") {
  fixture f;
  auto who = f.check("Bearer ek-nope.nope");
  REQUIRE_FALSE(who.ok());
  const gw::response res = gw::unauthorized_response(who.error());
  CHECK(res.result() == gw::http::status::unauthorized);
  CHECK(res[gw::http::field::www_authenticate] == "Bearer");
  const auto error = boost::json::parse(res.body()).as_object().at("error").as_object();
  CHECK(error.at("code") == "invalid_api_key");
  CHECK(error.at("type") == "invalid_request_error");
}

TEST_CASE("tenant ids and UTC times") {
  CHECK(gw::is_valid_tenant_id("acme"));
  CHECK(gw::is_valid_tenant_id("Team_1.prod-eu"));
  CHECK(gw::is_valid_tenant_id(std::string(64, 'a')));
  CHECK_FALSE(gw::is_valid_tenant_id(std::string(65, 'a')));
  CHECK_FALSE(gw::is_valid_tenant_id(""));
  CHECK_FALSE(gw::is_valid_tenant_id("-acme"));
  CHECK_FALSE(gw::is_valid_tenant_id("a/b"));
  CHECK_FALSE(gw::is_valid_tenant_id("a b"));

  CHECK(gw::format_utc(1777636800) == "2026-05-01T12:00:00Z");
  CHECK(gw::format_utc(0) == "1970-01-01T00:00:00Z");
  // Early years keep four digits, so that what is written reads back.
  CHECK(gw::format_utc(-61344000000) == "0026-02-01T00:00:00Z");
  CHECK(*gw::parse_utc(gw::format_utc(-30610224001)) == -30610224001);  // 0999-12-31T23:59:59Z
  CHECK(*gw::parse_utc("1777636800") == 1777636800);
  CHECK(*gw::parse_utc("2026-05-01") == 1777593600);
  CHECK(*gw::parse_utc("2026-05-01T12:00:00Z") == 1777636800);
  CHECK(*gw::parse_utc("2026-05-01T12:00Z") == 1777636800);
  CHECK(*gw::parse_utc("2026-05-01T12:00:00+00:00") == 1777636800);
  CHECK(*gw::parse_utc("2024-02-29T23:59:59") == 1709251199);
  CHECK_FALSE(gw::parse_utc("2026-02-30").ok());
  CHECK_FALSE(gw::parse_utc("2026-05-01T25:00").ok());
  CHECK_FALSE(gw::parse_utc("2026-05-01T12:00:00+02:00").ok());
  CHECK_FALSE(gw::parse_utc("yesterday").ok());
  // Unix seconds as far as a date can go, no further (format_utc could not write them back).
  CHECK(*gw::parse_utc("253402300799") == *gw::parse_utc("9999-12-31T23:59:59Z"));
  CHECK_FALSE(gw::parse_utc("253402300800").ok());
  CHECK_FALSE(gw::parse_utc("9223372036854775807").ok());
  CHECK_FALSE(gw::parse_utc("").ok());
}
