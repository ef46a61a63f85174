// Element types of weights, activations and the KV cache, with their facts in one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace edge::kernels {

enum class dtype : std::uint8_t {
  f32,
  f16,
  bf16,
  fp8_e4m3,  // OCP E4M3FN (numerics.h); as KV cache or weights always paired with scales
};

// Bytes per element.
constexpr std::size_t dtype_size(dtype type) {
  switch (type) {
    case dtype::f32: return 4;
    case dtype::f16: return 2;
    case dtype::bf16: return 2;
    case dtype::fp8_e4m3: return 1;
  }
  return 0;
}

constexpr std::string_view to_string(dtype type) {
  switch (type) {
    case dtype::f32: return "f32";
    case dtype::f16: return "f16";
    case dtype::bf16: return "bf16";
    case dtype::fp8_e4m3: return "fp8_e4m3";
  }
  return "unknown";
}

constexpr std::optional<dtype> parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32") return dtype::f32;
  if (name == "f16" || name == "fp16" || name == "float16") return dtype::f16;
  if (name == "bf16" || name == "bfloat16") return dtype::bf16;
  if (name == "fp8" || name == "fp8_e4m3" || name == "float8_e4m3fn") return dtype::fp8_e4m3;
  return std::nullopt;
}

}  // namespace edge::kernels
