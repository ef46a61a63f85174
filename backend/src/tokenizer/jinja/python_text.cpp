#include "python_text.h"

#include <unicode/uchar.h>
#include <unicode/unistr.h>
#include <unicode/locid.h>

#include <algorithm>
#include <charconv>
#include <limits>
#include <cmath>

#include "edge/common/utf8.h"

namespace edge::backend::jinja::python {
namespace {

icu::UnicodeString to_icu(std::string_view text) {
  return icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<std::int32_t>(text.size())));
}

std::string from_icu(const icu::UnicodeString& text) {
  std::string out;
  text.toUTF8String(out);
  return out;
}

bool is_cased(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_CASED) != 0; }

// The byte offsets of each character of `text`, and its end.
std::vector<std::size_t> character_offsets(std::string_view text) {
  std::vector<std::size_t> offsets;
  for (std::size_t i = 0; i < text.size();) {
    offsets.push_back(i);
    i += std::max<std::size_t>(1, utf8::valid_length(text, i));
  }
  offsets.push_back(text.size());
  return offsets;
}

}  // namespace

bool is_space(char32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E: case 0x1F:
    case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

std::vector<char32_t> code_points(std::string_view text) {
  std::vector<char32_t> out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8::valid_length(text, i);
    if (n == 0) {
      out.push_back(static_cast<unsigned char>(text[i]));
      ++i;
    } else {
      out.push_back(utf8::decode(text.substr(i), n));
      i += n;
    }
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c >= 0xD800 && c <= 0xDFFF) {
    // A lone surrogate (from a \ud800 escape) cannot be UTF-8.
    out += utf8::replacement_character;
  } else {
    utf8::append_code_point(out, c);
  }
}

std::string from_code_points(const std::vector<char32_t>& points, std::size_t begin, std::size_t end) {
  std::string out;
  for (std::size_t i = begin; i < end; ++i) append_utf8(out, points[i]);
  return out;
}

std::size_t length(std::string_view text) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < text.size(); ++n) i += std::max<std::size_t>(1, utf8::valid_length(text, i));
  return n;
}

std::string_view strip(std::string_view text, const std::optional<std::string_view>& chars, bool left, bool right) {
  const std::vector<char32_t> set = chars ? code_points(*chars) : std::vector<char32_t>{};
  const auto strips = [&](char32_t c) {
    if (!chars) return is_space(c);
    for (const char32_t s : set) {
      if (s == c) return true;
    }
    return false;
  };
  const auto offsets = character_offsets(text);
  std::size_t first = 0;
  std::size_t last = offsets.size() - 1;  // characters [first, last)
  const auto at = [&](std::size_t k) {
    const std::size_t n = offsets[k + 1] - offsets[k];
    const std::size_t valid = utf8::valid_length(text, offsets[k]);
    return valid == n ? utf8::decode(text.substr(offsets[k]), n) : static_cast<char32_t>(static_cast<unsigned char>(text[offsets[k]]));
  };
  if (left) {
    while (first < last && strips(at(first))) ++first;
  }
  if (right) {
    while (last > first && strips(at(last - 1))) --last;
  }
  return text.substr(offsets[first], offsets[last] - offsets[first]);
}

std::vector<std::string_view> split(std::string_view text, const std::optional<std::string_view>& sep,
                                    std::int64_t maxsplit, bool from_right) {
  std::vector<std::string_view> parts;
  if (maxsplit < 0) maxsplit = std::numeric_limits<std::int64_t>::max();
  if (sep) {
    if (!from_right) {
      std::size_t start = 0;
      while (static_cast<std::int64_t>(parts.size()) < maxsplit) {
        const std::size_t hit = text.find(*sep, start);
        if (hit == std::string_view::npos) break;
        parts.emplace_back(text.substr(start, hit - start));
        start = hit + sep->size();
      }
      parts.emplace_back(text.substr(start));
      return parts;
    }
    std::size_t end = text.size();
    while (static_cast<std::int64_t>(parts.size()) < maxsplit && end >= sep->size()) {
      const std::size_t hit = text.rfind(*sep, end - sep->size());
      if (hit == std::string_view::npos) break;
      parts.emplace_back(text.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    parts.emplace_back(text.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  // Runs of whitespace; no empty strings at either end.
  const auto offsets = character_offsets(text);
  const std::size_t count = offsets.size() - 1;
  const auto space = [&](std::size_t k) {
    const std::size_t n = offsets[k + 1] - offsets[k];
    return utf8::valid_length(text, offsets[k]) == n && is_space(utf8::decode(text.substr(offsets[k]), n));
  };
  if (!from_right) {
    std::size_t k = 0;
    while (true) {
      while (k < count && space(k)) ++k;
      if (k == count) break;
      if (static_cast<std::int64_t>(parts.size()) == maxsplit) {
        parts.emplace_back(text.substr(offsets[k]));
        break;
      }
      const std::size_t word = k;
      while (k < count && !space(k)) ++k;
      parts.emplace_back(text.substr(offsets[word], offsets[k] - offsets[word]));
    }
    return parts;
  }
  std::size_t k = count;
  while (true) {
    while (k > 0 && space(k - 1)) --k;
    if (k == 0) break;
    if (static_cast<std::int64_t>(parts.size()) == maxsplit) {
      parts.emplace_back(text.substr(0, offsets[k]));
      break;
    }
    const std::size_t word_end = k;
    while (k > 0 && !space(k - 1)) --k;
    parts.emplace_back(text.substr(offsets[k], offsets[word_end] - offsets[k]));
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> splitlines(std::string_view text) {
  std::vector<std::string> lines;
  std::string line;
  const auto points = code_points(text);
  for (std::size_t i = 0; i < points.size(); ++i) {
    const char32_t c = points[i];
    const bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) ||
                          c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!is_break) {
      append_utf8(line, c);
      continue;
    }
    if (c == '\r' && i + 1 < points.size() && points[i + 1] == '\n') ++i;
    lines.push_back(std::move(line));
    line.clear();
  }
  if (!line.empty()) lines.push_back(std::move(line));
  return lines;
}

std::string upper(std::string_view text) {
  bool ascii = true;
  for (const char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) {
    std::string out(text);
    for (char& c : out) {
      if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
    }
    return out;
  }
  auto s = to_icu(text);
  s.toUpper(icu::Locale::getRoot());
  return from_icu(s);
}

std::string lower(std::string_view text) {
  bool ascii = true;
  for (const char c : text) ascii &= static_cast<unsigned char>(c) < 0x80;
  if (ascii) {
    std::string out(text);
    for (char& c : out) {
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    return out;
  }
  auto s = to_icu(text);
  s.toLower(icu::Locale::getRoot());
  return from_icu(s);
}

std::string title(std::string_view text) {
  // CPython: a character after a cased one is lowercased, any other titlecased.
  std::string out;
  bool previous_cased = false;
  for (const char32_t c : code_points(text)) {
    if (previous_cased) {
      std::string one;
      append_utf8(one, c);
      out += lower(one);
    } else {
      append_utf8(out, static_cast<char32_t>(u_totitle(static_cast<UChar32>(c))));
    }
    previous_cased = is_cased(c);
  }
  return out;
}

std::string capitalize(std::string_view text) {
  const auto points = code_points(text);
  if (points.empty()) return {};
  std::string out;
  append_utf8(out, static_cast<char32_t>(u_totitle(static_cast<UChar32>(points.front()))));
  out += lower(from_code_points(points, 1, points.size()));
  return out;
}

bool is_lower(std::string_view text) {
  bool cased = false;
  for (const char32_t c : code_points(text)) {
    const auto u = static_cast<UChar32>(c);
    if (u_hasBinaryProperty(u, UCHAR_UPPERCASE) || u_istitle(u)) return false;
    cased |= u_hasBinaryProperty(u, UCHAR_LOWERCASE) != 0;
  }
  return cased;
}

bool is_upper(std::string_view text) {
  bool cased = false;
  for (const char32_t c : code_points(text)) {
    const auto u = static_cast<UChar32>(c);
    if (u_hasBinaryProperty(u, UCHAR_LOWERCASE) || u_istitle(u)) return false;
    cased |= u_hasBinaryProperty(u, UCHAR_UPPERCASE) != 0;
  }
  return cased;
}

std::vector<replaced_piece> replace_pieces(std::string_view text, std::string_view from, std::int64_t count) {
  if (count < 0) count = std::numeric_limits<std::int64_t>::max();
  std::vector<replaced_piece> pieces;
  if (from.empty()) {
    // Python inserts `to` before every character and at the end.
    const auto offsets = character_offsets(text);
    std::int64_t done = 0;
    for (std::size_t k = 0; k + 1 < offsets.size(); ++k) {
      if (done < count) {
        pieces.push_back({true, 0, 0});
        ++done;
      }
      pieces.push_back({false, offsets[k], offsets[k + 1]});
    }
    if (done < count) pieces.push_back({true, 0, 0});
    return pieces;
  }
  std::size_t start = 0;
  for (std::int64_t done = 0; done < count; ++done) {
    const std::size_t hit = text.find(from, start);
    if (hit == std::string_view::npos) break;
    if (hit > start) pieces.push_back({false, start, hit});
    pieces.push_back({true, 0, 0});
    start = hit + from.size();
  }
  if (start < text.size()) pieces.push_back({false, start, text.size()});
  return pieces;
}

std::int64_t count(std::string_view text, std::string_view sub) {
  if (sub.empty()) return static_cast<std::int64_t>(length(text)) + 1;
  std::int64_t n = 0;
  for (std::size_t at = text.find(sub); at != std::string_view::npos; at = text.find(sub, at + sub.size())) ++n;
  return n;
}

std::int64_t find(std::string_view text, std::string_view sub, bool from_right) {
  const std::size_t at = from_right ? text.rfind(sub) : text.find(sub);
  if (at == std::string_view::npos) return -1;
  return static_cast<std::int64_t>(length(text.substr(0, at)));
}

void append_repr(std::string& out, std::string_view text) {
  static constexpr char hex[] = "0123456789abcdef";
  const bool has_single = text.find('\'') != std::string_view::npos;
  const bool has_double = text.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  out += quote;
  for (const char32_t c : code_points(text)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c < 0x20 || c == 0x7F) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 0xF];
    } else if (c < 0x7F) {
      out += static_cast<char>(c);
    } else {
      const auto type = u_charType(static_cast<UChar32>(c));
      const bool printable = !(type == U_CONTROL_CHAR || type == U_FORMAT_CHAR || type == U_SURROGATE ||
                               type == U_PRIVATE_USE_CHAR || type == U_UNASSIGNED || type == U_LINE_SEPARATOR ||
                               type == U_PARAGRAPH_SEPARATOR || type == U_SPACE_SEPARATOR);
      if (printable) {
        append_utf8(out, c);
        continue;
      }
      const int digits = c <= 0xFF ? 2 : c <= 0xFFFF ? 4 : 8;
      out += digits == 2 ? "\\x" : digits == 4 ? "\\u" : "\\U";
      for (int shift = (digits - 1) * 4; shift >= 0; shift -= 4) out += hex[(c >> shift) & 0xF];
    }
  }
  out += quote;
}

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  char buffer[64];
  const auto written = std::to_chars(buffer, buffer + sizeof(buffer), std::fabs(v), std::chars_format::scientific);
  const std::string_view shortest(buffer, static_cast<std::size_t>(written.ptr - buffer));  // d[.ddd]e±XX
  const std::size_t e = shortest.find('e');
  std::string digits;
  for (const char c : shortest.substr(0, e)) {
    if (c != '.') digits += c;
  }
  int exponent = 0;
  std::from_chars(shortest.data() + e + 1 + (shortest[e + 1] == '+' ? 1 : 0), shortest.data() + shortest.size(),
                  exponent);
  // Python's repr: exponent notation when the decimal point would sit 4 places before the
  // first digit or more than 16 places after it.
  const int point = exponent + 1;
  std::string out = v < 0 ? "-" : "";
  const auto size = static_cast<int>(digits.size());
  if (point <= -4 || point > 16) {
    out += digits[0];
    if (size > 1) {
      out += '.';
      out += digits.substr(1);
    }
    out += exponent < 0 ? "e-" : "e+";
    const int magnitude = exponent < 0 ? -exponent : exponent;
    if (magnitude < 10) out += '0';
    out += std::to_string(magnitude);
  } else if (point <= 0) {
    out += "0.";
    out.append(static_cast<std::size_t>(-point), '0');
    out += digits;
  } else if (point >= size) {
    out += digits;
    out.append(static_cast<std::size_t>(point - size), '0');
    out += ".0";
  } else {
    out += digits.substr(0, static_cast<std::size_t>(point));
    out += '.';
    out += digits.substr(static_cast<std::size_t>(point));
  }
  return out;
}

}  // namespace edge::backend::jinja::python
