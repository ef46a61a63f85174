// The host-memory tier of the prefix cache: full KV blocks that KV memory evicted, kept in host
// memory under the same tenant-salted chain hashes (kv_block_pool.h), so that a later prompt
// with the same prefix copies them back instead of recomputing them. This class is the
// bookkeeping: which slot (one block's bytes each, in the layout of kv_slot_layout) holds which
// hash for which owner. The executor moves the bytes (batch_plan's spills and restores). Engine
// thread only.
//
// Replacement is least recently used (a slot is used when it is stored or found), with two
// rules on top:
// * a tenant at its cap replaces its own least recently used slot, never another tenant's, so a
//   tenant cannot push everyone else's sessions out by sending more;
// * a pinned slot (the source of a copy back that the current step has not done yet) is never
//   replaced until unpin_all().
//
// Because the hash chains the tenant's salt, a lookup can only ever find blocks of the tenant
// that asks; the owner recorded with a slot is for the caps alone.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <unordered_map>
#include <vector>

#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/common/status.h"

namespace edge::backend {

class kv_host_tier {
 public:
  static constexpr std::int64_t unlimited = std::numeric_limits<std::int64_t>::max();

  explicit kv_host_tier(std::int64_t slots);

  std::int64_t slots() const { return static_cast<std::int64_t>(slots_.size()); }
  std::int64_t used() const { return used_; }
  std::int64_t used_by(block_owner owner) const;

  // The slot holding `hash`, now the most recently used; nothing when the tier lacks it.
  std::optional<std::int32_t> find(const block_hash& hash);
  bool contains(const block_hash& hash) const { return index_.contains(hash); }
  // The slot holding `hash`, leaving the order of use as it is.
  std::optional<std::int32_t> slot_of(const block_hash& hash) const {
    const auto it = index_.find(hash);
    return it == index_.end() ? std::nullopt : std::optional<std::int32_t>(it->second);
  }

  // What place() did. `displaced` is the entry the slot held before (hash and owner), whose
  // bytes are still there until the slot is written.
  struct placement {
    std::int32_t slot = 0;
    bool present = false;  // the tier held `hash` already: nothing to copy
    std::optional<evicted_block> displaced;  // .block is the slot
  };
  // Where to keep the contents `hash` names, registered by `owner`, who may hold at most `cap`
  // slots: the slot already holding it, else a free slot, else (the owner at its cap) the
  // owner's own least recently used unpinned slot, else the least recently used unpinned slot.
  // Nothing when `cap` is 0 or no slot can be given. The slot is the most recently used.
  std::optional<placement> place(const block_hash& hash, block_owner owner, std::int64_t cap);

  // Forgets the slot's entry (its copy failed, or its bytes proved bad).
  void erase(std::int32_t slot);

  // `slot` is read by a copy not done yet: place() must not give it away.
  void pin(std::int32_t slot);
  // The copies of the step are done.
  void unpin_all();

  // Checks the lists, counts and index agree; internal on a mismatch. For tests.
  status check_consistency() const;

 private:
  static constexpr std::int32_t none = -1;

  struct slot_state {
    bool used = false;
    bool pinned = false;
    block_hash hash{};
    block_owner owner = 0;
    std::int32_t prev = none;  // the whole tier's LRU list
    std::int32_t next = none;
    std::int32_t owner_prev = none;  // the owner's LRU list
    std::int32_t owner_next = none;
  };
  struct owner_list {
    std::int32_t head = none;  // least recently used
    std::int32_t tail = none;
    std::int64_t count = 0;
  };
  struct hash_of_digest {
    std::size_t operator()(const block_hash& h) const noexcept;
  };

  void link(std::int32_t slot);    // as the most recently used, in both lists
  void unlink(std::int32_t slot);  // from both lists
  // The least recently used unpinned slot from `head` along `next` (whole tier or one owner).
  std::optional<std::int32_t> oldest_unpinned(std::int32_t head, bool along_owner) const;
  evicted_block drop(std::int32_t slot);

  std::vector<slot_state> slots_;
  std::vector<std::int32_t> free_;  // unused slots, a stack
  std::int32_t head_ = none;        // least recently used
  std::int32_t tail_ = none;
  std::int64_t used_ = 0;
  std::unordered_map<block_owner, owner_list> owners_;
  std::unordered_map<block_hash, std::int32_t, hash_of_digest> index_;
  std::vector<std::int32_t> pinned_;
};

}  // namespace edge::backend
