// INT4 and FP8 weights: the packed layout, quantization and its rounding, dequantization, and
// the matmul over quantized weights against the f32 matmul of the dequantized matrix.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstring>

#include "edge/common/thread_pool.h"
#include "kernel_test_util.h"
#include "quantized_test_util.h"
#include "kernels/matmul/matmul.h"
#include "kernels/quantize/quantize.h"

namespace {

using edge::testing::dequantize;
using edge::testing::quantize;
using edge::testing::reference;
using edge::kernels::int4_traits;
using edge::kernels::weight_format;
using edge::kernels::weight_view;

// The float kernels unless `integer` (INT4 and INT8 weights over int8 activations, where the CPU
// multiplies them so: integer_dot_test.cpp checks that path).
std::vector<float> matmul(const std::vector<float>& x, const weight_view& w, std::int64_t tokens, std::int64_t n,
                          std::int64_t k, const float* bias, edge::thread_pool* pool, bool integer = false) {
  std::vector<float> y(static_cast<std::size_t>(tokens * n), std::nanf(""));  // [tokens, n]
  const auto done = edge::kernels::run_matmul(
      {.x = x.data(), .w = w, .bias = bias, .y = y.data(), .tokens = tokens, .n = n, .k = k, .x_stride = k, .y_stride = n,
       .exact_activations = !integer},
      {.pool = pool});
  REQUIRE_MESSAGE(done.ok(), done.message());
  return y;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct shape {
  std::int64_t tokens, n, k, group_size;
};

// k not a multiple of the chunk (32) or of 16, groups from 1 to 128, row counts around the
// tile heights (8 and 4) and the per-thread block (64).
constexpr shape awkward_shapes[] = {
    {1, 1, 1, 1},      {1, 9, 17, 1},     {3, 13, 40, 8},    {5, 54, 48, 16},  {1, 97, 96, 32},
    {7, 65, 172, 4},   {2, 33, 200, 8},   {13, 64, 256, 128}, {6, 70, 384, 64}, {4, 130, 112, 16},
    {9, 8, 160, 32},   {1, 257, 2048, 128}, {17, 31, 72, 8},  {1, 12, 36, 4},   {8, 5, 4096, 128},
};

}  // namespace

TEST_CASE("INT4 packing: element i of a chunk sits in byte i % 16, low nibble for i < 16, as q + 8") {
  std::array<std::uint8_t, 2 * int4_traits::chunk_bytes> row{};  // [2 chunks]
  for (std::int64_t i = 0; i < 2 * int4_traits::chunk_elements; ++i) {
    edge::kernels::int4_set(row.data(), i, static_cast<int>(i % 16) - 8);
  }
  // Element j and j + 16 of a chunk share byte j: codes j (low) and j (high).
  for (std::size_t b = 0; b < row.size(); ++b) {
    const auto j = static_cast<std::uint8_t>(b % int4_traits::chunk_bytes);
    CHECK(row[b] == static_cast<std::uint8_t>(j | (j << 4)));
  }
  // Every value at every position of a chunk round-trips, and setting one nibble leaves the
  // other alone.
  for (int q = int4_traits::min_value; q <= int4_traits::max_value; ++q) {
    for (std::int64_t i = 0; i < int4_traits::chunk_elements; ++i) {
      std::array<std::uint8_t, int4_traits::chunk_bytes> chunk;
      chunk.fill(0x5A);
      edge::kernels::int4_set(chunk.data(), i, q);
      CHECK(edge::kernels::int4_get(chunk.data(), i) == q);
      const std::int64_t partner = i < 16 ? i + 16 : i - 16;
      CHECK(edge::kernels::int4_get(chunk.data(), partner) == (i < 16 ? 0x5 : 0xA) - 8);
    }
  }
  CHECK(edge::kernels::int4_row_bytes(1) == 16);
  CHECK(edge::kernels::int4_row_bytes(32) == 16);
  CHECK(edge::kernels::int4_row_bytes(33) == 32);
  CHECK(edge::kernels::int4_row_bytes(2048) == 1024);
}

TEST_CASE("INT4 group sizes: 128, or the largest power of two dividing the row") {
  CHECK(edge::kernels::int4_group_size_for(2048) == 128);
  CHECK(edge::kernels::int4_group_size_for(8192) == 128);
  CHECK(edge::kernels::int4_group_size_for(64) == 64);
  CHECK(edge::kernels::int4_group_size_for(96) == 32);
  CHECK(edge::kernels::int4_group_size_for(172) == 4);
  CHECK(edge::kernels::int4_group_size_for(896) == 128);
  CHECK(edge::kernels::int4_group_size_for(4864) == 128);
  CHECK(edge::kernels::int4_group_size_for(7) == 1);
  CHECK(edge::kernels::valid_int4_group_size(4, 172));
  CHECK_FALSE(edge::kernels::valid_int4_group_size(8, 172));
  CHECK_FALSE(edge::kernels::valid_int4_group_size(3, 6));
  CHECK_FALSE(edge::kernels::valid_int4_group_size(0, 6));
}

TEST_CASE("INT4 rounding: to nearest, ties to even, clamped to [-8, 7]; scale amax / 7.5") {
  const std::pair<float, int> cases[] = {
      {0.0f, 0},  {0.49f, 0}, {0.5f, 0},   {0.51f, 1},  {1.5f, 2},   {2.5f, 2},   {3.5f, 4},
      {-0.5f, 0}, {-1.5f, -2}, {-2.5f, -2}, {-2.51f, -3}, {6.5f, 6}, {7.49f, 7},  {7.5f, 7},
      {9.0f, 7},  {-7.5f, -8}, {-8.4f, -8}, {-100.0f, -8}, {100.0f, 7}, {-6.5f, -6},
  };
  for (const auto& [ratio, q] : cases) {
    CAPTURE(ratio);
    CHECK(edge::kernels::int4_quantize(ratio, 1.0f) == q);
    CHECK(edge::kernels::int4_quantize(ratio * 0.25f, 0.25f) == q);  // exact: powers of two
  }
  CHECK(edge::kernels::int4_quantize(1.0f, 0.0f) == 0);
  CHECK(edge::kernels::int4_scale(7.5f) == 1.0f);
  CHECK(edge::kernels::int4_scale(0.0f) == 0.0f);

  // A group's largest magnitude: negative maps to -8 exactly, positive clamps to 7.
  const std::vector<float> group = {-3.0f, 1.0f, 0.0f, 0.2f};
  const auto q = quantize(group, 1, 4, weight_format::int4, 4);
  CHECK(q.scales[0] == 3.0f / 7.5f);
  CHECK(edge::kernels::int4_get(q.values.data(), 0) == -8);
  const auto positive = quantize({3.0f, -1.0f, 0.0f, 0.2f}, 1, 4, weight_format::int4, 4);
  CHECK(edge::kernels::int4_get(positive.values.data(), 0) == 7);
  CHECK(edge::kernels::int4_get(positive.values.data(), 1) == -2);  // -1 / 0.4 = -2.5: ties to even
}

TEST_CASE("INT4 quantization: every weight within half a step, padding is zero, any thread count") {
  edge::thread_pool pool(2);
  for (const auto& [tokens, n, k, group_size] : awkward_shapes) {
    CAPTURE(n);
    CAPTURE(k);
    CAPTURE(group_size);
    const auto w = edge::testing::random_floats(static_cast<std::size_t>(n * k), 11, 0.05f);
    const auto q = quantize(w, n, k, weight_format::int4, group_size);
    CHECK(q.values == quantize(w, n, k, weight_format::int4, group_size, &pool).values);
    const auto back = dequantize(q.view(), n, k);
    const std::int64_t row_bytes = edge::kernels::int4_row_bytes(k);
    const std::int64_t groups = k / group_size;
    for (std::int64_t r = 0; r < n; ++r) {
      const std::uint8_t* row = q.values.data() + r * row_bytes;
      for (std::int64_t i = 0; i < k; ++i) {
        const float scale = q.scales[static_cast<std::size_t>(r * groups + i / group_size)];
        const float value = w[static_cast<std::size_t>(r * k + i)];
        const float restored = back[static_cast<std::size_t>(r * k + i)];
        // Dequantization is exactly float(q) × scale, and within half a step of the input.
        CHECK(restored == static_cast<float>(edge::kernels::int4_get(row, i)) * scale);
        CHECK(std::fabs(restored - value) <= 0.5f * scale * (1.0f + 1e-5f));
      }
      for (std::int64_t i = k; i < row_bytes * 2; ++i) CHECK(edge::kernels::int4_get(row, i) == 0);
    }
  }
}

TEST_CASE("FP8 weight quantization: scale amax / 448, codes round to nearest even, exact dequantization") {
  const std::vector<float> row = {-2.0f, 0.5f, 1e-6f, 1.0f, 0.0f, -0.75f};
  const auto q = quantize(row, 1, 6, weight_format::fp8_e4m3, 0);
  CHECK(q.scales[0] == 2.0f / 448.0f);
  CHECK(q.values[0] == 0xFE);  // -448
  for (std::size_t i = 0; i < row.size(); ++i) {
    CHECK(q.values[i] == edge::kernels::float_to_fp8_e4m3(row[i] / q.scales[0]));
  }
  const auto back = dequantize(q.view(), 1, 6);
  for (std::size_t i = 0; i < row.size(); ++i) {
    CHECK(back[i] == edge::kernels::fp8_e4m3_to_float(q.values[i]) * q.scales[0]);
  }
  CHECK(back[0] == -2.0f);
  const auto zeros = quantize(std::vector<float>(8, 0.0f), 1, 8, weight_format::fp8_e4m3, 0);
  CHECK(zeros.scales[0] == 0.0f);
  CHECK(dequantize(zeros.view(), 1, 8) == std::vector<float>(8, 0.0f));
}

TEST_CASE("INT4 matmul is bit-identical to the f32 matmul of the dequantized weights") {
  edge::thread_pool pool(2);
  for (const auto& [tokens, n, k, group_size] : awkward_shapes) {
    CAPTURE(tokens);
    CAPTURE(n);
    CAPTURE(k);
    CAPTURE(group_size);
    const auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), 21);
    const auto w = edge::testing::random_floats(static_cast<std::size_t>(n * k), 22, 0.05f);
    const auto bias = edge::testing::random_floats(static_cast<std::size_t>(n), 23);
    const auto q = quantize(w, n, k, weight_format::int4, group_size);
    const auto dense = dequantize(q.view(), n, k);
    const auto y = matmul(x, q.view(), tokens, n, k, bias.data(), &pool);
    const auto expected = matmul(x, {.format = weight_format::f32, .values = dense.data()}, tokens, n, k, bias.data(), &pool);
    CHECK(edge::testing::all_finite(y));
    CHECK(same_bits(y, expected));
    CHECK(edge::testing::relative_error(y, reference(x, dense, bias.data(), tokens, n, k)) < 1e-5);
  }
}

TEST_CASE("FP8 matmul matches the f32 matmul of the dequantized weights to 1e-5") {
  edge::thread_pool pool(2);
  for (const auto& [tokens, n, k, group_size] : awkward_shapes) {
    CAPTURE(tokens);
    CAPTURE(n);
    CAPTURE(k);
    const auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), 31);
    const auto w = edge::testing::random_floats(static_cast<std::size_t>(n * k), 32, 0.05f);
    const auto bias = edge::testing::random_floats(static_cast<std::size_t>(n), 33);
    const auto q = quantize(w, n, k, weight_format::fp8_e4m3, 0);
    const auto dense = dequantize(q.view(), n, k);
    const auto y = matmul(x, q.view(), tokens, n, k, bias.data(), &pool);
    const auto expected = matmul(x, {.format = weight_format::f32, .values = dense.data()}, tokens, n, k, bias.data(), &pool);
    CHECK(edge::testing::all_finite(y));
    std::vector<double> as_double(expected.begin(), expected.end());
    CHECK(edge::testing::relative_error(y, as_double) < 1e-5);
    CHECK(edge::testing::relative_error(y, reference(x, dense, bias.data(), tokens, n, k)) < 1e-5);
  }
}

TEST_CASE("an FP8 NaN code makes its row's outputs NaN and no other") {
  // Codes 0x7F and 0xFF are E4M3's NaN; every other code is finite. Rows of 40 (a full
  // 16-wide vector and a masked tail) with the NaN code at different places.
  const std::int64_t n = 4, k = 40, tokens = 3;
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(n * k), 0x38);  // 1.0
  codes[static_cast<std::size_t>(0 * k + 3)] = 0x7F;
  codes[static_cast<std::size_t>(2 * k + 37)] = 0xFF;
  const std::vector<float> scales(static_cast<std::size_t>(n), 0.5f);
  const weight_view w{.format = weight_format::fp8_e4m3, .values = codes.data(), .scales = scales.data(), .group_size = 0};
  const auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), 61);
  const auto y = matmul(x, w, tokens, n, k, nullptr, nullptr);
  for (std::int64_t t = 0; t < tokens; ++t) {
    CAPTURE(t);
    CHECK(std::isnan(y[static_cast<std::size_t>(t * n + 0)]));
    CHECK(std::isfinite(y[static_cast<std::size_t>(t * n + 1)]));
    CHECK(std::isnan(y[static_cast<std::size_t>(t * n + 2)]));
    CHECK(std::isfinite(y[static_cast<std::size_t>(t * n + 3)]));
  }
}

TEST_CASE("quantized matmul gives each token bit-identical results alone and in any batch") {
  edge::thread_pool pool(2);
  const std::int64_t n = 203, k = 176, tokens = 17;
  const auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), 41);
  const auto w = edge::testing::random_floats(static_cast<std::size_t>(n * k), 42, 0.05f);
  for (const auto& [format, group_size] : {std::pair{weight_format::int4, std::int64_t{16}},
                                           std::pair{weight_format::int4, std::int64_t{8}},
                                           std::pair{weight_format::fp8_e4m3, std::int64_t{0}}}) {
    CAPTURE(edge::kernels::to_string(format));
    CAPTURE(group_size);
    const auto q = quantize(w, n, k, format, group_size);
    const auto together = matmul(x, q.view(), tokens, n, k, nullptr, &pool);
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::vector<float> one(x.begin() + t * k, x.begin() + (t + 1) * k);
      const auto alone = matmul(one, q.view(), 1, n, k, nullptr, nullptr);
      CHECK(std::memcmp(alone.data(), together.data() + t * n, static_cast<std::size_t>(n) * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("quantized matmul accumulates, and zero groups give zeros, not NaN") {
  const std::int64_t n = 3, k = 64;
  std::vector<float> w(static_cast<std::size_t>(n * k), 0.0f);
  for (std::int64_t i = 0; i < k; ++i) w[static_cast<std::size_t>(k + i)] = static_cast<float>(i % 5) - 2.0f;
  const auto x = edge::testing::random_floats(static_cast<std::size_t>(k), 51);
  // INT4 on both CPU paths: the float one (exact) and the integer one (int8 activations).
  for (const auto& [format, exact] : {std::pair{weight_format::int4, true}, std::pair{weight_format::int4, false},
                                      std::pair{weight_format::int8, false}, std::pair{weight_format::fp8_e4m3, true}}) {
    CAPTURE(edge::kernels::to_string(format));
    CAPTURE(exact);
    const auto q = quantize(w, n, k, format, 32);
    std::vector<float> y(static_cast<std::size_t>(n), 1.0f);
    REQUIRE(edge::kernels::run_matmul({.x = x.data(), .w = q.view(), .y = y.data(), .tokens = 1, .n = n, .k = k,
                                       .x_stride = k, .y_stride = n, .accumulate = true, .exact_activations = exact},
                                      {})
                .ok());
    CHECK(y[0] == 1.0f);
    CHECK(y[2] == 1.0f);
    const auto dense = dequantize(q.view(), n, k);
    double expected = 1.0;
    for (std::int64_t i = 0; i < k; ++i) expected += double(x[static_cast<std::size_t>(i)]) * dense[static_cast<std::size_t>(k + i)];
    CHECK(y[1] == doctest::Approx(expected).epsilon(exact ? 1e-5 : 1e-2));
  }
}

TEST_CASE("matmul rejects quantized weights without scales or with a bad group size") {
  const std::vector<std::uint8_t> values(64, 0x88);
  const std::vector<float> scales(8, 1.0f), x(24, 1.0f);
  float y[2];
  edge::kernels::matmul_params p{.x = x.data(), .w = {.format = weight_format::int4, .values = values.data()}, .y = y,
                                 .tokens = 1, .n = 2, .k = 24, .x_stride = 24, .y_stride = 2};
  CHECK(edge::kernels::run_matmul(p, {}).code() == edge::status_code::invalid_argument);
  p.w.scales = scales.data();
  p.w.group_size = 16;  // does not divide 24
  CHECK(edge::kernels::run_matmul(p, {}).code() == edge::status_code::invalid_argument);
  p.w.group_size = 8;
  CHECK(edge::kernels::run_matmul(p, {}).ok());
  CHECK(y[0] == 0.0f);
  p.w.format = weight_format::fp8_e4m3;
  p.w.scales = nullptr;
  CHECK(edge::kernels::run_matmul(p, {}).code() == edge::status_code::invalid_argument);
  float row[24];
  CHECK(edge::kernels::run_quantize({.x = x.data(), .rows = 1, .k = 24, .x_stride = 24, .format = weight_format::bf16,
                                     .values = row, .scales = row},
                                    {})
            .code() == edge::status_code::invalid_argument);
}
