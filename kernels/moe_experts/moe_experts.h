// The routed experts of a Mixture-of-Experts layer: out[t] += Σ_i weights[t, i] ·
// down_e(silu(gate_e(x[t])) * up_e(x[t])) over token t's chosen experts e = experts[t, i]
// (moe_routing.h chooses them), each expert a SwiGLU block of its own weights in any weight
// format.
//
// The batch's (token, choice) pairs are grouped by expert and each expert that was chosen runs
// once over all its tokens (gathered rows through matmul), so its weights are read once per
// call and an expert nobody chose is never read. A token's contributions are summed in expert
// order and then added to out, so on the CPU its result does not depend on the batch it is in.
// CPU only for now: a CUDA stream is refused.
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
  const moe_expert_weights* matrices; // [num_experts]
  float* out;                         // [tokens, hidden], row stride out_stride: the sum is added here
  std::int32_t* expert_tokens = nullptr;  // [num_experts] tokens each expert ran, or null
  std::int64_t tokens = 0;
  std::int64_t top_k = 0;
  std::int64_t num_experts = 0;
  std::int64_t hidden = 0;
  std::int64_t intermediate = 0;
  std::int64_t x_stride = 0;
  std::int64_t out_stride = 0;
  float* workspace = nullptr;    // [workspace_floats]: gathered rows, activations and sums
  std::int64_t workspace_floats = 0;
};

// Tokens the forward pass runs through the experts at once: each chosen expert's weights are
// read once per chunk, and the workspace stays bounded for long prefills (GLM-4.5-Air: about
// 94 MB at 256 tokens).
inline constexpr std::int64_t moe_experts_chunk_tokens = 256;

// Workspace floats for `tokens` tokens at once. A call of more tokens than its workspace holds
// runs them in chunks of as many as it holds, at least one.
constexpr std::int64_t moe_experts_workspace_floats(std::int64_t tokens, std::int64_t top_k, std::int64_t hidden,
                                                    std::int64_t intermediate) {
  return tokens * top_k * (hidden + 2 * intermediate + hidden) + tokens * hidden;
}

// invalid_argument for shapes, an expert id outside [0, num_experts), a matrix of the wrong
// format for its shape, or a workspace too small for one token.
status run_moe_experts(const moe_experts_params& p, const stream& s);

}  // namespace edge::kernels
