#include "edge/gateway/json_response.h"

#include <boost/json/serialize.hpp>

namespace edge::gateway {

response json_response(http::status status, const boost::json::value& body) {
  response res{status, 11};
  res.set(http::field::content_type, "application/json");
  res.body() = boost::json::serialize(body);
  return res;
}

boost::json::object error_body(std::string_view message, std::string_view type, std::optional<std::string_view> param,
                               std::optional<std::string_view> code) {
  boost::json::object error;
  error["message"] = message;
  error["type"] = type;
  error["param"] = param ? boost::json::value(*param) : boost::json::value(nullptr);
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
