#include "edge/gateway/tenancy/tenant_json.h"

#include <boost/json/parse.hpp>

#include <cmath>

namespace edge::gateway {
namespace {

boost::json::value optional_value(const std::optional<std::int64_t>& v) {
  return v ? boost::json::value(*v) : boost::json::value(nullptr);
}

}  // namespace

boost::json::object to_json(const tenant_quotas& quotas) {
  boost::json::object out;
  for (const quota_kind& kind : quota_kinds) out[kind.name] = optional_value(kind.of(quotas));
  return out;
}

boost::json::object to_json(const tenant_record& tenant) {
  boost::json::object out;
  out["id"] = tenant.id;
  out["object"] = "tenant";
  // A whole weight is written as an integer: Boost.JSON writes the double 2.0 as "2E0".
  if (const double whole = std::trunc(tenant.weight); whole == tenant.weight && std::abs(whole) <= max_tenant_weight) {
    out["weight"] = static_cast<std::int64_t>(whole);
  } else {
    out["weight"] = tenant.weight;
  }
  out["quotas"] = to_json(tenant.quotas);
  out["created_at"] = tenant.created_at;
  out["updated_at"] = tenant.updated_at;
  return out;
}

boost::json::object to_json(const api_key_record& key, unix_time now) {
  boost::json::object out;
  out["id"] = key.id;
  out["object"] = "api_key";
  out["tenant"] = key.tenant_id;
  out["status"] = key.state(now);
  out["created_at"] = key.created_at;
  out["expires_at"] = optional_value(key.expires_at);
  out["revoked_at"] = optional_value(key.revoked_at);
  return out;
}

boost::json::object to_json(const usage_counts& counts) {
  boost::json::object out;
  out["requests"] = counts.requests;
  out["prompt_tokens"] = counts.prompt_tokens;
  out["completion_tokens"] = counts.completion_tokens;
  out["cached_tokens"] = counts.cached_tokens;
  out["total_tokens"] = counts.prompt_tokens + counts.completion_tokens;
  out["rejections"] = counts.rejections;
  return out;
}

boost::json::object to_json(const usage_row& row) {
  boost::json::object out;
  out["hour"] = format_utc(row.hour_start);
  for (auto& [name, value] : to_json(row.counts)) out[name] = value;
  return out;
}

boost::json::object to_json(const audit_entry& entry) {
  boost::json::object out;
  out["id"] = entry.id;
  out["at"] = entry.at;
  out["actor"] = entry.actor;
  out["action"] = entry.action;
  out["target"] = entry.target;
  out["request_id"] = entry.request_id.empty() ? boost::json::value(nullptr) : boost::json::value(entry.request_id);
  // Written by the store with Boost.JSON; parsed back so the API nests it as an object.
  boost::system::error_code ec;
  boost::json::value details = boost::json::parse(entry.details, ec);
  out["details"] = ec ? boost::json::value(entry.details) : std::move(details);
  return out;
}

}  // namespace edge::gateway
