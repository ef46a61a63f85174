// Anthropic's Messages API answers: errors in its shape, and count_tokens' body.
#pragma once

#include <cstdint>
#include <string_view>

#include "edge/gateway/http/http.h"

namespace edge::gateway {

// Anthropic's error type for an HTTP status (400 invalid_request_error, 401
// authentication_error, 403 permission_error, 404 not_found_error, 413 request_too_large, 429
// rate_limit_error, 503 overloaded_error, other 5xx api_error).
std::string_view anthropic_error_type(http::status status);

// The error `res` answers, written as this server writes every error (OpenAI's shape,
// {"error": {"message", ...}}), rewritten in Anthropic's: {"type": "error", "error": {"type",
// "message"}}. The status and headers stay (retry-after, x-ratelimit-*); a body that is not
// such an error keeps its text as the message.
response anthropic_error(response res);

// {"input_tokens": N}
response count_tokens_response(std::int64_t input_tokens);

}  // namespace edge::gateway
