// `edgeinfer admin`: a client of a running server's admin API (/admin/v1/), one subcommand per
// call. Prints the server's JSON answer (indented) on stdout; an error answer is printed on
// stderr with its status, and the exit code is 1.
//
//   edgeinfer admin tenants list | get ID | delete ID
//   edgeinfer admin tenants create ID [--weight W] [--KIND N for each quota kind: its name with '-'
//                                     for '_', as --requests-per-minute; quota_kinds.h lists them;
//                                     a size in bytes may have a unit, as --kv-host-cache-bytes 2GiB]
//   edgeinfer admin tenants update ID [same options; a limit of "unlimited" removes it]
//   edgeinfer admin keys create TENANT [--expires-in 30d | --expires-at 2026-12-31] [--state-dir DIR]
//   edgeinfer admin keys list TENANT | revoke KEY_ID
//   edgeinfer admin usage TENANT [--from TIME] [--to TIME]
//   edgeinfer admin spend TENANT [--from TIME] [--to TIME] [--key KEY_ID]
//   edgeinfer admin audit [--limit N] [--before ID]
//   edgeinfer admin migrate-store [--state-dir DIR] --to postgresql://…
//
// The server is --url (EDGE_URL, default http://127.0.0.1:8080); the token is --admin-token
// (EDGE_ADMIN_TOKEN). `migrate-store` calls no server: it copies a stopped server's SQLite
// tenant store into an empty PostgreSQL one. Neither does `keys create --state-dir DIR`: it
// makes the key in a stopped server's SQLite store (the way back in when no admin token was set
// and the first key is lost).
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/url/encode.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/rfc/unreserved_chars.hpp>

#include <array>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "edge/common/config.h"
#include "edge/common/format.h"
#include "edge/common/time_source.h"
#include "edge/gateway/tenancy/admin_request.h"
#include "edge/gateway/tenancy/quota_kinds.h"
#include "edge/gateway/tenancy/tenant_json.h"
#include "edge/gateway/tenancy/tenant_store.h"

namespace edge::cli {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace json = boost::json;
using tcp = asio::ip::tcp;

constexpr std::string_view default_url = "http://127.0.0.1:8080";
constexpr std::string_view unlimited = "unlimited";

// What the subcommands put on the command line; filled by CLI11 as it parses.
struct admin_invocation {
  std::string id;  // tenant id, or key id for `keys revoke`
  std::optional<double> weight;
  // Quota options as given, one per quota kind (in the order of quota_kinds): a number, or
  // "unlimited".
  std::array<std::optional<std::string>, gateway::quota_kinds.size()> quotas;
  std::optional<std::string> expires_in;
  std::optional<std::string> expires_at;
  std::optional<std::string> from;
  std::optional<std::string> to;
  std::optional<std::string> key_id;  // spend --key
  std::optional<std::int64_t> limit;
  std::optional<std::int64_t> before;
  // migrate-store: from the SQLite store in `state_dir` to the PostgreSQL store `store_url`.
  bool migrate = false;
  std::string state_dir = "state";
  std::string store_url;
  // keys create --state-dir: the SQLite store to make the key in, instead of calling a server.
  std::optional<std::string> key_store_dir;

  // The call the chosen subcommand makes; set by the subcommand's callback.
  http::verb method = http::verb::get;
  std::string target;
  std::optional<json::object> body;
  std::string error;  // a usage mistake found while building the call
};

struct http_answer {
  unsigned status = 0;
  std::string body;
};

// ---- HTTP -------------------------------------------------------------------------------------

struct server_address {
  std::string host;
  std::string port;
  std::string prefix;  // a path the admin API sits under, e.g. behind a proxy; "" usually
};

result<server_address> parse_server_url(std::string_view text) {
  const std::string copy(text);  // Boost.URL 1.81 parsers may read up to a NUL past a view's end
  auto url = boost::urls::parse_uri(copy);
  if (!url) return invalid_argument(format("--url \"{}\" is not a URL such as {}", text, default_url));
  if (url->scheme() != "http") {
    return invalid_argument(format("--url \"{}\": only http:// is supported (put TLS in front of the client side with a "
                                   "proxy if needed)",
                                   text));
  }
  server_address out;
  out.host = std::string(url->encoded_host());
  if (out.host.empty()) return invalid_argument(format("--url \"{}\" has no host", text));
  if (out.host.front() == '[' && out.host.back() == ']') out.host = out.host.substr(1, out.host.size() - 2);
  out.port = url->has_port() ? std::string(url->port()) : "80";
  out.prefix = std::string(url->encoded_path());
  while (!out.prefix.empty() && out.prefix.back() == '/') out.prefix.pop_back();
  return out;
}

asio::awaitable<void> exchange_once(const server_address& server, http::request<http::string_body> req,
                                    std::chrono::milliseconds timeout, result<http_answer>& out) {
  auto executor = co_await asio::this_coro::executor;
  tcp::resolver resolver(executor);
  beast::tcp_stream stream(executor);
  const std::string where = format("http://{}:{}", server.host, server.port);
  auto [resolve_ec, endpoints] =
      co_await resolver.async_resolve(server.host, server.port, asio::as_tuple(asio::use_awaitable));
  if (resolve_ec) {
    out = unavailable(format("cannot resolve {}: {}", server.host, resolve_ec.message()));
    co_return;
  }
  stream.expires_after(timeout);
  auto [connect_ec, endpoint] = co_await stream.async_connect(endpoints, asio::as_tuple(asio::use_awaitable));
  if (connect_ec) {
    out = unavailable(format("cannot reach {}: {}", where, connect_ec.message()));
    co_return;
  }
  stream.expires_after(timeout);
  auto [write_ec, written] = co_await http::async_write(stream, req, asio::as_tuple(asio::use_awaitable));
  if (write_ec) {
    out = unavailable(format("sending to {} failed: {}", where, write_ec.message()));
    co_return;
  }
  beast::flat_buffer buffer;
  http::response<http::string_body> res;
  stream.expires_after(timeout);
  auto [read_ec, read] = co_await http::async_read(stream, buffer, res, asio::as_tuple(asio::use_awaitable));
  if (read_ec) {
    out = unavailable(format("no answer from {}: {}", where, read_ec.message()));
    co_return;
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
  out = http_answer{res.result_int(), std::move(res.body())};
}

result<http_answer> call(const server_address& server, const std::string& token, http::verb method,
                         const std::string& target, const std::optional<json::object>& body,
                         std::chrono::milliseconds timeout) {
  http::request<http::string_body> req{method, server.prefix + target, 11};
  req.set(http::field::host, server.host + ":" + server.port);
  req.set(http::field::user_agent, "edgeinfer-admin");
  req.set(http::field::authorization, "Bearer " + token);
  req.set(http::field::accept, "application/json");
  if (body) {
    req.set(http::field::content_type, "application/json");
    req.body() = json::serialize(*body);
  }
  req.keep_alive(false);
  req.prepare_payload();
  asio::io_context ioc;
  result<http_answer> out = internal_error("no answer");
  asio::co_spawn(ioc, exchange_once(server, std::move(req), timeout, out), asio::detached);
  ioc.run();
  return out;
}

// ---- output -----------------------------------------------------------------------------------

void pretty(const json::value& v, std::string& out, int depth) {
  const std::string indent(static_cast<std::size_t>(depth) * 2, ' ');
  const std::string inner(static_cast<std::size_t>(depth + 1) * 2, ' ');
  if (v.is_object() && !v.get_object().empty()) {
    out += "{\n";
    bool first = true;
    for (const auto& [key, value] : v.get_object()) {
      if (!first) out += ",\n";
      first = false;
      out += inner + json::serialize(json::value(key)) + ": ";
      pretty(value, out, depth + 1);
    }
    out += "\n" + indent + "}";
  } else if (v.is_array() && !v.get_array().empty()) {
    out += "[\n";
    bool first = true;
    for (const auto& value : v.get_array()) {
      if (!first) out += ",\n";
      first = false;
      out += inner;
      pretty(value, out, depth + 1);
    }
    out += "\n" + indent + "]";
  } else {
    out += json::serialize(v);
  }
}

int report(const http_answer& answer) {
  boost::system::error_code ec;
  const json::value body = json::parse(answer.body, ec);
  if (answer.status >= 200 && answer.status < 300) {
    std::string text;
    if (ec) text = answer.body;
    else pretty(body, text, 0);
    std::fprintf(stdout, "%s\n", text.c_str());
    return 0;
  }
  std::string message = answer.body;
  if (!ec && body.is_object()) {
    if (const auto* error = body.get_object().if_contains("error"); error && error->is_object()) {
      if (const auto* m = error->get_object().if_contains("message"); m && m->is_string()) {
        message = std::string(m->get_string());
      }
    }
  }
  std::fprintf(stderr, "edgeinfer admin: HTTP %u: %s\n", answer.status, message.c_str());
  return 1;
}

// ---- building the calls -----------------------------------------------------------------------

std::string percent_encoded(std::string_view text) {
  const std::string copy(text);  // Boost.URL 1.81 may read up to a NUL past a view's end
  return boost::urls::encode(copy, boost::urls::unreserved_chars);
}

std::string path_segment(std::string_view text) { return percent_encoded(text); }
std::string query_value(std::string_view text) { return percent_encoded(text); }

// "30d", "12h", "90m", "3600" or "3600s": seconds.
std::optional<std::int64_t> parse_lifetime(std::string_view text) {
  if (text.ends_with("d")) {
    std::int64_t days = 0;
    const std::string_view digits = text.substr(0, text.size() - 1);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), days);
    if (ec != std::errc{} || end != digits.data() + digits.size() || days < 1) return std::nullopt;
    return days * 86400;
  }
  auto d = config::parse_duration(text);
  if (!d.ok() || d->count() < 1000) return std::nullopt;
  return d->count() / 1000;
}

// A quota kind's option: "--" and its name with '-' for '_'.
std::string quota_flag(const gateway::quota_kind& kind) {
  std::string flag = "--" + std::string(kind.name);
  for (char& c : flag) c = c == '_' ? '-' : c;
  return flag;
}

// What a kind's option takes, in the words of its help and its error.
std::string_view value_rule(const gateway::quota_kind& kind) {
  return kind.unit == gateway::quota_unit::bytes ? "a size in bytes (a whole number, or with a unit: 512MiB, 2GiB)"
                                                 : "a whole number";
}

// The value of a kind's option: a whole number, or for a size one with a unit, read as the
// serving commands read theirs (config::parse_bytes); nullopt when it is neither.
std::optional<std::int64_t> quota_value(const gateway::quota_kind& kind, std::string_view text) {
  std::int64_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec == std::errc{} && end == text.data() + text.size()) return n;
  if (kind.unit != gateway::quota_unit::bytes) return std::nullopt;
  auto bytes = config::parse_bytes(text);
  if (!bytes.ok()) return std::nullopt;
  return *bytes;
}

// The quotas object of a create/update body from the options given. In an update, "unlimited"
// becomes null (remove the limit); in a create it is the same as leaving the option out.

std::optional<std::string> quotas_json(const admin_invocation& in, bool update, json::object& out) {
  json::object quotas;
  for (const gateway::quota_kind& kind : gateway::quota_kinds) {
    const std::optional<std::string>& given = in.quotas[gateway::quota_kind_index(kind)];
    if (!given) continue;
    if (*given == unlimited) {
      if (update) quotas[kind.name] = nullptr;
      continue;
    }
    const std::optional<std::int64_t> n = quota_value(kind, *given);
    if (!n) return format("{} takes {} or \"unlimited\", not \"{}\"", quota_flag(kind), value_rule(kind), *given);
    quotas[kind.name] = *n;  // the server checks the range and says so
  }
  if (!quotas.empty()) out["quotas"] = std::move(quotas);
  return std::nullopt;
}

void add_quota_options(CLI::App& sub, admin_invocation& in) {
  sub.add_option("--weight", in.weight, "Share of the engine relative to other tenants (default 1)");
  for (const gateway::quota_kind& kind : gateway::quota_kinds) {
    sub.add_option(quota_flag(kind), in.quotas[gateway::quota_kind_index(kind)],
                   format("{}: {}, or \"unlimited\"", kind.help, value_rule(kind)));
  }
}

void define_subcommands(CLI::App& admin, const std::shared_ptr<admin_invocation>& in) {
  admin.require_subcommand(1, 1);
  const auto leaf = [](CLI::App& parent, const std::string& name, const std::string& help) -> CLI::App& {
    CLI::App* sub = parent.add_subcommand(name, help);
    sub->fallthrough();  // --url and --admin-token may come after the subcommand
    return *sub;
  };

  CLI::App& tenants = leaf(admin, "tenants", "List, show, create, update and delete tenants");
  tenants.require_subcommand(1, 1);
  leaf(tenants, "list", "All tenants").callback([in] { in->target = "/admin/v1/tenants"; });
  {
    CLI::App& get = leaf(tenants, "get", "One tenant");
    get.add_option("id", in->id, "Tenant id")->required();
    get.callback([in] { in->target = "/admin/v1/tenants/" + path_segment(in->id); });
  }
  {
    CLI::App& create = leaf(tenants, "create", "Create a tenant (limits left out are unlimited)");
    create.add_option("id", in->id, "Tenant id: 1-64 characters of A-Z a-z 0-9 . _ -")->required();
    add_quota_options(create, *in);
    create.callback([in] {
      in->method = http::verb::post;
      in->target = "/admin/v1/tenants";
      json::object body;
      body["id"] = in->id;
      if (in->weight) body["weight"] = *in->weight;
      if (auto error = quotas_json(*in, false, body)) in->error = *error;
      in->body = std::move(body);
    });
  }
  {
    CLI::App& update = leaf(tenants, "update", "Change a tenant's weight or limits (\"unlimited\" removes one)");
    update.add_option("id", in->id, "Tenant id")->required();
    add_quota_options(update, *in);
    update.callback([in] {
      in->method = http::verb::patch;
      in->target = "/admin/v1/tenants/" + path_segment(in->id);
      json::object body;
      if (in->weight) body["weight"] = *in->weight;
      if (auto error = quotas_json(*in, true, body)) in->error = *error;
      in->body = std::move(body);
    });
  }
  {
    CLI::App& remove = leaf(tenants, "delete", "Delete a tenant and its keys (its usage history stays)");
    remove.add_option("id", in->id, "Tenant id")->required();
    remove.callback([in] {
      in->method = http::verb::delete_;
      in->target = "/admin/v1/tenants/" + path_segment(in->id);
    });
  }

  CLI::App& keys = leaf(admin, "keys", "Create, list and revoke API keys");
  keys.require_subcommand(1, 1);
  {
    CLI::App& create = leaf(keys, "create", "Create an API key; its secret is shown this once");
    create.add_option("tenant", in->id, "Tenant id")->required();
    create.add_option("--expires-in", in->expires_in, "Lifetime: 30d, 12h, 90m, 3600s");
    create.add_option("--expires-at", in->expires_at, "Expiry: unix seconds, 2026-12-31 or 2026-12-31T12:00:00Z");
    create.add_option("--state-dir", in->key_store_dir,
                      "Make the key in this stopped server's tenant store (its --state-dir) instead of calling a "
                      "server; no admin token needed");
    create.callback([in] {
      in->method = http::verb::post;
      in->target = "/admin/v1/tenants/" + path_segment(in->id) + "/keys";
      json::object body;
      if (in->expires_in) {
        if (auto seconds = parse_lifetime(*in->expires_in)) body["expires_in"] = *seconds;
        else in->error = format("--expires-in takes a lifetime such as 30d, 12h or 3600s, not \"{}\"", *in->expires_in);
      }
      if (in->expires_at) body["expires_at"] = *in->expires_at;
      in->body = std::move(body);
    });
  }
  {
    CLI::App& list = leaf(keys, "list", "A tenant's keys (never their secrets)");
    list.add_option("tenant", in->id, "Tenant id")->required();
    list.callback([in] { in->target = "/admin/v1/tenants/" + path_segment(in->id) + "/keys"; });
  }
  {
    CLI::App& revoke = leaf(keys, "revoke", "Revoke a key: the next request that uses it is refused");
    revoke.add_option("key_id", in->id, "Key id (the part between \"ek-\" and \".\")")->required();
    revoke.callback([in] {
      in->method = http::verb::delete_;
      in->target = "/admin/v1/keys/" + path_segment(in->id);
    });
  }

  {
    CLI::App& usage = leaf(admin, "usage", "A tenant's hourly usage: requests, tokens, rejections");
    usage.add_option("tenant", in->id, "Tenant id")->required();
    usage.add_option("--from", in->from, "Start: unix seconds, 2026-05-01 or 2026-05-01T13:00:00Z (default: today)");
    usage.add_option("--to", in->to, "End, exclusive (default: now)");
    usage.callback([in] {
      std::string query;
      if (in->from) query += "from=" + query_value(*in->from);
      if (in->to) query += std::string(query.empty() ? "" : "&") + "to=" + query_value(*in->to);
      in->target = "/admin/v1/tenants/" + path_segment(in->id) + "/usage" + (query.empty() ? "" : "?" + query);
    });
  }
  {
    CLI::App& spend = leaf(admin, "spend", "What a tenant's requests used, per API key, model and API");
    spend.add_option("tenant", in->id, "Tenant id")->required();
    spend.add_option("--from", in->from, "Start: unix seconds, 2026-05-01 or 2026-05-01T13:00:00Z (default: today)");
    spend.add_option("--to", in->to, "End, exclusive (default: now)");
    spend.add_option("--key", in->key_id, "Only this API key (its id)");
    spend.callback([in] {
      std::string query;
      const auto add_param = [&query](std::string_view name, const std::string& value) {
        query += format("{}{}={}", query.empty() ? "" : "&", name, query_value(value));
      };
      if (in->from) add_param("from", *in->from);
      if (in->to) add_param("to", *in->to);
      if (in->key_id) add_param("key", *in->key_id);
      in->target = "/admin/v1/tenants/" + path_segment(in->id) + "/spend" + (query.empty() ? "" : "?" + query);
    });
  }
  {
    CLI::App& migrate = leaf(admin, "migrate-store",
                             "Copy a stopped server's SQLite tenant store into an empty PostgreSQL one (no server is "
                             "called)");
    migrate.add_option("--state-dir", in->state_dir, "The SQLite store's folder (the server's --state-dir)")
        ->capture_default_str();
    migrate.add_option("--to", in->store_url, "The PostgreSQL store: postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE")
        ->required();
    migrate.callback([in] { in->migrate = true; });
  }
  {
    CLI::App& audit = leaf(admin, "audit", "The audit log of admin changes, newest first");
    audit.add_option("--limit", in->limit, "Entries to show (default 100, at most 1000)");
    audit.add_option("--before", in->before, "Only entries older than this id (the next page)");
    audit.callback([in] {
      std::string query;
      if (in->limit) query += format("limit={}", *in->limit);
      if (in->before) query += format("{}before={}", query.empty() ? "" : "&", *in->before);
      in->target = "/admin/v1/audit" + (query.empty() ? "" : "?" + query);
    });
  }
}

config::schema admin_options() {
  config::schema s;
  s.add_string("url", std::string(default_url), "The server whose admin API to call");
  s.add_string("admin-token", std::nullopt, "The server's admin token (its --admin-token)");
  s.add_duration("timeout", "30s", std::chrono::milliseconds(100), std::chrono::hours(1),
                 "Give up on the server after this long");
  return s;
}

int run_migrate_store(const admin_invocation& in) {
  const auto fail = [](int code, const std::string& message) {
    std::fprintf(stderr, "edgeinfer admin migrate-store: %s\n", message.c_str());
    return code;
  };
  if (!gateway::is_postgres_url(in.store_url)) {
    return fail(2, format("--to '{}' is not a postgresql:// URL", in.store_url));
  }
  const std::filesystem::path database = std::filesystem::path(in.state_dir) / gateway::tenant_store::database_name;
  if (!std::filesystem::exists(database)) return fail(2, format("there is no tenant store at {}", database.string()));
  const real_time_source clock;
  auto from = gateway::tenant_store::open(in.state_dir, clock);
  if (!from.ok()) return fail(1, from.error().message());  // a server still running on it holds the lock
  auto contents = (*from)->contents();
  if (!contents.ok()) return fail(1, contents.error().message());
  auto to = gateway::tenant_store::open({.url = in.store_url}, clock);
  if (!to.ok()) return fail(1, to.error().message());
  if (status imported = (*to)->import_contents(*contents); !imported.ok()) return fail(1, imported.message());
  std::printf("copied %zu tenants, %zu API keys, %zu usage rows, %zu audit entries and %zu stored responses from %s "
              "to %s\n",
              contents->tenants.size(), contents->keys.size(), contents->usage.size(), contents->audit.size(),
              contents->responses.size(), (*from)->description().c_str(), (*to)->description().c_str());
  return 0;
}

// `keys create TENANT --state-dir DIR`: the key is made in the SQLite store itself, with the same
// checks and the same answer as the admin API's, and the audit log names this command.
int run_create_key_in_store(const admin_invocation& in) {
  const auto fail = [](int code, const std::string& message) {
    std::fprintf(stderr, "edgeinfer admin keys create: %s\n", message.c_str());
    return code;
  };
  const std::filesystem::path database = std::filesystem::path(*in.key_store_dir) / gateway::tenant_store::database_name;
  if (!std::filesystem::exists(database)) {
    return fail(2, format("there is no tenant store at {} (a server started with --state-dir {} makes it)",
                          database.string(), *in.key_store_dir));
  }
  const auto parsed = gateway::parse_key_create(json::serialize(in.body.value_or(json::object{})));
  if (const auto* error = std::get_if<gateway::admin_request_error>(&parsed)) return fail(2, error->message);
  const real_time_source clock;
  const gateway::unix_time now = gateway::to_unix_seconds(clock.system_time());
  const auto expiry = std::get<gateway::key_create_params>(parsed).expiry(now);
  if (const auto* error = std::get_if<gateway::admin_request_error>(&expiry)) return fail(2, error->message);
  auto store = gateway::tenant_store::open(*in.key_store_dir, clock);
  if (!store.ok()) {
    // A running server holds the store: its admin API is the way then.
    return fail(1, format("{}; while the server runs, use its admin API (--admin-token)", store.error().message()));
  }
  auto issued = (*store)->create_key(in.id, std::get<std::optional<gateway::unix_time>>(expiry),
                                     {.actor = "admin keys create --state-dir", .request_id = ""});
  if (!issued.ok()) return fail(1, issued.error().message());
  json::object body = gateway::to_json(issued->record, now);
  body["key"] = issued->key;
  return report({.status = 201, .body = json::serialize(body)});
}

int run_admin(const config::values& settings, const admin_invocation& in) {
  if (!in.error.empty()) {
    std::fprintf(stderr, "edgeinfer admin: %s\n", in.error.c_str());
    return 2;
  }
  if (in.migrate) return run_migrate_store(in);
  if (in.key_store_dir) return run_create_key_in_store(in);
  const auto token = settings.optional_string("admin-token");
  if (!token || token->empty()) {
    std::fprintf(stderr, "edgeinfer admin: no admin token: pass --admin-token or set EDGE_ADMIN_TOKEN\n");
    return 2;
  }
  auto server = parse_server_url(settings.string("url"));
  if (!server.ok()) {
    std::fprintf(stderr, "edgeinfer admin: %s\n", server.error().message().c_str());
    return 2;
  }
  auto answer = call(*server, *token, in.method, in.target, in.body, settings.duration("timeout"));
  if (!answer.ok()) {
    std::fprintf(stderr, "edgeinfer admin: %s\n", answer.error().message().c_str());
    return 1;
  }
  return report(*answer);
}

}  // namespace

command make_admin_command(CLI::App& app) {
  auto in = std::make_shared<admin_invocation>();
  command admin(app, "admin", "Manage tenants, API keys and quotas of a running server, and read usage and audit",
                admin_options(), [in](const config::values& settings) { return run_admin(settings, *in); });
  define_subcommands(admin.app(), in);
  return admin;
}

}  // namespace edge::cli
