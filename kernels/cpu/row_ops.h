// Dot products and scaled adds over one cache row of any KV dtype, per CPU code path: what the
// CPU attention kernels (paged_attention, mla_attention) read the cache with. `Ops::dot<KV>(q,
// base, index, n)` is q · row and `Ops::add_scaled<KV>(acc, w, base, index, n)` is acc += w ·
// row, over the n elements of `base` from `index` on. FP8 codes are decoded to Ops::fp8_unit
// times their value; a caller multiplies the row's scale by fp8_unit once per row to undo it.
#pragma once

#include <immintrin.h>

#include <array>
#include <cstdint>

#include "edge/kernels/dtype.h"
#include "edge/kernels/numerics.h"
#include "kernels/cpu/load.h"

namespace edge::kernels::cpu::rows {

// Every E4M3 code's value: the portable path looks codes up instead of decoding bit fields.
inline constexpr std::array<float, 256> fp8_values = [] {
  std::array<float, 256> table{};
  for (std::size_t code = 0; code < table.size(); ++code) table[code] = fp8_e4m3_to_float(static_cast<std::uint8_t>(code));
  return table;
}();

template <dtype KV>
inline float load_generic(const void* base, std::int64_t index) {
  if constexpr (KV == dtype::fp8_e4m3) {
    return fp8_values[static_cast<const std::uint8_t*>(base)[index]];
  } else {
    return load_as_float<KV>(base, index);
  }
}

template <dtype KV>
inline float dot_generic(const float* q, const void* k_base, std::int64_t k_index, std::int64_t n) {
  float sum = 0.0f;
  for (std::int64_t d = 0; d < n; ++d) sum += q[d] * load_generic<KV>(k_base, k_index + d);
  return sum;
}

template <dtype KV>
inline void add_scaled_generic(float* acc, float weight, const void* v_base, std::int64_t v_index, std::int64_t n) {
  for (std::int64_t d = 0; d < n; ++d) acc[d] += weight * load_generic<KV>(v_base, v_index + d);
}

#if defined(__x86_64__)
#define EDGE_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c")))
// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsics as
// uninitialised once they are inlined here (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// An E4M3 code moved into FP16's bit fields (magnitude shifted up by the difference in
// mantissa width, sign to FP16's sign bit) is an FP16 of the same mantissa whose exponent is
// read with bias 15 instead of 7: exactly 2^-8 times the E4M3 value, subnormals included. The
// hardware's FP16 conversion then widens 16 codes at once; avx512_ops::fp8_unit is the 2^8.
inline constexpr int fp8_to_fp16_shift = fp16_traits::mantissa_bits - fp8_e4m3_traits::mantissa_bits;
inline constexpr int fp8_to_fp16_sign_shift = 8;  // bit 7 of the byte to bit 15 of the half
inline constexpr float fp8_via_fp16_unit =
    static_cast<float>(1 << (fp16_traits::exponent_bias - fp8_e4m3_traits::exponent_bias));

template <dtype KV>
EDGE_AVX512 inline __m512 load16(const void* base, std::int64_t index, __mmask16 mask) {
  if constexpr (KV == dtype::f32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + index);
  } else if constexpr (KV == dtype::bf16) {
    const __m256i raw = _mm256_maskz_loadu_epi16(mask, static_cast<const std::uint16_t*>(base) + index);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  } else if constexpr (KV == dtype::fp8_e4m3) {
    const __m256i code =
        _mm256_cvtepu8_epi16(_mm_maskz_loadu_epi8(mask, static_cast<const std::uint8_t*>(base) + index));
    const __m256i magnitude = _mm256_and_si256(code, _mm256_set1_epi16(fp8_e4m3_traits::abs_mask));
    const __m256i sign = _mm256_and_si256(code, _mm256_set1_epi16(fp8_e4m3_traits::sign_mask));
    __m256i half = _mm256_or_si256(_mm256_slli_epi16(magnitude, fp8_to_fp16_shift),
                                   _mm256_slli_epi16(sign, fp8_to_fp16_sign_shift));
    // E4M3's NaN code would land on a finite FP16; make it FP16's NaN.
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(magnitude, _mm256_set1_epi16(fp8_e4m3_traits::nan_code));
    half = _mm256_mask_mov_epi16(half, nan, _mm256_set1_epi16(static_cast<short>(fp16_traits::nan_code)));
    return _mm512_cvtph_ps(half);
  } else {
    const __m256i raw = _mm256_maskz_loadu_epi16(mask, static_cast<const std::uint16_t*>(base) + index);
    return _mm512_cvtph_ps(raw);
  }
}

EDGE_AVX512 inline __mmask16 tail_mask(std::int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
}

template <dtype KV>
EDGE_AVX512 inline float dot_avx512(const float* q, const void* k_base, std::int64_t k_index, std::int64_t n) {
  __m512 sum = _mm512_setzero_ps();
  for (std::int64_t d = 0; d < n; d += 16) {
    const __mmask16 mask = tail_mask(n - d);
    sum = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q + d), load16<KV>(k_base, k_index + d, mask), sum);
  }
  return _mm512_reduce_add_ps(sum);
}

template <dtype KV>
EDGE_AVX512 inline void add_scaled_avx512(float* acc, float weight, const void* v_base, std::int64_t v_index,
                                   std::int64_t n) {
  const __m512 w = _mm512_set1_ps(weight);
  for (std::int64_t d = 0; d < n; d += 16) {
    const __mmask16 mask = tail_mask(n - d);
    const __m512 updated =
        _mm512_fmadd_ps(w, load16<KV>(v_base, v_index + d, mask), _mm512_maskz_loadu_ps(mask, acc + d));
    _mm512_mask_storeu_ps(acc + d, mask, updated);
  }
}
#pragma GCC diagnostic pop
#endif

struct generic_ops {
  static constexpr float fp8_unit = 1.0f;
  template <dtype KV>
  static float dot(const float* q, const void* k, std::int64_t i, std::int64_t n) { return dot_generic<KV>(q, k, i, n); }
  template <dtype KV>
  static void add_scaled(float* acc, float w, const void* v, std::int64_t i, std::int64_t n) {
    add_scaled_generic<KV>(acc, w, v, i, n);
  }
};

#if defined(__x86_64__)
struct avx512_ops {
  static constexpr float fp8_unit = fp8_via_fp16_unit;
  template <dtype KV>
  EDGE_AVX512 static float dot(const float* q, const void* k, std::int64_t i, std::int64_t n) {
    return dot_avx512<KV>(q, k, i, n);
  }
  template <dtype KV>
  EDGE_AVX512 static void add_scaled(float* acc, float w, const void* v, std::int64_t i, std::int64_t n) {
    add_scaled_avx512<KV>(acc, w, v, i, n);
  }
};
#endif

}  // namespace edge::kernels::cpu::rows
