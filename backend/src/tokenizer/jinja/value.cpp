#include <simdjson.h>

#include <algorithm>
#include <cmath>

#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/common/json_text.h"
#include "python_text.h"
#include "values.h"

namespace edge::backend::jinja {
namespace {

// Containers nested deeper than this are refused where they are compared or written (a value
// can contain itself through a namespace or append()).
constexpr int max_value_depth = 512;

value from_element(simdjson::dom::element e) {
  using type = simdjson::dom::element_type;
  switch (e.type()) {
    case type::OBJECT: {
      auto d = value::dict();
      for (const auto field : simdjson::dom::object(e)) d.as_dict().set(std::string(field.key), from_element(field.value));
      return d;
    }
    case type::ARRAY: {
      std::vector<value> items;
      for (const auto item : simdjson::dom::array(e)) items.push_back(from_element(item));
      return value::list(std::move(items));
    }
    case type::STRING: return value(std::string(std::string_view(e)));
    case type::INT64: return value(static_cast<std::int64_t>(e));
    case type::UINT64: return value(static_cast<double>(static_cast<std::uint64_t>(e)));
    case type::DOUBLE: return value(static_cast<double>(e));
    case type::BOOL: return value(static_cast<bool>(e));
    case type::NULL_VALUE: return value::none();
  }
  return value::none();
}

bool is_numeric(const value& v) {
  const auto t = v.type();
  return t == value::kind::boolean || t == value::kind::integer || t == value::kind::floating;
}

double numeric(const value& v) {
  switch (v.type()) {
    case value::kind::boolean: return v.as_bool() ? 1.0 : 0.0;
    case value::kind::integer: return static_cast<double>(v.as_int());
    default: return v.as_float();
  }
}

bool is_sequence(const value& v) { return v.type() == value::kind::list; }

// Writes containers, guarding against values that contain themselves and against output that
// outgrows its limit.
class writer {
 public:
  writer(std::string& out, std::size_t limit) : out_(out), limit_(limit) {}

  bool text(const value& v) {
    if (v.type() == value::kind::string) {
      out_ += v.as_string();
      return fits();
    }
    return repr(v, true);
  }

  bool repr(const value& v, bool as_str = false) {
    switch (v.type()) {
      case value::kind::undefined: out_ += as_str ? "" : "Undefined"; break;
      case value::kind::none: out_ += "None"; break;
      case value::kind::boolean: out_ += v.as_bool() ? "True" : "False"; break;
      case value::kind::integer: out_ += std::to_string(v.as_int()); break;
      case value::kind::floating: out_ += python::float_repr(v.as_float()); break;
      case value::kind::string: python::append_repr(out_, v.as_string()); break;
      case value::kind::function: out_ += "<function " + v.as_function().name + ">"; break;
      case value::kind::list: {
        const list_data& l = v.as_list();
        if (!enter(&l)) {
          out_ += l.tuple ? "(...)" : "[...]";
          break;
        }
        out_ += l.tuple ? '(' : '[';
        for (std::size_t i = 0; i < l.items.size(); ++i) {
          if (i) out_ += ", ";
          if (!repr(l.items[i])) return false;
        }
        if (l.tuple && l.items.size() == 1) out_ += ',';
        out_ += l.tuple ? ')' : ']';
        leave();
        break;
      }
      case value::kind::dict: {
        const dict_data& d = v.as_dict();
        if (!enter(&d)) {
          out_ += "{...}";
          break;
        }
        if (d.is_namespace) out_ += "<Namespace ";
        out_ += '{';
        for (std::size_t i = 0; i < d.items.size(); ++i) {
          if (i) out_ += ", ";
          python::append_repr(out_, d.items[i].first);
          out_ += ": ";
          if (!repr(d.items[i].second)) return false;
        }
        out_ += '}';
        if (d.is_namespace) out_ += '>';
        leave();
        break;
      }
    }
    return fits();
  }

  bool json(const value& v, const json_options& o, int level) {
    switch (v.type()) {
      case value::kind::none: out_ += "null"; break;
      case value::kind::boolean: out_ += v.as_bool() ? "true" : "false"; break;
      case value::kind::integer: out_ += std::to_string(v.as_int()); break;
      case value::kind::floating: {
        const double d = v.as_float();
        if (std::isnan(d)) {
          out_ += "NaN";
        } else if (std::isinf(d)) {
          out_ += d > 0 ? "Infinity" : "-Infinity";
        } else {
          out_ += python::float_repr(d);
        }
        break;
      }
      case value::kind::string: json_string(v.as_string(), o); break;
      case value::kind::list: {
        const list_data& l = v.as_list();
        if (!enter(&l)) fail("Circular reference detected");
        if (l.items.empty()) {
          out_ += "[]";
        } else {
          out_ += '[';
          for (std::size_t i = 0; i < l.items.size(); ++i) {
            if (i) out_ += o.item_separator;
            newline(o, level + 1);
            if (!json(l.items[i], o, level + 1)) return false;
          }
          newline(o, level);
          out_ += ']';
        }
        leave();
        break;
      }
      case value::kind::dict: {
        const dict_data& d = v.as_dict();
        if (d.is_namespace) fail("Object of type Namespace is not JSON serializable");
        if (!enter(&d)) fail("Circular reference detected");
        if (d.items.empty()) {
          out_ += "{}";
        } else {
          std::vector<const std::pair<std::string, value>*> fields;
          for (const auto& field : d.items) fields.push_back(&field);
          if (o.sort_keys) {
            std::stable_sort(fields.begin(), fields.end(), [](auto* a, auto* b) { return a->first < b->first; });
          }
          out_ += '{';
          for (std::size_t i = 0; i < fields.size(); ++i) {
            if (i) out_ += o.item_separator;
            newline(o, level + 1);
            json_string(fields[i]->first, o);
            out_ += o.key_separator;
            if (!json(fields[i]->second, o, level + 1)) return false;
          }
          newline(o, level);
          out_ += '}';
        }
        leave();
        break;
      }
      case value::kind::undefined: fail("Object of type Undefined is not JSON serializable");
      case value::kind::function: fail("Object of type function is not JSON serializable");
    }
    return fits();
  }

 private:
  bool fits() const { return out_.size() <= limit_; }

  bool enter(const void* container) {
    if (std::find(open_.begin(), open_.end(), container) != open_.end()) return false;
    if (static_cast<int>(open_.size()) >= max_value_depth) fail("the value is nested too deeply");
    open_.push_back(container);
    return true;
  }
  void leave() { open_.pop_back(); }

  void newline(const json_options& o, int level) {
    if (!o.indent) return;
    out_ += '\n';
    for (int i = 0; i < level; ++i) out_ += *o.indent;
  }

  void json_string(const std::string& s, const json_options& o) {
    if (!o.ensure_ascii) {
      append_json_string(out_, s, json_escaping::python);
      return;
    }
    // ensure_ascii: everything past ASCII as \uXXXX (UTF-16, surrogate pairs past U+FFFF).
    std::string plain;
    append_json_string(plain, s, json_escaping::python);
    static constexpr char hex[] = "0123456789abcdef";
    const auto unit = [&](unsigned u) {
      out_ += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out_ += hex[(u >> shift) & 0xF];
    };
    for (const char32_t c : python::code_points(plain)) {
      if (c < 0x80) {
        out_ += static_cast<char>(c);
      } else if (c < 0x10000) {
        unit(c);
      } else {
        const char32_t v = c - 0x10000;
        unit(0xD800 + (v >> 10));
        unit(0xDC00 + (v & 0x3FF));
      }
    }
  }

  std::string& out_;
  std::size_t limit_;
  std::vector<const void*> open_;  // the containers being written, outermost first
};

}  // namespace

// ---- value ----------------------------------------------------------------------------------------

const value* dict_data::find(std::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void dict_data::set(std::string key, value v) {
  for (auto& [k, existing] : items) {
    if (k == key) {
      existing = std::move(v);
      return;
    }
  }
  items.emplace_back(std::move(key), std::move(v));
}

value::value(marked_text t) : data_(text{std::move(t.text), nullptr, false}) {
  text& string = std::get<text>(data_);
  if (t.markup.empty()) return;
  if (t.markup.covers(0, string.bytes.size())) {
    string.all = true;
  } else {
    string.part = std::make_shared<const byte_ranges>(std::move(t.markup));
  }
}

value value::markup(std::string s) {
  const bool any = !s.empty();
  return value(text{std::move(s), nullptr, any});
}

value value::list(std::vector<value> items) {
  auto l = std::make_shared<list_data>();
  l->items = std::move(items);
  return value(std::move(l));
}

value value::tuple(std::vector<value> items) {
  auto l = std::make_shared<list_data>();
  l->items = std::move(items);
  l->tuple = true;
  return value(std::move(l));
}

value value::dict(std::vector<std::pair<std::string, value>> items) {
  auto d = std::make_shared<dict_data>();
  d->items = std::move(items);
  return value(std::move(d));
}

bool value::same_object(const value& other) const {
  if (type() != other.type()) return false;
  if (type() == kind::list) return &as_list() == &other.as_list();
  if (type() == kind::dict) return &as_dict() == &other.as_dict();
  if (type() == kind::function) return &as_function() == &other.as_function();
  return false;
}

result<value> value::from_json(std::string_view json) {
  simdjson::dom::parser parser;
  EDGE_ASSIGN_OR_RETURN(const simdjson::dom::element root, parse_json(parser, json));
  return from_element(root);
}

std::string to_text(const value& v) {
  std::string out;
  append_text(out, v, unlimited);
  return out;
}

result<std::string> to_json(const value& v, std::optional<std::int64_t> indent) {
  const json_options options =
      indent ? json_indented(std::string(static_cast<std::size_t>(std::clamp<std::int64_t>(*indent, 0, 64)), ' '))
             : json_options{};
  std::string out;
  try {
    append_json(out, v, options, unlimited);
  } catch (const render_failure& e) {
    return invalid_argument(e.what());
  }
  return out;
}

// ---- Python's rules ----------------------------------------------------------------------------

void fail(const std::string& message) { throw render_failure(message); }

const value* call_args::find(std::size_t index, std::string_view name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [key, v] : keywords) {
    if (key == name) return &v;
  }
  return nullptr;
}

value make_function(std::string name, std::function<value(interpreter&, const call_args&)> call) {
  auto f = std::make_shared<function_data>();
  f->name = std::move(name);
  f->call = std::move(call);
  return value::function(std::move(f));
}

std::string_view type_name(const value& v) {
  switch (v.type()) {
    case value::kind::undefined: return "Undefined";
    case value::kind::none: return "NoneType";
    case value::kind::boolean: return "bool";
    case value::kind::integer: return "int";
    case value::kind::floating: return "float";
    case value::kind::string: return "str";
    case value::kind::list: return v.as_list().tuple ? "tuple" : "list";
    case value::kind::dict: return v.as_dict().is_namespace ? "Namespace" : "dict";
    case value::kind::function: return "function";
  }
  return "object";
}

bool truthy(const value& v) {
  switch (v.type()) {
    case value::kind::undefined:
    case value::kind::none: return false;
    case value::kind::boolean: return v.as_bool();
    case value::kind::integer: return v.as_int() != 0;
    case value::kind::floating: return v.as_float() != 0.0;
    case value::kind::string: return !v.as_string().empty();
    case value::kind::list: return !v.as_list().items.empty();
    case value::kind::dict: return v.as_dict().is_namespace || !v.as_dict().items.empty();
    case value::kind::function: return true;
  }
  return false;
}

bool equal(const value& a, const value& b, int depth) {
  if (depth > max_value_depth) fail("the values compared are nested too deeply");
  if (is_numeric(a) && is_numeric(b)) {
    if (a.type() != value::kind::floating && b.type() != value::kind::floating) {
      const auto as_int = [](const value& v) { return v.type() == value::kind::boolean ? std::int64_t{v.as_bool()} : v.as_int(); };
      return as_int(a) == as_int(b);
    }
    return numeric(a) == numeric(b);
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case value::kind::undefined:
    case value::kind::none: return true;
    case value::kind::string: return a.as_string() == b.as_string();
    case value::kind::list: {
      const list_data& x = a.as_list();
      const list_data& y = b.as_list();
      if (&x == &y) return true;
      if (x.tuple != y.tuple || x.items.size() != y.items.size()) return false;
      for (std::size_t i = 0; i < x.items.size(); ++i) {
        if (!equal(x.items[i], y.items[i], depth + 1)) return false;
      }
      return true;
    }
    case value::kind::dict: {
      const dict_data& x = a.as_dict();
      const dict_data& y = b.as_dict();
      if (&x == &y) return true;
      if (x.is_namespace || y.is_namespace || x.items.size() != y.items.size()) return false;
      for (const auto& [key, v] : x.items) {
        const value* other = y.find(key);
        if (!other || !equal(v, *other, depth + 1)) return false;
      }
      return true;
    }
    case value::kind::function: return a.same_object(b);
    default: return false;
  }
}

int compare(const value& a, const value& b, int depth) {
  if (depth > max_value_depth) fail("the values compared are nested too deeply");
  if (a.is_undefined() || b.is_undefined()) {
    fail(a.is_undefined() ? a.undefined_message() : b.undefined_message());
  }
  if (is_numeric(a) && is_numeric(b)) {
    if (a.type() != value::kind::floating && b.type() != value::kind::floating) {
      const auto as_int = [](const value& v) { return v.type() == value::kind::boolean ? std::int64_t{v.as_bool()} : v.as_int(); };
      return as_int(a) < as_int(b) ? -1 : as_int(a) > as_int(b) ? 1 : 0;
    }
    const double x = numeric(a);
    const double y = numeric(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 orders as code points do.
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (is_sequence(a) && is_sequence(b) && a.as_list().tuple == b.as_list().tuple) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equal(x[i], y[i], depth + 1)) return compare(x[i], y[i], depth + 1);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  fail(format("'<' not supported between instances of '{}' and '{}'", type_name(a), type_name(b)));
}

json_options json_indented(std::string unit) {
  // Python's json.dumps: "," between items when indenting (the line breaks separate them).
  return json_options{.indent = std::move(unit), .item_separator = std::string(1, ','), .key_separator = ": "};
}

bool holds(const value& container, const value& target) {
  std::vector<const value*> pending{&container};
  while (!pending.empty()) {
    const value* v = pending.back();
    pending.pop_back();
    if (v->same_object(target)) return true;
    if (v->type() == value::kind::list) {
      for (const value& item : v->as_list().items) pending.push_back(&item);
    } else if (v->type() == value::kind::dict) {
      for (const auto& [key, item] : v->as_dict().items) pending.push_back(&item);
    }
  }
  return false;
}

bool append_text(std::string& out, const value& v, std::size_t limit) { return writer(out, limit).text(v); }

bool append_text(marked_text& out, const value& v, std::size_t limit) {
  if (!v.is_string()) return append_text(out.text, v, limit);
  const std::string& s = v.as_string();
  if (v.all_markup()) {
    out.append_markup(s);
  } else if (const byte_ranges* markup = v.partial_markup()) {
    out.append_part(s, *markup, 0, s.size());
  } else {
    out.append_text(s);
  }
  return out.text.size() <= limit;
}

value substring(const value& s, std::size_t begin, std::size_t end) {
  const std::string& whole = s.as_string();
  if (s.all_markup()) return value::markup(whole.substr(begin, end - begin));
  const byte_ranges* markup = s.partial_markup();
  if (markup == nullptr) return value(whole.substr(begin, end - begin));
  marked_text part;
  part.append_part(whole, *markup, begin, end);
  return value(std::move(part));
}

bool only_markup(const value& v) {
  switch (v.type()) {
    case value::kind::undefined:
    case value::kind::none:
    case value::kind::boolean:
    case value::kind::integer:
    case value::kind::floating: return true;
    case value::kind::string: return v.as_string().empty() || v.all_markup();
    default: return false;
  }
}

value computed_from(value result, const value& operand, const call_args& args) {
  if (!result.is_string() || result.all_markup() || result.partial_markup() != nullptr || result.as_string().empty()) {
    return result;
  }
  if (!only_markup(operand)) return result;
  if (!std::all_of(args.positional.begin(), args.positional.end(), only_markup)) return result;
  for (const auto& [key, v] : args.keywords) {
    if (!only_markup(v)) return result;
  }
  return value::markup(result.as_string());
}

bool append_repr(std::string& out, const value& v, std::size_t limit) { return writer(out, limit).repr(v); }

bool append_json(std::string& out, const value& v, const json_options& options, std::size_t limit) {
  return writer(out, limit).json(v, options, 0);
}

}  // namespace edge::backend::jinja
