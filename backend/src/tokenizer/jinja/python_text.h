// Python's text rules, where a chat template relies on them: what str.isspace() calls
// whitespace, strip/split, case mapping (full Unicode, through ICU), repr() of strings and
// floats. (json.dumps' escaping is edge/common/json_text.h's, json_escaping::python.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace edge::backend::jinja::python {

// Python's str.isspace() for one code point.
bool is_space(char32_t c);

// The code points of `text`; a byte that is not part of valid UTF-8 stands for itself (as a
// code point below 0x100 it cannot be confused with a character of valid UTF-8 text's).
std::vector<char32_t> code_points(std::string_view text);
void append_utf8(std::string& out, char32_t c);
std::string from_code_points(const std::vector<char32_t>& points, std::size_t begin, std::size_t end);
// The number of characters (code points) of `text`.
std::size_t length(std::string_view text);

// str.strip/lstrip/rstrip: whitespace when `chars` is nullopt, else any of its characters.
std::string_view strip(std::string_view text, const std::optional<std::string_view>& chars, bool left, bool right);

// str.split(sep, maxsplit) and str.rsplit, as parts of `text`; sep nullopt: runs of whitespace.
// An empty sep is the caller's error to report.
std::vector<std::string_view> split(std::string_view text, const std::optional<std::string_view>& sep,
                                    std::int64_t maxsplit, bool from_right);
// str.splitlines() (without keepends).
std::vector<std::string> splitlines(std::string_view text);

std::string upper(std::string_view text);
std::string lower(std::string_view text);
std::string title(std::string_view text);       // str.title()
std::string capitalize(std::string_view text);  // str.capitalize()
bool is_lower(std::string_view text);           // str.islower()
bool is_upper(std::string_view text);           // str.isupper()

// str.replace(old, new, count) (count < 0: all) as the pieces of its result, in order: bytes
// [begin, end) of `text`, or (replacement) the new text.
struct replaced_piece {
  bool replacement = false;
  std::size_t begin = 0;
  std::size_t end = 0;
};
std::vector<replaced_piece> replace_pieces(std::string_view text, std::string_view from, std::int64_t count);
// str.count(sub) and str.find(sub) (in characters; -1 when absent), str.rfind(sub).
std::int64_t count(std::string_view text, std::string_view sub);
std::int64_t find(std::string_view text, std::string_view sub, bool from_right);

// repr(str): quoted as Python quotes it.
void append_repr(std::string& out, std::string_view text);
// repr(float): "1.0", "0.1", "1e-05", "1.5e+16", "inf", "nan".
std::string float_repr(double value);

}  // namespace edge::backend::jinja::python
