// The K-quant matmul (kquant_cpu.h): the portable integer path, the float reference and the
// AVX-512 VNNI tiles.
#include "kernels/matmul/kquant_cpu.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/prefetch.h"
#include "kernels/matmul/cpu_outputs.h"

namespace edge::kernels::cpu {
namespace {

using activation_traits = int8_activation_traits;
constexpr std::int64_t block_elements = kquant_traits::block_elements;
constexpr std::int64_t spans_per_block = block_elements / activation_traits::sum_span;

const std::uint8_t* row_blocks(const matmul_params& p, std::int64_t n) {
  return static_cast<const std::uint8_t*>(p.w.values) + weight_values_bytes(p.w.format, n, p.k);
}

// ---- portable path ----------------------------------------------------------------------------

template <weight_format F>
float dot_generic(const std::uint8_t* row, std::int64_t k, const std::int8_t* codes, const float* scales,
                  const std::int32_t* sums) {
  constexpr std::int64_t bytes = kquant_block_bytes(F);
  float acc = 0.0f;
  for (std::int64_t b = 0; b < k / block_elements; ++b) {
    const std::uint8_t* block = row + b * bytes;
    const std::int8_t* c = codes + b * block_elements;
    const float* s = scales + b * (block_elements / activation_traits::block);
    const std::int32_t* sum = sums + b * spans_per_block;
    if constexpr (F == weight_format::q6_k) {
      const float d = kquant_half(block + kquant_traits::q6_k_d_at);
      for (int j = 0; j < kquant_traits::q6_k_sub_blocks; ++j) {
        std::int32_t dot = 0;
        for (int l = 0; l < kquant_traits::q6_k_sub_block; ++l) {
          const int i = j * kquant_traits::q6_k_sub_block + l;
          dot += q6_k_code(block, i) * c[i];
        }
        dot -= kquant_traits::q6_k_offset * sum[j];
        const float scale = d * static_cast<float>(q6_k_scale(block, j));
        acc += scale * s[j * kquant_traits::q6_k_sub_block / activation_traits::block] * static_cast<float>(dot);
      }
    } else {
      const float d = kquant_half(block);
      const float dmin = kquant_half(block + kquant_traits::dmin_at);
      constexpr int spans_per_sub_block = kquant_traits::q4_k_sub_block / activation_traits::sum_span;
      for (int j = 0; j < kquant_traits::q4_k_sub_blocks; ++j) {
        std::int32_t dot = 0;
        for (int l = 0; l < kquant_traits::q4_k_sub_block; ++l) {
          const int i = j * kquant_traits::q4_k_sub_block + l;
          dot += (F == weight_format::q4_k ? q4_k_code(block, i) : q5_k_code(block, i)) * c[i];
        }
        std::int32_t code_sum = 0;
        for (int h = 0; h < spans_per_sub_block; ++h) code_sum += sum[j * spans_per_sub_block + h];
        const kquant_scale_min sm = q4_k_scale_min(block, j);
        const float scale = d * static_cast<float>(sm.scale);
        const float min = dmin * static_cast<float>(sm.min);
        acc += scale * s[j] * static_cast<float>(dot) - min * (s[j] * static_cast<float>(code_sum));
      }
    }
  }
  return acc;
}

template <weight_format F>
void rows_generic(const matmul_params& p, const int8_activations& x, std::int64_t row_begin, std::int64_t row_end) {
  for (std::int64_t n = row_begin; n < row_end; ++n) {
    const std::uint8_t* row = row_blocks(p, n);
    for (std::int64_t t = 0; t < p.tokens; ++t) {
      store_output(p, t, n, dot_generic<F>(row, p.k, x.codes_of(t), x.scales_of(t), x.sums16_of(t)));
    }
  }
}

// The float reference: each block decoded exactly, lane j of 16 taking the elements k ≡ j mod 16
// in increasing k, added in the f32 matmul's tree.
template <weight_format F>
void rows_exact(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end) {
  constexpr std::int64_t lanes = 16;
  constexpr std::int64_t bytes = kquant_block_bytes(F);
  float decoded[block_elements];
  for (std::int64_t n = row_begin; n < row_end; ++n) {
    const std::uint8_t* row = row_blocks(p, n);
    for (std::int64_t t = 0; t < p.tokens; ++t) {
      const float* x = p.x + t * p.x_stride;
      float partial[lanes] = {};
      for (std::int64_t b = 0; b < p.k / block_elements; ++b) {
        kquant_dequantize_block(F, row + b * bytes, decoded);
        for (std::int64_t i = 0; i < block_elements; ++i) partial[i % lanes] += decoded[i] * x[b * block_elements + i];
      }
      for (std::int64_t width = lanes / 2; width > 0; width /= 2) {
        for (std::int64_t j = 0; j < width; ++j) partial[j] += partial[j + width];
      }
      store_output(p, t, n, partial[0]);
    }
  }
}

// ---- AVX-512 VNNI path ------------------------------------------------------------------------

#if defined(__x86_64__)
#define EDGE_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma,f16c")))
#define EDGE_VNNI_INLINE __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma,f16c"), always_inline))
// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsics as
// uninitialised once they are inlined here (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

constexpr std::int64_t quarter = 64;  // codes per 512-bit register
constexpr int quarters = static_cast<int>(block_elements / quarter);
constexpr std::int64_t cache_line = 64;

// A row's super-block, unpacked for every token of a tile.
struct unpacked_block {
  __m512i codes[quarters];  // the 256 codes in element order (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63)
  __m512 scale;             // lane i: the weight scale of the 16 elements from 16 i (d·sc)
  __m512 offset;            // lane i: what multiplies span i's scaled code sum (−dmin·m, or −32·d·sc)
};

// Two 256-bit halves as one 512-bit register, `low` first.
EDGE_VNNI_INLINE inline __m512i join(__m256i low, __m256i high) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}

template <weight_format F>
EDGE_VNNI_INLINE inline void unpack(const std::uint8_t* block, unpacked_block& out) {
  const __m256i low_nibble = _mm256_set1_epi8(0x0F);
  if constexpr (F == weight_format::q6_k) {
    const float d = kquant_half(block + kquant_traits::q6_k_d_at);
    const __m128i scales = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + kquant_traits::q6_k_scales_at));
    out.scale = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(scales)), _mm512_set1_ps(d));
    out.offset = _mm512_mul_ps(out.scale, _mm512_set1_ps(-static_cast<float>(kquant_traits::q6_k_offset)));
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const __m512i two_bits = _mm512_set1_epi8(0x03);
    // 16-bit lanes 0..15 (the first 32 bytes) shift by the first count, 16..31 by the second.
    const __m512i shift_01 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1);
    const __m512i shift_23 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(6), 1);
    for (int half = 0; half < 2; ++half) {
      const __m512i ql = _mm512_loadu_si512(block + half * quarter);
      const __m256i qh = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(block + kquant_traits::q6_k_qh_at + half * (quarter / 2)));
      const __m512i qh2 = join(qh, qh);
      const __m512i high_01 = _mm512_and_si512(_mm512_srlv_epi16(qh2, shift_01), two_bits);
      const __m512i high_23 = _mm512_and_si512(_mm512_srlv_epi16(qh2, shift_23), two_bits);
      out.codes[2 * half] = _mm512_or_si512(_mm512_and_si512(ql, nibble), _mm512_slli_epi16(high_01, 4));
      out.codes[2 * half + 1] =
          _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), nibble), _mm512_slli_epi16(high_23, 4));
    }
  } else {
    const float d = kquant_half(block);
    const float dmin = kquant_half(block + kquant_traits::dmin_at);
    // The 12 bytes of 6-bit scales and mins as [sc_0..sc_7, m_0..m_7] (weight_format.h's rule,
    // four bytes at a time).
    std::uint32_t packed[3];
    std::memcpy(packed, block + kquant_traits::scales_at, sizeof(packed));
    constexpr std::uint32_t six = 0x3F3F3F3F, four = 0x0F0F0F0F, two = 0x03030303;
    const std::uint32_t unpacked[4] = {packed[0] & six, (packed[2] & four) | (((packed[0] >> 6) & two) << 4),
                                       packed[1] & six, ((packed[2] >> 4) & four) | (((packed[1] >> 6) & two) << 4)};
    const __m512i both = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(unpacked)));
    // Lane i takes sub-block i / 2's scale (lanes 0..7 of `both`) and min (lanes 8..15).
    const __m512i scale_of_span = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
    const __m512i min_of_span = _mm512_add_epi32(scale_of_span, _mm512_set1_epi32(8));
    out.scale = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_permutexvar_epi32(scale_of_span, both)), _mm512_set1_ps(d));
    out.offset = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_permutexvar_epi32(min_of_span, both)), _mm512_set1_ps(-dmin));
    const std::uint8_t* qs = block + (F == weight_format::q4_k ? kquant_traits::q4_k_qs_at : kquant_traits::q5_k_qs_at);
    __m512i qh2 = _mm512_setzero_si512();
    if constexpr (F == weight_format::q5_k) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + kquant_traits::q5_k_qh_at));
      qh2 = join(qh, qh);
    }
    for (int c = 0; c < quarters; ++c) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + c * (quarter / 2)));
      __m512i codes = join(_mm256_and_si256(v, low_nibble), _mm256_and_si256(_mm256_srli_epi16(v, 4), low_nibble));
      if constexpr (F == weight_format::q5_k) {
        // Sub-block 2c (the low nibbles) takes bit 2c of qh, sub-block 2c + 1 bit 2c + 1.
        const __m512i bit = join(_mm256_set1_epi8(static_cast<char>(1 << (2 * c))),
                                 _mm256_set1_epi8(static_cast<char>(2 << (2 * c))));
        codes = _mm512_mask_add_epi8(codes, _mm512_test_epi8_mask(qh2, bit), codes, _mm512_set1_epi8(16));
      }
      out.codes[c] = codes;
    }
  }
}

// One tile: R weight rows from n0 against T tokens from t0.
template <weight_format F, int R, int T>
EDGE_VNNI void tile_vnni(const matmul_params& p, const int8_activations& x, const float* span_scales,
                         const float* span_sums, std::int64_t n0, std::int64_t t0) {
  constexpr std::int64_t bytes = kquant_block_bytes(F);
  const std::int64_t blocks = p.k / block_elements;
  const std::int64_t spans = p.k / activation_traits::sum_span;
  const std::int64_t row_bytes = blocks * bytes;
  __m512 acc[R][T];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const std::uint8_t* rows[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) rows[r] = row_blocks(p, n0 + r);
  // Lane l of a quarter's dot product covers 4 codes, in span 4 h + l / 4 of the block.
  __m512i span_of_lane[quarters];
#pragma GCC unroll 4
  for (int h = 0; h < quarters; ++h) {
    span_of_lane[h] = _mm512_add_epi32(_mm512_set1_epi32(4 * h),
                                       _mm512_srli_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                                                           13, 14, 15),
                                                         2));
  }
  const void* values = p.w.values;
  for (std::int64_t b = 0; b < blocks; ++b) {
    // A block spans up to four cache lines: each is asked for once, prefetch_distance ahead.
    for (std::int64_t line = b * bytes / cache_line; line <= ((b + 1) * bytes - 1) / cache_line; ++line) {
      if (line * cache_line >= b * bytes) prefetch_rows<R>(values, row_bytes, n0, line * cache_line);
    }
    unpacked_block w[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) unpack<F>(rows[r] + b * bytes, w[r]);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const std::int8_t* codes = x.codes_of(t0 + t) + b * block_elements;
      __m512i xv[quarters];
#pragma GCC unroll 4
      for (int h = 0; h < quarters; ++h) xv[h] = _mm512_loadu_si512(codes + h * quarter);
      const __m512 sx = _mm512_loadu_ps(span_scales + (t0 + t) * spans + b * spans_per_block);
      const __m512 xs = _mm512_loadu_ps(span_sums + (t0 + t) * spans + b * spans_per_block);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m512 factor = _mm512_mul_ps(w[r].scale, sx);
        __m512 a = _mm512_fmadd_ps(w[r].offset, xs, acc[r][t]);
#pragma GCC unroll 4
        for (int h = 0; h < quarters; ++h) {
          const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w[r].codes[h], xv[h]);
          a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_permutexvar_ps(span_of_lane[h], factor), a);
        }
        acc[r][t] = a;
      }
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) store_output(p, t0 + t, n0 + r, reduce16(acc[r][t]));
  }
}

constexpr int tile_rows = 4;
constexpr int tile_tokens = 4;

template <weight_format F, int T>
EDGE_VNNI void rows_for_tokens(const matmul_params& p, const int8_activations& x, const float* span_scales,
                               const float* span_sums, std::int64_t row_begin, std::int64_t row_end, std::int64_t t0) {
  std::int64_t n = row_begin;
  for (; n + tile_rows <= row_end; n += tile_rows) tile_vnni<F, tile_rows, T>(p, x, span_scales, span_sums, n, t0);
  for (; n < row_end; ++n) tile_vnni<F, 1, T>(p, x, span_scales, span_sums, n, t0);
}

// Token tiles outermost: the block's weight rows stay in cache while each token tile passes
// over them.
template <weight_format F>
EDGE_VNNI void rows_vnni(const matmul_params& p, const int8_activations& x, const float* span_scales,
                         const float* span_sums, std::int64_t row_begin, std::int64_t row_end) {
  for (std::int64_t t = 0; t < p.tokens; t += tile_tokens) {
    switch (std::min<std::int64_t>(tile_tokens, p.tokens - t)) {
      case 4: rows_for_tokens<F, 4>(p, x, span_scales, span_sums, row_begin, row_end, t); break;
      case 3: rows_for_tokens<F, 3>(p, x, span_scales, span_sums, row_begin, row_end, t); break;
      case 2: rows_for_tokens<F, 2>(p, x, span_scales, span_sums, row_begin, row_end, t); break;
      default: rows_for_tokens<F, 1>(p, x, span_scales, span_sums, row_begin, row_end, t); break;
    }
  }
}
#pragma GCC diagnostic pop
#endif

// Calls f.template operator()<F>() with the K-quant format as a compile-time value.
template <class Fn>
void dispatch_kquant(weight_format format, Fn&& f) {
  switch (format) {
    case weight_format::q4_k: return f.template operator()<weight_format::q4_k>();
    case weight_format::q5_k: return f.template operator()<weight_format::q5_k>();
    case weight_format::q6_k: return f.template operator()<weight_format::q6_k>();
    case weight_format::f32:
    case weight_format::f16:
    case weight_format::bf16:
    case weight_format::fp8_e4m3:
    case weight_format::int4:
    case weight_format::int8: return;  // not K-quants: run_matmul's other kernels take them
  }
}

}  // namespace

kquant_matmul::kquant_matmul(const matmul_params& p, isa level, int8_activations& x, std::vector<float>& spans)
    : p_(p), x_(x) {
  exact_ = p.exact_activations || !quantized_activations();
  if (exact_) return;
  path_ = level >= isa::avx512_vnni ? isa::avx512_vnni : isa::generic;
  quantize_activations(p.x, p.tokens, p.k, p.x_stride, code_order::natural, x);
  if (path_ != isa::avx512_vnni) return;
  const std::int64_t count = p.k / activation_traits::sum_span;
  if (static_cast<std::int64_t>(spans.size()) < 2 * p.tokens * count) {
    spans.resize(static_cast<std::size_t>(2 * p.tokens * count));
  }
  float* scales = spans.data();
  float* sums = spans.data() + p.tokens * count;
  constexpr std::int64_t spans_per_activation_block = activation_traits::block / activation_traits::sum_span;
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    const float* s = x.scales_of(t);
    const std::int32_t* code_sums = x.sums16_of(t);
    for (std::int64_t i = 0; i < count; ++i) {
      const float scale = s[i / spans_per_activation_block];
      scales[t * count + i] = scale;
      sums[t * count + i] = scale * static_cast<float>(code_sums[i]);
    }
  }
  span_scales_ = scales;
  span_sums_ = sums;
}

void kquant_matmul::rows(std::int64_t row_begin, std::int64_t row_end) const {
  dispatch_kquant(p_.w.format, [&]<weight_format F>() {
    if (exact_) return rows_exact<F>(p_, row_begin, row_end);
#if defined(__x86_64__)
    if (path_ == isa::avx512_vnni) return rows_vnni<F>(p_, x_, span_scales_, span_sums_, row_begin, row_end);
#endif
    rows_generic<F>(p_, x_, row_begin, row_end);
  });
}

}  // namespace edge::kernels::cpu
