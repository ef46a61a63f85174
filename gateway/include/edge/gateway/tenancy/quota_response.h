// Quota decisions on the wire, as OpenAI writes them.
//
// Every answer to an admitted or refused request carries, for each limit the tenant has:
//   x-ratelimit-limit-requests / -tokens       the per-minute limit
//   x-ratelimit-remaining-requests / -tokens   what could be admitted right now
//   x-ratelimit-reset-requests / -tokens       until the allowance is full again ("1s", "6m0s")
// and a refusal that retrying can cure also carries retry-after (whole seconds, rounded up)
// and retry-after-ms.
//
// Refusals, as each kind's row of quota_kinds.h has them (quota_refusal): 429
// {"error":{"type":"requests"|"tokens","code":"rate_limit_exceeded"}} for the per-minute limits
// and the requests in flight (type "requests"); 429 {"type":"insufficient_quota",
// "code":"insufficient_quota"} when the daily budget is spent; 400 invalid_request_error with
// param "max_tokens" when one request asks for more than its tenant's largest max_tokens; 503
// {"type":"server_error","code":"quota_store_unavailable"} with retry-after when the shared
// quota store is down and --quota-fail-mode is closed.
#pragma once

#include "edge/gateway/http/http.h"
#include "edge/gateway/tenancy/quota.h"

namespace edge::gateway {

// Sets the x-ratelimit-* headers (and, for a retryable refusal, retry-after and
// retry-after-ms) on a response or on a streamed response's header.
void set_rate_limit_headers(http::response_header<>& header, const quota_decision& decision);

// The complete answer to a refused request: status, OpenAI-shaped body and headers.
response quota_refusal_response(const quota_decision& decision);

}  // namespace edge::gateway
