#include <doctest/doctest.h>

#include <filesystem>
#include <numeric>

#include "backend/model/model_test_support.h"
#include "edge/backend/io/output_files.h"
#include "test_support.h"

using namespace edge::backend;
using edge::status_code;
namespace fs = std::filesystem;
namespace t = edge::testing;

namespace {

fs::path partial_of(const fs::path& path) {
  fs::path partial = path;
  partial += atomic_file::partial_suffix;
  return partial;
}

}  // namespace

TEST_CASE("an atomic file appears under its name only when committed") {
  t::temp_dir dir;
  const auto path = dir / "weights.bin";
  auto file = atomic_file::create(path);
  REQUIRE_MESSAGE(file.ok(), file.error().to_string());
  REQUIRE(file->write("hello, ").ok());
  REQUIRE(file->write_scalar<std::uint32_t>(0x0a21'6469u).ok());  // "id!\n" in little-endian order
  CHECK(file->position() == 11);
  CHECK_FALSE(fs::exists(path));
  REQUIRE(file->commit().ok());
  CHECK(t::read_text(path) == "hello, id!\n");
  CHECK_FALSE(fs::exists(partial_of(path)));
}

TEST_CASE("an atomic file destroyed without commit leaves nothing, and the earlier file as it was") {
  t::temp_dir dir;
  const auto path = dir / "config.json";
  t::write_text(path, "earlier");
  {
    auto file = atomic_file::create(path);
    REQUIRE(file.ok());
    REQUIRE(file->write("a later file that an error interrupts").ok());
    CHECK(fs::exists(partial_of(path)));
  }
  CHECK(t::read_text(path) == "earlier");
  CHECK_FALSE(fs::exists(partial_of(path)));
  CHECK(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()) == 1);
}

TEST_CASE("a committed atomic file replaces the earlier one") {
  t::temp_dir dir;
  const auto path = dir / "tokenizer.json";
  t::write_text(path, "earlier and longer than what replaces it");
  REQUIRE(write_text_file(path, "later").ok());
  CHECK(t::read_text(path) == "later");
}

TEST_CASE("an atomic file moved keeps its bytes and its temporary name") {
  t::temp_dir dir;
  const auto path = dir / "moved.bin";
  auto created = atomic_file::create(path);
  REQUIRE(created.ok());
  REQUIRE(created->write("first ").ok());
  atomic_file moved = std::move(created).value();
  REQUIRE(moved.write("second").ok());
  REQUIRE(moved.commit().ok());
  CHECK(t::read_text(path) == "first second");
}

TEST_CASE("writes far larger than the buffer arrive whole and in order, padding is zeros") {
  t::temp_dir dir;
  const auto path = dir / "large.bin";
  // 20 MiB in pieces of an odd size, so that pieces straddle every buffer boundary.
  constexpr std::size_t piece = 999'983;
  constexpr std::size_t pieces = 21;
  std::vector<std::uint8_t> expected(piece * pieces);
  for (std::size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<std::uint8_t>(i * 31 + i / 7);
  auto file = atomic_file::create(path);
  REQUIRE(file.ok());
  for (std::size_t p = 0; p < pieces; ++p) REQUIRE(file->write(expected.data() + p * piece, piece).ok());
  REQUIRE(file->pad_to(4096).ok());
  CHECK(file->position() % 4096 == 0);
  const auto padded_size = file->position();
  REQUIRE(file->pad_to(4096).ok());
  CHECK(file->position() == padded_size);
  REQUIRE(file->commit().ok());

  const auto bytes = t::read_bytes(path);
  REQUIRE(bytes.size() == padded_size);
  CHECK(std::memcmp(bytes.data(), expected.data(), expected.size()) == 0);
  const bool zeros = std::all_of(bytes.begin() + static_cast<std::ptrdiff_t>(expected.size()), bytes.end(),
                                 [](std::byte b) { return b == std::byte{0}; });
  CHECK(zeros);
}

TEST_CASE("an atomic file in a folder that does not exist is an error naming the file") {
  t::temp_dir dir;
  const auto file = atomic_file::create(dir / "missing" / "model.safetensors");
  REQUIRE_FALSE(file.ok());
  CHECK(file.error().code() == status_code::unavailable);
  CHECK(file.error().message().find("model.safetensors.partial") != std::string::npos);
}

TEST_CASE("an output folder is created when missing and says whether it holds files") {
  t::temp_dir dir;
  const auto folder = dir / "a" / "b";
  auto created = output_folder_has_files(folder);
  REQUIRE_MESSAGE(created.ok(), created.error().to_string());
  CHECK_FALSE(*created);
  CHECK(fs::is_directory(folder));
  t::write_text(folder / "config.json", "{}");
  CHECK(output_folder_has_files(folder).value_or(false));
  CHECK(output_folder_has_files(folder / "config.json").error().code() == status_code::invalid_argument);
}

TEST_CASE("a tensor whose callback writes other than its size is an error, and its file never appears") {
  t::temp_dir dir;
  const auto path = dir / "short.bin";
  const output_tensor tensor{.name = "w", .type = {.type = edge::kernels::dtype::bf16}, .shape = {3, 4},
                             .write = [](atomic_file& out) { return out.write(std::string(23, 'x')); }};
  CHECK(tensor.bytes() == 24);
  {
    auto file = atomic_file::create(path);
    REQUIRE(file.ok());
    const auto written = write_tensor_data(*file, tensor);
    CHECK(written.code() == status_code::internal);
    CHECK(written.message().find("\"w\"") != std::string::npos);
  }
  CHECK_FALSE(fs::exists(path));
}
