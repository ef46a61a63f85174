#include "edge/gateway/admin_routes.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/url/parse_query.hpp>

#include <charconv>
#include <cmath>
#include <functional>

#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/common/log.h"
#include "edge/common/sha256.h"
#include "edge/common/utf8.h"
#include "edge/gateway/json_response.h"
#include "edge/gateway/tenancy.h"
#include "edge/gateway/tenant_json.h"

namespace edge::gateway {
namespace {

namespace json = boost::json;

constexpr std::size_t default_audit_limit = 100;
constexpr std::size_t max_audit_limit = 1000;
// Longest a key may live when created with expires_in: ten years.
constexpr std::int64_t max_key_lifetime_seconds = 10LL * 366 * seconds_per_day;

// ---- body parsing -----------------------------------------------------------------------------

using parse_error = admin_request_error;
// What each field reader answers: nothing, or the first problem, an error naming the field.
using field_error = std::optional<json_error>;

// A quota value: a whole number from 1 to max_quota_value, or null (unlimited).
field_error read_quota(const json_value& v, std::optional<std::int64_t>& out) {
  if (v.is_null()) {
    out.reset();
    return std::nullopt;
  }
  EDGE_ASSIGN_OR_RETURN(const std::int64_t n, v.as<std::int64_t>("a whole number or null (unlimited)"));
  if (n < 1 || n > max_quota_value) return v.must_be(format("from 1 to {}, or null for unlimited", max_quota_value));
  out = n;
  return std::nullopt;
}

field_error read_weight(const json_value& v, double& out) {
  EDGE_ASSIGN_OR_RETURN(out, v.as<double>());
  if (!is_valid_tenant_weight(out)) return v.must_be(tenant_weight_rule());
  return std::nullopt;
}

// The quotas object: `slot(name)` is where each field's value goes (nullptr: no such quota).
field_error read_quotas(const json_value& v, const std::function<std::optional<std::int64_t>*(std::string_view)>& slot) {
  EDGE_ASSIGN_OR_RETURN(const json_fields quotas, v.as<json_fields>());
  for (const auto [name, value] : quotas) {
    std::optional<std::int64_t>* target = slot(name);
    if (target == nullptr) {
      return json_error(format("unknown quota '{}': the quotas are requests_per_minute, tokens_per_minute, "
                               "max_concurrent, daily_tokens and max_tokens_per_request",
                               name),
                        value.path().str());
    }
    if (auto error = read_quota(value, *target)) return error;
  }
  return std::nullopt;
}

// Parses the body and calls `read(name, value)` for each field of its object, in order; the
// first error, as the API answers it. An empty body is {} where `empty_is_object`.
template <class F>
std::optional<parse_error> read_body(std::string_view body, bool empty_is_object, F&& read) {
  if (empty_is_object && body.find_first_not_of(" \t\r\n") == std::string_view::npos) body = "{}";
  simdjson::dom::parser parser;
  const auto document = parse_json(parser, body);
  if (!document.ok()) return parse_error{"The body is not valid JSON", ""};
  if (document->type() != simdjson::dom::element_type::OBJECT) return parse_error{"The body must be a JSON object", ""};
  for (const auto [name, value] : json_fields(document->get_object().value_unsafe())) {
    if (const field_error error = read(name, value)) return parse_error{error->message(), error->path()};
  }
  return std::nullopt;
}

json_error unknown_field(std::string_view name, std::string_view known) {
  return {format("unknown field '{}': {}", name, known), std::string(name)};
}

std::optional<std::int64_t>* quota_slot(tenant_quotas& q, std::string_view name) {
  if (name == "requests_per_minute") return &q.requests_per_minute;
  if (name == "tokens_per_minute") return &q.tokens_per_minute;
  if (name == "max_concurrent") return &q.max_concurrent;
  if (name == "daily_tokens") return &q.daily_tokens;
  if (name == "max_tokens_per_request") return &q.max_tokens_per_request;
  return nullptr;
}

// ---- responses --------------------------------------------------------------------------------

response invalid(std::string_view message, std::optional<std::string_view> param = std::nullopt) {
  return error_response(http::status::bad_request, message, "invalid_request_error", param,
                        param ? std::optional<std::string_view>("invalid_value") : std::nullopt);
}

response from_status(const status& failure) {
  switch (failure.code()) {
    case status_code::not_found:
      return error_response(http::status::not_found, failure.message(), "invalid_request_error", std::nullopt,
                            "not_found");
    case status_code::already_exists:
      return error_response(http::status::conflict, failure.message(), "invalid_request_error", std::nullopt,
                            "already_exists");
    case status_code::invalid_argument:
      return error_response(http::status::bad_request, failure.message(), "invalid_request_error");
    case status_code::unavailable:
      return error_response(http::status::service_unavailable, failure.message(), "server_error");
    default:
      return error_response(http::status::internal_server_error, failure.message(), "server_error");
  }
}

json::object list_of(json::array data) {
  json::object out;
  out["object"] = "list";
  out["data"] = std::move(data);
  return out;
}

// ---- query strings ----------------------------------------------------------------------------

struct query_param {
  std::string name;
  std::string value;
};

// Decoded name=value pairs; an unknown name is a 400 naming it.
std::variant<std::vector<query_param>, response> read_query(std::string_view query,
                                                            std::initializer_list<std::string_view> known) {
  std::vector<query_param> out;
  if (query.empty()) return out;
  // Boost.URL 1.81's parse_query reads the last value up to a NUL, past the end of the view it
  // is given (the query sits inside the request target): parse a NUL-terminated copy.
  const std::string text(query);
  auto parsed = boost::urls::parse_query(text);
  if (!parsed) return invalid("The query string is malformed");
  boost::urls::encoding_opts decoding;
  decoding.space_as_plus = true;
  for (const auto& param : *parsed) {
    std::string name = param.key.decode(decoding);
    std::string value = param.value.decode(decoding);
    // Both are echoed in error messages, which are JSON and so must be UTF-8: bytes that are
    // not are refused without being repeated.
    if (!utf8::is_valid(name) || !utf8::is_valid(value)) {
      return invalid("Query parameter names and values must be UTF-8 once percent-decoded");
    }
    bool is_known = false;
    for (std::string_view k : known) is_known = is_known || k == name;
    if (!is_known) return invalid(format("unknown query parameter '{}'", name), name);
    out.push_back({std::move(name), std::move(value)});
  }
  return out;
}

// ---- the handlers -----------------------------------------------------------------------------

class admin_api {
 public:
  admin_api(tenancy& tenants, admin_options options) : tenants_(tenants) {
    if (!options.admin_token.empty()) token_digest_ = sha256(options.admin_token);
  }

  // Null when the caller may go on; else the answer to send.
  std::optional<response> check(const exchange& ex) const {
    if (!token_digest_) {
      return error_response(http::status::forbidden,
                            "The admin API is disabled: start the server with --admin-token (or EDGE_ADMIN_TOKEN) "
                            "to enable it",
                            "invalid_request_error", std::nullopt, "admin_api_disabled");
    }
    const std::string_view header = ex.req()[http::field::authorization];
    const std::string_view token = bearer_token(header);
    // Digests, so that neither the contents nor the length of the token leak by timing.
    if (token.empty() || !constant_time_equal(sha256(token), *token_digest_)) {
      response res = error_response(
          http::status::unauthorized,
          header.empty() ? "The admin API needs the admin token: \"Authorization: Bearer <admin token>\""
                         : "Incorrect admin token",
          "invalid_request_error", std::nullopt, "invalid_admin_token");
      res.set(http::field::www_authenticate, "Bearer");
      return res;
    }
    return std::nullopt;
  }

  audit_context who(const exchange& ex) const { return {"admin", ex.request_id()}; }
  unix_time now() const { return to_unix_seconds(tenants_.clock().system_time()); }

  response create_tenant(const exchange& ex) {
    auto parsed = parse_tenant_create(ex.req().body());
    if (auto* error = std::get_if<admin_request_error>(&parsed)) return invalid(error->message, param_of(*error));
    auto created = tenants_.store().create_tenant(std::move(std::get<tenant_record>(parsed)), who(ex));
    if (!created.ok()) return from_status(created.error());
    log_.info("tenant \"{}\" created ({})", created->id, ex.request_id());
    return json_response(http::status::created, to_json(*created));
  }

  response list_tenants() {
    auto tenants = tenants_.store().list_tenants();
    if (!tenants.ok()) return from_status(tenants.error());
    json::array data;
    for (const auto& t : *tenants) data.push_back(to_json(t));
    return json_response(http::status::ok, list_of(std::move(data)));
  }

  response get_tenant(const exchange& ex) {
    auto tenant = tenants_.store().get_tenant(ex.path_param("id"));
    if (!tenant.ok()) return from_status(tenant.error());
    return json_response(http::status::ok, to_json(*tenant));
  }

  response patch_tenant(const exchange& ex) {
    const std::string_view id = ex.path_param("id");
    auto parsed = parse_tenant_patch(ex.req().body(), id);
    if (auto* error = std::get_if<admin_request_error>(&parsed)) return invalid(error->message, param_of(*error));
    auto updated = tenants_.store().update_tenant(id, std::get<tenant_patch>(parsed), who(ex));
    if (!updated.ok()) return from_status(updated.error());
    log_.info("tenant \"{}\" updated ({})", id, ex.request_id());
    return json_response(http::status::ok, to_json(*updated));
  }

  response delete_tenant(const exchange& ex) {
    const std::string id(ex.path_param("id"));
    if (status deleted = tenants_.store().delete_tenant(id, who(ex)); !deleted.ok()) return from_status(deleted);
    log_.info("tenant \"{}\" deleted ({})", id, ex.request_id());
    json::object body;
    body["id"] = id;
    body["object"] = "tenant";
    body["deleted"] = true;
    return json_response(http::status::ok, body);
  }

  response create_key(const exchange& ex) {
    auto parsed = parse_key_create(ex.req().body());
    if (auto* error = std::get_if<admin_request_error>(&parsed)) return invalid(error->message, param_of(*error));
    const key_create_params& params = std::get<key_create_params>(parsed);
    const unix_time now = this->now();
    std::optional<unix_time> expires_at = params.expires_at;
    if (params.expires_in) expires_at = now + *params.expires_in;
    if (expires_at && *expires_at <= now) return invalid("'expires_at' must be in the future", "expires_at");
    auto issued = tenants_.store().create_key(ex.path_param("id"), expires_at, who(ex));
    if (!issued.ok()) return from_status(issued.error());
    log_.info("API key {} created for tenant \"{}\" ({})", issued->record.id, issued->record.tenant_id,
              ex.request_id());
    json::object body = to_json(issued->record, now);
    body["key"] = issued->key;  // the only time the secret leaves the server
    return json_response(http::status::created, body);
  }

  response list_keys(const exchange& ex) {
    auto keys = tenants_.store().list_keys(ex.path_param("id"));
    if (!keys.ok()) return from_status(keys.error());
    const unix_time now = this->now();
    json::array data;
    for (const auto& k : *keys) data.push_back(to_json(k, now));
    return json_response(http::status::ok, list_of(std::move(data)));
  }

  response revoke_key(const exchange& ex) {
    auto key = tenants_.store().revoke_key(ex.path_param("key_id"), who(ex));
    if (!key.ok()) return from_status(key.error());
    log_.info("API key {} of tenant \"{}\" revoked ({})", key->id, key->tenant_id, ex.request_id());
    return json_response(http::status::ok, to_json(*key, now()));
  }

  response usage(const exchange& ex) {
    auto query = read_query(ex.query(), {"from", "to"});
    if (auto* error = std::get_if<response>(&query)) return std::move(*error);
    const unix_time now = this->now();
    unix_time from = now - ((now % seconds_per_day) + seconds_per_day) % seconds_per_day;  // today, 00:00 UTC
    unix_time to = now + 1;
    for (const auto& [name, value] : std::get<std::vector<query_param>>(query)) {
      auto t = parse_utc(value);
      if (!t.ok()) return invalid(format("'{}': {}", name, t.error().message()), name);
      (name == "from" ? from : to) = *t;
    }
    if (from >= to) return invalid("'from' must be before 'to'", "from");
    const std::string id(ex.path_param("id"));
    if (auto tenant = tenants_.store().get_tenant(id); !tenant.ok()) return from_status(tenant.error());
    // What was recorded up to now is in the rows this answer reads.
    if (status flushed = tenants_.ledger().flush(); !flushed.ok()) return from_status(flushed);
    auto rows = tenants_.store().usage(id, from, to);
    if (!rows.ok()) return from_status(rows.error());
    json::array data;
    usage_counts total;
    for (const auto& row : *rows) {
      data.push_back(to_json(row));
      total += row.counts;
    }
    json::object body = list_of(std::move(data));
    body["tenant"] = id;
    body["from"] = format_utc(hour_start_of(from));
    body["to"] = format_utc(to);
    body["total"] = to_json(total);
    return json_response(http::status::ok, body);
  }

  response audit(const exchange& ex) {
    auto query = read_query(ex.query(), {"limit", "before"});
    if (auto* error = std::get_if<response>(&query)) return std::move(*error);
    std::size_t limit = default_audit_limit;
    std::optional<std::int64_t> before;
    for (const auto& [name, value] : std::get<std::vector<query_param>>(query)) {
      std::int64_t n = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
      if (ec != std::errc{} || end != value.data() + value.size() || n < 1 ||
          (name == "limit" && n > static_cast<std::int64_t>(max_audit_limit))) {
        return invalid(name == "limit" ? format("'limit' must be a whole number from 1 to {}", max_audit_limit)
                                       : std::string("'before' must be an audit entry id (a positive whole number)"),
                       name);
      }
      if (name == "limit") limit = static_cast<std::size_t>(n);
      else before = n;
    }
    auto entries = tenants_.store().audit(limit + 1, before);
    if (!entries.ok()) return from_status(entries.error());
    const bool more = entries->size() > limit;
    if (more) entries->pop_back();
    json::array data;
    for (const auto& e : *entries) data.push_back(to_json(e));
    json::object body = list_of(std::move(data));
    body["has_more"] = more;
    return json_response(http::status::ok, body);
  }

 private:
  static std::optional<std::string_view> param_of(const admin_request_error& e) {
    return e.param.empty() ? std::nullopt : std::optional<std::string_view>(e.param);
  }

  tenancy& tenants_;
  std::optional<sha256_digest> token_digest_;
  logger log_{"admin"};
};

void add(router& routes, http::verb method, std::string pattern, const std::shared_ptr<admin_api>& api,
         std::function<response(admin_api&, const exchange&)> handle) {
  routes.add(method, std::move(pattern), [api, handle = std::move(handle)](exchange& ex) -> asio::awaitable<void> {
    if (auto denied = api->check(ex)) {
      co_await ex.respond(std::move(*denied));
      co_return;
    }
    co_await ex.respond(handle(*api, ex));
  });
}

}  // namespace

std::variant<tenant_record, admin_request_error> parse_tenant_create(std::string_view body) {
  tenant_record tenant;
  bool has_id = false;
  auto error = read_body(body, false, [&](std::string_view name, const json_value& v) -> field_error {
    if (name == "id") {
      EDGE_ASSIGN_OR_RETURN(const std::string_view id, v.as<std::string_view>());
      if (!is_valid_tenant_id(id)) return v.must_be(tenant_id_rule);
      tenant.id = std::string(id);
      has_id = true;
    } else if (name == "weight") {
      if (v.is_null()) return std::nullopt;
      return read_weight(v, tenant.weight);
    } else if (name == "quotas") {
      if (v.is_null()) return std::nullopt;
      return read_quotas(v, [&](std::string_view field) { return quota_slot(tenant.quotas, field); });
    } else {
      return unknown_field(name, "a tenant has id, weight and quotas");
    }
    return std::nullopt;
  });
  if (error) return *error;
  if (!has_id) return parse_error{"'id' is required", "id"};
  return tenant;
}

std::variant<tenant_patch, admin_request_error> parse_tenant_patch(std::string_view body, std::string_view tenant_id) {
  tenant_patch patch;
  tenant_quotas values;   // the quota fields given, and their values
  tenant_quotas present;  // 1 for each quota field given (its value may be null)
  auto error = read_body(body, false, [&](std::string_view name, const json_value& v) -> field_error {
    if (name == "weight") {
      double w = 0;
      if (auto e = read_weight(v, w)) return e;
      patch.weight = w;
    } else if (name == "quotas") {
      return read_quotas(v, [&](std::string_view field) -> std::optional<std::int64_t>* {
        std::optional<std::int64_t>* slot = quota_slot(values, field);
        if (slot != nullptr) *quota_slot(present, field) = 1;
        return slot;
      });
    } else if (name == "id") {
      // The body may repeat the tenant's id, never change it: it names the tenant in its keys
      // and usage.
      EDGE_ASSIGN_OR_RETURN(const std::string_view id, v.as<std::string_view>());
      if (id != tenant_id) return v.error("cannot be changed");
    } else {
      return unknown_field(name, "a tenant has weight and quotas");
    }
    return std::nullopt;
  });
  if (error) return *error;
  if (present.requests_per_minute) patch.requests_per_minute = values.requests_per_minute;
  if (present.tokens_per_minute) patch.tokens_per_minute = values.tokens_per_minute;
  if (present.max_concurrent) patch.max_concurrent = values.max_concurrent;
  if (present.daily_tokens) patch.daily_tokens = values.daily_tokens;
  if (present.max_tokens_per_request) patch.max_tokens_per_request = values.max_tokens_per_request;
  return patch;
}

std::variant<key_create_params, admin_request_error> parse_key_create(std::string_view body) {
  key_create_params params;
  auto error = read_body(body, true, [&](std::string_view name, const json_value& v) -> field_error {
    if (v.is_null()) return std::nullopt;
    if (name == "expires_in") {
      EDGE_ASSIGN_OR_RETURN(const std::int64_t seconds, v.as<std::int64_t>("a whole number of seconds"));
      if (seconds < 1 || seconds > max_key_lifetime_seconds) {
        return v.must_be(format("from 1 to {} seconds", max_key_lifetime_seconds));
      }
      params.expires_in = seconds;
    } else if (name == "expires_at") {
      if (v.type() == simdjson::dom::element_type::STRING) {
        auto parsed = parse_utc(*v.as<std::string_view>());
        if (!parsed.ok()) return json_error(format("'{}': {}", name, parsed.error().message()), std::string(name));
        params.expires_at = *parsed;
      } else {
        EDGE_ASSIGN_OR_RETURN(params.expires_at,
                              v.as<std::int64_t>("unix seconds or a UTC time such as \"2026-05-01T13:00:00Z\""));
      }
    } else {
      return unknown_field(name, "a key takes expires_in or expires_at");
    }
    return std::nullopt;
  });
  if (error) return *error;
  if (params.expires_in && params.expires_at) {
    return admin_request_error{"give 'expires_in' or 'expires_at', not both", "expires_at"};
  }
  return params;
}

void add_admin_routes(router& routes, tenancy& tenants, admin_options options) {
  auto api = std::make_shared<admin_api>(tenants, std::move(options));
  using v = http::verb;
  add(routes, v::post, "/admin/v1/tenants", api, [](admin_api& a, const exchange& ex) { return a.create_tenant(ex); });
  add(routes, v::get, "/admin/v1/tenants", api, [](admin_api& a, const exchange&) { return a.list_tenants(); });
  add(routes, v::get, "/admin/v1/tenants/{id}", api, [](admin_api& a, const exchange& ex) { return a.get_tenant(ex); });
  add(routes, v::patch, "/admin/v1/tenants/{id}", api,
      [](admin_api& a, const exchange& ex) { return a.patch_tenant(ex); });
  add(routes, v::delete_, "/admin/v1/tenants/{id}", api,
      [](admin_api& a, const exchange& ex) { return a.delete_tenant(ex); });
  add(routes, v::post, "/admin/v1/tenants/{id}/keys", api,
      [](admin_api& a, const exchange& ex) { return a.create_key(ex); });
  add(routes, v::get, "/admin/v1/tenants/{id}/keys", api,
      [](admin_api& a, const exchange& ex) { return a.list_keys(ex); });
  add(routes, v::delete_, "/admin/v1/keys/{key_id}", api,
      [](admin_api& a, const exchange& ex) { return a.revoke_key(ex); });
  add(routes, v::get, "/admin/v1/tenants/{id}/usage", api, [](admin_api& a, const exchange& ex) { return a.usage(ex); });
  add(routes, v::get, "/admin/v1/audit", api, [](admin_api& a, const exchange& ex) { return a.audit(ex); });
}

}  // namespace edge::gateway
