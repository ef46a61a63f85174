// How a weight matrix is stored for the matmul kernels: plain elements (f32, f16, bf16), FP8
// E4M3 with one scale per output row (W8A16), packed INT4 with one scale per group of input
// elements per output row (W4A16), or INT8 with one scale per 32 input elements per output row
// (GGUF Q8_0's values). `dtype` (dtype.h) names element types; `weight_format` names
// matrix layouts, which for the quantized formats are values plus scales. Header-only and free
// of CUDA headers: the CPU kernels, the loaders' repacking and the CUDA kernels share it.
//
// A matrix has n output rows of k input elements ([n, k], rows contiguous).
//
// INT4 (weight_format::int4)
//   values  [n, int4_row_bytes(k)] bytes; scales [n, k / group_size] f32, row-major.
//   Element i of a row lies in chunk i / 32 (16 bytes); within it, byte i % 16 holds element
//   i in its low nibble when i % 32 < 16, in its high nibble otherwise (GGUF Q4_0's order).
//   A nibble stores q + 8 (offset binary) for a signed q in [-8, 7]; the weight is
//   float(q) × scales[row, i / group_size], one f32 multiply. The last chunk of a row is
//   padded with q = 0, so every row is a whole number of 16-byte chunks and rows stay 16-byte
//   aligned. group_size is a power of two that divides k (at most 128 when edgeinfer chooses
//   it: int4_group_size_for).
//   Why this nibble order: 16 bytes give two vectors of 16 consecutive weights with one mask
//   and one shift (the CPU kernel's 16 lanes, a CUDA thread's 16-byte load), and a GGUF Q4_0
//   block repacks into it without moving a nibble. Scales are f32 so that every source (Q4_0's
//   f16, compressed-tensors' bf16/f16, on-load quantization) is represented exactly; at a group
//   of 128 they add 4 bytes to 64 (6%).
//   Quantization (on load and by `edgeinfer quantize`): scale = amax / 7.5 over the group,
//   q = round-half-to-even(x / scale) clamped to [-8, 7]. This is compressed-tensors' symmetric
//   rule (and GPTQ's): all 16 codes are used (-amax → -8, +amax → 7.5 → clamped to 7), so the
//   step is 7% finer than amax / 7 with [-7, 7] while the largest error stays half a step.
//
// FP8 (weight_format::fp8_e4m3)
//   values [n, k] E4M3 codes (numerics.h); scales [n] f32. The weight is decode(code) × scale.
//   Quantization: scale = amax / 448 over the row, code = float_to_fp8_e4m3(x / scale). A NaN
//   weight (or a row whose amax is not finite) is stored as the NaN code (0x7F / 0xFF), and
//   every kernel, on the CPU and the device, reads that code as NaN: a broken checkpoint shows
//   as NaN outputs, never as silently different numbers.
//
// INT8 (weight_format::int8)
//   values [n, k] int8 codes (two's complement); scales [n, k / 32] f32; k a multiple of 32.
//   The weight is float(code) × scales[row, i / 32]. group_size is always 32.
//   Quantization: scale = amax / 127 over the group, code = round-half-to-even(x / scale),
//   clamped to [-127, 127]; a GGUF Q8_0 block (an f16 scale and 32 codes) is repacked into it
//   exactly, -128 included. Why a format of its own rather than Q8_0 widened to f16: the CPU
//   multiplies its codes as integers (kernels/matmul/integer_dot.h), reading a byte per weight.
//
// A zero group or row (amax = 0) gets scale 0 and codes for 0.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "edge/kernels/dtype.h"
#include "edge/kernels/numerics.h"

namespace edge::kernels {

enum class weight_format : std::uint8_t {
  f32,
  f16,
  bf16,
  fp8_e4m3,  // E4M3 codes and one f32 scale per row
  int4,      // packed 4-bit codes and one f32 scale per group of a row
  int8,      // int8 codes and one f32 scale per 32 elements of a row
};

struct int4_traits {
  static constexpr int min_value = -8;
  static constexpr int max_value = 7;
  static constexpr int code_offset = 8;  // a nibble holds q + 8
  static constexpr int nibble_bits = 4;
  static constexpr std::uint8_t nibble_mask = 0x0F;
  static constexpr std::int64_t chunk_elements = 32;
  static constexpr std::int64_t chunk_bytes = 16;
  static constexpr std::int64_t half_chunk = chunk_elements / 2;
  // amax / 7.5: +amax lands on the tie between 7 and 8 and is clamped to 7, -amax on -7.5,
  // which rounds to the even -8.
  static constexpr float scale_divisor = 7.5f;
  static constexpr std::int64_t max_group_size = 128;
};

struct int8_traits {
  static constexpr int max_code = 127;
  static constexpr std::int64_t group_size = 32;
  static constexpr float scale_divisor = 127.0f;
};

// Bytes of one packed INT4 row of k elements: whole 16-byte chunks.
EDGE_HOST_DEVICE constexpr std::int64_t int4_row_bytes(std::int64_t k) {
  return (k + int4_traits::chunk_elements - 1) / int4_traits::chunk_elements * int4_traits::chunk_bytes;
}

// Byte of a packed row that holds element i, and whether it is that byte's high nibble.
EDGE_HOST_DEVICE constexpr std::int64_t int4_byte_of(std::int64_t i) {
  return i / int4_traits::chunk_elements * int4_traits::chunk_bytes + i % int4_traits::half_chunk;
}
EDGE_HOST_DEVICE constexpr bool int4_in_high_nibble(std::int64_t i) {
  return i % int4_traits::chunk_elements >= int4_traits::half_chunk;
}

// q of element i of a packed row.
EDGE_HOST_DEVICE constexpr int int4_get(const std::uint8_t* row, std::int64_t i) {
  const std::uint8_t byte = row[int4_byte_of(i)];
  const int code = int4_in_high_nibble(i) ? byte >> int4_traits::nibble_bits : byte & int4_traits::nibble_mask;
  return code - int4_traits::code_offset;
}

// Writes q (in [-8, 7]) as element i of a packed row, leaving the byte's other nibble alone.
EDGE_HOST_DEVICE constexpr void int4_set(std::uint8_t* row, std::int64_t i, int q) {
  const auto code = static_cast<std::uint8_t>(q + int4_traits::code_offset);
  std::uint8_t& byte = row[int4_byte_of(i)];
  byte = int4_in_high_nibble(i)
             ? static_cast<std::uint8_t>((byte & int4_traits::nibble_mask) | (code << int4_traits::nibble_bits))
             : static_cast<std::uint8_t>((byte & ~int4_traits::nibble_mask) | code);
}

// The group size edgeinfer quantizes a row of k elements with: `largest` (128 unless asked
// otherwise), or for rows it does not divide (small models) the largest power of two that does.
EDGE_HOST_DEVICE constexpr std::int64_t int4_group_size_for(std::int64_t k,
                                                            std::int64_t largest = int4_traits::max_group_size) {
  std::int64_t group = largest;
  while (group > 1 && k % group != 0) group /= 2;
  return group;
}

EDGE_HOST_DEVICE constexpr bool valid_int4_group_size(std::int64_t group_size, std::int64_t k) {
  return group_size > 0 && (group_size & (group_size - 1)) == 0 && k % group_size == 0;
}

EDGE_HOST_DEVICE constexpr float int4_scale(float amax) { return amax / int4_traits::scale_divisor; }

// q for x in a group of scale `scale`: round half to even, clamped to [-8, 7]. The rounding is
// integer code on the exact fraction, so it does not depend on the floating-point environment
// or on fast-math flags. A zero scale gives 0.
EDGE_HOST_DEVICE constexpr int int4_quantize(float x, float scale) {
  if (scale == 0.0f) return 0;
  // Clamped to a small range first, so the conversion to int is defined (NaN goes to the low end).
  constexpr float limit = 2.0f * int4_traits::code_offset;
  float ratio = x / scale;
  if (!(ratio >= -limit)) ratio = -limit;
  if (ratio > limit) ratio = limit;
  const int truncated = static_cast<int>(ratio);
  const float fraction = ratio - static_cast<float>(truncated);  // exact: |ratio| is small
  int q = truncated;
  if (fraction > 0.5f || (fraction == 0.5f && (truncated & 1) != 0)) ++q;
  if (fraction < -0.5f || (fraction == -0.5f && (truncated & 1) != 0)) --q;
  return q < int4_traits::min_value ? int4_traits::min_value : (q > int4_traits::max_value ? int4_traits::max_value : q);
}

EDGE_HOST_DEVICE constexpr float int8_scale(float amax) { return amax / int8_traits::scale_divisor; }

// The code of x in a group of scale `scale`, rounded half to even as int4_quantize rounds.
EDGE_HOST_DEVICE constexpr int int8_quantize(float x, float scale) {
  if (scale == 0.0f) return 0;
  constexpr float limit = static_cast<float>(int8_traits::max_code);
  float ratio = x / scale;
  if (!(ratio >= -limit)) ratio = -limit;
  if (ratio > limit) ratio = limit;
  const int truncated = static_cast<int>(ratio);
  const float fraction = ratio - static_cast<float>(truncated);
  int q = truncated;
  if (fraction > 0.5f || (fraction == 0.5f && (truncated & 1) != 0)) ++q;
  if (fraction < -0.5f || (fraction == -0.5f && (truncated & 1) != 0)) --q;
  return q;
}

EDGE_HOST_DEVICE constexpr float fp8_weight_scale(float amax) { return amax / fp8_e4m3_traits::max; }

EDGE_HOST_DEVICE constexpr std::uint8_t fp8_weight_code(float x, float scale) {
  return scale == 0.0f ? std::uint8_t{0} : float_to_fp8_e4m3(x / scale);
}

// A weight matrix [n, k] as the matmul kernels read it.
struct weight_view {
  weight_format format = weight_format::f32;
  const void* values = nullptr;   // plain and fp8: [n, k] elements; int4: [n, int4_row_bytes(k)] bytes
  const float* scales = nullptr;  // fp8: [n]; int4, int8: [n, k / group_size]; null for the plain formats
  std::int64_t group_size = 0;    // int4 and int8 (always 32)
};

// Bytes of the values of an [n, k] matrix, and the number of its scales.
constexpr std::int64_t weight_values_bytes(weight_format format, std::int64_t n, std::int64_t k) {
  switch (format) {
    case weight_format::f32: return n * k * 4;
    case weight_format::f16:
    case weight_format::bf16: return n * k * 2;
    case weight_format::fp8_e4m3:
    case weight_format::int8: return n * k;
    case weight_format::int4: return n * int4_row_bytes(k);
  }
  return 0;
}
constexpr std::int64_t weight_scale_count(weight_format format, std::int64_t n, std::int64_t k,
                                          std::int64_t group_size) {
  switch (format) {
    case weight_format::fp8_e4m3: return n;
    case weight_format::int4: return group_size > 0 ? n * (k / group_size) : 0;
    case weight_format::int8: return n * (k / int8_traits::group_size);
    case weight_format::f32:
    case weight_format::f16:
    case weight_format::bf16: return 0;
  }
  return 0;
}

// The rows from `first` on of a matrix whose rows are k wide (values and, for the scaled
// formats, their scales).
inline weight_view weight_rows_from(const weight_view& w, std::int64_t first, std::int64_t k) {
  weight_view out = w;
  out.values = static_cast<const std::uint8_t*>(w.values) + weight_values_bytes(w.format, first, k);
  if (w.scales != nullptr) out.scales = w.scales + weight_scale_count(w.format, first, k, w.group_size);
  return out;
}

constexpr bool is_quantized(weight_format format) {
  return format == weight_format::fp8_e4m3 || format == weight_format::int4 || format == weight_format::int8;
}

// Whether the CUDA matmul reads a format; the CUDA placement widens the others to bf16 on upload.
constexpr bool cuda_matmul_reads(weight_format format) { return format != weight_format::int8; }

// The plain format of an element type; fp8_e4m3 weights always come with scales.
constexpr weight_format weight_format_of(dtype type) {
  switch (type) {
    case dtype::f32: return weight_format::f32;
    case dtype::f16: return weight_format::f16;
    case dtype::bf16: return weight_format::bf16;
    case dtype::fp8_e4m3: return weight_format::fp8_e4m3;
  }
  return weight_format::f32;
}

// The element type of the plain formats and fp8; nullopt for int4 and int8.
constexpr std::optional<dtype> element_dtype(weight_format format) {
  switch (format) {
    case weight_format::f32: return dtype::f32;
    case weight_format::f16: return dtype::f16;
    case weight_format::bf16: return dtype::bf16;
    case weight_format::fp8_e4m3: return dtype::fp8_e4m3;
    case weight_format::int4:
    case weight_format::int8: return std::nullopt;
  }
  return std::nullopt;
}

// The names of --weight-dtype.
constexpr std::string_view to_string(weight_format format) {
  switch (format) {
    case weight_format::f32: return "f32";
    case weight_format::f16: return "f16";
    case weight_format::bf16: return "bf16";
    case weight_format::fp8_e4m3: return "fp8";
    case weight_format::int4: return "int4";
    case weight_format::int8: return "int8";
  }
  return "unknown";
}

constexpr std::optional<weight_format> parse_weight_format(std::string_view name) {
  if (name == "int4") return weight_format::int4;
  if (name == "int8") return weight_format::int8;
  if (name == "fp8" || name == "fp8_e4m3") return weight_format::fp8_e4m3;
  if (const auto type = parse_dtype(name); type && *type != dtype::fp8_e4m3) return weight_format_of(*type);
  return std::nullopt;
}

}  // namespace edge::kernels
