// The CPU's integer matmul (INT4 and INT8 weights over int8 activations): the activation
// quantization, every code path this CPU has against a double-precision reference of the same
// quantized numbers and against the exact float matmul, batch invariance, NaN, and the INT8
// weight format itself.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <tuple>

#include "edge/common/thread_pool.h"
#include "kernel_test_util.h"
#include "quantized_test_util.h"
#include "kernels/matmul/integer_dot.h"
#include "kernels/matmul/matmul.h"
#include "kernels/quantize/quantize.h"

namespace {

namespace cpu = edge::kernels::cpu;
using edge::kernels::weight_format;
using edge::kernels::weight_view;
using traits = cpu::int8_activation_traits;
using edge::testing::dequantize;
using edge::testing::quantize;
using edge::testing::reference;

std::int64_t element_of(cpu::code_order order, std::int64_t p) { return cpu::element_at(order, p); }

// The activations as the integer path sees them: code × scale, in element order.
std::vector<float> dequantized_activations(const cpu::int8_activations& a) {
  std::vector<float> out(static_cast<std::size_t>(a.tokens * a.k));  // [tokens, k]
  for (std::int64_t t = 0; t < a.tokens; ++t) {
    for (std::int64_t p = 0; p < a.padded_k; ++p) {
      const std::int64_t e = element_of(a.order, p);
      if (e < a.k) {
        out[static_cast<std::size_t>(t * a.k + e)] = static_cast<float>(a.codes_of(t)[p]) * a.scales_of(t)[e / traits::block];
      }
    }
  }
  return out;
}

// Runs the integer matmul on one path, all rows on the calling thread.
std::vector<float> integer_matmul(const std::vector<float>& x, const weight_view& w, std::int64_t tokens, std::int64_t n,
                                  std::int64_t k, const float* bias, cpu::isa level,
                                  cpu::int8_activations* seen = nullptr) {
  std::vector<float> y(static_cast<std::size_t>(tokens * n), std::nanf(""));
  const edge::kernels::matmul_params p{.x = x.data(), .w = w, .bias = bias, .y = y.data(), .tokens = tokens, .n = n,
                                       .k = k, .x_stride = k, .y_stride = n};
  cpu::int8_activations activations;
  std::vector<float> sums;
  const cpu::integer_matmul call(p, level, activations, sums);
  CHECK(call.path() == level);
  call.rows(0, n);
  if (seen != nullptr) *seen = activations;
  return y;
}

// The paths this CPU can run, generic first.
std::vector<cpu::isa> available_paths() {
  std::vector<cpu::isa> paths{cpu::isa::generic};
  if (cpu::supported_isa() >= cpu::isa::avx2) paths.push_back(cpu::isa::avx2);
  if (cpu::supported_isa() >= cpu::isa::avx512_vnni) paths.push_back(cpu::isa::avx512_vnni);
  return paths;
}

struct case_shape {
  weight_format format;
  std::int64_t group_size, tokens, n, k;
};

// Awkward sizes: a last stretch of one block (k = 96, 2080), one row, rows that leave tiles
// partly filled, token counts across the tile widths.
const case_shape shapes[] = {
    {weight_format::int4, 32, 1, 1, 32},    {weight_format::int4, 32, 3, 67, 96},
    {weight_format::int4, 64, 5, 19, 192},  {weight_format::int4, 128, 9, 13, 2048},
    {weight_format::int4, 32, 2, 9, 2080},  {weight_format::int4, 128, 6, 33, 384},
    {weight_format::int8, 32, 1, 1, 32},    {weight_format::int8, 32, 4, 67, 96},
    {weight_format::int8, 32, 7, 21, 2080}, {weight_format::int8, 32, 9, 8, 512},
};

}  // namespace

TEST_CASE("activation quantization: amax / 127 per block of 32, ties to even, sums of 16, lane scales") {
  const std::int64_t k = 80;  // a padded second stretch
  std::vector<float> x(static_cast<std::size_t>(2 * k));
  for (std::int64_t i = 0; i < k; ++i) x[static_cast<std::size_t>(i)] = static_cast<float>(i % 32) - 12.7f;
  // Token 1, block 0: amax 127 so codes are the values; 2.5 and -3.5 are ties (to 2 and -4).
  for (std::int64_t i = 0; i < k; ++i) x[static_cast<std::size_t>(k + i)] = 0.0f;
  x[static_cast<std::size_t>(k + 0)] = 127.0f;
  x[static_cast<std::size_t>(k + 1)] = 2.5f;
  x[static_cast<std::size_t>(k + 2)] = -3.5f;
  x[static_cast<std::size_t>(k + 40)] = std::nanf("");
  for (const auto order : {cpu::code_order::natural, cpu::code_order::int4_spans, cpu::code_order::int8_spans}) {
    cpu::int8_activations a;
    cpu::quantize_activations(x.data(), 2, k, k, order, a);
    REQUIRE(a.padded_k == 512);
    CHECK(a.scales_of(0)[0] == std::fabs(31.0f - 12.7f) / 127.0f);
    CHECK(a.scales_of(1)[0] == 1.0f);
    CHECK(std::isnan(a.scales_of(1)[1]));  // the NaN's block
    CHECK(a.scales_of(1)[2] == 0.0f);      // zeros, and past k
    CHECK(a.scales_of(0)[3] == 0.0f);
    const auto back = dequantized_activations(a);
    CHECK(back[static_cast<std::size_t>(k + 0)] == 127.0f);
    CHECK(back[static_cast<std::size_t>(k + 1)] == 2.0f);
    CHECK(back[static_cast<std::size_t>(k + 2)] == -4.0f);
    for (std::int64_t p = 0; p < a.padded_k; ++p) {  // the NaN's block: codes 0
      const std::int64_t e = element_of(order, p);
      if (e >= 32 && e < 64) CHECK(a.codes_of(1)[p] == 0);
    }
    for (std::int64_t i = 0; i < k; ++i) {
      const float scale = a.scales_of(0)[i / traits::block];
      CHECK(std::fabs(back[static_cast<std::size_t>(i)] - x[static_cast<std::size_t>(i)]) <= 0.5f * scale * (1.0f + 1e-5f));
    }
    for (std::int64_t t = 0; t < 2; ++t) {
      std::vector<int> natural(static_cast<std::size_t>(a.padded_k));
      for (std::int64_t p = 0; p < a.padded_k; ++p) {
        natural[static_cast<std::size_t>(element_of(order, p))] = a.codes_of(t)[p];
      }
      for (std::int64_t s = 0; s < a.padded_k / traits::sum_span; ++s) {
        std::int32_t sum = 0;
        for (std::int64_t e = s * traits::sum_span; e < (s + 1) * traits::sum_span; ++e) sum += natural[static_cast<std::size_t>(e)];
        CHECK(a.sums16_of(t)[s] == sum);
      }
      // Each group of 4 stored codes carries its block's scale.
      for (std::int64_t p = 0; p < a.padded_k; p += traits::lane_span) {
        const float expected = a.scales_of(t)[element_of(order, p) / traits::block];
        const float got = a.lane_scales_of(t)[p / traits::lane_span];
        CHECK((got == expected || (std::isnan(got) && std::isnan(expected))));
      }
    }
  }
}

TEST_CASE("the span orders put 4 codes of one piece in each lane, every element once") {
  // INT4: step (u, h), lane j, byte i ↔ 32j + 16h + 4u + i; INT8: step u ↔ 16j + 4u + i.
  CHECK(cpu::element_at(cpu::code_order::int4_spans, 0) == 0);
  CHECK(cpu::element_at(cpu::code_order::int4_spans, 4) == 32);         // lane 1
  CHECK(cpu::element_at(cpu::code_order::int4_spans, 64) == 16);        // step (0, 1): high nibbles
  CHECK(cpu::element_at(cpu::code_order::int4_spans, 128 + 5) == 32 + 4 + 1);  // step (1, 0), lane 1, byte 1
  CHECK(cpu::element_at(cpu::code_order::int4_spans, 512 + 7) == 512 + 32 + 3);
  CHECK(cpu::element_at(cpu::code_order::int8_spans, 4) == 16);
  CHECK(cpu::element_at(cpu::code_order::int8_spans, 64 + 2) == 4 + 2);
  CHECK(cpu::element_at(cpu::code_order::int8_spans, 256 + 61) == 256 + 15 * 16 + 1);
  for (const auto order : {cpu::code_order::natural, cpu::code_order::int4_spans, cpu::code_order::int8_spans}) {
    std::vector<int> seen(1024, 0);
    for (std::int64_t p = 0; p < 1024; ++p) ++seen[static_cast<std::size_t>(cpu::element_at(order, p))];
    CHECK(std::count(seen.begin(), seen.end(), 1) == 1024);
  }
}

TEST_CASE("INT8 weights: scale amax / 127 per 32, ties to even, exact dequantization") {
  std::vector<float> w(64, 0.0f);
  w[0] = -127.0f;
  w[1] = 0.5f;   // tie: 0
  w[2] = 1.5f;   // tie: 2
  w[3] = -2.5f;  // tie: -2
  w[33] = 0.254f;
  const auto q = quantize(w, 1, 64, weight_format::int8, 32);
  CHECK(q.scales[0] == 1.0f);
  CHECK(q.scales[1] == 0.254f / 127.0f);
  const auto* codes = reinterpret_cast<const std::int8_t*>(q.values.data());
  CHECK(codes[0] == -127);
  CHECK(codes[1] == 0);
  CHECK(codes[2] == 2);
  CHECK(codes[3] == -2);
  CHECK(codes[33] == 127);
  const auto back = dequantize(q.view(), 1, 64);
  for (std::size_t i = 0; i < back.size(); ++i) CHECK(back[i] == static_cast<float>(codes[i]) * q.scales[i / 32]);
  CHECK(edge::kernels::run_quantize({.x = w.data(), .rows = 1, .k = 48, .x_stride = 48, .format = weight_format::int8,
                                     .values = nullptr, .scales = nullptr},
                                    {})
            .code() == edge::status_code::invalid_argument);
}

TEST_CASE("every integer path computes the quantized products exactly and stays near the float matmul") {
  for (const auto& c : shapes) {
    CAPTURE(edge::kernels::to_string(c.format));
    CAPTURE(c.group_size);
    CAPTURE(c.tokens);
    CAPTURE(c.n);
    CAPTURE(c.k);
    const auto x = edge::testing::random_floats(static_cast<std::size_t>(c.tokens * c.k), 71);
    const auto w = edge::testing::random_floats(static_cast<std::size_t>(c.n * c.k), 72, 0.05f);
    const auto bias = edge::testing::random_floats(static_cast<std::size_t>(c.n), 73);
    const auto q = quantize(w, c.n, c.k, c.format, c.group_size);
    const auto dense = dequantize(q.view(), c.n, c.k);
    const auto exact = reference(x, dense, bias.data(), c.tokens, c.n, c.k);
    for (const cpu::isa level : available_paths()) {
      CAPTURE(cpu::to_string(level));
      cpu::int8_activations seen;
      const auto y = integer_matmul(x, q.view(), c.tokens, c.n, c.k, bias.data(), level, &seen);
      CHECK(edge::testing::all_finite(y));
      // The same numbers in double: only the path's float summation differs.
      const auto same_numbers = reference(dequantized_activations(seen), dense, bias.data(), c.tokens, c.n, c.k);
      CHECK(edge::testing::relative_error(y, same_numbers) < 2e-6);
      // What quantizing the activations costs: about 2^-8 / sqrt(3) per element, relative.
      CHECK(edge::testing::relative_error(y, exact) < 1e-2);
    }
  }
}

TEST_CASE("integer paths give each token bit-identical results alone and in any batch") {
  const std::int64_t n = 45, tokens = 11;
  // k = 352: a last stretch of one block.
  for (const auto& [format, group_size, k] : {std::tuple{weight_format::int4, std::int64_t{32}, std::int64_t{352}},
                                              std::tuple{weight_format::int4, std::int64_t{128}, std::int64_t{640}},
                                              std::tuple{weight_format::int8, std::int64_t{32}, std::int64_t{352}}}) {
    CAPTURE(edge::kernels::to_string(format));
    CAPTURE(group_size);
    const auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), 81);
    const auto w = edge::testing::random_floats(static_cast<std::size_t>(n * k), 82, 0.05f);
    const auto q = quantize(w, n, k, format, group_size);
    for (const cpu::isa level : available_paths()) {
      CAPTURE(cpu::to_string(level));
      const auto together = integer_matmul(x, q.view(), tokens, n, k, nullptr, level);
      for (std::int64_t t = 0; t < tokens; ++t) {
        const std::vector<float> one(x.begin() + t * k, x.begin() + (t + 1) * k);
        const auto alone = integer_matmul(one, q.view(), 1, n, k, nullptr, level);
        CHECK(std::memcmp(alone.data(), together.data() + t * n, static_cast<std::size_t>(n) * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("run_matmul takes the integer path for INT4 and INT8 on the pool, and NaN activations show") {
  edge::thread_pool pool(2);
  const std::int64_t n = 300, k = 256, tokens = 5;
  auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), 91);
  const auto w = edge::testing::random_floats(static_cast<std::size_t>(n * k), 92, 0.05f);
  for (const auto format : {weight_format::int4, weight_format::int8}) {
    const auto q = quantize(w, n, k, format, 32);
    std::vector<float> y(static_cast<std::size_t>(tokens * n));
    REQUIRE(edge::kernels::run_matmul({.x = x.data(), .w = q.view(), .y = y.data(), .tokens = tokens, .n = n, .k = k,
                                       .x_stride = k, .y_stride = n},
                                      {.pool = &pool})
                .ok());
    // The integer path the active level takes.
    const cpu::isa active = cpu::active_isa();
    const cpu::isa path = active >= cpu::isa::avx512_vnni ? cpu::isa::avx512_vnni
                          : active >= cpu::isa::avx2     ? cpu::isa::avx2
                                                         : cpu::isa::generic;
    const auto direct = integer_matmul(x, q.view(), tokens, n, k, nullptr, path);
    if (cpu::quantized_activations()) CHECK(std::memcmp(y.data(), direct.data(), y.size() * sizeof(float)) == 0);
  }
  x[static_cast<std::size_t>(2 * k + 100)] = std::nanf("");
  const auto q = quantize(w, n, k, weight_format::int8, 32);
  for (const cpu::isa level : available_paths()) {
    const auto y = integer_matmul(x, q.view(), tokens, n, k, nullptr, level);
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t r = 0; r < n; ++r) CHECK(std::isnan(y[static_cast<std::size_t>(t * n + r)]) == (t == 2));
    }
  }
}

TEST_CASE("the CPU level names and their order") {
  for (const auto level :
       {cpu::isa::generic, cpu::isa::avx2, cpu::isa::avx512, cpu::isa::avx512_vnni, cpu::isa::avx512_bf16}) {
    CHECK(cpu::parse_isa(cpu::to_string(level)) == level);
  }
  CHECK_FALSE(cpu::parse_isa("sse2").has_value());
  CHECK(cpu::active_isa() <= cpu::supported_isa());
  CHECK(cpu::isa::avx2 < cpu::isa::avx512_vnni);
}
