#include "edge/backend/runtime/kv_cache.h"

#include <cstdlib>
#include <cstring>

#include "edge/backend/model/model_config.h"
#include "edge/common/format.h"

namespace edge::backend {
namespace {

// Block pools start on cache-line (and vector-register) boundaries.
constexpr std::size_t pool_alignment = 64;

std::size_t round_up(std::size_t value, std::size_t multiple) { return (value + multiple - 1) / multiple * multiple; }

}  // namespace

std::size_t kv_cache_layout::bytes_per_token() const {
  return 2 * static_cast<std::size_t>(num_layers * num_kv_heads * head_dim) * kernels::dtype_size(dtype);
}

kv_cache_layout kv_cache_layout::for_budget(const model_config& config, kernels::dtype dtype, std::int64_t block_size,
                                            std::size_t budget_bytes) {
  kv_cache_layout layout;
  layout.num_layers = config.num_layers;
  layout.num_kv_heads = config.num_kv_heads;
  layout.head_dim = config.head_dim;
  layout.block_size = block_size;
  layout.dtype = dtype;
  const std::size_t per_block = layout.bytes_per_block();
  layout.num_blocks = per_block == 0 ? 0 : static_cast<std::int64_t>(budget_bytes / per_block);
  return layout;
}

kv_cache_layout kv_cache_layout::for_tokens(const model_config& config, kernels::dtype dtype, std::int64_t block_size,
                                            std::int64_t tokens) {
  kv_cache_layout layout = for_budget(config, dtype, block_size, 0);
  layout.num_blocks = (tokens + block_size - 1) / block_size;
  return layout;
}

kv_cache::kv_cache(const kv_cache_layout& layout) : layout_(layout), memory_(nullptr, std::free) {}

result<std::unique_ptr<kv_cache>> kv_cache::create(const kv_cache_layout& layout) {
  if (layout.num_blocks <= 0 || layout.block_size <= 0 || layout.num_layers <= 0 || layout.head_dim <= 0 ||
      layout.num_kv_heads <= 0) {
    return invalid_argument(format("KV cache layout has no room: {} blocks of {} tokens", layout.num_blocks,
                                   layout.block_size));
  }
  std::unique_ptr<kv_cache> cache(new kv_cache(layout));
  cache->pool_bytes_ = round_up(static_cast<std::size_t>(layout.num_blocks * layout.num_kv_heads *
                                                         layout.block_size * layout.head_dim) *
                                    kernels::dtype_size(layout.dtype),
                                pool_alignment);
  const std::size_t total = cache->pool_bytes_ * 2 * static_cast<std::size_t>(layout.num_layers);
  void* memory = std::aligned_alloc(pool_alignment, total);
  if (memory == nullptr) {
    return resource_exhausted(format("cannot allocate {} for the KV cache", format_bytes(total)));
  }
  // Zeroed so that nothing reads indeterminate bytes even through a stale block table.
  std::memset(memory, 0, total);
  cache->memory_.reset(static_cast<std::byte*>(memory));
  return cache;
}

void* kv_cache::layer_base(std::int64_t layer, int which) {
  return memory_.get() + (static_cast<std::size_t>(layer) * 2 + static_cast<std::size_t>(which)) * pool_bytes_;
}

}  // namespace edge::backend
