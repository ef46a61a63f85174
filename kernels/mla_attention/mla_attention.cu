// CUDA MLA attention and DSA selection.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace edge::kernels::cuda {

status run_mla_attention(const mla_attention_params&, const stream&) {
  return status(status_code::unimplemented, "mla_attention has no CUDA kernel yet");
}

status run_dsa_select(const dsa_select_params&, const stream&) {
  return status(status_code::unimplemented, "dsa_select has no CUDA kernel yet");
}

}  // namespace edge::kernels::cuda
