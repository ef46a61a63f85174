// CPU paged attention. One work item is (token, KV head): the group of query heads that share
// the KV head walk the token's context block by block, keeping a running maximum, a running
// sum of exponentials and an output accumulator per head (online softmax), so no buffer grows
// with the context length.
#include "kernels/paged_attention/paged_attention.h"

#include <immintrin.h>

#include <array>
#include <cmath>
#include <limits>

#include "edge/common/format.h"
#include "kernels/cpu/isa.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/cpu/load.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cuda/launchers.h"

namespace edge::kernels {
namespace {

constexpr std::int64_t max_block_size = 256;

// The running softmax state of one query head.
struct head_state {
  float max_score;
  float sum;
  float* acc;  // [head_dim]
};

// ---- dot products and scaled adds, per code path ------------------------------------------
//
// Each path decodes fp8 codes to fp8_unit times their value; the row's scale is multiplied by
// fp8_unit once per row to undo it.

// Every E4M3 code's value: the portable path looks codes up instead of decoding bit fields.
constexpr std::array<float, 256> fp8_values = [] {
  std::array<float, 256> table{};
  for (std::size_t code = 0; code < table.size(); ++code) table[code] = fp8_e4m3_to_float(static_cast<std::uint8_t>(code));
  return table;
}();

template <dtype KV>
inline float load_generic(const void* base, std::int64_t index) {
  if constexpr (KV == dtype::fp8_e4m3) {
    return fp8_values[static_cast<const std::uint8_t*>(base)[index]];
  } else {
    return cpu::load_as_float<KV>(base, index);
  }
}

template <dtype KV>
float dot_generic(const float* q, const void* k_base, std::int64_t k_index, std::int64_t n) {
  float sum = 0.0f;
  for (std::int64_t d = 0; d < n; ++d) sum += q[d] * load_generic<KV>(k_base, k_index + d);
  return sum;
}

template <dtype KV>
void add_scaled_generic(float* acc, float weight, const void* v_base, std::int64_t v_index, std::int64_t n) {
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
constexpr int fp8_to_fp16_shift = fp16_traits::mantissa_bits - fp8_e4m3_traits::mantissa_bits;
constexpr int fp8_to_fp16_sign_shift = 8;  // bit 7 of the byte to bit 15 of the half
constexpr float fp8_via_fp16_unit =
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
EDGE_AVX512 float dot_avx512(const float* q, const void* k_base, std::int64_t k_index, std::int64_t n) {
  __m512 sum = _mm512_setzero_ps();
  for (std::int64_t d = 0; d < n; d += 16) {
    const __mmask16 mask = tail_mask(n - d);
    sum = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, q + d), load16<KV>(k_base, k_index + d, mask), sum);
  }
  return _mm512_reduce_add_ps(sum);
}

template <dtype KV>
EDGE_AVX512 void add_scaled_avx512(float* acc, float weight, const void* v_base, std::int64_t v_index,
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

// ---- one (token, KV head) ------------------------------------------------------------------

template <class Ops, dtype KV>
void attend(const paged_attention_params& p, std::int64_t t, std::int64_t kv_head) {
  constexpr bool scaled = kv_cache_scaled(KV);
  const std::int64_t group = p.num_heads / p.num_kv_heads;
  const std::int64_t hd = p.head_dim;
  const std::int64_t context = static_cast<std::int64_t>(p.pos[t]) + 1;
  const std::int32_t* table = p.block_tables + p.table_begin[p.seq[t]];

  float acc_storage[max_attention_group * max_attention_head_dim];
  head_state heads[max_attention_group];
  for (std::int64_t g = 0; g < group; ++g) {
    heads[g] = {-std::numeric_limits<float>::infinity(), 0.0f, acc_storage + g * hd};
    for (std::int64_t d = 0; d < hd; ++d) heads[g].acc[d] = 0.0f;
  }

  float scores[max_block_size];
  float k_factors[max_block_size];  // per row of the block: its K scale, times the path's fp8 unit
  float v_factors[max_block_size];
  for (std::int64_t first = 0; first < context; first += p.block_size) {
    const std::int64_t count = std::min(p.block_size, context - first);
    const std::int64_t block = table[first / p.block_size];
    // Row index of (block, kv_head, 0) in [num_blocks, num_kv_heads, block_size], and the
    // element index of its first value in [num_blocks, num_kv_heads, block_size, head_dim].
    const std::int64_t row = (block * p.num_kv_heads + kv_head) * p.block_size;
    const std::int64_t base = row * hd;
    if constexpr (scaled) {
      for (std::int64_t j = 0; j < count; ++j) {
        k_factors[j] = p.k_scales[row + j] * Ops::fp8_unit;
        v_factors[j] = p.v_scales[row + j] * Ops::fp8_unit;
      }
    }
    for (std::int64_t g = 0; g < group; ++g) {
      const float* q = p.q + t * p.q_stride + (kv_head * group + g) * hd;
      head_state& h = heads[g];
      float block_max = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < count; ++j) {
        float dot = Ops::template dot<KV>(q, p.k_cache, base + j * hd, hd);
        if constexpr (scaled) dot *= k_factors[j];
        scores[j] = dot * p.scale;
        block_max = std::max(block_max, scores[j]);
      }
      if (block_max > h.max_score) {
        // Rescale what was accumulated against the old maximum (exp(-inf) = 0 on the first block).
        const float correction = std::exp(h.max_score - block_max);
        h.sum *= correction;
        for (std::int64_t d = 0; d < hd; ++d) h.acc[d] *= correction;
        h.max_score = block_max;
      }
      for (std::int64_t j = 0; j < count; ++j) {
        const float weight = std::exp(scores[j] - h.max_score);
        h.sum += weight;
        Ops::template add_scaled<KV>(h.acc, scaled ? weight * v_factors[j] : weight, p.v_cache, base + j * hd, hd);
      }
    }
  }

  for (std::int64_t g = 0; g < group; ++g) {
    float* out = p.out + t * p.out_stride + (kv_head * group + g) * hd;
    const float inv_sum = 1.0f / heads[g].sum;
    for (std::int64_t d = 0; d < hd; ++d) out[d] = heads[g].acc[d] * inv_sum;
  }
}

template <class Ops>
void run_with(const paged_attention_params& p, const stream& s) {
  cpu::dispatch_dtype(p.kv_type, [&]<dtype KV>() {
    cpu::parallel_for(s, p.tokens * p.num_kv_heads, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t item = begin; item < end; ++item) {
        attend<Ops, KV>(p, item / p.num_kv_heads, item % p.num_kv_heads);
      }
    });
  });
}

}  // namespace

status run_paged_attention(const paged_attention_params& p, const stream& s) {
  if (s.where == device::cuda) return cuda::run_paged_attention(p, s);
  if (p.num_kv_heads <= 0 || p.num_heads % p.num_kv_heads != 0) {
    return invalid_argument("paged_attention: num_heads must be a multiple of num_kv_heads");
  }
  if (p.head_dim <= 0 || p.head_dim > max_attention_head_dim) {
    return invalid_argument(format("paged_attention: head_dim {} outside 1..{}", p.head_dim, max_attention_head_dim));
  }
  if (p.num_heads / p.num_kv_heads > max_attention_group) {
    return invalid_argument(format("paged_attention: more than {} query heads per KV head", max_attention_group));
  }
  if (p.block_size <= 0 || p.block_size > max_block_size) {
    return invalid_argument(format("paged_attention: block size {} outside 1..{}", p.block_size, max_block_size));
  }
  if (kv_cache_scaled(p.kv_type) && (p.k_scales == nullptr || p.v_scales == nullptr)) {
    return invalid_argument(format("paged_attention: a {} cache needs K and V scales", to_string(p.kv_type)));
  }
  if (p.tokens > 0 && (p.block_tables == nullptr || p.table_begin == nullptr)) {
    return invalid_argument("paged_attention: no block tables");
  }
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    const std::int64_t blocks_needed = (static_cast<std::int64_t>(p.pos[t]) + p.block_size) / p.block_size;
    const std::int32_t* row = p.table_begin + p.seq[t];
    if (p.pos[t] < 0 || blocks_needed > row[1] - row[0]) {
      return invalid_argument(format("paged_attention: position {} beyond the block table", p.pos[t]));
    }
    const std::int32_t* table = p.block_tables + row[0];
    for (std::int64_t b = 0; b < blocks_needed; ++b) {
      if (table[b] < 0 || table[b] >= p.num_blocks) {
        return invalid_argument(format("paged_attention: block {} outside the cache", table[b]));
      }
    }
  }
#if defined(__x86_64__)
  if (cpu::active_isa() == cpu::isa::avx512) {
    run_with<avx512_ops>(p, s);
    return {};
  }
#endif
  run_with<generic_ops>(p, s);
  return {};
}

}  // namespace edge::kernels
