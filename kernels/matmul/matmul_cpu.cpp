// CPU matmul. Both paths compute every y[t, n] as 16 partial sums over k (lane j takes the
// elements k ≡ j mod 16, in increasing k), added in a fixed tree at the end, so the result for
// a token does not depend on which other tokens or rows share its tile.
//
// Blocking: threads take blocks of rows_per_block weight rows; inside a block, tiles of
// tile_rows rows × tile_tokens tokens keep their accumulators in registers, and the block's
// rows stay in cache while every token tile passes over them, so each weight byte is read from
// memory once per call whatever the number of tokens.
//
// Quantized weights are dequantized in registers, a tile's rows once for all its tokens. INT4
// weights become float(q) × scale exactly (one FMA: code × scale − 8 × scale), and lane j still
// takes the elements k ≡ j mod 16 in increasing k, so an INT4 matmul is bit-identical to the f32
// matmul of its dequantized matrix on either path. FP8 rows are summed unscaled and their scale
// applied once to each dot product.
#include "kernels/matmul/matmul.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>

#include "edge/common/format.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/load.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/matmul/cpu_outputs.h"
#include "kernels/cuda/launchers.h"
#include "kernels/matmul/integer_dot.h"
#include "kernels/matmul/kquant_cpu.h"

namespace edge::kernels {
namespace {

constexpr std::int64_t lanes = 16;
constexpr std::int64_t rows_per_block = 64;
constexpr std::int64_t runs_per_thread = 4;
// Below this many multiply-adds a call is cheaper on one thread than split across the pool.
constexpr std::int64_t min_parallel_work = std::int64_t{1} << 16;
constexpr std::int64_t cache_line_bytes = 64;

// The AVX-512 path decodes an E4M3 code through FP16 bits, which gives the value divided by
// 2^(15 - 7) (the two formats' exponent biases); the factor goes back in with the row scale.
constexpr float fp8_via_fp16_factor =
    static_cast<float>(1 << (fp16_traits::exponent_bias - fp8_e4m3_traits::exponent_bias));

// The element type of a plain or FP8 weight format, as a compile-time value.
template <weight_format F>
constexpr dtype element_of() {
  return *element_dtype(F);
}


// How an INT4 chunk of 32 elements finds its scales: one for the whole chunk (group_size >= 32),
// one per half (16), or one per lane (8 and below, gathered with a permute).
enum class int4_scales { per_chunk, per_half, per_lane };

// ---- portable path ----------------------------------------------------------------------------

// Weight k of row n, as the kernels multiply it (FP8 without its row scale).
// INT4 and INT8 in either layout.
template <weight_format F>
inline float generic_weight(const matmul_params& p, std::int64_t n, std::int64_t k) {
  if constexpr (F == weight_format::int4 || F == weight_format::int8) {
    return static_cast<float>(integer_code_at(p.w, p.k, n, k)) * integer_scale_at(p.w, p.k, n, k);
  } else {
    return cpu::load_as_float<element_of<F>()>(p.w.values, n * p.k + k);
  }
}

template <weight_format F>
void matmul_rows_generic(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end) {
  for (std::int64_t n = row_begin; n < row_end; ++n) {
    for (std::int64_t t = 0; t < p.tokens; ++t) {
      const float* x = p.x + t * p.x_stride;
      float partial[lanes] = {};
      for (std::int64_t k = 0; k < p.k; ++k) {
        partial[k % lanes] += generic_weight<F>(p, n, k) * x[k];
      }
      // The same pairwise tree as the vector path's final reduction.
      for (std::int64_t width = lanes / 2; width > 0; width /= 2) {
        for (std::int64_t j = 0; j < width; ++j) partial[j] += partial[j + width];
      }
      float dot = partial[0];
      if constexpr (F == weight_format::fp8_e4m3) dot *= p.w.scales[n];
      cpu::store_output(p, t, n, dot);
    }
  }
}

// ---- CPU row tiles of the float formats (f16, bf16, FP8) ----------------------------------------
//
// Lane r of a vector is row r of a tile of 16 (weight_format.h), and each token's activation is
// broadcast; every output is summed in tile_chains partial sums (element i into sum i mod 4, in
// increasing i, by fused multiply-adds), added as (s0 + s1) + (s2 + s3), then FP8's row scale.
// Whatever the number of tokens, so results stay batch invariant; the portable code below and
// the AVX-512 kernel give the same bits.

constexpr std::int64_t tile_chains = 4;
// Tokens per pass over a tile's weights: 24 accumulators of AVX-512's 32 registers.
constexpr std::int64_t float_tile_tokens = 6;

template <weight_format F>
inline float tiled_element(const matmul_params& p, std::int64_t n, std::int64_t i) {
  const std::int64_t index = cpu_tiles::of(F, 0, p.k, n, i).byte / cpu_tiles::element_bytes(F);
  return cpu::load_as_float<element_of<F>()>(p.w.values, index);
}

template <weight_format F>
void float_tiles_generic(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end) {
  for (std::int64_t n = row_begin; n < row_end; ++n) {
    for (std::int64_t t = 0; t < p.tokens; ++t) {
      const float* x = p.x + t * p.x_stride;
      float partial[tile_chains] = {};
      for (std::int64_t i = 0; i < p.k; ++i) {
        partial[i % tile_chains] = std::fma(tiled_element<F>(p, n, i), x[i], partial[i % tile_chains]);
      }
      float dot = (partial[0] + partial[1]) + (partial[2] + partial[3]);
      if constexpr (F == weight_format::fp8_e4m3) dot *= p.w.scales[n];
      cpu::store_output(p, t, n, dot);
    }
  }
}

// ---- AVX-512 path -----------------------------------------------------------------------------

#if defined(__x86_64__)
#define EDGE_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c")))
#define EDGE_AVX512_LAMBDA __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c"), always_inline))
// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsics as
// uninitialised once they are inlined here (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// 16 weights starting at `index`, widened to float; lanes outside `mask` read nothing and are 0.
template <dtype W>
EDGE_AVX512 inline __m512 load_weights(const void* base, std::int64_t index, __mmask16 mask) {
  if constexpr (W == dtype::f32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + index);
  } else if constexpr (W == dtype::bf16) {
    const __m256i raw = _mm256_maskz_loadu_epi16(mask, static_cast<const std::uint16_t*>(base) + index);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
  } else if constexpr (W == dtype::f16) {
    const __m256i raw = _mm256_maskz_loadu_epi16(mask, static_cast<const std::uint16_t*>(base) + index);
    return _mm512_cvtph_ps(raw);
  } else {
    // E4M3 s.eeee.mmm placed as FP16 bits s.0eeee.mmm0000000 is the same number over 2^8,
    // subnormals included. Sign-extending the byte puts the sign in bits 15 and 14 after the
    // shift; the mask keeps bit 15 only.
    constexpr short fp16_of_fp8_mask = static_cast<short>(0xBF80);
    constexpr int fp16_of_fp8_shift = fp16_traits::mantissa_bits - fp8_e4m3_traits::mantissa_bits;
    const __m128i raw = _mm_maskz_loadu_epi8(mask, static_cast<const std::uint8_t*>(base) + index);
    __m256i bits = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(raw), fp16_of_fp8_shift),
                                    _mm256_set1_epi16(fp16_of_fp8_mask));
    // E4M3's NaN code would land on a finite FP16 (480): make it FP16's NaN, as the portable
    // path and the device read it.
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(
        _mm256_and_si256(_mm256_cvtepu8_epi16(raw), _mm256_set1_epi16(fp8_e4m3_traits::abs_mask)),
        _mm256_set1_epi16(fp8_e4m3_traits::nan_code));
    bits = _mm256_mask_mov_epi16(bits, nan, _mm256_set1_epi16(static_cast<short>(fp16_traits::nan_code)));
    return _mm512_cvtph_ps(bits);
  }
}


// Writes a tile's outputs; FP8 rows get their scale here.
template <dtype W, int R, int T>
EDGE_AVX512 inline void store_tile(const matmul_params& p, std::int64_t n0, std::int64_t t0, const __m512 (&acc)[R][T]) {
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float dot = cpu::reduce16(acc[r][t]);
      if constexpr (W == dtype::fp8_e4m3) dot *= p.w.scales[n0 + r] * fp8_via_fp16_factor;
      cpu::store_output(p, t0 + t, n0 + r, dot);
    }
  }
}

// One tile of element weights (f32, f16, bf16, FP8 codes): R weight rows starting at n0 against
// T tokens starting at t0.
template <dtype W, int R, int T>
EDGE_AVX512 void matmul_tile_avx512(const matmul_params& p, std::int64_t n0, std::int64_t t0) {
  // The accumulators must live in registers: every loop over R and T is unrolled completely.
  __m512 acc[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const float* x[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) x[t] = p.x + (t0 + t) * p.x_stride;
  const std::int64_t full = p.k / lanes * lanes;
  constexpr auto weight_bytes = static_cast<std::int64_t>(dtype_size(W));
  const std::int64_t row_bytes = p.k * weight_bytes;

  const auto step = [&](std::int64_t k, __mmask16 mask) EDGE_AVX512_LAMBDA {
    cpu::prefetch_rows<R>(p.w.values, row_bytes, n0, k * weight_bytes);
    __m512 w[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) w[r] = load_weights<W>(p.w.values, (n0 + r) * p.k + k, mask);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x[t] + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(w[r], xv, acc[r][t]);
    }
  };
  for (std::int64_t k = 0; k < full; k += lanes) step(k, __mmask16(0xFFFF));
  if (full < p.k) step(full, __mmask16((1u << (p.k - full)) - 1u));
  store_tile<W, R, T>(p, n0, t0, acc);
}

// The scales of the two halves of the chunk that starts at element `first` of a row. Lanes past
// the row's last group read nothing and get 0 (they only meet padding).
template <int4_scales S>
EDGE_AVX512_LAMBDA inline void int4_chunk_scales(const float* row_scales, std::int64_t groups, std::int64_t group_size,
                                                 std::int64_t first, bool has_high, __m512i lane_group, __m512& low,
                                                 __m512& high) {
  const std::int64_t group = first / group_size;
  if constexpr (S == int4_scales::per_chunk) {
    low = high = _mm512_set1_ps(row_scales[group]);
  } else if constexpr (S == int4_scales::per_half) {
    low = _mm512_set1_ps(row_scales[group]);
    high = has_high ? _mm512_set1_ps(row_scales[group + 1]) : low;
  } else {
    const std::int64_t per_half = int4_traits::half_chunk / group_size;
    const auto gather = [&](std::int64_t from) EDGE_AVX512_LAMBDA {
      const std::int64_t available = std::clamp<std::int64_t>(groups - from, 0, lanes);
      const auto mask = static_cast<__mmask16>((1u << available) - 1u);
      return _mm512_permutexvar_ps(lane_group, _mm512_maskz_loadu_ps(mask, row_scales + from));
    };
    low = gather(group);
    high = has_high ? gather(group + per_half) : low;
  }
}

// One tile of INT4 weights. Each chunk of 16 bytes widens to 16 lanes of bytes: the low nibbles
// are elements 0..15 of the chunk, the high nibbles 16..31, so lane j keeps taking the elements
// k ≡ j mod 16 in increasing k, as the other formats do.
template <int R, int T, int4_scales S>
EDGE_AVX512 void matmul_tile_int4(const matmul_params& p, std::int64_t n0, std::int64_t t0) {
  __m512 acc[R][T];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const float* x[T];
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) x[t] = p.x + (t0 + t) * p.x_stride;
  const std::int64_t row_bytes = int4_row_bytes(p.k);
  const std::int64_t groups = p.k / p.w.group_size;
  const auto* values = static_cast<const std::uint8_t*>(p.w.values);
  const float* row_scales[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) row_scales[r] = p.w.scales + (n0 + r) * groups;
  const __m512i nibble = _mm512_set1_epi32(int4_traits::nibble_mask);
  const __m512 minus_offset = _mm512_set1_ps(-static_cast<float>(int4_traits::code_offset));
  // per_lane: lane j of a half reads the scale j / group_size places after the half's first.
  const __m512i lane_group = _mm512_srlv_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
      _mm512_set1_epi32(static_cast<int>(__builtin_ctzll(static_cast<unsigned long long>(p.w.group_size)))));

  const auto step = [&](std::int64_t chunk, __mmask16 low_mask, __mmask16 high_mask) EDGE_AVX512_LAMBDA {
    const std::int64_t first = chunk * int4_traits::chunk_elements;
    const std::int64_t at = chunk * int4_traits::chunk_bytes;
    if (at % cache_line_bytes == 0) cpu::prefetch_rows<R>(values, row_bytes, n0, at);
    const bool has_high = high_mask != 0;
    __m512 w_low[R], w_high[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512i codes = _mm512_cvtepu8_epi32(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(values + (n0 + r) * row_bytes + at)));
      __m512 s_low, s_high;
      int4_chunk_scales<S>(row_scales[r], groups, p.w.group_size, first, has_high, lane_group, s_low, s_high);
      // code × scale − 8 × scale rounds once: exactly float(q) × scale.
      w_low[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(codes, nibble)), s_low,
                                 _mm512_mul_ps(s_low, minus_offset));
      w_high[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(codes, int4_traits::nibble_bits)), s_high,
                                  _mm512_mul_ps(s_high, minus_offset));
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 x_low = _mm512_maskz_loadu_ps(low_mask, x[t] + first);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(w_low[r], x_low, acc[r][t]);
      if (has_high) {
        const __m512 x_high = _mm512_maskz_loadu_ps(high_mask, x[t] + first + int4_traits::half_chunk);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(w_high[r], x_high, acc[r][t]);
      }
    }
  };
  const std::int64_t full = p.k / int4_traits::chunk_elements;
  for (std::int64_t chunk = 0; chunk < full; ++chunk) step(chunk, __mmask16(0xFFFF), __mmask16(0xFFFF));
  const std::int64_t rest = p.k - full * int4_traits::chunk_elements;
  if (rest > 0) {
    const auto mask_of = [](std::int64_t count) {
      return static_cast<__mmask16>(count >= lanes ? 0xFFFFu : (1u << std::max<std::int64_t>(count, 0)) - 1u);
    };
    step(full, mask_of(rest), mask_of(rest - int4_traits::half_chunk));
  }
  store_tile<dtype::f32, R, T>(p, n0, t0, acc);
}

// Tile shapes: a lone token streams eight rows at a time (more loads in flight for decode);
// otherwise four rows meet up to six tokens (24 accumulators + 4 weight registers fit the 32
// vector registers). An INT4 chunk needs two weight registers per row, so its tiles take at most
// four tokens.
constexpr int decode_tile_rows = 8;
constexpr int tile_rows = 4;

template <weight_format F>
constexpr int tile_tokens() {
  return F == weight_format::int4 ? 4 : 6;
}

template <weight_format F, int R, int T, int4_scales S>
EDGE_AVX512 inline void matmul_tile(const matmul_params& p, std::int64_t n0, std::int64_t t0) {
  if constexpr (F == weight_format::int4) {
    matmul_tile_int4<R, T, S>(p, n0, t0);
  } else {
    matmul_tile_avx512<element_of<F>(), R, T>(p, n0, t0);
  }
}

// Rows [row_begin, row_end) against a tile of T tokens starting at t0.
template <weight_format F, int T, int4_scales S>
EDGE_AVX512 void matmul_rows_for_tokens(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end,
                                        std::int64_t t0) {
  constexpr int rows = T == 1 ? decode_tile_rows : tile_rows;
  std::int64_t n = row_begin;
  for (; n + rows <= row_end; n += rows) matmul_tile<F, rows, T, S>(p, n, t0);
  for (; n < row_end; ++n) matmul_tile<F, 1, T, S>(p, n, t0);
}

// Token tiles outermost: the block's weight rows stay in cache while each token tile passes
// over them.
template <weight_format F, int4_scales S>
EDGE_AVX512 void matmul_rows_avx512(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end) {
  constexpr std::int64_t tokens_per_tile = tile_tokens<F>();
  for (std::int64_t t = 0; t < p.tokens; t += tokens_per_tile) {
    switch (std::min(tokens_per_tile, p.tokens - t)) {
      case 6:
        if constexpr (tokens_per_tile >= 6) matmul_rows_for_tokens<F, 6, S>(p, row_begin, row_end, t);
        break;
      case 5:
        if constexpr (tokens_per_tile >= 5) matmul_rows_for_tokens<F, 5, S>(p, row_begin, row_end, t);
        break;
      case 4: matmul_rows_for_tokens<F, 4, S>(p, row_begin, row_end, t); break;
      case 3: matmul_rows_for_tokens<F, 3, S>(p, row_begin, row_end, t); break;
      case 2: matmul_rows_for_tokens<F, 2, S>(p, row_begin, row_end, t); break;
      default: matmul_rows_for_tokens<F, 1, S>(p, row_begin, row_end, t); break;
    }
  }
}

#define EDGE_AVX512_VBMI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vbmi,fma,f16c")))

// What an FP8 code's element becomes in the tiles' kernel, as bf16 bits split into two bytes for
// vpermt2b (index: the code without its sign, which is put back after): the code's value over
// 2^8, as load_weights makes it through FP16, so that the sums are the same bits either way;
// bf16 holds every such value exactly (3 mantissa bits, exponents from 2^-17 to 2^0), and the
// NaN code stays a NaN.
struct fp8_tile_tables {
  alignas(64) std::uint8_t high[fp8_e4m3_traits::abs_mask + 1];
  alignas(64) std::uint8_t low[fp8_e4m3_traits::abs_mask + 1];
};
const fp8_tile_tables& fp8_tile_lookup() {
  static const fp8_tile_tables tables = [] {
    fp8_tile_tables t{};
    for (int code = 0; code <= fp8_e4m3_traits::abs_mask; ++code) {
      const float value = fp8_e4m3_to_float(static_cast<std::uint8_t>(code)) / fp8_via_fp16_factor;
      const auto bits = static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(value) >> 16);
      t.high[code] = static_cast<std::uint8_t>(bits >> 8);
      t.low[code] = static_cast<std::uint8_t>(bits & 0xFF);
    }
    return t;
  }();
  return tables;
}

// One quad of FP8 elements (4q .. 4q + 3) of a tile's 16 rows, the 64 bytes at `codes` laid out
// as weight_format.h says, as four vectors of floats (element 4q + j of row r in lane r of w[j]):
// the two table lookups give each code's bf16 high and low bytes, the sign goes back into the
// high byte, and interleaving the two makes the pairs (4q, 4q + 1) and (4q + 2, 4q + 3) of each
// row, a pair's first element in the low half of its 32-bit lane.
struct fp8_quad_decoder {
  __m512i high0, high1, low0, low1;

  EDGE_AVX512_VBMI static fp8_quad_decoder load() {
    const fp8_tile_tables& t = fp8_tile_lookup();
    return {_mm512_load_si512(t.high), _mm512_load_si512(t.high + 64), _mm512_load_si512(t.low),
            _mm512_load_si512(t.low + 64)};
  }
  EDGE_AVX512_VBMI __attribute__((always_inline)) inline void decode(const std::uint8_t* codes, __m512 (&w)[4]) const {
    constexpr int bits_or_sign = 0xF8;  // vpternlog: a | (b & c)
    const __m512i raw = _mm512_loadu_si512(codes);
    const __m512i sign = _mm512_set1_epi8(static_cast<char>(fp8_e4m3_traits::sign_mask));
    const __m512i high = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high0, raw, high1), raw, sign, bits_or_sign);
    const __m512i low = _mm512_permutex2var_epi8(low0, raw, low1);
    const __m512i first = _mm512_unpacklo_epi8(low, high);
    const __m512i second = _mm512_unpackhi_epi8(low, high);
    const __m512i upper = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    w[0] = _mm512_castsi512_ps(_mm512_slli_epi32(first, 16));
    w[1] = _mm512_castsi512_ps(_mm512_and_si512(first, upper));
    w[2] = _mm512_castsi512_ps(_mm512_slli_epi32(second, 16));
    w[3] = _mm512_castsi512_ps(_mm512_and_si512(second, upper));
  }
};

// The accumulators of TILES tiles of 16 rows against T tokens: tile_chains partial sums each
// (float_tiles_generic's arithmetic), and the reads that fill them.
template <dtype W, int TILES, int T>
struct float_tile_sums {
  static constexpr auto weight_bytes = static_cast<std::int64_t>(dtype_size(W));
  static constexpr std::int64_t step_bytes = cpu_tiles::rows * weight_bytes;  // one element of 16 rows

  const matmul_params& p;
  const std::int64_t tile0;
  const std::int64_t t0;
  const std::uint8_t* base[TILES];
  const float* x[T];
  __m512 acc[TILES][tile_chains][T];

  EDGE_AVX512_LAMBDA float_tile_sums(const matmul_params& params, std::int64_t first_tile, std::int64_t first_token)
      : p(params), tile0(first_tile), t0(first_token) {
#pragma GCC unroll 4
    for (int u = 0; u < TILES; ++u) {
      base[u] = static_cast<const std::uint8_t*>(p.w.values) + (tile0 + u) * p.k * step_bytes;
#pragma GCC unroll 4
      for (int j = 0; j < tile_chains; ++j) {
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) acc[u][j][t] = _mm512_setzero_ps();
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) x[t] = p.x + (t0 + t) * p.x_stride;
  }

  // Prefetches the next elements i .. i + 3 will need, cpu::tile_prefetch_distance ahead.
  EDGE_AVX512_LAMBDA void prefetch(std::int64_t i) const {
#pragma GCC unroll 4
    for (int u = 0; u < TILES; ++u) {
#pragma GCC unroll 4
      for (std::int64_t line = 0; line < tile_chains * step_bytes; line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(base[u] + i * step_bytes + cpu::tile_prefetch_distance + line),
                     _MM_HINT_T0);
      }
    }
  }

  // Element i of tile u's 16 rows, laid out as [k, 16], into chain j.
  EDGE_AVX512_LAMBDA void element(int u, std::int64_t i, int j) {
    multiply(u, load_weights<W>(base[u], i * cpu_tiles::rows, __mmask16(0xFFFF)), i, j);
  }
  EDGE_AVX512_LAMBDA void multiply(int u, __m512 w, std::int64_t i, int j) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[u][j][t] = _mm512_fmadd_ps(w, _mm512_set1_ps(x[t][i]), acc[u][j][t]);
  }

  // The last k % 4 elements, each to its own chain: the chain indices stay compile-time
  // constants (a runtime index would put the accumulators in memory).
  EDGE_AVX512_LAMBDA void tail() {
    const std::int64_t full = p.k / tile_chains * tile_chains;
#pragma GCC unroll 4
    for (int j = 0; j < tile_chains; ++j) {
      if (full + j < p.k) {
#pragma GCC unroll 4
        for (int u = 0; u < TILES; ++u) element(u, full + j, j);
      }
    }
  }

  // (s0 + s1) + (s2 + s3), FP8's row scale, the bias, and the output (added to it when
  // p.accumulate).
  EDGE_AVX512_LAMBDA void store() const {
#pragma GCC unroll 4
    for (int u = 0; u < TILES; ++u) {
      const std::int64_t row0 = (tile0 + u) * cpu_tiles::rows;
      const std::int64_t valid = std::min<std::int64_t>(cpu_tiles::rows, p.n - row0);
      if (valid <= 0) break;
      const auto mask = static_cast<__mmask16>((1u << valid) - 1u);
      __m512 scale = _mm512_set1_ps(1.0f);
      if constexpr (W == dtype::fp8_e4m3) {
        scale = _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, p.w.scales + row0), _mm512_set1_ps(fp8_via_fp16_factor));
      }
      const __m512 bias = p.bias != nullptr ? _mm512_maskz_loadu_ps(mask, p.bias + row0) : _mm512_setzero_ps();
#pragma GCC unroll 8
      for (int t = 0; t < T; ++t) {
        __m512 dot = _mm512_add_ps(_mm512_add_ps(acc[u][0][t], acc[u][1][t]), _mm512_add_ps(acc[u][2][t], acc[u][3][t]));
        if constexpr (W == dtype::fp8_e4m3) dot = _mm512_mul_ps(dot, scale);
        if (p.bias != nullptr) dot = _mm512_add_ps(dot, bias);
        float* y = p.y + (t0 + t) * p.y_stride + row0;
        if (p.accumulate) dot = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, y), dot);
        _mm512_mask_storeu_ps(y, mask, dot);
      }
    }
  }
};

// TILES tiles of 16 rows of f16 or bf16 (float_tiles_generic's arithmetic) against T tokens
// starting at t0. Each tile's [k, 16] weights are one stream, prefetched tile_prefetch_distance
// ahead. Few tokens take two tiles at a time: their accumulators are then enough independent
// chains to keep the FMA units busy.
template <dtype W, int TILES, int T>
EDGE_AVX512 void float_tile_avx512(const matmul_params& p, std::int64_t tile0, std::int64_t t0) {
  float_tile_sums<W, TILES, T> sums(p, tile0, t0);
  const std::int64_t full = p.k / tile_chains * tile_chains;
  for (std::int64_t i = 0; i < full; i += tile_chains) {
    sums.prefetch(i);
#pragma GCC unroll 4
    for (int j = 0; j < tile_chains; ++j) {
#pragma GCC unroll 4
      for (int u = 0; u < TILES; ++u) sums.element(u, i + j, j);
    }
  }
  sums.tail();
  sums.store();
}

// The same for FP8, whose tiles hold quads of elements (weight_format.h): each quad of a tile
// is one 64-byte load that fp8_quad_decoder turns into the four elements' floats, which go to
// the four chains as float_tile_avx512's would, so the sums are the same bits. `tables` is
// fp8_quad_decoder::load(), made once per call of float_tiles_avx512.
template <int TILES, int T>
EDGE_AVX512_VBMI void fp8_tile_avx512(const matmul_params& p, std::int64_t tile0, std::int64_t t0,
                                      const fp8_quad_decoder& tables) {
  static_assert(cpu_tiles::fp8_quad == tile_chains);
  float_tile_sums<dtype::fp8_e4m3, TILES, T> sums(p, tile0, t0);
  const fp8_quad_decoder decoder = tables;
  const std::int64_t full = p.k / tile_chains * tile_chains;
  for (std::int64_t i = 0; i < full; i += tile_chains) {
    sums.prefetch(i);
#pragma GCC unroll 4
    for (int u = 0; u < TILES; ++u) {
      __m512 w[cpu_tiles::fp8_quad];
      decoder.decode(sums.base[u] + i * cpu_tiles::rows, w);
#pragma GCC unroll 4
      for (int j = 0; j < tile_chains; ++j) sums.multiply(u, w[j], i + j, j);
    }
  }
  sums.tail();
  sums.store();
}

// Rows [row_begin, row_end) of float tiles (row_begin a multiple of 16), token tiles outermost
// so that the block's tiles stay in cache while each token tile passes over them.
template <weight_format F>
EDGE_AVX512 void float_tiles_avx512(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end) {
  constexpr dtype W = element_of<F>();
  const std::int64_t first = row_begin / cpu_tiles::rows;
  const std::int64_t end = cpu_tiles::tiles(row_end);
  fp8_quad_decoder fp8_tables{};
  if constexpr (W == dtype::fp8_e4m3) fp8_tables = fp8_quad_decoder::load();
  for (std::int64_t t = 0; t < p.tokens; t += float_tile_tokens) {
    const auto run = [&]<int TILES, int T>() {
      std::int64_t tile = first;
      if constexpr (W == dtype::fp8_e4m3) {
        for (; tile + TILES <= end; tile += TILES) fp8_tile_avx512<TILES, T>(p, tile, t, fp8_tables);
        for (; tile < end; ++tile) fp8_tile_avx512<1, T>(p, tile, t, fp8_tables);
      } else {
        for (; tile + TILES <= end; tile += TILES) float_tile_avx512<W, TILES, T>(p, tile, t);
        for (; tile < end; ++tile) float_tile_avx512<W, 1, T>(p, tile, t);
      }
    };
    switch (std::min(float_tile_tokens, p.tokens - t)) {
      case 6: run.template operator()<1, 6>(); break;
      case 5: run.template operator()<1, 5>(); break;
      case 4: run.template operator()<1, 4>(); break;
      case 3: run.template operator()<1, 3>(); break;
      case 2: run.template operator()<2, 2>(); break;
      default: run.template operator()<2, 1>(); break;
    }
  }
}
#pragma GCC diagnostic pop
#endif

template <weight_format F, int4_scales S>
void matmul_rows(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end) {
  if constexpr (F == weight_format::f16 || F == weight_format::bf16 || F == weight_format::fp8_e4m3) {
    if (p.w.layout == weight_layout::cpu_tiles) {
#if defined(__x86_64__)
      if (F == weight_format::fp8_e4m3 ? cpu::has_byte_permutes() : cpu::has(cpu::isa::avx512)) {
        float_tiles_avx512<F>(p, row_begin, row_end);
        return;
      }
#endif
      float_tiles_generic<F>(p, row_begin, row_end);
      return;
    }
  }
#if defined(__x86_64__)
  // INT8 has no float tile: it takes the integer kernels, or this reference; nor do CPU row
  // tiles, which the integer kernels are for.
  if constexpr (F != weight_format::int8) {
    if (cpu::has(cpu::isa::avx512) && p.w.layout == weight_layout::rows) {
      matmul_rows_avx512<F, S>(p, row_begin, row_end);
      return;
    }
  }
#endif
  matmul_rows_generic<F>(p, row_begin, row_end);
}

// Calls f.template operator()<F, S>() with the weight format and, for INT4, the way a chunk
// finds its scales, as compile-time values.
template <class Fn>
void dispatch_weights(const weight_view& w, Fn&& f) {
  switch (w.format) {
    case weight_format::f32: return f.template operator()<weight_format::f32, int4_scales::per_chunk>();
    case weight_format::f16: return f.template operator()<weight_format::f16, int4_scales::per_chunk>();
    case weight_format::bf16: return f.template operator()<weight_format::bf16, int4_scales::per_chunk>();
    case weight_format::fp8_e4m3: return f.template operator()<weight_format::fp8_e4m3, int4_scales::per_chunk>();
    case weight_format::int8: return f.template operator()<weight_format::int8, int4_scales::per_chunk>();
    case weight_format::int4:
      if (w.group_size >= int4_traits::chunk_elements) {
        return f.template operator()<weight_format::int4, int4_scales::per_chunk>();
      }
      if (w.group_size == int4_traits::half_chunk) {
        return f.template operator()<weight_format::int4, int4_scales::per_half>();
      }
      return f.template operator()<weight_format::int4, int4_scales::per_lane>();
    case weight_format::q4_k:
    case weight_format::q5_k:
    case weight_format::q6_k: return;  // run_matmul gives these to cpu::kquant_matmul
  }
}

}  // namespace

status run_matmul(const matmul_params& p, const stream& s) {
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_matmul(p, s);
  if (p.tokens < 0 || p.n <= 0 || p.k <= 0 || p.x_stride < p.k || p.y_stride < p.n) {
    return invalid_argument("matmul: bad shape or strides");
  }
  if (p.w.values == nullptr) return invalid_argument("matmul: no weights");
  if (has_scales(p.w.format) && p.w.scales == nullptr) {
    return invalid_argument(edge::format("matmul: {} weights need scales", to_string(p.w.format)));
  }
  if (p.w.format == weight_format::int4 && !valid_int4_group_size(p.w.group_size, p.k)) {
    return invalid_argument(
        edge::format("matmul: INT4 group size {} is not a power of two dividing k = {}", p.w.group_size, p.k));
  }
  if (p.w.format == weight_format::int8 && p.k % int8_traits::group_size != 0) {
    return invalid_argument(edge::format("matmul: INT8 rows need k a multiple of {}, not {}", int8_traits::group_size, p.k));
  }
  if (p.w.layout == weight_layout::cpu_tiles && !cpu_tiles::takes(p.w.format, p.w.group_size)) {
    return invalid_argument(edge::format("matmul: CPU row tiles of {} weights (group {})", to_string(p.w.format),
                                         p.w.group_size));
  }
  if (is_k_quant(p.w.format) && p.k % kquant_traits::block_elements != 0) {
    return invalid_argument(edge::format("matmul: {} rows need k a multiple of {}, not {}", to_string(p.w.format),
                                         kquant_traits::block_elements, p.k));
  }
  if (p.tokens == 0) return {};
  const std::int64_t blocks = (p.n + rows_per_block - 1) / rows_per_block;
  const bool parallel = p.tokens * p.n * p.k >= min_parallel_work;
  const stream where = parallel ? s : stream{.where = s.where, .pool = nullptr, .cuda_stream = nullptr};
  // A few runs of adjacent blocks per thread rather than one block at a time: a thread then
  // streams long contiguous stretches of the weights (measured 7-10% faster decode), and the
  // runs are still small enough to even out a thread that falls behind.
  const std::int64_t threads = where.pool != nullptr ? static_cast<std::int64_t>(where.pool->size()) + 1 : 1;
  const std::int64_t grain = std::max<std::int64_t>(1, blocks / (threads * runs_per_thread));
  const bool rounded_activations = !p.exact_activations && cpu::quantized_activations();
  const auto run_rows = [&](const auto& call) {
    cpu::parallel_for(where, blocks, grain, [&](std::int64_t block_begin, std::int64_t block_end) {
      call.rows(block_begin * rows_per_block, std::min(p.n, block_end * rows_per_block));
    });
    return status{};
  };
  // The caller's thread quantizes the activations once (into scratch of its own, reused across
  // calls); the pool's threads only read them.
  thread_local cpu::int8_activations activations;
  thread_local std::vector<float> scratch;
  // The K-quants' exact-activation reference is kquant_matmul's too: it takes every such call.
  if (is_k_quant(p.w.format)) return run_rows(cpu::kquant_matmul(p, cpu::active_isa(), activations, scratch));
  if (rounded_activations && cpu::integer_dot_reads(p.w)) {
    return run_rows(cpu::integer_matmul(p, cpu::active_isa(), activations, scratch));
  }
  dispatch_weights(p.w, [&]<weight_format F, int4_scales S>() {
    cpu::parallel_for(where, blocks, grain, [&](std::int64_t block_begin, std::int64_t block_end) {
      for (std::int64_t b = block_begin; b < block_end; ++b) {
        matmul_rows<F, S>(p, b * rows_per_block, std::min(p.n, (b + 1) * rows_per_block));
      }
    });
  });
  return {};
}

namespace detail {

status check_head_matmul(const head_matmul_params& p) {
  if (p.tokens < 0 || p.heads < 0 || p.n <= 0 || p.k <= 0 || p.first_row < 0 || p.head_rows < p.n ||
      p.x_stride < 0 || p.y_stride < 0 || p.x_head_stride < p.k || p.y_head_stride < p.n) {
    return invalid_argument("head matmul: bad shape or strides");
  }
  if (p.tokens > 1 && (p.x_stride < p.heads * p.x_head_stride || p.y_stride < p.heads * p.y_head_stride)) {
    return invalid_argument("head matmul: a token's heads overlap the next token's");
  }
  return {};
}

}  // namespace detail

status run_head_matmul(const head_matmul_params& p, const stream& s) {
  if (s.where == device::count) {
    count_launches(s, p.tokens <= head_matmul_gemv_tokens ? 1 : p.heads);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_head_matmul(p, s);
  EDGE_RETURN_IF_ERROR(detail::check_head_matmul(p));
  for (std::int64_t h = 0; h < p.heads; ++h) {
    EDGE_RETURN_IF_ERROR(run_matmul({.x = p.x + h * p.x_head_stride,
                                     .w = weight_rows_from(p.w, p.first_row + h * p.head_rows, p.k),
                                     .y = p.y + h * p.y_head_stride, .tokens = p.tokens, .n = p.n, .k = p.k,
                                     .x_stride = p.x_stride, .y_stride = p.y_stride,
                                     .exact_activations = p.exact_activations},
                                    s));
  }
  return {};
}

}  // namespace edge::kernels
