// Weight quantization to the INT4, INT8 and FP8 weight formats, and dequantization of any weight
// format back to float (layouts and rounding rules: edge/kernels/weight_format.h).
//
// Both are exact functions of their inputs: quantizing the same rows gives the same bytes
// whatever the thread count, and dequantize(w) is exactly the float each matmul kernel
// multiplies for that weight (float(q) × scale, decode(code) × scale; for the K-quants, read
// on the CPU only, the block's value as ggml's dequantize_row_* computes it).
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/stream.h"
#include "edge/kernels/weight_format.h"

namespace edge::kernels {

struct quantize_params {
  const float* x;                  // [rows, k], row stride x_stride
  std::int64_t rows = 0;
  std::int64_t k = 0;
  std::int64_t x_stride = 0;
  weight_format format = weight_format::int4;  // int4, int8 or fp8_e4m3
  std::int64_t group_size = 0;     // int4: a power of two dividing k (int8: always 32)
  void* values;                    // int4: [rows, int4_row_bytes(k)] bytes; int8, fp8: [rows, k] codes
  float* scales;                   // int4: [rows, k / group_size]; int8: [rows, k / 32]; fp8: [rows]
};

// Parallel over rows on the stream's pool. invalid_argument for a plain format or a bad group.
status run_quantize(const quantize_params& p, const stream& s);

struct dequantize_params {
  weight_view w;                   // the whole matrix [n, k]
  std::int64_t k = 0;
  std::int64_t row_begin = 0;      // rows [row_begin, row_begin + rows) of w
  std::int64_t rows = 0;
  float* y;                        // [rows, k], row stride y_stride
  std::int64_t y_stride = 0;
};

status run_dequantize(const dequantize_params& p, const stream& s);

}  // namespace edge::kernels
