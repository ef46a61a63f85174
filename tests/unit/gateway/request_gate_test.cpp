#include <doctest/doctest.h>

#include "edge/gateway/request_gate.h"

namespace gw = edge::gateway;

namespace {

gw::request make_request(std::string_view tenant) {
  gw::request req{gw::http::verb::post, "/v1/completions", 11};
  if (!tenant.empty()) req.set(gw::tenant_header, tenant);
  return req;
}

}  // namespace

TEST_CASE("the open gate lets everyone in as the default tenant or the one the header names") {
  gw::open_gate gate;
  auto anonymous = gate.authenticate(make_request(""));
  REQUIRE(std::holds_alternative<gw::caller>(anonymous));
  CHECK(std::get<gw::caller>(anonymous).tenant == "default");
  CHECK(std::get<gw::caller>(anonymous).weight == 1.0);

  auto named = gate.authenticate(make_request("acme-2.eu_west"));
  REQUIRE(std::holds_alternative<gw::caller>(named));
  const gw::caller who = std::get<gw::caller>(named);
  CHECK(who.tenant == "acme-2.eu_west");

  auto lease = gate.try_acquire(who, {.prompt_tokens = 100, .max_tokens = 1'000'000, .model = "m"});
  REQUIRE(std::holds_alternative<std::unique_ptr<gw::gate_lease>>(lease));
  auto& held = std::get<std::unique_ptr<gw::gate_lease>>(lease);
  gw::http::response_header<> head;
  held->add_headers(head);
  CHECK(head.begin() == head.end());  // no limits, no rate-limit headers
  held->settle({.prompt_tokens = 100, .completion_tokens = 7, .cached_tokens = 0});
}

TEST_CASE("a tenant header that could not be a metric label or log field is refused") {
  gw::open_gate gate;
  for (const std::string_view bad : {"a b", "x\"y", "tenant/1", "\xc3\xa9t\xc3\xa9"}) {
    CAPTURE(bad);
    auto refused = gate.authenticate(make_request(bad));
    REQUIRE(std::holds_alternative<gw::gate_refusal>(refused));
    const gw::response& answer = std::get<gw::gate_refusal>(refused);
    CHECK(answer.result() == gw::http::status::bad_request);
    CHECK(answer.body().find("\"code\":\"invalid_tenant\"") != std::string::npos);
  }
  CHECK(std::holds_alternative<gw::gate_refusal>(gate.authenticate(make_request(std::string(65, 'a')))));
}
