// The template's tokens, with Jinja's whitespace rules applied to the text between tags as the
// transformers environment sets them: the source's line breaks become "\n" and one at its end
// is dropped (Python's splitlines), trim_blocks drops the first newline after a block or comment
// tag, lstrip_blocks drops the spaces and tabs before a block or comment tag that starts its line,
// "-" next to a delimiter drops all whitespace on that side and "+" after "{%" keeps it.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace edge::backend::jinja {

enum class token_type : std::uint8_t {
  text,         // template text between tags (value: the text)
  var_begin,    // {{
  var_end,      // }}
  block_begin,  // {%
  block_end,    // %}
  name,
  string,    // value: the literal's text, escapes resolved
  integer,   // value: the digits (underscores removed)
  floating,  // value: the literal as written (underscores removed)
  op,        // value: the operator ("+", "//", "(", ...)
  end,       // the end of the template
};

struct token {
  token_type type;
  std::string value;
  int line;
  int column;
};

// A template that cannot be read: what is wrong and where (1-based line and column, the
// column counted in characters).
struct syntax_error : std::runtime_error {
  syntax_error(const std::string& what, int at_line, int at_column)
      : std::runtime_error(what), line(at_line), column(at_column) {}
  int line;
  int column;
};

// Throws syntax_error.
std::vector<token> tokenize(std::string_view source);

}  // namespace edge::backend::jinja
