// Finds where a JSON object ends in text that arrives a piece at a time, and whether it is valid
// JSON so far: the tool-call parsers stream a call's arguments to the client as the model writes
// them, and need to know, byte by byte, whether the arguments are still well-formed and where they
// end (a '}' inside a string does not end them). RFC 8259 syntax; bytes of 0x80 and above inside
// strings are passed as they are (the text is the model's UTF-8, already whole characters).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace edge::gateway {

class json_object_scanner {
 public:
  enum class verdict {
    more,      // the byte belongs to the object, which is not complete yet
    complete,  // the byte closed the object
    invalid,   // the byte cannot continue valid JSON (or the value is not an object); it is not consumed
  };

  // Nesting beyond this is invalid (as deep as any arguments a model writes, far below what
  // would make the stack's memory matter).
  static constexpr std::size_t max_depth = 256;

  // One byte. After `complete` or `invalid` the scanner takes no more bytes.
  verdict push(char byte);

 private:
  enum class state : std::uint8_t {
    value,         // a value is next (whitespace first); right after '[' also ']'
    key_or_close,  // right after '{': a key or '}'
    key,           // after ',' in an object: a key
    colon,         // after a key
    comma_or_close,
    value_after_comma,  // after ',' in an array: a value (not ']')
    string,        // inside a string (a key's or a value's)
    escape,        // after a backslash in a string
    unicode,       // the hex digits of \uXXXX
    literal,       // true, false, null
    number,
    done,
    failed,
  };
  // Where a number is, in RFC 8259's grammar.
  enum class number_part : std::uint8_t { sign, zero, integer, point, fraction, exponent, exponent_sign, exponent_digits };

  verdict after_value();
  verdict number_byte(char byte, bool& consumed);

  state state_ = state::value;
  std::vector<char> stack_;  // '{' or '[' per open container, innermost last
  bool string_is_key_ = false;
  int unicode_left_ = 0;
  std::string_view literal_;  // the rest of the literal being read
  number_part number_ = number_part::sign;
};

}  // namespace edge::gateway
