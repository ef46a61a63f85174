// MLA attention in the absorbed form against latent attention written out per head (keys and
// values expanded from the latents, as transformers computes it), DSA's selection against a brute
// force, and the selection's contract: no selection, or one that lists every position, is dense
// attention bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "edge/kernels/stream.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/mla_attention/mla_attention.h"

namespace {

using namespace edge::kernels;
using edge::status;
using edge::status_code;

std::vector<float> random_values(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// One layer's latent cache for one or more sequences, written through kv_cache_write, with
// block tables that interleave the sequences' blocks (so a wrong table shows).
struct latent_case {
  std::int64_t heads = 4, latent = 32, rope = 8, nope = 12, v = 10, block = 4;
  std::vector<std::int64_t> lengths = {11};  // positions per sequence
  dtype kv = dtype::f32;

  std::int64_t row() const { return latent + rope; }
  std::int64_t blocks_of(std::int64_t n) const { return (n + block - 1) / block; }
};

struct latent_setup {
  latent_case c;
  std::vector<float> rows;               // [sequence positions in order, row] the values written
  std::vector<std::uint8_t> cache;       // [num_blocks, block, row] bytes of c.kv
  std::vector<float> scales;             // [num_blocks, block]
  std::vector<std::int32_t> tables, table_begin;
  std::int64_t num_blocks = 0;

  explicit latent_setup(const latent_case& cfg) : c(cfg) {
    std::int64_t total = 0;
    for (const auto n : c.lengths) total += n;
    std::int64_t longest = 0;
    for (const auto n : c.lengths) longest = std::max(longest, c.blocks_of(n));
    num_blocks = longest * static_cast<std::int64_t>(c.lengths.size()) + 1;
    cache.assign(static_cast<std::size_t>(num_blocks * c.block * c.row()) * dtype_size(c.kv), 0);
    scales.assign(static_cast<std::size_t>(num_blocks * c.block), 0.0f);
    rows = random_values(static_cast<std::size_t>(total * c.row()), 11);
    // Sequence s takes blocks s, s + S, s + 2S, ...: interleaved.
    const auto seqs = static_cast<std::int64_t>(c.lengths.size());
    std::vector<std::int64_t> slots;
    table_begin.push_back(0);
    for (std::int64_t s = 0; s < seqs; ++s) {
      for (std::int64_t b = 0; b < c.blocks_of(c.lengths[static_cast<std::size_t>(s)]); ++b) {
        tables.push_back(static_cast<std::int32_t>(s + b * seqs));
      }
      table_begin.push_back(static_cast<std::int32_t>(tables.size()));
      for (std::int64_t p = 0; p < c.lengths[static_cast<std::size_t>(s)]; ++p) {
        slots.push_back(tables[static_cast<std::size_t>(table_begin[static_cast<std::size_t>(s)] + p / c.block)] * c.block +
                        p % c.block);
      }
    }
    REQUIRE(run_kv_cache_write({.k = rows.data(), .v = nullptr, .k_cache = cache.data(), .v_cache = nullptr,
                                .k_scales = scales.data(), .kv_type = c.kv, .slots = slots.data(), .tokens = total,
                                .num_kv_heads = 1, .head_dim = c.row(), .block_size = c.block,
                                .num_blocks = num_blocks, .kv_stride = c.row()},
                               {})
                .ok());
  }

  // The row of sequence s at position p as the attention reads it back (dequantized by the
  // reference's own rule for FP8: code value times the row's scale).
  const float* written(std::int64_t s, std::int64_t p) const {
    std::int64_t first = 0;
    for (std::int64_t i = 0; i < s; ++i) first += c.lengths[static_cast<std::size_t>(i)];
    return rows.data() + (first + p) * c.row();
  }
};

// transformers' form: per head, k = [W_UK c | k_pe], v = W_UV c, softmax(scale q·k) · v.
std::vector<double> expanded_attention(const latent_setup& s, std::int64_t seq, std::int64_t pos,
                                       const std::vector<float>& q_nope,  // [heads, nope]
                                       const std::vector<float>& q_pe,    // [heads, rope]
                                       const std::vector<float>& w_uk,    // [heads, nope, latent]
                                       const std::vector<float>& w_uv,    // [heads, v, latent]
                                       const std::vector<std::int32_t>& positions, float scale) {
  const latent_case& c = s.c;
  std::vector<double> out(static_cast<std::size_t>(c.heads * c.v), 0.0);
  for (std::int64_t h = 0; h < c.heads; ++h) {
    std::vector<double> scores;
    for (const std::int32_t p : positions) {
      const float* r = s.written(seq, p);
      double dot = 0.0;
      for (std::int64_t i = 0; i < c.nope; ++i) {
        double k = 0.0;
        for (std::int64_t j = 0; j < c.latent; ++j) k += w_uk[static_cast<std::size_t>((h * c.nope + i) * c.latent + j)] * r[j];
        dot += q_nope[static_cast<std::size_t>(h * c.nope + i)] * k;
      }
      for (std::int64_t i = 0; i < c.rope; ++i) dot += q_pe[static_cast<std::size_t>(h * c.rope + i)] * r[c.latent + i];
      scores.push_back(dot * scale);
    }
    const double top = *std::max_element(scores.begin(), scores.end());
    double sum = 0.0;
    for (double& x : scores) sum += (x = std::exp(x - top));
    for (std::size_t k = 0; k < positions.size(); ++k) {
      const float* r = s.written(seq, positions[k]);
      for (std::int64_t i = 0; i < c.v; ++i) {
        double val = 0.0;
        for (std::int64_t j = 0; j < c.latent; ++j) val += w_uv[static_cast<std::size_t>((h * c.v + i) * c.latent + j)] * r[j];
        out[static_cast<std::size_t>(h * c.v + i)] += scores[k] / sum * val;
      }
    }
    (void)pos;
  }
  return out;
}

struct absorbed_run {
  std::vector<float> out;  // [tokens, heads, latent]
};

// Runs the kernel for one query token per sequence (at the sequence's last position), q_latent
// computed from q_nope and W_UK as forward.cpp does (the absorbed query).
absorbed_run run_absorbed(const latent_setup& s, const std::vector<float>& q_latent, const std::vector<float>& q_pe,
                          const std::vector<std::int32_t>& selected, const std::vector<std::int32_t>& counts,
                          std::int64_t select_stride, float scale, bool in_place = false) {
  const latent_case& c = s.c;
  const auto tokens = static_cast<std::int64_t>(c.lengths.size());
  std::vector<std::int32_t> seq(static_cast<std::size_t>(tokens)), pos(static_cast<std::size_t>(tokens));
  for (std::int64_t t = 0; t < tokens; ++t) {
    seq[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(t);
    pos[static_cast<std::size_t>(t)] = static_cast<std::int32_t>(c.lengths[static_cast<std::size_t>(t)] - 1);
  }
  absorbed_run r;
  std::vector<float> q = q_latent;
  r.out.assign(static_cast<std::size_t>(tokens * c.heads * c.latent), -1.0f);
  float* out = in_place ? q.data() : r.out.data();
  const status done = run_mla_attention(
      {.q_latent = q.data(), .q_rope = q_pe.data(), .out = out, .cache = s.cache.data(), .scales = s.scales.data(),
       .kv_type = c.kv, .seq = seq.data(), .pos = pos.data(), .block_tables = s.tables.data(),
       .table_begin = s.table_begin.data(), .selected = selected.empty() ? nullptr : selected.data(),
       .selected_count = counts.empty() ? nullptr : counts.data(), .select_stride = select_stride, .tokens = tokens,
       .num_heads = c.heads, .latent_dim = c.latent, .rope_dim = c.rope, .block_size = c.block,
       .num_blocks = s.num_blocks, .q_latent_stride = c.heads * c.latent, .q_rope_stride = c.heads * c.rope,
       .q_rope_head_stride = c.rope, .out_stride = c.heads * c.latent, .scale = scale},
      {});
  REQUIRE(done.ok());
  if (in_place) r.out = q;
  return r;
}

// q_latent[h] = q_nope[h] · W_UK[h]
std::vector<float> absorb(const latent_case& c, const std::vector<float>& q_nope, const std::vector<float>& w_uk,
                          std::int64_t tokens) {
  std::vector<float> out(static_cast<std::size_t>(tokens * c.heads * c.latent), 0.0f);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t h = 0; h < c.heads; ++h) {
      for (std::int64_t j = 0; j < c.latent; ++j) {
        double sum = 0.0;
        for (std::int64_t i = 0; i < c.nope; ++i) {
          sum += q_nope[static_cast<std::size_t>((t * c.heads + h) * c.nope + i)] *
                 w_uk[static_cast<std::size_t>((h * c.nope + i) * c.latent + j)];
        }
        out[static_cast<std::size_t>((t * c.heads + h) * c.latent + j)] = static_cast<float>(sum);
      }
    }
  }
  return out;
}

// out_v[h] = W_UV[h] · o[h]
std::vector<double> expand_values(const latent_case& c, const float* o, const std::vector<float>& w_uv) {
  std::vector<double> out(static_cast<std::size_t>(c.heads * c.v), 0.0);
  for (std::int64_t h = 0; h < c.heads; ++h) {
    for (std::int64_t i = 0; i < c.v; ++i) {
      double sum = 0.0;
      for (std::int64_t j = 0; j < c.latent; ++j) sum += w_uv[static_cast<std::size_t>((h * c.v + i) * c.latent + j)] * o[h * c.latent + j];
      out[static_cast<std::size_t>(h * c.v + i)] = sum;
    }
  }
  return out;
}

double largest_gap(const std::vector<double>& a, const std::vector<double>& b) {
  double gap = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) gap = std::max(gap, std::fabs(a[i] - b[i]));
  return gap;
}

struct weights {
  std::vector<float> q_nope, q_pe, w_uk, w_uv;
  weights(const latent_case& c, std::int64_t tokens)
      : q_nope(random_values(static_cast<std::size_t>(tokens * c.heads * c.nope), 3)),
        q_pe(random_values(static_cast<std::size_t>(tokens * c.heads * c.rope), 5)),
        w_uk(random_values(static_cast<std::size_t>(c.heads * c.nope * c.latent), 7, 0.3f)),
        w_uv(random_values(static_cast<std::size_t>(c.heads * c.v * c.latent), 9, 0.3f)) {}
  std::vector<float> head_rows(const std::vector<float>& all, std::int64_t t, std::int64_t width, const latent_case& c) const {
    return {all.begin() + t * c.heads * width, all.begin() + (t + 1) * c.heads * width};
  }
};

}  // namespace

TEST_CASE("MLA attention in the absorbed form equals latent attention expanded per head") {
  for (const std::int64_t block : {4, 16}) {
    latent_case c;
    c.block = block;
    c.lengths = {11, 1, 37};  // three sequences, one token each, at their last positions
    const latent_setup s(c);
    const auto tokens = static_cast<std::int64_t>(c.lengths.size());
    const weights w(c, tokens);
    const float scale = 0.3f;
    const absorbed_run run = run_absorbed(s, absorb(c, w.q_nope, w.w_uk, tokens), w.q_pe, {}, {}, 0, scale);
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::vector<std::int32_t> all(static_cast<std::size_t>(c.lengths[static_cast<std::size_t>(t)]));
      std::iota(all.begin(), all.end(), 0);
      const auto expected = expanded_attention(s, t, c.lengths[static_cast<std::size_t>(t)] - 1,
                                               w.head_rows(w.q_nope, t, c.nope, c), w.head_rows(w.q_pe, t, c.rope, c),
                                               w.w_uk, w.w_uv, all, scale);
      const auto got = expand_values(c, run.out.data() + t * c.heads * c.latent, w.w_uv);
      INFO("block " << block << ", sequence " << t);
      CHECK(largest_gap(got, expected) < 2e-5);
    }
  }
}

TEST_CASE("MLA attention over FP8 and bf16 latents stays close to the f32 cache's, and in place equals apart") {
  latent_case f32_case;
  f32_case.lengths = {23, 9};
  const latent_setup exact(f32_case);
  const weights w(f32_case, 2);
  const auto q_latent = absorb(f32_case, w.q_nope, w.w_uk, 2);
  const auto reference = run_absorbed(exact, q_latent, w.q_pe, {}, {}, 0, 0.25f).out;
  CHECK(run_absorbed(exact, q_latent, w.q_pe, {}, {}, 0, 0.25f, true).out == reference);
  for (const dtype kv : {dtype::bf16, dtype::f16, dtype::fp8_e4m3}) {
    latent_case c = f32_case;
    c.kv = kv;
    const latent_setup s(c);
    const auto got = run_absorbed(s, q_latent, w.q_pe, {}, {}, 0, 0.25f).out;
    float gap = 0.0f;
    for (std::size_t i = 0; i < got.size(); ++i) gap = std::max(gap, std::fabs(got[i] - reference[i]));
    INFO(to_string(kv));
    // Latents of magnitude ≤ 1: bf16 keeps 8 bits, FP8 E4M3 3 (a step of 1/16 of the row's
    // largest value at most), averaged by the softmax.
    CHECK(gap < (kv == dtype::fp8_e4m3 ? 0.08f : 0.01f));
  }
}

TEST_CASE("a DSA selection attends to the listed positions only; listing every position is dense, bit for bit") {
  latent_case c;
  c.lengths = {20};
  const latent_setup s(c);
  const weights w(c, 1);
  const auto q_latent = absorb(c, w.q_nope, w.w_uk, 1);
  const auto dense = run_absorbed(s, q_latent, w.q_pe, {}, {}, 0, 0.3f).out;
  std::vector<std::int32_t> every(20);
  std::iota(every.begin(), every.end(), 0);
  CHECK(run_absorbed(s, q_latent, w.q_pe, every, {20}, 20, 0.3f).out == dense);
  CHECK(run_absorbed(s, q_latent, w.q_pe, every, {0}, 20, 0.3f).out == dense);  // count 0: all positions

  const std::vector<std::int32_t> some = {0, 3, 4, 11, 19};
  const auto sparse = run_absorbed(s, q_latent, w.q_pe, some, {5}, 5, 0.3f);
  const auto expected = expanded_attention(s, 0, 19, w.q_nope, w.q_pe, w.w_uk, w.w_uv, some, 0.3f);
  CHECK(largest_gap(expand_values(c, sparse.out.data(), w.w_uv), expected) < 2e-5);
  CHECK(sparse.out != dense);

  // A position after the token's own, or out of order, is refused.
  std::vector<std::int32_t> seq = {0}, pos = {19};
  std::vector<float> out(static_cast<std::size_t>(c.heads * c.latent));
  for (const std::vector<std::int32_t>& bad : {std::vector<std::int32_t>{3, 20}, std::vector<std::int32_t>{4, 3}}) {
    const std::vector<std::int32_t> count = {2};
    const status refused = run_mla_attention(
        {.q_latent = q_latent.data(), .q_rope = w.q_pe.data(), .out = out.data(), .cache = s.cache.data(),
         .scales = s.scales.data(), .kv_type = c.kv, .seq = seq.data(), .pos = pos.data(),
         .block_tables = s.tables.data(), .table_begin = s.table_begin.data(), .selected = bad.data(),
         .selected_count = count.data(), .select_stride = 2, .tokens = 1, .num_heads = c.heads,
         .latent_dim = c.latent, .rope_dim = c.rope, .block_size = c.block, .num_blocks = s.num_blocks,
         .q_latent_stride = c.heads * c.latent, .q_rope_stride = c.heads * c.rope, .q_rope_head_stride = c.rope,
         .out_stride = c.heads * c.latent, .scale = 0.3f},
        {});
    CHECK(refused.code() == status_code::invalid_argument);
  }
}

namespace {

// The DSA choice of each token (one per sequence, at its last position) over index keys `rows`.
struct selection {
  std::vector<std::int32_t> selected, counts;
};

selection select_over(const latent_case& c, const std::vector<float>& rows, const std::vector<float>& q,
                      const std::vector<float>& head_weights, std::int64_t heads, std::int64_t top_k) {
  latent_setup keys(c);
  keys.rows = rows;
  std::vector<std::int64_t> slots;
  std::vector<std::int32_t> seq, pos;
  for (std::size_t s = 0; s < c.lengths.size(); ++s) {
    for (std::int64_t p = 0; p < c.lengths[s]; ++p) {
      slots.push_back(keys.tables[static_cast<std::size_t>(keys.table_begin[s] + p / c.block)] * c.block + p % c.block);
    }
    seq.push_back(static_cast<std::int32_t>(s));
    pos.push_back(static_cast<std::int32_t>(c.lengths[s] - 1));
  }
  const auto tokens = static_cast<std::int64_t>(c.lengths.size());
  REQUIRE(run_kv_cache_write({.k = keys.rows.data(), .v = nullptr, .k_cache = keys.cache.data(), .v_cache = nullptr,
                              .k_scales = keys.scales.data(), .kv_type = c.kv, .slots = slots.data(),
                              .tokens = static_cast<std::int64_t>(slots.size()), .num_kv_heads = 1,
                              .head_dim = c.latent, .block_size = c.block, .num_blocks = keys.num_blocks,
                              .kv_stride = c.latent},
                             {})
              .ok());
  selection out{std::vector<std::int32_t>(static_cast<std::size_t>(tokens * top_k), -1),
                std::vector<std::int32_t>(static_cast<std::size_t>(tokens), -1)};
  REQUIRE(run_dsa_select({.q = q.data(), .head_weights = head_weights.data(), .weight_scale = 0.5f,
                          .key_cache = keys.cache.data(), .key_scales = keys.scales.data(), .kv_type = c.kv,
                          .seq = seq.data(), .pos = pos.data(), .block_tables = keys.tables.data(),
                          .table_begin = keys.table_begin.data(), .selected = out.selected.data(),
                          .selected_count = out.counts.data(), .tokens = tokens, .index_heads = heads,
                          .index_dim = c.latent, .top_k = top_k, .block_size = c.block, .num_blocks = keys.num_blocks,
                          .q_stride = heads * c.latent, .weights_stride = heads},
                         {})
              .ok());
  return out;
}

}  // namespace

TEST_CASE("DSA selection: the top_k positions by weighted relu scores, none below top_k, ties to the lower position") {
  constexpr std::int64_t heads = 3, dim = 8, top_k = 5;
  latent_case c;
  c.latent = dim;
  c.rope = 0;
  c.block = 4;
  c.lengths = {5, 13};
  const auto rows = random_values(18 * dim, 11);
  const auto q = random_values(2 * heads * dim, 21);
  const auto head_weights = random_values(2 * heads, 23);
  const selection got = select_over(c, rows, q, head_weights, heads, top_k);
  CHECK(got.counts[0] == 0);  // 5 positions, top 5: all of them, dense
  REQUIRE(got.counts[1] == top_k);
  std::vector<std::pair<double, std::int32_t>> ranked;  // (-score, position) of sequence 1
  for (std::int32_t p = 0; p <= 12; ++p) {
    const float* k = rows.data() + (5 + p) * dim;
    double score = 0.0;
    for (std::int64_t h = 0; h < heads; ++h) {
      double dot = 0.0;
      for (std::int64_t d = 0; d < dim; ++d) dot += q[static_cast<std::size_t>((heads + h) * dim + d)] * k[d];
      score += 0.5 * head_weights[static_cast<std::size_t>(heads + h)] * std::max(dot, 0.0);
    }
    ranked.emplace_back(-score, p);
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<std::int32_t> expected;
  for (std::int64_t i = 0; i < top_k; ++i) expected.push_back(ranked[static_cast<std::size_t>(i)].second);
  std::sort(expected.begin(), expected.end());
  CHECK(std::vector<std::int32_t>(got.selected.begin() + top_k, got.selected.end()) == expected);

  // Every key alike: every score ties, and the lowest positions are kept.
  std::vector<float> same(18 * dim);
  for (std::size_t i = 0; i < same.size(); ++i) same[i] = rows[i % dim];
  const selection ties = select_over(c, same, q, head_weights, heads, top_k);
  CHECK(std::vector<std::int32_t>(ties.selected.begin() + top_k, ties.selected.end()) ==
        std::vector<std::int32_t>{0, 1, 2, 3, 4});
}

TEST_CASE("the expanded prefill form equals latent attention per head: runs, offsets, chunks of keys, selections") {
  for (const std::int64_t first_position : {0, 5, 290}) {
    latent_case c;
    c.block = 16;
    const std::int64_t tokens = 7;
    c.lengths = {first_position + tokens};
    const latent_setup s(c);
    const weights w(c, tokens);
    // kv_b_proj as the loader holds it: per head its K rows (W_UK), then its V rows (W_UV).
    std::vector<float> kv_b(static_cast<std::size_t>(c.heads * (c.nope + c.v) * c.latent));
    for (std::int64_t h = 0; h < c.heads; ++h) {
      std::copy_n(w.w_uk.begin() + h * c.nope * c.latent, c.nope * c.latent, kv_b.begin() + h * (c.nope + c.v) * c.latent);
      std::copy_n(w.w_uv.begin() + h * c.v * c.latent, c.v * c.latent,
                  kv_b.begin() + (h * (c.nope + c.v) + c.nope) * c.latent);
    }
    std::vector<float> q(static_cast<std::size_t>(tokens * c.heads * (c.nope + c.rope)));
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t h = 0; h < c.heads; ++h) {
        float* head = q.data() + (t * c.heads + h) * (c.nope + c.rope);
        std::copy_n(w.q_nope.begin() + (t * c.heads + h) * c.nope, c.nope, head);
        std::copy_n(w.q_pe.begin() + (t * c.heads + h) * c.rope, c.rope, head + c.nope);
      }
    }
    // Token 3 attends to a selection; the others to every position up to their own.
    const std::int64_t stride = 4;
    std::vector<std::int32_t> selected(static_cast<std::size_t>(tokens * stride), 0), counts(tokens, 0);
    const std::vector<std::int32_t> chosen = {0, 2, static_cast<std::int32_t>(first_position), static_cast<std::int32_t>(first_position + 3)};
    std::copy(chosen.begin(), chosen.end(), selected.begin() + 3 * stride);
    counts[3] = 4;
    std::vector<float> out(static_cast<std::size_t>(tokens * c.heads * c.v), -1.0f);
    std::vector<float> workspace(static_cast<std::size_t>(
        mla_prefill_workspace_floats(tokens, c.heads, c.latent, c.rope, c.nope, c.v)));
    REQUIRE(run_mla_prefill({.q = q.data(), .out = out.data(), .cache = s.cache.data(), .scales = s.scales.data(),
                             .kv_type = c.kv, .block_table = s.tables.data(), .selected = selected.data(),
                             .selected_count = counts.data(), .select_stride = stride,
                             .kv_b = {.format = weight_format::f32, .values = kv_b.data()},
                             .first_position = first_position, .tokens = tokens, .heads = c.heads,
                             .latent_dim = c.latent, .rope_dim = c.rope, .nope = c.nope, .v_head_dim = c.v,
                             .block_size = c.block, .num_blocks = s.num_blocks,
                             .q_stride = c.heads * (c.nope + c.rope), .out_stride = c.heads * c.v, .scale = 0.3f,
                             .workspace = workspace.data(),
                             .workspace_floats = static_cast<std::int64_t>(workspace.size())},
                            {})
                .ok());
    for (std::int64_t t = 0; t < tokens; ++t) {
      std::vector<std::int32_t> positions;
      if (t == 3) {
        positions = chosen;
      } else {
        for (std::int32_t p = 0; p <= first_position + t; ++p) positions.push_back(p);
      }
      const auto expected = expanded_attention(s, 0, first_position + t, w.head_rows(w.q_nope, t, c.nope, c),
                                               w.head_rows(w.q_pe, t, c.rope, c), w.w_uk, w.w_uv, positions, 0.3f);
      const std::vector<double> got(out.begin() + t * c.heads * c.v, out.begin() + (t + 1) * c.heads * c.v);
      INFO("first position " << first_position << ", token " << t);
      CHECK(largest_gap(got, expected) < 2e-5);
    }
  }
  // At Kimi K2's widths the expanded form pays for long prompts only; at a decode step never.
  CHECK_FALSE(mla_expanded_pays(1, 4096, 512, 64, 128, 128));
  CHECK_FALSE(mla_expanded_pays(64, 4096, 512, 64, 128, 128));
  CHECK(mla_expanded_pays(512, 4096, 512, 64, 128, 128));
}
