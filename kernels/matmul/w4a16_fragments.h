// How the CUDA W4A16 decode kernel (matmul.cu, 1..8 tokens with INT4 groups of 32 or more) feeds
// INT4 weights in their stored layout (weight_format.h) to the tensor cores, as
// mma.m16n8k16.row.col.f32.bf16.bf16.f32: 16 weight rows (M) × 8 tokens (N) × 16 k per step.
// Host code too, so that the arithmetic of fragments is tested where no GPU is
// (tests/unit/kernels/w4a16_fragments_test.cpp emulates a warp and the mma's documented
// fragment layout); no CUDA header.
//
// The mma wants each lane (group g = lane / 4, t = lane % 4) to hold, for rows g and g + 8,
// the A elements of columns 2t, 2t + 1 (registers 0, 1) and 2t + 8, 2t + 9 (registers 2, 3),
// and B elements of rows 2t, 2t + 1 and 2t + 8, 2t + 9 for token g. The 16 columns of a step
// may be any 16 k indices, as long as A and B agree, so the kernel takes them in the order the
// stored nibbles give: ldmatrix hands lane t word t (bytes 4t..4t+3) of a 16-byte chunk, which
// holds elements 4t..4t+3 in its low nibbles and 16+4t..16+4t+3 in its high ones. One mask and
// one OR turn two nibbles four bits apart in bytes 0 and 2 into a bf16 pair 128 + nibble ("pair
// p" of the word: bits 4p..4p+3 of bytes 0 and 2, elements e and e + 2); subtracting 136
// (128 + the code offset) leaves q exactly. A chunk (32 k, one scale group or part of one) is
// two mma steps: step s takes pairs s and s + 2, i.e. elements 4t..4t+3 (s = 0) or
// 16+4t..16+4t+3 (s = 1), and the lane's x for token g is one float4 at that element.
#pragma once

#include <cstdint>

#include "edge/kernels/numerics.h"

namespace edge::kernels::w4a16 {

inline constexpr int tile_rows = 16;     // weight rows per block: the mma's M
inline constexpr int tile_tokens = 8;    // tokens per call at most: the mma's N
inline constexpr int chunk_k = 32;       // weights in a 16-byte chunk of a row
inline constexpr int chunk_bytes = 16;
inline constexpr int warps = 4;
inline constexpr int stage_chunks = 16;  // chunks of each row per pipeline stage (512 k)
inline constexpr int stages = 4;         // pipeline depth: stages in flight per block
inline constexpr int chunks_per_warp = stage_chunks / warps;
inline constexpr int threads = warps * 32;
// f32 scales per row of a stage, one per chunk, padded so that rows g = 0..7 fall in distinct banks.
inline constexpr int scale_stride = stage_chunks + 1;
static_assert(chunks_per_warp % 2 == 0, "a warp's chunks go in pairs through ldmatrix.x4");
static_assert(tile_rows * stage_chunks % threads == 0, "every thread copies the same number of chunks");

// The first of the two elements (the second is 2 further) of pair p of lane t's word, within
// the chunk.
EDGE_HOST_DEVICE constexpr int pair_first_element(int t, int p) { return 4 * t + (p >> 1) + 16 * (p & 1); }

// Pair p of a word as bf16x2 bits: 128 + nibble in each half (low half: the element with the
// lower column).
EDGE_HOST_DEVICE constexpr std::uint32_t pair_bits(std::uint32_t word, int p) {
  return ((word >> (4 * p)) & 0x000F000Fu) | 0x43004300u;
}
// bf16x2 (136, 136): what pair_bits adds to q in each half.
inline constexpr std::uint32_t pair_offset_bits = 0x43084308u;

// The pair in A registers of `half` 0 (columns 2t, 2t+1) or 1 (columns 2t+8, 2t+9) at step s.
EDGE_HOST_DEVICE constexpr int step_pair(int step, int half) { return step + 2 * half; }

// The element of a chunk at which lane t's float4 of x starts for step s.
EDGE_HOST_DEVICE constexpr int step_x_element(int t, int step) { return pair_first_element(t, step_pair(step, 0)); }

// Shared memory holds a stage as [tile_rows][stage_chunks] chunks of 16 bytes; chunk c of row r
// sits in slot c ^ (r % 8), so that the 8 rows one ldmatrix matrix reads fall in 8 distinct
// 16-byte bank groups.
EDGE_HOST_DEVICE constexpr int swizzled_chunk(int row, int chunk) { return chunk ^ (row & 7); }

// For ldmatrix.x4 number j (0, 1) of warp w in a stage: the row and chunk whose 16 bytes lane l
// points at. Matrix m = l / 8 is rows (m % 2) * 8 .. +7 of chunk 4w... + 2j + m / 2, so that
// registers 0..3 hold lane t's word of (row g, chunk a), (row g + 8, chunk a), (row g,
// chunk a + 1), (row g + 8, chunk a + 1) with a = w * chunks_per_warp + 2j.
struct ldmatrix_source {
  int row;
  int chunk;
};
EDGE_HOST_DEVICE constexpr ldmatrix_source ldmatrix_row(int warp, int j, int lane) {
  const int m = lane / 8;
  return {.row = (m % 2) * 8 + lane % 8, .chunk = warp * chunks_per_warp + 2 * j + m / 2};
}

}  // namespace edge::kernels::w4a16
