// On the GPU: NVIDIA's hardware conversions (cvt.rn.satfinite.e4m3x2.f32 and friends, behind
// __nv_fp8_e4m3, __float2bfloat16_rn, __float2half_rn) and our numerics.h compiled as device
// code must both produce, bit for bit, what our encoders and decoders produce on the host
// (a NaN decoded by the hardware only has to be a NaN).
// Exits 0 when every comparison agrees, 1 on a mismatch, 2 when the test cannot run (a CUDA
// error, or device code built for an architecture without FP8 conversions), 77 when there is
// no GPU (a skip).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "edge/kernels/numerics.h"

namespace {

namespace ek = edge::kernels;

constexpr int exit_mismatch = 1;
constexpr int exit_cannot_run = 2;
constexpr int exit_skipped = 77;  // no device here: ctest's SKIP_RETURN_CODE (gpu_test_support.h's rule)
constexpr int threads_per_block = 256;
constexpr std::uint32_t fp8_code_count = 256;
constexpr std::uint32_t half_code_count = 0x1'0000;  // bf16 and fp16

// Encoded forms of n floats, once by the hardware conversion and once by our device code.
struct encode_outputs {
  std::uint8_t* fp8_hw;      // [n]
  std::uint8_t* fp8_ours;    // [n]
  std::uint16_t* bf16_hw;    // [n]
  std::uint16_t* bf16_ours;  // [n]
  std::uint16_t* fp16_hw;    // [n]
  std::uint16_t* fp16_ours;  // [n]
};

__global__ void encode_kernel(const float* inputs /* [n] */, int n, encode_outputs out) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const float x = inputs[i];
    out.fp8_hw[i] = __nv_fp8_e4m3(x).__x;
    out.fp8_ours[i] = ek::float_to_fp8_e4m3(x);
    out.bf16_hw[i] = static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(x)).x;
    out.bf16_ours[i] = ek::float_to_bf16(x);
    out.fp16_hw[i] = static_cast<__half_raw>(__float2half_rn(x)).x;
    out.fp16_ours[i] = ek::float_to_fp16(x);
  }
}

// Decoded values of every code, as float bits, by the hardware path and by our device code.
struct decode_outputs {
  std::uint32_t* fp8_hw;     // [256]
  std::uint32_t* fp8_ours;   // [256]
  std::uint32_t* bf16_hw;    // [65536]
  std::uint32_t* bf16_ours;  // [65536]
  std::uint32_t* fp16_hw;    // [65536]
  std::uint32_t* fp16_ours;  // [65536]
};

__global__ void decode_kernel(decode_outputs out) {
  const auto code = static_cast<std::uint32_t>(blockIdx.x * blockDim.x + threadIdx.x);
  if (code >= half_code_count) {
    return;
  }
  if (code < fp8_code_count) {
    __nv_fp8_e4m3 fp8;
    fp8.__x = static_cast<__nv_fp8_storage_t>(code);
    out.fp8_hw[code] = __float_as_uint(static_cast<float>(fp8));
    out.fp8_ours[code] = __float_as_uint(ek::fp8_e4m3_to_float(static_cast<std::uint8_t>(code)));
  }
  __nv_bfloat16_raw bf16_raw;
  bf16_raw.x = static_cast<unsigned short>(code);
  out.bf16_hw[code] = __float_as_uint(__bfloat162float(__nv_bfloat16(bf16_raw)));
  out.bf16_ours[code] = __float_as_uint(ek::bf16_to_float(static_cast<std::uint16_t>(code)));
  __half_raw fp16_raw;
  fp16_raw.x = static_cast<unsigned short>(code);
  out.fp16_hw[code] = __float_as_uint(__half2float(__half(fp16_raw)));
  out.fp16_ours[code] = __float_as_uint(ek::fp16_to_float(static_cast<std::uint16_t>(code)));
}

// The architecture the running device code was compiled for: below sm_89, cuda_fp8.h falls
// back to its software conversion and the hardware would not be tested at all.
__global__ void compiled_arch_kernel(int* arch) {
#if defined(__CUDA_ARCH__)  // only the device pass defines it
  *arch = __CUDA_ARCH__;
#endif
}

constexpr int first_arch_with_fp8_cvt = 890;

bool cuda_ok(cudaError_t result, const char* what) {
  if (result != cudaSuccess) {
    std::fprintf(stderr, "numerics_gpu_test: %s failed: %s (%s)\n", what, cudaGetErrorName(result),
                 cudaGetErrorString(result));
    return false;
  }
  return true;
}

// Device memory for `count` elements of T, freed on scope exit.
template <typename T>
class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() {
    if (data_ != nullptr) {
      cuda_ok(cudaFree(data_), "cudaFree");
    }
  }

  bool allocate(std::size_t count) {
    count_ = count;
    return cuda_ok(cudaMalloc(&data_, count * sizeof(T)), "cudaMalloc");
  }
  bool upload(const std::vector<T>& host) {
    return cuda_ok(cudaMemcpy(data_, host.data(), count_ * sizeof(T), cudaMemcpyHostToDevice),
                   "cudaMemcpy to device");
  }
  bool download(std::vector<T>& host) const {
    host.resize(count_);
    return cuda_ok(cudaMemcpy(host.data(), data_, count_ * sizeof(T), cudaMemcpyDeviceToHost),
                   "cudaMemcpy to host");
  }
  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
  std::size_t count_ = 0;
};

float float_from_bits(std::uint32_t bits) { return ek::bit_cast_float(bits); }

// Special values, every FP8 code's value with the midpoints to its neighbour and the floats
// just either side, then one million random floats from a fixed seed: raw 32-bit patterns
// and patterns with exponents in the FP8 and FP16 ranges, where rounding edges lie.
std::vector<float> make_inputs() {
  std::vector<float> inputs;
  for (const std::uint32_t bits :
       {0x0000'0000u, 0x0000'0001u, 0x0000'8000u, 0x007F'FFFFu, 0x0080'0000u, 0x7F7F'FFFFu,
        0x7F7F'8000u, 0x7F80'0000u, 0x7F80'0001u, 0x7FA0'0000u, 0x7FC0'0000u, 0x7FFF'FFFFu,
        0x43E8'0000u /* 464 */, 0x477F'F000u /* 65520 */}) {
    inputs.push_back(float_from_bits(bits));
    inputs.push_back(float_from_bits(bits | 0x8000'0000u));
  }
  constexpr float inf = std::numeric_limits<float>::infinity();
  for (std::uint32_t code = 0; code < fp8_code_count; ++code) {
    const float a = ek::fp8_e4m3_to_float(static_cast<std::uint8_t>(code));
    inputs.push_back(a);
    const auto next_code = static_cast<std::uint8_t>(code + 1);
    if ((code & 0x7Fu) < ek::fp8_e4m3_traits::max_code) {
      const float midpoint = (a + ek::fp8_e4m3_to_float(next_code)) / 2.0f;
      inputs.push_back(midpoint);
      inputs.push_back(std::nextafter(midpoint, inf));
      inputs.push_back(std::nextafter(midpoint, -inf));
    }
  }

  constexpr int raw_count = 400'000;
  constexpr int fp8_band_count = 300'000;
  constexpr int fp16_band_count = 300'000;
  std::mt19937 rng(0x6E0'0001u);
  const auto banded = [&rng](std::uint32_t low_exponent, std::uint32_t high_exponent) {
    const std::uint32_t exponent =
        low_exponent + static_cast<std::uint32_t>(rng()) % (high_exponent - low_exponent + 1);
    const std::uint32_t sign_and_mantissa = static_cast<std::uint32_t>(rng()) & 0x807F'FFFFu;
    return float_from_bits(sign_and_mantissa | (exponent << 23));
  };
  for (int i = 0; i < raw_count; ++i) {
    inputs.push_back(float_from_bits(static_cast<std::uint32_t>(rng())));
  }
  for (int i = 0; i < fp8_band_count; ++i) {
    inputs.push_back(banded(112, 140));  // 2^-15 .. 2^13
  }
  for (int i = 0; i < fp16_band_count; ++i) {
    inputs.push_back(banded(96, 146));  // 2^-31 .. 2^19
  }
  return inputs;
}

bool is_nan_bits(std::uint32_t float_bits) {
  return (float_bits & ek::fp32_traits::abs_mask) > ek::fp32_traits::inf_bits;
}

// Compares device results with the host's expected values and prints one line per array.
// Everything must match exactly (encoded codes are the bytes a cache stores) except, under
// nan_rule::any_nan for the hardware decodes, a NaN's sign and payload: they carry no value,
// and NVIDIA's device decode (cvt.f32.bf16, cvt.f32.f16) need not keep the bits its host
// path keeps, so such differences are reported without failing the test.
class comparison_report {
 public:
  enum class nan_rule { exact, any_nan };

  template <typename T, typename Expected, typename Label>
  void compare(const char* name, const std::vector<T>& got, Expected expected, Label label,
               nan_rule rule) {
    constexpr int max_examples = 5;
    std::size_t mismatches = 0;
    std::size_t nan_differences = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const auto want = static_cast<std::uint32_t>(expected(i));
      const auto have = static_cast<std::uint32_t>(got[i]);
      if (have == want) {
        continue;
      }
      if (rule == nan_rule::any_nan && is_nan_bits(have) && is_nan_bits(want)) {
        ++nan_differences;
        continue;
      }
      if (mismatches < max_examples) {
        std::printf("    %s: %s -> got 0x%X, host gives 0x%X\n", name, label(i).c_str(), have,
                    want);
      }
      ++mismatches;
    }
    std::printf("  %-42s %8zu compared  %8zu mismatched  %s\n", name, got.size(), mismatches,
                mismatches == 0 ? "ok" : "FAIL");
    if (nan_differences != 0) {
      std::printf("    (%zu NaN results differ from the host's NaN only in sign or payload)\n",
                  nan_differences);
    }
    failed_ = failed_ || mismatches != 0;
  }
  bool failed() const { return failed_; }

 private:
  bool failed_ = false;
};

std::string hex_label(const char* kind, std::uint32_t value) {
  char text[48];
  std::snprintf(text, sizeof text, "%s 0x%X", kind, value);
  return text;
}

int run() {
  int device_count = 0;
  const cudaError_t count_result = cudaGetDeviceCount(&device_count);
  if (count_result != cudaSuccess || device_count == 0) {
    std::fprintf(
        stderr, "numerics_gpu_test: no usable CUDA device (%s); this test needs a GPU\n",
        count_result != cudaSuccess ? cudaGetErrorString(count_result) : "device count is 0");
    return exit_skipped;
  }
  cudaDeviceProp properties{};
  if (!cuda_ok(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties")) {
    return exit_cannot_run;
  }
  std::printf("numerics_gpu_test on %s (compute capability %d.%d)\n", properties.name,
              properties.major, properties.minor);

  device_buffer<int> device_arch;
  std::vector<int> compiled_arch;
  if (!device_arch.allocate(1)) {
    return exit_cannot_run;
  }
  compiled_arch_kernel<<<1, 1>>>(device_arch.get());
  if (!cuda_ok(cudaGetLastError(), "compiled_arch_kernel launch") ||
      !cuda_ok(cudaDeviceSynchronize(), "compiled_arch_kernel") ||
      !device_arch.download(compiled_arch)) {
    return exit_cannot_run;
  }
  std::printf("device code compiled for sm_%d\n", compiled_arch[0] / 10);
  if (compiled_arch[0] < first_arch_with_fp8_cvt) {
    std::fprintf(stderr,
                 "numerics_gpu_test: the hardware FP8 conversions need device code for sm_89 or "
                 "later; check CMAKE_CUDA_ARCHITECTURES\n");
    return exit_cannot_run;
  }

  const std::vector<float> inputs = make_inputs();
  const auto n = static_cast<int>(inputs.size());

  device_buffer<float> device_inputs;
  device_buffer<std::uint8_t> fp8_hw, fp8_ours;
  device_buffer<std::uint16_t> bf16_hw, bf16_ours, fp16_hw, fp16_ours;
  device_buffer<std::uint32_t> dec_fp8_hw, dec_fp8_ours, dec_bf16_hw, dec_bf16_ours, dec_fp16_hw,
      dec_fp16_ours;
  const bool allocated =
      device_inputs.allocate(inputs.size()) && fp8_hw.allocate(inputs.size()) &&
      fp8_ours.allocate(inputs.size()) && bf16_hw.allocate(inputs.size()) &&
      bf16_ours.allocate(inputs.size()) && fp16_hw.allocate(inputs.size()) &&
      fp16_ours.allocate(inputs.size()) && dec_fp8_hw.allocate(fp8_code_count) &&
      dec_fp8_ours.allocate(fp8_code_count) && dec_bf16_hw.allocate(half_code_count) &&
      dec_bf16_ours.allocate(half_code_count) && dec_fp16_hw.allocate(half_code_count) &&
      dec_fp16_ours.allocate(half_code_count);
  if (!allocated || !device_inputs.upload(inputs)) {
    return exit_cannot_run;
  }

  const encode_outputs encoded{fp8_hw.get(),    fp8_ours.get(), bf16_hw.get(),
                               bf16_ours.get(), fp16_hw.get(),  fp16_ours.get()};
  const int encode_blocks = (n + threads_per_block - 1) / threads_per_block;
  encode_kernel<<<encode_blocks, threads_per_block>>>(device_inputs.get(), n, encoded);
  if (!cuda_ok(cudaGetLastError(), "encode_kernel launch") ||
      !cuda_ok(cudaDeviceSynchronize(), "encode_kernel")) {
    return exit_cannot_run;
  }
  const decode_outputs decoded{dec_fp8_hw.get(),    dec_fp8_ours.get(), dec_bf16_hw.get(),
                               dec_bf16_ours.get(), dec_fp16_hw.get(),  dec_fp16_ours.get()};
  decode_kernel<<<half_code_count / threads_per_block, threads_per_block>>>(decoded);
  if (!cuda_ok(cudaGetLastError(), "decode_kernel launch") ||
      !cuda_ok(cudaDeviceSynchronize(), "decode_kernel")) {
    return exit_cannot_run;
  }

  std::vector<std::uint8_t> h_fp8_hw, h_fp8_ours;
  std::vector<std::uint16_t> h_bf16_hw, h_bf16_ours, h_fp16_hw, h_fp16_ours;
  std::vector<std::uint32_t> h_dec_fp8_hw, h_dec_fp8_ours, h_dec_bf16_hw, h_dec_bf16_ours,
      h_dec_fp16_hw, h_dec_fp16_ours;
  const bool downloaded =
      fp8_hw.download(h_fp8_hw) && fp8_ours.download(h_fp8_ours) && bf16_hw.download(h_bf16_hw) &&
      bf16_ours.download(h_bf16_ours) && fp16_hw.download(h_fp16_hw) &&
      fp16_ours.download(h_fp16_ours) && dec_fp8_hw.download(h_dec_fp8_hw) &&
      dec_fp8_ours.download(h_dec_fp8_ours) && dec_bf16_hw.download(h_dec_bf16_hw) &&
      dec_bf16_ours.download(h_dec_bf16_ours) && dec_fp16_hw.download(h_dec_fp16_hw) &&
      dec_fp16_ours.download(h_dec_fp16_ours);
  if (!downloaded) {
    return exit_cannot_run;
  }

  const auto input_label = [&inputs](std::size_t i) {
    return hex_label("float bits", ek::bit_cast_u32(inputs[i]));
  };
  const auto code_label = [](std::size_t i) {
    return hex_label("code", static_cast<std::uint32_t>(i));
  };
  const auto host_fp8 = [&inputs](std::size_t i) { return ek::float_to_fp8_e4m3(inputs[i]); };
  const auto host_bf16 = [&inputs](std::size_t i) { return ek::float_to_bf16(inputs[i]); };
  const auto host_fp16 = [&inputs](std::size_t i) { return ek::float_to_fp16(inputs[i]); };
  const auto host_fp8_decode = [](std::size_t i) {
    return ek::bit_cast_u32(ek::fp8_e4m3_to_float(static_cast<std::uint8_t>(i)));
  };
  const auto host_bf16_decode = [](std::size_t i) {
    return ek::bit_cast_u32(ek::bf16_to_float(static_cast<std::uint16_t>(i)));
  };
  const auto host_fp16_decode = [](std::size_t i) {
    return ek::bit_cast_u32(ek::fp16_to_float(static_cast<std::uint16_t>(i)));
  };

  comparison_report report;
  using nan_rule = comparison_report::nan_rule;
  std::printf("device result vs host numerics.h, bit for bit:\n");
  report.compare("fp8 e4m3 encode, __nv_fp8_e4m3 (hardware)", h_fp8_hw, host_fp8, input_label,
                 nan_rule::exact);
  report.compare("fp8 e4m3 encode, numerics.h on device", h_fp8_ours, host_fp8, input_label,
                 nan_rule::exact);
  report.compare("fp8 e4m3 decode, __nv_fp8_e4m3 (hardware)", h_dec_fp8_hw, host_fp8_decode,
                 code_label, nan_rule::any_nan);
  report.compare("fp8 e4m3 decode, numerics.h on device", h_dec_fp8_ours, host_fp8_decode,
                 code_label, nan_rule::exact);
  report.compare("bf16 encode, __float2bfloat16_rn", h_bf16_hw, host_bf16, input_label,
                 nan_rule::exact);
  report.compare("bf16 encode, numerics.h on device", h_bf16_ours, host_bf16, input_label,
                 nan_rule::exact);
  report.compare("bf16 decode, __bfloat162float", h_dec_bf16_hw, host_bf16_decode, code_label,
                 nan_rule::any_nan);
  report.compare("bf16 decode, numerics.h on device", h_dec_bf16_ours, host_bf16_decode, code_label,
                 nan_rule::exact);
  report.compare("fp16 encode, __float2half_rn", h_fp16_hw, host_fp16, input_label,
                 nan_rule::exact);
  report.compare("fp16 encode, numerics.h on device", h_fp16_ours, host_fp16, input_label,
                 nan_rule::exact);
  report.compare("fp16 decode, __half2float", h_dec_fp16_hw, host_fp16_decode, code_label,
                 nan_rule::any_nan);
  report.compare("fp16 decode, numerics.h on device", h_dec_fp16_ours, host_fp16_decode, code_label,
                 nan_rule::exact);

  std::printf("numerics_gpu_test: %s (%d inputs, all fp8/bf16/fp16 codes)\n",
              report.failed() ? "FAILED" : "PASSED", n);
  return report.failed() ? exit_mismatch : 0;
}

}  // namespace

int main() { return run(); }
