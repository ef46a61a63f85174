#include "edge/common/json_fields.h"

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "edge/common/format.h"
#include "edge/common/json_text.h"

namespace edge {
namespace {

using element_type = simdjson::dom::element_type;

// 2^63 and 2^64 are exactly representable; a double at or past them does not fit.
constexpr double two_to_63 = 9223372036854775808.0;
constexpr double two_to_64 = 18446744073709551616.0;

bool is_whole(double d) { return std::isfinite(d) && d == std::floor(d); }

std::optional<std::int64_t> to_int64(simdjson::dom::element e) {
  switch (e.type()) {
    case element_type::INT64: return e.get_int64().value_unsafe();
    case element_type::DOUBLE: {
      const double d = e.get_double().value_unsafe();
      if (!is_whole(d) || d >= two_to_63 || d < -two_to_63) return std::nullopt;
      return static_cast<std::int64_t>(d);
    }
    default: return std::nullopt;  // UINT64 holds only values past the int64 range
  }
}

std::optional<std::uint64_t> to_uint64(simdjson::dom::element e) {
  switch (e.type()) {
    case element_type::UINT64: return e.get_uint64().value_unsafe();
    case element_type::INT64: {
      const std::int64_t n = e.get_int64().value_unsafe();
      if (n < 0) return std::nullopt;
      return static_cast<std::uint64_t>(n);
    }
    case element_type::DOUBLE: {
      const double d = e.get_double().value_unsafe();
      if (!is_whole(d) || d >= two_to_64 || d < 0) return std::nullopt;
      return static_cast<std::uint64_t>(d);
    }
    default: return std::nullopt;
  }
}

std::optional<double> to_double(simdjson::dom::element e) {
  const element_type t = e.type();
  if (t != element_type::INT64 && t != element_type::UINT64 && t != element_type::DOUBLE) return std::nullopt;
  const double d = e.get_double().value_unsafe();
  if (!std::isfinite(d)) return std::nullopt;
  return d;
}

json_error not_json(std::string_view what, std::string_view reason) {
  return {format("{} is not valid JSON: {}", what, reason), ""};
}

json_error not_an_object(std::string_view what) { return {format("{} must be a JSON object", what), ""}; }

}  // namespace

// ---- json_path -------------------------------------------------------------------------------

void json_path::append_to(std::string& out) const {
  if (parent_ == nullptr) return;
  parent_->append_to(out);
  if (index_ != no_index) {
    out += '[';
    out += std::to_string(index_);
    out += ']';
    return;
  }
  if (!out.empty()) out += '.';
  out += key_;
}

std::string json_path::str() const {
  std::string out;
  append_to(out);
  return out;
}

json_error json_path::error(std::string_view what) const {
  std::string path = str();
  std::string message = path.empty() ? format("the document {}", what) : format("'{}' {}", path, what);
  return {std::move(message), std::move(path)};
}

// ---- json_value ------------------------------------------------------------------------------

json_error json_value::must_be(std::string_view expected) const { return error(format("must be {}", expected)); }

template <class T>
json_result<T> json_value::as(std::string_view expected) const {
  std::optional<T> value;
  if constexpr (std::is_same_v<T, std::int64_t>) {
    value = to_int64(element_);
  } else if constexpr (std::is_same_v<T, std::uint64_t>) {
    value = to_uint64(element_);
  } else if constexpr (std::is_same_v<T, double>) {
    value = to_double(element_);
  } else if constexpr (std::is_same_v<T, bool>) {
    if (element_.type() == element_type::BOOL) value = element_.get_bool().value_unsafe();
  } else if constexpr (std::is_same_v<T, std::string_view>) {
    if (element_.type() == element_type::STRING) value = element_.get_string().value_unsafe();
  } else if constexpr (std::is_same_v<T, json_fields>) {
    if (element_.type() == element_type::OBJECT) value.emplace(element_.get_object().value_unsafe(), path_);
  } else {
    static_assert(std::is_same_v<T, json_array>, "json_value::as reads the types listed in json_fields.h");
    if (element_.type() == element_type::ARRAY) value.emplace(element_.get_array().value_unsafe(), path_);
  }
  if (!value) return must_be(expected);
  return std::move(*value);
}

template json_result<std::int64_t> json_value::as<std::int64_t>(std::string_view) const;
template json_result<std::uint64_t> json_value::as<std::uint64_t>(std::string_view) const;
template json_result<double> json_value::as<double>(std::string_view) const;
template json_result<bool> json_value::as<bool>(std::string_view) const;
template json_result<std::string_view> json_value::as<std::string_view>(std::string_view) const;
template json_result<json_fields> json_value::as<json_fields>(std::string_view) const;
template json_result<json_array> json_value::as<json_array>(std::string_view) const;

// ---- json_fields -----------------------------------------------------------------------------

std::optional<json_value> json_fields::find(std::string_view key) const {
  // By iteration rather than object_[key] (as costly: a DOM object is a list), so that the path
  // keeps the parser's copy of the name, never the caller's.
  for (const simdjson::dom::key_value_pair field : items_) {
    if (field.key != key) continue;
    if (field.value.is_null()) return std::nullopt;
    return json_value(field.value, path_.member(field.key));
  }
  return std::nullopt;
}

json_result<json_value> json_fields::required(std::string_view key) const {
  if (auto value = find(key)) return *value;
  return path_.member(key).error("is required");
}

// ---- documents -------------------------------------------------------------------------------

result<simdjson::dom::element> parse_json(simdjson::dom::parser& parser, std::string_view text) {
  simdjson::dom::element document;
  // Copied into a padded buffer: simdjson reads a little past the end of what it parses.
  if (const auto error = parser.parse(text.data(), text.size()).get(document); error != simdjson::SUCCESS) {
    return invalid_argument(simdjson::error_message(error));
  }
  return document;
}

json_result<simdjson::dom::object> parse_json_object(simdjson::dom::parser& parser, std::string_view text,
                                                     std::string_view what) {
  auto document = parse_json(parser, text);
  if (!document.ok()) return not_json(what, document.error().message());
  if (document->type() != element_type::OBJECT) return not_an_object(what);
  return document->get_object().value_unsafe();
}

json_result<simdjson::dom::object> parse_json_members(simdjson::dom::parser& parser, std::string_view text,
                                                      std::string_view what,
                                                      std::initializer_list<std::string_view> keys) {
  // The on-demand parser reads only what it is asked for: the kept fields' JSON text is copied
  // into a document of their own, which the DOM parser then reads as a whole.
  simdjson::ondemand::parser on_demand;
  const simdjson::padded_string padded(text);
  simdjson::ondemand::document document;
  if (const auto error = on_demand.iterate(padded).get(document)) return not_json(what, simdjson::error_message(error));
  simdjson::ondemand::object object;
  if (const auto error = document.get_object().get(object)) {
    return error == simdjson::INCORRECT_TYPE ? not_an_object(what) : not_json(what, simdjson::error_message(error));
  }
  std::string kept = "{";
  for (auto entry : object) {
    simdjson::ondemand::field field;
    std::string_view key;
    if (const auto error = std::move(entry).get(field)) return not_json(what, simdjson::error_message(error));
    if (const auto error = field.unescaped_key().get(key)) return not_json(what, simdjson::error_message(error));
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) continue;
    if (kept.size() > 1) kept += ',';
    append_json_string(kept, key);
    kept += ':';
    simdjson::ondemand::value value = field.value();
    simdjson::ondemand::json_type type;
    if (const auto error = value.type().get(type)) return not_json(what, simdjson::error_message(error));
    std::string_view raw;
    simdjson::error_code error = simdjson::SUCCESS;
    if (type == simdjson::ondemand::json_type::object) {
      simdjson::ondemand::object member;
      error = value.get_object().get(member);
      if (!error) error = member.raw_json().get(raw);
    } else if (type == simdjson::ondemand::json_type::array) {
      simdjson::ondemand::array member;
      error = value.get_array().get(member);
      if (!error) error = member.raw_json().get(raw);
    } else {
      raw = value.raw_json_token();
    }
    if (error) return not_json(what, simdjson::error_message(error));
    kept += raw;
  }
  kept += '}';
  return parse_json_object(parser, kept, what);
}

}  // namespace edge
