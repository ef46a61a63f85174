#include <doctest/doctest.h>

#include <cstring>

#include "backend/model/model_test_support.h"
#include "edge/backend/io/safetensors.h"
#include "io_test_support.h"
#include "test_support.h"

using namespace edge::backend;
using edge::status_code;
using edge::kernels::dtype;
namespace fs = std::filesystem;
namespace t = edge::testing;

namespace {

void check_data(const tensor_view& read, int start) {
  CAPTURE(read.name);
  const auto expected = t::counting_bytes(read.bytes(), start);
  CHECK(std::memcmp(read.data, expected.data(), expected.size()) == 0);
}

std::uint64_t header_length(const fs::path& file) {
  const auto bytes = t::read_bytes(file);
  std::uint64_t length = 0;
  std::memcpy(&length, bytes.data(), sizeof(length));
  return length;
}

}  // namespace

TEST_CASE("safetensors written in one file read back with dtypes, shapes, data and metadata") {
  t::temp_dir dir;
  const std::vector<output_tensor> tensors = {
      t::counting_tensor("embed", {.type = dtype::bf16}, {3, 5}, 0),
      t::counting_tensor("norm", {.type = dtype::f32}, {7}, 40),
      t::counting_tensor("q \"proj\"\\weight", {.type = dtype::fp8_e4m3}, {2, 3}, 80),
      t::counting_tensor("packed", {.encoding = tensor_encoding::int32}, {2, 1}, 90),
      t::counting_tensor("shape", {.encoding = tensor_encoding::int64}, {2}, 110),
  };
  const safetensors_metadata metadata = {{"edgeinfer_quantized", "int4"}, {"note", "a \"quoted\" value"}};
  REQUIRE(write_safetensors_weights(dir.path(), tensors, metadata, 1 << 20).ok());
  CHECK_FALSE(fs::exists(dir / std::string(safetensors_index_file)));
  const auto file = dir / std::string(safetensors_single_file);
  // The 8-byte length and the header end where the data can start aligned.
  CHECK((8 + header_length(file)) % 8 == 0);

  const auto bytes = t::read_bytes(file);
  const auto parsed = parse_safetensors(bytes);
  REQUIRE_MESSAGE(parsed.ok(), parsed.error().to_string());
  CHECK(parsed->metadata == std::map<std::string, std::string>{
                                {"format", "pt"}, {"edgeinfer_quantized", "int4"}, {"note", "a \"quoted\" value"}});
  REQUIRE(parsed->tensors.size() == tensors.size());
  const int starts[] = {0, 40, 80, 90, 110};
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& read = parsed->tensors[i];
    CHECK(read.name == tensors[i].name);
    CHECK(read.shape == tensors[i].shape);
    CHECK(read.encoding == tensors[i].type.encoding);
    if (read.encoding == tensor_encoding::elements) CHECK(read.type == tensors[i].type.type);
    CHECK(read.bytes() == tensors[i].bytes());
    check_data(read, starts[i]);
  }
  // The tensors lie back to back in the order given.
  CHECK(parsed->tensors[1].data == parsed->tensors[0].data + 30);
}

TEST_CASE("safetensors past the shard limit: shards in order, an index, every tensor once") {
  t::temp_dir dir;
  // 4000, 4000, 12000 (over the limit on its own) and 100 bytes, with a 10000-byte limit.
  const std::vector<output_tensor> tensors = {
      t::counting_tensor("a", {.type = dtype::f32}, {1000}, 1),
      t::counting_tensor("b", {.type = dtype::f16}, {2000}, 2),
      t::counting_tensor("c", {.type = dtype::f32}, {3, 1000}, 3),
      t::counting_tensor("d", {.type = dtype::bf16}, {50}, 4),
  };
  REQUIRE(write_safetensors_weights(dir.path(), tensors, {}, 10'000).ok());
  CHECK_FALSE(fs::exists(dir / std::string(safetensors_single_file)));
  const char* shard_names[] = {"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                               "model-00003-of-00003.safetensors"};
  for (const auto* name : shard_names) {
    CAPTURE(name);
    CHECK(fs::exists(dir / name));
    CHECK((8 + header_length(dir / name)) % 8 == 0);
  }
  const auto index = t::read_text(dir / std::string(safetensors_index_file));
  CHECK(index.find("\"total_size\": 20100") != std::string::npos);
  CHECK(index.find("\"b\": \"model-00001-of-00003.safetensors\"") != std::string::npos);
  CHECK(index.find("\"c\": \"model-00002-of-00003.safetensors\"") != std::string::npos);
  CHECK(index.find("\"d\": \"model-00003-of-00003.safetensors\"") != std::string::npos);

  std::vector<std::shared_ptr<const mapped_file>> mappings;
  const auto read = load_safetensors_folder(dir.path(), mappings);
  REQUIRE_MESSAGE(read.ok(), read.error().to_string());
  CHECK(mappings.size() == 3);
  REQUIRE(read->size() == 4);
  for (const auto& tensor : *read) check_data(tensor, tensor.name[0] - 'a' + 1);
}

TEST_CASE("a type safetensors cannot hold is refused before any file is written") {
  t::temp_dir dir;
  const std::vector<output_tensor> tensors = {
      t::counting_tensor("fine", {.type = dtype::f32}, {4}, 0),
      t::counting_tensor("blocks", {.type = dtype::f16, .encoding = tensor_encoding::ggml_q4_0}, {1, 32}, 0),
  };
  const auto written = write_safetensors_weights(dir.path(), tensors, {}, 1 << 20);
  CHECK(written.code() == status_code::invalid_argument);
  CHECK(written.message().find("\"blocks\"") != std::string::npos);
  CHECK(written.message().find("Q4_0") != std::string::npos);
  CHECK(fs::is_empty(dir.path()));
}

TEST_CASE("a tensor that writes too few bytes fails the write and leaves no safetensors file") {
  t::temp_dir dir;
  std::vector<output_tensor> tensors = {t::counting_tensor("short", {.type = dtype::f32}, {4}, 0)};
  tensors[0].write = [](atomic_file& out) { return out.write(std::string(15, 'x')); };
  CHECK(write_safetensors_weights(dir.path(), tensors, {}, 1 << 20).code() == status_code::internal);
  CHECK(fs::is_empty(dir.path()));
}
