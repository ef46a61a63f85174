// y = x · wᵀ (+ bias) (+ y): activations in float, weights in any weight format (f32, f16,
// bf16, FP8 with row scales, INT4 with group scales, and on the CPU INT8 and GGUF's Q4_K / Q5_K
// / Q6_K: edge/kernels/weight_format.h), widened and dequantized in registers (no dequantized copy
// of the weights).
//
// On the CPU each output element is one dot product over k whose summation order depends only
// on k, not on how many tokens or rows are computed together. A sequence therefore gets
// bit-identical results alone or in any batch there (batch invariance). The CUDA kernels do
// not promise that: 1 to 8 tokens take the f32 GEMV (or, for INT4, the W4A16 tensor-core
// kernel), 9 and more the bf16 tensor-core GEMM, and the split of k depends on the tile count
// (docs/decisions.md). On both, decode (one token)
// and prefill (many) share one code path: the kernel tiles several tokens against several weight rows so that a
// weight row fetched from memory serves every token of the tile.
//
// Quantized weights give the result of the same matmul over their dequantized values
// (dequantize in kernels/quantize/quantize.h): for INT4 each weight is float(q) × scale exactly,
// so the INT4 result is bit-identical to the f32 matmul of the dequantized matrix; FP8 applies
// its row scale once to the row's dot product, which rounds differently (within 1e-6 relative).
// On the CPU, INT4 and INT8 weights take integer dot products over activations quantized to
// int8 unless exact_activations asks for that float reference (integer_dot.h: the numerics), and
// so do the GGUF K-quants (kquant_cpu.h says what it computes; their float reference is there too).
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/stream.h"
#include "edge/kernels/weight_format.h"

namespace edge::kernels {

struct matmul_params {
  const float* x;              // [tokens, k], row stride x_stride
  weight_view w;               // [n, k]; int4 needs a power-of-two group_size dividing k
  const float* bias = nullptr; // [n] or null
  float* y;                    // [tokens, n], row stride y_stride
  std::int64_t tokens = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  std::int64_t x_stride = 0;
  std::int64_t y_stride = 0;
  bool accumulate = false;     // y += x · wᵀ (fuses a residual add)
  // CPU only: INT4 (groups of 32 or more) and INT8 weights multiply activations quantized to
  // int8 (kernels/matmul/integer_dot.h) unless this asks for the float kernels, the exact
  // reference (EDGE_CPU_ACTIVATIONS=exact asks it of every call).
  bool exact_activations = false;
  // CUDA only: scratch for splitting k across blocks when the output alone would leave the
  // GPU idle (few rows, a batch of 9+ tokens). Null (or too small) computes without a split.
  float* workspace = nullptr;  // [workspace_floats]
  std::int64_t workspace_floats = 0;
};

// The CUDA matmul splits k at most this many ways, and only for calls of at most
// matmul_split_max_tokens tokens (larger batches fill the GPU with output tiles alone).
inline constexpr std::int64_t matmul_max_split_k = 8;
inline constexpr std::int64_t matmul_split_max_tokens = 256;

// How many ways the CUDA matmul splits k for a call whose output makes `tiles` blocks, on a GPU
// of `sms` multiprocessors, k walked in steps of `k_step`: none when the tiles already fill the
// GPU, when the batch is large or there is no workspace; else enough to cover the GPU about
// twice, at most matmul_max_split_k, each part at least two steps of k, and as many as the
// workspace holds. The W4A16 decode kernel (16 rows a block, k in stages of 512) splits this
// way too: Kimi K2's kv_a_proj (576 x 7168) is 36 blocks for 132 SMs, split 7 ways.
constexpr std::int64_t matmul_split_count(std::int64_t tiles, std::int64_t sms, std::int64_t tokens, std::int64_t n,
                                          std::int64_t k, std::int64_t k_step, std::int64_t workspace_floats) {
  if (tiles >= sms || tokens > matmul_split_max_tokens || workspace_floats <= 0) return 1;
  std::int64_t splits = (2 * sms + tiles - 1) / tiles;
  if (splits > matmul_max_split_k) splits = matmul_max_split_k;
  const std::int64_t by_k = (k + 2 * k_step - 1) / (2 * k_step);
  if (splits > by_k) splits = by_k;
  while (splits > 1 && splits * tokens * n > workspace_floats) --splits;
  if (splits < 1) return 1;
  // Whole steps per part: the count that k then needs.
  const std::int64_t per_split = ((k + splits - 1) / splits + k_step - 1) / k_step * k_step;
  return (k + per_split - 1) / per_split;
}

// Workspace floats with which the CUDA matmul never gives up a split it wants, for any call
// of up to `tokens` tokens and `n` output rows.
constexpr std::int64_t matmul_workspace_floats(std::int64_t tokens, std::int64_t n) {
  return matmul_max_split_k * (tokens < matmul_split_max_tokens ? tokens : matmul_split_max_tokens) * n;
}

// Whether the CUDA matmul runs a call on tensor cores, rounding x to bf16 (weights stay exact:
// bf16 values, fp8 codes, int4 q, with scales applied in f32): 9+ tokens with bf16, fp8 or int4
// weights, and 1..8 tokens with int4 groups of 32 or more (the W4A16 decode kernel, for weights
// that start 16-byte aligned, as every device allocation does; others take the f32 GEMV).
// Everything else multiplies in f32.
constexpr bool cuda_matmul_uses_tensor_cores(weight_format f, std::int64_t tokens, std::int64_t group_size) {
  if (f == weight_format::int4 && group_size >= 32) return true;
  return tokens > 8 && (f == weight_format::bf16 || f == weight_format::fp8_e4m3 || f == weight_format::int4);
}

status run_matmul(const matmul_params& p, const stream& s);

// y[t, h] = W_h · x[t, h] for every head h in one call, W_h the n rows of w from first_row +
// h · head_rows on: latent attention's absorbed projections (each head's q_nope through its
// W_UKᵀ, its latent through its W_UV), `heads` small matmuls of one shape. On the CPU each head
// is a run_matmul over its rows, so the result is the per-head calls' bit for bit. On CUDA one
// launch runs every head for up to head_matmul_gemv_tokens tokens (a GEMV tile per block of 4
// weight rows and head, the tokens 4 at a time, f32 products), where per-head calls took two
// launches per head and layer (7,808 a decode step at Kimi K2's shape); more tokens take a
// run_matmul per head, whose tensor cores then pay for the launches.
struct head_matmul_params {
  const float* x;                  // head h of token t: k floats at x + t · x_stride + h · x_head_stride
  weight_view w;                   // rows [first_row, first_row + (heads - 1) · head_rows + n) of a [*, k] matrix
  float* y;                        // head h of token t: n floats at y + t · y_stride + h · y_head_stride
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  std::int64_t first_row = 0;
  std::int64_t head_rows = 0;      // rows from one head's W_h to the next's (>= n)
  std::int64_t x_stride = 0;
  std::int64_t x_head_stride = 0;  // >= k
  std::int64_t y_stride = 0;
  std::int64_t y_head_stride = 0;  // >= n
  bool exact_activations = false;  // CPU only, as matmul_params says
};

inline constexpr std::int64_t head_matmul_gemv_tokens = 64;

status run_head_matmul(const head_matmul_params& p, const stream& s);

namespace detail {
// The shape and stride checks of run_head_matmul, the same for either device.
status check_head_matmul(const head_matmul_params& p);
}  // namespace detail

}  // namespace edge::kernels
