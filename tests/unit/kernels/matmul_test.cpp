#include <doctest/doctest.h>

#include <array>
#include <cstring>

#include "kernel_test_util.h"
#include "edge/common/thread_pool.h"
#include "kernels/matmul/matmul.h"

namespace {

using edge::kernels::dtype;

// y = x · wᵀ in double, from the decoded weights.
std::vector<double> reference(const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>* bias,
                              std::int64_t tokens, std::int64_t n, std::int64_t k) {
  std::vector<double> y(static_cast<std::size_t>(tokens * n));
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t r = 0; r < n; ++r) {
      double sum = bias ? (*bias)[static_cast<std::size_t>(r)] : 0.0;
      for (std::int64_t i = 0; i < k; ++i) sum += double(x[static_cast<std::size_t>(t * k + i)]) * w[static_cast<std::size_t>(r * k + i)];
      y[static_cast<std::size_t>(t * n + r)] = sum;
    }
  }
  return y;
}

// The float kernels unless `rounded` (bf16 weights then take vdpbf16ps where the CPU has it:
// bf16_dot_test.cpp checks that path).
std::vector<float> run(const std::vector<float>& x, const edge::testing::typed_buffer& w, dtype type, std::int64_t tokens,
                       std::int64_t n, std::int64_t k, const float* bias, edge::thread_pool* pool, bool rounded = false) {
  std::vector<float> y(static_cast<std::size_t>(tokens * n), std::nanf(""));
  edge::kernels::matmul_params p{.x = x.data(), .w = {.format = edge::kernels::weight_format_of(type), .values = w.bytes.data()},
                                 .bias = bias, .y = y.data(), .tokens = tokens, .n = n, .k = k, .x_stride = k,
                                 .y_stride = n, .exact_activations = !rounded};
  REQUIRE(edge::kernels::run_matmul(p, {.pool = pool}).ok());
  return y;
}

}  // namespace

TEST_CASE("matmul matches a double-precision reference for every weight dtype and awkward shapes") {
  edge::thread_pool pool(2);
  for (dtype type : {dtype::f32, dtype::bf16, dtype::f16}) {
    struct shape { std::int64_t tokens, n, k; };
    for (auto [tokens, n, k] : {shape{1, 1, 1}, shape{1, 54, 97}, shape{3, 97, 54}, shape{7, 130, 16},
                               shape{13, 64, 172}, shape{1, 257, 300}, shape{6, 8, 4096}, shape{25, 33, 65}}) {
      CAPTURE(edge::kernels::to_string(type));
      CAPTURE(tokens);
      CAPTURE(n);
      CAPTURE(k);
      const auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), 1);
      const auto w = edge::testing::encode(edge::testing::random_floats(static_cast<std::size_t>(n * k), 2, 0.1f), type);
      const auto bias = edge::testing::random_floats(static_cast<std::size_t>(n), 3);
      const auto y = run(x, w, type, tokens, n, k, bias.data(), &pool);
      CHECK(edge::testing::all_finite(y));
      CHECK(edge::testing::relative_error(y, reference(x, w.decoded, &bias, tokens, n, k)) < 1e-5);
    }
  }
}

TEST_CASE("matmul gives each token bit-identical results alone and in any batch") {
  edge::thread_pool pool(2);
  const std::int64_t n = 203, k = 173, tokens = 17;
  const auto x = edge::testing::random_floats(static_cast<std::size_t>(tokens * k), 4);
  for (dtype type : {dtype::f32, dtype::bf16}) {
    const auto w = edge::testing::encode(edge::testing::random_floats(static_cast<std::size_t>(n * k), 5, 0.1f), type);
    for (const bool rounded : {false, true}) {
      CAPTURE(rounded);
      const auto together = run(x, w, type, tokens, n, k, nullptr, &pool, rounded);
      for (std::int64_t t = 0; t < tokens; ++t) {
        const std::vector<float> one(x.begin() + t * k, x.begin() + (t + 1) * k);
        const auto alone = run(one, w, type, 1, n, k, nullptr, nullptr, rounded);
        CHECK(std::memcmp(alone.data(), together.data() + t * n, static_cast<std::size_t>(n) * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("matmul accumulates into y and honours strides") {
  const std::int64_t tokens = 3, n = 5, k = 19, x_stride = 24, y_stride = 9;
  const auto xs = edge::testing::random_floats(static_cast<std::size_t>(tokens * x_stride), 6);
  const auto w = edge::testing::encode(edge::testing::random_floats(static_cast<std::size_t>(n * k), 7), dtype::f32);
  std::vector<float> y(static_cast<std::size_t>(tokens * y_stride), 1.5f);
  edge::kernels::matmul_params p{.x = xs.data(), .w = {.values = w.bytes.data()}, .y = y.data(),
                                 .tokens = tokens, .n = n, .k = k, .x_stride = x_stride, .y_stride = y_stride,
                                 .accumulate = true};
  REQUIRE(edge::kernels::run_matmul(p, {}).ok());
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t r = 0; r < y_stride; ++r) {
      double expected = 1.5;
      if (r < n) {
        for (std::int64_t i = 0; i < k; ++i) expected += double(xs[static_cast<std::size_t>(t * x_stride + i)]) * w.decoded[static_cast<std::size_t>(r * k + i)];
      }
      CHECK(y[static_cast<std::size_t>(t * y_stride + r)] == doctest::Approx(expected).epsilon(1e-5));
    }
  }
}

TEST_CASE("matmul rejects impossible shapes") {
  float x = 0, y = 0;
  edge::kernels::matmul_params p{.x = &x, .w = {.values = &x}, .y = &y, .tokens = 1, .n = 1, .k = 2, .x_stride = 1, .y_stride = 1};
  CHECK_FALSE(edge::kernels::run_matmul(p, {}).ok());
}
