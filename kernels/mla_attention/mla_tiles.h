// The tiling of the CUDA tensor-core MLA attention (mla_attention.cu: a bf16 or FP8 cache at
// DeepSeek-V3's row, latent 512 + RoPE 64) and where each value goes in
// mma.m16n8k16.row.col.f32.bf16.bf16.f32 (attention_tiles.h has the fragment layout shared with
// the paged attention). Host code too: tests/unit/kernels/mla_tiles_test.cpp emulates a pair of
// warps over one tile; no CUDA header.
//
// A block takes one token and a band of 64 heads (its queries as bf16 rows in shared memory)
// and walks the token's positions in tiles of 32 cache rows (bf16 in shared memory, two buffers
// filled by cp.async). Eight warps: warp (m, half) holds heads 16m..16m+15; it computes S = Q Kᵀ
// for the tile's keys 16 half..16 half + 15 (Q and K both through ldmatrix), the two halves of a
// row tile exchange their maxima and sums through shared memory, each writes its P (bf16) to
// shared memory, and each adds P V over all 32 keys for the latent columns 256 half..256 half +
// 255 (P through ldmatrix, V through ldmatrix.trans).
#pragma once

#include "edge/kernels/numerics.h"
#include "kernels/paged_attention/attention_tiles.h"

namespace edge::kernels::mla_tiles {

inline constexpr int latent = 512;
inline constexpr int rope = 64;
inline constexpr int width = latent + rope;  // a cache row
inline constexpr int rows = 64;              // heads per block: 4 row tiles of 16
inline constexpr int warps = 8;              // (row tile m, half)
inline constexpr int threads = warps * 32;
inline constexpr int keys = 32;              // positions per tile: two halves of 16
inline constexpr int row_elements = attention_tiles::row_elements(width);  // bf16 elements per shared Q or K row
inline constexpr int p_row_elements = keys + attention_tiles::row_pad;     // a shared row of P
inline constexpr int score_steps = width / 16;     // k-steps of S = Q Kᵀ
inline constexpr int half_columns = latent / 2;    // latent columns of O per warp
inline constexpr int o_tiles = half_columns / 8;   // n-tiles of O per warp

// Warp w's row tile (heads 16 m..16 m + 15 of the band) and half.
struct warp_role {
  int m;
  int half;
};
EDGE_HOST_DEVICE constexpr warp_role role_of(int warp) { return {.m = warp % 4, .half = warp / 4}; }

// ldmatrix.x4 for an A fragment (16 rows × 16 columns of a row-major array): the row and column,
// from the fragment's top-left, lane `lane` points at. Matrices 0..3 are (rows 0-7, columns 0-7),
// (rows 8-15, 0-7), (rows 0-7, 8-15), (rows 8-15, 8-15): attention_tiles::q_register's order of
// A registers.
struct a_source {
  int row;
  int col;
};
EDGE_HOST_DEVICE constexpr a_source a_row(int lane) { return {.row = lane % 16, .col = 8 * (lane / 16)}; }

// The key within the tile of S accumulator `c` of lane (g, t) in the warp's key n-tile j (0, 1).
EDGE_HOST_DEVICE constexpr int score_key(int half, int g, int t, int j, int c) {
  return 16 * half + attention_tiles::s_accumulator(g, t, j, c).key;
}

}  // namespace edge::kernels::mla_tiles
