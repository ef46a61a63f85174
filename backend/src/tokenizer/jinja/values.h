// What the renderer needs to know about values: Python's truth, equality, ordering, str(),
// repr() and json.dumps, the names of types in error messages, and how functions are called.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "edge/backend/tokenizer/jinja.h"

namespace edge::backend::jinja {

// A render that cannot go on (Python raised, a limit was reached): caught where the render
// began and returned as its error, with the line of the template being rendered.
struct render_failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const std::string& message);

class interpreter;

struct call_args {
  std::vector<value> positional;
  std::vector<std::pair<std::string, value>> keywords;

  // Positional argument `index`, else the keyword `name`, else nullptr.
  const value* find(std::size_t index, std::string_view name) const;
  value get(std::size_t index, std::string_view name, value fallback) const {
    const value* v = find(index, name);
    return v ? *v : std::move(fallback);
  }
};

struct function_data {
  std::string name;
  std::function<value(interpreter&, const call_args&)> call;
};

value make_function(std::string name, std::function<value(interpreter&, const call_args&)> call);

// Python's type name: 'str', 'int', 'list', 'dict', 'NoneType', 'Undefined', ...
std::string_view type_name(const value& v);

bool truthy(const value& v);
// ==, as Python compares (1 == 1.0 == True; a list never equals a tuple). `depth` guards against
// self-containing values.
bool equal(const value& a, const value& b, int depth = 0);
// <, <= ...: -1, 0 or 1 for numbers, strings and sequences; render_failure for anything else.
int compare(const value& a, const value& b, int depth = 0);

// Whether `container` is `target` or holds it at any depth: putting it into `target` would make
// a value that holds itself (which nothing could write or free).
bool holds(const value& container, const value& target);

// The limit on a text being written: writing stops (and answers false) once it is passed.
inline constexpr std::size_t unlimited = static_cast<std::size_t>(-1);

// str(v) (what {{ v }} prints), repr(v), and json.dumps as transformers' tojson calls it.
bool append_text(std::string& out, const value& v, std::size_t limit);
// str(v) with its markup: a string's own; what any other value prints is ordinary text.
bool append_text(marked_text& out, const value& v, std::size_t limit);
bool append_repr(std::string& out, const value& v, std::size_t limit);

// The bytes [begin, end) of the string `s`, with their markup.
value substring(const value& s, std::size_t begin, std::size_t end);
// Whether `v` could be the whole of a computation on the template's own markup: a string that is
// markup throughout (or empty), a number, a boolean, none or undefined.
bool only_markup(const value& v);
// A string a filter or a method computed from `operand` and `args` alone: markup throughout when
// every one of them is only_markup, else as it is.
value computed_from(value result, const value& operand, const call_args& args);

struct json_options {
  std::optional<std::string> indent;  // per level; nullopt: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(indent=...): `unit` per level.
json_options json_indented(std::string unit);
// false when the limit was passed; render_failure for what JSON cannot hold.
bool append_json(std::string& out, const value& v, const json_options& options, std::size_t limit);

}  // namespace edge::backend::jinja
