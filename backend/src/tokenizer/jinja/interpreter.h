// Renders a parsed template: statements append to an output string, expressions evaluate to
// values. One interpreter per render (its state belongs to the rendering thread); the program
// it walks is shared and never changed.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ast.h"
#include "values.h"

namespace edge::backend::jinja {

// A scope: a for loop's, a macro call's, a with block's, or the template's own. Jinja's `set`
// writes to the innermost; names resolve from the innermost outwards, then the globals.
struct scope {
  std::shared_ptr<scope> parent;
  std::vector<std::pair<std::string, value>> variables;

  const value* find(std::string_view name) const;
  void set(const std::string& name, value v);
};
using scope_ptr = std::shared_ptr<scope>;

class interpreter {
 public:
  interpreter(const value& globals, const render_options& options);

  marked_text run(const node& root);

  value eval(const node& n, const scope_ptr& s);

  const render_options& options() const { return options_; }
  int line() const { return line_; }
  // A string, list or output about to reach `size` (bytes, or items): a render_failure past the limit.
  void check_size(std::size_t size) const;
  std::size_t size_limit() const { return options_.limits.max_output_bytes; }
  // A macro (or a call block's caller) called with `args`, in a scope whose parent is `closure`;
  // a keyword `caller` the macro does not name becomes its `caller`.
  value call_macro(const node& definition, const scope_ptr& closure, const call_args& args);

  // Filters, tests and methods (builtins.cpp).
  value apply_filter(const std::string& name, const value& operand, const call_args& args);
  bool apply_test(const std::string& name, const value& operand, const call_args& args);
  // The attribute `name` of a str, list or dict that is a method, bound to it; nullopt when none.
  std::optional<value> method(const value& object, const std::string& name);
  // range, dict, namespace, raise_exception, strftime_now, joiner.
  const value* builtin_global(std::string_view name) const;

  // Jinja's x.name and x[key]: a dict's method or item, a string's or list's method or element,
  // undefined when there is none; using an undefined value's attribute fails.
  value get_attribute(const value& object, const std::string& name);
  value get_item(const value& object, const value& key);

 private:
  enum class flow { normal, break_loop, continue_loop };

  flow exec(const node& n, const scope_ptr& s, marked_text& out);
  flow exec_body(const node& body, const scope_ptr& s, marked_text& out);
  flow exec_for(const node& n, const scope_ptr& s, marked_text& out);
  void exec_set(const node& n, const scope_ptr& s, value v);
  void append_output(marked_text& out, const value& v);

  value lookup(const std::string& name, const scope_ptr& s);
  value eval_binary(binary_op op, const value& a, const value& b);
  value eval_call(const node& n, const scope_ptr& s);
  call_args eval_arguments(const node& n, std::size_t first, const scope_ptr& s);
  value slice(const value& object, const value& start, const value& stop, const value& step);

  // Counts a step and a level of nesting, and keeps the line being rendered for errors.
  class guard {
   public:
    guard(interpreter& in, const node& n);
    ~guard();
    guard(const guard&) = delete;
    guard& operator=(const guard&) = delete;

   private:
    interpreter& in_;
    int line_;
    int uncaught_;
  };

  const value& globals_;
  render_options options_;
  std::vector<std::pair<std::string, value>> builtins_;
  std::int64_t steps_ = 0;
  int depth_ = 0;
  int line_ = 0;  // of the node being rendered

  friend class guard;
};

// What a for loop walks: a list's items, a dict's keys, a string's characters; nothing for
// undefined.
std::vector<value> iterate_value(const value& v);

// Python's `format % args` (printf style: %s %r %d %i %f %e %g %x %o %c, flags, width, precision,
// %(name)s with a dict): the format's text keeps its markup, and so does a string a bare %s writes.
value percent_format(interpreter& in, const value& format, const value& args);

// Filters and tests the renderer knows (the parser refuses others).
bool is_filter(std::string_view name);
bool is_test(std::string_view name);

}  // namespace edge::backend::jinja
