// The integer matmul (integer_dot.h): activation quantization and the three code paths.
//
// Every path computes, for output (t, n), Σ_b sw(n, b) · sx(t, b) · D(t, n, b) over blocks b of
// 32 elements (the AVX-512 path over pieces of 16 for INT8: the same scales), where D is the
// integer dot product of the weight codes q and the activation codes. The SIMD paths multiply
// unsigned weight codes (INT4 as its nibbles q + 8; INT8 on AVX-512 as q + 128), so they take
// offset × Σ activation codes back off: the AVX-512 path per piece in int32 (exact), the AVX2
// INT4 path once per output over the groups' scaled sums U(t, g) = Σ_{b in g} sx(t, b) · Σ codes.
// The AVX2 INT8 path multiplies |q| by the activations with q's sign, the generic path signed
// codes. Accumulation runs in lanes of the vector width, then one fixed tree, so it depends only
// on k and the path, never on the batch.
#include "kernels/matmul/integer_dot.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/matmul/cpu_outputs.h"

namespace edge::kernels::cpu {
namespace {

using traits = int8_activation_traits;
constexpr std::int64_t block = traits::block;
// Adding and subtracting 1.5 × 2^23 rounds a float of magnitude below 2^22 to an integer, ties
// to even (in the default rounding mode): the same rounding on every path, without libm.
constexpr float round_bias = 12582912.0f;

// element_at(order, p) for the positions of one span, worked out once.
using span_table = std::array<std::uint16_t, traits::row_multiple>;
constexpr span_table table_of(code_order order) {
  span_table table{};
  for (std::int64_t p = 0; p < traits::row_multiple; ++p) table[static_cast<std::size_t>(p)] = static_cast<std::uint16_t>(element_at(order, p));
  return table;
}
constexpr span_table natural_table = table_of(code_order::natural);
constexpr span_table int4_span_table = table_of(code_order::int4_spans);
constexpr span_table int8_span_table = table_of(code_order::int8_spans);

const span_table& table_for(code_order order) {
  switch (order) {
    case code_order::natural: return natural_table;
    case code_order::int4_spans: return int4_span_table;
    case code_order::int8_spans: return int8_span_table;
  }
  return natural_table;
}

// The scale and the inverse that codes one block, from its amax and whether it holds a NaN.
struct block_scale {
  float scale;
  float inverse;  // 0: every code is 0
};
inline block_scale scale_of(float amax, bool finite) {
  finite = finite && std::isfinite(amax);
  return {.scale = finite ? amax / static_cast<float>(traits::max_code) : std::nanf(""),
          .inverse = finite && amax > 0.0f ? static_cast<float>(traits::max_code) / amax : 0.0f};
}

// One block: `valid` activations (the rest of the 32 codes are 0) → codes; returns the scale.
float quantize_block_generic(const float* x, std::int64_t valid, std::int8_t* codes) {
  float amax = 0.0f;
  bool finite = true;
  for (std::int64_t i = 0; i < valid; ++i) {
    amax = std::max(amax, std::fabs(x[i]));
    finite = finite && !std::isnan(x[i]);
  }
  const block_scale s = scale_of(amax, finite);
  for (std::int64_t i = 0; i < block; ++i) {
    int code = 0;
    if (i < valid && s.inverse != 0.0f) {
      const float rounded = (x[i] * s.inverse + round_bias) - round_bias;
      code = std::clamp(static_cast<int>(rounded), -traits::max_code, traits::max_code);
    }
    codes[i] = static_cast<std::int8_t>(code);
  }
  return s.scale;
}

#if defined(__x86_64__)
#define EDGE_AVX512_QUANTIZE __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))
// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsics as
// uninitialised once they are inlined here (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Sixteen codes: round(v × inverse) by the bias, clamped, narrowed.
EDGE_AVX512_QUANTIZE inline __m128i codes_avx512(__m512 v, __m512 inverse, __m512 bias, __m512 limit) {
  const __m512 rounded = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v, inverse), bias), bias);
  const __m512 clamped = _mm512_min_ps(_mm512_max_ps(rounded, _mm512_sub_ps(_mm512_setzero_ps(), limit)), limit);
  return _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(clamped));
}

// The same operations sixteen at a time, so the same codes and scales bit for bit.
inline __mmask16 first_lanes(std::int64_t count) {
  return static_cast<__mmask16>(count >= 16 ? 0xFFFFu : count > 0 ? (1u << count) - 1u : 0u);
}

EDGE_AVX512_QUANTIZE float quantize_block_avx512(const float* x, std::int64_t valid, std::int8_t* codes) {
  const auto mask_of = first_lanes;
  const __m512 low = _mm512_maskz_loadu_ps(mask_of(valid), x);
  const __m512 high = _mm512_maskz_loadu_ps(mask_of(valid - 16), x + 16);
  const bool has_nan = (_mm512_cmp_ps_mask(low, low, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(high, high, _CMP_UNORD_Q)) != 0;
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(low), _mm512_abs_ps(high)));
  const block_scale s = scale_of(amax, !has_nan);
  if (s.inverse == 0.0f) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes), _mm256_setzero_si256());
    return s.scale;
  }
  const __m512 inverse = _mm512_set1_ps(s.inverse);
  const __m512 bias = _mm512_set1_ps(round_bias);
  const __m512 limit = _mm512_set1_ps(static_cast<float>(traits::max_code));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), codes_avx512(low, inverse, bias, limit));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + 16), codes_avx512(high, inverse, bias, limit));
  return s.scale;
}
#pragma GCC diagnostic pop
#endif

}  // namespace

void quantize_activations(const float* x, std::int64_t tokens, std::int64_t k, std::int64_t x_stride,
                          code_order order, int8_activations& out) {
  const std::int64_t padded = (k + traits::row_multiple - 1) / traits::row_multiple * traits::row_multiple;
  out.tokens = tokens;
  out.k = k;
  out.padded_k = padded;
  out.order = order;
  const auto grow = [](auto& v, std::int64_t size) {
    if (static_cast<std::int64_t>(v.size()) < size) v.resize(static_cast<std::size_t>(size));
  };
  grow(out.codes, tokens * padded);
  grow(out.scales, tokens * (padded / block));
  grow(out.sums16, tokens * (padded / traits::sum_span));
  grow(out.sums32, tokens * (padded / block));
  grow(out.lane_scales, tokens * (padded / traits::lane_span));

  const span_table& table = table_for(order);
  const bool vector = has(isa::avx512);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float* row = x + t * x_stride;
    std::int8_t* codes = out.codes.data() + t * padded;
    float* scales = out.scales.data() + t * (padded / block);
    std::int32_t* sums = out.sums16.data() + t * (padded / traits::sum_span);
    std::int32_t* block_sums = out.sums32.data() + t * (padded / block);
    float* lanes = out.lane_scales.data() + t * (padded / traits::lane_span);
    std::int8_t natural[traits::row_multiple];  // one span in element order
    for (std::int64_t base = 0; base < padded; base += traits::row_multiple) {
      for (std::int64_t b0 = base; b0 < base + traits::row_multiple; b0 += block) {
        const std::int64_t valid = std::clamp<std::int64_t>(k - b0, 0, block);
        std::int8_t* block_codes = natural + (b0 - base);
#if defined(__x86_64__)
        if (vector) {
          scales[b0 / block] = quantize_block_avx512(row + b0, valid, block_codes);
          continue;
        }
#endif
        scales[b0 / block] = quantize_block_generic(row + b0, valid, block_codes);
      }
      for (std::int64_t s = 0; s < traits::row_multiple; s += traits::sum_span) {
        std::int32_t sum = 0;
        for (std::int64_t i = 0; i < traits::sum_span; ++i) sum += natural[s + i];
        sums[(base + s) / traits::sum_span] = sum;
      }
      for (std::int64_t b = base / block; b < (base + traits::row_multiple) / block; ++b) {
        block_sums[b] = sums[2 * b] + sums[2 * b + 1];
      }
      for (std::int64_t p = 0; p < traits::row_multiple; ++p) codes[base + p] = natural[table[static_cast<std::size_t>(p)]];
      for (std::int64_t p = 0; p < traits::row_multiple; p += traits::lane_span) {
        lanes[(base + p) / traits::lane_span] = scales[(base + table[static_cast<std::size_t>(p)]) / block];
      }
    }
  }
}

namespace {

// What the kernels need of one call, prepared once on the calling thread.
struct prepared_call {
  const matmul_params* p = nullptr;
  const int8_activations* x = nullptr;
  const float* group_sums = nullptr;  // [tokens, groups]: U(t, g), of this call's tokens
  std::int64_t first = 0;             // token t of the call is row first + t of the activations
  std::int64_t groups = 0;            // weight scales per row
  std::int64_t group_size = 0;
};



// ---- generic path -----------------------------------------------------------------------------

// Either weight layout (the vector paths read only theirs).
void rows_generic(const prepared_call& c, std::int64_t row_begin, std::int64_t row_end) {
  const matmul_params& p = *c.p;
  const std::int64_t blocks = p.k / block;
  for (std::int64_t n = row_begin; n < row_end; ++n) {
    for (std::int64_t t = 0; t < p.tokens; ++t) {
      const std::int8_t* codes = c.x->codes_of(c.first + t);  // natural order
      const float* x_scales = c.x->scales_of(c.first + t);
      float acc = 0.0f;
      for (std::int64_t b = 0; b < blocks; ++b) {
        std::int32_t dot = 0;
        for (std::int64_t i = b * block; i < (b + 1) * block; ++i) dot += integer_code_at(p.w, p.k, n, i) * codes[i];
        acc = std::fma(static_cast<float>(dot), integer_scale_at(p.w, p.k, n, b * block) * x_scales[b], acc);
      }
      store_output(p, t, n, acc);
    }
  }
}

#if defined(__x86_64__)
// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsics as
// uninitialised once they are inlined here (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// ---- AVX2 path --------------------------------------------------------------------------------

#define EDGE_AVX2 __attribute__((target("avx2,fma,f16c")))

EDGE_AVX2 inline float reduce8(__m256 v) {
  const __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 eighth = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));
  return _mm_cvtss_f32(_mm_add_ss(eighth, _mm_shuffle_ps(eighth, eighth, 1)));
}

// offset · Σ_g sw(n, g) · U(t, g), eight lanes then the tree.
EDGE_AVX2 inline float correction_avx2(const float* w_scales, const float* sums, std::int64_t groups) {
  __m256 acc = _mm256_setzero_ps();
  std::int64_t g = 0;
  for (; g + 8 <= groups; g += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(w_scales + g), _mm256_loadu_ps(sums + g), acc);
  float rest = 0.0f;
  for (; g < groups; ++g) rest += w_scales[g] * sums[g];
  return reduce8(acc) + rest;
}

// R rows × T tokens. A block's 32 weight codes meet the token's 32 activation codes in one
// vpmaddubsw (unsigned × signed byte pairs into int16) and one vpmaddwd (pairs into int32).
template <weight_format F, int R, int T>
EDGE_AVX2 void tile_avx2(const prepared_call& c, std::int64_t n0, std::int64_t t0) {
  const matmul_params& p = *c.p;
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  const auto* values = static_cast<const std::uint8_t*>(p.w.values);
  const std::int64_t row_bytes = F == weight_format::int4 ? int4_row_bytes(p.k) : p.k;
  const __m128i nibble = _mm_set1_epi8(int4_traits::nibble_mask);
  const __m256i ones = _mm256_set1_epi16(1);
  const std::int64_t blocks = p.k / block;
  for (std::int64_t b = 0; b < blocks; ++b) {
    __m256i w[R];
    float w_scale[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* row = values + (n0 + r) * row_bytes;
      if constexpr (F == weight_format::int4) {
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + b * int4_traits::chunk_bytes));
        w[r] = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(bytes, int4_traits::nibble_bits), nibble),
                                _mm_and_si128(bytes, nibble));
      } else {
        w[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + b * block));
      }
      w_scale[r] = p.w.scales[(n0 + r) * c.groups + b * block / c.group_size];
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c.x->codes_of(c.first + t0 + t) + b * block));
      const float x_scale = c.x->scales_of(c.first + t0 + t)[b];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m256i pairs;
        if constexpr (F == weight_format::int4) {
          pairs = _mm256_maddubs_epi16(w[r], x);
        } else {
          // |w| × (x with w's sign): unsigned × signed, and |w| ≤ 128 keeps the pair sums in int16.
          pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w[r]), _mm256_sign_epi8(x, w[r]));
        }
        const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, ones));
        acc[r][t] = _mm256_fmadd_ps(dot, _mm256_set1_ps(w_scale[r] * x_scale), acc[r][t]);
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    for (int r = 0; r < R; ++r) {
      float dot = reduce8(acc[r][t]);
      if constexpr (F == weight_format::int4) {
        dot -= static_cast<float>(int4_traits::code_offset) *
               correction_avx2(p.w.scales + (n0 + r) * c.groups, c.group_sums + (t0 + t) * c.groups, c.groups);
      }
      store_output(p, t0 + t, n0 + r, dot);
    }
  }
}

// ---- AVX-512 VNNI path ------------------------------------------------------------------------

#define EDGE_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma")))



// A span: 256 weight bytes of a row, as 16 pieces of 16 bytes (INT4: a chunk of 32 elements;
// INT8: 16 elements). Turned so that out[u], lane j, is dword u of piece j: a lane then meets
// the same piece, one scale, in every step. Bytes from `valid` on read as zero.
EDGE_VNNI inline void load_span(const std::uint8_t* bytes, std::int64_t valid, __m512i (&out)[4]) {
  __m512i a[4];
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const std::int64_t left = valid - 64 * q;
    a[q] = left >= 64 ? _mm512_loadu_si512(bytes + 64 * q)
                      : _mm512_maskz_loadu_epi8(left > 0 ? ~0ull >> (64 - left) : 0ull, bytes + 64 * q);
  }
  // a[q] lane 4c + u is dword u of piece 4q + c. First, pieces 0-7 (a0, a1) and 8-15 (a2, a3):
  // dwords 0 and 1 of eight pieces as [u = 0: pieces | u = 1: pieces], then dwords 2 and 3.
  const __m512i low_dwords = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const __m512i high_dwords = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
  const __m512i b0 = _mm512_permutex2var_epi32(a[0], low_dwords, a[1]);
  const __m512i b1 = _mm512_permutex2var_epi32(a[0], high_dwords, a[1]);
  const __m512i b2 = _mm512_permutex2var_epi32(a[2], low_dwords, a[3]);
  const __m512i b3 = _mm512_permutex2var_epi32(a[2], high_dwords, a[3]);
  // Then the halves side by side: pieces 0-7 and 8-15 of one dword.
  constexpr int lower_halves = 0x44, upper_halves = 0xEE;
  out[0] = _mm512_shuffle_i64x2(b0, b2, lower_halves);
  out[1] = _mm512_shuffle_i64x2(b0, b2, upper_halves);
  out[2] = _mm512_shuffle_i64x2(b1, b3, lower_halves);
  out[3] = _mm512_shuffle_i64x2(b1, b3, upper_halves);
}

// R rows × T tokens, a span at a time (INT4: 512 elements, 8 steps; INT8: 256, 4 steps). Each
// step is one vpdpbusd per row and token, unsigned weight codes (INT4: q + 8; INT8: q + 128)
// times signed activation codes; lane j accumulates piece j's products in int32 over the whole
// span, so the scales, the code-offset correction (offset × Σ activation codes, exact in int32)
// and the conversion to float come once per span.
template <weight_format F, int R, int T>
EDGE_VNNI void tile_vnni(const prepared_call& c, std::int64_t n0, std::int64_t t0) {
  const matmul_params& p = *c.p;
  constexpr bool int4 = F == weight_format::int4;
  constexpr std::int64_t span_bytes = 256;
  constexpr std::int64_t span_elements = int4 ? 512 : 256;
  constexpr std::int64_t piece_elements = span_elements / 16;
  constexpr int steps = int4 ? 8 : 4;
  constexpr int offset_shift = int4 ? 3 : 7;  // × 8, × 128
  __m512 acc[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const auto* values = static_cast<const std::uint8_t*>(p.w.values);
  const std::int64_t row_bytes = int4 ? int4_row_bytes(p.k) : p.k;
  const __m512i nibble = _mm512_set1_epi8(int4_traits::nibble_mask);
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  // Lane j's weight scale: scale (first element of piece j) / group_size, from the span's first.
  const int scale_shift = __builtin_ctzll(static_cast<unsigned long long>(std::min(c.group_size, span_elements) / piece_elements));
  const __m512i lane_group = _mm512_srlv_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                               _mm512_set1_epi32(scale_shift));
  const std::int64_t scales_per_span = std::max<std::int64_t>(1, span_elements / c.group_size);
  constexpr std::int64_t scale_prefetch_spans = prefetch_distance / span_bytes;
  const std::int64_t spans = (p.k + span_elements - 1) / span_elements;
  for (std::int64_t s = 0; s < spans; ++s) {
    const std::int64_t at = s * span_bytes;
    const std::int64_t first_group = s * span_elements / c.group_size;
    const std::int64_t scale_count = std::min(scales_per_span, c.groups - first_group);
    const auto scale_mask = static_cast<__mmask16>((1u << scale_count) - 1u);
    __m512i offsets[T];
    __m512 x_scale[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const std::int32_t* sums = int4 ? c.x->sums32_of(c.first + t0 + t) : c.x->sums16_of(c.first + t0 + t);
      offsets[t] = _mm512_slli_epi32(_mm512_loadu_si512(sums + 16 * s), offset_shift);
      x_scale[t] = _mm512_loadu_ps(c.x->lane_scales_of(c.first + t0 + t) + s * span_elements / traits::lane_span);
    }
#pragma GCC unroll 4
    for (std::int64_t line = 0; line < span_bytes; line += 64) prefetch_rows<R>(values, row_bytes, n0, at + line);
    // The scales are a stream of their own per row (a cache line per span at groups of 32),
    // which the hardware prefetchers do not follow among this many rows.
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(p.w.scales + (n0 + r) * c.groups + first_group +
                                                 scale_prefetch_spans * scales_per_span),
                   _MM_HINT_T0);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      __m512i v[4];
      load_span(values + (n0 + r) * row_bytes + at, row_bytes - at, v);
      __m512i w[steps];
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        if constexpr (int4) {
          w[2 * u] = _mm512_and_si512(v[u], nibble);
          w[2 * u + 1] = _mm512_and_si512(_mm512_srli_epi16(v[u], int4_traits::nibble_bits), nibble);
        } else {
          w[u] = _mm512_xor_si512(v[u], flip);
        }
      }
      const __m512 w_scale = _mm512_permutexvar_ps(
          lane_group, _mm512_maskz_loadu_ps(scale_mask, p.w.scales + (n0 + r) * c.groups + first_group));
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const std::int8_t* x = c.x->codes_of(c.first + t0 + t) + s * span_elements;
        __m512i dot = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int step = 0; step < steps; ++step) dot = _mm512_dpbusd_epi32(dot, w[step], _mm512_loadu_si512(x + 64 * step));
        const __m512 value = _mm512_cvtepi32_ps(_mm512_sub_epi32(dot, offsets[t]));
        acc[r][t] = _mm512_fmadd_ps(value, _mm512_mul_ps(w_scale, x_scale[t]), acc[r][t]);
      }
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) store_output(p, t0 + t, n0 + r, reduce16(acc[r][t]));
  }
}

// CPU row tiles (weight_format.h): TILES tiles of 16 rows × T tokens, lane r of every vector
// being row r of its tile. Per block of 32 elements and token, each 4-code word of the token
// is broadcast and multiplied with a word of all 16 rows at once (vpdpbusd: unsigned weight
// codes, INT4 q + 8 and INT8 q + 128, times signed activation codes); the block's int32 dot,
// less offset × Σ activation codes (exact), is converted once and added as
// fma(dot, weight scale × activation scale, acc): per row and token the blocks in order, the
// portable path's arithmetic (rows_generic), whatever TILES and T. The activations are in
// natural order. Rows past n (the last tile's padding) are computed and not stored.
template <weight_format F, int TILES, int T>
EDGE_VNNI void tiles_vnni(const prepared_call& c, std::int64_t tile0, std::int64_t t0) {
  const matmul_params& p = *c.p;
  constexpr bool int4 = F == weight_format::int4;
  constexpr std::int64_t block_bytes = cpu_tiles::block_bytes(F);
  constexpr int offset = int4 ? int4_traits::code_offset : cpu_tiles::int8_offset;
  // A lone token's block is one chain of dependent vpdpbusd per tile: two halves shorten it.
  constexpr int chains = T == 1 ? 2 : 1;
  const std::int64_t blocks = p.k / block;
  const std::int64_t blocks_per_group = c.group_size / block;
  const auto* values = static_cast<const std::uint8_t*>(p.w.values);
  const __m512i nibble = _mm512_set1_epi8(int4_traits::nibble_mask);
  const std::int8_t* x[T];
  const float* x_scales[T];
  const std::int32_t* x_sums[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    x[t] = c.x->codes_of(c.first + t0 + t);
    x_scales[t] = c.x->scales_of(c.first + t0 + t);
    x_sums[t] = c.x->sums32_of(c.first + t0 + t);
  }
  __m512 acc[TILES][T];
#pragma GCC unroll 8
  for (int i = 0; i < TILES; ++i) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_ps();
  }
  for (std::int64_t g = 0; g < c.groups; ++g) {
    __m512 w_scale[TILES];
#pragma GCC unroll 8
    for (int i = 0; i < TILES; ++i) w_scale[i] = _mm512_loadu_ps(p.w.scales + ((tile0 + i) * c.groups + g) * cpu_tiles::rows);
    for (std::int64_t b = g * blocks_per_group; b < (g + 1) * blocks_per_group; ++b) {
      const std::uint8_t* w[TILES];
#pragma GCC unroll 8
      for (int i = 0; i < TILES; ++i) {
        w[i] = values + ((tile0 + i) * blocks + b) * block_bytes;
#pragma GCC unroll 8
        for (std::int64_t line = 0; line < block_bytes; line += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(w[i] + tile_prefetch_distance + line), _MM_HINT_T0);
        }
      }
      __m512i dot[chains][TILES][T];
#pragma GCC unroll 2
      for (int h = 0; h < chains; ++h) {
#pragma GCC unroll 8
        for (int i = 0; i < TILES; ++i) {
#pragma GCC unroll 8
          for (int t = 0; t < T; ++t) dot[h][i][t] = _mm512_setzero_si512();
        }
      }
      const std::int64_t at = b * block;
#pragma GCC unroll 8
      for (int v = 0; v < (int4 ? 4 : 8); ++v) {
        const int h = chains == 1 ? 0 : v % 2;
#pragma GCC unroll 8
        for (int i = 0; i < TILES; ++i) {
          const __m512i raw = _mm512_loadu_si512(w[i] + 64 * v);
          if constexpr (int4) {
            const __m512i low = _mm512_and_si512(raw, nibble);
            const __m512i high = _mm512_and_si512(_mm512_srli_epi16(raw, int4_traits::nibble_bits), nibble);
#pragma GCC unroll 8
            for (int t = 0; t < T; ++t) {
              std::int32_t first_word, second_word;
              std::memcpy(&first_word, x[t] + at + 8 * v, sizeof first_word);
              std::memcpy(&second_word, x[t] + at + 8 * v + 4, sizeof second_word);
              dot[h][i][t] = _mm512_dpbusd_epi32(dot[h][i][t], low, _mm512_set1_epi32(first_word));
              dot[h][i][t] = _mm512_dpbusd_epi32(dot[h][i][t], high, _mm512_set1_epi32(second_word));
            }
          } else {
#pragma GCC unroll 8
            for (int t = 0; t < T; ++t) {
              std::int32_t word;
              std::memcpy(&word, x[t] + at + 4 * v, sizeof word);
              dot[h][i][t] = _mm512_dpbusd_epi32(dot[h][i][t], raw, _mm512_set1_epi32(word));
            }
          }
        }
      }
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        const __m512i correction = _mm512_set1_epi32(offset * x_sums[t][b]);
        const __m512 x_scale = _mm512_set1_ps(x_scales[t][b]);
#pragma GCC unroll 8
        for (int i = 0; i < TILES; ++i) {
          __m512i sum = dot[0][i][t];
          if constexpr (chains == 2) sum = _mm512_add_epi32(sum, dot[1][i][t]);
          const __m512 value = _mm512_cvtepi32_ps(_mm512_sub_epi32(sum, correction));
          acc[i][t] = _mm512_fmadd_ps(value, _mm512_mul_ps(w_scale[i], x_scale), acc[i][t]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < TILES; ++i) {
    const std::int64_t row0 = (tile0 + i) * cpu_tiles::rows;
    if (row0 >= p.n) break;
    const std::int64_t valid = std::min<std::int64_t>(cpu_tiles::rows, p.n - row0);
    const auto mask = static_cast<__mmask16>((1u << valid) - 1u);
    const __m512 bias = p.bias != nullptr ? _mm512_maskz_loadu_ps(mask, p.bias + row0) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      float* y = p.y + (t0 + t) * p.y_stride + row0;
      __m512 value = p.bias != nullptr ? _mm512_add_ps(acc[i][t], bias) : acc[i][t];
      if (p.accumulate) value = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), value);
      _mm512_mask_storeu_ps(y, mask, value);
    }
  }
}
#pragma GCC diagnostic pop
#endif

// Calls tile.template operator()<R, T>(n0, t0) over rows [row_begin, row_end) and every token,
// token tiles outermost so that the rows stay in cache while each token tile passes over them.
// A lone token takes DECODE_ROWS rows at a time; otherwise ROWS rows meet up to four tokens.
template <int DECODE_ROWS, int ROWS, class Tile>
void over_tiles(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end, const Tile& tile) {
  constexpr std::int64_t max_tokens = 4;
  for (std::int64_t t0 = 0; t0 < p.tokens; t0 += max_tokens) {
    const auto run = [&]<int R, int T>() {
      std::int64_t n = row_begin;
      for (; n + R <= row_end; n += R) tile.template operator()<R, T>(n, t0);
      for (; n < row_end; ++n) tile.template operator()<1, T>(n, t0);
    };
    switch (std::min(max_tokens, p.tokens - t0)) {
      case 1: run.template operator()<DECODE_ROWS, 1>(); break;
      case 2: run.template operator()<ROWS, 2>(); break;
      case 3: run.template operator()<ROWS, 3>(); break;
      default: run.template operator()<ROWS, 4>(); break;
    }
  }
}

// Tile shapes: up to 16 accumulators with a row's 8 unpacked weight vectors of AVX-512's 32
// registers; AVX2 has 16. A lone token takes four rows at a time, like a batch: on a model's
// matrices (rows of 1-4 KiB) more rows in flight measured slower (10 against 20 tokens/s on one
// core at 16 rows), the interleaved streams defeating the hardware prefetchers.
constexpr int vnni_decode_rows = 4;
constexpr int vnni_rows = 4;
// CPU row tiles: 2 tiles at a time (32 rows: two streams, and two independent vpdpbusd chains
// per token besides those of a lone token's halves), up to 4 tokens.
constexpr int tiles_decode = 2;
constexpr int tiles_batch = 2;
constexpr int tiles_tokens = 4;
constexpr int avx2_decode_rows = 4;
constexpr int avx2_rows = 2;

// Rows [row_begin, row_end) of CPU row tiles (row_begin a multiple of the tile), as tiles of
// 16: DECODE_TILES at a time for a lone token, TILES for up to MAX_TOKENS.
template <int DECODE_TILES, int TILES, int MAX_TOKENS, class Tile>
void over_row_tiles(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end, const Tile& tile) {
  const std::int64_t first = row_begin / cpu_tiles::rows;
  const std::int64_t end = cpu_tiles::tiles(row_end);
  for (std::int64_t t0 = 0; t0 < p.tokens; t0 += MAX_TOKENS) {
    const auto run = [&]<int N, int T>() {
      std::int64_t i = first;
      for (; i + N <= end; i += N) tile.template operator()<N, T>(i, t0);
      for (; i < end; ++i) tile.template operator()<1, T>(i, t0);
    };
    switch (std::min<std::int64_t>(MAX_TOKENS, p.tokens - t0)) {
      case 1: run.template operator()<DECODE_TILES, 1>(); break;
      case 2: run.template operator()<TILES, 2>(); break;
      case 3: run.template operator()<TILES, 3>(); break;
      default: run.template operator()<TILES, 4>(); break;
    }
  }
}

}  // namespace

code_order integer_matmul::activation_order(isa level, const weight_view& w) {
  if (path_for(level) != isa::avx512_vnni || w.layout == weight_layout::cpu_tiles) return code_order::natural;
  const weight_format format = w.format;
  return format == weight_format::int4 ? code_order::int4_spans : code_order::int8_spans;
}

isa integer_matmul::path_for(isa level) {
  return level >= isa::avx512_vnni ? isa::avx512_vnni : level >= isa::avx2 ? isa::avx2 : isa::generic;
}

integer_matmul::integer_matmul(const matmul_params& p, isa level, int8_activations& x, std::vector<float>& group_sums)
    : p_(p), x_(x) {
  quantize_activations(p.x, p.tokens, p.k, p.x_stride, activation_order(level, p.w), x);
  prepare(level, 0, group_sums);
}

integer_matmul::integer_matmul(const matmul_params& p, isa level, const int8_activations& x, std::int64_t first_token,
                               std::vector<float>& group_sums)
    : p_(p), x_(x) {
  prepare(level, first_token, group_sums);
}

void integer_matmul::prepare(isa level, std::int64_t first_token, std::vector<float>& group_sums) {
  const matmul_params& p = p_;
  path_ = path_for(level);
  first_ = first_token;
  group_size_ = p.w.format == weight_format::int8 ? int8_traits::group_size : p.w.group_size;
  groups_ = p.k / group_size_;
  if (path_ != isa::avx2 || p.w.format != weight_format::int4) return;
  // U(t, g) for the AVX2 INT4 kernel, which multiplies shifted codes and corrects at the end.
  if (static_cast<std::int64_t>(group_sums.size()) < p.tokens * groups_) {
    group_sums.resize(static_cast<std::size_t>(p.tokens * groups_));
  }
  const std::int64_t blocks_per_group = group_size_ / block;
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    const float* scales = x_.scales_of(first_ + t);
    const std::int32_t* sums = x_.sums16_of(first_ + t);
    for (std::int64_t g = 0; g < groups_; ++g) {
      float u = 0.0f;
      for (std::int64_t b = g * blocks_per_group; b < (g + 1) * blocks_per_group; ++b) {
        u += scales[b] * static_cast<float>(sums[2 * b] + sums[2 * b + 1]);
      }
      group_sums[static_cast<std::size_t>(t * groups_ + g)] = u;
    }
  }
  group_sums_ = group_sums.data();
}

void integer_matmul::rows(std::int64_t row_begin, std::int64_t row_end) const {
  const prepared_call c{.p = &p_, .x = &x_, .group_sums = group_sums_, .first = first_, .groups = groups_,
                        .group_size = group_size_};
  const bool tiled = p_.w.layout == weight_layout::cpu_tiles;
  const auto dispatch = [&]<weight_format F>() {
#if defined(__x86_64__)
    if (path_ == isa::avx512_vnni && tiled) {
      over_row_tiles<tiles_decode, tiles_batch, tiles_tokens>(
          p_, row_begin, row_end,
          [&]<int N, int T>(std::int64_t tile0, std::int64_t t0) { tiles_vnni<F, N, T>(c, tile0, t0); });
      return;
    }
    if (tiled) {
      // The AVX2 kernel reads the row layout only.
      rows_generic(c, row_begin, row_end);
      return;
    }
    if (path_ == isa::avx512_vnni) {
      over_tiles<vnni_decode_rows, vnni_rows>(p_, row_begin, row_end, [&]<int R, int T>(std::int64_t n0, std::int64_t t0) {
        tile_vnni<F, R, T>(c, n0, t0);
      });
      return;
    }
    if (path_ == isa::avx2) {
      over_tiles<avx2_decode_rows, avx2_rows>(p_, row_begin, row_end, [&]<int R, int T>(std::int64_t n0, std::int64_t t0) {
        tile_avx2<F, R, T>(c, n0, t0);
      });
      return;
    }
#endif
    rows_generic(c, row_begin, row_end);
  };
  if (p_.w.format == weight_format::int4) {
    dispatch.template operator()<weight_format::int4>();
  } else {
    dispatch.template operator()<weight_format::int8>();
  }
}

}  // namespace edge::kernels::cpu
