// What the gateway knows about tenants and their API keys: plain values shared by the tenant
// store, the auth check, the quotas and the admin API.
//
// API keys look like `ek-<key id>.<secret>`: the key id (16 hex digits) names the key, the
// secret (43 base64url characters, 256 random bits) proves it. Only the SHA-256 of the secret
// is stored; the whole key is shown once, when it is created.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "edge/common/sha256.h"
#include "edge/common/status.h"
#include "edge/gateway/tenancy/quota_kinds.h"

namespace edge::gateway {

using unix_time = std::int64_t;  // seconds since 1970-01-01T00:00:00Z

// The largest value any quota field accepts (well inside a double's exact integers, so JSON
// clients in any language read it back exactly).
inline constexpr std::int64_t max_quota_value = std::int64_t{1} << 50;
inline constexpr double max_tenant_weight = 1000.0;
// Whether the tenant admin accepts `weight`: above 0 and at most max_tenant_weight. The rule in
// the words of an error: "'weight' must be {tenant_weight_rule()}".
bool is_valid_tenant_weight(double weight);
std::string tenant_weight_rule();
// Tenants have no priority of their own (the tenant admin sets none): every request a gateway
// sends runs at this one.
inline constexpr std::int32_t tenant_request_priority = 0;

struct tenant_record {
  std::string id;
  double weight = 1.0;  // share of the engine relative to other tenants (> 0)
  tenant_quotas quotas;
  unix_time created_at = 0;
  unix_time updated_at = 0;

  friend bool operator==(const tenant_record&, const tenant_record&) = default;
};

// An API key as stored: never the secret, only its digest.
struct api_key_record {
  std::string id;
  std::string tenant_id;
  sha256_digest secret_sha256{};
  unix_time created_at = 0;
  std::optional<unix_time> expires_at;
  std::optional<unix_time> revoked_at;

  // "active", "expired" or "revoked" at `now`.
  std::string_view state(unix_time now) const;
};

// A newly created key: the record, and the key text that is shown once.
struct issued_api_key {
  api_key_record record;
  std::string key;  // "ek-<id>.<secret>"
};

inline constexpr std::string_view api_key_prefix = "ek-";

// Tenant ids: 1 to 64 characters of [A-Za-z0-9._-], starting with a letter or digit, so they
// are safe in URLs, metric labels and log lines as they are. The rule in the words of an
// error: "'id' must be {tenant_id_rule}".
bool is_valid_tenant_id(std::string_view id);
inline constexpr std::string_view tenant_id_rule =
    "1 to 64 characters of A-Z, a-z, 0-9, '.', '_' and '-', starting with a letter or digit";

// `bytes` bytes from the kernel's CSPRNG as base64url text: the secret of an API key, and the
// internal API's token a backend makes on its first start.
std::string generate_secret_text(std::size_t bytes);

// A fresh key for `tenant_id`: a random id and secret from the kernel's CSPRNG.
issued_api_key generate_api_key(std::string_view tenant_id, unix_time now, std::optional<unix_time> expires_at);

// "ek-<id>.<secret>" split into its parts; nullopt when the text has another shape.
struct api_key_parts {
  std::string_view id;
  std::string_view secret;
};
std::optional<api_key_parts> split_api_key(std::string_view key);

// Whether `secret` is the one whose digest is `expected`, in constant time.
bool secret_matches(std::string_view secret, const sha256_digest& expected);

unix_time to_unix_seconds(std::chrono::system_clock::time_point t);

// "2026-05-01T13:00:00Z".
std::string format_utc(unix_time t);
// Accepts unix seconds ("1714568400"), a date ("2026-05-01", midnight UTC), or a UTC time
// ("2026-05-01T13:00:00Z", "2026-05-01T13:00Z", "2026-05-01T13:00:00"; a trailing "Z" or
// "+00:00" is allowed, other offsets are not), up to 9999-12-31T23:59:59Z.
result<unix_time> parse_utc(std::string_view text);

}  // namespace edge::gateway
