#include "edge/gateway/tenancy/auth.h"

#include "edge/common/format.h"
#include "edge/gateway/http/json_response.h"

namespace edge::gateway {
namespace {

status unauthenticated(std::string message) { return status(status_code::unauthenticated, std::move(message)); }

// Enough of a presented key to recognise it in a message, never enough to use it.
std::string redact(std::string_view key) {
  if (key.size() <= 12) return "****";
  return std::string(key.substr(0, 6)) + "****" + std::string(key.substr(key.size() - 4));
}

}  // namespace

configured_api_keys configured_api_keys::of(std::string tenant_id, const std::vector<std::string>& keys) {
  configured_api_keys out{.tenant_id = std::move(tenant_id), .digests = {}};
  out.digests.reserve(keys.size());
  for (const std::string& key : keys) out.digests.push_back(sha256(key));
  return out;
}

std::string configured_api_keys::key_id(std::size_t index) { return format("api-key-{}", index + 1); }

std::optional<std::size_t> authenticator::configured_key(std::string_view token) const {
  std::optional<std::size_t> found;
  for (std::size_t i = 0; i < configured_.digests.size(); ++i) {
    if (secret_matches(token, configured_.digests[i]) && !found) found = i;
  }
  return found;
}

result<authenticated_tenant> authenticator::authenticate(const request& req) const {
  const std::string_view authorization = req[http::field::authorization];
  const std::string_view api_key = req["x-api-key"];
  // Anthropic's clients send the key as x-api-key.
  if (authorization.empty() && !api_key.empty()) return authenticate_key(api_key);
  return authenticate_header(authorization);
}

result<authenticated_tenant> authenticator::authenticate_header(std::string_view authorization) const {
  if (authorization.empty()) {
    return unauthenticated(
        "You didn't provide an API key. Send it in the Authorization header: \"Authorization: Bearer ek-...\" "
        "(or as \"x-api-key: ek-...\")");
  }
  const std::string_view token = bearer_token(authorization);
  if (token.empty()) {
    return unauthenticated("The Authorization header must be \"Bearer <API key>\"");
  }
  return authenticate_key(token);
}

result<authenticated_tenant> authenticator::authenticate_key(std::string_view token) const {
  const auto incorrect = [&] { return unauthenticated(format("Incorrect API key provided: {}", redact(token))); };
  const std::shared_ptr<const tenant_snapshot> snapshot = store_.snapshot();
  const auto parts = split_api_key(token);
  const api_key_record* key = parts ? snapshot->key(parts->id) : nullptr;
  // An unknown id is refused after hashing all the same, so that a known id with a wrong secret
  // and an unknown id take the same time.
  static const sha256_digest no_digest{};
  const bool secret_ok = parts && secret_matches(parts->secret, key != nullptr ? key->secret_sha256 : no_digest);
  if (key == nullptr || !secret_ok) {
    if (const auto index = configured_key(token)) {
      std::shared_ptr<const tenant_record> tenant = snapshot->tenant(configured_.tenant_id);
      if (tenant != nullptr) return authenticated_tenant{std::move(tenant), configured_api_keys::key_id(*index)};
    }
    return incorrect();
  }
  // Only the key's owner learns that it expired or was revoked.
  if (key->revoked_at) return unauthenticated(format("The API key ek-{} has been revoked", key->id));
  if (key->expires_at && *key->expires_at <= to_unix_seconds(clock_.system_time())) {
    return unauthenticated(format("The API key ek-{} expired at {}", key->id, format_utc(*key->expires_at)));
  }
  std::shared_ptr<const tenant_record> tenant = snapshot->tenant(key->tenant_id);
  if (tenant == nullptr) return incorrect();
  return authenticated_tenant{std::move(tenant), key->id};
}

response unauthorized_response(const status& failure) {
  response res = error_response(http::status::unauthorized, failure.message(), "invalid_request_error", std::nullopt,
                                "invalid_api_key");
  res.set(http::field::www_authenticate, "Bearer");
  return res;
}

}  // namespace edge::gateway
