// The request gate: where the OpenAI routes ask "who is calling?" and "may they spend this?".
//
// Every /v1/ request passes the gate twice (DESIGN.md, data flow steps 2 and 5):
//   1. authenticate(req)  before the body is parsed: the caller (tenant, weight) or the response
//                         that refuses it (401 invalid_api_key, 403, ...). GET /v1/models
//                         passes here too.
//   2. try_acquire(...)   once the prompt is tokenized and max_tokens is known: a gate_lease
//                         (prompt + max_tokens reserved) or the refusal (429 with retry-after
//                         and the x-ratelimit-* headers).
// The route calls lease->settle(usage) exactly once when the request ends, however it ends
// (finished, client gone, engine refused it), with the tokens actually served, so the unused
// part of the reservation is refunded. The lease's headers (x-ratelimit-*) go on every
// response to the request, the SSE stream's included.
//
// open_gate is the permissive gate used until API keys and quotas are configured: every
// caller is let in, with no limits.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <variant>

#include "edge/backend/engine.h"
#include "edge/gateway/http.h"

namespace edge::gateway {

// Who is calling, as the gate established it.
struct caller {
  std::string tenant = "default";
  double weight = 1.0;  // the tenant's share of the engine (generate_request::weight)
  std::string key_id;   // the API key's id; empty when none was checked
  // The gate's own record of the check (e.g. the key and tenant snapshot it matched), handed
  // back to it in try_acquire(); the routes never look inside.
  std::shared_ptr<const void> credentials;
};

// The whole answer to a request the gate refuses (an OpenAI-shaped error with its headers).
using gate_refusal = response;

// What a request asks to spend, known once its prompt is tokenized.
struct quota_demand {
  std::int64_t prompt_tokens = 0;
  std::int64_t max_tokens = 0;  // the completion's limit after defaults (prompt + max_tokens <= context)
  std::string_view model;
};

// Tokens reserved for one admitted request. Connection strand only.
class gate_lease {
 public:
  virtual ~gate_lease() = default;
  // Adds the headers every response to this request carries (x-ratelimit-*).
  virtual void add_headers(http::response_header<>& header) const = 0;
  // Called once, when the request ends, with what it used.
  virtual void settle(const backend::token_usage& used) = 0;
};

class request_gate {
 public:
  virtual ~request_gate() = default;
  // Called on the connection's strand; must not block on I/O.
  virtual std::variant<caller, gate_refusal> authenticate(const request& req) = 0;
  virtual std::variant<std::unique_ptr<gate_lease>, gate_refusal> try_acquire(const caller& who,
                                                                               const quota_demand& demand) = 0;
};

// Request header naming the tenant for open_gate (API keys name it once they are checked).
inline constexpr std::string_view tenant_header = "x-edgeinfer-tenant";

// Lets every request in without limits; the tenant is the x-edgeinfer-tenant header, else
// "default". Thread-safe (stateless).
class open_gate final : public request_gate {
 public:
  std::variant<caller, gate_refusal> authenticate(const request& req) override;
  std::variant<std::unique_ptr<gate_lease>, gate_refusal> try_acquire(const caller& who,
                                                                       const quota_demand& demand) override;
};

}  // namespace edge::gateway
