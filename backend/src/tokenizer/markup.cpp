#include "edge/backend/tokenizer/markup.h"

#include <algorithm>

namespace edge::backend {

byte_ranges::byte_ranges(std::initializer_list<byte_range> ranges) {
  for (const byte_range& r : ranges) add(r.begin, r.end);
}

void byte_ranges::add(std::size_t begin, std::size_t end) {
  if (begin >= end) return;
  if (ranges_.empty() || begin > ranges_.back().end) {
    ranges_.push_back({begin, end});
    return;
  }
  if (begin >= ranges_.back().begin) {
    ranges_.back().end = std::max(ranges_.back().end, end);
    return;
  }
  // Out of order: merge with every range it touches.
  auto first = std::lower_bound(ranges_.begin(), ranges_.end(), begin,
                                [](const byte_range& r, std::size_t at) { return r.end < at; });
  auto last = first;
  while (last != ranges_.end() && last->begin <= end) {
    begin = std::min(begin, last->begin);
    end = std::max(end, last->end);
    ++last;
  }
  const auto at = ranges_.erase(first, last);
  ranges_.insert(at, {begin, end});
}

void byte_ranges::add_part(const byte_ranges& other, std::size_t from, std::size_t to, std::size_t at) {
  auto r = std::lower_bound(other.ranges_.begin(), other.ranges_.end(), from,
                            [](const byte_range& range, std::size_t x) { return range.end <= x; });
  for (; r != other.ranges_.end() && r->begin < to; ++r) {
    const std::size_t begin = std::max(r->begin, from);
    const std::size_t end = std::min(r->end, to);
    add(begin - from + at, end - from + at);
  }
}

bool byte_ranges::covers(std::size_t begin, std::size_t end) const {
  if (begin >= end) return true;
  // The last range starting at or before `begin` must reach `end`.
  auto after = std::upper_bound(ranges_.begin(), ranges_.end(), begin,
                                [](std::size_t x, const byte_range& r) { return x < r.begin; });
  if (after == ranges_.begin()) return false;
  return std::prev(after)->end >= end;
}

void marked_text::append_markup(std::string_view piece) {
  markup.add(text.size(), text.size() + piece.size());
  text += piece;
}

void marked_text::append_text(std::string_view piece) { text += piece; }

void marked_text::append_part(std::string_view piece, const byte_ranges& piece_markup, std::size_t from,
                              std::size_t to) {
  markup.add_part(piece_markup, from, to, text.size());
  text.append(piece.substr(from, to - from));
}

}  // namespace edge::backend
