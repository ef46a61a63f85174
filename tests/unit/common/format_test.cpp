#include <doctest/doctest.h>

#include <string>

#include "edge/common/format.h"

TEST_CASE("format substitutes arguments in order") {
  CHECK(edge::format("listening on http://{}:{}", "127.0.0.1", 8080) == "listening on http://127.0.0.1:8080");
  CHECK(edge::format("{} {} {}", true, 'x', -12) == "true x -12");
  CHECK(edge::format("{}", std::string("s")) == "s");
  CHECK(edge::format("{}", 18446744073709551615ull) == "18446744073709551615");
  CHECK(edge::format("{}", 0.5) == "0.5");
  CHECK(edge::format("{:.2f}", 3.14159) == "3.14");
  CHECK(edge::format("{:.0f}", 2.5) == "2");
}

TEST_CASE("format handles braces and argument count mismatches without throwing") {
  CHECK(edge::format("{{}} {}", 1) == "{} 1");
  CHECK(edge::format("{} and {}", 1) == "1 and {}");
  CHECK(edge::format("none", 1, 2) == "none");
  CHECK(edge::format("{bad} {}", 1) == "{bad} 1");
  CHECK(edge::format("trailing {", 1) == "trailing {");
}

TEST_CASE("format_bytes uses binary units") {
  CHECK(edge::format_bytes(17) == "17 B");
  CHECK(edge::format_bytes(4 << 20) == "4 MiB");
  CHECK(edge::format_bytes(1536) == "1.5 KiB");
  CHECK(edge::format_bytes(1471026299ull) == "1.37 GiB");
}
