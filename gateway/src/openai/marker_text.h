// Small text helpers the output parsers share: the markers a model writes (<think>,
// <tool_call>, <|tool_call_begin|>, ...) may arrive split across pieces, so a parser holds back
// the end of its text while it could still be the start of one.
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <string_view>

namespace edge::gateway {

inline bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// The length of the longest end of `text` that is a proper start of `marker` ("<tool" of
// "<tool_call>"): bytes that must wait for more text before they can be called plain text.
inline std::size_t partial_marker_length(std::string_view text, std::string_view marker) {
  for (std::size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

inline std::size_t partial_marker_length(std::string_view text, std::initializer_list<std::string_view> markers) {
  std::size_t longest = 0;
  for (const std::string_view marker : markers) {
    if (!marker.empty()) longest = std::max(longest, partial_marker_length(text, marker));
  }
  return longest;
}

// Where the whitespace at the end of text[0, end) begins (`end` when there is none).
inline std::size_t trailing_space_start(std::string_view text, std::size_t end) {
  while (end > 0 && is_space(text[end - 1])) --end;
  return end;
}

inline std::size_t leading_space_length(std::string_view text) {
  std::size_t n = 0;
  while (n < text.size() && is_space(text[n])) ++n;
  return n;
}

inline std::string_view trim_space(std::string_view text) {
  text.remove_prefix(leading_space_length(text));
  return text.substr(0, trailing_space_start(text, text.size()));
}

// `marker` in `text`, searched from `scanned`; when it is not there, `scanned` moves to where it
// could still begin, so that text held back while it grows is searched once, not again per piece.
inline std::size_t find_marker(std::string_view text, std::string_view marker, std::size_t& scanned) {
  const std::size_t found = text.find(marker, std::min(scanned, text.size()));
  if (found == std::string_view::npos) scanned = text.size() >= marker.size() ? text.size() - marker.size() + 1 : 0;
  return found;
}

// `marker` in `text` where it stands outside every JSON string (a quote opens one, an unescaped
// quote closes it), searched from where `scan` stopped: a JSON value's end, which a string inside
// the value may spell. `scan` carries the string state from one piece of text to the next.
struct json_string_scan {
  std::size_t at = 0;  // the next byte to read
  bool in_string = false;
  bool escaped = false;  // the byte before `at` is a backslash that escapes
};

inline std::size_t find_marker_outside_strings(std::string_view text, std::string_view marker, json_string_scan& scan) {
  for (; scan.at + marker.size() <= text.size(); ++scan.at) {
    const char c = text[scan.at];
    if (!scan.in_string) {
      if (text.substr(scan.at).starts_with(marker)) return scan.at;
      scan.in_string = c == '"';
    } else if (scan.escaped) {
      scan.escaped = false;
    } else if (c == '\\') {
      scan.escaped = true;
    } else {
      scan.in_string = c != '"';
    }
  }
  return std::string_view::npos;
}

// Whether `text` could still grow into `marker` (it is a proper start of it).
inline bool is_marker_start(std::string_view text, std::string_view marker) {
  return text.size() < marker.size() && marker.starts_with(text);
}

}  // namespace edge::gateway
