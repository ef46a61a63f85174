// The routed experts (moe_experts.h) against a plain reference (each token's experts computed
// one by one in double), with experts nobody chose left unreadable, batch invariance, and INT4
// experts against their dequantized values.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "edge/common/thread_pool.h"
#include "kernel_test_util.h"
#include "kernels/moe_experts/moe_experts.h"
#include "kernels/quantize/quantize.h"

namespace {

using edge::kernels::weight_format;
using edge::kernels::weight_view;

constexpr std::int64_t num_experts = 8, top_k = 2, hidden = 32, inter = 24;

struct expert_set {
  std::vector<std::vector<float>> gate_up, down;  // f32 values (dequantized when quantized)
  std::vector<std::vector<std::uint8_t>> packed_gate_up, packed_down;
  std::vector<std::vector<float>> scales_gate_up, scales_down;
  std::vector<edge::kernels::moe_expert_weights> matrices;

  // Experts in `used` get weights; the others have none, so reading them is an error.
  expert_set(const std::vector<int>& used, weight_format format) {
    gate_up.resize(num_experts);
    down.resize(num_experts);
    packed_gate_up.resize(num_experts);
    packed_down.resize(num_experts);
    scales_gate_up.resize(num_experts);
    scales_down.resize(num_experts);
    matrices.resize(num_experts);
    for (const int e : used) {
      gate_up[e] = edge::testing::random_floats(2 * inter * hidden, 100 + e, 0.2f);
      down[e] = edge::testing::random_floats(hidden * inter, 200 + e, 0.2f);
      matrices[e].gate = place(gate_up[e], 2 * inter, hidden, format, packed_gate_up[e], scales_gate_up[e]);
      matrices[e].down = place(down[e], hidden, inter, format, packed_down[e], scales_down[e]);
    }
  }

  // The matrix in `format`; for int4 its f32 values become the dequantized ones.
  static weight_view place(std::vector<float>& values, std::int64_t rows, std::int64_t cols, weight_format format,
                           std::vector<std::uint8_t>& packed, std::vector<float>& scales) {
    if (format == weight_format::f32) return {.format = format, .values = values.data()};
    const std::int64_t group = 8;
    packed.resize(static_cast<std::size_t>(edge::kernels::weight_values_bytes(format, rows, cols)));
    scales.resize(static_cast<std::size_t>(edge::kernels::weight_scale_count(format, rows, cols, group)));
    REQUIRE(edge::kernels::run_quantize({.x = values.data(), .rows = rows, .k = cols, .x_stride = cols, .format = format,
                                         .group_size = group, .values = packed.data(), .scales = scales.data()},
                                        {})
                .ok());
    const weight_view view{.format = format, .values = packed.data(), .scales = scales.data(), .group_size = group};
    REQUIRE(edge::kernels::run_dequantize({.w = view, .k = cols, .rows = rows, .y = values.data(), .y_stride = cols}, {})
                .ok());
    return view;
  }
};

// The set with each expert's gate and up as two views of its stacked rows.
std::vector<edge::kernels::moe_expert_weights> split_gate_up(const expert_set& set) {
  std::vector<edge::kernels::moe_expert_weights> out = set.matrices;
  for (auto& m : out) {
    if (m.gate.values == nullptr) continue;
    const weight_view both = m.gate;
    m.up = both;
    m.up.values = static_cast<const std::uint8_t*>(both.values) +
                  edge::kernels::weight_values_bytes(both.format, inter, hidden);
    if (both.scales != nullptr) {
      m.up.scales = both.scales + edge::kernels::weight_scale_count(both.format, inter, hidden, both.group_size);
    }
  }
  return out;
}

std::vector<float> run(const expert_set& set, const std::vector<float>& x, const std::vector<std::int32_t>& experts,
                       const std::vector<float>& weights, std::vector<float> out,
                       const std::vector<edge::kernels::moe_expert_weights>* matrices = nullptr,
                       std::vector<std::int32_t>* expert_tokens = nullptr, std::int64_t workspace_tokens = 0,
                       edge::thread_pool* pool = nullptr) {
  const auto tokens = static_cast<std::int64_t>(x.size()) / hidden;
  std::vector<float> workspace(static_cast<std::size_t>(edge::kernels::moe_experts_workspace_floats(
      workspace_tokens > 0 ? workspace_tokens : tokens, top_k, num_experts, hidden, inter)));
  REQUIRE(edge::kernels::run_moe_experts({.x = x.data(), .experts = experts.data(), .weights = weights.data(),
                                          .matrices = matrices != nullptr ? matrices->data() : set.matrices.data(),
                                          .out = out.data(),
                                          .expert_tokens = expert_tokens != nullptr ? expert_tokens->data() : nullptr,
                                          .tokens = tokens, .top_k = top_k,
                                          .num_experts = num_experts, .hidden = hidden, .intermediate = inter,
                                          .x_stride = hidden, .out_stride = hidden, .workspace = workspace.data(),
                                          .workspace_floats = static_cast<std::int64_t>(workspace.size())},
                                         {.where = edge::kernels::device::cpu, .pool = pool})
              .ok());
  return out;
}

std::vector<double> reference(const expert_set& set, const std::vector<float>& x, const std::vector<std::int32_t>& experts,
                              const std::vector<float>& weights, const std::vector<float>& out0) {
  const auto tokens = static_cast<std::int64_t>(x.size()) / hidden;
  std::vector<double> out(out0.begin(), out0.end());
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t i = 0; i < top_k; ++i) {
      const int e = experts[static_cast<std::size_t>(t * top_k + i)];
      std::vector<double> h(inter);
      for (std::int64_t r = 0; r < inter; ++r) {
        double g = 0.0, u = 0.0;
        for (std::int64_t c = 0; c < hidden; ++c) {
          g += double(set.gate_up[e][r * hidden + c]) * x[t * hidden + c];
          u += double(set.gate_up[e][(inter + r) * hidden + c]) * x[t * hidden + c];
        }
        h[r] = g / (1.0 + std::exp(-g)) * u;
      }
      for (std::int64_t d = 0; d < hidden; ++d) {
        double y = 0.0;
        for (std::int64_t r = 0; r < inter; ++r) y += double(set.down[e][d * inter + r]) * h[r];
        out[t * hidden + d] += weights[static_cast<std::size_t>(t * top_k + i)] * y;
      }
    }
  }
  return out;
}

}  // namespace

TEST_CASE("routed experts add each token's weighted SwiGLU experts, reading only the experts chosen") {
  const std::vector<int> used = {0, 1, 2, 5};  // experts 3, 4, 6 and 7 have no weights at all
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> pick(0, static_cast<int>(used.size()) - 1);
  std::uniform_real_distribution<float> share(0.1f, 0.9f);
  const std::int64_t tokens = 13;
  const auto x = edge::testing::random_floats(tokens * hidden, 5);
  const auto out0 = edge::testing::random_floats(tokens * hidden, 6);
  std::vector<std::int32_t> experts;
  std::vector<float> weights;
  for (std::int64_t t = 0; t < tokens; ++t) {
    const int a = used[static_cast<std::size_t>(pick(rng))];
    int b = used[static_cast<std::size_t>(pick(rng))];
    while (b == a) b = used[static_cast<std::size_t>(pick(rng))];
    experts.push_back(a);
    experts.push_back(b);
    const float w = share(rng);
    weights.push_back(w);
    weights.push_back(1.0f - w);
  }
  for (const weight_format format : {weight_format::f32, weight_format::int4}) {
    CAPTURE(edge::kernels::to_string(format));
    const expert_set set(used, format);
    const auto got = run(set, x, experts, weights, out0);
    const auto want = reference(set, x, experts, weights, out0);
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));

    // Gate and up apart (as weights used in place from a file are) give the same bits, and
    // the tokens per expert are counted.
    const auto split = split_gate_up(set);
    std::vector<std::int32_t> counts(num_experts, -1);
    const auto apart = run(set, x, experts, weights, out0, &split, &counts);
    CHECK(apart == got);
    for (std::int64_t e = 0; e < num_experts; ++e) {
      CHECK(counts[static_cast<std::size_t>(e)] == std::count(experts.begin(), experts.end(), e));
    }
    // A workspace of 5 tokens runs the 13 in chunks of 5, 5 and 3: the same bits, the same counts.
    std::vector<std::int32_t> chunked_counts(num_experts, -1);
    CHECK(run(set, x, experts, weights, out0, nullptr, &chunked_counts, 5) == got);
    CHECK(chunked_counts == counts);
    // On a pool of threads, each expert's rows split into bands across them: the same bits.
    edge::thread_pool pool(2);
    CHECK(run(set, x, experts, weights, out0, nullptr, nullptr, 0, &pool) == got);
    CHECK(run(set, x, experts, weights, out0, &split, nullptr, 5, &pool) == got);

    // Batch invariance: each token alone gives the same bits as in the batch.
    for (std::int64_t t = 0; t < tokens; ++t) {
      const std::vector<float> xt(x.begin() + t * hidden, x.begin() + (t + 1) * hidden);
      const std::vector<std::int32_t> et(experts.begin() + t * top_k, experts.begin() + (t + 1) * top_k);
      const std::vector<float> wt(weights.begin() + t * top_k, weights.begin() + (t + 1) * top_k);
      const std::vector<float> ot(out0.begin() + t * hidden, out0.begin() + (t + 1) * hidden);
      const auto alone = run(set, xt, et, wt, ot);
      CHECK(std::equal(alone.begin(), alone.end(), got.begin() + t * hidden));
    }
  }
}

TEST_CASE("routed experts refuse an expert outside the set and a short workspace") {
  const expert_set set({0, 1}, weight_format::f32);
  const auto x = edge::testing::random_floats(hidden, 1);
  std::vector<float> out(hidden);
  std::vector<std::int32_t> experts = {0, 8};
  const std::vector<float> weights = {0.5f, 0.5f};
  std::vector<float> workspace(
      static_cast<std::size_t>(edge::kernels::moe_experts_workspace_floats(1, top_k, num_experts, hidden, inter)));
  edge::kernels::moe_experts_params p{.x = x.data(), .experts = experts.data(), .weights = weights.data(),
                                      .matrices = set.matrices.data(),
                                      .out = out.data(), .tokens = 1, .top_k = top_k, .num_experts = num_experts,
                                      .hidden = hidden, .intermediate = inter, .x_stride = hidden, .out_stride = hidden,
                                      .workspace = workspace.data(),
                                      .workspace_floats = static_cast<std::int64_t>(workspace.size())};
  CHECK_FALSE(edge::kernels::run_moe_experts(p, {}).ok());
  experts[1] = 1;
  CHECK(edge::kernels::run_moe_experts(p, {}).ok());
  p.workspace_floats -= 1;
  CHECK_FALSE(edge::kernels::run_moe_experts(p, {}).ok());
}
