#include "kernels/kv_cache_write/kv_cache_write.h"

#include "edge/common/format.h"
#include "kernels/cpu/load.h"
#include "kernels/cpu/parallel.h"

namespace edge::kernels {

status run_kv_cache_write(const kv_cache_write_params& p, const stream& s) {
  const std::int64_t capacity = p.num_blocks * p.block_size;
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    if (p.slots[t] < 0 || p.slots[t] >= capacity) {
      return invalid_argument(format("kv_cache_write: slot {} outside the cache of {} slots", p.slots[t], capacity));
    }
  }
  cpu::dispatch_dtype(p.kv_type, [&]<dtype T>() {
    cpu::parallel_for(s, p.tokens, 16, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) {
        const std::int64_t block = p.slots[t] / p.block_size;
        const std::int64_t offset = p.slots[t] % p.block_size;
        for (std::int64_t h = 0; h < p.num_kv_heads; ++h) {
          // Element index of (block, h, offset, 0) in [num_blocks, num_kv_heads, block_size, head_dim].
          const std::int64_t base = ((block * p.num_kv_heads + h) * p.block_size + offset) * p.head_dim;
          const float* k = p.k + t * p.kv_stride + h * p.head_dim;
          const float* v = p.v + t * p.kv_stride + h * p.head_dim;
          for (std::int64_t d = 0; d < p.head_dim; ++d) {
            cpu::store_from_float<T>(p.k_cache, base + d, k[d]);
            cpu::store_from_float<T>(p.v_cache, base + d, v[d]);
          }
        }
      }
    });
  });
  return {};
}

}  // namespace edge::kernels
