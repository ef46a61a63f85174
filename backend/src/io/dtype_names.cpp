#include "edge/backend/io/dtype_names.h"

namespace edge::backend {
namespace {

constexpr stored_type elements_of(kernels::dtype type) { return {.type = type}; }

// safetensors' name of every stored type it can hold.
struct safetensors_entry {
  std::string_view name;
  stored_type type;
};
constexpr safetensors_entry safetensors_dtypes[] = {
    {"F32", elements_of(kernels::dtype::f32)},
    {"F16", elements_of(kernels::dtype::f16)},
    {"BF16", elements_of(kernels::dtype::bf16)},
    {"F8_E4M3", elements_of(kernels::dtype::fp8_e4m3)},
    {"I32", {.encoding = tensor_encoding::int32}},
    {"I64", {.encoding = tensor_encoding::int64}},
};

// ggml's number of every stored type it can hold.
struct ggml_entry {
  ggml_type number;
  stored_type type;
};
constexpr ggml_entry ggml_types[] = {
    {ggml_type::f32, elements_of(kernels::dtype::f32)},
    {ggml_type::f16, elements_of(kernels::dtype::f16)},
    {ggml_type::bf16, elements_of(kernels::dtype::bf16)},
    // The block encodings' element type is that of their scales.
    {ggml_type::q4_0, {.type = kernels::dtype::f16, .encoding = tensor_encoding::ggml_q4_0}},
    {ggml_type::q8_0, {.type = kernels::dtype::f16, .encoding = tensor_encoding::ggml_q8_0}},
    {ggml_type::q4_k, {.type = kernels::dtype::f16, .encoding = tensor_encoding::ggml_q4_k}},
    {ggml_type::q5_k, {.type = kernels::dtype::f16, .encoding = tensor_encoding::ggml_q5_k}},
    {ggml_type::q6_k, {.type = kernels::dtype::f16, .encoding = tensor_encoding::ggml_q6_k}},
};

// Only the element type tells elements apart; the other encodings ignore it.
bool same_storage(stored_type a, stored_type b) {
  return a.encoding == b.encoding && (a.encoding != tensor_encoding::elements || a.type == b.type);
}

}  // namespace

std::optional<stored_type> parse_safetensors_dtype(std::string_view name) {
  for (const auto& entry : safetensors_dtypes) {
    if (entry.name == name) return entry.type;
  }
  return std::nullopt;
}

std::string_view safetensors_dtype_name(stored_type type) {
  for (const auto& entry : safetensors_dtypes) {
    if (same_storage(entry.type, type)) return entry.name;
  }
  return {};
}

bool is_other_safetensors_dtype(std::string_view name) {
  static constexpr std::string_view others[] = {"F64", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL",
                                                "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64"};
  for (const auto other : others) {
    if (other == name) return true;
  }
  return false;
}

std::string_view torch_dtype_name(kernels::dtype type) {
  switch (type) {
    case kernels::dtype::f32: return "float32";
    case kernels::dtype::f16: return "float16";
    case kernels::dtype::bf16: return "bfloat16";
    case kernels::dtype::fp8_e4m3: return "float8_e4m3fn";
  }
  return "float32";
}

std::optional<stored_type> parse_ggml_type(std::uint32_t type) {
  for (const auto& entry : ggml_types) {
    if (static_cast<std::uint32_t>(entry.number) == type) return entry.type;
  }
  return std::nullopt;
}

std::optional<ggml_type> ggml_type_of(stored_type type) {
  for (const auto& entry : ggml_types) {
    if (same_storage(entry.type, type)) return entry.number;
  }
  return std::nullopt;
}

std::string_view ggml_type_name(std::uint32_t type) {
  switch (type) {
    case 0: return "F32";
    case 1: return "F16";
    case 2: return "Q4_0";
    case 3: return "Q4_1";
    case 6: return "Q5_0";
    case 7: return "Q5_1";
    case 8: return "Q8_0";
    case 9: return "Q8_1";
    case 10: return "Q2_K";
    case 11: return "Q3_K";
    case 12: return "Q4_K";
    case 13: return "Q5_K";
    case 14: return "Q6_K";
    case 15: return "Q8_K";
    case 16: return "IQ2_XXS";
    case 17: return "IQ2_XS";
    case 18: return "IQ3_XXS";
    case 19: return "IQ1_S";
    case 20: return "IQ4_NL";
    case 21: return "IQ3_S";
    case 22: return "IQ2_S";
    case 23: return "IQ4_XS";
    case 24: return "I8";
    case 25: return "I16";
    case 26: return "I32";
    case 27: return "I64";
    case 28: return "F64";
    case 29: return "IQ1_M";
    case 30: return "BF16";
    case 34: return "TQ1_0";
    case 35: return "TQ2_0";
    case 39: return "MXFP4";
    default: return {};
  }
}

std::optional<std::uint32_t> gguf_file_type(kernels::dtype type) {
  // llama.cpp's llama_ftype numbers.
  constexpr std::uint32_t all_f32 = 0;
  constexpr std::uint32_t mostly_f16 = 1;
  constexpr std::uint32_t mostly_bf16 = 32;
  switch (type) {
    case kernels::dtype::f32: return all_f32;
    case kernels::dtype::f16: return mostly_f16;
    case kernels::dtype::bf16: return mostly_bf16;
    case kernels::dtype::fp8_e4m3: break;
  }
  return std::nullopt;
}

std::string_view stored_type_name(stored_type type) {
  if (const auto name = safetensors_dtype_name(type); !name.empty()) return name;
  if (const auto number = ggml_type_of(type)) return ggml_type_name(static_cast<std::uint32_t>(*number));
  return "unknown";
}

std::string_view type_name(const tensor_view& tensor) {
  return stored_type_name({.type = tensor.type, .encoding = tensor.encoding});
}

}  // namespace edge::backend
