// The SwiGLU gate: out = silu(gate) * up, silu(x) = x / (1 + exp(-x)).
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/stream.h"

namespace edge::kernels {

struct silu_mul_params {
  const float* gate;  // [rows, cols], row stride in_stride
  const float* up;    // [rows, cols], row stride in_stride
  float* out;         // [rows, cols], row stride out_stride; may equal gate
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t in_stride = 0;
  std::int64_t out_stride = 0;
};

status run_silu_mul(const silu_mul_params& p, const stream& s);

}  // namespace edge::kernels
