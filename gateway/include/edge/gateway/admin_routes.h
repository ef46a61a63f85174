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
// admin_api_disabled. Bodies are parsed with simdjson; unknown fields, wrong types and values
// out of range are a 400 naming the field (a misspelt quota silently ignored would leave a
// tenant unlimited). Quota fields absent (or null) mean unlimited; in a PATCH, absent means
// unchanged and null means unlimited. Times are unix seconds; `from`, `to` and `expires_at`
// also take "2026-05-01" or "2026-05-01T13:00:00Z".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <variant>

#include "edge/gateway/http.h"
#include "edge/gateway/tenant.h"
#include "edge/gateway/tenant_store.h"

namespace edge::gateway {

class tenancy;

// The shortest admin token accepted: shorter ones are guessable.
inline constexpr std::size_t min_admin_token_length = 16;

struct admin_options {
  std::string admin_token;  // empty: the admin API is disabled
};

// `tenants` must outlive the router.
void add_admin_routes(router& routes, tenancy& tenants, admin_options options);

// A body the client must fix: 400 with `param` naming the field ("quotas.daily_tokens").
struct admin_request_error {
  std::string message;
  std::string param;
};

std::variant<tenant_record, admin_request_error> parse_tenant_create(std::string_view body);
// `tenant_id` is the tenant patched: the body may repeat it, not change it.
std::variant<tenant_patch, admin_request_error> parse_tenant_patch(std::string_view body, std::string_view tenant_id);

struct key_create_params {
  std::optional<unix_time> expires_at;  // absolute
  std::optional<std::int64_t> expires_in;  // seconds from now
};
std::variant<key_create_params, admin_request_error> parse_key_create(std::string_view body);

}  // namespace edge::gateway
