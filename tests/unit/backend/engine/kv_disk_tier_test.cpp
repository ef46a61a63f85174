// The disk tier's files: what is put comes back, across a reopen; short, damaged, foreign and
// half-written files are dropped (at open or at read), never served; the capacity and each
// tenant's cap are kept, a tenant at its cap replacing only its own files.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include "edge/backend/runtime/kv_disk_tier.h"
#include "test_support.h"

namespace {

using namespace edge::backend;
namespace fs = std::filesystem;

constexpr std::size_t block_bytes = 256;

block_hash hash_of(std::int32_t n) { return chain_block_hash(prefix_root_hash("t"), std::vector<std::int32_t>{n}); }

std::vector<std::byte> block_of(std::int32_t n) {
  std::vector<std::byte> out(block_bytes);
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::byte>((static_cast<std::size_t>(n) * 31 + i) & 0xFF);
  return out;
}

std::unique_ptr<kv_disk_tier> open(const fs::path& dir, std::int64_t capacity = 1 << 20, std::uint8_t identity = 1) {
  auto tier = kv_disk_tier::open({.directory = dir, .capacity_bytes = capacity, .identity = {identity},
                                  .block_bytes = block_bytes});
  REQUIRE_MESSAGE(tier.ok(), tier.error().message());
  return std::move(tier).value();
}

bool get_equals(kv_disk_tier& tier, std::int32_t n) {
  std::vector<std::byte> out(block_bytes);
  return tier.get(hash_of(n), out) && out == block_of(n);
}

void write_bytes(const fs::path& path, std::size_t at, std::span<const std::byte> bytes) {
  std::FILE* f = std::fopen(path.c_str(), "r+b");
  REQUIRE(f != nullptr);
  std::fseek(f, static_cast<long>(at), SEEK_SET);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

}  // namespace

TEST_CASE("disk tier: blocks come back, from the queue before they are written and from files after, and after a reopen") {
  edge::testing::temp_dir dir;
  {
    auto tier = open(dir.path());
    for (std::int32_t n = 0; n < 5; ++n) CHECK(tier->put(hash_of(n), "a", kv_disk_tier::unlimited, block_of(n)));
    CHECK(get_equals(*tier, 3));  // perhaps still queued
    tier->flush();
    CHECK(tier->counters().written == 5);
    for (std::int32_t n = 0; n < 5; ++n) CHECK(get_equals(*tier, n));
    CHECK(!tier->contains(hash_of(9)));
    std::vector<std::byte> out(block_bytes);
    CHECK(!tier->get(hash_of(9), out));
    CHECK(tier->used_by("a") == 5 * tier->file_bytes(1));
  }
  auto reopened = open(dir.path());
  CHECK(reopened->blocks() == 5);
  CHECK(reopened->used_by("a") == 5 * reopened->file_bytes(1));
  for (std::int32_t n = 0; n < 5; ++n) CHECK(get_equals(*reopened, n));
  // Another identity (model or KV layout) sees none of them.
  auto other = open(dir.path(), 1 << 20, 2);
  CHECK(other->blocks() == 0);
}

TEST_CASE("disk tier: damaged, short, foreign and half-written files are dropped, never served") {
  edge::testing::temp_dir dir;
  fs::path folder;
  {
    auto tier = open(dir.path());
    for (std::int32_t n = 0; n < 4; ++n) CHECK(tier->put(hash_of(n), "a", kv_disk_tier::unlimited, block_of(n)));
    tier->flush();
    folder = tier->folder();
    // Damage found at read: a flipped byte in the block.
    const std::byte flipped[1] = {std::byte{0x5A}};
    write_bytes(tier->path_of(hash_of(0)), static_cast<std::size_t>(tier->file_bytes(1)) - 10, flipped);
    CHECK(!get_equals(*tier, 0));
    CHECK(tier->counters().rejected == 1);
    CHECK(!tier->contains(hash_of(0)));
    tier->flush();
    CHECK(!fs::exists(tier->path_of(hash_of(0))));
    // A short file and a file under another block's name, found at read.
    fs::resize_file(tier->path_of(hash_of(1)), 100);
    CHECK(!get_equals(*tier, 1));
    fs::copy_file(tier->path_of(hash_of(3)), tier->path_of(hash_of(2)), fs::copy_options::overwrite_existing);
    CHECK(!get_equals(*tier, 2));
    CHECK(tier->counters().rejected == 3);
    CHECK(get_equals(*tier, 3));
  }
  // Found at open: a short file, a block of another identity under our folder, a write a crash
  // interrupted, and a file that is not a block (left alone).
  {
    auto tier = open(dir.path());
    CHECK(tier->put(hash_of(5), "a", kv_disk_tier::unlimited, block_of(5)));
    CHECK(tier->put(hash_of(6), "a", kv_disk_tier::unlimited, block_of(6)));
    tier->flush();
  }
  const auto name_of = [&](std::int32_t n) {
    auto tier = open(dir.path());
    return tier->path_of(hash_of(n));
  };
  const fs::path three = name_of(3);
  const fs::path five = name_of(5);
  const fs::path six = name_of(6);
  fs::resize_file(five, fs::file_size(five) - 1);
  const std::byte foreign[1] = {std::byte{0x77}};
  write_bytes(six, 16, foreign);  // the identity's first byte
  fs::copy_file(three, folder / "0123.kvb.tmp");
  std::FILE* note = std::fopen((folder / "README").c_str(), "wb");
  REQUIRE(note != nullptr);
  std::fclose(note);
  auto tier = open(dir.path());
  CHECK(tier->counters().rejected == 2);
  CHECK(!tier->contains(hash_of(5)));
  CHECK(!tier->contains(hash_of(6)));
  CHECK(!fs::exists(five));
  CHECK(!fs::exists(six));
  CHECK(!fs::exists(folder / "0123.kvb.tmp"));
  CHECK(fs::exists(folder / "README"));
  CHECK(get_equals(*tier, 3));
}

TEST_CASE("disk tier: the capacity evicts the least recently used; a tenant at its cap replaces only its own files") {
  edge::testing::temp_dir dir;
  const std::int64_t file = 96 + 1 + static_cast<std::int64_t>(block_bytes);  // header, a one-byte name, the block
  auto tier = open(dir.path(), 6 * file);
  for (std::int32_t n = 0; n < 3; ++n) CHECK(tier->put(hash_of(n), "b", kv_disk_tier::unlimited, block_of(n)));
  CHECK(tier->file_bytes(1) == file);
  // Tenant c, capped at two files, puts five: it keeps its last two, and b keeps all three.
  for (std::int32_t n = 10; n < 15; ++n) CHECK(tier->put(hash_of(n), "c", 2 * file, block_of(n)));
  CHECK(tier->used_by("c") == 2 * file);
  CHECK(tier->used_by("b") == 3 * file);
  CHECK(tier->contains(hash_of(13)));
  CHECK(tier->contains(hash_of(14)));
  CHECK(!tier->contains(hash_of(10)));
  // A cap under one file keeps nothing.
  CHECK(!tier->put(hash_of(20), "d", file - 1, block_of(20)));
  // Over the capacity (six files), the least recently used go, whoever's: b's 0 and 2, not its
  // 1, which was read last.
  CHECK(get_equals(*tier, 1));
  CHECK(tier->put(hash_of(30), "e", kv_disk_tier::unlimited, block_of(30)));
  CHECK(tier->put(hash_of(31), "e", kv_disk_tier::unlimited, block_of(31)));
  CHECK(tier->put(hash_of(32), "e", kv_disk_tier::unlimited, block_of(32)));
  CHECK(tier->used_bytes() <= 6 * file);
  CHECK(tier->contains(hash_of(1)));
  CHECK(!tier->contains(hash_of(0)));
  CHECK(!tier->contains(hash_of(2)));
  tier->flush();
  CHECK(tier->counters().evicted >= 5);
  // A smaller size at the next open drops the oldest.
  tier.reset();
  auto smaller = open(dir.path(), 2 * file);
  CHECK(smaller->blocks() == 2);
}
