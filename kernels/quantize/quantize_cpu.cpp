#include "kernels/quantize/quantize.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/load.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cuda/launchers.h"

namespace edge::kernels {
namespace {

// Rows per parallel chunk: enough work per chunk to amortise the hand-off.
constexpr std::int64_t rows_per_chunk = 16;

float max_magnitude(const float* x, std::int64_t count) {
  float amax = 0.0f;
  for (std::int64_t i = 0; i < count; ++i) amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

void quantize_int4_row(const float* x, std::int64_t k, std::int64_t group_size, std::uint8_t* values,
                       float* scales) {
  for (std::int64_t g = 0; g < k / group_size; ++g) scales[g] = int4_scale(max_magnitude(x + g * group_size, group_size));
  const auto q_of = [&](std::int64_t i) { return i < k ? int4_quantize(x[i], scales[i / group_size]) : 0; };
  for (std::int64_t chunk = 0; chunk * int4_traits::chunk_elements < k; ++chunk) {
    const std::int64_t first = chunk * int4_traits::chunk_elements;
    for (std::int64_t j = 0; j < int4_traits::half_chunk; ++j) {
      const int low = q_of(first + j) + int4_traits::code_offset;
      const int high = q_of(first + int4_traits::half_chunk + j) + int4_traits::code_offset;
      values[chunk * int4_traits::chunk_bytes + j] = static_cast<std::uint8_t>(low | (high << int4_traits::nibble_bits));
    }
  }
}

void quantize_int8_row(const float* x, std::int64_t k, std::int8_t* values, float* scales) {
  constexpr std::int64_t g = int8_traits::group_size;
  for (std::int64_t b = 0; b < k / g; ++b) {
    scales[b] = int8_scale(max_magnitude(x + b * g, g));
    for (std::int64_t i = b * g; i < (b + 1) * g; ++i) values[i] = static_cast<std::int8_t>(int8_quantize(x[i], scales[b]));
  }
}

void quantize_fp8_row(const float* x, std::int64_t k, std::uint8_t* values, float* scale) {
  *scale = fp8_weight_scale(max_magnitude(x, k));
  for (std::int64_t i = 0; i < k; ++i) values[i] = fp8_weight_code(x[i], *scale);
}

void dequantize_row(const weight_view& w, std::int64_t k, std::int64_t row, float* y) {
  if (w.layout == weight_layout::cpu_tiles && cpu_tiles::integer(w.format)) {
    for (std::int64_t i = 0; i < k; ++i) {
      y[i] = static_cast<float>(integer_code_at(w, k, row, i)) * integer_scale_at(w, k, row, i);
    }
    return;
  }
  if (w.layout == weight_layout::cpu_tiles) {
    const auto* values = static_cast<const std::byte*>(w.values);
    for (std::int64_t i = 0; i < k; ++i) {
      const std::byte* at = values + cpu_tiles::of(w.format, w.group_size, k, row, i).byte;
      if (w.format == weight_format::fp8_e4m3) {
        y[i] = fp8_e4m3_to_float(std::to_integer<std::uint8_t>(*at)) * w.scales[row];
      } else {
        cpu::convert_to_float(*element_dtype(w.format), at, 1, y + i);
      }
    }
    return;
  }
  switch (w.format) {
    case weight_format::int4: {
      const auto* values = static_cast<const std::uint8_t*>(w.values) + row * int4_row_bytes(k);
      const float* scales = w.scales + row * (k / w.group_size);
      for (std::int64_t i = 0; i < k; ++i) y[i] = static_cast<float>(int4_get(values, i)) * scales[i / w.group_size];
      return;
    }
    case weight_format::int8: {
      const auto* values = static_cast<const std::int8_t*>(w.values) + row * k;
      const float* scales = w.scales + row * (k / int8_traits::group_size);
      for (std::int64_t i = 0; i < k; ++i) y[i] = static_cast<float>(values[i]) * scales[i / int8_traits::group_size];
      return;
    }
    case weight_format::fp8_e4m3: {
      const auto* values = static_cast<const std::uint8_t*>(w.values) + row * k;
      for (std::int64_t i = 0; i < k; ++i) y[i] = fp8_e4m3_to_float(values[i]) * w.scales[row];
      return;
    }
    case weight_format::q4_k:
    case weight_format::q5_k:
    case weight_format::q6_k: {
      const auto* blocks = static_cast<const std::uint8_t*>(w.values) + weight_values_bytes(w.format, row, k);
      const std::int64_t block_bytes = kquant_block_bytes(w.format);
      for (std::int64_t b = 0; b < k / kquant_traits::block_elements; ++b) {
        kquant_dequantize_block(w.format, blocks + b * block_bytes, y + b * kquant_traits::block_elements);
      }
      return;
    }
    case weight_format::f32:
    case weight_format::f16:
    case weight_format::bf16: {
      const dtype type = *element_dtype(w.format);
      cpu::convert_to_float(type, static_cast<const std::byte*>(w.values) + row * k * static_cast<std::int64_t>(dtype_size(type)),
                            k, y);
      return;
    }
  }
}

}  // namespace

status run_quantize(const quantize_params& p, const stream& s) {
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_quantize(p, s);
  if (p.rows < 0 || p.k <= 0 || p.x_stride < p.k) return invalid_argument("quantize: bad shape or stride");
  if (p.format == weight_format::int4 && !valid_int4_group_size(p.group_size, p.k)) {
    return invalid_argument("quantize: the INT4 group size must be a power of two dividing k");
  }
  if (p.format == weight_format::int8 && p.k % int8_traits::group_size != 0) {
    return invalid_argument("quantize: INT8 rows need k a multiple of 32");
  }
  if (!has_scales(p.format)) return invalid_argument("quantize: the target must be int4, int8 or fp8");
  cpu::parallel_for(s, p.rows, rows_per_chunk, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      const float* x = p.x + r * p.x_stride;
      if (p.format == weight_format::int4) {
        quantize_int4_row(x, p.k, p.group_size, static_cast<std::uint8_t*>(p.values) + r * int4_row_bytes(p.k),
                          p.scales + r * (p.k / p.group_size));
      } else if (p.format == weight_format::int8) {
        quantize_int8_row(x, p.k, static_cast<std::int8_t*>(p.values) + r * p.k,
                          p.scales + r * (p.k / int8_traits::group_size));
      } else {
        quantize_fp8_row(x, p.k, static_cast<std::uint8_t*>(p.values) + r * p.k, p.scales + r);
      }
    }
  });
  return {};
}

status run_dequantize(const dequantize_params& p, const stream& s) {
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_dequantize(p, s);
  if (p.rows < 0 || p.k <= 0 || p.row_begin < 0 || p.y_stride < p.k) {
    return invalid_argument("dequantize: bad shape or stride");
  }
  if (has_scales(p.w.format) && p.w.scales == nullptr) return invalid_argument("dequantize: scales missing");
  if (p.w.format == weight_format::int4 && !valid_int4_group_size(p.w.group_size, p.k)) {
    return invalid_argument("dequantize: the INT4 group size must be a power of two dividing k");
  }
  if (p.w.layout == weight_layout::cpu_tiles && !cpu_tiles::takes(p.w.format, p.w.group_size)) {
    return invalid_argument("dequantize: CPU row tiles hold INT4 with groups of 32 or more and INT8");
  }
  if (p.w.format == weight_format::int8 && p.k % int8_traits::group_size != 0) {
    return invalid_argument("dequantize: INT8 rows need k a multiple of 32");
  }
  if (is_k_quant(p.w.format) && p.k % kquant_traits::block_elements != 0) {
    return invalid_argument("dequantize: K-quant rows must be whole super-blocks of 256");
  }
  cpu::parallel_for(s, p.rows, rows_per_chunk, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) dequantize_row(p.w, p.k, p.row_begin + r, p.y + r * p.y_stride);
  });
  return {};
}

}  // namespace edge::kernels
