// Conversions between float and the narrow storage types of the KV cache and the weights:
// FP8 E4M3FN, BF16 and IEEE FP16. Header-only and free of CUDA headers so that the CPU
// reference kernels and the CUDA kernels share one definition of every rounding decision.
//
// Policy: each conversion agrees bit for bit with NVIDIA's conversion for the same type
// (`__nv_fp8_e4m3`, `__float2bfloat16_rn`, `__float2half_rn` and the matching decodes), NaN
// inputs included, so a CPU reference and a CUDA kernel write identical cache bytes
// (tests/unit/kernels checks the CUDA headers' host path, tests/gpu the hardware). All
// encoders round to nearest, ties to even, and are pure integer code so they behave the same
// on the host, in device code and under fast-math flags.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define EDGE_HOST_DEVICE __host__ __device__
#else
#define EDGE_HOST_DEVICE
#endif

namespace edge::kernels {

// __builtin_bit_cast rather than std::bit_cast: nvcc accepts it in device code without
// --expt-relaxed-constexpr, and it keeps the conversions constexpr.
EDGE_HOST_DEVICE constexpr std::uint32_t bit_cast_u32(float value) {
  return __builtin_bit_cast(std::uint32_t, value);
}

EDGE_HOST_DEVICE constexpr float bit_cast_float(std::uint32_t bits) {
  return __builtin_bit_cast(float, bits);
}

struct fp32_traits {
  static constexpr int mantissa_bits = 23;
  static constexpr int exponent_bias = 127;
  static constexpr std::uint32_t sign_mask = 0x8000'0000u;
  static constexpr std::uint32_t abs_mask = 0x7FFF'FFFFu;
  static constexpr std::uint32_t mantissa_mask = 0x007F'FFFFu;
  static constexpr std::uint32_t implicit_bit = 0x0080'0000u;
  static constexpr std::uint32_t inf_bits = 0x7F80'0000u;
  // What NVIDIA's decoders return for any NaN input: positive, all payload bits set.
  static constexpr std::uint32_t canonical_nan_bits = 0x7FFF'FFFFu;
};

// OCP FP8 E4M3FN: no infinities; S.1111.111 is the only NaN, so the top exponent still
// holds the finite values 256..448.
struct fp8_e4m3_traits {
  static constexpr int mantissa_bits = 3;
  static constexpr int exponent_bias = 7;
  static constexpr float max = 448.0f;
  static constexpr float min_normal = 0.015625f;        // 2^-6
  static constexpr float min_subnormal = 0.001953125f;  // 2^-9
  static constexpr std::uint8_t sign_mask = 0x80;
  static constexpr std::uint8_t abs_mask = 0x7F;
  static constexpr std::uint8_t max_code = 0x7E;  // +448
  // NVIDIA encodes every NaN, whatever its sign, as 0x7F; 0xFF decodes as NaN too.
  static constexpr std::uint8_t nan_code = 0x7F;
};

// The top half of a float: same exponent, 7 of its 23 mantissa bits.
struct bf16_traits {
  static constexpr int mantissa_bits = 7;
  static constexpr std::uint16_t inf_code = 0x7F80;
  static constexpr std::uint16_t nan_code = 0x7FFF;
};

struct fp16_traits {
  static constexpr int mantissa_bits = 10;
  static constexpr int exponent_bias = 15;
  static constexpr float max = 65504.0f;
  static constexpr float min_normal = 6.103515625e-05f;            // 2^-14
  static constexpr float min_subnormal = 5.9604644775390625e-08f;  // 2^-24
  static constexpr std::uint16_t sign_mask = 0x8000;
  static constexpr std::uint16_t abs_mask = 0x7FFF;
  static constexpr std::uint16_t inf_code = 0x7C00;
  static constexpr std::uint16_t nan_code = 0x7FFF;
};

namespace numerics_detail {

// Drops the low `shift` bits of `value` with round to nearest, ties to even. A carry out of
// the kept mantissa field lands in the exponent field, which is the correctly rounded result
// (including the step from the largest subnormal to the smallest normal). 1 <= shift <= 31.
EDGE_HOST_DEVICE constexpr std::uint32_t shift_right_rne(std::uint32_t value, int shift) {
  const std::uint32_t kept = value >> shift;
  const std::uint32_t dropped = value & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  const bool round_up = dropped > half || (dropped == half && (kept & 1u) != 0u);
  return kept + (round_up ? 1u : 0u);
}

// Encodes |x| (float bits, not NaN) into a narrow IEEE-like format with `mantissa_bits`
// stored bits and exponent bias `bias`, normals and subnormals, rounding to nearest even.
// Returns the code without its sign bit; above the format's range the result runs past its
// largest code and the caller clamps it to its own overflow rule.
EDGE_HOST_DEVICE constexpr std::uint32_t encode_finite_magnitude(std::uint32_t abs_bits,
                                                                 int mantissa_bits, int bias) {
  const int drop = fp32_traits::mantissa_bits - mantissa_bits;
  const int exponent = static_cast<int>(abs_bits >> fp32_traits::mantissa_bits);
  const int rebias = fp32_traits::exponent_bias - bias;
  if (exponent > rebias) {
    // Normal in the target: move the exponent field to the target bias in place, then
    // round the mantissa.
    return shift_right_rne(
        abs_bits - (static_cast<std::uint32_t>(rebias) << fp32_traits::mantissa_bits), drop);
  }
  // Subnormal in the target (code = |x| / smallest subnormal). Float subnormals and zero
  // are far below half the smallest target subnormal, so they fall in the underflow case.
  const int shift = drop + 1 + rebias - exponent;
  if (shift > fp32_traits::mantissa_bits + 1) {
    return 0u;  // |x| < half the smallest subnormal: rounds to zero
  }
  const std::uint32_t significand =
      (abs_bits & fp32_traits::mantissa_mask) | fp32_traits::implicit_bit;
  return shift_right_rne(significand, shift);
}

// Decodes a narrow code's magnitude (sign, NaN and infinity already handled) to float bits.
EDGE_HOST_DEVICE constexpr std::uint32_t decode_finite_magnitude(std::uint32_t abs_code,
                                                                 int mantissa_bits, int bias) {
  const int rebias = fp32_traits::exponent_bias - bias;
  const int widen = fp32_traits::mantissa_bits - mantissa_bits;
  if ((abs_code >> mantissa_bits) != 0u) {
    return (abs_code << widen) + (static_cast<std::uint32_t>(rebias) << fp32_traits::mantissa_bits);
  }
  if (abs_code == 0u) {
    return 0u;
  }
  // Subnormal: normalise so the leading one becomes float's implicit bit.
  int leading = 0;
  while ((abs_code >> (leading + 1)) != 0u) {
    ++leading;
  }
  const std::uint32_t exponent = static_cast<std::uint32_t>(rebias + 1 + leading - mantissa_bits);
  const std::uint32_t mantissa =
      (abs_code << (fp32_traits::mantissa_bits - leading)) & fp32_traits::mantissa_mask;
  return (exponent << fp32_traits::mantissa_bits) | mantissa;
}

}  // namespace numerics_detail

// ---- FP8 E4M3FN --------------------------------------------------------------------------

// Round to nearest even; finite values beyond 448 and ±inf saturate to ±448 (the
// __NV_SATFINITE behaviour of __nv_fp8_e4m3), since E4M3FN has no infinity and a KV scale
// of amax / 448 keeps real data inside the range anyway. Any NaN gives 0x7F; -0.0 gives 0x80.
EDGE_HOST_DEVICE constexpr std::uint8_t float_to_fp8_e4m3(float value) {
  using traits = fp8_e4m3_traits;
  const std::uint32_t bits = bit_cast_u32(value);
  const std::uint32_t abs_bits = bits & fp32_traits::abs_mask;
  if (abs_bits > fp32_traits::inf_bits) {
    return traits::nan_code;
  }
  const std::uint32_t sign = (bits & fp32_traits::sign_mask) != 0u ? traits::sign_mask : 0u;
  // Rounding first and clamping after gives the right answer on both sides of the limit:
  // 464, halfway to the next binade, ties to 448 because 448's code is even, and anything
  // that rounds higher (up to and including infinity) would land on the NaN code or beyond.
  const std::uint32_t magnitude = numerics_detail::encode_finite_magnitude(
      abs_bits, traits::mantissa_bits, traits::exponent_bias);
  return static_cast<std::uint8_t>(sign |
                                   (magnitude > traits::max_code ? traits::max_code : magnitude));
}

// Exact. 0x7F and 0xFF decode to the canonical NaN (sign dropped, as NVIDIA's decode does).
EDGE_HOST_DEVICE constexpr float fp8_e4m3_to_float(std::uint8_t code) {
  using traits = fp8_e4m3_traits;
  const std::uint32_t abs_code = code & traits::abs_mask;
  if (abs_code == traits::nan_code) {
    return bit_cast_float(fp32_traits::canonical_nan_bits);
  }
  const std::uint32_t sign = (code & traits::sign_mask) != 0 ? fp32_traits::sign_mask : 0u;
  return bit_cast_float(sign | numerics_detail::decode_finite_magnitude(
                                   abs_code, traits::mantissa_bits, traits::exponent_bias));
}

// ---- BF16 --------------------------------------------------------------------------------

// Round to nearest even; values that round past the largest finite bf16 become ±inf. Any
// NaN gives 0x7FFF, the NaN that __float2bfloat16_rn returns.
EDGE_HOST_DEVICE constexpr std::uint16_t float_to_bf16(float value) {
  const std::uint32_t bits = bit_cast_u32(value);
  if ((bits & fp32_traits::abs_mask) > fp32_traits::inf_bits) {
    return bf16_traits::nan_code;
  }
  // bf16 is float's top half, so rounding the low half carries into the exponent and, from
  // the largest finite value, into infinity exactly as round to nearest even requires.
  return static_cast<std::uint16_t>(numerics_detail::shift_right_rne(
      bits, fp32_traits::mantissa_bits - bf16_traits::mantissa_bits));
}

// Exact: bf16 is the top half of a float. NaN payload and sign are kept, as NVIDIA's is.
EDGE_HOST_DEVICE constexpr float bf16_to_float(std::uint16_t code) {
  return bit_cast_float(static_cast<std::uint32_t>(code)
                        << (fp32_traits::mantissa_bits - bf16_traits::mantissa_bits));
}

// ---- FP16 (IEEE binary16) ----------------------------------------------------------------

// Round to nearest even with gradual underflow; values that round past 65504 become ±inf.
// Any NaN gives 0x7FFF, as __float2half_rn does.
EDGE_HOST_DEVICE constexpr std::uint16_t float_to_fp16(float value) {
  using traits = fp16_traits;
  const std::uint32_t bits = bit_cast_u32(value);
  const std::uint32_t abs_bits = bits & fp32_traits::abs_mask;
  if (abs_bits > fp32_traits::inf_bits) {
    return traits::nan_code;
  }
  const std::uint32_t sign = (bits & fp32_traits::sign_mask) != 0u ? traits::sign_mask : 0u;
  // Values from 65520 (halfway past 65504, whose code is odd) round onto the infinity code;
  // larger ones, infinity included, would run past it into the NaN codes.
  const std::uint32_t magnitude = numerics_detail::encode_finite_magnitude(
      abs_bits, traits::mantissa_bits, traits::exponent_bias);
  return static_cast<std::uint16_t>(sign |
                                    (magnitude > traits::inf_code ? traits::inf_code : magnitude));
}

// Exact for finite values and infinities. NaN decodes to the canonical NaN (sign and payload
// dropped), matching NVIDIA's host decode.
EDGE_HOST_DEVICE constexpr float fp16_to_float(std::uint16_t code) {
  using traits = fp16_traits;
  const std::uint32_t sign = (code & traits::sign_mask) != 0 ? fp32_traits::sign_mask : 0u;
  const std::uint32_t abs_code = code & traits::abs_mask;
  if (abs_code >= traits::inf_code) {
    return abs_code == traits::inf_code ? bit_cast_float(sign | fp32_traits::inf_bits)
                                        : bit_cast_float(fp32_traits::canonical_nan_bits);
  }
  return bit_cast_float(sign | numerics_detail::decode_finite_magnitude(
                                   abs_code, traits::mantissa_bits, traits::exponent_bias));
}

// ---- storage types -----------------------------------------------------------------------

// Distinct types for buffers of encoded values, so a kernel templated on its cache type
// cannot mistake fp16 bits for bf16 bits. Layout-identical to their bits.
struct fp8_e4m3 {
  std::uint8_t bits;
  EDGE_HOST_DEVICE static constexpr fp8_e4m3 from_float(float value) {
    return {float_to_fp8_e4m3(value)};
  }
  EDGE_HOST_DEVICE constexpr float to_float() const { return fp8_e4m3_to_float(bits); }
};

struct bf16 {
  std::uint16_t bits;
  EDGE_HOST_DEVICE static constexpr bf16 from_float(float value) { return {float_to_bf16(value)}; }
  EDGE_HOST_DEVICE constexpr float to_float() const { return bf16_to_float(bits); }
};

struct fp16 {
  std::uint16_t bits;
  EDGE_HOST_DEVICE static constexpr fp16 from_float(float value) { return {float_to_fp16(value)}; }
  EDGE_HOST_DEVICE constexpr float to_float() const { return fp16_to_float(bits); }
};

static_assert(sizeof(fp8_e4m3) == 1 && sizeof(bf16) == 2 && sizeof(fp16) == 2);

}  // namespace edge::kernels
