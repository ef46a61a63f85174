#include <doctest/doctest.h>

#include "edge/backend/runtime/stop_checker.h"

using edge::backend::stop_checker;

TEST_CASE("text is released at once when there are no stop strings") {
  stop_checker c({});
  auto s = c.push("hello");
  CHECK(s.text == "hello");
  CHECK_FALSE(s.stopped);
}

TEST_CASE("a stop string spanning pieces ends the text right before it") {
  stop_checker c({"###", "END"});
  std::string out;
  std::string matched;
  for (std::string_view piece : {"one two ", "#", "#", " three E", "N", "D four"}) {
    auto s = c.push(piece);
    out += s.text;
    matched = s.matched;
    if (s.stopped) break;
  }
  CHECK(out == "one two ## three ");
  CHECK(matched == "END");
}

TEST_CASE("a possible start of a stop string is held back until it is decided") {
  stop_checker c({"</answer>"});
  auto a = c.push("result </ans");
  CHECK(a.text == "result ");
  auto b = c.push("wer and more");
  CHECK(b.text == "</answer and more");
  CHECK_FALSE(b.stopped);
  auto d = c.push("</");
  CHECK(d.text.empty());
  CHECK(c.flush() == "</");
}

TEST_CASE("the earliest stop string wins") {
  stop_checker c({"bc", "ab"});
  auto s = c.push("xxabc");
  CHECK(s.stopped);
  CHECK(s.text == "xx");
  CHECK(s.matched == "ab");
}
