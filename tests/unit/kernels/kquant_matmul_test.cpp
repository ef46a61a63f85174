// GGUF K-quant weights (Q4_K, Q5_K, Q6_K): their blocks decode to the values their fields
// give, and the CPU matmul over them (activations quantized to int8 per block of 32) gives the
// matmul of the decoded weights within the activations' rounding, on the portable path and the
// AVX-512 VNNI path alike, with the same bits for a token alone or in any batch; with exact
// activations, the f32 matmul of the decoded weights to float rounding. The CUDA launchers
// refuse the formats.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "edge/common/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/matmul/integer_dot.h"
#include "kernels/matmul/kquant_cpu.h"
#include "kernels/matmul/matmul.h"
#include "kernels/quantize/quantize.h"
#include "kquant_blocks.h"

namespace {

namespace cpu = edge::kernels::cpu;
using edge::kernels::weight_format;
using edge::testing::kquant_fields;
using edge::testing::kquant_matrix;

constexpr weight_format all_kquants[] = {weight_format::q4_k, weight_format::q5_k, weight_format::q6_k};

std::vector<float> dequantize(const kquant_matrix& m) {
  std::vector<float> out(static_cast<std::size_t>(m.n * m.k), std::nanf(""));  // [n, k]
  const auto done = edge::kernels::run_dequantize(
      {.w = m.view(), .k = m.k, .row_begin = 0, .rows = m.n, .y = out.data(), .y_stride = m.k}, {});
  REQUIRE_MESSAGE(done.ok(), done.message());
  return out;
}

void check_decodes(const kquant_fields& f) {
  kquant_matrix m{.format = f.format, .n = 1, .k = edge::testing::kq_elements, .bytes = {}, .values = {}};
  m.append(f);
  const auto decoded = dequantize(m);
  for (int i = 0; i < edge::testing::kq_elements; ++i) {
    if (decoded[static_cast<std::size_t>(i)] != m.values[static_cast<std::size_t>(i)]) {
      CAPTURE(i);
      CHECK(decoded[static_cast<std::size_t>(i)] == m.values[static_cast<std::size_t>(i)]);
      return;
    }
  }
}

std::vector<float> run(const kquant_matrix& w, const std::vector<float>& x, std::int64_t tokens,
                       const float* bias = nullptr, edge::thread_pool* pool = nullptr) {
  std::vector<float> y(static_cast<std::size_t>(tokens * w.n), std::nanf(""));  // [tokens, n]
  const auto done = edge::kernels::run_matmul({.x = x.data(), .w = w.view(), .bias = bias, .y = y.data(),
                                               .tokens = tokens, .n = w.n, .k = w.k, .x_stride = w.k, .y_stride = w.n},
                                              {.pool = pool});
  REQUIRE_MESSAGE(done.ok(), done.message());
  return y;
}

// One path of the kernel, chosen directly (exact: the float reference).
std::vector<float> run_path(const kquant_matrix& w, const std::vector<float>& x, std::int64_t tokens, cpu::isa level,
                            bool exact = false) {
  std::vector<float> y(static_cast<std::size_t>(tokens * w.n), std::nanf(""));  // [tokens, n]
  const edge::kernels::matmul_params p{.x = x.data(), .w = w.view(), .y = y.data(), .tokens = tokens, .n = w.n,
                                       .k = w.k, .x_stride = w.k, .y_stride = w.n, .exact_activations = exact};
  cpu::int8_activations scratch;
  std::vector<float> spans;
  const cpu::kquant_matmul call(p, level, scratch, spans);
  CHECK(call.exact() == (exact || !cpu::quantized_activations()));
  if (!call.exact()) CHECK(call.path() == level);
  call.rows(0, w.n);
  return y;
}

// The integer paths this CPU can run, generic first.
std::vector<cpu::isa> integer_paths() {
  std::vector<cpu::isa> paths{cpu::isa::generic};
  if (cpu::supported_isa() >= cpu::isa::avx512_vnni) paths.push_back(cpu::isa::avx512_vnni);
  return paths;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The bounds an output must meet, from the decoded weights w and the activations x.
struct expected_output {
  double exact = 0.0;     // Σ w·x in double
  double rounding = 0.0;  // Σ |w| · s / 2: the most the activations' rounding can move it (s = amax / 127 of x's block)
  double magnitude = 0.0; // Σ |w·x|, what float rounding is relative to
};

expected_output expect(const float* w, const float* x, std::int64_t k) {
  expected_output e;
  for (std::int64_t b = 0; b < k; b += 32) {
    double amax = 0.0;
    for (std::int64_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(double(x[i])));
    for (std::int64_t i = b; i < b + 32; ++i) {
      e.exact += double(w[i]) * x[i];
      e.rounding += std::fabs(double(w[i])) * (amax / 127.0) / 2.0;
      e.magnitude += std::fabs(double(w[i]) * x[i]);
    }
  }
  return e;
}

// Every output within the activations' rounding (a strict bound: each activation moves by at
// most half its block's step) plus float rounding (1e-5 of Σ |w·x|, ample for k ≤ 2304).
void check_against_decoded(const kquant_matrix& w, const std::vector<float>& x, std::int64_t tokens,
                           const std::vector<float>& y) {
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t r = 0; r < w.n; ++r) {
      const auto e = expect(w.values.data() + r * w.k, x.data() + t * w.k, w.k);
      const double got = y[static_cast<std::size_t>(t * w.n + r)];
      if (!(std::fabs(got - e.exact) <= e.rounding + 1e-5 * e.magnitude)) {
        CAPTURE(t);
        CAPTURE(r);
        CAPTURE(e.rounding);
        CHECK(got == doctest::Approx(e.exact));
        return;
      }
    }
  }
}

}  // namespace

TEST_CASE("K-quant blocks: hand-built fields decode to d × sc × q − dmin × m and d × sc × (q − 32)") {
  SUBCASE("Q4_K / Q5_K: each sub-block's 6-bit scale and min found in its packed bits") {
    for (const auto format : {weight_format::q4_k, weight_format::q5_k}) {
      CAPTURE(edge::kernels::to_string(format));
      kquant_fields f{.format = format};
      f.d = edge::kernels::float_to_fp16(0.5f);
      f.dmin = edge::kernels::float_to_fp16(0.25f);
      // The extremes of both fields in the sub-blocks whose bits are split (4..7) and whole (0..3).
      f.scale = {63, 0, 1, 62, 63, 16, 32, 48};
      f.min = {0, 63, 31, 1, 63, 15, 47, 0};
      const int max_code = format == weight_format::q4_k ? 15 : 31;
      for (int i = 0; i < edge::testing::kq_elements; ++i) f.q[i] = (i * 7) % (max_code + 1);
      f.q[0] = max_code;
      f.q[255] = max_code;
      check_decodes(f);
      // Element 32 × 4 + 3 (sub-block 4): q × 0.5 × 63 − 0.25 × 63.
      kquant_matrix m{.format = format, .n = 1, .k = 256, .bytes = {}, .values = {}};
      m.append(f);
      CHECK(dequantize(m)[131] == static_cast<float>(f.q[131]) * 0.5f * 63.0f - 0.25f * 63.0f);
    }
  }
  SUBCASE("Q6_K: signed 8-bit scales from -128 to 127, codes 0 and 63") {
    kquant_fields f{.format = weight_format::q6_k};
    f.d = edge::kernels::float_to_fp16(-0.0078125f);
    f.scale = {-128, 127, 0, 1, -1, 64, -64, 100, -100, 5, 6, 7, -8, 9, 10, -128};
    for (int i = 0; i < edge::testing::kq_elements; ++i) f.q[i] = (i * 13) % 64;
    f.q[0] = 0;
    f.q[1] = 63;
    check_decodes(f);
    kquant_matrix m{.format = weight_format::q6_k, .n = 1, .k = 256, .bytes = {}, .values = {}};
    m.append(f);
    CHECK(dequantize(m)[0] == -0.0078125f * -128.0f * -32.0f);
    CHECK(dequantize(m)[1] == -0.0078125f * -128.0f * 31.0f);
  }
  SUBCASE("extreme super-block scales: the largest f16, a subnormal one, zero") {
    std::mt19937 rng(5);
    for (const auto format : all_kquants) {
      CAPTURE(edge::kernels::to_string(format));
      for (const std::uint16_t d : {std::uint16_t{0x7BFF}, std::uint16_t{0x0001}, std::uint16_t{0x8000}}) {
        kquant_fields f = edge::testing::random_fields(format, rng);
        f.d = d;
        f.dmin = d;  // the same exponent as d, so each value is exact in double before its one rounding
        check_decodes(f);
      }
    }
  }
  SUBCASE("random fields across the whole code and scale ranges") {
    std::mt19937 rng(11);
    for (const auto format : all_kquants) {
      CAPTURE(edge::kernels::to_string(format));
      for (int i = 0; i < 50; ++i) check_decodes(edge::testing::random_fields(format, rng));
    }
  }
}

TEST_CASE("K-quant matmul: the decoded weights' matmul within the activations' int8 rounding, at awkward sizes") {
  edge::thread_pool pool(3);
  for (const auto format : all_kquants) {
    for (const std::int64_t k : {256, 512, 2304}) {
      for (const std::int64_t n : {1, 3, 67}) {
        CAPTURE(edge::kernels::to_string(format));
        CAPTURE(k);
        CAPTURE(n);
        const auto w = edge::testing::random_kquant_matrix(format, n, k, static_cast<std::uint32_t>(k + n));
        constexpr std::int64_t tokens = 9;
        const auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), static_cast<std::uint32_t>(n));
        const auto y = run(w, x, tokens, nullptr, &pool);
        check_against_decoded(w, x, tokens, y);
        // Each token count from 1 to 9 gives every token the bits it gets in the batch of 9.
        for (std::int64_t count = 1; count < tokens; ++count) {
          const auto part = run(w, x, count);
          CHECK(same_bits(part, std::vector<float>(y.begin(), y.begin() + count * n)));
        }
      }
    }
  }
}

TEST_CASE("K-quant matmul: the portable and AVX-512 VNNI paths agree, and a lone token matches its batch on each") {
  if (!cpu::quantized_activations()) return;  // EDGE_CPU_ACTIVATIONS=exact: the float reference alone
  const auto paths = integer_paths();
  if (paths.size() == 1) MESSAGE("no AVX-512 VNNI on this CPU: the portable path alone");
  for (const auto format : all_kquants) {
    CAPTURE(edge::kernels::to_string(format));
    constexpr std::int64_t n = 13, k = 768, tokens = 7;
    const auto w = edge::testing::random_kquant_matrix(format, n, k, 3);
    const auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), 4);
    const auto generic = run_path(w, x, tokens, cpu::isa::generic);
    for (const cpu::isa level : paths) {
      CAPTURE(cpu::to_string(level));
      const auto y = run_path(w, x, tokens, level);
      check_against_decoded(w, x, tokens, y);
      for (std::int64_t t = 0; t < tokens; ++t) {
        for (std::int64_t r = 0; r < n; ++r) {
          const auto e = expect(w.values.data() + r * k, x.data() + t * k, k);
          const auto at = static_cast<std::size_t>(t * n + r);
          // The same integer sums scaled in another order: float rounding apart.
          CHECK(std::fabs(double(generic[at]) - y[at]) <= 1e-5 * (e.magnitude + e.rounding));
        }
        const std::vector<float> lone_x(x.begin() + t * k, x.begin() + (t + 1) * k);
        const auto lone = run_path(w, lone_x, 1, level);
        CHECK(same_bits(lone, std::vector<float>(y.begin() + t * n, y.begin() + (t + 1) * n)));
      }
    }
  }
}

TEST_CASE("K-quant matmul with exact activations: the f32 matmul of the decoded weights, to float rounding") {
  for (const auto format : all_kquants) {
    CAPTURE(edge::kernels::to_string(format));
    constexpr std::int64_t n = 7, k = 512, tokens = 5;
    const auto w = edge::testing::random_kquant_matrix(format, n, k, 8);
    const auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), 9);
    std::vector<float> y(static_cast<std::size_t>(tokens * n), std::nanf(""));  // [tokens, n]
    REQUIRE(edge::kernels::run_matmul({.x = x.data(), .w = w.view(), .y = y.data(), .tokens = tokens, .n = n, .k = k,
                                       .x_stride = k, .y_stride = n, .exact_activations = true},
                                      {})
                .ok());
    CHECK(same_bits(y, run_path(w, x, tokens, cpu::isa::generic, true)));
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t r = 0; r < n; ++r) {
        const auto e = expect(w.values.data() + r * k, x.data() + t * k, k);
        CHECK(std::fabs(double(y[static_cast<std::size_t>(t * n + r)]) - e.exact) <= 1e-6 * e.magnitude);
      }
      const std::vector<float> lone_x(x.begin() + t * k, x.begin() + (t + 1) * k);
      const auto lone = run_path(w, lone_x, 1, cpu::isa::generic, true);
      CHECK(same_bits(lone, std::vector<float>(y.begin() + t * n, y.begin() + (t + 1) * n)));
    }
  }
}

TEST_CASE("K-quant matmul: bias and accumulation; NaN activations show; k must be whole super-blocks") {
  const auto w = edge::testing::random_kquant_matrix(weight_format::q4_k, 5, 256, 9);
  const auto x = edge::testing::random_floats(2 * 256, 10);
  const std::vector<float> bias{1.0f, -2.0f, 3.0f, 0.5f, 0.0f};
  const auto plain = run(w, x, 2);
  const auto biased = run(w, x, 2, bias.data());
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(biased[i] == plain[i] + bias[i % 5]);

  std::vector<float> y(plain);  // y += x · wᵀ
  REQUIRE(edge::kernels::run_matmul({.x = x.data(), .w = w.view(), .y = y.data(), .tokens = 2, .n = 5, .k = 256,
                                     .x_stride = 256, .y_stride = 5, .accumulate = true},
                                    {})
              .ok());
  for (std::size_t i = 0; i < plain.size(); ++i) CHECK(y[i] == plain[i] + plain[i]);

  auto broken = x;
  broken[256 + 40] = std::nanf("");
  const auto with_nan = run(w, broken, 2);
  for (std::size_t r = 0; r < 5; ++r) {
    CHECK(with_nan[r] == plain[r]);
    CHECK(std::isnan(with_nan[5 + r]));
  }

  const auto narrow = edge::testing::random_kquant_matrix(weight_format::q6_k, 2, 256, 1);
  std::vector<float> out(2);
  const auto refused = edge::kernels::run_matmul({.x = x.data(), .w = narrow.view(), .y = out.data(), .tokens = 1,
                                                  .n = 1, .k = 128, .x_stride = 128, .y_stride = 1},
                                                 {});
  CHECK(refused.code() == edge::status_code::invalid_argument);
}

TEST_CASE("K-quants are files' formats: not a --weight-dtype, no scales array, not read by the CUDA kernels") {
  for (const auto format : all_kquants) {
    CAPTURE(edge::kernels::to_string(format));
    CHECK_FALSE(edge::kernels::parse_weight_format(edge::kernels::to_string(format)));
    CHECK(edge::kernels::is_quantized(format));
    CHECK_FALSE(edge::kernels::has_scales(format));
    CHECK_FALSE(edge::kernels::cuda_matmul_reads(format));
    CHECK(edge::kernels::weight_scale_count(format, 4, 512, 0) == 0);
    CHECK(edge::kernels::weight_values_bytes(format, 3, 512) ==
          3 * 2 * static_cast<std::int64_t>(edge::testing::kq_block_bytes(format)));
  }
  CHECK(edge::kernels::weight_values_bytes(weight_format::q4_k, 1, 256) == 144);
  CHECK(edge::kernels::weight_values_bytes(weight_format::q5_k, 1, 256) == 176);
  CHECK(edge::kernels::weight_values_bytes(weight_format::q6_k, 1, 256) == 210);
  for (const auto readable : {weight_format::f32, weight_format::f16, weight_format::bf16, weight_format::fp8_e4m3,
                              weight_format::int4}) {
    CHECK(edge::kernels::cuda_matmul_reads(readable));
  }
}

TEST_CASE("K-quants on a CUDA stream: the launchers refuse them by name rather than misread them") {
  const edge::kernels::stream cuda{.where = edge::kernels::device::cuda, .pool = nullptr, .cuda_stream = nullptr};
  const auto w = edge::testing::random_kquant_matrix(weight_format::q4_k, 2, 256, 1);
  const auto x = edge::testing::random_floats(256, 2);
  std::vector<float> y(256 * 2, -7.0f);
  const auto mm = edge::kernels::run_matmul(
      {.x = x.data(), .w = w.view(), .y = y.data(), .tokens = 1, .n = 2, .k = 256, .x_stride = 256, .y_stride = 2}, cuda);
  const auto dq = edge::kernels::run_dequantize(
      {.w = w.view(), .k = 256, .row_begin = 0, .rows = 2, .y = y.data(), .y_stride = 256}, cuda);
  for (const edge::status& s : {mm, dq}) {
    CAPTURE(s.message());
    REQUIRE_FALSE(s.ok());
    if (s.code() == edge::status_code::failed_precondition) continue;  // built without CUDA: nothing to refuse
    CHECK(s.code() == edge::status_code::invalid_argument);
    CHECK(s.message().find("q4_k") != std::string::npos);
  }
  CHECK(y[0] == -7.0f);
}
