// What the CUDA kernels share: status from CUDA errors, the stream, warp reductions, element
// loads that widen any stored dtype to float, and the dispatch that turns a runtime dtype into
// a template argument (only the combinations a caller names are instantiated). Device code
// only: included by kernels/<op>/<op>.cu, never by a host header.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/dtype.h"
#include "edge/kernels/numerics.h"
#include "edge/kernels/stream.h"

namespace edge::kernels::cuda {

constexpr int warp_size = 32;
constexpr unsigned full_warp = 0xFFFF'FFFFu;

inline cudaStream_t native(const stream& s) { return static_cast<cudaStream_t>(s.cuda_stream); }

// A status for a CUDA error ("<what>: cudaErrorX (text)"); ok for cudaSuccess.
status from_cuda(cudaError_t error, const char* what);

// The launch error of the kernel just queued, if any (bad configuration, no device code for
// this GPU). Errors of the kernel's execution surface at the caller's next synchronisation.
status check_launch(const char* op);

// Streaming multiprocessors of the current device (read once per device).
int multiprocessor_count();

// Raises a kernel's dynamic shared memory limit to `bytes` once per process (more than 48 KiB
// needs it). Called before the first launch, outside any graph capture.
status allow_shared_memory(const void* kernel, int bytes);

EDGE_HOST_DEVICE inline std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = warp_size / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(full_warp, v, offset);
  return v;
}

// fmaxf ignores a NaN operand, as std::max(running, x) does in the CPU kernels.
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = warp_size / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(full_warp, v, offset));
  return v;
}

// ---- element loads -------------------------------------------------------------------------

__device__ __forceinline__ float bf16_bits_to_float(std::uint16_t bits) {
  return __uint_as_float(static_cast<std::uint32_t>(bits) << 16);
}

__device__ __forceinline__ float f16_bits_to_float(std::uint16_t bits) {
  __half_raw raw;
  raw.x = bits;
  return __half2float(__half(raw));
}

// Hopper converts E4M3 in hardware (cvt.rn.f16x2.e4m3x2); the values agree with
// fp8_e4m3_to_float (tests/gpu/numerics_gpu_test.cu).
__device__ __forceinline__ float fp8_bits_to_float(std::uint8_t bits) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(bits, __NV_E4M3)));
}

// Two E4M3 codes (low byte first) as two floats.
__device__ __forceinline__ float2 fp8x2_to_float2(std::uint16_t bits) {
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(bits, __NV_E4M3)));
}

// Element `index` of a buffer of stored type T, as float.
template <dtype T>
__device__ __forceinline__ float load_float(const void* base, std::int64_t index) {
  if constexpr (T == dtype::f32) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (T == dtype::bf16) {
    return bf16_bits_to_float(static_cast<const std::uint16_t*>(base)[index]);
  } else if constexpr (T == dtype::f16) {
    return f16_bits_to_float(static_cast<const std::uint16_t*>(base)[index]);
  } else {
    return fp8_bits_to_float(static_cast<const std::uint8_t*>(base)[index]);
  }
}

// Stores `value` as type T, rounded as the host encoders round (numerics.h).
template <dtype T>
__device__ __forceinline__ void store_float(void* base, std::int64_t index, float value) {
  if constexpr (T == dtype::f32) {
    static_cast<float*>(base)[index] = value;
  } else if constexpr (T == dtype::bf16) {
    static_cast<std::uint16_t*>(base)[index] = float_to_bf16(value);
  } else if constexpr (T == dtype::f16) {
    static_cast<std::uint16_t*>(base)[index] = float_to_fp16(value);
  } else {
    static_cast<std::uint8_t*>(base)[index] = float_to_fp8_e4m3(value);
  }
}

// ---- dispatch -------------------------------------------------------------------------------

// Calls f.template operator()<T>() for the runtime dtype.
template <class F>
status dispatch_dtype(dtype type, F&& f) {
  switch (type) {
    case dtype::f32: return f.template operator()<dtype::f32>();
    case dtype::f16: return f.template operator()<dtype::f16>();
    case dtype::bf16: return f.template operator()<dtype::bf16>();
    case dtype::fp8_e4m3: return f.template operator()<dtype::fp8_e4m3>();
  }
  return invalid_argument("unknown dtype");
}

}  // namespace edge::kernels::cuda
