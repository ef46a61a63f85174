// The inputs of the MLA attention and DSA selection cases (kernel_cases.h), built the same way by
// the GPU program and the CPU suite, and their plain references in double, from what
// mla_attention.h describes. The mutation test builds its "wrong kernels" from the MLA reference
// too: the same sums with one thing changed.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "edge/common/thread_pool.h"
#include "kernel_cases.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/mla_attention/mla_attention.h"
#include "problems.h"

namespace edge::kernel_cases {

// ---- the paged rows both read -----------------------------------------------------------------

// A paged cache of one row of `width` values per position (MLA latent rows, or DSA index keys)
// holding sequences of the given contexts, written by the CPU's kv_cache_write into blocks handed
// out in a shuffled order; the tables ragged, as the executor stages them. Each position's row
// times its own 2^U(-3, 3), so FP8 row scales differ from one position to the next.
struct paged_rows {
  dtype type = dtype::f32;
  std::int64_t width = 0;
  std::int64_t block_size = 0;
  std::int64_t num_blocks = 0;
  std::vector<std::uint8_t> cache;    // [num_blocks, block_size, width] of type
  std::vector<float> scales;          // [num_blocks, block_size] (fp8)
  std::vector<std::int32_t> tables;   // [table_begin[sequences]]
  std::vector<std::int32_t> table_begin;

  bool scaled() const { return kernels::kv_cache_scaled(type); }
  // The cache row of a sequence's position.
  std::int64_t row(std::int64_t seq, std::int64_t position) const {
    const auto block = tables[static_cast<std::size_t>(table_begin[static_cast<std::size_t>(seq)] + position / block_size)];
    return static_cast<std::int64_t>(block) * block_size + position % block_size;
  }
  // Element d of a cache row as stored, without its scale.
  float code(std::int64_t cache_row, std::int64_t d) const {
    return decode(cache.data(), type, static_cast<std::size_t>(cache_row * width + d));
  }
  float scale(std::int64_t cache_row) const { return scaled() ? scales[static_cast<std::size_t>(cache_row)] : 1.0f; }
  // Element d of a position's row as the kernels read it: decoded, times the row's scale.
  double value(std::int64_t seq, std::int64_t position, std::int64_t d) const {
    const std::int64_t r = row(seq, position);
    return static_cast<double>(code(r, d)) * scale(r);
  }
};

inline paged_rows make_paged_rows(const std::vector<std::int64_t>& contexts, std::int64_t width, std::int64_t block_size,
                                  dtype type, std::uint32_t seed, const kernels::stream& s) {
  paged_rows p{.type = type, .width = width, .block_size = block_size};
  std::int64_t positions = 0;
  for (const std::int64_t c : contexts) positions += c;
  block_tables t = shuffled_block_tables(contexts, block_size, seed);
  p.tables = std::move(t.tables);
  p.table_begin = std::move(t.table_begin);
  p.num_blocks = t.num_blocks;
  std::vector<std::int64_t> slots;
  for (std::size_t q = 0; q < contexts.size(); ++q) {
    for (std::int64_t i = 0; i < contexts[q]; ++i) slots.push_back(p.row(static_cast<std::int64_t>(q), i));
  }
  const auto rows = scaled_floats(static_cast<std::size_t>(positions * width), seed + 1, static_cast<std::size_t>(width),
                                  3.0f);
  p.cache.assign(static_cast<std::size_t>(p.num_blocks * block_size * width) * kernels::dtype_size(type), 0);
  p.scales.assign(static_cast<std::size_t>(p.num_blocks * block_size), 0.0f);
  require_ok(kernels::run_kv_cache_write({.k = rows.data(), .v = nullptr, .k_cache = p.cache.data(), .v_cache = nullptr,
                                          .k_scales = p.scaled() ? p.scales.data() : nullptr, .kv_type = type,
                                          .slots = slots.data(), .tokens = positions, .num_kv_heads = 1,
                                          .head_dim = width, .block_size = block_size, .num_blocks = p.num_blocks,
                                          .kv_stride = width},
                                         s),
             "kv cache write (rows)");
  return p;
}

// A batch of query tokens over the sequences of a paged_rows: one decode token at the last
// position of each sequence but the last, whose last `chunk` positions are a prefill run.
struct query_batch {
  std::vector<std::int32_t> seq, pos;  // [tokens]
};

inline query_batch make_queries(const std::vector<std::int64_t>& contexts, std::int64_t chunk) {
  query_batch b;
  for (std::size_t s = 0; s + 1 < contexts.size(); ++s) {
    b.seq.push_back(static_cast<std::int32_t>(s));
    b.pos.push_back(static_cast<std::int32_t>(contexts[s] - 1));
  }
  for (std::int64_t i = 0; i < chunk; ++i) {
    b.seq.push_back(static_cast<std::int32_t>(contexts.size() - 1));
    b.pos.push_back(static_cast<std::int32_t>(contexts.back() - chunk + i));
  }
  return b;
}

// The tokens of a batch a reference checks: all of them, or with `sample` the decode tokens and
// the first and last of the prefill run.
inline std::vector<std::int64_t> checked_tokens(const query_batch& b, std::int64_t chunk, bool sample) {
  const auto tokens = static_cast<std::int64_t>(b.seq.size());
  std::vector<std::int64_t> out;
  for (std::int64_t t = 0; t < tokens; ++t) {
    if (!sample || t < tokens - chunk || t == tokens - chunk || t == tokens - 1) out.push_back(t);
  }
  return out;
}

// ---- MLA attention ----------------------------------------------------------------------------

struct mla_problem {
  mla_case c;
  paged_rows cache;             // rows [latent | rope]
  query_batch batch;
  std::int64_t tokens = 0;
  // q_rope lies in q rows of nope + rope per head, as forward.cpp's: a strided view.
  static constexpr std::int64_t nope = 3;
  std::vector<float> q_latent;  // [tokens, heads, latent]: each head's row times its own 2^U(-1, 1)
  std::vector<float> q_full;    // [tokens, heads, nope + rope]
  // A selection: select_k positions at random (ascending) for each token with more, else 0.
  std::vector<std::int32_t> selected;  // [tokens, select_k]
  std::vector<std::int32_t> counts;    // [tokens]
  float scale = 0.0f;                  // 1 / sqrt(latent + rope)

  std::int64_t width() const { return c.latent + c.rope; }
  std::int64_t q_rope_head_stride() const { return nope + c.rope; }
  // The parameters over these (host) arrays, with or without the selection; a caller swaps in
  // device copies.
  kernels::mla_attention_params params(float* out, bool select) const {
    return {.q_latent = q_latent.data(), .q_rope = q_full.data() + nope, .out = out, .cache = cache.cache.data(),
            .scales = cache.scaled() ? cache.scales.data() : nullptr, .kv_type = c.kv, .seq = batch.seq.data(),
            .pos = batch.pos.data(), .block_tables = cache.tables.data(), .table_begin = cache.table_begin.data(),
            .selected = select ? selected.data() : nullptr, .selected_count = select ? counts.data() : nullptr,
            .select_stride = c.select_k, .tokens = tokens, .num_heads = c.heads, .latent_dim = c.latent,
            .rope_dim = c.rope, .block_size = c.block_size, .num_blocks = cache.num_blocks,
            .q_latent_stride = c.heads * c.latent, .q_rope_stride = c.heads * q_rope_head_stride(),
            .q_rope_head_stride = q_rope_head_stride(), .out_stride = c.heads * c.latent, .scale = scale};
  }
  // The positions token t attends: its selection, or 0..pos.
  std::vector<std::int64_t> attended(std::int64_t t, bool select) const {
    std::vector<std::int64_t> out;
    const auto count = counts[static_cast<std::size_t>(t)];
    if (select && count > 0) {
      for (std::int32_t i = 0; i < count; ++i) out.push_back(selected[static_cast<std::size_t>(t * c.select_k + i)]);
    } else {
      for (std::int64_t j = 0; j <= batch.pos[static_cast<std::size_t>(t)]; ++j) out.push_back(j);
    }
    return out;
  }
  // The problem of tokens `keep` alone (a token's result does not depend on its batch).
  mla_problem only(const std::vector<std::int64_t>& keep) const {
    mla_problem p = *this;
    p.tokens = static_cast<std::int64_t>(keep.size());
    p.batch = {};
    p.q_latent.clear();
    p.q_full.clear();
    p.selected.clear();
    p.counts.clear();
    const std::int64_t latent_row = c.heads * c.latent;
    const std::int64_t full_row = c.heads * q_rope_head_stride();
    for (const std::int64_t t : keep) {
      const auto at = static_cast<std::size_t>(t);
      p.batch.seq.push_back(batch.seq[at]);
      p.batch.pos.push_back(batch.pos[at]);
      p.q_latent.insert(p.q_latent.end(), q_latent.begin() + t * latent_row, q_latent.begin() + (t + 1) * latent_row);
      p.q_full.insert(p.q_full.end(), q_full.begin() + t * full_row, q_full.begin() + (t + 1) * full_row);
      p.selected.insert(p.selected.end(), selected.begin() + t * c.select_k, selected.begin() + (t + 1) * c.select_k);
      p.counts.push_back(counts[at]);
    }
    return p;
  }
};

inline mla_problem make_mla_problem(const mla_case& c, std::uint32_t seed, const kernels::stream& s) {
  mla_problem p{.c = c};
  p.cache = make_paged_rows(c.contexts, p.width(), c.block_size, c.kv, seed, s);
  p.batch = make_queries(c.contexts, c.chunk);
  p.tokens = static_cast<std::int64_t>(p.batch.seq.size());
  p.q_latent = scaled_floats(static_cast<std::size_t>(p.tokens * c.heads * c.latent), seed + 2,
                             static_cast<std::size_t>(c.latent), 1.0f);
  p.q_full = scaled_floats(static_cast<std::size_t>(p.tokens * c.heads * p.q_rope_head_stride()), seed + 3,
                           static_cast<std::size_t>(p.q_rope_head_stride()), 1.0f);
  p.selected.assign(static_cast<std::size_t>(p.tokens * c.select_k), -1);
  p.counts.assign(static_cast<std::size_t>(p.tokens), 0);
  std::mt19937 rng(seed + 4);
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    const std::int32_t pos = p.batch.pos[static_cast<std::size_t>(t)];
    if (pos + 1 <= c.select_k) continue;
    std::vector<std::int32_t> all(static_cast<std::size_t>(pos + 1));
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(static_cast<std::size_t>(c.select_k));
    std::sort(all.begin(), all.end());
    std::copy(all.begin(), all.end(), p.selected.begin() + t * c.select_k);
    p.counts[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(c.select_k);
  }
  p.scale = 1.0f / std::sqrt(static_cast<float>(p.width()));
  return p;
}

// The largest |c| (latent part, times the row's scale) each token attends [tokens]: mla_error's
// denominator, the same for every head.
inline std::vector<double> mla_attended_max(const mla_problem& p, bool select) {
  std::vector<double> out(static_cast<std::size_t>(p.tokens), 0.0);
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    const std::int64_t seq = p.batch.seq[static_cast<std::size_t>(t)];
    double m = 0.0;
    for (const std::int64_t j : p.attended(t, select)) {
      const std::int64_t r = p.cache.row(seq, j);
      double code = 0.0;
      for (std::int64_t d = 0; d < p.c.latent; ++d) code = std::max(code, static_cast<double>(std::fabs(p.cache.code(r, d))));
      m = std::max(m, code * p.cache.scale(r));
    }
    out[static_cast<std::size_t>(t)] = m;
  }
  return out;
}

// How a reference MLA attention computes: exactly (double), or as the tensor cores do (the
// queries and the softmax weights times an FP8 row's scale rounded to bf16; mla_attention.cu), or
// with one of the bugs the mutation test injects.
enum class mla_flaw {
  none,
  neighbour_row_scale,    // each row read with the next cache row's scale
  value_neighbour_scale,  // the score with the row's own scale, the latent sum with the next row's
  rope_unscaled,          // the RoPE part of the score without the row's scale
  own_key_missed,         // the last position attended left out (the query's own, without a selection)
};

struct mla_reference {
  std::vector<std::int64_t> tokens, heads;  // what it holds
  std::vector<double> out;    // [tokens, heads, latent]
  std::vector<double> c_max;  // [tokens] the largest |c| the token attends
};

// What mla_attention.h describes, in double: per head, score_j = scale · (q_latent · c_j +
// q_rope · k_pe_j) over the positions j the token attends (each row [c_j | k_pe_j] decoded and
// times its scale), and the softmax-weighted mean of the latents c_j.
inline mla_reference reference_mla(const mla_problem& p, bool select, const std::vector<std::int64_t>& tokens,
                                   const std::vector<std::int64_t>& heads, bool bf16_tensor_cores,
                                   mla_flaw flaw = mla_flaw::none, thread_pool* pool = nullptr) {
  const auto& c = p.c;
  mla_reference r{.tokens = tokens, .heads = heads};
  const auto nh = static_cast<std::int64_t>(heads.size());
  r.out.assign(static_cast<std::size_t>(static_cast<std::int64_t>(tokens.size()) * nh * c.latent), 0.0);
  const auto all_max = mla_attended_max(p, select);
  for (const std::int64_t t : tokens) r.c_max.push_back(all_max[static_cast<std::size_t>(t)]);
  const std::size_t scale_count = p.cache.scales.size();
  const auto row_scale = [&](std::int64_t row, bool neighbour) -> double {
    if (!p.cache.scaled()) return 1.0;
    return p.cache.scales[neighbour ? std::min(static_cast<std::size_t>(row + 1), scale_count - 1)
                                    : static_cast<std::size_t>(row)];
  };
  const auto rounded = [&](double v) { return bf16_tensor_cores ? static_cast<double>(bf16_round(static_cast<float>(v))) : v; };
  const std::int64_t width = p.width();
  // One token of the reference (its rows decoded once for all its heads), on any thread.
  const auto one = [&](std::int64_t i) {
    const std::int64_t t = tokens[static_cast<std::size_t>(i)];
    const std::int64_t seq = p.batch.seq[static_cast<std::size_t>(t)];
    std::vector<std::int64_t> positions = p.attended(t, select);
    if (flaw == mla_flaw::own_key_missed && positions.size() > 1) positions.pop_back();
    const auto n = static_cast<std::int64_t>(positions.size());
    // Up to 4096 rows of 576 per token: this thread's buffers, reused.
    thread_local std::vector<float> codes;  // [positions, width]
    thread_local std::vector<std::int64_t> rows;
    codes.resize(static_cast<std::size_t>(n * width));
    rows.resize(static_cast<std::size_t>(n));
    for (std::int64_t j = 0; j < n; ++j) {
      rows[static_cast<std::size_t>(j)] = p.cache.row(seq, positions[static_cast<std::size_t>(j)]);
      for (std::int64_t d = 0; d < width; ++d) {
        codes[static_cast<std::size_t>(j * width + d)] = p.cache.code(rows[static_cast<std::size_t>(j)], d);
      }
    }
    std::vector<double> q(static_cast<std::size_t>(width)), scores(static_cast<std::size_t>(n));
    for (std::int64_t k = 0; k < nh; ++k) {
      const std::int64_t h = heads[static_cast<std::size_t>(k)];
      const float* ql = p.q_latent.data() + (t * c.heads + h) * c.latent;
      const float* qr = p.q_full.data() + (t * c.heads + h) * p.q_rope_head_stride() + mla_problem::nope;
      for (std::int64_t d = 0; d < c.latent; ++d) q[static_cast<std::size_t>(d)] = rounded(ql[d]);
      for (std::int64_t d = 0; d < c.rope; ++d) q[static_cast<std::size_t>(c.latent + d)] = rounded(qr[d]);
      double best = -INFINITY;
      for (std::int64_t j = 0; j < n; ++j) {
        const float* code = codes.data() + j * width;
        double latent_dot = 0.0, rope_dot = 0.0;
        for (std::int64_t d = 0; d < c.latent; ++d) latent_dot += q[static_cast<std::size_t>(d)] * code[d];
        for (std::int64_t d = c.latent; d < width; ++d) rope_dot += q[static_cast<std::size_t>(d)] * code[d];
        const double s = row_scale(rows[static_cast<std::size_t>(j)], flaw == mla_flaw::neighbour_row_scale);
        double& score = scores[static_cast<std::size_t>(j)];
        score = p.scale * (flaw == mla_flaw::rope_unscaled ? latent_dot * s + rope_dot : (latent_dot + rope_dot) * s);
        best = std::max(best, score);
      }
      double total = 0.0;
      double* o = r.out.data() + (i * nh + k) * c.latent;
      const bool neighbour = flaw == mla_flaw::neighbour_row_scale || flaw == mla_flaw::value_neighbour_scale;
      for (std::int64_t j = 0; j < n; ++j) {
        const double e = std::exp(scores[static_cast<std::size_t>(j)] - best);
        total += e;
        const double w = rounded(e * row_scale(rows[static_cast<std::size_t>(j)], neighbour));
        const float* code = codes.data() + j * width;
        for (std::int64_t d = 0; d < c.latent; ++d) o[d] += w * code[d];
      }
      for (std::int64_t d = 0; d < c.latent; ++d) o[d] /= total;
    }
  };
  const auto count = static_cast<std::int64_t>(tokens.size());
  if (pool != nullptr) {
    pool->parallel_for(0, static_cast<std::size_t>(count), 1, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) one(static_cast<std::int64_t>(i));
    });
  } else {
    for (std::int64_t i = 0; i < count; ++i) one(i);
  }
  return r;
}

// The largest mla_error of an output [tokens, heads, latent] (token stride heads · latent) over
// what the reference holds; `row_of(i)` is the output row of the reference's i-th token.
template <class RowOf>
double worst_mla_error(const std::vector<float>& out, const mla_problem& p, const mla_reference& ref, RowOf row_of) {
  double worst = 0.0;
  const std::int64_t latent = p.c.latent;
  const auto nh = static_cast<std::int64_t>(ref.heads.size());
  for (std::size_t i = 0; i < ref.tokens.size(); ++i) {
    const std::int64_t row = row_of(i);
    for (std::int64_t j = 0; j < nh; ++j) {
      const std::int64_t h = ref.heads[static_cast<std::size_t>(j)];
      for (std::int64_t d = 0; d < latent; ++d) {
        const double want = ref.out[static_cast<std::size_t>((static_cast<std::int64_t>(i) * nh + j) * latent + d)];
        const float got = out[static_cast<std::size_t>((row * p.c.heads + h) * latent + d)];
        worst = std::max(worst, mla_error(got, want, ref.c_max[i]));
      }
    }
  }
  return worst;
}

// ---- DSA selection ----------------------------------------------------------------------------

struct dsa_problem {
  dsa_case c;
  paged_rows keys;
  query_batch batch;
  std::int64_t tokens = 0;
  std::int64_t weights_stride = 0;  // heads + 5: weights_proj's columns of a wider row
  std::vector<float> q;             // [tokens, heads, head_dim], each head's row its own 2^U(-1, 1)
  std::vector<float> weights;       // [tokens, weights_stride] in +-1: both signs
  float weight_scale = 0.0f;        // 1 / sqrt(heads · head_dim)

  std::int64_t longest() const { return *std::max_element(c.contexts.begin(), c.contexts.end()); }
  // The parameters over these (host) arrays; a caller swaps in device copies.
  kernels::dsa_select_params params(std::int32_t* selected, std::int32_t* selected_count) const {
    return {.q = q.data(), .head_weights = weights.data(), .weight_scale = weight_scale,
            .key_cache = keys.cache.data(), .key_scales = keys.scaled() ? keys.scales.data() : nullptr,
            .kv_type = c.kv, .seq = batch.seq.data(), .pos = batch.pos.data(), .block_tables = keys.tables.data(),
            .table_begin = keys.table_begin.data(), .selected = selected, .selected_count = selected_count,
            .tokens = tokens, .index_heads = c.heads, .index_dim = c.head_dim, .top_k = c.top_k,
            .block_size = c.block_size, .num_blocks = keys.num_blocks, .q_stride = c.heads * c.head_dim,
            .weights_stride = weights_stride};
  }
  // The problem of tokens `keep` alone (a token's choice does not depend on its batch).
  dsa_problem only(const std::vector<std::int64_t>& keep) const {
    dsa_problem p = *this;
    p.tokens = static_cast<std::int64_t>(keep.size());
    p.batch = {};
    p.q.clear();
    p.weights.clear();
    const std::int64_t q_row = c.heads * c.head_dim;
    for (const std::int64_t t : keep) {
      p.batch.seq.push_back(batch.seq[static_cast<std::size_t>(t)]);
      p.batch.pos.push_back(batch.pos[static_cast<std::size_t>(t)]);
      p.q.insert(p.q.end(), q.begin() + t * q_row, q.begin() + (t + 1) * q_row);
      p.weights.insert(p.weights.end(), weights.begin() + t * weights_stride, weights.begin() + (t + 1) * weights_stride);
    }
    return p;
  }
};

inline dsa_problem make_dsa_problem(const dsa_case& c, std::uint32_t seed, const kernels::stream& s) {
  dsa_problem p{.c = c};
  p.keys = make_paged_rows(c.contexts, c.head_dim, c.block_size, c.kv, seed, s);
  p.batch = make_queries(c.contexts, c.chunk);
  p.tokens = static_cast<std::int64_t>(p.batch.seq.size());
  p.weights_stride = c.heads + 5;
  p.q = scaled_floats(static_cast<std::size_t>(p.tokens * c.heads * c.head_dim), seed + 2,
                      static_cast<std::size_t>(c.head_dim), 1.0f);
  p.weights = scaled_floats(static_cast<std::size_t>(p.tokens * p.weights_stride), seed + 3, 0, 0.0f);
  p.weight_scale = 1.0f / std::sqrt(static_cast<float>(c.heads * c.head_dim));
  return p;
}

// A token's scores in double, score(s) = Σ_h weight_scale · w_h · relu(q_h · k_s) over positions
// 0..pos, and for each the sum of the magnitudes it adds (Σ_h |w_h| Σ_d |q_d k_d| over the heads
// whose dot product is positive): the scale of its rounding error in float.
struct dsa_scores {
  std::vector<double> score, magnitude;
};

inline dsa_scores reference_dsa_scores(const dsa_problem& p, std::int64_t t) {
  const auto& c = p.c;
  const std::int64_t seq = p.batch.seq[static_cast<std::size_t>(t)];
  const std::int64_t pos = p.batch.pos[static_cast<std::size_t>(t)];
  dsa_scores e;
  std::vector<double> key(static_cast<std::size_t>(c.head_dim));
  for (std::int64_t s = 0; s <= pos; ++s) {
    for (std::int64_t d = 0; d < c.head_dim; ++d) key[static_cast<std::size_t>(d)] = p.keys.value(seq, s, d);
    double score = 0.0, magnitude = 0.0;
    for (std::int64_t h = 0; h < c.heads; ++h) {
      const float* q = p.q.data() + (t * c.heads + h) * c.head_dim;
      double dot = 0.0, abs_dot = 0.0;
      for (std::int64_t d = 0; d < c.head_dim; ++d) {
        const double term = q[d] * key[static_cast<std::size_t>(d)];
        dot += term;
        abs_dot += std::fabs(term);
      }
      const double w = p.weights[static_cast<std::size_t>(t * p.weights_stride + h)];
      if (dot > 0.0) {
        score += w * dot;
        magnitude += std::fabs(w) * abs_dot;
      }
    }
    e.score.push_back(score * p.weight_scale);
    e.magnitude.push_back(magnitude * p.weight_scale);
  }
  return e;
}

// The choice mla_attention.h describes for a token with more than top_k positions: the top_k by
// score (ties to the lower position), ascending; and whether the top_k-th and the next best lie
// within dsa_tie of their magnitudes, where float rounding may pick either.
inline constexpr double dsa_tie = 1e-5;

struct dsa_choice {
  std::vector<std::int32_t> selected;
  bool near_tie = false;
};

inline dsa_choice reference_dsa_choice(const dsa_scores& e, std::int64_t top_k) {
  std::vector<std::int32_t> order(e.score.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](std::int32_t a, std::int32_t b) {
    return e.score[static_cast<std::size_t>(a)] > e.score[static_cast<std::size_t>(b)];
  });
  dsa_choice out;
  const auto last = static_cast<std::size_t>(order[static_cast<std::size_t>(top_k - 1)]);
  const auto next = static_cast<std::size_t>(order[static_cast<std::size_t>(top_k)]);
  const double magnitude = std::max(e.magnitude[last], e.magnitude[next]);
  // Scores of heads that are all negative are exact zeros on both sides: no tie to break.
  out.near_tie = magnitude > 0.0 && std::fabs(e.score[last] - e.score[next]) <= dsa_tie * magnitude;
  out.selected.assign(order.begin(), order.begin() + top_k);
  std::sort(out.selected.begin(), out.selected.end());
  return out;
}

// Whether `got` is a top_k of these scores up to float rounding: top_k distinct positions,
// ascending, none ranked below one left out by more than dsa_tie of their magnitudes.
inline bool dsa_choice_within_rounding(const dsa_scores& e, std::int64_t top_k, const std::vector<std::int32_t>& got) {
  if (static_cast<std::int64_t>(got.size()) != top_k || !std::is_sorted(got.begin(), got.end()) ||
      std::adjacent_find(got.begin(), got.end()) != got.end() || got.front() < 0 ||
      static_cast<std::size_t>(got.back()) >= e.score.size()) {
    return false;
  }
  std::vector<bool> chosen(e.score.size(), false);
  for (const std::int32_t s : got) chosen[static_cast<std::size_t>(s)] = true;
  // The lowest chosen score against the highest left out, each with its own margin.
  double lowest = INFINITY, lowest_margin = 0.0, highest = -INFINITY, highest_margin = 0.0;
  for (std::size_t s = 0; s < e.score.size(); ++s) {
    const double margin = dsa_tie * e.magnitude[s];
    if (chosen[s] && e.score[s] < lowest) {
      lowest = e.score[s];
      lowest_margin = margin;
    } else if (!chosen[s] && e.score[s] > highest) {
      highest = e.score[s];
      highest_margin = margin;
    }
  }
  return lowest + std::max(lowest_margin, highest_margin) >= highest;
}

}  // namespace edge::kernel_cases
