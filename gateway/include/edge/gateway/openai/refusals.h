// Why a request is refused, or ended before its answer was whole, and what each reason is in
// HTTP: one table (refusal_info) that every route answers through (the OpenAI routes and a split
// backend's internal route, refusal_response) and that the split gateway reads a backend's answer
// back with (refusal_kind_of), so that the engine's typed refusals (engine::submit's
// submit_error) and the compiler's (compile_failure) mean the same on every path.
#pragma once

#include <boost/json/object.hpp>

#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "edge/backend/engine/engine.h"
#include "edge/common/status.h"
#include "edge/gateway/http/http.h"

namespace edge::gateway {

class compile_failure;  // grammar_compiler.h

enum class refusal_kind {
  invalid_request,      // the request's own content
  context_length,       // longer than the context or the KV cache
  too_large,            // a body over a backend's --max-body (the split gateway reads it)
  tenant_limit,         // a limit of the tenant's own that waiting cures (its grammar compiles)
  backend_unavailable,  // the engine failed, or no backend could take the request
  overloaded,           // the queue of all tenants is full: waiting, or another backend, may do
  shutting_down,        // the server is draining
  model_not_ready,      // the model is still loading
  engine_failed,        // the engine failed while the request ran
};

// What the split gateway does when a backend answers a refusal of the kind.
enum class split_handling {
  final,           // the request's or its tenant's own: the client gets it; no backend is marked
  next_backend,    // the backend is busy: another may take the request; it is not marked failed
  backend_failed,  // the backend cannot serve: marked failed, and another is tried
};

struct refusal_row {
  refusal_kind kind;
  http::status status;
  std::string_view type;   // the error's type; a tenant limit's is the limit's name instead
  std::string_view code;   // the error's code; "" for none
  bool retry_after;        // answered with retry-after: the refusal's own wait, else 1 s
  status_code engine_code; // the status engine::submit refuses with for it (the split gateway's too)
  split_handling split;
};

const refusal_row& refusal_info(refusal_kind kind);
// Every row, in the order refusal_kind declares the kinds.
std::span<const refusal_row> refusal_rows();

// A backend's answer read back: the row of its status and error code, else the first row of its
// status (400: invalid_request, 503: backend_unavailable), else nothing (an answer no row has,
// which the split gateway takes for the backend's failure).
std::optional<refusal_kind> refusal_kind_of(unsigned status, std::string_view code);

struct refusal {
  refusal_kind kind = refusal_kind::invalid_request;
  std::string message;
  std::string param;  // the parameter at fault: the API's name, or the internal protocol's field; "" none
  std::string limit;  // tenant_limit: the limit's name ("grammar_compile_queue", ...), the error's type
  std::chrono::milliseconds retry_after{0};  // 0: the kind's default (1 s where it has retry-after)
};

response refusal_response(const refusal& r);
// The error body alone: what a stream already begun sends as its error event.
boost::json::object refusal_body(const refusal& r);

// The engine's refusal; its generate_request field as the param (an API maps it to its own).
refusal refusal_of(const backend::submit_error& e);
// A grammar not compiled; `param` names the grammar's source for its own fault.
refusal refusal_of(const compile_failure& f, std::string_view param);
// And back to the engine's form: what the split gateway's pool hands the routes.
backend::submit_error submit_error_of(const refusal& r);

}  // namespace edge::gateway
