// The refusal table: every kind's answer reads back as that kind (what the split gateway does
// with a backend's answer), the engine's refusals keep their kind across the split protocol, and
// the answers carry the type, code, param and retry-after the table says.
#include <doctest/doctest.h>

#include <boost/json/parse.hpp>

#include "edge/common/format.h"
#include "edge/gateway/openai/grammar_compiler.h"
#include "edge/gateway/openai/refusals.h"

namespace gw = edge::gateway;
namespace be = edge::backend;
using namespace std::chrono_literals;

namespace {

boost::json::object error_of(const gw::response& res) { return boost::json::parse(res.body()).as_object().at("error").as_object(); }

}  // namespace

TEST_CASE("every refusal's answer reads back as its kind") {
  for (const gw::refusal_row& row : gw::refusal_rows()) {
    const gw::refusal_kind kind = row.kind;
    CAPTURE(row.code);
    CHECK(&gw::refusal_info(kind) == &row);
    const gw::response res = gw::refusal_response({.kind = kind, .message = "why", .param = "p"});
    CHECK(res.result() == row.status);
    const auto error = error_of(res);
    CHECK(error.at("message").as_string() == "why");
    const std::string code = error.at("code").is_null() ? std::string() : std::string(error.at("code").as_string());
    CHECK(code == row.code);
    CHECK(gw::refusal_kind_of(res.result_int(), code) == kind);
    CHECK((res.find(gw::http::field::retry_after) != res.end()) == row.retry_after);
  }
  // What no row has: 400 and 503 read as their first row; another status as nothing.
  CHECK(gw::refusal_kind_of(400, "something_new") == gw::refusal_kind::invalid_request);
  CHECK(gw::refusal_kind_of(503, "something_new") == gw::refusal_kind::backend_unavailable);
  CHECK_FALSE(gw::refusal_kind_of(401, "invalid_internal_token"));
  CHECK_FALSE(gw::refusal_kind_of(418, ""));
}

TEST_CASE("the engine's refusals keep their kind, field and wait across the split protocol") {
  const std::vector<be::submit_error> engine_refusals{
      be::submit_error(edge::invalid_argument("n must be between 1 and 128"), "n"),
      be::submit_error(edge::out_of_range("the prompt is longer than the context"), "prompt"),
      be::submit_error(edge::resource_exhausted("1024 requests are waiting")),
      be::submit_error(edge::failed_precondition("draining")),
      be::submit_error(edge::unavailable("the engine failed")),
      be::submit_error(edge::resource_exhausted("3 compiles queued"),
                       be::submit_error::tenant_limit{.name = "grammar_compile_queue", .retry_after = 1500ms}),
  };
  for (const be::submit_error& e : engine_refusals) {
    CAPTURE(e.message());
    const gw::refusal r = gw::refusal_of(e);
    const be::submit_error back = gw::submit_error_of(r);
    CHECK(back.code() == e.code());
    CHECK(back.message() == e.message());
    CHECK(back.field() == e.field());
    CHECK(back.limit().has_value() == e.limit().has_value());
    if (e.limit()) {
      CHECK(back.limit()->name == e.limit()->name);
      CHECK(back.limit()->retry_after == e.limit()->retry_after);
    }
    // And through HTTP, as a backend answers and the split gateway reads it.
    const gw::response res = gw::refusal_response(r);
    const auto error = error_of(res);
    const std::string code = error.at("code").is_null() ? std::string() : std::string(error.at("code").as_string());
    CHECK(gw::refusal_kind_of(res.result_int(), code) == r.kind);
  }
}

TEST_CASE("a tenant's limit is a 429 typed by the limit, with its own wait") {
  const gw::response res = gw::refusal_response(
      {.kind = gw::refusal_kind::tenant_limit, .message = "wait", .limit = "grammar_compile_seconds", .retry_after = 2500ms});
  CHECK(res.result() == gw::http::status::too_many_requests);
  CHECK(error_of(res).at("type").as_string() == "grammar_compile_seconds");
  CHECK(res[gw::http::field::retry_after] == "3");
  CHECK(res["retry-after-ms"] == "2500");
  // A 503 without a wait of its own says one second.
  const gw::response busy = gw::refusal_response({.kind = gw::refusal_kind::overloaded, .message = "busy"});
  CHECK(busy[gw::http::field::retry_after] == "1");
}

TEST_CASE("a grammar not compiled: its own fault names the parameter, the compiler's limits are not the client's fault") {
  const gw::compile_failure own(gw::compile_failure::kind::grammar, edge::invalid_argument("bad"));
  const gw::refusal r = gw::refusal_of(own, "response_format.json_schema");
  CHECK(r.kind == gw::refusal_kind::invalid_request);
  CHECK(r.param == "response_format.json_schema");
  const gw::compile_failure queue(gw::compile_failure::kind::server_queue, edge::resource_exhausted("full"), 700ms);
  CHECK(gw::refusal_of(queue, "x").kind == gw::refusal_kind::overloaded);
  CHECK(gw::refusal_of(queue, "x").retry_after == 700ms);
  const gw::compile_failure budget(gw::compile_failure::kind::tenant_budget, edge::resource_exhausted("spent"), 9s);
  const gw::refusal limited = gw::refusal_of(budget, "x");
  CHECK(limited.kind == gw::refusal_kind::tenant_limit);
  CHECK(limited.limit == budget.limit_name());
  CHECK(gw::refusal_of(gw::compile_failure(gw::compile_failure::kind::cancelled, edge::status(edge::status_code::cancelled, "gone")), "x").kind ==
        gw::refusal_kind::shutting_down);
}
