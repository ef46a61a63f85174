// CPU MLA attention and DSA selection. One MLA work item is (token, a band of heads): the band
// walks the token's positions in tiles of up to one block, each latent row read once for all
// heads of the band, with a running maximum, sum and latent accumulator per head (online
// softmax), so nothing grows with the context length.
#include "kernels/mla_attention/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "edge/common/format.h"
#include "kernels/cpu/block_tables.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/load.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/row_ops.h"
#include "kernels/cuda/launchers.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/matmul/matmul.h"

namespace edge::kernels {
namespace {

using cpu::rows::generic_ops;
#if defined(__x86_64__)
using cpu::rows::avx512_ops;
#endif

// Heads per work item: their accumulators ([band, latent_dim] floats) stay in the L1/L2 cache,
// and a 64-head model still splits into 8 items per token for the pool.
constexpr std::int64_t head_band = 8;
// Positions per tile: the scores of a tile for the band live on the stack.
constexpr std::int64_t tile_positions = 32;

// Where position `position` of a token lies: its row in [num_blocks, block_size].
inline std::int64_t cache_row(const std::int32_t* table, std::int64_t block_size, std::int64_t position) {
  return static_cast<std::int64_t>(table[position / block_size]) * block_size + position % block_size;
}

// The positions a token reads, in order: the selection, or 0..pos.
struct token_positions {
  const std::int32_t* list = nullptr;  // null: 0..count-1
  std::int64_t count = 0;
  std::int64_t at(std::int64_t i) const { return list != nullptr ? list[i] : i; }
};

token_positions positions_of(const std::int32_t* selected, const std::int32_t* selected_count,
                             std::int64_t select_stride, const std::int32_t* pos, std::int64_t t) {
  if (selected_count != nullptr && selected_count[t] > 0) {
    return {.list = selected + t * select_stride, .count = selected_count[t]};
  }
  return {.list = nullptr, .count = static_cast<std::int64_t>(pos[t]) + 1};
}

template <class Ops, dtype KV>
void attend_band(const mla_attention_params& p, std::int64_t t, std::int64_t first_head, std::int64_t heads) {
  constexpr bool scaled = kv_cache_scaled(KV);
  const std::int64_t latent = p.latent_dim;
  const std::int64_t row_width = p.latent_dim + p.rope_dim;
  const std::int32_t* table = p.block_tables + p.table_begin[p.seq[t]];
  const token_positions positions = positions_of(p.selected, p.selected_count, p.select_stride, p.pos, t);

  float acc[head_band * max_mla_row];  // [heads, latent_dim]
  std::fill_n(acc, heads * latent, 0.0f);
  float max_score[head_band];
  float sum[head_band];
  std::fill_n(max_score, heads, -std::numeric_limits<float>::infinity());
  std::fill_n(sum, heads, 0.0f);

  float scores[head_band][tile_positions];
  std::int64_t rows[tile_positions];
  float factors[tile_positions];  // a row's scale times the path's fp8 unit
  for (std::int64_t first = 0; first < positions.count; first += tile_positions) {
    const std::int64_t count = std::min(tile_positions, positions.count - first);
    for (std::int64_t j = 0; j < count; ++j) {
      rows[j] = cache_row(table, p.block_size, positions.at(first + j));
      factors[j] = scaled ? p.scales[rows[j]] * Ops::fp8_unit : 1.0f;
    }
    for (std::int64_t h = 0; h < heads; ++h) {
      const float* ql = p.q_latent + t * p.q_latent_stride + (first_head + h) * latent;
      const float* qr = p.q_rope + t * p.q_rope_stride + (first_head + h) * p.q_rope_head_stride;
      float block_max = -std::numeric_limits<float>::infinity();
      for (std::int64_t j = 0; j < count; ++j) {
        const std::int64_t base = rows[j] * row_width;
        const float dot = Ops::template dot<KV>(ql, p.cache, base, latent) +
                          Ops::template dot<KV>(qr, p.cache, base + latent, p.rope_dim);
        scores[h][j] = dot * factors[j] * p.scale;
        block_max = std::max(block_max, scores[h][j]);
      }
      float* a = acc + h * latent;
      if (block_max > max_score[h]) {
        // Rescale what was accumulated against the old maximum (exp(-inf) = 0 on the first tile).
        const float correction = std::exp(max_score[h] - block_max);
        sum[h] *= correction;
        for (std::int64_t d = 0; d < latent; ++d) a[d] *= correction;
        max_score[h] = block_max;
      }
      for (std::int64_t j = 0; j < count; ++j) {
        const float weight = std::exp(scores[h][j] - max_score[h]);
        sum[h] += weight;
        Ops::template add_scaled<KV>(a, weight * factors[j], p.cache, rows[j] * row_width, latent);
      }
    }
  }
  for (std::int64_t h = 0; h < heads; ++h) {
    float* out = p.out + t * p.out_stride + (first_head + h) * latent;
    const float inv_sum = 1.0f / sum[h];
    for (std::int64_t d = 0; d < latent; ++d) out[d] = acc[h * latent + d] * inv_sum;
  }
}

template <class Ops>
void run_mla_with(const mla_attention_params& p, const stream& s) {
  const std::int64_t bands = (p.num_heads + head_band - 1) / head_band;
  cpu::dispatch_dtype(p.kv_type, [&]<dtype KV>() {
    cpu::parallel_for(s, p.tokens * bands, 1, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t item = begin; item < end; ++item) {
        const std::int64_t first_head = item % bands * head_band;
        attend_band<Ops, KV>(p, item / bands, first_head, std::min(head_band, p.num_heads - first_head));
      }
    });
  });
}

status check_cache_shape(std::int64_t block_size, std::int64_t tokens, const void* tables, const void* begin,
                         dtype type, const float* scales, std::string_view op) {
  if (block_size <= 0) return invalid_argument(format("{}: block size {} must be positive", op, block_size));
  if (kv_cache_scaled(type) && scales == nullptr) {
    return invalid_argument(format("{}: a {} cache needs its scales", op, to_string(type)));
  }
  if (tokens > 0 && (tables == nullptr || begin == nullptr)) return invalid_argument(format("{}: no block tables", op));
  return {};
}

status check_mla(const mla_attention_params& p) {
  if (p.num_heads <= 0 || p.num_heads > max_mla_heads) {
    return invalid_argument(format("mla_attention: {} heads outside 1..{}", p.num_heads, max_mla_heads));
  }
  if (p.latent_dim <= 0 || p.rope_dim < 0 || p.latent_dim + p.rope_dim > max_mla_row) {
    return invalid_argument(format("mla_attention: a row of {} + {} outside 1..{}", p.latent_dim, p.rope_dim, max_mla_row));
  }
  if (p.q_latent_stride < p.num_heads * p.latent_dim || p.out_stride < p.num_heads * p.latent_dim ||
      p.q_rope_head_stride < p.rope_dim || p.q_rope_stride < (p.num_heads - 1) * p.q_rope_head_stride + p.rope_dim) {
    return invalid_argument("mla_attention: strides too small for the rows");
  }
  if ((p.selected == nullptr) != (p.selected_count == nullptr)) {
    return invalid_argument("mla_attention: a selection needs both its positions and its counts");
  }
  return check_cache_shape(p.block_size, p.tokens, p.block_tables, p.table_begin, p.kv_type, p.scales, "mla_attention");
}

}  // namespace

status run_mla_attention(const mla_attention_params& p, const stream& s) {
  EDGE_RETURN_IF_ERROR(check_mla(p));
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_mla_attention(p, s);
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    EDGE_RETURN_IF_ERROR(cpu::check_block_table("mla_attention", p.pos, p.seq, p.block_tables, p.table_begin,
                                                p.block_size, p.num_blocks, t));
    if (p.selected_count == nullptr || p.selected_count[t] == 0) continue;
    if (p.selected_count[t] < 0 || p.selected_count[t] > p.select_stride) {
      return invalid_argument(format("mla_attention: a selection of {} positions", p.selected_count[t]));
    }
    const std::int32_t* list = p.selected + t * p.select_stride;
    for (std::int64_t i = 0; i < p.selected_count[t]; ++i) {
      if (list[i] < 0 || list[i] > p.pos[t] || (i > 0 && list[i] <= list[i - 1])) {
        return invalid_argument(format("mla_attention: selected position {} of a token at {} (ascending, at most its own)",
                                       list[i], p.pos[t]));
      }
    }
  }
#if defined(__x86_64__)
  if (cpu::has(cpu::isa::avx512)) {
    run_mla_with<avx512_ops>(p, s);
    return {};
  }
#endif
  run_mla_with<generic_ops>(p, s);
  return {};
}

namespace {

template <class Ops, dtype KV>
void select_token(const dsa_select_params& p, std::int64_t t, std::vector<float>& scores,
                  std::vector<std::int32_t>& order) {
  const std::int64_t context = static_cast<std::int64_t>(p.pos[t]) + 1;
  if (context <= p.top_k) {
    p.selected_count[t] = 0;
    return;
  }
  const std::int32_t* table = p.block_tables + p.table_begin[p.seq[t]];
  const float* q = p.q + t * p.q_stride;
  const float* w = p.head_weights + t * p.weights_stride;
  scores.resize(static_cast<std::size_t>(context));
  for (std::int64_t s = 0; s < context; ++s) {
    const std::int64_t row = cache_row(table, p.block_size, s);
    const float factor = kv_cache_scaled(KV) ? p.key_scales[row] * Ops::fp8_unit : 1.0f;
    float score = 0.0f;
    for (std::int64_t h = 0; h < p.index_heads; ++h) {
      const float dot = Ops::template dot<KV>(q + h * p.index_dim, p.key_cache, row * p.index_dim, p.index_dim) * factor;
      score += w[h] * std::max(dot, 0.0f);
    }
    scores[static_cast<std::size_t>(s)] = score * p.weight_scale;
  }
  order.resize(static_cast<std::size_t>(context));
  std::iota(order.begin(), order.end(), 0);
  const auto better = [&](std::int32_t a, std::int32_t b) {
    const float sa = scores[static_cast<std::size_t>(a)];
    const float sb = scores[static_cast<std::size_t>(b)];
    return sa > sb || (sa == sb && a < b);
  };
  std::nth_element(order.begin(), order.begin() + p.top_k - 1, order.end(), better);
  std::sort(order.begin(), order.begin() + p.top_k);
  std::copy_n(order.begin(), p.top_k, p.selected + t * p.top_k);
  p.selected_count[t] = static_cast<std::int32_t>(p.top_k);
}

template <class Ops>
void run_select_with(const dsa_select_params& p, const stream& s) {
  cpu::dispatch_dtype(p.kv_type, [&]<dtype KV>() {
    cpu::parallel_for(s, p.tokens, 1, [&](std::int64_t begin, std::int64_t end) {
      std::vector<float> scores;
      std::vector<std::int32_t> order;
      for (std::int64_t t = begin; t < end; ++t) select_token<Ops, KV>(p, t, scores, order);
    });
  });
}

}  // namespace

status run_dsa_select(const dsa_select_params& p, const stream& s) {
  if (p.index_heads <= 0 || p.index_dim <= 0 || p.top_k <= 0 || p.q_stride < p.index_heads * p.index_dim ||
      p.weights_stride < p.index_heads) {
    return invalid_argument("dsa_select: bad shape or strides");
  }
  EDGE_RETURN_IF_ERROR(
      check_cache_shape(p.block_size, p.tokens, p.block_tables, p.table_begin, p.kv_type, p.key_scales, "dsa_select"));
  // The scores, then the pick.
  if (s.where == device::count) {
    count_launches(s, 2);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_dsa_select(p, s);
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    EDGE_RETURN_IF_ERROR(cpu::check_block_table("dsa_select", p.pos, p.seq, p.block_tables, p.table_begin,
                                                p.block_size, p.num_blocks, t));
  }
#if defined(__x86_64__)
  if (cpu::has(cpu::isa::avx512)) {
    run_select_with<avx512_ops>(p, s);
    return {};
  }
#endif
  run_select_with<generic_ops>(p, s);
  return {};
}

namespace {

template <class Ops>
void prefill_chunk(const mla_prefill_params& p, const stream& s, std::int64_t first, std::int64_t count,
                   const float* latents, const float* kv, float* state) {
  const std::int64_t row = p.latent_dim + p.rope_dim;
  const std::int64_t per_head = p.nope + p.v_head_dim;
  const std::int64_t kv_stride = p.heads * per_head;
  const std::int64_t state_width = p.v_head_dim + 2;
  cpu::parallel_for(s, p.tokens * p.heads, 4, [&](std::int64_t begin, std::int64_t end) {
    float scores[mla_prefill_chunk];
    std::int64_t keys[mla_prefill_chunk];
    for (std::int64_t item = begin; item < end; ++item) {
      const std::int64_t t = item / p.heads;
      const std::int64_t h = item % p.heads;
      const std::int64_t pos = p.first_position + t;
      if (first > pos) continue;  // every key of the chunk comes after the token
      const std::int64_t causal = std::min(count, pos - first + 1);
      // The chunk's keys this token reads: all causal ones, or those its selection lists.
      std::int64_t n = 0;
      if (p.selected_count != nullptr && p.selected_count[t] > 0) {
        const std::int32_t* list = p.selected + t * p.select_stride;
        const std::int32_t* stop = list + p.selected_count[t];
        for (const std::int32_t* at = std::lower_bound(list, stop, static_cast<std::int32_t>(first));
             at != stop && *at < first + causal; ++at) {
          keys[n++] = *at - first;
        }
      } else {
        for (std::int64_t j = 0; j < causal; ++j) keys[n++] = j;
      }
      if (n == 0) continue;
      const float* q = p.q + t * p.q_stride + h * (p.nope + p.rope_dim);
      float block_max = -std::numeric_limits<float>::infinity();
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t j = keys[i];
        const float dot = Ops::template dot<dtype::f32>(q, kv, j * kv_stride + h * per_head, p.nope) +
                          Ops::template dot<dtype::f32>(q + p.nope, latents, j * row + p.latent_dim, p.rope_dim);
        scores[i] = dot * p.scale;
        block_max = std::max(block_max, scores[i]);
      }
      float* st = state + item * state_width;  // acc [v_head_dim], then max, then sum
      float& max_score = st[p.v_head_dim];
      float& sum = st[p.v_head_dim + 1];
      if (block_max > max_score) {
        const float correction = std::exp(max_score - block_max);
        sum *= correction;
        for (std::int64_t d = 0; d < p.v_head_dim; ++d) st[d] *= correction;
        max_score = block_max;
      }
      for (std::int64_t i = 0; i < n; ++i) {
        const float weight = std::exp(scores[i] - max_score);
        sum += weight;
        Ops::template add_scaled<dtype::f32>(st, weight, kv, keys[i] * kv_stride + h * per_head + p.nope, p.v_head_dim);
      }
    }
  });
}

template <class Ops>
status run_prefill_with(const mla_prefill_params& p, const stream& s) {
  const std::int64_t row = p.latent_dim + p.rope_dim;
  const std::int64_t kv_width = p.heads * (p.nope + p.v_head_dim);
  const std::int64_t state_width = p.v_head_dim + 2;
  float* latents = p.workspace;                       // [chunk, latent + rope], dequantized
  float* kv = latents + mla_prefill_chunk * row;      // [chunk, heads, nope + v]
  float* state = kv + mla_prefill_chunk * kv_width;   // [tokens, heads, v + 2]
  for (std::int64_t i = 0; i < p.tokens * p.heads; ++i) {
    float* st = state + i * state_width;
    std::fill_n(st, p.v_head_dim, 0.0f);
    st[p.v_head_dim] = -std::numeric_limits<float>::infinity();
    st[p.v_head_dim + 1] = 0.0f;
  }
  const std::int64_t context = p.first_position + p.tokens;
  for (std::int64_t first = 0; first < context; first += mla_prefill_chunk) {
    const std::int64_t count = std::min(mla_prefill_chunk, context - first);
    cpu::dispatch_dtype(p.kv_type, [&]<dtype KV>() {
      for (std::int64_t j = 0; j < count; ++j) {
        const std::int64_t r = cache_row(p.block_table, p.block_size, first + j);
        const float factor = kv_cache_scaled(KV) ? p.scales[r] : 1.0f;
        float* out = latents + j * row;
        for (std::int64_t d = 0; d < row; ++d) out[d] = cpu::rows::load_generic<KV>(p.cache, r * row + d) * factor;
      }
    });
    EDGE_RETURN_IF_ERROR(run_matmul({.x = latents, .w = p.kv_b, .y = kv, .tokens = count, .n = kv_width,
                                     .k = p.latent_dim, .x_stride = row, .y_stride = kv_width},
                                    s));
    prefill_chunk<Ops>(p, s, first, count, latents, kv, state);
  }
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    for (std::int64_t h = 0; h < p.heads; ++h) {
      const float* st = state + (t * p.heads + h) * state_width;
      float* out = p.out + t * p.out_stride + h * p.v_head_dim;
      const float inv_sum = 1.0f / st[p.v_head_dim + 1];
      for (std::int64_t d = 0; d < p.v_head_dim; ++d) out[d] = st[d] * inv_sum;
    }
  }
  return {};
}

}  // namespace

status run_mla_prefill(const mla_prefill_params& p, const stream& s) {
  if (s.where == device::cuda) {
    return failed_precondition("mla_prefill runs on the CPU only; a CUDA stream takes the absorbed form");
  }
  if (p.heads <= 0 || p.latent_dim <= 0 || p.rope_dim < 0 || p.nope <= 0 || p.v_head_dim <= 0 || p.tokens < 0 ||
      p.first_position < 0 || p.q_stride < p.heads * (p.nope + p.rope_dim) || p.out_stride < p.heads * p.v_head_dim) {
    return invalid_argument("mla_prefill: bad shape or strides");
  }
  if (p.workspace_floats < mla_prefill_workspace_floats(p.tokens, p.heads, p.latent_dim, p.rope_dim, p.nope, p.v_head_dim)) {
    return invalid_argument("mla_prefill: the workspace is too small");
  }
  if (p.block_size <= 0 || p.block_table == nullptr || (kv_cache_scaled(p.kv_type) && p.scales == nullptr)) {
    return invalid_argument("mla_prefill: no block table, or a scaled cache without its scales");
  }
  const std::int64_t blocks = (p.first_position + p.tokens + p.block_size - 1) / p.block_size;
  for (std::int64_t b = 0; b < blocks; ++b) {
    if (p.block_table[b] < 0 || p.block_table[b] >= p.num_blocks) {
      return invalid_argument(format("mla_prefill: block {} outside the cache", p.block_table[b]));
    }
  }
  if (p.tokens == 0) return {};
#if defined(__x86_64__)
  if (cpu::has(cpu::isa::avx512)) return run_prefill_with<avx512_ops>(p, s);
#endif
  return run_prefill_with<generic_ops>(p, s);
}

}  // namespace edge::kernels
