#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "edge/common/status.h"

namespace {

edge::result<int> parse_positive(int v) {
  if (v <= 0) return edge::invalid_argument("must be positive, got " + std::to_string(v));
  return v;
}

edge::result<int> doubled(int v) {
  EDGE_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

edge::status check_both(int a, int b) {
  EDGE_RETURN_IF_ERROR(parse_positive(a).error());
  EDGE_RETURN_IF_ERROR(parse_positive(b).error());
  return {};
}

}  // namespace

TEST_CASE("status carries a code and a message") {
  const edge::status ok;
  CHECK(ok.ok());
  CHECK(ok.to_string() == "ok");

  const auto bad = edge::not_found("model x");
  CHECK_FALSE(bad.ok());
  CHECK(bad.code() == edge::status_code::not_found);
  CHECK(bad.to_string() == "not_found: model x");
  CHECK(bad.with_context("loading").message() == "loading: model x");
  CHECK(bad.with_context("loading").code() == edge::status_code::not_found);
  CHECK(ok.with_context("ignored").ok());
}

TEST_CASE("result holds a value or a status") {
  auto good = parse_positive(3);
  REQUIRE(good.ok());
  CHECK(*good == 3);
  CHECK(good.error().ok());

  auto bad = parse_positive(-1);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code() == edge::status_code::invalid_argument);
  CHECK(bad.error().message() == "must be positive, got -1");
  CHECK(bad.value_or(7) == 7);
}

TEST_CASE("result works with move-only values") {
  edge::result<std::unique_ptr<int>> r = std::make_unique<int>(5);
  REQUIRE(r.ok());
  std::unique_ptr<int> taken = std::move(r).value();
  CHECK(*taken == 5);
}

TEST_CASE("EDGE_ASSIGN_OR_RETURN and EDGE_RETURN_IF_ERROR propagate failures") {
  CHECK(*doubled(4) == 8);
  CHECK(doubled(0).error().message() == "must be positive, got 0");
  CHECK(check_both(1, 2).ok());
  CHECK(check_both(1, -2).message() == "must be positive, got -2");
}
