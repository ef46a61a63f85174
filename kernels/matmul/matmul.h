// y = x · wᵀ (+ bias) (+ y): activations in float, weights in any supported dtype, widened
// in registers (no dequantized copy of the weights).
//
// Each output element is one dot product over k whose summation order depends only on k, not
// on how many tokens or rows are computed together. A sequence therefore gets bit-identical
// results alone or in any batch (batch invariance), and decode (one token) and prefill (many)
// share one code path: the kernel tiles several tokens against several weight rows so that a
// weight row fetched from memory serves every token of the tile.
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/dtype.h"
#include "edge/kernels/stream.h"

namespace edge::kernels {

struct matmul_params {
  const float* x;              // [tokens, k], row stride x_stride
  const void* w;               // [n, k] of w_type, rows contiguous
  dtype w_type = dtype::f32;
  const float* bias = nullptr; // [n] or null
  float* y;                    // [tokens, n], row stride y_stride
  std::int64_t tokens = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  std::int64_t x_stride = 0;
  std::int64_t y_stride = 0;
  bool accumulate = false;     // y += x · wᵀ (fuses a residual add)
};

status run_matmul(const matmul_params& p, const stream& s);

}  // namespace edge::kernels
