#include "lexer.h"

#include <algorithm>

#include "edge/common/format.h"
#include "edge/common/utf8.h"
#include "python_text.h"

namespace edge::backend::jinja {
namespace {

// Python's str.splitlines() breaks, as UTF-8: \r\n, \n, \r, \v, \f, \x1c-\x1e, U+0085, U+2028,
// U+2029. Returns the length of the break at `i`, 0 when there is none.
std::size_t line_break_at(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c == '\r') return i + 1 < s.size() && s[i + 1] == '\n' ? 2 : 1;
  if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) return 1;
  if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x85) return 2;
  if (c == 0xE2 && i + 2 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x80 &&
      (static_cast<unsigned char>(s[i + 2]) == 0xA8 || static_cast<unsigned char>(s[i + 2]) == 0xA9)) {
    return 3;
  }
  return 0;
}

// Jinja reads the source as "\n".join(source.splitlines()): every break becomes "\n" and a
// break at the very end is dropped.
std::string normalize_newlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (std::size_t i = 0; i < source.size();) {
    if (const std::size_t n = line_break_at(source, i)) {
      i += n;
      if (i < source.size()) out += '\n';
      continue;
    }
    out += source[i++];
  }
  return out;
}

// The length of the whitespace character at `i` (Python's str.isspace()), 0 when there is none.
std::size_t space_at(std::string_view s, std::size_t i) {
  const std::size_t n = utf8::valid_length(s, i);
  if (n == 0) return 0;
  return python::is_space(utf8::decode(s.substr(i), n)) ? n : 0;
}

std::size_t skip_spaces(std::string_view s, std::size_t i) {
  while (i < s.size()) {
    const std::size_t n = space_at(s, i);
    if (n == 0) break;
    i += n;
  }
  return i;
}

std::string_view rstrip_spaces(std::string_view s) {
  return python::strip(s, std::nullopt, false, true);
}

bool all_spaces(std::string_view s) { return skip_spaces(s, 0) == s.size(); }

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class lexer {
 public:
  explicit lexer(std::string_view source) : src_(normalize_newlines(source)) {
    line_starts_.push_back(0);
    for (std::size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<token> run() {
    std::size_t pos = 0;
    while (pos < src_.size()) pos = lex_data(pos);
    push(token_type::end, "", src_.size());
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(const std::string& what, std::size_t at) const {
    const auto [line, column] = where(at);
    throw syntax_error(what, line, column);
  }

  std::pair<int, int> where(std::size_t at) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), at);
    const std::size_t line_start = *(it - 1);
    const std::size_t column = python::length(std::string_view(src_).substr(line_start, at - line_start));
    return {static_cast<int>(it - line_starts_.begin()), static_cast<int>(column) + 1};
  }

  void push(token_type type, std::string value, std::size_t at) {
    const auto [line, column] = where(at);
    tokens_.push_back(token{type, std::move(value), line, column});
  }

  // The text before a tag at `tag`, with the tag's whitespace rules applied to it.
  void push_text(std::size_t begin, std::size_t tag, char modifier, bool block_like) {
    std::string_view text = std::string_view(src_).substr(begin, tag - begin);
    if (modifier == '-') {
      text = rstrip_spaces(text);
    } else if (modifier != '+' && block_like) {
      // lstrip_blocks: only spaces between the line's start and the tag go.
      const std::size_t last_newline = text.rfind('\n');
      const std::size_t line_begin = last_newline == std::string_view::npos ? 0 : last_newline + 1;
      const bool line_starting = begin == 0 || src_[begin - 1] == '\n';
      if ((line_begin > 0 || line_starting) && all_spaces(text.substr(line_begin))) text = text.substr(0, line_begin);
    }
    if (!text.empty()) push(token_type::text, std::string(text), begin);
  }

  // After a block or comment's end at `pos`: "-" drops the whitespace that follows, "+" keeps it,
  // otherwise trim_blocks drops one newline.
  std::size_t after_block_end(std::size_t pos, char modifier) const {
    if (modifier == '-') return skip_spaces(src_, pos);
    if (modifier != '+' && pos < src_.size() && src_[pos] == '\n') return pos + 1;
    return pos;
  }

  std::size_t lex_data(std::size_t pos) {
    std::size_t tag = pos;
    while (true) {
      tag = src_.find('{', tag);
      if (tag == std::string::npos || tag + 1 >= src_.size()) {
        push(token_type::text, src_.substr(pos), pos);
        return src_.size();
      }
      const char next = src_[tag + 1];
      if (next == '{' || next == '%' || next == '#') break;
      ++tag;
    }
    const char kind = src_[tag + 1];
    const char modifier = tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+') ? src_[tag + 2] : 0;
    std::size_t inner = tag + 2 + (modifier ? 1 : 0);
    if (kind == '%' && is_raw(inner)) return lex_raw(pos, tag, modifier, inner);
    push_text(pos, tag, modifier, kind != '{');
    if (kind == '#') {
      const std::size_t end = src_.find("#}", inner);
      if (end == std::string::npos) fail("the comment is not closed: '#}' is missing", tag);
      const char end_modifier = end > inner && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
      return after_block_end(end + 2, end_modifier);
    }
    if (kind == '{') {
      push(token_type::var_begin, "{{", tag);
      return lex_tag(inner, tag, false);
    }
    push(token_type::block_begin, "{%", tag);
    return lex_tag(inner, tag, true);
  }

  bool is_raw(std::size_t inner) const {
    const std::size_t at = skip_spaces(src_, inner);
    if (src_.compare(at, 3, "raw") != 0) return false;
    const std::size_t after = at + 3;
    return after < src_.size() && !is_name_char(src_[after]);
  }

  // {% raw %}...{% endraw %}: the text between is kept as it is.
  std::size_t lex_raw(std::size_t text_begin, std::size_t tag, char modifier, std::size_t inner) {
    push_text(text_begin, tag, modifier, true);
    std::size_t at = skip_spaces(src_, skip_spaces(src_, inner) + 3);
    char end_modifier = 0;
    if (at < src_.size() && (src_[at] == '-' || src_[at] == '+')) end_modifier = src_[at++];
    if (src_.compare(at, 2, "%}") != 0) fail("expected '%}' after 'raw'", at);
    const std::size_t content = after_block_end(at + 2, end_modifier);
    // The first "{%[-+] endraw [-+]%}" ends it.
    for (std::size_t search = content;;) {
      const std::size_t close = src_.find("{%", search);
      if (close == std::string::npos) fail("the raw block is not closed: '{% endraw %}' is missing", tag);
      std::size_t p = close + 2;
      const char close_modifier = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p] : 0;
      if (close_modifier) ++p;
      p = skip_spaces(src_, p);
      if (src_.compare(p, 6, "endraw") != 0 || (p + 6 < src_.size() && is_name_char(src_[p + 6]))) {
        search = close + 2;
        continue;
      }
      p = skip_spaces(src_, p + 6);
      char last_modifier = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) last_modifier = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) fail("expected '%}' after 'endraw'", p);
      push_text(content, close, close_modifier, true);
      return after_block_end(p + 2, last_modifier);
    }
  }

  // The tokens of an expression or statement tag, up to and with its end.
  std::size_t lex_tag(std::size_t pos, std::size_t tag, bool block) {
    std::string balance;  // the brackets open, innermost last
    while (true) {
      pos = skip_spaces(src_, pos);
      if (pos >= src_.size()) fail(block ? "the tag is not closed: '%}' is missing" : "'}}' is missing", tag);
      const char c = src_[pos];
      if (balance.empty()) {
        const char end = block ? '%' : '}';
        if ((c == '-' || c == '+') && src_.compare(pos + 1, 2, std::string{end, '}'}) == 0 && (block || c == '-')) {
          push(block ? token_type::block_end : token_type::var_end, block ? "%}" : "}}", pos);
          return block ? after_block_end(pos + 3, c) : skip_spaces(src_, pos + 3);
        }
        if (c == end && pos + 1 < src_.size() && src_[pos + 1] == '}') {
          push(block ? token_type::block_end : token_type::var_end, block ? "%}" : "}}", pos);
          return block ? after_block_end(pos + 2, 0) : pos + 2;
        }
      }
      if (is_name_start(c)) {
        std::size_t end = pos;
        while (end < src_.size() && is_name_char(src_[end])) ++end;
        push(token_type::name, src_.substr(pos, end - pos), pos);
        pos = end;
      } else if (is_digit(c)) {
        pos = lex_number(pos);
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos);
      } else {
        pos = lex_operator(pos, balance);
      }
    }
  }

  std::size_t digits(std::size_t pos, std::string& out) const {
    // Python's digit groups: 1_000.
    while (pos < src_.size()) {
      if (is_digit(src_[pos])) {
        out += src_[pos++];
      } else if (src_[pos] == '_' && pos + 1 < src_.size() && is_digit(src_[pos + 1]) && !out.empty()) {
        ++pos;
      } else {
        break;
      }
    }
    return pos;
  }

  std::size_t lex_number(std::size_t pos) {
    const std::size_t start = pos;
    std::string text;
    pos = digits(pos, text);
    bool floating = false;
    // After a dot (x.0.1) a number is an integer attribute, never a float.
    const bool after_dot = !tokens_.empty() && tokens_.back().type == token_type::op && tokens_.back().value == ".";
    if (!after_dot && pos + 1 < src_.size() && src_[pos] == '.' && is_digit(src_[pos + 1])) {
      text += '.';
      pos = digits(pos + 1, text);
      floating = true;
    }
    if (!after_dot && pos < src_.size() && (src_[pos] == 'e' || src_[pos] == 'E')) {
      std::size_t p = pos + 1;
      std::string exponent = "e";
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) exponent += src_[p++];
      if (p < src_.size() && is_digit(src_[p])) {
        std::string exponent_digits;
        pos = digits(p, exponent_digits);
        text += exponent + exponent_digits;
        floating = true;
      }
    }
    push(floating ? token_type::floating : token_type::integer, text, start);
    return pos;
  }

  // A string literal, with Python's escapes (as Jinja decodes them: unicode-escape).
  std::size_t lex_string(std::size_t pos) {
    const std::size_t start = pos;
    const char quote = src_[pos++];
    std::string out;
    while (true) {
      if (pos >= src_.size()) fail("the string is not closed", start);
      const char c = src_[pos];
      if (c == quote) break;
      if (c != '\\') {
        out += c;
        ++pos;
        continue;
      }
      if (pos + 1 >= src_.size()) fail("the string is not closed", start);
      const char e = src_[pos + 1];
      pos += 2;
      switch (e) {
        case '\n': break;  // a line continuation
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const std::size_t width = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          char32_t code = 0;
          for (std::size_t k = 0; k < width; ++k) {
            const int h = pos + k < src_.size() ? hex_value(src_[pos + k]) : -1;
            if (h < 0) fail(format("a \\{} escape needs {} hexadecimal digits", e, width), pos - 2);
            code = code * 16 + static_cast<char32_t>(h);
          }
          if (code > 0x10FFFF) fail("the escape is past U+10FFFF", pos - 2);
          pos += width;
          python::append_utf8(out, code);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            // Up to three octal digits.
            char32_t code = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && pos < src_.size() && src_[pos] >= '0' && src_[pos] <= '7'; ++k) {
              code = code * 8 + static_cast<char32_t>(src_[pos++] - '0');
            }
            python::append_utf8(out, code);
          } else {
            // Python keeps an unknown escape as it is written.
            out += '\\';
            out += e;
          }
      }
    }
    push(token_type::string, std::move(out), start);
    return pos + 1;
  }

  std::size_t lex_operator(std::size_t pos, std::string& balance) {
    static constexpr std::string_view two_char[] = {"//", "**", "==", "!=", "<=", ">="};
    for (const std::string_view op : two_char) {
      if (src_.compare(pos, 2, op) == 0) {
        push(token_type::op, std::string(op), pos);
        return pos + 2;
      }
    }
    const char c = src_[pos];
    static constexpr std::string_view single = "+-/*%~[](){}<>=.:|,;";
    if (single.find(c) == std::string_view::npos) {
      const std::size_t n = std::max<std::size_t>(1, utf8::valid_length(src_, pos));
      fail(format("unexpected character '{}'", src_.substr(pos, n)), pos);
    }
    if (c == '(' || c == '[' || c == '{') {
      balance += c;
    } else if (c == ')' || c == ']' || c == '}') {
      const char open = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (balance.empty() || balance.back() != open) fail(format("unexpected '{}'", c), pos);
      balance.pop_back();
    }
    push(token_type::op, std::string(1, c), pos);
    return pos + 1;
  }

  std::string src_;
  std::vector<std::size_t> line_starts_;  // [lines]: the offset where each line begins
  std::vector<token> tokens_;
};

}  // namespace

std::vector<token> tokenize(std::string_view source) { return lexer(source).run(); }

}  // namespace edge::backend::jinja
