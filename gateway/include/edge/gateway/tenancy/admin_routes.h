// The admin API, under /admin/v1/, for operators (never for tenants):
//
//   POST   /admin/v1/tenants                  {"id","weight","quotas":{...}}         -> 201 tenant
//   GET    /admin/v1/tenants                                                          -> 200 list
//   GET    /admin/v1/tenants/{id}                                                     -> 200 tenant
//   PATCH  /admin/v1/tenants/{id}             {"weight","quotas":{field: n | null}}  -> 200 tenant
//   DELETE /admin/v1/tenants/{id}             (its keys go too; usage stays)          -> 200
//   POST   /admin/v1/tenants/{id}/keys        {"expires_in": s} | {"expires_at": t}  -> 201 {"id","key":"ek-…",…}
//   GET    /admin/v1/tenants/{id}/keys                                                -> 200 list (no secrets)
//   DELETE /admin/v1/keys/{key_id}            revokes                                 -> 200 key
//   GET    /admin/v1/tenants/{id}/usage?from=&to=   hourly rows and their total       -> 200
//   GET    /admin/v1/audit?limit=&before=     admin changes, newest first             -> 200
//
// Every call needs `Authorization: Bearer <admin token>` (--admin-token / EDGE_ADMIN_TOKEN),
// compared in constant time; without a configured token the whole API answers 403
// admin_api_disabled. Bodies and query strings are read by admin_request.h: unknown fields,
// wrong types and values out of range are a 400 naming the field (a misspelt quota silently
// ignored would leave a tenant unlimited). Quota fields absent (or null) mean unlimited; in a PATCH, absent means
// unchanged and null means unlimited. Times are unix seconds; `from`, `to` and `expires_at`
// also take "2026-05-01" or "2026-05-01T13:00:00Z".
#pragma once

#include <string>

#include "edge/gateway/tenancy/admin_request.h"
#include "edge/gateway/http/http.h"

namespace edge::gateway {

class tenancy;

// The shortest admin token accepted: shorter ones are guessable.
inline constexpr std::size_t min_admin_token_length = 16;

struct admin_options {
  std::string admin_token;  // empty: the admin API is disabled
};

// `tenants` must outlive the router.
void add_admin_routes(router& routes, tenancy& tenants, admin_options options);

}  // namespace edge::gateway
