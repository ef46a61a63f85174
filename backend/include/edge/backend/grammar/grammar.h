// Grammars for constrained decoding: what a request's output must match, as a context-free
// grammar over bytes and special tokens. A grammar is built from a JSON schema
// (json_schema.h), composed by hand from the pieces below, or both: a schema is one more piece.
// compiled_grammar.h turns a grammar into per-step token masks for one tokenizer.
//
// Pieces (`expr`, immutable values, cheap to copy and share):
//
//   literal("text")            these bytes, spelled by any tokens whose bytes make them up
//   special_token("<|x|>")     exactly that special token of the vocabulary (resolved when the
//                              grammar is compiled; a special token is never allowed anywhere
//                              else, and never spelled out of plain tokens)
//   char_class({{'a','z'}})    one Unicode character from the ranges (or outside them:
//                              negated), UTF-8 encoded; surrogates are never characters
//   json_char_class(...)       the same character written as JSON string content ('"' as \",
//                              a control character as \n or \u00XX)
//   any_json_char()            one character of a JSON string, escapes included (\uXXXX too,
//                              but no surrogate halves: each is one code point)
//   seq({a, b}), alt({a, b})   sequence, alternation
//   repeat(e, min, max)        e min to max times (max unbounded: -1); optional, star, plus
//   number(...)                a JSON number in a range, exactly (number_range below)
//   b.ref(rule)                a rule of the builder, defined before or after: rules may refer
//                              to each other and to themselves (not left-recursively: a rule
//                              that can reach itself before consuming a byte is an error)
//   b.json_schema(...)         a JSON value valid against a schema (json_schema.h)
//   b.json_value()             any JSON value; b.whitespace(): the bounded whitespace JSON
//                              pieces allow between their tokens
//
// A tool call in a model's own syntax, around a tool's parameter schema:
//
//   grammar_builder b;
//   EDGE_ASSIGN_OR_RETURN(expr args, b.json_schema(tool.parameters, {.path = "tools[0].function.parameters"}));
//   // Hermes / Qwen: plain text markers
//   expr hermes = seq({literal("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "), args,
//                      literal("}\n</tool_call>")});
//   // Kimi K2: each marker one special token
//   expr kimi = seq({special_token("<|tool_calls_section_begin|>"), special_token("<|tool_call_begin|>"),
//                    literal("functions.get_weather:0"), special_token("<|tool_call_argument_begin|>"), args,
//                    special_token("<|tool_call_end|>"), special_token("<|tool_calls_section_end|>")});
//   grammar g = b.build(plus(kimi));   // then compile(g, vocabulary)
//
// Once the root matches, the output may end (EOS, a stop token) and nothing but the end is
// allowed when the grammar cannot go on; before it matches, EOS is not allowed.
//
// Thread safety: a builder is used by one thread; a built grammar is immutable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "edge/common/status.h"

namespace edge::backend::grammar {

using rule_id = std::int32_t;

// A grammar that cannot be built or compiled: the message, and where in the request the piece
// at fault sits ("response_format.json_schema.schema.properties.name.pattern"; "" when the
// grammar as a whole is at fault), which the API answers as the error's `param`.
class grammar_error : public status {
 public:
  grammar_error() = default;
  grammar_error(std::string message, std::string path)
      : status(status_code::invalid_argument, std::move(message)), path_(std::move(path)) {}
  explicit grammar_error(const status& s) : status(s) {}
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

// Inclusive.
struct codepoint_range {
  char32_t first = 0;
  char32_t last = 0;
  friend bool operator==(const codepoint_range&, const codepoint_range&) = default;
};

// An exact decimal, as JSON writes numbers: sign, digits without leading zeros ("0" for zero)
// and the power of ten they are scaled by. 0.25 is {false, "25", -2}.
struct decimal {
  bool negative = false;
  std::string digits = "0";
  std::int32_t exponent = 0;

  // From JSON number text ("-1.5e3"); nullopt when it is not one.
  static std::optional<decimal> parse(std::string_view text);
  // The shortest decimal that reads back as exactly `value` (finite values only).
  static decimal of(double value);
  static decimal of(std::int64_t value);
  // Digits from the first nonzero one to the last nonzero one (0 for zero).
  std::int32_t significant_digits() const;
  std::string str() const;  // JSON number text
  friend bool operator==(const decimal&, const decimal&) = default;
};

// -1, 0, 1: a < b, a == b, a > b.
int compare(const decimal& a, const decimal& b);

// What number() matches: a JSON number in [low, high] (ends exclusive when asked), written
// with at most max_significant_digits significant digits, so that any two numbers it allows
// read as different doubles and a bound of as many digits is kept exactly by a validator that
// reads doubles. Integers are written without fraction or exponent; other numbers without an
// exponent when a bound is given, and with an optional two-digit exponent otherwise.
struct number_range {
  static constexpr std::int32_t max_significant_digits = 15;
  bool integer = false;
  std::optional<decimal> low;
  bool low_exclusive = false;
  std::optional<decimal> high;
  bool high_exclusive = false;
  friend bool operator==(const number_range&, const number_range&) = default;
};

enum class expr_kind { empty, literal, special_token, char_class, json_char_class, any_json_char, sequence,
                       alternation, repeat, rule_ref, number };

struct expr_node;
class grammar_builder;

class expr {
 public:
  expr();  // empty: matches nothing at all (the empty string)
  const expr_node& node() const { return *node_; }
  expr_kind kind() const;

 private:
  friend expr make_expr(expr_node node);
  explicit expr(std::shared_ptr<const expr_node> node) : node_(std::move(node)) {}
  std::shared_ptr<const expr_node> node_;
};

struct expr_node {
  expr_kind kind = expr_kind::empty;
  std::string text;                     // literal: the bytes; special_token: the token's text
  std::vector<codepoint_range> ranges;  // char classes: sorted, disjoint, no surrogates
  std::vector<expr> items;              // sequence, alternation: the parts; repeat: the one repeated
  std::int64_t min = 0;                 // repeat
  std::int64_t max = -1;                // repeat: -1 unbounded
  rule_id rule = -1;                    // rule_ref
  number_range number;                  // number
};

expr literal(std::string_view bytes);
expr special_token(std::string_view text);
expr char_class(std::vector<codepoint_range> ranges, bool negated = false);
expr json_char_class(std::vector<codepoint_range> ranges, bool negated = false);
expr any_json_char();
expr seq(std::vector<expr> items);
expr alt(std::vector<expr> items);
expr repeat(expr item, std::int64_t min, std::int64_t max);
expr optional(expr item);
expr star(expr item);
expr plus(expr item);
expr number(number_range range);

struct rule {
  std::string name;  // for messages
  expr body;
};

// A grammar: rules and the root. Built by grammar_builder.
class grammar {
 public:
  const std::vector<rule>& rules() const { return rules_; }
  const expr& root() const { return root_; }
  // A canonical text of the whole grammar: equal texts are equal grammars (the compile cache's
  // key), and parse_grammar() reads it back.
  const std::string& text() const { return text_; }

 private:
  friend class grammar_builder;
  friend result<grammar> parse_grammar(std::string_view text);
  std::vector<rule> rules_;
  expr root_;
  std::string text_;
};

// Reads grammar::text() back (what a split gateway sends a backend). Errors say what is wrong.
result<grammar> parse_grammar(std::string_view text);

// Options of the JSON pieces a builder makes.
struct json_schema_options {
  // Where the schema sits in the request: errors name "path.properties.x.pattern".
  std::string path = "schema";
  // The schema at this JSON pointer of the document ("/properties/city"; "": the document),
  // with the document's $refs still resolved from its root; errors name its place below `path`.
  std::string pointer;
};

class grammar_builder {
 public:
  grammar_builder();

  // A rule to define later (define()), so that rules can refer to each other.
  rule_id declare(std::string name);
  // invalid_argument when the rule is defined already or unknown.
  status define(rule_id id, expr body);
  // A rule defined at once.
  rule_id add_rule(std::string name, expr body);
  expr ref(rule_id id) const;

  // A JSON value valid against `schema` (JSON text): its rules join this builder's. Errors name the keyword's path below options.path (json_schema.h lists what is
  // supported).
  result<expr, grammar_error> json_schema(std::string_view schema, const json_schema_options& options = {});
  // Any JSON object (response_format json_object).
  expr json_object();
  expr json_value();
  // Nothing, one space, or a line break and up to max_indent spaces: what JSON pieces allow
  // between their tokens (compact and pretty-printed JSON; a model cannot spin in whitespace).
  expr whitespace();
  static constexpr std::int64_t max_indent = 12;

  // A JSON string (quotes included) of min_length to max_length characters (-1: unbounded).
  expr json_string(std::int64_t min_length = 0, std::int64_t max_length = -1);

  // The grammar with `root`; invalid_argument when a declared rule was never defined.
  result<grammar> build(expr root) const;

 private:
  friend class schema_reader;
  std::vector<rule> rules_;
  std::vector<bool> defined_;
  // Shared rules by what they match, so that every use of one shares its token tables.
  std::vector<std::pair<std::string, rule_id>> shared_;
  rule_id shared_rule(const std::string& key, const std::function<expr()>& make);
};

}  // namespace edge::backend::grammar
