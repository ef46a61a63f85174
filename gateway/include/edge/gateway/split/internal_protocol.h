// The wire format between a split gateway and its backends (`edgeinfer backend`): JSON written
// with Boost.JSON, read with simdjson's DOM parser (which validates the whole document first).
//
//   POST /internal/v1/generate   body: a generate request
//     {"id","tenant","weight","priority","prompt":[token ids],
//      "sampling":{"temperature","top_k","top_p","min_p","repetition_penalty",
//                  "presence_penalty","frequency_penalty","seed","logit_bias":{"id":bias}},
//      "max_tokens","stop":[strings],"stop_token_ids":[ids],"ignore_eos","logprobs":k|null,
//      "n","prompt_logprobs":k|null,"grammar":text,"skip_special_tokens" (written only when false),
//      "session" (the client's session key, written only when there is one),
//      "host_tier_cap_bytes", "disk_tier_cap_bytes" (the tenant's caps on the lower KV tiers,
//      engine_limits.h; written only when it has them, null or absent: unlimited)}
//     grammar (optional): what the output must match, as grammar::text() writes it (a
//     response_format's schema, lowered); the backend compiles it for its tokenizer (cached).
//     prompt and max_tokens are required; an unknown field is a 400 naming it (a gateway that
//     asks for something this backend does not know must hear so, not be ignored). Every field
//     is held to the public API's rules (openai_request.h: sampling ranges, stop strings,
//     max_tokens, n, logit_bias, the session key's bound; token ids within the vocabulary,
//     prompt and completion within the context),
//     id to an x-request-id's and tenant to a tenant id's. Weight and priority are bounded as
//     the tenant admin bounds them (tenant.h: 0 < weight <= 1000; no priorities, so 0), the tier
//     caps as it bounds their quotas (0 to max_quota_value bytes). The
//     prefix cache is salted with the tenant's id, as in `serve`: a "cache_salt" other than
//     "" (what older gateways send) is refused.
//     200: application/x-ndjson, one event per line, flushed as produced:
//       {"type":"admitted"}
//       {"type":"prompt_logprobs","logprobs":[{"id","logprob","top":[{"id","logprob"}]}]}
//       {"type":"delta","index","text","tokens":[ids],"logprobs":[{"id","logprob","top":[{"id","logprob"}]}],
//        "finish":"stop|length" (on a choice's last delta), "stop_string" (the request's stop
//        string that ended the choice, when one did)}
//       {"type":"finished","reason":"stop|length|abort|error","error","usage":{"prompt_tokens",
//        "completion_tokens","cached_tokens"},"timings":{"queued_seconds",
//        "time_to_first_token","total_seconds","preemptions"}}
//       {"type":"heartbeat"}    when nothing else was written for a while (keeps read
//                               timeouts meaningful on a request that waits in the queue)
//     Refusals: 400 (code invalid_request or context_length_exceeded), 401 (internal token),
//     503 (code overloaded or shutting_down), all {"error":{"message","type","code"}}.
//     Closing the connection cancels the request.
//   GET /internal/v1/info   what the gateway must agree with before it tokenizes for a backend:
//     {"model","context_length","chat_template": a built-in name or "jinja",
//      "chat_template_jinja": {"template","tool_use","bos_token","eos_token","origin"} (jinja only),
//      "tokenizer_fingerprint","vocab_size","block_size","version"}; the gateway renders every
//     prompt with this template, so nothing of a chat request but its token ids travels
//   GET /internal/v1/load   what the router weighs (backend_load_report)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "edge/backend/engine/engine.h"
#include "edge/backend/grammar/grammar.h"
#include "edge/backend/tokenizer/chat_template.h"
#include "edge/common/status.h"
#include "edge/gateway/openai/refusals.h"

namespace edge::gateway {

struct backend_info;

inline constexpr std::string_view internal_generate_path = "/internal/v1/generate";
inline constexpr std::string_view internal_info_path = "/internal/v1/info";
inline constexpr std::string_view internal_load_path = "/internal/v1/load";
inline constexpr std::string_view ndjson_content_type = "application/x-ndjson";
// The internal API's bearer token is at least this long (as the admin token): guessing it must
// be hopeless.
inline constexpr std::size_t min_internal_token_length = 16;
// Where a backend started without one keeps the token it made (in its --state-dir).
inline constexpr std::string_view internal_token_file_name = "internal_token";

// ---- the generate request ---------------------------------------------------------------------

// `grammar` may be null (unconstrained).
std::string encode_generate_request(const backend::generate_request& request, const backend::grammar::grammar* grammar);

// A body the backend cannot use: the message, the field it is about ("" for the body), and
// the refusal's kind (the gateway tells a prompt too long for the context by it).
struct internal_request_error {
  std::string message;
  std::string param;
  refusal_kind kind = refusal_kind::invalid_request;  // or context_length
};

// A generate request as a backend reads it: the request, and the grammar to compile for it.
struct parsed_generate_request {
  backend::generate_request request;
  std::shared_ptr<const backend::grammar::grammar> grammar;  // null: unconstrained
};

std::variant<parsed_generate_request, internal_request_error> parse_generate_request(std::string_view body);

// The rules a parsed request is held to against the model it is for: its token ids within the
// vocabulary, its prompt and max_tokens within the context.
std::optional<internal_request_error> check_generate_request(const backend::generate_request& request,
                                                             const backend_info& model);

// ---- events -----------------------------------------------------------------------------------

// One line (with its '\n') per event.
std::string encode_event(const backend::engine_event& event);
std::string encode_heartbeat();

// A line without its '\n'. nullopt for a heartbeat; invalid_argument for anything malformed.
result<std::optional<backend::engine_event>> parse_event(std::string_view line);

// ---- model identity ---------------------------------------------------------------------------

struct backend_info {
  std::string model;                  // the served model id
  std::int64_t context_length = 0;    // prompt + completion tokens at most
  backend::chat_template_spec chat_template;  // which template renders prompts (the gateway renders them)
  std::string tokenizer_fingerprint;  // backend::tokenizer_fingerprint
  std::int64_t vocab_size = 0;
  std::int64_t block_size = 0;        // tokens per KV block: the prefix cache's unit
  std::string version;                // edgeinfer's
};

std::string encode_info(const backend_info& info);
result<backend_info> parse_info(std::string_view body);

// Why `other` cannot stand in for `expected` (a gateway sends every backend the same token
// ids), or empty when it can. The version may differ.
std::string info_mismatch(const backend_info& expected, const backend_info& other);

// ---- load ------------------------------------------------------------------------------------

struct backend_load_report {
  std::int64_t waiting = 0;    // accepted, not running
  std::int64_t running = 0;
  std::int64_t in_flight = 0;  // accepted, not finished
  std::int64_t kv_blocks_total = 0;
  std::int64_t kv_blocks_free = 0;
  double kv_usage = 0.0;       // blocks referenced / total (edgeinfer_kv_cache_usage_ratio)
  // Prefix cache: its unit, how many blocks hold a cached prefix, and lookups and hits in
  // tokens since start (hits / queries is the hit rate).
  std::int64_t block_size = 0;
  std::int64_t cached_blocks = 0;
  std::int64_t prefix_cache_queries = 0;
  std::int64_t prefix_cache_hits = 0;
};

backend_load_report load_report_from(const backend::engine_stats& stats, std::int64_t block_size);
std::string encode_load(const backend_load_report& load);
result<backend_load_report> parse_load(std::string_view body);

}  // namespace edge::gateway
