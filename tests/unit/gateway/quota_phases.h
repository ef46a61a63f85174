// Both admission phases as a request goes through them (as tenancy::admit does): phase 1, then
// phase 2 with what it holds; the first refusal is the answer, and a phase-2 refusal ends
// phase 1 with finish(held, 0). The answer carries phase 1's requests status and phase 2's
// tokens status, as the response headers do.
#pragma once

#include <cstdint>
#include <string_view>

#include "edge/gateway/tenancy/quota.h"

namespace edge::testing {

inline gateway::quota_decision admit_and_reserve(gateway::quota_store& store, const gateway::tenant_quotas& q,
                                                 std::int64_t prompt_tokens, std::int64_t max_tokens,
                                                 std::string_view tenant = "acme", std::int64_t choices = 1) {
  static gateway::reservation_ids ids;
  const std::string id = ids.next();
  gateway::quota_decision admitted = store.try_admit({tenant, q, id});
  if (!admitted.allowed) return admitted;
  gateway::quota_decision reserved = store.try_reserve(admitted.reservation, {tenant, q, prompt_tokens, max_tokens, choices});
  reserved.requests = admitted.requests;
  if (!reserved.allowed) store.finish(admitted.reservation, 0);
  return reserved;
}

}  // namespace edge::testing
