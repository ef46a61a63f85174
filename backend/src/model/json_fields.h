// Typed access to the fields of a parsed JSON object (config.json, tokenizer_config.json),
// where an absent field and a null one both mean "not given" and a wrong type is an error
// naming the field.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "edge/common/format.h"
#include "edge/common/status.h"

namespace edge::backend {

class json_fields {
 public:
  explicit json_fields(simdjson::dom::object object) : object_(object) {}

  // The field, unless absent or null.
  std::optional<simdjson::dom::element> find(std::string_view key) const {
    simdjson::dom::element element;
    if (object_[key].get(element) != simdjson::SUCCESS || element.is_null()) return std::nullopt;
    return element;
  }

  result<std::optional<std::int64_t>> optional_int(std::string_view key) const {
    const auto element = find(key);
    if (!element) return std::optional<std::int64_t>{};
    std::int64_t value = 0;
    if (element->get_int64().get(value) != simdjson::SUCCESS) return wrong_type(key, "an integer");
    return std::optional<std::int64_t>{value};
  }

  result<std::int64_t> required_int(std::string_view key) const {
    EDGE_ASSIGN_OR_RETURN(const auto value, optional_int(key));
    if (!value) return missing(key);
    return *value;
  }

  result<std::optional<double>> optional_number(std::string_view key) const {
    const auto element = find(key);
    if (!element) return std::optional<double>{};
    double value = 0;
    if (element->get_double().get(value) != simdjson::SUCCESS) return wrong_type(key, "a number");
    return std::optional<double>{value};
  }

  result<std::optional<bool>> optional_bool(std::string_view key) const {
    const auto element = find(key);
    if (!element) return std::optional<bool>{};
    bool value = false;
    if (element->get_bool().get(value) != simdjson::SUCCESS) return wrong_type(key, "true or false");
    return std::optional<bool>{value};
  }

  result<std::optional<std::string>> optional_string(std::string_view key) const {
    const auto element = find(key);
    if (!element) return std::optional<std::string>{};
    std::string_view value;
    if (element->get_string().get(value) != simdjson::SUCCESS) return wrong_type(key, "a string");
    return std::optional<std::string>{std::string(value)};
  }

 private:
  static status wrong_type(std::string_view key, std::string_view expected) {
    return invalid_argument(edge::format("\"{}\" must be {}", key, expected));
  }
  static status missing(std::string_view key) {
    return invalid_argument(edge::format("\"{}\" is missing", key));
  }

  simdjson::dom::object object_;
};

// Parses `text` into `parser` and returns its top-level object.
inline result<simdjson::dom::object> parse_json_object(simdjson::dom::parser& parser, std::string_view text) {
  simdjson::dom::element document;
  if (auto error = parser.parse(simdjson::padded_string(text)).get(document); error != simdjson::SUCCESS) {
    return invalid_argument(edge::format("invalid JSON: {}", simdjson::error_message(error)));
  }
  simdjson::dom::object object;
  if (document.get_object().get(object) != simdjson::SUCCESS) return invalid_argument("not a JSON object");
  return object;
}

}  // namespace edge::backend
