// Activations quantized to int8 per block of 32 elements (one f32 scale per token and block,
// amax / 127), for the CPU's integer dot products (the K-quant matmul, kquant_cpu.h).
#pragma once

#include <cstdint>
#include <vector>

namespace edge::kernels::cpu {

struct int8_activation_traits {
  static constexpr std::int64_t block = 32;         // elements per activation scale
  static constexpr std::int64_t sum_span = 16;      // elements per stored code sum
  static constexpr std::int64_t row_multiple = 64;  // codes per row, padded to this (one 512-bit load)
  // Symmetric: codes stay in [-127, 127], so negating one never overflows.
  static constexpr int max_code = 127;
};

enum class code_order : std::uint8_t {
  natural,  // codes in element order
};

// A batch of activation rows quantized per block of 32: x[i] ≈ code × scale of i's block.
// Reused across calls: quantize_activations only grows the vectors.
struct int8_activations {
  std::int64_t tokens = 0;
  std::int64_t k = 0;
  std::int64_t padded_k = 0;  // k rounded up to row_multiple
  code_order order = code_order::natural;
  std::vector<std::int8_t> codes;    // [tokens, padded_k] in `order`, zero past k
  std::vector<float> scales;         // [tokens, padded_k / block]: amax / 127 of each block
  std::vector<std::int32_t> sums16;  // [tokens, padded_k / sum_span]: Σ codes of each 16 elements

  const std::int8_t* codes_of(std::int64_t t) const { return codes.data() + t * padded_k; }
  const float* scales_of(std::int64_t t) const { return scales.data() + t * (padded_k / int8_activation_traits::block); }
  const std::int32_t* sums16_of(std::int64_t t) const {
    return sums16.data() + t * (padded_k / int8_activation_traits::sum_span);
  }
};

// x [tokens, k] (row stride x_stride) → out. A block whose amax is not finite gets a NaN scale
// and zero codes, so that a NaN or infinite activation shows in every output it touches.
void quantize_activations(const float* x, std::int64_t tokens, std::int64_t k, std::int64_t x_stride,
                          code_order order, int8_activations& out);

}  // namespace edge::kernels::cpu
