// CPU matmul. Both paths compute every y[t, n] as 16 partial sums over k (lane j takes the
// elements k ≡ j mod 16, in increasing k), added in a fixed tree at the end, so the result for
// a token does not depend on which other tokens or rows share its tile.
//
// Blocking: threads take blocks of rows_per_block weight rows; inside a block, tiles of
// tile_rows rows × tile_tokens tokens keep their accumulators in registers, and the block's
// rows stay in cache while every token tile passes over them, so each weight byte is read from
// memory once per call whatever the number of tokens.
#include "kernels/matmul/matmul.h"

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/load.h"
#include "kernels/cpu/parallel.h"

namespace edge::kernels {
namespace {

constexpr std::int64_t lanes = 16;
// How far ahead of the loads each weight row is prefetched (measured best on Zen 4: 1 KiB).
constexpr std::int64_t prefetch_distance = 1024;
constexpr std::int64_t rows_per_block = 64;
constexpr std::int64_t runs_per_thread = 4;
// Below this many multiply-adds a call is cheaper on one thread than split across the pool.
constexpr std::int64_t min_parallel_work = std::int64_t{1} << 16;

// ---- portable path ----------------------------------------------------------------------------

template <dtype W>
void matmul_rows_generic(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end) {
  for (std::int64_t n = row_begin; n < row_end; ++n) {
    const std::int64_t w_row = n * p.k;
    for (std::int64_t t = 0; t < p.tokens; ++t) {
      const float* x = p.x + t * p.x_stride;
      float partial[lanes] = {};
      for (std::int64_t k = 0; k < p.k; ++k) {
        partial[k % lanes] += cpu::load_as_float<W>(p.w, w_row + k) * x[k];
      }
      // The same pairwise tree as the vector path's final reduction.
      for (std::int64_t width = lanes / 2; width > 0; width /= 2) {
        for (std::int64_t j = 0; j < width; ++j) partial[j] += partial[j + width];
      }
      float value = partial[0];
      if (p.bias != nullptr) value += p.bias[n];
      float& out = p.y[t * p.y_stride + n];
      out = p.accumulate ? out + value : value;
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
  } else {
    const __m256i raw = _mm256_maskz_loadu_epi16(mask, static_cast<const std::uint16_t*>(base) + index);
    return _mm512_cvtph_ps(raw);
  }
}

// Adds 16 lanes in the same pairwise tree as the portable path.
EDGE_AVX512 inline float reduce_lanes(__m512 v) {
  const __m256 half = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  const __m128 quarter = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
  const __m128 eighth = _mm_add_ps(quarter, _mm_movehl_ps(quarter, quarter));
  const __m128 last = _mm_add_ss(eighth, _mm_shuffle_ps(eighth, eighth, 1));
  return _mm_cvtss_f32(last);
}

// One tile: R weight rows starting at n0 against T tokens starting at t0.
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
    // Hardware prefetchers alone leave bandwidth unused with this many interleaved streams.
    // Near the end of a row the prefetch moves on to the same row of the next tile, so a tile
    // starts with its first bytes already on the way.
    std::int64_t ahead = k * weight_bytes + prefetch_distance;
    std::int64_t ahead_row = n0;
    if (ahead >= row_bytes) {
      ahead -= row_bytes;
      ahead_row += R;
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(static_cast<const char*>(p.w) + (ahead_row + r) * row_bytes + ahead, _MM_HINT_T0);
    }
    __m512 w[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) w[r] = load_weights<W>(p.w, (n0 + r) * p.k + k, mask);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x[t] + k);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(w[r], xv, acc[r][t]);
    }
  };
  for (std::int64_t k = 0; k < full; k += lanes) step(k, __mmask16(0xFFFF));
  if (full < p.k) step(full, __mmask16((1u << (p.k - full)) - 1u));

#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
    float* y = p.y + (t0 + t) * p.y_stride + n0;
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      float value = reduce_lanes(acc[r][t]);
      if (p.bias != nullptr) value += p.bias[n0 + r];
      y[r] = p.accumulate ? y[r] + value : value;
    }
  }
}

// Tile shapes: a lone token streams eight rows at a time (more loads in flight for decode);
// otherwise four rows meet up to six tokens (24 accumulators + 4 weight registers fit the 32
// vector registers).
constexpr int decode_tile_rows = 8;
constexpr int tile_rows = 4;
constexpr int tile_tokens = 6;

// Rows [row_begin, row_end) against a tile of T tokens starting at t0.
template <dtype W, int T>
EDGE_AVX512 void matmul_rows_for_tokens(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end,
                                        std::int64_t t0) {
  constexpr int rows = T == 1 ? decode_tile_rows : tile_rows;
  std::int64_t n = row_begin;
  for (; n + rows <= row_end; n += rows) matmul_tile_avx512<W, rows, T>(p, n, t0);
  for (; n < row_end; ++n) matmul_tile_avx512<W, 1, T>(p, n, t0);
}

// Token tiles outermost: the block's weight rows stay in cache while each token tile passes
// over them.
template <dtype W>
EDGE_AVX512 void matmul_rows_avx512(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end) {
  for (std::int64_t t = 0; t < p.tokens; t += tile_tokens) {
    switch (std::min<std::int64_t>(tile_tokens, p.tokens - t)) {
      case 6: matmul_rows_for_tokens<W, 6>(p, row_begin, row_end, t); break;
      case 5: matmul_rows_for_tokens<W, 5>(p, row_begin, row_end, t); break;
      case 4: matmul_rows_for_tokens<W, 4>(p, row_begin, row_end, t); break;
      case 3: matmul_rows_for_tokens<W, 3>(p, row_begin, row_end, t); break;
      case 2: matmul_rows_for_tokens<W, 2>(p, row_begin, row_end, t); break;
      default: matmul_rows_for_tokens<W, 1>(p, row_begin, row_end, t); break;
    }
  }
}
#pragma GCC diagnostic pop
#endif

template <dtype W>
void matmul_rows(const matmul_params& p, std::int64_t row_begin, std::int64_t row_end) {
#if defined(__x86_64__)
  if (cpu::active_isa() == cpu::isa::avx512) {
    matmul_rows_avx512<W>(p, row_begin, row_end);
    return;
  }
#endif
  matmul_rows_generic<W>(p, row_begin, row_end);
}

}  // namespace

status run_matmul(const matmul_params& p, const stream& s) {
  if (p.tokens < 0 || p.n <= 0 || p.k <= 0 || p.x_stride < p.k || p.y_stride < p.n) {
    return invalid_argument("matmul: bad shape or strides");
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
  cpu::dispatch_dtype(p.w_type, [&]<dtype W>() {
    cpu::parallel_for(where, blocks, grain, [&](std::int64_t block_begin, std::int64_t block_end) {
      for (std::int64_t b = block_begin; b < block_end; ++b) {
        matmul_rows<W>(p, b * rows_per_block, std::min(p.n, (b + 1) * rows_per_block));
      }
    });
  });
  return {};
}

}  // namespace edge::kernels
