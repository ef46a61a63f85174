#include "json_object_scanner.h"

namespace edge::gateway {
namespace {

bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

}  // namespace

json_object_scanner::verdict json_object_scanner::after_value() {
  if (stack_.empty()) {
    state_ = state::done;
    return verdict::complete;
  }
  state_ = state::comma_or_close;
  return verdict::more;
}

json_object_scanner::verdict json_object_scanner::number_byte(char byte, bool& consumed) {
  consumed = true;
  switch (number_) {
    case number_part::sign:
      if (byte == '0') {
        number_ = number_part::zero;
      } else if (is_digit(byte)) {
        number_ = number_part::integer;
      } else {
        consumed = false;
        state_ = state::failed;
        return verdict::invalid;
      }
      return verdict::more;
    case number_part::zero:
    case number_part::integer:
      if (number_ == number_part::integer && is_digit(byte)) return verdict::more;
      if (byte == '.') {
        number_ = number_part::point;
        return verdict::more;
      }
      if (byte == 'e' || byte == 'E') {
        number_ = number_part::exponent;
        return verdict::more;
      }
      break;
    case number_part::point:
      if (!is_digit(byte)) break;
      number_ = number_part::fraction;
      return verdict::more;
    case number_part::fraction:
      if (is_digit(byte)) return verdict::more;
      if (byte == 'e' || byte == 'E') {
        number_ = number_part::exponent;
        return verdict::more;
      }
      break;
    case number_part::exponent:
      if (byte == '+' || byte == '-') {
        number_ = number_part::exponent_sign;
        return verdict::more;
      }
      [[fallthrough]];
    case number_part::exponent_sign:
      if (!is_digit(byte)) break;
      number_ = number_part::exponent_digits;
      return verdict::more;
    case number_part::exponent_digits:
      if (is_digit(byte)) return verdict::more;
      break;
  }
  consumed = false;
  // A number may end only after a digit; the byte that ends it belongs to what follows.
  const bool can_end = number_ == number_part::zero || number_ == number_part::integer ||
                       number_ == number_part::fraction || number_ == number_part::exponent_digits;
  if (!can_end) {
    state_ = state::failed;
    return verdict::invalid;
  }
  state_ = state::comma_or_close;  // numbers are never the top level, so a container is open
  return verdict::more;
}

json_object_scanner::verdict json_object_scanner::push(char byte) {
  const auto fail = [this] {
    state_ = state::failed;
    return verdict::invalid;
  };
  const auto open = [&](char container) {
    if (stack_.size() >= max_depth) return fail();
    stack_.push_back(container);
    state_ = container == '{' ? state::key_or_close : state::value;
    return verdict::more;
  };

  switch (state_) {
    case state::done:
    case state::failed: return verdict::invalid;

    case state::value:
      if (is_json_space(byte)) return verdict::more;
      if (stack_.empty()) return byte == '{' ? open('{') : fail();
      // Right after '[' the array may close at once.
      if (byte == ']' && stack_.back() == '[') {
        stack_.pop_back();
        return after_value();
      }
      switch (byte) {
        case '{':
        case '[': return open(byte);
        case '"':
          string_is_key_ = false;
          state_ = state::string;
          return verdict::more;
        case 't': literal_ = "rue"; break;
        case 'f': literal_ = "alse"; break;
        case 'n': literal_ = "ull"; break;
        case '-':
          number_ = number_part::sign;
          state_ = state::number;
          return verdict::more;
        default:
          if (!is_digit(byte)) return fail();
          number_ = byte == '0' ? number_part::zero : number_part::integer;
          state_ = state::number;
          return verdict::more;
      }
      state_ = state::literal;
      return verdict::more;

    case state::key_or_close:
    case state::key:
      if (is_json_space(byte)) return verdict::more;
      if (byte == '}' && state_ == state::key_or_close) {
        stack_.pop_back();
        return after_value();
      }
      if (byte != '"') return fail();
      string_is_key_ = true;
      state_ = state::string;
      return verdict::more;

    case state::colon:
      if (is_json_space(byte)) return verdict::more;
      if (byte != ':') return fail();
      state_ = state::value;
      return verdict::more;

    case state::comma_or_close:
      if (is_json_space(byte)) return verdict::more;
      if (byte == ',') {
        state_ = stack_.back() == '{' ? state::key : state::value;
        // A ']' right after ',' is not the array's close: "value" only takes ']' after '['.
        if (state_ == state::value) state_ = state::value_after_comma;
        return verdict::more;
      }
      if ((byte == '}' && stack_.back() == '{') || (byte == ']' && stack_.back() == '[')) {
        stack_.pop_back();
        return after_value();
      }
      return fail();

    case state::value_after_comma:
      if (is_json_space(byte)) return verdict::more;
      if (byte == ']') return fail();
      state_ = state::value;
      return push(byte);

    case state::string:
      if (byte == '"') {
        if (string_is_key_) {
          state_ = state::colon;
          return verdict::more;
        }
        return after_value();
      }
      if (byte == '\\') {
        state_ = state::escape;
        return verdict::more;
      }
      if (static_cast<unsigned char>(byte) < 0x20) return fail();
      return verdict::more;

    case state::escape:
      if (byte == 'u') {
        unicode_left_ = 4;
        state_ = state::unicode;
        return verdict::more;
      }
      if (std::string_view("\"\\/bfnrt").find(byte) == std::string_view::npos) return fail();
      state_ = state::string;
      return verdict::more;

    case state::unicode:
      if (!is_hex(byte)) return fail();
      if (--unicode_left_ == 0) state_ = state::string;
      return verdict::more;

    case state::literal:
      if (byte != literal_.front()) return fail();
      literal_.remove_prefix(1);
      return literal_.empty() ? after_value() : verdict::more;

    case state::number: {
      bool consumed = false;
      const verdict v = number_byte(byte, consumed);
      if (consumed || v == verdict::invalid) return v;
      return push(byte);  // the byte after the number, in comma_or_close
    }
  }
  return fail();
}

}  // namespace edge::gateway
