// The JSON string escaper and number writer: what they write, and that simdjson reads it back.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <string>

#include "edge/common/json_text.h"

namespace {

// `literal` read back by a JSON parser, or "<invalid>".
std::string read_back(const std::string& literal) {
  simdjson::dom::parser parser;
  std::string_view text;
  if (parser.parse(literal).get_string().get(text) != simdjson::SUCCESS) return "<invalid>";
  return std::string(text);
}

}  // namespace

TEST_CASE("quotes, backslashes and control characters are escaped") {
  CHECK(edge::json_string("plain text") == R"("plain text")");
  CHECK(edge::json_string("") == R"("")");
  CHECK(edge::json_string(R"(say "hi" \ bye)") == R"("say \"hi\" \\ bye")");
  CHECK(edge::json_string("a\nb\rc\td") == R"("a\nb\rc\td")");
  CHECK(edge::json_string(std::string_view("\x00\x01\x1f\x7f", 4)) == R"("\u0000\u0001\u001f\u007f")");
  CHECK(edge::json_string("/ and ' stay") == R"("/ and ' stay")");
}

TEST_CASE("valid UTF-8 is passed through; other bytes become U+FFFD each") {
  const std::string utf8 = "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x98\x80";  // café 日本 😀
  CHECK(edge::json_string(utf8) == "\"" + utf8 + "\"");
  const std::string fffd = "\xEF\xBF\xBD";
  CHECK(edge::json_string("a\xFF" "b") == "\"a" + fffd + "b\"");
  CHECK(edge::json_string("\x80") == "\"" + fffd + "\"");                        // a lone continuation byte
  CHECK(edge::json_string("\xC3") == "\"" + fffd + "\"");                        // cut off at the end
  CHECK(edge::json_string("\xC0\x80") == "\"" + fffd + fffd + "\"");             // overlong NUL
  CHECK(edge::json_string("\xED\xA0\x80") == "\"" + fffd + fffd + fffd + "\"");  // a surrogate
  CHECK(edge::json_string("\xF4\x90\x80\x80") == "\"" + fffd + fffd + fffd + fffd + "\"");  // past U+10FFFF
}

TEST_CASE("what is written reads back as the text") {
  for (const std::string& text : {std::string("quote \" backslash \\ newline \n tab \t"), std::string("\x01\x7f"),
                                 std::string("caf\xC3\xA9 \xF0\x9F\x98\x80"), std::string("\xE2\x80\xA8 line separator")}) {
    CAPTURE(text);
    CHECK(read_back(edge::json_string(text)) == text);
  }
  std::string appended = "[";
  edge::append_json_string(appended, "x");
  CHECK(appended == R"(["x")");
}

TEST_CASE("numbers are written in their shortest exact form") {
  CHECK(edge::json_number(0.1) == "0.1");
  CHECK(edge::json_number(10000.0) == "10000");
  CHECK(edge::json_number(-2.5) == "-2.5");
  CHECK(edge::json_number(1e-6) == "1e-06");
  for (const double value : {0.1, 1e-5, 500000.0, 3.0e38, 6.103515625e-05}) {
    CHECK(std::stod(edge::json_number(value)) == value);
  }
}

TEST_CASE("is_json_number accepts what RFC 8259 calls a number, and nothing else") {
  for (const char* number : {"0", "-0", "7", "-12", "0.5", "10.25", "1e3", "1E+3", "2.5e-07", "-0.0e0"}) {
    CAPTURE(number);
    CHECK(edge::is_json_number(number));
  }
  for (const char* other : {"", "-", "01", "1.", ".5", "+1", "1e", "1e+", "NaN", "inf", "0x10", "1 ", " 1", "1,2"}) {
    CAPTURE(other);
    CHECK_FALSE(edge::is_json_number(other));
  }
}
