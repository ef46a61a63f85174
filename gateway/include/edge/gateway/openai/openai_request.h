// Parsing and validation of OpenAI request bodies: POST /v1/chat/completions and
// POST /v1/completions.
//
// Fields (null means "not given", as in OpenAI's API; unknown fields are ignored):
//   both         model, max_tokens, temperature (0..2), top_p (0 < p <= 1), seed, stop (a string
//                or up to 4), presence_penalty / frequency_penalty (-2..2), n (1..max_choices),
//                logit_bias ({"token id": -100..100}, at most 300), stream,
//                stream_options.include_usage (only with stream), user, prompt_cache_key (a
//                session key: is_valid_session_key); vLLM's top_k (-1, 0 or > 0), min_p (0..1),
//                repetition_penalty (> 0) and ignore_eos.
//   chat         messages (required, non-empty: role system | developer | user | assistant |
//                tool; content a string or an array of {"type":"text","text":…} parts, which
//                are joined; an assistant's may be null or absent; an assistant message may
//                carry tool_calls [{id, type "function", function {name, arguments}}] and
//                reasoning_content, a tool message needs tool_call_id; any may carry name),
//                tools ([{type "function", function {name, description, parameters, strict}}]),
//                tool_choice (none | auto | required | {type "function", function {name}}, a
//                name among the tools), parallel_tool_calls, chat_template_kwargs (an object:
//                each key a variable of the chat template, e.g. enable_thinking),
//                add_generation_prompt (vLLM's; default true), max_completion_tokens (wins
//                over max_tokens), logprobs (true / false) and top_logprobs (0..20, only with
//                logprobs true).
//   completions  prompt (required: a string or an array of token ids; or a batch, an array of
//                strings or of arrays of token ids: n choices for each, n x prompts at most
//                max_choices),
//                logprobs (0..5), echo, best_of (equal to n: choosing among more is not served).
//   both         response_format: {"type":"text"}, {"type":"json_object"} (any JSON object), or
//                {"type":"json_schema","json_schema":{"name","schema","strict","description"}}
//                (a value valid against the schema: README "Structured outputs"), built here
//                into the grammar the output must match; an unsupported schema keyword is a 400
//                naming it ("response_format.json_schema.schema.properties.x.pattern").
// Fields that would change the answer's shape and are not served (suffix, functions) are a 400
// rather than silently dropped. The tools, tool_choice and parallel_tool_calls read here reach
// the chat template and choose how the routes parse the answer (output_parser.h); tool_choice
// "required" or a named function also makes the routes constrain the answer to calls in the
// model's syntax (tool_call_answer_grammar), so it cannot go with a JSON response_format (a
// 400 naming response_format).
//
// Every error names the offending field in `param` ("messages[2].content[0].text"), as
// OpenAI's errors do. The parser is pure (no I/O, no allocation beyond the result), so it is
// fuzzed directly (tests/fuzz/openai_request_fuzz.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "edge/backend/engine/request_rules.h"
#include "edge/backend/grammar/grammar.h"
#include "edge/backend/runtime/sampler.h"
#include "edge/backend/tokenizer/chat_template.h"
#include "edge/common/json_fields.h"

namespace edge::gateway {

enum class openai_api { chat_completions, completions };

// A completions prompt: text to tokenize, or token ids as given.
using prompt_input = std::variant<std::string, std::vector<std::int64_t>>;

struct tool_definition {  // one entry of "tools" (type "function")
  std::string name;         // function.name
  std::string description;  // function.description ("" when absent)
  std::string parameters;   // function.parameters as minified JSON text ("" when absent)
  bool strict = false;      // function.strict
  std::string json;         // the whole tool object, minified, for the template
};

enum class tool_choice_mode { none, auto_select, required, named };
struct tool_choice {
  tool_choice_mode mode = tool_choice_mode::auto_select;
  std::string name;  // named: the function
};

// OpenAI's limit on a function's name: ^[a-zA-Z0-9_-]{1,64}$.
inline constexpr std::size_t max_function_name_length = 64;

struct responses_fields;

struct openai_request {
  openai_api api = openai_api::completions;
  std::optional<std::string> model;              // absent: the served model
  std::vector<backend::chat_message> messages;   // chat: system/user/assistant turns, in order
  // completions: one prompt, or a batch of them (OpenAI's list of prompts), each answered by
  // n choices: choice p x n + j is prompt p's choice j.
  std::vector<prompt_input> prompts;
  std::optional<std::int64_t> max_tokens;        // absent: the API's default
  backend::sampling_params sampling;              // logit_bias included (its ids not yet held to the vocabulary)
  std::vector<std::string> stop;                 // non-empty strings, at most max_stop_strings
  std::int32_t n = 1;                            // choices
  // Log probabilities of every completion token with this many alternatives (chat: logprobs
  // true, top_logprobs; completions: logprobs); none when not asked for.
  std::optional<std::int32_t> logprobs;
  bool echo = false;                             // completions: the prompt in front of each choice's text
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;                    // stream_options.include_usage
  std::string user;
  // The client's session key (prompt_cache_key, or the x-session-affinity header, which wins);
  // empty: none. A split gateway sends a session's requests to the backend caching its context.
  std::string session;
  // response_format json_object / json_schema (or vLLM's guided_json and guided_choice,
  // llama.cpp's json_schema): what the output must match; null for text.
  std::shared_ptr<const backend::grammar::grammar> grammar;
  std::string grammar_param;  // the field that set `grammar`, which its errors name

  std::vector<tool_definition> tools;
  tool_choice choice;                  // default auto when tools are given, none otherwise
  bool parallel_tool_calls = true;
  std::string chat_template_kwargs;    // minified JSON object text, "" when absent
  bool add_generation_prompt = true;   // end the prompt with the assistant's header
  // The Responses API's own fields (responses_request.h); null for the other APIs.
  std::shared_ptr<const responses_fields> responses;
};

using backend::request_error;

// OpenAI's limits.
inline constexpr std::size_t max_stop_strings = 4;
inline constexpr std::int32_t max_completion_logprobs = 5;  // the completions API's logprobs
inline constexpr double max_temperature = 2.0;
inline constexpr double max_penalty = 2.0;
// The completions API's max_tokens when none is given (the chat API's default is the rest of
// the context).
inline constexpr std::int64_t default_completion_max_tokens = 16;

std::variant<openai_request, request_error> parse_openai_request(openai_api api, std::string_view body);

// ---- the rules of every generation request ---------------------------------------------------
// The OpenAI routes and a backend's internal API (internal_protocol.h) read and check these
// fields with the same functions: a caller of a backend gets nothing past what the public API
// refuses.

// Whether `key` names a sampling parameter: temperature (0..2), top_p (0 < p <= 1), top_k (-1,
// 0 or > 0), min_p (0..1), presence_penalty and frequency_penalty (-2..2), repetition_penalty
// (> 0), seed (any 64-bit integer).
bool is_sampling_field(std::string_view key);
// Reads the sampling parameter `key` (is_sampling_field) into `out`; a value outside its range
// is the error. Null leaves `out` as it is.
std::optional<json_error> read_sampling_field(std::string_view key, const json_value& v, backend::sampling_params& out);
// logit_bias: an object of token ids (as strings) to biases in [-100, 100], at most
// backend::max_logit_bias_entries; a repeated id counts once, with its last bias.
std::optional<json_error> read_logit_bias(const json_value& v, std::vector<kernels::logit_bias>& out);
// Stop strings: a string, or an array of at most max_stop_strings; empty ones are dropped.
std::optional<json_error> read_stop(const json_value& v, std::vector<std::string>& out);
// "hello" or [{"type":"text","text":"hel"}, {"type":"text","text":"lo"}] (OpenAI's content
// parts, Anthropic's text blocks): the text, parts joined, in place of `out`'s.
std::optional<json_error> read_content(const json_value& v, std::string& out);
// A function's name as OpenAI allows it: 1 to 64 of a-z, A-Z, 0-9, _ and -.
std::optional<json_error> read_function_name(const json_value& v, std::string& out);
// A completion's token limit: at least 1.
json_result<std::int64_t> read_max_tokens(const json_value& v);

// A session key (the x-session-affinity header, the body's prompt_cache_key): 1 to
// max_session_key_bytes bytes, any bytes (it is only hashed, never shown or logged).
// The header names it for every generating route, Anthropic's included (Workers AI's name).
inline constexpr std::string_view session_affinity_header = "x-session-affinity";
inline constexpr std::size_t max_session_key_bytes = 256;
inline constexpr std::string_view session_key_rule = "a non-empty string of at most 256 bytes";
bool is_valid_session_key(std::string_view key);
// prompt_cache_key: a session key, in `out`.
std::optional<json_error> read_session_key(const json_value& v, std::string& out);

// What an API calls the fields tool_choice is checked against.
struct tool_choice_names {
  std::string_view name;    // the named function's name: "tool_choice.function.name" in chat completions
  std::string_view format;  // the output format: "response_format" in chat completions
};
// tool_choice against the tools (`chosen`: the request gave one): auto without them means none;
// one that forces calls needs them, a named one must be among them, and neither goes with a
// JSON output format.
// vLLM's and llama.cpp's fields that change the output (guided_json, guided_choice, json_schema,
// n_predict, min_tokens, stop_token_ids, grammar, guided_regex, guided_grammar,
// structured_outputs): served or refused on chat completions and completions; on the Messages
// and Responses APIs, a value (not null) is a 400 naming the field, never ignored.
bool is_peer_output_field(std::string_view key);
std::optional<request_error> peer_output_field_elsewhere(std::string_view key, bool null);

std::optional<request_error> check_tool_choice(openai_request& r, bool chosen, const tool_choice_names& names);

// Where a json_schema format keeps its name, schema and strict: chat completions'
// response_format nests them ({"type": "json_schema", "json_schema": {...}}), Responses'
// text.format has them beside "type".
enum class output_format_layout { chat_completions, responses };
// An output format ({"type": "text" | "json_object" | "json_schema", ...}): the grammar the
// answer must match in `out`, null for text.
std::optional<json_error> read_output_format(const json_value& v, output_format_layout layout,
                                             std::shared_ptr<const backend::grammar::grammar>& out);

}  // namespace edge::gateway
