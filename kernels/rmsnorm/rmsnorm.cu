// CUDA RMSNorm with the residual add fused in front: one block per row; the row's sum of
// squares is reduced across the block in float (a fixed order for a given row length, though
// not the CPU's 16-lane order: results agree to float rounding, tests/gpu states the bound).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace edge::kernels::cuda {
namespace {

constexpr int rmsnorm_threads = 256;
constexpr int rmsnorm_warps = rmsnorm_threads / warp_size;

__global__ void __launch_bounds__(rmsnorm_threads)
    rmsnorm_kernel(float* x,  // [rows, cols], row stride x_stride; may be out (not restrict)
                   const float* __restrict__ residual,  // [rows, cols] or null
                   const std::int64_t* __restrict__ row_index,  // [rows] or null (no residual then)
                   const float* __restrict__ weight,    // [cols]
                   float* out,                          // [rows, cols], row stride out_stride; may be x
                   std::int64_t cols, std::int64_t groups, std::int64_t x_stride, std::int64_t out_stride,
                   float eps, bool center, const float* __restrict__ bias) {
  __shared__ float partial[rmsnorm_warps];
  // One block per (row, group): group g of a row is its g-th vector of cols.
  const std::int64_t row = blockIdx.x / groups;
  const std::int64_t group = blockIdx.x % groups;
  float* xr = x + (row_index != nullptr ? row_index[row] : row) * x_stride + group * cols;
  // The block's sum of term(x[i]), through the warps' partials (a barrier before reusing them).
  const auto block_sum = [&](auto term) {
    float sum = 0.0f;
    for (std::int64_t i = threadIdx.x; i < cols; i += rmsnorm_threads) sum += term(xr[i]);
    sum = warp_sum(sum);
    const int warp = static_cast<int>(threadIdx.x) / warp_size;
    const int lane = static_cast<int>(threadIdx.x) % warp_size;
    __syncthreads();
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (warp == 0) {
      sum = lane < rmsnorm_warps ? partial[lane] : 0.0f;
      sum = warp_sum(sum);
      if (lane == 0) partial[0] = sum;
    }
    __syncthreads();
    return partial[0];
  };
  if (residual != nullptr) {
    for (std::int64_t i = threadIdx.x; i < cols; i += rmsnorm_threads) xr[i] += residual[row * cols + i];
  }
  const float n = static_cast<float>(cols);
  const float mean = center ? block_sum([](float v) { return v; }) / n : 0.0f;
  const float inv_rms = 1.0f / sqrtf(block_sum([mean](float v) { return (v - mean) * (v - mean); }) / n + eps);
  float* orow = out + row * out_stride + group * cols;
  // Each thread reads back only the elements it wrote itself, and the sums' barriers lie between
  // the residual update and this pass, even when out == x.
  for (std::int64_t i = threadIdx.x; i < cols; i += rmsnorm_threads) {
    orow[i] = (xr[i] - mean) * inv_rms * weight[i] + (bias != nullptr ? bias[i] : 0.0f);
  }
}

}  // namespace

status run_rmsnorm(const rmsnorm_params& p, const stream& s) {
  if (p.rows <= 0) return {};
  rmsnorm_kernel<<<static_cast<unsigned>(p.rows * p.groups), rmsnorm_threads, 0, native(s)>>>(
      p.x, p.residual, p.row_index, p.weight, p.out, p.cols, p.groups, p.x_stride, p.out_stride, p.eps, p.center, p.bias);
  return check_launch("rmsnorm");
}

}  // namespace edge::kernels::cuda
