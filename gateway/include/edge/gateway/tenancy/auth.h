// API-key authentication on the request path:
//
//   Authorization: Bearer ek-<key id>.<secret>   (or x-api-key: ek-<key id>.<secret>, as
//                                                  Anthropic's clients send it)
//     -> the key id is looked up in the tenant store's current snapshot (no SQLite, no lock held
//        by writers), the SHA-256 of the secret is compared with the stored digest in constant
//        time, expiry and revocation are checked against the clock, and the key's tenant is the
//        caller.
//
// Every failure is an `unauthenticated` status whose message the client may see; the 401 body
// is OpenAI's: {"error":{"type":"invalid_request_error","code":"invalid_api_key",...}}.
#pragma once

#include <memory>
#include <string>
#include <string_view>

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

class authenticator {
 public:
  // Both must outlive the authenticator.
  authenticator(const tenant_store& store, const time_source& clock) : store_(store), clock_(clock) {}

  // The request's Authorization header (x-api-key when there is none), checked. Thread-safe.
  result<authenticated_tenant> authenticate(const request& req) const;
  // `authorization` is the header's value ("Bearer ek-...").
  result<authenticated_tenant> authenticate_header(std::string_view authorization) const;
  // `token` is the key itself ("ek-...").
  result<authenticated_tenant> authenticate_key(std::string_view token) const;

 private:
  const tenant_store& store_;
  const time_source& clock_;
};

// 401 invalid_api_key with the status's message, and WWW-Authenticate: Bearer.
response unauthorized_response(const status& failure);

}  // namespace edge::gateway
