#include "cuda_executor_kernels.h"

#include "kernels/cuda/common.cuh"

namespace edge::backend::cuda_detail {
namespace {

namespace kc = kernels::cuda;

constexpr int helper_threads = 256;
constexpr std::int64_t max_helper_blocks = 65535;
constexpr float inv_two_pow_24 = 1.0f / 16777216.0f;

unsigned blocks_for(std::int64_t count) {
  return static_cast<unsigned>(std::min(max_helper_blocks, std::max<std::int64_t>(1, kc::ceil_div(count, helper_threads))));
}

// SplitMix64 of (seed, index): independent of the launch shape.
__device__ __forceinline__ std::uint64_t mix(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed + 0x9E37'79B9'7F4A'7C15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xBF58'476D'1CE4'E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D0'49BB'1331'11EBull;
  return z ^ (z >> 31);
}

template <kernels::dtype T>
__global__ void fill_uniform_kernel(void* out, std::int64_t count, std::uint64_t seed, float low, float high) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float unit = static_cast<float>(mix(seed, static_cast<std::uint64_t>(i)) >> 40) * inv_two_pow_24;
    kc::store_float<T>(out, i, low + (high - low) * unit);
  }
}

__global__ void fill_constant_kernel(float* out, std::int64_t count, float value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = value;
  }
}

}  // namespace

status fill_uniform(void* out, kernels::dtype type, std::int64_t count, std::uint64_t seed, float low, float high,
                    void* stream) {
  if (count <= 0) return {};
  return kc::dispatch_dtype(type, [&]<kernels::dtype T>() {
    fill_uniform_kernel<T><<<blocks_for(count), helper_threads, 0, static_cast<cudaStream_t>(stream)>>>(out, count, seed,
                                                                                                       low, high);
    return kc::check_launch("fill_uniform");
  });
}

status fill_constant(float* out, std::int64_t count, float value, void* stream) {
  if (count <= 0) return {};
  fill_constant_kernel<<<blocks_for(count), helper_threads, 0, static_cast<cudaStream_t>(stream)>>>(out, count, value);
  return kc::check_launch("fill_constant");
}

}  // namespace edge::backend::cuda_detail
