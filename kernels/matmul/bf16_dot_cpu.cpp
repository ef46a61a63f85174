// bf16 weights × bf16-rounded activations with vdpbf16ps (bf16_dot.h). Lane j of a product
// vector takes the pairs 2j, 2j + 1 of each 32 elements in increasing k; the 16 lanes are added
// in one fixed tree at the end, so a token's result does not depend on its batch.
#include "kernels/matmul/bf16_dot.h"

#include <immintrin.h>

#include <algorithm>

#include "edge/kernels/numerics.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/matmul/cpu_outputs.h"

namespace edge::kernels::cpu {

void round_activations(const float* x, std::int64_t tokens, std::int64_t k, std::int64_t x_stride,
                       bf16_activations& out) {
  constexpr std::int64_t multiple = bf16_activations::row_multiple;
  out.tokens = tokens;
  out.padded_k = (k + multiple - 1) / multiple * multiple;
  const auto size = static_cast<std::size_t>(tokens * out.padded_k);
  if (out.values.size() < size) out.values.resize(size);
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::uint16_t* row = out.values.data() + t * out.padded_k;
    for (std::int64_t i = 0; i < k; ++i) row[i] = float_to_bf16(x[t * x_stride + i]);
    std::fill(row + k, row + out.padded_k, std::uint16_t{0});
  }
}

#if defined(__x86_64__)
namespace {

#define EDGE_BF16 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,fma")))
// GCC 12 reports its own _mm512_undefined_*() placeholders inside the intrinsics as
// uninitialised once they are inlined here (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

constexpr std::int64_t pair_lanes = 32;  // bf16 elements per vector

// R weight rows × T tokens, 32 elements at a time; the last step's weights are masked.
template <int R, int T>
EDGE_BF16 void tile_bf16(const matmul_params& p, const bf16_activations& x, std::int64_t n0, std::int64_t t0) {
  __m512 acc[R][T];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const auto* values = static_cast<const std::uint16_t*>(p.w.values);
  const std::int64_t row_bytes = p.k * 2;
  for (std::int64_t k = 0; k < p.k; k += pair_lanes) {
    const std::int64_t left = p.k - k;
    const auto mask = static_cast<__mmask32>(left >= pair_lanes ? ~0u : (1u << left) - 1u);
    prefetch_rows<R>(values, row_bytes, n0, k * 2);
    __m512bh w[R];
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) w[r] = (__m512bh)_mm512_maskz_loadu_epi16(mask, values + (n0 + r) * p.k + k);
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) {
      const auto xv = (__m512bh)_mm512_loadu_si512(x.row(t0 + t) + k);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w[r], xv);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < T; ++t) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) store_output(p, t0 + t, n0 + r, reduce16(acc[r][t]));
  }
}
#pragma GCC diagnostic pop

// A lone token streams 16 rows at a time (more loads in flight for decode); otherwise four rows
// meet up to six tokens (24 accumulators and 4 weight registers of the 32).
constexpr int decode_rows = 16;
constexpr int tile_rows = 4;
constexpr std::int64_t max_tokens = 6;

}  // namespace
#endif

bf16_matmul::bf16_matmul(const matmul_params& p, bf16_activations& x) : p_(p), x_(x) {
  round_activations(p.x, p.tokens, p.k, p.x_stride, x);
}

void bf16_matmul::rows(std::int64_t row_begin, std::int64_t row_end) const {
#if defined(__x86_64__)
  for (std::int64_t t0 = 0; t0 < p_.tokens; t0 += max_tokens) {
    const auto run = [&]<int R, int T>() {
      std::int64_t n = row_begin;
      for (; n + R <= row_end; n += R) tile_bf16<R, T>(p_, x_, n, t0);
      for (; n < row_end; ++n) tile_bf16<1, T>(p_, x_, n, t0);
    };
    switch (std::min(max_tokens, p_.tokens - t0)) {
      case 1: run.template operator()<decode_rows, 1>(); break;
      case 2: run.template operator()<tile_rows, 2>(); break;
      case 3: run.template operator()<tile_rows, 3>(); break;
      case 4: run.template operator()<tile_rows, 4>(); break;
      case 5: run.template operator()<tile_rows, 5>(); break;
      default: run.template operator()<tile_rows, 6>(); break;
    }
  }
#else
  (void)row_begin;
  (void)row_end;
#endif
}

}  // namespace edge::kernels::cpu
