// The whole-server fuzzer's requests (server_fuzz.cpp): each one a pure function of the run's
// seed and the request's number, so that any request of a run can be made again alone
// (`edge_server_fuzz --seed S --replay K`).
//
// A request combines, as a hostile tenant would, what the agent APIs read: every generation
// route (chat completions, completions, and chat requests said again in Anthropic's Messages and
// OpenAI's Responses words), response_format (json_object, schemas from a corpus of valid ones and generated
// hostile ones), tools with tool_choice and parallel_tool_calls, n, logit_bias, logprobs and
// top_logprobs, echo, stop, max_tokens, sampling, streaming, special-token text in contents,
// bodies near the server's body limit, malformed JSON and wrong types, and a client that leaves
// early. Along with the body it carries what the answer's checks need to know of it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace edge::fuzz {

// splitmix64: small, and the same numbers on every platform (std's distributions are not).
class fuzz_random {
 public:
  explicit fuzz_random(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next();
  // Uniform in [low, high] (low <= high).
  std::int64_t between(std::int64_t low, std::int64_t high);
  bool chance(double p);

 private:
  std::uint64_t state_;
};

// The servers a run drives: the model served plainly, and with --tool-call-parser hermes.
enum class served_as { plain, hermes };
inline constexpr int served_kinds = 2;

// Whose API key a request carries: the default tenant (no limits), or a tenant with tight quotas
// (one request at a time, a small token budget per minute), whose refusals are 429s.
enum class tenant_kind { open, tight };

// The API a request speaks.
enum class api_kind { chat_completions, completions, messages, responses };

// How the client ends the exchange.
enum class leaving {
  stays,          // reads the whole answer
  after_send,     // closes once the request is written
  after_headers,  // closes once the answer's headers are read
  mid_body,       // closes after `leave_after_bytes` bytes of the answer's body
};

// What the server may answer, as far as the request alone tells.
enum class expectation {
  any,          // any documented status
  refused_400,  // the body is malformed JSON or has a field of a wrong type or range: 400 (or 413 when too large)
};

struct fuzz_request {
  std::uint64_t index = 0;
  served_as server = served_as::plain;
  tenant_kind tenant = tenant_kind::open;
  std::string method = "POST";
  std::string target;  // "/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", or another path
  api_kind api = api_kind::completions;
  std::string body;
  leaving leave = leaving::stays;
  std::size_t leave_after_bytes = 0;
  expectation expect = expectation::any;

  // What the body asks for, where it is well-formed (the checks of a 200 answer use these).
  bool chat = false;                // the chat path: chat completions, messages or responses
  bool stream = false;
  int n = 1;
  int prompts = 1;                  // completions: a batch's prompts, n choices each
  bool json_output = false;         // response_format json_object or json_schema
  std::optional<std::int64_t> max_tokens;  // a valid limit given
  bool has_stop = false;            // stop given (an answer may end inside its JSON)
  std::vector<std::string> stop;    // the stop strings, where they are valid ones
  bool echo = false;                // completions: the prompt comes back in front of the text
  bool tools_offered = false;       // tools given and tool_choice not "none"
  bool calls_forced = false;        // tool_choice "required" or a named function
  std::string named_tool;           // tool_choice names this function
  bool parallel_calls = true;       // parallel_tool_calls not false
  std::optional<int> top_logprobs;  // chat logprobs true: the alternatives asked for; completions: logprobs

  // Names of what the request exercises, for the run's summary ("stream", "n>4", ...).
  std::vector<std::string> features;
};

struct request_limits {
  std::size_t max_body = 0;     // the server's --max-body
  std::int64_t vocab_size = 0;  // the served model's vocabulary
  std::int64_t context = 0;     // the served model's context length
  std::string model_id;         // the served model's id
};

// Request `index` of the run of `seed`.
fuzz_request make_request(std::uint64_t seed, std::uint64_t index, const request_limits& limits);

// The request as an HTTP/1.1 message would show it (for findings and --replay).
std::string describe(const fuzz_request& r, std::size_t max_body_chars);

}  // namespace edge::fuzz
