// The CPU's bf16 matmul on AVX-512 BF16: bf16 weights are multiplied as they are stored, in
// pairs, by vdpbf16ps against the activations rounded to bf16 (round to nearest even, once per
// call), accumulating in f32. Against the float kernels, which widen each weight to f32 and
// keep the activations in f32, it saves the widening and halves the multiplies; the price is
// the activations' rounding, a relative 2^-9 per element that averages out over k (measured
// with `edgeinfer eval` in docs/quantization.md). Like the integer matmul (integer_dot.h) it
// keeps batch invariance, and EDGE_CPU_ACTIVATIONS=exact or matmul_params::exact_activations
// ask for the float kernels instead.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/matmul/matmul.h"

namespace edge::kernels::cpu {

// Activation rows rounded to bf16, each padded with zeros to a multiple of 32 elements (one
// 512-bit vector of pairs). Reused across calls: round_activations only grows the vector.
struct bf16_activations {
  static constexpr std::int64_t row_multiple = 32;
  std::int64_t tokens = 0;
  std::int64_t padded_k = 0;
  std::vector<std::uint16_t> values;  // [tokens, padded_k] bf16 bits

  const std::uint16_t* row(std::int64_t t) const { return values.data() + t * padded_k; }
};

void round_activations(const float* x, std::int64_t tokens, std::int64_t k, std::int64_t x_stride,
                       bf16_activations& out);

// Rounds the call's activations (on the calling thread) into the caller's scratch; rows() may then
// run on any threads, each over its own rows. w must be bf16; p and x must outlive it. Only for
// CPUs with AVX-512 BF16 (isa::avx512_bf16).
class bf16_matmul {
 public:
  bf16_matmul(const matmul_params& p, bf16_activations& x);
  void rows(std::int64_t row_begin, std::int64_t row_end) const;

 private:
  const matmul_params& p_;
  const bf16_activations& x_;
};

}  // namespace edge::kernels::cpu
