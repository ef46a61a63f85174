#include "interpreter.h"

#include <cmath>
#include <exception>
#include <limits>
#include <new>

#include "edge/common/format.h"
#include "edge/common/utf8.h"
#include "python_text.h"

namespace edge::backend::jinja {
namespace {

std::int64_t as_integer(const value& v) {
  return v.type() == value::kind::boolean ? std::int64_t{v.as_bool()} : v.as_int();
}

bool is_integral(const value& v) { return v.type() == value::kind::integer || v.type() == value::kind::boolean; }

double as_double(const value& v) {
  return v.type() == value::kind::floating ? v.as_float() : static_cast<double>(as_integer(v));
}

[[noreturn]] void unsupported(std::string_view op, const value& a, const value& b) {
  fail(format("unsupported operand type(s) for {}: '{}' and '{}'", op, type_name(a), type_name(b)));
}

[[noreturn]] void overflow() { fail("integer overflow: the result does not fit 64 bits"); }

std::int64_t add_checked(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}
std::int64_t sub_checked(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_sub_overflow(a, b, &r)) overflow();
  return r;
}
std::int64_t mul_checked(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}

}  // namespace

// ---- scopes -----------------------------------------------------------------------------------

const value* scope::find(std::string_view name) const {
  for (const auto& [key, v] : variables) {
    if (key == name) return &v;
  }
  return nullptr;
}

void scope::set(const std::string& name, value v) {
  for (auto& [key, existing] : variables) {
    if (key == name) {
      existing = std::move(v);
      return;
    }
  }
  variables.emplace_back(name, std::move(v));
}

// ---- the interpreter --------------------------------------------------------------------------

interpreter::interpreter(const value& globals, const render_options& options) : globals_(globals), options_(options) {}

interpreter::guard::guard(interpreter& in, const node& n)
    : in_(in), line_(in.line_), uncaught_(std::uncaught_exceptions()) {
  if (++in.steps_ > in.options_.limits.max_steps) {
    fail(format("the template ran for more than {} steps", in.options_.limits.max_steps));
  }
  if (++in.depth_ > in.options_.limits.max_depth) {
    fail(format("the template nests calls or expressions more than {} deep", in.options_.limits.max_depth));
  }
  in.line_ = n.line;
}

interpreter::guard::~guard() {
  --in_.depth_;
  // While a failure unwinds, the line where it happened stays for its message.
  if (std::uncaught_exceptions() == uncaught_) in_.line_ = line_;
}

marked_text interpreter::run(const node& root) {
  auto top = std::make_shared<scope>();
  marked_text out;
  exec_body(root, top, out);
  return out;
}

void interpreter::check_size(std::size_t size) const {
  if (size > options_.limits.max_output_bytes) {
    fail(format("the template's text or a value it builds would pass {} bytes", options_.limits.max_output_bytes));
  }
}

void interpreter::append_output(marked_text& out, const value& v) {
  if (!append_text(out, v, options_.limits.max_output_bytes)) check_size(out.text.size());
}

interpreter::flow interpreter::exec_body(const node& body, const scope_ptr& s, marked_text& out) {
  for (const auto& statement : body.children) {
    const flow f = exec(*statement, s, out);
    if (f != flow::normal) return f;
  }
  return flow::normal;
}

interpreter::flow interpreter::exec(const node& n, const scope_ptr& s, marked_text& out) {
  const guard g(*this, n);
  switch (n.kind) {
    case node_kind::text: append_output(out, n.literal); return flow::normal;
    case node_kind::output: append_output(out, eval(*n.children[0], s)); return flow::normal;
    case node_kind::body: return exec_body(n, s, out);
    case node_kind::if_block:
      if (truthy(eval(*n.children[0], s))) return exec_body(*n.children[1], s, out);
      if (n.children[2]) return exec_body(*n.children[2], s, out);
      return flow::normal;
    case node_kind::for_block: return exec_for(n, s, out);
    case node_kind::set: exec_set(*n.children[0], s, eval(*n.children[1], s)); return flow::normal;
    case node_kind::set_block: {
      marked_text captured;
      exec_body(*n.children[1], s, captured);
      value v(std::move(captured));
      if (const node* filters = n.children[2].get()) {
        // The chain's innermost filter has no operand: it takes the block's text.
        std::vector<const node*> chain;
        for (const node* f = filters; f != nullptr; f = f->children[0].get()) chain.push_back(f);
        for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
          v = apply_filter((*it)->text, v, eval_arguments(**it, 1, s));
        }
      }
      exec_set(*n.children[0], s, std::move(v));
      return flow::normal;
    }
    case node_kind::macro: {
      // The macro sees the scope it was defined in (weakly: a scope holds its macros).
      std::weak_ptr<scope> closure = s;
      const node* definition = &n;
      s->set(n.text, make_function(n.text, [definition, closure](interpreter& in, const call_args& args) {
               const scope_ptr defined_in = closure.lock();
               if (!defined_in) fail(format("macro '{}' is called after its scope ended", definition->text));
               return in.call_macro(*definition, defined_in, args);
             }));
      return flow::normal;
    }
    case node_kind::call_block: {
      std::weak_ptr<scope> closure = s;
      const node* block = &n;
      value caller = make_function("caller", [block, closure](interpreter& in, const call_args& args) {
        const scope_ptr defined_in = closure.lock();
        if (!defined_in) fail("caller() is called after its scope ended");
        return in.call_macro(*block, defined_in, args);
      });
      const node& call = *n.children[0];
      const value callee = eval(*call.children[0], s);
      call_args args = eval_arguments(call, 1, s);
      args.keywords.emplace_back("caller", std::move(caller));
      if (callee.type() != value::kind::function) fail(format("'{}' object is not callable", type_name(callee)));
      append_output(out, callee.as_function().call(*this, args));
      return flow::normal;
    }
    case node_kind::filter_block: {
      marked_text captured;
      exec_body(*n.children[1], s, captured);
      value v(std::move(captured));
      std::vector<const node*> chain;
      for (const node* f = n.children[0].get(); f != nullptr; f = f->children[0].get()) chain.push_back(f);
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) v = apply_filter((*it)->text, v, eval_arguments(**it, 1, s));
      append_output(out, v);
      return flow::normal;
    }
    case node_kind::with_block: {
      auto inner = std::make_shared<scope>();
      inner->parent = s;
      for (std::size_t i = 0; i < n.names.size(); ++i) inner->set(n.names[i], eval(*n.children[i], s));
      return exec_body(*n.children.back(), inner, out);
    }
    case node_kind::break_loop: return flow::break_loop;
    case node_kind::continue_loop: return flow::continue_loop;
    default: fail("an expression where a statement belongs");
  }
}

namespace {

// What a for loop (or unpacking, list(), join) walks: a list's items, a dict's keys, a string's
// characters; nothing for undefined.
std::vector<value> iterate(const value& v) {
  switch (v.type()) {
    case value::kind::undefined: return {};
    case value::kind::list: return v.as_list().items;
    case value::kind::dict: {
      if (v.as_dict().is_namespace) fail("'Namespace' object is not iterable");
      std::vector<value> keys;
      for (const auto& [key, item] : v.as_dict().items) keys.emplace_back(key);
      return keys;
    }
    case value::kind::string: {
      std::vector<value> chars;
      const std::string& s = v.as_string();
      for (std::size_t i = 0; i < s.size();) {
        // A byte that is not valid UTF-8 stands for itself, as python::code_points reads it.
        const std::size_t n = utf8::valid_length(s, i);
        if (n == 0) {
          std::string one;
          python::append_utf8(one, static_cast<unsigned char>(s[i]));
          chars.emplace_back(std::move(one));
          ++i;
          continue;
        }
        chars.push_back(substring(v, i, i + n));
        i += n;
      }
      return chars;
    }
    default: fail(format("'{}' object is not iterable", type_name(v)));
  }
}

}  // namespace

std::vector<value> iterate_value(const value& v) { return iterate(v); }

void interpreter::exec_set(const node& target, const scope_ptr& s, value v) {
  if (target.kind == node_kind::name) {
    s->set(target.text, std::move(v));
    return;
  }
  if (target.kind == node_kind::tuple) {
    const std::vector<value> items = iterate(v);
    if (items.size() != target.names.size()) {
      fail(format("cannot unpack {} values into {} names", items.size(), target.names.size()));
    }
    for (std::size_t i = 0; i < items.size(); ++i) s->set(target.names[i], items[i]);
    return;
  }
  // ns.attribute = v
  const value object = lookup(target.children[0]->text, s);
  if (object.type() != value::kind::dict || !object.as_dict().is_namespace) {
    fail("cannot assign attribute on non-namespace object");
  }
  if (holds(v, object)) fail("a namespace cannot hold itself");
  object.as_dict().set(target.text, std::move(v));
}

interpreter::flow interpreter::exec_for(const node& n, const scope_ptr& s, marked_text& out) {
  const value iterable = eval(*n.children[0], s);
  std::vector<value> items = iterate(iterable);
  auto loop_scope = std::make_shared<scope>();
  loop_scope->parent = s;
  const auto bind = [&](const scope_ptr& into, const value& item) {
    if (n.names.size() == 1) {
      into->set(n.names[0], item);
      return;
    }
    const std::vector<value> parts = iterate(item);
    if (parts.size() != n.names.size()) fail(format("cannot unpack {} values into {} names", parts.size(), n.names.size()));
    for (std::size_t i = 0; i < parts.size(); ++i) into->set(n.names[i], parts[i]);
  };
  if (const node* condition = n.children[1].get()) {
    std::vector<value> kept;
    for (const value& item : items) {
      auto test_scope = std::make_shared<scope>();
      test_scope->parent = s;
      bind(test_scope, item);
      if (truthy(eval(*condition, test_scope))) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    if (n.children[3]) return exec_body(*n.children[3], loop_scope, out);
    return flow::normal;
  }
  const bool wants_loop = n.flag;
  const auto length = static_cast<std::int64_t>(items.size());
  for (std::int64_t i = 0; i < length; ++i) {
    const guard iteration(*this, n);  // an empty body still costs a step
    if (wants_loop) {
      auto loop = value::dict();
      dict_data& d = loop.as_dict();
      d.items.reserve(12);
      d.items.emplace_back("index", value(i + 1));
      d.items.emplace_back("index0", value(i));
      d.items.emplace_back("revindex", value(length - i));
      d.items.emplace_back("revindex0", value(length - i - 1));
      d.items.emplace_back("first", value(i == 0));
      d.items.emplace_back("last", value(i == length - 1));
      d.items.emplace_back("length", value(length));
      d.items.emplace_back("previtem", i > 0 ? items[static_cast<std::size_t>(i - 1)] : value::undefined("there is no previous item"));
      d.items.emplace_back("nextitem", i + 1 < length ? items[static_cast<std::size_t>(i + 1)] : value::undefined("there is no next item"));
      d.items.emplace_back("depth", value(1));
      d.items.emplace_back("depth0", value(0));
      d.items.emplace_back("cycle", make_function("cycle", [i](interpreter&, const call_args& args) {
                             if (args.positional.empty()) fail("no items for cycling given");
                             return args.positional[static_cast<std::size_t>(i) % args.positional.size()];
                           }));
      loop_scope->set("loop", std::move(loop));
    }
    bind(loop_scope, items[static_cast<std::size_t>(i)]);
    const flow f = exec_body(*n.children[2], loop_scope, out);
    if (f == flow::break_loop) break;
  }
  return flow::normal;
}

value interpreter::call_macro(const node& definition, const scope_ptr& closure, const call_args& args) {
  auto frame = std::make_shared<scope>();
  frame->parent = closure;
  const std::vector<std::string>& parameters = definition.names;
  std::vector<value> varargs;
  auto kwargs = value::dict();
  for (std::size_t i = 0; i < parameters.size(); ++i) frame->set(parameters[i], value::undefined(format("'{}' is undefined", parameters[i])));
  std::vector<bool> given(parameters.size(), false);
  for (std::size_t i = 0; i < args.positional.size(); ++i) {
    if (i < parameters.size()) {
      frame->set(parameters[i], args.positional[i]);
      given[i] = true;
    } else {
      varargs.push_back(args.positional[i]);
    }
  }
  for (const auto& [key, v] : args.keywords) {
    bool matched = false;
    for (std::size_t i = 0; i < parameters.size(); ++i) {
      if (parameters[i] == key) {
        if (given[i]) fail(format("macro '{}' got multiple values for argument '{}'", definition.text, key));
        frame->set(key, v);
        given[i] = true;
        matched = true;
      }
    }
    if (!matched) {
      if (key == "caller") {
        frame->set("caller", v);
      } else {
        kwargs.as_dict().set(key, v);
      }
    }
  }
  // Defaults are evaluated in the call's scope, after every argument is bound. A call block's
  // come after its call.
  const std::size_t first_default = definition.kind == node_kind::call_block ? 1 : 0;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const node* fallback = definition.children[first_default + i].get();
    if (!given[i] && fallback) frame->set(parameters[i], eval(*fallback, frame));
  }
  frame->set("varargs", value::list(std::move(varargs)));
  frame->set("kwargs", std::move(kwargs));
  marked_text out;
  exec_body(*definition.children.back(), frame, out);
  return value(std::move(out));
}

value interpreter::lookup(const std::string& name, const scope_ptr& s) {
  for (const scope* at = s.get(); at != nullptr; at = at->parent.get()) {
    if (const value* v = at->find(name)) return *v;
  }
  if (globals_.type() == value::kind::dict) {
    if (const value* v = globals_.as_dict().find(name)) return *v;
  }
  if (const value* v = builtin_global(name)) return *v;
  return value::undefined(format("'{}' is undefined", name));
}

call_args interpreter::eval_arguments(const node& n, std::size_t first, const scope_ptr& s) {
  call_args args;
  for (std::size_t i = first; i < n.children.size(); ++i) args.positional.push_back(eval(*n.children[i], s));
  for (const auto& [key, expr] : n.keywords) args.keywords.emplace_back(key, eval(*expr, s));
  return args;
}

value interpreter::eval_call(const node& n, const scope_ptr& s) {
  const value callee = eval(*n.children[0], s);
  const call_args args = eval_arguments(n, 1, s);
  if (callee.is_undefined()) fail(callee.undefined_message());
  if (callee.type() != value::kind::function) fail(format("'{}' object is not callable", type_name(callee)));
  return callee.as_function().call(*this, args);
}

value interpreter::get_attribute(const value& object, const std::string& name) {
  switch (object.type()) {
    case value::kind::undefined: fail(object.undefined_message());
    case value::kind::dict: {
      const dict_data& d = object.as_dict();
      if (!d.is_namespace) {
        if (auto m = method(object, name)) return *m;
      }
      if (const value* v = d.find(name)) return *v;
      return value::undefined(format("'{}' has no attribute '{}'", d.is_namespace ? "Namespace" : "dict object", name));
    }
    case value::kind::string:
    case value::kind::list:
      if (auto m = method(object, name)) return *m;
      break;
    default: break;
  }
  return value::undefined(format("'{}' object has no attribute '{}'", type_name(object), name));
}

value interpreter::get_item(const value& object, const value& key) {
  switch (object.type()) {
    case value::kind::undefined: fail(object.undefined_message());
    case value::kind::dict:
      if (key.is_string()) {
        if (const value* v = object.as_dict().find(key.as_string())) return *v;
        return get_attribute(object, key.as_string());
      }
      break;
    case value::kind::list:
    case value::kind::string: {
      if (is_integral(key)) {
        std::int64_t index = as_integer(key);
        if (object.type() == value::kind::list) {
          const auto& items = object.as_list().items;
          const auto size = static_cast<std::int64_t>(items.size());
          if (index < 0) index += size;
          if (index >= 0 && index < size) return items[static_cast<std::size_t>(index)];
        } else {
          const std::vector<value> chars = iterate(object);
          const auto size = static_cast<std::int64_t>(chars.size());
          if (index < 0) index += size;
          if (index >= 0 && index < size) return chars[static_cast<std::size_t>(index)];
        }
        return value::undefined(format("'{}' object has no element {}", type_name(object), as_integer(key)));
      }
      if (key.is_string()) return get_attribute(object, key.as_string());
      break;
    }
    default: break;
  }
  std::string shown;
  append_repr(shown, key, 256);
  return value::undefined(format("'{}' object has no element {}", type_name(object), shown));
}

value interpreter::slice(const value& object, const value& start, const value& stop, const value& step) {
  if (object.is_undefined()) fail(object.undefined_message());
  const bool is_list = object.type() == value::kind::list;
  if (!is_list && !object.is_string()) return value::undefined(format("'{}' object cannot be sliced", type_name(object)));
  for (const value* bound : {&start, &stop, &step}) {
    // Python: a TypeError, which Jinja's subscript turns into undefined.
    if (!bound->is_none() && !is_integral(*bound)) return value::undefined("slice indices must be integers or None");
  }
  const std::int64_t stride = step.is_none() ? 1 : as_integer(step);
  if (stride == 0) fail("slice step cannot be zero");
  std::vector<char32_t> points;
  if (!is_list) points = python::code_points(object.as_string());
  const auto length = static_cast<std::int64_t>(is_list ? object.as_list().items.size() : points.size());
  const auto adjust = [&](const value& bound, std::int64_t fallback) {
    if (bound.is_none()) return fallback;
    std::int64_t i = as_integer(bound);
    if (i < 0) {
      i += length;
      if (i < 0) i = stride < 0 ? -1 : 0;
    } else if (i >= length) {
      i = stride < 0 ? length - 1 : length;
    }
    return i;
  };
  const std::int64_t first = adjust(start, stride < 0 ? length - 1 : 0);
  const std::int64_t last = adjust(stop, stride < 0 ? -1 : length);
  std::vector<std::size_t> picked;
  for (std::int64_t i = first; stride > 0 ? i < last : i > last; i += stride) picked.push_back(static_cast<std::size_t>(i));
  if (is_list) {
    std::vector<value> items;
    items.reserve(picked.size());
    for (const std::size_t i : picked) items.push_back(object.as_list().items[i]);
    return object.as_list().tuple ? value::tuple(std::move(items)) : value::list(std::move(items));
  }
  std::string text;
  for (const std::size_t i : picked) python::append_utf8(text, points[i]);
  // A run of consecutive characters that reads as it did keeps its markup.
  if (stride == 1 && !picked.empty()) {
    const std::string& whole = object.as_string();
    std::size_t begin = 0;
    for (std::size_t k = 0; k < picked.front(); ++k) begin += std::max<std::size_t>(1, utf8::valid_length(whole, begin));
    if (std::string_view(whole).substr(begin, text.size()) == text) return substring(object, begin, begin + text.size());
  }
  return value(std::move(text));
}

value interpreter::eval_binary(binary_op op, const value& a, const value& b) {
  if (op == binary_op::concat) {
    marked_text text;
    if (!append_text(text, a, size_limit()) || !append_text(text, b, size_limit())) check_size(text.text.size());
    return value(std::move(text));
  }
  if (op == binary_op::eq) return value(equal(a, b));
  if (op == binary_op::ne) return value(!equal(a, b));
  if (op == binary_op::in || op == binary_op::not_in) {
    bool found = false;
    switch (b.type()) {
      case value::kind::undefined: break;
      case value::kind::string:
        if (!a.is_string()) fail(format("'in <string>' requires string as left operand, not {}", type_name(a)));
        found = b.as_string().find(a.as_string()) != std::string::npos;
        break;
      case value::kind::list:
        for (const value& item : b.as_list().items) {
          if (equal(item, a)) {
            found = true;
            break;
          }
        }
        break;
      case value::kind::dict:
        if (b.as_dict().is_namespace) fail("argument of type 'Namespace' is not iterable");
        found = a.is_string() && b.as_dict().find(a.as_string()) != nullptr;
        break;
      default: fail(format("argument of type '{}' is not iterable", type_name(b)));
    }
    return value(op == binary_op::in ? found : !found);
  }
  if (op == binary_op::lt || op == binary_op::le || op == binary_op::gt || op == binary_op::ge) {
    const int c = compare(a, b);
    switch (op) {
      case binary_op::lt: return value(c < 0);
      case binary_op::le: return value(c <= 0);
      case binary_op::gt: return value(c > 0);
      default: return value(c >= 0);
    }
  }
  if (a.is_undefined()) fail(a.undefined_message());
  if (b.is_undefined()) fail(b.undefined_message());
  const bool numbers = (a.is_number() || a.type() == value::kind::boolean) && (b.is_number() || b.type() == value::kind::boolean);
  const bool integers = numbers && is_integral(a) && is_integral(b);
  switch (op) {
    case binary_op::add: {
      if (integers) return value(add_checked(as_integer(a), as_integer(b)));
      if (numbers) return value(as_double(a) + as_double(b));
      if (a.is_string() && b.is_string()) {
        check_size(a.as_string().size() + b.as_string().size());
        marked_text text;
        append_text(text, a, unlimited);
        append_text(text, b, unlimited);
        return value(std::move(text));
      }
      if (a.type() == value::kind::list && b.type() == value::kind::list && a.as_list().tuple == b.as_list().tuple) {
        check_size((a.as_list().items.size() + b.as_list().items.size()) * sizeof(value));
        std::vector<value> items = a.as_list().items;
        items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
        return a.as_list().tuple ? value::tuple(std::move(items)) : value::list(std::move(items));
      }
      unsupported("+", a, b);
    }
    case binary_op::sub:
      if (integers) return value(sub_checked(as_integer(a), as_integer(b)));
      if (numbers) return value(as_double(a) - as_double(b));
      unsupported("-", a, b);
    case binary_op::mul: {
      if (integers) return value(mul_checked(as_integer(a), as_integer(b)));
      if (numbers) return value(as_double(a) * as_double(b));
      const value* sequence = is_integral(b) ? &a : is_integral(a) ? &b : nullptr;
      const value* times = sequence == &a ? &b : &a;
      if (sequence && (sequence->is_string() || sequence->type() == value::kind::list)) {
        const std::int64_t n = std::max<std::int64_t>(0, as_integer(*times));
        if (sequence->is_string()) {
          const std::size_t unit = sequence->as_string().size();
          if (unit > 0 && static_cast<std::uint64_t>(n) > size_limit() / unit) check_size(size_limit() + 1);
          marked_text text;
          text.text.reserve(unit * static_cast<std::size_t>(n));
          for (std::int64_t i = 0; i < n; ++i) append_text(text, *sequence, unlimited);
          return value(std::move(text));
        }
        const std::size_t unit = sequence->as_list().items.size();
        if (unit > 0 && static_cast<std::uint64_t>(n) > size_limit() / (unit * sizeof(value))) check_size(size_limit() + 1);
        std::vector<value> items;
        for (std::int64_t i = 0; i < n; ++i) {
          items.insert(items.end(), sequence->as_list().items.begin(), sequence->as_list().items.end());
        }
        return sequence->as_list().tuple ? value::tuple(std::move(items)) : value::list(std::move(items));
      }
      unsupported("*", a, b);
    }
    case binary_op::div:
      if (!numbers) unsupported("/", a, b);
      if (as_double(b) == 0.0) fail("division by zero");
      return value(as_double(a) / as_double(b));
    case binary_op::floordiv:
      if (!numbers) unsupported("//", a, b);
      if (integers) {
        const std::int64_t x = as_integer(a);
        const std::int64_t y = as_integer(b);
        if (y == 0) fail("integer division or modulo by zero");
        if (x == std::numeric_limits<std::int64_t>::min() && y == -1) overflow();
        std::int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return value(q);
      }
      if (as_double(b) == 0.0) fail("float floor division by zero");
      return value(std::floor(as_double(a) / as_double(b)));
    case binary_op::mod:
      if (a.is_string()) return percent_format(*this, a, b);
      if (!numbers) unsupported("%", a, b);
      if (integers) {
        const std::int64_t x = as_integer(a);
        const std::int64_t y = as_integer(b);
        if (y == 0) fail("integer division or modulo by zero");
        if (y == -1) return value(std::int64_t{0});
        std::int64_t r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) r += y;
        return value(r);
      }
      {
        const double y = as_double(b);
        if (y == 0.0) fail("float modulo");
        double r = std::fmod(as_double(a), y);
        if (r != 0.0) {
          if ((y < 0) != (r < 0)) r += y;
        } else {
          r = std::copysign(0.0, y);
        }
        return value(r);
      }
    case binary_op::pow: {
      if (!numbers) unsupported("** or pow()", a, b);
      if (integers && as_integer(b) >= 0) {
        std::int64_t base = as_integer(a);
        std::int64_t exponent = as_integer(b);
        std::int64_t r = 1;
        while (exponent > 0) {
          if (exponent & 1) r = mul_checked(r, base);
          exponent >>= 1;
          if (exponent > 0) base = mul_checked(base, base);
        }
        return value(r);
      }
      const double x = as_double(a);
      const double y = as_double(b);
      if (x == 0.0 && y < 0) fail("0.0 cannot be raised to a negative power");
      const double r = std::pow(x, y);
      if (std::isnan(r) && !std::isnan(x) && !std::isnan(y)) fail("the power has no real value");
      return value(r);
    }
    default: break;
  }
  fail("unknown operator");
}

value interpreter::eval(const node& n, const scope_ptr& s) {
  const guard g(*this, n);
  switch (n.kind) {
    case node_kind::literal: return n.literal;
    case node_kind::name: return lookup(n.text, s);
    case node_kind::list:
    case node_kind::tuple: {
      std::vector<value> items;
      items.reserve(n.children.size());
      for (const auto& child : n.children) items.push_back(eval(*child, s));
      return n.kind == node_kind::list ? value::list(std::move(items)) : value::tuple(std::move(items));
    }
    case node_kind::dict: {
      auto d = value::dict();
      for (std::size_t i = 0; i + 1 < n.children.size(); i += 2) {
        const value key = eval(*n.children[i], s);
        if (!key.is_string()) fail(format("dict keys must be strings here, not '{}'", type_name(key)));
        d.as_dict().set(key.as_string(), eval(*n.children[i + 1], s));
      }
      return d;
    }
    case node_kind::getattr: return get_attribute(eval(*n.children[0], s), n.text);
    case node_kind::getitem: return get_item(eval(*n.children[0], s), eval(*n.children[1], s));
    case node_kind::slice: {
      const value object = eval(*n.children[0], s);
      const auto bound = [&](std::size_t i) { return n.children[i] ? eval(*n.children[i], s) : value::none(); };
      const value start = bound(1);
      const value stop = bound(2);
      const value step = bound(3);
      return slice(object, start, stop, step);
    }
    case node_kind::call: return eval_call(n, s);
    case node_kind::filter: {
      const value operand = eval(*n.children[0], s);
      return apply_filter(n.text, operand, eval_arguments(n, 1, s));
    }
    case node_kind::test: {
      const value operand = eval(*n.children[0], s);
      return value(apply_test(n.text, operand, eval_arguments(n, 1, s)) != n.flag);
    }
    case node_kind::negative:
    case node_kind::positive: {
      const value v = eval(*n.children[0], s);
      const bool negate = n.kind == node_kind::negative;
      if (v.is_undefined()) fail(v.undefined_message());
      if (is_integral(v)) {
        if (!negate) return value(as_integer(v));
        if (as_integer(v) == std::numeric_limits<std::int64_t>::min()) overflow();
        return value(-as_integer(v));
      }
      if (v.type() == value::kind::floating) return value(negate ? -v.as_float() : v.as_float());
      fail(format("bad operand type for unary {}: '{}'", negate ? '-' : '+', type_name(v)));
    }
    case node_kind::logical_not: return value(!truthy(eval(*n.children[0], s)));
    case node_kind::logical_and: {
      value left = eval(*n.children[0], s);
      if (!truthy(left)) return left;
      return eval(*n.children[1], s);
    }
    case node_kind::logical_or: {
      value left = eval(*n.children[0], s);
      if (truthy(left)) return left;
      return eval(*n.children[1], s);
    }
    case node_kind::binary: {
      const value left = eval(*n.children[0], s);
      const value right = eval(*n.children[1], s);
      return eval_binary(n.op, left, right);
    }
    case node_kind::compare: {
      value left = eval(*n.children[0], s);
      for (std::size_t i = 0; i < n.ops.size(); ++i) {
        value right = eval(*n.children[i + 1], s);
        if (!truthy(eval_binary(n.ops[i], left, right))) return value(false);
        left = std::move(right);
      }
      return value(true);
    }
    case node_kind::conditional:
      if (truthy(eval(*n.children[1], s))) return eval(*n.children[0], s);
      if (n.children[2]) return eval(*n.children[2], s);
      return value::undefined("the conditional expression has no else branch");
    default: fail("a statement where an expression belongs");
  }
}

// ---- the entry point --------------------------------------------------------------------------

result<marked_text> render(const program& p, const value& globals, const render_options& options) {
  if (!p) return invalid_argument("there is no template to render");
  interpreter in(globals, options);
  try {
    return in.run(*p.root());
  } catch (const render_failure& e) {
    return invalid_argument(format("line {}: {}", in.line(), e.what()));
  } catch (const std::bad_alloc&) {
    return resource_exhausted(format("line {}: the template needs more memory than there is", in.line()));
  }
}

}  // namespace edge::backend::jinja
