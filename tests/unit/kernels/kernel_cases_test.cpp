// The case list (tests/kernel_cases/kernel_cases.h): every CUDA kernel has cases, and the CPU
// references the GPU program compares against are right on every case, checked against plain
// double-precision sums with the GPU program's own metrics.
#include <doctest/doctest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "edge/common/thread_pool.h"
#include "tests/kernel_cases/problems.h"

namespace {

using namespace edge::kernel_cases;
namespace ek = edge::kernels;

edge::thread_pool& pool() {
  static edge::thread_pool p(0);
  return p;
}
ek::stream cpu() { return {.where = ek::device::cpu, .pool = &pool()}; }

}  // namespace

TEST_CASE("case list: every CUDA kernel has cases") {
  std::ifstream in(std::string(EDGE_SOURCE_DIR) + "/kernels/cuda/launchers.h");
  REQUIRE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string launchers = text.str();
  const std::regex entry(R"(status run_([a-z0-9_]+)\()");
  std::set<std::string> launched;
  for (auto it = std::sregex_iterator(launchers.begin(), launchers.end(), entry); it != std::sregex_iterator(); ++it) {
    launched.insert((*it)[1].str());
  }
  CHECK(launched.size() >= 15);
  for (const std::string& name : launched) {
    INFO("kernels/cuda/launchers.h launches run_" << name << ": give it cases in tests/kernel_cases/kernel_cases.h");
    CHECK(std::find(kernel_names.begin(), kernel_names.end(), name) != kernel_names.end());
    CHECK(case_count(name) > 0);
  }
  for (const auto name : kernel_names) {
    INFO(name);
    CHECK(launched.count(std::string(name)) == 1);
    CHECK(case_count(name) > 0);
  }
  // The real shapes are there.
  std::set<std::string> models;
  for (const auto& c : matmul_cases()) models.insert(c.shape.substr(0, c.shape.find(' ')));
  for (const char* model : {"llama-3-8b", "qwen3-30b-a3b", "kimi-k2", "glm-5"}) {
    INFO(model);
    CHECK(models.count(model) == 1);
  }
}

TEST_CASE("case list: the CPU matmul reference on every case") {
  std::uint32_t seed = 100;
  for (const matmul_case& c : matmul_cases()) {
    const host_weights w = make_weights(c, ++seed, cpu());
    const auto bias = scaled_floats(static_cast<std::size_t>(c.n), ++seed, 1, 1.0f);
    for (const std::int64_t tokens : c.tokens) {
      const bool with_bias = tokens % 2 == 1;
      const auto x = activations(tokens, c.k, ++seed);
      std::vector<float> y(static_cast<std::size_t>(tokens * c.n));
      REQUIRE(ek::run_matmul({.x = x.data(), .w = w.view(), .bias = with_bias ? bias.data() : nullptr, .y = y.data(),
                              .tokens = tokens, .n = c.n, .k = c.k, .x_stride = c.k, .y_stride = c.n,
                              .exact_activations = true},
                             cpu())
                  .ok());
      // Large cases: the first and the last token (the sums in double take a while).
      const bool every_token = tokens * c.n * c.k <= (std::int64_t{1} << 24);
      double worst = 0.0;
      for (std::int64_t t = 0; t < tokens; ++t) {
        if (!every_token && t != 0 && t != tokens - 1) continue;
        const auto exact = exact_matmul(x.data() + t * c.k, w, with_bias ? bias.data() : nullptr, 1, c.k);
        for (std::int64_t r = 0; r < c.n; ++r) {
          const auto at = static_cast<std::size_t>(r);
          worst = std::max(worst, matmul_error(y[static_cast<std::size_t>(t * c.n + r)], exact.y[at], exact.l2[at],
                                               with_bias ? std::fabs(bias[at]) : 0.0));
        }
      }
      INFO(c.shape << " " << to_string(c.format) << " n " << c.n << " k " << c.k << " tokens " << tokens << ": error "
                   << worst);
      CHECK(worst <= matmul_f32_tolerance);
    }
  }
}

TEST_CASE("case list: the CPU paged attention reference on every case") {
  std::uint32_t seed = 200;
  for (const attention_case& c : attention_cases()) {
    const attention_problem p = make_attention_problem(c, ++seed, cpu());
    std::vector<float> out(static_cast<std::size_t>(p.tokens * p.heads * c.head_dim));
    REQUIRE(ek::run_paged_attention(p.params(out.data()), cpu()).ok());
    const double error = worst_attention_error(out, reference_attention(p, false, attention_flaw::none, &pool()), p);
    INFO(c.shape << " " << to_string(c.kv) << " head_dim " << c.head_dim << " gqa " << c.group << ":1 block "
                 << c.block_size << ": error " << error);
    CHECK(error <= attention_f32_tolerance);
  }
}
