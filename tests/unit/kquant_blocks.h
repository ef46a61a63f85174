// GGUF K-quant super-blocks for tests, built byte by byte from their fields as ggml lays out
// block_q4_K, block_q5_K and block_q6_K (written here independently of
// edge/kernels/weight_format.h, so that a mistake there cannot hide the same mistake here), the
// value each element holds, and a simple quantizer from floats (amax-based, not llama.cpp's
// search: close enough for a model to keep predicting).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "edge/kernels/numerics.h"
#include "edge/kernels/weight_format.h"

namespace edge::testing {

inline constexpr int kq_elements = 256;

// One super-block's fields: d and dmin as f16 bits; scales and mins per sub-block (Q4_K and
// Q5_K: 8 of each, 6 bits; Q6_K: 16 signed scales, no mins); the codes as stored (Q4_K 0..15,
// Q5_K 0..31, Q6_K 0..63, whose value is code - 32).
struct kquant_fields {
  kernels::weight_format format = kernels::weight_format::q4_k;
  std::uint16_t d = 0;
  std::uint16_t dmin = 0;
  std::vector<int> scale;
  std::vector<int> min;
  std::array<int, kq_elements> q{};
};

inline int kq_sub_blocks(kernels::weight_format f) { return f == kernels::weight_format::q6_k ? 16 : 8; }

inline std::size_t kq_block_bytes(kernels::weight_format f) {
  return f == kernels::weight_format::q4_k ? 144 : f == kernels::weight_format::q5_k ? 176 : 210;
}

// The block's bytes, field by field.
inline std::vector<std::uint8_t> block_bytes(const kquant_fields& f) {
  std::vector<std::uint8_t> b(kq_block_bytes(f.format), 0);
  const auto put_half = [&](std::size_t at, std::uint16_t bits) {
    b[at] = static_cast<std::uint8_t>(bits & 0xFF);
    b[at + 1] = static_cast<std::uint8_t>(bits >> 8);
  };
  if (f.format == kernels::weight_format::q6_k) {
    // ql[128], qh[64], scales[16], d.
    for (int i = 0; i < kq_elements; ++i) {
      const int half = i / 128, r = i % 128;
      const int low = f.q[i] & 0xF, high = f.q[i] >> 4;
      b[64 * half + r % 64] |= static_cast<std::uint8_t>(r < 64 ? low : low << 4);
      b[128 + 32 * half + r % 32] |= static_cast<std::uint8_t>(high << (2 * (r / 32)));
    }
    for (int j = 0; j < 16; ++j) b[192 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(f.scale[j]));
    put_half(208, f.d);
    return b;
  }
  // d, dmin, scales[12], (Q5_K: qh[32]), qs[128].
  put_half(0, f.d);
  put_half(2, f.dmin);
  for (int j = 0; j < 4; ++j) {
    b[4 + j] = static_cast<std::uint8_t>((f.scale[j] & 63) | ((f.scale[j + 4] >> 4) << 6));
    b[8 + j] = static_cast<std::uint8_t>((f.min[j] & 63) | ((f.min[j + 4] >> 4) << 6));
    b[12 + j] = static_cast<std::uint8_t>((f.scale[j + 4] & 15) | ((f.min[j + 4] & 15) << 4));
  }
  const bool q5 = f.format == kernels::weight_format::q5_k;
  const std::size_t qs = q5 ? 48 : 16;
  for (int i = 0; i < kq_elements; ++i) {
    const int nibble = f.q[i] & 0xF;
    b[qs + 32 * (i / 64) + i % 32] |= static_cast<std::uint8_t>(i % 64 < 32 ? nibble : nibble << 4);
    if (q5) b[16 + i % 32] |= static_cast<std::uint8_t>((f.q[i] >> 4) << (i / 32));
  }
  return b;
}

// Element i's value, computed in double (exact here) and rounded once.
inline float element_value(const kquant_fields& f, int i) {
  const double d = kernels::fp16_to_float(f.d);
  if (f.format == kernels::weight_format::q6_k) return static_cast<float>(d * f.scale[i / 16] * (f.q[i] - 32));
  const double dmin = kernels::fp16_to_float(f.dmin);
  return static_cast<float>(d * f.scale[i / 32] * f.q[i] - dmin * f.min[i / 32]);
}

// Random fields: every code and scale of the format's range, d and dmin of about `magnitude`
// over the largest code (so values stay within a few `magnitude`).
inline kquant_fields random_fields(kernels::weight_format format, std::mt19937& rng, float magnitude = 1.0f) {
  kquant_fields f;
  f.format = format;
  const int subs = kq_sub_blocks(format);
  const bool q6 = format == kernels::weight_format::q6_k;
  const int max_code = format == kernels::weight_format::q4_k ? 15 : format == kernels::weight_format::q5_k ? 31 : 63;
  std::uniform_int_distribution<int> code(0, max_code);
  std::uniform_int_distribution<int> six(0, 63);
  std::uniform_int_distribution<int> signed_scale(-128, 127);
  std::uniform_real_distribution<float> unit(0.5f, 1.0f);
  const float scale_range = q6 ? 128.0f : 63.0f;
  f.d = kernels::float_to_fp16(magnitude * unit(rng) / (scale_range * static_cast<float>(max_code)));
  f.dmin = kernels::float_to_fp16(magnitude * unit(rng) / 63.0f);
  for (int j = 0; j < subs; ++j) {
    f.scale.push_back(q6 ? signed_scale(rng) : six(rng));
    if (!q6) f.min.push_back(six(rng));
  }
  for (int& q : f.q) q = code(rng);
  return f;
}

// Fields that approximate x[256]: per sub-block the scale (and for Q4_K / Q5_K the min) from
// its range, quantized to 6 or 8 bits against d (and dmin), codes rounded to nearest.
inline kquant_fields quantize_fields(kernels::weight_format format, const float* x) {
  kquant_fields f;
  f.format = format;
  const int subs = kq_sub_blocks(format);
  const int size = kq_elements / subs;
  if (format == kernels::weight_format::q6_k) {
    std::vector<float> step(static_cast<std::size_t>(subs));
    float max_step = 0.0f;
    for (int j = 0; j < subs; ++j) {
      float amax = 0.0f;
      for (int l = 0; l < size; ++l) amax = std::max(amax, std::fabs(x[j * size + l]));
      step[static_cast<std::size_t>(j)] = amax / 31.0f;
      max_step = std::max(max_step, amax / 31.0f);
    }
    f.d = kernels::float_to_fp16(max_step / 127.0f);
    const float d = kernels::fp16_to_float(f.d);
    for (int j = 0; j < subs; ++j) {
      const int sc = d > 0.0f ? std::clamp(static_cast<int>(std::lround(step[static_cast<std::size_t>(j)] / d)), -128, 127) : 0;
      f.scale.push_back(sc);
      const float unit = d * static_cast<float>(sc);
      for (int l = 0; l < size; ++l) {
        const int i = j * size + l;
        f.q[i] = unit != 0.0f ? std::clamp(static_cast<int>(std::lround(x[i] / unit)), -32, 31) + 32 : 32;
      }
    }
    return f;
  }
  const int max_code = format == kernels::weight_format::q4_k ? 15 : 31;
  std::vector<float> step(static_cast<std::size_t>(subs)), offset(static_cast<std::size_t>(subs));
  float max_step = 0.0f, max_offset = 0.0f;
  for (int j = 0; j < subs; ++j) {
    float lo = 0.0f, hi = 0.0f;
    for (int l = 0; l < size; ++l) {
      lo = std::min(lo, x[j * size + l]);
      hi = std::max(hi, x[j * size + l]);
    }
    step[static_cast<std::size_t>(j)] = (hi - lo) / static_cast<float>(max_code);
    offset[static_cast<std::size_t>(j)] = -lo;
    max_step = std::max(max_step, step[static_cast<std::size_t>(j)]);
    max_offset = std::max(max_offset, -lo);
  }
  f.d = kernels::float_to_fp16(max_step / 63.0f);
  f.dmin = kernels::float_to_fp16(max_offset / 63.0f);
  const float d = kernels::fp16_to_float(f.d), dmin = kernels::fp16_to_float(f.dmin);
  for (int j = 0; j < subs; ++j) {
    const int sc = d > 0.0f ? std::clamp(static_cast<int>(std::lround(step[static_cast<std::size_t>(j)] / d)), 0, 63) : 0;
    const int m = dmin > 0.0f ? std::clamp(static_cast<int>(std::lround(offset[static_cast<std::size_t>(j)] / dmin)), 0, 63) : 0;
    f.scale.push_back(sc);
    f.min.push_back(m);
    const float unit = d * static_cast<float>(sc), shift = dmin * static_cast<float>(m);
    for (int l = 0; l < size; ++l) {
      const int i = j * size + l;
      f.q[i] = unit != 0.0f ? std::clamp(static_cast<int>(std::lround((x[i] + shift) / unit)), 0, max_code) : 0;
    }
  }
  return f;
}

// A K-quant matrix [n, k]: its blocks row after row and the value of every element.
struct kquant_matrix {
  kernels::weight_format format = kernels::weight_format::q4_k;
  std::int64_t n = 0, k = 0;
  std::vector<std::uint8_t> bytes;  // [n, k / 256] blocks
  std::vector<float> values;        // [n, k]

  kernels::weight_view view() const { return {.format = format, .values = bytes.data()}; }
  void append(const kquant_fields& f) {
    const auto b = block_bytes(f);
    bytes.insert(bytes.end(), b.begin(), b.end());
    for (int i = 0; i < kq_elements; ++i) values.push_back(element_value(f, i));
  }
};

inline kquant_matrix random_kquant_matrix(kernels::weight_format format, std::int64_t n, std::int64_t k,
                                          std::uint32_t seed, float magnitude = 1.0f) {
  std::mt19937 rng(seed);
  kquant_matrix m{.format = format, .n = n, .k = k, .bytes = {}, .values = {}};
  for (std::int64_t b = 0; b < n * k / kq_elements; ++b) m.append(random_fields(format, rng, magnitude));
  return m;
}

// x [n, k] (k a multiple of 256) quantized block by block.
inline kquant_matrix quantize_kquant_matrix(kernels::weight_format format, const float* x, std::int64_t n,
                                            std::int64_t k) {
  kquant_matrix m{.format = format, .n = n, .k = k, .bytes = {}, .values = {}};
  for (std::int64_t b = 0; b < n * k / kq_elements; ++b) m.append(quantize_fields(format, x + b * kq_elements));
  return m;
}

}  // namespace edge::testing
