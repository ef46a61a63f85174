// What every CPU matmul path does with a finished dot product, and the fixed tree that adds a
// vector's lanes, shared by the float, integer and bf16 kernels.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "kernels/matmul/matmul.h"

namespace edge::kernels::cpu {

// One output element from its dot product: the bias, the residual.
inline void store_output(const matmul_params& p, std::int64_t t, std::int64_t n, float dot) {
  float value = dot;
  if (p.bias != nullptr) value += p.bias[n];
  float& out = p.y[t * p.y_stride + n];
  out = p.accumulate ? out + value : value;
}

#if defined(__x86_64__)
// Adds 16 lanes pairwise: 8 + 8, 4 + 4, 2 + 2, 1 + 1 (the portable paths' tree).
__attribute__((target("avx512f,avx512dq"), always_inline)) inline float reduce16(__m512 v) {
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
  const __m128 eighth = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));
  return _mm_cvtss_f32(_mm_add_ss(eighth, _mm_shuffle_ps(eighth, eighth, 1)));
}
#endif

}  // namespace edge::kernels::cpu
