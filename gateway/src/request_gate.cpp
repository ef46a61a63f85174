#include "edge/gateway/request_gate.h"

#include "edge/gateway/json_response.h"

namespace edge::gateway {
namespace {

// Unlimited: nothing is reserved, so nothing is refunded.
class unlimited_lease final : public gate_lease {
 public:
  void add_headers(http::response_header<>&) const override {}
  void settle(const backend::token_usage&) override {}
};

// Tenant names become metric labels and log fields: keep them short and printable.
constexpr std::size_t max_tenant_length = 64;

bool is_tenant_name(std::string_view name) {
  if (name.empty() || name.size() > max_tenant_length) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

std::variant<caller, gate_refusal> open_gate::authenticate(const request& req) {
  caller who;
  const auto named = req[tenant_header];
  if (named.empty()) return who;
  if (!is_tenant_name(named)) {
    return error_response(http::status::bad_request,
                          "The x-edgeinfer-tenant header must be 1 to 64 letters, digits, '-', '_' or '.'",
                          "invalid_request_error", std::nullopt, "invalid_tenant");
  }
  who.tenant = std::string(named);
  return who;
}

std::variant<std::unique_ptr<gate_lease>, gate_refusal> open_gate::try_acquire(const caller&, const quota_demand&) {
  return std::make_unique<unlimited_lease>();
}

}  // namespace edge::gateway
