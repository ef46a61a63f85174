// Our conversions against NVIDIA's own, bit for bit. Built by the host compiler, so the CUDA
// headers take their host path (a software implementation of what the hardware does); the
// device side is checked by tests/gpu/numerics_gpu_test.cu.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "edge/kernels/numerics.h"

namespace {

using edge::kernels::bit_cast_float;
using edge::kernels::bit_cast_u32;

std::string hex(std::uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%X", value);
  return text;
}

std::uint32_t nvidia_fp8_e4m3(float x) {
  return __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
}

// The class constructor is what kernels using NVIDIA's types call; it should not differ
// from the free function, and checking both keeps this test honest if it ever does.
std::uint32_t nvidia_fp8_e4m3_class(float x) { return __nv_fp8_e4m3(x).__x; }

float nvidia_fp8_e4m3_decode(std::uint8_t code) {
  __nv_fp8_e4m3 value;
  value.__x = code;
  return static_cast<float>(value);
}

std::uint32_t nvidia_bf16(float x) {
  return static_cast<__nv_bfloat16_raw>(__float2bfloat16_rn(x)).x;
}

float nvidia_bf16_decode(std::uint16_t code) {
  __nv_bfloat16_raw raw;
  raw.x = code;
  return __bfloat162float(__nv_bfloat16(raw));
}

std::uint32_t nvidia_fp16(float x) { return static_cast<__half_raw>(__float2half_rn(x)).x; }

float nvidia_fp16_decode(std::uint16_t code) {
  __half_raw raw;
  raw.x = code;
  return __half2float(__half(raw));
}

// Zeros, infinities, NaNs of both signs and payload kinds, float subnormals and the extremes.
std::vector<float> special_floats() {
  std::vector<float> values;
  for (const std::uint32_t bits :
       {0x0000'0000u, 0x0000'0001u, 0x0000'8000u, 0x0000'8001u, 0x007F'FFFFu, 0x0080'0000u,
        0x7F7F'FFFFu, 0x7F7F'7FFFu, 0x7F7F'8000u, 0x7F80'0000u, 0x7F80'0001u, 0x7FA0'0000u,
        0x7FC0'0000u, 0x7FFF'FFFFu}) {
    values.push_back(bit_cast_float(bits));
    values.push_back(bit_cast_float(bits | 0x8000'0000u));
  }
  return values;
}

// Every code's value and, for each pair of neighbours, their midpoint and the floats just
// either side of it: the inputs where a rounding mistake shows.
template <typename Decode>
std::vector<float> codes_and_midpoints(std::uint32_t code_count, Decode decode) {
  std::vector<float> values;
  for (std::uint32_t code = 0; code < code_count; ++code) {
    const float a = decode(code);
    values.push_back(a);
    if (code + 1 < code_count) {
      const float b = decode(code + 1);
      if (std::isfinite(a) && std::isfinite(b) && std::signbit(a) == std::signbit(b)) {
        const float midpoint = static_cast<float>((static_cast<double>(a) + b) / 2.0);
        values.push_back(midpoint);
        values.push_back(std::nextafter(midpoint, 0.0f));
        values.push_back(std::nextafter(
            midpoint, std::copysign(std::numeric_limits<float>::infinity(), midpoint)));
      }
    }
  }
  return values;
}

// A million raw 32-bit patterns and a million with the exponent drawn from
// [band_low, band_high], where the target format's range and its edges lie.
std::vector<float> random_floats(std::uint32_t seed, int band_low, int band_high) {
  constexpr int count_each = 1'000'000;
  std::mt19937 rng(seed);
  std::vector<float> values;
  values.reserve(2 * count_each);
  const auto band_width = static_cast<std::uint32_t>(band_high - band_low + 1);
  for (int i = 0; i < count_each; ++i) {
    values.push_back(bit_cast_float(static_cast<std::uint32_t>(rng())));
    const std::uint32_t exponent =
        static_cast<std::uint32_t>(band_low) + static_cast<std::uint32_t>(rng()) % band_width;
    const std::uint32_t sign_and_mantissa = static_cast<std::uint32_t>(rng()) & 0x807F'FFFFu;
    values.push_back(bit_cast_float(sign_and_mantissa | (exponent << 23)));
  }
  return values;
}

template <typename Ours, typename Theirs>
void check_encoders_agree(const std::vector<float>& inputs, Ours ours, Theirs theirs) {
  std::size_t mismatches = 0;
  std::uint32_t first_input = 0;
  std::uint32_t first_ours = 0;
  std::uint32_t first_theirs = 0;
  for (const float x : inputs) {
    const std::uint32_t a = ours(x);
    const std::uint32_t b = theirs(x);
    if (a != b) {
      if (mismatches == 0) {
        first_input = bit_cast_u32(x);
        first_ours = a;
        first_theirs = b;
      }
      ++mismatches;
    }
  }
  INFO("inputs: " << inputs.size() << ", first mismatch: float bits " << hex(first_input)
                  << ", ours " << hex(first_ours) << ", NVIDIA " << hex(first_theirs));
  CHECK(mismatches == 0);
}

template <typename Ours, typename Theirs>
void check_decoders_agree(std::uint32_t code_count, Ours ours, Theirs theirs) {
  std::size_t mismatches = 0;
  std::uint32_t first_code = 0;
  for (std::uint32_t code = 0; code < code_count; ++code) {
    if (bit_cast_u32(ours(code)) != bit_cast_u32(theirs(code))) {
      if (mismatches == 0) {
        first_code = code;
      }
      ++mismatches;
    }
  }
  INFO("first mismatch at code " << hex(first_code) << ": ours "
                                 << hex(bit_cast_u32(ours(first_code))) << ", NVIDIA "
                                 << hex(bit_cast_u32(theirs(first_code))));
  CHECK(mismatches == 0);
}

std::vector<float> concat(std::vector<float> a, const std::vector<float>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("fp8 e4m3 matches NVIDIA: all 256 decodes") {
  check_decoders_agree(
      256,
      [](std::uint32_t c) {
        return edge::kernels::fp8_e4m3_to_float(static_cast<std::uint8_t>(c));
      },
      [](std::uint32_t c) { return nvidia_fp8_e4m3_decode(static_cast<std::uint8_t>(c)); });
}

TEST_CASE("fp8 e4m3 matches NVIDIA (__NV_SATFINITE): codes, midpoints, specials, random") {
  const auto decode = [](std::uint32_t c) {
    return edge::kernels::fp8_e4m3_to_float(static_cast<std::uint8_t>(c));
  };
  // 2^-15 .. 2^13: underflow, subnormals, normals and saturation.
  const std::vector<float> inputs =
      concat(concat(codes_and_midpoints(256, decode), special_floats()),
             random_floats(0xE4'3002u, 112, 140));
  check_encoders_agree(inputs, edge::kernels::float_to_fp8_e4m3, nvidia_fp8_e4m3);
  check_encoders_agree(inputs, edge::kernels::float_to_fp8_e4m3, nvidia_fp8_e4m3_class);
}

TEST_CASE("bf16 matches NVIDIA: all 65536 decodes") {
  check_decoders_agree(
      0x1'0000,
      [](std::uint32_t c) { return edge::kernels::bf16_to_float(static_cast<std::uint16_t>(c)); },
      [](std::uint32_t c) { return nvidia_bf16_decode(static_cast<std::uint16_t>(c)); });
}

TEST_CASE("bf16 matches __float2bfloat16_rn: codes, midpoints, specials, random") {
  const auto decode = [](std::uint32_t c) {
    return edge::kernels::bf16_to_float(static_cast<std::uint16_t>(c));
  };
  const std::vector<float> inputs =
      concat(concat(codes_and_midpoints(0x1'0000, decode), special_floats()),
             random_floats(0xBF16'0002u, 0, 255));
  check_encoders_agree(inputs, edge::kernels::float_to_bf16, nvidia_bf16);
}

TEST_CASE("fp16 matches NVIDIA: all 65536 decodes") {
  check_decoders_agree(
      0x1'0000,
      [](std::uint32_t c) { return edge::kernels::fp16_to_float(static_cast<std::uint16_t>(c)); },
      [](std::uint32_t c) { return nvidia_fp16_decode(static_cast<std::uint16_t>(c)); });
}

TEST_CASE("fp16 matches __float2half_rn: codes, midpoints, specials, random") {
  const auto decode = [](std::uint32_t c) {
    return edge::kernels::fp16_to_float(static_cast<std::uint16_t>(c));
  };
  // 2^-31 .. 2^19: underflow, subnormals, normals and overflow to infinity.
  const std::vector<float> inputs =
      concat(concat(codes_and_midpoints(0x1'0000, decode), special_floats()),
             random_floats(0xF16'0002u, 96, 146));
  check_encoders_agree(inputs, edge::kernels::float_to_fp16, nvidia_fp16);
}
