// The names and numbers the checkpoint formats give element types, in one table that every
// reader and writer uses: safetensors' dtype strings, config.json's torch_dtype, ggml's tensor
// type numbers (GGUF) and llama.cpp's general.file_type.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "edge/backend/io/tensor_view.h"
#include "edge/kernels/dtype.h"

namespace edge::backend {

// How a file stores a tensor's elements: an element type, or an encoding of the file's own.
struct stored_type {
  kernels::dtype type = kernels::dtype::f32;  // the element type when encoding is `elements`
  tensor_encoding encoding = tensor_encoding::elements;

  friend bool operator==(const stored_type&, const stored_type&) = default;
};

// The safetensors dtypes edgeinfer reads and writes: F32, F16, BF16, F8_E4M3, and I32 / I64 for
// compressed-tensors' packed INT4 weights and weight shapes.
std::optional<stored_type> parse_safetensors_dtype(std::string_view name);
// The inverse; empty for GGUF's block encodings, which safetensors cannot hold.
std::string_view safetensors_dtype_name(stored_type type);
// Whether `name` is one of the format's other dtypes ("F64", "U8", ...): "unsupported" rather
// than "unknown" in messages.
bool is_other_safetensors_dtype(std::string_view name);

// config.json's torch_dtype: "float32", "float16", "bfloat16", "float8_e4m3fn".
std::string_view torch_dtype_name(kernels::dtype type);

// The ggml tensor types edgeinfer reads (the numbering is the file format's). Q4_0 and Q8_0
// tensors (tensor_encoding::ggml_q4_0 / ggml_q8_0) have rows of whole 32-element blocks, the
// K-quants (ggml_q4_k, ggml_q5_k, ggml_q6_k) rows of whole 256-element super-blocks.
enum class ggml_type : std::uint32_t { f32 = 0, f16 = 1, q4_0 = 2, q8_0 = 8, q4_k = 12, q5_k = 13, q6_k = 14, bf16 = 30 };

// A GGUF tensor info's type number as stored elements; nullopt for a type edgeinfer cannot read.
std::optional<stored_type> parse_ggml_type(std::uint32_t type);
// The inverse; nullopt for what GGUF has no type for (FP8, compressed-tensors' integers).
std::optional<ggml_type> ggml_type_of(stored_type type);
// ggml's name of any type number it defines ("Q4_K" for 12), for messages; empty for others.
std::string_view ggml_type_name(std::uint32_t type);

// llama.cpp's general.file_type for a file whose weights are mostly of `type` (what llama.cpp
// shows as the model's type); nullopt for FP8, which llama.cpp has no file type for.
std::optional<std::uint32_t> gguf_file_type(kernels::dtype type);

// "BF16", "Q4_0", "I32": a type in the files' own words, for messages.
std::string_view stored_type_name(stored_type type);
std::string_view type_name(const tensor_view& tensor);

}  // namespace edge::backend
