#include "edge/gateway/http/json_response.h"

#include <boost/json/serialize.hpp>
#include <boost/json/string.hpp>

#include <string>

#include "edge/common/utf8.h"

namespace edge::gateway {
namespace {

// Error texts repeat parts of the request (a path, a parameter name), which may be any bytes;
// a JSON text must be UTF-8 (RFC 8259), and Boost.JSON writes strings as they are.
boost::json::string valid_text(std::string_view text) {
  if (utf8::is_valid(text)) return boost::json::string(text);
  std::string repaired;
  utf8::append_sanitized(repaired, text);
  return boost::json::string(repaired);
}

}  // namespace

response json_response(http::status status, const boost::json::value& body) {
  return json_text_response(status, boost::json::serialize(body));
}

response json_text_response(http::status status, std::string body) {
  response res{status, 11};
  res.set(http::field::content_type, "application/json");
  res.body() = std::move(body);
  return res;
}

boost::json::object error_body(std::string_view message, std::string_view type, std::optional<std::string_view> param,
                               std::optional<std::string_view> code) {
  boost::json::object error;
  error["message"] = valid_text(message);
  error["type"] = type;
  error["param"] = param ? boost::json::value(valid_text(*param)) : boost::json::value(nullptr);
  error["code"] = code ? boost::json::value(*code) : boost::json::value(nullptr);
  boost::json::object body;
  body["error"] = std::move(error);
  return body;
}

response error_response(http::status status, std::string_view message, std::string_view type,
                        std::optional<std::string_view> param, std::optional<std::string_view> code) {
  return json_response(status, error_body(message, type, param, code));
}

}  // namespace edge::gateway
