#include <doctest/doctest.h>

#include "edge/backend/io/dtype_names.h"

using namespace edge::backend;
using edge::kernels::dtype;

namespace {

constexpr dtype all_dtypes[] = {dtype::f32, dtype::f16, dtype::bf16, dtype::fp8_e4m3};

}  // namespace

TEST_CASE("safetensors dtype names read back as the types they were written for") {
  const std::pair<std::string_view, stored_type> table[] = {
      {"F32", {.type = dtype::f32}},
      {"F16", {.type = dtype::f16}},
      {"BF16", {.type = dtype::bf16}},
      {"F8_E4M3", {.type = dtype::fp8_e4m3}},
      {"I32", {.encoding = tensor_encoding::int32}},
      {"I64", {.encoding = tensor_encoding::int64}},
  };
  for (const auto& [name, type] : table) {
    CAPTURE(name);
    CHECK(safetensors_dtype_name(type) == name);
    CHECK(parse_safetensors_dtype(name) == type);
    CHECK_FALSE(is_other_safetensors_dtype(name));
  }
  // The element type of an integer encoding is not part of its name.
  CHECK(safetensors_dtype_name({.type = dtype::bf16, .encoding = tensor_encoding::int32}) == "I32");
  CHECK(safetensors_dtype_name({.type = dtype::f16, .encoding = tensor_encoding::ggml_q4_0}).empty());
  CHECK_FALSE(parse_safetensors_dtype("F64"));
  CHECK(is_other_safetensors_dtype("F64"));
  CHECK_FALSE(parse_safetensors_dtype("bf16"));
  CHECK_FALSE(is_other_safetensors_dtype("bf16"));
}

TEST_CASE("torch_dtype names are the ones config.json readers parse back") {
  CHECK(torch_dtype_name(dtype::bf16) == "bfloat16");
  CHECK(torch_dtype_name(dtype::f16) == "float16");
  CHECK(torch_dtype_name(dtype::f32) == "float32");
  for (const auto type : all_dtypes) {
    CAPTURE(edge::kernels::to_string(type));
    CHECK(edge::kernels::parse_dtype(torch_dtype_name(type)) == type);
  }
}

TEST_CASE("ggml type numbers: the file format's, both ways, and names for the ones not read") {
  CHECK(parse_ggml_type(0) == stored_type{.type = dtype::f32});
  CHECK(parse_ggml_type(1) == stored_type{.type = dtype::f16});
  CHECK(parse_ggml_type(30) == stored_type{.type = dtype::bf16});
  CHECK(parse_ggml_type(2) == stored_type{.type = dtype::f16, .encoding = tensor_encoding::ggml_q4_0});
  CHECK(parse_ggml_type(8) == stored_type{.type = dtype::f16, .encoding = tensor_encoding::ggml_q8_0});
  CHECK(parse_ggml_type(12) == stored_type{.type = dtype::f16, .encoding = tensor_encoding::ggml_q4_k});
  CHECK(parse_ggml_type(13) == stored_type{.type = dtype::f16, .encoding = tensor_encoding::ggml_q5_k});
  CHECK(parse_ggml_type(14) == stored_type{.type = dtype::f16, .encoding = tensor_encoding::ggml_q6_k});
  for (std::uint32_t number = 0; number < 64; ++number) {
    CAPTURE(number);
    if (const auto type = parse_ggml_type(number)) {
      CHECK(ggml_type_of(*type) == static_cast<ggml_type>(number));
    }
  }
  CHECK_FALSE(parse_ggml_type(10));  // Q2_K
  CHECK(ggml_type_name(10) == "Q2_K");
  CHECK(ggml_type_name(14) == "Q6_K");
  CHECK(ggml_type_name(4).empty());  // a number ggml retired
  CHECK_FALSE(ggml_type_of({.type = dtype::fp8_e4m3}));
  CHECK_FALSE(ggml_type_of({.encoding = tensor_encoding::int32}));
}

TEST_CASE("general.file_type is llama.cpp's number for the weights' type") {
  CHECK(gguf_file_type(dtype::f32) == 0u);
  CHECK(gguf_file_type(dtype::f16) == 1u);
  CHECK(gguf_file_type(dtype::bf16) == 32u);
  CHECK_FALSE(gguf_file_type(dtype::fp8_e4m3));
}

TEST_CASE("a tensor's type in the files' own words") {
  tensor_view view;
  view.type = dtype::fp8_e4m3;
  CHECK(type_name(view) == "F8_E4M3");
  view.type = dtype::f16;
  view.encoding = tensor_encoding::ggml_q8_0;
  CHECK(type_name(view) == "Q8_0");
  view.encoding = tensor_encoding::ggml_q5_k;
  CHECK(type_name(view) == "Q5_K");
  view.encoding = tensor_encoding::int64;
  CHECK(type_name(view) == "I64");
}
