// The paged KV cache memory: for every layer, a K pool and a V pool of fixed-size blocks, each
// block holding block_size token slots for all KV heads. Which blocks are in use is
// kv_block_pool's business.
//
//   K and V of layer l: [num_blocks, num_kv_heads, block_size, head_dim] of dtype
//
// A sequence owns a block table (its blocks in position order); position p lives in block
// table[p / block_size] at offset p % block_size. Owned by the engine thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "edge/common/status.h"
#include "edge/kernels/dtype.h"

namespace edge::backend {

struct model_config;

struct kv_cache_layout {
  std::int64_t num_layers = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t block_size = 16;
  std::int64_t num_blocks = 0;
  kernels::dtype dtype = kernels::dtype::f32;

  // K and V of one token in every layer.
  std::size_t bytes_per_token() const;
  std::size_t bytes_per_block() const { return bytes_per_token() * static_cast<std::size_t>(block_size); }
  std::int64_t capacity_tokens() const { return num_blocks * block_size; }

  // The layout for a model: as many whole blocks as fit in `budget_bytes`.
  static kv_cache_layout for_budget(const model_config& config, kernels::dtype dtype, std::int64_t block_size,
                                    std::size_t budget_bytes);
  // The layout for a model with room for `tokens` token slots (rounded up to whole blocks).
  static kv_cache_layout for_tokens(const model_config& config, kernels::dtype dtype, std::int64_t block_size,
                                    std::int64_t tokens);
};

class kv_cache {
 public:
  // resource_exhausted when the memory cannot be allocated; invalid_argument for an empty layout.
  static result<std::unique_ptr<kv_cache>> create(const kv_cache_layout& layout);

  const kv_cache_layout& layout() const { return layout_; }

  void* keys(std::int64_t layer) { return layer_base(layer, 0); }
  void* values(std::int64_t layer) { return layer_base(layer, 1); }

 private:
  explicit kv_cache(const kv_cache_layout& layout);
  void* layer_base(std::int64_t layer, int which);

  kv_cache_layout layout_;
  std::size_t pool_bytes_ = 0;  // one K or V pool of one layer
  std::unique_ptr<std::byte, void (*)(void*)> memory_;
};

}  // namespace edge::backend
