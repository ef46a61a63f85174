// What the admin API reads from a request (admin_routes.h lists the routes): the bodies of
// tenant create / patch and key create, and the query strings of the usage and audit listings.
// Bodies are parsed with simdjson, query strings with Boost.URL; nothing here needs the HTTP
// server, so the parsers are tested and fuzzed on their own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "edge/gateway/tenancy/tenant.h"
#include "edge/gateway/tenancy/tenant_store.h"

namespace edge::gateway {

// A request the client must fix: 400 with `param` naming the field ("weight", or "quotas." and
// a quota kind's name) or query parameter ("" for the body as a whole).
struct admin_request_error {
  std::string message;
  std::string param;
};

// ---- bodies -----------------------------------------------------------------------------------

std::variant<tenant_record, admin_request_error> parse_tenant_create(std::string_view body);
// `tenant_id` is the tenant patched: the body may repeat it, not change it.
std::variant<tenant_patch, admin_request_error> parse_tenant_patch(std::string_view body, std::string_view tenant_id);

struct key_create_params {
  std::optional<unix_time> expires_at;     // absolute
  std::optional<std::int64_t> expires_in;  // seconds from now

  // When the key expires if made at `now` (nullopt: never), or the error when that is not in the
  // future.
  std::variant<std::optional<unix_time>, admin_request_error> expiry(unix_time now) const;
};
std::variant<key_create_params, admin_request_error> parse_key_create(std::string_view body);

// ---- query strings ----------------------------------------------------------------------------

inline constexpr std::size_t default_audit_limit = 100;
inline constexpr std::size_t max_audit_limit = 1000;

struct query_param {
  std::string name;
  std::string value;
};

// The query string (after '?') as percent-decoded name=value pairs ('+' is a space), in order;
// a name outside `known` is an error naming it.
std::variant<std::vector<query_param>, admin_request_error> parse_query(std::string_view query,
                                                                        std::initializer_list<std::string_view> known);

// GET /admin/v1/tenants/{id}/usage?from=&to= and .../spend?from=&to=&key=: the hours
// [from, to) asked for, by default from the start of `now`'s UTC day to just after `now` (both
// take what parse_utc reads); `key` (spend only) narrows it to one API key.
struct usage_window {
  unix_time from = 0;
  unix_time to = 0;
  std::optional<std::string> key_id;
};
std::variant<usage_window, admin_request_error> parse_usage_query(std::string_view query, unix_time now,
                                                                  bool by_key = false);

// GET /admin/v1/audit?limit=&before=: at most `limit` entries older than the entry `before`.
struct audit_page {
  std::size_t limit = default_audit_limit;
  std::optional<std::int64_t> before;
};
std::variant<audit_page, admin_request_error> parse_audit_query(std::string_view query);

}  // namespace edge::gateway
