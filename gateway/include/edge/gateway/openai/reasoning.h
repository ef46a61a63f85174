// Reasoning models write their thinking before the answer, between <think> and </think> (Qwen3,
// GLM-4.5/4.6, DeepSeek-R1 and V3.1 in thinking mode, Kimi K2 Thinking). The reasoning splitter
// separates that text from the answer as it streams, so that clients get `reasoning_content`
// apart from `content` and never see a tag, even one split across tokens.
//
// The rules, for both parsers:
//   * A reasoning block opens with <think> at the very start of the output (whitespace before it
//     aside), or is already open when the prompt ended inside one (a template that writes
//     "<think>\n" after the assistant header: DeepSeek-R1, V3.1 in thinking mode, the Qwen3
//     thinking releases): the routes decide that from the prompt (prompt_opens_reasoning) and
//     pass it in. A template that switched thinking off closes an empty block in the prompt
//     ("<think>\n\n</think>\n\n"), so the output starts outside.
//   * The block closes at </think>; `kimi_k2` also closes it where Kimi's tool-call section
//     begins (<|tool_calls_section_begin|>, passed on to the tool-call parser), as Kimi K2
//     Thinking may call a tool without closing its thinking.
//   * Whitespace around the reasoning and at the start of the answer after it is dropped (the
//     templates write "<think>\n…\n</think>\n\n"). An output without a block is all answer,
//     unchanged; text after the block is answer too, a later "<think>" in it included (only the
//     start of the output can open a block, so that the answer's text, tool-call arguments
//     among it, is never taken for thinking).
//   * A block the output never closes (cut short by max_tokens) is all reasoning.
//   * reasoning_tokens(): the generated tokens up to and including the one that closed the block
//     (tags included; all of them while it is open), counted per piece of text fed: a piece fed
//     while the block is open counts whole.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/grammar/grammar.h"
#include "edge/gateway/openai/output_events.h"

namespace edge::gateway {

enum class reasoning_parser_kind { none, think, kimi_k2 };

// "none", "think", "kimi_k2".
std::string_view to_string(reasoning_parser_kind kind);
std::optional<reasoning_parser_kind> parse_reasoning_parser_name(std::string_view name);

inline constexpr std::string_view think_open_tag = "<think>";
inline constexpr std::string_view think_close_tag = "</think>";

// Whether a prompt ending with `prompt_tail` (its last tokens' text, special tokens written out)
// leaves the model inside a reasoning block: its last tag is <think>, with only whitespace after.
bool prompt_opens_reasoning(std::string_view prompt_tail);

// What a constrained answer may write before the part the constraint is about (tool calls): a
// reasoning block the splitter reads, optional, or the end of the one the prompt opened
// (`starts_inside`): text without "</", then </think> and up to two line breaks. Nothing for
// `none`.
backend::grammar::expr reasoning_grammar(reasoning_parser_kind kind, bool starts_inside,
                                         const special_token_test& is_special);

// One request's splitter. Owned by the request (connection strand only).
class reasoning_splitter {
 public:
  reasoning_splitter(reasoning_parser_kind kind, bool starts_inside);

  // The next piece of generated text and how many tokens it came from. Appends reasoning_delta
  // and content_delta events, in order.
  void feed(std::string_view text, std::int64_t tokens, std::vector<output_event>& out);
  // The output has ended: releases what was held back.
  void finish(std::vector<output_event>& out);

  std::int64_t reasoning_tokens() const { return reasoning_tokens_; }

 private:
  enum class state {
    start,        // nothing but whitespace yet: a <think> may still open a block
    inside,       // in the block
    after_block,  // the block has closed: whitespace before the answer is dropped
    answer,       // the rest is answer
  };
  void run(bool at_end, std::vector<output_event>& out);

  reasoning_parser_kind kind_;
  state state_;
  bool block_start_ = true;  // inside: no reasoning text yet (leading whitespace and a <think> are dropped)
  std::string pending_;      // text not yet classified
  std::int64_t reasoning_tokens_ = 0;
  std::int64_t undecided_tokens_ = 0;  // fed in `start`: reasoning if a block opens
};

}  // namespace edge::gateway
