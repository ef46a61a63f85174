// A Jinja renderer for the chat templates models ship (tokenizer_config.json "chat_template",
// chat_template.jinja, GGUF tokenizer.chat_template), behaving as Hugging Face transformers'
// chat-template environment does: Python Jinja 2 with trim_blocks and lstrip_blocks on, the
// loop-control extension (break, continue), transformers' own tojson (Python's json.dumps with
// ensure_ascii=False) and the functions raise_exception and strftime_now.
//
// A template is parsed once (parse_template: a syntax error names its line and column) into an
// immutable program that any number of threads render at once. Rendering is bounded: a render
// that would exceed its output size, evaluation steps or call depth fails, and so does one that
// calls raise_exception; every render error names the template line it happened on. What is
// supported, and what is not, is listed in README.md ("Chat templates").
//
// A render also says which bytes of its text are markup (markup.h): the template's own text and
// string literals, and the strings its caller gives as markup (value::markup: a chat's roles,
// bos_token), kept through concatenation, output, set blocks and macros, slicing and indexing,
// strip/trim, replace, split, join and both kinds of formatting. A string a filter or a method
// computes from markup and numbers alone is markup; anything else it computes is not. Every
// other byte (the strings of the globals: a client's messages, tools and arguments) is
// ordinary text, however the template moves it around.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "edge/backend/tokenizer/markup.h"
#include "edge/common/status.h"

namespace edge::backend::jinja {

class value;

// A list or a tuple (Python's), shared by reference as Python shares them.
struct list_data {
  std::vector<value> items;
  bool tuple = false;
};

// A dict (keys in insertion order, as Python's) or a namespace() object.
struct dict_data {
  std::vector<std::pair<std::string, value>> items;
  bool is_namespace = false;

  const value* find(std::string_view key) const;
  void set(std::string key, value v);
};

struct function_data;  // a built-in function, a bound method or a macro (interpreter only)

// One Jinja value. Copies of a list or a dict share it (as in Python); everything else is copied.
class value {
 public:
  enum class kind : std::uint8_t { undefined, none, boolean, integer, floating, string, list, dict, function };

  value() = default;  // undefined
  value(bool b) : data_(b) {}
  value(std::int64_t i) : data_(i) {}
  value(int i) : data_(static_cast<std::int64_t>(i)) {}
  value(double d) : data_(d) {}
  // Strings of ordinary text.
  value(std::string s) : data_(text{std::move(s), nullptr, false}) {}
  value(std::string_view s) : data_(text{std::string(s), nullptr, false}) {}
  value(const char* s) : data_(text{std::string(s), nullptr, false}) {}
  // A string whose bytes are markup where `t.markup` says.
  explicit value(marked_text t);
  // A string all of whose bytes are markup.
  static value markup(std::string s);

  static value none() { return value(none_tag{}); }
  // An undefined value, with the error that using it raises ("'foo' is undefined", "'dict
  // object' has no attribute 'bar'").
  static value undefined(std::string message) { return value(undefined_tag{std::move(message)}); }
  static value list(std::vector<value> items = {});
  static value tuple(std::vector<value> items);
  static value dict(std::vector<std::pair<std::string, value>> items = {});
  static value function(std::shared_ptr<const function_data> f) { return value(std::move(f)); }

  // A JSON document as a value: objects become dicts (keys in document order; a repeated key
  // keeps its first place and its last value, as Python's json module does), integers that fit
  // 64 bits integers, other numbers floats.
  static result<value> from_json(std::string_view json);

  kind type() const noexcept { return static_cast<kind>(data_.index()); }
  bool is_undefined() const noexcept { return type() == kind::undefined; }
  bool is_none() const noexcept { return type() == kind::none; }
  bool is_string() const noexcept { return type() == kind::string; }
  bool is_number() const noexcept { return type() == kind::integer || type() == kind::floating; }

  bool as_bool() const { return std::get<bool>(data_); }
  std::int64_t as_int() const { return std::get<std::int64_t>(data_); }
  double as_float() const { return std::get<double>(data_); }
  const std::string& as_string() const { return std::get<text>(data_).bytes; }
  // Whether every byte of a string is markup (an empty string's is not).
  bool all_markup() const { return std::get<text>(data_).all; }
  // A string's markup (byte ranges of as_string()) when some but not all of it is; else nullptr.
  const byte_ranges* partial_markup() const { return std::get<text>(data_).part.get(); }
  const std::string& undefined_message() const { return std::get<undefined_tag>(data_).message; }
  list_data& as_list() const { return *std::get<std::shared_ptr<list_data>>(data_); }
  dict_data& as_dict() const { return *std::get<std::shared_ptr<dict_data>>(data_); }
  const function_data& as_function() const { return *std::get<std::shared_ptr<const function_data>>(data_); }
  // Whether both are the same list or dict (Python's `is`).
  bool same_object(const value& other) const;

 private:
  struct undefined_tag {
    std::string message;
  };
  struct none_tag {};
  struct text {
    std::string bytes;
    std::shared_ptr<const byte_ranges> part;  // the markup when only part of the string is; else null
    bool all = false;                         // every byte is markup (the common case costs no ranges)
  };
  explicit value(text t) : data_(std::move(t)) {}
  explicit value(undefined_tag u) : data_(std::move(u)) {}
  explicit value(none_tag n) : data_(n) {}
  explicit value(std::shared_ptr<list_data> l) : data_(std::move(l)) {}
  explicit value(std::shared_ptr<dict_data> d) : data_(std::move(d)) {}
  explicit value(std::shared_ptr<const function_data> f) : data_(std::move(f)) {}

  // In the order of `kind`.
  std::variant<undefined_tag, none_tag, bool, std::int64_t, double, text, std::shared_ptr<list_data>,
               std::shared_ptr<dict_data>, std::shared_ptr<const function_data>>
      data_;
};

// What Python's str() writes for a value, as {{ v }} prints it: strings as they are, None,
// True, 1.5, [1, 'a'], {'k': None}; undefined as nothing.
std::string to_text(const value& v);

// transformers' tojson: Python's json.dumps(v, ensure_ascii=False, indent=indent) with the default
// separators (", " and ": ", or "," and ": " when indenting). An undefined value or a function
// cannot be written: the error says so.
result<std::string> to_json(const value& v, std::optional<std::int64_t> indent = std::nullopt);

struct node;  // the parsed template (parser and interpreter only)

// A parsed template: immutable, shared by copies, rendered from any thread.
class program {
 public:
  program() = default;
  explicit program(std::shared_ptr<const node> root) : root_(std::move(root)) {}
  const node* root() const noexcept { return root_.get(); }
  explicit operator bool() const noexcept { return root_ != nullptr; }

 private:
  std::shared_ptr<const node> root_;
};

// The template's program, or invalid_argument "line L, column C: what is wrong".
result<program> parse_template(std::string_view source);

struct render_limits {
  std::size_t max_output_bytes = std::size_t{32} << 20;  // also bounds every string and list the template builds
  std::int64_t max_steps = 20'000'000;                   // expressions and statements evaluated
  int max_depth = 1000;  // evaluations nested in one another (expressions, statements, macro calls)
};

struct render_options {
  render_limits limits;
  // strftime_now's clock (the local time zone, as Python's datetime.now()); empty: the system clock.
  std::function<std::chrono::system_clock::time_point()> now;
};

// The text the template renders with `globals` (a dict: messages, tools, add_generation_prompt,
// ...) and its markup, or invalid_argument "line N: what went wrong" (raise_exception's message
// as given).
result<marked_text> render(const program& p, const value& globals, const render_options& options = {});

}  // namespace edge::backend::jinja
