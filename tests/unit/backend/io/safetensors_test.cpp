#include <doctest/doctest.h>

#include "backend/model/model_test_support.h"
#include "edge/backend/io/safetensors.h"
#include "test_support.h"

using namespace edge::backend;
using edge::status_code;
namespace t = edge::testing;

namespace {

// Two tensors: "a" F32 [2, 2] at [0, 16), "b" BF16 [3] at [16, 22).
constexpr std::string_view two_tensor_header =
    R"({"__metadata__": {"format": "pt", "note": "x"}, "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},)"
    R"( "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]}})";

std::vector<std::byte> two_tensor_file() {
  auto data = t::f32_bytes({1, 2, 3, 4});
  data.resize(22, std::byte{0});
  return t::make_safetensors(two_tensor_header, data);
}

std::string tensor_header(std::string_view dtype, std::string_view shape, std::string_view offsets) {
  return std::string(R"({"w": {"dtype": ")") + std::string(dtype) + R"(", "shape": )" + std::string(shape) +
         R"(, "data_offsets": )" + std::string(offsets) + "}}";
}

edge::result<safetensors_file> parse_one(std::string_view dtype, std::string_view shape, std::string_view offsets,
                                         std::size_t data_size = 16) {
  static std::vector<std::byte> keep;
  keep = t::make_safetensors(tensor_header(dtype, shape, offsets), std::vector<std::byte>(data_size));
  return parse_safetensors(keep);
}

}  // namespace

TEST_CASE("safetensors: tensors, dtypes, shapes and metadata") {
  const auto bytes = two_tensor_file();
  auto parsed = parse_safetensors(bytes);
  REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
  REQUIRE(parsed->tensors.size() == 2);
  const auto& a = parsed->tensors[0];
  CHECK(a.name == "a");
  CHECK(a.type == edge::kernels::dtype::f32);
  CHECK(a.shape == std::vector<std::int64_t>{2, 2});
  CHECK(a.data == bytes.data() + 8 + two_tensor_header.size());
  CHECK(t::element(a, 3) == 4.0f);
  const auto& b = parsed->tensors[1];
  CHECK(b.type == edge::kernels::dtype::bf16);
  CHECK(b.data == a.data + 16);
  CHECK(parsed->metadata.at("format") == "pt");
  CHECK(parsed->metadata.at("note") == "x");
}

TEST_CASE("safetensors: scalars, empty tensors and F16") {
  CHECK(parse_one("F16", "[]", "[0, 2]").ok());
  CHECK(parse_one("F16", "[0, 5]", "[4, 4]").ok());
  CHECK(parse_safetensors(t::make_safetensors("{}", {})).ok());
}

TEST_CASE("safetensors: bad headers and ranges are errors") {
  SUBCASE("too short for the length") {
    CHECK(parse_safetensors(std::vector<std::byte>(7)).error().code() == status_code::data_loss);
  }
  SUBCASE("header length past the end or absurd") {
    t::byte_writer w;
    w.put<std::uint64_t>(100).raw("{}");
    CHECK(parse_safetensors(w.bytes()).error().code() == status_code::data_loss);
    t::byte_writer huge;
    huge.put<std::uint64_t>(~std::uint64_t{0}).raw("{}");
    CHECK(parse_safetensors(huge.bytes()).error().code() == status_code::data_loss);
  }
  SUBCASE("not JSON, not an object") {
    CHECK(parse_safetensors(t::make_safetensors("{\"a\": ", {})).error().code() == status_code::invalid_argument);
    CHECK(parse_safetensors(t::make_safetensors("[1, 2]", {})).error().code() == status_code::invalid_argument);
    CHECK(parse_safetensors(t::make_safetensors(R"({"w": 3})", {})).error().code() == status_code::invalid_argument);
  }
  SUBCASE("dtypes") {
    auto unsupported = parse_one("I8", "[2]", "[0, 2]");
    CHECK(unsupported.error().code() == status_code::invalid_argument);
    CHECK(unsupported.error().message() == "tensor \"w\": unsupported dtype I8");
    CHECK(parse_one("Q9", "[2]", "[0, 16]").error().message() == "tensor \"w\": unknown dtype Q9");
  }
  SUBCASE("shape and data size disagree") {
    auto parsed = parse_one("F32", "[3]", "[0, 16]");
    CHECK(parsed.error().code() == status_code::invalid_argument);
    CHECK(parsed.error().message().find("hold 16 bytes but 3 elements of F32 need 12") != std::string::npos);
    CHECK(parse_one("F32", "[-1]", "[0, 16]").error().code() == status_code::invalid_argument);
    CHECK(parse_one("F32", "[4294967296, 4294967296]", "[0, 16]").error().code() == status_code::invalid_argument);
    CHECK(parse_one("F32", "[1.5]", "[0, 16]").error().code() == status_code::invalid_argument);
    CHECK(parse_one("F32", "[0, 4294967296, 4294967296]", "[0, 0]").error().code() == status_code::invalid_argument);
    CHECK(parse_one("F32", "[0, 4294967296]", "[0, 0]").ok());
  }
  SUBCASE("offsets out of range") {
    CHECK(parse_one("F32", "[4]", "[0, 20]").error().code() == status_code::data_loss);
    CHECK(parse_one("F32", "[0]", "[8, 4]").error().code() == status_code::data_loss);
    CHECK(parse_one("F32", "[4]", "[18446744073709551615, 16]").error().code() == status_code::data_loss);
    CHECK(parse_one("F32", "[4]", "[0]").error().code() == status_code::invalid_argument);
    CHECK(parse_one("F32", "[4]", "[0, 16, 32]").error().code() == status_code::invalid_argument);
  }
  SUBCASE("duplicate names and bad metadata") {
    const std::string duplicate =
        R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
    CHECK(parse_safetensors(t::make_safetensors(duplicate, std::vector<std::byte>(4))).error().code() ==
          status_code::invalid_argument);
    CHECK(parse_safetensors(t::make_safetensors(R"({"__metadata__": {"a": 1}})", {})).error().code() ==
          status_code::invalid_argument);
  }
}

TEST_CASE("every truncation and single-byte corruption of a safetensors file is handled") {
  const auto good = two_tensor_file();
  for (std::size_t n = 0; n < good.size(); ++n) {
    if (parse_safetensors(std::span(good).first(n)).ok()) FAIL("a prefix of " << n << " bytes parsed");
  }
  for (std::size_t i = 0; i < good.size(); ++i) {
    auto copy = good;
    copy[i] = std::byte{static_cast<unsigned char>(static_cast<unsigned char>(copy[i]) ^ 0x5A)};
    auto parsed = parse_safetensors(copy);
    if (parsed.ok()) {
      for (const auto& tensor : parsed->tensors) CHECK(tensor.data + tensor.bytes() <= copy.data() + copy.size());
    }
  }
}

TEST_CASE("load_safetensors_folder: one file, a sharded index, and broken indexes") {
  t::temp_dir dir;
  std::vector<std::shared_ptr<const mapped_file>> keep;

  SUBCASE("nothing there") {
    auto loaded = load_safetensors_folder(dir.path(), keep);
    CHECK(loaded.error().code() == status_code::not_found);
  }
  SUBCASE("model.safetensors") {
    t::write_bytes(dir / "model.safetensors", two_tensor_file());
    auto loaded = load_safetensors_folder(dir.path(), keep);
    REQUIRE_MESSAGE(loaded.ok(), loaded.error().to_string());
    CHECK(loaded->size() == 2);
    CHECK(keep.size() == 1);
  }
  SUBCASE("shards") {
    const auto shard = [](std::string_view name, float value) {
      const std::string header =
          "{\"" + std::string(name) + R"(": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
      return t::make_safetensors(header, t::f32_bytes({value}));
    };
    t::write_bytes(dir / "part-1.safetensors", shard("x", 1));
    t::write_bytes(dir / "part-2.safetensors", shard("y", 2));
    t::write_text(dir / "model.safetensors.index.json",
                  R"({"metadata": {"total_size": 8}, "weight_map": {"x": "part-1.safetensors", "y": "part-2.safetensors"}})");
    auto loaded = load_safetensors_folder(dir.path(), keep);
    REQUIRE_MESSAGE(loaded.ok(), loaded.error().to_string());
    REQUIRE(loaded->size() == 2);
    CHECK(keep.size() == 2);

    // The index names a shard that does not hold the tensor.
    t::write_text(dir / "model.safetensors.index.json",
                  R"({"weight_map": {"x": "part-2.safetensors", "y": "part-2.safetensors"}})");
    auto misplaced = load_safetensors_folder(dir.path(), keep);
    CHECK(misplaced.error().code() == status_code::data_loss);
    CHECK(misplaced.error().message().find("\"x\"") != std::string::npos);

    // A tensor in two shards.
    t::write_bytes(dir / "part-2.safetensors", shard("x", 2));
    t::write_text(dir / "model.safetensors.index.json",
                  R"({"weight_map": {"x": "part-1.safetensors", "z": "part-2.safetensors"}})");
    CHECK(load_safetensors_folder(dir.path(), keep).error().code() == status_code::invalid_argument);

    // Paths outside the folder, a missing shard, and no weight_map.
    t::write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"x": "../part-1.safetensors"}})");
    CHECK(load_safetensors_folder(dir.path(), keep).error().code() == status_code::invalid_argument);
    t::write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"x": "absent.safetensors"}})");
    auto absent = load_safetensors_folder(dir.path(), keep);
    CHECK(absent.error().code() == status_code::not_found);
    CHECK(absent.error().message().find("absent.safetensors") != std::string::npos);
    t::write_text(dir / "model.safetensors.index.json", R"({"metadata": {}})");
    CHECK(load_safetensors_folder(dir.path(), keep).error().code() == status_code::invalid_argument);
  }
  SUBCASE("a corrupt file is named") {
    t::write_text(dir / "model.safetensors", "short");
    auto loaded = load_safetensors_folder(dir.path(), keep);
    CHECK(loaded.error().code() == status_code::data_loss);
    CHECK(loaded.error().message().find("model.safetensors") != std::string::npos);
  }
}
