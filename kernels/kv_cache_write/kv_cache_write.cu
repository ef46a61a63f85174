// CUDA KV-cache write: one warp per (token, KV head) row of K and of V. FP8 rows take their
// scale (amax / 448) from a warp reduction and are encoded with the same integer-exact encoder
// and IEEE division as the CPU reference, so both write identical cache bytes.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace edge::kernels::cuda {
namespace {

constexpr int kv_write_warps = 4;  // rows per block

// Writes one row of head_dim values: the warp's lanes take elements lane, lane + 32, ...
template <dtype T>
__device__ __forceinline__ void write_row(const float* __restrict__ x,  // [head_dim]
                                          void* cache, float* scales, std::int64_t row, std::int64_t head_dim,
                                          int lane) {
  const std::int64_t base = row * head_dim;
  if constexpr (T == dtype::fp8_e4m3) {  // kv_cache_scaled(T)
    float amax = 0.0f;
    for (std::int64_t d = lane; d < head_dim; d += warp_size) amax = fmaxf(amax, fabsf(x[d]));
    amax = warp_max(amax);
    const float scale = fp8_kv_scale(amax);
    auto* codes = static_cast<std::uint8_t*>(cache);
    for (std::int64_t d = lane; d < head_dim; d += warp_size) codes[base + d] = fp8_kv_encode(x[d], scale);
    if (lane == 0) scales[row] = scale;
  } else {
    for (std::int64_t d = lane; d < head_dim; d += warp_size) store_float<T>(cache, base + d, x[d]);
  }
}

template <dtype T>
__global__ void __launch_bounds__(kv_write_warps * warp_size)
    kv_cache_write_kernel(const float* __restrict__ k,          // [tokens, num_kv_heads, head_dim], token stride kv_stride
                          const float* __restrict__ v,          // [tokens, num_kv_heads, head_dim], token stride kv_stride; or null
                          void* __restrict__ k_cache,           // [num_blocks, num_kv_heads, block_size, head_dim] of T
                          void* __restrict__ v_cache,           // [num_blocks, num_kv_heads, block_size, head_dim] of T
                          float* __restrict__ k_scales,         // [num_blocks, num_kv_heads, block_size] (fp8)
                          float* __restrict__ v_scales,         // [num_blocks, num_kv_heads, block_size] (fp8)
                          const std::int64_t* __restrict__ slots,  // [tokens]
                          std::int64_t tokens, std::int64_t num_kv_heads, std::int64_t head_dim,
                          std::int64_t block_size, std::int64_t num_blocks, std::int64_t kv_stride) {
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * kv_write_warps + threadIdx.x / warp_size;
  if (item >= tokens * num_kv_heads) return;
  const std::int64_t t = item / num_kv_heads;
  const std::int64_t h = item % num_kv_heads;
  const std::int64_t slot = slots[t];
  // A slot outside the cache is skipped, never written: the padding rows of CUDA-graph batches
  // (slot -1); the caller checks the slots of real rows on the host.
  if (slot < 0 || slot >= num_blocks * block_size) return;
  // Row index of (block, h, offset) in [num_blocks, num_kv_heads, block_size].
  const std::int64_t row = (slot / block_size * num_kv_heads + h) * block_size + slot % block_size;
  write_row<T>(k + t * kv_stride + h * head_dim, k_cache, k_scales, row, head_dim, lane);
  if (v != nullptr) write_row<T>(v + t * kv_stride + h * head_dim, v_cache, v_scales, row, head_dim, lane);
}

constexpr int kv_copy_threads = 256;
constexpr int kv_copy_pairs = 64;  // block pairs per launch, passed by value

struct block_pairs {
  std::int32_t from[kv_copy_pairs];
  std::int32_t to[kv_copy_pairs];
};

// One CUDA block per (pair, layer): the pair's block of that layer's region, in words of Word.
template <class Word>
__global__ void kv_block_copy_kernel(std::byte* __restrict__ base,  // layer 0's region
                                     std::size_t layer_stride, std::size_t block_bytes, block_pairs pairs) {
  std::byte* region = base + static_cast<std::size_t>(blockIdx.y) * layer_stride;
  const auto* from = reinterpret_cast<const Word*>(region + static_cast<std::size_t>(pairs.from[blockIdx.x]) * block_bytes);
  auto* to = reinterpret_cast<Word*>(region + static_cast<std::size_t>(pairs.to[blockIdx.x]) * block_bytes);
  const std::size_t words = block_bytes / sizeof(Word);
  for (std::size_t i = threadIdx.x; i < words; i += kv_copy_threads) to[i] = from[i];
}

}  // namespace

status run_kv_cache_write(const kv_cache_write_params& p, const stream& s) {
  if (p.num_kv_heads <= 0 || p.head_dim <= 0 || p.block_size <= 0 || p.num_blocks <= 0 ||
      p.kv_stride < p.num_kv_heads * p.head_dim) {
    return invalid_argument("kv_cache_write: bad shape or stride");
  }
  if (kv_cache_scaled(p.kv_type) && (p.k_scales == nullptr || (p.v != nullptr && p.v_scales == nullptr))) {
    return invalid_argument("kv_cache_write: an fp8_e4m3 cache needs K and V scales");
  }
  if (p.tokens <= 0) return {};
  const std::int64_t blocks = ceil_div(p.tokens * p.num_kv_heads, kv_write_warps);
  return dispatch_dtype(p.kv_type, [&]<dtype T>() {
    kv_cache_write_kernel<T><<<static_cast<unsigned>(blocks), kv_write_warps * warp_size, 0, native(s)>>>(
        p.k, p.v, p.k_cache, p.v_cache, p.k_scales, p.v_scales, p.slots, p.tokens, p.num_kv_heads, p.head_dim,
        p.block_size, p.num_blocks, p.kv_stride);
    return check_launch("kv_cache_write");
  });
}

status run_kv_block_copy(const kv_block_copy_params& p, const stream& s) {
  if (p.count == 0 || p.layers == 0 || p.block_bytes == 0) return {};
  if (p.layers > 65535) return invalid_argument("kv_block_copy: more than 65535 layers");
  auto* base = static_cast<std::byte*>(p.first_region);
  // Regions start aligned (kv_cache_view::plan), so whole 16-byte words when the blocks are.
  const bool words = p.block_bytes % sizeof(uint4) == 0 && p.layer_stride % sizeof(uint4) == 0 &&
                     reinterpret_cast<std::uintptr_t>(base) % sizeof(uint4) == 0;
  for (std::int64_t first = 0; first < p.count; first += kv_copy_pairs) {
    block_pairs pairs{};
    const std::int64_t n = std::min<std::int64_t>(kv_copy_pairs, p.count - first);
    for (std::int64_t i = 0; i < n; ++i) {
      pairs.from[i] = p.from[first + i];
      pairs.to[i] = p.to[first + i];
    }
    const dim3 grid(static_cast<unsigned>(n), static_cast<unsigned>(p.layers));
    if (words) {
      kv_block_copy_kernel<uint4><<<grid, kv_copy_threads, 0, native(s)>>>(base, p.layer_stride, p.block_bytes, pairs);
    } else {
      kv_block_copy_kernel<unsigned char><<<grid, kv_copy_threads, 0, native(s)>>>(base, p.layer_stride, p.block_bytes,
                                                                                  pairs);
    }
    EDGE_RETURN_IF_ERROR(check_launch("kv_block_copy"));
  }
  return {};
}

}  // namespace edge::kernels::cuda
