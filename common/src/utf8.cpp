#include "edge/common/utf8.h"

namespace edge::utf8 {
namespace {

struct scan_result {
  std::size_t length;  // bytes that belong together: a whole character or a maximal ill-formed part
  bool complete;       // a well-formed character
};

// The second byte's range depends on the lead: it is what excludes overlong forms, surrogates
// and code points past U+10FFFF.
constexpr bool second_byte_ok(unsigned char lead, unsigned char byte) noexcept {
  switch (lead) {
    case 0xE0: return byte >= 0xA0 && byte <= 0xBF;
    case 0xED: return byte >= 0x80 && byte <= 0x9F;
    case 0xF0: return byte >= 0x90 && byte <= 0xBF;
    case 0xF4: return byte >= 0x80 && byte <= 0x8F;
    default: return byte >= 0x80 && byte <= 0xBF;
  }
}

scan_result scan(std::string_view text, std::size_t pos) noexcept {
  const auto lead = static_cast<unsigned char>(text[pos]);
  const std::size_t need = sequence_length(lead);
  if (need == 0) return {1, false};
  if (need == 1) return {1, true};
  std::size_t got = 1;
  while (got < need && pos + got < text.size()) {
    const auto byte = static_cast<unsigned char>(text[pos + got]);
    const bool ok = got == 1 ? second_byte_ok(lead, byte) : (byte >= 0x80 && byte <= 0xBF);
    if (!ok) break;
    ++got;
  }
  return {got, got == need};
}

}  // namespace

std::size_t valid_length(std::string_view text, std::size_t pos) noexcept {
  if (pos >= text.size()) return 0;
  const scan_result r = scan(text, pos);
  return r.complete ? r.length : 0;
}

std::size_t incomplete_tail(std::string_view text) noexcept {
  // A character is at most 4 bytes, so only the last 3 can be an unfinished start.
  const std::size_t first = text.size() > 3 ? text.size() - 3 : 0;
  for (std::size_t pos = first; pos < text.size(); ++pos) {
    const auto lead = static_cast<unsigned char>(text[pos]);
    if (sequence_length(lead) < 2) continue;
    const scan_result r = scan(text, pos);
    if (!r.complete && pos + r.length == text.size()) return text.size() - pos;
  }
  return 0;
}

void append_sanitized(std::string& out, std::string_view text) {
  std::size_t pos = 0;
  std::size_t clean_start = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const scan_result r = scan(text, pos);
    if (r.complete) {
      pos += r.length;
      continue;
    }
    out.append(text.substr(clean_start, pos - clean_start));
    out.append(replacement_character);
    pos += r.length;
    clean_start = pos;
  }
  out.append(text.substr(clean_start));
}

bool is_valid(std::string_view text) noexcept {
  std::size_t pos = 0;
  while (pos < text.size()) {
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      continue;
    }
    const scan_result r = scan(text, pos);
    if (!r.complete) return false;
    pos += r.length;
  }
  return true;
}

void append_code_point(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

char32_t decode(std::string_view text, std::size_t length) noexcept {
  const auto byte = [&](std::size_t i) { return static_cast<char32_t>(static_cast<unsigned char>(text[i])); };
  switch (length) {
    case 1: return byte(0);
    case 2: return ((byte(0) & 0x1F) << 6) | (byte(1) & 0x3F);
    case 3: return ((byte(0) & 0x0F) << 12) | ((byte(1) & 0x3F) << 6) | (byte(2) & 0x3F);
    default: return ((byte(0) & 0x07) << 18) | ((byte(1) & 0x3F) << 12) | ((byte(2) & 0x3F) << 6) | (byte(3) & 0x3F);
  }
}

}  // namespace edge::utf8
