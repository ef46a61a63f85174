// The CUDA implementations of the ops, as the ops' run_<op>() reach them for a stream whose
// `where` is device::cuda. Every pointer in the params is then a device pointer (a
// cudaMalloc'ed buffer), and the work is queued on stream::cuda_stream without waiting for it.
//
// Free of CUDA headers, so the CPU files can route to these; without CUDA in the build
// (EDGE_CUDA=OFF, or no nvcc) each returns failed_precondition and cuda_device_count() is 0.
//
// What the CPU paths check by reading their inputs (token ids, KV slots, block tables) cannot be
// checked here without a copy back from the device: the CUDA kernels leave an out-of-range id
// or slot alone (the row is zeroed or the write skipped) instead of touching memory outside
// the buffers, and the caller (cuda_executor) checks those values on the host before uploading
// them. Shapes, dtypes and limits are checked as on the CPU.
#pragma once

#include <string>

#include "edge/common/status.h"
#include "edge/kernels/stream.h"
#include "kernels/embedding/embedding.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/matmul/matmul.h"
#include "kernels/mla_attention/mla_attention.h"
#include "kernels/moe_experts/moe_experts.h"
#include "kernels/moe_routing/moe_routing.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/quantize/quantize.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/sampling/sampling.h"
#include "kernels/silu_mul/silu_mul.h"

namespace edge::kernels::cuda {

// Whether this build holds the CUDA kernels.
bool compiled();

// CUDA devices this process can use: 0 without CUDA in the build, without a driver or without
// a device; `why_none` (when given) then says which.
int device_count(std::string* why_none = nullptr);

status run_embedding(const embedding_params& p, const stream& s);
status run_rmsnorm(const rmsnorm_params& p, const stream& s);
status run_rope(const rope_params& p, const stream& s);
status run_silu_mul(const silu_mul_params& p, const stream& s);
status run_matmul(const matmul_params& p, const stream& s);
status run_head_matmul(const head_matmul_params& p, const stream& s);
status run_quantize(const quantize_params& p, const stream& s);
status run_dequantize(const dequantize_params& p, const stream& s);
status run_kv_cache_write(const kv_cache_write_params& p, const stream& s);
status run_kv_block_copy(const kv_block_copy_params& p, const stream& s);
status run_paged_attention(const paged_attention_params& p, const stream& s);
status run_sampling(const sampling_params& p, const stream& s);
status run_moe_routing(const moe_routing_params& p, const stream& s);
status run_moe_experts(const moe_experts_params& p, const stream& s);
status run_mla_attention(const mla_attention_params& p, const stream& s);
status run_dsa_select(const dsa_select_params& p, const stream& s);

}  // namespace edge::kernels::cuda
