// The tiling of the CUDA tensor-core GEMM (matmul.cu: 9+ tokens with bf16, fp8 or int4 weights,
// k a multiple of 32, 16-byte aligned rows) and where each weight format's bytes go in
// mma.m16n8k16.row.col.f32.bf16.bf16.f32 (weights as A: 16 rows; tokens as B: 8 columns).
// Host code too: tests/unit/kernels/gemm_tiles_test.cpp emulates a warp's stage for every
// format against PTX's fragment layout; no CUDA header.
//
// A block computes 128 weight rows × 64 tokens with 8 warps (4 along the rows, 2 along the
// tokens), each warp 2 m-tiles × 4 n-tiles; k advances 32 at a time through a 4-stage cp.async
// pipeline that holds each stage's raw weight bytes (swizzled) and its x rows (f32, padded). A
// lane's A registers come from ldmatrix (lane t receives bytes 4t..4t+3 of each 16-byte row
// segment it is handed); its B registers are x pairs rounded to bf16. An mma step's 16 k
// columns may be any 16 k indices as long as A and B agree, so each format takes them in the
// order its bytes arrive:
//   * bf16: natural order, one k16 step from two segments (8 values each);
//   * fp8: one segment (16 codes) per step; lane t's word holds codes 4t..4t+3, paired
//     (4t, 4t+1) for columns 2t, 2t+1 and (4t+2, 4t+3) for 2t+8, 2t+9;
//   * int4: one segment (32 nibbles) for both steps, in the nibble order of w4a16_fragments.h.
#pragma once

#include <cstdint>

#include "edge/kernels/numerics.h"
#include "edge/kernels/weight_format.h"
#include "kernels/matmul/w4a16_fragments.h"

namespace edge::kernels::gemm_tiles {

inline constexpr int warps_m = 4;       // warps along the weight rows
inline constexpr int warps_n = 2;       // warps along the tokens
inline constexpr int warp_m_tiles = 2;  // 16-row mma tiles per warp
inline constexpr int warp_n_tiles = 4;  // 8-token mma tiles per warp
inline constexpr int warps = warps_m * warps_n;
inline constexpr int threads = warps * 32;
inline constexpr int block_rows = warps_m * warp_m_tiles * 16;   // 128
inline constexpr int block_tokens = warps_n * warp_n_tiles * 8;  // 64
inline constexpr int stage_k = 32;
inline constexpr int stages = 4;
inline constexpr int segment_bytes = 16;
// A stage's x rows: 32 floats, padded so that the 8 tokens of an n-tile start in distinct banks
// for the float4 reads of the fp8 and int4 orders.
inline constexpr int x_row_floats = stage_k + 16;

// Bytes of one weight row in a stage, and the 16-byte segments they make.
EDGE_HOST_DEVICE constexpr int stage_row_bytes(weight_format f) {
  return f == weight_format::int4 ? 16 : (f == weight_format::fp8_e4m3 ? 32 : 64);
}
EDGE_HOST_DEVICE constexpr int stage_segments(weight_format f) { return stage_row_bytes(f) / segment_bytes; }

// Segment s of row r sits in slot s ^ ((r / rows_per_128) % segments) of the row, so that the 8
// consecutive rows one ldmatrix matrix reads fall in 8 distinct 16-byte bank groups.
EDGE_HOST_DEVICE constexpr int swizzled_segment(weight_format f, int row, int segment) {
  const int segments = stage_segments(f);
  const int rows_per_128 = 128 / stage_row_bytes(f);
  return segment ^ ((row / rows_per_128) % segments);
}

// ldmatrix.x4 calls per warp and stage.
EDGE_HOST_DEVICE constexpr int ldmatrix_calls(weight_format f) {
  return f == weight_format::int4 ? 1 : (f == weight_format::fp8_e4m3 ? warp_m_tiles : warp_m_tiles * 2);
}

// The row (within the warp's 32) and segment that lane l points at in ldmatrix.x4 call `call`.
// Matrix m = l / 8 covers rows (m % 2) * 8 .. +7 of an m-tile, so register m of every lane
// holds row g (m even) or g + 8 (m odd), of:
//   * int4: m-tile m / 2, the stage's one segment (call 0);
//   * fp8: m-tile `call`, segment m / 2 (the step);
//   * bf16: m-tile call / 2, segment 2 * (call % 2) + m / 2 (step call % 2, its two halves).
struct ldmatrix_source {
  int row;
  int segment;
};
EDGE_HOST_DEVICE constexpr ldmatrix_source ldmatrix_row(weight_format f, int call, int lane) {
  const int m = lane / 8;
  const int in_tile = (m % 2) * 8 + lane % 8;
  if (f == weight_format::int4) return {.row = (m / 2) * 16 + in_tile, .segment = 0};
  if (f == weight_format::fp8_e4m3) return {.row = call * 16 + in_tile, .segment = m / 2};
  return {.row = (call / 2) * 16 + in_tile, .segment = 2 * (call % 2) + m / 2};
}

// Where the A registers of (m-tile, step) come from: register `reg` (0..3: a0a1 row g, a2a3 row
// g + 8, a4a5 row g columns +8, a6a7 row g + 8 columns +8) of ldmatrix call `call`, and (fp8,
// int4) which part of that word: fp8 codes (2 part, 2 part + 1) of the word; int4 nibble pair
// `part` (w4a16::pair_bits).
struct a_source {
  int call;
  int reg;
  int part;
};
EDGE_HOST_DEVICE constexpr a_source a_register(weight_format f, int m_tile, int step, int a) {
  const int row_half = a % 2;     // row g or g + 8
  const int column_half = a / 2;  // columns 2t.. or 2t + 8..
  if (f == weight_format::int4) {
    return {.call = 0, .reg = 2 * m_tile + row_half, .part = w4a16::step_pair(step, column_half)};
  }
  if (f == weight_format::fp8_e4m3) return {.call = m_tile, .reg = 2 * step + row_half, .part = column_half};
  return {.call = 2 * m_tile + step, .reg = a, .part = 0};
}

// The two k indices (within the stage) of lane t's B register `half` (0: rows 2t, 2t + 1 of B;
// 1: rows 2t + 8, 2t + 9) at `step`.
struct x_pair {
  int first;
  int second;
};
EDGE_HOST_DEVICE constexpr x_pair b_pair(weight_format f, int t, int step, int half) {
  if (f == weight_format::int4) {
    const int e = w4a16::pair_first_element(t, w4a16::step_pair(step, half));
    return {.first = e, .second = e + 2};
  }
  if (f == weight_format::fp8_e4m3) {
    const int e = 16 * step + 4 * t + 2 * half;
    return {.first = e, .second = e + 1};
  }
  const int e = 16 * step + 8 * half + 2 * t;
  return {.first = e, .second = e + 1};
}

// b_pair as the kernel reads x from shared memory: int4 and fp8 read one float4 at `first`,
// whose elements (0, 2) and (1, 3) (int4: `interleaved`) or (0, 1) and (2, 3) (fp8) are halves
// 0 and 1; bf16 reads a float2 at `first` (half 0) and one at `second` (half 1).
struct b_loads {
  int first;
  int second;
  bool float4_load;
  bool interleaved;
};
EDGE_HOST_DEVICE constexpr b_loads b_load(weight_format f, int t, int step) {
  if (f == weight_format::int4) {
    return {.first = b_pair(f, t, step, 0).first, .second = 0, .float4_load = true, .interleaved = true};
  }
  if (f == weight_format::fp8_e4m3) {
    return {.first = b_pair(f, t, step, 0).first, .second = 0, .float4_load = true, .interleaved = false};
  }
  return {.first = b_pair(f, t, step, 0).first, .second = b_pair(f, t, step, 1).first, .float4_load = false,
          .interleaved = false};
}

}  // namespace edge::kernels::gemm_tiles
