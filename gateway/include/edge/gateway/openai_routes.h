// The OpenAI-compatible API, on the in-process engine or on remote backends (engine_client.h):
//
//   POST /v1/chat/completions   chat through the model's chat template; stream or not
//   POST /v1/completions        plain prompt; stream or not
//   GET  /v1/models             {"object":"list","data":[the served model]}
//   GET  /v1/models/{id}        the model, or 404 model_not_found
//
// One generation request goes: gate.authenticate → parse and validate the body (400 naming
// the field) → the model named (404 model_not_found) → chat template + tokenize on this
// connection's thread → context check (400 context_length_exceeded) → gate.try_acquire
// (quotas) → engine.submit (503 + retry-after when the engine's queue is full, the engine has
// failed, or no backend answers) → events from the engine thread or the backend's stream
// relayed to the connection's strand → the JSON answer, or Server-Sent Events flushed per delta with a `: ping` heartbeat
// when nothing was written for `sse_heartbeat` → lease settled with the tokens served. A client that goes away (streaming
// or not) cancels its request in the engine at once: the request handle is destroyed, and
// its KV blocks are freed at the engine's next step.
#pragma once

#include <chrono>

#include "edge/gateway/http.h"
#include "edge/gateway/request_gate.h"
#include "edge/gateway/serving_model.h"

namespace edge::monitoring {
struct gateway_metrics;
}

namespace edge::gateway {

struct openai_route_options {
  // A stream that wrote nothing for this long gets a `: ping` comment.
  std::chrono::milliseconds sse_heartbeat{std::chrono::seconds(15)};
};

// `models`, `gate` and `metrics` (which may be null) must outlive the router.
void add_openai_routes(router& routes, const model_slot& models, request_gate& gate,
                       monitoring::gateway_metrics* metrics, openai_route_options options = {});

}  // namespace edge::gateway
