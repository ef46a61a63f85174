// How the CUDA decode attention (paged_attention.cu, attention_kernel) widens a tile's K and V
// rows into f32 rows in shared memory without bank conflicts. Host code too:
// tests/unit/kernels/widen_rows_test.cpp models the banks of every store.
//
// Each thread widens one 16-byte chunk (`vec` elements: 4 f32, 8 bf16 / f16, 16 FP8) of a row,
// and consecutive threads take consecutive chunks of a row, so that their loads (global, or the
// cp.async'd raw rows in shared memory) are consecutive. Stored one element after another, the
// chunks' first elements lie `vec` floats apart: the lanes of a warp met in 32 / vec banks, an
// 8-way conflict for bf16 and up to 16-way for FP8 (V rows, whose stride is head_dim) every
// store. Instead, lane L's e-th store writes element (e + r) % vec of its chunk, with a rotation
// r per lane: L · vec / 32 for V rows, which spreads the lanes of each bank class over its vec
// banks; that minus the row for K rows, whose stride head_dim + 1 (odd, for the conflict-free
// reads of the dot products) shifts each row by a bank. Every store of a warp then hits 32
// banks. The chunk's register is rotated once (rotate_right, a few funnel shifts), so each
// store still reads a register known at compile time.
#pragma once

#include <cstdint>

#include "edge/kernels/numerics.h"

namespace edge::kernels::widen_rows {

// Rotation of lane `lane`'s chunk (elements) when widening a V row / a K row `row` of the tile.
EDGE_HOST_DEVICE constexpr int v_rotation(int lane, int vec) { return lane * vec / 32; }
EDGE_HOST_DEVICE constexpr int k_rotation(int lane, std::int64_t row, int vec) {
  return static_cast<int>(((lane * vec / 32 - row) % vec + vec) % vec);
}

// The shared-memory float a lane's e-th store of chunk `piece` of tile row `row` writes: rows
// `stride` floats apart, its chunk's elements in rotated order.
EDGE_HOST_DEVICE constexpr std::int64_t store_index(std::int64_t row, std::int64_t stride, std::int64_t piece, int vec,
                                                    int rotation, int e) {
  return row * stride + piece * vec + (e + rotation) % vec;
}

// 16 bytes as four little-endian words.
struct chunk {
  std::uint32_t w[4];
};

// `c` rotated right by `bits` (0..127): with elements of b bits, element e of the result is
// element (e + bits / b) % (128 / b) of `c`. Whole words by selects, then the bits within by a
// funnel shift per word: no register is indexed by a run-time value (that would put the chunk in
// local memory).
EDGE_HOST_DEVICE constexpr chunk rotate_right(chunk c, int bits) {
  std::uint32_t w0 = c.w[0], w1 = c.w[1], w2 = c.w[2], w3 = c.w[3];
  if ((bits & 32) != 0) {
    const std::uint32_t t = w0;
    w0 = w1;
    w1 = w2;
    w2 = w3;
    w3 = t;
  }
  if ((bits & 64) != 0) {
    std::uint32_t t = w0;
    w0 = w2;
    w2 = t;
    t = w1;
    w1 = w3;
    w3 = t;
  }
  const int shift = bits & 31;
  if (shift == 0) return {{w0, w1, w2, w3}};
  return {{(w0 >> shift) | (w1 << (32 - shift)), (w1 >> shift) | (w2 << (32 - shift)),
           (w2 >> shift) | (w3 << (32 - shift)), (w3 >> shift) | (w0 << (32 - shift))}};
}

}  // namespace edge::kernels::widen_rows
