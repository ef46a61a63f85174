#include "edge/gateway/tenancy/admin_request.h"

#include <boost/url/parse_query.hpp>

#include <charconv>

#include "edge/common/format.h"
#include "edge/common/json_fields.h"
#include "edge/common/utf8.h"

namespace edge::gateway {
namespace {

// Longest a key may live when created with expires_in: ten years.
constexpr std::int64_t max_key_lifetime_seconds = 10LL * 366 * seconds_per_day;

using parse_error = admin_request_error;
// What each field reader answers: nothing, or the first problem, an error naming the field.
using field_error = std::optional<json_error>;

// A value of `kind`: a whole number from its least to max_quota_value, or null (unlimited).
field_error read_quota(const quota_kind& kind, const json_value& v, std::optional<std::int64_t>& out) {
  if (v.is_null()) {
    out.reset();
    return std::nullopt;
  }
  EDGE_ASSIGN_OR_RETURN(const std::int64_t n, v.as<std::int64_t>("a whole number or null (unlimited)"));
  if (n < kind.least || n > max_quota_value) {
    return v.must_be(format("from {} to {}, or null for unlimited", kind.least, max_quota_value));
  }
  out = n;
  return std::nullopt;
}

field_error read_weight(const json_value& v, double& out) {
  EDGE_ASSIGN_OR_RETURN(out, v.as<double>());
  if (!is_valid_tenant_weight(out)) return v.must_be(tenant_weight_rule());
  return std::nullopt;
}

// "a, b and c" of the quota kinds' names.
std::string quota_names() {
  std::string out;
  for (const quota_kind& kind : quota_kinds) {
    if (!out.empty()) out += &kind == &quota_kinds.back() ? " and " : ", ";
    out += kind.name;
  }
  return out;
}

// The quotas object: `given(kind, value)` takes each field's value (nullopt: unlimited).
template <class F>
field_error read_quotas(const json_value& v, F&& given) {
  EDGE_ASSIGN_OR_RETURN(const json_fields quotas, v.as<json_fields>());
  for (const auto [name, value] : quotas) {
    const quota_kind* kind = find_quota_kind(name);
    if (kind == nullptr) {
      return json_error(format("unknown quota '{}': the quotas are {}", name, quota_names()), value.path().str());
    }
    std::optional<std::int64_t> limit;
    if (auto error = read_quota(*kind, value, limit)) return error;
    given(*kind, limit);
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

}  // namespace

// ---- bodies -----------------------------------------------------------------------------------

std::variant<tenant_record, admin_request_error> parse_tenant_create(std::string_view body) {
  tenant_record tenant;
  bool has_id = false;
  auto error = read_body(body, false, [&](std::string_view name, const json_value& v) -> field_error {
    if (name == "id") {
      EDGE_ASSIGN_OR_RETURN(const std::string_view id, v.as<std::string_view>());
      if (!is_valid_tenant_id(id)) {
        return v.must_be("1 to 64 characters of A-Z, a-z, 0-9, '.', '_' and '-', starting with a letter or digit");
      }
      tenant.id = std::string(id);
      has_id = true;
    } else if (name == "weight") {
      if (v.is_null()) return std::nullopt;
      return read_weight(v, tenant.weight);
    } else if (name == "quotas") {
      if (v.is_null()) return std::nullopt;
      return read_quotas(v, [&](const quota_kind& kind, std::optional<std::int64_t> limit) {
        kind.of(tenant.quotas) = limit;
      });
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
  auto error = read_body(body, false, [&](std::string_view name, const json_value& v) -> field_error {
    if (name == "weight") {
      double w = 0;
      if (auto e = read_weight(v, w)) return e;
      patch.weight = w;
    } else if (name == "quotas") {
      return read_quotas(v, [&](const quota_kind& kind, std::optional<std::int64_t> limit) {
        patch.quota(kind) = limit;
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
  return patch;
}

std::variant<std::optional<unix_time>, admin_request_error> key_create_params::expiry(unix_time now) const {
  std::optional<unix_time> at = expires_at;
  if (expires_in) at = now + *expires_in;
  if (at && *at <= now) return admin_request_error{"'expires_at' must be in the future", "expires_at"};
  return at;
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

// ---- query strings ----------------------------------------------------------------------------

std::variant<std::vector<query_param>, admin_request_error> parse_query(std::string_view query,
                                                                        std::initializer_list<std::string_view> known) {
  std::vector<query_param> out;
  if (query.empty()) return out;
  // Boost.URL 1.81's parse_query reads the last value up to a NUL, past the end of the view it
  // is given (the query sits inside the request target): parse a NUL-terminated copy.
  const std::string text(query);
  auto parsed = boost::urls::parse_query(text);
  if (!parsed) return admin_request_error{"The query string is malformed", ""};
  boost::urls::encoding_opts decoding;
  decoding.space_as_plus = true;
  for (const auto& param : *parsed) {
    std::string name = param.key.decode(decoding);
    std::string value = param.value.decode(decoding);
    // Both are echoed in error messages, which are JSON and so must be UTF-8: bytes that are
    // not are refused without being repeated.
    if (!utf8::is_valid(name) || !utf8::is_valid(value)) {
      return admin_request_error{"Query parameter names and values must be UTF-8 once percent-decoded", ""};
    }
    bool is_known = false;
    for (std::string_view k : known) is_known = is_known || k == name;
    if (!is_known) return admin_request_error{format("unknown query parameter '{}'", name), name};
    out.push_back({std::move(name), std::move(value)});
  }
  return out;
}

std::variant<usage_window, admin_request_error> parse_usage_query(std::string_view query, unix_time now,
                                                                  bool by_key) {
  auto params = by_key ? parse_query(query, {"from", "to", "key"}) : parse_query(query, {"from", "to"});
  if (auto* error = std::get_if<admin_request_error>(&params)) return std::move(*error);
  usage_window window;
  window.from = now - ((now % seconds_per_day) + seconds_per_day) % seconds_per_day;  // today, 00:00 UTC
  window.to = now + 1;
  for (const auto& [name, value] : std::get<std::vector<query_param>>(params)) {
    if (name == "key") {
      window.key_id = value;
      continue;
    }
    auto t = parse_utc(value);
    if (!t.ok()) return admin_request_error{format("'{}': {}", name, t.error().message()), name};
    (name == "from" ? window.from : window.to) = *t;
  }
  if (window.from >= window.to) return admin_request_error{"'from' must be before 'to'", "from"};
  return window;
}

std::variant<audit_page, admin_request_error> parse_audit_query(std::string_view query) {
  auto params = parse_query(query, {"limit", "before"});
  if (auto* error = std::get_if<admin_request_error>(&params)) return std::move(*error);
  audit_page page;
  for (const auto& [name, value] : std::get<std::vector<query_param>>(params)) {
    std::int64_t n = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc{} || end != value.data() + value.size() || n < 1 ||
        (name == "limit" && n > static_cast<std::int64_t>(max_audit_limit))) {
      return admin_request_error{name == "limit" ? format("'limit' must be a whole number from 1 to {}", max_audit_limit)
                                                 : std::string("'before' must be an audit entry id (a positive whole "
                                                               "number)"),
                                 name};
    }
    if (name == "limit") page.limit = static_cast<std::size_t>(n);
    else page.before = n;
  }
  return page;
}

}  // namespace edge::gateway
