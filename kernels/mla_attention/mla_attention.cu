// CUDA MLA attention and DSA selection.
//
// MLA attention (the absorbed form; decode and prefill alike): a block takes one token and a
// band of its heads, and walks the token's positions (0..pos, or its DSA selection) in tiles of
// 32 through its block table. Each cached row [latent | k_pe] of a tile is read once into shared
// memory for every head of the band; per head, score = scale · (q · row) (an FP8 row's scale
// folded in), an online softmax (running max and sum), and the softmax-weighted sum of the
// latents. Two kernels:
//   * tensor cores (cuda_mla_uses_tensor_cores: a bf16 or FP8 cache at latent 512, RoPE 64): a
//     band of 64 heads, the queries as bf16 in shared memory, the rows of the next tile landing
//     by cp.async while the current one is computed (FP8 codes widened to bf16, exactly). Eight
//     warps: warp (m, half) takes heads 16m..16m+15; for S = Q Kᵀ the tile's keys
//     16 half..16 half + 15, for O += P V the latent columns 256 half..256 half + 255. The two
//     halves exchange their tile maxima and sums through shared memory (so both keep the same
//     running max and sum) and P goes through shared memory as bf16 (mla_tiles.h has the tiling).
//   * f32 (every other call): a band of 16 heads, two per warp. The tile's rows are widened to
//     f32 in shared memory; for the scores a lane takes one key of the tile, for the sum a lane
//     takes latent columns 4 lane + 128 i, with the weights passed by shuffles.
// Long contexts are split (split-K) as paged_attention.cu splits them: blockIdx.z selects one of
// `splits` slices of the token's positions (sized on the device, so that a CUDA graph captured
// once serves every length); each slice writes its unnormalised output with its max and sum to
// the workspace, and a second kernel combines the slices in a fixed order.
//
// The queries may be the output (forward.cpp runs it in place): a block reads its band's
// queries into shared memory before anything else, only that block writes the band's rows, and
// with splits the combine kernel writes them after every block is done.
//
// DSA selection: a scoring kernel (blocks of 64 positions of a token: q and the keys in shared
// memory as f32, each thread 4 heads × 4 positions) writes every position's score to the
// workspace; then one block per token finds the top_k by a radix select over the scores' order
// keys (8 bits a pass) and writes the chosen positions in ascending order (ballot scans).
#include "edge/common/format.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/mla_attention/mla_tiles.h"
#include "kernels/paged_attention/attention_tiles.h"

namespace edge::kernels::cuda {
namespace {

constexpr int mla_threads = 256;
constexpr int mla_warps = mla_threads / warp_size;
constexpr int key_tile = warp_size;  // positions per tile: one per lane for the f32 scores

// The CUDA kernels' limits beyond the CPU's: the f32 kernel keeps a lane's share of the latent
// (4 columns per 128) in registers, and every kernel loads rows 4 elements at a time.
constexpr std::int64_t cuda_max_latent = 512;
constexpr std::int64_t row_element_multiple = 4;

struct mla_args {
  const float* q_latent;             // [tokens, num_heads, latent_dim], token stride q_latent_stride
  const float* q_rope;               // [tokens, num_heads, rope_dim], token stride q_rope_stride, head stride q_rope_head_stride
  float* out;                        // [tokens, num_heads, latent_dim], token stride out_stride
  const void* cache;                 // [num_blocks, block_size, latent_dim + rope_dim]
  const float* scales;               // [num_blocks, block_size] (fp8)
  const std::int32_t* seq;           // [tokens]
  const std::int32_t* pos;           // [tokens]
  const std::int32_t* block_tables;  // [table_begin[rows]]
  const std::int32_t* table_begin;   // [rows + 1]
  const std::int32_t* selected;        // [tokens, select_stride] or null
  const std::int32_t* selected_count;  // [tokens] or null
  float* partials;                   // [tokens, num_heads, splits, latent_dim + 2] when splits > 1
  std::int64_t tokens, num_heads, latent_dim, rope_dim, block_size, num_blocks, select_stride;
  std::int64_t q_latent_stride, q_rope_stride, q_rope_head_stride, out_stride;
  int splits;
  float scale;
};

// The positions a token reads, in order (its selection, or 0..pos), and where each one's row is.
struct token_walk {
  const std::int32_t* table;  // the token's blocks
  std::int64_t table_blocks;
  const std::int32_t* list;   // null: the i-th position is i
  std::int64_t count;
  std::int64_t pos;

  // The cache row of the i-th position, or -1 for one the CPU refuses (after the token's own,
  // past its block table, in a block outside the cache): left out, never read.
  __device__ std::int64_t row(std::int64_t i, std::int64_t block_size, std::int64_t num_blocks) const {
    const std::int64_t p = list != nullptr ? list[i] : i;
    if (p < 0 || p > pos || p / block_size >= table_blocks) return -1;
    const std::int64_t block = table[p / block_size];
    if (block < 0 || block >= num_blocks) return -1;
    return block * block_size + p % block_size;
  }
};

__device__ token_walk walk_of(const mla_args& a, std::int64_t t) {
  token_walk w{};
  const std::int64_t seq = a.seq[t];
  w.table = a.block_tables + a.table_begin[seq];
  w.table_blocks = a.table_begin[seq + 1] - a.table_begin[seq];
  w.pos = a.pos[t];
  w.list = nullptr;
  w.count = w.pos < 0 ? 0 : w.pos + 1;  // a negative position (the CPU refuses it) reads nothing
  if (a.selected_count != nullptr && a.selected_count[t] > 0) {
    w.list = a.selected + t * a.select_stride;
    w.count = min(static_cast<std::int64_t>(a.selected_count[t]), a.select_stride);
  }
  return w;
}

// This block's slice [begin, end) of a token's `count` positions: one of `splits` equal slices
// in whole tiles of `tile` positions.
struct position_slice {
  std::int64_t begin;
  std::int64_t end;
};
__device__ position_slice slice_of(std::int64_t count, int splits, int split, int tile) {
  const std::int64_t size = ceil_div(ceil_div(count, splits), tile) * tile;
  const std::int64_t begin = split * size;
  return {begin, min(count, begin + size)};
}

// Elements [index, index + 4) of a buffer of stored type T, widened; index a multiple of 4 and
// the buffer 16-byte aligned.
template <dtype T>
__device__ __forceinline__ float4 load4(const void* base, std::int64_t index) {
  if constexpr (T == dtype::f32) {
    return *reinterpret_cast<const float4*>(static_cast<const float*>(base) + index);
  } else if constexpr (T == dtype::fp8_e4m3) {
    const std::uint32_t bits = *reinterpret_cast<const std::uint32_t*>(static_cast<const std::uint8_t*>(base) + index);
    const float2 lo = fp8x2_to_float2(static_cast<std::uint16_t>(bits & 0xFFFFu));
    const float2 hi = fp8x2_to_float2(static_cast<std::uint16_t>(bits >> 16));
    return make_float4(lo.x, lo.y, hi.x, hi.y);
  } else {
    const uint2 bits = *reinterpret_cast<const uint2*>(static_cast<const std::uint16_t*>(base) + index);
    const auto widen = [](std::uint32_t half_bits) {
      const auto b = static_cast<std::uint16_t>(half_bits);
      return T == dtype::bf16 ? bf16_bits_to_float(b) : f16_bits_to_float(b);
    };
    return make_float4(widen(bits.x & 0xFFFFu), widen(bits.x >> 16), widen(bits.y & 0xFFFFu), widen(bits.y >> 16));
  }
}

__device__ __forceinline__ float4 times(float4 v, float f) { return make_float4(v.x * f, v.y * f, v.z * f, v.w * f); }

// ---- f32 kernel --------------------------------------------------------------------------------

constexpr int simt_heads_per_warp = 2;
constexpr int simt_band = mla_warps * simt_heads_per_warp;  // heads per block

// Floats between two rows of the widened tile: a multiple of 4 (float4 loads) whose quarter is
// odd, so that the 8 lanes of a quarter-warp reading 8 rows at one column hit 8 different
// 16-byte bank groups.
EDGE_HOST_DEVICE constexpr std::int64_t simt_row_stride(std::int64_t row_width) { return 4 * ((row_width / 4) | 1); }

// Shared memory: the tile's cache rows (int64), the band's queries [band, row_width], the
// widened tile [key_tile, simt_row_stride].
std::int64_t simt_shared_bytes(std::int64_t row_width) {
  return key_tile * 8 + (simt_band * row_width + key_tile * simt_row_stride(row_width)) * 4;
}

template <dtype KV, int CPL>  // CPL: float4 columns of the latent per lane (latent_dim <= 128 CPL)
__global__ void __launch_bounds__(mla_threads) mla_simt_kernel(mla_args a) {
  extern __shared__ __align__(16) unsigned char mla_simt_shared[];
  const std::int64_t L = a.latent_dim;
  const std::int64_t W = a.latent_dim + a.rope_dim;
  const std::int64_t row_stride = simt_row_stride(W);
  auto* rows_s = reinterpret_cast<std::int64_t*>(mla_simt_shared);                    // [key_tile] cache row, -1: none
  float* q_s = reinterpret_cast<float*>(mla_simt_shared + key_tile * sizeof(std::int64_t));  // [simt_band, W]
  float* c_s = q_s + simt_band * W;                                                     // [key_tile, row_stride]

  const std::int64_t t = blockIdx.x;
  const std::int64_t first_head = static_cast<std::int64_t>(blockIdx.y) * simt_band;
  const int split = static_cast<int>(blockIdx.z);
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;

  // The band's queries, [latent | rope] per head, before anything is written.
  for (std::int64_t i = threadIdx.x; i < simt_band * W; i += mla_threads) {
    const std::int64_t h = first_head + i / W;
    const std::int64_t d = i % W;
    float v = 0.0f;
    if (h < a.num_heads) {
      v = d < L ? a.q_latent[t * a.q_latent_stride + h * L + d]
                : a.q_rope[t * a.q_rope_stride + h * a.q_rope_head_stride + (d - L)];
    }
    q_s[i] = v;
  }
  const token_walk walk = walk_of(a, t);
  const position_slice slice = slice_of(walk.count, a.splits, split, key_tile);

  float acc[simt_heads_per_warp][CPL][4];
  float running_max[simt_heads_per_warp];
  float running_sum[simt_heads_per_warp];
#pragma unroll
  for (int k = 0; k < simt_heads_per_warp; ++k) {
    running_max[k] = -INFINITY;
    running_sum[k] = 0.0f;
#pragma unroll
    for (int c = 0; c < CPL; ++c) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[k][c][e] = 0.0f;
    }
  }
  const float* q_warp = q_s + warp * simt_heads_per_warp * W;  // this warp's heads

  const std::int64_t pieces = W / 4;
  for (std::int64_t kb = slice.begin; kb < slice.end; kb += key_tile) {
    if (threadIdx.x < key_tile) {
      const std::int64_t i = kb + threadIdx.x;
      rows_s[threadIdx.x] = i < slice.end ? walk.row(i, a.block_size, a.num_blocks) : -1;
    }
    __syncthreads();  // the rows (and, the first time, the queries) are in
    for (std::int64_t item = threadIdx.x; item < key_tile * pieces; item += mla_threads) {
      const auto j = static_cast<int>(item / pieces);
      const std::int64_t piece = item % pieces;
      const std::int64_t row = rows_s[j];
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (row >= 0) {
        v = load4<KV>(a.cache, row * W + piece * 4);
        if constexpr (KV == dtype::fp8_e4m3) v = times(v, a.scales[row]);  // kv_cache_scaled(KV)
      }
      *reinterpret_cast<float4*>(c_s + j * row_stride + piece * 4) = v;
    }
    __syncthreads();

    // Scores: lane j takes key j of the tile for the warp's heads.
    const bool visible = rows_s[lane] >= 0;
    float dot[simt_heads_per_warp];
#pragma unroll
    for (int k = 0; k < simt_heads_per_warp; ++k) dot[k] = 0.0f;
    const float* c_row = c_s + lane * row_stride;
    for (std::int64_t d = 0; d < W; d += 4) {
      const float4 c = *reinterpret_cast<const float4*>(c_row + d);
#pragma unroll
      for (int k = 0; k < simt_heads_per_warp; ++k) {
        const float4 q = *reinterpret_cast<const float4*>(q_warp + k * W + d);
        dot[k] = fmaf(q.x, c.x, dot[k]);
        dot[k] = fmaf(q.y, c.y, dot[k]);
        dot[k] = fmaf(q.z, c.z, dot[k]);
        dot[k] = fmaf(q.w, c.w, dot[k]);
      }
    }
    float weight[simt_heads_per_warp];
#pragma unroll
    for (int k = 0; k < simt_heads_per_warp; ++k) {
      const float score = visible ? dot[k] * a.scale : -INFINITY;
      const float tile_max = warp_max(score);
      weight[k] = 0.0f;
      if (tile_max == -INFINITY) continue;  // nothing visible in the tile: the same for the whole warp
      const float new_max = fmaxf(running_max[k], tile_max);
      const float correction = expf(running_max[k] - new_max);  // exp(-inf) = 0 on the first tile
      weight[k] = visible ? expf(score - new_max) : 0.0f;
      running_sum[k] = running_sum[k] * correction + warp_sum(weight[k]);
      running_max[k] = new_max;
#pragma unroll
      for (int c = 0; c < CPL; ++c) {
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[k][c][e] *= correction;
      }
    }
    // Latents: lane takes columns 4 lane + 128 c.
    for (int j = 0; j < key_tile; ++j) {
      float wj[simt_heads_per_warp];
      bool any = false;
#pragma unroll
      for (int k = 0; k < simt_heads_per_warp; ++k) {
        wj[k] = __shfl_sync(full_warp, weight[k], j);
        any = any || wj[k] != 0.0f;
      }
      if (!any) continue;  // the same for the whole warp
      const float* v_row = c_s + j * row_stride;
#pragma unroll
      for (int c = 0; c < CPL; ++c) {
        const std::int64_t d = 4 * lane + 128 * c;
        if (d >= L) continue;
        const float4 v = *reinterpret_cast<const float4*>(v_row + d);
#pragma unroll
        for (int k = 0; k < simt_heads_per_warp; ++k) {
          acc[k][c][0] = fmaf(wj[k], v.x, acc[k][c][0]);
          acc[k][c][1] = fmaf(wj[k], v.y, acc[k][c][1]);
          acc[k][c][2] = fmaf(wj[k], v.z, acc[k][c][2]);
          acc[k][c][3] = fmaf(wj[k], v.w, acc[k][c][3]);
        }
      }
    }
    __syncthreads();  // every warp is done with the tile before the next one replaces it
  }

#pragma unroll
  for (int k = 0; k < simt_heads_per_warp; ++k) {
    const std::int64_t h = first_head + warp * simt_heads_per_warp + k;
    if (h >= a.num_heads) continue;
    // [tokens, num_heads, splits, L + 2]: max, sum, then the unnormalised output.
    float* part = a.splits == 1 ? nullptr : a.partials + ((t * a.num_heads + h) * a.splits + split) * (L + 2);
    if (part != nullptr) {
      if (lane == 0) {
        part[0] = running_max[k];
        part[1] = running_sum[k];
      }
      // A slice that saw no row (past a short context) is left out by its max: its output unwritten.
      if (running_max[k] == -INFINITY) continue;
    }
    // A token that saw no row (a negative position, or rows all outside the cache) reads as zeros.
    const float inv_sum = running_sum[k] > 0.0f ? 1.0f / running_sum[k] : 0.0f;
    float* out_row = a.out + t * a.out_stride + h * L;
#pragma unroll
    for (int c = 0; c < CPL; ++c) {
      const std::int64_t d = 4 * lane + 128 * c;
      if (d >= L) continue;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        if (part != nullptr) {
          part[2 + d + e] = acc[k][c][e];
        } else {
          out_row[d + e] = acc[k][c][e] * inv_sum;
        }
      }
    }
  }
}

// ---- tensor-core kernel (bf16 / FP8 cache, latent 512, RoPE 64) ----------------------------

namespace at = attention_tiles;

namespace mt = mla_tiles;

// Shared memory of the tensor-core kernel, in bytes from its start.
template <dtype KV>
struct mla_tc_shared {
  static constexpr bool fp8 = KV == dtype::fp8_e4m3;
  static constexpr int elem_bytes = fp8 ? 1 : 2;
  static constexpr int q = 0;                                            // bf16 [rows][row_elements]
  static constexpr int tile_bytes = mt::keys * mt::row_elements * 2;     // bf16 [keys][row_elements]
  static constexpr int tiles = q + mt::rows * mt::row_elements * 2;      // [2] tiles
  static constexpr int raw_bytes = fp8 ? mt::keys * mt::width : 0;       // FP8 codes [keys][width]
  static constexpr int raw = tiles + 2 * tile_bytes;                     // [2] raw tiles
  static constexpr int p = raw + 2 * raw_bytes;                          // bf16 [rows][p_row_elements]
  static constexpr int scales = p + mt::rows * mt::p_row_elements * 2;   // f32 [2][keys] (FP8)
  static constexpr int valid = scales + 2 * mt::keys * 4;                // int [2][keys] 1: the row is read
  static constexpr int tile_max = valid + 2 * mt::keys * 4;              // f32 [2 halves][rows]
  static constexpr int tile_sum = tile_max + 2 * mt::rows * 4;           // f32 [2 halves][rows]
  static constexpr int total = tile_sum + 2 * mt::rows * 4;
  static_assert(tile_bytes % 16 == 0 && raw_bytes % 16 == 0 && tiles % 16 == 0 && p % 16 == 0,
                "16-byte aligned regions for cp.async and ldmatrix");
  static_assert(total <= 227 * 1024, "within the shared memory of an sm_90 block");
};

template <dtype KV>
__global__ void __launch_bounds__(mt::threads, 1) mla_tc_kernel(mla_args a) {
  using layout = mla_tc_shared<KV>;
  constexpr bool fp8 = layout::fp8;
  constexpr int elem_bytes = layout::elem_bytes;
  constexpr int pieces = mt::width * elem_bytes / 16;  // 16-byte pieces of a cache row
  extern __shared__ __align__(128) unsigned char mla_tc_shared_memory[];
  unsigned char* const sm = mla_tc_shared_memory;
  auto* q_s = reinterpret_cast<__nv_bfloat16*>(sm + layout::q);
  auto* p_s = reinterpret_cast<__nv_bfloat16*>(sm + layout::p);
  auto* valid_s = reinterpret_cast<int*>(sm + layout::valid);
  auto* scale_s = reinterpret_cast<float*>(sm + layout::scales);
  auto* max_s = reinterpret_cast<float*>(sm + layout::tile_max);
  auto* sum_s = reinterpret_cast<float*>(sm + layout::tile_sum);

  const std::int64_t t = blockIdx.x;
  const std::int64_t first_head = static_cast<std::int64_t>(blockIdx.y) * mt::rows;
  const int split = static_cast<int>(blockIdx.z);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / warp_size;
  const int lane = tid % warp_size;
  const int g = lane / 4;
  const int tq = lane % 4;
  const mt::warp_role role = mt::role_of(warp);
  const int m = role.m;        // rows 16m..16m+15
  const int half = role.half;  // keys 16 half.. of a tile in S; latent columns 256 half.. in O
  const mt::a_source a_src = mt::a_row(lane);

  // The band's queries as bf16, [latent | rope] per head, before anything is written.
  for (int i = tid; i < mt::rows * (mt::width / 2); i += mt::threads) {
    const int r = i / (mt::width / 2);
    const int d = 2 * (i % (mt::width / 2));
    const std::int64_t h = first_head + r;
    float lo = 0.0f;
    float hi = 0.0f;
    if (h < a.num_heads) {
      const float* src = d < mt::latent ? a.q_latent + t * a.q_latent_stride + h * mt::latent + d
                                        : a.q_rope + t * a.q_rope_stride + h * a.q_rope_head_stride + (d - mt::latent);
      lo = src[0];
      hi = src[1];
    }
    *reinterpret_cast<__nv_bfloat162*>(q_s + r * mt::row_elements + d) = __floats2bfloat162_rn(lo, hi);
  }
  const token_walk walk = walk_of(a, t);
  const position_slice slice = slice_of(walk.count, a.splits, split, mt::keys);
  const std::int64_t tiles = slice.end > slice.begin ? ceil_div(slice.end - slice.begin, mt::keys) : 0;

  // Tile i's rows into buffer `buffer`: bf16 rows straight into the tile, FP8 codes into the raw
  // tile; a position left out reads as zeros with a scale of 0.
  const auto load_tile = [&](std::int64_t i, int buffer) {
    const std::int64_t kb = slice.begin + i * mt::keys;
    for (int item = tid; item < mt::keys * pieces; item += mt::threads) {
      const int j = item / pieces;
      const int piece = item % pieces;
      const std::int64_t index = kb + j;
      const std::int64_t row = index < slice.end ? walk.row(index, a.block_size, a.num_blocks) : -1;
      const bool inside = row >= 0;
      const auto* src = static_cast<const std::uint8_t*>(a.cache) + (inside ? row : 0) * (mt::width * elem_bytes) + piece * 16;
      unsigned char* dst = fp8 ? sm + layout::raw + buffer * layout::raw_bytes + j * mt::width + piece * 16
                               : sm + layout::tiles + buffer * layout::tile_bytes + j * (mt::row_elements * 2) + piece * 16;
      copy_async_16(dst, src, inside);
      if (piece == 0) {
        valid_s[buffer * mt::keys + j] = inside ? 1 : 0;
        if constexpr (fp8) copy_async_4(scale_s + buffer * mt::keys + j, a.scales + (inside ? row : 0), inside);
      }
    }
  };

  float o[mt::o_tiles][4];
#pragma unroll
  for (int n = 0; n < mt::o_tiles; ++n) {
#pragma unroll
    for (int c = 0; c < 4; ++c) o[n][c] = 0.0f;
  }
  float running_max[2] = {-INFINITY, -INFINITY};  // rows g and g + 8 of the warp's 16
  float running_sum[2] = {0.0f, 0.0f};
  const int row0 = 16 * m + g;  // the block's row of accumulator pair 0 (pair 1: + 8)

  if (tiles > 0) load_tile(0, 0);
  copy_async_commit();
  for (std::int64_t i = 0; i < tiles; ++i) {
    const int buffer = static_cast<int>(i % 2);
    if (i + 1 < tiles) load_tile(i + 1, (buffer + 1) % 2);  // into the buffer tile i - 1 used: everyone is done with it
    copy_async_commit();
    copy_async_wait<1>();  // tile i has landed
    __syncthreads();       // (and, the first time, the queries are in)
    auto* tile = reinterpret_cast<__nv_bfloat16*>(sm + layout::tiles + buffer * layout::tile_bytes);
    if constexpr (fp8) {
      const unsigned char* codes = sm + layout::raw + buffer * layout::raw_bytes;
      fp8_tiles_to_bf16<1>({codes}, {tile}, mt::keys, mt::width, mt::row_elements, tid, mt::threads);
      __syncthreads();
    }
    const int* valid = valid_s + buffer * mt::keys;
    const float* row_scale = scale_s + buffer * mt::keys;

    // S = Q Kᵀ: the warp's 16 rows against keys 16 half..16 half + 15 (n-tiles 0 and 1).
    float sc[2][4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) sc[j][c] = 0.0f;
    }
#pragma unroll 4
    for (int step = 0; step < mt::score_steps; ++step) {
      std::uint32_t qa[4];
      ldmatrix_x4(qa, q_s + (16 * m + a_src.row) * mt::row_elements + 16 * step + a_src.col);
      const at::k_source src = at::k_row(half, step, lane);
      std::uint32_t kb_regs[4];
      ldmatrix_x4(kb_regs, tile + src.key * mt::row_elements + src.d);
      const std::uint32_t b0[2] = {kb_regs[0], kb_regs[1]};
      const std::uint32_t b1[2] = {kb_regs[2], kb_regs[3]};
      mma_bf16(sc[0], qa, b0);
      mma_bf16(sc[1], qa, b1);
    }
    // Scale and mask; the tile's maximum of rows g and g + 8 over both halves.
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int key = mt::score_key(half, g, tq, j, c);
        const float factor = fp8 ? a.scale * row_scale[key] : a.scale;
        sc[j][c] = valid[key] != 0 ? sc[j][c] * factor : -INFINITY;
        tile_max[c / 2] = fmaxf(tile_max[c / 2], sc[j][c]);
      }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(full_warp, tile_max[h], 1));
      tile_max[h] = fmaxf(tile_max[h], __shfl_xor_sync(full_warp, tile_max[h], 2));
      if (tq == 0) max_s[half * mt::rows + row0 + 8 * h] = tile_max[h];
    }
    __syncthreads();
    float correction[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // fmaxf is exact and symmetric: both halves get the same maximum.
      tile_max[h] = fmaxf(tile_max[h], max_s[(1 - half) * mt::rows + row0 + 8 * h]);
      const float new_max = fmaxf(running_max[h], tile_max[h]);
      correction[h] = running_max[h] == -INFINITY ? 0.0f : expf(running_max[h] - new_max);
      running_max[h] = new_max;
    }
    // P = exp(S - max) (times an FP8 row's scale, which its latent carries), as bf16 in shared
    // memory for both halves' O; each half's row sums for the other.
    float tile_sum[2] = {0.0f, 0.0f};
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int h = c / 2;
        const float p = sc[j][c] == -INFINITY ? 0.0f : expf(sc[j][c] - running_max[h]);
        tile_sum[h] += p;
        sc[j][c] = fp8 ? p * row_scale[mt::score_key(half, g, tq, j, c)] : p;
      }
      const int key = 16 * half + 8 * j + 2 * tq;
      *reinterpret_cast<__nv_bfloat162*>(p_s + row0 * mt::p_row_elements + key) = __floats2bfloat162_rn(sc[j][0], sc[j][1]);
      *reinterpret_cast<__nv_bfloat162*>(p_s + (row0 + 8) * mt::p_row_elements + key) =
          __floats2bfloat162_rn(sc[j][2], sc[j][3]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      tile_sum[h] += __shfl_xor_sync(full_warp, tile_sum[h], 1);
      tile_sum[h] += __shfl_xor_sync(full_warp, tile_sum[h], 2);
      if (tq == 0) sum_s[half * mt::rows + row0 + 8 * h] = tile_sum[h];
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Half 0's sum first on both halves: the same running sum.
      running_sum[h] = running_sum[h] * correction[h] + (sum_s[row0 + 8 * h] + sum_s[mt::rows + row0 + 8 * h]);
    }
#pragma unroll
    for (int n = 0; n < mt::o_tiles; ++n) {
#pragma unroll
      for (int c = 0; c < 4; ++c) o[n][c] *= correction[c / 2];
    }
    // O += P V over the tile's 32 keys, for latent columns 256 half..256 half + 255.
#pragma unroll
    for (int key_step = 0; key_step < mt::keys / 16; ++key_step) {
      std::uint32_t pa[4];
      ldmatrix_x4(pa, p_s + (16 * m + a_src.row) * mt::p_row_elements + 16 * key_step + a_src.col);
#pragma unroll
      for (int pair = 0; pair < mt::o_tiles / 2; ++pair) {
        const at::v_source src = at::v_row(key_step, pair, lane);
        std::uint32_t vb[4];
        ldmatrix_x4_trans(vb, tile + src.key * mt::row_elements + mt::half_columns * half + src.d);
        const std::uint32_t b0[2] = {vb[0], vb[1]};
        const std::uint32_t b1[2] = {vb[2], vb[3]};
        mma_bf16(o[2 * pair], pa, b0);
        mma_bf16(o[2 * pair + 1], pa, b1);
      }
    }
    __syncthreads();  // every warp is done with this buffer, P and the sums before they are refilled
  }
  copy_async_wait<0>();

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const std::int64_t head = first_head + row0 + 8 * h;
    if (head >= a.num_heads) continue;
    float* part = a.splits == 1 ? nullptr : a.partials + ((t * a.num_heads + head) * a.splits + split) * (mt::latent + 2);
    if (part != nullptr) {
      if (half == 0 && tq == 0) {
        part[0] = running_max[h];
        part[1] = running_sum[h];
      }
      // A slice that saw no row (past a short context) is left out by its max: its output unwritten.
      if (running_max[h] == -INFINITY) continue;
    }
    // A token that saw no row reads as zeros.
    const float inv_sum = running_sum[h] > 0.0f ? 1.0f / running_sum[h] : 0.0f;
    float* out_row = a.out + t * a.out_stride + head * mt::latent;
#pragma unroll
    for (int n = 0; n < mt::o_tiles; ++n) {
#pragma unroll
      for (int c = 2 * h; c < 2 * h + 2; ++c) {
        const int d = mt::half_columns * half + at::o_accumulator(g, tq, n, c).d;
        if (part != nullptr) {
          part[2 + d] = o[n][c];
        } else {
          out_row[d] = o[n][c] * inv_sum;
        }
      }
    }
  }
}

// ---- the slices combined --------------------------------------------------------------------

constexpr int slices_per_lane = static_cast<int>(mla_attention_max_splits / warp_size);
static_assert(mla_attention_max_splits % warp_size == 0, "the combine kernel keeps whole slices per lane");

// One warp per (token, head): the slices' results rescaled to the common max and added in slice
// order (lane l holds the factors of slices l, l + 32, ...). A slice that saw no row has max -inf
// and sum 0 and adds nothing (its output, never written, is not read); a token that saw none
// reads as zeros.
__global__ void __launch_bounds__(mla_threads) mla_combine_kernel(mla_args a) {
  const std::int64_t item = static_cast<std::int64_t>(blockIdx.x) * mla_warps + threadIdx.x / warp_size;
  if (item >= a.tokens * a.num_heads) return;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const std::int64_t L = a.latent_dim;
  const std::int64_t t = item / a.num_heads;
  const std::int64_t h = item % a.num_heads;
  const float* parts = a.partials + item * a.splits * (L + 2);
  float m[slices_per_lane];
  float lane_max = -INFINITY;
#pragma unroll
  for (int g = 0; g < slices_per_lane; ++g) {
    const int s = g * warp_size + lane;
    m[g] = s < a.splits ? parts[s * (L + 2)] : -INFINITY;
    lane_max = fmaxf(lane_max, m[g]);
  }
  const float max_all = warp_max(lane_max);
  float factor[slices_per_lane];
  float lane_sum = 0.0f;
#pragma unroll
  for (int g = 0; g < slices_per_lane; ++g) {
    const int s = g * warp_size + lane;
    factor[g] = m[g] == -INFINITY ? 0.0f : expf(m[g] - max_all);
    if (s < a.splits) lane_sum = fmaf(parts[s * (L + 2) + 1], factor[g], lane_sum);
  }
  const float sum = warp_sum(lane_sum);
  const bool none = !(sum > 0.0f);
  float* out_row = a.out + t * a.out_stride + h * L;
  for (std::int64_t d = lane; d < L; d += warp_size) {
    float value = 0.0f;
#pragma unroll
    for (int g = 0; g < slices_per_lane; ++g) {
      for (int l = 0; l < warp_size; ++l) {
        const int s = g * warp_size + l;
        if (s >= a.splits) break;  // the same for the whole warp
        const float f = __shfl_sync(full_warp, factor[g], l);
        if (f != 0.0f) value = fmaf(parts[s * (L + 2) + 2 + d], f, value);
      }
    }
    out_row[d] = none ? 0.0f : value / sum;
  }
}

// The number of slices per context that finishes soonest when `blocks` blocks (each a whole
// context) run `resident` at a time: the fewest waves per slice of the work, and on a tie the
// fewest slices (each costs its partial results, about 2 KB per head).
std::int64_t fastest_splits(std::int64_t blocks, std::int64_t resident, std::int64_t most) {
  std::int64_t best = 1;
  std::int64_t best_waves = ceil_div(blocks, resident);
  for (std::int64_t splits = 2; splits <= most; ++splits) {
    const std::int64_t waves = ceil_div(blocks * splits, resident);
    if (waves * best < best_waves * splits) {  // waves / splits < best_waves / best
      best = splits;
      best_waves = waves;
    }
  }
  return best;
}

template <dtype KV, int CPL>
status launch_simt(const mla_args& a, dim3 grid, cudaStream_t stream) {
  const auto bytes = static_cast<int>(simt_shared_bytes(a.latent_dim + a.rope_dim));
  EDGE_RETURN_IF_ERROR(allow_shared_memory(reinterpret_cast<const void*>(&mla_simt_kernel<KV, CPL>), bytes));
  mla_simt_kernel<KV, CPL><<<grid, mla_threads, static_cast<std::size_t>(bytes), stream>>>(a);
  return check_launch("mla_attention");
}

template <dtype KV>
status launch_tc(const mla_args& a, dim3 grid, cudaStream_t stream) {
  constexpr int bytes = mla_tc_shared<KV>::total;
  EDGE_RETURN_IF_ERROR(allow_shared_memory(reinterpret_cast<const void*>(&mla_tc_kernel<KV>), bytes));
  mla_tc_kernel<KV><<<grid, mt::threads, bytes, stream>>>(a);
  return check_launch("mla_attention (tensor cores)");
}

}  // namespace

status run_mla_attention(const mla_attention_params& p, const stream& s) {
  // run_mla_attention (mla_attention_cpu.cpp) has checked the shapes, strides and selection.
  if (p.latent_dim > cuda_max_latent || p.latent_dim % row_element_multiple != 0 ||
      p.rope_dim % row_element_multiple != 0) {
    return invalid_argument(format("mla_attention: the CUDA kernel takes latent_dim up to {} and latent_dim and "
                                   "rope_dim in multiples of {}, not {} and {}",
                                   cuda_max_latent, row_element_multiple, p.latent_dim, p.rope_dim));
  }
  if (reinterpret_cast<std::uintptr_t>(p.cache) % 16 != 0) {
    return invalid_argument("mla_attention: the CUDA kernel reads a cache that starts at a 16-byte boundary");
  }
  if (p.tokens <= 0) return {};

  const bool tensor_cores = cuda_mla_uses_tensor_cores(p.kv_type, p.latent_dim, p.rope_dim);
  const std::int64_t band = tensor_cores ? mt::rows : simt_band;
  const std::int64_t bands = ceil_div(p.num_heads, band);
  // As many slices as the workspace holds, at most.
  std::int64_t most = 1;
  if (p.workspace != nullptr) {
    most = std::clamp<std::int64_t>(p.workspace_floats / (p.tokens * p.num_heads * (p.latent_dim + 2)), 1,
                                    mla_attention_splits_cap(p.tokens));
  }
  // A tensor-core block fills an SM's shared memory; two f32 blocks share one.
  const std::int64_t resident = (tensor_cores ? 1 : 2) * multiprocessor_count();
  const std::int64_t splits = fastest_splits(p.tokens * bands, resident, most);

  mla_args a{};
  a.q_latent = p.q_latent;
  a.q_rope = p.q_rope;
  a.out = p.out;
  a.cache = p.cache;
  a.scales = p.scales;
  a.seq = p.seq;
  a.pos = p.pos;
  a.block_tables = p.block_tables;
  a.table_begin = p.table_begin;
  a.selected = p.selected;
  a.selected_count = p.selected_count;
  a.partials = p.workspace;
  a.tokens = p.tokens;
  a.num_heads = p.num_heads;
  a.latent_dim = p.latent_dim;
  a.rope_dim = p.rope_dim;
  a.block_size = p.block_size;
  a.num_blocks = p.num_blocks;
  a.select_stride = p.select_stride;
  a.q_latent_stride = p.q_latent_stride;
  a.q_rope_stride = p.q_rope_stride;
  a.q_rope_head_stride = p.q_rope_head_stride;
  a.out_stride = p.out_stride;
  a.splits = static_cast<int>(splits);
  a.scale = p.scale;

  const dim3 grid(static_cast<unsigned>(p.tokens), static_cast<unsigned>(bands), static_cast<unsigned>(splits));
  const cudaStream_t stream = native(s);
  if (tensor_cores) {
    EDGE_RETURN_IF_ERROR(p.kv_type == dtype::bf16 ? launch_tc<dtype::bf16>(a, grid, stream)
                                                  : launch_tc<dtype::fp8_e4m3>(a, grid, stream));
  } else {
    EDGE_RETURN_IF_ERROR(dispatch_dtype(p.kv_type, [&]<dtype KV>() {
      if (p.latent_dim <= 128) return launch_simt<KV, 1>(a, grid, stream);
      if (p.latent_dim <= 256) return launch_simt<KV, 2>(a, grid, stream);
      return launch_simt<KV, 4>(a, grid, stream);
    }));
  }
  if (splits > 1) {
    mla_combine_kernel<<<static_cast<unsigned>(ceil_div(p.tokens * p.num_heads, mla_warps)), mla_threads, 0, stream>>>(a);
    EDGE_RETURN_IF_ERROR(check_launch("mla_attention (combine)"));
  }
  return {};
}

// ---- DSA selection ------------------------------------------------------------------------------

namespace {

constexpr int score_threads = 256;
constexpr int score_positions = 64;                       // positions per scoring tile
constexpr int score_group = 4;                            // a thread's heads × positions: 4 × 4
constexpr int score_head_groups = score_threads / (score_positions / score_group);  // 16
constexpr std::int64_t cuda_max_index_heads = score_head_groups * score_group;      // 64
constexpr std::int64_t cuda_max_index_dim = 128;
constexpr int pick_threads = 512;
constexpr int pick_warps = pick_threads / warp_size;
constexpr int radix_bits = 8;
constexpr int radix_bins = 1 << radix_bits;

struct dsa_args {
  const float* q;              // [tokens, index_heads, index_dim], token stride q_stride
  const float* head_weights;   // [tokens, index_heads], token stride weights_stride
  const void* key_cache;       // [num_blocks, block_size, index_dim]
  const float* key_scales;     // [num_blocks, block_size] (fp8)
  const std::int32_t* seq;
  const std::int32_t* pos;
  const std::int32_t* block_tables;
  const std::int32_t* table_begin;
  std::int32_t* selected;        // [tokens, top_k]
  std::int32_t* selected_count;  // [tokens]
  float* scores;                 // [chunk tokens, max_context] this chunk's scores
  std::int64_t first_token;      // of the chunk
  std::int64_t max_context;      // workspace_context
  std::int64_t index_heads, index_dim, top_k, block_size, num_blocks, q_stride, weights_stride;
  float weight_scale;
};

// Whether token t takes a selection: a context longer than top_k that the workspace holds.
__device__ __forceinline__ bool selects(const dsa_args& a, std::int64_t pos) {
  return pos >= 0 && pos + 1 > a.top_k && pos + 1 <= a.max_context;
}

// Shared floats of the scoring kernel: qᵀ [index_dim][64 heads], keysᵀ [index_dim][64
// positions], the head weights [64], the partial sums [16 head groups][64 positions], and
// whether each position's row was read [64].
std::int64_t score_shared_bytes(std::int64_t index_dim) {
  return (index_dim * (cuda_max_index_heads + score_positions) + cuda_max_index_heads +
          score_head_groups * score_positions + score_positions) *
         4;
}

// Every position's score of token first_token + blockIdx.y, blocks of 64 positions taken by
// blockIdx.x, + gridDim.x, ...; a position whose row is outside the cache scores -inf.
template <dtype KV>
__global__ void __launch_bounds__(score_threads) dsa_score_kernel(dsa_args a) {
  extern __shared__ __align__(16) float score_shared[];
  const std::int64_t D = a.index_dim;
  float* q_s = score_shared;                                     // [D][64 heads]
  float* k_s = q_s + D * cuda_max_index_heads;                   // [D][64 positions]
  float* w_s = k_s + D * score_positions;                        // [64]
  float* part_s = w_s + cuda_max_index_heads;                    // [16][64]
  auto* read_s = reinterpret_cast<int*>(part_s + score_head_groups * score_positions);  // [64]

  const std::int64_t t = a.first_token + blockIdx.y;
  const std::int64_t pos = a.pos[t];
  if (!selects(a, pos)) return;
  const std::int64_t context = pos + 1;
  const std::int64_t tiles = ceil_div(context, score_positions);
  if (static_cast<std::int64_t>(blockIdx.x) >= tiles) return;
  const int tid = static_cast<int>(threadIdx.x);
  const std::int64_t seq = a.seq[t];
  const std::int32_t* table = a.block_tables + a.table_begin[seq];
  const std::int64_t table_blocks = a.table_begin[seq + 1] - a.table_begin[seq];

  for (std::int64_t i = tid; i < D * cuda_max_index_heads; i += score_threads) {
    const std::int64_t h = i % cuda_max_index_heads;
    const std::int64_t d = i / cuda_max_index_heads;
    q_s[d * cuda_max_index_heads + h] = h < a.index_heads ? a.q[t * a.q_stride + h * D + d] : 0.0f;
  }
  if (tid < cuda_max_index_heads) w_s[tid] = tid < a.index_heads ? a.head_weights[t * a.weights_stride + tid] : 0.0f;
  float* scores = a.scores + static_cast<std::int64_t>(blockIdx.y) * a.max_context;
  const int head_group = tid / (score_positions / score_group);
  const int position_group = tid % (score_positions / score_group);

  for (std::int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const std::int64_t first = tile * score_positions;
    __syncthreads();  // the previous tile's keys and sums are used (and, the first time, q is in)
    for (std::int64_t item = tid; item < score_positions * (D / 4); item += score_threads) {
      const auto s = static_cast<int>(item % score_positions);
      const std::int64_t c = item / score_positions;
      const std::int64_t position = first + s;
      std::int64_t row = -1;
      if (position < context && position / a.block_size < table_blocks) {
        const std::int64_t block = table[position / a.block_size];
        if (block >= 0 && block < a.num_blocks) row = block * a.block_size + position % a.block_size;
      }
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (row >= 0) {
        v = load4<KV>(a.key_cache, row * D + 4 * c);
        if constexpr (KV == dtype::fp8_e4m3) v = times(v, a.key_scales[row]);  // kv_cache_scaled(KV)
      }
      k_s[(4 * c + 0) * score_positions + s] = v.x;
      k_s[(4 * c + 1) * score_positions + s] = v.y;
      k_s[(4 * c + 2) * score_positions + s] = v.z;
      k_s[(4 * c + 3) * score_positions + s] = v.w;
      if (c == 0) read_s[s] = row >= 0 ? 1 : 0;
    }
    __syncthreads();
    float dot[score_group][score_group];  // [head][position]
#pragma unroll
    for (int i = 0; i < score_group; ++i) {
#pragma unroll
      for (int j = 0; j < score_group; ++j) dot[i][j] = 0.0f;
    }
    for (std::int64_t d = 0; d < D; ++d) {
      const float4 q = *reinterpret_cast<const float4*>(q_s + d * cuda_max_index_heads + score_group * head_group);
      const float4 k = *reinterpret_cast<const float4*>(k_s + d * score_positions + score_group * position_group);
      const float qv[4] = {q.x, q.y, q.z, q.w};
      const float kv[4] = {k.x, k.y, k.z, k.w};
#pragma unroll
      for (int i = 0; i < score_group; ++i) {
#pragma unroll
        for (int j = 0; j < score_group; ++j) dot[i][j] = fmaf(qv[i], kv[j], dot[i][j]);
      }
    }
#pragma unroll
    for (int j = 0; j < score_group; ++j) {
      float partial = 0.0f;
#pragma unroll
      for (int i = 0; i < score_group; ++i) partial += w_s[score_group * head_group + i] * fmaxf(dot[i][j], 0.0f);
      part_s[head_group * score_positions + score_group * position_group + j] = partial;
    }
    __syncthreads();
    if (tid < score_positions && first + tid < context) {
      float total = 0.0f;
      for (int hg = 0; hg < score_head_groups; ++hg) total += part_s[hg * score_positions + tid];
      scores[first + tid] = read_s[tid] != 0 ? total * a.weight_scale : -INFINITY;
    }
  }
}

// A score's order key: larger scores get larger keys, -0 and +0 the same one, NaN the smallest.
__device__ __forceinline__ std::uint32_t score_key(float v) {
  if (isnan(v)) return 0u;
  const std::uint32_t bits = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (bits & 0x8000'0000u) != 0 ? ~bits : bits | 0x8000'0000u;
}

// The number of threads of the block before this one (in thread order) for which `flag` holds,
// and (in `total`) for how many it holds in all. `counts` is [pick_warps] of shared memory, free
// again when this returns.
__device__ __forceinline__ int block_rank(bool flag, unsigned* counts, int& total) {
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  const unsigned ballot = __ballot_sync(full_warp, flag);
  if (lane == 0) counts[warp] = static_cast<unsigned>(__popc(ballot));
  __syncthreads();
  int rank = __popc(ballot & ((1u << lane) - 1u));
  total = 0;
  for (int w = 0; w < pick_warps; ++w) {
    const int c = static_cast<int>(counts[w]);
    if (w < warp) rank += c;
    total += c;
  }
  __syncthreads();
  return rank;
}

// Token first_token + blockIdx.x's top_k positions from its scores: a radix select of the
// order keys finds the top_k-th largest key K and how many of the keys equal to K belong to the
// top_k (the lowest positions first); then the positions whose key is above K, and those first
// ones equal to K, are written in ascending order.
__global__ void __launch_bounds__(pick_threads) dsa_pick_kernel(dsa_args a) {
  __shared__ unsigned histogram[radix_bins];
  __shared__ unsigned counts[pick_warps];
  __shared__ unsigned chosen_digit;
  __shared__ int chosen_left;
  const std::int64_t t = a.first_token + blockIdx.x;
  const std::int64_t pos = a.pos[t];
  const int tid = static_cast<int>(threadIdx.x);
  if (!selects(a, pos)) {
    if (tid == 0) a.selected_count[t] = 0;
    return;
  }
  const std::int64_t context = pos + 1;
  const float* scores = a.scores + static_cast<std::int64_t>(blockIdx.x) * a.max_context;

  std::uint32_t prefix = 0;
  std::uint32_t mask = 0;
  int left = static_cast<int>(a.top_k);  // of the keys matching the prefix, how many to take
  for (int shift = 32 - radix_bits; shift >= 0; shift -= radix_bits) {
    for (int i = tid; i < radix_bins; i += pick_threads) histogram[i] = 0;
    __syncthreads();
    for (std::int64_t s = tid; s < context; s += pick_threads) {
      const std::uint32_t key = score_key(scores[s]);
      if ((key & mask) == prefix) atomicAdd(&histogram[(key >> shift) & (radix_bins - 1)], 1u);
    }
    __syncthreads();
    if (tid == 0) {
      // The digit whose keys (with those of the larger digits) first reach `left`.
      int above = 0;
      int digit = radix_bins - 1;
      for (; digit > 0; --digit) {
        const int here = static_cast<int>(histogram[digit]);
        if (above + here >= left) break;
        above += here;
      }
      chosen_digit = static_cast<unsigned>(digit);
      chosen_left = left - above;
    }
    __syncthreads();
    prefix |= chosen_digit << shift;
    mask |= static_cast<std::uint32_t>(radix_bins - 1) << shift;
    left = chosen_left;
  }
  // prefix is now the top_k-th largest key; `left` of the keys equal to it are taken.
  std::int32_t* out = a.selected + t * a.top_k;
  int written = 0;
  int equal_before = 0;
  for (std::int64_t start = 0; start < context; start += pick_threads) {
    const std::int64_t s = start + tid;
    const std::uint32_t key = s < context ? score_key(scores[s]) : 0u;
    const bool above = s < context && key > prefix;
    const bool equal = s < context && key == prefix;
    int equal_total = 0;
    const int equal_rank = equal_before + block_rank(equal, counts, equal_total);
    const bool take = above || (equal && equal_rank < left);
    int taken = 0;
    const int index = written + block_rank(take, counts, taken);
    if (take && index < a.top_k) out[index] = static_cast<std::int32_t>(s);
    written += taken;
    equal_before += equal_total;
  }
  if (tid == 0) a.selected_count[t] = static_cast<std::int32_t>(a.top_k);
}

template <dtype KV>
status launch_score(const dsa_args& a, dim3 grid, cudaStream_t stream) {
  const auto bytes = static_cast<int>(score_shared_bytes(a.index_dim));
  EDGE_RETURN_IF_ERROR(allow_shared_memory(reinterpret_cast<const void*>(&dsa_score_kernel<KV>), bytes));
  dsa_score_kernel<KV><<<grid, score_threads, static_cast<std::size_t>(bytes), stream>>>(a);
  return check_launch("dsa_select (scores)");
}

}  // namespace

status run_dsa_select(const dsa_select_params& p, const stream& s) {
  // run_dsa_select (mla_attention_cpu.cpp) has checked the shapes and strides.
  if (p.index_heads > cuda_max_index_heads || p.index_dim > cuda_max_index_dim ||
      p.index_dim % row_element_multiple != 0) {
    return invalid_argument(format("dsa_select: the CUDA kernel takes up to {} index heads and index_dim up to {} "
                                   "in multiples of {}, not {} and {}",
                                   cuda_max_index_heads, cuda_max_index_dim, row_element_multiple, p.index_heads,
                                   p.index_dim));
  }
  if (reinterpret_cast<std::uintptr_t>(p.key_cache) % 16 != 0) {
    return invalid_argument("dsa_select: the CUDA kernel reads a key cache that starts at a 16-byte boundary");
  }
  if (p.tokens <= 0) return {};
  if (p.workspace == nullptr || p.workspace_context <= 0 || p.workspace_floats < p.workspace_context) {
    return invalid_argument(format("dsa_select: the CUDA kernel needs a workspace for the scores of at least one "
                                   "token (dsa_select_workspace_floats), not {} floats for contexts of {}",
                                   p.workspace_floats, p.workspace_context));
  }
  dsa_args a{};
  a.q = p.q;
  a.head_weights = p.head_weights;
  a.key_cache = p.key_cache;
  a.key_scales = p.key_scales;
  a.seq = p.seq;
  a.pos = p.pos;
  a.block_tables = p.block_tables;
  a.table_begin = p.table_begin;
  a.selected = p.selected;
  a.selected_count = p.selected_count;
  a.scores = p.workspace;
  a.max_context = p.workspace_context;
  a.index_heads = p.index_heads;
  a.index_dim = p.index_dim;
  a.top_k = p.top_k;
  a.block_size = p.block_size;
  a.num_blocks = p.num_blocks;
  a.q_stride = p.q_stride;
  a.weights_stride = p.weights_stride;
  a.weight_scale = p.weight_scale;
  const cudaStream_t stream = native(s);
  // Tokens at a time: as many as the workspace holds the scores of.
  constexpr std::int64_t max_grid_y = 65535;
  const std::int64_t chunk = std::min({p.tokens, p.workspace_floats / p.workspace_context, max_grid_y});
  const std::int64_t max_tiles = ceil_div(p.workspace_context, score_positions);
  for (std::int64_t first = 0; first < p.tokens; first += chunk) {
    const std::int64_t count = std::min(chunk, p.tokens - first);
    a.first_token = first;
    // Enough blocks per token to cover the GPU about four times; each walks its token's tiles.
    const std::int64_t per_token = std::clamp<std::int64_t>(ceil_div(4 * multiprocessor_count(), count), 1, max_tiles);
    const dim3 grid(static_cast<unsigned>(per_token), static_cast<unsigned>(count));
    EDGE_RETURN_IF_ERROR(dispatch_dtype(p.kv_type, [&]<dtype KV>() { return launch_score<KV>(a, grid, stream); }));
    dsa_pick_kernel<<<static_cast<unsigned>(count), pick_threads, 0, stream>>>(a);
    EDGE_RETURN_IF_ERROR(check_launch("dsa_select (choice)"));
  }
  return {};
}

}  // namespace edge::kernels::cuda
