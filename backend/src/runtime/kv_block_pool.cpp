#include "edge/backend/runtime/kv_block_pool.h"

#include <cassert>

namespace edge::backend {

kv_block_pool::kv_block_pool(std::int64_t num_blocks) : total_(num_blocks) {
  free_.reserve(static_cast<std::size_t>(num_blocks));
  for (std::int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<std::int32_t>(b));
}

std::optional<std::int32_t> kv_block_pool::allocate() {
  if (free_.empty()) return std::nullopt;
  const std::int32_t block = free_.back();
  free_.pop_back();
  return block;
}

void kv_block_pool::free(std::int32_t block) {
  assert(block >= 0 && block < total_);
  assert(static_cast<std::int64_t>(free_.size()) < total_);
  free_.push_back(block);
}

}  // namespace edge::backend
