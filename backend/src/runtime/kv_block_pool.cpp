#include "edge/backend/runtime/kv_block_pool.h"

#include <cassert>
#include <cstring>

#include "edge/common/format.h"

namespace edge::backend {

block_hash prefix_root_hash(std::string_view salt) {
  sha256_hasher hasher;
  // A domain prefix keeps a root from ever equalling a block hash.
  hasher.update(std::string_view("edgeinfer prefix root\n"));
  hasher.update(salt);
  return hasher.finish();
}

block_hash chain_block_hash(const block_hash& parent, std::span<const std::int32_t> tokens) {
  sha256_hasher hasher;
  hasher.update(std::as_bytes(std::span(parent)));
  // Token ids as little-endian 32-bit words, whatever the host's byte order.
  for (const std::int32_t id : tokens) {
    const auto u = static_cast<std::uint32_t>(id);
    const std::byte word[4] = {std::byte(u & 0xFF), std::byte((u >> 8) & 0xFF), std::byte((u >> 16) & 0xFF),
                               std::byte(u >> 24)};
    hasher.update(std::span<const std::byte>(word));
  }
  return hasher.finish();
}

std::size_t kv_block_pool::hash_of_digest::operator()(const block_hash& h) const noexcept {
  // The digest is already uniformly distributed: any eight of its bytes make a good hash.
  std::size_t value = 0;
  std::memcpy(&value, h.data(), sizeof(value));
  return value;
}

kv_block_pool::kv_block_pool(std::int64_t num_blocks)
    : total_(num_blocks),
      refs_(static_cast<std::size_t>(num_blocks), 0),
      cached_(static_cast<std::size_t>(num_blocks), false),
      kept_(static_cast<std::size_t>(num_blocks), false),
      hashes_(static_cast<std::size_t>(num_blocks)),
      owners_(static_cast<std::size_t>(num_blocks), 0),
      lru_prev_(static_cast<std::size_t>(num_blocks), none),
      lru_next_(static_cast<std::size_t>(num_blocks), none) {
  uncached_free_.reserve(static_cast<std::size_t>(num_blocks));
  for (std::int64_t b = num_blocks - 1; b >= 0; --b) uncached_free_.push_back(static_cast<std::int32_t>(b));
}

std::optional<std::int32_t> kv_block_pool::allocate() {
  std::int32_t block = none;
  if (!uncached_free_.empty()) {
    block = uncached_free_.back();
    uncached_free_.pop_back();
  } else if (lru_head_[0] != none || lru_head_[1] != none) {
    block = lru_head_[0] != none ? lru_head_[0] : lru_head_[1];
    const auto b = static_cast<std::size_t>(block);
    unlink_cached_free(block);
    index_.erase(hashes_[b]);
    if (record_evictions_) evictions_.push_back({.block = block, .hash = hashes_[b], .owner = owners_[b]});
    cached_[b] = false;
  } else {
    return std::nullopt;
  }
  kept_[static_cast<std::size_t>(block)] = false;
  refs_[static_cast<std::size_t>(block)] = 1;
  return block;
}

void kv_block_pool::free(std::int32_t block) {
  assert(block >= 0 && block < total_);
  auto& refs = refs_[static_cast<std::size_t>(block)];
  assert(refs > 0 && "freeing a block nobody holds");
  if (--refs > 0) return;
  if (cached_[static_cast<std::size_t>(block)]) {
    append_cached_free(block);
  } else {
    uncached_free_.push_back(block);
  }
}

std::optional<std::int32_t> kv_block_pool::find_cached(const block_hash& hash) const {
  const auto it = index_.find(hash);
  if (it == index_.end()) return std::nullopt;
  return it->second;
}

void kv_block_pool::acquire(std::int32_t block) {
  assert(block >= 0 && block < total_);
  assert(cached_[static_cast<std::size_t>(block)] && "only cached blocks are shared");
  auto& refs = refs_[static_cast<std::size_t>(block)];
  if (refs++ == 0) unlink_cached_free(block);
}

void kv_block_pool::share(std::int32_t block) {
  assert(block >= 0 && block < total_);
  assert(refs_[static_cast<std::size_t>(block)] > 0 && "only a held block is shared");
  ++refs_[static_cast<std::size_t>(block)];
}

bool kv_block_pool::register_full(std::int32_t block, const block_hash& hash, block_owner owner) {
  assert(block >= 0 && block < total_);
  assert(refs_[static_cast<std::size_t>(block)] > 0);
  if (cached_[static_cast<std::size_t>(block)]) return false;
  if (!index_.emplace(hash, block).second) return false;
  cached_[static_cast<std::size_t>(block)] = true;
  hashes_[static_cast<std::size_t>(block)] = hash;
  owners_[static_cast<std::size_t>(block)] = owner;
  return true;
}

void kv_block_pool::prefer_keeping(std::int32_t block) {
  assert(block >= 0 && block < total_);
  assert(refs_[static_cast<std::size_t>(block)] > 0 && "only a held block changes lists");
  kept_[static_cast<std::size_t>(block)] = true;
}

std::vector<evicted_block> kv_block_pool::take_evictions() {
  std::vector<evicted_block> out;
  out.swap(evictions_);
  return out;
}

void kv_block_pool::unlink_cached_free(std::int32_t block) {
  const auto b = static_cast<std::size_t>(block);
  const int list = kept_[b] ? 1 : 0;
  const std::int32_t prev = lru_prev_[b];
  const std::int32_t next = lru_next_[b];
  (prev == none ? lru_head_[list] : lru_next_[static_cast<std::size_t>(prev)]) = next;
  (next == none ? lru_tail_[list] : lru_prev_[static_cast<std::size_t>(next)]) = prev;
  lru_prev_[b] = none;
  lru_next_[b] = none;
  --cached_free_count_;
}

void kv_block_pool::append_cached_free(std::int32_t block) {
  const auto b = static_cast<std::size_t>(block);
  const int list = kept_[b] ? 1 : 0;
  lru_prev_[b] = lru_tail_[list];
  lru_next_[b] = none;
  (lru_tail_[list] == none ? lru_head_[list] : lru_next_[static_cast<std::size_t>(lru_tail_[list])]) = block;
  lru_tail_[list] = block;
  ++cached_free_count_;
}

status kv_block_pool::check_consistency() const {
  std::vector<int> seen(static_cast<std::size_t>(total_), 0);
  for (const std::int32_t b : uncached_free_) {
    if (b < 0 || b >= total_) return internal_error(format("block {} on the free stack is out of range", b));
    if (refs_[static_cast<std::size_t>(b)] != 0) return internal_error(format("free block {} is referenced", b));
    if (cached_[static_cast<std::size_t>(b)]) return internal_error(format("block {} is free as uncached but cached", b));
    ++seen[static_cast<std::size_t>(b)];
  }
  std::int64_t lru_length = 0;
  for (int list = 0; list < 2; ++list) {
    std::int32_t prev = none;
    for (std::int32_t b = lru_head_[list]; b != none; prev = b, b = lru_next_[static_cast<std::size_t>(b)]) {
      if (lru_prev_[static_cast<std::size_t>(b)] != prev) return internal_error(format("LRU list broken at block {}", b));
      if (refs_[static_cast<std::size_t>(b)] != 0) return internal_error(format("LRU block {} is referenced", b));
      if (!cached_[static_cast<std::size_t>(b)]) return internal_error(format("LRU block {} is not cached", b));
      if (kept_[static_cast<std::size_t>(b)] != (list == 1)) {
        return internal_error(format("LRU block {} is on the wrong list", b));
      }
      ++seen[static_cast<std::size_t>(b)];
      if (++lru_length > total_) return internal_error("LRU list has a cycle");
    }
    if (prev != lru_tail_[list]) return internal_error(format("LRU list {} ends at {}, not its tail", list, prev));
  }
  if (lru_length != cached_free_count_) {
    return internal_error(format("LRU list holds {} blocks, counted {}", lru_length, cached_free_count_));
  }
  std::int64_t cached = 0;
  for (std::int64_t b = 0; b < total_; ++b) {
    const auto i = static_cast<std::size_t>(b);
    if (refs_[i] < 0) return internal_error(format("block {} has {} references", b, refs_[i]));
    if (refs_[i] == 0 && seen[i] != 1) return internal_error(format("free block {} is listed {} times", b, seen[i]));
    if (refs_[i] > 0 && seen[i] != 0) return internal_error(format("referenced block {} is on a free list", b));
    if (cached_[i]) {
      ++cached;
      const auto it = index_.find(hashes_[i]);
      if (it == index_.end() || it->second != b) return internal_error(format("cached block {} is not indexed", b));
    }
  }
  if (cached != static_cast<std::int64_t>(index_.size())) {
    return internal_error(format("{} blocks are cached but the index holds {}", cached, index_.size()));
  }
  return {};
}

}  // namespace edge::backend
