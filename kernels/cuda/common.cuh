// What the CUDA kernels share: status from CUDA errors, the stream, warp reductions, element
// loads that widen any stored dtype to float, cp.async / ldmatrix / mma.sync wrappers, and the
// dispatch that turns a runtime dtype into a template argument (only the combinations a caller
// names are instantiated). Device code only: included by kernels/<op>/<op>.cu, never by a host
// header.
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

// ---- tensor cores and asynchronous copies (sm_80+) ----------------------------------------

__device__ __forceinline__ std::uint32_t shared_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

// Asynchronous copies into shared memory; an invalid source fills the destination with zeros
// (no byte is read, but the address given stays a valid one).
__device__ __forceinline__ void copy_async_16(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void copy_async_4(void* shared, const void* global, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(shared_address(shared)), "l"(global),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most `Pending` of this thread's committed copy groups are still in flight.
template <int Pending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
}

// Four 8x8 matrices of 16-bit values from shared memory (lanes 8m..8m+7 give matrix m's row
// addresses): register m holds row lane / 4, columns 2 (lane % 4) and + 1 of matrix m; with
// .trans, rows 2 (lane % 4) and + 1 of column lane / 4.
__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(shared)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(shared)));
}

// d += a · b over one m16n8k16 step (bf16 in, f32 accumulate).
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], const std::uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ std::uint32_t bf16x2_bits(__nv_bfloat162 v) {
  std::uint32_t bits;
  __builtin_memcpy(&bits, &v, sizeof bits);
  return bits;
}
__device__ __forceinline__ __nv_bfloat162 bf16x2_of(std::uint32_t bits) {
  __nv_bfloat162 v;
  __builtin_memcpy(&v, &bits, sizeof bits);
  return v;
}

// Widens tiles of E4M3 codes in shared memory to bf16 for the tensor cores (exactly: every E4M3
// value is a bf16 value), the block's `threads` threads 16 codes at a time. Tile t's `rows` rows
// of `width` codes, one after another at codes[t], become rows of `row_elements` bf16 (width and
// padding) at tiles[t]; the tiles share their shape and are converted in one pass. Width a
// multiple of 16, every row 16-byte aligned. The caller synchronises before reading the tiles.
template <int Tiles>
__device__ __forceinline__ void fp8_tiles_to_bf16(const unsigned char* const (&codes)[Tiles],
                                                  __nv_bfloat16* const (&tiles)[Tiles], int rows, int width,
                                                  int row_elements, int thread, int threads) {
  const int chunks = width / 16;  // per row
  for (int item = thread; item < rows * chunks; item += threads) {
    const int j = item / chunks;
    const int d0 = (item % chunks) * 16;
#pragma unroll
    for (int t = 0; t < Tiles; ++t) {
      const uint4 raw = *reinterpret_cast<const uint4*>(codes[t] + j * width + d0);
      const std::uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
      std::uint32_t out[8];
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const float2 lo = fp8x2_to_float2(static_cast<std::uint16_t>(words[w] & 0xFFFFu));
        const float2 hi = fp8x2_to_float2(static_cast<std::uint16_t>(words[w] >> 16));
        out[2 * w] = bf16x2_bits(__floats2bfloat162_rn(lo.x, lo.y));
        out[2 * w + 1] = bf16x2_bits(__floats2bfloat162_rn(hi.x, hi.y));
      }
      auto* dst = reinterpret_cast<uint4*>(tiles[t] + j * row_elements + d0);
      dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
      dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
    }
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
