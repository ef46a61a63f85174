// Percent-decoding of path segments (model ids such as "org/name" in GET /v1/models/{id}).
#include <doctest/doctest.h>

#include "edge/gateway/http/percent_encoding.h"

namespace gw = edge::gateway;

TEST_CASE("percent_decode: %XX in either case, '+' kept, a broken escape refused") {
  CHECK(gw::percent_decode("org%2Fname") == "org/name");
  CHECK(gw::percent_decode("org%2fname") == "org/name");
  CHECK(gw::percent_decode("a+b") == "a+b");
  CHECK(gw::percent_decode("%00%FF") == std::string("\0\xFF", 2));
  CHECK(gw::percent_decode("") == "");
  CHECK(gw::percent_decode("100%25") == "100%");
  for (const std::string_view broken : {"%", "%2", "a%2", "%G0", "%0G", "%%41"}) {
    CHECK_MESSAGE(!gw::percent_decode(broken), broken);
  }
}
