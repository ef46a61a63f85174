// Tool calls in a model's own syntax, parsed as the text streams: each family's parser turns the
// answer's text (what the reasoning splitter left) into content and tool calls, naming a call as
// soon as its header is complete and passing its arguments on as the model writes them.
//
// Each family's syntax, as its chat template writes a call, is described in its own file under
// gateway/src/openai/families/ (llama3_json, hermes, deepseek_v3, kimi_k2, glm45): its markers,
// how a call's header is read, how its calls are written as a grammar. One generic parser reads
// them all. Whitespace between the parts of a call is allowed wherever the templates put a newline.
//
// What is a call, and what is not:
//   * A call is named (tool_call_begin) once its header is complete and names one of the
//     request's tools. A header that is not the family's (other keys first, a bad id) or names
//     another tool makes the whole call content, markers included, as the model wrote it.
//   * Arguments are passed on as the model writes them (the JSON families: the object's own
//     text, found by a JSON scanner, so a '}' or a marker inside a string does not end it). If
//     they stop being valid JSON, the rest of what the model wrote up to the call's end marker
//     (to the end of the output for llama3_json) is passed on as it is: the arguments are then
//     not valid JSON, as OpenAI's own may not be, and clients must check them.
//   * After the arguments the parser expects the family's closing syntax ("}" and
//     </tool_call>, "```" and <｜tool▁call▁end｜>, ...); text that is not, ends the call and is
//     read as what follows it. Whitespace between and around calls is dropped, as is whitespace
//     at the end of content right before a call.
//   * A call cut short by the end of the output keeps what it has (finish_reason "length" says
//     so). Held-back text at the end is content when the model ended by itself, and is dropped
//     when the output was cut short (max_tokens, content_filter): then a marker begun, a call
//     whose header is not whole yet or a section without a call is markup the model did not
//     finish, and no markup is left in content.
//   * With parallel_tool_calls false only the first call is returned; later calls are parsed and
//     dropped, as vLLM does (the client asked for one call at most).
//   * DeepSeek and Kimi calls count only inside their section; a section whose first call is not
//     a call is content from its begin marker on.
//
// The same syntaxes as grammars (tool_call_grammar): what tool_choice "required" or a named
// function makes the model write, so that the answer is always calls these parsers read back, with
// arguments valid against each tool's parameters schema: one call, or with parallel_tool_calls
// several joined as the family joins them (Kimi K2's numbered ids unroll to at most max_kimi_calls).
// Key/value arguments (GLM-4.5): a pair per property in the order `properties` lists them (the
// required ones always, the others optionally). A string-typed property's raw V honours enum,
// const, minLength and maxLength and holds no '<' or control character, and neither starts nor
// ends with a space; another property's V is JSON valid against its schema. The parameters must be
// an object schema of properties (no anyOf, minProperties, ... at its top). JSON arguments are
// valid against the tool's parameters schema (grammar_builder::json_schema), "{}" for a tool
// without one. A marker that is a special token of the vocabulary is that token.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/grammar/grammar.h"
#include "edge/gateway/openai/output_events.h"

namespace edge::gateway {

enum class tool_call_parser_kind { none, llama3_json, hermes, deepseek_v3, kimi_k2, glm45 };

// "none", "llama3_json", "hermes", "deepseek_v3", "kimi_k2", "glm45".
std::string_view to_string(tool_call_parser_kind kind);
std::optional<tool_call_parser_kind> parse_tool_call_parser_name(std::string_view name);

// The marker texts of a family's syntax (empty for none), e.g. to ask whether the vocabulary
// makes them special tokens. The first is the family's signature in a vocabulary:
// <|python_tag|>, <tool_call>, <｜tool▁calls▁begin｜>, <|tool_calls_section_begin|>, <arg_key>.
std::span<const std::string_view> tool_call_markers(tool_call_parser_kind kind);

// One tool the request offers.
struct tool_spec {
  std::string name;
  std::string parameters;  // its JSON schema, as JSON text ("" when it has none)
};

// Makes a tool call's id where the syntax has none.
using tool_call_id_source = std::function<std::string()>;
// `prefix` and 24 random letters and digits: "call_…" as OpenAI's ids, "toolu_…" as Anthropic's.
std::string random_id(std::string_view prefix = "call_");

// One request's parser. Owned by the request (connection strand only).
class tool_call_parser {
 public:
  virtual ~tool_call_parser() = default;
  // The next piece of the answer's text. Appends content_delta, tool_call_begin and
  // tool_call_arguments events, in order.
  virtual void feed(std::string_view text, std::vector<output_event>& out) = 0;
  // The output has ended; `cut`: it was cut short rather than ended by the model.
  virtual void finish(std::vector<output_event>& out, bool cut) = 0;
};

// `kind` must not be none. `make_id` empty: random_id.
std::unique_ptr<tool_call_parser> make_tool_call_parser(tool_call_parser_kind kind, std::vector<tool_spec> tools,
                                                        bool parallel_tool_calls, tool_call_id_source make_id = {});

// What the answer of a request with tool_choice "required" or a named function must be.
struct tool_call_grammar_options {
  tool_call_parser_kind kind = tool_call_parser_kind::none;  // not none
  std::span<const tool_spec> tools;  // the request's tools, in its order (errors name tools[i])
  std::string only;                  // a named function: the one tool to call; "": any of them
  bool parallel = true;              // one or more calls; false: exactly one
  std::size_t earlier_calls = 0;     // tool calls in the conversation before this answer (Kimi's ids)
  special_token_test is_special;     // which markers are special tokens; empty: none
};

// Kimi K2 numbers its calls, so the grammar unrolls them: an answer makes at most this many.
inline constexpr std::size_t max_kimi_calls = 16;

// The calls, as an expression of `b`'s rules. Errors name the piece of the request at fault:
// an unsupported schema keyword ("tools[1].function.parameters.properties.x.pattern"), a
// parameters schema that does not describe an object, or one GLM's key/value pairs cannot
// write; the message names the tool.
result<backend::grammar::expr, backend::grammar::grammar_error> tool_call_grammar(
    backend::grammar::grammar_builder& b, const tool_call_grammar_options& options);

}  // namespace edge::gateway
