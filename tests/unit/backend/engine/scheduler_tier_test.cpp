// The lower tiers below the KV block pool, through the scheduler: evicted prefix blocks are
// spilled to host slots (and written through to disk) and restored for a later prompt, per
// tenant (salt and caps), and a session's blocks are evicted last. A block's "bytes" are its
// chain hash: each KV block holds the hash of what was written there, each host slot 32 real
// bytes that the disk tier reads and writes, moved as an executor moves them (spills, then
// restores, then block copies, then the step's tokens). After every step, every block a sequence
// reads must hold exactly its own prefix.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "edge/backend/engine/scheduler.h"
#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/backend/runtime/kv_tiers.h"
#include "test_support.h"

namespace {

using namespace edge::backend;

constexpr std::int64_t block = 4;

std::vector<std::int32_t> tokens(std::int64_t n, std::int32_t first) {
  std::vector<std::int32_t> out(static_cast<std::size_t>(n));
  std::iota(out.begin(), out.end(), first);
  return out;
}

// What a block or slot holds: the chain hash of the full block written there, or nothing.
using contents = std::optional<block_hash>;

constexpr std::size_t slot_bytes = sizeof(block_hash);

std::shared_ptr<kv_disk_tier> open_disk(const std::filesystem::path& folder, std::int64_t capacity = 1 << 20) {
  auto disk = kv_disk_tier::open({.directory = folder, .capacity_bytes = capacity, .identity = {1, 2, 3},
                                  .block_bytes = slot_bytes});
  REQUIRE_MESSAGE(disk.ok(), disk.error().message());
  return std::move(disk).value();
}

class tier_driver {
 public:
  tier_driver(std::int64_t blocks, std::int64_t slots, bool overlap = false, std::shared_ptr<kv_disk_tier> disk = nullptr)
      : pool_(blocks),
        host_memory_(static_cast<std::size_t>(slots) * slot_bytes),
        tiers_(host_memory_, slot_bytes, std::move(disk)),
        blocks_(static_cast<std::size_t>(blocks)) {
    auto s = scheduler::create({.block_size = block,
                                .max_num_seqs = 8,
                                .max_num_batched_tokens = 64,
                                .enable_prefix_caching = true,
                                .watermark = 0.0,
                                .restores_overlap_step = overlap},
                               pool_, &tiers_);
    REQUIRE_MESSAGE(s.ok(), s.error().message());
    sched_ = std::move(s).value();
  }

  void add(sequence_id id, std::int64_t prompt, std::int32_t first, std::int64_t output,
           const std::string& tenant = "default", std::int64_t cap = kv_host_tier::unlimited, bool session = false) {
    const auto added = sched_->add({.id = id,
                                    .tenant = tenant,
                                    .prompt = tokens(prompt, first),
                                    .max_tokens = output,
                                    .session = session,
                                    .caps = {.host_blocks = cap}});
    REQUIRE_MESSAGE(added.ok(), added.message());
    output_[id] = output;
    tenant_[id] = tenant;
  }

  // One step: plan, move the bytes as an executor would, check every reader, sample.
  step_plan step() {
    step_plan plan = sched_->schedule();
    for (const tier_copy& c : plan.spills) {
      const contents& held = blocks_.at(static_cast<std::size_t>(c.block));
      REQUIRE(held.has_value());  // only full, registered blocks are spilled
      std::memcpy(slot(c.slot), held->data(), slot_bytes);
    }
    for (const tier_copy& c : plan.restores) {
      block_hash h{};
      std::memcpy(h.data(), slot(c.slot), slot_bytes);
      blocks_.at(static_cast<std::size_t>(c.block)) = h;
    }
    for (const block_copy& c : plan.copies) blocks_.at(static_cast<std::size_t>(c.to)) = blocks_.at(static_cast<std::size_t>(c.from));
    // Every chunk reads the full blocks before its start: they must hold its own prefix.
    for (const scheduled_chunk& c : plan.chunks) check_prefix(c.id, c.start / block, c.block_table);
    // Its tokens are written: the blocks it fills hold its chain from now on.
    for (const scheduled_chunk& c : plan.chunks) {
      const std::int64_t end = c.start + static_cast<std::int64_t>(c.tokens.size());
      for (std::int64_t j = c.start / block; j < end / block; ++j) {
        blocks_.at(static_cast<std::size_t>(c.block_table[static_cast<std::size_t>(j)])) = chain(c.id, j);
      }
      // A partly written block holds no full block's contents.
      if (end % block != 0) blocks_.at(static_cast<std::size_t>(c.block_table[static_cast<std::size_t>(end / block)])).reset();
    }
    sched_->complete(plan);
    for (const scheduled_chunk& c : plan.chunks) {
      if (!c.samples) continue;
      sched_->append_token(c.id, 7);
      if (++generated_[c.id] >= output_.at(c.id)) {
        cached_[c.id] = sched_->cached_prompt_tokens(c.id);
        REQUIRE(sched_->remove(c.id));
      }
    }
    const auto ok = sched_->check_invariants();
    CHECK_MESSAGE(ok.ok(), ok.message());
    return plan;
  }

  // A step the executor fails to run: nothing is copied, its sequences end.
  void fail_step() {
    const step_plan plan = sched_->schedule();
    sched_->step_failed();
    for (const scheduled_chunk& c : plan.chunks) sched_->remove(c.id);
    for (const sequence_id id : plan.admitted) sched_->remove(id);
  }

  // Steps until nothing is left.
  void drain() {
    for (int i = 0; i < 1000 && !sched_->idle(); ++i) step();
    REQUIRE(sched_->idle());
  }

  std::int64_t cached(sequence_id id) const { return cached_.at(id); }
  scheduler& sched() { return *sched_; }
  kv_block_pool& pool() { return pool_; }
  kv_host_tier& tier() { return tiers_.host(); }
  kv_tiers& tiers() { return tiers_; }

 private:
  std::byte* slot(std::int32_t s) { return host_memory_.data() + static_cast<std::size_t>(s) * slot_bytes; }

  block_hash chain(sequence_id id, std::int64_t j) const {
    const auto all = sched_->tokens(id);
    block_hash h = prefix_root_hash(tenant_.at(id));
    for (std::int64_t k = 0; k <= j; ++k) h = chain_block_hash(h, all.subspan(static_cast<std::size_t>(k * block), block));
    return h;
  }

  void check_prefix(sequence_id id, std::int64_t full_blocks, std::span<const std::int32_t> table) {
    for (std::int64_t j = 0; j < full_blocks; ++j) {
      const contents& held = blocks_.at(static_cast<std::size_t>(table[static_cast<std::size_t>(j)]));
      CAPTURE(id);
      CAPTURE(j);
      REQUIRE(held.has_value());
      CHECK(*held == chain(id, j));
    }
  }

  kv_block_pool pool_;
  std::vector<std::byte> host_memory_;
  kv_tiers tiers_;
  std::vector<contents> blocks_;
  std::unique_ptr<scheduler> sched_;
  std::map<sequence_id, std::int64_t> output_;
  std::map<sequence_id, std::int64_t> generated_;
  std::map<sequence_id, std::int64_t> cached_;
  std::map<sequence_id, std::string> tenant_;
};

}  // namespace

TEST_CASE("host tier: a prefix evicted from KV memory is spilled, then copied back for the next prompt with it") {
  tier_driver t(/*blocks=*/6, /*slots=*/8);
  t.add(1, 9, 100, 1);  // two full blocks and the last token's
  t.drain();
  CHECK(t.pool().free_cached_blocks() == 2);
  // 21 tokens need all six blocks: A's two cached blocks are evicted and spilled.
  t.add(2, 21, 500, 1);
  const step_plan b = t.step();
  CHECK(b.spills.size() == 2);
  CHECK(b.restores.empty());
  t.drain();
  CHECK(t.tier().used() == 2);
  CHECK(t.sched().counters().spilled_blocks >= 2);

  // A's prompt again: both full blocks come back from the host tier, only the last token is computed.
  t.add(3, 9, 100, 1);
  const step_plan c = t.step();
  CHECK(c.restores.size() == 2);
  REQUIRE(c.chunks.size() == 1);
  CHECK(c.chunks[0].start == 8);
  t.drain();
  CHECK(t.cached(3) == 8);
  CHECK(t.sched().counters().host_tier_hits == 8);
  CHECK(t.sched().counters().restored_blocks == 2);

  // Another tenant's identical prompt finds nothing in either tier.
  t.add(4, 9, 100, 1, "other");
  const step_plan d = t.step();
  CHECK(d.restores.empty());
  t.drain();
  CHECK(t.cached(4) == 0);
}

TEST_CASE("host tier: KV memory and the host tier may each hold part of one prompt's chain") {
  tier_driver t(6, 8);
  t.add(1, 17, 100, 1);  // four full blocks
  t.drain();
  // A 13-token prompt of another chain needs four blocks: beside the two without contents it
  // evicts A's two least recently freed blocks (its last two: a sequence frees its blocks last
  // first).
  t.add(2, 13, 900, 1);
  t.drain();
  t.add(3, 17, 100, 1);
  const step_plan c = t.step();
  CHECK(c.restores.size() == 2);
  REQUIRE(c.chunks.size() == 1);
  CHECK(c.chunks[0].start == 16);
  t.drain();
  CHECK(t.cached(3) == 16);
}

TEST_CASE("host tier: a tenant at its cap replaces only its own slots") {
  // Owners are numbered as tenants are first seen: y is 1, x is 2.
  constexpr block_owner y = 1;
  constexpr block_owner x = 2;
  tier_driver t(4, 8);
  // Tenant y's two prompts of three full blocks each: the first is spilled by the second, the
  // second by x's first.
  t.add(1, 13, 100, 1, "y");
  t.drain();
  t.add(2, 13, 300, 1, "y");
  t.drain();
  t.add(10, 13, 1000, 1, "x", /*cap=*/2);
  t.drain();
  CHECK(t.tier().used_by(y) == 6);
  // Tenant x, capped at two slots, evicts block after block of its own: two free slots are
  // taken, then it replaces its own, and y keeps every slot it had.
  for (int i = 1; i < 6; ++i) {
    t.add(static_cast<sequence_id>(10 + i), 13, 1000 + 100 * i, 1, "x", 2);
    t.drain();
  }
  CHECK(t.tier().used_by(x) == 2);
  CHECK(t.tier().used_by(y) == 6);
  CHECK(t.tier().used() == 8);
  const auto ok = t.tier().check_consistency();
  CHECK_MESSAGE(ok.ok(), ok.message());
}

TEST_CASE("host tier: a tenant with a cap of zero spills nothing") {
  tier_driver t(4, 6);
  t.add(1, 13, 100, 1, "z", 0);
  t.drain();
  t.add(2, 13, 300, 1, "z", 0);
  t.drain();
  CHECK(t.tier().used() == 0);
  CHECK(t.sched().counters().spilled_blocks == 0);
}

TEST_CASE("host tier: with copies beside the step, a sequence reading a restored block computes from the next step") {
  tier_driver t(6, 8, /*overlap=*/true);
  t.add(1, 9, 100, 1);
  t.drain();
  t.add(2, 21, 500, 1);
  t.drain();
  t.add(3, 9, 100, 1);
  const step_plan admit = t.step();
  CHECK(admit.restores.size() == 2);
  CHECK(admit.admitted.size() == 1);
  CHECK(admit.chunks.empty());
  const step_plan next = t.step();
  REQUIRE(next.chunks.size() == 1);
  CHECK(next.chunks[0].start == 8);
  t.drain();
  CHECK(t.cached(3) == 8);
}

TEST_CASE("sessions: KV memory evicts a session's cached blocks after every other cached block") {
  tier_driver t(8, 0);
  t.add(1, 9, 100, 1, "default", kv_host_tier::unlimited, /*session=*/true);
  t.drain();
  t.add(2, 9, 300, 1);
  t.drain();
  CHECK(t.pool().free_cached_blocks() == 4);
  // Needs two blocks beyond the four without contents: the one-off prompt's go, though the
  // session's were freed earlier.
  t.add(3, 21, 700, 1);
  t.drain();
  t.add(4, 9, 100, 1);
  t.drain();
  CHECK(t.cached(4) == 8);
  t.add(5, 9, 300, 1);
  t.drain();
  CHECK(t.cached(5) == 0);
}

TEST_CASE("host tier: random workloads keep every block a sequence reads its own, over few blocks and slots") {
  std::mt19937 rng(20261207);
  scheduler_counters total;
  std::int64_t disk_hits = 0;
  for (int round = 0; round < 30; ++round) {
    const std::int64_t blocks = 6 + static_cast<std::int64_t>(rng() % 6);
    const std::int64_t slots = static_cast<std::int64_t>(rng() % 6);
    // Every other round with a small disk tier below the host slots.
    edge::testing::temp_dir folder;
    const bool with_disk = round % 2 == 1;
    tier_driver t(blocks, slots, /*overlap=*/rng() % 2 == 0,
                  with_disk ? open_disk(folder.path(), 8 * (96 + 1 + static_cast<std::int64_t>(slot_bytes))) : nullptr);
    const std::vector<std::string> tenants = {"a", "b", "c"};
    sequence_id next = 1;
    for (int step = 0; step < 60; ++step) {
      if (t.sched().num_waiting() < 3 && rng() % 2 == 0) {
        // Prompts from a few shared beginnings, so that chains meet in both tiers.
        const std::int64_t prompt = 1 + static_cast<std::int64_t>(rng() % static_cast<unsigned>((blocks - 2) * block));
        const auto first = static_cast<std::int32_t>(100 * (rng() % 3));
        const std::string& tenant = tenants[rng() % tenants.size()];
        const std::int64_t cap = rng() % 3 == 0 ? 1 : kv_host_tier::unlimited;
        t.add(next++, prompt, first, 1 + static_cast<std::int64_t>(rng() % 4), tenant, cap, rng() % 2 == 0);
      }
      t.step();
    }
    t.drain();
    total.spilled_blocks += t.sched().counters().spilled_blocks;
    disk_hits += t.tiers().counters().disk_hits;
    total.restored_blocks += t.sched().counters().restored_blocks;
    total.preemptions += t.sched().counters().preemptions;
  }
  MESSAGE("spilled ", total.spilled_blocks, ", restored ", total.restored_blocks, " (", disk_hits, " from disk), preemptions ",
          total.preemptions);
  CHECK(total.restored_blocks > 0);
  CHECK(disk_hits > 0);
}

TEST_CASE("disk tier: a block gone from host memory is read back from disk, and a new process finds it there") {
  edge::testing::temp_dir folder;
  {
    tier_driver t(6, /*slots=*/2, false, open_disk(folder.path()));
    t.add(1, 9, 100, 1);
    t.drain();
    t.add(2, 21, 500, 1);  // spills the two blocks of 1 (written through to disk a step later)
    t.drain();
    t.add(3, 21, 800, 1);  // spills 2's blocks over 1's in the two host slots
    t.drain();
    REQUIRE(t.tiers().disk() != nullptr);
    t.tiers().disk()->flush();
    CHECK(t.tiers().disk()->blocks() >= 4);
    t.add(4, 9, 100, 1);
    const step_plan again = t.step();
    CHECK(again.restores.size() == 2);
    t.drain();
    CHECK(t.cached(4) == 8);
    CHECK(t.tiers().counters().disk_hits == 2);
    // Another tenant's identical prompt finds nothing on disk either.
    t.add(5, 9, 100, 1, "other");
    t.drain();
    CHECK(t.cached(5) == 0);
    t.tiers().disk()->flush();
  }
  // A restarted engine: empty KV memory and host slots, the same folder.
  tier_driver restarted(6, 2, false, open_disk(folder.path()));
  restarted.add(1, 9, 100, 1);
  restarted.drain();
  CHECK(restarted.cached(1) == 8);
  CHECK(restarted.tiers().counters().disk_hits == 2);
}

TEST_CASE("disk tier: a damaged block file is dropped and the prefix recomputed, never served") {
  edge::testing::temp_dir folder;
  tier_driver t(6, 2, false, open_disk(folder.path()));
  t.add(1, 9, 100, 1);
  t.drain();
  t.add(2, 21, 500, 1);
  t.drain();
  t.add(3, 21, 800, 1);
  t.drain();
  t.tiers().disk()->flush();
  // Flip a byte in the middle of every block file of the first prompt: the first block's hash.
  const block_hash first = chain_block_hash(prefix_root_hash("default"), tokens(4, 100));
  const auto path = t.tiers().disk()->path_of(first);
  REQUIRE(std::filesystem::exists(path));
  {
    std::FILE* f = std::fopen(path.c_str(), "r+b");
    REQUIRE(f != nullptr);
    std::fseek(f, -3, SEEK_END);
    const int c = std::fgetc(f);
    std::fseek(f, -3, SEEK_END);
    std::fputc(c ^ 0x40, f);
    std::fclose(f);
  }
  t.add(4, 9, 100, 1);
  t.drain();  // the content check of every step fails if a damaged block were served
  CHECK(t.cached(4) == 0);
  CHECK(t.tiers().disk()->counters().rejected == 1);
  t.tiers().disk()->flush();
  CHECK(!std::filesystem::exists(path));
}

TEST_CASE("host tier: a step the executor did not run leaves no slot claiming the blocks it was to spill") {
  tier_driver t(6, 8);
  t.add(1, 9, 100, 1);
  t.drain();
  t.add(2, 21, 500, 1);  // would spill 1's two blocks
  t.fail_step();
  CHECK(t.tier().used() == 0);
  // 1's prompt is computed again, not restored from slots that never got its bytes.
  t.add(3, 9, 100, 1);
  t.drain();
  CHECK(t.cached(3) == 0);
}
