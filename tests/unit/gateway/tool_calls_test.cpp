// Each family's tool-call syntax as its chat template writes it: single and several calls, text
// around them, markers split at every byte, calls that are not calls (unknown tools, other
// shapes) returned as content, arguments that are not JSON, parallel_tool_calls, truncation.
#include <doctest/doctest.h>

#include <algorithm>
#include <random>

#include "edge/common/json_fields.h"
#include "edge/gateway/openai/tool_calls.h"
#include "openai/families/family.h"
#include "output_feeding.h"

namespace gw = edge::gateway;
using edge::testing::describe;
using edge::testing::parse_every_way;

namespace {

const std::vector<gw::tool_spec> weather_tools = {
    {"get_weather", R"({"type":"object","properties":{"city":{"type":"string"},"days":{"type":"integer"}}})"},
    {"get_time", R"({"type":"object","properties":{"zone":{"type":["string","null"]},"utc":{"type":"boolean"}}})"},
};

edge::testing::options_factory tools(gw::tool_call_parser_kind kind, bool parallel = true,
                                     std::vector<gw::tool_spec> offered = weather_tools) {
  return [=] {
    gw::output_parser_options o;
    o.tool_calls = kind;
    o.tools = offered;
    o.parallel_tool_calls = parallel;
    o.make_id = edge::testing::counting_ids();
    return o;
  };
}

gw::assembled_tool_call call(std::string id, std::string name, std::string arguments) {
  return {std::move(id), std::move(name), std::move(arguments)};
}

bool parses_as_json(std::string_view text) {
  simdjson::dom::parser parser;
  return edge::parse_json(parser, text).ok();
}

const auto hermes = tools(gw::tool_call_parser_kind::hermes);
const auto llama = tools(gw::tool_call_parser_kind::llama3_json);
const auto deepseek = tools(gw::tool_call_parser_kind::deepseek_v3);
const auto kimi = tools(gw::tool_call_parser_kind::kimi_k2);
const auto glm = tools(gw::tool_call_parser_kind::glm45);

}  // namespace

// ---- hermes (Qwen2.5, Qwen3) ---------------------------------------------------------------------

TEST_CASE("hermes: one call, named first, then its arguments as written") {
  const auto r = parse_every_way(
      hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>");
  CHECK(describe(r.events) == R"(call#0(call_1,get_weather) args#0[{"city": "Paris", "days": 3}] )");
  CHECK(r.message.content.empty());
}

TEST_CASE("hermes: text before, several calls, whitespace between them dropped") {
  const auto r = parse_every_way(hermes,
                                 "Let me check both.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                                 "{\"city\": \"Oslo\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
                                 "\"arguments\": {\"zone\": \"CET\"}}\n</tool_call>");
  CHECK(r.message.content == "Let me check both.");
  REQUIRE(r.message.tool_calls.size() == 2);
  CHECK(r.message.tool_calls[0] == call("call_1", "get_weather", R"({"city": "Oslo"})"));
  CHECK(r.message.tool_calls[1] == call("call_2", "get_time", R"({"zone": "CET"})"));
}

TEST_CASE("hermes: braces and markers inside argument strings do not end the call") {
  const auto r = parse_every_way(
      hermes, R"(<tool_call>{"name":"get_weather","arguments":{"city":"} </tool_call> \"{"}}</tool_call>)");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0].arguments == R"({"city":"} </tool_call> \"{"})");
  CHECK(r.message.content.empty());
}

TEST_CASE("hermes: an unknown tool, another shape or a mentioned tag is content, as written") {
  for (const std::string_view text :
       {"<tool_call>\n{\"name\": \"launch_rocket\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"arguments\": {}, \"name\": \"get_weather\"}\n</tool_call>",
        "Wrap calls in <tool_call> tags.", "<tool_call>not json</tool_call>", "<tool_call>"}) {
    CAPTURE(text);
    const auto r = parse_every_way(hermes, text);
    CHECK(r.message.tool_calls.empty());
    CHECK(r.message.content == text);
  }
}

TEST_CASE("hermes: a real call after a mentioned tag is still found") {
  const auto r = parse_every_way(hermes,
                                 "I use <tool_call> tags:\n<tool_call>{\"name\": \"get_time\", \"arguments\": {}}"
                                 "</tool_call>");
  CHECK(r.message.content == "I use <tool_call> tags:");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0] == call("call_1", "get_time", "{}"));
}

TEST_CASE("hermes: arguments that stop being JSON are passed on as written, up to the end marker") {
  const auto r =
      parse_every_way(hermes, "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": Paris}}\n</tool_call>Done");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0].arguments == R"({"city": Paris}})");
  CHECK_FALSE(parses_as_json(r.message.tool_calls[0].arguments));
  CHECK(r.message.content == "Done");
}

TEST_CASE("hermes: a call without arguments gets {}; text after the closing syntax is content") {
  auto r = parse_every_way(hermes, "<tool_call>{\"name\": \"get_time\"}</tool_call>");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0].arguments == "{}");
  r = parse_every_way(hermes, "<tool_call>{\"name\": \"get_time\", \"arguments\": {}} trailing</tool_call>");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0].arguments == "{}");
  CHECK(r.message.content == "trailing</tool_call>");
}

TEST_CASE("hermes: a call cut short keeps what it has; a header the model ended in is content, one cut short is dropped") {
  for (const bool cut : {false, true}) {
    CAPTURE(cut);
    auto r = parse_every_way(hermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Par", cut);
    REQUIRE(r.message.tool_calls.size() == 1);
    CHECK(r.message.tool_calls[0].arguments == R"({"city": "Par)");
  }
  auto r = parse_every_way(hermes, "Sure.\n<tool_call>\n{\"name\": \"get_wea");
  CHECK(r.message.tool_calls.empty());
  CHECK(r.message.content == "Sure.\n<tool_call>\n{\"name\": \"get_wea");
  // Cut short (max_tokens): the unfinished call and a marker begun are markup, not content.
  for (const std::string_view text : {"Sure.\n<tool_call>\n{\"name\": \"get_wea", "Sure.\n<tool_call>", "Sure.\n<tool_c"}) {
    CAPTURE(text);
    r = parse_every_way(hermes, text, /*cut=*/true);
    CHECK(r.message.tool_calls.empty());
    CHECK(r.message.content == "Sure.");
  }
  // A whole call, then the next one cut short: the first stays, nothing of the second shows.
  r = parse_every_way(hermes,
                      "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>\n<tool_call>\n{\"nam",
                      /*cut=*/true);
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0] == call("call_1", "get_time", "{}"));
  CHECK(r.message.content.empty());
}

TEST_CASE("section families cut short: a section or call marker begun leaves nothing in content") {
  auto r = parse_every_way(kimi, "Checking.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_ti",
                           /*cut=*/true);
  CHECK(r.message.tool_calls.empty());
  CHECK(r.message.content == "Checking.");
  r = parse_every_way(kimi, "Checking.<|tool_calls_section_begin|>", /*cut=*/true);
  CHECK(r.message.tool_calls.empty());
  CHECK(r.message.content == "Checking.");
  r = parse_every_way(deepseek, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```"
                                "<｜tool▁call▁end｜><｜tool▁call▁begin｜>funct", /*cut=*/true);
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.content.empty());
}

TEST_CASE("parallel_tool_calls false: the first call only") {
  const auto r = parse_every_way(tools(gw::tool_call_parser_kind::hermes, /*parallel=*/false),
                                 "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}</tool_call>\n"
                                 "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0] == call("call_1", "get_weather", R"({"city": "A"})"));
  CHECK(r.message.content.empty());
}

TEST_CASE("escaped names are read as JSON") {
  const auto r = parse_every_way(hermes, R"(<tool_call>{"name": "get_\u0074ime", "arguments": {}}</tool_call>)");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0].name == "get_time");
}

// ---- llama3_json ------------------------------------------------------------------------------

TEST_CASE("llama3_json: a JSON call with parameters, with or without <|python_tag|>") {
  for (const std::string_view text :
       {R"({"name": "get_weather", "parameters": {"city": "Rome"}})",
        R"(<|python_tag|>{"name": "get_weather", "parameters": {"city": "Rome"}})",
        "\n\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n"}) {
    CAPTURE(text);
    const auto r = parse_every_way(llama, text);
    REQUIRE(r.message.tool_calls.size() == 1);
    CHECK(r.message.tool_calls[0] == call("call_1", "get_weather", R"({"city": "Rome"})"));
    CHECK(r.message.content.empty());
  }
}

TEST_CASE("llama3_json: several calls separated by ';'") {
  const auto r = parse_every_way(
      llama, R"({"name": "get_weather", "parameters": {"city": "Rome"}}; {"name": "get_time", "parameters": {}})");
  REQUIRE(r.message.tool_calls.size() == 2);
  CHECK(r.message.tool_calls[1] == call("call_2", "get_time", "{}"));
}

TEST_CASE("llama3_json: an answer that is no call is content, unchanged") {
  for (const std::string_view text :
       {"The weather in Rome is sunny.", R"({"answer": 42})", R"({"name": "unknown", "parameters": {}})",
        "  <|python_tag|>brave_search.call(query=\"x\")", "Call {\"name\": \"get_time\", \"parameters\": {}} later"}) {
    CAPTURE(text);
    const auto r = parse_every_way(llama, text);
    CHECK(r.message.tool_calls.empty());
    CHECK(r.message.content == text);
  }
}

TEST_CASE("llama3_json: text after a call is content") {
  const auto r = parse_every_way(llama, R"({"name": "get_time", "parameters": {}} and then some)");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.content == "and then some");
}

// ---- deepseek_v3 ------------------------------------------------------------------------------

TEST_CASE("deepseek_v3: V3's fenced calls, several in one section") {
  const auto r = parse_every_way(
      deepseek,
      "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
      "\"Lima\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```"
      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  CHECK(r.message.content == "Checking.");
  REQUIRE(r.message.tool_calls.size() == 2);
  CHECK(r.message.tool_calls[0] == call("call_1", "get_weather", R"({"city": "Lima"})"));
  CHECK(r.message.tool_calls[1] == call("call_2", "get_time", "{}"));
}

TEST_CASE("deepseek_v3: V3.1's calls (name, separator, JSON)") {
  const auto r = parse_every_way(
      deepseek,
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Lima\", \"days\": 2}"
      "<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"utc\": true}<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>");
  REQUIRE(r.message.tool_calls.size() == 2);
  CHECK(r.message.tool_calls[0] == call("call_1", "get_weather", R"({"city": "Lima", "days": 2})"));
  CHECK(r.message.tool_calls[1] == call("call_2", "get_time", R"({"utc": true})"));
  CHECK(r.message.content.empty());
}

TEST_CASE("deepseek_v3: a section whose first call is no call is content from its marker on") {
  const std::string_view text =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>launch\n```json\n{}\n```<｜tool▁call▁end｜>"
      "<｜tool▁calls▁end｜>";
  const auto r = parse_every_way(deepseek, text);
  CHECK(r.message.tool_calls.empty());
  CHECK(r.message.content == text);
}

TEST_CASE("deepseek_v3: a later call that is no call is content; the calls around it stay") {
  const auto r = parse_every_way(
      deepseek,
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>launch<｜tool▁sep｜>{}<｜tool▁call▁end｜>"
      "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  REQUIRE(r.message.tool_calls.size() == 2);
  CHECK(r.message.tool_calls[0].name == "get_time");
  CHECK(r.message.tool_calls[1].name == "get_weather");
  CHECK(r.message.content == "<｜tool▁call▁begin｜>launch<｜tool▁sep｜>{}<｜tool▁call▁end｜>");
}

// ---- kimi_k2 ----------------------------------------------------------------------------------

TEST_CASE("kimi_k2: calls keep the id the model wrote") {
  const auto r = parse_every_way(
      kimi,
      "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": "
      "\"Kyoto\"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{}"
      "<|tool_call_end|><|tool_calls_section_end|>");
  CHECK(describe(r.events) ==
        R"(call#0(functions.get_weather:0,get_weather) args#0[{"city": "Kyoto"}] call#1(functions.get_time:1,get_time) args#1[{}] )");
}

TEST_CASE("kimi_k2: an id without its index, or an unknown function, is content") {
  for (const std::string_view text :
       {"<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time<|tool_call_argument_begin|>{}"
        "<|tool_call_end|><|tool_calls_section_end|>",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.fly:0<|tool_call_argument_begin|>{}"
        "<|tool_call_end|><|tool_calls_section_end|>"}) {
    CAPTURE(text);
    const auto r = parse_every_way(kimi, text);
    CHECK(r.message.tool_calls.empty());
    CHECK(r.message.content == text);
  }
}

// ---- glm45 ------------------------------------------------------------------------------------

TEST_CASE("glm45: string parameters are raw text, the others JSON, as the schema says") {
  const auto r = parse_every_way(glm,
                                 "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>New \"York\"\nCity"
                                 "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>5</arg_value>\n</tool_call>");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0] == call("call_1", "get_weather", R"({"city": "New \"York\"\nCity", "days": 5})"));
  CHECK(parses_as_json(r.message.tool_calls[0].arguments));
  CHECK(r.message.content.empty());
}

TEST_CASE("glm45: a value that should be JSON and is not becomes a string; unknown keys are JSON if they can be") {
  const auto r = parse_every_way(glm,
                                 "<tool_call>get_weather<arg_key>days</arg_key><arg_value>five</arg_value>"
                                 "<arg_key>extra</arg_key><arg_value>[1, 2]</arg_value></tool_call>");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0].arguments == R"({"days": "five", "extra": [1, 2]})");
  CHECK(parses_as_json(r.message.tool_calls[0].arguments));
}

TEST_CASE("glm45: a JSON value ends at the closing tag outside its strings; a quote left open ends at the first") {
  const std::vector<gw::tool_spec> offered = {
      {"write", R"({"type":"object","properties":{"doc":{"type":"object"},"n":{"type":"integer"}}})"}};
  // A string inside the value spells the closing tag, an escaped quote before it.
  auto r = parse_every_way(tools(gw::tool_call_parser_kind::glm45, true, offered),
                           "<tool_call>write\n<arg_key>doc</arg_key>\n<arg_value>{\"html\": \"a \\\" </arg_value>\"}"
                           "</arg_value>\n<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n</tool_call>");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0].arguments == R"({"doc": {"html": "a \" </arg_value>"}, "n": 2})");
  CHECK(parses_as_json(r.message.tool_calls[0].arguments));
  // Not JSON, its quote never closed: the value is the text up to the first closing tag, a string.
  r = parse_every_way(tools(gw::tool_call_parser_kind::glm45, true, offered),
                      "<tool_call>write\n<arg_key>n</arg_key>\n<arg_value>2\"</arg_value>\n<arg_key>doc</arg_key>\n"
                      "<arg_value>{}</arg_value>\n</tool_call>");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0].arguments == R"({"n": "2\"", "doc": {}})");
  CHECK(parses_as_json(r.message.tool_calls[0].arguments));
}

TEST_CASE("glm45: a type list of string and null is a string; booleans stay JSON; several calls") {
  const auto r = parse_every_way(glm,
                                 "Two calls.\n<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>true"
                                 "</arg_value>\n<arg_key>utc</arg_key>\n<arg_value>true</arg_value>\n</tool_call>\n"
                                 "<tool_call>get_weather\n</tool_call>");
  CHECK(r.message.content == "Two calls.");
  REQUIRE(r.message.tool_calls.size() == 2);
  CHECK(r.message.tool_calls[0].arguments == R"({"zone": "true", "utc": true})");
  CHECK(r.message.tool_calls[1] == call("call_2", "get_weather", "{}"));
}

TEST_CASE("glm45: string values stream as they are written") {
  gw::output_parser_options o = glm();
  gw::output_parser parser(std::move(o));
  auto events = parser.feed("<tool_call>get_weather\n<arg_key>city</arg_key><arg_value>Rio de", 1);
  CHECK(describe(events) == R"(call#0(call_1,get_weather) args#0[{"city": "Rio de] )");
  events = parser.feed(" Janeiro </arg_value></tool_call>", 1);
  CHECK(describe(events) == R"(args#0[ Janeiro"}] )");
}

TEST_CASE("glm45: an unknown tool is content") {
  const std::string_view text = "<tool_call>fly\n<arg_key>to</arg_key>\n<arg_value>Mars</arg_value>\n</tool_call>";
  const auto r = parse_every_way(glm, text);
  CHECK(r.message.tool_calls.empty());
  CHECK(r.message.content == text);
}

// ---- all families ------------------------------------------------------------------------------

TEST_CASE("arguments stream as the model writes them") {
  gw::output_parser parser(hermes());
  auto events = parser.feed("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"ci", 1);
  CHECK(describe(events) == R"(call#0(call_1,get_weather) args#0[{"ci] )");
  events = parser.feed("ty\": \"Paris\"}}\n</tool_", 1);
  CHECK(describe(events) == R"(args#0[ty": "Paris"}] )");
  events = parser.feed("call>", 1);
  CHECK(events.empty());
  CHECK(parser.finish(false).empty());
}

TEST_CASE("random ids look like OpenAI's") {
  const std::string a = gw::random_id();
  const std::string b = gw::random_id();
  CHECK(a.starts_with("call_"));
  CHECK(a.size() == 29);
  CHECK(a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 5) == std::string::npos);
  CHECK(a != b);
}

TEST_CASE("tool-call parser names and markers") {
  for (const auto kind : {gw::tool_call_parser_kind::none, gw::tool_call_parser_kind::llama3_json,
                          gw::tool_call_parser_kind::hermes, gw::tool_call_parser_kind::deepseek_v3,
                          gw::tool_call_parser_kind::kimi_k2, gw::tool_call_parser_kind::glm45}) {
    CHECK(gw::parse_tool_call_parser_name(gw::to_string(kind)) == kind);
    CHECK(gw::tool_call_markers(kind).empty() == (kind == gw::tool_call_parser_kind::none));
  }
  CHECK_FALSE(gw::parse_tool_call_parser_name("qwen").has_value());
}

// ---- random texts ------------------------------------------------------------------------------

TEST_CASE("random texts of markers, JSON and words parse the same however they are cut") {
  // Fragments of every family's syntax, some valid, some broken, shuffled into texts: whatever
  // the text, parsing it whole, a byte at a time and in random pieces gives the same events.
  const std::vector<std::string> fragments = {
      "<tool_call>", "</tool_call>", "<tool_", "call>", "{\"name\": \"get_weather\", \"arguments\": ",
      "{\"name\": \"get_time\"}", "{\"city\": \"Paris\"}", "}", "{", "\"", "\\", ";", "\n", " ", "```json\n", "```",
      "<|python_tag|>", "{\"name\": \"get_time\", \"parameters\": {}}", "<｜tool▁calls▁begin｜>",
      "<｜tool▁call▁begin｜>", "function<｜tool▁sep｜>get_weather\n", "get_time<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
      "<｜tool▁calls▁end｜>", "<|tool_calls_section_begin|>", "<|tool_call_begin|>", "functions.get_time:0",
      "<|tool_call_argument_begin|>", "<|tool_call_end|>", "<|tool_calls_section_end|>", "get_weather\n",
      "<arg_key>", "city", "</arg_key>", "<arg_value>", "Oslo", "5", "</arg_value>", "<think>", "</think>", "words",
      "é", "日本"};
  std::mt19937 random(20240521);
  std::uniform_int_distribution<std::size_t> pick(0, fragments.size() - 1);
  std::uniform_int_distribution<int> length(1, 24);
  for (const auto kind : {gw::tool_call_parser_kind::llama3_json, gw::tool_call_parser_kind::hermes,
                          gw::tool_call_parser_kind::deepseek_v3, gw::tool_call_parser_kind::kimi_k2,
                          gw::tool_call_parser_kind::glm45}) {
    const auto options = [kind] {
      gw::output_parser_options o = tools(kind)();
      o.reasoning = gw::reasoning_parser_kind::think;
      return o;
    };
    for (int round = 0; round < 150; ++round) {
      std::string text;
      for (int n = length(random); n > 0; --n) text += fragments[pick(random)];
      CAPTURE(text);
      const auto whole = edge::testing::parse_pieces(options, {text});
      const auto bytes = edge::testing::parse_pieces(options, edge::testing::bytes_of(text));
      CHECK(describe(bytes.events) == describe(whole.events));
      std::vector<std::string> pieces;
      for (std::size_t at = 0; at < text.size();) {
        const std::size_t size = std::uniform_int_distribution<std::size_t>(1, 9)(random);
        pieces.push_back(text.substr(at, size));
        at += size;
      }
      CHECK(describe(edge::testing::parse_pieces(options, pieces).events) == describe(whole.events));
      for (const auto& call : whole.message.tool_calls) CHECK(!call.name.empty());
    }
  }
}

TEST_CASE("the family registry: every syntax has its file's family, by name, with its signature first") {
  namespace families = edge::gateway::families;
  using edge::gateway::tool_call_parser_kind;
  CHECK(families::find(tool_call_parser_kind::none) == nullptr);
  CHECK(edge::gateway::tool_call_markers(tool_call_parser_kind::none).empty());
  CHECK(edge::gateway::to_string(tool_call_parser_kind::none) == "none");
  CHECK(edge::gateway::parse_tool_call_parser_name("none") == tool_call_parser_kind::none);
  std::vector<tool_call_parser_kind> seen;
  for (const families::family_traits* f : families::all()) {
    CAPTURE(f->name);
    CHECK(families::find(f->kind) == f);
    CHECK(edge::gateway::to_string(f->kind) == f->name);
    CHECK(edge::gateway::parse_tool_call_parser_name(f->name) == f->kind);
    REQUIRE_FALSE(f->markers.empty());
    CHECK((f->write_calls != nullptr));
    CHECK((f->read_header != nullptr));
    CHECK(std::find(seen.begin(), seen.end(), f->kind) == seen.end());
    seen.push_back(f->kind);
  }
  for (const auto kind : {tool_call_parser_kind::llama3_json, tool_call_parser_kind::hermes,
                          tool_call_parser_kind::deepseek_v3, tool_call_parser_kind::kimi_k2,
                          tool_call_parser_kind::glm45}) {
    CHECK(std::find(seen.begin(), seen.end(), kind) != seen.end());
  }
  // GLM's signature is asked before Hermes': its vocabulary has Hermes' <tool_call> too.
  const auto at = [&](tool_call_parser_kind kind) { return std::find(seen.begin(), seen.end(), kind) - seen.begin(); };
  CHECK(at(tool_call_parser_kind::glm45) < at(tool_call_parser_kind::hermes));
  CHECK(families::glm45.markers.front() == "<arg_key>");
  CHECK(families::kimi_k2.reasoning == edge::gateway::reasoning_parser_kind::kimi_k2);
  CHECK(families::hermes.reasoning == edge::gateway::reasoning_parser_kind::think);
}
