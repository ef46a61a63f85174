// Writes each token's K and V rows into the paged KV cache, converting to the cache dtype.
//
// The cache of one layer is a pool of blocks, each holding block_size token slots:
//   k_cache, v_cache: [num_blocks, num_kv_heads, block_size, head_dim] of kv_type
// A token goes to slot slots[t] = block * block_size + offset, as the sequence's block table
// maps its position.
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/dtype.h"
#include "edge/kernels/stream.h"

namespace edge::kernels {

struct kv_cache_write_params {
  const float* k;              // [tokens, num_kv_heads, head_dim], token stride kv_stride
  const float* v;              // [tokens, num_kv_heads, head_dim], token stride kv_stride
  void* k_cache;               // [num_blocks, num_kv_heads, block_size, head_dim]
  void* v_cache;               // [num_blocks, num_kv_heads, block_size, head_dim]
  dtype kv_type = dtype::f32;
  const std::int64_t* slots;   // [tokens]
  std::int64_t tokens = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t block_size = 0;
  std::int64_t num_blocks = 0;
  std::int64_t kv_stride = 0;
};

// invalid_argument when a slot is outside the cache.
status run_kv_cache_write(const kv_cache_write_params& p, const stream& s);

}  // namespace edge::kernels
