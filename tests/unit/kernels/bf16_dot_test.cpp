// bf16 weights with vdpbf16ps (kernels/matmul/bf16_dot.h), where the CPU has AVX-512 BF16:
// exactly the products of the bf16-rounded activations (up to f32 summation), near the float
// matmul, batch invariant, NaN kept, and what run_matmul takes by default.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>

#include "edge/common/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/cpu/isa.h"
#include "kernels/matmul/bf16_dot.h"
#include "quantized_test_util.h"

namespace {

namespace cpu = edge::kernels::cpu;
using edge::kernels::dtype;
using edge::kernels::weight_format;

bool available() { return cpu::supported_isa() >= cpu::isa::avx512_bf16; }

std::vector<float> bf16_matmul(const std::vector<float>& x, const edge::testing::typed_buffer& w, std::int64_t tokens,
                               std::int64_t n, std::int64_t k, const float* bias, cpu::bf16_activations* seen = nullptr) {
  std::vector<float> y(static_cast<std::size_t>(tokens * n), std::nanf(""));
  const edge::kernels::matmul_params p{.x = x.data(), .w = {.format = weight_format::bf16, .values = w.bytes.data()},
                                       .bias = bias, .y = y.data(), .tokens = tokens, .n = n, .k = k, .x_stride = k,
                                       .y_stride = n};
  cpu::bf16_activations activations;
  const cpu::bf16_matmul call(p, activations);
  call.rows(0, n);
  if (seen != nullptr) *seen = activations;
  return y;
}

}  // namespace

TEST_CASE("bf16 dot products: the rounded activations' products exactly, near the float matmul") {
  if (!available()) {
    MESSAGE("this CPU has no AVX-512 BF16: nothing to check");
    return;
  }
  struct shape { std::int64_t tokens, n, k; };
  for (auto [tokens, n, k] : {shape{1, 1, 32}, shape{1, 67, 40}, shape{3, 19, 97}, shape{6, 33, 2048}, shape{9, 21, 300},
                              shape{13, 5, 64}}) {
    CAPTURE(tokens);
    CAPTURE(n);
    CAPTURE(k);
    const auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), 11);
    const auto w = edge::testing::encode(edge::testing::random_floats(static_cast<std::size_t>(n * k), 12, 0.1f), dtype::bf16);
    const auto bias = edge::testing::random_floats(static_cast<std::size_t>(n), 13);
    cpu::bf16_activations seen;
    const auto y = bf16_matmul(x, w, tokens, n, k, bias.data(), &seen);
    CHECK(edge::testing::all_finite(y));
    std::vector<float> rounded(static_cast<std::size_t>(tokens * k));
    for (std::int64_t t = 0; t < tokens; ++t) {
      for (std::int64_t i = 0; i < k; ++i) {
        const std::uint16_t bits = seen.row(t)[i];
        CHECK(bits == edge::kernels::float_to_bf16(x[static_cast<std::size_t>(t * k + i)]));
        rounded[static_cast<std::size_t>(t * k + i)] = edge::kernels::bf16_to_float(bits);
      }
    }
    CHECK(edge::testing::relative_error(y, edge::testing::reference(rounded, w.decoded, bias.data(), tokens, n, k)) < 2e-6);
    // What rounding the activations costs: about 2^-9 / sqrt(3) per element, relative.
    CHECK(edge::testing::relative_error(y, edge::testing::reference(x, w.decoded, bias.data(), tokens, n, k)) < 4e-3);
  }
}

TEST_CASE("bf16 dot products are batch invariant, keep NaN, and are run_matmul's default for bf16") {
  if (!available()) {
    MESSAGE("this CPU has no AVX-512 BF16: nothing to check");
    return;
  }
  edge::thread_pool pool(2);
  const std::int64_t n = 70, k = 200, tokens = 9;
  auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), 21);
  const auto w = edge::testing::encode(edge::testing::random_floats(static_cast<std::size_t>(n * k), 22, 0.1f), dtype::bf16);
  const auto together = bf16_matmul(x, w, tokens, n, k, nullptr);
  for (std::int64_t t = 0; t < tokens; ++t) {
    const std::vector<float> one(x.begin() + t * k, x.begin() + (t + 1) * k);
    const auto alone = bf16_matmul(one, w, 1, n, k, nullptr);
    CHECK(std::memcmp(alone.data(), together.data() + t * n, static_cast<std::size_t>(n) * sizeof(float)) == 0);
  }
  std::vector<float> y(static_cast<std::size_t>(tokens * n));
  REQUIRE(edge::kernels::run_matmul({.x = x.data(), .w = {.format = weight_format::bf16, .values = w.bytes.data()},
                                     .y = y.data(), .tokens = tokens, .n = n, .k = k, .x_stride = k, .y_stride = n},
                                    {.pool = &pool})
              .ok());
  if (cpu::has(cpu::isa::avx512_bf16) && cpu::quantized_activations()) {
    CHECK(std::memcmp(y.data(), together.data(), y.size() * sizeof(float)) == 0);
  }
  x[static_cast<std::size_t>(4 * k + 7)] = std::nanf("");
  const auto with_nan = bf16_matmul(x, w, tokens, n, k, nullptr);
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t r = 0; r < n; ++r) CHECK(std::isnan(with_nan[static_cast<std::size_t>(t * n + r)]) == (t == 4));
  }
}
