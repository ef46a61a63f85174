#include "edge/gateway/openai/anthropic_response.h"

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include <string>

#include "edge/gateway/http/json_response.h"

namespace edge::gateway {

std::string_view anthropic_error_type(http::status status) {
  switch (status) {
    case http::status::bad_request: return "invalid_request_error";
    case http::status::unauthorized: return "authentication_error";
    case http::status::forbidden: return "permission_error";
    case http::status::not_found: return "not_found_error";
    case http::status::payload_too_large: return "request_too_large";
    case http::status::too_many_requests: return "rate_limit_error";
    case http::status::service_unavailable: return "overloaded_error";
    default: break;
  }
  return static_cast<unsigned>(status) >= 500 ? "api_error" : "invalid_request_error";
}

response anthropic_error(response res) {
  std::string message = res.body();
  boost::system::error_code failed;
  const boost::json::value body = boost::json::parse(res.body(), failed);
  if (!failed && body.is_object()) {
    const boost::json::value* error = body.get_object().if_contains("error");
    const boost::json::value* text = error != nullptr && error->is_object() ? error->get_object().if_contains("message") : nullptr;
    if (text != nullptr && text->is_string()) message = std::string(text->get_string());
  }
  boost::json::object error;
  error["type"] = anthropic_error_type(res.result());
  error["message"] = message;
  res.body() = boost::json::serialize(boost::json::object{{"type", "error"}, {"error", std::move(error)}});
  res.set(http::field::content_type, "application/json");
  return res;
}

response count_tokens_response(std::int64_t input_tokens) {
  return json_response(http::status::ok, boost::json::object{{"input_tokens", input_tokens}});
}

}  // namespace edge::gateway
