// CUDA weight quantization (INT4 groups, FP8 rows) and dequantization, one block per row. The
// rounding is the integer-exact code of weight_format.h and IEEE division, so the device writes
// the same bytes and scales as the CPU reference; used to quantize weights on the device
// (cuda_executor's synthetic models) and by the GPU tests.
#include "edge/common/format.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace edge::kernels::cuda {
namespace {

constexpr int quantize_threads = 256;
constexpr int quantize_warps = quantize_threads / warp_size;

// amax of count floats, by one warp; fmaxf ignores NaN as std::max(running, x) does.
__device__ __forceinline__ float warp_amax(const float* x, std::int64_t count, int lane) {
  float amax = 0.0f;
  for (std::int64_t i = lane; i < count; i += warp_size) amax = fmaxf(amax, fabsf(x[i]));
  return warp_max(amax);
}

__global__ void __launch_bounds__(quantize_threads)
    quantize_int4_kernel(const float* __restrict__ x,      // [rows, k], row stride x_stride
                         std::uint8_t* __restrict__ values,  // [rows, int4_row_bytes(k)]
                         float* __restrict__ scales,       // [rows, k / group_size]
                         std::int64_t k, std::int64_t x_stride, std::int64_t group_size) {
  const std::int64_t row = blockIdx.x;
  const float* xr = x + row * x_stride;
  const std::int64_t groups = k / group_size;
  float* row_scales = scales + row * groups;
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  for (std::int64_t g = warp; g < groups; g += quantize_warps) {
    const float amax = warp_amax(xr + g * group_size, group_size, lane);
    if (lane == 0) row_scales[g] = int4_scale(amax);
  }
  // The block's own global writes are visible to it after the barrier.
  __syncthreads();
  const std::int64_t row_bytes = int4_row_bytes(k);
  std::uint8_t* out = values + row * row_bytes;
  for (std::int64_t b = threadIdx.x; b < row_bytes; b += quantize_threads) {
    const std::int64_t low = b / int4_traits::chunk_bytes * int4_traits::chunk_elements + b % int4_traits::chunk_bytes;
    const std::int64_t high = low + int4_traits::half_chunk;
    const int q_low = low < k ? int4_quantize(xr[low], row_scales[low / group_size]) : 0;
    const int q_high = high < k ? int4_quantize(xr[high], row_scales[high / group_size]) : 0;
    out[b] = static_cast<std::uint8_t>((q_low + int4_traits::code_offset) |
                                       ((q_high + int4_traits::code_offset) << int4_traits::nibble_bits));
  }
}

__global__ void __launch_bounds__(quantize_threads)
    quantize_fp8_kernel(const float* __restrict__ x,      // [rows, k], row stride x_stride
                        std::uint8_t* __restrict__ values,  // [rows, k]
                        float* __restrict__ scales,       // [rows]
                        std::int64_t k, std::int64_t x_stride) {
  __shared__ float partial[quantize_warps];
  const std::int64_t row = blockIdx.x;
  const float* xr = x + row * x_stride;
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  float amax = 0.0f;
  for (std::int64_t i = threadIdx.x; i < k; i += quantize_threads) amax = fmaxf(amax, fabsf(xr[i]));
  amax = warp_max(amax);
  if (lane == 0) partial[warp] = amax;
  __syncthreads();
  amax = 0.0f;
#pragma unroll
  for (int w = 0; w < quantize_warps; ++w) amax = fmaxf(amax, partial[w]);
  const float scale = fp8_weight_scale(amax);
  if (threadIdx.x == 0) scales[row] = scale;
  for (std::int64_t i = threadIdx.x; i < k; i += quantize_threads) values[row * k + i] = fp8_weight_code(xr[i], scale);
}

template <weight_format F>
__global__ void __launch_bounds__(quantize_threads)
    dequantize_kernel(weight_view w,                  // the whole matrix [n, k]
                      std::int64_t k, std::int64_t row_begin,
                      float* __restrict__ y,          // [rows, k], row stride y_stride
                      std::int64_t y_stride) {
  const std::int64_t r = blockIdx.x;
  const std::int64_t row = row_begin + r;
  for (std::int64_t i = threadIdx.x; i < k; i += quantize_threads) {
    float value = 0.0f;
    if constexpr (F == weight_format::int4) {
      const auto* packed = static_cast<const std::uint8_t*>(w.values) + row * int4_row_bytes(k);
      value = static_cast<float>(int4_get(packed, i)) * w.scales[row * (k / w.group_size) + i / w.group_size];
    } else if constexpr (F == weight_format::int8) {
      value = static_cast<float>(static_cast<const std::int8_t*>(w.values)[row * k + i]) *
              w.scales[row * (k / int8_traits::group_size) + i / int8_traits::group_size];
    } else if constexpr (F == weight_format::fp8_e4m3) {
      value = fp8_bits_to_float(static_cast<const std::uint8_t*>(w.values)[row * k + i]) * w.scales[row];
    } else if constexpr (F == weight_format::bf16) {
      value = load_float<dtype::bf16>(w.values, row * k + i);
    } else if constexpr (F == weight_format::f16) {
      value = load_float<dtype::f16>(w.values, row * k + i);
    } else {
      value = load_float<dtype::f32>(w.values, row * k + i);
    }
    y[r * y_stride + i] = value;
  }
}

}  // namespace

status run_quantize(const quantize_params& p, const stream& s) {
  if (p.rows < 0 || p.k <= 0 || p.x_stride < p.k) return invalid_argument("quantize: bad shape or stride");
  if (p.format == weight_format::int4 && !valid_int4_group_size(p.group_size, p.k)) {
    return invalid_argument("quantize: the INT4 group size must be a power of two dividing k");
  }
  if (p.format != weight_format::int4 && p.format != weight_format::fp8_e4m3) {
    return invalid_argument("quantize: the device quantizes to int4 or fp8");
  }
  if (p.rows == 0) return {};
  const auto blocks = static_cast<unsigned>(p.rows);
  if (p.format == weight_format::int4) {
    quantize_int4_kernel<<<blocks, quantize_threads, 0, native(s)>>>(p.x, static_cast<std::uint8_t*>(p.values), p.scales,
                                                                      p.k, p.x_stride, p.group_size);
  } else {
    quantize_fp8_kernel<<<blocks, quantize_threads, 0, native(s)>>>(p.x, static_cast<std::uint8_t*>(p.values), p.scales,
                                                                     p.k, p.x_stride);
  }
  return check_launch("quantize");
}

status run_dequantize(const dequantize_params& p, const stream& s) {
  if (p.rows < 0 || p.k <= 0 || p.row_begin < 0 || p.y_stride < p.k) return invalid_argument("dequantize: bad shape or stride");
  if (is_k_quant(p.w.format)) {
    return invalid_argument(format("dequantize: the CUDA kernels do not read {} weights", to_string(p.w.format)));
  }
  if (p.w.layout != weight_layout::rows) return invalid_argument("dequantize: the CUDA kernels read the row layout");
  if (has_scales(p.w.format) && p.w.scales == nullptr) return invalid_argument("dequantize: scales missing");
  if (p.w.format == weight_format::int4 && !valid_int4_group_size(p.w.group_size, p.k)) {
    return invalid_argument("dequantize: the INT4 group size must be a power of two dividing k");
  }
  if (p.rows == 0) return {};
  const auto blocks = static_cast<unsigned>(p.rows);
  const auto launch = [&]<weight_format F>() {
    dequantize_kernel<F><<<blocks, quantize_threads, 0, native(s)>>>(p.w, p.k, p.row_begin, p.y, p.y_stride);
    return check_launch("dequantize");
  };
  switch (p.w.format) {
    case weight_format::f32: return launch.template operator()<weight_format::f32>();
    case weight_format::f16: return launch.template operator()<weight_format::f16>();
    case weight_format::bf16: return launch.template operator()<weight_format::bf16>();
    case weight_format::fp8_e4m3: return launch.template operator()<weight_format::fp8_e4m3>();
    case weight_format::int4: return launch.template operator()<weight_format::int4>();
    case weight_format::int8: return launch.template operator()<weight_format::int8>();
    case weight_format::q4_k:
    case weight_format::q5_k:
    case weight_format::q6_k: break;  // refused above
  }
  return invalid_argument("dequantize: unknown weight format");
}

}  // namespace edge::kernels::cuda
