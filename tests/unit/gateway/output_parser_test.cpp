// The whole output path: reasoning then tool calls in one answer, characters cut by delta
// boundaries, and the syntaxes a vocabulary shows.
#include <doctest/doctest.h>

#include "backend/tokenizer/tokenizer_fixtures.h"
#include "edge/common/utf8.h"
#include "edge/gateway/openai/output_parser.h"
#include "output_feeding.h"

namespace gw = edge::gateway;
using edge::testing::describe;
using edge::testing::parse_every_way;
using edge::testing::parse_pieces;

namespace {

edge::testing::options_factory thinking_tools(gw::reasoning_parser_kind reasoning, gw::tool_call_parser_kind calls) {
  return [=] {
    gw::output_parser_options o;
    o.reasoning = reasoning;
    o.tool_calls = calls;
    o.tools = {{"get_weather", R"({"type":"object","properties":{"city":{"type":"string"}}})"}};
    o.make_id = edge::testing::counting_ids();
    return o;
  };
}

// A byte-level vocabulary with `added` tokens (text, special).
std::unique_ptr<edge::backend::tokenizer> vocabulary(const std::vector<std::pair<std::string, bool>>& added) {
  edge::testing::byte_level_json json;
  std::string entries;
  for (const auto& [text, special] : added) json.extra.push_back(text);
  for (const auto& [text, special] : added) {
    if (!entries.empty()) entries += ",";
    entries += R"({"id":)" + std::to_string(json.id(text)) + R"(,"content":)" + edge::testing::json_quote(text) +
               R"(,"special":)" + (special ? "true" : "false") + "}";
  }
  json.added_tokens = "[" + entries + "]";
  auto tok = edge::backend::parse_hf_tokenizer(json.text(), "");
  REQUIRE_MESSAGE(tok.ok(), tok.error().to_string());
  return std::move(tok).value();
}

}  // namespace

TEST_CASE("Qwen3: reasoning, a sentence, then a call; the same streamed any way") {
  const auto r = parse_every_way(
      thinking_tools(gw::reasoning_parser_kind::think, gw::tool_call_parser_kind::hermes),
      "<think>\nThe user wants the weather; <tool_call> is how I call.\n</think>\n\nChecking.\n<tool_call>\n"
      "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
  CHECK(describe(r.events) ==
        "reasoning[The user wants the weather; <tool_call> is how I call.] content[Checking.] "
        R"(call#0(call_1,get_weather) args#0[{"city": "Paris"}] )");
}

TEST_CASE("GLM-4.5: reasoning then a call") {
  const auto r = parse_every_way(
      thinking_tools(gw::reasoning_parser_kind::think, gw::tool_call_parser_kind::glm45),
      "<think>Need weather.</think><tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n"
      "</tool_call>");
  CHECK(r.message.reasoning == "Need weather.");
  CHECK(r.message.content.empty());
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0].arguments == R"({"city": "Oslo"})");
}

TEST_CASE("Kimi K2 Thinking: a call that ends the thinking without </think>") {
  const auto r = parse_every_way(
      thinking_tools(gw::reasoning_parser_kind::kimi_k2, gw::tool_call_parser_kind::kimi_k2),
      "<think>I'll look it up.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0"
      "<|tool_call_argument_begin|>{\"city\": \"Seoul\"}<|tool_call_end|><|tool_calls_section_end|>");
  CHECK(describe(r.events) ==
        R"(reasoning[I'll look it up.] call#0(functions.get_weather:0,get_weather) args#0[{"city": "Seoul"}] )");
}

TEST_CASE("no tools: the answer is content even when it looks like a call") {
  const std::string_view text = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {}}</tool_call>";
  const auto r = parse_every_way(thinking_tools(gw::reasoning_parser_kind::think, gw::tool_call_parser_kind::none), text);
  CHECK(r.message.content == text);
  CHECK(r.message.tool_calls.empty());
}

TEST_CASE("characters cut between deltas reach every parser whole") {
  // "é" is two bytes, "日" three, "😀" four; fed a byte at a time.
  const std::string text =
      "<think>é日😀</think>Voilà 日本 <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"東京😀\"}}"
      "</tool_call>";
  const auto r = parse_pieces(thinking_tools(gw::reasoning_parser_kind::think, gw::tool_call_parser_kind::hermes),
                              edge::testing::bytes_of(text));
  CHECK(r.message.reasoning == "é日😀");
  CHECK(r.message.content == "Voilà 日本");
  REQUIRE(r.message.tool_calls.size() == 1);
  CHECK(r.message.tool_calls[0].arguments == R"({"city": "東京😀"})");
  for (const auto& event : r.events) {
    if (const auto* c = std::get_if<gw::content_delta>(&event)) CHECK(edge::utf8::is_valid(c->text));
  }
  // Every piece of every event is valid UTF-8, not only their sum.
  gw::output_parser parser(thinking_tools(gw::reasoning_parser_kind::think, gw::tool_call_parser_kind::glm45)());
  for (const std::string& byte : edge::testing::bytes_of("<think>日本</think>é")) {
    for (const auto& event : parser.feed(byte, 1)) {
      std::visit([](const auto& e) {
        if constexpr (requires { e.text; }) CHECK(edge::utf8::is_valid(e.text));
      }, event);
    }
  }
  // A character the output ends inside becomes U+FFFD.
  gw::output_parser cut(thinking_tools(gw::reasoning_parser_kind::none, gw::tool_call_parser_kind::none)());
  CHECK(cut.feed("a\xE6\x97", 1).size() == 1);
  const auto rest = cut.finish(false);
  REQUIRE(rest.size() == 1);
  CHECK(std::get<gw::content_delta>(rest[0]).text == "\xEF\xBF\xBD");
}

TEST_CASE("the syntaxes a vocabulary shows") {
  struct expectation {
    std::vector<std::pair<std::string, bool>> added;
    gw::tool_call_parser_kind calls;
    gw::reasoning_parser_kind reasoning;
    bool markers_special;
    bool tags_special;
  };
  const std::vector<expectation> cases = {
      // Qwen3: <tool_call> and <think> are added tokens that are not special.
      {{{"<|im_start|>", true}, {"<tool_call>", false}, {"</tool_call>", false}, {"<think>", false}, {"</think>", false}},
       gw::tool_call_parser_kind::hermes, gw::reasoning_parser_kind::think, false, false},
      // Qwen2.5: tool calls, no thinking.
      {{{"<|im_start|>", true}, {"<tool_call>", false}, {"</tool_call>", false}},
       gw::tool_call_parser_kind::hermes, gw::reasoning_parser_kind::none, false, false},
      // GLM-4.5: <arg_key> beside <tool_call>, special.
      {{{"<tool_call>", true}, {"</tool_call>", true}, {"<arg_key>", true}, {"<think>", true}, {"</think>", true}},
       gw::tool_call_parser_kind::glm45, gw::reasoning_parser_kind::think, true, true},
      // Kimi K2 (Thinking): its section markers are special; its reasoning ends at the section.
      {{{"<|tool_calls_section_begin|>", true}, {"<|tool_call_begin|>", true}, {"<think>", false}, {"</think>", false}},
       gw::tool_call_parser_kind::kimi_k2, gw::reasoning_parser_kind::kimi_k2, true, false},
      // DeepSeek-V3 / R1.
      {{{"<｜tool▁calls▁begin｜>", false}, {"<｜tool▁call▁begin｜>", false}, {"<think>", false}, {"</think>", false}},
       gw::tool_call_parser_kind::deepseek_v3, gw::reasoning_parser_kind::think, false, false},
      // Llama 3.1+.
      {{{"<|begin_of_text|>", true}, {"<|python_tag|>", true}}, gw::tool_call_parser_kind::llama3_json,
       gw::reasoning_parser_kind::none, true, false},
      // Nothing known; one think tag alone is not enough.
      {{{"<s>", true}, {"<think>", false}}, gw::tool_call_parser_kind::none, gw::reasoning_parser_kind::none, false,
       false},
  };
  for (const expectation& e : cases) {
    CAPTURE(e.added.front().first);
    const auto tok = vocabulary(e.added);
    const gw::detected_output_syntax found = gw::detect_output_syntax(*tok);
    CHECK(found.syntax.tool_calls == e.calls);
    CHECK(found.syntax.reasoning == e.reasoning);
    CHECK(found.syntax.tool_markers_special == e.markers_special);
    CHECK(found.syntax.reasoning_tags_special == e.tags_special);
    CHECK_FALSE(found.tool_calls_reason.empty());
    CHECK_FALSE(found.reasoning_reason.empty());
  }
}

TEST_CASE("events join per kind; the message adds them up") {
  std::vector<gw::output_event> events;
  gw::append_event(events, gw::content_delta{"a"});
  gw::append_event(events, gw::content_delta{"b"});
  gw::append_event(events, gw::tool_call_begin{0, "call_1", "f"});
  gw::append_event(events, gw::tool_call_arguments{0, "{"});
  gw::append_event(events, gw::tool_call_arguments{0, "}"});
  gw::append_event(events, gw::tool_call_begin{1, "call_2", "g"});
  gw::append_event(events, gw::tool_call_arguments{1, "[]"});
  gw::append_event(events, gw::reasoning_delta{"r"});
  CHECK(describe(events) == "content[ab] call#0(call_1,f) args#0[{}] call#1(call_2,g) args#1[[]] reasoning[r] ");
  gw::assistant_message message;
  for (const auto& e : events) message.add(e);
  CHECK(message.content == "ab");
  CHECK(message.reasoning == "r");
  REQUIRE(message.tool_calls.size() == 2);
  CHECK(message.tool_calls[1] == gw::assembled_tool_call{"call_2", "g", "[]"});
}
