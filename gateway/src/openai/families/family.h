// A model family's output syntax: everything the generic tool-call parser (tool_calls.cpp), the
// grammar that forces a call, the reasoning splitter and the vocabulary's detection need to know
// of how Llama 3, Hermes/Qwen, DeepSeek-V3, Kimi K2 or GLM-4.5 write their answers. Each family
// is one file of this folder (its markers, how a call's header is read, how its calls are written
// as a grammar, its reasoning) and one line of the registry (families.cpp). tool_calls.h describes
// each syntax for the reader; nothing outside this folder switches on the family.
//
// How a family's prompt is written is its chat template: the model's own (every family here
// ships one), or a built-in format (backend chat_formats.cpp) for a model that ships none.
#pragma once

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/grammar/grammar.h"
#include "edge/gateway/openai/reasoning.h"
#include "edge/gateway/openai/tool_calls.h"

namespace edge::gateway::families {

// ---- a call's header: the text after a call's opener that names the tool ----------------------

enum class header_status { more, mismatch, match };

struct header {
  header_status status = header_status::more;
  std::string name;
  std::string id;             // the id the syntax gives (Kimi), else ""
  std::size_t length = 0;     // bytes of text the header takes (match)
  bool no_arguments = false;  // a JSON call closed without arguments: {"name": "f"}
  bool fenced = false;        // the arguments sit in a fence the family closes with fence_close
};

inline header more_header() { return {}; }
inline header mismatched_header() { return {.status = header_status::mismatch}; }

// {"name": NAME, "arguments": (or "parameters":) — the arguments follow; or {"name": NAME}: the
// header of the families that write a call as one JSON object (tool_calls.cpp).
header json_header(std::string_view text);

// ---- a family's calls as a grammar ---------------------------------------------------------------

// What a family's grammar writer builds its calls from: the tools the request allows, each with
// its arguments' rule, and the pieces every family's calls are made of.
class call_grammar_context {
 public:
  struct allowed_tool {
    std::string name;
    backend::grammar::expr arguments;
  };

  call_grammar_context(backend::grammar::grammar_builder& b, const tool_call_grammar_options& o,
                       std::vector<allowed_tool> allowed)
      : b_(b), o_(o), allowed_(std::move(allowed)) {}

  // The marker as one special token where the vocabulary makes it one, else its text.
  backend::grammar::expr marker(std::string_view text) const;
  // One call of any allowed tool: `call` written for each.
  backend::grammar::expr any_call(const std::function<backend::grammar::expr(const allowed_tool&)>& call) const;
  // One call, or with parallel_tool_calls one or more joined by `separator`.
  backend::grammar::expr joined(const backend::grammar::expr& call, std::string_view separator) const;

  backend::grammar::grammar_builder& builder() const { return b_; }
  const tool_call_grammar_options& options() const { return o_; }

 private:
  backend::grammar::grammar_builder& b_;
  const tool_call_grammar_options& o_;
  std::vector<allowed_tool> allowed_;
};

// ---- the traits ----------------------------------------------------------------------------------

// How a family writes a call's arguments: a JSON object, or key/value pairs (GLM's
// <arg_key>K</arg_key><arg_value>V</arg_value>, where V is raw text for a string-typed parameter
// and JSON otherwise).
enum class argument_form { json, key_value_pairs };

struct family_traits {
  tool_call_parser_kind kind;
  std::string_view name;                      // --tool-call-parser
  std::span<const std::string_view> markers;  // every marker; the first is its signature in a vocabulary
  // Calls grouped in a section (DeepSeek, Kimi): its markers; "" otherwise.
  std::string_view section_begin;
  std::string_view section_end;
  std::string_view call_begin;  // "" for bare calls
  std::string_view call_end;
  header (*read_header)(std::string_view text);  // a call's header, from the text after its opener
  argument_form arguments = argument_form::json;
  // key_value_pairs: the pair's markers.
  std::string_view key_open;
  std::string_view key_close;
  std::string_view value_open;
  std::string_view value_close;
  // Bare calls (Llama 3): JSON objects at the answer's start, after this marker or none, joined by
  // ';'; anything else is plain content.
  bool bare = false;
  std::string_view bare_marker;
  std::string_view arguments_close;  // after JSON arguments: the call object's own '}' (the header opened it)
  std::string_view fence_close;      // after a fenced call's arguments
  // The calls as a grammar.
  backend::grammar::expr (*write_calls)(const call_grammar_context& calls);
  // The reasoning the family writes where the vocabulary has <think> and </think>.
  reasoning_parser_kind reasoning = reasoning_parser_kind::think;
};

// The families, each in its own file.
extern const family_traits llama3_json;
extern const family_traits hermes;
extern const family_traits deepseek_v3;
extern const family_traits kimi_k2;
extern const family_traits glm45;

// The registry (families.cpp): every family, in the order a vocabulary is asked for their
// signatures.
std::span<const family_traits* const> all();
// The family of `kind`; null for none.
const family_traits* find(tool_call_parser_kind kind);

}  // namespace edge::gateway::families
