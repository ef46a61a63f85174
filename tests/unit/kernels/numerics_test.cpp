// Float <-> FP8 E4M3FN / BF16 / FP16 conversions, checked against expectations derived here
// from the format definitions (a value formula per code and a nearest-value search), not
// from the bit manipulation the encoders use.
#include "edge/kernels/numerics.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

using edge::kernels::bf16_to_float;
using edge::kernels::bit_cast_float;
using edge::kernels::bit_cast_u32;
using edge::kernels::float_to_bf16;
using edge::kernels::float_to_fp16;
using edge::kernels::float_to_fp8_e4m3;
using edge::kernels::fp16_to_float;
using edge::kernels::fp8_e4m3_to_float;

constexpr std::uint32_t canonical_nan_bits = 0x7FFF'FFFFu;
constexpr float inf = std::numeric_limits<float>::infinity();

// The conversions are constexpr, so tables of encoded constants can be built at compile time.
static_assert(float_to_fp8_e4m3(448.0f) == 0x7E);
static_assert(float_to_fp8_e4m3(-1.0f) == 0xB8);
static_assert(fp8_e4m3_to_float(0x38) == 1.0f);
static_assert(float_to_bf16(1.0f) == 0x3F80);
static_assert(float_to_fp16(1.0f) == 0x3C00);
static_assert(fp16_to_float(0x3C00) == 1.0f);

std::string hex(std::uint32_t value) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%X", value);
  return text;
}

float next_up(float x) { return std::nextafter(x, inf); }
float next_down(float x) { return std::nextafter(x, -inf); }

// An IEEE-style binary format by its field widths. Values come from the textbook formula:
// (-1)^s * 2^(e - bias) * (1 + m / 2^M) for normals, (-1)^s * 2^(1 - bias) * (m / 2^M) for
// subnormals.
struct format_layout {
  int exponent_bits;
  int mantissa_bits;
  int bias;

  int total_bits() const { return 1 + exponent_bits + mantissa_bits; }
  std::uint32_t sign_bit() const { return 1u << (total_bits() - 1); }
  std::uint32_t exponent_field() const { return ((1u << exponent_bits) - 1u) << mantissa_bits; }
};

constexpr format_layout e4m3_layout{4, 3, 7};
constexpr format_layout bf16_layout{8, 7, 127};
constexpr format_layout fp16_layout{5, 10, 15};

double formula_value(std::uint32_t code, format_layout layout) {
  const double sign = (code & layout.sign_bit()) != 0 ? -1.0 : 1.0;
  const int exponent = static_cast<int>((code & layout.exponent_field()) >> layout.mantissa_bits);
  const double fraction = static_cast<double>(code & ((1u << layout.mantissa_bits) - 1u)) /
                          static_cast<double>(1u << layout.mantissa_bits);
  if (exponent == 0) {
    return sign * std::ldexp(fraction, 1 - layout.bias);
  }
  return sign * std::ldexp(1.0 + fraction, exponent - layout.bias);
}

// In E4M3FN only S.1111.111 is NaN; bf16 and fp16 reserve the whole top exponent.
bool is_e4m3_nan(std::uint32_t code) { return (code & 0x7Fu) == 0x7Fu; }
bool is_ieee_inf_or_nan(std::uint32_t code, format_layout layout) {
  return (code & layout.exponent_field()) == layout.exponent_field();
}

// Magnitudes of codes 0, 1, 2, ... (ascending), for the nearest-value search.
std::vector<double> magnitudes(std::uint32_t code_count, format_layout layout) {
  std::vector<double> values;
  values.reserve(code_count);
  for (std::uint32_t code = 0; code < code_count; ++code) {
    values.push_back(formula_value(code, layout));
  }
  return values;
}

// The code whose magnitude is nearest to `abs_x` (which must not exceed values.back()),
// ties to the even code. 2|x| against the neighbours' sum is exact in double.
std::uint32_t nearest_code(double abs_x, const std::vector<double>& values) {
  const auto above = std::lower_bound(values.begin(), values.end(), abs_x);
  const auto hi = static_cast<std::uint32_t>(above - values.begin());
  if (hi == 0 || *above == abs_x) {
    return hi;
  }
  const std::uint32_t lo = hi - 1;
  const double twice = 2.0 * abs_x;
  const double sum = values[lo] + values[hi];
  if (twice < sum) {
    return lo;
  }
  if (twice > sum) {
    return hi;
  }
  return lo % 2 == 0 ? lo : hi;
}

// Slow E4M3 encoder: nearest of the 127 finite magnitudes, saturating at the largest,
// every NaN to 0x7F.
std::uint8_t reference_e4m3(float x) {
  static const std::vector<double> values = magnitudes(0x7F, e4m3_layout);
  if (std::isnan(x)) {
    return 0x7F;
  }
  const std::uint32_t sign = std::signbit(x) ? e4m3_layout.sign_bit() : 0u;
  const double abs_x = std::fabs(static_cast<double>(x));
  const std::uint32_t magnitude = abs_x >= values.back() ? 0x7Eu : nearest_code(abs_x, values);
  return static_cast<std::uint8_t>(sign | magnitude);
}

// Slow IEEE encoder. The infinity code gets the value 2^(emax + 1), the first power of two
// past the range: IEEE 754 rounds to infinity exactly when a format with an unbounded
// exponent would round to that value, so overflow falls out of the same nearest search.
class ieee_reference {
 public:
  ieee_reference(format_layout layout, std::uint16_t nan_code)
      : layout_(layout), nan_code_(nan_code) {
    values_ = magnitudes(layout.exponent_field(), layout);
    values_.push_back(std::ldexp(1.0, layout.bias + 1));
  }

  std::uint16_t encode(float x) const {
    if (std::isnan(x)) {
      return nan_code_;
    }
    const std::uint32_t sign = std::signbit(x) ? layout_.sign_bit() : 0u;
    const double abs_x = std::fabs(static_cast<double>(x));
    const std::uint32_t magnitude =
        abs_x >= values_.back() ? layout_.exponent_field() : nearest_code(abs_x, values_);
    return static_cast<std::uint16_t>(sign | magnitude);
  }

 private:
  format_layout layout_;
  std::uint16_t nan_code_;
  std::vector<double> values_;  // [inf_code + 1], magnitudes of codes 0 .. inf_code
};

// Deterministic inputs: raw 32-bit patterns (every exponent, NaNs and infinities included)
// and patterns with the exponent drawn from the band where the format's own exponents,
// subnormals, underflow and overflow all lie.
std::vector<float> random_floats(std::uint32_t seed, int count_each, int band_low_exponent,
                                 int band_high_exponent) {
  std::mt19937 rng(seed);
  std::vector<float> inputs;
  inputs.reserve(2 * static_cast<std::size_t>(count_each));
  const auto band_width = static_cast<std::uint32_t>(band_high_exponent - band_low_exponent + 1);
  for (int i = 0; i < count_each; ++i) {
    inputs.push_back(bit_cast_float(static_cast<std::uint32_t>(rng())));
    const auto r = static_cast<std::uint32_t>(rng());
    const std::uint32_t exponent = static_cast<std::uint32_t>(band_low_exponent) + r % band_width;
    const std::uint32_t sign_and_mantissa = static_cast<std::uint32_t>(rng()) & 0x807F'FFFFu;
    inputs.push_back(bit_cast_float(sign_and_mantissa | (exponent << 23)));
  }
  return inputs;
}

template <typename Encoder, typename Reference>
void check_encoder_against_reference(const std::vector<float>& inputs, Encoder encoder,
                                     Reference reference) {
  std::size_t mismatches = 0;
  std::uint32_t first_input = 0;
  std::uint32_t first_got = 0;
  std::uint32_t first_expected = 0;
  for (const float x : inputs) {
    const std::uint32_t got = encoder(x);
    const std::uint32_t expected = reference(x);
    if (got != expected) {
      if (mismatches == 0) {
        first_input = bit_cast_u32(x);
        first_got = got;
        first_expected = expected;
      }
      ++mismatches;
    }
  }
  INFO("inputs: " << inputs.size() << ", first mismatch: float bits " << hex(first_input)
                  << " encoded " << hex(first_got) << ", expected " << hex(first_expected));
  CHECK(mismatches == 0);
}

}  // namespace

// ---- FP8 E4M3FN --------------------------------------------------------------------------

TEST_CASE("fp8 e4m3: every code decodes to the value the OCP spec gives it") {
  for (std::uint32_t code = 0; code < 256; ++code) {
    CAPTURE(hex(code));
    const float decoded = fp8_e4m3_to_float(static_cast<std::uint8_t>(code));
    if (is_e4m3_nan(code)) {
      CHECK(bit_cast_u32(decoded) == canonical_nan_bits);
    } else {
      // Bits, not values, so that 0x80 must give -0.0.
      CHECK(bit_cast_u32(decoded) ==
            bit_cast_u32(static_cast<float>(formula_value(code, e4m3_layout))));
    }
  }
}

TEST_CASE("fp8 e4m3: spot values") {
  CHECK(fp8_e4m3_to_float(0x7E) == 448.0f);
  CHECK(fp8_e4m3_to_float(0xFE) == -448.0f);
  CHECK(fp8_e4m3_to_float(0x78) == 256.0f);
  CHECK(fp8_e4m3_to_float(0x38) == 1.0f);
  CHECK(fp8_e4m3_to_float(0x39) == 1.125f);
  CHECK(fp8_e4m3_to_float(0xC4) == -3.0f);
  CHECK(fp8_e4m3_to_float(0x08) == std::ldexp(1.0f, -6));
  CHECK(fp8_e4m3_to_float(0x07) == std::ldexp(7.0f, -9));
  CHECK(fp8_e4m3_to_float(0x01) == std::ldexp(1.0f, -9));
  CHECK(bit_cast_u32(fp8_e4m3_to_float(0x00)) == 0x0000'0000u);
  CHECK(bit_cast_u32(fp8_e4m3_to_float(0x80)) == 0x8000'0000u);
  CHECK(std::isnan(fp8_e4m3_to_float(0x7F)));
  CHECK(std::isnan(fp8_e4m3_to_float(0xFF)));

  using traits = edge::kernels::fp8_e4m3_traits;
  CHECK(fp8_e4m3_to_float(traits::max_code) == traits::max);
  CHECK(fp8_e4m3_to_float(0x08) == traits::min_normal);
  CHECK(fp8_e4m3_to_float(0x01) == traits::min_subnormal);
}

TEST_CASE("fp8 e4m3: every finite code survives a round trip, NaN codes give 0x7F") {
  for (std::uint32_t code = 0; code < 256; ++code) {
    CAPTURE(hex(code));
    const std::uint32_t round_trip =
        float_to_fp8_e4m3(fp8_e4m3_to_float(static_cast<std::uint8_t>(code)));
    CHECK(round_trip == (is_e4m3_nan(code) ? 0x7Fu : code));
  }
}

TEST_CASE("fp8 e4m3: midpoints round to the even code, values beside them to the nearer") {
  for (std::uint32_t lo = 0; lo < 0x7E; ++lo) {
    const std::uint32_t hi = lo + 1;
    const std::uint32_t even = lo % 2 == 0 ? lo : hi;
    for (const std::uint32_t sign : {0x00u, 0x80u}) {
      const float a = fp8_e4m3_to_float(static_cast<std::uint8_t>(sign | lo));
      const float b = fp8_e4m3_to_float(static_cast<std::uint8_t>(sign | hi));
      const float midpoint = (a + b) / 2.0f;  // exact: a few significant bits each
      const float toward_b = sign != 0 ? next_down(midpoint) : next_up(midpoint);
      const float toward_a = sign != 0 ? next_up(midpoint) : next_down(midpoint);
      CAPTURE(hex(sign | lo));
      CAPTURE(midpoint);
      CHECK(float_to_fp8_e4m3(midpoint) == (sign | even));
      CHECK(float_to_fp8_e4m3(toward_b) == (sign | hi));
      CHECK(float_to_fp8_e4m3(toward_a) == (sign | lo));
    }
  }
}

TEST_CASE("fp8 e4m3: values past 448, infinities included, saturate to +-448") {
  for (const float x :
       {448.0f, next_up(448.0f), 460.0f, next_down(464.0f), 464.0f, next_up(464.0f), 480.0f, 500.0f,
        512.0f, 1.0e4f, 1.0e9f, std::numeric_limits<float>::max(), inf}) {
    CAPTURE(x);
    CHECK(float_to_fp8_e4m3(x) == 0x7E);
    CHECK(float_to_fp8_e4m3(-x) == 0xFE);
  }
  // Below 448 the encoder still rounds: 432 is halfway between 416 (0x7D) and 448 (0x7E).
  CHECK(float_to_fp8_e4m3(432.0f) == 0x7E);
  CHECK(float_to_fp8_e4m3(next_down(432.0f)) == 0x7D);
}

TEST_CASE("fp8 e4m3: subnormals and underflow to zero keep the sign") {
  const float min_subnormal = std::ldexp(1.0f, -9);
  struct example {
    float input;
    std::uint8_t code;
  };
  for (const example& e : {
           example{0.0f, 0x00},
           example{-0.0f, 0x80},
           example{std::numeric_limits<float>::denorm_min(), 0x00},
           example{-std::numeric_limits<float>::denorm_min(), 0x80},
           example{std::numeric_limits<float>::min(), 0x00},
           example{1.0e-30f, 0x00},
           example{-1.0e-30f, 0x80},
           example{min_subnormal / 4.0f, 0x00},
           example{min_subnormal / 2.0f, 0x00},  // tie with 0x01: 0x00 is even
           example{-min_subnormal / 2.0f, 0x80},
           example{next_up(min_subnormal / 2.0f), 0x01},
           example{-next_up(min_subnormal / 2.0f), 0x81},
           example{min_subnormal, 0x01},
           example{1.5f * min_subnormal, 0x02},  // tie: 0x02 is even
           example{2.5f * min_subnormal, 0x02},  // tie: 0x02 is even
           example{3.0f * min_subnormal, 0x03},
           example{7.0f * min_subnormal, 0x07},  // largest subnormal
           example{7.5f * min_subnormal, 0x08},  // tie with the smallest normal
           example{-7.5f * min_subnormal, 0x88},
           example{next_down(7.5f * min_subnormal), 0x07},
       }) {
    CAPTURE(e.input);
    CHECK(float_to_fp8_e4m3(e.input) == e.code);
  }
}

TEST_CASE("fp8 e4m3: every NaN, whatever its sign or payload, encodes to 0x7F") {
  for (const std::uint32_t nan_bits : {0x7FC0'0000u, 0xFFC0'0000u, 0x7F80'0001u, 0xFF80'0001u,
                                       0x7FA0'0000u, 0x7FFF'FFFFu, 0xFFFF'FFFFu}) {
    CAPTURE(hex(nan_bits));
    CHECK(float_to_fp8_e4m3(bit_cast_float(nan_bits)) == 0x7F);
  }
}

TEST_CASE("fp8 e4m3: encoder matches a nearest-value search over four million floats") {
  // Band: 2^-15 (well below half the smallest subnormal) to 2^13 (well past 448).
  const std::vector<float> inputs = random_floats(0xE4'3001u, 2'000'000, 112, 140);
  check_encoder_against_reference(inputs, float_to_fp8_e4m3, reference_e4m3);
}

// ---- BF16 --------------------------------------------------------------------------------

TEST_CASE("bf16: every code decodes to its value; NaN keeps its bits") {
  for (std::uint32_t code = 0; code < 0x1'0000; ++code) {
    CAPTURE(hex(code));
    const float decoded = bf16_to_float(static_cast<std::uint16_t>(code));
    if (!is_ieee_inf_or_nan(code, bf16_layout)) {
      CHECK(bit_cast_u32(decoded) ==
            bit_cast_u32(static_cast<float>(formula_value(code, bf16_layout))));
    } else if ((code & 0x7Fu) == 0) {
      CHECK(decoded == ((code & 0x8000u) != 0 ? -inf : inf));
    } else {
      // bf16 widens by appending zero bits, so even a NaN's sign and payload survive.
      CHECK(bit_cast_u32(decoded) == code << 16);
    }
  }
}

TEST_CASE("bf16: every non-NaN code survives a round trip, NaN codes give 0x7FFF") {
  for (std::uint32_t code = 0; code < 0x1'0000; ++code) {
    CAPTURE(hex(code));
    const bool nan = is_ieee_inf_or_nan(code, bf16_layout) && (code & 0x7Fu) != 0;
    CHECK(float_to_bf16(bf16_to_float(static_cast<std::uint16_t>(code))) == (nan ? 0x7FFFu : code));
  }
}

TEST_CASE("bf16: ties go to the even code") {
  const float ulp_at_one = std::ldexp(1.0f, -7);
  CHECK(float_to_bf16(1.0f + ulp_at_one / 2) == 0x3F80);      // 1.0 is even
  CHECK(float_to_bf16(1.0f + 3 * ulp_at_one / 2) == 0x3F82);  // 0x3F81 is odd
  CHECK(float_to_bf16(next_up(1.0f + ulp_at_one / 2)) == 0x3F81);
  CHECK(float_to_bf16(next_down(1.0f + 3 * ulp_at_one / 2)) == 0x3F81);
  CHECK(float_to_bf16(-(1.0f + ulp_at_one / 2)) == 0xBF80);
  CHECK(float_to_bf16(-(1.0f + 3 * ulp_at_one / 2)) == 0xBF82);
  // A tie whose round-up carries into the exponent: 2 - 2^-8 is halfway to 2.0.
  CHECK(float_to_bf16(2.0f - std::ldexp(1.0f, -8)) == 0x4000);
}

TEST_CASE("bf16: overflow rounds to infinity; infinities stay, every NaN gives 0x7FFF") {
  CHECK(float_to_bf16(bit_cast_float(0x7F7F'7FFFu)) == 0x7F7F);  // below the tie
  CHECK(float_to_bf16(bit_cast_float(0x7F7F'8000u)) == 0x7F80);  // tie, 0x7F7F is odd
  CHECK(float_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);
  CHECK(float_to_bf16(-std::numeric_limits<float>::max()) == 0xFF80);
  CHECK(float_to_bf16(inf) == 0x7F80);
  CHECK(float_to_bf16(-inf) == 0xFF80);
  // A signalling NaN whose payload sits only in the dropped half must not become infinity.
  for (const std::uint32_t nan_bits :
       {0x7FC0'0000u, 0xFFC0'0000u, 0x7F80'0001u, 0xFF80'0001u, 0x7FFF'FFFFu, 0xFFFF'FFFFu}) {
    CAPTURE(hex(nan_bits));
    CHECK(float_to_bf16(bit_cast_float(nan_bits)) == 0x7FFF);
  }
}

TEST_CASE("bf16: zeros and float subnormals round like any other value") {
  CHECK(float_to_bf16(0.0f) == 0x0000);
  CHECK(float_to_bf16(-0.0f) == 0x8000);
  CHECK(float_to_bf16(bit_cast_float(0x0000'8000u)) == 0x0000);  // tie, 0 is even
  CHECK(float_to_bf16(bit_cast_float(0x0000'8001u)) == 0x0001);
  CHECK(float_to_bf16(bit_cast_float(0x0001'8000u)) == 0x0002);  // tie, 0x0001 is odd
  CHECK(float_to_bf16(bit_cast_float(0x8000'8000u)) == 0x8000);
  CHECK(float_to_bf16(bit_cast_float(0x007F'FFFFu)) == 0x0080);  // carries into a normal
  CHECK(bf16_to_float(0x0001) == std::ldexp(1.0f, -133));
}

TEST_CASE("bf16: encoder matches a nearest-value search over four million floats") {
  const ieee_reference reference(bf16_layout, 0x7FFF);
  const std::vector<float> inputs = random_floats(0xBF16'0001u, 2'000'000, 0, 255);
  check_encoder_against_reference(inputs, float_to_bf16,
                                  [&](float x) { return reference.encode(x); });
}

// ---- FP16 --------------------------------------------------------------------------------

TEST_CASE("fp16: every code decodes to its value; NaN decodes to the canonical NaN") {
  for (std::uint32_t code = 0; code < 0x1'0000; ++code) {
    CAPTURE(hex(code));
    const float decoded = fp16_to_float(static_cast<std::uint16_t>(code));
    if (!is_ieee_inf_or_nan(code, fp16_layout)) {
      CHECK(bit_cast_u32(decoded) ==
            bit_cast_u32(static_cast<float>(formula_value(code, fp16_layout))));
    } else if ((code & 0x3FFu) == 0) {
      CHECK(decoded == ((code & 0x8000u) != 0 ? -inf : inf));
    } else {
      CHECK(bit_cast_u32(decoded) == canonical_nan_bits);
    }
  }
  using traits = edge::kernels::fp16_traits;
  CHECK(fp16_to_float(0x7BFF) == traits::max);
  CHECK(fp16_to_float(0x0400) == traits::min_normal);
  CHECK(fp16_to_float(0x0001) == traits::min_subnormal);
}

TEST_CASE("fp16: every non-NaN code survives a round trip, NaN codes give 0x7FFF") {
  for (std::uint32_t code = 0; code < 0x1'0000; ++code) {
    CAPTURE(hex(code));
    const bool nan = is_ieee_inf_or_nan(code, fp16_layout) && (code & 0x3FFu) != 0;
    CHECK(float_to_fp16(fp16_to_float(static_cast<std::uint16_t>(code))) == (nan ? 0x7FFFu : code));
  }
}

TEST_CASE("fp16: ties go to the even code") {
  const float ulp_at_one = std::ldexp(1.0f, -10);
  CHECK(float_to_fp16(1.0f + ulp_at_one / 2) == 0x3C00);
  CHECK(float_to_fp16(1.0f + 3 * ulp_at_one / 2) == 0x3C02);
  CHECK(float_to_fp16(next_up(1.0f + ulp_at_one / 2)) == 0x3C01);
  CHECK(float_to_fp16(next_down(1.0f + 3 * ulp_at_one / 2)) == 0x3C01);
  CHECK(float_to_fp16(-(1.0f + 3 * ulp_at_one / 2)) == 0xBC02);
  CHECK(float_to_fp16(2.0f - std::ldexp(1.0f, -11)) == 0x4000);
}

TEST_CASE("fp16: overflow rounds to infinity from 65520 up; every NaN gives 0x7FFF") {
  CHECK(float_to_fp16(65504.0f) == 0x7BFF);
  CHECK(float_to_fp16(next_down(65520.0f)) == 0x7BFF);
  CHECK(float_to_fp16(65520.0f) == 0x7C00);  // tie, 0x7BFF is odd
  CHECK(float_to_fp16(-65520.0f) == 0xFC00);
  CHECK(float_to_fp16(1.0e6f) == 0x7C00);
  CHECK(float_to_fp16(std::numeric_limits<float>::max()) == 0x7C00);
  CHECK(float_to_fp16(inf) == 0x7C00);
  CHECK(float_to_fp16(-inf) == 0xFC00);
  for (const std::uint32_t nan_bits :
       {0x7FC0'0000u, 0xFFC0'0000u, 0x7F80'0001u, 0xFF80'0001u, 0x7FFF'FFFFu, 0xFFFF'FFFFu}) {
    CAPTURE(hex(nan_bits));
    CHECK(float_to_fp16(bit_cast_float(nan_bits)) == 0x7FFF);
  }
}

TEST_CASE("fp16: subnormals, the step to normals and underflow to zero with sign") {
  const float min_subnormal = std::ldexp(1.0f, -24);
  CHECK(float_to_fp16(min_subnormal) == 0x0001);
  CHECK(float_to_fp16(min_subnormal / 2) == 0x0000);  // tie, 0 is even
  CHECK(float_to_fp16(-min_subnormal / 2) == 0x8000);
  CHECK(float_to_fp16(next_up(min_subnormal / 2)) == 0x0001);
  CHECK(float_to_fp16(3 * min_subnormal / 2) == 0x0002);
  CHECK(float_to_fp16(5 * min_subnormal / 2) == 0x0002);
  CHECK(float_to_fp16(1023 * min_subnormal) == 0x03FF);
  CHECK(float_to_fp16(1023.5f * min_subnormal) == 0x0400);  // tie into the smallest normal
  CHECK(float_to_fp16(next_down(1023.5f * min_subnormal)) == 0x03FF);
  CHECK(float_to_fp16(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(float_to_fp16(-std::numeric_limits<float>::min()) == 0x8000);
  CHECK(float_to_fp16(-0.0f) == 0x8000);
}

TEST_CASE("fp16: encoder matches a nearest-value search over four million floats") {
  const ieee_reference reference(fp16_layout, 0x7FFF);
  // Band: 2^-31 (below half the smallest subnormal) to 2^19 (past 65504).
  const std::vector<float> inputs = random_floats(0xF16'0001u, 2'000'000, 96, 146);
  check_encoder_against_reference(inputs, float_to_fp16,
                                  [&](float x) { return reference.encode(x); });
}

// ---- storage types -----------------------------------------------------------------------

TEST_CASE("storage types convert through the same functions") {
  using edge::kernels::bf16;
  using edge::kernels::fp16;
  using edge::kernels::fp8_e4m3;
  CHECK(fp8_e4m3::from_float(-2.0f).bits == 0xC0);
  CHECK(fp8_e4m3{0xC0}.to_float() == -2.0f);
  CHECK(bf16::from_float(3.0f).bits == 0x4040);
  CHECK(bf16{0x4040}.to_float() == 3.0f);
  CHECK(fp16::from_float(-0.5f).bits == 0xB800);
  CHECK(fp16{0xB800}.to_float() == -0.5f);
}
