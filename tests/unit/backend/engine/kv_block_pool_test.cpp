// The KV block pool: reference counts, the prefix cache's chained hashes and salts, and LRU
// eviction of free cached blocks.
#include <doctest/doctest.h>

#include <vector>

#include "edge/backend/runtime/kv_block_pool.h"

namespace {

using namespace edge::backend;

void check_consistent(const kv_block_pool& pool) {
  const auto ok = pool.check_consistency();
  CHECK_MESSAGE(ok.ok(), ok.message());
}

}  // namespace

TEST_CASE("blocks are handed out once, counted by reference, and come back when the last holder frees them") {
  kv_block_pool pool(3);
  std::vector<std::int32_t> got;
  for (int i = 0; i < 3; ++i) {
    const auto b = pool.allocate();
    REQUIRE(b);
    got.push_back(*b);
    CHECK(pool.ref_count(*b) == 1);
  }
  CHECK(got[0] != got[1]);
  CHECK(got[1] != got[2]);
  CHECK(got[0] != got[2]);
  CHECK(!pool.allocate());
  CHECK(pool.free_blocks() == 0);
  pool.free(got[1]);
  CHECK(pool.free_blocks() == 1);
  CHECK(pool.allocate() == got[1]);
  check_consistent(pool);
}

TEST_CASE("block hashes chain: a block's hash depends on everything before it and on the salt") {
  const std::vector<std::int32_t> a = {1, 2, 3, 4};
  const std::vector<std::int32_t> b = {5, 6, 7, 8};
  const block_hash root = prefix_root_hash("tenant-1");
  CHECK(root == prefix_root_hash("tenant-1"));
  CHECK(root != prefix_root_hash("tenant-2"));
  CHECK(root != prefix_root_hash(""));
  const block_hash ha = chain_block_hash(root, a);
  CHECK(ha == chain_block_hash(prefix_root_hash("tenant-1"), a));
  // The same tokens after a different beginning, or for another tenant, hash differently.
  CHECK(chain_block_hash(ha, b) != chain_block_hash(chain_block_hash(root, b), b));
  CHECK(chain_block_hash(ha, b) != chain_block_hash(chain_block_hash(prefix_root_hash("tenant-2"), a), b));
  CHECK(chain_block_hash(root, a) != chain_block_hash(root, b));
  // Token ids are hashed as whole 32-bit words: {1, 256} is not {256, 1} nor {257}.
  CHECK(chain_block_hash(root, std::vector<std::int32_t>{1, 256}) != chain_block_hash(root, std::vector<std::int32_t>{256, 1}));
  CHECK(chain_block_hash(root, std::vector<std::int32_t>{1, 256}) != chain_block_hash(root, std::vector<std::int32_t>{257}));
}

TEST_CASE("a registered block is found while in use and after it is freed, until it is evicted") {
  kv_block_pool pool(2);
  const block_hash h = chain_block_hash(prefix_root_hash("t"), std::vector<std::int32_t>{1, 2});
  const auto b = *pool.allocate();
  CHECK(!pool.find_cached(h));
  CHECK(pool.register_full(b, h));
  CHECK(pool.is_cached(b));
  CHECK(pool.find_cached(h) == b);

  // Shared while in use: two references.
  pool.acquire(b);
  CHECK(pool.ref_count(b) == 2);
  pool.free(b);
  pool.free(b);
  // Free, but its contents are kept and findable.
  CHECK(pool.free_blocks() == 2);
  CHECK(pool.free_cached_blocks() == 1);
  CHECK(pool.find_cached(h) == b);
  check_consistent(pool);

  // Taken back from the free list by a hit: no longer free.
  pool.acquire(b);
  CHECK(pool.free_blocks() == 1);
  CHECK(pool.free_cached_blocks() == 0);
  pool.free(b);

  // allocate() takes the empty block first, then evicts the cached one.
  const auto empty = pool.allocate();
  REQUIRE(empty);
  CHECK(*empty != b);
  CHECK(pool.find_cached(h) == b);
  const auto evicted = pool.allocate();
  CHECK(evicted == b);
  CHECK(!pool.find_cached(h));
  CHECK(!pool.is_cached(b));
  check_consistent(pool);
}

TEST_CASE("free cached blocks are evicted least recently freed first") {
  kv_block_pool pool(3);
  const block_hash root = prefix_root_hash("t");
  std::vector<std::int32_t> blocks;
  std::vector<block_hash> hashes;
  for (std::int32_t i = 0; i < 3; ++i) {
    blocks.push_back(*pool.allocate());
    hashes.push_back(chain_block_hash(root, std::vector<std::int32_t>{i}));
    REQUIRE(pool.register_full(blocks.back(), hashes.back()));
  }
  // Freed in the order 2, 0, 1; block 0 is then used again (a hit) and freed last.
  pool.free(blocks[2]);
  pool.free(blocks[0]);
  pool.free(blocks[1]);
  pool.acquire(blocks[0]);
  pool.free(blocks[0]);
  CHECK(pool.allocate() == blocks[2]);
  CHECK(pool.allocate() == blocks[1]);
  CHECK(pool.allocate() == blocks[0]);
  CHECK(!pool.find_cached(hashes[0]));
  check_consistent(pool);
}

TEST_CASE("a second block with contents already cached stays private") {
  kv_block_pool pool(2);
  const block_hash h = chain_block_hash(prefix_root_hash("t"), std::vector<std::int32_t>{9});
  const auto first = *pool.allocate();
  const auto second = *pool.allocate();
  CHECK(pool.register_full(first, h));
  CHECK(!pool.register_full(second, h));
  CHECK(!pool.register_full(first, h));  // already registered
  CHECK(!pool.is_cached(second));
  pool.free(second);
  CHECK(pool.free_cached_blocks() == 0);
  CHECK(pool.find_cached(h) == first);
  check_consistent(pool);
}
