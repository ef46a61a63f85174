// libFuzzer harness: the admin API's body parsers (admin_request.h) on arbitrary bytes return a
// value or an error naming the field; they never crash, and what they accept is inside the
// documented ranges. A tenant they accept, written as the API shows it (tenant_json.h) and
// sent back as a create body, reads back as the same tenant.
#include <boost/json/serialize.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "edge/gateway/tenancy/admin_request.h"
#include "edge/gateway/tenancy/tenant_json.h"
#include "require.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

namespace gw = edge::gateway;

using edge::fuzz::require;

bool quota_ok(const gw::quota_kind& kind, const std::optional<std::int64_t>& q) {
  return !q || (*q >= kind.least && *q <= gw::max_quota_value);
}

bool quotas_ok(const gw::tenant_quotas& q) {
  for (const gw::quota_kind& kind : gw::quota_kinds) {
    if (!quota_ok(kind, kind.of(q))) return false;
  }
  return true;
}

bool weight_ok(double w) { return w > 0.0 && w <= gw::max_tenant_weight; }

bool patched_quota_ok(const gw::quota_kind& kind, const std::optional<std::optional<std::int64_t>>& q) {
  return !q || quota_ok(kind, *q);
}

void check_create(std::string_view body) {
  const auto parsed = gw::parse_tenant_create(body);
  if (std::holds_alternative<gw::admin_request_error>(parsed)) {
    require(!std::get<gw::admin_request_error>(parsed).message.empty());
    return;
  }
  const auto& tenant = std::get<gw::tenant_record>(parsed);
  require(gw::is_valid_tenant_id(tenant.id) && weight_ok(tenant.weight) && quotas_ok(tenant.quotas));
  boost::json::object shown = gw::to_json(tenant);
  boost::json::object resent;
  resent["id"] = shown["id"];
  resent["weight"] = shown["weight"];
  resent["quotas"] = shown["quotas"];
  const auto again = gw::parse_tenant_create(boost::json::serialize(resent));
  require(std::holds_alternative<gw::tenant_record>(again) && std::get<gw::tenant_record>(again) == tenant);
}

void check_patch(std::string_view body) {
  const auto parsed = gw::parse_tenant_patch(body, "acme");
  if (std::holds_alternative<gw::admin_request_error>(parsed)) return;
  const auto& patch = std::get<gw::tenant_patch>(parsed);
  require(!patch.weight || weight_ok(*patch.weight));
  for (const gw::quota_kind& kind : gw::quota_kinds) require(patched_quota_ok(kind, patch.quota(kind)));
}

void check_key(std::string_view body) {
  const auto parsed = gw::parse_key_create(body);
  if (std::holds_alternative<gw::admin_request_error>(parsed)) return;
  const auto& params = std::get<gw::key_create_params>(parsed);
  require(!(params.expires_in && params.expires_at));
  require(!params.expires_in || *params.expires_in >= 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  check_create(body);
  check_patch(body);
  check_key(body);
  return 0;
}
