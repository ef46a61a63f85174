// CUDA paged attention over the block tables, FP8 (scaled) or BF16/F16/F32 KV: a SIMT kernel
// for every case, and a tensor-core kernel for prefill runs over a bf16 / FP8 cache at head_dim
// 64 or 128 (cuda_attention_uses_tensor_cores; described with its code below).
//
// The SIMT kernel:
// A block takes one KV head and a tile of query rows: the `group` query heads that share the KV
// head (GQA: each K/V row is read once for the whole group), for one token (decode, or no run
// layout given) or for several consecutive tokens of one sequence (prefill, when the caller
// gives seq_token_begin: up to 16 query rows per block). It walks the keys in tiles of 32:
// the tile's K and V rows are gathered through the block table in 16-byte pieces (for 16-bit and
// FP8 caches by cp.async into one of two buffers while the previous tile is computed), widened
// to f32 with their per-row FP8 scale folded in, and kept in shared memory; each warp then takes
// some of the query rows, a lane per key for the scores and a lane per head dimension (strided
// by 32) for the output, with the softmax kept online (running max and sum per row).
//
// Long contexts are split (split-K, "flash decoding"): blockIdx.y also selects one of `splits`
// equal slices of the tile's context (sized on the device from the real positions, so a CUDA
// graph captured once serves every length), each slice writes its unnormalised output with its
// max and sum to the workspace, and a second kernel combines the slices in a fixed order.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/paged_attention/attention_tiles.h"
#include "kernels/paged_attention/widen_rows.h"

namespace edge::kernels::cuda {
namespace {

constexpr int attn_threads = 128;
constexpr int attn_warps = attn_threads / warp_size;
constexpr int key_tile = warp_size;               // keys per tile: one per lane for the scores
constexpr int max_rows = 32;                      // query rows per block (max_attention_group)
constexpr int rows_per_warp = max_rows / attn_warps;
constexpr int prefill_rows = 16;                  // query rows a prefill block aims for

struct attention_args {
  const float* q;                   // [tokens, num_heads, head_dim], token stride q_stride
  float* out;                       // [tokens, num_heads, head_dim], token stride out_stride
  const void* k_cache;              // [num_blocks, num_kv_heads, block_size, head_dim]
  const void* v_cache;              // [num_blocks, num_kv_heads, block_size, head_dim]
  const float* k_scales;            // [num_blocks, num_kv_heads, block_size] (fp8)
  const float* v_scales;            // [num_blocks, num_kv_heads, block_size] (fp8)
  const std::int32_t* seq;          // [tokens]
  const std::int32_t* pos;          // [tokens]
  const std::int32_t* block_tables; // [table_begin[rows]]: row s at [table_begin[s], table_begin[s + 1])
  const std::int32_t* table_begin;  // [rows + 1]
  const std::int32_t* seq_token_begin;  // [num_seqs + 1] or null (a block per token)
  const std::int32_t* tile_offsets;     // [runs + 1]: the flat (run, tile) list, or null (blockIdx.z is the run)
  std::int64_t runs;
  float* partials;                  // [tokens, num_heads, splits, head_dim + 2] when splits > 1
  std::int64_t tokens, num_heads, num_kv_heads, head_dim, block_size, num_blocks;
  std::int64_t q_stride, out_stride;
  int group;        // query heads per KV head
  int tile_tokens;  // query tokens per block
  int splits;
  float scale;
  bool vec;         // K/V rows are whole 16-byte vectors
};

// Shared memory of one block, in floats: q rows, K tile (rows padded by one float so that the
// lanes' different rows fall in different banks), V tile, the rows' positions, and whether each
// key of the tile is in the cache; then, for a 16-bit or FP8 cache with 16-byte rows, the two
// buffers that cp.async fills with the next tile's raw rows (K, V), FP8 scales (K, V) and
// cached flags while the current tile is computed.
EDGE_HOST_DEVICE constexpr std::int64_t staged_offset_floats(std::int64_t rows, std::int64_t head_dim) {
  return (rows * head_dim + key_tile * (head_dim + 1) + key_tile * head_dim + rows + key_tile + 3) / 4 * 4;
}
EDGE_HOST_DEVICE constexpr std::int64_t staged_buffer_bytes(std::int64_t head_dim, std::int64_t elem_bytes) {
  return 2 * key_tile * head_dim * elem_bytes + 3 * key_tile * 4;  // K and V rows, then K scales, V scales, flags
}
constexpr int staged_buffers = 2;
std::int64_t shared_floats(std::int64_t rows, std::int64_t head_dim, std::int64_t elem_bytes, bool staged) {
  return staged_offset_floats(rows, head_dim) + (staged ? staged_buffers * staged_buffer_bytes(head_dim, elem_bytes) / 4 : 0);
}

// The run and the tile within it of this block (runs given): from the flat list when there is
// one, else blockIdx.z and blockIdx.x. False for a block past the flat list's end.
__device__ __forceinline__ bool block_work(const attention_args& a, std::int64_t& run, std::int64_t& tile) {
  if (a.tile_offsets == nullptr) {
    run = blockIdx.z;
    tile = blockIdx.x;
    return true;
  }
  run = attention_tiles::run_of_block(a.tile_offsets, a.runs, blockIdx.x);
  if (run < 0) return false;
  tile = static_cast<std::int64_t>(blockIdx.x) - a.tile_offsets[run];
  return true;
}

// offsets[r] = the first flat block of run r (each run's ceil(len / tile) tiles in turn).
__global__ void tile_offsets_kernel(const std::int32_t* __restrict__ seq_token_begin,  // [runs + 1]
                                    std::int64_t runs, int tile_tokens,
                                    std::int32_t* __restrict__ offsets) {  // [runs + 1]
  if (threadIdx.x != 0) return;
  std::int32_t total = 0;
  for (std::int64_t r = 0; r < runs; ++r) {
    offsets[r] = total;
    total += static_cast<std::int32_t>(ceil_div(seq_token_begin[r + 1] - seq_token_begin[r], tile_tokens));
  }
  offsets[runs] = total;
}

// Chunk `piece` (16 bytes) of tile row j of K and of V, widened into k_s ([key_tile, D + 1]) and
// v_s ([key_tile, D]) in the rotated order of widen_rows.h, so that no two lanes of a warp store
// into one bank.
template <dtype KV>
__device__ __forceinline__ void widen_chunk(uint4 kraw, uint4 vraw, int j, std::int64_t piece, std::int64_t D,
                                            float k_factor, float v_factor, float* k_s, float* v_s) {
  constexpr int elem_bytes = KV == dtype::f32 ? 4 : (KV == dtype::fp8_e4m3 ? 1 : 2);
  constexpr int vec = 16 / elem_bytes;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const int kr = widen_rows::k_rotation(lane, j, vec);
  const int vr = widen_rows::v_rotation(lane, vec);
  const auto rotated = [](uint4 raw, int rotation) {
    const widen_rows::chunk c = widen_rows::rotate_right({{raw.x, raw.y, raw.z, raw.w}}, rotation * elem_bytes * 8);
    return make_uint4(c.w[0], c.w[1], c.w[2], c.w[3]);
  };
  const uint4 k_rot = rotated(kraw, kr);
  const uint4 v_rot = rotated(vraw, vr);
#pragma unroll
  for (int e = 0; e < vec; ++e) {
    k_s[widen_rows::store_index(j, D + 1, piece, vec, kr, e)] = load_float<KV>(&k_rot, e) * k_factor;
    v_s[widen_rows::store_index(j, D, piece, vec, vr, e)] = load_float<KV>(&v_rot, e) * v_factor;
  }
}

template <dtype KV, int DPL>
__global__ void __launch_bounds__(attn_threads) attention_kernel(attention_args a) {
  extern __shared__ float shared[];
  const std::int64_t D = a.head_dim;
  const int rows = a.tile_tokens * a.group;
  float* q_s = shared;                         // [rows, D]
  float* k_s = q_s + rows * D;                 // [key_tile, D + 1]
  float* v_s = k_s + key_tile * (D + 1);       // [key_tile, D]
  auto* pos_s = reinterpret_cast<int*>(v_s + key_tile * D);  // [rows] position, -1: no token
  int* key_cached_s = pos_s + rows;                          // [key_tile] 1: the key's block is in the cache

  const int kv_head = static_cast<int>(blockIdx.y) / a.splits;
  const int split = static_cast<int>(blockIdx.y) % a.splits;
  // The tile's tokens [first, last) and their sequence.
  std::int64_t first = 0;
  std::int64_t last = 0;
  std::int64_t seq = 0;
  if (a.seq_token_begin != nullptr) {
    std::int64_t tile = 0;
    if (!block_work(a, seq, tile)) return;
    first = a.seq_token_begin[seq] + tile * a.tile_tokens;
    last = min(static_cast<std::int64_t>(a.seq_token_begin[seq + 1]), first + a.tile_tokens);
    if (first >= last) return;
  } else {
    first = blockIdx.x;
    last = first + 1;
    seq = a.seq[first];
  }
  const std::int32_t* table = a.block_tables + a.table_begin[seq];
  const std::int64_t table_blocks = a.table_begin[seq + 1] - a.table_begin[seq];
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;

  // Query rows (row = token_in_tile * group + g) and their positions.
  for (std::int64_t i = threadIdx.x; i < rows * D; i += attn_threads) {
    const int r = static_cast<int>(i / D);
    const std::int64_t t = first + r / a.group;
    const std::int64_t head = static_cast<std::int64_t>(kv_head) * a.group + r % a.group;
    q_s[i] = t < last ? a.q[t * a.q_stride + head * D + i % D] : 0.0f;
  }
  for (int r = static_cast<int>(threadIdx.x); r < rows; r += attn_threads) {
    const std::int64_t t = first + r / a.group;
    pos_s[r] = t < last ? a.pos[t] : -1;
  }
  __syncthreads();
  // Keys [0, context) are visible to some row of the tile; this block takes one slice of them.
  int context = 0;
  for (int r = 0; r < rows; ++r) context = max(context, pos_s[r] + 1);
  const std::int64_t slice = ceil_div(ceil_div(context, a.splits), key_tile) * key_tile;
  const std::int64_t key_begin = split * slice;
  const std::int64_t key_end = min(static_cast<std::int64_t>(context), key_begin + slice);

  float acc[rows_per_warp][DPL];
  float running_max[rows_per_warp];
  float running_sum[rows_per_warp];
#pragma unroll
  for (int rr = 0; rr < rows_per_warp; ++rr) {
    running_max[rr] = -INFINITY;
    running_sum[rr] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[rr][i] = 0.0f;
  }

  constexpr int elem_bytes = KV == dtype::f32 ? 4 : (KV == dtype::fp8_e4m3 ? 1 : 2);
  constexpr int vec_elems = 16 / elem_bytes;
  // The cache row of key `key`, or -1: past the slice, past the block table or in a block outside
  // the cache (zero, and masked below: the executor checks its tables on the host; a caller that
  // did not gets no out-of-bounds read and no diluted softmax).
  const auto cache_row = [&](std::int64_t key) -> std::int64_t {
    if (key >= key_end || key / a.block_size >= table_blocks) return -1;
    const std::int64_t block = table[key / a.block_size];
    if (block < 0 || block >= a.num_blocks) return -1;
    return (block * a.num_kv_heads + kv_head) * a.block_size + key % a.block_size;
  };
  // Without double buffering: gather the tile's rows with plain loads, widen them, store them.
  const auto gather = [&](std::int64_t kb) {
    const std::int64_t pieces_per_row = a.vec ? D / vec_elems : D;
    const int elems = a.vec ? vec_elems : 1;
    for (std::int64_t i = threadIdx.x; i < key_tile * pieces_per_row; i += attn_threads) {
      const int j = static_cast<int>(i / pieces_per_row);
      const std::int64_t d0 = (i % pieces_per_row) * elems;
      const std::int64_t row = cache_row(kb + j);
      if (d0 == 0) key_cached_s[j] = row >= 0 ? 1 : 0;
      float k_factor = 1.0f;
      float v_factor = 1.0f;
      if constexpr (KV == dtype::fp8_e4m3) {
        if (row >= 0) {
          k_factor = a.k_scales[row];
          v_factor = a.v_scales[row];
        }
      }
      if (a.vec) {
        uint4 kraw = make_uint4(0, 0, 0, 0);
        uint4 vraw = make_uint4(0, 0, 0, 0);
        if (row >= 0) {
          kraw = *reinterpret_cast<const uint4*>(static_cast<const std::uint8_t*>(a.k_cache) + (row * D + d0) * elem_bytes);
          vraw = *reinterpret_cast<const uint4*>(static_cast<const std::uint8_t*>(a.v_cache) + (row * D + d0) * elem_bytes);
        }
        widen_chunk<KV>(kraw, vraw, j, d0 / vec_elems, D, k_factor, v_factor, k_s, v_s);
      } else {
        k_s[j * (D + 1) + d0] = row >= 0 ? load_float<KV>(a.k_cache, row * D + d0) * k_factor : 0.0f;
        v_s[j * D + d0] = row >= 0 ? load_float<KV>(a.v_cache, row * D + d0) * v_factor : 0.0f;
      }
    }
  };
  // Double buffering (16-bit and FP8 caches with 16-byte rows): the next tile's raw rows land
  // by cp.async while this one is computed, and are widened in shared memory.
  const bool staged = KV != dtype::f32 && a.vec;
  const std::int64_t pieces = D / vec_elems;
  unsigned char* const stage_base = reinterpret_cast<unsigned char*>(shared + staged_offset_floats(rows, D));
  const std::int64_t stage_bytes = staged_buffer_bytes(D, elem_bytes);
  const auto stage_tile = [&](std::int64_t kb, int buffer) {
    unsigned char* base = stage_base + buffer * stage_bytes;
    auto* scales = reinterpret_cast<float*>(base + 2 * key_tile * D * elem_bytes);  // [K: key_tile][V: key_tile]
    auto* flags = reinterpret_cast<int*>(scales + 2 * key_tile);
    for (std::int64_t i = threadIdx.x; i < key_tile * pieces; i += attn_threads) {
      const int j = static_cast<int>(i / pieces);
      const std::int64_t piece = i % pieces;
      const std::int64_t row = cache_row(kb + j);
      const bool inside = row >= 0;
      const std::int64_t offset = ((inside ? row : 0) * D + piece * vec_elems) * elem_bytes;
      copy_async_16(base + (j * D + piece * vec_elems) * elem_bytes, static_cast<const std::uint8_t*>(a.k_cache) + offset,
                    inside);
      copy_async_16(base + ((key_tile + j) * D + piece * vec_elems) * elem_bytes,
                    static_cast<const std::uint8_t*>(a.v_cache) + offset, inside);
      if (piece == 0) {
        flags[j] = inside ? 1 : 0;
        if constexpr (KV == dtype::fp8_e4m3) {
          copy_async_4(scales + j, a.k_scales + (inside ? row : 0), inside);
          copy_async_4(scales + key_tile + j, a.v_scales + (inside ? row : 0), inside);
        }
      }
    }
  };
  if (staged) {
    if (key_begin < key_end) stage_tile(key_begin, 0);
    copy_async_commit();
  }
  int tile_index = 0;
  for (std::int64_t kb = key_begin; kb < key_end; kb += key_tile, ++tile_index) {
    if (staged) {
      // Into the buffer the previous tile was widened from: everyone is past that.
      if (kb + key_tile < key_end) stage_tile(kb + key_tile, (tile_index + 1) % staged_buffers);
      copy_async_commit();
      copy_async_wait<1>();  // this tile has landed
      __syncthreads();
      const unsigned char* base = stage_base + (tile_index % staged_buffers) * stage_bytes;
      const auto* scales = reinterpret_cast<const float*>(base + 2 * key_tile * D * elem_bytes);
      const auto* flags = reinterpret_cast<const int*>(scales + 2 * key_tile);
      for (std::int64_t i = threadIdx.x; i < key_tile * pieces; i += attn_threads) {
        const int j = static_cast<int>(i / pieces);
        const std::int64_t d0 = (i % pieces) * vec_elems;
        if (d0 == 0) key_cached_s[j] = flags[j];
        const float k_factor = KV == dtype::fp8_e4m3 ? scales[j] : 1.0f;
        const float v_factor = KV == dtype::fp8_e4m3 ? scales[key_tile + j] : 1.0f;
        const uint4 kraw = *reinterpret_cast<const uint4*>(base + (j * D + d0) * elem_bytes);
        const uint4 vraw = *reinterpret_cast<const uint4*>(base + ((key_tile + j) * D + d0) * elem_bytes);
        widen_chunk<KV>(kraw, vraw, j, d0 / vec_elems, D, k_factor, v_factor, k_s, v_s);
      }
      __syncthreads();
    } else {
      gather(kb);
      __syncthreads();
    }
    const std::int64_t key = kb + lane;
#pragma unroll
    for (int rr = 0; rr < rows_per_warp; ++rr) {
      const int r = warp + rr * attn_warps;
      if (r >= rows || pos_s[r] < 0) continue;  // the same for the whole warp
      const float* qr = q_s + r * D;
      const float* kr = k_s + lane * (D + 1);
      float dot = 0.0f;
      for (std::int64_t d = 0; d < D; ++d) dot = fmaf(qr[d], kr[d], dot);
      const bool visible = key < key_end && key <= pos_s[r] && key_cached_s[lane] != 0;
      const float score = visible ? dot * a.scale : -INFINITY;
      const float tile_max = warp_max(score);
      if (tile_max == -INFINITY) continue;  // nothing visible to this row in the tile
      const float new_max = fmaxf(running_max[rr], tile_max);
      const float correction = expf(running_max[rr] - new_max);  // exp(-inf) = 0 on the first tile
      const float p = visible ? expf(score - new_max) : 0.0f;
      running_sum[rr] = running_sum[rr] * correction + warp_sum(p);
      running_max[rr] = new_max;
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[rr][i] *= correction;
      for (int j = 0; j < key_tile; ++j) {
        const float pj = __shfl_sync(full_warp, p, j);
        if (pj == 0.0f) continue;  // the same for the whole warp
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          const std::int64_t d = lane + i * warp_size;
          if (d < D) acc[rr][i] = fmaf(pj, v_s[j * D + d], acc[rr][i]);
        }
      }
    }
    __syncthreads();
  }

  if (staged) copy_async_wait<0>();

#pragma unroll
  for (int rr = 0; rr < rows_per_warp; ++rr) {
    const int r = warp + rr * attn_warps;
    if (r >= rows) continue;
    const std::int64_t t = first + r / a.group;
    if (t >= last) continue;  // no token in this row of the tile
    const std::int64_t head = static_cast<std::int64_t>(kv_head) * a.group + r % a.group;
    if (pos_s[r] < 0) {
      // A token at a negative position (the CPU refuses it) reads as zeros; with splits the
      // combine kernel writes them.
      if (a.splits == 1) {
        for (std::int64_t d = lane; d < D; d += warp_size) a.out[t * a.out_stride + head * D + d] = 0.0f;
      }
      continue;
    }
    if (a.splits == 1) {
      // A row that saw no key (its blocks all outside the cache) reads as zeros, not NaN.
      const float inv_sum = running_sum[rr] > 0.0f ? 1.0f / running_sum[rr] : 0.0f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const std::int64_t d = lane + i * warp_size;
        if (d < D) a.out[t * a.out_stride + head * D + d] = acc[rr][i] * inv_sum;
      }
    } else {
      // [tokens, num_heads, splits, D + 2]: max, sum, then the unnormalised output.
      float* part = a.partials + ((t * a.num_heads + head) * a.splits + split) * (D + 2);
      if (lane == 0) {
        part[0] = running_max[rr];
        part[1] = running_sum[rr];
      }
#pragma unroll
      for (int i = 0; i < DPL; ++i) {
        const std::int64_t d = lane + i * warp_size;
        if (d < D) part[2 + d] = acc[rr][i];
      }
    }
  }
}

// One warp per (token, head): the slices' results rescaled to the common max and added in
// slice order. A slice that saw no key has sum 0 and max -inf and adds nothing.
__global__ void combine_kernel(attention_args a) {
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * attn_warps + threadIdx.x / warp_size;
  if (item >= a.tokens * a.num_heads) return;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const std::int64_t D = a.head_dim;
  const std::int64_t t = item / a.num_heads;
  const std::int64_t head = item % a.num_heads;
  if (a.pos[t] < 0) {
    // A token at a negative position wrote no partials (the CPU refuses it): zeros.
    for (std::int64_t d = lane; d < D; d += warp_size) a.out[t * a.out_stride + head * D + d] = 0.0f;
    return;
  }
  const float* parts = a.partials + item * a.splits * (D + 2);
  float max_all = -INFINITY;
  for (int s = 0; s < a.splits; ++s) max_all = fmaxf(max_all, parts[s * (D + 2)]);
  float sum = 0.0f;
  for (int s = 0; s < a.splits; ++s) {
    const float m = parts[s * (D + 2)];
    if (m != -INFINITY) sum += parts[s * (D + 2) + 1] * expf(m - max_all);
  }
  // A token that saw no key (its blocks all outside the cache) has sum 0: zeros, not NaN.
  const bool none = !(sum > 0.0f);
  for (std::int64_t d = lane; d < D; d += warp_size) {
    float value = 0.0f;
    for (int s = 0; s < a.splits && !none; ++s) {
      const float m = parts[s * (D + 2)];
      if (m != -INFINITY) value += parts[s * (D + 2) + 2 + d] * expf(m - max_all);
    }
    a.out[t * a.out_stride + head * D + d] = none ? 0.0f : value / sum;
  }
}

// ---- tensor-core prefill (bf16 / FP8 cache, head_dim 64 or 128) ------------------------------
//
// attention_tiles.h gives the tiling and where each value sits in the mma fragments (its host
// test emulates a warp's tile). The block's 64 query rows live in registers as bf16 A
// fragments; keys come in tiles of 64 through two shared buffers that cp.async fills while the
// previous tile is computed. Unlike the f32 kernel (and the CPU), which skip a key a row cannot
// see, the mma multiplies every key of the tile with a weight of 0, so a non-finite V row (a
// model already producing NaN) also reaches the rows of its tile that precede it. In a mixed
// step the decode runs share the call: each takes a 64-row block with only its group's rows.

namespace at = attention_tiles;

// Shared memory of the tensor-core kernel, in bytes from its start.
template <dtype KV, int D>
struct mma_shared {
  static constexpr bool fp8 = KV == dtype::fp8_e4m3;
  static constexpr int tile_bytes = at::key_tile * at::row_elements(D) * 2;  // bf16 [key_tile][row_elements]
  static constexpr int raw_bytes = fp8 ? at::key_tile * D : 0;                // FP8 codes [key_tile][D]
  static constexpr int k_tiles = 0;                                           // [buffers] K tiles, then V tiles
  static constexpr int v_tiles = k_tiles + at::buffers * tile_bytes;
  static constexpr int k_raw = v_tiles + at::buffers * tile_bytes;            // [buffers] FP8 K codes, then V codes
  static constexpr int v_raw = k_raw + at::buffers * raw_bytes;
  static constexpr int k_scales = v_raw + at::buffers * raw_bytes;            // [buffers][key_tile] f32
  static constexpr int v_scales = k_scales + (fp8 ? at::buffers * at::key_tile * 4 : 0);
  static constexpr int cached = v_scales + (fp8 ? at::buffers * at::key_tile * 4 : 0);  // [buffers][key_tile] int
  static constexpr int positions = cached + at::buffers * at::key_tile * 4;             // [rows] int
  static constexpr int total = positions + at::rows * 4;
  static_assert(tile_bytes % 16 == 0 && raw_bytes % 16 == 0, "16-byte aligned regions for cp.async");
};

template <dtype KV, int D>
__global__ void __launch_bounds__(at::threads) attention_mma_kernel(attention_args a) {
  using layout = mma_shared<KV, D>;
  constexpr bool fp8 = layout::fp8;
  constexpr int row_e = at::row_elements(D);
  constexpr int elem_bytes = fp8 ? 1 : 2;
  constexpr int pieces = D * elem_bytes / 16;  // 16-byte pieces of a cache row
  extern __shared__ __align__(128) unsigned char attention_shared[];
  unsigned char* const sm = attention_shared;
  auto* positions = reinterpret_cast<int*>(sm + layout::positions);

  const int kv_head = static_cast<int>(blockIdx.y) / a.splits;
  const int split = static_cast<int>(blockIdx.y) % a.splits;
  std::int64_t seq = 0;
  std::int64_t tile = 0;
  if (!block_work(a, seq, tile)) return;
  const std::int64_t first = a.seq_token_begin[seq] + tile * a.tile_tokens;
  const std::int64_t last = min(static_cast<std::int64_t>(a.seq_token_begin[seq + 1]), first + a.tile_tokens);
  if (first >= last) return;
  const std::int32_t* table = a.block_tables + a.table_begin[seq];
  const std::int64_t table_blocks = a.table_begin[seq + 1] - a.table_begin[seq];
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / warp_size;
  const int lane = tid % warp_size;
  const int g = lane / 4;
  const int t = lane % 4;

  // Row r of the block: token r / group of the tile, head r % group of the KV head.
  const auto token_of = [&](int r) { return first + r / a.group; };
  const auto head_of = [&](int r) { return static_cast<std::int64_t>(kv_head) * a.group + r % a.group; };
  for (int r = tid; r < at::rows; r += at::threads) positions[r] = token_of(r) < last ? a.pos[token_of(r)] : -1;
  __syncthreads();
  int context = 0;
  for (int r = 0; r < at::rows; ++r) context = max(context, positions[r] + 1);
  const std::int64_t slice = ceil_div(ceil_div(context, a.splits), at::key_tile) * at::key_tile;
  const std::int64_t key_begin = split * slice;
  const std::int64_t key_end = min(static_cast<std::int64_t>(context), key_begin + slice);
  const std::int64_t tiles = key_end > key_begin ? ceil_div(key_end - key_begin, at::key_tile) : 0;

  // This warp's rows g and g + 8 (of its 16), their positions, and Q as A fragments.
  const int row_base = warp * 16;
  const int row_pos[2] = {positions[row_base + g], positions[row_base + g + 8]};
  std::uint32_t qf[D / 16][4];
#pragma unroll
  for (int step = 0; step < D / 16; ++step) {
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      const at::q_element e = at::q_register(g, t, step, reg);
      const int r = row_base + e.row;
      float lo = 0.0f;
      float hi = 0.0f;
      if (token_of(r) < last) {
        const float* qr = a.q + token_of(r) * a.q_stride + head_of(r) * D;
        lo = qr[e.d];
        hi = qr[e.d + 1];
      }
      qf[step][reg] = bf16x2_bits(__floats2bfloat162_rn(lo, hi));
    }
  }

  // Queues key tile `i` (keys kb..kb+63) into buffer i % 2: rows through the block table; keys
  // past the slice, past the table or in a block outside the cache read as zeros and are masked.
  const auto load_tile = [&](std::int64_t i) {
    const int buffer = static_cast<int>(i % at::buffers);
    const std::int64_t kb = key_begin + i * at::key_tile;
    unsigned char* k_dst = sm + (fp8 ? layout::k_raw + buffer * layout::raw_bytes : layout::k_tiles + buffer * layout::tile_bytes);
    unsigned char* v_dst = sm + (fp8 ? layout::v_raw + buffer * layout::raw_bytes : layout::v_tiles + buffer * layout::tile_bytes);
    const int dst_row_bytes = fp8 ? D : row_e * 2;
    for (int item = tid; item < at::key_tile * pieces; item += at::threads) {
      const int j = item / pieces;
      const int piece = item % pieces;
      const std::int64_t key = kb + j;
      std::int64_t row = -1;
      if (key < key_end && key / a.block_size < table_blocks) {
        const std::int64_t block = table[key / a.block_size];
        if (block >= 0 && block < a.num_blocks) row = (block * a.num_kv_heads + kv_head) * a.block_size + key % a.block_size;
      }
      const bool inside = row >= 0;
      const std::int64_t offset = (inside ? row : 0) * D * elem_bytes + piece * 16;
      copy_async_16(k_dst + j * dst_row_bytes + piece * 16, static_cast<const std::uint8_t*>(a.k_cache) + offset, inside);
      copy_async_16(v_dst + j * dst_row_bytes + piece * 16, static_cast<const std::uint8_t*>(a.v_cache) + offset, inside);
      if (piece == 0) {
        reinterpret_cast<int*>(sm + layout::cached)[buffer * at::key_tile + j] = inside ? 1 : 0;
        if constexpr (fp8) {
          auto* ks = reinterpret_cast<float*>(sm + layout::k_scales) + buffer * at::key_tile;
          auto* vs = reinterpret_cast<float*>(sm + layout::v_scales) + buffer * at::key_tile;
          copy_async_4(ks + j, a.k_scales + (inside ? row : 0), inside);
          copy_async_4(vs + j, a.v_scales + (inside ? row : 0), inside);
        }
      }
    }
  };

  float running_max[2] = {-INFINITY, -INFINITY};
  float running_sum[2] = {0.0f, 0.0f};
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) o[n][c] = 0.0f;
  }

  if (tiles > 0) load_tile(0);
  copy_async_commit();
  for (std::int64_t i = 0; i < tiles; ++i) {
    if (i + 1 < tiles) load_tile(i + 1);  // into the buffer tile i - 1 used: every warp is done with it
    copy_async_commit();
    copy_async_wait<1>();  // tile i has landed
    __syncthreads();
    const int buffer = static_cast<int>(i % at::buffers);
    const std::int64_t kb = key_begin + i * at::key_tile;
    auto* k_tile = reinterpret_cast<__nv_bfloat16*>(sm + layout::k_tiles + buffer * layout::tile_bytes);
    auto* v_tile = reinterpret_cast<__nv_bfloat16*>(sm + layout::v_tiles + buffer * layout::tile_bytes);
    if constexpr (fp8) {
      const unsigned char* k_codes = sm + layout::k_raw + buffer * layout::raw_bytes;
      const unsigned char* v_codes = sm + layout::v_raw + buffer * layout::raw_bytes;
      fp8_tiles_to_bf16<2>({k_codes, v_codes}, {k_tile, v_tile}, at::key_tile, D, row_e, tid, at::threads);
      __syncthreads();
    }
    const int* cached = reinterpret_cast<const int*>(sm + layout::cached) + buffer * at::key_tile;
    const float* k_scale = fp8 ? reinterpret_cast<const float*>(sm + layout::k_scales) + buffer * at::key_tile : nullptr;
    const float* v_scale = fp8 ? reinterpret_cast<const float*>(sm + layout::v_scales) + buffer * at::key_tile : nullptr;

    // S = Q Kᵀ over the tile's 64 keys.
    float sc[at::key_n_tiles][4];
#pragma unroll
    for (int j = 0; j < at::key_n_tiles; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) sc[j][c] = 0.0f;
    }
#pragma unroll
    for (int step = 0; step < D / 16; ++step) {
#pragma unroll
      for (int pair = 0; pair < at::key_n_tiles / 2; ++pair) {
        const at::k_source src = at::k_row(pair, step, lane);
        std::uint32_t kb_regs[4];
        ldmatrix_x4(kb_regs, k_tile + src.key * row_e + src.d);
        const std::uint32_t b0[2] = {kb_regs[0], kb_regs[1]};
        const std::uint32_t b1[2] = {kb_regs[2], kb_regs[3]};
        mma_bf16(sc[2 * pair], qf[step], b0);
        mma_bf16(sc[2 * pair + 1], qf[step], b1);
      }
    }
    // Scale, mask, and the online softmax of rows g and g + 8 (a row's 64 scores lie across the
    // 4 lanes of its quad).
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < at::key_n_tiles; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const at::s_element e = at::s_accumulator(g, t, j, c);
        const std::int64_t key = kb + e.key;
        const bool visible = key < key_end && key <= row_pos[c / 2] && cached[e.key] != 0;
        const float factor = fp8 ? a.scale * k_scale[e.key] : a.scale;
        sc[j][c] = visible ? sc[j][c] * factor : -INFINITY;
        tile_max[c / 2] = fmaxf(tile_max[c / 2], sc[j][c]);
      }
    }
    float correction[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(full_warp, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(full_warp, tile_max[h], 2));
      const float new_max = fmaxf(running_max[h], tile_max[h]);
      correction[h] = running_max[h] == -INFINITY ? 0.0f : expf(running_max[h] - new_max);
      running_max[h] = new_max;
    }
    float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < at::key_n_tiles; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int h = c / 2;
        const float p = sc[j][c] == -INFINITY ? 0.0f : expf(sc[j][c] - running_max[h]);
        tile_sum[h] += p;
        sc[j][c] = fp8 ? p * v_scale[at::s_accumulator(g, t, j, c).key] : p;  // the V row's scale rides on its weight
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_sum[h] += __shfl_xor_sync(full_warp, tile_sum[h], 1);
      tile_sum[h] += __shfl_xor_sync(full_warp, tile_sum[h], 2);
      running_sum[h] = running_sum[h] * correction[h] + tile_sum[h];
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) o[n][c] *= correction[c / 2];
    }
    // O += P V.
#pragma unroll
    for (int key_step = 0; key_step < at::key_tile / 16; ++key_step) {
      std::uint32_t pf[4];
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const at::p_source src = at::p_register(key_step, reg);
        pf[reg] = bf16x2_bits(
            __floats2bfloat162_rn(sc[src.n_tile][src.first_accumulator], sc[src.n_tile][src.first_accumulator + 1]));
      }
#pragma unroll
      for (int pair = 0; pair < D / 16; ++pair) {
        const at::v_source src = at::v_row(key_step, pair, lane);
        std::uint32_t vb[4];
        ldmatrix_x4_trans(vb, v_tile + src.key * row_e + src.d);
        const std::uint32_t b0[2] = {vb[0], vb[1]};
        const std::uint32_t b1[2] = {vb[2], vb[3]};
        mma_bf16(o[2 * pair], pf, b0);
        mma_bf16(o[2 * pair + 1], pf, b1);
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
  copy_async_wait<0>();

  // Rows g and g + 8: normalised output, or the slice's partial (max, sum, unnormalised output).
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row_base + g + 8 * h;
    const std::int64_t token = token_of(r);
    if (token >= last) continue;
    const std::int64_t head = head_of(r);
    float* out_row = a.out + token * a.out_stride + head * D;
    if (row_pos[h] < 0) {
      // A token at a negative position (the CPU refuses it) reads as zeros; with splits the
      // combine kernel writes them.
      if (a.splits == 1) {
        for (int d = t; d < D; d += 4) out_row[d] = 0.0f;
      }
      continue;
    }
    float* part = a.splits == 1 ? nullptr : a.partials + ((token * a.num_heads + head) * a.splits + split) * (D + 2);
    if (part != nullptr && t == 0) {
      part[0] = running_max[h];
      part[1] = running_sum[h];
    }
    // A row that saw no key (its blocks all outside the cache) reads as zeros, not NaN.
    const float inv_sum = running_sum[h] > 0.0f ? 1.0f / running_sum[h] : 0.0f;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
#pragma unroll
      for (int c = 2 * h; c < 2 * h + 2; ++c) {
        const int d = at::o_accumulator(g, t, n, c).d;
        if (part != nullptr) {
          part[2 + d] = o[n][c];
        } else {
          out_row[d] = o[n][c] * inv_sum;
        }
      }
    }
  }
}

template <dtype KV, int D>
status launch_mma(const attention_args& a, dim3 grid, cudaStream_t stream) {
  constexpr int bytes = mma_shared<KV, D>::total;
  EDGE_RETURN_IF_ERROR(allow_shared_memory(reinterpret_cast<const void*>(&attention_mma_kernel<KV, D>), bytes));
  attention_mma_kernel<KV, D><<<grid, at::threads, bytes, stream>>>(a);
  return check_launch("paged_attention (tensor cores)");
}

// The instantiations cuda_attention_uses_tensor_cores admits.
status launch_tensor_cores(const attention_args& a, dim3 grid, dtype kv, std::int64_t head_dim, cudaStream_t stream) {
  if (kv == dtype::bf16) {
    return head_dim == 64 ? launch_mma<dtype::bf16, 64>(a, grid, stream) : launch_mma<dtype::bf16, 128>(a, grid, stream);
  }
  return head_dim == 64 ? launch_mma<dtype::fp8_e4m3, 64>(a, grid, stream)
                        : launch_mma<dtype::fp8_e4m3, 128>(a, grid, stream);
}

template <dtype KV, int DPL>
status launch(const attention_args& a, dim3 grid, std::int64_t rows, cudaStream_t stream) {
  const bool staged = KV != dtype::f32 && a.vec;  // as the kernel decides
  const auto bytes = static_cast<int>(shared_floats(rows, a.head_dim, static_cast<std::int64_t>(dtype_size(KV)), staged) *
                                      static_cast<std::int64_t>(sizeof(float)));
  EDGE_RETURN_IF_ERROR(allow_shared_memory(reinterpret_cast<const void*>(&attention_kernel<KV, DPL>), bytes));
  attention_kernel<KV, DPL><<<grid, attn_threads, static_cast<std::size_t>(bytes), stream>>>(a);
  return check_launch("paged_attention");
}

}  // namespace

status run_paged_attention(const paged_attention_params& p, const stream& s) {
  if (p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0) {
    return invalid_argument("paged_attention: num_heads must be a multiple of num_kv_heads");
  }
  if (p.head_dim <= 0 || p.head_dim > max_attention_head_dim) return invalid_argument("paged_attention: bad head_dim");
  if (p.num_heads / p.num_kv_heads > max_attention_group) {
    return invalid_argument("paged_attention: too many query heads per KV head");
  }
  if (p.block_size <= 0) return invalid_argument("paged_attention: bad block size");
  if (kv_cache_scaled(p.kv_type) && (p.k_scales == nullptr || p.v_scales == nullptr)) {
    return invalid_argument("paged_attention: an fp8_e4m3 cache needs K and V scales");
  }
  if (p.seq_token_begin != nullptr && (p.num_seqs <= 0 || p.max_seq_tokens <= 0)) {
    return invalid_argument("paged_attention: seq_token_begin needs num_seqs and max_seq_tokens");
  }
  if (p.tokens <= 0) return {};
  if (p.block_tables == nullptr || p.table_begin == nullptr) return invalid_argument("paged_attention: no block tables");

  attention_args a{};
  a.q = p.q;
  a.out = p.out;
  a.k_cache = p.k_cache;
  a.v_cache = p.v_cache;
  a.k_scales = p.k_scales;
  a.v_scales = p.v_scales;
  a.seq = p.seq;
  a.pos = p.pos;
  a.block_tables = p.block_tables;
  a.table_begin = p.table_begin;
  a.seq_token_begin = p.seq_token_begin;
  a.partials = p.workspace;
  a.tokens = p.tokens;
  a.num_heads = p.num_heads;
  a.num_kv_heads = p.num_kv_heads;
  a.head_dim = p.head_dim;
  a.block_size = p.block_size;
  a.num_blocks = p.num_blocks;
  a.q_stride = p.q_stride;
  a.out_stride = p.out_stride;
  a.group = static_cast<int>(p.num_heads / p.num_kv_heads);
  a.scale = p.scale;
  const std::int64_t vec_elems = 16 / static_cast<std::int64_t>(dtype_size(p.kv_type));
  a.vec = p.head_dim % vec_elems == 0 && reinterpret_cast<std::uintptr_t>(p.k_cache) % 16 == 0 &&
          reinterpret_cast<std::uintptr_t>(p.v_cache) % 16 == 0;

  const bool tensor_cores = a.vec && cuda_attention_uses_tensor_cores(p.kv_type, p.head_dim, a.group,
                                                                     p.seq_token_begin != nullptr, p.max_seq_tokens);
  if (tensor_cores) {
    a.tile_tokens = at::rows / a.group;
  } else {
    a.tile_tokens = p.seq_token_begin != nullptr ? std::max(1, prefill_rows / a.group) : 1;
  }
  const std::int64_t runs = p.seq_token_begin != nullptr ? p.num_seqs : 1;
  // Runs of different lengths take the flat (run, tile) list from the start of the workspace
  // (attention_tiles.h); the splits' partials follow it.
  const std::int64_t offset_floats = p.seq_token_begin != nullptr ? ceil_div(runs + 1, 4) * 4 : 0;
  const bool flat = runs > 1 && p.workspace != nullptr && p.workspace_floats >= offset_floats;
  const std::int64_t tiles = p.seq_token_begin == nullptr ? p.tokens
                             : flat ? attention_tiles::flat_tile_bound(p.tokens, runs, a.tile_tokens)
                                    : ceil_div(p.max_seq_tokens, a.tile_tokens);
  const std::int64_t grid_runs = flat ? 1 : runs;
  const std::int64_t partial_floats = p.workspace == nullptr ? 0 : p.workspace_floats - (flat ? offset_floats : 0);
  // Split contexts until the grid covers the GPU about twice, as far as the workspace allows.
  const std::int64_t blocks = tiles * grid_runs * p.num_kv_heads;
  std::int64_t splits = std::clamp<std::int64_t>(ceil_div(2 * multiprocessor_count(), blocks), 1, attention_max_splits);
  if (p.workspace == nullptr) splits = 1;
  while (splits > 1 && p.tokens * p.num_heads * splits * (p.head_dim + 2) > partial_floats) --splits;
  a.splits = static_cast<int>(splits);
  a.runs = runs;
  a.tile_offsets = nullptr;
  if (flat) {
    auto* offsets = reinterpret_cast<std::int32_t*>(p.workspace);
    a.partials = p.workspace + offset_floats;
    tile_offsets_kernel<<<1, warp_size, 0, native(s)>>>(p.seq_token_begin, runs, a.tile_tokens, offsets);
    EDGE_RETURN_IF_ERROR(check_launch("paged_attention (tile offsets)"));
    a.tile_offsets = offsets;
  }

  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.num_kv_heads * splits),
                  static_cast<unsigned>(grid_runs));
  const std::int64_t rows = static_cast<std::int64_t>(a.tile_tokens) * a.group;
  const cudaStream_t stream = native(s);
  if (tensor_cores) {
    EDGE_RETURN_IF_ERROR(launch_tensor_cores(a, grid, p.kv_type, p.head_dim, stream));
  } else {
    EDGE_RETURN_IF_ERROR(dispatch_dtype(p.kv_type, [&]<dtype KV>() {
      if (p.head_dim <= 64) return launch<KV, 2>(a, grid, rows, stream);
      if (p.head_dim <= 128) return launch<KV, 4>(a, grid, rows, stream);
      return launch<KV, 8>(a, grid, rows, stream);
    }));
  }
  if (splits > 1) {
    combine_kernel<<<static_cast<unsigned>(ceil_div(p.tokens * p.num_heads, attn_warps)), attn_threads, 0, stream>>>(a);
    EDGE_RETURN_IF_ERROR(check_launch("paged_attention (combine)"));
  }
  return {};
}

}  // namespace edge::kernels::cuda
