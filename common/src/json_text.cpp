#include "edge/common/json_text.h"

#include <charconv>

#include "edge/common/utf8.h"

namespace edge {
namespace {

constexpr unsigned char first_printable = 0x20;
constexpr unsigned char delete_character = 0x7F;

}  // namespace

void append_json_string(std::string& out, std::string_view text, json_escaping style) {
  const bool python = style == json_escaping::python;
  static constexpr char hex_digits[] = "0123456789abcdef";
  out += '"';
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b':
        case '\f':
          if (python) {
            out += c == '\b' ? "\\b" : "\\f";
            break;
          }
          [[fallthrough]];
        default:
          if (c < first_printable || (c == delete_character && !python)) {
            out += "\\u00";
            out += hex_digits[c >> 4];
            out += hex_digits[c & 0xF];
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    const std::size_t length = utf8::valid_length(text, i);
    if (length == 0) {
      out += utf8::replacement_character;
      ++i;
    } else {
      out.append(text.substr(i, length));
      i += length;
    }
  }
  out += '"';
}

std::string json_string(std::string_view text) {
  std::string out;
  append_json_string(out, text);
  return out;
}

std::string json_number(double value) {
  char buffer[32];
  const auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, error == std::errc{} ? end : buffer);
}

bool is_json_number(std::string_view text) {
  std::size_t i = 0;
  const auto digits = [&] {
    const std::size_t start = i;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9') ++i;
    return i - start;
  };
  if (i < text.size() && text[i] == '-') ++i;
  if (i < text.size() && text[i] == '0') {
    ++i;
  } else if (digits() == 0) {
    return false;
  }
  if (i < text.size() && text[i] == '.') {
    ++i;
    if (digits() == 0) return false;
  }
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) ++i;
    if (digits() == 0) return false;
  }
  return i == text.size();
}

}  // namespace edge
