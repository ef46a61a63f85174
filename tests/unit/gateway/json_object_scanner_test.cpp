// The JSON object scanner the tool-call parsers find a call's arguments with: where the object
// ends, and the first byte that cannot continue valid JSON, checked against simdjson.
#include <doctest/doctest.h>

#include <string>
#include <string_view>

#include "edge/common/json_fields.h"
#include "openai/json_object_scanner.h"

namespace {

using edge::gateway::json_object_scanner;
using verdict = json_object_scanner::verdict;

// Feeds `text` until the scanner decides: the byte position of `complete` or `invalid`, or
// npos while it still wants more.
struct outcome {
  verdict how = verdict::more;
  std::size_t at = std::string_view::npos;
};
outcome scan(std::string_view text) {
  json_object_scanner scanner;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const verdict v = scanner.push(text[i]);
    if (v != verdict::more) return {v, i};
  }
  return {};
}

bool simdjson_object(std::string_view text) {
  simdjson::dom::parser parser;
  const auto parsed = edge::parse_json(parser, text);
  return parsed.ok() && parsed->type() == simdjson::dom::element_type::OBJECT;
}

}  // namespace

TEST_CASE("a valid object completes at its closing brace, whatever its strings hold") {
  for (const std::string_view text :
       {R"({})", R"( {"a":1})", R"({"city": "Paris", "days": 3})", R"({"s": "}{][\"\\ \u00e9 </tool_call>"})",
        R"({"n": [1, -2.5e+3, 0, 0.0, 1E9, true, false, null, {"x": []}, [[]]]})", R"({"a":{"b":{"c":{}}}})",
        "{\"multi\":\n  [\n    1\n  ]\n}", R"({"unicode": "日本語 😀"})"}) {
    CAPTURE(text);
    CHECK(simdjson_object(text));
    const outcome o = scan(text);
    CHECK(o.how == verdict::complete);
    CHECK(o.at == text.size() - 1);
  }
}

TEST_CASE("the first byte that cannot continue JSON is invalid, and not taken") {
  struct bad {
    std::string_view text;
    std::size_t at;
  };
  for (const bad b : {bad{"[1]", 0}, bad{"\"x\"", 0}, bad{"{'a': 1}", 1}, bad{R"({"a" 1})", 5},
                      bad{R"({"a": 01})", 7}, bad{R"({"a": 1.})", 8}, bad{R"({"a": -})", 7}, bad{R"({"a": 1,})", 8},
                      bad{R"({"a": [1,]})", 9}, bad{R"({"a": tru})", 9}, bad{R"({"a": "\x"})", 8},
                      bad{R"({"a": "\u12g4"})", 11}, bad{R"({"a": 1]})", 7}, bad{R"({,})", 1},
                      bad{"{\"a\": \"line\nbreak\"}", 11}, bad{R"({"a": 1e})", 8}, bad{R"({"a": nul})", 9}}) {
    CAPTURE(b.text);
    CHECK_FALSE(simdjson_object(b.text));
    const outcome o = scan(b.text);
    CHECK(o.how == verdict::invalid);
    CHECK(o.at == b.at);
  }
}

TEST_CASE("an unfinished object wants more, and takes nothing after it completes") {
  CHECK(scan(R"({"a": {"b": [1, 2)").how == verdict::more);
  CHECK(scan(R"({"a": "}")").how == verdict::more);
  json_object_scanner scanner;
  for (const char c : std::string_view("{}")) scanner.push(c);
  CHECK(scanner.push(' ') == verdict::invalid);
}

TEST_CASE("nesting past the limit is invalid") {
  std::string deep(json_object_scanner::max_depth, '[');
  deep.front() = '{';
  deep.insert(1, "\"a\":");
  CHECK(scan(deep).how == verdict::more);
  CHECK(scan(deep + "[").how == verdict::invalid);
}
