#include "kernels/moe_experts/moe_experts.h"

#include <algorithm>
#include <vector>

#include "edge/common/format.h"
#include "kernels/cuda/launchers.h"
#include "kernels/matmul/matmul.h"
#include "kernels/silu_mul/silu_mul.h"

namespace edge::kernels {

namespace detail {

status check_moe_experts(const moe_experts_params& p) {
  if (p.tokens < 0 || p.top_k < 1 || p.num_experts < 1 || p.hidden < 1 || p.intermediate < 1 ||
      p.x_stride < p.hidden || p.out_stride < p.hidden) {
    return invalid_argument("moe experts: bad shape or strides");
  }
  if (p.workspace_floats < moe_experts_workspace_floats(p.tokens, p.top_k, p.num_experts, p.hidden, p.intermediate)) {
    return invalid_argument("moe experts: the workspace is too small");
  }
  return {};
}

}  // namespace detail

status run_moe_experts(const moe_experts_params& p, const stream& s) {
  if (s.where == device::cuda) return cuda::run_moe_experts(p, s);
  EDGE_RETURN_IF_ERROR(detail::check_moe_experts(p));
  if (p.tokens == 0) {
    if (p.expert_tokens != nullptr) std::fill_n(p.expert_tokens, p.num_experts, 0);
    return {};
  }
  const std::int64_t pairs = p.tokens * p.top_k;
  for (std::int64_t i = 0; i < pairs; ++i) {
    if (p.experts[i] < 0 || p.experts[i] >= p.num_experts) {
      return invalid_argument(format("moe experts: expert {} of {}", p.experts[i], p.num_experts));
    }
  }

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
      p.expert_tokens[e] = static_cast<std::int32_t>(begin[static_cast<std::size_t>(e + 1)] - begin[static_cast<std::size_t>(e)]);
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
  for (std::int64_t e = 0; e < p.num_experts; ++e) {
    const std::int64_t first = begin[static_cast<std::size_t>(e)];
    const std::int64_t rows = begin[static_cast<std::size_t>(e + 1)] - first;
    if (rows == 0) continue;  // never read
    const std::int64_t inter = p.intermediate;
    const moe_expert_weights& m = p.matrices[e];
    float* act = activation + first * 2 * inter;
    const float* rows_x = gathered + first * p.hidden;
    if (m.stacked()) {
      EDGE_RETURN_IF_ERROR(run_matmul({.x = rows_x, .w = m.gate, .y = act, .tokens = rows, .n = 2 * inter,
                                       .k = p.hidden, .x_stride = p.hidden, .y_stride = 2 * inter},
                                      s));
    } else {
      EDGE_RETURN_IF_ERROR(run_matmul({.x = rows_x, .w = m.gate, .y = act, .tokens = rows, .n = inter, .k = p.hidden,
                                       .x_stride = p.hidden, .y_stride = 2 * inter},
                                      s));
      EDGE_RETURN_IF_ERROR(run_matmul({.x = rows_x, .w = m.up, .y = act + inter, .tokens = rows, .n = inter,
                                       .k = p.hidden, .x_stride = p.hidden, .y_stride = 2 * inter},
                                      s));
    }
    EDGE_RETURN_IF_ERROR(run_silu_mul({.gate = activation + first * 2 * inter, .up = activation + first * 2 * inter + inter,
                                       .out = activation + first * 2 * inter, .rows = rows, .cols = inter,
                                       .in_stride = 2 * inter, .out_stride = 2 * inter},
                                      s));
    EDGE_RETURN_IF_ERROR(run_matmul({.x = activation + first * 2 * inter, .w = m.down, .y = expert_out + first * p.hidden,
                                     .tokens = rows, .n = p.hidden, .k = inter, .x_stride = 2 * inter,
                                     .y_stride = p.hidden},
                                    s));
  }
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

}  // namespace edge::kernels
