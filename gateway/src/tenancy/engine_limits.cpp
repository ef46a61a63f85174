#include "edge/gateway/tenancy/engine_limits.h"

namespace edge::gateway {

void set_tenant_fields(backend::generate_request& request, const tenant_record& tenant) {
  request.tenant = tenant.id;
  request.weight = tenant.weight;
  request.priority = tenant_request_priority;
  request.host_tier_cap_bytes = tenant.quotas.kv_host_cache_bytes.value_or(unlimited_tier_bytes);
  request.disk_tier_cap_bytes = tenant.quotas.kv_disk_cache_bytes.value_or(unlimited_tier_bytes);
}

}  // namespace edge::gateway
