// CPU paged attention. One work item is (token, KV head): the group of query heads that share
// the KV head walk the token's context block by block, keeping a running maximum, a running
// sum of exponentials and an output accumulator per head (online softmax), so no buffer grows
// with the context length.
#include "kernels/paged_attention/paged_attention.h"

#include <array>
#include <cmath>
#include <limits>

#include "edge/common/format.h"
#include "kernels/cpu/block_tables.h"
#include "kernels/cpu/isa.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/cpu/load.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/row_ops.h"
#include "kernels/cuda/launchers.h"

namespace edge::kernels {
namespace {

using cpu::rows::generic_ops;
#if defined(__x86_64__)
using cpu::rows::avx512_ops;
#endif

constexpr std::int64_t max_block_size = 256;

// The running softmax state of one query head.
struct head_state {
  float max_score;
  float sum;
  float* acc;  // [head_dim]
};

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
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
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
    EDGE_RETURN_IF_ERROR(cpu::check_block_table("paged_attention", p.pos, p.seq, p.block_tables, p.table_begin,
                                                p.block_size, p.num_blocks, t));
  }
#if defined(__x86_64__)
  if (cpu::has(cpu::isa::avx512)) {
    run_with<avx512_ops>(p, s);
    return {};
  }
#endif
  run_with<generic_ops>(p, s);
  return {};
}

}  // namespace edge::kernels
