// The case list of every kernel: each op x dtype x shape written once, here. The CPU suite
// (tests/unit/kernels/kernel_cases_test.cpp) runs every case's CPU reference against a plain
// double-precision one and holds that every CUDA launcher (kernels/cuda/launchers.h) has cases;
// the GPU program (tests/gpu/kernels_gpu_test.cpp) runs the same cases on the device against
// the CPU reference, with the metrics and tolerances below, which the mutation test
// (tests/unit/kernels/kernel_mutation_test.cpp) shows reject each class of bug a review feared
// while accepting the rounding the tensor cores really do (emulated on the host).
//
// Shapes: the awkward ones (1, 54, 97; k = 96 and 288, whose INT4 groups of 32 end half-way
// through a tensor-core tile; block sizes 1, 8, 16; GQA up to 16:1) and the real projections
// of Llama 3 8B, Qwen3-30B-A3B, Kimi K2 and GLM-5 (synthetic.cpp's presets of those names).
//
// Data: magnitudes that differ per row, per group and per token (x 2^U(-s, s)), so that a
// kernel which applies the wrong row's or group's or token's scale gets a visibly wrong answer;
// uniform data in +-0.5 hides such a bug under the rounding of the right answer.
//
// Plain C++ on edge_kernels (no doctest, no CUDA): both programs include it.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "edge/kernels/dtype.h"
#include "edge/kernels/numerics.h"
#include "edge/kernels/weight_format.h"
#include "kernels/mla_attention/mla_attention.h"
#include "kernels/moe_routing/moe_routing.h"
#include "kernels/rope/rope.h"

namespace edge::kernel_cases {

using kernels::dtype;
using kernels::weight_format;

// ---- the kernels ------------------------------------------------------------------------------

// Every CUDA entry point (the `run_*` of kernels/cuda/launchers.h, without `run_`); the case
// list test fails when launchers.h names one that is not here, or one here has no cases.
inline constexpr std::array<std::string_view, 16> kernel_names = {
    "embedding",      "rmsnorm",      "rope",         "silu_mul",     "matmul",        "head_matmul",
    "quantize",       "dequantize",   "kv_cache_write", "kv_block_copy", "paged_attention",
    "sampling",       "moe_routing",  "moe_experts",  "mla_attention", "dsa_select",
};

// ---- data -------------------------------------------------------------------------------------

// A fast stream of test values (SplitMix64): the real shapes need hundreds of millions.
struct test_random {
  std::uint64_t state;
  explicit test_random(std::uint64_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [low, high).
  float uniform(float low, float high) {
    return low + (high - low) * static_cast<float>(next() >> 40) * 0x1p-24f;
  }
  // 2^U(-spread, spread).
  float magnitude(float spread) { return std::exp2(uniform(-spread, spread)); }
};

// `count` values uniform in [-amplitude, amplitude], each run of `run` consecutive values times
// its own magnitude 2^U(-spread, spread).
inline std::vector<float> scaled_floats(std::size_t count, std::uint32_t seed, std::size_t run, float spread,
                                        float amplitude = 1.0f) {
  test_random rng(seed);
  std::vector<float> out(count);
  float m = 1.0f;
  for (std::size_t i = 0; i < count; ++i) {
    if (run > 0 && i % run == 0) m = rng.magnitude(spread);
    out[i] = rng.uniform(-amplitude, amplitude) * m;
  }
  return out;
}

// A weight matrix [n, k]: each row times 2^U(-2, 2), and each group of `group` values of a row
// (32 when the format has no groups) times 2^U(-4, 4) more, so that INT4 group scales and FP8
// row scales differ by up to 2^12 within a matrix.
inline std::vector<float> weight_values(std::int64_t n, std::int64_t k, std::int64_t group, std::uint32_t seed) {
  test_random rng(seed);
  const std::int64_t g = group > 0 ? group : 32;
  std::vector<float> out(static_cast<std::size_t>(n * k));
  for (std::int64_t r = 0; r < n; ++r) {
    const float row = rng.magnitude(2.0f);
    float m = row;
    for (std::int64_t j = 0; j < k; ++j) {
      if (j % g == 0) m = row * rng.magnitude(4.0f);
      out[static_cast<std::size_t>(r * k + j)] = rng.uniform(-1.0f, 1.0f) * m;
    }
  }
  return out;
}

// Block tables of sequences of `contexts` positions, as the executor stages them: blocks handed
// out in a shuffled order, each sequence's table right after the previous one's; 3 blocks more
// in the cache than the tables use.
struct block_tables {
  std::vector<std::int32_t> tables, table_begin;  // [blocks used], [sequences + 1]
  std::int64_t num_blocks = 0;
};

inline block_tables shuffled_block_tables(const std::vector<std::int64_t>& contexts, std::int64_t block_size,
                                          std::uint32_t seed) {
  block_tables t;
  std::int64_t used = 0;
  for (const std::int64_t c : contexts) used += (c + block_size - 1) / block_size;
  t.num_blocks = used + 3;
  std::vector<std::int32_t> order(static_cast<std::size_t>(t.num_blocks));
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  std::size_t next = 0;
  for (const std::int64_t c : contexts) {
    t.table_begin.push_back(static_cast<std::int32_t>(t.tables.size()));
    for (std::int64_t b = 0; b < (c + block_size - 1) / block_size; ++b) t.tables.push_back(order[next++]);
  }
  t.table_begin.push_back(static_cast<std::int32_t>(t.tables.size()));
  return t;
}

// Activations [tokens, stride]: each token times 2^U(-2, 2).
inline std::vector<float> activations(std::int64_t tokens, std::int64_t stride, std::uint32_t seed) {
  return scaled_floats(static_cast<std::size_t>(tokens * stride), seed, static_cast<std::size_t>(stride), 2.0f);
}

// ---- matmul -----------------------------------------------------------------------------------

struct matmul_case {
  std::string shape;               // where the shape comes from ("kimi-k2 kv_a_proj", "awkward")
  weight_format format;
  std::int64_t n = 0, k = 0;
  std::int64_t group_size = 0;     // int4: 0 takes int4_group_size_for(k)
  std::vector<std::int64_t> tokens;
  bool quick = true;               // in the --quick set (under compute-sanitizer)
};

inline std::vector<matmul_case> matmul_cases() {
  struct shape {
    const char* name;
    std::int64_t n, k;
    std::vector<std::int64_t> tokens;
  };
  // k = 288 and 96 (k = 32 mod 64): INT4 groups of 32 whose last tensor-core tile ends half-way,
  // at 9, 17, 64 and 65 tokens, and whose W4A16 decode stage (512 k) is partly empty at 1..8;
  // k = 1056: groups of 32 over two stages, the second holding one chunk.
  const std::vector<shape> awkward = {
      {"awkward", 1, 128, {1, 54}},        {"awkward", 97, 54, {1, 5, 97}},    {"awkward", 54, 4096, {1, 8, 54}},
      {"awkward", 4096, 97, {1, 97}},      {"awkward", 97, 288, {1, 5, 9, 64, 65}},
      {"awkward", 64, 96, {1, 8, 9, 17}},  {"awkward", 54, 1056, {1, 3, 8}},
  };
  // The real projections where a kernel's choices differ: few rows (576, 512: split-K), the
  // experts' shapes (k = 768, 2048, 7168), the wide ones (14336, 16384).
  const std::vector<shape> real = {
      {"llama-3-8b k_proj", 1024, 4096, {1, 9}},
      {"llama-3-8b down_proj", 4096, 14336, {1, 8, 54}},
      {"qwen3-30b-a3b k_proj", 512, 2048, {1, 16}},
      {"qwen3-30b-a3b expert up", 768, 2048, {1, 9}},
      {"qwen3-30b-a3b expert down", 2048, 768, {1, 9}},
      {"kimi-k2 kv_a_proj", 576, 7168, {1, 16}},
      {"kimi-k2 expert gate", 2048, 7168, {1}},
      {"kimi-k2 expert down", 7168, 2048, {1, 9}},
      {"kimi-k2 kv_b_proj", 16384, 512, {1}},
      {"glm-5 kv_a_proj", 576, 6144, {1}},
      {"glm-5 q_b_proj", 16384, 2048, {1}},
  };
  std::vector<matmul_case> out;
  for (const weight_format f : {weight_format::f32, weight_format::f16, weight_format::bf16, weight_format::fp8_e4m3,
                                weight_format::int4}) {
    for (const shape& s : awkward) {
      out.push_back({s.name, f, s.n, s.k, 0, s.tokens, s.n * s.k <= 64 * 1024});
    }
    // The tensor-core formats at the real shapes (the f32 / f16 GEMV is the same code at any size).
    if (f == weight_format::bf16 || f == weight_format::fp8_e4m3 || f == weight_format::int4) {
      for (const shape& s : real) out.push_back({s.name, f, s.n, s.k, 0, s.tokens, false});
    }
  }
  // INT4 groups of 128 at a real k, and groups of 32 over two W4A16 stages.
  out.push_back({"llama-3-8b q_proj, int4 groups of 128", weight_format::int4, 4096, 4096, 128, {1, 9}, false});
  out.push_back({"awkward, int4 groups of 32", weight_format::int4, 97, 1056, 32, {1, 3, 9}, true});
  return out;
}

// The error of a matmul output against the reference: |y - y_ref| over the L2 norm of the
// output's products, sqrt(sum_k (x_k w_k)^2), plus 2^-10 of what was added to them (bias, the
// accumulated y). Rounding x (or w) to bf16 perturbs each product by up to 2^-9 of itself, at
// random: the sum moves by about 2^-9 / sqrt(3) of that norm, whatever k is. A wrong scale, row
// or edge moves whole groups of products: a fraction of the norm near 1. Relative to sum |x w|
// instead, a wrong group scale at k = 4096 scores below bf16's worst case.
inline double matmul_error(double y, double y_ref, double products_l2, double added) {
  const double d = std::fabs(y - y_ref);
  if (std::isnan(d)) return INFINITY;
  return d / (products_l2 + added * 0x1p-10 + 1e-30);
}

// Tolerances of matmul_error: f32 products in another order; x (and INT4's q x scale) rounded
// to bf16 on tensor cores (cuda_matmul_uses_tensor_cores).
inline constexpr double matmul_f32_tolerance = 0x1p-13;
inline constexpr double matmul_tensor_core_tolerance = 0x1p-4;

// ---- every head's matmul (latent attention's absorbed projections) ----------------------------

struct head_matmul_case {
  std::string shape;
  weight_format format;
  std::int64_t heads, n, k, first_row, head_rows;
  std::vector<std::int64_t> tokens;  // past head_matmul_gemv_tokens CUDA runs a matmul per head
};

inline std::vector<head_matmul_case> head_matmul_cases() {
  std::vector<head_matmul_case> out;
  for (const weight_format f : {weight_format::bf16, weight_format::fp8_e4m3, weight_format::int4}) {
    // q_nope through W_UKᵀ (w_uk_t: [heads · kv_lora, nope]) and the latents through W_UV
    // (kv_b_proj's V rows: [heads · (nope + v_head), kv_lora] from row nope on).
    out.push_back({"kimi-k2 w_uk", f, 64, 512, 128, 0, 512, {1, 8, 65}});
    out.push_back({"kimi-k2 w_uv", f, 64, 128, 512, 128, 256, {1, 8, 65}});
    out.push_back({"glm-5 w_uk", f, 64, 512, 192, 0, 512, {1, 5}});
    out.push_back({"glm-5 w_uv", f, 64, 256, 512, 192, 448, {1, 5}});
  }
  out.push_back({"awkward", weight_format::f32, 3, 13, 24, 8, 21, {1, 3, 70}});
  out.push_back({"awkward", weight_format::f16, 3, 13, 24, 8, 21, {1, 3}});
  return out;
}

// ---- paged attention --------------------------------------------------------------------------

struct attention_case {
  std::string shape;
  dtype kv;
  std::int64_t head_dim = 0;
  std::int64_t group = 0;        // query heads per KV head
  std::int64_t kv_heads = 2;
  std::int64_t block_size = 0;
  // Decode tokens at the end of the first contexts.size() - 1 sequences, and a prefill chunk
  // of `chunk` tokens ending the last one.
  std::vector<std::int64_t> contexts;
  std::int64_t chunk = 0;
  bool quick = true;
};

inline std::vector<attention_case> attention_cases() {
  std::vector<attention_case> out;
  for (const dtype type : {dtype::fp8_e4m3, dtype::bf16}) {
    // head_dim 256, and 16 query heads per KV head at 128, need more than 48 KB of shared memory.
    for (const std::int64_t head_dim : {64, 128, 256}) {
      for (const std::int64_t group : {1, 4, 8, 16}) {
        for (const std::int64_t block_size : {1, 8, 16}) {
          // Decode at 1, 54, 97 and 4096 positions, a chunk of 97 tokens from position 54.
          out.push_back({"awkward", type, head_dim, group, 2, block_size, {1, 54, 97, 4096, 151}, 97, false});
          if (block_size != 8 && group != 4) {
            out.push_back({"awkward, short", type, head_dim, group, 2, block_size, {1, 54, 97, 300, 151}, 97, true});
          }
        }
      }
    }
    // Llama 3 8B (32 / 8 heads of 128) and Qwen3-30B-A3B (32 / 4 heads of 128), 16-token blocks.
    out.push_back({"llama-3-8b", type, 128, 4, 8, 16, {1, 1000, 2048, 300}, 256, false});
    out.push_back({"qwen3-30b-a3b", type, 128, 8, 4, 16, {17, 1000, 4096, 600}, 512, false});
  }
  return out;
}

// The error of an attention output against the reference: |o - o_ref| over the largest |v| among
// the values the query attends (the output is a weighted mean of them). Rounding q, K and the
// softmax weights to bf16 moves it by a few 2^-9 of that; a wrong K or V scale, or a key too
// few at a tile's edge, by a sizeable part of it wherever the keys' magnitudes differ.
inline double attention_error(double o, double o_ref, double v_max) {
  const double d = std::fabs(o - o_ref);
  if (std::isnan(d)) return INFINITY;
  return d / (v_max + 1e-30);
}

inline constexpr double attention_f32_tolerance = 0x1p-13;
inline constexpr double attention_tensor_core_tolerance = 0x1p-6;

// ---- embedding, rmsnorm, rope, silu_mul --------------------------------------------------------

struct embedding_case {
  dtype table;
  std::int64_t vocab, hidden, tokens;
};
inline std::vector<embedding_case> embedding_cases() {
  std::vector<embedding_case> out;
  for (const dtype type : {dtype::f32, dtype::f16, dtype::bf16}) {
    for (const std::int64_t hidden : {1, 54, 97, 4096, 7168}) out.push_back({type, 97, hidden, 54});
  }
  return out;
}

struct rows_case {
  std::int64_t rows, cols;
};
// rmsnorm: each with and without the residual add, as a gather of rows, and (cols a multiple of
// 64) as per-head norms of 64.
inline std::vector<rows_case> rmsnorm_cases() {
  std::vector<rows_case> out;
  for (const std::int64_t rows : {1, 54, 97}) {
    for (const std::int64_t cols : {1, 54, 97, 4096, 6144, 7168, 14336}) out.push_back({rows, cols});
  }
  return out;
}
inline std::vector<rows_case> silu_mul_cases() {
  return {{54, 1}, {54, 97}, {54, 768}, {54, 2048}, {54, 14336}};
}

struct rope_case {
  std::int64_t head_dim, rotary_dim, heads;  // rotary_dim 0: all of head_dim
  kernels::rope_pairs pairs;
  std::int64_t tokens = 97;
};
inline std::vector<rope_case> rope_cases() {
  std::vector<rope_case> out;
  // 64: the rotary part of MLA's keys (Kimi K2, GLM-5); 128 with half of it rotated (GLM-4.5).
  for (const auto& [head_dim, rotary_dim] : {std::pair<std::int64_t, std::int64_t>{64, 0}, {128, 0}, {128, 64}}) {
    for (const std::int64_t heads : {1, 8, 64}) {
      for (const auto pairs : {kernels::rope_pairs::adjacent, kernels::rope_pairs::half_split}) {
        out.push_back({head_dim, rotary_dim, heads, pairs});
      }
    }
  }
  return out;
}

// Absolute tolerances of the float kernels, for the value ranges their problems have
// (small_ops.h): rmsnorm's outputs up to about 3 (sums of squares in another order), rope's
// |x| <= 1 and silu_mul's gates up to 8 (one float rounding of a few operations).
inline constexpr double rmsnorm_tolerance = 5e-5;
inline constexpr double rope_tolerance = 1e-5;
inline constexpr double silu_mul_tolerance = 1e-5;

// ---- quantize, dequantize, the KV cache's writes and block copies --------------------------------

struct quantize_case {
  weight_format format;
  std::int64_t n, k;
  bool quick = true;
};
inline std::vector<quantize_case> quantize_cases() {
  std::vector<quantize_case> out;
  for (const weight_format f : {weight_format::int4, weight_format::fp8_e4m3}) {
    for (const auto& [n, k] : std::vector<std::pair<std::int64_t, std::int64_t>>{
             {1, 128}, {54, 97}, {97, 4096}, {8, 14336}, {576, 7168}, {2048, 768}}) {
      out.push_back({f, n, k, n * k <= 97 * 4096});
    }
  }
  return out;
}

struct kv_write_case {
  dtype kv;
  std::int64_t head_dim, kv_heads, block_size;
  bool values = true;  // false: K rows only (an MLA layer's latent rows)
  std::int64_t tokens = 54;
};
inline std::vector<kv_write_case> kv_cache_write_cases() {
  std::vector<kv_write_case> out;
  for (const dtype type : {dtype::fp8_e4m3, dtype::bf16, dtype::f16, dtype::f32}) {
    for (const std::int64_t head_dim : {64, 128}) {
      for (const std::int64_t block_size : {1, 8, 16}) out.push_back({type, head_dim, 8, block_size});
    }
    // MLA's latent rows: kv_lora 512 + rope 64 as one "head" (Kimi K2, GLM-5).
    out.push_back({type, 576, 1, 64, false});
  }
  return out;
}

// Bytes of one block of one layer.
inline std::vector<std::size_t> kv_block_copy_cases() { return {12, 256, 4096, 576 * 64 + 4 * 64}; }

// ---- sampling, MoE, MLA, DSA ---------------------------------------------------------------------

struct sampling_case {
  std::int64_t vocab, rows;
  bool masked;  // with a grammar's token mask
  bool quick = true;
};
inline std::vector<sampling_case> sampling_cases() {
  std::vector<sampling_case> out;
  // Llama 3's, Qwen's, Kimi K2's vocabularies among them.
  for (const std::int64_t vocab : {54, 97, 4096, 128256, 151936, 163840}) out.push_back({vocab, 64, false, vocab <= 128256});
  for (const std::int64_t vocab : {97, 128256}) out.push_back({vocab, 32, true});
  return out;
}

struct routing_case {
  std::string shape;
  std::int64_t experts, top_k;
  kernels::router_scoring scoring;
  std::int64_t groups = 1, top_groups = 1;
  bool normalize = true;      // norm_topk_prob
  bool bias = false;          // sigmoid: a correction bias (e_score_correction_bias)
  float scaling = 1.0f;       // routed_scaling_factor (sigmoid)
  std::vector<std::int64_t> tokens = {1, 97, 513};
};
// Qwen3-MoE (128 experts, softmax, normalised or not), DeepSeek-V3 (256 in 8 groups, 4 kept),
// Kimi K2 (384 in one group), GLM-5 (256 in one group), and others around them.
inline std::vector<routing_case> moe_routing_cases() {
  using kernels::router_scoring;
  return {
      {"qwen3-30b-a3b", 128, 8, router_scoring::softmax, 1, 1, true, false, 1.0f},
      {"softmax, not normalised", 128, 8, router_scoring::softmax, 1, 1, false, false, 1.0f},
      {"softmax, 384 experts", 384, 8, router_scoring::softmax, 1, 1, true, false, 1.0f},
      {"awkward softmax", 60, 4, router_scoring::softmax, 1, 1, false, false, 1.0f, {1, 97}},
      {"deepseek-v3", 256, 8, router_scoring::sigmoid, 8, 4, true, true, 2.5f},
      {"sigmoid 8 groups top 4", 128, 8, router_scoring::sigmoid, 8, 4, true, true, 2.5f},
      {"sigmoid 8 groups top 4", 384, 8, router_scoring::sigmoid, 8, 4, true, true, 2.827f},
      {"kimi-k2", 384, 8, router_scoring::sigmoid, 1, 1, true, true, 2.827f},
      {"glm-5", 256, 8, router_scoring::sigmoid, 1, 1, true, true, 2.5f, {1, 97}},
      {"sigmoid 16 groups top 5, not normalised", 128, 8, router_scoring::sigmoid, 16, 5, false, true, 1.5f},
      {"sigmoid without a correction bias", 64, 6, router_scoring::sigmoid, 1, 1, true, false, 2.5f, {1, 97}},
      {"awkward grouped", 16, 4, router_scoring::sigmoid, 4, 2, true, true, 2.5f, {1, 7}},
  };
}

// A row's choice may differ from the exact one where two of the values it ranks (choice values
// among the top_k + 1 best, or group scores among the top_groups + 1 best) lie within this of
// each other, relative: exp in float on either side may order them either way. Where the
// experts agree, the weights agree to routing_weight_tolerance, relative (a few ulp through the
// normalisation).
inline constexpr double routing_tie = 1e-5;
inline constexpr double routing_weight_tolerance = 2e-6;

struct experts_case {
  std::string shape;
  weight_format format;
  std::int64_t hidden, inter;
  std::int64_t group = 0;  // int4: 0 takes the largest power of two up to 128 dividing hidden and inter
  std::int64_t experts = 16, top_k = 4;
  std::vector<std::int64_t> tokens = {1, 7, 97};
  bool quick = true;
  bool quick_prefill = false;  // --quick runs its 97 tokens too (the tensor-core form, under memcheck)
};
// The experts' real widths with fewer experts held (a case holds every expert's weights; the
// real counts are the routing cases'): a Kimi K2 expert is 44 M weights, and the CPU suite's
// double reference reads every expert a checked token chose, so its case chooses two per token
// of five. Odd widths (rows that are not whole 16-byte chunks, x
// rows that are not 16-byte aligned) in every format; INT4 in groups of 1, 16, 32 and 128.
inline std::vector<experts_case> moe_experts_cases() {
  std::vector<experts_case> out;
  for (const weight_format f : {weight_format::bf16, weight_format::fp8_e4m3, weight_format::int4, weight_format::f32}) {
    out.push_back({.shape = "awkward", .format = f, .hidden = 64, .inter = 96, .quick_prefill = true});
    out.push_back({"awkward", f, 97, 54});
    if (f == weight_format::bf16 || f == weight_format::fp8_e4m3) out.push_back({"awkward", f, 256, 96});
    if (f != weight_format::f32) {
      out.push_back({"qwen3-30b-a3b", f, 2048, 768, 0, 16, 8, {1, 8, 64}, false});
      out.push_back({"kimi-k2", f, 7168, 2048, 0, 5, 2, {1, 8}, false});
    }
  }
  out.push_back({"awkward", weight_format::int4, 96, 48, 16});
  out.push_back({"awkward", weight_format::int4, 160, 96, 32});
  out.push_back({"awkward", weight_format::int4, 256, 384, 128});
  return out;
}

// The error of an experts output against the reference: |out - out_ref| over the spread of the
// rounding it may carry, `spread` = sqrt(sum over the token's choices of weight² times, per
// output, the squared products of the down matrix plus the squared products of the gate and up
// matrices carried through SwiGLU into it), plus 2^-10 of the value it was added to. Rounding
// each product by a relative e at random moves the output by about e / sqrt(3) of that spread,
// as matmul_error's norm does for one matmul; a wrong scale, row, expert or weight moves it by a
// sizeable part of it.
inline double experts_error(double out, double out_ref, double spread, double added) {
  const double d = std::fabs(out - out_ref);
  if (std::isnan(d)) return INFINITY;
  return d / (spread + added * 0x1p-10 + 1e-30);
}

// Tolerances of experts_error: f32 products in another order; activations rounded to int8 (the
// CPU's integer dot products for INT4 in groups of 32 or more, unless EDGE_CPU_ACTIVATIONS=exact),
// 2^-8 of each block of 32's largest value, twice (x, and silu(gate) · up). The error is not
// relative to each product: where a block holds one large silu(gate) · up among small ones, the
// small ones' rounding is large for their share of the spread, and over k of 64 to 384 it does
// not average out (0.13 at 64 x 96, 0.02 at the real widths). The GPU, in f32, is held to the
// first.
// On tensor cores (cuda_moe_experts_use_tensor_cores: 9+ tokens), x and silu(gate) · up are
// rounded to bf16, as the dense matmul's x is: held to matmul_tensor_core_tolerance.
inline constexpr double experts_f32_tolerance = 0x1p-13;
inline constexpr double experts_int8_tolerance = 0x1p-2;
inline constexpr double experts_tensor_core_tolerance = matmul_tensor_core_tolerance;

struct mla_case {
  std::string shape;
  dtype kv;
  std::int64_t heads, latent, rope;
  std::int64_t block_size;
  std::vector<std::int64_t> contexts;  // decode tokens at the ends of all but the last; a chunk of the last
  std::int64_t chunk;
  std::int64_t select_k = 40;          // a random selection of this many positions (DSA's form)
  bool quick = true;
};
inline std::vector<mla_case> mla_attention_cases() {
  struct shape {
    const char* name;
    std::int64_t heads, latent, rope;
    bool quick;
  };
  // The tiny test models' row; DeepSeek-V3's (Kimi K2 and GLM-5: 64 heads, DeepSeek-V3: 128),
  // also with a band of 20 heads (a partial band of 64 on tensor cores, of 16 in f32); and an
  // awkward row (184 floats: 46 float4s, padded to 47 in shared memory).
  const std::vector<shape> shapes = {{"tiny", 4, 32, 8, true},
                                     {"deepseek-v3 row", 64, 512, 64, true},
                                     {"deepseek-v3", 128, 512, 64, false},
                                     {"deepseek-v3 row", 20, 512, 64, false},
                                     {"awkward", 20, 160, 24, false}};
  std::vector<mla_case> out;
  for (const shape& s : shapes) {
    for (const dtype type : {dtype::fp8_e4m3, dtype::bf16, dtype::f16, dtype::f32}) {
      for (const std::int64_t block_size : {16, 64}) {
        const bool quick = s.quick && type != dtype::f16 && block_size == 16;
        // Decode at 1, 17 and 300 positions (4096 too on tensor cores: many tiles and splits),
        // and a prefill run of 13 tokens ending at position 76.
        if (kernels::cuda_mla_uses_tensor_cores(type, s.latent, s.rope)) {
          out.push_back({s.name, type, s.heads, s.latent, s.rope, block_size, {1, 17, 300, 4096, 77}, 13, 40, false});
        }
        if (!kernels::cuda_mla_uses_tensor_cores(type, s.latent, s.rope) || quick) {
          out.push_back({s.name, type, s.heads, s.latent, s.rope, block_size, {1, 17, 300, 77}, 13, 40, quick});
        }
      }
    }
  }
  // Kimi K2 and GLM-5 (64 heads of DeepSeek-V3's row) at longer contexts and chunks.
  for (const dtype type : {dtype::fp8_e4m3, dtype::bf16, dtype::f16, dtype::f32}) {
    out.push_back({"awkward", type, 3, 32, 8, 16, {1, 54, 97, 151}, 20, 40, type != dtype::f16});
    out.push_back({"deepseek-v3-small", type, 16, 512, 64, 16, {1, 300, 151}, 40, 40, type != dtype::f16});
    out.push_back({"kimi-k2", type, 64, 512, 64, 64, {1, 1000, 4096, 600}, 64, 40, false});
    out.push_back({"glm-5", type, 64, 512, 64, 64, {17, 2048, 700}, 64, 40, false});
  }
  return out;
}

// The MLA metric: attention_error's, |o - o_ref| over the largest |c| among the latents the query
// attends (scaled: what the output is a weighted mean of). MLA's tensor cores round the queries
// and the softmax weights (times an FP8 row's scale) to bf16, as paged attention's do; its scores
// reach further (a row of 576 against 64 to 256), so its tolerance is stated on its own, from the
// mutation test (tests/unit/kernels/kernel_mutation_test.cpp): the rounding it accepts, the
// scale mix-ups and the missed key it rejects.
inline double mla_error(double o, double o_ref, double c_max) { return attention_error(o, o_ref, c_max); }

inline constexpr double mla_f32_tolerance = 0x1p-13;
inline constexpr double mla_tensor_core_tolerance = 0x1p-6;

struct dsa_case {
  std::string shape;
  dtype kv;
  std::int64_t heads, head_dim, top_k;
  std::int64_t block_size;
  std::vector<std::int64_t> contexts;  // decode tokens at the ends of all but the last; a chunk of the last
  std::int64_t chunk;
  bool quick = true;
};
inline std::vector<dsa_case> dsa_select_cases() {
  struct shape {
    const char* name;
    std::int64_t heads, head_dim, top_k;
    bool quick;
  };
  // The tiny GLM-5 model's indexer (8 heads of 16, keeping 8); GLM-5's (32 heads of 128) and
  // DeepSeek-V3.2's (64 of 128), keeping 2048 and an awkward 100.
  const std::vector<shape> shapes = {{"glm-5-tiny indexer", 8, 16, 8, true},
                                     {"glm-5 indexer", 32, 128, 2048, false},
                                     {"deepseek-v3.2 indexer", 64, 128, 2048, false},
                                     {"deepseek-v3.2 indexer, top 100", 64, 128, 100, true}};
  std::vector<dsa_case> out;
  for (const shape& s : shapes) {
    for (const dtype type : {dtype::fp8_e4m3, dtype::bf16, dtype::f16, dtype::f32}) {
      for (const std::int64_t block_size : {16, 64}) {
        // Decode at 1, 17, 300, 2100 and 9000 positions, and a prefill run of 8 tokens ending at
        // position 2052 (the first of them within top_k 2048, the rest past it); the quick set's
        // twin stops at 300, with a run of 4 ending at 129.
        out.push_back({s.name, type, s.heads, s.head_dim, s.top_k, block_size, {1, 17, 300, 2100, 9000, 2053}, 8, false});
        if (s.quick && type != dtype::f16 && block_size == 16) {
          out.push_back({s.name, type, s.heads, s.head_dim, s.top_k, block_size, {1, 17, 300, 130}, 4, true});
        }
      }
    }
  }
  for (const dtype type : {dtype::fp8_e4m3, dtype::bf16, dtype::f16, dtype::f32}) {
    out.push_back({"awkward", type, 3, 16, 8, 16, {1, 9, 54, 97}, 5, type != dtype::f16});
    out.push_back({"glm-5 indexer, a chunk at 4096", type, 32, 128, 2048, 64, {17, 2048, 4096}, 8, false});
  }
  return out;
}

// How many cases a kernel has (the case list test).
inline std::size_t case_count(std::string_view kernel) {
  if (kernel == "embedding") return embedding_cases().size();
  if (kernel == "rmsnorm") return rmsnorm_cases().size();
  if (kernel == "rope") return rope_cases().size();
  if (kernel == "silu_mul") return silu_mul_cases().size();
  if (kernel == "matmul") return matmul_cases().size();
  if (kernel == "head_matmul") return head_matmul_cases().size();
  if (kernel == "quantize" || kernel == "dequantize") return quantize_cases().size();
  if (kernel == "kv_cache_write") return kv_cache_write_cases().size();
  if (kernel == "kv_block_copy") return kv_block_copy_cases().size();
  if (kernel == "paged_attention") return attention_cases().size();
  if (kernel == "sampling") return sampling_cases().size();
  if (kernel == "moe_routing") return moe_routing_cases().size();
  if (kernel == "moe_experts") return moe_experts_cases().size();
  if (kernel == "mla_attention") return mla_attention_cases().size();
  if (kernel == "dsa_select") return dsa_select_cases().size();
  return 0;
}

}  // namespace edge::kernel_cases
