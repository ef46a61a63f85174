// PTX's fragment layout for mma.m16n8k16 with 16-bit inputs (PTX ISA, "Matrix fragments for
// mma.m16n8k16 with floating point type"), for the host tests that emulate a warp of the CUDA
// kernels: lane (g = lane / 4, t = lane % 4) holds
//   A: a0a1 (register 0) row g, columns 2t, 2t+1; a2a3 row g + 8; a4a5 and a6a7 the same rows,
//      columns 2t + 8, 2t + 9;
//   B: b0b1 (register 0) rows 2t, 2t+1 of column g; b2b3 rows 2t + 8, 2t + 9;
//   C: c0, c1 row g, columns 2t, 2t+1; c2, c3 row g + 8.
#pragma once

namespace edge::testing {

struct mma_step {
  float a[16][16] = {};  // [m][k]
  float b[16][8] = {};   // [k][n]

  static int a_row(int lane, int reg) { return lane / 4 + 8 * (reg % 2); }
  static int a_col(int lane, int reg) { return 2 * (lane % 4) + 8 * (reg / 2); }
  static int c_row(int lane, int c) { return lane / 4 + 8 * (c / 2); }
  static int c_col(int lane, int c) { return 2 * (lane % 4) + c % 2; }

  void set_a(int lane, int reg, float lo, float hi) {
    a[a_row(lane, reg)][a_col(lane, reg)] = lo;
    a[a_row(lane, reg)][a_col(lane, reg) + 1] = hi;
  }
  void set_b(int lane, int reg, float lo, float hi) {
    const int k = 2 * (lane % 4) + 8 * reg;
    b[k][lane / 4] = lo;
    b[k + 1][lane / 4] = hi;
  }
  // Accumulator c of `lane` of the product A · B.
  double product(int lane, int c) const {
    double sum = 0.0;
    for (int k = 0; k < 16; ++k) sum += static_cast<double>(a[c_row(lane, c)][k]) * b[k][c_col(lane, c)];
    return sum;
  }
};

}  // namespace edge::testing
