// Jinja's filters and tests, Python's str/list/dict methods, and the globals the transformers
// environment gives templates (range, dict, namespace, joiner, raise_exception, strftime_now).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <limits>
#include <map>

#include "edge/common/format.h"
#include "interpreter.h"
#include "python_text.h"

namespace edge::backend::jinja {
namespace {

using filter_fn = value (*)(interpreter&, const value&, const call_args&);
using test_fn = bool (*)(interpreter&, const value&, const call_args&);

bool is_integral(const value& v) { return v.type() == value::kind::integer || v.type() == value::kind::boolean; }
std::int64_t as_integer(const value& v) { return v.type() == value::kind::boolean ? std::int64_t{v.as_bool()} : v.as_int(); }
bool is_numeric(const value& v) { return is_integral(v) || v.type() == value::kind::floating; }
double as_double(const value& v) { return v.type() == value::kind::floating ? v.as_float() : static_cast<double>(as_integer(v)); }

std::string text_of(interpreter& in, const value& v) {
  std::string out;
  if (!append_text(out, v, in.size_limit())) in.check_size(out.size());
  return out;
}

bool bool_arg(const call_args& args, std::size_t index, std::string_view name, bool fallback) {
  const value* v = args.find(index, name);
  return v ? truthy(*v) : fallback;
}

std::int64_t int_arg(const call_args& args, std::size_t index, std::string_view name, std::int64_t fallback) {
  const value* v = args.find(index, name);
  if (v == nullptr || v->is_none()) return fallback;
  if (!is_integral(*v)) fail(format("'{}' must be an integer, not '{}'", name, type_name(*v)));
  return as_integer(*v);
}

// The string argument itself (with its markup), or nullptr when it is not given.
const value* string_value_arg(const call_args& args, std::size_t index, std::string_view name) {
  const value* v = args.find(index, name);
  if (v == nullptr || v->is_none() || v->is_undefined()) return nullptr;
  if (!v->is_string()) fail(format("'{}' must be a string, not '{}'", name, type_name(*v)));
  return v;
}

std::optional<std::string> string_arg(const call_args& args, std::size_t index, std::string_view name) {
  const value* v = string_value_arg(args, index, name);
  if (v == nullptr) return std::nullopt;
  return v->as_string();
}

value string_list(std::vector<std::string> parts) {
  std::vector<value> items;
  items.reserve(parts.size());
  for (auto& part : parts) items.emplace_back(std::move(part));
  return value::list(std::move(items));
}

value pair(value a, value b) { return value::tuple({std::move(a), std::move(b)}); }

std::size_t length_of(const value& v) {
  switch (v.type()) {
    case value::kind::undefined: return 0;
    case value::kind::string: return python::length(v.as_string());
    case value::kind::list: return v.as_list().items.size();
    case value::kind::dict:
      if (!v.as_dict().is_namespace) return v.as_dict().items.size();
      break;
    default: break;
  }
  fail(format("object of type '{}' has no len()", type_name(v)));
}

// Jinja's attribute paths: "a.b.0".
value attribute_path(interpreter& in, const value& item, const value& path) {
  if (is_integral(path)) return in.get_item(item, path);
  if (!path.is_string()) fail("an attribute must be a string or an integer");
  value v = item;
  for (const std::string_view part : python::split(path.as_string(), std::string_view("."), -1, false)) {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = digits && part.size() < 18 ? in.get_item(v, value(static_cast<std::int64_t>(std::stoll(std::string(part)))))
                                   : in.get_item(v, value(part));
  }
  return v;
}

// The key a sort or comparison uses: the item, or its attribute; strings lowercased unless
// case-sensitive.
value sort_key(interpreter& in, const value& item, const value* attribute, bool case_sensitive) {
  value key = attribute ? attribute_path(in, item, *attribute) : item;
  if (!case_sensitive && key.is_string()) return value(python::lower(key.as_string()));
  return key;
}

// ---- filters ------------------------------------------------------------------------------------

value f_abs(interpreter&, const value& v, const call_args&) {
  if (is_integral(v)) {
    const std::int64_t i = as_integer(v);
    if (i == std::numeric_limits<std::int64_t>::min()) fail("integer overflow: the result does not fit 64 bits");
    return value(i < 0 ? -i : i);
  }
  if (v.type() == value::kind::floating) return value(std::fabs(v.as_float()));
  fail(format("bad operand type for abs(): '{}'", type_name(v)));
}

value f_attr(interpreter& in, const value& v, const call_args& args) {
  const auto name = string_arg(args, 0, "name");
  if (!name) fail("attr needs the attribute's name");
  return in.get_attribute(v, *name);
}

value f_batch(interpreter& in, const value& v, const call_args& args) {
  const std::int64_t size = int_arg(args, 0, "linecount", 0);
  if (size <= 0) fail("batch needs a positive size");
  const value* fill = args.find(1, "fill_with");
  std::vector<value> batches;
  std::vector<value> current;
  for (const value& item : iterate_value(v)) {
    current.push_back(item);
    if (static_cast<std::int64_t>(current.size()) == size) {
      batches.push_back(value::list(std::move(current)));
      current.clear();
    }
  }
  if (!current.empty()) {
    if (fill && !fill->is_none()) {
      in.check_size(static_cast<std::size_t>(size) * sizeof(value));
      while (static_cast<std::int64_t>(current.size()) < size) current.push_back(*fill);
    }
    batches.push_back(value::list(std::move(current)));
  }
  return value::list(std::move(batches));
}

value f_capitalize(interpreter& in, const value& v, const call_args&) { return value(python::capitalize(text_of(in, v))); }

value f_center(interpreter& in, const value& v, const call_args& args) {
  const std::string text = text_of(in, v);
  const std::int64_t width = int_arg(args, 0, "width", 80);
  const auto length = static_cast<std::int64_t>(python::length(text));
  if (width <= length) return value(text);
  in.check_size(static_cast<std::size_t>(width));
  // Python: the extra space goes left when the padding is odd and the width is odd.
  const std::int64_t pad = width - length;
  const std::int64_t left = pad / 2 + (pad & width & 1);
  return value(std::string(static_cast<std::size_t>(left), ' ') + text + std::string(static_cast<std::size_t>(pad - left), ' '));
}

value f_length(interpreter&, const value& v, const call_args&) { return value(static_cast<std::int64_t>(length_of(v))); }

value f_default(interpreter&, const value& v, const call_args& args) {
  const value fallback = args.get(0, "default_value", value(""));
  const bool boolean = bool_arg(args, 1, "boolean", false);
  if (v.is_undefined() || (boolean && !truthy(v))) return fallback;
  return v;
}

value f_dictsort(interpreter& in, const value& v, const call_args& args) {
  if (v.type() != value::kind::dict || v.as_dict().is_namespace) fail(format("dictsort needs a dict, not '{}'", type_name(v)));
  const bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  const std::string by = string_arg(args, 1, "by").value_or("key");
  if (by != "key" && by != "value") fail("dictsort: 'by' must be 'key' or 'value'");
  const bool reverse = bool_arg(args, 2, "reverse", false);
  std::vector<value> items;
  for (const auto& [key, item] : v.as_dict().items) items.push_back(pair(value(key), item));
  const std::size_t index = by == "key" ? 0 : 1;
  std::stable_sort(items.begin(), items.end(), [&](const value& a, const value& b) {
    const int c = compare(sort_key(in, a.as_list().items[index], nullptr, case_sensitive),
                          sort_key(in, b.as_list().items[index], nullptr, case_sensitive));
    return reverse ? c > 0 : c < 0;
  });
  return value::list(std::move(items));
}

value f_escape(interpreter& in, const value& v, const call_args&) {
  std::string out;
  for (const char c : text_of(in, v)) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return value(std::move(out));
}

value f_first(interpreter&, const value& v, const call_args&) {
  const auto items = iterate_value(v);
  if (items.empty()) return value::undefined("No first item, sequence was empty.");
  return items.front();
}

value f_last(interpreter&, const value& v, const call_args&) {
  const auto items = iterate_value(v);
  if (items.empty()) return value::undefined("No last item, sequence was empty.");
  return items.back();
}

// Python's int(text, base) and float(text); nullopt when they would raise.
std::optional<std::int64_t> parse_int(std::string text, int base) {
  std::string_view t = python::strip(text, std::nullopt, true, true);
  bool negative = false;
  if (!t.empty() && (t.front() == '+' || t.front() == '-')) {
    negative = t.front() == '-';
    t.remove_prefix(1);
  }
  if (t.size() > 2 && t[0] == '0' && ((base == 16 && (t[1] == 'x' || t[1] == 'X')) || (base == 8 && (t[1] == 'o' || t[1] == 'O')) ||
                                      (base == 2 && (t[1] == 'b' || t[1] == 'B')))) {
    t.remove_prefix(2);
  }
  if (t.empty() || t.front() == '_' || t.back() == '_') return std::nullopt;
  std::int64_t v = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '_') {
      if (t[i - 1] == '_') return std::nullopt;
      continue;
    }
    int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'z' ? c - 'a' + 10 : c >= 'A' && c <= 'Z' ? c - 'A' + 10 : 99;
    if (digit >= base) return std::nullopt;
    if (__builtin_mul_overflow(v, base, &v) || __builtin_add_overflow(v, digit, &v)) return std::nullopt;
  }
  return negative ? -v : v;
}

std::optional<double> parse_float(const std::string& text) {
  std::string t(python::strip(text, std::nullopt, true, true));
  t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
  if (t.empty()) return std::nullopt;
  const std::string lower = python::lower(t);
  const std::string_view body = lower.front() == '-' || lower.front() == '+' ? std::string_view(lower).substr(1) : std::string_view(lower);
  const double sign = lower.front() == '-' ? -1.0 : 1.0;
  if (body == "inf" || body == "infinity") return sign * std::numeric_limits<double>::infinity();
  if (body == "nan") return std::numeric_limits<double>::quiet_NaN();
  for (const char c : body) {
    if (!((c >= '0' && c <= '9') || c == '.' || c == 'e' || c == '+' || c == '-')) return std::nullopt;
  }
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return d;
}

value f_float(interpreter&, const value& v, const call_args& args) {
  const value fallback = args.get(0, "default", value(0.0));
  if (is_numeric(v)) return value(as_double(v));
  if (v.is_string()) {
    if (const auto d = parse_float(v.as_string())) return value(*d);
  }
  return fallback;
}

value f_int(interpreter&, const value& v, const call_args& args) {
  const value fallback = args.get(0, "default", value(std::int64_t{0}));
  const std::int64_t base = int_arg(args, 1, "base", 10);
  if (is_integral(v)) return value(as_integer(v));
  if (v.type() == value::kind::floating) {
    const double d = v.as_float();
    if (std::isfinite(d) && std::fabs(d) < 9.2e18) return value(static_cast<std::int64_t>(d));
    return fallback;
  }
  if (v.is_string()) {
    if (base >= 2 && base <= 36) {
      if (const auto i = parse_int(v.as_string(), static_cast<int>(base))) return value(*i);
    }
    if (const auto d = parse_float(v.as_string()); d && std::isfinite(*d) && std::fabs(*d) < 9.2e18) {
      return value(static_cast<std::int64_t>(*d));
    }
  }
  return fallback;
}

value f_format(interpreter& in, const value& v, const call_args& args) {
  const value pattern = v.is_string() ? v : value(text_of(in, v));
  if (!args.keywords.empty()) {
    auto mapping = value::dict();
    for (const auto& [key, item] : args.keywords) mapping.as_dict().set(key, item);
    return percent_format(in, pattern, mapping);
  }
  return percent_format(in, pattern, value::tuple(args.positional));
}

value f_indent(interpreter& in, const value& v, const call_args& args) {
  const value width = args.get(0, "width", value(std::int64_t{4}));
  const bool first = bool_arg(args, 1, "first", false);
  const bool blank = bool_arg(args, 2, "blank", false);
  std::string indentation;
  if (width.is_string()) {
    indentation = width.as_string();
  } else if (is_integral(width)) {
    const std::int64_t n = as_integer(width);
    in.check_size(static_cast<std::size_t>(std::max<std::int64_t>(0, n)));
    indentation.assign(static_cast<std::size_t>(std::max<std::int64_t>(0, n)), ' ');
  } else {
    fail("indent: the width must be an integer or a string");
  }
  // Jinja appends a newline first so that splitlines keeps a trailing empty line.
  const std::vector<std::string> lines = python::splitlines(text_of(in, v) + "\n");
  std::string out;
  if (blank) {
    for (std::size_t i = 0; i < lines.size(); ++i) {
      if (i) out += "\n" + indentation;
      out += lines[i];
      in.check_size(out.size());
    }
  } else if (!lines.empty()) {
    out = lines.front();
    for (std::size_t i = 1; i < lines.size(); ++i) {
      out += '\n';
      if (!lines[i].empty()) out += indentation;
      out += lines[i];
      in.check_size(out.size());
    }
  }
  if (first) out = indentation + out;
  return value(std::move(out));
}

value f_items(interpreter&, const value& v, const call_args&) {
  if (v.is_undefined()) return value::list();
  if (v.type() != value::kind::dict || v.as_dict().is_namespace) fail(format("items needs a dict, not '{}'", type_name(v)));
  std::vector<value> items;
  for (const auto& [key, item] : v.as_dict().items) items.push_back(pair(value(key), item));
  return value::list(std::move(items));
}

value f_join(interpreter& in, const value& v, const call_args& args) {
  const value* given = string_value_arg(args, 0, "d");
  const value separator = given ? *given : value("");
  const value* attribute = args.find(1, "attribute");
  marked_text out;
  bool first = true;
  for (const value& item : iterate_value(v)) {
    if (!first) append_text(out, separator, unlimited);
    first = false;
    const value shown = attribute && !attribute->is_none() ? attribute_path(in, item, *attribute) : item;
    if (!append_text(out, shown, in.size_limit())) in.check_size(out.text.size());
    in.check_size(out.text.size());
  }
  return value(std::move(out));
}

value f_list(interpreter&, const value& v, const call_args&) { return value::list(iterate_value(v)); }

value f_lower(interpreter& in, const value& v, const call_args&) { return value(python::lower(text_of(in, v))); }
value f_upper(interpreter& in, const value& v, const call_args&) { return value(python::upper(text_of(in, v))); }

// Jinja's title filter: each word (after '-', whitespace or an opening bracket) capitalized.
value f_title(interpreter& in, const value& v, const call_args&) {
  const auto points = python::code_points(text_of(in, v));
  std::string out;
  bool word_start = true;
  std::string word;
  const auto flush = [&] {
    if (word.empty()) return;
    const auto w = python::code_points(word);
    out += python::upper(python::from_code_points(w, 0, 1));
    out += python::lower(python::from_code_points(w, 1, w.size()));
    word.clear();
  };
  for (const char32_t c : points) {
    const bool separator = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || python::is_space(c);
    if (separator) {
      flush();
      python::append_utf8(out, c);
      word_start = true;
    } else {
      python::append_utf8(word, c);
      word_start = false;
    }
  }
  flush();
  (void)word_start;
  return value(std::move(out));
}

value f_map(interpreter& in, const value& v, const call_args& args) {
  std::vector<value> out;
  if (const value* attribute = args.find(std::numeric_limits<std::size_t>::max(), "attribute")) {
    const value* fallback = args.find(std::numeric_limits<std::size_t>::max(), "default");
    for (const value& item : iterate_value(v)) {
      value mapped = attribute_path(in, item, *attribute);
      if (mapped.is_undefined() && fallback) mapped = *fallback;
      out.push_back(std::move(mapped));
    }
    return value::list(std::move(out));
  }
  if (args.positional.empty() || !args.positional.front().is_string()) fail("map needs a filter name or attribute=");
  const std::string name = args.positional.front().as_string();
  if (!is_filter(name)) fail(format("no filter named '{}'", name));
  call_args rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keywords = args.keywords;
  for (const value& item : iterate_value(v)) out.push_back(in.apply_filter(name, item, rest));
  return value::list(std::move(out));
}

value extreme(interpreter& in, const value& v, const call_args& args, bool largest) {
  const bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  const value* attribute = args.find(1, "attribute");
  if (attribute && attribute->is_none()) attribute = nullptr;
  const auto items = iterate_value(v);
  if (items.empty()) return value::undefined(largest ? "No aggregated item, sequence was empty." : "No aggregated item, sequence was empty.");
  const value* best = &items.front();
  for (const value& item : items) {
    const int c = compare(sort_key(in, item, attribute, case_sensitive), sort_key(in, *best, attribute, case_sensitive));
    if (largest ? c > 0 : c < 0) best = &item;
  }
  return *best;
}

value f_max(interpreter& in, const value& v, const call_args& args) { return extreme(in, v, args, true); }
value f_min(interpreter& in, const value& v, const call_args& args) { return extreme(in, v, args, false); }

// select / reject / selectattr / rejectattr.
value pick(interpreter& in, const value& v, const call_args& args, bool keep, bool by_attribute) {
  std::size_t next = 0;
  const value* attribute = nullptr;
  if (by_attribute) {
    attribute = args.find(next++, "attr");
    if (attribute == nullptr) fail("selectattr and rejectattr need an attribute");
  }
  std::optional<std::string> test;
  call_args test_args;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) fail("the test must be named by a string");
    test = args.positional[next].as_string();
    if (!is_test(*test)) fail(format("no test named '{}'", *test));
    test_args.positional.assign(args.positional.begin() + static_cast<std::ptrdiff_t>(next) + 1, args.positional.end());
  }
  std::vector<value> out;
  for (const value& item : iterate_value(v)) {
    const value subject = attribute ? attribute_path(in, item, *attribute) : item;
    const bool passes = test ? in.apply_test(*test, subject, test_args) : truthy(subject);
    if (passes == keep) out.push_back(item);
  }
  return value::list(std::move(out));
}

value f_select(interpreter& in, const value& v, const call_args& args) { return pick(in, v, args, true, false); }
value f_reject(interpreter& in, const value& v, const call_args& args) { return pick(in, v, args, false, false); }
value f_selectattr(interpreter& in, const value& v, const call_args& args) { return pick(in, v, args, true, true); }
value f_rejectattr(interpreter& in, const value& v, const call_args& args) { return pick(in, v, args, false, true); }

value f_replace(interpreter& in, const value& v, const call_args& args) {
  const value text = v.is_string() ? v : value(text_of(in, v));
  const value* from = args.find(0, "old");
  const value* given_to = args.find(1, "new");
  if (!from || !given_to) fail("replace needs the text to replace and its replacement");
  const std::string from_text = text_of(in, *from);
  const value to = given_to->is_string() ? *given_to : value(text_of(in, *given_to));
  const std::int64_t count = int_arg(args, 2, "count", -1);
  const std::string& whole = text.as_string();
  const std::size_t growth = from_text.empty() ? python::length(whole) + 1 : whole.size() / from_text.size();
  if (to.as_string().size() > from_text.size() && growth > 0) in.check_size(whole.size() + growth * to.as_string().size());
  // The text kept and the new text each keep their markup.
  marked_text out;
  for (const python::replaced_piece& p : python::replace_pieces(whole, from_text, count)) {
    if (p.replacement) {
      append_text(out, to, unlimited);
    } else {
      append_text(out, substring(text, p.begin, p.end), unlimited);
    }
  }
  return value(std::move(out));
}

value f_reverse(interpreter&, const value& v, const call_args&) {
  if (v.is_string()) {
    auto points = python::code_points(v.as_string());
    std::reverse(points.begin(), points.end());
    return value(python::from_code_points(points, 0, points.size()));
  }
  auto items = iterate_value(v);
  std::reverse(items.begin(), items.end());
  return value::list(std::move(items));
}

value f_round(interpreter&, const value& v, const call_args& args) {
  const std::int64_t precision = int_arg(args, 0, "precision", 0);
  const std::string method = string_arg(args, 1, "method").value_or("common");
  if (!is_numeric(v)) fail(format("round needs a number, not '{}'", type_name(v)));
  if (method != "common" && method != "ceil" && method != "floor") fail("round: the method must be common, ceil or floor");
  if (is_integral(v) && method == "common") return value(as_integer(v));
  const double scale = std::pow(10.0, static_cast<double>(std::clamp<std::int64_t>(precision, -300, 300)));
  const double x = as_double(v) * scale;
  // Python's round() rounds half to even.
  const double rounded = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
  return value(rounded / scale);
}

value f_safe(interpreter&, const value& v, const call_args&) { return v; }

value f_sort(interpreter& in, const value& v, const call_args& args) {
  const bool reverse = bool_arg(args, 0, "reverse", false);
  const bool case_sensitive = bool_arg(args, 1, "case_sensitive", false);
  const value* attribute = args.find(2, "attribute");
  if (attribute && attribute->is_none()) attribute = nullptr;
  auto items = iterate_value(v);
  std::stable_sort(items.begin(), items.end(), [&](const value& a, const value& b) {
    const int c = compare(sort_key(in, a, attribute, case_sensitive), sort_key(in, b, attribute, case_sensitive));
    return reverse ? c > 0 : c < 0;
  });
  return value::list(std::move(items));
}

value f_string(interpreter& in, const value& v, const call_args&) { return v.is_string() ? v : value(text_of(in, v)); }

value f_sum(interpreter& in, const value& v, const call_args& args) {
  const value* attribute = args.find(0, "attribute");
  if (attribute && attribute->is_none()) attribute = nullptr;
  value total = args.get(1, "start", value(std::int64_t{0}));
  for (const value& item : iterate_value(v)) {
    const value x = attribute ? attribute_path(in, item, *attribute) : item;
    if (!is_numeric(x) || !is_numeric(total)) fail(format("unsupported operand type(s) for +: '{}' and '{}'", type_name(total), type_name(x)));
    if (is_integral(x) && is_integral(total)) {
      std::int64_t r = 0;
      if (__builtin_add_overflow(as_integer(total), as_integer(x), &r)) fail("integer overflow: the result does not fit 64 bits");
      total = value(r);
    } else {
      total = value(as_double(total) + as_double(x));
    }
  }
  return total;
}

value f_tojson(interpreter& in, const value& v, const call_args& args) {
  json_options options;
  if (const value* indent = args.find(0, "indent"); indent && !indent->is_none()) {
    if (indent->is_string()) {
      options = json_indented(indent->as_string());
    } else if (is_integral(*indent)) {
      options = json_indented(std::string(static_cast<std::size_t>(std::clamp<std::int64_t>(as_integer(*indent), 0, 64)), ' '));
    } else {
      fail("tojson: indent must be an integer or a string");
    }
  }
  options.ensure_ascii = bool_arg(args, std::numeric_limits<std::size_t>::max(), "ensure_ascii", false);
  options.sort_keys = bool_arg(args, std::numeric_limits<std::size_t>::max(), "sort_keys", false);
  if (const value* separators = args.find(std::numeric_limits<std::size_t>::max(), "separators");
      separators && !separators->is_none()) {
    if (separators->type() != value::kind::list || separators->as_list().items.size() != 2 ||
        !separators->as_list().items[0].is_string() || !separators->as_list().items[1].is_string()) {
      fail("tojson: separators must be two strings");
    }
    options.item_separator = separators->as_list().items[0].as_string();
    options.key_separator = separators->as_list().items[1].as_string();
  }
  std::string out;
  if (!append_json(out, v, options, in.size_limit())) in.check_size(out.size());
  return value(std::move(out));
}

// What strip/trim leaves of a string: a part of it, with its markup.
value stripped(const value& text, const std::optional<std::string>& chars, bool left, bool right) {
  const std::string& whole = text.as_string();
  const std::string_view kept =
      python::strip(whole, chars ? std::optional<std::string_view>(*chars) : std::nullopt, left, right);
  const auto begin = static_cast<std::size_t>(kept.data() - whole.data());
  return substring(text, begin, begin + kept.size());
}

value f_trim(interpreter& in, const value& v, const call_args& args) {
  return stripped(v.is_string() ? v : value(text_of(in, v)), string_arg(args, 0, "chars"), true, true);
}

value f_unique(interpreter& in, const value& v, const call_args& args) {
  const bool case_sensitive = bool_arg(args, 0, "case_sensitive", false);
  const value* attribute = args.find(1, "attribute");
  if (attribute && attribute->is_none()) attribute = nullptr;
  std::vector<value> out;
  std::vector<value> seen;
  for (const value& item : iterate_value(v)) {
    value key = sort_key(in, item, attribute, case_sensitive);
    if (std::any_of(seen.begin(), seen.end(), [&](const value& s) { return equal(s, key); })) continue;
    seen.push_back(std::move(key));
    out.push_back(item);
  }
  return value::list(std::move(out));
}

value f_wordcount(interpreter& in, const value& v, const call_args&) {
  const std::string text = text_of(in, v);
  return value(static_cast<std::int64_t>(python::split(text, std::nullopt, -1, false).size()));
}

const std::map<std::string, filter_fn, std::less<>>& filters() {
  static const std::map<std::string, filter_fn, std::less<>> table = {
      {"abs", f_abs},         {"attr", f_attr},           {"batch", f_batch},       {"capitalize", f_capitalize},
      {"center", f_center},   {"count", f_length},        {"d", f_default},         {"default", f_default},
      {"dictsort", f_dictsort}, {"e", f_escape},          {"escape", f_escape},     {"first", f_first},
      {"float", f_float},     {"format", f_format},       {"indent", f_indent},     {"int", f_int},
      {"items", f_items},     {"join", f_join},           {"last", f_last},         {"length", f_length},
      {"list", f_list},       {"lower", f_lower},         {"map", f_map},           {"max", f_max},
      {"min", f_min},         {"reject", f_reject},       {"rejectattr", f_rejectattr}, {"replace", f_replace},
      {"reverse", f_reverse}, {"round", f_round},         {"safe", f_safe},         {"select", f_select},
      {"selectattr", f_selectattr}, {"sort", f_sort},     {"string", f_string},     {"sum", f_sum},
      {"title", f_title},     {"tojson", f_tojson},       {"trim", f_trim},         {"unique", f_unique},
      {"upper", f_upper},     {"wordcount", f_wordcount},
  };
  return table;
}

// ---- tests --------------------------------------------------------------------------------------

const value& test_arg(const call_args& args) {
  if (args.positional.empty()) fail("the test needs an argument");
  return args.positional.front();
}

bool t_defined(interpreter&, const value& v, const call_args&) { return !v.is_undefined(); }
bool t_undefined(interpreter&, const value& v, const call_args&) { return v.is_undefined(); }
bool t_none(interpreter&, const value& v, const call_args&) { return v.is_none(); }
bool t_boolean(interpreter&, const value& v, const call_args&) { return v.type() == value::kind::boolean; }
bool t_false(interpreter&, const value& v, const call_args&) { return v.type() == value::kind::boolean && !v.as_bool(); }
bool t_true(interpreter&, const value& v, const call_args&) { return v.type() == value::kind::boolean && v.as_bool(); }
bool t_integer(interpreter&, const value& v, const call_args&) { return v.type() == value::kind::integer; }
bool t_float(interpreter&, const value& v, const call_args&) { return v.type() == value::kind::floating; }
bool t_number(interpreter&, const value& v, const call_args&) { return is_numeric(v); }
bool t_string(interpreter&, const value& v, const call_args&) { return v.is_string(); }
bool t_mapping(interpreter&, const value& v, const call_args&) {
  return v.type() == value::kind::dict && !v.as_dict().is_namespace;
}
bool t_sequence(interpreter&, const value& v, const call_args&) {
  return v.is_string() || v.type() == value::kind::list || (v.type() == value::kind::dict && !v.as_dict().is_namespace);
}
bool t_iterable(interpreter&, const value& v, const call_args&) {
  return v.is_undefined() || v.is_string() || v.type() == value::kind::list ||
         (v.type() == value::kind::dict && !v.as_dict().is_namespace);
}
bool t_callable(interpreter&, const value& v, const call_args&) { return v.type() == value::kind::function; }

std::int64_t remainder_by(const value& v, std::int64_t divisor) {
  if (v.is_undefined()) fail(v.undefined_message());
  if (!is_integral(v)) fail(format("'{}' is not an integer", type_name(v)));
  if (divisor == 0) fail("integer division or modulo by zero");
  const std::int64_t r = divisor == -1 ? 0 : as_integer(v) % divisor;
  return r;
}

bool t_odd(interpreter&, const value& v, const call_args&) { return remainder_by(v, 2) != 0; }
bool t_even(interpreter&, const value& v, const call_args&) { return remainder_by(v, 2) == 0; }
bool t_divisibleby(interpreter&, const value& v, const call_args& args) {
  const value& d = test_arg(args);
  if (!is_integral(d)) fail("divisibleby needs an integer");
  return remainder_by(v, as_integer(d)) == 0;
}
bool t_eq(interpreter&, const value& v, const call_args& args) { return equal(v, test_arg(args)); }
bool t_ne(interpreter&, const value& v, const call_args& args) { return !equal(v, test_arg(args)); }
bool t_lt(interpreter&, const value& v, const call_args& args) { return compare(v, test_arg(args)) < 0; }
bool t_le(interpreter&, const value& v, const call_args& args) { return compare(v, test_arg(args)) <= 0; }
bool t_gt(interpreter&, const value& v, const call_args& args) { return compare(v, test_arg(args)) > 0; }
bool t_ge(interpreter&, const value& v, const call_args& args) { return compare(v, test_arg(args)) >= 0; }
bool t_in(interpreter&, const value& v, const call_args& args) {
  const value& seq = test_arg(args);
  if (seq.is_string() && v.is_string()) return seq.as_string().find(v.as_string()) != std::string::npos;
  if (seq.type() == value::kind::dict) return v.is_string() && seq.as_dict().find(v.as_string()) != nullptr;
  for (const value& item : iterate_value(seq)) {
    if (equal(item, v)) return true;
  }
  return false;
}
bool t_sameas(interpreter&, const value& v, const call_args& args) {
  const value& other = test_arg(args);
  if (v.type() == value::kind::list || v.type() == value::kind::dict || v.type() == value::kind::function) return v.same_object(other);
  return v.type() == other.type() && equal(v, other);
}
bool t_lower(interpreter& in, const value& v, const call_args&) { return python::is_lower(text_of(in, v)); }
bool t_upper(interpreter& in, const value& v, const call_args&) { return python::is_upper(text_of(in, v)); }
bool t_escaped(interpreter&, const value&, const call_args&) { return false; }
bool t_filter(interpreter&, const value& v, const call_args&) { return v.is_string() && is_filter(v.as_string()); }
bool t_test(interpreter&, const value& v, const call_args&) { return v.is_string() && is_test(v.as_string()); }

const std::map<std::string, test_fn, std::less<>>& tests() {
  static const std::map<std::string, test_fn, std::less<>> table = {
      {"boolean", t_boolean},   {"callable", t_callable},   {"defined", t_defined},   {"divisibleby", t_divisibleby},
      {"eq", t_eq},             {"equalto", t_eq},          {"==", t_eq},             {"escaped", t_escaped},
      {"even", t_even},         {"false", t_false},         {"filter", t_filter},     {"float", t_float},
      {"ge", t_ge},             {">=", t_ge},               {"gt", t_gt},             {">", t_gt},
      {"greaterthan", t_gt},    {"in", t_in},               {"integer", t_integer},   {"iterable", t_iterable},
      {"le", t_le},             {"<=", t_le},               {"lower", t_lower},       {"lt", t_lt},
      {"<", t_lt},              {"lessthan", t_lt},         {"mapping", t_mapping},   {"ne", t_ne},
      {"!=", t_ne},             {"none", t_none},           {"number", t_number},     {"odd", t_odd},
      {"sameas", t_sameas},     {"sequence", t_sequence},   {"string", t_string},     {"test", t_test},
      {"true", t_true},         {"undefined", t_undefined}, {"upper", t_upper},
  };
  return table;
}

// ---- methods ------------------------------------------------------------------------------------

using method_fn = value (*)(interpreter&, const value& self, const call_args&);

value m_strip(interpreter&, const value& self, const call_args& args, bool left, bool right) {
  return stripped(self, string_arg(args, 0, "chars"), left, right);
}
value m_strip_both(interpreter& in, const value& self, const call_args& args) { return m_strip(in, self, args, true, true); }
value m_lstrip(interpreter& in, const value& self, const call_args& args) { return m_strip(in, self, args, true, false); }
value m_rstrip(interpreter& in, const value& self, const call_args& args) { return m_strip(in, self, args, false, true); }

value m_split(interpreter&, const value& self, const call_args& args, bool from_right) {
  const auto sep = string_arg(args, 0, "sep");
  if (sep && sep->empty()) fail("empty separator");
  const std::int64_t maxsplit = int_arg(args, 1, "maxsplit", -1);
  const std::string& whole = self.as_string();
  std::vector<value> parts;
  for (const std::string_view part : python::split(whole, sep ? std::optional<std::string_view>(*sep) : std::nullopt, maxsplit, from_right)) {
    const auto begin = static_cast<std::size_t>(part.data() - whole.data());
    parts.push_back(substring(self, begin, begin + part.size()));
  }
  return value::list(std::move(parts));
}
value m_split_left(interpreter& in, const value& self, const call_args& args) { return m_split(in, self, args, false); }
value m_rsplit(interpreter& in, const value& self, const call_args& args) { return m_split(in, self, args, true); }
value m_splitlines(interpreter&, const value& self, const call_args&) { return string_list(python::splitlines(self.as_string())); }

value m_affix(interpreter&, const value& self, const call_args& args, bool prefix) {
  const value* what = args.find(0, prefix ? "prefix" : "suffix");
  if (what == nullptr) fail(format("{}() takes at least 1 argument", prefix ? "startswith" : "endswith"));
  const std::string& s = self.as_string();
  const auto matches = [&](const value& candidate) {
    if (!candidate.is_string()) fail(format("{} arg must be str or a tuple of str, not {}", prefix ? "startswith" : "endswith", type_name(candidate)));
    return prefix ? s.starts_with(candidate.as_string()) : s.ends_with(candidate.as_string());
  };
  if (what->type() == value::kind::list && what->as_list().tuple) {
    for (const value& candidate : what->as_list().items) {
      if (matches(candidate)) return value(true);
    }
    return value(false);
  }
  return value(matches(*what));
}
value m_startswith(interpreter& in, const value& self, const call_args& args) { return m_affix(in, self, args, true); }
value m_endswith(interpreter& in, const value& self, const call_args& args) { return m_affix(in, self, args, false); }

value m_replace(interpreter& in, const value& self, const call_args& args) {
  const value* from = string_value_arg(args, 0, "old");
  const value* to = string_value_arg(args, 1, "new");
  if (!from || !to) fail("replace() needs two strings");
  call_args filter_args{{*from, *to, value(int_arg(args, 2, "count", -1))}, {}};
  return f_replace(in, self, filter_args);
}
value m_upper(interpreter&, const value& self, const call_args&) { return value(python::upper(self.as_string())); }
value m_lower(interpreter&, const value& self, const call_args&) { return value(python::lower(self.as_string())); }
value m_title(interpreter&, const value& self, const call_args&) { return value(python::title(self.as_string())); }
value m_capitalize(interpreter&, const value& self, const call_args&) { return value(python::capitalize(self.as_string())); }
value m_find(interpreter&, const value& self, const call_args& args, bool from_right) {
  const auto sub = string_arg(args, 0, "sub");
  if (!sub) fail("find() needs a string");
  return value(python::find(self.as_string(), *sub, from_right));
}
value m_find_left(interpreter& in, const value& self, const call_args& args) { return m_find(in, self, args, false); }
value m_rfind(interpreter& in, const value& self, const call_args& args) { return m_find(in, self, args, true); }
value m_str_count(interpreter&, const value& self, const call_args& args) {
  const auto sub = string_arg(args, 0, "sub");
  if (!sub) fail("count() needs a string");
  return value(python::count(self.as_string(), *sub));
}
value m_join(interpreter& in, const value& self, const call_args& args) {
  const value* items = args.find(0, "iterable");
  if (items == nullptr) fail("join() takes exactly one argument");
  marked_text out;
  bool first = true;
  for (const value& item : iterate_value(*items)) {
    if (!item.is_string()) fail(format("sequence item: expected str instance, {} found", type_name(item)));
    if (!first) append_text(out, self, unlimited);
    first = false;
    append_text(out, item, unlimited);
    in.check_size(out.text.size());
  }
  return value(std::move(out));
}
value m_format(interpreter& in, const value& self, const call_args& args);
template <bool (*Predicate)(char32_t)>
value m_is(interpreter&, const value& self, const call_args&) {
  const auto points = python::code_points(self.as_string());
  return value(!points.empty() && std::all_of(points.begin(), points.end(), Predicate));
}
bool is_digit(char32_t c) { return c >= '0' && c <= '9'; }
bool is_alpha(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c > 0x7F; }
bool is_alnum(char32_t c) { return is_digit(c) || is_alpha(c); }
value m_isupper(interpreter&, const value& self, const call_args&) { return value(python::is_upper(self.as_string())); }
value m_islower(interpreter&, const value& self, const call_args&) { return value(python::is_lower(self.as_string())); }

value m_list_index(interpreter&, const value& self, const call_args& args) {
  const value& target = test_arg(args);
  const auto& items = self.as_list().items;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (equal(items[i], target)) return value(static_cast<std::int64_t>(i));
  }
  fail("the value is not in the list");
}
value m_list_count(interpreter&, const value& self, const call_args& args) {
  const value& target = test_arg(args);
  std::int64_t n = 0;
  for (const value& item : self.as_list().items) n += equal(item, target) ? 1 : 0;
  return value(n);
}
void check_mutable(const value& self, const value* inserted) {
  if (self.as_list().tuple) fail("'tuple' object does not support changes");
  if (inserted && holds(*inserted, self)) fail("a list cannot hold itself");
}
value m_append(interpreter& in, const value& self, const call_args& args) {
  const value& item = test_arg(args);
  check_mutable(self, &item);
  in.check_size((self.as_list().items.size() + 1) * sizeof(value));
  self.as_list().items.push_back(item);
  return value::none();
}
value m_extend(interpreter& in, const value& self, const call_args& args) {
  const value& more = test_arg(args);
  check_mutable(self, &more);
  const auto items = iterate_value(more);
  in.check_size((self.as_list().items.size() + items.size()) * sizeof(value));
  self.as_list().items.insert(self.as_list().items.end(), items.begin(), items.end());
  return value::none();
}
value m_insert(interpreter& in, const value& self, const call_args& args) {
  if (args.positional.size() != 2 || !is_integral(args.positional[0])) fail("insert() takes an index and a value");
  check_mutable(self, &args.positional[1]);
  auto& items = self.as_list().items;
  in.check_size((items.size() + 1) * sizeof(value));
  const auto size = static_cast<std::int64_t>(items.size());
  std::int64_t at = as_integer(args.positional[0]);
  if (at < 0) at = std::max<std::int64_t>(0, at + size);
  at = std::min(at, size);
  items.insert(items.begin() + at, args.positional[1]);
  return value::none();
}
value m_pop(interpreter&, const value& self, const call_args& args) {
  check_mutable(self, nullptr);
  auto& items = self.as_list().items;
  if (items.empty()) fail("pop from empty list");
  const auto size = static_cast<std::int64_t>(items.size());
  std::int64_t at = int_arg(args, 0, "index", -1);
  if (at < 0) at += size;
  if (at < 0 || at >= size) fail("pop index out of range");
  value v = items[static_cast<std::size_t>(at)];
  items.erase(items.begin() + at);
  return v;
}

value m_get(interpreter&, const value& self, const call_args& args) {
  const value* key = args.find(0, "key");
  if (key == nullptr) fail("get() needs a key");
  if (key->is_string()) {
    if (const value* v = self.as_dict().find(key->as_string())) return *v;
  }
  return args.get(1, "default", value::none());
}
value m_items(interpreter& in, const value& self, const call_args& args) { return f_items(in, self, args); }
value m_keys(interpreter&, const value& self, const call_args&) { return value::list(iterate_value(self)); }
value m_values(interpreter&, const value& self, const call_args&) {
  std::vector<value> out;
  for (const auto& [key, item] : self.as_dict().items) out.push_back(item);
  return value::list(std::move(out));
}
value m_dict_pop(interpreter&, const value& self, const call_args& args) {
  const value* key = args.find(0, "key");
  if (key == nullptr) fail("pop() needs a key");
  auto& items = self.as_dict().items;
  for (auto it = items.begin(); it != items.end(); ++it) {
    if (key->is_string() && it->first == key->as_string()) {
      value v = std::move(it->second);
      items.erase(it);
      return v;
    }
  }
  if (const value* fallback = args.find(1, "default")) return *fallback;
  std::string shown;
  append_repr(shown, *key, 256);
  fail(format("KeyError: {}", shown));
}
value m_update(interpreter&, const value& self, const call_args& args) {
  dict_data& d = self.as_dict();
  if (const value* other = args.find(0, "other")) {
    if (other->type() != value::kind::dict || other->as_dict().is_namespace) fail("update() needs a dict");
    if (holds(*other, self)) fail("a dict cannot hold itself");
    for (const auto& [key, item] : other->as_dict().items) d.set(key, item);
  }
  for (const auto& [key, item] : args.keywords) {
    if (holds(item, self)) fail("a dict cannot hold itself");
    d.set(key, item);
  }
  return value::none();
}

struct method_entry {
  value::kind kind;
  std::string_view name;
  method_fn fn;
};

const std::vector<method_entry>& methods() {
  static const std::vector<method_entry> table = {
      {value::kind::string, "strip", m_strip_both},     {value::kind::string, "lstrip", m_lstrip},
      {value::kind::string, "rstrip", m_rstrip},        {value::kind::string, "split", m_split_left},
      {value::kind::string, "rsplit", m_rsplit},        {value::kind::string, "splitlines", m_splitlines},
      {value::kind::string, "startswith", m_startswith}, {value::kind::string, "endswith", m_endswith},
      {value::kind::string, "replace", m_replace},      {value::kind::string, "upper", m_upper},
      {value::kind::string, "lower", m_lower},          {value::kind::string, "title", m_title},
      {value::kind::string, "capitalize", m_capitalize}, {value::kind::string, "find", m_find_left},
      {value::kind::string, "rfind", m_rfind},          {value::kind::string, "count", m_str_count},
      {value::kind::string, "join", m_join},            {value::kind::string, "format", m_format},
      {value::kind::string, "isdigit", m_is<is_digit>}, {value::kind::string, "isalpha", m_is<is_alpha>},
      {value::kind::string, "isalnum", m_is<is_alnum>}, {value::kind::string, "isspace", m_is<python::is_space>},
      {value::kind::string, "isupper", m_isupper},      {value::kind::string, "islower", m_islower},
      {value::kind::list, "index", m_list_index},       {value::kind::list, "count", m_list_count},
      {value::kind::list, "append", m_append},          {value::kind::list, "extend", m_extend},
      {value::kind::list, "insert", m_insert},          {value::kind::list, "pop", m_pop},
      {value::kind::dict, "get", m_get},                {value::kind::dict, "items", m_items},
      {value::kind::dict, "keys", m_keys},              {value::kind::dict, "values", m_values},
      {value::kind::dict, "pop", m_dict_pop},           {value::kind::dict, "update", m_update},
  };
  return table;
}

// ---- formatting numbers ------------------------------------------------------------------------

// printf's %f, %e and %g (precision digits), through to_chars.
std::string format_float(double d, char code, int precision) {
  if (std::isnan(d)) return code >= 'a' ? "nan" : "NAN";
  if (std::isinf(d)) return d > 0 ? (code >= 'a' ? "inf" : "INF") : (code >= 'a' ? "-inf" : "-INF");
  char buffer[400];
  const char lower = static_cast<char>(code | 0x20);
  const auto form = lower == 'f' ? std::chars_format::fixed : lower == 'e' ? std::chars_format::scientific : std::chars_format::general;
  const auto written = std::to_chars(buffer, buffer + sizeof(buffer), d, form, std::clamp(precision, 0, 100));
  std::string out(buffer, written.ec == std::errc{} ? written.ptr : buffer);
  if (code != lower) out = python::upper(out);
  return out;
}

// `body` padded to `width` characters: on the right when `left`, else on the left with spaces or
// (numbers) zeros after the sign.
std::string pad(interpreter& in, std::string body, std::int64_t width, bool left, bool zeros) {
  const auto length = static_cast<std::int64_t>(python::length(body));
  if (width <= length) return body;
  in.check_size(static_cast<std::size_t>(width));
  const auto n = static_cast<std::size_t>(width - length);
  if (left) return body + std::string(n, ' ');
  if (zeros) {
    const std::size_t sign = !body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ') ? 1 : 0;
    return body.substr(0, sign) + std::string(n, '0') + body.substr(sign);
  }
  return std::string(n, ' ') + body;
}

// ---- str.format ---------------------------------------------------------------------------------

// A format spec's subset: [[fill]align][sign][0][width][,][.precision][type].
std::string apply_spec(interpreter& in, const value& v, std::string_view spec) {
  if (spec.empty()) return text_of(in, v);
  std::size_t i = 0;
  char fill = ' ';
  char align = 0;
  const auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (spec.size() >= 2 && is_align(spec[1])) {
    fill = spec[0];
    align = spec[1];
    i = 2;
  } else if (!spec.empty() && is_align(spec[0])) {
    align = spec[0];
    i = 1;
  }
  char sign = 0;
  if (i < spec.size() && (spec[i] == '+' || spec[i] == '-' || spec[i] == ' ')) sign = spec[i++];
  if (i < spec.size() && spec[i] == '0') {
    fill = '0';
    if (!align) align = '=';
    ++i;
  }
  std::int64_t width = 0;
  while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9' && width < 100000) width = width * 10 + (spec[i++] - '0');
  std::int64_t precision = -1;
  if (i < spec.size() && spec[i] == '.') {
    precision = 0;
    ++i;
    while (i < spec.size() && spec[i] >= '0' && spec[i] <= '9' && precision < 1000) precision = precision * 10 + (spec[i++] - '0');
  }
  const char type = i < spec.size() ? spec[i++] : 0;
  if (i != spec.size()) fail(format("the format spec '{}' is not supported", spec));
  std::string body;
  if (type == 'f' || type == 'F' || type == 'e' || type == 'E' || type == 'g' || type == 'G' || type == '%') {
    if (!is_numeric(v)) fail(format("the format code '{}' needs a number", type));
    const double d = as_double(v) * (type == '%' ? 100.0 : 1.0);
    body = format_float(d, type == '%' ? 'f' : type, precision < 0 ? 6 : static_cast<int>(precision));
    if (d >= 0 && (sign == '+' || sign == ' ')) body = std::string(1, sign) + body;
    if (type == '%') body += '%';
  } else if (type == 'd' || (type == 0 && is_integral(v) && precision < 0)) {
    if (!is_integral(v)) fail("the format code 'd' needs an integer");
    body = std::to_string(as_integer(v));
    if (sign == '+' && as_integer(v) >= 0) body = "+" + body;
  } else if (type == 's' || type == 0) {
    body = text_of(in, v);
    if (precision >= 0) {
      const auto points = python::code_points(body);
      body = python::from_code_points(points, 0, std::min<std::size_t>(points.size(), static_cast<std::size_t>(precision)));
    }
  } else {
    fail(format("the format code '{}' is not supported", type));
  }
  const auto length = static_cast<std::int64_t>(python::length(body));
  if (width <= length) return body;
  in.check_size(static_cast<std::size_t>(width));
  const auto pad = static_cast<std::size_t>(width - length);
  if (!align) align = v.is_string() ? '<' : '>';
  switch (align) {
    case '<': return body + std::string(pad, fill);
    case '^': return std::string(pad / 2, fill) + body + std::string(pad - pad / 2, fill);
    case '=':
      if (!body.empty() && (body[0] == '-' || body[0] == '+')) return body.substr(0, 1) + std::string(pad, fill) + body.substr(1);
      return std::string(pad, fill) + body;
    default: return std::string(pad, fill) + body;
  }
}

value m_format(interpreter& in, const value& self, const call_args& args) {
  const std::string& pattern = self.as_string();
  marked_text out;
  std::size_t automatic = 0;
  for (std::size_t i = 0; i < pattern.size();) {
    const char c = pattern[i];
    if (c == '}') {
      if (i + 1 < pattern.size() && pattern[i + 1] == '}') {
        append_text(out, substring(self, i, i + 1), unlimited);
        i += 2;
        continue;
      }
      fail("Single '}' encountered in format string");
    }
    if (c != '{') {
      const std::size_t run_end = std::min(pattern.find_first_of("{}", i), pattern.size());
      append_text(out, substring(self, i, run_end), unlimited);
      i = run_end;
      continue;
    }
    if (i + 1 < pattern.size() && pattern[i + 1] == '{') {
      append_text(out, substring(self, i, i + 1), unlimited);
      i += 2;
      continue;
    }
    const std::size_t close = pattern.find('}', i);
    if (close == std::string::npos) fail("Single '{' encountered in format string");
    std::string_view field(pattern.data() + i + 1, close - i - 1);
    std::string_view spec;
    if (const std::size_t colon = field.find(':'); colon != std::string_view::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    char conversion = 0;
    if (const std::size_t bang = field.find('!'); bang != std::string_view::npos) {
      if (bang + 2 != field.size()) fail("the format field's conversion must be !r or !s");
      conversion = field[bang + 1];
      field = field.substr(0, bang);
    }
    value v;
    if (field.empty()) {
      if (automatic >= args.positional.size()) fail("Replacement index out of range for positional args tuple");
      v = args.positional[automatic++];
    } else if (std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      const std::size_t index = field.size() < 9 ? static_cast<std::size_t>(std::stoul(std::string(field))) : args.positional.size();
      if (index >= args.positional.size()) fail("Replacement index out of range for positional args tuple");
      v = args.positional[index];
    } else {
      const value* named = nullptr;
      for (const auto& [key, item] : args.keywords) {
        if (key == field) named = &item;
      }
      if (named == nullptr) fail(format("KeyError: '{}'", field));
      v = *named;
    }
    if (conversion == 'r') {
      std::string shown;
      if (!append_repr(shown, v, in.size_limit())) in.check_size(shown.size());
      v = value(std::move(shown));
    } else if (conversion == 's') {
      v = value(text_of(in, v));
    } else if (conversion != 0) {
      fail("the format field's conversion must be !r or !s");
    }
    if (spec.empty()) {
      // As {{ }} writes it: a string with its markup.
      if (!append_text(out, v, in.size_limit())) in.check_size(out.text.size());
    } else {
      out.append_text(apply_spec(in, v, spec));
    }
    in.check_size(out.text.size());
    i = close + 1;
  }
  return value(std::move(out));
}

// ---- globals ------------------------------------------------------------------------------------

value g_range(interpreter& in, const call_args& args) {
  for (const value& a : args.positional) {
    if (!is_integral(a)) fail(format("'{}' object cannot be interpreted as an integer", type_name(a)));
  }
  std::int64_t start = 0;
  std::int64_t stop = 0;
  std::int64_t step = 1;
  switch (args.positional.size()) {
    case 1: stop = as_integer(args.positional[0]); break;
    case 2:
      start = as_integer(args.positional[0]);
      stop = as_integer(args.positional[1]);
      break;
    case 3:
      start = as_integer(args.positional[0]);
      stop = as_integer(args.positional[1]);
      step = as_integer(args.positional[2]);
      break;
    default: fail(format("range expected 1 to 3 arguments, got {}", args.positional.size()));
  }
  if (step == 0) fail("range() arg 3 must not be zero");
  const long double span = step > 0 ? static_cast<long double>(stop) - start : static_cast<long double>(start) - stop;
  const long double count = span <= 0 ? 0 : std::ceil(span / (step > 0 ? step : -static_cast<long double>(step)));
  if (count * sizeof(value) > in.size_limit()) in.check_size(in.size_limit() + 1);
  std::vector<value> items;
  items.reserve(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(count); ++i) items.emplace_back(start + i * step);
  return value::list(std::move(items));
}

value g_dict(interpreter&, const call_args& args) {
  auto d = value::dict();
  if (!args.positional.empty()) {
    const value& source = args.positional.front();
    if (source.type() == value::kind::dict && !source.as_dict().is_namespace) {
      d.as_dict().items = source.as_dict().items;
    } else {
      for (const value& entry : iterate_value(source)) {
        const auto kv = iterate_value(entry);
        if (kv.size() != 2 || !kv[0].is_string()) fail("dict() needs pairs of a string and a value");
        d.as_dict().set(kv[0].as_string(), kv[1]);
      }
    }
  }
  for (const auto& [key, item] : args.keywords) d.as_dict().set(key, item);
  return d;
}

value g_namespace(interpreter& in, const call_args& args) {
  value d = g_dict(in, args);
  d.as_dict().is_namespace = true;
  return d;
}

value g_raise_exception(interpreter& in, const call_args& args) {
  fail(args.positional.empty() ? std::string("raise_exception() was called") : text_of(in, args.positional.front()));
}

value g_strftime_now(interpreter& in, const call_args& args) {
  const auto pattern = string_arg(args, 0, "format");
  if (!pattern) fail("strftime_now() needs a format");
  if (pattern->size() > 256) fail("strftime_now(): the format is too long");
  const auto now = in.options().now ? in.options().now() : std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm local{};
  localtime_r(&t, &local);
  std::string buffer(pattern->size() * 64 + 64, '\0');
  // The format is the template's: strftime reads no arguments through it, whatever it holds.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  const std::size_t n = std::strftime(buffer.data(), buffer.size(), pattern->c_str(), &local);
#pragma GCC diagnostic pop
  buffer.resize(n);
  return value(std::move(buffer));
}

value g_joiner(interpreter&, const call_args& args) {
  const std::string separator = string_arg(args, 0, "sep").value_or(", ");
  auto used = std::make_shared<bool>(false);
  return make_function("joiner", [separator, used](interpreter&, const call_args&) {
    if (!*used) {
      *used = true;
      return value("");
    }
    return value(separator);
  });
}

const std::vector<std::pair<std::string, value>>& globals() {
  static const std::vector<std::pair<std::string, value>> table = {
      {"range", make_function("range", g_range)},
      {"dict", make_function("dict", g_dict)},
      {"namespace", make_function("namespace", g_namespace)},
      {"joiner", make_function("joiner", g_joiner)},
      {"raise_exception", make_function("raise_exception", g_raise_exception)},
      {"strftime_now", make_function("strftime_now", g_strftime_now)},
  };
  return table;
}

}  // namespace

bool is_filter(std::string_view name) { return filters().contains(name); }
bool is_test(std::string_view name) { return tests().contains(name); }

value interpreter::apply_filter(const std::string& name, const value& operand, const call_args& args) {
  const auto it = filters().find(name);
  if (it == filters().end()) fail(format("no filter named '{}'", name));
  // Most filters read their operand as it is; using an undefined one (other than as text, a
  // sequence or a default) is an error, as in Jinja.
  return computed_from(it->second(*this, operand, args), operand, args);
}

bool interpreter::apply_test(const std::string& name, const value& operand, const call_args& args) {
  const auto it = tests().find(name);
  if (it == tests().end()) fail(format("no test named '{}'", name));
  return it->second(*this, operand, args);
}

std::optional<value> interpreter::method(const value& object, const std::string& name) {
  for (const method_entry& m : methods()) {
    if (m.kind != object.type() || m.name != name) continue;
    const method_fn fn = m.fn;
    value self = object;
    return make_function(name, [fn, self](interpreter& in, const call_args& args) {
      return computed_from(fn(in, self, args), self, args);
    });
  }
  return std::nullopt;
}

const value* interpreter::builtin_global(std::string_view name) const {
  for (const auto& [key, v] : globals()) {
    if (key == name) return &v;
  }
  return nullptr;
}

value percent_format(interpreter& in, const value& format_value, const value& args) {
  const std::string& pattern = format_value.as_string();
  std::vector<value> positional;
  const value* mapping = nullptr;
  if (args.type() == value::kind::list && args.as_list().tuple) {
    positional = args.as_list().items;
  } else if (args.type() == value::kind::dict && !args.as_dict().is_namespace) {
    mapping = &args;
    positional.push_back(args);
  } else {
    positional.push_back(args);
  }
  std::size_t next = 0;
  marked_text out;
  for (std::size_t i = 0; i < pattern.size();) {
    if (pattern[i] != '%') {
      const std::size_t run_end = std::min(pattern.find('%', i), pattern.size());
      append_text(out, substring(format_value, i, run_end), unlimited);
      i = run_end;
      continue;
    }
    ++i;
    if (i >= pattern.size()) fail("incomplete format");
    value v;
    bool have = false;
    if (pattern[i] == '(') {
      const std::size_t close = pattern.find(')', i);
      if (close == std::string::npos || mapping == nullptr) fail("format requires a mapping");
      const value* found = mapping->as_dict().find(std::string_view(pattern).substr(i + 1, close - i - 1));
      if (found == nullptr) fail(format("KeyError: '{}'", pattern.substr(i + 1, close - i - 1)));
      v = *found;
      have = true;
      i = close + 1;
    }
    std::string spec;
    while (i < pattern.size() && std::string_view("-+ #0").find(pattern[i]) != std::string_view::npos) spec += pattern[i++];
    std::string width_text;
    while (i < pattern.size() && pattern[i] >= '0' && pattern[i] <= '9' && width_text.size() < 5) width_text += pattern[i++];
    std::string precision_text;
    if (i < pattern.size() && pattern[i] == '.') {
      ++i;
      while (i < pattern.size() && pattern[i] >= '0' && pattern[i] <= '9' && precision_text.size() < 3) precision_text += pattern[i++];
      precision_text = "." + (precision_text.empty() ? std::string("0") : precision_text);
    }
    if (i >= pattern.size()) fail("incomplete format");
    const char code = pattern[i++];
    if (code == '%') {
      out.append_text("%");
      continue;
    }
    if (!have) {
      if (next >= positional.size()) fail("not enough arguments for format string");
      v = positional[next++];
    }
    std::string body;
    if (code == 's' && spec.empty() && width_text.empty() && precision_text.empty()) {
      // A bare %s writes the value as {{ }} would, a string with its markup.
      if (!append_text(out, v, in.size_limit())) in.check_size(out.text.size());
      continue;
    }
    if (code == 's' || code == 'r' || code == 'a') {
      if (code == 's') {
        body = text_of(in, v);
      } else if (!append_repr(body, v, in.size_limit())) {
        in.check_size(body.size());
      }
      if (!precision_text.empty()) {
        const auto points = python::code_points(body);
        body = python::from_code_points(points, 0, std::min<std::size_t>(points.size(), std::stoul(precision_text.substr(1))));
      }
      const std::size_t width = width_text.empty() ? 0 : std::stoul(width_text);
      const std::size_t length = python::length(body);
      if (width > length) {
        const bool left = spec.find('-') != std::string::npos;
        body = left ? body + std::string(width - length, ' ') : std::string(width - length, ' ') + body;
      }
    } else if (std::string_view("diouxXeEfFgGc").find(code) != std::string_view::npos) {
      if (!is_numeric(v)) fail(format("%{} format: a number is required, not {}", code, type_name(v)));
      const bool plus = spec.find('+') != std::string::npos;
      const bool space = spec.find(' ') != std::string::npos;
      if (code == 'c') {
        if (!is_integral(v)) fail("%c requires an int");
        python::append_utf8(body, static_cast<char32_t>(std::clamp<std::int64_t>(as_integer(v), 0, 0x10FFFF)));
      } else if (code == 'd' || code == 'i' || code == 'u' || code == 'o' || code == 'x' || code == 'X') {
        if (!is_integral(v) && (code == 'o' || code == 'x' || code == 'X')) fail(format("%{} format: an integer is required", code));
        const double d = as_double(v);
        if (!is_integral(v) && !(std::isfinite(d) && std::fabs(d) < 9.2e18)) fail("the number does not fit 64 bits");
        const std::int64_t i64 = is_integral(v) ? as_integer(v) : static_cast<std::int64_t>(d);
        const std::uint64_t magnitude = i64 < 0 ? 0 - static_cast<std::uint64_t>(i64) : static_cast<std::uint64_t>(i64);
        char buffer[80];
        const int base = code == 'o' ? 8 : (code == 'x' || code == 'X') ? 16 : 10;
        const auto written = std::to_chars(buffer, buffer + sizeof(buffer), magnitude, base);
        std::string digits(buffer, written.ptr);
        if (code == 'X') digits = python::upper(digits);
        body = (i64 < 0 ? "-" : plus ? "+" : space ? " " : "") + digits;
      } else {
        const int precision = precision_text.empty() ? 6 : static_cast<int>(std::stoul(precision_text.substr(1)));
        body = format_float(as_double(v), code, precision);
        if (as_double(v) >= 0 && (plus || space)) body = (plus ? "+" : " ") + body;
      }
      body = pad(in, std::move(body), width_text.empty() ? 0 : std::stoll(width_text), spec.find('-') != std::string::npos,
                 spec.find('0') != std::string::npos);
    } else {
      fail(format("unsupported format character '{}'", code));
    }
    out.append_text(body);
    in.check_size(out.text.size());
  }
  if (mapping == nullptr && next < positional.size()) fail("not all arguments converted during string formatting");
  return value(std::move(out));
}

}  // namespace edge::backend::jinja
