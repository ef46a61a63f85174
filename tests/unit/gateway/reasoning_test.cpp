// Reasoning split from the answer: <think> blocks at the start of the output or opened by the
// prompt, tags split anywhere, Kimi's tool-call section ending the thinking, and the reasoning
// tokens counted.
#include <doctest/doctest.h>

#include "edge/gateway/openai/reasoning.h"
#include "output_feeding.h"

namespace gw = edge::gateway;
using edge::testing::parse_every_way;
using edge::testing::parse_pieces;

namespace {

edge::testing::options_factory reasoning(gw::reasoning_parser_kind kind, bool starts_inside = false) {
  return [=] {
    gw::output_parser_options o;
    o.reasoning = kind;
    o.starts_in_reasoning = starts_inside;
    return o;
  };
}

const auto think = reasoning(gw::reasoning_parser_kind::think);

}  // namespace

TEST_CASE("a <think> block at the start is reasoning; the answer after it is content") {
  const auto r = parse_every_way(think, "<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!");
  CHECK(r.message.reasoning == "The user greets me.\nI greet back.");
  CHECK(r.message.content == "Hello!");
  CHECK(r.message.tool_calls.empty());
  CHECK(edge::testing::describe(r.events) == "reasoning[The user greets me.\nI greet back.] content[Hello!] ");
}

TEST_CASE("no block: the output is all content, whitespace and all") {
  for (const std::string_view text : {"  Hello <think>not thinking</think>", "\n", "<thin", "plain", "<thinker>"}) {
    CAPTURE(text);
    const auto r = parse_every_way(think, text);
    CHECK(r.message.reasoning.empty());
    CHECK(r.message.content == text);
    CHECK(r.reasoning_tokens == 0);
  }
}

TEST_CASE("a prompt that opened the block: the output starts inside it") {
  const auto inside = reasoning(gw::reasoning_parser_kind::think, /*starts_inside=*/true);
  auto r = parse_every_way(inside, "\nweighing options\n</think>\n\nAnswer.");
  CHECK(r.message.reasoning == "weighing options");
  CHECK(r.message.content == "Answer.");
  // A model that writes the opening tag again anyway does not leak it.
  r = parse_every_way(inside, "<think>\nhmm</think>ok");
  CHECK(r.message.reasoning == "hmm");
  CHECK(r.message.content == "ok");
  // Never closed (cut short): all reasoning, no content.
  r = parse_every_way(inside, "still thinking about </thi");
  CHECK(r.message.reasoning == "still thinking about </thi");
  CHECK(r.message.content.empty());
}

TEST_CASE("an empty block and thinking switched off leave only the answer") {
  auto r = parse_every_way(think, "<think>\n\n</think>\n\nJust the answer.");
  CHECK(r.message.reasoning.empty());
  CHECK(r.message.content == "Just the answer.");
  CHECK(edge::testing::describe(r.events) == "content[Just the answer.] ");
  // The template closed the block in the prompt: the output starts outside.
  CHECK(!gw::prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  r = parse_every_way(think, "Just the answer.");
  CHECK(r.message.content == "Just the answer.");
}

TEST_CASE("tags split across pieces never reach the client") {
  const std::string text = "<think>a</think>b";
  // Every byte its own piece, and every way of cutting into three pieces.
  for (std::size_t i = 1; i < text.size(); ++i) {
    for (std::size_t j = i + 1; j < text.size(); ++j) {
      const auto r = parse_pieces(think, {text.substr(0, i), text.substr(i, j - i), text.substr(j)});
      CHECK(r.message.reasoning == "a");
      CHECK(r.message.content == "b");
    }
  }
}

TEST_CASE("a later <think> is answer text, so tool-call arguments are never taken for thinking") {
  const auto r = parse_every_way(think, "<think>x</think>The tag <think> opens a block.");
  CHECK(r.message.reasoning == "x");
  CHECK(r.message.content == "The tag <think> opens a block.");
}

TEST_CASE("kimi_k2: the tool-call section ends the thinking and is passed on") {
  const auto kimi = reasoning(gw::reasoning_parser_kind::kimi_k2);
  auto r = parse_every_way(kimi, "<think>I need the weather.<|tool_calls_section_begin|><|tool_call_begin|>");
  CHECK(r.message.reasoning == "I need the weather.");
  CHECK(r.message.content == "<|tool_calls_section_begin|><|tool_call_begin|>");
  // think does not: the marker stays in the reasoning.
  r = parse_every_way(think, "<think>I need the weather.<|tool_calls_section_begin|></think>");
  CHECK(r.message.reasoning == "I need the weather.<|tool_calls_section_begin|>");
}

TEST_CASE("reasoning tokens: every piece fed while the block is open, tags included") {
  // One token per piece: "<think>", "a", "b", "</think>" are reasoning; "\n\n", "c" are not.
  auto r = parse_pieces(think, {"<think>", "a", "b", "</think>", "\n\n", "c"});
  CHECK(r.reasoning_tokens == 4);
  CHECK(r.message.reasoning == "ab");
  // Pieces before the block is known to open count once it does.
  r = parse_pieces(think, {"\n", "<", "think>", "x", "</think>", "y"});
  CHECK(r.reasoning_tokens == 5);
  // ... and not when it does not.
  r = parse_pieces(think, {"\n", "<", "b>", "x"});
  CHECK(r.reasoning_tokens == 0);
  // Opened by the prompt, never closed: every token.
  r = parse_pieces(reasoning(gw::reasoning_parser_kind::think, true), {"a", "b", "c"});
  CHECK(r.reasoning_tokens == 3);
  // No reasoning parser: none.
  r = parse_pieces(reasoning(gw::reasoning_parser_kind::none), {"<think>", "a", "</think>"});
  CHECK(r.reasoning_tokens == 0);
  CHECK(r.message.content == "<think>a</think>");
}

TEST_CASE("whether the prompt leaves the model inside a block") {
  CHECK(gw::prompt_opens_reasoning("<｜Assistant｜><think>\n"));
  CHECK(gw::prompt_opens_reasoning("<|im_start|>assistant\n<think>"));
  CHECK_FALSE(gw::prompt_opens_reasoning("<｜Assistant｜></think>"));
  CHECK_FALSE(gw::prompt_opens_reasoning("<think>x</think>\n<|im_start|>assistant\n"));
  CHECK_FALSE(gw::prompt_opens_reasoning("<|im_start|>assistant\n<think>Okay"));
  CHECK_FALSE(gw::prompt_opens_reasoning(""));
}

TEST_CASE("reasoning parser names") {
  for (const auto kind : {gw::reasoning_parser_kind::none, gw::reasoning_parser_kind::think,
                          gw::reasoning_parser_kind::kimi_k2}) {
    CHECK(gw::parse_reasoning_parser_name(gw::to_string(kind)) == kind);
  }
  CHECK_FALSE(gw::parse_reasoning_parser_name("qwen3").has_value());
}
