#include <doctest/doctest.h>

#include <cstring>
#include <limits>

#include "backend/model/model_test_support.h"
#include "edge/backend/io/gguf.h"
#include "io_test_support.h"
#include "test_support.h"

using namespace edge::backend;
using edge::status_code;
using edge::kernels::dtype;
namespace fs = std::filesystem;
namespace t = edge::testing;

TEST_CASE("GGUF metadata written reads back with its types and values") {
  t::temp_dir dir;
  gguf_metadata_writer keys;
  keys.add_u32("u32", 4'000'000'000u);
  keys.add_u64("u64", std::numeric_limits<std::uint64_t>::max());
  keys.add_f32("f32", 0.25f);
  keys.add_bool("yes", true);
  keys.add_bool("no", false);
  keys.add_string("text", "h\xc3\xa9llo \"quoted\"");
  const std::vector<std::string> strings = {"a", "", "bc"};
  keys.add_strings("strings", strings);
  const std::vector<std::int32_t> ints = {-1, 0, 2'000'000'000};
  keys.add_i32s("ints", ints);
  keys.add("i64", gguf_value{std::int64_t{-5}});
  keys.add("f64", gguf_value{-2.5});
  keys.add("nested", gguf_value{gguf_array{gguf_value{gguf_array{gguf_value{std::uint64_t{1}}}}, gguf_value{gguf_array{}}}});
  CHECK(keys.count() == 11);
  REQUIRE(write_gguf(dir / "keys.gguf", keys, {}).ok());

  const auto file = load_gguf(dir / "keys.gguf");
  REQUIRE_MESSAGE(file.ok(), file.error().to_string());
  CHECK(file->version == 3);
  CHECK(file->metadata.size() == 11);
  CHECK(file->tensors.empty());
  CHECK(file->find("u32")->as_int() == 4'000'000'000);
  CHECK(std::get<std::uint64_t>(file->find("u64")->value) == std::numeric_limits<std::uint64_t>::max());
  CHECK(file->find("f32")->as_number() == 0.25);
  CHECK(file->find("yes")->as_bool() == true);
  CHECK(file->find("no")->as_bool() == false);
  CHECK(*file->find("text")->as_string() == "h\xc3\xa9llo \"quoted\"");
  const auto* read_strings = file->find("strings")->as_array();
  REQUIRE(read_strings != nullptr);
  REQUIRE(read_strings->size() == 3);
  CHECK(*(*read_strings)[2].as_string() == "bc");
  const auto* read_ints = file->find("ints")->as_array();
  REQUIRE(read_ints != nullptr);
  CHECK((*read_ints)[0].as_int() == -1);
  CHECK((*read_ints)[2].as_int() == 2'000'000'000);
  CHECK(file->find("i64")->as_int() == -5);
  CHECK(file->find("f64")->as_number() == -2.5);
  const auto* nested = file->find("nested")->as_array();
  REQUIRE(nested != nullptr);
  REQUIRE(nested->size() == 2);
  REQUIRE((*nested)[0].as_array() != nullptr);
  CHECK((*nested)[0].as_array()->front().as_int() == 1);
  CHECK((*nested)[1].as_array()->empty());
  // No tensors: the (empty) data section still starts aligned.
  CHECK(fs::file_size(dir / "keys.gguf") % gguf_default_alignment == 0);
}

TEST_CASE("a parsed GGUF's metadata written again is the same bytes the second time") {
  t::temp_dir dir;
  const auto stories = load_gguf(t::stories260k_dir() / "stories260K.gguf");
  REQUIRE(stories.ok());
  const auto rewrite = [&](const gguf_file& source, const fs::path& path) {
    gguf_metadata_writer keys;
    for (const auto& [key, value] : source.metadata) keys.add(key, value);
    REQUIRE(write_gguf(path, keys, {}).ok());
  };
  rewrite(*stories, dir / "once.gguf");
  const auto once = load_gguf(dir / "once.gguf");
  REQUIRE(once.ok());
  CHECK(once->metadata.size() == stories->metadata.size());
  CHECK(*once->find("tokenizer.ggml.model")->as_string() == "llama");
  CHECK(once->find("tokenizer.ggml.tokens")->as_array()->size() == 512);
  CHECK(once->find("llama.attention.layer_norm_rms_epsilon")->as_number() ==
        stories->find("llama.attention.layer_norm_rms_epsilon")->as_number());
  rewrite(*once, dir / "twice.gguf");
  CHECK(t::read_bytes(dir / "once.gguf") == t::read_bytes(dir / "twice.gguf"));
}

TEST_CASE("GGUF tensors written read back with shapes, types and data, at aligned offsets") {
  t::temp_dir dir;
  const auto q8_rows = static_cast<std::size_t>(2 * ggml_block_traits::q8_0_bytes);
  const std::vector<output_tensor> tensors = {
      t::tensor_of("matrix", {.type = dtype::f32}, {2, 3}, t::f32_bytes({1, 2, 3, 4, 5, 6})),
      t::tensor_of("vector", {.type = dtype::bf16}, {5}, t::counting_bytes(10, 7)),
      t::tensor_of("blocks", {.type = dtype::f16, .encoding = tensor_encoding::ggml_q8_0}, {2, 32},
                t::counting_bytes(q8_rows, 100)),
  };
  gguf_metadata_writer keys;
  keys.add_string("general.architecture", "llama");
  REQUIRE(write_gguf(dir / "tensors.gguf", keys, tensors).ok());

  const auto file = load_gguf(dir / "tensors.gguf");
  REQUIRE_MESSAGE(file.ok(), file.error().to_string());
  CHECK(file->data_offset % gguf_default_alignment == 0);
  REQUIRE(file->tensors.size() == 3);
  const auto* data_start = file->file->bytes().data() + file->data_offset;
  for (const auto& written : tensors) {
    CAPTURE(written.name);
    const auto* read = file->find_tensor(written.name);
    REQUIRE(read != nullptr);
    CHECK(read->shape == written.shape);
    CHECK(read->type == written.type.type);
    CHECK(read->encoding == written.type.encoding);
    CHECK(read->bytes() == written.bytes());
    CHECK((read->data - data_start) % static_cast<std::ptrdiff_t>(gguf_default_alignment) == 0);
  }
  CHECK(t::element(*file->find_tensor("matrix"), 5) == 6.0f);
  const auto* vector = file->find_tensor("vector");
  CHECK(std::memcmp(vector->data, t::counting_bytes(10, 7).data(), 10) == 0);
  const auto* blocks = file->find_tensor("blocks");
  CHECK(std::memcmp(blocks->data, t::counting_bytes(q8_rows, 100).data(), q8_rows) == 0);
}

TEST_CASE("a tensor type GGUF has no number for is refused before any file is written") {
  t::temp_dir dir;
  const std::vector<output_tensor> tensors = {
      t::tensor_of("codes", {.type = dtype::fp8_e4m3}, {4}, t::counting_bytes(4, 0)),
  };
  const auto written = write_gguf(dir / "fp8.gguf", {}, tensors);
  CHECK(written.code() == status_code::invalid_argument);
  CHECK(written.message().find("\"codes\"") != std::string::npos);
  CHECK(written.message().find("F8_E4M3") != std::string::npos);
  CHECK(fs::is_empty(dir.path()));
}
