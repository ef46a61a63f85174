#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "kernel_test_util.h"
#include "kernels/embedding/embedding.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/sampling/sampling.h"
#include "kernels/silu_mul/silu_mul.h"

using edge::kernels::dtype;

TEST_CASE("embedding widens the looked-up rows and rejects ids outside the vocabulary") {
  const std::int64_t vocab = 11, hidden = 37;
  const auto table = edge::testing::encode(edge::testing::random_floats(vocab * hidden, 1), dtype::bf16);
  std::vector<std::int32_t> ids = {3, 0, 10, 3};
  std::vector<float> out(ids.size() * hidden);
  REQUIRE(edge::kernels::run_embedding({.ids = ids.data(), .table = table.bytes.data(), .table_type = dtype::bf16,
                                        .out = out.data(), .tokens = 4, .vocab = vocab, .hidden = hidden},
                                       {})
              .ok());
  for (std::size_t t = 0; t < ids.size(); ++t) {
    for (std::int64_t d = 0; d < hidden; ++d) CHECK(out[t * hidden + d] == table.decoded[ids[t] * hidden + d]);
  }
  ids[1] = 11;
  CHECK_FALSE(edge::kernels::run_embedding({.ids = ids.data(), .table = table.bytes.data(), .table_type = dtype::bf16,
                                            .out = out.data(), .tokens = 4, .vocab = vocab, .hidden = hidden},
                                           {})
                  .ok());
}

TEST_CASE("rmsnorm normalises each row, with and without a fused residual") {
  const std::int64_t rows = 3, cols = 172;
  auto x = edge::testing::random_floats(rows * cols, 2, 3.0f);
  const auto residual = edge::testing::random_floats(rows * cols, 3);
  const auto weight = edge::testing::random_floats(cols, 4);
  const auto original = x;
  std::vector<float> out(x.size());
  REQUIRE(edge::kernels::run_rmsnorm({.x = x.data(), .residual = residual.data(), .weight = weight.data(),
                                      .out = out.data(), .rows = rows, .cols = cols, .x_stride = cols,
                                      .out_stride = cols, .eps = 1e-5f},
                                     {})
              .ok());
  for (std::int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (std::int64_t i = 0; i < cols; ++i) {
      const double v = double(original[r * cols + i]) + residual[r * cols + i];
      CHECK(x[r * cols + i] == doctest::Approx(v).epsilon(1e-6));
      ss += v * v;
    }
    const double inv = 1.0 / std::sqrt(ss / cols + 1e-5);
    for (std::int64_t i = 0; i < cols; ++i) {
      CHECK(out[r * cols + i] == doctest::Approx(x[r * cols + i] * inv * weight[i]).epsilon(1e-5));
    }
  }
}

TEST_CASE("rmsnorm with a row index normalises the chosen rows of x into consecutive rows") {
  const std::int64_t rows = 5, cols = 37;
  const auto x = edge::testing::random_floats(rows * cols, 6, 2.0f);
  const auto weight = edge::testing::random_floats(cols, 7);
  std::vector<float> all(x.size());
  auto x_copy = x;
  REQUIRE(edge::kernels::run_rmsnorm({.x = x_copy.data(), .weight = weight.data(), .out = all.data(), .rows = rows,
                                      .cols = cols, .x_stride = cols, .out_stride = cols},
                                     {})
              .ok());
  const std::vector<std::int64_t> index = {4, 0, 4};
  std::vector<float> gathered(index.size() * cols);
  auto x_read = x;
  REQUIRE(edge::kernels::run_rmsnorm({.x = x_read.data(), .row_index = index.data(), .weight = weight.data(),
                                      .out = gathered.data(), .rows = 3, .cols = cols, .x_stride = cols,
                                      .out_stride = cols},
                                     {})
              .ok());
  CHECK(x_read == x);
  for (std::size_t r = 0; r < index.size(); ++r) {
    for (std::int64_t i = 0; i < cols; ++i) CHECK(gathered[r * cols + i] == all[index[r] * cols + i]);
  }
  const auto residual = edge::testing::random_floats(rows * cols, 8);
  CHECK(!edge::kernels::run_rmsnorm({.x = x_read.data(), .residual = residual.data(), .row_index = index.data(),
                                     .weight = weight.data(), .out = gathered.data(), .rows = 3, .cols = cols,
                                     .x_stride = cols, .out_stride = cols},
                                    {})
             .ok());
}

TEST_CASE("rope rotates the right pairs by position times frequency") {
  const std::int64_t head_dim = 8, heads = 2;
  const auto inv_freq = edge::kernels::rope_inv_freq(head_dim, 10000.0, std::nullopt);
  REQUIRE(inv_freq.size() == 4);
  CHECK(inv_freq[1] == doctest::Approx(std::pow(10000.0, -2.0 / 8)));
  for (auto layout : {edge::kernels::rope_pairs::adjacent, edge::kernels::rope_pairs::half_split}) {
    const auto original = edge::testing::random_floats(2 * heads * head_dim, 5);
    auto x = original;
    std::vector<std::int32_t> positions = {0, 7};
    REQUIRE(edge::kernels::run_rope({.x = x.data(), .positions = positions.data(), .inv_freq = inv_freq.data(),
                                     .tokens = 2, .heads = heads, .head_dim = head_dim, .x_stride = heads * head_dim,
                                     .pairs = layout},
                                    {})
                .ok());
    for (std::int64_t i = 0; i < heads * head_dim; ++i) CHECK(x[i] == original[i]);  // position 0: identity
    for (std::int64_t h = 0; h < heads; ++h) {
      for (std::int64_t i = 0; i < head_dim / 2; ++i) {
        const std::int64_t a = layout == edge::kernels::rope_pairs::adjacent ? 2 * i : i;
        const std::int64_t b = layout == edge::kernels::rope_pairs::adjacent ? 2 * i + 1 : i + head_dim / 2;
        const std::int64_t base = heads * head_dim + h * head_dim;
        const double angle = 7.0 * inv_freq[i];
        const double x0 = original[base + a], x1 = original[base + b];
        CHECK(x[base + a] == doctest::Approx(x0 * std::cos(angle) - x1 * std::sin(angle)).epsilon(1e-5));
        CHECK(x[base + b] == doctest::Approx(x0 * std::sin(angle) + x1 * std::cos(angle)).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("partial rope rotates the leading rotary_dim elements of each head and passes the rest") {
  const std::int64_t head_dim = 8, rotary_dim = 4, heads = 2;
  const auto inv_freq = edge::kernels::rope_inv_freq(rotary_dim, 10000.0, std::nullopt);
  REQUIRE(inv_freq.size() == 2);
  const auto original = edge::testing::random_floats(heads * head_dim, 6);
  auto x = original;
  const std::vector<std::int32_t> positions = {5};
  REQUIRE(edge::kernels::run_rope({.x = x.data(), .positions = positions.data(), .inv_freq = inv_freq.data(),
                                   .tokens = 1, .heads = heads, .head_dim = head_dim, .rotary_dim = rotary_dim,
                                   .x_stride = heads * head_dim, .pairs = edge::kernels::rope_pairs::half_split},
                                  {})
              .ok());
  for (std::int64_t h = 0; h < heads; ++h) {
    const std::int64_t base = h * head_dim;
    for (std::int64_t i = 0; i < rotary_dim / 2; ++i) {  // pairs (i, i + rotary_dim / 2)
      const double angle = 5.0 * inv_freq[static_cast<std::size_t>(i)];
      const double x0 = original[base + i], x1 = original[base + i + rotary_dim / 2];
      CHECK(x[base + i] == doctest::Approx(x0 * std::cos(angle) - x1 * std::sin(angle)).epsilon(1e-5));
      CHECK(x[base + i + rotary_dim / 2] == doctest::Approx(x0 * std::sin(angle) + x1 * std::cos(angle)).epsilon(1e-5));
    }
    for (std::int64_t i = rotary_dim; i < head_dim; ++i) CHECK(x[base + i] == original[base + i]);
  }
  for (const std::int64_t bad : {3, 10}) {
    CHECK(edge::kernels::run_rope({.x = x.data(), .positions = positions.data(), .inv_freq = inv_freq.data(),
                                   .tokens = 1, .heads = heads, .head_dim = head_dim, .rotary_dim = bad,
                                   .x_stride = heads * head_dim},
                                  {})
              .code() == edge::status_code::invalid_argument);
  }
}

TEST_CASE("rope's Llama-3 scaling keeps high frequencies, divides low ones and blends between") {
  const edge::kernels::rope_llama3_scaling scaling{8.0, 1.0, 4.0, 8192.0};
  const auto plain = edge::kernels::rope_inv_freq(128, 500000.0, std::nullopt);
  const auto scaled = edge::kernels::rope_inv_freq(128, 500000.0, scaling);
  for (std::size_t i = 0; i < plain.size(); ++i) {
    const double wavelength = 2 * std::numbers::pi / plain[i];
    if (wavelength < 8192.0 / 4.0) {
      CHECK(scaled[i] == plain[i]);
    } else if (wavelength > 8192.0) {
      CHECK(scaled[i] == doctest::Approx(plain[i] / 8.0));
    } else {
      CHECK(scaled[i] < plain[i]);
      CHECK(scaled[i] > plain[i] / 8.0);
    }
  }
}

TEST_CASE("silu_mul computes silu(gate) * up") {
  const auto gate = edge::testing::random_floats(2 * 33, 6, 4.0f);
  const auto up = edge::testing::random_floats(2 * 33, 7);
  std::vector<float> out(gate.size());
  REQUIRE(edge::kernels::run_silu_mul({.gate = gate.data(), .up = up.data(), .out = out.data(), .rows = 2,
                                       .cols = 33, .in_stride = 33, .out_stride = 33},
                                      {})
              .ok());
  for (std::size_t i = 0; i < out.size(); ++i) {
    CHECK(out[i] == doctest::Approx(gate[i] / (1.0 + std::exp(-double(gate[i]))) * up[i]).epsilon(1e-5));
  }
}

namespace {

std::int32_t sample_one(std::vector<float> logits, edge::kernels::sampling_row row) {
  std::int32_t out = -1;
  REQUIRE(edge::kernels::run_sampling({.logits = logits.data(), .config = &row, .out = &out, .rows = 1,
                                       .vocab = static_cast<std::int64_t>(logits.size())},
                                      {})
              .ok());
  return out;
}

}  // namespace

TEST_CASE("argmax picks the first largest value and skips NaN") {
  CHECK(edge::kernels::argmax(std::vector<float>{1, 3, 3, 2}) == 1);
  CHECK(edge::kernels::argmax(std::vector<float>{std::nanf(""), -5, -7}) == 1);
  CHECK(sample_one({0.5f, 2.0f, 1.0f}, {.temperature = 0.0f, .uniform = 0.9f}) == 1);
}

TEST_CASE("sampling follows the softmax distribution and its filters") {
  const std::vector<float> logits = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  // Evenly spaced uniforms: token i is chosen for a share of them equal to its probability.
  const auto shares = [&](edge::kernels::sampling_row row) {
    std::vector<int> counts(logits.size(), 0);
    const int draws = 1000;
    for (int i = 0; i < draws; ++i) {
      row.uniform = (static_cast<float>(i) + 0.5f) / draws;
      ++counts[static_cast<std::size_t>(sample_one(logits, row))];
    }
    return counts;
  };
  auto plain = shares({.temperature = 1.0f});
  CHECK(plain == std::vector<int>{100, 200, 300, 400});

  auto top2 = shares({.temperature = 1.0f, .top_k = 2});
  CHECK(top2[0] == 0);
  CHECK(top2[1] == 0);
  CHECK(top2[2] == doctest::Approx(1000 * 3.0 / 7).epsilon(0.01));

  // top_p 0.65: 0.4 + 0.3 reaches it; 0.2 and 0.1 are cut.
  auto nucleus = shares({.temperature = 1.0f, .top_p = 0.65f});
  CHECK(nucleus[0] + nucleus[1] == 0);

  // min_p 0.6: tokens below 0.6 * 0.4 = 0.24 are cut.
  auto minp = shares({.temperature = 1.0f, .min_p = 0.6f});
  CHECK(minp[0] + minp[1] == 0);
  CHECK(minp[2] + minp[3] == 1000);

  CHECK(sample_one(logits, {.temperature = 1.0f, .top_k = 1, .uniform = 0.99f}) == 3);
  // A low temperature sharpens toward the most likely token.
  auto cold = shares({.temperature = 0.05f});
  CHECK(cold[3] > 990);
}

TEST_CASE("sampling rows without a finite maximum take the first of the largest, as greedy") {
  const float inf = std::numeric_limits<float>::infinity();
  // +inf logits: no distribution to draw from, whatever the draw.
  const std::vector<float> infinite = {1.0f, inf, 3.0f, inf};
  for (const float u : {0.0f, 0.5f, 0.99f}) {
    CHECK(sample_one(infinite, {.temperature = 1.0f, .uniform = u}) == 1);
    CHECK(sample_one(infinite, {.temperature = 0.7f, .top_p = 0.9f, .uniform = u}) == 1);
  }
  // Nothing but -inf (and a NaN, never chosen): the lowest id.
  const std::vector<float> none = {std::nanf(""), -inf, -inf};
  CHECK(sample_one(none, {.temperature = 1.0f, .uniform = 0.7f}) == 1);
  // top_k keeps the largest first: here the +inf one.
  CHECK(sample_one({-inf, 2.0f, inf}, {.temperature = 1.0f, .top_k = 2, .uniform = 0.1f}) == 2);
}

TEST_CASE("a token mask limits greedy and random draws to the allowed tokens, renormalised") {
  // Token 3 is the most likely; the mask allows 0 and 2 only (one row masked, one not).
  const std::vector<float> logits = {std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f),
                                     std::log(0.1f), std::log(0.2f), std::log(0.3f), std::log(0.4f)};
  const std::vector<std::uint32_t> allowed = {0b0101u};
  std::vector<int> counts(4, 0);
  std::vector<int> unmasked(4, 0);
  const int draws = 1000;
  for (int i = 0; i < draws; ++i) {
    std::vector<float> scratch = logits;
    const float u = (static_cast<float>(i) + 0.5f) / draws;
    const std::vector<edge::kernels::sampling_row> rows = {{.temperature = 1.0f, .uniform = u, .allowed_row = 0},
                                                           {.temperature = 1.0f, .uniform = u}};
    std::vector<std::int32_t> out(2);
    REQUIRE(edge::kernels::run_sampling({.logits = scratch.data(), .config = rows.data(), .out = out.data(), .rows = 2,
                                         .vocab = 4, .allowed = allowed.data()},
                                        {})
                .ok());
    ++counts[static_cast<std::size_t>(out[0])];
    ++unmasked[static_cast<std::size_t>(out[1])];
  }
  // 0.1 : 0.3 of the allowed mass; the unmasked row draws from everything.
  CHECK(counts == std::vector<int>{250, 0, 750, 0});
  CHECK(unmasked == std::vector<int>{100, 200, 300, 400});
  std::vector<float> scratch = logits;
  const edge::kernels::sampling_row greedy{.temperature = 0.0f, .allowed_row = 0};
  std::int32_t chosen = -1;
  REQUIRE(edge::kernels::run_sampling({.logits = scratch.data(), .config = &greedy, .out = &chosen, .rows = 1, .vocab = 4,
                                       .allowed = allowed.data()},
                                      {})
              .ok());
  CHECK(chosen == 2);
}

TEST_CASE("rmsnorm with groups normalises each vector of a row on its own, in place and strided") {
  // 3 rows of 4 heads of 16, in rows 70 wide (as Q heads sit in a fused Q/K/V row).
  const std::int64_t rows = 3, groups = 4, cols = 16, stride = 70;
  auto x = edge::testing::random_floats(rows * stride, 6, 2.0f);
  const auto weight = edge::testing::random_floats(cols, 7);
  auto expected = x;
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t g = 0; g < groups; ++g) {
      float* v = expected.data() + r * stride + g * cols;
      REQUIRE(edge::kernels::run_rmsnorm({.x = v, .weight = weight.data(), .out = v, .rows = 1, .cols = cols,
                                          .x_stride = cols, .out_stride = cols, .eps = 1e-6f},
                                         {})
                  .ok());
    }
  }
  REQUIRE(edge::kernels::run_rmsnorm({.x = x.data(), .weight = weight.data(), .out = x.data(), .rows = rows, .cols = cols,
                                      .groups = groups, .x_stride = stride, .out_stride = stride, .eps = 1e-6f},
                                     {})
              .ok());
  CHECK(x == expected);  // the same sums in the same order: bit for bit; the tail of each row untouched
  // A stride too short for the groups, and groups with a residual, are refused.
  CHECK_FALSE(edge::kernels::run_rmsnorm({.x = x.data(), .weight = weight.data(), .out = x.data(), .rows = rows,
                                          .cols = cols, .groups = groups, .x_stride = 60, .out_stride = 60},
                                         {})
                  .ok());
  CHECK_FALSE(edge::kernels::run_rmsnorm({.x = x.data(), .residual = x.data(), .weight = weight.data(), .out = x.data(),
                                          .rows = rows, .cols = cols, .groups = groups, .x_stride = stride,
                                          .out_stride = stride},
                                         {})
                  .ok());
}
