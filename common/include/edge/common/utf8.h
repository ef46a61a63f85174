// UTF-8 helpers: character boundaries, validation and repair, for the tokenizers, the JSON
// text writer, the log and the gateway's error messages.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

namespace edge::utf8 {

inline constexpr std::string_view replacement_character = "\xEF\xBF\xBD";  // U+FFFD

// The length a character starting with `lead` claims (1 to 4), or 0 for a byte that cannot
// start one (a continuation byte, 0xC0/0xC1, 0xF5..0xFF).
constexpr std::size_t sequence_length(unsigned char lead) noexcept {
  if (lead < 0x80) return 1;
  if (lead < 0xC2) return 0;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF5) return 4;
  return 0;
}

// The length of the well-formed character at `pos` (1 to 4), or 0 when the bytes there do not
// form one (including a character cut short by the end of `text`). Overlong forms, surrogates
// and code points past U+10FFFF are not well-formed.
std::size_t valid_length(std::string_view text, std::size_t pos) noexcept;

// How many bytes at the end of `text` are the start of a character that more bytes could still
// complete (0 when the text ends on a boundary or with bytes no continuation can repair).
std::size_t incomplete_tail(std::string_view text) noexcept;

// Appends `text` with every ill-formed sequence replaced by U+FFFD (one per maximal ill-formed
// subpart, as the Unicode standard recommends and as browsers do).
void append_sanitized(std::string& out, std::string_view text);

bool is_valid(std::string_view text) noexcept;

void append_code_point(std::string& out, char32_t code_point);

// The characters of well-formed UTF-8 text (bytes that are no continuation byte): what JSON
// Schema's string lengths and OpenAI's logprob offsets count.
inline std::size_t code_points(std::string_view text) noexcept {
  return static_cast<std::size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
}

// The code point of the well-formed character of `length` bytes at the start of `text`.
char32_t decode(std::string_view text, std::size_t length) noexcept;

}  // namespace edge::utf8
