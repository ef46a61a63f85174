// CUDA SwiGLU gate: element-wise over a grid-stride loop. expf is the accurate exponential
// (no fast-math), so results agree with the CPU's std::exp to a few ulp.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace edge::kernels::cuda {
namespace {

constexpr int silu_threads = 256;
constexpr std::int64_t max_silu_blocks = 65535;

__global__ void silu_mul_kernel(const float* gate,  // [rows, cols], row stride in_stride
                                const float* up,    // [rows, cols], row stride in_stride
                                float* out,         // [rows, cols], row stride out_stride; may be gate
                                std::int64_t rows, std::int64_t cols, std::int64_t in_stride,
                                std::int64_t out_stride) {
  const std::int64_t total = rows * cols;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / cols;
    const std::int64_t c = i % cols;
    const float g = gate[r * in_stride + c];
    out[r * out_stride + c] = g / (1.0f + expf(-g)) * up[r * in_stride + c];
  }
}

}  // namespace

status run_silu_mul(const silu_mul_params& p, const stream& s) {
  if (p.cols < 0 || p.in_stride < p.cols || p.out_stride < p.cols) return invalid_argument("silu_mul: bad shape or strides");
  if (p.rows <= 0 || p.cols == 0) return {};
  const std::int64_t blocks = std::min(max_silu_blocks, ceil_div(p.rows * p.cols, silu_threads));
  silu_mul_kernel<<<static_cast<unsigned>(blocks), silu_threads, 0, native(s)>>>(p.gate, p.up, p.out, p.rows, p.cols,
                                                                                 p.in_stride, p.out_stride);
  return check_launch("silu_mul");
}

}  // namespace edge::kernels::cuda
