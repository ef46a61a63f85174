// The request gate of a server with tenants: API keys checked against the tenant store's
// snapshot, quotas admitted and settled through tenancy (tenancy.h). The OpenAI routes see only
// request_gate (request_gate.h).
#pragma once

#include <memory>
#include <variant>

#include "edge/gateway/request_gate.h"
#include "edge/gateway/tenancy.h"

namespace edge::gateway {

class tenancy_gate final : public request_gate {
 public:
  // `tenants` must outlive the gate and every lease it hands out.
  explicit tenancy_gate(tenancy& tenants) : tenants_(tenants) {}

  // 401 invalid_api_key for a missing, malformed, unknown, revoked or expired key.
  std::variant<caller, gate_refusal> authenticate(const request& req) override;
  // 429 (rate_limit_exceeded / insufficient_quota) or 400 (max_tokens over the tenant's
  // max_tokens_per_request), with retry-after and the x-ratelimit-* headers.
  std::variant<std::unique_ptr<gate_lease>, gate_refusal> try_acquire(const caller& who,
                                                                       const quota_demand& demand) override;

 private:
  tenancy& tenants_;
};

}  // namespace edge::gateway
