// Jinja's grammar, as its own parser reads it (precedence from loosest to tightest):
//   conditional (a if b else c) < or < and < not < comparisons, in, not in (chained) < + - <
//   ~ < * / // % < ** < unary - + < postfix (.attr, [key], [a:b:c], (args)) and filters | and
//   tests `is`, read left to right after a unary operand.
#include <limits>

#include "ast.h"
#include "interpreter.h"
#include "edge/common/format.h"
#include "lexer.h"

namespace edge::backend::jinja {
namespace {

// Nesting deeper than this (brackets, expressions, blocks) is refused, so that neither parsing
// nor rendering can exhaust the stack.
constexpr int max_nesting = 256;

// Whether the statements under `n` use the name `loop` (a for loop builds it only then).
bool mentions_loop(const node* n) {
  if (n == nullptr) return false;
  if (n->kind == node_kind::name && n->text == "loop") return true;
  for (const auto& child : n->children) {
    if (mentions_loop(child.get())) return true;
  }
  for (const auto& [key, child] : n->keywords) {
    if (mentions_loop(child.get())) return true;
  }
  return false;
}

class parser {
 public:
  explicit parser(std::vector<token> tokens) : tokens_(std::move(tokens)) {}

  node_ptr parse_template() {
    auto root = parse_body({});
    if (current().type != token_type::end) fail_here("unexpected tag");
    return root;
  }

 private:
  // ---- the token stream ------------------------------------------------------------------------
  const token& current() const { return tokens_[pos_]; }
  const token& peek(std::size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool at_op(std::string_view op) const { return current().type == token_type::op && current().value == op; }
  bool at_name(std::string_view name) const { return current().type == token_type::name && current().value == name; }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    advance();
    return true;
  }

  static std::string describe(const token& t) {
    switch (t.type) {
      case token_type::end: return "the end of the template";
      case token_type::text: return "template text";
      case token_type::var_begin: return "'{{'";
      case token_type::var_end: return "'}}'";
      case token_type::block_begin: return "'{%'";
      case token_type::block_end: return "'%}'";
      case token_type::string: return "a string";
      case token_type::integer:
      case token_type::floating: return format("'{}'", t.value);
      default: return format("'{}'", t.value);
    }
  }

  [[noreturn]] void fail_at(const token& t, const std::string& what) const { throw syntax_error(what, t.line, t.column); }
  [[noreturn]] void fail_here(const std::string& what) const {
    fail_at(current(), format("{}: found {}", what, describe(current())));
  }

  void expect_op(std::string_view op) {
    if (!skip_op(op)) fail_here(format("expected '{}'", op));
  }
  std::string expect_name() {
    if (current().type != token_type::name) fail_here("expected a name");
    std::string name = current().value;
    advance();
    return name;
  }
  void expect_block_end() {
    if (current().type != token_type::block_end) fail_here("expected '%}'");
    advance();
  }

  node_ptr make(node_kind kind, const token& at) {
    auto n = std::make_unique<node>();
    n->kind = kind;
    n->line = at.line;
    n->column = at.column;
    return n;
  }

  struct nesting {
    explicit nesting(parser& p) : p_(p) {
      if (++p_.depth_ > max_nesting) p_.fail_here(format("the template nests more than {} levels deep", max_nesting));
    }
    ~nesting() { --p_.depth_; }
    nesting(const nesting&) = delete;
    nesting& operator=(const nesting&) = delete;
    parser& p_;
  };

  // ---- statements --------------------------------------------------------------------------------

  // Statements up to a tag named in `ends` (its "{%" and name are left unread) or the end.
  node_ptr parse_body(std::initializer_list<std::string_view> ends) {
    const nesting guard(*this);
    auto body = make(node_kind::body, current());
    while (true) {
      const token& t = current();
      if (t.type == token_type::end) {
        if (ends.size() > 0) {
          std::string names;
          for (const auto end : ends) names += (names.empty() ? "'" : " or '") + std::string(end) + "'";
          fail_at(t, format("the template ends before {}", names));
        }
        return body;
      }
      if (t.type == token_type::text) {
        auto text = make(node_kind::text, t);
        // The template's own text and string literals are its markup (jinja.h).
        text->literal = value::markup(t.value);
        body->children.push_back(std::move(text));
        advance();
      } else if (t.type == token_type::var_begin) {
        advance();
        auto out = make(node_kind::output, t);
        out->children.push_back(parse_tuple(true, {}, false));
        if (current().type != token_type::var_end) fail_here("expected '}}'");
        advance();
        body->children.push_back(std::move(out));
      } else if (t.type == token_type::block_begin) {
        const token& name = peek();
        if (name.type == token_type::name) {
          for (const auto end : ends) {
            if (name.value == end) return body;
          }
        }
        advance();
        body->children.push_back(parse_statement());
      } else {
        fail_here("unexpected token");
      }
    }
  }

  // After "{%": the statement and its end.
  node_ptr parse_statement() {
    const token start = current();
    if (start.type != token_type::name) fail_here("expected a statement name");
    const std::string& name = start.value;
    advance();
    if (name == "if") return parse_if(start);
    if (name == "for") return parse_for(start);
    if (name == "set") return parse_set(start);
    if (name == "macro") return parse_macro(start);
    if (name == "call") return parse_call_block(start);
    if (name == "filter") return parse_filter_block(start);
    if (name == "with") return parse_with(start);
    if (name == "generation") {
      // transformers' tag marking the assistant's tokens: rendered as its body.
      expect_block_end();
      auto body = parse_body({"endgeneration"});
      end_tag("endgeneration");
      return body;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail_at(start, format("'{}' outside of a loop", name));
      expect_block_end();
      return make(name == "break" ? node_kind::break_loop : node_kind::continue_loop, start);
    }
    if (name == "extends" || name == "include" || name == "import" || name == "from" || name == "block" ||
        name == "do" || name == "autoescape") {
      fail_at(start, format("'{}' is not supported in chat templates", name));
    }
    fail_at(start, format("unknown tag '{}'", name));
  }

  // "{% name %}" closing a block (its "{%" is current).
  void end_tag(std::string_view name) {
    advance();  // {%
    if (!skip_name(name)) fail_here(format("expected '{}'", name));
    expect_block_end();
  }

  node_ptr parse_if(const token& start) {
    auto n = make(node_kind::if_block, start);
    n->children.push_back(parse_tuple(true, {}, false));
    expect_block_end();
    n->children.push_back(parse_body({"elif", "else", "endif"}));
    advance();  // {%
    if (at_name("elif")) {
      const token elif = current();
      advance();
      auto body = make(node_kind::body, elif);
      body->children.push_back(parse_if(elif));  // reads up to and with endif
      n->children.push_back(std::move(body));
      return n;
    }
    if (skip_name("else")) {
      expect_block_end();
      n->children.push_back(parse_body({"endif"}));
      advance();
    }
    if (!skip_name("endif")) fail_here("expected 'endif'");
    expect_block_end();
    if (n->children.size() == 2) n->children.push_back(nullptr);
    return n;
  }

  // Names to assign: "a", "a, b", "(a, b)".
  std::vector<std::string> parse_target_names() {
    std::vector<std::string> names;
    const bool parenthesized = skip_op("(");
    do {
      if (parenthesized && at_op(")")) break;
      names.push_back(expect_name());
    } while (skip_op(","));
    if (parenthesized) expect_op(")");
    return names;
  }

  node_ptr parse_for(const token& start) {
    auto n = make(node_kind::for_block, start);
    n->names = parse_target_names();
    if (!skip_name("in")) fail_here("expected 'in'");
    n->children.push_back(parse_tuple(false, {"recursive"}, false));
    if (skip_name("if")) {
      n->children.push_back(parse_expression(true));
    } else {
      n->children.push_back(nullptr);
    }
    if (at_name("recursive")) fail_here("recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    n->children.push_back(parse_body({"endfor", "else"}));
    n->flag = mentions_loop(n->children.back().get());
    --loop_depth_;
    advance();  // {%
    if (skip_name("else")) {
      expect_block_end();
      n->children.push_back(parse_body({"endfor"}));
      advance();
    } else {
      n->children.push_back(nullptr);
    }
    if (!skip_name("endfor")) fail_here("expected 'endfor'");
    expect_block_end();
    return n;
  }

  node_ptr parse_set(const token& start) {
    const token target_at = current();
    node_ptr target;
    const std::string first = expect_name();
    if (skip_op(".")) {
      // namespace attribute: ns.attr
      target = make(node_kind::getattr, target_at);
      auto object = make(node_kind::name, target_at);
      object->text = first;
      target->children.push_back(std::move(object));
      target->text = expect_name();
    } else if (at_op(",")) {
      target = make(node_kind::tuple, target_at);
      target->names.push_back(first);
      while (skip_op(",")) target->names.push_back(expect_name());
    } else {
      target = make(node_kind::name, target_at);
      target->text = first;
    }
    if (skip_op("=")) {
      auto n = make(node_kind::set, start);
      n->children.push_back(std::move(target));
      n->children.push_back(parse_tuple(true, {}, false));
      expect_block_end();
      return n;
    }
    if (target->kind != node_kind::name) fail_here("expected '='");
    auto n = make(node_kind::set_block, start);
    node_ptr filters = at_op("|") ? parse_filters(nullptr, false) : nullptr;
    expect_block_end();
    n->children.push_back(std::move(target));
    n->children.push_back(parse_body({"endset"}));
    n->children.push_back(std::move(filters));
    end_tag("endset");
    return n;
  }

  // "(a, b=default, ...)": names into n->names, defaults (or null) into n->children.
  void parse_parameters(node& n) {
    expect_op("(");
    while (!at_op(")")) {
      if (!n.names.empty()) expect_op(",");
      if (at_op(")")) break;
      n.names.push_back(expect_name());
      n.children.push_back(skip_op("=") ? parse_expression(true) : nullptr);
    }
    expect_op(")");
  }

  node_ptr parse_macro(const token& start) {
    auto n = make(node_kind::macro, start);
    n->text = expect_name();
    parse_parameters(*n);
    expect_block_end();
    const int loops = loop_depth_;
    loop_depth_ = 0;
    n->children.push_back(parse_body({"endmacro"}));
    loop_depth_ = loops;
    end_tag("endmacro");
    return n;
  }

  node_ptr parse_call_block(const token& start) {
    auto n = make(node_kind::call_block, start);
    auto parameters = make(node_kind::body, start);
    if (at_op("(")) parse_parameters(*parameters);
    auto call = parse_expression(true);
    if (call->kind != node_kind::call) fail_at(start, "'call' needs a macro call");
    expect_block_end();
    n->children.push_back(std::move(call));
    n->names = std::move(parameters->names);
    for (auto& d : parameters->children) n->children.push_back(std::move(d));
    const int loops = loop_depth_;
    loop_depth_ = 0;
    n->children.push_back(parse_body({"endcall"}));
    loop_depth_ = loops;
    end_tag("endcall");
    return n;
  }

  node_ptr parse_filter_block(const token& start) {
    auto n = make(node_kind::filter_block, start);
    n->children.push_back(parse_filters(nullptr, true));
    expect_block_end();
    n->children.push_back(parse_body({"endfilter"}));
    end_tag("endfilter");
    return n;
  }

  node_ptr parse_with(const token& start) {
    auto n = make(node_kind::with_block, start);
    while (current().type != token_type::block_end) {
      if (!n->names.empty()) expect_op(",");
      n->names.push_back(expect_name());
      expect_op("=");
      n->children.push_back(parse_expression(true));
    }
    expect_block_end();
    n->children.push_back(parse_body({"endwith"}));
    end_tag("endwith");
    return n;
  }

  // ---- expressions -------------------------------------------------------------------------------

  bool at_tuple_end(std::initializer_list<std::string_view> extra_ends) const {
    const token& t = current();
    if (t.type == token_type::var_end || t.type == token_type::block_end || t.type == token_type::end) return true;
    if (t.type == token_type::op && t.value == ")") return true;
    if (t.type == token_type::name) {
      for (const auto end : extra_ends) {
        if (t.value == end) return true;
      }
    }
    return false;
  }

  // An expression, or several separated by commas (a tuple).
  node_ptr parse_tuple(bool with_conditional, std::initializer_list<std::string_view> extra_ends,
                       bool explicit_parentheses) {
    const token start = current();
    std::vector<node_ptr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) expect_op(",");
      if (at_tuple_end(extra_ends)) break;
      items.push_back(parse_expression(with_conditional));
      if (at_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items.front());
      if (!explicit_parentheses) fail_here("expected an expression");
    }
    auto n = make(node_kind::tuple, start);
    n->children = std::move(items);
    return n;
  }

  node_ptr parse_expression(bool with_conditional) {
    const nesting guard(*this);
    return with_conditional ? parse_conditional() : parse_or();
  }

  node_ptr parse_conditional() {
    auto expr = parse_or();
    while (at_name("if")) {
      const token at = current();
      advance();
      auto condition = parse_or();
      node_ptr otherwise = skip_name("else") ? parse_conditional() : nullptr;
      auto n = make(node_kind::conditional, at);
      n->children.push_back(std::move(expr));
      n->children.push_back(std::move(condition));
      n->children.push_back(std::move(otherwise));
      expr = std::move(n);
    }
    return expr;
  }

  node_ptr binary(node_kind kind, const token& at, node_ptr left, node_ptr right) {
    auto n = make(kind, at);
    n->children.push_back(std::move(left));
    n->children.push_back(std::move(right));
    return n;
  }

  node_ptr parse_or() {
    auto left = parse_and();
    while (at_name("or")) {
      const token at = current();
      advance();
      left = binary(node_kind::logical_or, at, std::move(left), parse_and());
    }
    return left;
  }

  node_ptr parse_and() {
    auto left = parse_not();
    while (at_name("and")) {
      const token at = current();
      advance();
      left = binary(node_kind::logical_and, at, std::move(left), parse_not());
    }
    return left;
  }

  node_ptr parse_not() {
    if (at_name("not")) {
      const nesting guard(*this);
      const token at = current();
      advance();
      auto n = make(node_kind::logical_not, at);
      n->children.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }

  node_ptr parse_compare() {
    const token start = current();
    auto first = parse_math1();
    std::vector<binary_op> ops;
    std::vector<node_ptr> operands;
    while (true) {
      binary_op op;
      if (skip_op("==")) {
        op = binary_op::eq;
      } else if (skip_op("!=")) {
        op = binary_op::ne;
      } else if (skip_op("<")) {
        op = binary_op::lt;
      } else if (skip_op("<=")) {
        op = binary_op::le;
      } else if (skip_op(">")) {
        op = binary_op::gt;
      } else if (skip_op(">=")) {
        op = binary_op::ge;
      } else if (skip_name("in")) {
        op = binary_op::in;
      } else if (at_name("not") && peek().type == token_type::name && peek().value == "in") {
        advance();
        advance();
        op = binary_op::not_in;
      } else {
        break;
      }
      ops.push_back(op);
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto n = make(node_kind::compare, start);
    n->children.push_back(std::move(first));
    for (auto& operand : operands) n->children.push_back(std::move(operand));
    n->ops = std::move(ops);
    return n;
  }

  node_ptr arithmetic(binary_op op, const token& at, node_ptr left, node_ptr right) {
    auto n = binary(node_kind::binary, at, std::move(left), std::move(right));
    n->op = op;
    return n;
  }

  node_ptr parse_math1() {
    auto left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const token at = current();
      advance();
      left = arithmetic(at.value == "+" ? binary_op::add : binary_op::sub, at, std::move(left), parse_concat());
    }
    return left;
  }

  node_ptr parse_concat() {
    auto left = parse_math2();
    while (at_op("~")) {
      const token at = current();
      advance();
      left = arithmetic(binary_op::concat, at, std::move(left), parse_math2());
    }
    return left;
  }

  node_ptr parse_math2() {
    auto left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const token at = current();
      advance();
      const binary_op op = at.value == "*"    ? binary_op::mul
                           : at.value == "/"  ? binary_op::div
                           : at.value == "//" ? binary_op::floordiv
                                              : binary_op::mod;
      left = arithmetic(op, at, std::move(left), parse_pow());
    }
    return left;
  }

  node_ptr parse_pow() {
    auto left = parse_unary(true);
    while (at_op("**")) {
      const token at = current();
      advance();
      left = arithmetic(binary_op::pow, at, std::move(left), parse_unary(true));
    }
    return left;
  }

  node_ptr parse_unary(bool with_filter) {
    const nesting guard(*this);
    const token at = current();
    node_ptr n;
    if (skip_op("-")) {
      n = make(node_kind::negative, at);
      n->children.push_back(parse_unary(false));
    } else if (skip_op("+")) {
      n = make(node_kind::positive, at);
      n->children.push_back(parse_unary(false));
    } else {
      n = parse_primary();
    }
    n = parse_postfix(std::move(n));
    if (with_filter) n = parse_filter_expression(std::move(n));
    return n;
  }

  node_ptr literal(const token& at, value v) {
    auto n = make(node_kind::literal, at);
    n->literal = std::move(v);
    return n;
  }

  node_ptr parse_primary() {
    const token t = current();
    switch (t.type) {
      case token_type::name: {
        advance();
        if (t.value == "true" || t.value == "True") return literal(t, value(true));
        if (t.value == "false" || t.value == "False") return literal(t, value(false));
        if (t.value == "none" || t.value == "None") return literal(t, value::none());
        auto n = make(node_kind::name, t);
        n->text = t.value;
        return n;
      }
      case token_type::string: {
        // Adjacent strings are one: 'a' 'b' is 'ab'.
        std::string text;
        while (current().type == token_type::string) {
          text += current().value;
          advance();
        }
        return literal(t, value::markup(std::move(text)));
      }
      case token_type::integer: {
        advance();
        std::int64_t v = 0;
        for (const char c : t.value) {
          if (v > (std::numeric_limits<std::int64_t>::max() - (c - '0')) / 10) {
            fail_at(t, "the integer does not fit 64 bits");
          }
          v = v * 10 + (c - '0');
        }
        return literal(t, value(v));
      }
      case token_type::floating: {
        advance();
        return literal(t, value(std::strtod(t.value.c_str(), nullptr)));
      }
      case token_type::op:
        if (t.value == "(") {
          advance();
          auto n = parse_tuple(true, {}, true);
          expect_op(")");
          return n;
        }
        if (t.value == "[") return parse_list();
        if (t.value == "{") return parse_dict();
        break;
      default: break;
    }
    fail_here("expected an expression");
  }

  node_ptr parse_list() {
    auto n = make(node_kind::list, current());
    expect_op("[");
    while (!at_op("]")) {
      if (!n->children.empty()) expect_op(",");
      if (at_op("]")) break;
      n->children.push_back(parse_expression(true));
    }
    expect_op("]");
    return n;
  }

  node_ptr parse_dict() {
    auto n = make(node_kind::dict, current());
    expect_op("{");
    while (!at_op("}")) {
      if (!n->children.empty()) expect_op(",");
      if (at_op("}")) break;
      n->children.push_back(parse_expression(true));
      expect_op(":");
      n->children.push_back(parse_expression(true));
    }
    expect_op("}");
    return n;
  }

  node_ptr parse_postfix(node_ptr n) {
    while (true) {
      if (at_op(".") || at_op("[")) {
        n = parse_subscript(std::move(n));
      } else if (at_op("(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  node_ptr parse_filter_expression(node_ptr n) {
    while (true) {
      if (at_op("|")) {
        n = parse_filters(std::move(n), false);
      } else if (at_name("is")) {
        n = parse_test(std::move(n));
      } else if (at_op("(")) {
        n = parse_call(std::move(n));
      } else {
        return n;
      }
    }
  }

  node_ptr parse_subscript(node_ptr object) {
    const nesting guard(*this);
    const token at = current();
    if (skip_op(".")) {
      const token attribute = current();
      if (attribute.type == token_type::name) {
        advance();
        auto n = make(node_kind::getattr, at);
        n->children.push_back(std::move(object));
        n->text = attribute.value;
        return n;
      }
      if (attribute.type == token_type::integer) {
        // x.0 is x[0]
        auto n = make(node_kind::getitem, at);
        n->children.push_back(std::move(object));
        n->children.push_back(parse_primary());
        return n;
      }
      fail_here("expected an attribute name");
    }
    expect_op("[");
    std::vector<node_ptr> keys;
    while (!at_op("]")) {
      if (!keys.empty()) expect_op(",");
      if (at_op("]")) break;
      keys.push_back(parse_subscribed(object));
    }
    expect_op("]");
    if (keys.empty()) fail_at(at, "expected a subscript");
    if (keys.size() == 1 && keys.front()->kind == node_kind::slice && keys.front()->children.front() == nullptr) {
      keys.front()->children.front() = std::move(object);
      return std::move(keys.front());
    }
    auto n = make(node_kind::getitem, at);
    n->children.push_back(std::move(object));
    if (keys.size() == 1) {
      n->children.push_back(std::move(keys.front()));
    } else {
      auto tuple = make(node_kind::tuple, at);
      for (auto& key : keys) {
        if (key->kind == node_kind::slice) fail_at(at, "a slice cannot be part of a tuple");
        tuple->children.push_back(std::move(key));
      }
      n->children.push_back(std::move(tuple));
    }
    return n;
  }

  // A key, or a slice (whose object, children[0], the caller fills in).
  node_ptr parse_subscribed(const node_ptr&) {
    const token at = current();
    node_ptr start;
    if (!at_op(":")) {
      start = parse_expression(true);
      if (!at_op(":")) return start;
    }
    advance();  // :
    auto n = make(node_kind::slice, at);
    n->children.push_back(nullptr);
    n->children.push_back(std::move(start));
    n->children.push_back(at_op(":") || at_op("]") || at_op(",") ? nullptr : parse_expression(true));
    if (skip_op(":")) {
      n->children.push_back(at_op("]") || at_op(",") ? nullptr : parse_expression(true));
    } else {
      n->children.push_back(nullptr);
    }
    return n;
  }

  // "(a, b, key=c)" into n (children after the callee or operand, keywords).
  void parse_arguments(node& n) {
    expect_op("(");
    bool first = true;
    while (!at_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (at_op(")")) break;
      if (at_op("*") || at_op("**")) fail_here("argument unpacking is not supported");
      if (current().type == token_type::name && peek().type == token_type::op && peek().value == "=") {
        std::string key = current().value;
        advance();
        advance();
        n.keywords.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!n.keywords.empty()) fail_here("a positional argument follows a keyword argument");
        n.children.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  node_ptr parse_call(node_ptr callee) {
    const nesting guard(*this);
    auto n = make(node_kind::call, current());
    n->children.push_back(std::move(callee));
    parse_arguments(*n);
    return n;
  }

  // "| name(args) | name ..." applied to `operand` (null: a filter block's body). `inline_start`:
  // the first name comes without its "|".
  node_ptr parse_filters(node_ptr operand, bool inline_start) {
    bool first = true;
    while (at_op("|") || (inline_start && first)) {
      const nesting guard(*this);
      if (!(inline_start && first)) advance();
      first = false;
      const token at = current();
      auto n = make(node_kind::filter, at);
      n->text = expect_name();
      while (skip_op(".")) n->text += "." + expect_name();
      if (!is_filter(n->text)) fail_at(at, format("no filter named '{}'", n->text));
      n->children.push_back(std::move(operand));
      if (at_op("(")) parse_arguments(*n);
      operand = std::move(n);
    }
    return operand;
  }

  node_ptr parse_test(node_ptr operand) {
    const nesting guard(*this);
    const token at = current();
    advance();  // is
    const bool negated = skip_name("not");
    auto n = make(node_kind::test, at);
    const token name_at = current();
    n->text = expect_name();
    while (skip_op(".")) n->text += "." + expect_name();
    if (!is_test(n->text)) fail_at(name_at, format("no test named '{}'", n->text));
    n->flag = negated;
    n->children.push_back(std::move(operand));
    const token& t = current();
    if (at_op("(")) {
      parse_arguments(*n);
    } else if ((t.type == token_type::name || t.type == token_type::string || t.type == token_type::integer ||
                t.type == token_type::floating || at_op("[") || at_op("{")) &&
               !at_name("else") && !at_name("or") && !at_name("and")) {
      if (at_name("is")) fail_here("tests cannot be chained with 'is'");
      // One argument without parentheses: x is divisibleby 3.
      n->children.push_back(parse_postfix(parse_primary()));
    }
    return n;
  }

  std::vector<token> tokens_;
  std::size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // loops around the statement being read, within the macro being read
};

}  // namespace

result<program> parse_template(std::string_view source) {
  try {
    parser p(tokenize(source));
    std::shared_ptr<const node> root = p.parse_template();
    return program(std::move(root));
  } catch (const syntax_error& e) {
    return invalid_argument(format("line {}, column {}: {}", e.line, e.column, e.what()));
  }
}

}  // namespace edge::backend::jinja
