#include "edge/gateway/tenancy/quota_response.h"

#include <string>

#include "edge/gateway/http/json_response.h"

namespace edge::gateway {

void set_rate_limit_headers(http::response_header<>& header, const quota_decision& decision) {
  if (decision.requests) {
    header.set("x-ratelimit-limit-requests", std::to_string(decision.requests->limit));
    header.set("x-ratelimit-remaining-requests", std::to_string(decision.requests->remaining));
    header.set("x-ratelimit-reset-requests", format_reset_duration(decision.requests->reset));
  }
  if (decision.tokens) {
    header.set("x-ratelimit-limit-tokens", std::to_string(decision.tokens->limit));
    header.set("x-ratelimit-remaining-tokens", std::to_string(decision.tokens->remaining));
    header.set("x-ratelimit-reset-tokens", format_reset_duration(decision.tokens->reset));
  }
  if (!decision.allowed && decision.retry_after) {
    const std::int64_t ms = decision.retry_after->count();
    // Whole seconds, rounded up and at least 1, so a client honouring only retry-after never
    // comes back too early.
    const std::int64_t seconds = std::max<std::int64_t>((ms + 999) / 1000, 1);
    header.set(http::field::retry_after, std::to_string(seconds));
    header.set("retry-after-ms", std::to_string(ms));
  }
}

response quota_refusal_response(const quota_decision& decision) {
  response res;
  if (decision.limit == quota_limit::quota_store_unavailable) {
    res = error_response(http::status::service_unavailable, decision.message, "server_error", std::nullopt,
                         "quota_store_unavailable");
  } else {
    const quota_kind* kind = find_quota_kind(decision.limit);
    const quota_refusal& refusal = kind != nullptr ? kind->refusal : requests_refusal;
    const std::optional<std::string_view> param =
        refusal.param.empty() ? std::nullopt : std::optional<std::string_view>(refusal.param);
    res = error_response(static_cast<http::status>(refusal.status), decision.message, refusal.type, param,
                         refusal.code);
  }
  set_rate_limit_headers(res, decision);
  return res;
}

}  // namespace edge::gateway
