#include "edge/gateway/openai/refusals.h"

#include <array>

#include "edge/gateway/http/json_response.h"
#include "edge/gateway/openai/grammar_compiler.h"
#include "edge/gateway/tenancy/quota_response.h"

namespace edge::gateway {
namespace {

using split = split_handling;

// Each status's first row is how the split gateway reads an answer of that status whose code no
// row has.
constexpr std::array rows{
    refusal_row{refusal_kind::invalid_request, http::status::bad_request, "invalid_request_error", "", false,
                status_code::invalid_argument, split::final},
    refusal_row{refusal_kind::context_length, http::status::bad_request, "invalid_request_error",
                "context_length_exceeded", false, status_code::out_of_range, split::final},
    refusal_row{refusal_kind::too_large, http::status::payload_too_large, "invalid_request_error", "request_too_large",
                false, status_code::invalid_argument, split::final},
    refusal_row{refusal_kind::tenant_limit, http::status::too_many_requests, "rate_limit_error", "rate_limit_exceeded",
                true, status_code::resource_exhausted, split::final},
    refusal_row{refusal_kind::backend_unavailable, http::status::service_unavailable, "server_error",
                "backend_unavailable", true, status_code::unavailable, split::backend_failed},
    refusal_row{refusal_kind::overloaded, http::status::service_unavailable, "server_error", "overloaded", true,
                status_code::resource_exhausted, split::next_backend},
    refusal_row{refusal_kind::shutting_down, http::status::service_unavailable, "server_error", "shutting_down", true,
                status_code::failed_precondition, split::backend_failed},
    refusal_row{refusal_kind::model_not_ready, http::status::service_unavailable, "server_error", "model_not_ready",
                true, status_code::unavailable, split::backend_failed},
    refusal_row{refusal_kind::engine_failed, http::status::internal_server_error, "server_error", "engine_error", false,
                status_code::internal, split::backend_failed},
};

constexpr bool rows_in_order() {
  for (std::size_t i = 0; i < rows.size(); ++i) {
    if (static_cast<std::size_t>(rows[i].kind) != i) return false;
  }
  return true;
}
static_assert(rows_in_order(), "rows lists the kinds in the order refusal_kind declares them");

std::optional<std::string_view> optional_text(std::string_view text) {
  return text.empty() ? std::nullopt : std::optional<std::string_view>(text);
}

}  // namespace

const refusal_row& refusal_info(refusal_kind kind) { return rows[static_cast<std::size_t>(kind)]; }

std::span<const refusal_row> refusal_rows() { return rows; }

std::optional<refusal_kind> refusal_kind_of(unsigned status, std::string_view code) {
  std::optional<refusal_kind> first_of_status;
  for (const refusal_row& row : rows) {
    if (static_cast<unsigned>(row.status) != status) continue;
    if (row.code == code) return row.kind;
    if (!first_of_status) first_of_status = row.kind;
  }
  return first_of_status;
}

boost::json::object refusal_body(const refusal& r) {
  const refusal_row& row = refusal_info(r.kind);
  const std::string_view type = r.kind == refusal_kind::tenant_limit && !r.limit.empty() ? r.limit : row.type;
  return error_body(r.message, type, optional_text(r.param), optional_text(row.code));
}

response refusal_response(const refusal& r) {
  const refusal_row& row = refusal_info(r.kind);
  response res = json_response(row.status, refusal_body(r));
  if (row.retry_after) {
    if (r.retry_after.count() > 0 || r.kind == refusal_kind::tenant_limit) {
      set_rate_limit_headers(res, quota_decision{.allowed = false, .retry_after = r.retry_after});
    } else {
      res.set(http::field::retry_after, "1");
    }
  }
  return res;
}

refusal refusal_of(const backend::submit_error& e) {
  refusal r{.message = e.message(), .param = e.field()};
  if (const auto& limit = e.limit()) {
    r.kind = refusal_kind::tenant_limit;
    r.limit = limit->name;
    r.retry_after = limit->retry_after;
    return r;
  }
  switch (e.code()) {
    case status_code::out_of_range: r.kind = refusal_kind::context_length; break;
    case status_code::resource_exhausted: r.kind = refusal_kind::overloaded; break;
    case status_code::failed_precondition: r.kind = refusal_kind::shutting_down; break;
    case status_code::unavailable: r.kind = refusal_kind::backend_unavailable; break;
    default: r.kind = refusal_kind::invalid_request; break;
  }
  return r;
}

refusal refusal_of(const compile_failure& f, std::string_view param) {
  refusal r{.message = f.message(), .retry_after = f.retry_after()};
  switch (f.what()) {
    case compile_failure::kind::grammar:
      r.kind = refusal_kind::invalid_request;
      r.param = param;
      break;
    case compile_failure::kind::tenant_queue:
    case compile_failure::kind::tenant_budget:
      r.kind = refusal_kind::tenant_limit;
      r.limit = f.limit_name();
      break;
    case compile_failure::kind::server_queue: r.kind = refusal_kind::overloaded; break;
    case compile_failure::kind::shutting_down:
    case compile_failure::kind::cancelled: r.kind = refusal_kind::shutting_down; break;
  }
  return r;
}

backend::submit_error submit_error_of(const refusal& r) {
  const status why(refusal_info(r.kind).engine_code, r.message);
  if (r.kind == refusal_kind::tenant_limit) {
    return backend::submit_error(why, backend::submit_error::tenant_limit{
                                          .name = r.limit.empty() ? std::string("rate_limit") : r.limit,
                                          .retry_after = r.retry_after});
  }
  return backend::submit_error(why, r.param);
}

}  // namespace edge::gateway
