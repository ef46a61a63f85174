// Causal attention for a ragged batch over the paged KV cache (prefill chunks and decode
// tokens alike).
//
// Token t belongs to sequence seq[t] and sits at position pos[t]; it attends to positions
// 0..pos[t] of its sequence, whose K/V rows are found through the sequence's block table
// (those of the token itself included, so the cache must be written first). Grouped-query
// attention: query head h reads KV head h / (num_heads / num_kv_heads), and each KV row is
// read once for the whole group. Softmax is computed online, one KV block at a time, in a
// fixed order per token, so on the CPU results do not depend on batch composition. The CUDA
// kernel splits a context into a number of slices chosen from the batch's size (to fill the
// device), so there a token's result may round differently in another batch.
//
// An fp8_e4m3 cache is dequantized inside the kernel (kv_cache_write.h describes the scales):
// a K row's scale multiplies its dot product with q, and a V row's scale multiplies its
// softmax weight, so the scale costs one multiply per row, not one per element.
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/dtype.h"
#include "edge/kernels/stream.h"

namespace edge::kernels {

// Limits of the CPU kernel's on-stack accumulators.
inline constexpr std::int64_t max_attention_head_dim = 256;
inline constexpr std::int64_t max_attention_group = 32;

struct paged_attention_params {
  const float* q;                   // [tokens, num_heads, head_dim], token stride q_stride
  float* out;                       // [tokens, num_heads, head_dim], token stride out_stride
  const void* k_cache;              // [num_blocks, num_kv_heads, block_size, head_dim]
  const void* v_cache;              // [num_blocks, num_kv_heads, block_size, head_dim]
  const float* k_scales = nullptr;  // [num_blocks, num_kv_heads, block_size]; when kv_cache_scaled(kv_type)
  const float* v_scales = nullptr;  // [num_blocks, num_kv_heads, block_size]; when kv_cache_scaled(kv_type)
  dtype kv_type = dtype::f32;
  const std::int32_t* seq;          // [tokens] the token's row of table_begin
  const std::int32_t* pos;          // [tokens]
  // The block tables, one after another: row s holds block_tables[table_begin[s] ..
  // table_begin[s + 1]), as many blocks as the row's sequence covers (ragged, so that a step
  // stages and uploads only the blocks its sequences use).
  const std::int32_t* block_tables; // [table_begin[rows]]
  const std::int32_t* table_begin;  // [rows + 1]
  std::int64_t tokens = 0;
  std::int64_t num_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t block_size = 0;
  std::int64_t num_blocks = 0;
  std::int64_t q_stride = 0;
  std::int64_t out_stride = 0;
  float scale = 0.0f;               // usually 1 / sqrt(head_dim)

  // CUDA only, all optional. The batch as runs of consecutive tokens, one run per sequence
  // (run r holds tokens [seq_token_begin[r], seq_token_begin[r + 1]), each with seq[t] == r):
  // one block then serves several query tokens of a run (prefill), reading each K/V tile once
  // for all of them. Without it every token gets its own blocks.
  const std::int32_t* seq_token_begin = nullptr;  // [num_seqs + 1]
  std::int64_t num_seqs = 0;
  std::int64_t max_seq_tokens = 0;                // the longest run
  // Scratch: the flat list of (run, tile) blocks when runs differ in length (else each run gets
  // as many blocks as the longest needs), then the partials of long contexts split across
  // blocks (split-K, combined in a fixed order). Null (or too small) gives each (token tile, KV
  // head) one block.
  float* workspace = nullptr;                     // [workspace_floats]
  std::int64_t workspace_floats = 0;
};

// The CUDA kernel splits a context at most this many ways.
inline constexpr std::int64_t attention_max_splits = 32;

// Workspace floats with which the CUDA paged attention never gives up a split it wants.
constexpr std::int64_t paged_attention_workspace_floats(std::int64_t tokens, std::int64_t num_heads,
                                                        std::int64_t head_dim) {
  return (tokens + 4) / 4 * 4 + tokens * num_heads * attention_max_splits * (head_dim + 2);
}

// Whether the CUDA paged attention runs a call on tensor cores, rounding q, K and the softmax
// weights to bf16 (the scores, the softmax and the output stay f32): runs of several query
// tokens (prefill chunks; seq_token_begin given) over a bf16 or FP8 cache with head_dim 64 or
// 128 and a group that divides 64. Everything else (decode steps, f16 / f32 caches, other
// head sizes) multiplies in f32.
constexpr bool cuda_attention_uses_tensor_cores(dtype kv, std::int64_t head_dim, std::int64_t group, bool runs,
                                                std::int64_t max_run) {
  return runs && max_run > 1 && (kv == dtype::bf16 || kv == dtype::fp8_e4m3) && (head_dim == 64 || head_dim == 128) &&
         group > 0 && 64 % group == 0;
}

// invalid_argument for a shape beyond the limits above, a position beyond its block table, a
// block outside the cache, or a scaled KV dtype without its scales.
status run_paged_attention(const paged_attention_params& p, const stream& s);

}  // namespace edge::kernels
