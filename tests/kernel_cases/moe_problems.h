// The inputs of the MoE routing and experts cases (kernel_cases.h), built the same way by the GPU
// program and the CPU suite, and their plain references: moe_routing.h's choice in double, and
// each token's experts as plain dense SwiGLU blocks in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "edge/common/thread_pool.h"
#include "kernel_cases.h"
#include "kernels/moe_experts/moe_experts.h"
#include "kernels/moe_routing/moe_routing.h"
#include "problems.h"

namespace edge::kernel_cases {

// ---- routing ----------------------------------------------------------------------------------

struct routing_problem {
  routing_case c;
  std::int64_t tokens = 0;
  std::int64_t stride = 0;    // experts + 3: a strided view of the logits
  std::vector<float> logits;  // [tokens, stride] in +-4
  std::vector<float> bias;    // [experts] in +-0.1

  kernels::moe_routing_params params(const float* logit_rows, const float* correction, std::int32_t* experts,
                                     float* weights) const {
    return {.logits = logit_rows, .correction_bias = c.bias ? correction : nullptr, .experts = experts,
            .weights = weights, .tokens = tokens, .num_experts = c.experts, .top_k = c.top_k, .logits_stride = stride,
            .scoring = c.scoring, .groups = c.groups, .top_groups = c.top_groups, .normalize = c.normalize,
            .scaling = c.scaling};
  }
};

inline routing_problem make_routing_problem(const routing_case& c, std::int64_t tokens, std::uint32_t seed) {
  routing_problem p{.c = c, .tokens = tokens, .stride = c.experts + 3};
  p.logits = scaled_floats(static_cast<std::size_t>(tokens * p.stride), seed, 0, 0.0f, 4.0f);
  p.bias = scaled_floats(static_cast<std::size_t>(c.experts), seed + 1, 0, 0.0f, 0.1f);
  return p;
}

struct routing_reference {
  std::vector<std::int32_t> experts;  // [tokens, top_k] best first
  std::vector<double> weights;        // [tokens, top_k]
  std::vector<bool> near_tie;         // [tokens] two ranked values within routing_tie
};

// moe_routing.h's choice in double. softmax: p = softmax(logits), the top_k largest p, divided by
// their sum with `normalize`. sigmoid: s = sigmoid(logits), ranked by c = s + bias; with groups,
// each group scored by the sum of its two largest c, the top_groups best groups eligible and
// every other expert ranked as c = 0; the top_k largest c, weighted by their s, divided by their
// sum + 1e-20 with `normalize`, times `scaling`. Ties to the lower id, best first.
inline routing_reference reference_routing(const routing_problem& p) {
  const auto& c = p.c;
  const auto n = static_cast<std::size_t>(c.experts);
  routing_reference r;
  // Whether adjacent values among the `count` + 1 largest of v lie within routing_tie.
  const auto close = [](std::vector<double> v, std::size_t count) {
    std::sort(v.begin(), v.end(), std::greater<>());
    for (std::size_t i = 0; i + 1 < std::min(count + 1, v.size()); ++i) {
      if (v[i] - v[i + 1] <= routing_tie * std::max(std::fabs(v[i]), 1e-3)) return true;
    }
    return false;
  };
  // The `count` best indices of v, larger first, lower index first among equals.
  const auto best = [](const std::vector<double>& v, std::size_t count) {
    std::vector<std::size_t> order(v.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return v[a] > v[b]; });
    order.resize(count);
    return order;
  };
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    const float* logits = p.logits.data() + t * p.stride;
    std::vector<double> score(n), choice(n);
    bool tie = false;
    if (c.scoring == kernels::router_scoring::softmax) {
      const double top = *std::max_element(logits, logits + n);
      double total = 0.0;
      for (std::size_t e = 0; e < n; ++e) total += score[e] = std::exp(logits[e] - top);
      for (std::size_t e = 0; e < n; ++e) choice[e] = score[e] /= total;
    } else {
      for (std::size_t e = 0; e < n; ++e) {
        score[e] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[e])));
        choice[e] = score[e] + (c.bias ? p.bias[e] : 0.0);
      }
      if (c.groups > 1) {
        const auto size = n / static_cast<std::size_t>(c.groups);
        std::vector<double> group_score(static_cast<std::size_t>(c.groups));
        for (std::size_t g = 0; g < group_score.size(); ++g) {
          std::vector<double> members(choice.begin() + static_cast<std::ptrdiff_t>(g * size),
                                      choice.begin() + static_cast<std::ptrdiff_t>((g + 1) * size));
          std::sort(members.begin(), members.end(), std::greater<>());
          group_score[g] = members[0] + (size > 1 ? members[1] : 0.0);
        }
        tie = close(group_score, static_cast<std::size_t>(c.top_groups));
        std::vector<bool> eligible(group_score.size(), false);
        for (const std::size_t g : best(group_score, static_cast<std::size_t>(c.top_groups))) eligible[g] = true;
        for (std::size_t e = 0; e < n; ++e) {
          if (!eligible[e / size]) choice[e] = 0.0;
        }
      }
    }
    tie = tie || close(choice, static_cast<std::size_t>(c.top_k));
    const auto chosen = best(choice, static_cast<std::size_t>(c.top_k));
    double sum = 0.0;
    for (const std::size_t e : chosen) sum += score[e];
    const bool sigmoid = c.scoring == kernels::router_scoring::sigmoid;
    const double divisor = c.normalize ? sum + (sigmoid ? 1e-20 : 0.0) : 1.0;
    for (const std::size_t e : chosen) {
      r.experts.push_back(static_cast<std::int32_t>(e));
      r.weights.push_back(score[e] / divisor * (sigmoid ? c.scaling : 1.0));
    }
    r.near_tie.push_back(tie);
  }
  return r;
}

// ---- experts ----------------------------------------------------------------------------------

// The INT4 group of a case: one that divides both of its matrices' k (hidden and inter).
inline std::int64_t experts_group(const experts_case& c) {
  if (c.format != weight_format::int4) return 0;
  return c.group > 0 ? c.group : kernels::int4_group_size_for(std::gcd(c.hidden, c.inter));
}

// A matrix [n, k] written straight in its format, without a float pass and a quantization (the
// expert sets hold up to 200 M weights): each row times 2^(-2..2) and each group of a row times
// 2^(-4..4) more, as weight_values makes them (groups of 128 when the format has none: bf16 and
// FP8 hold the magnitudes in their codes). INT4: random codes, a scale per group; FP8: random
// codes whose exponents carry the group's magnitude (to 2^+-3), a scale per row; bf16: values of
// 2^-4 .. 1 times the magnitude, random mantissas and signs; f32 from weight_values itself.
inline host_weights make_expert_matrix(weight_format f, std::int64_t n, std::int64_t k, std::int64_t group,
                                       std::uint32_t seed) {
  host_weights w{.format = f, .n = n, .k = k, .group_size = f == weight_format::int4 ? group : 0};
  if (f == weight_format::f32) {
    w.values = encode(weight_values(n, k, group, seed), dtype::f32);
    return w;
  }
  test_random rng(seed);
  const std::int64_t g = group > 0 ? group : 128;
  constexpr std::uint8_t int4_zeros = 0x88;  // the padding past k: q = 0 in both nibbles
  w.values.assign(static_cast<std::size_t>(kernels::weight_values_bytes(f, n, k)),
                  f == weight_format::int4 ? int4_zeros : 0);
  w.scales.resize(static_cast<std::size_t>(kernels::weight_scale_count(f, n, k, w.group_size)));
  const auto exponent_in = [&](int spread) { return static_cast<int>(rng.next() % static_cast<std::uint64_t>(2 * spread + 1)) - spread; };
  // Sixteen random bits per weight, four weights per draw.
  std::uint64_t bits = 0;
  int pieces = 0;
  for (std::int64_t r = 0; r < n; ++r) {
    const int row_exponent = exponent_in(2);
    std::uint8_t* int4_row = w.values.data() + r * kernels::int4_row_bytes(k);
    for (std::int64_t first = 0; first < k; first += g) {
      const int group_exponent = exponent_in(4);
      if (f == weight_format::int4) {
        w.scales[static_cast<std::size_t>((r * k + first) / g)] =
            std::ldexp(rng.uniform(1.0f, 2.0f), row_exponent + group_exponent) / 7.5f;
      }
      // FP8's exponent field: 6 + [-3, 3] for the group, minus a jitter of 0..3 per weight (0..9:
      // never the NaN code's 15); bf16's: the magnitude's, minus 1 + the jitter.
      const auto fp8_field = static_cast<std::uint32_t>(6 + std::clamp(group_exponent, -3, 3));
      const auto bf16_field = static_cast<std::uint32_t>(127 + row_exponent + group_exponent - 1);
      for (std::int64_t j = first; j < std::min(first + g, k); ++j) {
        if (pieces == 0) {
          bits = rng.next();
          pieces = 4;
        }
        const auto piece = static_cast<std::uint32_t>(bits & 0xFFFF);
        bits >>= 16;
        --pieces;
        const std::uint32_t jitter = piece & 3;
        const std::uint32_t sign = piece >> 2 & 1;
        const std::uint32_t mantissa = piece >> 3;  // 13 bits, the low ones used
        if (f == weight_format::int4) {
          kernels::int4_set(int4_row, j, static_cast<int>(piece & 0xF) - 8);
        } else if (f == weight_format::fp8_e4m3) {
          w.values[static_cast<std::size_t>(r * k + j)] =
              static_cast<std::uint8_t>(sign << 7 | (fp8_field - jitter) << 3 | (mantissa & 7));
        } else {
          const auto value = static_cast<std::uint16_t>(sign << 15 | (bf16_field - jitter) << 7 | (mantissa & 127));
          std::memcpy(w.values.data() + 2 * (r * k + j), &value, 2);
        }
      }
    }
    if (f == weight_format::fp8_e4m3) w.scales[static_cast<std::size_t>(r)] = std::ldexp(rng.uniform(1.0f, 2.0f), row_exponent - 6);
  }
  return w;
}

// An expert set: every expert but the last has weights (gate and up stacked as [2 inter, hidden]
// rows, gate first; down [hidden, inter]); the last has none, and is never chosen. The experts
// share one matrix of each kind, expert e's rows a window of it that starts expert_shift rows
// after expert e - 1's: a set of distinct Kimi K2 experts (44 M weights each) would take seconds
// and hundreds of MB to build per format, and a window a few rows on is a different matrix all
// the same, so a token given the wrong expert still reads visibly wrong weights.
inline constexpr std::int64_t expert_shift = 3;

struct experts_problem {
  experts_case c;
  std::int64_t group = 0;
  host_weights gate_up;  // [2 inter + (experts - 2) expert_shift, hidden]
  host_weights down;     // [hidden + (experts - 2) expert_shift, inter]

  bool has_weights(std::int64_t e) const { return e + 1 < c.experts; }
  // The first row of expert e's window.
  std::int64_t first_row(std::int64_t e) const { return e * expert_shift; }
  // Views of the set over `gate_up` and `down` (host or device copies of the problem's, in the
  // same layout): gate and up stacked in `gate`, or apart (two views of the rows).
  std::vector<kernels::moe_expert_weights> views(const kernels::weight_view& gate_up_view,
                                                 const kernels::weight_view& down_view, bool stacked) const {
    std::vector<kernels::moe_expert_weights> out(static_cast<std::size_t>(c.experts));
    for (std::int64_t e = 0; has_weights(e); ++e) {
      auto& m = out[static_cast<std::size_t>(e)];
      m.gate = kernels::weight_rows_from(gate_up_view, first_row(e), c.hidden);
      if (!stacked) m.up = kernels::weight_rows_from(m.gate, c.inter, c.hidden);
      m.down = kernels::weight_rows_from(down_view, first_row(e), c.inter);
    }
    return out;
  }
  std::vector<kernels::moe_expert_weights> views(bool stacked) const {
    return views(gate_up.view(), down.view(), stacked);
  }
};

inline experts_problem make_experts_problem(const experts_case& c, std::uint32_t seed) {
  experts_problem p{.c = c, .group = experts_group(c)};
  const std::int64_t extra = (c.experts - 2) * expert_shift;
  p.gate_up = make_expert_matrix(c.format, 2 * c.inter + extra, c.hidden, p.group, seed);
  p.down = make_expert_matrix(c.format, c.hidden + extra, c.inter, p.group, seed + 1);
  return p;
}

// A batch's choices [tokens, top_k]: expert 0 has weights and no tokens, expert 1 one token (the
// first), expert 2 every token, the last expert (no weights) none; the rest at random, in random
// order within each token (so that the sum's expert order is not the choice order). Takes
// top_k <= experts - 3.
inline std::vector<std::int32_t> choose_experts(std::int64_t tokens, std::int64_t top_k, std::int64_t experts,
                                                std::uint32_t seed) {
  test_random rng(seed);
  const auto others = static_cast<std::uint64_t>(experts - 4);  // 3 .. experts - 2
  std::vector<std::int32_t> out;
  for (std::int64_t t = 0; t < tokens; ++t) {
    std::vector<std::int32_t> chosen = {2};
    if (t == 0) chosen.push_back(1);
    while (static_cast<std::int64_t>(chosen.size()) < top_k) {
      const auto e = static_cast<std::int32_t>(3 + rng.next() % others);
      if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
    }
    chosen.resize(static_cast<std::size_t>(top_k));
    for (std::size_t i = chosen.size(); i > 1; --i) std::swap(chosen[i - 1], chosen[rng.next() % i]);
    out.insert(out.end(), chosen.begin(), chosen.end());
  }
  return out;
}

// One call's inputs: x [tokens, x_stride], its choices and their weights (in [0.1, 1]), and out's
// starting values [tokens, out_stride] that the sum is added to.
struct experts_batch {
  std::int64_t tokens = 0, x_stride = 0, out_stride = 0;
  std::vector<float> x, out0, weights;
  std::vector<std::int32_t> experts;
};

inline experts_batch make_experts_batch(const experts_problem& p, std::int64_t tokens, std::int64_t x_stride,
                                        std::int64_t out_stride, std::uint32_t seed) {
  experts_batch b{.tokens = tokens, .x_stride = x_stride, .out_stride = out_stride};
  b.x = activations(tokens, x_stride, seed);
  b.out0 = scaled_floats(static_cast<std::size_t>(tokens * out_stride), seed + 1, static_cast<std::size_t>(out_stride), 2.0f);
  b.experts = choose_experts(tokens, p.c.top_k, p.c.experts, seed + 2);
  test_random rng(seed + 3);
  for (std::size_t i = 0; i < b.experts.size(); ++i) b.weights.push_back(rng.uniform(0.1f, 1.0f));
  return b;
}

struct experts_reference {
  std::vector<double> out;     // [hidden] out0 + the sum
  std::vector<double> spread;  // [hidden] experts_error's spread
};

// Token t of a batch in double: out0[t] + Σ_i weight_i · down_e(silu(gate_e x) · up_e x), each
// expert a plain dense SwiGLU block of its window's weights (weight_row), and experts_error's spread: per
// output d, sqrt(Σ_i weight_i² (Σ_r (D[d,r] a_r)² + Σ_r D[d,r]² ((u_r silu'(g_r))² |G[r]·x|₂² +
// silu(g_r)² |U[r]·x|₂²))), with |W[r]·x|₂² = Σ_j (W[r,j] x_j)², the squared products of a row.
// Rows split over `pool` when given.
inline experts_reference reference_experts_token(const experts_problem& p, const experts_batch& b, std::int64_t t,
                                                 thread_pool* pool = nullptr) {
  const std::int64_t hidden = p.c.hidden;
  const std::int64_t inter = p.c.inter;
  const auto rows_of = [&](std::int64_t count, const auto& body) {
    if (pool == nullptr) {
      body(0, count);
      return;
    }
    pool->parallel_for(0, static_cast<std::size_t>(count), 16, [&](std::size_t begin, std::size_t end) {
      body(static_cast<std::int64_t>(begin), static_cast<std::int64_t>(end));
    });
  };
  experts_reference r;
  r.out.assign(static_cast<std::size_t>(hidden), 0.0);
  std::vector<double> variance(static_cast<std::size_t>(hidden), 0.0);
  const float* x = b.x.data() + t * b.x_stride;
  std::vector<double> a(static_cast<std::size_t>(inter)), carried(static_cast<std::size_t>(inter));
  for (std::int64_t i = 0; i < p.c.top_k; ++i) {
    const std::int64_t e = b.experts[static_cast<std::size_t>(t * p.c.top_k + i)];
    const double w = b.weights[static_cast<std::size_t>(t * p.c.top_k + i)];
    rows_of(inter, [&](std::int64_t first, std::int64_t last) {
      std::vector<float> gate(static_cast<std::size_t>(hidden)), up(gate.size());
      for (std::int64_t row = first; row < last; ++row) {
        weight_row(p.gate_up, p.first_row(e) + row, gate.data());
        weight_row(p.gate_up, p.first_row(e) + inter + row, up.data());
        double g = 0.0, u = 0.0, g2 = 0.0, u2 = 0.0;
        for (std::int64_t j = 0; j < hidden; ++j) {
          const double gx = static_cast<double>(gate[static_cast<std::size_t>(j)]) * x[j];
          const double ux = static_cast<double>(up[static_cast<std::size_t>(j)]) * x[j];
          g += gx;
          u += ux;
          g2 += gx * gx;
          u2 += ux * ux;
        }
        const double sigma = 1.0 / (1.0 + std::exp(-g));
        const double silu = g * sigma;
        const double silu_slope = sigma * (1.0 + g * (1.0 - sigma));
        a[static_cast<std::size_t>(row)] = silu * u;
        carried[static_cast<std::size_t>(row)] = u * silu_slope * (u * silu_slope) * g2 + silu * silu * u2;
      }
    });
    rows_of(hidden, [&](std::int64_t first, std::int64_t last) {
      std::vector<float> down(static_cast<std::size_t>(inter));
      for (std::int64_t d = first; d < last; ++d) {
        weight_row(p.down, p.first_row(e) + d, down.data());
        double y = 0.0, v = 0.0;
        for (std::int64_t row = 0; row < inter; ++row) {
          const double dr = down[static_cast<std::size_t>(row)];
          const double product = dr * a[static_cast<std::size_t>(row)];
          y += product;
          v += product * product + dr * dr * carried[static_cast<std::size_t>(row)];
        }
        r.out[static_cast<std::size_t>(d)] += w * y;
        variance[static_cast<std::size_t>(d)] += w * w * v;
      }
    });
  }
  r.spread.resize(static_cast<std::size_t>(hidden));
  for (std::int64_t d = 0; d < hidden; ++d) {
    r.out[static_cast<std::size_t>(d)] += b.out0[static_cast<std::size_t>(t * b.out_stride + d)];
    r.spread[static_cast<std::size_t>(d)] = std::sqrt(variance[static_cast<std::size_t>(d)]);
  }
  return r;
}

// The largest experts_error of token t's output row (of a [tokens, out_stride] output).
inline double worst_experts_error(const std::vector<float>& out, const experts_batch& b, const experts_reference& r,
                                  std::int64_t t) {
  double worst = 0.0;
  for (std::size_t d = 0; d < r.out.size(); ++d) {
    const auto at = static_cast<std::size_t>(t * b.out_stride) + d;
    worst = std::max(worst, experts_error(out[at], r.out[d], r.spread[d], std::fabs(b.out0[at])));
  }
  return worst;
}

}  // namespace edge::kernel_cases
