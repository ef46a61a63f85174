// Reading parsed JSON (simdjson's DOM) field by field, with errors that name the field by its
// path: "'messages[2].content' must be a string", "'hidden_size' is required". Every parser of
// the tree reads through these: the OpenAI and admin request bodies, the internal protocol,
// config.json, tokenizer.json and tokenizer_config.json, safetensors headers.
//
// The DOM parser validates the whole document before anything is read, so malformed JSON
// anywhere (also inside a field nobody reads) is an error, never half a document. Values refer
// to the parser's memory: the parser must outlive them.
#pragma once

#include <simdjson.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "edge/common/status.h"

namespace edge {

// A field that is not what its reader needs (always invalid_argument): the message, and the
// field's path ("" for the document), which the API answers as the error's `param`.
class json_error : public status {
 public:
  json_error() = default;
  json_error(std::string message, std::string path)
      : status(status_code::invalid_argument, std::move(message)), path_(std::move(path)) {}

  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

// Where a value sits in its document: "messages[2].content" ("" for the document itself). A
// value keeps its own step and points to its parent's, so a path costs nothing until an error
// writes it out; a value must therefore not outlive the object or array it was read from
// (a document's top level excepted: its fields point to a path all documents share).
class json_path {
 public:
  json_path() = default;  // the document

  json_path member(std::string_view key) const noexcept { return {outer(), key, no_index}; }
  json_path element(std::size_t index) const noexcept { return {outer(), {}, index}; }

  bool is_document() const noexcept { return parent_ == nullptr; }
  std::string str() const;

  // An error about the value here: "'path' {what}" ("the document {what}" for the document).
  json_error error(std::string_view what) const;

 private:
  static constexpr std::size_t no_index = static_cast<std::size_t>(-1);
  static const json_path document_;

  json_path(const json_path* parent, std::string_view key, std::size_t index) noexcept
      : parent_(parent), key_(key), index_(index) {}
  const json_path* outer() const noexcept { return is_document() ? &document_ : this; }
  void append_to(std::string& out) const;

  const json_path* parent_ = nullptr;
  std::string_view key_;          // a member's name (in the parser's memory), or
  std::size_t index_ = no_index;  // an array element's index
};

inline const json_path json_path::document_{};

template <class T>
using json_result = result<T, json_error>;

class json_fields;
class json_array;

// How an error names the JSON type a reader wanted.
template <class T> inline constexpr std::string_view json_type_name = {};
template <> inline constexpr std::string_view json_type_name<std::int64_t> = "an integer";
template <> inline constexpr std::string_view json_type_name<std::uint64_t> = "a non-negative integer";
template <> inline constexpr std::string_view json_type_name<double> = "a number";
template <> inline constexpr std::string_view json_type_name<bool> = "true or false";
template <> inline constexpr std::string_view json_type_name<std::string_view> = "a string";
template <> inline constexpr std::string_view json_type_name<json_fields> = "an object";
template <> inline constexpr std::string_view json_type_name<json_array> = "an array";

// One value of a parsed document, and where it is.
class json_value {
 public:
  explicit json_value(simdjson::dom::element element) noexcept : element_(element) {}  // the document
  json_value(simdjson::dom::element element, json_path path) noexcept : element_(element), path_(path) {}

  simdjson::dom::element element() const noexcept { return element_; }
  const json_path& path() const noexcept { return path_; }
  simdjson::dom::element_type type() const noexcept { return element_.type(); }
  bool is_null() const noexcept { return element_.is_null(); }

  // The value as T, or the error "'path' must be {expected}". T is one of
  //   std::int64_t, std::uint64_t  an integer in T's range, also when written as 3.0 (JSON does
  //                                not tell them apart and clients in languages with one number
  //                                type send either)
  //   double                       any (finite) number
  //   bool, std::string_view       (the string lies in the parser's memory)
  //   json_fields, json_array      an object, an array
  template <class T>
  json_result<T> as(std::string_view expected = json_type_name<T>) const;

  // An error about this value: "'path' {what}", "'path' must be {expected}".
  json_error error(std::string_view what) const { return path_.error(what); }
  json_error must_be(std::string_view expected) const;

 private:
  simdjson::dom::element element_;
  json_path path_;
};

// A member of an object: its name (in the parser's memory) and its value.
struct json_member {
  std::string_view key;
  json_value value;
};

// What objects and arrays share: their path, their size, and their items in document order,
// each with its path below the container's.
template <class Container>  // simdjson::dom::object or simdjson::dom::array
class json_container {
 public:
  class iterator {
   public:
    iterator(typename Container::iterator at, const json_path* parent) noexcept : at_(at), parent_(parent) {}
    auto operator*() const {
      if constexpr (std::is_same_v<Container, simdjson::dom::object>) {
        const simdjson::dom::key_value_pair field = *at_;
        return json_member{field.key, json_value(field.value, parent_->member(field.key))};
      } else {
        return json_value(*at_, parent_->element(index_));
      }
    }
    iterator& operator++() noexcept {
      ++at_;
      ++index_;
      return *this;
    }
    bool operator!=(const iterator& other) const noexcept { return at_ != other.at_; }

   private:
    typename Container::iterator at_;
    const json_path* parent_;
    std::size_t index_ = 0;
  };

  const json_path& path() const noexcept { return path_; }
  std::size_t size() const noexcept { return items_.size(); }
  bool empty() const noexcept { return size() == 0; }
  iterator begin() const noexcept { return {items_.begin(), &path_}; }
  iterator end() const noexcept { return {items_.end(), &path_}; }

 protected:
  json_container(Container items, json_path path) noexcept : items_(items), path_(path) {}

  Container items_;
  json_path path_;
};

// An object's fields, read by name or in document order (a repeated key as often as it is
// written).
class json_fields : public json_container<simdjson::dom::object> {
 public:
  explicit json_fields(simdjson::dom::object object) noexcept : json_container(object, {}) {}  // the document
  json_fields(simdjson::dom::object object, json_path path) noexcept : json_container(object, path) {}

  simdjson::dom::object object() const noexcept { return items_; }

  // The field `key` (the first, when it is repeated), unless it is absent or null: both mean
  // "not given".
  std::optional<json_value> find(std::string_view key) const;
  // The field `key`; not given: the error "'path.key' is required".
  json_result<json_value> required(std::string_view key) const;

  // The field `key` as T (json_value::as): nullopt when it is not given, an error when it is of
  // another type.
  template <class T>
  json_result<std::optional<T>> optional(std::string_view key) const {
    const auto value = find(key);
    if (!value) return std::optional<T>{};
    auto typed = value->as<T>();
    if (!typed.ok()) return typed.error();
    return std::optional<T>(std::move(typed).value());
  }

  // The field `key` as T; not given: "'path.key' is required".
  template <class T>
  json_result<T> required(std::string_view key) const {
    auto value = required(key);
    if (!value.ok()) return value.error();
    return value->as<T>();
  }

  // The field `key` as T, or `fallback` when it is not given.
  template <class T>
  json_result<T> value_or(std::string_view key, T fallback) const {
    auto value = optional<T>(key);
    if (!value.ok()) return value.error();
    return value->value_or(std::move(fallback));
  }
};

// An array's elements, in order.
class json_array : public json_container<simdjson::dom::array> {
 public:
  json_array(simdjson::dom::array array, json_path path) noexcept : json_container(array, path) {}

  json_value front() const { return *begin(); }  // of an array that is not empty
};

// How deep the JSON that parse_json accepts may nest (simdjson's DOM parser's limit): what a
// reader of the same text with another library (Boost.JSON, whose default is 32) must allow.
inline constexpr std::size_t max_json_depth = 1024;

// Parses `text` into `parser` (which holds what the result refers to). The error's message is
// simdjson's reason, for the caller to say what was being read.
result<simdjson::dom::element> parse_json(simdjson::dom::parser& parser, std::string_view text);

// Parses `text` into `parser` and returns its top-level object, read with json_fields. Errors:
// "{what} is not valid JSON: {reason}", "{what} must be a JSON object".
json_result<simdjson::dom::object> parse_json_object(simdjson::dom::parser& parser, std::string_view text,
                                                     std::string_view what = "the file");

// parse_json_object for a file of which only some top-level fields are read: those named in
// `keys` are parsed and the rest skipped unread, so a number that no 64-bit type holds there
// is no error (Llama 3's tokenizer_config.json writes model_max_length, 1e30, in digits).
json_result<simdjson::dom::object> parse_json_members(simdjson::dom::parser& parser, std::string_view text,
                                                      std::string_view what,
                                                      std::initializer_list<std::string_view> keys);

}  // namespace edge
