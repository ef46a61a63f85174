// The CPU matmul of GGUF K-quant weights (q4_k, q5_k, q6_k: edge/kernels/weight_format.h),
// which run_matmul hands its K-quant calls to. The weights are read in place, block by block;
// the activations are quantized to int8 per block of 32 (integer_dot.h: x ≈ c × s, one s per
// token and block), and each output is a sum of integer dot products, scaled per sub-block:
//
//   Q4_K, Q5_K (sub-blocks j of 32 elements, each one activation block of scale s_j):
//     y = Σ_j  (d·sc_j)·s_j · Σ_i q_i·c_i  −  (dmin·m_j) · s_j·Σ_i c_i
//   Q6_K (sub-blocks j of 16, activation scale s_{j/2}; q the stored code, q − 32 the value):
//     y = Σ_j  (d·sc_j)·s_{j/2} · (Σ_i q_i·c_i  −  32·Σ_i c_i)
//
// which is the matmul of the exactly dequantized weights with the rounded activations c × s:
// the integer sums are exact, the scale products and the float sums round. (The code sums come
// with the activations, 16 elements each, so the min and offset terms cost one multiply per
// sub-block.)
//
// Paths: generic (portable C++, the reference: the formulas above, sub-block after sub-block in
// increasing k) and AVX-512 VNNI (vpdpbusd: the unsigned weight codes times the signed
// activation codes, four products per 32-bit lane; 16 float lanes accumulate each lane's share
// of k, added once at the end); and, where matmul_params::exact_activations or
// EDGE_CPU_ACTIVATIONS=exact asks, the float reference: the exactly decoded weights times the
// activations as they are, in the f32 matmul's 16 lanes. Each output's summation order depends
// only on k and the path, so a token gets bit-identical results alone or in any batch. The paths
// agree within float rounding.
//
// Blocking: threads take blocks of rows (run_matmul's); inside, tiles of up to 4 rows × 4
// tokens: a row's super-block is unpacked once (its codes to 256 bytes in element order, its
// scales to floats) for all the tile's tokens, and the tile's rows stay in cache while every
// token tile passes over them.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/matmul/integer_dot.h"
#include "kernels/matmul/matmul.h"

namespace edge::kernels::cpu {

// y = x · wᵀ for K-quant weights, on the most capable path at or below `level` (the float
// reference when the call or EDGE_CPU_ACTIVATIONS asks for exact activations). Construction
// quantizes the activations into the caller's scratch (on the calling thread); rows() may then
// run on any threads, each over its own rows. The caller has checked the shapes (run_matmul
// does); w is a K-quant and k a multiple of 256. p, x and spans must outlive it.
class kquant_matmul {
 public:
  kquant_matmul(const matmul_params& p, isa level, int8_activations& x, std::vector<float>& spans);
  void rows(std::int64_t row_begin, std::int64_t row_end) const;
  isa path() const { return path_; }
  bool exact() const { return exact_; }

 private:
  const matmul_params& p_;
  const int8_activations& x_;
  isa path_ = isa::generic;
  bool exact_ = false;
  // AVX-512 VNNI only: per token and span of 16 elements, the span's activation scale and that
  // scale times the span's code sum.
  const float* span_scales_ = nullptr;  // [tokens, k / 16]
  const float* span_sums_ = nullptr;    // [tokens, k / 16]
};

}  // namespace edge::kernels::cpu
