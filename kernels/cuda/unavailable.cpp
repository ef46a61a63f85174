// The CUDA launchers of a build without CUDA: every op on a CUDA stream is refused with a
// clear message, and no device is ever reported.
#include "kernels/cuda/launchers.h"

namespace edge::kernels::cuda {
namespace {

status not_built() { return failed_precondition("edgeinfer was built without CUDA (nvcc was not found at build time)"); }

}  // namespace

bool compiled() { return false; }

int device_count(std::string* why_none) {
  if (why_none != nullptr) *why_none = "edgeinfer was built without CUDA";
  return 0;
}

status run_embedding(const embedding_params&, const stream&) { return not_built(); }
status run_rmsnorm(const rmsnorm_params&, const stream&) { return not_built(); }
status run_rope(const rope_params&, const stream&) { return not_built(); }
status run_silu_mul(const silu_mul_params&, const stream&) { return not_built(); }
status run_matmul(const matmul_params&, const stream&) { return not_built(); }
status run_head_matmul(const head_matmul_params&, const stream&) { return not_built(); }
status run_quantize(const quantize_params&, const stream&) { return not_built(); }
status run_dequantize(const dequantize_params&, const stream&) { return not_built(); }
status run_kv_cache_write(const kv_cache_write_params&, const stream&) { return not_built(); }
status run_kv_block_copy(const kv_block_copy_params&, const stream&) { return not_built(); }
status run_paged_attention(const paged_attention_params&, const stream&) { return not_built(); }
status run_sampling(const sampling_params&, const stream&) { return not_built(); }
status run_moe_routing(const moe_routing_params&, const stream&) { return not_built(); }
status run_moe_experts(const moe_experts_params&, const stream&) { return not_built(); }
status run_mla_attention(const mla_attention_params&, const stream&) { return not_built(); }
status run_dsa_select(const dsa_select_params&, const stream&) { return not_built(); }

}  // namespace edge::kernels::cuda
