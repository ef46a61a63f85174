// The weight matrices the matmul kernels read, beside the file tensors they are bound from
// (edge/backend/io/tensor_view.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "edge/backend/io/tensor_view.h"
#include "edge/common/format.h"
#include "edge/common/status.h"
#include "edge/kernels/weight_format.h"

namespace edge::backend {

// "[4096, 128256]".
std::string shape_to_string(std::span<const std::int64_t> shape);

// invalid_argument naming the tensor (a tensor_view or a weight_matrix), the shape wanted and
// the shape found, when they differ or the tensor is absent.
template <class Tensor>
status check_shape(const Tensor& tensor, const std::vector<std::int64_t>& shape) {
  if (!tensor.present()) return invalid_argument(format("tensor \"{}\" is missing", tensor.name));
  if (tensor.shape == shape) return {};
  return invalid_argument(format("tensor \"{}\" has shape {}, expected {}", tensor.name, shape_to_string(tensor.shape),
                                 shape_to_string(shape)));
}

// A weight matrix [rows, cols] ([out_features, in_features]) in a format the matmul kernels
// read: values and, for INT4 and FP8, scales (layouts in edge/kernels/weight_format.h).
struct weight_matrix {
  std::string name;
  std::vector<std::int64_t> shape;  // [rows, cols]
  kernels::weight_format format = kernels::weight_format::f32;
  const std::byte* data = nullptr;  // the values
  const float* scales = nullptr;    // int4: [rows, cols / group_size]; int8: [rows, cols / 32]; fp8: [rows]; else null
  std::int64_t group_size = 0;      // int4, and int8 (32)
  // rows, or CPU row tiles (kernels::cpu_tiles: INT4 and INT8 of a model loaded for the CPU
  // executor, load_options::cpu_tiles); data and scales are then in that layout.
  kernels::weight_layout layout = kernels::weight_layout::rows;

  bool present() const { return data != nullptr; }
  std::int64_t rows() const { return shape.size() == 2 ? shape[0] : 0; }
  std::int64_t cols() const { return shape.size() == 2 ? shape[1] : 0; }
  std::int64_t elements() const { return rows() * cols(); }
  // Values and scales: what one pass over the matrix reads.
  std::uint64_t bytes() const {
    if (layout == kernels::weight_layout::cpu_tiles) {
      return static_cast<std::uint64_t>(kernels::cpu_tiles::values_bytes(format, rows(), cols()) +
                                        kernels::cpu_tiles::scale_count(format, rows(), cols(), group_size) *
                                            static_cast<std::int64_t>(sizeof(float)));
    }
    return static_cast<std::uint64_t>(kernels::weight_values_bytes(format, rows(), cols()) +
                                      kernels::weight_scale_count(format, rows(), cols(), group_size) *
                                          static_cast<std::int64_t>(sizeof(float)));
  }
  kernels::weight_view view() const {
    return {.format = format, .values = data, .scales = scales, .group_size = group_size, .layout = layout};
  }
};

// Whether matrices can be stacked into one (their rows in order): one format, one group size,
// one width.
inline bool same_layout(std::span<const weight_matrix* const> parts) {
  for (const weight_matrix* p : parts) {
    if (p->format != parts.front()->format || p->group_size != parts.front()->group_size ||
        p->cols() != parts.front()->cols() || p->layout != parts.front()->layout) {
      return false;
    }
  }
  return !parts.empty();
}

}  // namespace edge::backend
