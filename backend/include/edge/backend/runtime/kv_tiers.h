// The tiers of the prefix cache below KV memory, as the scheduler uses them: host memory
// (kv_host_tier's bookkeeping over the executor's host slots) and, optionally, a folder on a
// local disk (kv_disk_tier), all under the tenant-salted chain hashes of kv_block_pool.h.
//
// * A cached block that KV memory evicts is kept in a host slot (keep(): the scheduler plans the
//   copy, a spill), under its tenant's host cap. With a disk tier, every block spilled is also
//   written through to disk once the step that spilled it is done, under the tenant's disk cap:
//   the disk holds what the host tier holds and more, and survives restarts.
// * find() returns the host slot holding a block; a block only on disk is first read into a host
//   slot (synchronously, on the engine thread; a read that fails drops the file). The scheduler
//   then plans the copy back (a restore).
// * The slots of the step's spills and restores are pinned until the step is done (step_done(),
//   or step_failed() when the executor did not run it), so that nothing reuses a slot whose copy
//   is not done. A failed step's spills never happened: their slots are forgotten.
//
// A tenant's caps are the latest its requests gave (owner()); a tenant is numbered once and keeps
// its number (its blocks outlive its requests). Engine thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/backend/runtime/kv_disk_tier.h"
#include "edge/backend/runtime/kv_host_tier.h"
#include "edge/common/status.h"

namespace edge::backend {

// What one tenant's blocks may take in the lower tiers.
struct tier_caps {
  std::int64_t host_blocks = kv_host_tier::unlimited;
  std::int64_t disk_bytes = kv_disk_tier::unlimited;
};

struct kv_tier_counters {
  std::int64_t disk_hits = 0;      // blocks read from disk into host slots
  std::int64_t disk_failures = 0;  // blocks the disk index had and could not give
};

class kv_tiers {
 public:
  // `host_memory` holds the host slots ([slots, block_bytes], the executor's); `disk` may be
  // null. `finish_copies` waits until the executor's copies of earlier steps are done (they may
  // still read or write host slots on a GPU); it runs before this class first touches host memory
  // in a step.
  kv_tiers(std::span<std::byte> host_memory, std::size_t block_bytes, std::shared_ptr<kv_disk_tier> disk,
           std::function<void()> finish_copies = {});

  // The number `tenant`'s blocks carry; its caps are now `caps`.
  block_owner owner(const std::string& tenant, const tier_caps& caps);
  // The slot the evicted block is to be copied into, or nothing (kept already, or no room
  // within its owner's cap).
  std::optional<std::int32_t> keep(const evicted_block& e);
  // The host slot holding `hash`, which `owner` asks for, reading it from disk when only there.
  std::optional<std::int32_t> find(const block_hash& hash, block_owner owner);
  // A step is being planned.
  void begin_step();
  // The executor ran the step planned: its spills are written through, its slots unpinned.
  void step_done();
  // The executor did not run it: the slots its spills were to fill are forgotten.
  void step_failed();

  kv_host_tier& host() { return host_; }
  const kv_host_tier& host() const { return host_; }
  kv_disk_tier* disk() { return disk_.get(); }
  const kv_disk_tier* disk() const { return disk_.get(); }
  std::size_t block_bytes() const { return block_bytes_; }
  const kv_tier_counters& counters() const { return counters_; }

  status check_consistency() const { return host_.check_consistency(); }

 private:
  struct owner_state {
    std::string tenant;
    tier_caps caps;
  };
  struct spilled {
    std::int32_t slot = 0;
    block_hash hash{};
    block_owner owner = 0;
  };

  std::span<std::byte> slot_bytes(std::int32_t slot) const;
  void touch_host_memory();
  const tier_caps& caps_of(block_owner owner) const;

  std::span<std::byte> host_memory_;
  std::size_t block_bytes_;
  kv_host_tier host_;
  std::shared_ptr<kv_disk_tier> disk_;
  std::function<void()> finish_copies_;
  bool copies_finished_ = false;  // finish_copies_ ran in this step
  std::unordered_map<std::string, block_owner> numbers_;
  std::vector<owner_state> owners_;  // [owner - 1]
  std::vector<spilled> spills_;      // the step's spills, pinned until it is done or failed
  kv_tier_counters counters_;
};

}  // namespace edge::backend
