// The byte ranges renderers record a prompt's markup in.
#include <doctest/doctest.h>

#include <vector>

#include "edge/backend/tokenizer/markup.h"

namespace {

using edge::backend::byte_range;
using edge::backend::byte_ranges;
using edge::backend::marked_text;

std::vector<byte_range> ranges_of(const byte_ranges& r) { return {r.ranges().begin(), r.ranges().end()}; }

}  // namespace

TEST_CASE("byte ranges stay sorted, apart and non-empty whatever order they come in") {
  byte_ranges r;
  r.add(10, 12);
  r.add(12, 14);  // adjacent: one range
  r.add(3, 3);    // empty: nothing
  r.add(0, 2);
  r.add(5, 6);
  CHECK(ranges_of(r) == std::vector<byte_range>{{0, 2}, {5, 6}, {10, 14}});
  r.add(1, 11);  // bridges all three
  CHECK(ranges_of(r) == std::vector<byte_range>{{0, 14}});
  r.add(20, 30);
  r.add(16, 18);
  CHECK(ranges_of(r) == std::vector<byte_range>{{0, 14}, {16, 18}, {20, 30}});
}

TEST_CASE("byte ranges cover a span only when every byte of it is in one of them") {
  const byte_ranges r{{2, 5}, {7, 9}};
  CHECK(r.covers(2, 5));
  CHECK(r.covers(3, 4));
  CHECK(r.covers(8, 8));  // empty
  CHECK_FALSE(r.covers(1, 3));
  CHECK_FALSE(r.covers(4, 8));  // across the gap
  CHECK_FALSE(r.covers(8, 10));
  CHECK_FALSE(byte_ranges{}.covers(0, 1));
}

TEST_CASE("marked text: parts of other texts keep their markup, moved to where they land") {
  marked_text t;
  t.append_markup("<a>");
  t.append_text("hi");
  marked_text other;
  other.append_text("xx");
  other.append_markup("<b>");
  other.append_text("yy");
  t.append_part(other.text, other.markup, 1, 6);  // "x<b>y"
  t.append(other);
  CHECK(t.text == "<a>hix<b>yxx<b>yy");
  CHECK(ranges_of(t.markup) == std::vector<byte_range>{{0, 3}, {6, 9}, {12, 15}});
}
