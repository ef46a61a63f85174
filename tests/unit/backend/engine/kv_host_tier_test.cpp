// The host tier's bookkeeping: least recently used replacement, per-owner caps that replace only
// the owner's own slots, and pinned slots that are never given away.
#include <doctest/doctest.h>

#include <vector>

#include "edge/backend/runtime/kv_host_tier.h"

namespace {

using namespace edge::backend;

block_hash hash_of(std::int32_t n) { return chain_block_hash(prefix_root_hash("t"), std::vector<std::int32_t>{n}); }

void check_consistent(const kv_host_tier& tier) {
  const auto ok = tier.check_consistency();
  CHECK_MESSAGE(ok.ok(), ok.message());
}

}  // namespace

TEST_CASE("host tier: blocks are found by hash; the least recently used is replaced when full") {
  kv_host_tier tier(2);
  const auto a = tier.place(hash_of(1), 1, kv_host_tier::unlimited);
  const auto b = tier.place(hash_of(2), 1, kv_host_tier::unlimited);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(!a->present);
  CHECK(a->slot != b->slot);
  CHECK(tier.find(hash_of(1)) == a->slot);  // 1 is now more recent than 2
  const auto c = tier.place(hash_of(3), 1, kv_host_tier::unlimited);
  REQUIRE(c);
  CHECK(c->slot == b->slot);
  REQUIRE(c->displaced);
  CHECK(c->displaced->hash == hash_of(2));
  CHECK(!tier.contains(hash_of(2)));
  CHECK(tier.contains(hash_of(1)));
  // Placing what is there already copies nothing.
  const auto again = tier.place(hash_of(1), 1, kv_host_tier::unlimited);
  REQUIRE(again);
  CHECK(again->present);
  CHECK(again->slot == a->slot);
  check_consistent(tier);
}

TEST_CASE("host tier: an owner at its cap replaces its own least recently used slot, never another's") {
  kv_host_tier tier(4);
  REQUIRE(tier.place(hash_of(1), 7, kv_host_tier::unlimited));
  REQUIRE(tier.place(hash_of(2), 8, 2));
  REQUIRE(tier.place(hash_of(3), 8, 2));
  // Owner 8 is at 2: its next block replaces its block 2 although a slot is free and 1 is older.
  const auto placed = tier.place(hash_of(4), 8, 2);
  REQUIRE(placed);
  REQUIRE(placed->displaced);
  CHECK(placed->displaced->hash == hash_of(2));
  CHECK(tier.used_by(8) == 2);
  CHECK(tier.used_by(7) == 1);
  CHECK(tier.contains(hash_of(1)));
  // A cap of zero keeps nothing.
  CHECK(!tier.place(hash_of(5), 9, 0));
  check_consistent(tier);
}

TEST_CASE("host tier: a pinned slot is not given away until unpinned; erase frees a slot") {
  kv_host_tier tier(1);
  const auto a = tier.place(hash_of(1), 1, kv_host_tier::unlimited);
  REQUIRE(a);
  tier.pin(a->slot);
  CHECK(!tier.place(hash_of(2), 1, kv_host_tier::unlimited));
  CHECK(tier.contains(hash_of(1)));
  tier.unpin_all();
  CHECK(tier.place(hash_of(2), 1, kv_host_tier::unlimited));
  CHECK(!tier.contains(hash_of(1)));
  tier.erase(tier.find(hash_of(2)).value());
  CHECK(tier.used() == 0);
  check_consistent(tier);
  kv_host_tier none(0);
  CHECK(!none.place(hash_of(1), 1, kv_host_tier::unlimited));
}
