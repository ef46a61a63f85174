// Which blocks of the KV cache are in use, by how many sequences, and which hold reusable
// prompt prefixes. The cache (kv_cache.h) holds the memory; the pool hands out block numbers.
// Owned by the engine thread (or whatever single thread drives the executor).
//
// Every block has a reference count: the number of block tables that hold it. A block whose
// count falls to zero is free. A full block whose contents are known (registered with the hash
// of its tokens and of every token before it) is a prefix-cache entry: when it becomes free it
// keeps its contents and its hash, so a later sequence with the same prefix can take it back
// (acquire) instead of recomputing it. allocate() prefers free blocks without contents and
// otherwise evicts the free cached block that was freed longest ago (LRU); blocks a sessioned
// request held (prefer_keeping) go only once no other free cached block is left, so that an
// agent's session keeps its context while one-off prompts come and go. With record_evictions,
// the pool lists what it evicted (block, hash, owner) so that the block's contents can be kept
// in a lower tier (kv_host_tier) before the block is written again.
//
// Shared blocks are read-only: only the sequence that allocated a block writes into it, and it
// registers the block only once the block is full. Blocks are shared through the cache
// (acquire), or handed by a sequence to the choices it forks into (share): full blocks either way.
//
// Block hashes chain: hash(block i) = SHA-256(hash(block i-1) ‖ the block's token ids), and
// the chain starts from SHA-256 of the tenant's salt, so equal prompts of different tenants
// never share entries (nor reveal, by timing, that another tenant sent the same prompt).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "edge/common/sha256.h"
#include "edge/common/status.h"

namespace edge::backend {

using block_hash = sha256_digest;

// One whole block's contents (every layer's K, V and scales) copied into another block.
struct block_copy {
  std::int32_t from = 0;
  std::int32_t to = 0;
};

// A block's contents moved between KV memory and a host tier slot (kv_host_tier.h).
struct tier_copy {
  std::int32_t block = 0;
  std::int32_t slot = 0;
};

// Who registered a cached block: a number the pool's user gives each tenant (the scheduler's
// tenant numbers), for the per-tenant caps of the lower tiers.
using block_owner = std::uint32_t;

// A cached block allocate() took back: its contents are still in it until the step that
// allocated it writes there.
struct evicted_block {
  std::int32_t block = 0;
  block_hash hash{};
  block_owner owner = 0;
};

// The first link of a hash chain: what every sequence of one tenant (one salt) starts from.
block_hash prefix_root_hash(std::string_view salt);
// The hash of a full block of `tokens` following the block (or root) hashed `parent`.
block_hash chain_block_hash(const block_hash& parent, std::span<const std::int32_t> tokens);

class kv_block_pool {
 public:
  explicit kv_block_pool(std::int64_t num_blocks);

  // A free block with one reference, or nothing when every block is referenced. Takes a block
  // without contents when there is one, else evicts the least recently freed cached block.
  std::optional<std::int32_t> allocate();
  // Drops one reference; at zero the block is free (a cached block stays findable until evicted).
  void free(std::int32_t block);

  // The cached block holding the contents `hash` names, if any (whether free or in use).
  std::optional<std::int32_t> find_cached(const block_hash& hash) const;
  // One more reference to a block found with find_cached(); a free cached block leaves the
  // free list without losing its contents.
  void acquire(std::int32_t block);
  // One more reference to a referenced block, cached or not: a sequence forking hands its full
  // blocks to the sequences it forks into.
  void share(std::int32_t block);
  // Records that the referenced, full `block` holds the contents `hash` names, making it
  // findable. False when another block already holds those contents (this one stays private,
  // and is freed as a plain block) or when the block is already registered.
  bool register_full(std::int32_t block, const block_hash& hash, block_owner owner = 0);
  // The referenced `block` belongs to a session: once free and cached, it is evicted after every
  // other free cached block. Sticky until the block is evicted.
  void prefer_keeping(std::int32_t block);

  // From now on allocate() lists the cached blocks it evicts, for take_evictions().
  void record_evictions(bool on) { record_evictions_ = on; }
  // The evictions since the last call, oldest first.
  std::vector<evicted_block> take_evictions();

  std::int64_t total_blocks() const { return total_; }
  // Blocks no sequence references (allocatable): without contents plus free cached ones.
  std::int64_t free_blocks() const { return static_cast<std::int64_t>(uncached_free_.size()) + cached_free_count_; }
  // Free blocks that still hold a cached prefix.
  std::int64_t free_cached_blocks() const { return cached_free_count_; }
  // Blocks registered in the prefix cache, free or not.
  std::int64_t cached_blocks() const { return static_cast<std::int64_t>(index_.size()); }
  std::int32_t ref_count(std::int32_t block) const { return refs_[static_cast<std::size_t>(block)]; }
  bool is_cached(std::int32_t block) const { return cached_[static_cast<std::size_t>(block)]; }
  bool kept(std::int32_t block) const { return kept_[static_cast<std::size_t>(block)]; }
  block_owner owner(std::int32_t block) const { return owners_[static_cast<std::size_t>(block)]; }

  // Checks the pool's own bookkeeping (counts, lists and index agree); internal on a mismatch.
  // For tests: linear in the number of blocks.
  status check_consistency() const;

 private:
  static constexpr std::int32_t none = -1;

  struct hash_of_digest {
    std::size_t operator()(const block_hash& h) const noexcept;
  };

  void unlink_cached_free(std::int32_t block);
  void append_cached_free(std::int32_t block);

  std::int64_t total_;
  std::vector<std::int32_t> refs_;            // [total] references per block
  std::vector<bool> cached_;                  // [total] registered in index_
  std::vector<bool> kept_;                    // [total] prefer_keeping(): on the kept LRU list when free
  std::vector<block_hash> hashes_;            // [total] contents of a cached block
  std::vector<block_owner> owners_;           // [total] who registered a cached block
  std::vector<std::int32_t> uncached_free_;   // a stack: the most recently freed block is reused first
  // Free cached blocks, least recently freed first, as two doubly linked lists through lru_prev_
  // and lru_next_ ([total] each), so that a hit can take a block out of the middle in O(1):
  // list 0 the plain blocks, list 1 the kept ones (evicted only when list 0 is empty).
  std::vector<std::int32_t> lru_prev_;
  std::vector<std::int32_t> lru_next_;
  std::int32_t lru_head_[2] = {none, none};
  std::int32_t lru_tail_[2] = {none, none};
  std::int64_t cached_free_count_ = 0;
  std::unordered_map<block_hash, std::int32_t, hash_of_digest> index_;
  bool record_evictions_ = false;
  std::vector<evicted_block> evictions_;
};

}  // namespace edge::backend
