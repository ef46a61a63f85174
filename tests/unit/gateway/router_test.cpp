#include <doctest/doctest.h>

#include "edge/gateway/http/http.h"

namespace gw = edge::gateway;

namespace {

gw::handler noop() {
  return [](gw::exchange&) -> gw::asio::awaitable<void> { co_return; };
}

}  // namespace

TEST_CASE("routes match literal paths and capture {params}") {
  gw::router routes;
  routes.add(gw::http::verb::get, "/healthz", noop());
  routes.add(gw::http::verb::get, "/v1/models", noop());
  routes.add(gw::http::verb::get, "/v1/models/{id}", noop());
  routes.add(gw::http::verb::post, "/v1/chat/completions", noop());

  auto m = routes.find(gw::http::verb::get, "/v1/models/stories260K");
  REQUIRE(m.target != nullptr);
  CHECK(m.route == "/v1/models/{id}");
  REQUIRE(m.params.size() == 1);
  CHECK(m.params[0].first == "id");
  CHECK(m.params[0].second == "stories260K");

  auto list = routes.find(gw::http::verb::get, "/v1/models");
  REQUIRE(list.target != nullptr);
  CHECK(list.route == "/v1/models");
  CHECK(list.params.empty());

  CHECK(routes.find(gw::http::verb::get, "/healthz/").target != nullptr);
}

TEST_CASE("unknown paths are unmatched and wrong methods list the allowed ones") {
  gw::router routes;
  routes.add(gw::http::verb::get, "/healthz", noop());
  routes.add(gw::http::verb::post, "/v1/chat/completions", noop());

  auto missing = routes.find(gw::http::verb::get, "/nope");
  CHECK(missing.target == nullptr);
  CHECK(missing.route == "unmatched");
  CHECK(missing.allow.empty());

  auto wrong = routes.find(gw::http::verb::get, "/v1/chat/completions");
  CHECK(wrong.target == nullptr);
  CHECK(wrong.allow == "POST");
  CHECK(wrong.route == "/v1/chat/completions");

  CHECK(routes.find(gw::http::verb::get, "/v1/models/x/extra").target == nullptr);
}
