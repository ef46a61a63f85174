#include "kernels/moe_experts/moe_experts.h"

#include <algorithm>
#include <array>
#include <mutex>
#include <optional>
#include <vector>

#include "edge/common/format.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/parallel.h"
#include "kernels/matmul/integer_dot.h"
#include "kernels/cuda/launchers.h"
#include "kernels/matmul/matmul.h"
#include "kernels/silu_mul/silu_mul.h"

namespace edge::kernels {
namespace {

// Output rows of one matrix one thread computes at a time: a multiple of every matmul row tile,
// small enough that a decode step's few experts spread over the threads.
constexpr std::int64_t band_rows = 64;

// The tokens of one chunk, all of which the workspace holds; expert_tokens is added to.
status run_chunk_cpu(const moe_experts_params& p, const stream& s) {
  const std::int64_t pairs = p.tokens * p.top_k;

  // The (token, choice) pairs grouped by expert (a counting sort: token order within each);
  // grown once per thread, then reused.
  thread_local std::vector<std::int64_t> begin;  // [num_experts + 1]
  thread_local std::vector<std::int64_t> order;  // [pairs] pair index t * top_k + i
  begin.assign(static_cast<std::size_t>(p.num_experts + 1), 0);
  order.resize(static_cast<std::size_t>(pairs));
  for (std::int64_t i = 0; i < pairs; ++i) ++begin[static_cast<std::size_t>(p.experts[i]) + 1];
  for (std::int64_t e = 0; e < p.num_experts; ++e) begin[static_cast<std::size_t>(e + 1)] += begin[static_cast<std::size_t>(e)];
  thread_local std::vector<std::int64_t> cursor;  // [num_experts] the next free place of each expert
  cursor.assign(begin.begin(), begin.end() - 1);
  for (std::int64_t i = 0; i < pairs; ++i) order[static_cast<std::size_t>(cursor[static_cast<std::size_t>(p.experts[i])]++)] = i;

  if (p.expert_tokens != nullptr) {
    for (std::int64_t e = 0; e < p.num_experts; ++e) {
      p.expert_tokens[e] += static_cast<std::int32_t>(begin[static_cast<std::size_t>(e + 1)] - begin[static_cast<std::size_t>(e)]);
    }
  }

  const moe_experts_layout layout = moe_experts_workspace(p.tokens, p.top_k, p.num_experts, p.hidden, p.intermediate);
  float* gathered = p.workspace + layout.gathered;      // [pairs, hidden] x rows in expert order
  float* activation = p.workspace + layout.activation;  // [pairs, 2 intermediate]
  float* expert_out = p.workspace + layout.expert_out;  // [pairs, hidden]
  float* sums = p.workspace + layout.tail;              // [tokens, hidden]
  for (std::int64_t j = 0; j < pairs; ++j) {
    const std::int64_t t = order[static_cast<std::size_t>(j)] / p.top_k;
    std::copy_n(p.x + t * p.x_stride, p.hidden, gathered + j * p.hidden);
  }
  // Every chosen expert's matrices in bands of rows, all in one parallel pass (gate and up),
  // then the activation, then one pass for down: at decode each expert has a row or two, and
  // a dispatch per matrix would cost as much as reading it.
  const std::int64_t inter = p.intermediate;
  struct band {
    weight_view w;        // its rows [first_row, first_row + n)
    std::int64_t n, k;
    const float* x;       // [tokens, k], row stride x_stride
    std::int64_t x_stride, tokens;
    float* y;             // [tokens, n], row stride y_stride
    std::int64_t y_stride;
    std::int64_t first_token;  // x's first row among the pass's quantized activations
  };
  // A pass whose experts all take the integer matmul quantizes its rows once, here, rather than
  // once per band (at decode a band is a few microseconds of work, and quantizing k activations
  // cost as much). Calling thread only; the bands read it.
  thread_local cpu::int8_activations pass_codes_of_thread;
  cpu::int8_activations& pass_codes = pass_codes_of_thread;  // named once, as band_list below
  const cpu::isa level = cpu::active_isa();
  bool prequantized = false;
  const auto quantize_pass = [&](const float* x, std::int64_t rows, std::int64_t k, std::int64_t x_stride,
                                 auto&& matrices_of) {
    // Every expert that runs in the pass takes its activations in one order.
    std::optional<cpu::code_order> codes_order;
    prequantized = cpu::quantized_activations();
    for (std::int64_t e = 0; e < p.num_experts && prequantized; ++e) {
      if (begin[static_cast<std::size_t>(e + 1)] == begin[static_cast<std::size_t>(e)]) continue;
      for (const weight_view* w : matrices_of(p.matrices[e])) {
        if (w->values == nullptr) continue;
        if (!cpu::integer_dot_reads(*w)) {
          prequantized = false;
          break;
        }
        const cpu::code_order wanted = cpu::integer_matmul::activation_order(level, *w);
        if (codes_order && *codes_order != wanted) prequantized = false;
        codes_order = wanted;
      }
    }
    prequantized = prequantized && codes_order.has_value();
    if (prequantized) cpu::quantize_activations(x, rows, k, x_stride, *codes_order, pass_codes);
  };
  // The calling thread's list, named once: inside the pool's lambda `bands` would be each
  // worker's own thread_local.
  thread_local std::vector<band> band_list;
  std::vector<band>& bands = band_list;
  const auto add_bands = [&](const weight_view& w, std::int64_t n, std::int64_t k, const float* x, std::int64_t x_stride,
                             std::int64_t tokens, float* y, std::int64_t y_stride, std::int64_t first_token) {
    for (std::int64_t r = 0; r < n; r += band_rows) {
      bands.push_back({.w = weight_rows_from(w, r, k), .n = std::min(band_rows, n - r), .k = k, .x = x,
                       .x_stride = x_stride, .tokens = tokens, .y = y + r, .y_stride = y_stride,
                       .first_token = first_token});
    }
  };
  const auto run_bands = [&]() -> status {
    status failure;
    std::mutex failure_mutex;
    const stream here{device::cpu, nullptr, nullptr};  // each band on the thread that takes it
    cpu::parallel_for(s, static_cast<std::int64_t>(bands.size()), 1, [&](std::int64_t b0, std::int64_t b1) {
      for (std::int64_t b = b0; b < b1; ++b) {
        const band& w = bands[static_cast<std::size_t>(b)];
        const matmul_params params{.x = w.x, .w = w.w, .y = w.y, .tokens = w.tokens, .n = w.n, .k = w.k,
                                   .x_stride = w.x_stride, .y_stride = w.y_stride};
        if (prequantized) {
          thread_local std::vector<float> group_sums;  // the integer matmul's scratch, per thread
          cpu::integer_matmul(params, level, pass_codes, w.first_token, group_sums).rows(0, w.n);
          continue;
        }
        const status done = run_matmul(params, here);
        if (!done.ok()) {
          const std::lock_guard lock(failure_mutex);
          failure = done;
        }
      }
    });
    bands.clear();
    return failure;
  };
  bands.clear();
  quantize_pass(gathered, pairs, p.hidden, p.hidden, [](const moe_expert_weights& m) {
    return std::array<const weight_view*, 2>{&m.gate, &m.up};
  });
  for (std::int64_t e = 0; e < p.num_experts; ++e) {
    const std::int64_t first = begin[static_cast<std::size_t>(e)];
    const std::int64_t rows = begin[static_cast<std::size_t>(e + 1)] - first;
    if (rows == 0) continue;  // never read
    const moe_expert_weights& m = p.matrices[e];
    float* act = activation + first * 2 * inter;
    const float* rows_x = gathered + first * p.hidden;
    if (m.stacked()) {
      add_bands(m.gate, 2 * inter, p.hidden, rows_x, p.hidden, rows, act, 2 * inter, first);
    } else {
      add_bands(m.gate, inter, p.hidden, rows_x, p.hidden, rows, act, 2 * inter, first);
      add_bands(m.up, inter, p.hidden, rows_x, p.hidden, rows, act + inter, 2 * inter, first);
    }
  }
  EDGE_RETURN_IF_ERROR(run_bands());
  EDGE_RETURN_IF_ERROR(run_silu_mul({.gate = activation, .up = activation + inter, .out = activation, .rows = pairs,
                                     .cols = inter, .in_stride = 2 * inter, .out_stride = 2 * inter},
                                    s));
  quantize_pass(activation, pairs, inter, 2 * inter, [](const moe_expert_weights& m) {
    return std::array<const weight_view*, 1>{&m.down};
  });
  for (std::int64_t e = 0; e < p.num_experts; ++e) {
    const std::int64_t first = begin[static_cast<std::size_t>(e)];
    const std::int64_t rows = begin[static_cast<std::size_t>(e + 1)] - first;
    if (rows == 0) continue;
    add_bands(p.matrices[e].down, p.hidden, inter, activation + first * 2 * inter, 2 * inter, rows,
              expert_out + first * p.hidden, p.hidden, first);
  }
  EDGE_RETURN_IF_ERROR(run_bands());
  // Each token's contributions in the order of its experts' ids, whatever the batch, then onto out.
  std::fill_n(sums, p.tokens * p.hidden, 0.0f);
  thread_local std::vector<std::int64_t> row_of;  // [pairs] where pair i's expert output sits
  row_of.resize(static_cast<std::size_t>(pairs));
  for (std::int64_t j = 0; j < pairs; ++j) row_of[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])] = j;
  thread_local std::vector<std::int64_t> by_expert;  // one token's choices, sorted by expert
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    by_expert.resize(static_cast<std::size_t>(p.top_k));
    for (std::int64_t i = 0; i < p.top_k; ++i) by_expert[static_cast<std::size_t>(i)] = t * p.top_k + i;
    std::sort(by_expert.begin(), by_expert.end(), [&](std::int64_t a, std::int64_t b) {
      return p.experts[a] < p.experts[b] || (p.experts[a] == p.experts[b] && a < b);
    });
    float* sum = sums + t * p.hidden;
    for (const std::int64_t i : by_expert) {
      const float w = p.weights[i];
      const float* y = expert_out + row_of[static_cast<std::size_t>(i)] * p.hidden;
      for (std::int64_t d = 0; d < p.hidden; ++d) sum[d] += w * y[d];
    }
    float* o = p.out + t * p.out_stride;
    for (std::int64_t d = 0; d < p.hidden; ++d) o[d] += sum[d];
  }
  return {};
}

// The most tokens of p at once that its workspace holds (at least 1).
std::int64_t chunk_tokens(const moe_experts_params& p) {
  const auto fits = [&](std::int64_t tokens) {
    return moe_experts_workspace_floats(tokens, p.top_k, p.num_experts, p.hidden, p.intermediate) <= p.workspace_floats;
  };
  if (fits(p.tokens)) return std::max<std::int64_t>(p.tokens, 1);
  std::int64_t low = 1, high = p.tokens;  // fits(low), !fits(high)
  while (high - low > 1) {
    const std::int64_t mid = low + (high - low) / 2;
    (fits(mid) ? low : high) = mid;
  }
  return low;
}

}  // namespace

namespace detail {

status check_moe_experts(const moe_experts_params& p) {
  if (p.tokens < 0 || p.top_k < 1 || p.num_experts < 1 || p.hidden < 1 || p.intermediate < 1 ||
      p.x_stride < p.hidden || p.out_stride < p.hidden) {
    return invalid_argument("moe experts: bad shape or strides");
  }
  const std::int64_t one = std::min<std::int64_t>(p.tokens, 1);
  if (p.workspace_floats < moe_experts_workspace_floats(one, p.top_k, p.num_experts, p.hidden, p.intermediate)) {
    return invalid_argument("moe experts: the workspace is too small for one token");
  }
  return {};
}

}  // namespace detail

status run_moe_experts(const moe_experts_params& p, const stream& s) {
  if (s.where == device::count) {
    // count, place, gather, gate and up (one launch when stacked), silu_mul, down, combine.
    const bool stacked = p.num_experts == 0 || p.matrices == nullptr || p.matrices[0].stacked();
    count_launches(s, stacked ? 7 : 8);
    return {};
  }
  const bool cuda = s.where == device::cuda;
  if (cuda && !cuda::compiled()) return cuda::run_moe_experts(p, s);  // a build without CUDA says so first
  EDGE_RETURN_IF_ERROR(detail::check_moe_experts(p));
  if (!cuda) {
    for (std::int64_t i = 0; i < p.tokens * p.top_k; ++i) {
      if (p.experts[i] < 0 || p.experts[i] >= p.num_experts) {
        return invalid_argument(format("moe experts: expert {} of {}", p.experts[i], p.num_experts));
      }
    }
    if (p.expert_tokens != nullptr && !p.add_expert_tokens) std::fill_n(p.expert_tokens, p.num_experts, 0);
  }
  // As many tokens at a time as the workspace holds; expert_tokens sums the chunks.
  const std::int64_t chunk = chunk_tokens(p);
  for (std::int64_t first = 0; first < p.tokens || first == 0; first += chunk) {
    moe_experts_params part = p;
    part.tokens = std::min(chunk, p.tokens - first);
    part.x = p.x + first * p.x_stride;
    part.experts = p.experts + first * p.top_k;
    part.weights = p.weights + first * p.top_k;
    part.out = p.out + first * p.out_stride;
    part.add_expert_tokens = p.add_expert_tokens || first > 0;
    if (cuda) {
      EDGE_RETURN_IF_ERROR(cuda::run_moe_experts(part, s));
    } else if (part.tokens > 0) {
      EDGE_RETURN_IF_ERROR(run_chunk_cpu(part, s));
    }
    if (p.tokens == 0) break;
  }
  return {};
}

}  // namespace edge::kernels
