// The routed experts of a Mixture-of-Experts layer: out[t] += Σ_i weights[t, i] ·
// down_e(silu(gate_e(x[t])) * up_e(x[t])) over token t's chosen experts e = experts[t, i]
// (moe_routing.h chooses them), each expert a SwiGLU block of its own weights in any weight
// format.
//
// The batch's (token, choice) pairs are grouped by expert and each expert that was chosen runs
// once over all its tokens (gathered rows through matmul), so its weights are read once per
// call and an expert nobody chose is never read. A token's contributions are summed in expert
// order and then added to out, so on the CPU its result does not depend on the batch it is in.
//
// On a CUDA stream (moe_experts.cu) the grouping happens on the device, so a call never waits
// for the GPU and can be captured in a CUDA graph: the pairs are counted per expert and placed
// in the CPU's order (moe_experts_order.h), their x rows gathered, and each chosen expert's rows
// run through a grouped matmul whose grid covers only as many experts as the call can have
// chosen (moe_grouped_blocks), their ids compacted on the device. The weights
// then come from `device_matrices`, a device copy of `matrices` that the caller keeps (the
// executor uploads it with the weights); `matrices` stays a host array, read for the checks
// and the formats. There, every expert with weights must share one layout (gate, up and down
// each one format and group size, stacked or apart alike), and at most max_router_experts
// experts and choices per token are allowed (moe_routing.h). The expert ids are device data,
// not checked on the host: a pair whose id lies outside [0, num_experts) is left out (it adds
// nothing and is not counted). The sums are added in the CPU's order with the CPU's rounding,
// so the two agree to the rounding of the matmuls (f32 multiply-adds in another order).
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/stream.h"
#include "edge/kernels/weight_format.h"

namespace edge::kernels {

// One expert's matrices: gate and up stacked in `gate` (up.values null), or apart.
struct moe_expert_weights {
  weight_view gate;  // [intermediate, hidden], or [2 intermediate, hidden]: gate rows, then up rows
  weight_view up;    // [intermediate, hidden], or values null when stacked in gate
  weight_view down;  // [hidden, intermediate]

  bool stacked() const { return up.values == nullptr; }
};

struct moe_experts_params {
  const float* x;                     // [tokens, hidden], row stride x_stride
  const std::int32_t* experts;        // [tokens, top_k] chosen experts
  const float* weights;               // [tokens, top_k] their weights
  const moe_expert_weights* matrices; // [num_experts], in host memory on either device
  float* out;                         // [tokens, hidden], row stride out_stride: the sum is added here
  std::int32_t* expert_tokens = nullptr;  // [num_experts] tokens each expert ran, or null
  std::int64_t tokens = 0;
  std::int64_t top_k = 0;
  std::int64_t num_experts = 0;
  std::int64_t hidden = 0;
  std::int64_t intermediate = 0;
  std::int64_t x_stride = 0;
  std::int64_t out_stride = 0;
  float* workspace = nullptr;    // [workspace_floats]: moe_experts_layout
  std::int64_t workspace_floats = 0;
  const moe_expert_weights* device_matrices = nullptr;  // CUDA: [num_experts], device memory, = matrices
  bool add_expert_tokens = false;  // add this call's counts to expert_tokens rather than write them
};

// Tokens the forward pass runs through the experts at once: each chosen expert's weights are
// read once per chunk, and the workspace stays bounded for long prefills (GLM-4.5-Air: about
// 94 MB at 256 tokens). A call of more tokens than its workspace holds runs them in chunks of
// as many as it holds, at least one.
inline constexpr std::int64_t moe_experts_chunk_tokens = 256;

// Where the parts of the workspace lie, in floats from its start (pairs = tokens × top_k):
//   gathered   [pairs, hidden]           x rows in expert order
//   activation [pairs, 2 intermediate]   gate | up, then silu(gate) · up in the gate half
//   expert_out [pairs, hidden]           each pair's expert output
//   tail: CPU  sums [tokens, hidden]     each token's weighted sum
//         CUDA int32 scratch: begin [num_experts + 1] (each expert's first row, then pairs
//              placed), order [pairs] (the pair of each row), row_of [pairs] (the row of each pair),
//              chosen [num_experts + 1] (the chosen experts in id order, then their count),
//              tile_begin [num_experts + 1] (each chosen expert's first 64-row tile, then the
//              tiles' count: the tensor-core work list, moe_experts_order.h)
struct moe_experts_layout {
  std::int64_t gathered = 0, activation = 0, expert_out = 0, tail = 0, floats = 0;
};

constexpr moe_experts_layout moe_experts_workspace(std::int64_t tokens, std::int64_t top_k, std::int64_t num_experts,
                                                   std::int64_t hidden, std::int64_t intermediate) {
  const std::int64_t pairs = tokens * top_k;
  const std::int64_t sums = tokens * hidden;
  const std::int64_t scratch = 3 * (num_experts + 1) + 2 * pairs;  // int32 and float share a size
  moe_experts_layout l;
  l.activation = l.gathered + pairs * hidden;
  l.expert_out = l.activation + pairs * 2 * intermediate;
  l.tail = l.expert_out + pairs * hidden;
  l.floats = l.tail + (sums > scratch ? sums : scratch);
  return l;
}

// Workspace floats for `tokens` tokens at once, on either device.
constexpr std::int64_t moe_experts_workspace_floats(std::int64_t tokens, std::int64_t top_k, std::int64_t num_experts,
                                                    std::int64_t hidden, std::int64_t intermediate) {
  return moe_experts_workspace(tokens, top_k, num_experts, hidden, intermediate).floats;
}

// The CUDA grouped matmul's grid for one of an expert's matrices of n rows: a block per tile of
// moe_grouped_tile_rows weight rows and per expert a call can have chosen, at most tokens ×
// top_k of them (the device compacts the chosen experts' ids, so a grid slot is a chosen expert,
// not an expert id). At Kimi K2's decode shape (one token, 8 of 384 experts) a layer's gate-up
// and down take 22,528 blocks; a grid over every expert took 1,081,344, of which all but 8 in
// 384 returned at once.
inline constexpr std::int64_t moe_grouped_tile_rows = 4;

constexpr std::int64_t moe_grouped_blocks(std::int64_t n, std::int64_t tokens, std::int64_t top_k,
                                          std::int64_t num_experts) {
  const std::int64_t slots = tokens * top_k < num_experts ? tokens * top_k : num_experts;
  return (n + moe_grouped_tile_rows - 1) / moe_grouped_tile_rows * slots;
}

// Whether the CUDA experts run one of their matrices, of depth k (hidden for gate and up, the
// intermediate width for down), on tensor cores, rounding its x to bf16 as the dense GEMM does:
// 9+ tokens with bf16, fp8 or int4 weights (int4 in groups of 32 or more) and k a multiple of
// 32. (Unlike the dense matmul, INT4 decode of 1..8 tokens stays in f32 here: the GEMV tile.) Each chosen expert's rows then go through the GEMM tile of
// gemm_mma.cuh, 64 of them against 128 weight rows per block, so its weights are read once per
// 64 of its rows instead of once per 4 (prefill); decode, and other formats and shapes, keep the
// f32 GEMV tile. (Weights that start 16-byte aligned, as every device allocation does; others
// take the GEMV tile too.)
constexpr bool cuda_moe_experts_use_tensor_cores(weight_format f, std::int64_t tokens, std::int64_t k,
                                                 std::int64_t group_size) {
  const bool formats = f == weight_format::bf16 || f == weight_format::fp8_e4m3 ||
                       (f == weight_format::int4 && group_size >= 32);
  return tokens > 8 && formats && k % 32 == 0;
}

// invalid_argument for shapes, an expert id outside [0, num_experts) (CPU), a matrix of the
// wrong format for its shape, or a workspace too small for one token; on CUDA also for experts
// of different layouts and a missing device_matrices.
status run_moe_experts(const moe_experts_params& p, const stream& s);

namespace detail {
// The shape, stride and workspace checks of run_moe_experts, the same for either device.
status check_moe_experts(const moe_experts_params& p);
}  // namespace detail

}  // namespace edge::kernels
