// The JSON field readers: documents, typed reads, missing / null / wrong-type fields, and the
// path every error carries.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "edge/common/json_fields.h"

namespace {

using edge::json_array;
using edge::json_fields;
using edge::json_value;

// A parsed document kept with its parser, read through json_fields.
struct document {
  simdjson::dom::parser parser;
  simdjson::dom::object object;

  explicit document(std::string_view text) {
    auto parsed = edge::parse_json_object(parser, text, "the test");
    REQUIRE_MESSAGE(parsed.ok(), parsed.error().message());
    object = *parsed;
  }
  json_fields fields() const { return json_fields(object); }
};

// A status-returning caller: a json_error travels out of it as its status.
edge::result<std::int64_t> required_count(const json_fields& fields) {
  EDGE_ASSIGN_OR_RETURN(const std::int64_t count, fields.required<std::int64_t>("count"));
  return count * 2;
}

}  // namespace

TEST_CASE("a document that is not JSON, or not an object, is an error naming what it is") {
  simdjson::dom::parser parser;
  const auto broken = edge::parse_json_object(parser, R"({"a": )", "The body");
  REQUIRE_FALSE(broken.ok());
  CHECK(broken.error().message().starts_with("The body is not valid JSON: "));
  CHECK(broken.error().path().empty());
  CHECK(broken.error().code() == edge::status_code::invalid_argument);
  const auto trailing = edge::parse_json_object(parser, R"({"a": 1} x)", "The body");
  CHECK(trailing.error().message().starts_with("The body is not valid JSON: "));
  const auto array = edge::parse_json_object(parser, "[1, 2]", "the header");
  CHECK(array.error().message() == "the header must be a JSON object");
  CHECK_FALSE(edge::parse_json(parser, "nul").ok());
  CHECK(edge::parse_json(parser, "[1]").ok());
}

TEST_CASE("absent and null fields are not given; required ones say so with their path") {
  const document doc(R"({"a": 1, "n": null, "inner": {"z": null}})");
  const json_fields fields = doc.fields();
  CHECK(fields.find("a").has_value());
  CHECK_FALSE(fields.find("n").has_value());
  CHECK_FALSE(fields.find("absent").has_value());

  const auto missing = fields.required("absent");
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.error().message() == "'absent' is required");
  CHECK(missing.error().path() == "absent");
  CHECK(fields.required("n").error().message() == "'n' is required");

  const auto inner = fields.required<json_fields>("inner");
  REQUIRE(inner.ok());
  const auto z = inner->required<std::int64_t>("z");
  CHECK(z.error().message() == "'inner.z' is required");
  CHECK(z.error().path() == "inner.z");

  const auto optional = fields.optional<std::int64_t>("n");
  REQUIRE(optional.ok());
  CHECK_FALSE(optional->has_value());
  CHECK(fields.value_or<std::int64_t>("absent", 7).value() == 7);
  CHECK(fields.value_or<std::int64_t>("a", 7).value() == 1);
}

TEST_CASE("a field of the wrong type is an error naming the field and the type wanted") {
  const document doc(R"({"s": 1, "b": "yes", "o": [], "a": {}, "n": "1", "i": true})");
  const json_fields fields = doc.fields();
  const auto s = fields.required<std::string_view>("s");
  CHECK(s.error().message() == "'s' must be a string");
  CHECK(s.error().path() == "s");
  CHECK(fields.required<bool>("b").error().message() == "'b' must be true or false");
  CHECK(fields.required<json_fields>("o").error().message() == "'o' must be an object");
  CHECK(fields.required<json_array>("a").error().message() == "'a' must be an array");
  CHECK(fields.required<double>("n").error().message() == "'n' must be a number");
  CHECK(fields.required<std::int64_t>("i").error().message() == "'i' must be an integer");
  // An optional field given with the wrong type is an error too, not "not given".
  CHECK(fields.optional<std::string_view>("s").error().path() == "s");
  CHECK(fields.value_or<bool>("b", false).error().path() == "b");
  // The reader may say what it wanted in its own words.
  CHECK(fields.required("o")->as<json_fields>("an object with 'role'").error().message() ==
        "'o' must be an object with 'role'");
}

TEST_CASE("paths name nested fields and array elements") {
  const document doc(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": 5}],
                        "grid": [[0, 1], [2, {"c": "x"}]]})");
  const json_fields fields = doc.fields();
  const auto messages = fields.required<json_array>("messages");
  REQUIRE(messages.ok());
  std::vector<std::string> errors;
  for (const json_value message : *messages) {
    const auto object = message.as<json_fields>();
    REQUIRE(object.ok());
    const auto content = object->required<std::string_view>("content");
    if (!content.ok()) errors.push_back(content.error().message() + " @ " + content.error().path());
  }
  CHECK(errors == std::vector<std::string>{"'messages[1].content' must be a string @ messages[1].content"});

  const auto grid = fields.required<json_array>("grid");
  REQUIRE(grid.ok());
  std::string deepest;
  for (const json_value row : *grid) {
    const auto cells = row.as<json_array>();
    REQUIRE(cells.ok());
    for (const json_value cell : *cells) {
      if (cell.type() != simdjson::dom::element_type::OBJECT) continue;
      const auto c = cell.as<json_fields>()->required<std::int64_t>("c");
      deepest = c.error().path();
      CHECK(c.error().message() == "'grid[1][1].c' must be an integer");
    }
  }
  CHECK(deepest == "grid[1][1].c");
  CHECK(grid->front().error("is odd").message() == "'grid[0]' is odd");
  CHECK(json_value(grid->front().element()).must_be("an object").message() == "the document must be an object");
}

TEST_CASE("a top-level field's path outlives the temporary fields it was found in") {
  const document doc(R"({"temperature": "hot"})");
  const auto value = doc.fields().find("temperature");
  REQUIRE(value.has_value());
  CHECK(value->path().str() == "temperature");
  CHECK(value->as<double>().error().path() == "temperature");
}

TEST_CASE("integers: within range, also when written as 3.0") {
  const document doc(R"({"three": 3.0, "half": 3.5, "negative": -4, "big": 9223372036854775808,
                        "max": 18446744073709551615, "huge": 1e19, "too_huge": 18446744073709551616.0,
                        "neg_zero": -0.0})");
  const json_fields fields = doc.fields();
  CHECK(fields.required<std::int64_t>("three").value() == 3);
  CHECK_FALSE(fields.required<std::int64_t>("half").ok());
  CHECK(fields.required<std::int64_t>("negative").value() == -4);
  CHECK_FALSE(fields.required<std::int64_t>("big").ok());
  CHECK(fields.required<std::uint64_t>("big").value() == 9223372036854775808ull);
  CHECK(fields.required<std::uint64_t>("max").value() == 18446744073709551615ull);
  CHECK(fields.required<std::uint64_t>("huge").value() == 10000000000000000000ull);
  CHECK_FALSE(fields.required<std::uint64_t>("too_huge").ok());
  const auto negative = fields.required<std::uint64_t>("negative");
  CHECK(negative.error().message() == "'negative' must be a non-negative integer");
  CHECK(fields.required<std::uint64_t>("neg_zero").value() == 0);
  CHECK(fields.required<double>("negative").value() == -4.0);
  CHECK(fields.required<double>("max").value() == 18446744073709551615.0);
}

TEST_CASE("fields come in document order, a repeated key each time; find takes the first") {
  const document doc(R"({"a": 1, "b": 2, "a": 3})");
  std::string seen;
  std::int64_t sum = 0;
  for (const auto [key, value] : doc.fields()) {
    seen += key;
    sum += value.as<std::int64_t>().value();
    CHECK(value.path().str() == key);
  }
  CHECK(seen == "aba");
  CHECK(sum == 6);
  CHECK(doc.fields().required<std::int64_t>("a").value() == 1);
  CHECK(doc.fields().size() == 3);
}

TEST_CASE("a json_error returned where a status is expected keeps its message") {
  const document given(R"({"count": 21})");
  CHECK(required_count(given.fields()).value() == 42);
  const document wrong(R"({"count": "many"})");
  const auto doubled = required_count(wrong.fields());
  REQUIRE_FALSE(doubled.ok());
  CHECK(doubled.error().code() == edge::status_code::invalid_argument);
  CHECK(doubled.error().message() == "'count' must be an integer");
}

TEST_CASE("parse_json_members reads the fields asked for and skips the rest unread") {
  simdjson::dom::parser parser;
  // 1e30 in digits: no 64-bit number holds it, and the DOM parser refuses the whole document.
  const std::string text = R"({"model_max_length": 1000000000000000019884624838656, "bos_token": "<s>",
      "added": {"0": {"content": "<unk>", "special": true}}, "list": [1, "two", null], "flag": false,
      "none": null, "qu\"ote": 5, "bos_token": "second"})";
  CHECK_FALSE(edge::parse_json_object(parser, text).ok());
  const auto object =
      edge::parse_json_members(parser, text, "tokenizer_config.json",
                               {"bos_token", "added", "list", "flag", "none", "qu\"ote", "absent"});
  REQUIRE_MESSAGE(object.ok(), object.error().message());
  const json_fields fields(*object);
  CHECK(fields.required<std::string_view>("bos_token").value() == "<s>");
  const auto added = fields.required<json_fields>("added");
  REQUIRE(added.ok());
  CHECK(added->required<json_fields>("0")->required<bool>("special").value());
  CHECK(fields.required<json_array>("list")->size() == 3);
  CHECK_FALSE(fields.required<bool>("flag").value());
  CHECK_FALSE(fields.find("none").has_value());
  CHECK(fields.required<std::int64_t>("qu\"ote").value() == 5);
  CHECK_FALSE(fields.find("model_max_length").has_value());
  CHECK_FALSE(fields.find("absent").has_value());
  CHECK(fields.size() == 7);  // both bos_token, in order

  CHECK(edge::parse_json_members(parser, "[1]", "tokenizer_config.json", {"a"}).error().message() ==
        "tokenizer_config.json must be a JSON object");
  CHECK(edge::parse_json_members(parser, R"({"a": )", "tokenizer_config.json", {"a"})
            .error()
            .message()
            .starts_with("tokenizer_config.json is not valid JSON: "));
}
