// What a chat answer's generated text is made of: reasoning, content and tool calls, parsed as the
// engine's deltas arrive, the same way whether the answer is streamed or not.
//
//   engine delta text ─▶ whole UTF-8 characters ─▶ reasoning splitter (reasoning.h)
//                                                   ├─ reasoning_delta
//                                                   └─ the answer's text ─▶ tool-call parser (tool_calls.h)
//                                                                           ├─ content_delta
//                                                                           └─ tool_call_begin / tool_call_arguments
//
// Which syntaxes a model writes is chosen once, when it is served (output_syntax: from the
// vocabulary, or the --tool-call-parser / --reasoning-parser flags); each request then turns on
// what applies to it: tool calls only when it offers tools (and tool_choice is not "none"),
// reasoning always when the model has it, starting inside a block when the prompt opened one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/gateway/openai/output_events.h"
#include "edge/gateway/openai/reasoning.h"
#include "edge/gateway/openai/tool_calls.h"

namespace edge::gateway {

// The syntaxes of the served model's output.
struct output_syntax {
  tool_call_parser_kind tool_calls = tool_call_parser_kind::none;
  reasoning_parser_kind reasoning = reasoning_parser_kind::none;
  // Some marker of the tool-call syntax / a think tag is a special token of the vocabulary. The
  // engine leaves special tokens out of its text unless asked (generate_request::
  // skip_special_tokens), so a request that parses them asks for them.
  bool tool_markers_special = false;
  bool reasoning_tags_special = false;
};

// The syntaxes the vocabulary shows, and why, for the start-up log:
//   tool calls  the first family (in the registry's order, families/families.cpp) whose signature
//               marker is a token: <|tool_calls_section_begin|> kimi_k2, <｜tool▁calls▁begin｜>
//               deepseek_v3, <arg_key> glm45, <tool_call> hermes, <|python_tag|> llama3_json
//   reasoning   <think> and </think> both tokens: the family's reasoning (think; kimi_k2 for Kimi)
// (A token here is any vocabulary entry with exactly that text, special or not.)
struct detected_output_syntax {
  output_syntax syntax;
  std::string tool_calls_reason;
  std::string reasoning_reason;
};
detected_output_syntax detect_output_syntax(const backend::tokenizer& tok);

// The syntax with the special-token flags filled in for `tok`.
output_syntax with_special_markers(output_syntax syntax, const backend::tokenizer& tok);

// Whether `text` is one special token of `tok`'s vocabulary.
bool is_special_token(const backend::tokenizer& tok, std::string_view text);

// The grammar of a chat answer that must call tools (tool_choice "required" or a named
// function) in the served model's syntax: the reasoning a model with reasoning may write first
// (reasoning_grammar: the block is optional, or is closed first when the prompt opened it:
// `starts_in_reasoning`), then the calls (tool_call_grammar; `calls.kind` and `calls.is_special`
// are the syntax's and the vocabulary's). The syntax must have tool calls.
result<backend::grammar::grammar, backend::grammar::grammar_error> tool_call_answer_grammar(
    const output_syntax& syntax, const backend::tokenizer& tok, tool_call_grammar_options calls,
    bool starts_in_reasoning);

struct output_parser_options {
  reasoning_parser_kind reasoning = reasoning_parser_kind::none;
  bool starts_in_reasoning = false;  // the prompt opened a reasoning block (prompt_opens_reasoning)
  tool_call_parser_kind tool_calls = tool_call_parser_kind::none;  // none: the answer is all content
  std::vector<tool_spec> tools;
  bool parallel_tool_calls = true;
  tool_call_id_source make_id;  // empty: random_id
};

// One request's output parser. Owned by the request (connection strand only).
class output_parser {
 public:
  explicit output_parser(output_parser_options options);

  // A delta's text and how many tokens it came from; the events it completes.
  std::vector<output_event> feed(std::string_view text, std::int64_t tokens);
  // The output has ended: the events of what was held back. `cut`: it was cut short (length,
  // content_filter) rather than ended by the model, and leaves no unfinished tool-call markup in
  // content (tool_calls.h).
  std::vector<output_event> finish(bool cut);

  bool reasoning_on() const { return reasoning_on_; }
  // Generated tokens whose text went to reasoning (reasoning.h says how they are counted).
  std::int64_t reasoning_tokens() const { return reasoning_.reasoning_tokens(); }

 private:
  void route(std::vector<output_event>& split, std::vector<output_event>& out);

  bool reasoning_on_;
  reasoning_splitter reasoning_;
  std::unique_ptr<tool_call_parser> tool_calls_;  // null: no tool calls
  std::string partial_character_;  // the start of a UTF-8 character cut by the end of a delta
};

}  // namespace edge::gateway
