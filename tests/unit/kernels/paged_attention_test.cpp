#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "kernel_test_util.h"
#include "edge/common/thread_pool.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/paged_attention/paged_attention.h"

namespace {

using edge::kernels::dtype;

// A paged cache holding `seqs` sequences of random K/V, their blocks scattered over the pool.
struct fixture {
  std::int64_t heads, kv_heads, head_dim, block_size, num_blocks, table_stride;
  dtype kv_type;
  std::vector<std::int64_t> lengths;    // positions per sequence
  std::vector<std::int32_t> tables;     // [seqs, table_stride]
  std::vector<std::byte> k_cache, v_cache;
  std::vector<float> k_values, v_values;  // decoded, [seq][pos][kv_head][d] flattened per sequence offset
  std::vector<std::int64_t> seq_offset;   // first row of each sequence in k_values

  fixture(std::vector<std::int64_t> lens, std::int64_t h, std::int64_t kvh, std::int64_t hd, std::int64_t bs, dtype type)
      : heads(h), kv_heads(kvh), head_dim(hd), block_size(bs), kv_type(type), lengths(std::move(lens)) {
    std::int64_t blocks = 0;
    table_stride = 0;
    for (auto len : lengths) {
      const std::int64_t b = (len + bs - 1) / bs;
      blocks += b;
      table_stride = std::max(table_stride, b);
    }
    num_blocks = blocks + 3;  // some blocks stay unused
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(11));
    tables.assign(lengths.size() * static_cast<std::size_t>(table_stride), -1);
    std::size_t next = 0;
    for (std::size_t s = 0; s < lengths.size(); ++s) {
      for (std::int64_t b = 0; b < (lengths[s] + bs - 1) / bs; ++b) tables[s * static_cast<std::size_t>(table_stride) + static_cast<std::size_t>(b)] = order[next++];
    }
    const std::size_t cache_elems = static_cast<std::size_t>(num_blocks * kv_heads * bs * hd);
    k_cache.assign(cache_elems * edge::kernels::dtype_size(type), std::byte{0});
    v_cache.assign(k_cache.size(), std::byte{0});

    // Write every sequence's rows through the real kv_cache_write kernel.
    std::int64_t rows = 0;
    for (auto len : lengths) {
      seq_offset.push_back(rows);
      rows += len;
    }
    const auto k = edge::testing::random_floats(static_cast<std::size_t>(rows * kv_heads * hd), 21);
    const auto v = edge::testing::random_floats(static_cast<std::size_t>(rows * kv_heads * hd), 22);
    std::vector<std::int64_t> slots;
    for (std::size_t s = 0; s < lengths.size(); ++s) {
      for (std::int64_t p = 0; p < lengths[s]; ++p) {
        slots.push_back(tables[s * static_cast<std::size_t>(table_stride) + static_cast<std::size_t>(p / bs)] * bs + p % bs);
      }
    }
    edge::kernels::kv_cache_write_params w{.k = k.data(), .v = v.data(), .k_cache = k_cache.data(),
                                           .v_cache = v_cache.data(), .kv_type = type, .slots = slots.data(),
                                           .tokens = rows, .num_kv_heads = kv_heads, .head_dim = hd,
                                           .block_size = bs, .num_blocks = num_blocks, .kv_stride = kv_heads * hd};
    REQUIRE(edge::kernels::run_kv_cache_write(w, {}).ok());
    k_values = edge::testing::encode(k, type).decoded;
    v_values = edge::testing::encode(v, type).decoded;
  }

  // Two-pass softmax attention in double for (query row of token at `pos` of `seq`).
  std::vector<double> reference(const float* q, std::int64_t seq, std::int64_t pos, float scale) const {
    std::vector<double> out(static_cast<std::size_t>(heads * head_dim), 0.0);
    const std::int64_t group = heads / kv_heads;
    for (std::int64_t h = 0; h < heads; ++h) {
      const std::int64_t g = h / group;
      std::vector<double> scores(static_cast<std::size_t>(pos + 1));
      double max_score = -1e300;
      for (std::int64_t p = 0; p <= pos; ++p) {
        const float* kr = k_values.data() + ((seq_offset[static_cast<std::size_t>(seq)] + p) * kv_heads + g) * head_dim;
        double dot = 0;
        for (std::int64_t d = 0; d < head_dim; ++d) dot += double(q[h * head_dim + d]) * kr[d];
        scores[static_cast<std::size_t>(p)] = dot * scale;
        max_score = std::max(max_score, scores[static_cast<std::size_t>(p)]);
      }
      double total = 0;
      for (auto& sc : scores) total += (sc = std::exp(sc - max_score));
      for (std::int64_t p = 0; p <= pos; ++p) {
        const float* vr = v_values.data() + ((seq_offset[static_cast<std::size_t>(seq)] + p) * kv_heads + g) * head_dim;
        for (std::int64_t d = 0; d < head_dim; ++d) out[static_cast<std::size_t>(h * head_dim + d)] += scores[static_cast<std::size_t>(p)] / total * vr[d];
      }
    }
    return out;
  }

  edge::kernels::paged_attention_params params(const float* q, float* out, const std::int32_t* seq,
                                               const std::int32_t* pos, std::int64_t tokens) const {
    return {.q = q, .out = out, .k_cache = k_cache.data(), .v_cache = v_cache.data(), .kv_type = kv_type,
            .seq = seq, .pos = pos, .block_tables = tables.data(), .tokens = tokens, .num_heads = heads,
            .num_kv_heads = kv_heads, .head_dim = head_dim, .block_size = block_size, .num_blocks = num_blocks,
            .block_table_stride = table_stride, .q_stride = heads * head_dim, .out_stride = heads * head_dim,
            .scale = 1.0f / std::sqrt(static_cast<float>(head_dim))};
  }
};

}  // namespace

TEST_CASE("paged attention matches two-pass softmax attention over scattered blocks") {
  edge::thread_pool pool(2);
  struct shape { std::int64_t heads, kv_heads, head_dim, block_size; dtype type; };
  for (const shape& sh : {shape{8, 4, 8, 16, dtype::f32}, shape{4, 4, 64, 1, dtype::f32}, shape{8, 2, 128, 8, dtype::bf16},
                          shape{14, 2, 64, 16, dtype::f16}, shape{2, 1, 97, 16, dtype::f32}}) {
    CAPTURE(sh.heads);
    CAPTURE(sh.head_dim);
    CAPTURE(sh.block_size);
    fixture f({1, 54, 97, 16}, sh.heads, sh.kv_heads, sh.head_dim, sh.block_size, sh.type);
    // One query per sequence at its last position, plus a prefix of prefill positions of seq 2.
    std::vector<std::int32_t> seq = {0, 1, 2, 3, 2, 2, 2};
    std::vector<std::int32_t> pos = {0, 53, 96, 15, 0, 17, 50};
    const auto tokens = static_cast<std::int64_t>(seq.size());
    const auto q = edge::testing::random_floats(static_cast<std::size_t>(tokens * sh.heads * sh.head_dim), 23);
    std::vector<float> out(q.size(), std::nanf(""));
    REQUIRE(edge::kernels::run_paged_attention(f.params(q.data(), out.data(), seq.data(), pos.data(), tokens), {.pool = &pool}).ok());
    CHECK(edge::testing::all_finite(out));
    for (std::int64_t t = 0; t < tokens; ++t) {
      const auto expected = f.reference(q.data() + t * sh.heads * sh.head_dim, seq[static_cast<std::size_t>(t)], pos[static_cast<std::size_t>(t)], 1.0f / std::sqrt(float(sh.head_dim)));
      const std::vector<float> got(out.begin() + t * sh.heads * sh.head_dim, out.begin() + (t + 1) * sh.heads * sh.head_dim);
      CHECK(edge::testing::relative_error(got, expected) < 2e-6);
    }
  }
}

TEST_CASE("paged attention gives each token the same bits alone or in a batch") {
  fixture f({40, 9, 33}, 8, 2, 64, 16, dtype::bf16);
  std::vector<std::int32_t> seq = {0, 1, 2, 0, 2};
  std::vector<std::int32_t> pos = {39, 8, 32, 5, 0};
  const std::int64_t row = 8 * 64;
  const auto q = edge::testing::random_floats(seq.size() * static_cast<std::size_t>(row), 24);
  edge::thread_pool pool(2);
  std::vector<float> together(q.size());
  REQUIRE(edge::kernels::run_paged_attention(f.params(q.data(), together.data(), seq.data(), pos.data(), 5), {.pool = &pool}).ok());
  for (std::size_t t = 0; t < seq.size(); ++t) {
    std::vector<float> alone(static_cast<std::size_t>(row));
    REQUIRE(edge::kernels::run_paged_attention(
                f.params(q.data() + t * static_cast<std::size_t>(row), alone.data(), &seq[t], &pos[t], 1), {})
                .ok());
    CHECK(std::memcmp(alone.data(), together.data() + t * static_cast<std::size_t>(row), static_cast<std::size_t>(row) * sizeof(float)) == 0);
  }
}

TEST_CASE("paged attention and the cache write reject out-of-range blocks and slots") {
  fixture f({20}, 2, 1, 16, 16, dtype::f32);
  std::vector<float> q(32), out(32);
  std::int32_t seq = 0, pos = 40;  // beyond the 2-block table
  CHECK_FALSE(edge::kernels::run_paged_attention(f.params(q.data(), out.data(), &seq, &pos, 1), {}).ok());

  std::int64_t slot = f.num_blocks * f.block_size;
  std::vector<float> k(16), v(16);
  edge::kernels::kv_cache_write_params w{.k = k.data(), .v = v.data(), .k_cache = f.k_cache.data(),
                                         .v_cache = f.v_cache.data(), .slots = &slot, .tokens = 1, .num_kv_heads = 1,
                                         .head_dim = 16, .block_size = 16, .num_blocks = f.num_blocks, .kv_stride = 16};
  CHECK_FALSE(edge::kernels::run_kv_cache_write(w, {}).ok());
}
