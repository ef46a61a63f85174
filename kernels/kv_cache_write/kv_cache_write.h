// Writes each token's K and V rows into the paged KV cache, converting to the cache dtype.
//
// The cache of one layer is a pool of blocks, each holding block_size token slots:
//   k_cache, v_cache:   [num_blocks, num_kv_heads, block_size, head_dim] of kv_type
//   k_scales, v_scales: [num_blocks, num_kv_heads, block_size] of f32 (fp8_e4m3 only)
// A token goes to slot slots[t] = block * block_size + offset, as the sequence's block table
// maps its position.
//
// FP8 E4M3 rows are scaled: each (token, kv head) row of K, and of V, gets its own scale,
// amax / 448 of that row, computed here when the row is written, so no calibration data is
// needed and one outlier token costs precision only in its own row. A row stores
// code[d] = fp8(x[d] / scale) and reads back as fp8_to_float(code[d]) * scale. The scales sit
// in their own arrays beside the blocks (not inside the rows) so that a row stays a dense run
// of head_dim bytes for vector loads, and (with 16-token blocks) one block's scales for a head
// fill one cache line.
#pragma once

#include <cstddef>
#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/dtype.h"
#include "edge/kernels/numerics.h"
#include "edge/kernels/stream.h"

namespace edge::kernels {

// Whether rows of this KV dtype carry a scale (one f32 per token and kv head, for K and for V).
constexpr bool kv_cache_scaled(dtype type) { return type == dtype::fp8_e4m3; }

// Bytes one (token, kv head) row of K (or of V) takes in the cache, its scale included.
constexpr std::size_t kv_cache_row_bytes(dtype type, std::int64_t head_dim) {
  return static_cast<std::size_t>(head_dim) * dtype_size(type) + (kv_cache_scaled(type) ? sizeof(float) : 0);
}

// The scale of an FP8 row whose largest magnitude is `amax`: the largest magnitude lands on
// E4M3's largest finite value. A row of zeros gets scale 0 (as does a row so small that
// amax / 448 underflows), written as all-zero codes, and reads back as exact zeros; a made-up
// scale of 1.0 would instead quantize a later tiny row coarsely for no reason. Rows are never
// rescaled after they are written, so 0 is final.
EDGE_HOST_DEVICE constexpr float fp8_kv_scale(float amax) { return amax / fp8_e4m3_traits::max; }

// The code of x in a row with scale `scale` (see fp8_kv_scale). Division rather than a
// multiply by a reciprocal: x / scale is correctly rounded, so the stored code is within half
// an E4M3 step of the exact quotient, and a CUDA kernel computes the same bits.
EDGE_HOST_DEVICE constexpr std::uint8_t fp8_kv_encode(float x, float scale) {
  return scale > 0.0f ? float_to_fp8_e4m3(x / scale) : std::uint8_t{0};
}

struct kv_cache_write_params {
  const float* k;              // [tokens, num_kv_heads, head_dim], token stride kv_stride
  const float* v;              // [tokens, num_kv_heads, head_dim], token stride kv_stride; null: K rows only
                               // (an MLA layer's latent rows, or the DSA indexer's keys)
  void* k_cache;               // [num_blocks, num_kv_heads, block_size, head_dim]
  void* v_cache;               // [num_blocks, num_kv_heads, block_size, head_dim]
  float* k_scales = nullptr;   // [num_blocks, num_kv_heads, block_size]; when kv_cache_scaled(kv_type)
  float* v_scales = nullptr;   // [num_blocks, num_kv_heads, block_size]; when kv_cache_scaled(kv_type)
  dtype kv_type = dtype::f32;
  const std::int64_t* slots;   // [tokens]
  std::int64_t tokens = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t block_size = 0;
  std::int64_t num_blocks = 0;
  std::int64_t kv_stride = 0;
};

// invalid_argument when a slot is outside the cache, or a scaled dtype comes without scales.
status run_kv_cache_write(const kv_cache_write_params& p, const stream& s);

// Copies whole blocks of one kind of pool region (a K pool, a V pool, or their scales) in every
// layer: block to[i] of each layer's region becomes a copy of block from[i] of the same region.
// What a sequence forking into several does with the block it has partly filled.
struct kv_block_copy_params {
  void* first_region = nullptr;    // layer 0's region: [num_blocks, block_bytes] bytes
  std::size_t layer_stride = 0;    // bytes from one layer's region to the next
  std::size_t block_bytes = 0;
  std::int64_t layers = 0;
  std::int64_t num_blocks = 0;
  // Host memory on either device (the copies are queued from the host).
  const std::int32_t* from = nullptr;  // [count]
  const std::int32_t* to = nullptr;    // [count] distinct, and none of them in `from`
  std::int64_t count = 0;
};

// invalid_argument for a block outside the region.
status run_kv_block_copy(const kv_block_copy_params& p, const stream& s);

}  // namespace edge::kernels
