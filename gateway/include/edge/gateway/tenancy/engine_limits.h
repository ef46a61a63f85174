// What a tenant's record puts on each generate request it sends to an engine: its id (which also
// salts its prefix cache), its weight in the fair share, the one priority every tenant has, and
// its quota kinds of the engine phase (quota_kinds.h): limits no quota store judges, which the
// engine applies to the tenant's requests. Every API's route sets them here, so a generate
// request of a tenant carries all of them, locally and across the split protocol.
#pragma once

#include <cstdint>
#include <limits>

#include "edge/backend/engine/engine.h"
#include "edge/gateway/tenancy/tenant.h"

namespace edge::gateway {

// An absent (unlimited) cap on a lower KV tier, as generate_request has it by default.
inline constexpr std::int64_t unlimited_tier_bytes = std::numeric_limits<std::int64_t>::max();

// Sets the tenant's fields of `request`: tenant, weight, priority, and the caps on the lower KV
// tiers (kv_host_cache_bytes, kv_disk_cache_bytes; absent: unlimited).
void set_tenant_fields(backend::generate_request& request, const tenant_record& tenant);

}  // namespace edge::gateway
