#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>

#include "kernel_test_util.h"
#include "edge/common/thread_pool.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/paged_attention/paged_attention.h"

namespace {

using edge::kernels::dtype;

// What an fp8_e4m3 cache row should read back as: the rule of kv_cache_write.h, applied here
// independently of the kernel (scale = amax / 448, code = fp8(x / scale)).
std::vector<float> fp8_row_dequantized(const float* x, std::int64_t n) {
  float amax = 0.0f;
  for (std::int64_t d = 0; d < n; ++d) amax = std::max(amax, std::fabs(x[d]));
  const float scale = amax / edge::kernels::fp8_e4m3_traits::max;
  std::vector<float> out(static_cast<std::size_t>(n), 0.0f);
  if (scale == 0.0f) return out;
  for (std::int64_t d = 0; d < n; ++d) {
    out[static_cast<std::size_t>(d)] = edge::kernels::fp8_e4m3_to_float(edge::kernels::float_to_fp8_e4m3(x[d] / scale)) * scale;
  }
  return out;
}

// Values as the cache holds them, decoded: per element for unscaled dtypes, per
// (token, kv head) row of head_dim values for fp8.
std::vector<float> cache_values(const std::vector<float>& x, dtype type, std::int64_t head_dim) {
  if (type != dtype::fp8_e4m3) return edge::testing::encode(x, type).decoded;
  std::vector<float> out;
  for (std::size_t row = 0; row < x.size(); row += static_cast<std::size_t>(head_dim)) {
    const auto r = fp8_row_dequantized(x.data() + row, head_dim);
    out.insert(out.end(), r.begin(), r.end());
  }
  return out;
}

// A paged cache holding `seqs` sequences of random K/V, their blocks scattered over the pool.
struct fixture {
  std::int64_t heads, kv_heads, head_dim, block_size, num_blocks;
  dtype kv_type;
  std::vector<std::int64_t> lengths;       // positions per sequence
  std::vector<std::int32_t> tables;        // each sequence's blocks, one table after another
  std::vector<std::int32_t> table_begin;   // [seqs + 1]
  std::vector<std::byte> k_cache, v_cache;
  std::vector<float> k_scales, v_scales;  // [num_blocks, kv_heads, block_size]; fp8 only
  std::vector<float> k_values, v_values;  // decoded, [seq][pos][kv_head][d] flattened per sequence offset
  std::vector<std::int64_t> seq_offset;   // first row of each sequence in k_values

  fixture(std::vector<std::int64_t> lens, std::int64_t h, std::int64_t kvh, std::int64_t hd, std::int64_t bs, dtype type)
      : heads(h), kv_heads(kvh), head_dim(hd), block_size(bs), kv_type(type), lengths(std::move(lens)) {
    std::int64_t blocks = 0;
    for (auto len : lengths) blocks += (len + bs - 1) / bs;
    num_blocks = blocks + 3;  // some blocks stay unused
    std::vector<std::int32_t> order(static_cast<std::size_t>(num_blocks));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(11));
    std::size_t next = 0;
    for (std::size_t s = 0; s < lengths.size(); ++s) {
      table_begin.push_back(static_cast<std::int32_t>(tables.size()));
      for (std::int64_t b = 0; b < (lengths[s] + bs - 1) / bs; ++b) tables.push_back(order[next++]);
    }
    table_begin.push_back(static_cast<std::int32_t>(tables.size()));
    const std::size_t cache_elems = static_cast<std::size_t>(num_blocks * kv_heads * bs * hd);
    k_cache.assign(cache_elems * edge::kernels::dtype_size(type), std::byte{0});
    v_cache.assign(k_cache.size(), std::byte{0});
    if (edge::kernels::kv_cache_scaled(type)) {
      k_scales.assign(static_cast<std::size_t>(num_blocks * kv_heads * bs), 0.0f);
      v_scales.assign(k_scales.size(), 0.0f);
    }

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
        slots.push_back(tables[static_cast<std::size_t>(table_begin[s] + p / bs)] * bs + p % bs);
      }
    }
    edge::kernels::kv_cache_write_params w{.k = k.data(), .v = v.data(), .k_cache = k_cache.data(),
                                           .v_cache = v_cache.data(), .k_scales = scales(k_scales),
                                           .v_scales = scales(v_scales), .kv_type = type, .slots = slots.data(),
                                           .tokens = rows, .num_kv_heads = kv_heads, .head_dim = hd,
                                           .block_size = bs, .num_blocks = num_blocks, .kv_stride = kv_heads * hd};
    REQUIRE(edge::kernels::run_kv_cache_write(w, {}).ok());
    k_values = cache_values(k, type, hd);
    v_values = cache_values(v, type, hd);
  }

  static float* scales(std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }
  static const float* scales(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

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
    return {.q = q, .out = out, .k_cache = k_cache.data(), .v_cache = v_cache.data(), .k_scales = scales(k_scales),
            .v_scales = scales(v_scales), .kv_type = kv_type,
            .seq = seq, .pos = pos, .block_tables = tables.data(), .table_begin = table_begin.data(),
            .tokens = tokens, .num_heads = heads, .num_kv_heads = kv_heads, .head_dim = head_dim,
            .block_size = block_size, .num_blocks = num_blocks, .q_stride = heads * head_dim, .out_stride = heads * head_dim,
            .scale = 1.0f / std::sqrt(static_cast<float>(head_dim))};
  }
};

}  // namespace

TEST_CASE("paged attention matches two-pass softmax attention over scattered blocks") {
  edge::thread_pool pool(2);
  struct shape { std::int64_t heads, kv_heads, head_dim, block_size; dtype type; };
  for (const shape& sh : {shape{8, 4, 8, 16, dtype::f32}, shape{4, 4, 64, 1, dtype::f32}, shape{8, 2, 128, 8, dtype::bf16},
                          shape{14, 2, 64, 16, dtype::f16}, shape{2, 1, 97, 16, dtype::f32},
                          shape{8, 2, 128, 8, dtype::fp8_e4m3}, shape{4, 4, 64, 1, dtype::fp8_e4m3},
                          shape{14, 2, 64, 16, dtype::fp8_e4m3}, shape{2, 1, 97, 16, dtype::fp8_e4m3}}) {
    CAPTURE(edge::kernels::to_string(sh.type));
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
  for (dtype type : {dtype::bf16, dtype::fp8_e4m3}) {
    CAPTURE(edge::kernels::to_string(type));
    fixture f({40, 9, 33}, 8, 2, 64, 16, type);
    std::vector<std::int32_t> seq = {0, 1, 2, 0, 2};
    std::vector<std::int32_t> pos = {39, 8, 32, 5, 0};
    const std::int64_t row = 8 * 64;
    const auto q = edge::testing::random_floats(seq.size() * static_cast<std::size_t>(row), 24);
    edge::thread_pool pool(2);
    std::vector<float> together(q.size());
    REQUIRE(edge::kernels::run_paged_attention(f.params(q.data(), together.data(), seq.data(), pos.data(), 5), {.pool = &pool}).ok());
    CHECK(edge::testing::all_finite(together));
    for (std::size_t t = 0; t < seq.size(); ++t) {
      std::vector<float> alone(static_cast<std::size_t>(row));
      REQUIRE(edge::kernels::run_paged_attention(
                  f.params(q.data() + t * static_cast<std::size_t>(row), alone.data(), &seq[t], &pos[t], 1), {})
                  .ok());
      CHECK(std::memcmp(alone.data(), together.data() + t * static_cast<std::size_t>(row), static_cast<std::size_t>(row) * sizeof(float)) == 0);
    }
  }
}

namespace {

// Half the distance from |y| to the next E4M3 value: E4M3 steps are 2^(e - 3) in the binade
// [2^e, 2^(e+1)), and 2^-9 throughout the subnormals below 2^-6.
double fp8_half_step(double y) {
  const int binade = std::max(static_cast<int>(std::floor(std::log2(std::fabs(y)))), -6);
  return std::ldexp(0.5, binade - edge::kernels::fp8_e4m3_traits::mantissa_bits);
}

}  // namespace

TEST_CASE("an FP8 KV row reads back within half an E4M3 step of x / scale, times the scale") {
  const std::int64_t kv_heads = 2, head_dim = 96, block_size = 16, num_blocks = 2;
  // Rows (token, head): ordinary data, wide dynamic range, one outlier among tiny values (they
  // go subnormal), a row of zeros and a row of negative zeros.
  std::vector<float> k = edge::testing::random_floats(static_cast<std::size_t>(5 * kv_heads * head_dim), 31);
  std::vector<float> v = edge::testing::random_floats(k.size(), 32, 40.0f);
  std::mt19937 rng(33);
  for (std::size_t i = 0; i < static_cast<std::size_t>(head_dim); ++i) {
    k[static_cast<std::size_t>(head_dim) + i] *= std::ldexp(1.0f, static_cast<int>(rng() % 24) - 12);
    k[static_cast<std::size_t>(2 * head_dim) + i] *= 1e-3f;
  }
  k[static_cast<std::size_t>(2 * head_dim)] = 250.0f;
  std::fill_n(k.begin() + 3 * head_dim, head_dim, 0.0f);
  std::fill_n(v.begin() + 3 * head_dim, head_dim, -0.0f);
  const std::vector<std::int64_t> slots = {3, 16, 31, 0, 17};  // scattered over both blocks
  const auto tokens = static_cast<std::int64_t>(slots.size());

  std::vector<std::uint8_t> k_cache(static_cast<std::size_t>(num_blocks * kv_heads * block_size * head_dim));
  std::vector<std::uint8_t> v_cache(k_cache.size());
  std::vector<float> k_scales(static_cast<std::size_t>(num_blocks * kv_heads * block_size), -1.0f);
  std::vector<float> v_scales(k_scales.size(), -1.0f);
  REQUIRE(edge::kernels::run_kv_cache_write({.k = k.data(), .v = v.data(), .k_cache = k_cache.data(),
                                             .v_cache = v_cache.data(), .k_scales = k_scales.data(),
                                             .v_scales = v_scales.data(), .kv_type = dtype::fp8_e4m3,
                                             .slots = slots.data(), .tokens = tokens, .num_kv_heads = kv_heads,
                                             .head_dim = head_dim, .block_size = block_size,
                                             .num_blocks = num_blocks, .kv_stride = kv_heads * head_dim},
                                            {})
              .ok());

  int rows_checked = 0, zero_rows = 0;
  double largest_error = 0.0;
  for (auto [input, codes, scales] : {std::tuple{&k, &k_cache, &k_scales}, std::tuple{&v, &v_cache, &v_scales}}) {
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t h = 0; h < kv_heads; ++h) {
        const float* x = input->data() + (t * kv_heads + h) * head_dim;
        const std::int64_t row = (slots[static_cast<std::size_t>(t)] / block_size * kv_heads + h) * block_size +
                                 slots[static_cast<std::size_t>(t)] % block_size;
        const std::uint8_t* code = codes->data() + row * head_dim;
        const float scale = (*scales)[static_cast<std::size_t>(row)];
        float amax = 0.0f;
        for (std::int64_t d = 0; d < head_dim; ++d) amax = std::max(amax, std::fabs(x[d]));
        CHECK(scale == amax / edge::kernels::fp8_e4m3_traits::max);
        if (amax == 0.0f) {
          ++zero_rows;
          for (std::int64_t d = 0; d < head_dim; ++d) CHECK(edge::kernels::fp8_e4m3_to_float(code[d]) == 0.0f);
          continue;
        }
        float largest_code = 0.0f;
        for (std::int64_t d = 0; d < head_dim; ++d) {
          const double y = static_cast<double>(x[d]) / scale;
          const double q = edge::kernels::fp8_e4m3_to_float(code[d]);
          largest_code = std::max(largest_code, std::fabs(static_cast<float>(q)));
          // The quotient x / scale is itself rounded to float first: allow its half ulp.
          const double bound = fp8_half_step(y) + std::fabs(y) * 0x1p-24;
          CHECK(std::fabs(q - y) <= bound);
          const double dequantized = static_cast<double>(static_cast<float>(q) * scale);
          CHECK(std::fabs(dequantized - x[d]) <= (bound + std::fabs(y) * 0x1p-23) * scale);
          largest_error = std::max(largest_error, std::fabs(q - y) / fp8_half_step(y));
        }
        CHECK(largest_code == edge::kernels::fp8_e4m3_traits::max);  // the row's largest value uses the top code
        ++rows_checked;
      }
    }
  }
  CHECK(rows_checked == 2 * tokens * kv_heads - 2);
  CHECK(zero_rows == 2);
  CHECK(largest_error > 0.5);  // the data really was rounded, up to the bound
}

TEST_CASE("every E4M3 code in an FP8 V row reads back exactly through attention") {
  // One KV head of 256 dims holding each of the 256 codes once (scaled by an awkward factor),
  // and a context of one token: its softmax weight is exactly 1, so the output is that V row
  // dequantized, which each code path must produce bit for bit (NaN codes as NaN).
  const std::int64_t head_dim = 256, block_size = 4, num_blocks = 2;
  std::vector<float> v(static_cast<std::size_t>(head_dim));
  for (std::size_t code = 0; code < v.size(); ++code) {
    v[code] = edge::kernels::fp8_e4m3_to_float(static_cast<std::uint8_t>(code)) * 0.37f;
  }
  const auto k = edge::testing::random_floats(v.size(), 41);
  std::vector<std::uint8_t> k_cache(static_cast<std::size_t>(num_blocks * block_size * head_dim));
  std::vector<std::uint8_t> v_cache(k_cache.size());
  std::vector<float> k_scales(static_cast<std::size_t>(num_blocks * block_size)), v_scales(k_scales.size());
  const std::int64_t slot = 4;  // block 1, offset 0
  REQUIRE(edge::kernels::run_kv_cache_write({.k = k.data(), .v = v.data(), .k_cache = k_cache.data(),
                                             .v_cache = v_cache.data(), .k_scales = k_scales.data(),
                                             .v_scales = v_scales.data(), .kv_type = dtype::fp8_e4m3,
                                             .slots = &slot, .tokens = 1, .num_kv_heads = 1, .head_dim = head_dim,
                                             .block_size = block_size, .num_blocks = num_blocks,
                                             .kv_stride = head_dim},
                                            {})
              .ok());
  const std::uint8_t* codes = v_cache.data() + slot * head_dim;
  const float scale = v_scales[static_cast<std::size_t>(slot)];
  for (std::size_t code = 0; code < v.size(); ++code) {
    const bool is_nan = (code & edge::kernels::fp8_e4m3_traits::abs_mask) == edge::kernels::fp8_e4m3_traits::nan_code;
    CHECK(codes[code] == (is_nan ? edge::kernels::fp8_e4m3_traits::nan_code : code));
  }

  // Position 0 of a sequence whose block table is {1}.
  const std::vector<std::int32_t> table = {1};
  const std::vector<std::int32_t> table_begin = {0, 1};
  const std::int32_t seq = 0, pos = 0;
  const auto q = edge::testing::random_floats(v.size(), 42);
  std::vector<float> out(v.size());
  REQUIRE(edge::kernels::run_paged_attention(
              {.q = q.data(), .out = out.data(), .k_cache = k_cache.data(), .v_cache = v_cache.data(),
               .k_scales = k_scales.data(), .v_scales = v_scales.data(), .kv_type = dtype::fp8_e4m3,
               .seq = &seq, .pos = &pos, .block_tables = table.data(), .table_begin = table_begin.data(),
               .tokens = 1, .num_heads = 1, .num_kv_heads = 1, .head_dim = head_dim, .block_size = block_size,
               .num_blocks = num_blocks, .q_stride = head_dim, .out_stride = head_dim, .scale = 0.0625f},
              {})
              .ok());
  for (std::size_t d = 0; d < v.size(); ++d) {
    CAPTURE(d);
    const float expected = edge::kernels::fp8_e4m3_to_float(codes[d]) * scale;
    if (std::isnan(expected)) {
      CHECK(std::isnan(out[d]));
    } else {
      CHECK(out[d] == expected);
    }
  }
}

TEST_CASE("paged attention and the cache write reject out-of-range blocks and slots") {
  fixture f({20}, 2, 1, 16, 16, dtype::f32);
  std::vector<float> q(32), out(32);
  std::int32_t seq = 0, pos = 40;  // beyond the 2-block table
  CHECK_FALSE(edge::kernels::run_paged_attention(f.params(q.data(), out.data(), &seq, &pos, 1), {}).ok());
  // Ragged tables: a row's own length bounds it, not what follows it.
  fixture two({20, 40}, 2, 1, 16, 16, dtype::f32);
  pos = 39;
  CHECK_FALSE(edge::kernels::run_paged_attention(two.params(q.data(), out.data(), &seq, &pos, 1), {}).ok());
  seq = 1;
  CHECK(edge::kernels::run_paged_attention(two.params(q.data(), out.data(), &seq, &pos, 1), {}).ok());
  seq = 0;

  std::int64_t slot = f.num_blocks * f.block_size;
  std::vector<float> k(16), v(16);
  edge::kernels::kv_cache_write_params w{.k = k.data(), .v = v.data(), .k_cache = f.k_cache.data(),
                                         .v_cache = f.v_cache.data(), .slots = &slot, .tokens = 1, .num_kv_heads = 1,
                                         .head_dim = 16, .block_size = 16, .num_blocks = f.num_blocks, .kv_stride = 16};
  CHECK_FALSE(edge::kernels::run_kv_cache_write(w, {}).ok());

  // An FP8 cache without its scales.
  fixture fp8({20}, 2, 1, 16, 16, dtype::fp8_e4m3);
  pos = 19;
  auto missing = fp8.params(q.data(), out.data(), &seq, &pos, 1);
  CHECK(edge::kernels::run_paged_attention(missing, {}).ok());
  missing.v_scales = nullptr;
  CHECK_FALSE(edge::kernels::run_paged_attention(missing, {}).ok());
  slot = 0;
  w.k_cache = fp8.k_cache.data();
  w.v_cache = fp8.v_cache.data();
  w.kv_type = dtype::fp8_e4m3;
  CHECK_FALSE(edge::kernels::run_kv_cache_write(w, {}).ok());
  w.k_scales = fp8.k_scales.data();
  w.v_scales = fp8.v_scales.data();
  CHECK(edge::kernels::run_kv_cache_write(w, {}).ok());
}
