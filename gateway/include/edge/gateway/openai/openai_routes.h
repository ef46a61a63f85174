// The APIs that generate, on the in-process engine or on remote backends (engine_client.h):
//
//   POST /v1/chat/completions        chat through the model's chat template; stream or not
//   POST /v1/completions             plain prompt; stream or not
//   POST /v1/responses               OpenAI's Responses API (responses_request.h): the chat path;
//                                    store: true keeps the response for the tenant
//   GET|DELETE /v1/responses/{id}    a stored response of the caller's tenant, or 404
//   POST /v1/messages                Anthropic's Messages API (anthropic_request.h): the chat path
//   POST /v1/messages/count_tokens   the prompt /v1/messages would run, counted
//   GET  /v1/models                  {"object":"list","data":[the served model]}
//   GET  /v1/models/{id}             the model, or 404 model_not_found
//
// Each API reads its body into the same request and writes its answer with its own writer
// (answer_writer.h) from the same relay: streamed or not, the same fold of the same events.
//
// One generation request goes: authenticate (401) → admit: requests per minute and concurrency
// (429), before the body is parsed → parse and validate the body (400 naming the field) → the
// model named (404 model_not_found) → chat template + tokenize on this connection's thread →
// context check (400 context_length_exceeded; a missing max_tokens defaults to what the context
// and the tenant's limits leave) → reserve prompt + max_tokens (429, or 400 over the tenant's
// largest max_tokens) → engine.submit (503 + retry-after when the engine's queue is full,
// the engine has failed, or no backend answers) → events from the engine thread or the
// backend's stream relayed to the connection's strand → the JSON answer, or Server-Sent Events
// flushed per delta with a `: ping` heartbeat when nothing was written for `sse_heartbeat` →
// settled with the tokens the engine produced (tenancy.h). A client that goes away (streaming or
// not) cancels its request in the engine at once: the request handle is destroyed, and its KV
// blocks are freed at the engine's next step.
#pragma once

#include <chrono>

#include "edge/gateway/http/http.h"
#include "edge/gateway/openai/serving_model.h"
#include "edge/gateway/tenancy/tenancy.h"

namespace edge::monitoring {
struct gateway_metrics;
}

namespace edge::gateway {

struct openai_route_options {
  // A stream that wrote nothing for this long gets a `: ping` comment.
  std::chrono::milliseconds sse_heartbeat{std::chrono::seconds(15)};
  // The Responses API's stored responses: each tenant keeps at most this many bytes (the oldest
  // go first), each for this long.
  std::int64_t stored_response_bytes = std::int64_t{64} << 20;
  std::chrono::seconds stored_response_ttl{std::chrono::hours(24 * 30)};
};

// `models`, `tenants` and `metrics` (which may be null) must outlive the router.
void add_openai_routes(router& routes, const model_slot& models, tenancy& tenants,
                       monitoring::gateway_metrics* metrics, openai_route_options options = {});

}  // namespace edge::gateway
