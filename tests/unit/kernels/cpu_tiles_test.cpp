// CPU row tiles (weight_layout::cpu_tiles): the layout's arithmetic against packing, packing and
// unpacking as exact inverses, and the tiles' VNNI kernel giving the portable path's bits.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "edge/common/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/cpu/isa.h"
#include "kernels/matmul/cpu_tiles.h"
#include "kernels/matmul/integer_dot.h"
#include "kernels/matmul/matmul.h"
#include "quantized_test_util.h"

namespace {

namespace cpu = edge::kernels::cpu;
using edge::kernels::cpu_tiles;
using edge::kernels::weight_format;
using edge::kernels::weight_layout;
using edge::kernels::weight_view;
using edge::testing::quantize;
using edge::testing::quantized;

std::vector<float> random_floats(std::int64_t count, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(static_cast<std::size_t>(count));
  for (float& v : out) v = normal(rng);
  return out;
}

// A matrix in CPU row tiles, owning its bytes.
struct tiled {
  std::vector<std::uint8_t> values;
  std::vector<float> scales;
  weight_view view;
};

tiled pack(const quantized& q, edge::thread_pool* pool = nullptr) {
  tiled t;
  t.values.assign(static_cast<std::size_t>(cpu_tiles::values_bytes(q.format, q.n, q.k)), 0xA5);
  t.scales.assign(static_cast<std::size_t>(cpu_tiles::scale_count(q.format, q.n, q.k, q.group_size)), -1.0f);
  const edge::status done = edge::kernels::pack_cpu_tiles(q.view(), q.n, q.k, t.values.data(), t.scales.data(), pool);
  REQUIRE_MESSAGE(done.ok(), done.message());
  t.view = q.view();
  t.view.values = t.values.data();
  t.view.scales = t.scales.data();
  t.view.layout = weight_layout::cpu_tiles;
  return t;
}

struct tile_case {
  weight_format format;
  std::int64_t group_size, n, k;
};

// Awkward shapes: one row, rows that leave the last tile partly filled, k not a multiple of the
// span (a last span of one block), groups from 32 to larger than a span.
const tile_case cases[] = {
    {weight_format::int4, 32, 1, 32},     {weight_format::int4, 32, 9, 544},   {weight_format::int4, 64, 17, 1024},
    {weight_format::int4, 128, 8, 2080 - 32}, {weight_format::int4, 1024, 13, 2048}, {weight_format::int4, 32, 67, 96},
    {weight_format::int8, 32, 1, 32},     {weight_format::int8, 32, 9, 288},   {weight_format::int8, 32, 24, 1024},
    {weight_format::int8, 32, 67, 96},
};

}  // namespace

TEST_CASE("CPU row tiles: every element where the layout says, padding as code 0, and back exactly") {
  edge::thread_pool pool(2);
  for (const tile_case& c : cases) {
    CAPTURE(edge::kernels::to_string(c.format));
    CAPTURE(c.group_size);
    CAPTURE(c.n);
    CAPTURE(c.k);
    const quantized q = quantize(random_floats(c.n * c.k, 3), c.n, c.k, c.format, c.group_size);
    const tiled t = pack(q, &pool);
    for (std::int64_t r = 0; r < c.n; ++r) {
      for (std::int64_t i = 0; i < c.k; ++i) {
        const int expected = edge::kernels::integer_code_at(q.view(), c.k, r, i);
        const cpu_tiles::place at = cpu_tiles::of(c.format, c.group_size, c.k, r, i);
        const int stored = at.high_nibble ? t.values[static_cast<std::size_t>(at.byte)] >> 4
                                          : t.values[static_cast<std::size_t>(at.byte)] & 15;
        const int code = c.format == weight_format::int8 ? t.values[static_cast<std::size_t>(at.byte)] - 128 : stored - 8;
        REQUIRE(code == expected);
        REQUIRE(edge::kernels::integer_code_at(t.view, c.k, r, i) == expected);
        REQUIRE(edge::kernels::integer_scale_at(t.view, c.k, r, i) == edge::kernels::integer_scale_at(q.view(), c.k, r, i));
      }
    }
    // The padding rows of the last tile: q = 0 and scale 0 everywhere.
    for (std::int64_t r = c.n; r < cpu_tiles::tiles(c.n) * cpu_tiles::rows; ++r) {
      for (std::int64_t i = 0; i < c.k; i += 7) {
        CHECK(edge::kernels::integer_code_at(t.view, c.k, r, i) == 0);
        CHECK(edge::kernels::integer_scale_at(t.view, c.k, r, i) == 0.0f);
      }
    }
    std::vector<std::uint8_t> values(q.values.size(), 0);
    std::vector<float> scales(q.scales.size(), 0.0f);
    REQUIRE(edge::kernels::unpack_cpu_tiles(t.view, c.n, c.k, values.data(), scales.data(), &pool).ok());
    CHECK(values == q.values);
    CHECK(std::memcmp(scales.data(), q.scales.data(), scales.size() * sizeof(float)) == 0);
    // Dequantization reads either layout.
    CHECK(edge::testing::dequantize(t.view, c.n, c.k) == edge::testing::dequantize(q.view(), c.n, c.k));
  }
}

TEST_CASE("CPU row tiles refuse what they do not hold") {
  const std::vector<float> f32 = random_floats(8 * 64, 1);
  std::vector<std::uint8_t> values(8192);
  std::vector<float> scales(64);
  CHECK(edge::kernels::pack_cpu_tiles({.format = weight_format::f32, .values = f32.data()}, 8, 64, values.data(),
                                      scales.data())
            .code() == edge::status_code::invalid_argument);
  const quantized small_groups = quantize(random_floats(8 * 64, 1), 8, 64, weight_format::int4, 16);
  CHECK(edge::kernels::pack_cpu_tiles(small_groups.view(), 8, 64, values.data(), scales.data()).code() ==
        edge::status_code::invalid_argument);
  // A matmul over tiles of a format they do not hold is refused rather than misread.
  weight_view wrong = small_groups.view();
  wrong.layout = weight_layout::cpu_tiles;
  std::vector<float> x(64, 1.0f), y(8);
  CHECK(edge::kernels::run_matmul({.x = x.data(), .w = wrong, .y = y.data(), .tokens = 1, .n = 8, .k = 64, .x_stride = 64,
                                   .y_stride = 8},
                                  {})
            .code() == edge::status_code::invalid_argument);
}

TEST_CASE("on tiles every path gives the portable path's bits, alone and in any batch, near the rows' result") {
  std::vector<cpu::isa> paths{cpu::isa::generic};
  if (cpu::supported_isa() >= cpu::isa::avx2) paths.push_back(cpu::isa::avx2);
  if (cpu::supported_isa() >= cpu::isa::avx512_vnni) paths.push_back(cpu::isa::avx512_vnni);
  const std::int64_t token_counts[] = {1, 2, 3, 5, 9};
  for (const tile_case& c : cases) {
    CAPTURE(edge::kernels::to_string(c.format));
    CAPTURE(c.group_size);
    CAPTURE(c.n);
    CAPTURE(c.k);
    const quantized q = quantize(random_floats(c.n * c.k, 5), c.n, c.k, c.format, c.group_size);
    const tiled t = pack(q);
    const std::vector<float> bias = random_floats(c.n, 6);
    for (const std::int64_t tokens : token_counts) {
      CAPTURE(tokens);
      const std::vector<float> x = random_floats(tokens * c.k, 7 + static_cast<unsigned>(tokens));
      const auto run = [&](const weight_view& w, cpu::isa level, std::int64_t count, const float* xs) {
        std::vector<float> y(static_cast<std::size_t>(count * c.n), std::nanf(""));
        const edge::kernels::matmul_params p{.x = xs, .w = w, .bias = bias.data(), .y = y.data(), .tokens = count,
                                             .n = c.n, .k = c.k, .x_stride = c.k, .y_stride = c.n};
        cpu::int8_activations activations;
        std::vector<float> sums;
        const cpu::integer_matmul call(p, level, activations, sums);
        // Threads take whole tiles: split the rows there, as run_matmul's blocks do.
        const std::int64_t half = std::min(c.n, cpu_tiles::rows * ((c.n / 2 + cpu_tiles::rows - 1) / cpu_tiles::rows));
        call.rows(0, half);
        call.rows(half, c.n);
        return y;
      };
      const std::vector<float> portable = run(q.view(), cpu::isa::generic, tokens, x.data());
      for (const cpu::isa level : paths) {
        CAPTURE(std::string(cpu::to_string(level)));
        const std::vector<float> on_tiles = run(t.view, level, tokens, x.data());
        REQUIRE(std::memcmp(on_tiles.data(), portable.data(), on_tiles.size() * sizeof(float)) == 0);
        // Each token alone gets the bits it got in the batch.
        for (std::int64_t one = 0; one < tokens; ++one) {
          const std::vector<float> alone = run(t.view, level, 1, x.data() + one * c.k);
          REQUIRE(std::memcmp(alone.data(), on_tiles.data() + one * c.n, alone.size() * sizeof(float)) == 0);
        }
        // The row layout's kernels on this path add in another order (AVX2's INT4 takes the
        // code offset off in float, at the end): the same within rounding.
        const std::vector<float> on_rows = run(q.view(), level, tokens, x.data());
        for (std::size_t i = 0; i < on_rows.size(); ++i) {
          REQUIRE(on_tiles[i] == doctest::Approx(on_rows[i]).epsilon(2e-4).scale(1.0));
        }
      }
    }
    // The exact float path (EDGE_CPU_ACTIVATIONS=exact) reads tiles too, as the same numbers.
    const std::vector<float> x = random_floats(3 * c.k, 11);
    std::vector<float> on_rows(static_cast<std::size_t>(3 * c.n)), on_tiles(on_rows.size());
    for (auto [w, y] : {std::pair{q.view(), &on_rows}, std::pair{t.view, &on_tiles}}) {
      REQUIRE(edge::kernels::run_matmul({.x = x.data(), .w = w, .y = y->data(), .tokens = 3, .n = c.n, .k = c.k,
                                         .x_stride = c.k, .y_stride = c.n, .exact_activations = true},
                                        {})
                  .ok());
    }
    const std::vector<double> reference =
        edge::testing::reference(x, edge::testing::dequantize(q.view(), c.n, c.k), nullptr, 3, c.n, c.k);
    for (std::size_t i = 0; i < on_rows.size(); ++i) {
      CHECK(on_tiles[i] == doctest::Approx(reference[i]).epsilon(1e-4).scale(1.0));
    }
  }
}

TEST_CASE("a view of tiles from a whole tile on equals the rows from there") {
  const std::int64_t n = 72, k = 1024;
  for (const weight_format f : {weight_format::int4, weight_format::int8}) {
    const quantized q = quantize(random_floats(n * k, 9), n, k, f, 32);
    const tiled t = pack(q);
    const std::vector<float> x = random_floats(k, 10);
    for (const std::int64_t first : {std::int64_t{16}, std::int64_t{32}, std::int64_t{64}}) {
      const std::int64_t rows = n - first;
      std::vector<float> from_rows(static_cast<std::size_t>(rows)), from_tiles(from_rows.size());
      REQUIRE(edge::kernels::run_matmul({.x = x.data(), .w = edge::kernels::weight_rows_from(q.view(), first, k),
                                         .y = from_rows.data(), .tokens = 1, .n = rows, .k = k, .x_stride = k,
                                         .y_stride = rows},
                                        {})
                  .ok());
      REQUIRE(edge::kernels::run_matmul({.x = x.data(), .w = edge::kernels::weight_rows_from(t.view, first, k),
                                         .y = from_tiles.data(), .tokens = 1, .n = rows, .k = k, .x_stride = k,
                                         .y_stride = rows},
                                        {})
                  .ok());
      // Rows and tiles add in other orders on some paths (AVX2's INT4 rows take the code offset
      // off in float, at the end), as in the test above: the same within that rounding.
      for (std::size_t i = 0; i < from_rows.size(); ++i) {
        CHECK(from_tiles[i] == doctest::Approx(from_rows[i]).epsilon(2e-4).scale(1.0));
      }
    }
  }
}

TEST_CASE("float tiles (f16, bf16, FP8): every element where the layout says, the tile sum's bits, batch invariant") {
  edge::thread_pool pool(2);
  struct float_case {
    weight_format format;
    std::int64_t n, k;
  };
  const float_case float_cases[] = {{weight_format::f16, 1, 5},     {weight_format::bf16, 17, 100},
                                    {weight_format::fp8_e4m3, 33, 2048}, {weight_format::f16, 16, 64},
                                    {weight_format::bf16, 40, 7},   {weight_format::fp8_e4m3, 5, 129}};
  for (const float_case& c : float_cases) {
    CAPTURE(edge::kernels::to_string(c.format));
    CAPTURE(c.n);
    CAPTURE(c.k);
    const std::vector<float> w = random_floats(c.n * c.k, 21);
    // The rows: f16 / bf16 encoded from w, FP8 quantized with row scales.
    std::vector<std::uint8_t> values;
    std::vector<float> scales;
    weight_view rows{.format = c.format};
    if (c.format == weight_format::fp8_e4m3) {
      const quantized q = quantize(w, c.n, c.k, c.format, 0);
      values = q.values;
      scales = q.scales;
      rows.scales = scales.data();
    } else {
      values.resize(static_cast<std::size_t>(c.n * c.k * 2));
      for (std::int64_t i = 0; i < c.n * c.k; ++i) {
        const std::uint16_t bits = c.format == weight_format::f16 ? edge::kernels::float_to_fp16(w[static_cast<std::size_t>(i)])
                                                                  : edge::kernels::float_to_bf16(w[static_cast<std::size_t>(i)]);
        std::memcpy(values.data() + 2 * i, &bits, 2);
      }
    }
    rows.values = values.data();
    const std::int64_t size = cpu_tiles::element_bytes(c.format);
    std::vector<std::uint8_t> tiled_values(static_cast<std::size_t>(cpu_tiles::values_bytes(c.format, c.n, c.k)), 0xA5);
    std::vector<float> tiled_scales(static_cast<std::size_t>(std::max<std::int64_t>(1, cpu_tiles::scale_count(c.format, c.n, c.k, 0))), -1.0f);
    REQUIRE(edge::kernels::pack_cpu_tiles(rows, c.n, c.k, tiled_values.data(), tiled_scales.data(), &pool).ok());
    weight_view tiles = rows;
    tiles.values = tiled_values.data();
    tiles.scales = c.format == weight_format::fp8_e4m3 ? tiled_scales.data() : nullptr;
    tiles.layout = weight_layout::cpu_tiles;
    for (std::int64_t r = 0; r < c.n; ++r) {
      for (std::int64_t i = 0; i < c.k; ++i) {
        const auto at = cpu_tiles::of(c.format, 0, c.k, r, i);
        REQUIRE(std::memcmp(tiled_values.data() + at.byte, values.data() + (r * c.k + i) * size, static_cast<std::size_t>(size)) == 0);
      }
    }
    std::vector<std::uint8_t> back(values.size(), 0);
    std::vector<float> back_scales(scales.size(), 0.0f);
    REQUIRE(edge::kernels::unpack_cpu_tiles(tiles, c.n, c.k, back.data(), back_scales.data(), &pool).ok());
    CHECK(back == values);
    CHECK(back_scales == scales);

    // The matmul on tiles: per output, 4 partial sums by element index mod 4 (fused
    // multiply-adds), (s0 + s1) + (s2 + s3), then FP8's row scale, written out here again.
    const std::vector<float> decoded = edge::testing::dequantize(rows, c.n, c.k);  // FP8: × scale
    for (const std::int64_t tokens : {std::int64_t{1}, std::int64_t{4}, std::int64_t{7}, std::int64_t{13}}) {
      CAPTURE(tokens);
      const std::vector<float> x = random_floats(tokens * c.k, 30 + static_cast<unsigned>(tokens));
      std::vector<float> y(static_cast<std::size_t>(tokens * c.n));
      REQUIRE(edge::kernels::run_matmul({.x = x.data(), .w = tiles, .y = y.data(), .tokens = tokens, .n = c.n, .k = c.k,
                                         .x_stride = c.k, .y_stride = c.n},
                                        {.pool = &pool})
                  .ok());
      for (std::int64_t t = 0; t < tokens; ++t) {
        for (std::int64_t r = 0; r < c.n; ++r) {
          const float scale = c.format == weight_format::fp8_e4m3 ? scales[static_cast<std::size_t>(r)] : 1.0f;
          float partial[4] = {};
          for (std::int64_t i = 0; i < c.k; ++i) {
            // The unscaled element: FP8's decoded value over its row scale is exact (a power-of-two
            // factor apart at most), as the kernel multiplies the code's value.
            const float element = c.format == weight_format::fp8_e4m3
                                      ? edge::kernels::fp8_e4m3_to_float(values[static_cast<std::size_t>(r * c.k + i)])
                                      : decoded[static_cast<std::size_t>(r * c.k + i)];
            partial[i % 4] = std::fma(element, x[static_cast<std::size_t>(t * c.k + i)], partial[i % 4]);
          }
          const float expected = ((partial[0] + partial[1]) + (partial[2] + partial[3])) * scale;
          REQUIRE(y[static_cast<std::size_t>(t * c.n + r)] == expected);
        }
      }
      // Near the row layout's result (16 partial sums, another order).
      std::vector<float> on_rows(y.size());
      REQUIRE(edge::kernels::run_matmul({.x = x.data(), .w = rows, .y = on_rows.data(), .tokens = tokens, .n = c.n,
                                         .k = c.k, .x_stride = c.k, .y_stride = c.n},
                                        {})
                  .ok());
      for (std::size_t i = 0; i < y.size(); ++i) CHECK(y[i] == doctest::Approx(on_rows[i]).epsilon(1e-4).scale(1.0));
    }
  }
}
