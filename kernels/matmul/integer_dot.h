// The CPU's integer matmul for INT4 (groups of 32 or more) and INT8 weights: the activations
// are quantized to int8 per block of 32 elements on the fly (one f32 scale per token and block,
// amax / 127), and each block's dot product is an integer sum of code products (AVX-512 VNNI
// vpdpbusd, or AVX2 vpmaddubsw + vpmaddwd), scaled once by weight scale × activation scale.
//
// This is a numerics change against the float kernels (matmul.h), which stay the exact
// reference: the activations' rounding adds a relative error of about 2^-8 per element,
// averaging out over k (docs/quantization.md has its measured cost). What it keeps: each output
// element's summation order depends only on k, so a token gets bit-identical results alone or
// in any batch, on a given code path; the paths (generic, avx2, avx512_vnni) agree within
// rounding, not bit for bit.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/matmul/matmul.h"

namespace edge::kernels::cpu {

struct int8_activation_traits {
  static constexpr std::int64_t block = 32;          // elements per activation scale
  static constexpr std::int64_t sum_span = 16;       // elements per stored code sum (sums16)
  static constexpr std::int64_t row_multiple = 512;  // codes per row, padded to this (one span of INT4)
  static constexpr std::int64_t lane_span = 4;       // codes per 32-bit lane of an integer dot product
  // Symmetric: codes stay in [-127, 127], so negating one never overflows.
  static constexpr int max_code = 127;
};

// The order in which a kernel meets the activation codes. The AVX-512 kernels read 256 bytes of
// weights at a time (a span: 16 INT4 chunks of 32 elements, or 16 INT8 pieces of 16) and turn
// them so that each 32-bit lane j of a vector holds 4 codes of chunk (piece) j; the activations
// are stored in that order, so that one vector load meets one turned weight vector.
enum class code_order : std::uint8_t {
  natural,     // codes in element order
  int4_spans,  // per 512 elements: step (u, h) = 0..7, lane j, byte i holds 32j + 16h + 4u + i
  int8_spans,  // per 256 elements: step u = 0..3, lane j, byte i holds 16j + 4u + i
};

// The element (within its row) whose code stored position p holds.
constexpr std::int64_t element_at(code_order order, std::int64_t p) {
  const std::int64_t i = p % 4, j = p / 4 % 16;
  switch (order) {
    case code_order::natural: return p;
    case code_order::int4_spans: {
      const std::int64_t step = p % 512 / 64, u = step / 2, h = step % 2;
      return p / 512 * 512 + 32 * j + 16 * h + 4 * u + i;
    }
    case code_order::int8_spans: return p / 256 * 256 + 16 * j + 4 * (p % 256 / 64) + i;
  }
  return p;
}

// A batch of activation rows quantized per block of 32: x[i] ≈ code × scale of i's block.
// Reused across calls: quantize_activations only grows the vectors.
struct int8_activations {
  std::int64_t tokens = 0;
  std::int64_t k = 0;
  std::int64_t padded_k = 0;  // k rounded up to row_multiple
  code_order order = code_order::natural;
  std::vector<std::int8_t> codes;     // [tokens, padded_k] in `order`, zero past k
  std::vector<float> scales;          // [tokens, padded_k / block]: amax / 127 of each block (by element)
  std::vector<std::int32_t> sums16;   // [tokens, padded_k / sum_span]: Σ codes of each 16 elements (by element)
  std::vector<std::int32_t> sums32;   // [tokens, padded_k / block]: Σ codes of each block of 32 (by element)
  std::vector<float> lane_scales;     // [tokens, padded_k / lane_span]: the scale of each 4 stored codes

  const std::int8_t* codes_of(std::int64_t t) const { return codes.data() + t * padded_k; }
  const float* scales_of(std::int64_t t) const { return scales.data() + t * (padded_k / int8_activation_traits::block); }
  const std::int32_t* sums16_of(std::int64_t t) const {
    return sums16.data() + t * (padded_k / int8_activation_traits::sum_span);
  }
  const std::int32_t* sums32_of(std::int64_t t) const {
    return sums32.data() + t * (padded_k / int8_activation_traits::block);
  }
  const float* lane_scales_of(std::int64_t t) const {
    return lane_scales.data() + t * (padded_k / int8_activation_traits::lane_span);
  }
};

// x [tokens, k] (row stride x_stride) → out. A block whose amax is not finite gets a NaN scale
// and zero codes, so that a NaN or infinite activation shows in every output it touches.
void quantize_activations(const float* x, std::int64_t tokens, std::int64_t k, std::int64_t x_stride,
                          code_order order, int8_activations& out);

// Whether the integer matmul takes these weights: INT8, and INT4 with groups of 32 or more.
constexpr bool integer_dot_reads(const weight_view& w) {
  return w.format == weight_format::int8 || (w.format == weight_format::int4 && w.group_size >= 32);
}

// y = x · wᵀ over quantized activations, on the most capable path at or below `level`.
// Construction quantizes the activations into the caller's scratch (on the calling thread);
// rows() may then run on any threads, each over its own rows. The caller has checked the shapes
// (run_matmul does); w must satisfy integer_dot_reads. p, x and group_sums must outlive it.
class integer_matmul {
 public:
  integer_matmul(const matmul_params& p, isa level, int8_activations& x, std::vector<float>& group_sums);
  // Over activations quantized before (several matmuls of the same rows: a Mixture-of-Experts
  // layer's experts): p's tokens are rows [first_token, first_token + p.tokens) of x, which were
  // quantized from k = p.k elements in activation_order(level, p.w); p.x is not read.
  integer_matmul(const matmul_params& p, isa level, const int8_activations& x, std::int64_t first_token,
                 std::vector<float>& group_sums);
  void rows(std::int64_t row_begin, std::int64_t row_end) const;
  isa path() const { return path_; }

  // The order the path at or below `level` wants the activation codes in for weights `w`.
  static code_order activation_order(isa level, const weight_view& w);

 private:
  static isa path_for(isa level);
  void prepare(isa level, std::int64_t first_token, std::vector<float>& group_sums);

  const matmul_params& p_;
  const int8_activations& x_;
  isa path_ = isa::generic;
  std::int64_t first_ = 0;
  std::int64_t group_size_ = 0;
  std::int64_t groups_ = 0;
  const float* group_sums_ = nullptr;  // [tokens, groups_]
};

}  // namespace edge::kernels::cpu
