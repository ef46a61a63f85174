// CUDA MoE routing: one block per token, the CPU router's steps in the same order
// (moe_routing.h). Each thread holds up to routing_items experts of the row in registers: their
// scores (softmax: the row's maximum and the double sum of exponentials reduced over the
// block; sigmoid: 1 / (1 + expf(-x)) and the choice value with the correction bias), then with
// groups each group's score from its two best choice values (one thread per group, over the
// choice values in shared memory), the kept groups and the top_k experts by repeated
// block-wide maxima of the keys of moe_routing_keys.h (the value's order, then the lower id,
// NaN lowest), as many rounds as items are chosen. The chosen scores become weights on one
// thread, with the CPU's double arithmetic (moe_routing_keys::finish_weights).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/moe_routing/moe_routing_keys.h"

namespace edge::kernels::cuda {
namespace {

namespace keys = moe_routing_keys;

constexpr int routing_threads = 256;
constexpr int routing_warps = routing_threads / warp_size;
constexpr int routing_items = static_cast<int>(max_router_experts / routing_threads);  // per thread
static_assert(max_router_experts % routing_threads == 0);

struct routing_scratch {
  float choice[max_router_experts];   // [num_experts] what ranks the choice (groups only)
  float chosen[max_router_experts];   // [top_k] the chosen experts' scores, best first
  bool kept[max_router_experts];      // [groups] whether the group stays eligible
  unsigned long long keys[routing_warps];
  double sums[routing_warps];
  float maxima[routing_warps];
};

// The largest key over the block, on every thread.
__device__ std::uint64_t block_max(std::uint64_t v, routing_scratch& s) {
  unsigned long long m = v;
#pragma unroll
  for (int offset = warp_size / 2; offset > 0; offset /= 2) m = max(m, __shfl_xor_sync(full_warp, m, offset));
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  __syncthreads();  // the previous round's readers are done with s.keys
  if (lane == 0) s.keys[warp] = m;
  __syncthreads();
  m = s.keys[0];
#pragma unroll
  for (int w = 1; w < routing_warps; ++w) m = max(m, s.keys[w]);
  return m;
}

// fmaxf ignores a NaN, as std::max(running, x) does on the CPU.
__device__ float block_max_float(float v, routing_scratch& s) {
  v = warp_max(v);
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  __syncthreads();
  if (lane == 0) s.maxima[warp] = v;
  __syncthreads();
  v = s.maxima[0];
#pragma unroll
  for (int w = 1; w < routing_warps; ++w) v = fmaxf(v, s.maxima[w]);
  return v;
}

__device__ double block_sum(double v, routing_scratch& s) {
#pragma unroll
  for (int offset = warp_size / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(full_warp, v, offset);
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  __syncthreads();
  if (lane == 0) s.sums[warp] = v;
  __syncthreads();
  v = 0.0;
#pragma unroll
  for (int w = 0; w < routing_warps; ++w) v += s.sums[w];
  return v;
}

struct routing_args {
  const float* logits;           // [tokens, num_experts], row stride logits_stride
  const float* correction_bias;  // [num_experts] or null
  std::int32_t* experts;         // [tokens, top_k]
  float* weights;                // [tokens, top_k]
  std::int64_t num_experts, top_k, logits_stride;
  std::int64_t groups, top_groups;  // groups > 1: group-limited (sigmoid only)
  bool sigmoid, normalize;
  float scaling;
};

__global__ void __launch_bounds__(routing_threads) moe_routing_kernel(routing_args a) {
  __shared__ routing_scratch s;
  const std::int64_t t = blockIdx.x;
  const float* logits = a.logits + t * a.logits_stride;
  const int tid = static_cast<int>(threadIdx.x);
  const auto n = static_cast<int>(a.num_experts);

  // Item j of this thread is expert tid + j * routing_threads.
  float score[routing_items];
  float choice[routing_items];
  if (!a.sigmoid) {
    float m = -INFINITY;
#pragma unroll
    for (int j = 0; j < routing_items; ++j) {
      const int e = tid + j * routing_threads;
      if (e < n) m = fmaxf(m, logits[e]);
    }
    m = block_max_float(m, s);
    double total = 0.0;
#pragma unroll
    for (int j = 0; j < routing_items; ++j) {
      const int e = tid + j * routing_threads;
      score[j] = e < n ? expf(logits[e] - m) : 0.0f;
      if (e < n) total += score[j];
    }
    total = block_sum(total, s);
#pragma unroll
    for (int j = 0; j < routing_items; ++j) choice[j] = score[j] = static_cast<float>(score[j] / total);
  } else {
#pragma unroll
    for (int j = 0; j < routing_items; ++j) {
      const int e = tid + j * routing_threads;
      score[j] = e < n ? 1.0f / (1.0f + expf(-logits[e])) : 0.0f;
      choice[j] = score[j] + (e < n && a.correction_bias != nullptr ? a.correction_bias[e] : 0.0f);
    }
    if (a.groups > 1) {
      const auto groups = static_cast<int>(a.groups);
      const int size = n / groups;
#pragma unroll
      for (int j = 0; j < routing_items; ++j) {
        const int e = tid + j * routing_threads;
        if (e < n) s.choice[e] = choice[j];
      }
      __syncthreads();
      // Group g is item j of thread g % routing_threads, like the experts.
      std::uint64_t group_key[routing_items];
#pragma unroll
      for (int j = 0; j < routing_items; ++j) {
        const int g = tid + j * routing_threads;
        group_key[j] = g < groups ? keys::rank_key(keys::group_score(s.choice + g * size, size), g) : keys::taken;
        if (g < groups) s.kept[g] = false;
      }
      for (std::int64_t round = 0; round < a.top_groups; ++round) {
        std::uint64_t best = keys::taken;
#pragma unroll
        for (int j = 0; j < routing_items; ++j) best = max(best, group_key[j]);
        best = block_max(best, s);
        // Keys are unique: the one equal to the best is the chosen group's, on its thread.
#pragma unroll
        for (int j = 0; j < routing_items; ++j) {
          if (group_key[j] == best) {
            group_key[j] = keys::taken;
            s.kept[keys::id_of(best)] = true;
          }
        }
      }
      __syncthreads();
      // Experts outside the kept groups rank as 0, as transformers masks them.
#pragma unroll
      for (int j = 0; j < routing_items; ++j) {
        const int e = tid + j * routing_threads;
        if (e < n && !s.kept[e / size]) choice[j] = 0.0f;
      }
    }
  }

  std::uint64_t key[routing_items];
#pragma unroll
  for (int j = 0; j < routing_items; ++j) {
    const int e = tid + j * routing_threads;
    key[j] = e < n ? keys::rank_key(choice[j], e) : keys::taken;
  }
  std::int32_t* experts = a.experts + t * a.top_k;
  for (std::int64_t i = 0; i < a.top_k; ++i) {
    std::uint64_t best = keys::taken;
#pragma unroll
    for (int j = 0; j < routing_items; ++j) best = max(best, key[j]);
    best = block_max(best, s);
#pragma unroll
    for (int j = 0; j < routing_items; ++j) {
      if (key[j] == best) {
        key[j] = keys::taken;
        s.chosen[i] = score[j];
        experts[i] = keys::id_of(best);
      }
    }
  }
  __syncthreads();
  if (tid == 0) {
    keys::finish_weights(s.chosen, a.top_k, a.normalize, a.sigmoid, a.scaling);
    float* weights = a.weights + t * a.top_k;
    for (std::int64_t i = 0; i < a.top_k; ++i) weights[i] = s.chosen[i];
  }
}

}  // namespace

status run_moe_routing(const moe_routing_params& p, const stream& s) {
  EDGE_RETURN_IF_ERROR(detail::check_moe_routing(p));
  if (p.tokens == 0) return {};
  const routing_args a{.logits = p.logits, .correction_bias = p.correction_bias, .experts = p.experts,
                       .weights = p.weights, .num_experts = p.num_experts, .top_k = p.top_k,
                       .logits_stride = p.logits_stride, .groups = p.groups, .top_groups = p.top_groups,
                       .sigmoid = p.scoring == router_scoring::sigmoid, .normalize = p.normalize,
                       .scaling = p.scaling};
  moe_routing_kernel<<<static_cast<unsigned>(p.tokens), routing_threads, 0, native(s)>>>(a);
  return check_launch("moe routing");
}

}  // namespace edge::kernels::cuda
