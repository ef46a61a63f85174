// run_head_matmul (kernels/matmul/matmul.h): every head's small matmul in one call, against plain
// double sums over each head's rows, on every case of the case list; its refusals; and the
// launches it counts.
#include <doctest/doctest.h>

#include "kernel_test_util.h"
#include "tests/kernel_cases/problems.h"

namespace {

using namespace edge::kernel_cases;
namespace ek = edge::kernels;

ek::stream cpu() { return edge::testing::cpu_stream(); }

}  // namespace

TEST_CASE("case list: the CPU head_matmul reference on every case") {
  std::uint32_t seed = 500;
  for (const head_matmul_case& c : head_matmul_cases()) {
    const std::int64_t rows = c.first_row + (c.heads - 1) * c.head_rows + c.n;
    const host_weights w = make_weights(c.format, rows, c.k, 0, ++seed, cpu());
    for (const std::int64_t tokens : c.tokens) {
      // Heads of a token side by side with a gap (x: k + 3 apart; y: n + 5 apart).
      const std::int64_t x_head = c.k + 3, y_head = c.n + 5;
      const auto x = activations(tokens, c.heads * x_head, ++seed);
      std::vector<float> y(static_cast<std::size_t>(tokens * c.heads * y_head), -7.0f);
      REQUIRE(ek::run_head_matmul({.x = x.data(), .w = w.view(), .y = y.data(), .tokens = tokens, .heads = c.heads,
                                   .n = c.n, .k = c.k, .first_row = c.first_row, .head_rows = c.head_rows,
                                   .x_stride = c.heads * x_head, .x_head_stride = x_head,
                                   .y_stride = c.heads * y_head, .y_head_stride = y_head,
                                   .exact_activations = true},
                                  cpu())
                  .ok());
      double worst = 0.0;
      bool gaps_kept = true;
      for (std::int64_t t = 0; t < tokens; ++t) {
        for (std::int64_t h = 0; h < c.heads; ++h) {
          const float* xr = x.data() + t * c.heads * x_head + h * x_head;
          for (std::int64_t r = 0; r < y_head; ++r) {
            const float got = y[static_cast<std::size_t>((t * c.heads + h) * y_head + r)];
            if (r >= c.n) {
              gaps_kept = gaps_kept && got == -7.0f;
              continue;
            }
            const float* wr = w.dense.data() + (c.first_row + h * c.head_rows + r) * c.k;
            double sum = 0.0, squares = 0.0;
            for (std::int64_t j = 0; j < c.k; ++j) {
              const double product = static_cast<double>(xr[j]) * wr[j];
              sum += product;
              squares += product * product;
            }
            worst = std::max(worst, matmul_error(got, sum, std::sqrt(squares), 0.0));
          }
        }
      }
      INFO(c.shape << " " << to_string(c.format) << " tokens " << tokens << ": error " << worst);
      CHECK(worst <= matmul_f32_tolerance);
      CHECK(gaps_kept);
    }
  }
}

TEST_CASE("head_matmul: refuses heads that overlap and counts its launches") {
  std::vector<float> x(64), y(64), w(64);
  const ek::weight_view view{.format = ek::weight_format::f32, .values = w.data()};
  const ek::head_matmul_params good{.x = x.data(), .w = view, .y = y.data(), .tokens = 2, .heads = 2, .n = 4, .k = 4,
                                    .first_row = 0, .head_rows = 4, .x_stride = 8, .x_head_stride = 4,
                                    .y_stride = 8, .y_head_stride = 4};
  CHECK(ek::run_head_matmul(good, cpu()).ok());
  auto overlap = good;
  overlap.y_stride = 4;  // token 1's heads over token 0's second head
  CHECK(ek::run_head_matmul(overlap, cpu()).code() == edge::status_code::invalid_argument);
  auto short_rows = good;
  short_rows.head_rows = 3;  // a head's rows into the next head's
  CHECK(ek::run_head_matmul(short_rows, cpu()).code() == edge::status_code::invalid_argument);

  std::int64_t launches = 0;
  const ek::stream count{.where = ek::device::count, .launches = &launches};
  CHECK(ek::run_head_matmul(good, count).ok());
  CHECK(launches == 1);
  auto prefill = good;
  prefill.tokens = ek::head_matmul_gemv_tokens + 1;
  CHECK(ek::run_head_matmul(prefill, count).ok());
  CHECK(launches == 3);  // a matmul per head
}
