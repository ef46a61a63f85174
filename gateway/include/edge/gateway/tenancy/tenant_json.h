// JSON forms of tenants, keys, usage rows and audit entries, as the admin API shows them and
// the audit log records them. Written with Boost.JSON.
//
//   tenant:  {"id","object":"tenant","weight","quotas":{one field per quota kind, named and
//             ordered as quota_kinds.h has them (null: unlimited)},"created_at","updated_at"}
//   key:     {"id","object":"api_key","tenant","status":"active"|"expired"|"revoked",
//             "created_at","expires_at","revoked_at"}                (times: unix seconds or null)
//   usage:   {"hour":"2026-05-01T13:00:00Z","requests","prompt_tokens","completion_tokens",
//             "cached_tokens","total_tokens","rejections"}
//   audit:   {"id","at","actor","action","target","request_id","details":{...}}
#pragma once

#include <boost/json/object.hpp>

#include "edge/gateway/tenancy/tenant.h"
#include "edge/gateway/tenancy/tenant_store.h"

namespace edge::gateway {

boost::json::object to_json(const tenant_quotas& quotas);
boost::json::object to_json(const tenant_record& tenant);
boost::json::object to_json(const api_key_record& key, unix_time now);
boost::json::object to_json(const usage_counts& counts);
boost::json::object to_json(const usage_row& row);
boost::json::object to_json(const audit_entry& entry);

}  // namespace edge::gateway
