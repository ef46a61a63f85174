#include "edge/backend/grammar/grammar.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "edge/common/format.h"
#include "edge/common/json_text.h"

namespace edge::backend::grammar {

// ---- decimals ------------------------------------------------------------------------------------

namespace {

// Drops leading and trailing zeros, moving the exponent with the trailing ones.
decimal normalized(bool negative, std::string digits, std::int64_t exponent) {
  const auto first = digits.find_first_not_of('0');
  if (first == std::string::npos) return decimal{};
  digits.erase(0, first);
  const auto last = digits.find_last_not_of('0');
  exponent += static_cast<std::int64_t>(digits.size() - 1 - last);
  digits.erase(last + 1);
  return decimal{negative, std::move(digits), static_cast<std::int32_t>(exponent)};
}

// Exponents past this are not numbers any schema means; they would make digit strings huge.
constexpr std::int64_t max_decimal_exponent = 400;

}  // namespace

std::optional<decimal> decimal::parse(std::string_view text) {
  if (!is_json_number(text)) return std::nullopt;
  bool negative = false;
  std::size_t at = 0;
  if (text[at] == '-') {
    negative = true;
    ++at;
  }
  std::string digits;
  std::int64_t exponent = 0;
  while (at < text.size() && text[at] >= '0' && text[at] <= '9') digits += text[at++];
  if (at < text.size() && text[at] == '.') {
    ++at;
    while (at < text.size() && text[at] >= '0' && text[at] <= '9') {
      digits += text[at++];
      --exponent;
    }
  }
  if (at < text.size() && (text[at] == 'e' || text[at] == 'E')) {
    ++at;
    bool minus = false;
    if (text[at] == '+' || text[at] == '-') minus = text[at++] == '-';
    std::int64_t e = 0;
    while (at < text.size()) {
      e = e * 10 + (text[at++] - '0');
      if (e > max_decimal_exponent * 10) return std::nullopt;
    }
    exponent += minus ? -e : e;
  }
  if (exponent > max_decimal_exponent || exponent < -max_decimal_exponent) return std::nullopt;
  decimal d = normalized(negative, std::move(digits), exponent);
  return d;
}

decimal decimal::of(double value) { return *parse(json_number(value)); }

decimal decimal::of(std::int64_t value) {
  const bool negative = value < 0;
  std::string digits = std::to_string(value);
  if (negative) digits.erase(0, 1);
  return normalized(negative, std::move(digits), 0);
}

std::int32_t decimal::significant_digits() const {
  return digits == "0" ? 0 : static_cast<std::int32_t>(digits.size());
}

std::string decimal::str() const {
  if (digits == "0") return "0";
  std::string out = negative ? "-" : "";
  out += digits;
  if (exponent != 0) out += format("e{}", exponent);
  return out;
}

int compare(const decimal& a, const decimal& b) {
  const bool a_zero = a.digits == "0";
  const bool b_zero = b.digits == "0";
  if (a_zero && b_zero) return 0;
  const int a_sign = a_zero ? 0 : (a.negative ? -1 : 1);
  const int b_sign = b_zero ? 0 : (b.negative ? -1 : 1);
  if (a_sign != b_sign) return a_sign < b_sign ? -1 : 1;
  // Same sign: compare magnitudes, then flip for negatives.
  const std::int64_t a_top = static_cast<std::int64_t>(a.digits.size()) + a.exponent;  // position past the first digit
  const std::int64_t b_top = static_cast<std::int64_t>(b.digits.size()) + b.exponent;
  int magnitude = 0;
  if (a_top != b_top) {
    magnitude = a_top < b_top ? -1 : 1;
  } else {
    const std::size_t n = std::max(a.digits.size(), b.digits.size());
    for (std::size_t i = 0; i < n && magnitude == 0; ++i) {
      const char x = i < a.digits.size() ? a.digits[i] : '0';
      const char y = i < b.digits.size() ? b.digits[i] : '0';
      if (x != y) magnitude = x < y ? -1 : 1;
    }
  }
  return a_sign < 0 ? -magnitude : magnitude;
}

// ---- expressions ---------------------------------------------------------------------------------

expr make_expr(expr_node node) { return expr(std::make_shared<const expr_node>(std::move(node))); }

expr::expr() : node_(std::make_shared<const expr_node>()) {}
expr_kind expr::kind() const { return node_->kind; }

namespace {

constexpr char32_t max_codepoint = 0x10FFFF;
constexpr char32_t surrogate_first = 0xD800;
constexpr char32_t surrogate_last = 0xDFFF;

// Sorted, merged, clipped to Unicode, without surrogates; the complement when negated.
std::vector<codepoint_range> normalize_ranges(std::vector<codepoint_range> ranges, bool negated) {
  for (auto& r : ranges) {
    if (r.first > r.last) std::swap(r.first, r.last);
    r.last = std::min(r.last, max_codepoint);
  }
  std::erase_if(ranges, [](const codepoint_range& r) { return r.first > max_codepoint; });
  std::sort(ranges.begin(), ranges.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<codepoint_range> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().last + 1) {
      merged.back().last = std::max(merged.back().last, r.last);
    } else {
      merged.push_back(r);
    }
  }
  if (negated) {
    std::vector<codepoint_range> complement;
    char32_t next = 0;
    for (const auto& r : merged) {
      if (r.first > next) complement.push_back({next, r.first - 1});
      next = r.last + 1;
    }
    if (next <= max_codepoint) complement.push_back({next, max_codepoint});
    merged = std::move(complement);
  }
  std::vector<codepoint_range> out;
  for (const auto& r : merged) {
    if (r.last < surrogate_first || r.first > surrogate_last) {
      out.push_back(r);
      continue;
    }
    if (r.first < surrogate_first) out.push_back({r.first, surrogate_first - 1});
    if (r.last > surrogate_last) out.push_back({surrogate_last + 1, r.last});
  }
  return out;
}

expr class_expr(expr_kind kind, std::vector<codepoint_range> ranges, bool negated) {
  expr_node n;
  n.kind = kind;
  n.ranges = normalize_ranges(std::move(ranges), negated);
  return make_expr(std::move(n));
}

// Flattens nested pieces of the same kind and drops empty parts of a sequence.
expr group(expr_kind kind, std::vector<expr> items) {
  std::vector<expr> flat;
  for (expr& item : items) {
    if (item.kind() == kind) {
      for (const expr& inner : item.node().items) flat.push_back(inner);
    } else if (kind == expr_kind::sequence && item.kind() == expr_kind::empty) {
      continue;
    } else {
      flat.push_back(std::move(item));
    }
  }
  if (kind == expr_kind::sequence && flat.empty()) return expr();
  if (flat.size() == 1) return flat.front();
  expr_node n;
  n.kind = kind;
  n.items = std::move(flat);
  return make_expr(std::move(n));
}

}  // namespace

expr literal(std::string_view bytes) {
  if (bytes.empty()) return expr();
  expr_node n;
  n.kind = expr_kind::literal;
  n.text = std::string(bytes);
  return make_expr(std::move(n));
}

expr special_token(std::string_view text) {
  expr_node n;
  n.kind = expr_kind::special_token;
  n.text = std::string(text);
  return make_expr(std::move(n));
}

expr char_class(std::vector<codepoint_range> ranges, bool negated) {
  return class_expr(expr_kind::char_class, std::move(ranges), negated);
}

expr json_char_class(std::vector<codepoint_range> ranges, bool negated) {
  return class_expr(expr_kind::json_char_class, std::move(ranges), negated);
}

expr any_json_char() {
  expr_node n;
  n.kind = expr_kind::any_json_char;
  return make_expr(std::move(n));
}

expr seq(std::vector<expr> items) { return group(expr_kind::sequence, std::move(items)); }
expr alt(std::vector<expr> items) {
  if (items.empty()) return expr();
  return group(expr_kind::alternation, std::move(items));
}

expr repeat(expr item, std::int64_t min, std::int64_t max) {
  min = std::max<std::int64_t>(min, 0);
  if (max >= 0 && max < min) max = min;
  if (max == 0 || item.kind() == expr_kind::empty) return expr();
  if (min == 1 && max == 1) return item;
  expr_node n;
  n.kind = expr_kind::repeat;
  n.items = {std::move(item)};
  n.min = min;
  n.max = max;
  return make_expr(std::move(n));
}

expr optional(expr item) { return repeat(std::move(item), 0, 1); }
expr star(expr item) { return repeat(std::move(item), 0, -1); }
expr plus(expr item) { return repeat(std::move(item), 1, -1); }

expr number(number_range range) {
  expr_node n;
  n.kind = expr_kind::number;
  n.number = std::move(range);
  return make_expr(std::move(n));
}

// ---- the text form -------------------------------------------------------------------------------
//
//   grammar   (grammar (rule NAME EXPR)... (root EXPR))
//   EXPR      () | (lit HEX) | (tok HEX) | (cls LO HI ...) | (jcls LO HI ...) | (jchar)
//             | (seq EXPR...) | (alt EXPR...) | (rep MIN MAX EXPR) | (ref N)
//             | (num int|real LOW LOWX HIGH HIGHX)     bounds as JSON numbers or _, X 0 or 1
// Bytes are written in hex (names too), so nothing needs escaping.

namespace {

constexpr std::string_view hex_digits = "0123456789abcdef";

void append_hex(std::string& out, std::string_view bytes) {
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    out += hex_digits[b >> 4];
    out += hex_digits[b & 15];
  }
}

void append_decimal(std::string& out, const std::optional<decimal>& d) { out += d ? d->str() : "_"; }

void write_expr(std::string& out, const expr& e) {
  const expr_node& n = e.node();
  switch (n.kind) {
    case expr_kind::empty: out += "()"; return;
    case expr_kind::literal: out += "(lit "; append_hex(out, n.text); out += ')'; return;
    case expr_kind::special_token: out += "(tok "; append_hex(out, n.text); out += ')'; return;
    case expr_kind::char_class:
    case expr_kind::json_char_class:
      out += n.kind == expr_kind::char_class ? "(cls" : "(jcls";
      for (const auto& r : n.ranges) out += format(" {} {}", static_cast<std::uint32_t>(r.first), static_cast<std::uint32_t>(r.last));
      out += ')';
      return;
    case expr_kind::any_json_char: out += "(jchar)"; return;
    case expr_kind::sequence:
    case expr_kind::alternation:
      out += n.kind == expr_kind::sequence ? "(seq" : "(alt";
      for (const expr& item : n.items) {
        out += ' ';
        write_expr(out, item);
      }
      out += ')';
      return;
    case expr_kind::repeat:
      out += format("(rep {} {} ", n.min, n.max);
      write_expr(out, n.items.front());
      out += ')';
      return;
    case expr_kind::rule_ref: out += format("(ref {})", n.rule); return;
    case expr_kind::number:
      out += n.number.integer ? "(num int " : "(num real ";
      append_decimal(out, n.number.low);
      out += n.number.low_exclusive ? " 1 " : " 0 ";
      append_decimal(out, n.number.high);
      out += n.number.high_exclusive ? " 1)" : " 0)";
      return;
  }
}

std::string grammar_text(const std::vector<rule>& rules, const expr& root) {
  std::string out = "(grammar";
  for (const rule& r : rules) {
    out += " (rule ";
    append_hex(out, r.name.empty() ? std::string_view("_") : std::string_view(r.name));
    out += ' ';
    write_expr(out, r.body);
    out += ')';
  }
  out += " (root ";
  write_expr(out, root);
  out += "))";
  return out;
}

// A reader of the text form. Depth and size are bounded: the text comes over the network.
class text_reader {
 public:
  explicit text_reader(std::string_view text) : text_(text) {}

  result<grammar> read(std::vector<rule>& rules, expr& root) {
    EDGE_RETURN_IF_ERROR(open("grammar"));
    for (;;) {
      skip_space();
      if (peek_word("(rule")) {
        EDGE_RETURN_IF_ERROR(open("rule"));
        EDGE_ASSIGN_OR_RETURN(std::string name, hex());
        EDGE_ASSIGN_OR_RETURN(expr body, read_expr(0));
        EDGE_RETURN_IF_ERROR(close());
        if (rules.size() >= max_rules) return fail("too many rules");
        rules.push_back({std::move(name), std::move(body)});
        continue;
      }
      EDGE_RETURN_IF_ERROR(open("root"));
      EDGE_ASSIGN_OR_RETURN(root, read_expr(0));
      EDGE_RETURN_IF_ERROR(close());
      EDGE_RETURN_IF_ERROR(close());
      skip_space();
      if (at_ != text_.size()) return fail("text after the grammar");
      return grammar{};
    }
  }

  result<expr> read_expr(int depth) {
    if (depth > max_depth) return fail("nested too deeply");
    skip_space();
    if (at_ + 1 < text_.size() && text_.substr(at_, 2) == "()") {
      at_ += 2;
      return expr();
    }
    if (!eat('(')) return fail("expected '('");
    const std::string_view word = token();
    expr out;
    if (word == "lit" || word == "tok") {
      EDGE_ASSIGN_OR_RETURN(const std::string bytes, hex());
      out = word == "lit" ? literal(bytes) : special_token(bytes);
    } else if (word == "cls" || word == "jcls") {
      std::vector<codepoint_range> ranges;
      for (;;) {
        skip_space();
        if (peek(')')) break;
        EDGE_ASSIGN_OR_RETURN(const std::int64_t first, integer(0, max_codepoint));
        EDGE_ASSIGN_OR_RETURN(const std::int64_t last, integer(0, max_codepoint));
        if (ranges.size() >= max_items) return fail("too many ranges");
        ranges.push_back({static_cast<char32_t>(first), static_cast<char32_t>(last)});
      }
      out = word == "cls" ? char_class(std::move(ranges)) : json_char_class(std::move(ranges));
    } else if (word == "jchar") {
      out = any_json_char();
    } else if (word == "seq" || word == "alt") {
      std::vector<expr> items;
      for (;;) {
        skip_space();
        if (peek(')')) break;
        if (items.size() >= max_items) return fail("too many items");
        EDGE_ASSIGN_OR_RETURN(expr item, read_expr(depth + 1));
        items.push_back(std::move(item));
      }
      out = word == "seq" ? seq(std::move(items)) : alt(std::move(items));
    } else if (word == "rep") {
      EDGE_ASSIGN_OR_RETURN(const std::int64_t min, integer(0, max_count));
      EDGE_ASSIGN_OR_RETURN(const std::int64_t max, integer(-1, max_count));
      EDGE_ASSIGN_OR_RETURN(expr item, read_expr(depth + 1));
      out = repeat(std::move(item), min, max);
    } else if (word == "ref") {
      EDGE_ASSIGN_OR_RETURN(const std::int64_t id, integer(0, max_rules));
      expr_node n;
      n.kind = expr_kind::rule_ref;
      n.rule = static_cast<rule_id>(id);
      out = make_expr(std::move(n));
    } else if (word == "num") {
      number_range range;
      const std::string_view kind = token();
      if (kind != "int" && kind != "real") return fail("expected int or real");
      range.integer = kind == "int";
      EDGE_ASSIGN_OR_RETURN(range.low, bound());
      EDGE_ASSIGN_OR_RETURN(const std::int64_t low_x, integer(0, 1));
      EDGE_ASSIGN_OR_RETURN(range.high, bound());
      EDGE_ASSIGN_OR_RETURN(const std::int64_t high_x, integer(0, 1));
      range.low_exclusive = low_x == 1;
      range.high_exclusive = high_x == 1;
      out = number(std::move(range));
    } else {
      return fail(format("unknown piece '{}'", word));
    }
    EDGE_RETURN_IF_ERROR(close());
    return out;
  }

 private:
  static constexpr int max_depth = 200;
  static constexpr std::size_t max_rules = 100'000;
  static constexpr std::size_t max_items = 1'000'000;
  static constexpr std::int64_t max_count = 1'000'000;

  status fail(std::string_view what) const { return invalid_argument(format("grammar text at byte {}: {}", at_, what)); }

  void skip_space() {
    while (at_ < text_.size() && text_[at_] == ' ') ++at_;
  }
  bool peek(char c) const { return at_ < text_.size() && text_[at_] == c; }
  bool eat(char c) {
    skip_space();
    if (!peek(c)) return false;
    ++at_;
    return true;
  }
  bool peek_word(std::string_view word) const { return text_.substr(at_).starts_with(word); }
  std::string_view token() {
    skip_space();
    const std::size_t begin = at_;
    while (at_ < text_.size() && text_[at_] != ' ' && text_[at_] != '(' && text_[at_] != ')') ++at_;
    return text_.substr(begin, at_ - begin);
  }
  status open(std::string_view word) {
    if (!eat('(')) return fail("expected '('");
    if (token() != word) return fail(format("expected '{}'", word));
    return {};
  }
  status close() {
    if (!eat(')')) return fail("expected ')'");
    return {};
  }
  result<std::string> hex() {
    const std::string_view t = token();
    if (t == "_") return std::string();
    if (t.size() % 2 != 0) return fail("odd hex digits");
    std::string out;
    for (std::size_t i = 0; i < t.size(); i += 2) {
      const auto hi = hex_digits.find(t[i]);
      const auto lo = hex_digits.find(t[i + 1]);
      if (hi == std::string_view::npos || lo == std::string_view::npos) return fail("expected hex digits");
      out += static_cast<char>(hi * 16 + lo);
    }
    return out;
  }
  result<std::int64_t> integer(std::int64_t low, std::int64_t high) {
    const std::string_view t = token();
    std::int64_t v = 0;
    const auto [end, error] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (error != std::errc() || end != t.data() + t.size() || v < low || v > high) return fail("expected an integer");
    return v;
  }
  result<std::optional<decimal>> bound() {
    const std::string_view t = token();
    if (t == "_") return std::optional<decimal>();
    auto d = decimal::parse(t);
    if (!d) return fail("expected a number");
    return std::optional<decimal>(std::move(*d));
  }

  std::string_view text_;
  std::size_t at_ = 0;
};

// Every rule_ref names a rule of `rules`.
status check_refs(const expr& e, std::size_t rules) {
  const expr_node& n = e.node();
  if (n.kind == expr_kind::rule_ref && (n.rule < 0 || static_cast<std::size_t>(n.rule) >= rules)) {
    return invalid_argument(format("a reference to rule {}, of {}", n.rule, rules));
  }
  for (const expr& item : n.items) EDGE_RETURN_IF_ERROR(check_refs(item, rules));
  return {};
}

}  // namespace

result<grammar> parse_grammar(std::string_view text) {
  grammar g;
  text_reader reader(text);
  EDGE_RETURN_IF_ERROR(reader.read(g.rules_, g.root_).error());
  for (const rule& r : g.rules_) EDGE_RETURN_IF_ERROR(check_refs(r.body, g.rules_.size()));
  EDGE_RETURN_IF_ERROR(check_refs(g.root_, g.rules_.size()));
  g.text_ = grammar_text(g.rules_, g.root_);
  return g;
}

// ---- the builder ---------------------------------------------------------------------------------

grammar_builder::grammar_builder() = default;

rule_id grammar_builder::declare(std::string name) {
  rules_.push_back({std::move(name), expr()});
  defined_.push_back(false);
  return static_cast<rule_id>(rules_.size() - 1);
}

status grammar_builder::define(rule_id id, expr body) {
  if (id < 0 || static_cast<std::size_t>(id) >= rules_.size()) return invalid_argument(format("no rule {}", id));
  if (defined_[static_cast<std::size_t>(id)]) {
    return invalid_argument(format("rule '{}' is defined already", rules_[static_cast<std::size_t>(id)].name));
  }
  rules_[static_cast<std::size_t>(id)].body = std::move(body);
  defined_[static_cast<std::size_t>(id)] = true;
  return {};
}

rule_id grammar_builder::add_rule(std::string name, expr body) {
  const rule_id id = declare(std::move(name));
  static_cast<void>(define(id, std::move(body)));
  return id;
}

expr grammar_builder::ref(rule_id id) const {
  expr_node n;
  n.kind = expr_kind::rule_ref;
  n.rule = id;
  return make_expr(std::move(n));
}

rule_id grammar_builder::shared_rule(const std::string& key, const std::function<expr()>& make) {
  for (const auto& [k, id] : shared_) {
    if (k == key) return id;
  }
  // Declared before it is made: a shared rule may use itself (JSON values nest).
  const rule_id id = declare(key);
  shared_.emplace_back(key, id);
  static_cast<void>(define(id, make()));
  return id;
}

expr grammar_builder::whitespace() {
  return ref(shared_rule("ws", [] {
    return optional(alt({literal(" "), seq({literal("\n"), repeat(literal(" "), 0, max_indent)})}));
  }));
}

expr grammar_builder::json_string(std::int64_t min_length, std::int64_t max_length) {
  const std::string key = format("string{{{},{}}}", min_length, max_length);
  return ref(shared_rule(key, [&] {
    return seq({literal("\""), repeat(any_json_char(), min_length, max_length), literal("\"")});
  }));
}

expr grammar_builder::json_value() {
  return ref(shared_rule("value", [this] {
    const expr ws = whitespace();
    const expr value_ref = json_value();  // the rule itself: declared already
    const expr object = ref(shared_rule("object", [&] {
      const expr member = seq({json_string(), ws, literal(":"), ws, value_ref});
      return seq({literal("{"), ws, optional(seq({member, star(seq({ws, literal(","), ws, member})), ws})),
                  literal("}")});
    }));
    const expr array = ref(shared_rule("array", [&] {
      return seq({literal("["), ws, optional(seq({value_ref, star(seq({ws, literal(","), ws, value_ref})), ws})),
                  literal("]")});
    }));
    const expr numeric = ref(shared_rule("number", [] { return number({}); }));
    return alt({object, array, json_string(), numeric, literal("true"), literal("false"), literal("null")});
  }));
}

expr grammar_builder::json_object() {
  static_cast<void>(json_value());
  for (const auto& [k, id] : shared_) {
    if (k == "object") return ref(id);
  }
  return json_value();  // unreachable: json_value() made it
}

result<grammar> grammar_builder::build(expr root) const {
  for (std::size_t i = 0; i < rules_.size(); ++i) {
    if (!defined_[i]) return invalid_argument(format("rule '{}' was declared but never defined", rules_[i].name));
    EDGE_RETURN_IF_ERROR(check_refs(rules_[i].body, rules_.size()));
  }
  EDGE_RETURN_IF_ERROR(check_refs(root, rules_.size()));
  grammar g;
  g.rules_ = rules_;
  g.root_ = std::move(root);
  g.text_ = grammar_text(g.rules_, g.root_);
  return g;
}

}  // namespace edge::backend::grammar
