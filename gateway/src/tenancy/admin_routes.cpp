#include "edge/gateway/tenancy/admin_routes.h"

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>

#include <functional>

#include "edge/common/log.h"
#include "edge/common/sha256.h"
#include "edge/gateway/http/json_response.h"
#include "edge/gateway/tenancy/tenancy.h"
#include "edge/gateway/tenancy/tenant_json.h"
#include "console_files.h"

namespace edge::gateway {
namespace {

namespace json = boost::json;

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
    const auto expiry = params.expiry(now);
    if (auto* error = std::get_if<admin_request_error>(&expiry)) return invalid(error->message, param_of(*error));
    auto issued = tenants_.store().create_key(ex.path_param("id"), std::get<std::optional<unix_time>>(expiry), who(ex));
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
    const auto window = parse_usage_query(ex.query(), now());
    if (const auto* error = std::get_if<admin_request_error>(&window)) return invalid(error->message, param_of(*error));
    const unix_time from = std::get<usage_window>(window).from;
    const unix_time to = std::get<usage_window>(window).to;
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

  // The quota kinds' table, as the console builds its forms from it.
  static response quota_kinds_table() {
    json::array data;
    for (const quota_kind& kind : quota_kinds) {
      json::object row;
      row["name"] = kind.name;
      row["unit"] = kind.unit == quota_unit::bytes ? "bytes" : "count";
      row["least"] = kind.least;
      row["refuses"] = kind.judged();
      row["help"] = kind.help;
      data.push_back(std::move(row));
    }
    json::object body = list_of(std::move(data));
    body["max"] = max_quota_value;
    return json_response(http::status::ok, body);
  }

  // What the tenant's requests used over a window, per API key, model and API.
  response spend(const exchange& ex) {
    const auto window = parse_usage_query(ex.query(), now(), /*by_key=*/true);
    if (const auto* error = std::get_if<admin_request_error>(&window)) return invalid(error->message, param_of(*error));
    const auto& [from, to, key_id] = std::get<usage_window>(window);
    const std::string id(ex.path_param("id"));
    if (auto tenant = tenants_.store().get_tenant(id); !tenant.ok()) return from_status(tenant.error());
    if (status flushed = tenants_.ledger().flush(); !flushed.ok()) return from_status(flushed);
    auto rows = tenants_.store().spend(id, from, to, key_id);
    if (!rows.ok()) return from_status(rows.error());
    json::array data;
    usage_counts total;
    for (const spend_row& row : *rows) {
      json::object item = to_json(row.counts);
      item.erase("rejections");  // counted per tenant, in the usage rows
      item["key_id"] = row.labels.key_id;
      item["model"] = row.labels.model;
      item["api"] = row.labels.api;
      data.push_back(std::move(item));
      total += row.counts;
    }
    json::object body = list_of(std::move(data));
    body["tenant"] = id;
    body["from"] = format_utc(hour_start_of(from));
    body["to"] = format_utc(to);
    json::object sum = to_json(total);
    sum.erase("rejections");
    body["total"] = std::move(sum);
    return json_response(http::status::ok, body);
  }

  response audit(const exchange& ex) {
    const auto page = parse_audit_query(ex.query());
    if (const auto* error = std::get_if<admin_request_error>(&page)) return invalid(error->message, param_of(*error));
    const auto [limit, before] = std::get<audit_page>(page);
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

// The handlers call the tenant store, which may wait on its database (PostgreSQL: up to
// --tenant-store-timeout): they run on the tenancy's store threads, never on an HTTP thread.
void add(router& routes, tenancy& tenants, http::verb method, std::string pattern,
         const std::shared_ptr<admin_api>& api, std::function<response(admin_api&, const exchange&)> handle) {
  routes.add(method, std::move(pattern),
             [&tenants, api, handle = std::move(handle)](exchange& ex) -> asio::awaitable<void> {
               if (auto denied = api->check(ex)) {
                 co_await ex.respond(std::move(*denied));
                 co_return;
               }
               std::optional<response> answer;
               const bool ran = co_await tenants.store_call([&] { answer = handle(*api, ex); });
               if (!ran) {
                 answer = error_response(http::status::service_unavailable,
                                         "Too many tenant store calls are waiting; please try again in 1s",
                                         "server_error");
                 answer->set(http::field::retry_after, "1");
               }
               co_await ex.respond(std::move(*answer));
             });
}

std::string_view content_type_of(std::string_view name) {
  if (name.ends_with(".html")) return "text/html; charset=utf-8";
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (name.ends_with(".css")) return "text/css; charset=utf-8";
  if (name.ends_with(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

// The console: static files that call the admin API from the browser with the admin token
// (kept in the tab's session storage, sent as a bearer token: no cookie, so no request of
// another site can carry it). Nothing but these files runs: no inline script or style, no
// other origin, no framing.
void add_console_routes(router& routes) {
  for (const console::embedded_file& file : console::embedded_files()) {
    const std::string pattern = file.name == "index.html" ? "/admin" : "/admin/" + std::string(file.name);
    routes.add(http::verb::get, pattern, [file](exchange& ex) -> asio::awaitable<void> {
      response res{http::status::ok, 11};
      res.set(http::field::content_type, content_type_of(file.name));
      res.set("Content-Security-Policy",
              "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
              "base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
      res.set(http::field::x_frame_options, "DENY");
      res.set("X-Content-Type-Options", "nosniff");
      res.set("Referrer-Policy", "no-referrer");
      res.set(http::field::cache_control, "no-cache");
      res.body() = std::string(file.bytes);
      res.prepare_payload();
      co_await ex.respond(std::move(res));
    });
  }
}

}  // namespace

void add_admin_routes(router& routes, tenancy& tenants, admin_options options) {
  add_console_routes(routes);
  auto api = std::make_shared<admin_api>(tenants, std::move(options));
  using v = http::verb;
  add(routes, tenants, v::post, "/admin/v1/tenants", api, [](admin_api& a, const exchange& ex) { return a.create_tenant(ex); });
  add(routes, tenants, v::get, "/admin/v1/tenants", api, [](admin_api& a, const exchange&) { return a.list_tenants(); });
  add(routes, tenants, v::get, "/admin/v1/tenants/{id}", api, [](admin_api& a, const exchange& ex) { return a.get_tenant(ex); });
  add(routes, tenants, v::patch, "/admin/v1/tenants/{id}", api,
      [](admin_api& a, const exchange& ex) { return a.patch_tenant(ex); });
  add(routes, tenants, v::delete_, "/admin/v1/tenants/{id}", api,
      [](admin_api& a, const exchange& ex) { return a.delete_tenant(ex); });
  add(routes, tenants, v::post, "/admin/v1/tenants/{id}/keys", api,
      [](admin_api& a, const exchange& ex) { return a.create_key(ex); });
  add(routes, tenants, v::get, "/admin/v1/tenants/{id}/keys", api,
      [](admin_api& a, const exchange& ex) { return a.list_keys(ex); });
  add(routes, tenants, v::delete_, "/admin/v1/keys/{key_id}", api,
      [](admin_api& a, const exchange& ex) { return a.revoke_key(ex); });
  add(routes, tenants, v::get, "/admin/v1/tenants/{id}/usage", api, [](admin_api& a, const exchange& ex) { return a.usage(ex); });
  add(routes, tenants, v::get, "/admin/v1/tenants/{id}/spend", api,
      [](admin_api& a, const exchange& ex) { return a.spend(ex); });
  add(routes, tenants, v::get, "/admin/v1/audit", api, [](admin_api& a, const exchange& ex) { return a.audit(ex); });
  add(routes, tenants, v::get, "/admin/v1/quota-kinds", api,
      [](admin_api&, const exchange&) { return admin_api::quota_kinds_table(); });
}

}  // namespace edge::gateway
