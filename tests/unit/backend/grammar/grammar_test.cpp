// Grammars: composition, the text form, JSON Schema -> grammar (what it allows, what it
// refuses and how the error names the keyword), and the matcher's masks against the brute
// force (every token tried on a fresh matcher replaying the output) on random walks.
#include <doctest/doctest.h>
#include <simdjson.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "backend/grammar/grammar_test_support.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/json_text.h"

namespace edge::testing {
namespace {

using namespace backend::grammar;

// Every byte string of up to `max_length` bytes the grammar takes whole, found by walking the
// byte tokenizer's masks (each byte is its own token).
std::set<std::string> language(const std::shared_ptr<const compiled_grammar>& grammar, const backend::tokenizer& tok,
                               std::size_t max_length) {
  std::set<std::string> out;
  const std::int64_t vocab = tok.vocab_size();
  std::function<void(std::vector<backend::token_id>&, std::string&)> visit = [&](std::vector<backend::token_id>& path,
                                                                                 std::string& text) {
    grammar_matcher m(grammar);
    for (const auto t : path) REQUIRE(m.accept(t));
    if (m.can_end()) out.insert(text);
    if (text.size() >= max_length) return;
    std::vector<std::uint32_t> mask(static_cast<std::size_t>(mask_words(vocab)));
    m.fill_mask(mask);
    for (backend::token_id t = 0; t < 256; ++t) {
      if (!bit(mask, t)) continue;
      path.push_back(t);
      text.push_back(static_cast<char>(t));
      visit(path, text);
      path.pop_back();
      text.pop_back();
    }
  };
  std::vector<backend::token_id> path;
  std::string text;
  visit(path, text);
  return out;
}

grammar build_or_fail(grammar_builder& b, expr root) {
  auto g = b.build(std::move(root));
  REQUIRE_MESSAGE(g.ok(), g.error().message());
  return std::move(g).value();
}

// Whether the grammar takes `text` whole, a byte at a time (on the byte tokenizer, a byte's id
// is its value).
bool takes(const std::shared_ptr<const compiled_grammar>& g, std::string_view text) {
  grammar_matcher m(g);
  for (const char c : text) {
    if (!m.accept(static_cast<unsigned char>(c))) return false;
  }
  return m.can_end();
}

// The schema's grammar, whose text form reads back as the same grammar (what a split gateway
// sends a backend).
grammar schema_grammar(std::string_view schema) {
  grammar_builder b;
  auto root = b.json_schema(schema);
  REQUIRE_MESSAGE(root.ok(), root.error().message());
  grammar g = build_or_fail(b, *root);
  auto again = parse_grammar(g.text());
  REQUIRE_MESSAGE(again.ok(), again.error().message());
  CHECK(again->text() == g.text());
  return g;
}

TEST_CASE("a composed grammar: literals, classes, repetition, special tokens") {
  const auto tok = byte_tokenizer();
  grammar_builder b;
  const expr word = plus(char_class({{'a', 'c'}}));
  const grammar g = build_or_fail(b, seq({special_token("<|call|>"), literal("f("), word, optional(seq({literal(","), word})),
                                          literal(")")}));
  const auto compiled = compile_or_fail(g, *tok);
  grammar_matcher m(compiled);
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(mask_words(tok->vocab_size())));
  m.fill_mask(mask);
  const auto call = *tok->find_token("<|call|>");
  const auto end = tok->eos_ids().front();
  CHECK(bit(mask, call));
  CHECK_FALSE(bit(mask, 'f'));  // the special token first: never spelled out of bytes
  CHECK_FALSE(bit(mask, end));
  CHECK(m.accept(call));
  for (const char c : std::string("f(ab,c)")) REQUIRE(m.accept(static_cast<backend::token_id>(c)));
  CHECK(m.can_end());
  CHECK(m.must_end());
  m.fill_mask(mask);
  for (std::int64_t t = 0; t < tok->vocab_size(); ++t) CHECK(bit(mask, t) == (t == end));
  CHECK_FALSE(m.accept('x'));
  CHECK(m.accept(end));
  CHECK(m.ended());
}

TEST_CASE("recursive rules: balanced brackets, and the left-recursive and unproductive ones refused") {
  const auto tok = byte_tokenizer();
  {
    grammar_builder b;
    const rule_id nest = b.declare("nest");
    REQUIRE(b.define(nest, alt({literal("x"), seq({literal("["), b.ref(nest), literal("]")})})).ok());
    const auto compiled = compile_or_fail(build_or_fail(b, b.ref(nest)), *tok);
    const auto words = language(compiled, *tok, 7);
    CHECK(words == std::set<std::string>{"x", "[x]", "[[x]]", "[[[x]]]"});
  }
  {
    grammar_builder b;
    const rule_id left = b.declare("list");
    REQUIRE(b.define(left, alt({literal("x"), seq({b.ref(left), literal(",x")})})).ok());
    auto compiled = compile(build_or_fail(b, b.ref(left)), token_vocabulary::create(*tok));
    REQUIRE_FALSE(compiled.ok());
    CHECK(compiled.error().message().find("left-recursive") != std::string::npos);
  }
  {
    grammar_builder b;
    const rule_id forever = b.declare("forever");
    REQUIRE(b.define(forever, seq({literal("("), b.ref(forever), literal(")")})).ok());
    auto compiled = compile(build_or_fail(b, b.ref(forever)), token_vocabulary::create(*tok));
    REQUIRE_FALSE(compiled.ok());
    CHECK(compiled.error().message().find("no finite output") != std::string::npos);
  }
  {
    grammar_builder b;
    auto compiled = compile(build_or_fail(b, special_token("<|nowhere|>")), token_vocabulary::create(*tok));
    REQUIRE_FALSE(compiled.ok());
    CHECK(compiled.error().message().find("<|nowhere|>") != std::string::npos);
  }
}

TEST_CASE("an ambiguous grammar whose parses double with every byte ends with a clear error, at once") {
  // Two rules that both match every bracket nesting: after n brackets, 2^n stacks.
  const auto tok = byte_tokenizer();
  grammar_builder b;
  const rule_id one = b.declare("one");
  const rule_id other = b.declare("other");
  for (const rule_id r : {one, other}) {
    REQUIRE(b.define(r, alt({literal("x"), seq({literal("["), b.ref(one), literal("]")}),
                             seq({literal("["), b.ref(other), literal("]")})}))
                .ok());
  }
  const auto compiled = compile_or_fail(build_or_fail(b, b.ref(one)), *tok);
  grammar_matcher m(compiled);
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(mask_words(tok->vocab_size())));
  const auto open = static_cast<backend::token_id>('[');
  int accepted = 0;
  for (; accepted < 64 && m.fill_mask(mask); ++accepted) {
    REQUIRE(bit(mask, open));
    if (!m.accept(open)) break;
  }
  MESSAGE("brackets taken: " << accepted);
  // 2^12 stacks pass max_parses: the matcher fails there, and then allows and takes nothing.
  CHECK(accepted <= 13);
  REQUIRE(m.failed());
  CHECK(m.error().find("too ambiguous") != std::string::npos);
  CHECK_FALSE(m.fill_mask(mask));
  CHECK(std::all_of(mask.begin(), mask.end(), [](std::uint32_t w) { return w == 0; }));
  CHECK_FALSE(m.accept(static_cast<backend::token_id>('x')));

  // The same from a schema: two alternatives that both match every nesting of arrays.
  const auto schema = compile_schema(
      R"({"$defs":{"n":{"anyOf":[{"type":"array","items":{"$ref":"#/$defs/n"}},)"
      R"({"type":"array","items":{"$ref":"#/$defs/n"}}]}},"$ref":"#/$defs/n"})",
      *tok);
  grammar_matcher nested(schema);
  for (accepted = 0; accepted < 64 && nested.fill_mask(mask) && nested.accept(open); ++accepted) {
  }
  MESSAGE("arrays opened: " << accepted);
  CHECK(accepted < 64);
  CHECK(nested.failed());

  // Below the limits the same grammar is followed as before.
  grammar_matcher shallow(compiled);
  for (const char c : std::string_view("[[[x]]]")) REQUIRE(shallow.accept(static_cast<backend::token_id>(c)));
  CHECK(shallow.can_end());
  CHECK_FALSE(shallow.failed());
}

TEST_CASE("the text form reads back as the same grammar") {
  grammar_builder b;
  auto schema = b.json_schema(
      R"({"type":"object","properties":{"a":{"type":"integer","minimum":-3,"exclusiveMaximum":12.5},)"
      R"("b":{"type":"array","items":{"type":"string","maxLength":3},"maxItems":2}},"required":["a"]})");
  REQUIRE(schema.ok());
  const grammar g = build_or_fail(b, seq({special_token("<|call|>"), *schema, json_char_class({{'"', '"'}, {'\n', '\n'}})}));
  auto again = parse_grammar(g.text());
  REQUIRE_MESSAGE(again.ok(), again.error().message());
  CHECK(again->text() == g.text());
  CHECK_FALSE(parse_grammar("(grammar (root (ref 3)))").ok());
  CHECK_FALSE(parse_grammar("(grammar (root (lit 4)))").ok());
  CHECK_FALSE(parse_grammar(g.text().substr(0, g.text().size() - 1)).ok());
}

// JSON text of a number in [low, high] as a double, read independently of the grammar.
bool number_in(const std::string& text, double low, bool low_x, double high, bool high_x) {
  const double v = std::strtod(text.c_str(), nullptr);
  return (low_x ? v > low : v >= low) && (high_x ? v < high : v <= high);
}

TEST_CASE("numbers: every string the grammar takes is in range, and every short one in range is taken") {
  const auto tok = byte_tokenizer();
  struct range_case {
    std::string schema;
    double low, high;
    bool low_x, high_x;
    std::size_t length;
  };
  const std::vector<range_case> cases = {
      {R"({"type":"integer","minimum":-15,"maximum":27})", -15, 27, false, false, 3},
      {R"({"type":"integer","exclusiveMinimum":-15,"exclusiveMaximum":27})", -15, 27, true, true, 3},
      {R"({"type":"integer","minimum":0.5,"maximum":9.5})", 0.5, 9.5, false, false, 2},
      {R"({"type":"number","minimum":-1.25,"maximum":2.5})", -1.25, 2.5, false, false, 5},
      {R"({"type":"number","exclusiveMinimum":0,"exclusiveMaximum":1})", 0, 1, true, true, 5},
      {R"({"type":"number","minimum":10,"exclusiveMaximum":10.5})", 10, 10.5, false, true, 5},
  };
  for (const range_case& c : cases) {
    CAPTURE(c.schema);
    const auto words = language(compile_schema(c.schema, *tok), *tok, c.length);
    CHECK_FALSE(words.empty());
    for (const std::string& w : words) {
      CAPTURE(w);
      CHECK(is_json_number(w));
      CHECK(number_in(w, c.low, c.low_x, c.high, c.high_x));
      CHECK(w != "-0");
    }
    // Completeness over a grid: integers, and for numbers every step of 0.25 written shortest.
    const bool integer = c.schema.find("integer") != std::string::npos;
    for (double v = -30; v <= 30; v += integer ? 1.0 : 0.25) {
      std::string text = json_number(v);
      if (text.size() > c.length || text == "-0") continue;
      CHECK_MESSAGE(words.contains(text) == number_in(text, c.low, c.low_x, c.high, c.high_x), text);
    }
  }
}

TEST_CASE("strings: lengths count characters, escapes included; formats are exact") {
  const auto tok = byte_tokenizer();
  const auto words = language(compile_schema(R"({"type":"string","minLength":1,"maxLength":2})", *tok), *tok, 5);
  for (const std::string& w : words) {
    simdjson::dom::parser parser;
    simdjson::dom::element e;
    REQUIRE_MESSAGE(parser.parse(w).get(e) == simdjson::SUCCESS, w);
    const std::string_view value = e.get_string().value_unsafe();
    std::size_t chars = 0;
    for (const char c : value) chars += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
    CHECK_MESSAGE((chars >= 1 && chars <= 2), w);
  }
  CHECK(words.contains("\"ab\""));
  CHECK(words.contains("\"\\n\""));
  CHECK_FALSE(words.contains("\"\""));
  CHECK_FALSE(words.contains("\"abc\""));

  const auto dates = compile_schema(R"({"type":"string","format":"date"})", *tok);
  CHECK(takes(dates, "\"2024-02-29\""));
  CHECK(takes(dates, "\"2000-02-29\""));
  CHECK_FALSE(takes(dates, "\"1900-02-29\""));
  CHECK_FALSE(takes(dates, "\"2023-02-29\""));
  CHECK_FALSE(takes(dates, "\"2023-04-31\""));
  CHECK(takes(dates, "\"2023-12-31\""));
  const auto times = compile_schema(R"({"type":"string","format":"date-time"})", *tok);
  CHECK(takes(times, "\"2023-12-31T23:59:59.5+01:00\""));
  CHECK_FALSE(takes(times, "\"2023-12-31T24:00:00Z\""));
  const auto uuid = compile_schema(R"({"type":"string","format":"uuid"})", *tok);
  CHECK(takes(uuid, "\"123e4567-e89b-12d3-a456-426614174000\""));
  CHECK_FALSE(takes(uuid, "\"123e4567-e89b-12d3-a456-42661417400\""));
}

TEST_CASE("an array schema with items has no rules of any JSON value, and compiles to a few states") {
  const auto tok = byte_tokenizer();
  const auto rule_names = [](std::string_view schema) {
    grammar_builder b;
    auto root = b.json_schema(schema);
    REQUIRE_MESSAGE(root.ok(), root.error().message());
    const grammar built = build_or_fail(b, *root);
    std::set<std::string> names;
    for (const rule& r : built.rules()) names.insert(r.name);
    return names;
  };
  // Made and left unused, those rules were compiled all the same: about 680 states for an
  // array of at most one boolean, most of them the number's.
  for (const std::string_view schema : {R"({"type":"array","items":{"type":"boolean"},"maxItems":1})",
                                        R"({"type":"array","items":false})",
                                        R"({"type":"array","prefixItems":[{"const":1}],"items":{"enum":["a"]}})"}) {
    CAPTURE(schema);
    CHECK(rule_names(schema).count("value") == 0);
    CHECK(compile_schema(schema, *tok)->stats().states < 100);
  }
  // Without items (or with items: true) an element is any value.
  CHECK(rule_names(R"({"type":"array"})").count("value") == 1);
  CHECK(rule_names(R"({"type":"array","items":true})").count("value") == 1);
}

TEST_CASE("schemas of long names, deep nesting and many items build grammars of linear text that read back") {
  const auto tok = byte_tokenizer();
  // Additional properties are told apart from a long listed name (rules every few bytes keep
  // the text form shallow); before, its trie nested two levels a byte, past what parse_grammar
  // reads, and a name of 200 000 bytes overflowed the stack.
  const std::string name(250, 'k');
  const grammar named = schema_grammar(R"({"type":"object","properties":{")" + name +
                                       R"(":{"type":"boolean"}},"additionalProperties":{"type":"integer"}})");
  auto compiled = compile(named, token_vocabulary::create(*tok));
  REQUIRE_MESSAGE(compiled.ok(), compiled.error().message());
  CHECK(takes(*compiled, "{\"" + name + "\":true,\"" + name + "k\":1,\"k\":2}"));
  CHECK_FALSE(takes(*compiled, "{\"" + name + "\":true,\"" + name + "\":1}"));
  grammar_builder b;
  const auto too_long = b.json_schema(R"({"type":"object","properties":{")" + std::string(257, 'k') +
                                      R"(":{}},"additionalProperties":true})");
  REQUIRE_FALSE(too_long.ok());
  CHECK(too_long.error().path() == "schema.properties");

  // Pieces used twice (an array's items, an object's additional members) are rules: written out
  // in place, the text doubled at each level (2^40 pieces at these depths, built for hours).
  const auto nested = [](std::string_view open, std::string_view close, int depth) {
    std::string schema;
    for (int i = 0; i < depth; ++i) schema += open;
    schema += R"({"type":"boolean"})";
    for (int i = 0; i < depth; ++i) schema += close;
    return schema;
  };
  for (const std::string& schema :
       {nested(R"({"type":"array","minItems":1,"items":)", "}", 40),
        nested(R"({"type":"object","properties":{"a":{"type":"null"}},"additionalProperties":)", "}", 40),
        nested(R"({"type":"object","additionalProperties":)", "}", 40)}) {
    CAPTURE(schema);
    CHECK(schema_grammar(schema).text().size() < 40 * schema.size());
  }

  // prefixItems: a rule now and then, as each item nests the rest deeper; at most 1024.
  std::string items = R"({"const":0})";
  for (int i = 1; i < 300; ++i) items += R"(,{"const":)" + std::to_string(i) + "}";
  const grammar listed = schema_grammar(R"({"type":"array","items":false,"prefixItems":[)" + items + "]}");
  auto listed_compiled = compile(listed, token_vocabulary::create(*tok));
  REQUIRE_MESSAGE(listed_compiled.ok(), listed_compiled.error().message());
  std::string all = "[0";
  for (int i = 1; i < 300; ++i) all += "," + std::to_string(i);
  CHECK(takes(*listed_compiled, all + "]"));
  CHECK(takes(*listed_compiled, "[0,1,2]"));
  CHECK_FALSE(takes(*listed_compiled, "[0,2]"));
  std::string too_many = R"({"const":0})";
  for (int i = 1; i < 1025; ++i) too_many += R"(,{"const":0})";
  const auto refused = b.json_schema(R"({"type":"array","prefixItems":[)" + too_many + "]}");
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().path() == "schema.prefixItems");
}

TEST_CASE("schemas the reader refuses name the keyword and its path") {
  struct refusal {
    std::string schema;
    std::string path;
  };
  const std::vector<refusal> cases = {
      {R"({"type":"object","properties":{"name":{"type":"string","pattern":"^a"}}})", "schema.properties.name.pattern"},
      {R"({"type":"object","properties":{"x":{"type":"number","multipleOf":3}}})", "schema.properties.x.multipleOf"},
      {R"({"type":"array","uniqueItems":true})", "schema.uniqueItems"},
      {R"({"type":"object","minProperties":2})", "schema.minProperties"},
      {R"({"type":"string","format":"email"})", "schema.format"},
      {R"({"type":"string","maxLength":100000})", "schema.maxLength"},
      {R"({"type":"bogus"})", "schema.type"},
      {R"({"$ref":"#/$defs/missing"})", "schema.$ref"},
      {R"({"$ref":"https://example.com/s.json"})", "schema.$ref"},
      {R"({"oneOf":[{"type":"string"},{"type":"string","maxLength":2}]})", "schema.oneOf[1]"},
      {R"({"type":"object","properties":{"a":{}},"required":["b"]})", "schema.required[0]"},
      {R"({"type":"number","minimum":0.12345678901234567})", "schema.minimum"},
      {R"({"type":"integer","minimum":5,"maximum":4})", "schema"},
      {R"(not json)", "schema"},
  };
  for (const refusal& c : cases) {
    CAPTURE(c.schema);
    grammar_builder b;
    auto root = b.json_schema(c.schema);
    REQUIRE_FALSE(root.ok());
    CHECK(root.error().path() == c.path);
  }
  // Annotations pass.
  grammar_builder b;
  CHECK(b.json_schema(R"({"title":"t","description":"d","$schema":"x","examples":[1],"default":2,"type":"integer"})").ok());
}

// A corpus of schemas; each walk's output must be valid JSON with the keys and types asked for.
const std::vector<std::string>& schema_corpus() {
  static const std::vector<std::string> schemas = {
      R"({"type":"object","properties":{"name":{"type":"string","maxLength":4},"age":{"type":"integer","minimum":0,"maximum":120}},"required":["name","age"],"additionalProperties":false})",
      R"({"type":"object","properties":{"tags":{"type":"array","items":{"enum":["a","b",1,null]},"minItems":1,"maxItems":3},"ok":{"type":"boolean"}},"required":["tags"]})",
      R"({"anyOf":[{"type":"object","properties":{"kind":{"const":"x"},"v":{"type":"number","exclusiveMinimum":0,"maximum":1}},"required":["kind","v"]},{"type":"null"}]})",
      R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},"next":{"anyOf":[{"$ref":"#/$defs/node"},{"type":"null"}]}},"required":["v","next"]}},"$ref":"#/$defs/node"})",
      R"({"type":"object","properties":{"a":{"type":"string"},"b":{"type":"string"}},"additionalProperties":{"type":"integer"}})",
      R"({"type":"array","prefixItems":[{"type":"string","format":"date"},{"type":"number"}],"items":false,"minItems":1})",
  };
  return schemas;
}

void check_output(const std::string& schema, const std::string& text) {
  simdjson::dom::parser parser;
  simdjson::dom::element e;
  REQUIRE_MESSAGE(parser.parse(text).get(e) == simdjson::SUCCESS, text);
  if (schema.find("\"age\"") != std::string::npos) {
    CHECK(e["name"].get_string().value().size() <= 4 * 4);
    const std::int64_t age = e["age"].get_int64().value();
    CHECK((age >= 0 && age <= 120));
  }
}

TEST_CASE("masks equal the brute force on random walks over the schema corpus (tokens of several bytes)") {
  const auto tok = byte_tokenizer(json_merges());
  for (std::size_t i = 0; i < schema_corpus().size(); ++i) {
    const std::string& schema = schema_corpus()[i];
    CAPTURE(schema);
    const auto grammar = compile_schema(schema, *tok);
    for (std::uint64_t seed = 0; seed < 3; ++seed) {
      const walk_result walk = random_walk(grammar, *tok, seed * 31 + i, 60, true);
      if (walk.ended) check_output(schema, walk.text);
    }
  }
}

TEST_CASE("masks equal the brute force on stories260K's vocabulary") {
  auto tok = backend::load_llama2c_tokenizer(stories260k_dir() / "tok512.bin", 512);
  REQUIRE(tok.ok());
  for (std::size_t i = 0; i < schema_corpus().size(); ++i) {
    const std::string& schema = schema_corpus()[i];
    CAPTURE(schema);
    const auto grammar = compile_schema(schema, **tok);
    const walk_result walk = random_walk(grammar, **tok, 7 + i, 40, true);
    if (walk.ended) check_output(schema, walk.text);
  }
}

TEST_CASE("walks that end give valid JSON for every schema of the corpus, and json_object any object") {
  const auto tok = byte_tokenizer(json_merges());
  for (const std::string& schema : schema_corpus()) {
    CAPTURE(schema);
    const auto grammar = compile_schema(schema, *tok);
    int ended = 0;
    for (std::uint64_t seed = 0; seed < 40; ++seed) {
      const walk_result walk = random_walk(grammar, *tok, seed, 400, false, 0.9);
      if (!walk.ended) continue;
      ++ended;
      check_output(schema, walk.text);
    }
    CHECK(ended > 10);
  }
  grammar_builder b;
  const auto any_object = compile_or_fail(build_or_fail(b, b.json_object()), *tok);
  for (std::uint64_t seed = 0; seed < 20; ++seed) {
    const walk_result walk = random_walk(any_object, *tok, seed, 300, false, 0.9);
    if (!walk.ended) continue;
    simdjson::dom::parser parser;
    simdjson::dom::element e;
    REQUIRE_MESSAGE(parser.parse(walk.text).get(e) == simdjson::SUCCESS, walk.text);
    CHECK(e.type() == simdjson::dom::element_type::OBJECT);
  }
}

}  // namespace
}  // namespace edge::testing
