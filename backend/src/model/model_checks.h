// Plausibility checks on hyperparameters, shared by every format, and the Llama 3 RoPE
// frequency factors (written by make-model into GGUFs, recognised when loading them).
#pragma once

#include <vector>

#include "edge/backend/model/model_config.h"
#include "edge/common/status.h"

namespace edge::backend {

// invalid_argument naming the first value out of range (every size positive and bounded, heads
// divisible by KV heads, an even head_dim, positive epsilon and theta). The bounds keep every
// product of two sizes far from overflowing.
status check_config(const model_config& config);
status check_rope_scaling(const rope_scaling_llama3& scaling);
status check_rope_scaling(const rope_scaling_yarn& scaling);
// The latent attention's widths against the CPU kernel's limits, and DSA's indexer.
status check_mla(const model_config& config);
// The experts, their groups and the sparse layers (fields named as transformers names them).
status check_moe(const moe_config& moe, std::int64_t num_layers);

// What llama.cpp stores as rope_freqs.weight for Llama 3 scaling: per rotated pair i of a head
// (head_dim / 2 of them), the divisor applied to the frequency theta^(-2i / head_dim).
std::vector<float> llama3_rope_factors(const rope_scaling_llama3& scaling, double rope_theta, std::int64_t head_dim);

}  // namespace edge::backend
