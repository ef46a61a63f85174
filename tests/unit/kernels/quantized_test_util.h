// Quantized weight matrices for the kernel tests: quantize and dequantize through the kernels,
// and the double-precision matmul reference.
#pragma once

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "edge/common/thread_pool.h"
#include "kernels/quantize/quantize.h"

namespace edge::testing {

// A quantized matrix that owns its values and scales.
struct quantized {
  kernels::weight_format format;
  std::int64_t n = 0, k = 0, group_size = 0;
  std::vector<std::uint8_t> values;  // int4: [n, int4_row_bytes(k)]; int8, fp8: [n, k]
  std::vector<float> scales;         // int4: [n, k / group_size]; int8: [n, k / 32]; fp8: [n]

  kernels::weight_view view() const {
    return {.format = format, .values = values.data(), .scales = scales.data(), .group_size = group_size};
  }
};

inline quantized quantize(const std::vector<float>& w, std::int64_t n, std::int64_t k, kernels::weight_format format,
                   std::int64_t group_size, thread_pool* pool = nullptr) {
  quantized q{format, n, k, group_size, {}, {}};
  q.values.resize(static_cast<std::size_t>(kernels::weight_values_bytes(format, n, k)));
  q.scales.resize(static_cast<std::size_t>(kernels::weight_scale_count(format, n, k, group_size)));
  const auto quantized_ok = kernels::run_quantize({.x = w.data(), .rows = n, .k = k, .x_stride = k,
                                                         .format = format, .group_size = group_size,
                                                         .values = q.values.data(), .scales = q.scales.data()},
                                                        {.pool = pool});
  REQUIRE_MESSAGE(quantized_ok.ok(), quantized_ok.message());
  return q;
}

inline std::vector<float> dequantize(const kernels::weight_view& w, std::int64_t n, std::int64_t k) {
  std::vector<float> out(static_cast<std::size_t>(n * k));  // [n, k]
  REQUIRE(kernels::run_dequantize({.w = w, .k = k, .row_begin = 0, .rows = n, .y = out.data(), .y_stride = k}, {})
              .ok());
  return out;
}

// y = x · wᵀ (+ bias) in double: x [tokens, k], w [n, k].
inline std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w, const float* bias,
                              std::int64_t tokens, std::int64_t n, std::int64_t k) {
  std::vector<double> y(static_cast<std::size_t>(tokens * n));
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t r = 0; r < n; ++r) {
      double sum = bias ? bias[r] : 0.0;
      for (std::int64_t i = 0; i < k; ++i) {
        sum += double(x[static_cast<std::size_t>(t * k + i)]) * w[static_cast<std::size_t>(r * k + i)];
      }
      y[static_cast<std::size_t>(t * n + r)] = sum;
    }
  }
  return y;
}

}  // namespace edge::testing
