// A named, typed, shaped view of tensor data that lives elsewhere (a file mapping or a buffer
// owned by the model).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "edge/kernels/dtype.h"

namespace edge::backend {

struct tensor_view {
  std::string name;
  kernels::dtype type = kernels::dtype::f32;
  // Row-major, outermost dimension first: a weight matrix is [out_features, in_features]
  // (GGUF lists dimensions the other way round; its parser reverses them).
  std::vector<std::int64_t> shape;
  const std::byte* data = nullptr;  // null: the tensor is absent (an optional bias)

  bool present() const { return data != nullptr; }
  std::int64_t elements() const {
    std::int64_t n = 1;
    for (auto d : shape) n *= d;
    return n;
  }
  std::size_t bytes() const { return static_cast<std::size_t>(elements()) * kernels::dtype_size(type); }
  std::int64_t rows() const { return shape.empty() ? 0 : shape.front(); }
  std::int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
};

}  // namespace edge::backend
