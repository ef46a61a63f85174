#include "kernels/kv_cache_write/kv_cache_write.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "edge/common/format.h"
#include "kernels/cpu/load.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cuda/launchers.h"

namespace edge::kernels {
namespace {

// Quantizes one row of head_dim values to E4M3 codes and returns its scale. NaN elements do
// not enter amax (std::max keeps the running value), so they encode as E4M3's NaN code and
// read back as NaN without spoiling the rest of the row.
float write_fp8_row(const float* x, std::int64_t head_dim, std::uint8_t* codes) {
  float amax = 0.0f;
  for (std::int64_t d = 0; d < head_dim; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float scale = fp8_kv_scale(amax);
  for (std::int64_t d = 0; d < head_dim; ++d) codes[d] = fp8_kv_encode(x[d], scale);
  return scale;
}

}  // namespace

status run_kv_cache_write(const kv_cache_write_params& p, const stream& s) {
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_kv_cache_write(p, s);
  const std::int64_t capacity = p.num_blocks * p.block_size;
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    if (p.slots[t] < 0 || p.slots[t] >= capacity) {
      return invalid_argument(format("kv_cache_write: slot {} outside the cache of {} slots", p.slots[t], capacity));
    }
  }
  if (kv_cache_scaled(p.kv_type) && (p.k_scales == nullptr || (p.v != nullptr && p.v_scales == nullptr))) {
    return invalid_argument(format("kv_cache_write: a {} cache needs K and V scales", to_string(p.kv_type)));
  }
  cpu::dispatch_dtype(p.kv_type, [&]<dtype T>() {
    cpu::parallel_for(s, p.tokens, 16, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) {
        const std::int64_t block = p.slots[t] / p.block_size;
        const std::int64_t offset = p.slots[t] % p.block_size;
        for (std::int64_t h = 0; h < p.num_kv_heads; ++h) {
          // Row index of (block, h, offset) in [num_blocks, num_kv_heads, block_size].
          const std::int64_t row = (block * p.num_kv_heads + h) * p.block_size + offset;
          const std::int64_t base = row * p.head_dim;
          const float* k = p.k + t * p.kv_stride + h * p.head_dim;
          const float* v = p.v != nullptr ? p.v + t * p.kv_stride + h * p.head_dim : nullptr;
          if constexpr (kv_cache_scaled(T)) {
            p.k_scales[row] = write_fp8_row(k, p.head_dim, static_cast<std::uint8_t*>(p.k_cache) + base);
            if (v != nullptr) p.v_scales[row] = write_fp8_row(v, p.head_dim, static_cast<std::uint8_t*>(p.v_cache) + base);
          } else {
            for (std::int64_t d = 0; d < p.head_dim; ++d) cpu::store_from_float<T>(p.k_cache, base + d, k[d]);
            if (v != nullptr) {
              for (std::int64_t d = 0; d < p.head_dim; ++d) cpu::store_from_float<T>(p.v_cache, base + d, v[d]);
            }
          }
        }
      }
    });
  });
  return {};
}

namespace {

status check_kv_block_copy(const kv_block_copy_params& p) {
  for (std::int64_t i = 0; i < p.count; ++i) {
    if (p.from[i] < 0 || p.from[i] >= p.num_blocks || p.to[i] < 0 || p.to[i] >= p.num_blocks) {
      return invalid_argument(format("kv_block_copy: block {} -> {} outside the cache of {} blocks", p.from[i], p.to[i],
                                     p.num_blocks));
    }
  }
  return {};
}

}  // namespace

status run_kv_block_copy(const kv_block_copy_params& p, const stream& s) {
  EDGE_RETURN_IF_ERROR(check_kv_block_copy(p));
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_kv_block_copy(p, s);
  auto* base = static_cast<std::byte*>(p.first_region);
  for (std::int64_t l = 0; l < p.layers; ++l) {
    std::byte* region = base + static_cast<std::size_t>(l) * p.layer_stride;
    for (std::int64_t i = 0; i < p.count; ++i) {
      std::memcpy(region + static_cast<std::size_t>(p.to[i]) * p.block_bytes,
                  region + static_cast<std::size_t>(p.from[i]) * p.block_bytes, p.block_bytes);
    }
  }
  return {};
}

}  // namespace edge::kernels
