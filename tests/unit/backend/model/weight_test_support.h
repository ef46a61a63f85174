// Test helpers for weight matrices (model.h's weight_matrix), which may be quantized.
#pragma once

#include <cstring>
#include <limits>
#include <vector>

#include "edge/backend/model/tensor.h"
#include "kernels/quantize/quantize.h"
#include "model_test_support.h"

namespace edge::testing {

// Element i (row-major) of a weight matrix as the float the matmul kernels multiply.
inline float element(const backend::weight_matrix& w, std::int64_t i) {
  if (!kernels::is_quantized(w.format)) {
    backend::tensor_view plain{.name = w.name, .type = *kernels::element_dtype(w.format), .shape = w.shape,
                               .data = w.data};
    return element(plain, i);
  }
  std::vector<float> row(static_cast<std::size_t>(w.cols()));
  const auto done = kernels::run_dequantize({.w = w.view(), .k = w.cols(), .row_begin = i / w.cols(), .rows = 1,
                                             .y = row.data(), .y_stride = w.cols()},
                                            kernels::stream{});
  if (!done.ok()) return std::numeric_limits<float>::quiet_NaN();
  return row[static_cast<std::size_t>(i % w.cols())];
}

inline bool same_bytes(const backend::weight_matrix& a, const backend::weight_matrix& b) {
  return a.format == b.format && a.shape == b.shape && a.group_size == b.group_size && a.present() &&
         b.present() && std::memcmp(a.data, b.data, kernels::weight_values_bytes(a.format, a.rows(), a.cols())) == 0 &&
         (a.scales == nullptr) == (b.scales == nullptr) &&
         (a.scales == nullptr ||
          std::memcmp(a.scales, b.scales,
                      kernels::weight_scale_count(a.format, a.rows(), a.cols(), a.group_size) * sizeof(float)) == 0);
}

}  // namespace edge::testing
