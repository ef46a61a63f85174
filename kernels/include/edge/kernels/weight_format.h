// How a weight matrix is stored for the matmul kernels: plain elements (f32, f16, bf16), FP8
// E4M3 with one scale per output row (W8A16), packed INT4 with one scale per group of input
// elements per output row (W4A16), INT8 with one scale per 32 input elements per output row
// (GGUF Q8_0's values), or GGUF's K-quant super-blocks as a file holds them (Q4_K, Q5_K, Q6_K).
// `dtype` (dtype.h) names element types; `weight_format` names matrix layouts, which for the
// quantized formats are values plus scales (the K-quants keep their scales inside their
// blocks). Header-only and free of CUDA headers: the CPU kernels, the loaders' repacking and the
// CUDA kernels share it.
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
//
// CPU row tiles (weight_layout::cpu_tiles: INT4 with groups of 32 or more, INT8, f16, bf16, FP8)
//   The same values and scales as the row layout above, rearranged once on load for the CPU's
//   matmul kernels, which multiply 16 rows at once: lane r of a vector is row r of a tile, and a
//   token's activation (4 codes for the integer formats) is broadcast to every lane. Each weight
//   vector loaded then serves every token of a batch, and a tile is one sequential stream for a
//   decode step (the row layout's several row streams at once are served poorly by the hardware
//   prefetchers: measured 1.3-1.4× the bandwidth on 2 cores of a Zen 5 EPYC).
//   Rows go in tiles of 16 (cpu_tiles::rows).
//   f16, bf16: a tile is [k, 16]: element i of row r at (t · k + i) · 16 + r (in elements).
//   FP8: a tile is k · 16 bytes too, elements 4q .. 4q + 3 of its 16 rows in the 64 bytes from
//     (t · k + 4q) · 16, arranged for a byte table lookup to 16-bit values and one interleave of
//     their two bytes (x86's vpermt2b and vpunpck{l,h}bw, which work within 16-byte lanes): element
//     4q + j of row r at byte 16 (r / 4) + 8 (j / 2) + 2 (r % 4) + j % 2 of them, so that each
//     of the two interleaved vectors holds the pairs (4q, 4q + 1) or (4q + 2, 4q + 3) of the 16
//     rows, row r's pair in lane r. The last k % 4 elements as f16 and bf16 lay theirs: element i
//     of row r at byte (t · k + i) · 16 + r. FP8's scales: the tile's 16 rows' at t · 16.
//   INT4, INT8: a tile holds its rows block by block (32 elements, cpu_tiles::block), and a
//   block as 4-byte words, word (v, r) for row r:
//     INT8: 512 bytes; word (v, r) at (16 v + r) · 4 (v = 0..7) holds elements 4v..4v+3 of row
//       r, each as q + 128 (unsigned, as vpdpbusd multiplies it).
//     INT4: 256 bytes; word (v, r) at (16 v + r) · 4 (v = 0..3): its byte i holds element
//       8v + i in the low nibble and 8v + 4 + i in the high one, each as q + 8.
//   values: tile t, block b at (t · blocks + b) · block bytes (blocks = k / 32).
//   scales: tile t, group g: the 16 rows' scales at (t · groups + g) · 16 (INT8: groups of 32).
//   Padding: the last tile's missing rows hold q = 0 and scale 0. Threads split a matrix at tile
//   boundaries, and a view of rows (weight_rows_from) starts at a multiple of 16 rows.
//
// GGUF K-quants (weight_format::q4_k, q5_k, q6_k)
//   values [n, k / 256] super-blocks of 256 elements, row after row, byte for byte as ggml
//   lays them out (ggml-common.h's block_q4_K, block_q5_K, block_q6_K), used in place from a
//   memory-mapped file; no separate scales (scales = null, group_size 0); k a multiple of 256.
//   Multi-byte fields are little-endian; f16 is IEEE binary16. In a block, element i:
//   Q4_K, 144 bytes: f16 d, f16 dmin, 12 bytes of scales s, 128 bytes of nibbles qs.
//     Eight sub-blocks of 32, j = i / 32, each with a 6-bit scale sc_j and a 6-bit min m_j:
//       j < 4:  sc_j = s[j] & 63,                       m_j = s[j + 4] & 63
//       j >= 4: sc_j = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4,  m_j = (s[j + 4] >> 4) | (s[j] >> 6) << 4
//     q = the nibble of qs[32 (i / 64) + i % 32]: its low nibble when i % 64 < 32, else its high
//     one (each 32 bytes hold two sub-blocks); q in [0, 15].
//     weight = (d × sc_j) × q − dmin × m_j.
//   Q5_K, 176 bytes: f16 d, f16 dmin, 12 bytes of scales s (as Q4_K), 32 bytes qh, 128 bytes qs.
//     q = the Q4_K nibble + 16 × bit j of qh[i % 32]; q in [0, 31]; weight as Q4_K.
//   Q6_K, 210 bytes: 128 bytes ql, 64 bytes qh, 16 int8 scales sc, f16 d.
//     Sixteen sub-blocks of 16, j = i / 16. With h = i / 128 and r = i % 128: the low 4 bits of
//     q are the nibble of ql[64 h + r % 64] (low when r < 64, else high), the high 2 bits are
//     (qh[32 h + r % 32] >> (2 (r / 32))) & 3; q in [0, 63].
//     weight = (d × sc_j) × (q − 32).
//   Each weight is exact in float once the products are: d × sc_j and q's factor are exact, and
//   Q4_K/Q5_K round once, at the subtraction (dequantize_row_q4_K's arithmetic).
//   Bits per weight: 4.5, 5.5 and 6.5625 (bytes per block / 32). Why in place rather than repacked: the file's
//   bytes are the smallest form of these numbers, and the CPU kernels read them as they are (the
//   nibbles of 32 bytes are 64 consecutive weights). edgeinfer never writes these formats: they
//   are how files come; --weight-dtype converts from them (decoded exactly) but not to them.
//   The CUDA kernels do not read them: the CUDA executor widens them to bf16 as it uploads
//   (cuda_matmul_reads below).
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
  q4_k,      // GGUF Q4_K super-blocks, as the file holds them
  q5_k,      // GGUF Q5_K super-blocks
  q6_k,      // GGUF Q6_K super-blocks
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

struct kquant_traits {
  static constexpr std::int64_t block_elements = 256;  // a super-block
  static constexpr std::int64_t q4_k_bytes = 144;
  static constexpr std::int64_t q5_k_bytes = 176;
  static constexpr std::int64_t q6_k_bytes = 210;
  // Q4_K and Q5_K: sub-blocks of 32 with a scale and a min; Q6_K: sub-blocks of 16 with a scale.
  static constexpr std::int64_t q4_k_sub_block = 32;
  static constexpr std::int64_t q6_k_sub_block = 16;
  static constexpr std::int64_t q4_k_sub_blocks = block_elements / q4_k_sub_block;
  static constexpr std::int64_t q6_k_sub_blocks = block_elements / q6_k_sub_block;
  static constexpr int q6_k_offset = 32;  // a 6-bit code holds q + 32
  // Byte offsets inside a block.
  static constexpr std::int64_t dmin_at = 2;      // Q4_K, Q5_K (d at 0)
  static constexpr std::int64_t scales_at = 4;    // Q4_K, Q5_K: 12 bytes of packed 6-bit scales and mins
  static constexpr std::int64_t q4_k_qs_at = 16;
  static constexpr std::int64_t q5_k_qh_at = 16;
  static constexpr std::int64_t q5_k_qs_at = 48;
  static constexpr std::int64_t q6_k_qh_at = 128;
  static constexpr std::int64_t q6_k_scales_at = 192;
  static constexpr std::int64_t q6_k_d_at = 208;
  static constexpr int six_bits = 63;
};

constexpr bool is_k_quant(weight_format format) {
  return format == weight_format::q4_k || format == weight_format::q5_k || format == weight_format::q6_k;
}

// Bytes of one super-block; 0 for the other formats.
EDGE_HOST_DEVICE constexpr std::int64_t kquant_block_bytes(weight_format format) {
  return format == weight_format::q4_k   ? kquant_traits::q4_k_bytes
         : format == weight_format::q5_k ? kquant_traits::q5_k_bytes
         : format == weight_format::q6_k ? kquant_traits::q6_k_bytes
                                         : 0;
}

// The f16 at `p` (little-endian, any alignment), as float.
EDGE_HOST_DEVICE constexpr float kquant_half(const std::uint8_t* p) {
  return fp16_to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8)));
}

// Q4_K / Q5_K: sub-block j's 6-bit scale and min.
struct kquant_scale_min {
  int scale;
  int min;
};
EDGE_HOST_DEVICE constexpr kquant_scale_min q4_k_scale_min(const std::uint8_t* block, int j) {
  const std::uint8_t* s = block + kquant_traits::scales_at;
  if (j < 4) return {s[j] & kquant_traits::six_bits, s[j + 4] & kquant_traits::six_bits};
  return {(s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4), (s[j + 4] >> 4) | ((s[j] >> 6) << 4)};
}

// q of element i (0..255) of a block: Q4_K in [0, 15], Q5_K in [0, 31], Q6_K in [0, 63] (q + 32).
EDGE_HOST_DEVICE constexpr int q4_k_code(const std::uint8_t* block, int i) {
  const std::uint8_t byte = block[kquant_traits::q4_k_qs_at + 32 * (i / 64) + i % 32];
  return i % 64 < 32 ? byte & 0x0F : byte >> 4;
}
EDGE_HOST_DEVICE constexpr int q5_k_code(const std::uint8_t* block, int i) {
  const std::uint8_t byte = block[kquant_traits::q5_k_qs_at + 32 * (i / 64) + i % 32];
  const int low = i % 64 < 32 ? byte & 0x0F : byte >> 4;
  const int high = (block[kquant_traits::q5_k_qh_at + i % 32] >> (i / 32)) & 1;
  return low | (high << 4);
}
EDGE_HOST_DEVICE constexpr int q6_k_code(const std::uint8_t* block, int i) {
  const int h = i / 128;
  const int r = i % 128;
  const std::uint8_t byte = block[64 * h + r % 64];
  const int low = r < 64 ? byte & 0x0F : byte >> 4;
  const int high = (block[kquant_traits::q6_k_qh_at + 32 * h + r % 32] >> (2 * (r / 32))) & 3;
  return low | (high << 4);
}
// Q6_K: sub-block j's (0..15) signed scale.
EDGE_HOST_DEVICE constexpr int q6_k_scale(const std::uint8_t* block, int j) {
  return static_cast<std::int8_t>(block[kquant_traits::q6_k_scales_at + j]);
}

// The 256 weights of one super-block, exactly (the arithmetic of the format's description).
EDGE_HOST_DEVICE inline void kquant_dequantize_block(weight_format format, const std::uint8_t* block, float* out) {
  if (format == weight_format::q6_k) {
    const float d = kquant_half(block + kquant_traits::q6_k_d_at);
    for (int j = 0; j < kquant_traits::q6_k_sub_blocks; ++j) {
      const float scale = d * static_cast<float>(q6_k_scale(block, j));
      for (int l = 0; l < kquant_traits::q6_k_sub_block; ++l) {
        const int i = j * kquant_traits::q6_k_sub_block + l;
        out[i] = scale * static_cast<float>(q6_k_code(block, i) - kquant_traits::q6_k_offset);
      }
    }
    return;
  }
  const float d = kquant_half(block);
  const float dmin = kquant_half(block + kquant_traits::dmin_at);
  for (int j = 0; j < kquant_traits::q4_k_sub_blocks; ++j) {
    const kquant_scale_min sm = q4_k_scale_min(block, j);
    const float scale = d * static_cast<float>(sm.scale);
    const float min = dmin * static_cast<float>(sm.min);
    for (int l = 0; l < kquant_traits::q4_k_sub_block; ++l) {
      const int i = j * kquant_traits::q4_k_sub_block + l;
      const int q = format == weight_format::q4_k ? q4_k_code(block, i) : q5_k_code(block, i);
      out[i] = scale * static_cast<float>(q) - min;
    }
  }
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

// How a matrix's rows are laid out: one after the other (every format), or in the CPU's row
// tiles (INT4 with groups of 32 or more, and INT8; see above).
enum class weight_layout : std::uint8_t { rows, cpu_tiles };

// A weight matrix [n, k] as the matmul kernels read it.
struct weight_view {
  weight_format format = weight_format::f32;
  const void* values = nullptr;   // plain and fp8: [n, k] elements; int4: [n, int4_row_bytes(k)] bytes;
                                  // K-quants: [n, k / 256] blocks; cpu_tiles: cpu_tiles::values_bytes
  const float* scales = nullptr;  // fp8: [n]; int4, int8: [n, k / group_size]; null for the plain formats and K-quants
  std::int64_t group_size = 0;    // int4 and int8 (always 32)
  weight_layout layout = weight_layout::rows;
};

// The arithmetic of the CPU row tiles.
struct cpu_tiles {
  static constexpr std::int64_t rows = 16;
  static constexpr std::int64_t block = 32;      // elements of a row per block (INT4, INT8)
  static constexpr std::int64_t word_bytes = 4;  // bytes of one row in one word (INT4, INT8)
  static constexpr int int8_offset = 128;        // INT8 codes are stored as q + 128
  static constexpr std::int64_t fp8_quad = 4;     // FP8 elements of a row arranged together

  // Whether a matrix of the format may be tiled.
  static constexpr bool takes(weight_format format, std::int64_t group_size) {
    return format == weight_format::int8 || (format == weight_format::int4 && group_size >= int4_traits::chunk_elements) ||
           format == weight_format::f16 || format == weight_format::bf16 || format == weight_format::fp8_e4m3;
  }
  static constexpr bool integer(weight_format format) {
    return format == weight_format::int4 || format == weight_format::int8;
  }
  // Bytes of an element of the float formats.
  static constexpr std::int64_t element_bytes(weight_format format) { return format == weight_format::fp8_e4m3 ? 1 : 2; }
  static constexpr std::int64_t block_bytes(weight_format format) { return format == weight_format::int4 ? 256 : 512; }
  static constexpr std::int64_t tiles(std::int64_t n) { return (n + rows - 1) / rows; }
  static constexpr std::int64_t group_of(weight_format format, std::int64_t group_size) {
    return format == weight_format::int8 ? int8_traits::group_size : group_size;
  }
  static constexpr std::int64_t values_bytes(weight_format format, std::int64_t n, std::int64_t k) {
    if (!integer(format)) return tiles(n) * k * rows * element_bytes(format);
    return tiles(n) * (k / block) * block_bytes(format);
  }
  static constexpr std::int64_t scale_count(weight_format format, std::int64_t n, std::int64_t k,
                                            std::int64_t group_size) {
    if (format == weight_format::fp8_e4m3) return tiles(n) * rows;
    if (!integer(format)) return 0;
    return tiles(n) * (k / group_of(format, group_size)) * rows;
  }
  // Where element i of row n lies: its byte among the values and (INT4) whether it is the high
  // nibble; and its scale's index (FP8: the row's).
  struct place {
    std::int64_t byte;
    bool high_nibble;
    std::int64_t scale;
  };
  static constexpr place of(weight_format format, std::int64_t group_size, std::int64_t k, std::int64_t n,
                            std::int64_t i) {
    const std::int64_t t = n / rows, r = n % rows;
    if (format == weight_format::fp8_e4m3 && i < k / fp8_quad * fp8_quad) {
      const std::int64_t j = i % fp8_quad;
      const std::int64_t in_quad = 16 * (r / 4) + 8 * (j / 2) + 2 * (r % 4) + j % 2;
      return {.byte = (t * k + i - j) * rows + in_quad, .high_nibble = false, .scale = n};
    }
    if (!integer(format)) {
      return {.byte = ((t * k + i) * rows + r) * element_bytes(format), .high_nibble = false, .scale = n};
    }
    const std::int64_t b = i / block, e = i % block;
    const std::int64_t group = group_of(format, group_size);
    const std::int64_t first = (t * (k / block) + b) * block_bytes(format);
    const std::int64_t scale = (t * (k / group) + i / group) * rows + r;
    if (format == weight_format::int8) {
      return {.byte = first + (e / 4 * rows + r) * word_bytes + e % 4, .high_nibble = false, .scale = scale};
    }
    const std::int64_t in_word = e % 8;
    return {.byte = first + (e / 8 * rows + r) * word_bytes + in_word % 4, .high_nibble = in_word >= 4, .scale = scale};
  }
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
    case weight_format::q4_k:
    case weight_format::q5_k:
    case weight_format::q6_k: return n * (k / kquant_traits::block_elements) * kquant_block_bytes(format);
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
    case weight_format::bf16:
    case weight_format::q4_k:
    case weight_format::q5_k:
    case weight_format::q6_k: return 0;
  }
  return 0;
}

// The rows from `first` on of a matrix whose rows are k wide (values and, for the scaled
// formats, their scales).
// A view of CPU row tiles starts at a whole tile (`first` a multiple of cpu_tiles::rows).
inline weight_view weight_rows_from(const weight_view& w, std::int64_t first, std::int64_t k) {
  weight_view out = w;
  if (w.layout == weight_layout::cpu_tiles) {
    out.values = static_cast<const std::uint8_t*>(w.values) + cpu_tiles::values_bytes(w.format, first, k);
    if (w.scales != nullptr) out.scales = w.scales + cpu_tiles::scale_count(w.format, first, k, w.group_size);
    return out;
  }
  out.values = static_cast<const std::uint8_t*>(w.values) + weight_values_bytes(w.format, first, k);
  if (w.scales != nullptr) out.scales = w.scales + weight_scale_count(w.format, first, k, w.group_size);
  return out;
}

// Element i of row n of an INT4 or INT8 matrix [n, k] in either layout: its code (q) and its
// scale. For the portable kernels and conversions; the vector kernels read whole spans.
inline int integer_code_at(const weight_view& w, std::int64_t k, std::int64_t n, std::int64_t i) {
  const auto* values = static_cast<const std::uint8_t*>(w.values);
  if (w.layout == weight_layout::cpu_tiles) {
    const cpu_tiles::place at = cpu_tiles::of(w.format, w.group_size, k, n, i);
    if (w.format == weight_format::int8) return static_cast<int>(values[at.byte]) - cpu_tiles::int8_offset;
    const int nibble = at.high_nibble ? values[at.byte] >> int4_traits::nibble_bits : values[at.byte] & int4_traits::nibble_mask;
    return nibble - int4_traits::code_offset;
  }
  if (w.format == weight_format::int8) return static_cast<std::int8_t>(values[n * k + i]);
  return int4_get(values + n * int4_row_bytes(k), i);
}
inline float integer_scale_at(const weight_view& w, std::int64_t k, std::int64_t n, std::int64_t i) {
  if (w.layout == weight_layout::cpu_tiles) return w.scales[cpu_tiles::of(w.format, w.group_size, k, n, i).scale];
  const std::int64_t group = w.format == weight_format::int8 ? int8_traits::group_size : w.group_size;
  return w.scales[n * (k / group) + i / group];
}

constexpr bool is_quantized(weight_format format) {
  return format == weight_format::fp8_e4m3 || format == weight_format::int4 || format == weight_format::int8 ||
         is_k_quant(format);
}

// Whether a matrix of the format comes with a separate scales array (weight_view::scales).
constexpr bool has_scales(weight_format format) {
  return format == weight_format::fp8_e4m3 || format == weight_format::int4 || format == weight_format::int8;
}

// Whether the CUDA kernels (matmul, MoE experts) read weights of the format. They refuse the
// others with invalid_argument; the CUDA executor widens such a matrix to bf16 on the host as it
// uploads it (INT8, and the K-quants, which the CPU kernels read in place).
constexpr bool cuda_matmul_reads(weight_format format) {
  switch (format) {
    case weight_format::f32:
    case weight_format::f16:
    case weight_format::bf16:
    case weight_format::fp8_e4m3:
    case weight_format::int4: return true;
    case weight_format::int8:
    case weight_format::q4_k:
    case weight_format::q5_k:
    case weight_format::q6_k: return false;
  }
  return false;
}

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

// The element type of the plain formats and fp8; nullopt for int4, int8 and the K-quants.
constexpr std::optional<dtype> element_dtype(weight_format format) {
  switch (format) {
    case weight_format::f32: return dtype::f32;
    case weight_format::f16: return dtype::f16;
    case weight_format::bf16: return dtype::bf16;
    case weight_format::fp8_e4m3: return dtype::fp8_e4m3;
    case weight_format::int4:
    case weight_format::int8: return std::nullopt;
    case weight_format::q4_k:
    case weight_format::q5_k:
    case weight_format::q6_k: return std::nullopt;
  }
  return std::nullopt;
}

// The names of --weight-dtype, and of the K-quants in logs and metrics ("q4_k").
constexpr std::string_view to_string(weight_format format) {
  switch (format) {
    case weight_format::f32: return "f32";
    case weight_format::f16: return "f16";
    case weight_format::bf16: return "bf16";
    case weight_format::fp8_e4m3: return "fp8";
    case weight_format::int4: return "int4";
    case weight_format::int8: return "int8";
    case weight_format::q4_k: return "q4_k";
    case weight_format::q5_k: return "q5_k";
    case weight_format::q6_k: return "q6_k";
  }
  return "unknown";
}

// A --weight-dtype name. The K-quants are not among them: they are how files store weights,
// kept as loaded, never a target to convert to.
constexpr std::optional<weight_format> parse_weight_format(std::string_view name) {
  if (name == "int4") return weight_format::int4;
  if (name == "int8") return weight_format::int8;
  if (name == "fp8" || name == "fp8_e4m3") return weight_format::fp8_e4m3;
  if (const auto type = parse_dtype(name); type && *type != dtype::fp8_e4m3) return weight_format_of(*type);
  return std::nullopt;
}

}  // namespace edge::kernels
