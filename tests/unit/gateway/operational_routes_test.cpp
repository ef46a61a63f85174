// Who may read /metrics (metrics_guard): everyone on a loopback listener without a token, no one
// beyond loopback without one, and with a token only the scrapers that send it.
#include <doctest/doctest.h>

#include <string>

#include "edge/gateway/http/operational_routes.h"

namespace gw = edge::gateway;

namespace {

gw::request scrape(std::string authorization = {}) {
  gw::request req{gw::http::verb::get, "/metrics", 11};
  if (!authorization.empty()) req.set(gw::http::field::authorization, authorization);
  return req;
}

}  // namespace

TEST_CASE("metrics guard: without a token, open on loopback and off beyond it") {
  CHECK_FALSE(gw::metrics_guard({.token = "", .open = true}).refusal(scrape()).has_value());
  const auto off = gw::metrics_guard({.token = "", .open = false}).refusal(scrape("Bearer anything-at-all-here"));
  REQUIRE(off.has_value());
  CHECK(off->result() == gw::http::status::forbidden);
  CHECK(off->body().find("\"metrics_disabled\"") != std::string::npos);
  CHECK(off->body().find("--metrics-token") != std::string::npos);
}

TEST_CASE("metrics guard: with a token, only a scraper sending it reads, wherever the server listens") {
  const std::string token = "metrics-token-0123456789";
  for (const bool loopback : {true, false}) {
    const gw::metrics_guard guard({.token = token, .open = loopback});
    CHECK_FALSE(guard.refusal(scrape("Bearer " + token)).has_value());
    CHECK_FALSE(guard.refusal(scrape("bearer  " + token + " ")).has_value());
    for (const std::string& wrong : {std::string(), "Bearer " + token + "x", "Bearer " + token.substr(1), "Basic " + token,
                                    token}) {
      const auto refused = guard.refusal(scrape(wrong));
      REQUIRE_MESSAGE(refused.has_value(), wrong);
      CHECK(refused->result() == gw::http::status::unauthorized);
      CHECK((*refused)[gw::http::field::www_authenticate] == "Bearer");
      CHECK(refused->body().find("\"invalid_metrics_token\"") != std::string::npos);
    }
  }
}
