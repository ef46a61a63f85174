// The grammar tool_choice "required" / a named function decodes with, per family: it accepts the
// family's own rendering of calls (as its chat template writes them), markers as special tokens
// or spelled out; it refuses other tools, a second call without parallel_tool_calls, arguments
// outside the schema and anything but calls; and the family's parser reads every output the
// grammar allows (random walks over the compiled grammar) back as calls whose arguments are
// JSON objects with their required keys. Errors name the tool and the keyword.
#include <doctest/doctest.h>

#include <algorithm>

#include "backend/grammar/grammar_test_support.h"
#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/gateway/openai/output_parser.h"
#include "edge/gateway/openai/tool_calls.h"
#include "output_feeding.h"

namespace gw = edge::gateway;
namespace g = edge::backend::grammar;
using gw::tool_call_parser_kind;

namespace {

// A byte-level tokenizer (a few JSON merges) with <|end|> (EOS) and `specials` as special tokens.
std::unique_ptr<edge::backend::tokenizer> tokenizer_with(const std::vector<std::string>& specials) {
  edge::testing::byte_level_json json;
  json.merges = edge::testing::json_merges();
  std::vector<std::string> all = {"<|end|>"};
  all.insert(all.end(), specials.begin(), specials.end());
  const auto base = static_cast<int>(256 + json.merges.size());
  json.added_tokens = "[";
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (i > 0) json.added_tokens += ",";
    json.added_tokens += "{\"id\":" + std::to_string(base + static_cast<int>(i)) + ",\"content\":" +
                         edge::testing::json_quote(all[i]) +
                         ",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,\"special\":true}";
  }
  json.added_tokens += "]";
  json.extra = all;
  auto tok = edge::backend::parse_hf_tokenizer(json.text(), R"({"eos_token":"<|end|>"})");
  REQUIRE_MESSAGE(tok.ok(), tok.error().message());
  return std::move(tok).value();
}

// The family's markers as special tokens, or none (every marker spelled out of bytes).
std::unique_ptr<edge::backend::tokenizer> family_tokenizer(tool_call_parser_kind kind, bool special_markers,
                                                           bool think_tags = false) {
  std::vector<std::string> specials;
  if (special_markers) {
    for (const std::string_view m : gw::tool_call_markers(kind)) specials.emplace_back(m);
  }
  if (think_tags) {
    specials.emplace_back(gw::think_open_tag);
    specials.emplace_back(gw::think_close_tag);
  }
  return tokenizer_with(specials);
}

const std::vector<gw::tool_spec> tools = {
    {"get_weather",
     R"({"type":"object","properties":{"city":{"type":"string","maxLength":12},"days":{"type":"integer","minimum":1,"maximum":7}},"required":["city"],"additionalProperties":false})"},
    {"get_time", ""},
    {"set_alarm",
     R"({"type":"object","properties":{"at":{"type":"object","properties":{"h":{"type":"integer","minimum":0,"maximum":23},"m":{"type":"integer","minimum":0,"maximum":59}},"required":["h","m"],"additionalProperties":false},"label":{"enum":["wake","nap"]},"repeat":{"type":"array","items":{"type":"boolean"},"maxItems":3}},"required":["at","label"],"additionalProperties":false})"},
};

struct family_case {
  tool_call_parser_kind kind;
  bool special_markers;
  std::string_view name;
};

const family_case all_families[] = {
    {tool_call_parser_kind::llama3_json, false, "llama3_json"},
    {tool_call_parser_kind::hermes, false, "hermes (spelled)"},
    {tool_call_parser_kind::hermes, true, "hermes (special)"},
    {tool_call_parser_kind::deepseek_v3, true, "deepseek_v3 (special)"},
    {tool_call_parser_kind::deepseek_v3, false, "deepseek_v3 (spelled)"},
    {tool_call_parser_kind::kimi_k2, true, "kimi_k2 (special)"},
    {tool_call_parser_kind::kimi_k2, false, "kimi_k2 (spelled)"},
    {tool_call_parser_kind::glm45, true, "glm45 (special)"},
    {tool_call_parser_kind::glm45, false, "glm45 (spelled)"},
};

struct grammar_case {
  std::string only;
  bool parallel = true;
  std::size_t earlier_calls = 0;
  gw::reasoning_parser_kind reasoning = gw::reasoning_parser_kind::none;
  bool starts_in_reasoning = false;
};

std::shared_ptr<const g::compiled_grammar> compile_calls(tool_call_parser_kind kind, const edge::backend::tokenizer& tok,
                                                         const grammar_case& c = {},
                                                         const std::vector<gw::tool_spec>& offered = tools) {
  gw::output_syntax syntax;
  syntax.tool_calls = kind;
  syntax.reasoning = c.reasoning;
  auto built = gw::tool_call_answer_grammar(
      syntax, tok, {.tools = offered, .only = c.only, .parallel = c.parallel, .earlier_calls = c.earlier_calls},
      c.starts_in_reasoning);
  REQUIRE_MESSAGE(built.ok(), built.error().message());
  return edge::testing::compile_or_fail(*built, tok);
}

// Whether the grammar takes `text` (special markers as their tokens) whole: every token, then the end.
bool accepts(const std::shared_ptr<const g::compiled_grammar>& grammar, const edge::backend::tokenizer& tok,
             std::string_view text) {
  g::grammar_matcher m(grammar);
  for (const auto id : tok.encode(text, {.add_bos = false, .parse_special = true})) {
    if (!m.accept(id)) return false;
  }
  return m.can_end();
}

gw::output_parser_options parsing(tool_call_parser_kind kind, const grammar_case& c = {},
                                  const std::vector<gw::tool_spec>& offered = tools) {
  gw::output_parser_options o;
  o.tool_calls = kind;
  o.tools = offered;
  o.parallel_tool_calls = c.parallel;
  o.reasoning = c.reasoning;
  o.starts_in_reasoning = c.starts_in_reasoning;
  o.make_id = edge::testing::counting_ids();
  return o;
}

// The family's rendering of calls, as its chat template writes an assistant turn with them:
// get_weather(city Paris, days 3), then get_time().
std::string rendering(tool_call_parser_kind kind, std::size_t first_index = 0) {
  switch (kind) {
    case tool_call_parser_kind::llama3_json:
      return R"({"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; {"name": "get_time", "parameters": {}})";
    case tool_call_parser_kind::hermes:
      return "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n"
             "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    case tool_call_parser_kind::deepseek_v3:
      return "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
             "{\"city\": \"Paris\", \"days\": 3}\n```<｜tool▁call▁end｜>\n"
             "<｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    case tool_call_parser_kind::kimi_k2:
      return "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:" + std::to_string(first_index) +
             "<|tool_call_argument_begin|>{\"city\": \"Paris\", \"days\": 3}<|tool_call_end|>"
             "<|tool_call_begin|>functions.get_time:" +
             std::to_string(first_index + 1) + "<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>";
    case tool_call_parser_kind::glm45:
      return "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
             "<arg_value>3</arg_value>\n</tool_call>\n<tool_call>get_time\n</tool_call>";
    case tool_call_parser_kind::none: break;
  }
  return {};
}

// The first call of rendering(kind) alone.
std::string first_call(tool_call_parser_kind kind) {
  const std::string all = rendering(kind);
  switch (kind) {
    case tool_call_parser_kind::llama3_json: return all.substr(0, all.find("; "));
    case tool_call_parser_kind::hermes:
    case tool_call_parser_kind::glm45: return all.substr(0, all.find("\n<tool_call>"));
    case tool_call_parser_kind::deepseek_v3:
      return all.substr(0, all.find("\n<｜tool▁call▁begin｜>")) + "<｜tool▁calls▁end｜>";
    case tool_call_parser_kind::kimi_k2:
      return all.substr(0, all.find("<|tool_call_begin|>functions.get_time")) + "<|tool_calls_section_end|>";
    case tool_call_parser_kind::none: break;
  }
  return {};
}

bool is_json_object(std::string_view text) {
  simdjson::dom::parser parser;
  const auto parsed = edge::parse_json(parser, text);
  return parsed.ok() && parsed->type() == simdjson::dom::element_type::OBJECT;
}

std::vector<std::string> keys_of(std::string_view text) {
  simdjson::dom::parser parser;
  std::vector<std::string> keys;
  const auto parsed = edge::parse_json(parser, text);
  if (!parsed.ok() || parsed->type() != simdjson::dom::element_type::OBJECT) return keys;
  const simdjson::dom::object object = parsed->get_object().value_unsafe();
  for (const auto field : object) keys.emplace_back(field.key);
  return keys;
}

const std::vector<std::string>& required_keys(std::string_view tool) {
  static const std::vector<std::string> weather = {"city"};
  static const std::vector<std::string> alarm = {"at", "label"};
  static const std::vector<std::string> none;
  return tool == "get_weather" ? weather : tool == "set_alarm" ? alarm : none;
}

}  // namespace

TEST_CASE("each family's grammar accepts the family's own rendering of calls") {
  for (const family_case& f : all_families) {
    CAPTURE(f.name);
    const auto tok = family_tokenizer(f.kind, f.special_markers);
    const auto grammar = compile_calls(f.kind, *tok);
    CHECK(accepts(grammar, *tok, rendering(f.kind)));
    CHECK(accepts(grammar, *tok, first_call(f.kind)));
    // The parser reads the rendering back as the two calls.
    const auto parsed = edge::testing::parse_every_way([&] { return parsing(f.kind); }, rendering(f.kind));
    REQUIRE(parsed.message.tool_calls.size() == 2);
    CHECK(parsed.message.content.empty());
    CHECK(keys_of(parsed.message.tool_calls[0].arguments) == std::vector<std::string>{"city", "days"});
    CHECK(parsed.message.tool_calls[1].arguments == "{}");
  }
}

TEST_CASE("the grammar refuses what is not a call of an allowed tool") {
  for (const family_case& f : all_families) {
    CAPTURE(f.name);
    const auto tok = family_tokenizer(f.kind, f.special_markers);
    const auto any = compile_calls(f.kind, *tok);
    // Nothing at all, text, or a call cut short.
    CHECK_FALSE(accepts(any, *tok, ""));
    CHECK_FALSE(accepts(any, *tok, "Sure, here it is."));
    const std::string one = first_call(f.kind);
    CHECK_FALSE(accepts(any, *tok, one.substr(0, one.size() - 3)));
    // A call and then text.
    CHECK_FALSE(accepts(any, *tok, rendering(f.kind) + " done"));
    // Arguments without the required city.
    std::string no_city = one;
    const std::string city = f.kind == tool_call_parser_kind::glm45
                                 ? "<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
                                 : "\"city\": \"Paris\", ";
    REQUIRE(no_city.find(city) != std::string::npos);
    no_city.erase(no_city.find(city), city.size());
    CHECK_FALSE(accepts(any, *tok, no_city));
    // A number outside the schema's bounds.
    std::string ten_days = one;
    ten_days.replace(ten_days.find('3'), 1, "10");
    CHECK_FALSE(accepts(any, *tok, ten_days));
    // Named: only that tool; not parallel: one call.
    const auto named = compile_calls(f.kind, *tok, {.only = "get_time"});
    CHECK_FALSE(accepts(named, *tok, one));
    const auto single = compile_calls(f.kind, *tok, {.parallel = false});
    CHECK(accepts(single, *tok, one));
    CHECK_FALSE(accepts(single, *tok, rendering(f.kind)));
  }
}

TEST_CASE("a marker that is a special token is only that token, never spelled out") {
  const auto tok = family_tokenizer(tool_call_parser_kind::hermes, true);
  const auto grammar = compile_calls(tool_call_parser_kind::hermes, *tok);
  g::grammar_matcher m(grammar);
  const auto marker = tok->find_token("<tool_call>");
  REQUIRE(marker);
  std::vector<std::uint32_t> mask(static_cast<std::size_t>(g::mask_words(tok->vocab_size())));
  REQUIRE(m.fill_mask(mask));
  std::vector<edge::backend::token_id> allowed;
  for (std::int64_t t = 0; t < tok->vocab_size(); ++t) {
    if (edge::testing::bit(mask, t)) allowed.push_back(static_cast<edge::backend::token_id>(t));
  }
  CHECK(allowed == std::vector<edge::backend::token_id>{*marker});
}

TEST_CASE("kimi_k2: the calls' ids count on from the conversation's earlier calls") {
  const auto tok = family_tokenizer(tool_call_parser_kind::kimi_k2, true);
  const auto after_three = compile_calls(tool_call_parser_kind::kimi_k2, *tok, {.earlier_calls = 3});
  CHECK(accepts(after_three, *tok, rendering(tool_call_parser_kind::kimi_k2, 3)));
  CHECK_FALSE(accepts(after_three, *tok, rendering(tool_call_parser_kind::kimi_k2, 0)));
  const auto parsed = edge::testing::parse_every_way([&] { return parsing(tool_call_parser_kind::kimi_k2); },
                                                     rendering(tool_call_parser_kind::kimi_k2, 3));
  REQUIRE(parsed.message.tool_calls.size() == 2);
  CHECK(parsed.message.tool_calls[0].id == "functions.get_weather:3");
  CHECK(parsed.message.tool_calls[1].id == "functions.get_time:4");
}

TEST_CASE("glm45: raw string values, JSON values, required and optional pairs") {
  const std::vector<gw::tool_spec> offered = {
      {"book",
       R"({"type":"object","properties":{"who":{"type":"string","minLength":2,"maxLength":6},"kind":{"type":"string","enum":["bus","train"]},"seats":{"type":"integer","minimum":1,"maximum":4},"note":{"type":["string","null"]},"ref":{"$ref":"#/$defs/code"}},"required":["who","kind"],"$defs":{"code":{"type":"array","items":{"type":"integer"},"maxItems":2}}})"}};
  const auto tok = family_tokenizer(tool_call_parser_kind::glm45, true);
  const auto grammar = compile_calls(tool_call_parser_kind::glm45, *tok, {}, offered);
  const auto pair = [](std::string_view key, std::string_view value) {
    return "<arg_key>" + std::string(key) + "</arg_key>\n<arg_value>" + std::string(value) + "</arg_value>\n";
  };
  const auto call = [](const std::string& pairs) { return "<tool_call>book\n" + pairs + "</tool_call>"; };
  CHECK(accepts(grammar, *tok, call(pair("who", "Ann B") + pair("kind", "train"))));
  CHECK(accepts(grammar, *tok, call(pair("who", "Ann") + pair("kind", "bus") + pair("seats", "2") +
                                    pair("note", "by the window") + pair("ref", "[1, 2]"))));
  CHECK_FALSE(accepts(grammar, *tok, call(pair("who", "A") + pair("kind", "bus"))));          // minLength
  CHECK_FALSE(accepts(grammar, *tok, call(pair("who", "Annabel") + pair("kind", "bus"))));    // maxLength
  CHECK_FALSE(accepts(grammar, *tok, call(pair("who", " Ann") + pair("kind", "bus"))));       // trimmed by the parser
  CHECK_FALSE(accepts(grammar, *tok, call(pair("who", "Ann") + pair("kind", "car"))));        // enum
  CHECK_FALSE(accepts(grammar, *tok, call(pair("who", "Ann") + pair("kind", "\"bus\""))));    // raw, not JSON
  CHECK_FALSE(accepts(grammar, *tok, call(pair("who", "Ann"))));                              // kind is required
  CHECK_FALSE(accepts(grammar, *tok, call(pair("who", "Ann") + pair("kind", "bus") + pair("seats", "\"2\""))));
  CHECK_FALSE(accepts(grammar, *tok, call(pair("who", "a<b") + pair("kind", "bus"))));
  const auto parsed = edge::testing::parse_every_way(
      [&] { return parsing(tool_call_parser_kind::glm45, {}, offered); },
      call(pair("who", "Ann") + pair("kind", "bus") + pair("seats", "2") + pair("note", "by the window") +
           pair("ref", "[1, 2]")));
  REQUIRE(parsed.message.tool_calls.size() == 1);
  CHECK(parsed.message.tool_calls[0].arguments ==
        R"({"who": "Ann", "kind": "bus", "seats": 2, "note": "by the window", "ref": [1, 2]})");
}

TEST_CASE("reasoning: an optional block before the calls, or the end of the one the prompt opened") {
  const auto kind = tool_call_parser_kind::hermes;
  const auto tok = family_tokenizer(kind, true, /*think_tags=*/true);
  const grammar_case outside{.reasoning = gw::reasoning_parser_kind::think};
  const grammar_case inside{.reasoning = gw::reasoning_parser_kind::think, .starts_in_reasoning = true};
  const auto optional_block = compile_calls(kind, *tok, outside);
  const auto open_block = compile_calls(kind, *tok, inside);
  const std::string calls = rendering(kind);
  CHECK(accepts(optional_block, *tok, calls));
  CHECK(accepts(optional_block, *tok, "<think>\nParis, so a < b.\n</think>\n\n" + calls));
  CHECK_FALSE(accepts(optional_block, *tok, "<think>a</b></think>" + calls));
  CHECK_FALSE(accepts(optional_block, *tok, "<think>never closed"));
  CHECK(accepts(open_block, *tok, "The user wants Paris.</think>\n\n" + calls));
  CHECK_FALSE(accepts(open_block, *tok, calls));
  const auto parsed = edge::testing::parse_every_way([&] { return parsing(kind, inside); },
                                                     "The user wants Paris.</think>\n\n" + calls);
  CHECK(parsed.message.reasoning == "The user wants Paris.");
  CHECK(parsed.message.content.empty());
  CHECK(parsed.message.tool_calls.size() == 2);
}

TEST_CASE("the parser reads every output the grammar allows as calls of allowed tools with JSON object arguments") {
  for (const family_case& f : all_families) {
    for (const grammar_case& c : {grammar_case{}, grammar_case{.only = "set_alarm", .parallel = false, .earlier_calls = 5}}) {
      CAPTURE(f.name);
      CAPTURE(c.only);
      const auto tok = family_tokenizer(f.kind, f.special_markers);
      const auto grammar = compile_calls(f.kind, *tok, c);
      int ended = 0;
      for (std::uint64_t seed = 0; seed < 40; ++seed) {
        CAPTURE(seed);
        const auto walk = edge::testing::random_walk(grammar, *tok, seed, 3000, /*check=*/seed == 0, 0.5);
        if (!walk.ended) continue;
        ++ended;
        CAPTURE(walk.text);
        const auto parsed = edge::testing::parse_pieces([&] { return parsing(f.kind, c); }, {walk.text});
        CHECK(parsed.message.content.empty());
        REQUIRE_FALSE(parsed.message.tool_calls.empty());
        if (!c.parallel) CHECK(parsed.message.tool_calls.size() == 1);
        for (const auto& call : parsed.message.tool_calls) {
          if (!c.only.empty()) CHECK(call.name == c.only);
          CHECK(is_json_object(call.arguments));
          const auto keys = keys_of(call.arguments);
          for (const std::string& key : required_keys(call.name)) {
            CHECK(std::find(keys.begin(), keys.end(), key) != keys.end());
          }
        }
        if (f.kind == tool_call_parser_kind::kimi_k2) {
          for (std::size_t k = 0; k < parsed.message.tool_calls.size(); ++k) {
            const auto& call = parsed.message.tool_calls[k];
            CHECK(call.id == "functions." + call.name + ":" + std::to_string(c.earlier_calls + k));
          }
        }
      }
      CHECK(ended >= 30);
    }
  }
}

TEST_CASE("arguments are a JSON object whatever the parameters schema says, or the schema is an error") {
  // A schema of annotations alone allows any object; one whose values are objects through
  // anyOf, allOf or $ref is enforced as it is.
  const std::vector<gw::tool_spec> object_tools = {
      {"any", "{}"},
      {"described", R"({"description":"anything","title":"t"})"},
      {"either", R"({"anyOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},{"type":"object","properties":{"b":{"const":"x"}},"required":["b"]}]})"},
      {"referred", R"({"$defs":{"args":{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}},"$ref":"#/$defs/args"})"},
  };
  for (const auto kind : {tool_call_parser_kind::hermes, tool_call_parser_kind::llama3_json}) {
    CAPTURE(gw::to_string(kind));
    const auto tok = family_tokenizer(kind, false);
    for (const gw::tool_spec& tool : object_tools) {
      CAPTURE(tool.name);
      const grammar_case c{.only = tool.name, .parallel = false};
      const auto grammar = compile_calls(kind, *tok, c, object_tools);
      int ended = 0;
      for (std::uint64_t seed = 0; seed < 30; ++seed) {
        const auto walk = edge::testing::random_walk(grammar, *tok, seed, 3000, /*check=*/false, 0.5);
        if (!walk.ended) continue;
        ++ended;
        CAPTURE(walk.text);
        const auto parsed = edge::testing::parse_pieces([&] { return parsing(kind, c, object_tools); }, {walk.text});
        REQUIRE(parsed.message.tool_calls.size() == 1);
        CHECK(parsed.message.content.empty());
        CHECK(is_json_object(parsed.message.tool_calls[0].arguments));
      }
      CHECK(ended >= 20);
    }
  }
  // A string where arguments must be: the hermes wrapper's '}' once ended up in the arguments.
  const auto hermes = family_tokenizer(tool_call_parser_kind::hermes, false);
  const auto any = compile_calls(tool_call_parser_kind::hermes, *hermes, {.only = "any"}, object_tools);
  CHECK(accepts(any, *hermes, "<tool_call>\n{\"name\": \"any\", \"arguments\": {\"k\": [1]}}\n</tool_call>"));
  CHECK_FALSE(accepts(any, *hermes, "<tool_call>\n{\"name\": \"any\", \"arguments\": \"fixed\"}\n</tool_call>"));

  const auto build = [](std::string parameters) {
    g::grammar_builder b;
    const std::vector<gw::tool_spec> offered = {{"f", std::move(parameters)}};
    return gw::tool_call_grammar(b, {.kind = tool_call_parser_kind::hermes, .tools = offered});
  };
  const std::pair<std::string_view, std::string_view> refused[] = {
      {R"({"const":"fixed"})", "tools[0].function.parameters.const"},
      {R"({"enum":[{"a":1},"b"]})", "tools[0].function.parameters.enum"},
      {R"({"anyOf":[{"type":"object"},{"type":"string"}]})", "tools[0].function.parameters.anyOf[1].type"},
      {R"({"oneOf":[{"type":"object"},{"minLength":2}]})", "tools[0].function.parameters.oneOf[1]"},
      {R"({"allOf":[{"minimum":1},{"maximum":2}]})", "tools[0].function.parameters.allOf"},
      {R"({"properties":{"a":{"type":"integer"}}})", "tools[0].function.parameters"},
      {R"({"$ref":"#/$defs/s","$defs":{"s":{"type":"string"}}})", "tools[0].function.parameters.$ref.type"},
      {R"({"$ref":"#"})", "tools[0].function.parameters.$ref"},
  };
  for (const auto& [parameters, path] : refused) {
    CAPTURE(parameters);
    const auto e = build(std::string(parameters));
    REQUIRE_FALSE(e.ok());
    CHECK(e.error().path() == path);
  }
  CHECK(build(R"({"allOf":[{"type":"object","properties":{"a":{"type":"integer"}}},{"required":["a"]}]})").ok());

  // Definitions whose two alternatives both name the next, 40 levels deep: 2^40 paths to the
  // last one, each definition checked once.
  const auto ladder = [](std::string_view last) {
    std::string defs;
    for (int i = 0; i < 40; ++i) {
      defs += edge::format(R"("d{}":{{"anyOf":[{{"$ref":"#/$defs/d{}"}},{{"$ref":"#/$defs/d{}"}}]}},)", i, i + 1, i + 1);
    }
    return edge::format(R"({{"$ref":"#/$defs/d0","$defs":{{{}"d40":{}}}}})", defs, last);
  };
  const auto ladder_to_object = build(ladder(R"({"type":"object","properties":{"n":{"type":"integer"}}})"));
  CHECK_MESSAGE(ladder_to_object.ok(), (ladder_to_object.ok() ? "" : ladder_to_object.error().message()));
  const auto ladder_to_string = build(ladder(R"({"type":"string"})"));
  REQUIRE_FALSE(ladder_to_string.ok());
  std::string first_path = "tools[0].function.parameters.$ref";
  for (int i = 0; i < 40; ++i) first_path += ".anyOf[0]";
  CHECK(ladder_to_string.error().path() == first_path + ".type");
  // A loop of references through alternatives, with an object beside it.
  const auto loop = build(R"({"$defs":{"a":{"anyOf":[{"$ref":"#/$defs/b"},{"type":"object"}]},)"
                          R"("b":{"oneOf":[{"$ref":"#/$defs/a"}]}},"$ref":"#/$defs/a"})");
  REQUIRE_FALSE(loop.ok());
  CHECK(loop.error().path() == "tools[0].function.parameters.$ref.anyOf[0].oneOf[0]");
}

TEST_CASE("schemas the grammar cannot enforce are errors naming the tool and the keyword") {
  const auto build = [](tool_call_parser_kind kind, std::vector<gw::tool_spec> offered, std::string only = "") {
    g::grammar_builder b;
    return gw::tool_call_grammar(b, {.kind = kind, .tools = offered, .only = std::move(only)});
  };
  const std::vector<gw::tool_spec> with_pattern = {
      {"ok", ""}, {"lookup", R"({"type":"object","properties":{"code":{"type":"string","pattern":"^[A-Z]+$"}}})"}};
  auto e = build(tool_call_parser_kind::hermes, with_pattern);
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().path() == "tools[1].function.parameters.properties.code.pattern");
  CHECK(e.error().message().find("tool 'lookup'") != std::string::npos);
  CHECK(e.error().message().find("pattern") != std::string::npos);
  // Named: only the chosen tool's schema matters.
  CHECK(build(tool_call_parser_kind::hermes, with_pattern, "ok").ok());

  e = build(tool_call_parser_kind::llama3_json, {{"f", R"({"type":"string"})"}});
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().path() == "tools[0].function.parameters.type");

  e = build(tool_call_parser_kind::glm45, {{"f", R"({"anyOf":[{"type":"object"}]})"}});
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().path() == "tools[0].function.parameters.anyOf");
  CHECK(e.error().message().find("GLM-4.5") != std::string::npos);

  e = build(tool_call_parser_kind::glm45, {{"f", R"({"type":"object","properties":{"d":{"type":"string","format":"date"}}})"}});
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().path() == "tools[0].function.parameters.properties.d.format");

  e = build(tool_call_parser_kind::glm45, {{"f", R"({"type":"object","properties":{"n":{"type":"integer","multipleOf":3}}})"}});
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().path() == "tools[0].function.parameters.properties.n.multipleOf");

  e = build(tool_call_parser_kind::glm45, {{"f", R"({"type":"object","properties":{"a":{}},"required":["b"]})"}});
  REQUIRE_FALSE(e.ok());
  CHECK(e.error().path() == "tools[0].function.parameters.required");
}
