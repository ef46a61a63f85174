// JSON Schemas of the shapes that made grammar compiles slow, made to a size: shared by the
// structured-outputs benchmark (grammar_bench.cpp) and the unit tests that bound their compiles.
#pragma once

#include <string>

#include "edge/common/format.h"

namespace edge::testing {

// A 1,000-value enum of the kind a classifier's label set is: words and codes of varied lengths.
inline std::string enum_schema(int values) {
  static const char* const words[] = {"alpha",   "bravo",  "charlie", "delta", "echo",    "foxtrot", "golf",
                                      "hotel",   "india",  "juliett", "kilo",  "lima",    "mike",    "november",
                                      "oscar",   "papa",   "quebec",  "romeo", "sierra",  "tango",   "uniform",
                                      "victor",  "whiskey", "xray",   "yankee", "zulu"};
  std::string s = R"({"enum":[)";
  for (int i = 0; i < values; ++i) {
    if (i > 0) s += ',';
    std::string number = std::to_string(i);
    number.insert(0, number.size() < 3 ? 3 - number.size() : 0, '0');
    s += edge::format(R"("{}-{}-{}")", words[i % 26], words[(i / 26) % 26], number);
  }
  return s + "]}";
}

// An object of `count` properties of mixed types, the first half required.
inline std::string properties_schema(int count) {
  std::string props;
  std::string required;
  static const char* const types[] = {R"({"type":"string"})", R"({"type":"integer"})", R"({"type":"boolean"})",
                                      R"({"type":"number","minimum":0,"maximum":1000})",
                                      R"({"type":"string","enum":["low","medium","high"]})"};
  for (int i = 0; i < count; ++i) {
    if (i > 0) props += ',';
    props += edge::format(R"("field_{}":{})", i, types[i % 5]);
    if (i < count / 2) {
      if (!required.empty()) required += ',';
      required += edge::format(R"("field_{}")", i);
    }
  }
  return R"({"type":"object","properties":{)" + props + R"(},"required":[)" + required +
         R"(],"additionalProperties":false})";
}

}  // namespace edge::testing
