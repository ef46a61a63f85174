// Writing JSON text by hand for the files make-model produces (edge_backend has no JSON writer:
// simdjson only parses).
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

namespace edge::backend {

// `text` as a JSON string literal, quotes included. Text is passed through as UTF-8; quotes,
// backslashes and control characters are escaped.
inline void append_json_string(std::string& out, std::string_view text) {
  static constexpr char hex_digits[] = "0123456789abcdef";
  constexpr unsigned char first_printable = 0x20;
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < first_printable) {
          out += "\\u00";
          out += hex_digits[static_cast<unsigned char>(c) >> 4];
          out += hex_digits[static_cast<unsigned char>(c) & 0xF];
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

inline std::string json_string(std::string_view text) {
  std::string out;
  append_json_string(out, text);
  return out;
}

// The shortest text that reads back as exactly `value` (finite values only).
inline std::string json_number(double value) {
  char buffer[32];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, error == std::errc{} ? end : buffer);
}

}  // namespace edge::backend
