// JSON Schema -> grammar (grammar_builder::json_schema). README "Structured outputs" lists what
// is enforced; everything else is an error naming the keyword, never silently dropped.
//
// Choices that make the grammar smaller than the schema's language (every value it allows
// still validates):
//   * object properties come in the order `properties` lists them; optional ones may be left
//     out. Without `additionalProperties` (or with it false) no other property is written;
//     `additionalProperties` true or a schema allows more after the listed ones, with ASCII
//     names other than the listed ones. An object schema without `properties` allows any
//     members (as JSON Schema does).
//   * without `type`, the type is taken from the keywords present (properties: object, items:
//     array, ...), or any JSON value when none says.
//   * strings of a `format` are written as the format's canonical form (RFC 3339 with a time
//     zone; lowercase or uppercase hex in a uuid).
//   * numbers: see number_range (grammar.h).
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "edge/backend/grammar/grammar.h"
#include "edge/common/format.h"
#include "edge/common/json_text.h"

namespace edge::backend::grammar {

using element = simdjson::dom::element;
using element_type = simdjson::dom::element_type;

namespace {

// Schemas nest no deeper than this (each level is a C++ call).
constexpr int max_schema_depth = 96;
// Counts the grammar unrolls: larger ones are refused rather than compiled for minutes.
constexpr std::int64_t max_string_length = 4096;
constexpr std::int64_t max_array_items = 1024;
// The longest property name that additional properties are told apart from: key_except() is a
// trie over the names, built with a C++ call and some 150 bytes of grammar text per byte (real
// names are far shorter; at 1024 bytes, such schemas made most of the grammar fuzzer's time).
constexpr std::size_t max_excepted_name = 256;
// key_except() starts a rule this many bytes into a name, and an array every this many items
// of prefixItems: each nests an expression two levels deeper, and the text form (parse_grammar)
// reads no deeper than 200.
constexpr std::size_t levels_per_rule = 32;

const std::set<std::string_view>& annotation_keywords() {
  static const std::set<std::string_view> words = {"title",   "description", "examples", "default",   "$schema",
                                                   "$id",     "$comment",    "deprecated", "readOnly", "writeOnly",
                                                   "$defs",   "definitions"};
  return words;
}

enum type_bit : unsigned {
  t_null = 1,
  t_boolean = 2,
  t_object = 4,
  t_array = 8,
  t_string = 16,
  t_integer = 32,
  t_number = 64,  // any number (integers included)
  t_all = 127,
};

std::optional<unsigned> type_from_name(std::string_view name) {
  if (name == "null") return t_null;
  if (name == "boolean") return t_boolean;
  if (name == "object") return t_object;
  if (name == "array") return t_array;
  if (name == "string") return t_string;
  if (name == "integer") return t_integer;
  if (name == "number") return t_number;
  return std::nullopt;
}

// The type bits a JSON value has.
unsigned type_of(element e) {
  switch (e.type()) {
    case element_type::NULL_VALUE: return t_null;
    case element_type::BOOL: return t_boolean;
    case element_type::OBJECT: return t_object;
    case element_type::ARRAY: return t_array;
    case element_type::STRING: return t_string;
    case element_type::INT64:
    case element_type::UINT64: return t_integer | t_number;
    case element_type::DOUBLE: {
      const double d = e.get_double().value_unsafe();
      return std::floor(d) == d ? (t_integer | t_number) : t_number;
    }
  }
  return 0;
}

// A JSON value written canonically: minified, keys in document order, strings escaped as
// append_json_string does, numbers as the shortest text of their double (integers exactly).
void append_value(std::string& out, element e) {
  switch (e.type()) {
    case element_type::NULL_VALUE: out += "null"; return;
    case element_type::BOOL: out += e.get_bool().value_unsafe() ? "true" : "false"; return;
    case element_type::INT64: out += std::to_string(e.get_int64().value_unsafe()); return;
    case element_type::UINT64: out += std::to_string(e.get_uint64().value_unsafe()); return;
    case element_type::DOUBLE: out += json_number(e.get_double().value_unsafe()); return;
    case element_type::STRING: append_json_string(out, e.get_string().value_unsafe()); return;
    case element_type::ARRAY: {
      out += '[';
      bool first = true;
      const simdjson::dom::array listed_items_1 = e.get_array().value_unsafe();
      for (element item : listed_items_1) {
        if (!first) out += ',';
        first = false;
        append_value(out, item);
      }
      out += ']';
      return;
    }
    case element_type::OBJECT: {
      out += '{';
      bool first = true;
      const simdjson::dom::object listed_items_2 = e.get_object().value_unsafe();
      for (auto field : listed_items_2) {
        if (!first) out += ',';
        first = false;
        append_json_string(out, field.key);
        out += ':';
        append_value(out, field.value);
      }
      out += '}';
      return;
    }
  }
}

std::string canonical(element e) {
  std::string out;
  append_value(out, e);
  return out;
}

bool is_ascii_plain(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c < 0x7F && c != '"' && c != '\\'; });
}

// ASCII characters a JSON string holds without escapes.
std::vector<codepoint_range> plain_ascii() { return {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x7E}}; }

// A JSON string literal (quotes included) of plain ASCII characters that is none of `names`
// (their JSON string contents; none longer than max_excepted_name). A trie over the names: past
// a byte no name continues with, anything goes. Every levels_per_rule bytes deep, the rest of
// the trie is a rule of `b`, so that no expression nests deeper than that however long the names.
expr key_except(grammar_builder& b, const std::vector<std::string>& names) {
  std::vector<std::string> sorted;
  for (const auto& n : names) {
    if (is_ascii_plain(n)) sorted.push_back(n);
  }
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const expr any_tail = seq({star(char_class(plain_ascii())), literal("\"")});
  // Keys with the prefix `prefix`, among the names from `begin` to `end` that share it.
  std::function<expr(std::size_t, std::size_t, std::size_t)> node = [&](std::size_t begin, std::size_t end,
                                                                        std::size_t depth) -> expr {
    std::vector<expr> options;
    bool terminal = false;
    std::vector<codepoint_range> taken;
    std::size_t i = begin;
    while (i < end) {
      if (sorted[i].size() == depth) {
        terminal = true;
        ++i;
        continue;
      }
      const char c = sorted[i][depth];
      std::size_t j = i;
      while (j < end && sorted[j].size() > depth && sorted[j][depth] == c) ++j;
      options.push_back(seq({literal(std::string(1, c)), node(i, j, depth + 1)}));
      taken.push_back({static_cast<char32_t>(c), static_cast<char32_t>(c)});
      i = j;
    }
    if (!terminal) options.push_back(literal("\""));
    // Any other first byte: the key already differs from every name here.
    std::vector<codepoint_range> others;
    for (const auto& r : plain_ascii()) {
      for (char32_t c = r.first; c <= r.last; ++c) {
        const bool used = std::any_of(taken.begin(), taken.end(), [&](const codepoint_range& t) { return t.first == c; });
        if (!used) others.push_back({c, c});
      }
    }
    if (!others.empty()) options.push_back(seq({char_class(others), any_tail}));
    if (depth == 0 || depth % levels_per_rule != 0) return alt(std::move(options));
    return b.ref(b.add_rule("key", alt(std::move(options))));
  };
  return seq({literal("\""), node(0, sorted.size(), 0)});
}

// The request path of the schema at JSON pointer `pointer` below `root_path`.
std::string path_of_pointer(const std::string& root_path, std::string_view pointer) {
  std::string path = root_path;
  for (std::size_t at = 1; at <= pointer.size();) {
    const std::size_t next = std::min(pointer.find('/', at), pointer.size());
    std::string step(pointer.substr(at, next - at));
    for (std::size_t i = 0; (i = step.find("~1", i)) != std::string::npos;) step.replace(i, 2, "/");
    for (std::size_t i = 0; (i = step.find("~0", i)) != std::string::npos;) step.replace(i, 2, "~");
    path += "." + step;
    at = next + 1;
  }
  return path;
}

}  // namespace

// Reads one schema document into a builder's rules.
class schema_reader {
 public:
  schema_reader(grammar_builder& b, element root, std::string root_path)
      : b_(b), root_(root), root_path_(std::move(root_path)) {}

  result<expr, grammar_error> read(element schema, const std::string& path, int depth);

 private:
  grammar_error error_at(const std::string& path, std::string_view what) const {
    return grammar_error(format("'{}' {}", path, what), path);
  }
  grammar_error unsupported(const std::string& path, std::string_view keyword, std::string_view why = {}) const {
    const std::string where = path + "." + std::string(keyword);
    if (why.empty()) return grammar_error(format("'{}': the keyword '{}' is not supported", where, keyword), where);
    return grammar_error(format("'{}': {}", where, why), where);
  }

  result<expr, grammar_error> read_ref(std::string_view ref, const std::string& path, int depth);
  result<expr, grammar_error> read_typed(simdjson::dom::object o, unsigned types, const std::string& path, int depth);
  result<expr, grammar_error> read_object(simdjson::dom::object o, const std::string& path, int depth);
  result<expr, grammar_error> read_array(simdjson::dom::object o, const std::string& path, int depth);
  result<expr, grammar_error> read_string(simdjson::dom::object o, const std::string& path);
  result<expr, grammar_error> read_number(simdjson::dom::object o, bool integer, const std::string& path);
  result<expr, grammar_error> read_enum(simdjson::dom::object o, element values, unsigned types, const std::string& path);
  result<expr, grammar_error> read_all_of(simdjson::dom::object o, element all, const std::string& path, int depth);
  result<expr, grammar_error> read_one_of(element options, const std::string& path, int depth);
  result<std::int64_t, grammar_error> read_count(simdjson::dom::object o, std::string_view key, std::int64_t limit,
                                                 const std::string& path);

  grammar_builder& b_;
  element root_;
  std::string root_path_;
  std::map<std::string, rule_id> refs_;  // by JSON pointer: a rule per referenced schema
};

result<std::int64_t, grammar_error> schema_reader::read_count(simdjson::dom::object o, std::string_view key,
                                                              std::int64_t limit, const std::string& path) {
  element v;
  if (o[key].get(v) != simdjson::SUCCESS) return std::int64_t{-1};
  const std::string where = path + "." + std::string(key);
  std::int64_t n = -1;
  if (v.type() == element_type::INT64) {
    n = v.get_int64().value_unsafe();
  } else if (v.type() == element_type::DOUBLE && std::floor(v.get_double().value_unsafe()) == v.get_double().value_unsafe()) {
    const double d = v.get_double().value_unsafe();
    n = d > static_cast<double>(limit) ? limit + 1 : static_cast<std::int64_t>(d);
  } else if (v.type() == element_type::UINT64) {
    n = limit + 1;
  } else {
    return error_at(where, "must be a non-negative integer");
  }
  if (n < 0) return error_at(where, "must be a non-negative integer");
  if (n > limit) {
    return grammar_error(format("'{}' is {}: edgeinfer enforces at most {}", where, n, limit), where);
  }
  return n;
}

result<expr, grammar_error> schema_reader::read(element schema, const std::string& path, int depth) {
  if (depth > max_schema_depth) return error_at(path, format("nests schemas deeper than {}", max_schema_depth));
  if (schema.type() == element_type::BOOL) {
    if (schema.get_bool().value_unsafe()) return b_.json_value();
    return error_at(path, "is false: no value is valid");
  }
  if (schema.type() != element_type::OBJECT) return error_at(path, "must be a schema (an object or a boolean)");
  const simdjson::dom::object o = schema.get_object().value_unsafe();

  bool nullable = false;
  element v;
  if (o["nullable"].get(v) == simdjson::SUCCESS) {
    if (v.type() != element_type::BOOL) return error_at(path + ".nullable", "must be true or false");
    nullable = v.get_bool().value_unsafe();
  }
  const auto with_null = [&](expr e) { return nullable ? alt({std::move(e), literal("null")}) : e; };

  // Keywords this reader knows; what is left is an error naming it.
  static const std::set<std::string_view> known = {
      "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
      "minItems", "maxItems", "uniqueItems", "minLength", "maxLength", "format", "minimum", "maximum",
      "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref", "nullable", "multipleOf"};
  std::size_t constraints = 0;
  for (auto field : o) {
    if (annotation_keywords().contains(field.key)) continue;
    if (!known.contains(field.key)) return unsupported(path, field.key);
    if (field.key != "nullable") ++constraints;
  }

  if (o["$ref"].get(v) == simdjson::SUCCESS) {
    if (v.type() != element_type::STRING) return error_at(path + ".$ref", "must be a string");
    if (constraints > 1) {
      return unsupported(path, "$ref", "other constraints beside $ref are not supported (only annotations and nullable)");
    }
    EDGE_ASSIGN_OR_RETURN(expr e, read_ref(v.get_string().value_unsafe(), path + ".$ref", depth));
    return with_null(std::move(e));
  }

  for (const std::string_view combiner : {"anyOf", "oneOf", "allOf"}) {
    if (o[combiner].get(v) != simdjson::SUCCESS) continue;
    const std::string where = path + "." + std::string(combiner);
    if (v.type() != element_type::ARRAY || v.get_array().value_unsafe().size() == 0) {
      return error_at(where, "must be a non-empty array of schemas");
    }
    if (combiner == "allOf") {
      EDGE_ASSIGN_OR_RETURN(expr e, read_all_of(o, v, path, depth));
      return with_null(std::move(e));
    }
    if (constraints > 1) {
      return unsupported(path, combiner,
                         format("other constraints beside {} are not supported (only annotations and nullable)", combiner));
    }
    if (combiner == "oneOf") {
      EDGE_ASSIGN_OR_RETURN(expr e, read_one_of(v, where, depth));
      return with_null(std::move(e));
    }
    std::vector<expr> options;
    std::size_t i = 0;
    const simdjson::dom::array listed_items_3 = v.get_array().value_unsafe();
    for (element option : listed_items_3) {
      EDGE_ASSIGN_OR_RETURN(expr e, read(option, format("{}[{}]", where, i++), depth + 1));
      options.push_back(std::move(e));
    }
    return with_null(alt(std::move(options)));
  }

  unsigned types = 0;
  if (o["type"].get(v) == simdjson::SUCCESS) {
    const std::string where = path + ".type";
    const auto add = [&](element name) -> std::optional<grammar_error> {
      if (name.type() != element_type::STRING) return error_at(where, "must be a type name or an array of them");
      const auto bit = type_from_name(name.get_string().value_unsafe());
      if (!bit) return error_at(where, format("names an unknown type '{}'", name.get_string().value_unsafe()));
      types |= *bit;
      return std::nullopt;
    };
    if (v.type() == element_type::ARRAY) {
      const simdjson::dom::array listed_items_4 = v.get_array().value_unsafe();
      for (element name : listed_items_4) {
        if (auto e = add(name)) return *e;
      }
      if (types == 0) return error_at(where, "must name at least one type");
    } else if (auto e = add(v)) {
      return *e;
    }
  }
  if (nullable) types = types == 0 ? 0 : (types | t_null);

  element values;
  bool has_enum = o["enum"].get(values) == simdjson::SUCCESS;
  element constant;
  if (o["const"].get(constant) == simdjson::SUCCESS) {
    if (has_enum) return unsupported(path, "const", "enum and const together are not supported");
    has_enum = true;
    values = constant;
  }
  if (has_enum) {
    // Only the type may narrow the listed values: other constraints would have to be checked
    // against each value.
    for (auto field : o) {
      if (annotation_keywords().contains(field.key) || field.key == "type" || field.key == "enum" ||
          field.key == "const" || field.key == "nullable") {
        continue;
      }
      return unsupported(path, field.key, format("'{}' beside enum or const is not supported", field.key));
    }
    EDGE_ASSIGN_OR_RETURN(expr e, read_enum(o, values, types == 0 ? t_all : types, path));
    return with_null(std::move(e));
  }

  if (types == 0) {
    // The type the keywords present speak of; any value when none does.
    const auto has = [&](std::initializer_list<std::string_view> keys) {
      return std::any_of(keys.begin(), keys.end(), [&](std::string_view k) { return o[k].error() == simdjson::SUCCESS; });
    };
    if (has({"properties", "required", "additionalProperties"})) types |= t_object;
    if (has({"items", "prefixItems", "minItems", "maxItems"})) types |= t_array;
    if (has({"minLength", "maxLength", "format"})) types |= t_string;
    if (has({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})) types |= t_number;
    if (types == 0) return with_null(b_.json_value());
    if (nullable) types |= t_null;
  }
  return read_typed(o, types, path, depth);
}

result<expr, grammar_error> schema_reader::read_typed(simdjson::dom::object o, unsigned types, const std::string& path,
                                                      int depth) {
  std::vector<expr> options;
  if (types & t_object) {
    EDGE_ASSIGN_OR_RETURN(expr e, read_object(o, path, depth));
    options.push_back(std::move(e));
  }
  if (types & t_array) {
    EDGE_ASSIGN_OR_RETURN(expr e, read_array(o, path, depth));
    options.push_back(std::move(e));
  }
  if (types & t_string) {
    EDGE_ASSIGN_OR_RETURN(expr e, read_string(o, path));
    options.push_back(std::move(e));
  }
  if (types & (t_number | t_integer)) {
    EDGE_ASSIGN_OR_RETURN(expr e, read_number(o, (types & t_number) == 0, path));
    options.push_back(std::move(e));
  }
  if (types & t_boolean) options.push_back(alt({literal("true"), literal("false")}));
  if (types & t_null) options.push_back(literal("null"));
  return alt(std::move(options));
}

result<expr, grammar_error> schema_reader::read_ref(std::string_view ref, const std::string& path, int depth) {
  if (!ref.starts_with("#")) {
    return grammar_error(format("'{}' is '{}': only references inside the schema (#/$defs/...) are supported", path, ref),
                         path);
  }
  const std::string pointer(ref.substr(1));
  if (const auto found = refs_.find(pointer); found != refs_.end()) return b_.ref(found->second);
  element target;
  // JSON pointers may be percent-encoded inside a URI fragment; schemas rarely need it.
  if (pointer.find('%') != std::string::npos) return error_at(path, "uses percent-encoding, which is not supported");
  if (root_.at_pointer(pointer).get(target) != simdjson::SUCCESS) {
    return error_at(path, format("points to '{}', which the schema does not have", ref));
  }
  // The rule exists before its body is read: the schema may refer to itself.
  const rule_id id = b_.declare(format("ref {}", ref));
  refs_.emplace(pointer, id);
  EDGE_ASSIGN_OR_RETURN(expr body, read(target, path_of_pointer(root_path_, pointer), depth + 1));
  static_cast<void>(b_.define(id, std::move(body)));
  return b_.ref(id);
}

result<expr, grammar_error> schema_reader::read_object(simdjson::dom::object o, const std::string& path, int depth) {
  const expr ws = b_.whitespace();
  const expr comma = seq({ws, literal(","), ws});
  element v;
  struct member {
    std::string name;
    expr text;  // "name" ws ":" ws value
    bool required = false;
  };
  std::vector<member> members;
  const bool has_properties = o["properties"].get(v) == simdjson::SUCCESS;
  if (has_properties) {
    if (v.type() != element_type::OBJECT) return error_at(path + ".properties", "must be an object of schemas");
    const simdjson::dom::object listed_items_5 = v.get_object().value_unsafe();
    for (auto field : listed_items_5) {
      const std::string where = path + ".properties." + std::string(field.key);
      if (std::any_of(members.begin(), members.end(), [&](const member& m) { return m.name == field.key; })) {
        return error_at(where, "is listed twice");
      }
      EDGE_ASSIGN_OR_RETURN(expr value, read(field.value, where, depth + 1));
      members.push_back({std::string(field.key), seq({literal(json_string(field.key)), ws, literal(":"), ws, value}), false});
    }
  }
  if (o["required"].get(v) == simdjson::SUCCESS) {
    const std::string where = path + ".required";
    if (v.type() != element_type::ARRAY) return error_at(where, "must be an array of property names");
    std::size_t i = 0;
    const simdjson::dom::array listed_items_6 = v.get_array().value_unsafe();
    for (element name : listed_items_6) {
      const std::string item = format("{}[{}]", where, i++);
      if (name.type() != element_type::STRING) return error_at(item, "must be a property name");
      const std::string_view key = name.get_string().value_unsafe();
      auto it = std::find_if(members.begin(), members.end(), [&](const member& m) { return m.name == key; });
      if (it == members.end()) {
        return grammar_error(
            format("'{}' requires '{}', which 'properties' does not describe: describe it there (edgeinfer writes only "
                   "described required properties)",
                   item, key),
            item);
      }
      it->required = true;
    }
  }
  // What may come after the listed members.
  std::optional<expr> extra_value;
  if (o["additionalProperties"].get(v) == simdjson::SUCCESS) {
    const std::string where = path + ".additionalProperties";
    if (v.type() == element_type::BOOL) {
      if (v.get_bool().value_unsafe()) extra_value = b_.json_value();
    } else {
      EDGE_ASSIGN_OR_RETURN(expr value, read(v, where, depth + 1));
      extra_value = std::move(value);
    }
  } else if (!has_properties) {
    extra_value = b_.json_value();
  }
  if (!has_properties && extra_value && members.empty()) {
    // Any members with values of one schema.
    // A rule, as every piece written twice below: the text form writes an expression as often
    // as it is used, which would double at each level of schemas nested in it.
    const expr member_text =
        b_.ref(b_.add_rule(format("{} member", path), seq({b_.json_string(), ws, literal(":"), ws, *extra_value})));
    return seq({literal("{"), ws, optional(seq({member_text, star(seq({comma, member_text})), ws})), literal("}")});
  }
  std::optional<expr> extra;
  if (extra_value) {
    std::vector<std::string> names;
    for (const member& m : members) {
      if (m.name.size() > max_excepted_name) {
        const std::string where = path + ".properties";
        return error_at(where, format("has a name longer than {} bytes, which additional properties cannot be told "
                                      "apart from: shorten it, or set additionalProperties to false",
                                      max_excepted_name));
      }
      names.push_back(m.name);
    }
    extra = b_.ref(b_.add_rule(format("{} additional member", path),
                               seq({key_except(b_, names), ws, literal(":"), ws, *extra_value})));
  }

  // tail(i): the members from i on after at least one was written, each after a comma. A rule
  // per tail that has optional members keeps the grammar linear in the number of members (its
  // reference is the tail of its caller: a tail call, no stack).
  std::vector<expr> tails(members.size() + 1);
  tails[members.size()] = extra ? star(seq({comma, *extra})) : expr();
  for (std::size_t i = members.size(); i-- > 0;) {
    const expr next = seq({comma, members[i].text});
    const expr body = members[i].required ? seq({next, tails[i + 1]}) : seq({optional(next), tails[i + 1]});
    tails[i] = members[i].required ? body : b_.ref(b_.add_rule(format("{} members", path), body));
  }
  // The first member written: each optional one before the first required one may be it (then
  // the rest follow as tails), or the first required one is, or (all optional) an additional one.
  std::vector<expr> firsts;
  bool all_optional = true;
  for (std::size_t i = 0; i < members.size(); ++i) {
    firsts.push_back(seq({members[i].text, tails[i + 1]}));
    if (members[i].required) {
      all_optional = false;
      break;
    }
  }
  if (all_optional && extra) firsts.push_back(seq({*extra, tails[members.size()]}));
  expr body = alt(std::move(firsts));
  if (all_optional) body = optional(body);
  if (members.empty() && !extra) return literal("{}");
  return seq({literal("{"), ws, body, ws, literal("}")});
}

result<expr, grammar_error> schema_reader::read_array(simdjson::dom::object o, const std::string& path, int depth) {
  const expr ws = b_.whitespace();
  const expr sep = seq({ws, literal(","), ws});
  element v;
  if (o["uniqueItems"].get(v) == simdjson::SUCCESS) {
    if (v.type() != element_type::BOOL) return error_at(path + ".uniqueItems", "must be true or false");
    if (v.get_bool().value_unsafe()) return unsupported(path, "uniqueItems", "uniqueItems true is not enforced");
  }
  std::vector<expr> prefix;
  if (o["prefixItems"].get(v) == simdjson::SUCCESS) {
    const std::string where = path + ".prefixItems";
    if (v.type() != element_type::ARRAY) return error_at(where, "must be an array of schemas");
    std::size_t i = 0;
    const simdjson::dom::array listed_items_7 = v.get_array().value_unsafe();
    for (element item : listed_items_7) {
      // from() below takes a C++ call per item.
      if (i == static_cast<std::size_t>(max_array_items)) {
        return error_at(where, format("lists more than {} schemas", max_array_items));
      }
      EDGE_ASSIGN_OR_RETURN(expr e, read(item, format("{}[{}]", where, i++), depth + 1));
      prefix.push_back(std::move(e));
    }
  }
  // Any JSON value's rules are made only when an array takes any value: made and left unused,
  // they would still be compiled (hundreds of states for the number alone).
  std::optional<expr> items;
  if (o["items"].get(v) == simdjson::SUCCESS) {
    const std::string where = path + ".items";
    if (v.type() == element_type::ARRAY) {
      return unsupported(path, "items", "'items' as an array (draft 4 tuples) is not supported: use prefixItems");
    }
    if (v.type() != element_type::BOOL || v.get_bool().value_unsafe()) {
      EDGE_ASSIGN_OR_RETURN(expr e, read(v, where, depth + 1));
      items = std::move(e);
    }
  } else {
    items = b_.json_value();
  }
  EDGE_ASSIGN_OR_RETURN(const std::int64_t min_items, read_count(o, "minItems", max_array_items, path));
  EDGE_ASSIGN_OR_RETURN(std::int64_t max_items, read_count(o, "maxItems", max_array_items, path));
  const std::int64_t min = std::max<std::int64_t>(min_items, 0);
  if (max_items >= 0 && max_items < min) return error_at(path + ".maxItems", "is below minItems: no array is valid");
  auto k = static_cast<std::int64_t>(prefix.size());
  if (max_items >= 0 && max_items < k) k = max_items;
  if (!items && min > k) return error_at(path + ".minItems", "asks for more items than prefixItems allows");
  const std::int64_t tail_min = std::max<std::int64_t>(0, min - k);
  const std::int64_t tail_max = !items ? 0 : (max_items < 0 ? -1 : std::max<std::int64_t>(0, max_items - k));

  // from(i): the elements from i on; the first one written has no separator before it.
  std::function<expr(std::int64_t)> from = [&](std::int64_t i) -> expr {
    if (i == k) {
      if (tail_max == 0) return expr();
      if (i > 0) return repeat(seq({sep, *items}), tail_min, tail_max);
      const expr item = b_.ref(b_.add_rule(format("{} item", path), *items));
      const expr list = seq({item, repeat(seq({sep, item}), std::max<std::int64_t>(0, tail_min - 1),
                                             tail_max < 0 ? -1 : tail_max - 1)});
      return tail_min == 0 ? optional(list) : list;
    }
    const expr here = i == 0 ? prefix[static_cast<std::size_t>(i)] : seq({sep, prefix[static_cast<std::size_t>(i)]});
    const expr rest = seq({here, from(i + 1)});
    const expr out = i < min ? rest : optional(rest);
    // Each item nests the rest two levels deeper: a rule now and then keeps the text form
    // within the depth parse_grammar reads.
    if (i == 0 || i % static_cast<std::int64_t>(levels_per_rule) != 0) return out;
    return b_.ref(b_.add_rule(format("{} items from {}", path, i), out));
  };
  return seq({literal("["), ws, from(0), ws, literal("]")});
}

result<expr, grammar_error> schema_reader::read_string(simdjson::dom::object o, const std::string& path) {
  EDGE_ASSIGN_OR_RETURN(const std::int64_t min_length, read_count(o, "minLength", max_string_length, path));
  EDGE_ASSIGN_OR_RETURN(const std::int64_t max_length, read_count(o, "maxLength", max_string_length, path));
  if (max_length >= 0 && max_length < std::max<std::int64_t>(min_length, 0)) {
    return error_at(path + ".maxLength", "is below minLength: no string is valid");
  }
  element v;
  if (o["format"].get(v) != simdjson::SUCCESS) return b_.json_string(std::max<std::int64_t>(min_length, 0), max_length);
  const std::string where = path + ".format";
  if (v.type() != element_type::STRING) return error_at(where, "must be a string");
  const std::string_view name = v.get_string().value_unsafe();
  const expr digit = char_class({{'0', '9'}});
  const auto digits = [&](int n) { return repeat(digit, n, n); };
  const expr hex = char_class({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
  // Calendar dates exactly: 30-day months, February's 28 days, and 29 in leap years (every
  // fourth year but centuries not divisible by 400).
  const expr year = digits(4);
  const expr day_28 = alt({seq({literal("0"), char_class({{'1', '9'}})}), seq({literal("1"), digit}),
                           seq({literal("2"), char_class({{'0', '8'}})})});
  const expr day_30 = alt({day_28, literal("29"), literal("30")});
  const expr day_31 = alt({day_30, literal("31")});
  const expr leap_year = alt({seq({digits(2), alt({seq({literal("0"), char_class({{'4', '4'}, {'8', '8'}})}),
                                                  seq({char_class({{'2', '2'}, {'4', '4'}, {'6', '6'}, {'8', '8'}}),
                                                       char_class({{'0', '0'}, {'4', '4'}, {'8', '8'}})}),
                                                  seq({char_class({{'1', '1'}, {'3', '3'}, {'5', '5'}, {'7', '7'}, {'9', '9'}}),
                                                       char_class({{'2', '2'}, {'6', '6'}})})})}),
                              seq({alt({seq({literal("0"), char_class({{'4', '4'}, {'8', '8'}})}),
                                        seq({char_class({{'2', '2'}, {'4', '4'}, {'6', '6'}, {'8', '8'}}),
                                             char_class({{'0', '0'}, {'4', '4'}, {'8', '8'}})}),
                                        seq({char_class({{'1', '1'}, {'3', '3'}, {'5', '5'}, {'7', '7'}, {'9', '9'}}),
                                             char_class({{'2', '2'}, {'6', '6'}})})}),
                                   literal("00")})});
  const expr date = alt({seq({year, literal("-"), alt({literal("01"), literal("03"), literal("05"), literal("07"),
                                                      literal("08"), literal("10"), literal("12")}),
                              literal("-"), day_31}),
                         seq({year, literal("-"), alt({literal("04"), literal("06"), literal("09"), literal("11")}),
                              literal("-"), day_30}),
                         seq({year, literal("-02-"), day_28}), seq({leap_year, literal("-02-29")})});
  const expr hour = alt({seq({char_class({{'0', '1'}}), digit}), seq({literal("2"), char_class({{'0', '3'}})})});
  const expr minute = seq({char_class({{'0', '5'}}), digit});
  const expr offset = alt({char_class({{'Z', 'Z'}, {'z', 'z'}}), seq({char_class({{'+', '+'}, {'-', '-'}}), hour,
                                                                      literal(":"), minute})});
  const expr time = seq({hour, literal(":"), minute, literal(":"), minute,
                         optional(seq({literal("."), repeat(digit, 1, 9)})), offset});
  const expr octet = alt({seq({literal("25"), char_class({{'0', '5'}})}), seq({literal("2"), char_class({{'0', '4'}}), digit}),
                          seq({literal("1"), digit, digit}), seq({char_class({{'1', '9'}}), digit}), digit});
  expr body;
  std::int64_t fixed_length = -1;
  if (name == "date") {
    body = date;
    fixed_length = 10;
  } else if (name == "time") {
    body = time;
  } else if (name == "date-time") {
    body = seq({date, char_class({{'T', 'T'}, {'t', 't'}}), time});
  } else if (name == "uuid") {
    body = seq({repeat(hex, 8, 8), literal("-"), repeat(hex, 4, 4), literal("-"), repeat(hex, 4, 4), literal("-"),
                repeat(hex, 4, 4), literal("-"), repeat(hex, 12, 12)});
    fixed_length = 36;
  } else if (name == "ipv4") {
    body = seq({octet, literal("."), octet, literal("."), octet, literal("."), octet});
  } else {
    return grammar_error(format("'{}' is '{}': the formats enforced are date, time, date-time, uuid and ipv4", where, name),
                         where);
  }
  if (min_length >= 0 || max_length >= 0) {
    const bool fits = fixed_length >= 0 && fixed_length >= std::max<std::int64_t>(min_length, 0) &&
                      (max_length < 0 || fixed_length <= max_length);
    if (!fits) {
      const std::string keyword = min_length >= 0 ? "minLength" : "maxLength";
      return unsupported(path, keyword, format("{} together with format '{}' is not supported", keyword, name));
    }
  }
  return seq({literal("\""), body, literal("\"")});
}

result<expr, grammar_error> schema_reader::read_number(simdjson::dom::object o, bool integer, const std::string& path) {
  number_range range;
  range.integer = integer;
  element v;
  if (o["multipleOf"].get(v) == simdjson::SUCCESS) {
    const bool one = (v.type() == element_type::INT64 && v.get_int64().value_unsafe() == 1) ||
                     (v.type() == element_type::DOUBLE && v.get_double().value_unsafe() == 1.0);
    if (!(integer && one)) return unsupported(path, "multipleOf", "multipleOf is not enforced (only 1, for integers)");
  }
  const auto bound = [&](std::string_view key) -> result<std::optional<decimal>, grammar_error> {
    element b;
    if (o[key].get(b) != simdjson::SUCCESS) return std::optional<decimal>();
    const std::string where = path + "." + std::string(key);
    decimal d;
    if (b.type() == element_type::INT64) {
      d = decimal::of(b.get_int64().value_unsafe());
    } else if (b.type() == element_type::DOUBLE) {
      d = decimal::of(b.get_double().value_unsafe());
    } else if (b.type() == element_type::UINT64) {
      d = *decimal::parse(std::to_string(b.get_uint64().value_unsafe()));
    } else if (b.type() == element_type::BOOL && (key == "exclusiveMinimum" || key == "exclusiveMaximum")) {
      return std::optional<decimal>();  // draft 4's form: read beside minimum / maximum
    } else {
      return error_at(where, "must be a number");
    }
    if (d.significant_digits() > number_range::max_significant_digits) {
      return grammar_error(format("'{}' is {}: bounds of more than {} significant digits are not enforced exactly", where,
                                  d.str(), number_range::max_significant_digits),
                           where);
    }
    return std::optional<decimal>(std::move(d));
  };
  const auto draft4_flag = [&](std::string_view key) {
    element b;
    return o[key].get(b) == simdjson::SUCCESS && b.type() == element_type::BOOL && b.get_bool().value_unsafe();
  };
  EDGE_ASSIGN_OR_RETURN(const auto minimum, bound("minimum"));
  EDGE_ASSIGN_OR_RETURN(const auto maximum, bound("maximum"));
  EDGE_ASSIGN_OR_RETURN(const auto exclusive_minimum, bound("exclusiveMinimum"));
  EDGE_ASSIGN_OR_RETURN(const auto exclusive_maximum, bound("exclusiveMaximum"));
  range.low = minimum;
  range.low_exclusive = draft4_flag("exclusiveMinimum");
  if (exclusive_minimum && (!range.low || compare(*exclusive_minimum, *range.low) >= 0)) {
    range.low = exclusive_minimum;
    range.low_exclusive = true;
  }
  range.high = maximum;
  range.high_exclusive = draft4_flag("exclusiveMaximum");
  if (exclusive_maximum && (!range.high || compare(*exclusive_maximum, *range.high) <= 0)) {
    range.high = exclusive_maximum;
    range.high_exclusive = true;
  }
  if (range.low && range.high) {
    const int c = compare(*range.low, *range.high);
    if (c > 0 || (c == 0 && (range.low_exclusive || range.high_exclusive))) {
      return error_at(path, "has bounds no number lies between");
    }
  }
  return number(std::move(range));
}

result<expr, grammar_error> schema_reader::read_enum(simdjson::dom::object, element values, unsigned types,
                                                     const std::string& path) {
  std::vector<element> listed;
  if (values.type() == element_type::ARRAY) {
    const simdjson::dom::array items = values.get_array().value_unsafe();
    for (element value : items) listed.push_back(value);
  } else {
    listed.push_back(values);  // const
  }
  std::vector<expr> options;
  std::set<std::string> seen;
  for (element value : listed) {
    if ((type_of(value) & types) == 0) continue;
    std::string text = canonical(value);
    if (seen.insert(text).second) options.push_back(literal(text));
  }
  if (options.empty()) return error_at(path, "lists no value of the types it allows");
  return alt(std::move(options));
}

// allOf is enforced where it can be honestly: one schema (then it is that schema), or object
// schemas describing different properties, whose union is written (each part's other
// properties are additional to it, which its additionalProperties must allow).
result<expr, grammar_error> schema_reader::read_all_of(simdjson::dom::object o, element all, const std::string& path,
                                                       int depth) {
  const std::string where = path + ".allOf";
  const auto parts = all.get_array().value_unsafe();
  for (auto field : o) {
    if (annotation_keywords().contains(field.key) || field.key == "allOf" || field.key == "nullable") continue;
    if (field.key == "type") {
      element t = field.value;
      if (t.type() == element_type::STRING && t.get_string().value_unsafe() == "object") continue;
    }
    return unsupported(path, field.key, format("'{}' beside allOf is not supported", field.key));
  }
  if (parts.size() == 1) return read(parts.at(0).value_unsafe(), where + "[0]", depth + 1);
  // Merge: every part an object schema with properties of its own, none closing itself.
  std::string merged = "{\"type\":\"object\",\"properties\":{";
  std::string required = "[";
  std::set<std::string> names;
  std::size_t i = 0;
  for (element part : parts) {
    const std::string part_path = format("{}[{}]", where, i++);
    simdjson::dom::object po;
    if (part.get_object().get(po) != simdjson::SUCCESS) {
      return error_at(part_path, "must be an object schema: allOf of several schemas is enforced for objects only");
    }
    for (auto field : po) {
      if (annotation_keywords().contains(field.key) || field.key == "properties" || field.key == "required") continue;
      if (field.key == "type" && field.value.type() == element_type::STRING &&
          field.value.get_string().value_unsafe() == "object") {
        continue;
      }
      return unsupported(part_path, field.key,
                         format("'{}' in a part of allOf is not supported (parts are merged: properties and required only)",
                                field.key));
    }
    element props;
    if (po["properties"].get(props) == simdjson::SUCCESS && props.type() == element_type::OBJECT) {
      const simdjson::dom::object listed_items_8 = props.get_object().value_unsafe();
      for (auto field : listed_items_8) {
        if (!names.insert(std::string(field.key)).second) {
          return error_at(part_path + ".properties." + std::string(field.key),
                          "is described by two parts of allOf: such parts are not merged");
        }
        if (merged.back() != '{') merged += ',';
        append_json_string(merged, field.key);
        merged += ':';
        append_value(merged, field.value);
      }
    }
    element req;
    if (po["required"].get(req) == simdjson::SUCCESS && req.type() == element_type::ARRAY) {
      const simdjson::dom::array listed_items_9 = req.get_array().value_unsafe();
      for (element name : listed_items_9) {
        if (required.size() > 1) required += ',';
        append_value(required, name);
      }
    }
  }
  merged += "},\"required\":" + required + "]}";
  // The merged schema is read on its own; references inside it still resolve against the root.
  simdjson::dom::parser parser;
  element doc;
  if (parser.parse(merged).get(doc) != simdjson::SUCCESS) return error_at(where, "could not be merged");
  return read(doc, where, depth + 1);
}

// oneOf is enforced where its schemas cannot match the same value: where their types differ.
result<expr, grammar_error> schema_reader::read_one_of(element options, const std::string& path, int depth) {
  unsigned seen = 0;
  std::vector<expr> out;
  std::size_t i = 0;
  const simdjson::dom::array listed_items_10 = options.get_array().value_unsafe();
  for (element option : listed_items_10) {
    const std::string where = format("{}[{}]", path, i++);
    unsigned types = 0;
    simdjson::dom::object po;
    element t;
    if (option.get_object().get(po) == simdjson::SUCCESS && po["type"].get(t) == simdjson::SUCCESS &&
        t.type() == element_type::STRING) {
      types = type_from_name(t.get_string().value_unsafe()).value_or(0);
      if (types == t_number) types |= t_integer;
      if (types == t_integer) types |= t_number;
    }
    element nullable;
    if (types != 0 && po["nullable"].get(nullable) == simdjson::SUCCESS && nullable.type() == element_type::BOOL &&
        nullable.get_bool().value_unsafe()) {
      types |= t_null;
    }
    if (types == 0 || (types & seen) != 0) {
      return grammar_error(format("'{}': oneOf is enforced only when each schema names one type of its own; use anyOf",
                                  where),
                           where);
    }
    seen |= types;
    EDGE_ASSIGN_OR_RETURN(expr e, read(option, where, depth + 1));
    out.push_back(std::move(e));
  }
  return alt(std::move(out));
}

result<expr, grammar_error> grammar_builder::json_schema(std::string_view schema, const json_schema_options& options) {
  simdjson::dom::parser parser;
  element root;
  if (const auto error = parser.parse(schema).get(root); error != simdjson::SUCCESS) {
    return grammar_error(format("'{}' is not valid JSON: {}", options.path, simdjson::error_message(error)), options.path);
  }
  schema_reader reader(*this, root, options.path);
  if (options.pointer.empty()) return reader.read(root, options.path, 0);
  element target;
  if (root.at_pointer(options.pointer).get(target) != simdjson::SUCCESS) {
    return grammar_error(format("'{}' has nothing at '{}'", options.path, options.pointer), options.path);
  }
  return reader.read(target, path_of_pointer(options.path, options.pointer), 0);
}

}  // namespace edge::backend::grammar
