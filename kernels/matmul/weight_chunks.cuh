// How the CUDA kernels read weight rows, for every weight format: 16-byte chunks widened and
// dequantized in registers (weight_format.h gives the layouts), and the GEMV tile (gemv_rows
// weight rows against up to gemv_max_tokens token rows, f32 multiply-adds) that the matmul's
// GEMV and every head's matmul (matmul.cu) and the grouped expert matmul (moe_experts.cu)
// share. Device code only.
#pragma once

#include "edge/kernels/weight_format.h"
#include "kernels/cuda/common.cuh"

namespace edge::kernels::cuda {

template <weight_format F>
EDGE_HOST_DEVICE constexpr int element_bytes() {
  if constexpr (F == weight_format::f32) return 4;
  if constexpr (F == weight_format::f16 || F == weight_format::bf16) return 2;
  return 1;  // fp8 (int4 rows are counted in bytes by int4_row_bytes)
}

// Elements in one 16-byte chunk of a weight row, and the groups of 4 ("quads") they form.
template <weight_format F>
EDGE_HOST_DEVICE constexpr int chunk_elements() {
  if constexpr (F == weight_format::int4) return static_cast<int>(int4_traits::chunk_elements);
  return 16 / element_bytes<F>();
}
template <weight_format F>
EDGE_HOST_DEVICE constexpr int chunk_quads() {
  return chunk_elements<F>() / 4;
}

constexpr std::int64_t chunk_bytes = 16;

// A 16-byte chunk that is read once: bypass L1 so that the activations stay cached there.
__device__ __forceinline__ uint4 load_streaming(const void* address) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(address));
  return v;
}

// Chunk c of a weight row; bytes at or past `valid_bytes` read as zero bytes (a zero weight in
// the plain and FP8 formats; in INT4 the code of q = -8, so INT4 callers also give such
// elements a zero scale). The vector path needs 16-byte alignment and a whole chunk inside the
// row.
__device__ __forceinline__ uint4 load_chunk(const std::uint8_t* row, std::int64_t c, std::int64_t valid_bytes,
                                            bool vec) {
  const std::int64_t first = c * chunk_bytes;
  if (vec && first + chunk_bytes <= valid_bytes) return load_streaming(row + first);
  std::uint32_t words[4] = {0, 0, 0, 0};
#pragma unroll
  for (int b = 0; b < 16; ++b) {
    if (first + b < valid_bytes) words[b / 4] |= static_cast<std::uint32_t>(row[first + b]) << (8 * (b % 4));
  }
  return make_uint4(words[0], words[1], words[2], words[3]);
}

__device__ __forceinline__ std::uint32_t word_of(const uint4& v, int i) {
  return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

// Index, within its chunk, of the first element of quad q.
template <weight_format F>
__device__ __forceinline__ int quad_first_element(int q) {
  if constexpr (F == weight_format::int4) {
    // Word q % 4 holds elements 4(q%4)..+3 in its low nibbles and 16 + 4(q%4)..+3 in its high ones.
    return (q / 4) * static_cast<int>(int4_traits::half_chunk) + 4 * (q % 4);
  }
  return 4 * q;
}

// The 4 weights of quad q of a chunk, as the kernels multiply them: int4 as q (unscaled), fp8
// as its decoded code (unscaled), the plain formats as their values.
template <weight_format F>
__device__ __forceinline__ void quad_weights(const uint4& raw, int q, float w[4]) {
  if constexpr (F == weight_format::int4) {
    const std::uint32_t nibbles = (word_of(raw, q % 4) >> (4 * (q / 4))) & 0x0F0F0F0Fu;
    // 0x4B0000XX is the float 2^23 + XX; minus 2^23 + 8 leaves XX - 8 = q, exactly.
    constexpr float magic = 8388608.0f + static_cast<float>(int4_traits::code_offset);
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = __uint_as_float(__byte_perm(nibbles, 0x4B000000u, 0x7540u | i)) - magic;
  } else if constexpr (F == weight_format::fp8_e4m3) {
    const std::uint32_t codes = word_of(raw, q);
    const float2 lo = fp8x2_to_float2(static_cast<std::uint16_t>(codes & 0xFFFFu));
    const float2 hi = fp8x2_to_float2(static_cast<std::uint16_t>(codes >> 16));
    w[0] = lo.x;
    w[1] = lo.y;
    w[2] = hi.x;
    w[3] = hi.y;
  } else if constexpr (F == weight_format::bf16) {
    const std::uint32_t a = word_of(raw, 2 * q);
    const std::uint32_t b = word_of(raw, 2 * q + 1);
    w[0] = __uint_as_float(a << 16);
    w[1] = __uint_as_float(a & 0xFFFF0000u);
    w[2] = __uint_as_float(b << 16);
    w[3] = __uint_as_float(b & 0xFFFF0000u);
  } else if constexpr (F == weight_format::f16) {
    w[0] = f16_bits_to_float(static_cast<std::uint16_t>(word_of(raw, 2 * q) & 0xFFFFu));
    w[1] = f16_bits_to_float(static_cast<std::uint16_t>(word_of(raw, 2 * q) >> 16));
    w[2] = f16_bits_to_float(static_cast<std::uint16_t>(word_of(raw, 2 * q + 1) & 0xFFFFu));
    w[3] = f16_bits_to_float(static_cast<std::uint16_t>(word_of(raw, 2 * q + 1) >> 16));
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = __uint_as_float(word_of(raw, i));
  }
}

// x[p..p+3] of one token row; elements at or past `limit` read as zero.
__device__ __forceinline__ float4 load_x4(const float* row, std::int64_t p, std::int64_t limit, bool vec) {
  if (vec && p + 3 < limit) return *reinterpret_cast<const float4*>(row + p);
  return make_float4(p < limit ? row[p] : 0.0f, p + 1 < limit ? row[p + 1] : 0.0f, p + 2 < limit ? row[p + 2] : 0.0f,
                     p + 3 < limit ? row[p + 3] : 0.0f);
}

// ---- the GEMV tile ----------------------------------------------------------------------------
//
// A block of 4 warps takes gemv_rows weight rows; each thread streams 16-byte chunks of those
// rows (gemv_unroll chunks per row in flight), dequantizes them in registers and multiplies
// them with every token's x in f32. INT4 group scales multiply a chunk's partial sum once
// (group_size >= 32) or each weight (FINE_GROUPS: smaller groups); FP8 row scales are left to
// the caller, once per output.

constexpr int gemv_threads = 128;
constexpr int gemv_warps = gemv_threads / warp_size;
constexpr int gemv_rows = 4;    // weight rows per block
constexpr int gemv_unroll = 2;  // chunks per row in flight per thread
constexpr std::int64_t gemv_max_tokens = 8;

// What one GEMV tile reads.
struct gemv_operands {
  const float* x;               // [tokens, k], row stride x_stride
  const std::uint8_t* w;        // [n, row_bytes]: plain/fp8 [n, k] elements, int4 packed rows
  const float* scales;          // fp8: [n]; int4: [n, groups_per_row]; else unused
  std::int64_t tokens;          // at most the tile's T_MAX
  std::int64_t n, k, x_stride;
  std::int64_t row_bytes;       // bytes of one weight row
  std::int64_t group_size;      // int4 only
  std::int64_t groups_per_row;  // int4 only
  bool w_vec;                   // weight rows are 16-byte aligned: whole chunks load as one vector
  bool x_vec;                   // x rows are 16-byte aligned: 4 floats load as one vector
};

// This thread's parts of the dot products of rows row0..row0 + gemv_rows - 1 with the tokens'
// x rows (tokens past o.tokens are zero, rows past n repeat the last row).
template <weight_format F, int T_MAX, bool FINE_GROUPS>
__device__ __forceinline__ void gemv_accumulate(const gemv_operands& o, std::int64_t row0,
                                                float (&acc)[T_MAX][gemv_rows]) {
  constexpr int elements = chunk_elements<F>();
  constexpr int quads = chunk_quads<F>();
  const std::int64_t chunks = ceil_div(o.row_bytes, chunk_bytes);
  const std::int64_t valid_bytes = F == weight_format::int4 ? o.row_bytes : o.k * element_bytes<F>();

  const std::uint8_t* rows[gemv_rows];
#pragma unroll
  for (int r = 0; r < gemv_rows; ++r) {
    // Rows past n repeat the last row (their results are dropped) so loads stay in bounds.
    rows[r] = o.w + min(row0 + r, o.n - 1) * o.row_bytes;
  }

#pragma unroll
  for (int t = 0; t < T_MAX; ++t) {
#pragma unroll
    for (int r = 0; r < gemv_rows; ++r) acc[t][r] = 0.0f;
  }

  for (std::int64_t c0 = threadIdx.x; c0 < chunks; c0 += gemv_threads * gemv_unroll) {
    uint4 raw[gemv_unroll][gemv_rows];
#pragma unroll
    for (int u = 0; u < gemv_unroll; ++u) {
      const std::int64_t c = c0 + u * gemv_threads;
#pragma unroll
      for (int r = 0; r < gemv_rows; ++r) {
        raw[u][r] = c < chunks ? load_chunk(rows[r], c, valid_bytes, o.w_vec) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < gemv_unroll; ++u) {
      const std::int64_t c = c0 + u * gemv_threads;
      if (c >= chunks) break;
      float part[T_MAX][gemv_rows];
#pragma unroll
      for (int t = 0; t < T_MAX; ++t) {
#pragma unroll
        for (int r = 0; r < gemv_rows; ++r) part[t][r] = 0.0f;
      }
#pragma unroll
      for (int q = 0; q < quads; ++q) {
        const std::int64_t p = c * elements + quad_first_element<F>(q);
        float4 xq[T_MAX];
#pragma unroll
        for (int t = 0; t < T_MAX; ++t) {
          xq[t] = t < o.tokens ? load_x4(o.x + t * o.x_stride, p, o.k, o.x_vec) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int r = 0; r < gemv_rows; ++r) {
          float w[4];
          quad_weights<F>(raw[u][r], q, w);
          if constexpr (FINE_GROUPS) {
            const float* row_scales = o.scales + min(row0 + r, o.n - 1) * o.groups_per_row;
#pragma unroll
            for (int i = 0; i < 4; ++i) w[i] *= p + i < o.k ? row_scales[(p + i) / o.group_size] : 0.0f;
          }
#pragma unroll
          for (int t = 0; t < T_MAX; ++t) {
            part[t][r] = fmaf(w[0], xq[t].x, part[t][r]);
            part[t][r] = fmaf(w[1], xq[t].y, part[t][r]);
            part[t][r] = fmaf(w[2], xq[t].z, part[t][r]);
            part[t][r] = fmaf(w[3], xq[t].w, part[t][r]);
          }
        }
      }
#pragma unroll
      for (int r = 0; r < gemv_rows; ++r) {
        float scale = 1.0f;
        if constexpr (F == weight_format::int4 && !FINE_GROUPS) {
          scale = o.scales[min(row0 + r, o.n - 1) * o.groups_per_row + c * elements / o.group_size];
        }
#pragma unroll
        for (int t = 0; t < T_MAX; ++t) acc[t][r] = fmaf(part[t][r], scale, acc[t][r]);
      }
    }
  }
}

// The warps' sums of `acc` into `partial` [gemv_warps][T_CAP][gemv_rows] (T_MAX <= T_CAP), ready
// for gemv_dot once the block has passed the barrier at the end.
template <int T_MAX, int T_CAP>
__device__ __forceinline__ void gemv_reduce(const float (&acc)[T_MAX][gemv_rows],
                                            float (&partial)[gemv_warps][T_CAP][gemv_rows]) {
  static_assert(T_MAX <= T_CAP);
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
#pragma unroll
  for (int t = 0; t < T_MAX; ++t) {
#pragma unroll
    for (int r = 0; r < gemv_rows; ++r) {
      const float v = warp_sum(acc[t][r]);
      if (lane == 0) partial[warp][t][r] = v;
    }
  }
  __syncthreads();
}

// The dot product of token t with tile row r, the warps' parts added in warp order.
template <int T_CAP>
__device__ __forceinline__ float gemv_dot(const float (&partial)[gemv_warps][T_CAP][gemv_rows], int t, int r) {
  float dot = 0.0f;
#pragma unroll
  for (int wi = 0; wi < gemv_warps; ++wi) dot += partial[wi][t][r];
  return dot;
}

// The GEMV tile into y: weight rows row0.. against o's tokens (at most T_MAX, the tile's
// accumulators; partial holds T_CAP), y[t · y_stride + row] = the dot product, times the row's
// scale for FP8. Every thread of the block calls it; the caller's barrier comes before partial
// is reused.
template <weight_format F, int T_MAX, bool FINE_GROUPS, int T_CAP>
__device__ __forceinline__ void gemv_tile_store(const gemv_operands& o, std::int64_t row0,
                                                float (&partial)[gemv_warps][T_CAP][gemv_rows], float* y,
                                                std::int64_t y_stride) {
  float acc[T_MAX][gemv_rows];
  gemv_accumulate<F, T_MAX, FINE_GROUPS>(o, row0, acc);
  gemv_reduce(acc, partial);
  for (int i = static_cast<int>(threadIdx.x); i < T_MAX * gemv_rows; i += gemv_threads) {
    const int t = i / gemv_rows;
    const int r = i % gemv_rows;
    const std::int64_t row = row0 + r;
    if (t >= o.tokens || row >= o.n) continue;
    float dot = gemv_dot(partial, t, r);
    if constexpr (F == weight_format::fp8_e4m3) dot *= o.scales[row];
    y[t * y_stride + row] = dot;
  }
}

// gemv_tile_store over o.tokens tokens: a tile of one for one token (decode's common case),
// else of T_CAP.
template <weight_format F, bool FINE_GROUPS, int T_CAP>
__device__ __forceinline__ void gemv_tiles_store(const gemv_operands& o, std::int64_t row0,
                                                 float (&partial)[gemv_warps][T_CAP][gemv_rows], float* y,
                                                 std::int64_t y_stride) {
  if (o.tokens == 1) {
    gemv_tile_store<F, 1, FINE_GROUPS>(o, row0, partial, y, y_stride);
  } else {
    gemv_tile_store<F, T_CAP, FINE_GROUPS>(o, row0, partial, y, y_stride);
  }
}

}  // namespace edge::kernels::cuda
