// JSON responses, including the OpenAI-shaped error body
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// Bodies are written with Boost.JSON, never pasted together from strings (a whole answer's body
// joins parts that Boost.JSON wrote: openai_response.h).
#pragma once

#include <boost/json/object.hpp>
#include <boost/json/value.hpp>

#include <optional>
#include <string_view>

#include "edge/gateway/http/http.h"

namespace edge::gateway {

response json_response(http::status status, const boost::json::value& body);
// A body already written as JSON text (a whole answer: openai_response.h's completion_body).
response json_text_response(http::status status, std::string body);

// {"error": {...}}: the body of an error response, also sent as an event inside a stream.
// `message` and `param` may repeat request bytes: any that are not UTF-8 become U+FFFD.
boost::json::object error_body(std::string_view message, std::string_view type,
                               std::optional<std::string_view> param = std::nullopt,
                               std::optional<std::string_view> code = std::nullopt);

response error_response(http::status status, std::string_view message, std::string_view type,
                        std::optional<std::string_view> param = std::nullopt,
                        std::optional<std::string_view> code = std::nullopt);

}  // namespace edge::gateway
