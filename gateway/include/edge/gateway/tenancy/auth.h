// API-key authentication on the request path:
//
//   Authorization: Bearer ek-<key id>.<secret>   (or x-api-key: ek-<key id>.<secret>, as
//                                                  Anthropic's clients send it)
//     -> the key id is looked up in the tenant store's current snapshot (no SQLite, no lock held
//        by writers), the SHA-256 of the secret is compared with the stored digest in constant
//        time, expiry and revocation are checked against the clock, and the key's tenant is the
//        caller.
//   Authorization: Bearer <a key given at start with --api-key>
//     -> for single-tenant use (as vLLM's and llama.cpp's --api-key): the key's SHA-256 is
//        compared in constant time with the digests of the configured keys (their text is never
//        kept), and the caller is the default tenant, with key id "api-key-N" (N: its place
//        among the configured keys) in usage and spend.
//
// Every failure is an `unauthenticated` status whose message the client may see; the 401 body
// is OpenAI's: {"error":{"type":"invalid_request_error","code":"invalid_api_key",...}}.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "edge/common/status.h"
#include "edge/common/time_source.h"
#include "edge/gateway/http/http.h"
#include "edge/gateway/tenancy/tenant.h"
#include "edge/gateway/tenancy/tenant_store.h"

namespace edge::gateway {

struct authenticated_tenant {
  std::shared_ptr<const tenant_record> tenant;  // as of the snapshot the request was checked against
  std::string key_id;
};

// Keys given to the server when it starts (--api-key): each authenticates as `tenant_id`.
struct configured_api_keys {
  std::string tenant_id;
  std::vector<sha256_digest> digests;  // of each key's whole text, in the order given

  // The digests of `keys`; the text is not kept.
  static configured_api_keys of(std::string tenant_id, const std::vector<std::string>& keys);
  // "api-key-N" for the key at `index`: its id in usage, spend and logs.
  static std::string key_id(std::size_t index);
};

class authenticator {
 public:
  // Both must outlive the authenticator.
  authenticator(const tenant_store& store, const time_source& clock, configured_api_keys configured = {})
      : store_(store), clock_(clock), configured_(std::move(configured)) {}

  // The request's Authorization header (x-api-key when there is none), checked. Thread-safe.
  result<authenticated_tenant> authenticate(const request& req) const;
  // `authorization` is the header's value ("Bearer ek-...").
  result<authenticated_tenant> authenticate_header(std::string_view authorization) const;
  // `token` is the key itself ("ek-...").
  result<authenticated_tenant> authenticate_key(std::string_view token) const;

 private:
  // The configured key `token` is, if any: every digest is compared, so the time taken does not
  // say which (or whether one) matched.
  std::optional<std::size_t> configured_key(std::string_view token) const;

  const tenant_store& store_;
  const time_source& clock_;
  const configured_api_keys configured_;
};

// 401 invalid_api_key with the status's message, and WWW-Authenticate: Bearer.
response unauthorized_response(const status& failure);

}  // namespace edge::gateway
