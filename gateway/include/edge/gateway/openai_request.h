// Parsing and validation of OpenAI request bodies: POST /v1/chat/completions and
// POST /v1/completions.
//
// Fields (null means "not given", as in OpenAI's API; unknown fields are ignored):
//   both         model, max_tokens, temperature (0..2), top_p (0 < p <= 1), seed, stop (a string
//                or up to 4), presence_penalty / frequency_penalty (-2..2), n (1 only), stream,
//                stream_options.include_usage (only with stream), user; vLLM's top_k (-1, 0 or
//                > 0), min_p (0..1), repetition_penalty (> 0) and ignore_eos.
//   chat         messages (required, non-empty: role system | developer | user | assistant;
//                content a string or an array of {"type":"text","text":…} parts),
//                max_completion_tokens (wins over max_tokens).
//   completions  prompt (required: a string, an array of one string, or an array of token ids),
//                best_of (1 only).
// Fields that would change the answer's shape and are not served (logprobs, echo, suffix,
// tools, a JSON response_format, logit_bias) are a 400 rather than silently dropped.
//
// Every error names the offending field in `param` ("messages[2].content[0].text"), as
// OpenAI's errors do. The parser is pure (no I/O, no allocation beyond the result), so it is
// fuzzed directly (tests/fuzz/openai_request_fuzz.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "edge/backend/runtime/sampler.h"
#include "edge/backend/tokenizer/chat_template.h"

namespace edge::gateway {

enum class openai_api { chat_completions, completions };

// A completions prompt: text to tokenize, or token ids as given.
using prompt_input = std::variant<std::string, std::vector<std::int64_t>>;

struct openai_request {
  openai_api api = openai_api::completions;
  std::optional<std::string> model;              // absent: the served model
  std::vector<backend::chat_message> messages;   // chat: system/user/assistant turns, in order
  prompt_input prompt;                           // completions
  std::optional<std::int64_t> max_tokens;        // absent: the API's default
  backend::sampling_params sampling;
  std::vector<std::string> stop;                 // non-empty strings, at most max_stop_strings
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;                    // stream_options.include_usage
  std::string user;
};

// A request the client must fix: a 400 whose `param` names the field ("" for the body as a
// whole, e.g. malformed JSON).
struct request_error {
  std::string message;
  std::string param;
  friend bool operator==(const request_error&, const request_error&) = default;
};

// OpenAI's limits.
inline constexpr std::size_t max_stop_strings = 4;
inline constexpr double max_temperature = 2.0;
inline constexpr double max_penalty = 2.0;
// The completions API's max_tokens when none is given (the chat API's default is the rest of
// the context).
inline constexpr std::int64_t default_completion_max_tokens = 16;

std::variant<openai_request, request_error> parse_openai_request(openai_api api, std::string_view body);

}  // namespace edge::gateway
