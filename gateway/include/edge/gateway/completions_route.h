// POST /v1/completions on the in-process engine: OpenAI's completions API, just enough to use
// the engine end to end. Request fields: model, prompt (a string, or an array of one string),
// max_tokens, temperature, top_p, seed, stop (a string or up to 4), stream, stream_options
// {include_usage}, n (1 only), presence_penalty, frequency_penalty, and vLLM's top_k, min_p,
// repetition_penalty and ignore_eos. Unknown fields are ignored, as OpenAI does; fields that
// would change the answer's shape and are not supported (echo, logprobs, best_of, suffix) are
// a 400.
//
// Non-streaming: one "text_completion" object with usage (prompt_tokens_details.cached_tokens
// counts prompt tokens served from the prefix cache). Streaming: Server-Sent Events, one
// `data: {chunk}` per piece of text as the engine produces it, a last chunk with the
// finish_reason, a usage chunk when stream_options.include_usage, then `data: [DONE]`. When the
// client goes away, the request is cancelled at once and its KV blocks are freed at the
// engine's next step.
//
// Tenant: with tenancy, the caller's API key names it (401 without a valid key), its quotas
// admit the request (429 and the x-ratelimit-* headers) and its usage goes to the ledger;
// without tenancy, the `x-edgeinfer-tenant` header, else "default".
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "edge/backend/engine.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/gateway/http.h"

namespace edge::gateway {

// What the route serves once the model is loaded and its engine runs.
struct serving_model {
  std::string id;  // the served model name
  const backend::tokenizer* tokenizer = nullptr;
  backend::engine* engine = nullptr;
};

// Empty until the model is loaded; then holds it for the server's life. Thread-safe.
class model_slot {
 public:
  void publish(std::shared_ptr<const serving_model> model);
  std::shared_ptr<const serving_model> get() const;

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const serving_model> model_;  // guarded by mutex_
};

// A parsed, validated completions request.
struct completion_params {
  std::optional<std::string> model;
  std::string prompt;
  std::int64_t max_tokens = 16;  // OpenAI's default
  backend::sampling_params sampling;
  std::vector<std::string> stop;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;
};

// A request the client must fix: 400 with `param` naming the field.
struct completion_request_error {
  std::string message;
  std::string param;
};

std::variant<completion_params, completion_request_error> parse_completion_request(std::string_view body);

// Request header naming the tenant, until API keys do.
inline constexpr std::string_view tenant_header = "x-edgeinfer-tenant";

class tenancy;

// `models` and `tenants` (may be null: no auth, no quotas) must outlive the router.
void add_completions_route(router& routes, const model_slot& models, tenancy* tenants = nullptr);

}  // namespace edge::gateway
