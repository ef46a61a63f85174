// Which blocks of the KV cache are free. The cache (kv_cache.h) holds the memory; the pool
// hands out block numbers. Owned by the engine thread (or whatever single thread drives the
// executor).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

namespace edge::backend {

class kv_block_pool {
 public:
  explicit kv_block_pool(std::int64_t num_blocks);

  // A free block, or nothing when all are in use.
  std::optional<std::int32_t> allocate();
  void free(std::int32_t block);

  std::int64_t free_blocks() const { return static_cast<std::int64_t>(free_.size()); }
  std::int64_t total_blocks() const { return total_; }

 private:
  std::int64_t total_;
  std::vector<std::int32_t> free_;  // a stack: the most recently freed block is reused first
};

}  // namespace edge::backend
