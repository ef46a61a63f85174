// A named, typed, shaped view of tensor data that lives elsewhere (a file mapping or a buffer
// owned by the model), as the checkpoint readers return it. Names of the types in the files'
// own words are in edge/backend/io/dtype_names.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "edge/kernels/dtype.h"
#include "edge/kernels/weight_format.h"

namespace edge::backend {

// How a file tensor's bytes encode its elements. Only `elements` tensors are read by kernels;
// the others are quantized weights in a file's own layout (and their metadata), which loading
// converts (backend/src/model/weight_conversion.h).
enum class tensor_encoding : std::uint8_t {
  elements,   // `type` elements, row-major
  int32,      // little-endian int32 (compressed-tensors' packed INT4 weights, weight shapes)
  int64,      // little-endian int64 (weight shapes)
  ggml_q4_0,  // GGUF Q4_0: per 32 elements of a row, an f16 scale d and 16 bytes of nibbles n,
              // element j = (low nibble of byte j, or for j >= 16 high nibble of byte j - 16) - 8, times d
  ggml_q8_0,  // GGUF Q8_0: per 32 elements of a row, an f16 scale d and 32 int8 q, element = q × d
  // GGUF's K-quants: super-blocks of 256 elements of a row, laid out as the weight formats of
  // the same names (edge/kernels/weight_format.h), which use them in place.
  ggml_q4_k,
  ggml_q5_k,
  ggml_q6_k,
};

// GGUF's block formats: the block length along a row and the bytes of one block.
struct ggml_block_traits {
  static constexpr std::int64_t elements = 32;
  static constexpr std::int64_t scale_bytes = 2;  // an IEEE f16
  static constexpr std::int64_t q4_0_bytes = scale_bytes + elements / 2;
  static constexpr std::int64_t q8_0_bytes = scale_bytes + elements;
};

// The weight format of a K-quant encoding; nullopt for the others.
constexpr std::optional<kernels::weight_format> k_quant_format(tensor_encoding encoding) {
  switch (encoding) {
    case tensor_encoding::ggml_q4_k: return kernels::weight_format::q4_k;
    case tensor_encoding::ggml_q5_k: return kernels::weight_format::q5_k;
    case tensor_encoding::ggml_q6_k: return kernels::weight_format::q6_k;
    case tensor_encoding::elements:
    case tensor_encoding::int32:
    case tensor_encoding::int64:
    case tensor_encoding::ggml_q4_0:
    case tensor_encoding::ggml_q8_0: return std::nullopt;
  }
  return std::nullopt;
}

// Elements of one block along a row (1 for the encodings without blocks).
constexpr std::int64_t block_elements(tensor_encoding encoding) {
  if (k_quant_format(encoding)) return kernels::kquant_traits::block_elements;
  if (encoding == tensor_encoding::ggml_q4_0 || encoding == tensor_encoding::ggml_q8_0) return ggml_block_traits::elements;
  return 1;
}

// Bytes of `elements` values in an encoding (`type` matters for `elements` only). Block
// encodings assume whole blocks, which the parsers check.
constexpr std::uint64_t encoded_bytes(tensor_encoding encoding, kernels::dtype type, std::uint64_t elements) {
  switch (encoding) {
    case tensor_encoding::elements: return elements * kernels::dtype_size(type);
    case tensor_encoding::int32: return elements * 4;
    case tensor_encoding::int64: return elements * 8;
    case tensor_encoding::ggml_q4_0:
      return elements / ggml_block_traits::elements * ggml_block_traits::q4_0_bytes;
    case tensor_encoding::ggml_q8_0:
      return elements / ggml_block_traits::elements * ggml_block_traits::q8_0_bytes;
    case tensor_encoding::ggml_q4_k:
    case tensor_encoding::ggml_q5_k:
    case tensor_encoding::ggml_q6_k:
      return elements / kernels::kquant_traits::block_elements *
             static_cast<std::uint64_t>(kernels::kquant_block_bytes(*k_quant_format(encoding)));
  }
  return 0;
}

struct tensor_view {
  std::string name;
  kernels::dtype type = kernels::dtype::f32;  // the element type when encoding is `elements`
  tensor_encoding encoding = tensor_encoding::elements;
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
  std::size_t bytes() const { return static_cast<std::size_t>(encoded_bytes(encoding, type, static_cast<std::uint64_t>(elements()))); }
  std::int64_t rows() const { return shape.empty() ? 0 : shape.front(); }
  std::int64_t cols() const { return shape.empty() ? 0 : shape.back(); }
};

}  // namespace edge::backend
