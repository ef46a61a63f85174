// The tiling of the CUDA tensor-core prefill attention (paged_attention.cu: runs of query tokens
// over a bf16 or FP8 cache, head_dim 64 or 128) and where each value goes in
// mma.m16n8k16.row.col.f32.bf16.bf16.f32. Host code too: tests/unit/kernels/attention_tiles_test.cpp
// emulates a warp's tile (ldmatrix, ldmatrix.trans and the mma's fragment layout); no CUDA header.
//
// A block takes 64 query rows (row r: token r / group of the tile, head r % group of the KV
// head) with 4 warps of 16 rows, and walks the keys in tiles of 64 through two shared-memory
// buffers filled by cp.async (bf16 rows as they are; FP8 rows as codes, widened to bf16 in
// shared memory before use). Per tile a warp computes S = Q Kᵀ (Q as A from registers, K as B
// through ldmatrix), scales and masks it in f32, updates the online softmax per row, and adds
// P V (P as A straight from S's accumulators, V as B through ldmatrix.trans). FP8's K scale
// multiplies its key's scores and the V scale its key's probabilities, so the scales cost one
// multiply per key and row.
#pragma once

#include <cstdint>

#include "edge/kernels/numerics.h"

namespace edge::kernels::attention_tiles {

inline constexpr int warps = 4;
inline constexpr int threads = warps * 32;
inline constexpr int rows = warps * 16;  // query rows per block
inline constexpr int key_tile = 64;      // keys per tile
inline constexpr int key_n_tiles = key_tile / 8;
inline constexpr int buffers = 2;
// Padding of a shared K or V row (bf16 elements), so that 8 rows an ldmatrix reads start 16
// bytes apart modulo 128.
inline constexpr int row_pad = 8;

EDGE_HOST_DEVICE constexpr int row_elements(int head_dim) { return head_dim + row_pad; }

// The element of Q (row, d) that A register `a` (0..3) of lane (g, t) holds at d-step s, first
// of its pair (the second is d + 1): rows g and g + 8, columns 2t and 2t + 8 of the step.
struct q_element {
  int row;
  int d;
};
EDGE_HOST_DEVICE constexpr q_element q_register(int g, int t, int step, int a) {
  return {.row = g + 8 * (a % 2), .d = 16 * step + 2 * t + 8 * (a / 2)};
}

// ldmatrix.x4 for S = Q Kᵀ at d-step s over key n-tiles 2p and 2p + 1: the K row (key within
// the tile) and d lane l points at. Registers 0, 1 are B for n-tile 2p (d 16s..+7, 16s+8..),
// registers 2, 3 for n-tile 2p + 1.
struct k_source {
  int key;
  int d;
};
EDGE_HOST_DEVICE constexpr k_source k_row(int pair, int step, int lane) {
  const int m = lane / 8;
  return {.key = 16 * pair + 8 * (m / 2) + lane % 8, .d = 16 * step + 8 * (m % 2)};
}

// The key (within the tile) and row of S accumulator `c` (0..3) of lane (g, t) in key n-tile j.
struct s_element {
  int row;
  int key;
};
EDGE_HOST_DEVICE constexpr s_element s_accumulator(int g, int t, int j, int c) {
  return {.row = g + 8 * (c / 2), .key = 8 * j + 2 * t + c % 2};
}

// P as A for key k-step i (keys 16i..16i+15): register `a` is the pair of S accumulators
// (c, c + 1) = (2 (a % 2), 2 (a % 2) + 1) of key n-tile 2i + a / 2.
struct p_source {
  int n_tile;
  int first_accumulator;
};
EDGE_HOST_DEVICE constexpr p_source p_register(int key_step, int a) {
  return {.n_tile = 2 * key_step + a / 2, .first_accumulator = 2 * (a % 2)};
}

// ldmatrix.x4.trans for O += P V at key k-step i over d n-tiles 2p and 2p + 1: the V row (key)
// and d lane l points at. Registers 0, 1 are B for d n-tile 2p (keys 16i..+7, 16i+8..),
// registers 2, 3 for 2p + 1.
struct v_source {
  int key;
  int d;
};
EDGE_HOST_DEVICE constexpr v_source v_row(int key_step, int pair, int lane) {
  const int m = lane / 8;
  return {.key = 16 * key_step + 8 * (m % 2) + lane % 8, .d = 16 * pair + 8 * (m / 2)};
}

// The row and d of O accumulator `c` of lane (g, t) in d n-tile n.
struct o_element {
  int row;
  int d;
};
EDGE_HOST_DEVICE constexpr o_element o_accumulator(int g, int t, int n, int c) {
  return {.row = g + 8 * (c / 2), .d = 8 * n + 2 * t + c % 2};
}

// ---- the flat list of (run, tile) blocks -----------------------------------------------------
//
// With runs of different lengths (a prefill chunk beside decode tokens, as continuous batching
// makes almost every step), a grid of (longest run / tile) × runs gives each short run empty
// blocks. Both attention kernels can instead take a flat list: offsets[r] is the first block of
// run r (its tiles one after another), offsets[runs] the total, written on the device from the
// runs' token counts before the attention kernel runs.

// Blocks a grid needs for any runs of these totals: the sum of ceil(len / tile) is below
// tokens / tile + runs.
EDGE_HOST_DEVICE constexpr std::int64_t flat_tile_bound(std::int64_t tokens, std::int64_t runs, std::int64_t tile) {
  return (tokens + tile - 1) / tile + runs;
}

// The run of flat block b (the last r with offsets[r] <= b), or -1 when b is past the total.
// Runs without tiles have equal offsets; the search lands on the last of them that starts at or
// before b, which is the one whose tiles hold b.
EDGE_HOST_DEVICE inline std::int64_t run_of_block(const std::int32_t* offsets, std::int64_t runs, std::int64_t b) {
  if (b >= offsets[runs]) return -1;
  std::int64_t lo = 0;
  std::int64_t hi = runs;  // offsets[lo] <= b < offsets[hi]
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    if (offsets[mid] <= b) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return lo;
}

}  // namespace edge::kernels::attention_tiles
