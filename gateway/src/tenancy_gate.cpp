#include "edge/gateway/tenancy_gate.h"

#include <optional>
#include <utility>

#include "edge/gateway/auth.h"
#include "edge/gateway/quota_response.h"

namespace edge::gateway {
namespace {

// An admitted request's quota lease and the headers its responses carry.
class tenancy_lease final : public gate_lease {
 public:
  tenancy_lease(quota_decision decision, quota_lease lease) : decision_(std::move(decision)), lease_(std::move(lease)) {}

  void add_headers(http::response_header<>& header) const override { set_rate_limit_headers(header, decision_); }

  void settle(const backend::token_usage& used) override {
    lease_.record({.prompt_tokens = used.prompt_tokens,
                   .completion_tokens = used.completion_tokens,
                   .cached_tokens = used.cached_tokens});
    lease_.finish();
  }

 private:
  quota_decision decision_;
  quota_lease lease_;
};

}  // namespace

std::variant<caller, gate_refusal> tenancy_gate::authenticate(const request& req) {
  auto who = tenants_.authenticate(req);
  if (!who.ok()) return unauthorized_response(who.error());
  caller out;
  out.tenant = who->tenant->id;
  out.weight = who->tenant->weight;
  out.key_id = who->key_id;
  out.credentials = std::make_shared<const authenticated_tenant>(std::move(who).value());
  return out;
}

std::variant<std::unique_ptr<gate_lease>, gate_refusal> tenancy_gate::try_acquire(const caller& who,
                                                                                   const quota_demand& demand) {
  const auto* credentials = static_cast<const authenticated_tenant*>(who.credentials.get());
  if (credentials == nullptr) {
    // Only callers this gate authenticated carry credentials; anything else is a wiring bug.
    return unauthorized_response(status(status_code::unauthenticated, "the request was not authenticated"));
  }
  admission admitted = tenants_.admit(*credentials, demand.prompt_tokens, demand.max_tokens);
  if (!admitted.allowed()) return quota_refusal_response(admitted.decision);
  return std::make_unique<tenancy_lease>(std::move(admitted.decision), std::move(*admitted.lease));
}

}  // namespace edge::gateway
