// Multi-head Latent Attention (DeepSeek-V3, Kimi K2, GLM-5) over a paged latent cache, and the
// DeepSeek Sparse Attention indexer's choice of keys.
//
// An MLA layer caches, per token, one row of latent_dim + rope_dim values: the normalised
// latent c (kv_a_layernorm of kv_a_proj's first kv_lora_rank outputs) followed by the rotated
// key k_pe that every head shares. Head h's key is [W_UK[h] c | k_pe] and its value W_UV[h] c,
// where kv_b_proj stacks W_UK[h] ([qk_nope_head_dim, latent_dim]) and W_UV[h] ([v_head_dim,
// latent_dim]) per head. This kernel runs the absorbed form: the caller folds W_UK into the
// query (q_latent[h] = q_nope[h] · W_UK[h]) and applies W_UV after, so the score is
//   scale · (q_latent[h] · c + q_rope[h] · k_pe)
// and the kernel's output per head is the softmax-weighted sum of the latents c, read once for
// all heads of a token. Softmax is online, block by block, in position order per token, so on
// the CPU a token's result does not depend on the batch.
//
// With DSA a token may attend to a chosen subset of its positions instead (selected[t]: its
// count, ascending). A count of 0 means every position 0..pos[t], which is what the indexer
// writes for a token whose context holds no more than its top_k: dense and sparse attention
// then run the same code and agree exactly.
//
// The cache layout, per layer (one "head" of rows, as kv_cache_write writes it with
// num_kv_heads = 1):
//   cache:   [num_blocks, block_size, latent_dim + rope_dim] of kv_type
//   scales:  [num_blocks, block_size] of f32 (fp8_e4m3: one scale for the whole row)
#pragma once

#include <cstdint>

#include "edge/common/status.h"
#include "edge/kernels/dtype.h"
#include "edge/kernels/stream.h"
#include "edge/kernels/weight_format.h"

namespace edge::kernels {

// Limits of the CPU kernel's accumulators (Kimi K2: 64 heads, DeepSeek-V3: 128; latent 512).
inline constexpr std::int64_t max_mla_heads = 256;
inline constexpr std::int64_t max_mla_row = 1024;  // latent_dim + rope_dim

struct mla_attention_params {
  const float* q_latent;        // [tokens, num_heads, latent_dim], token stride q_latent_stride
  const float* q_rope;          // [tokens, num_heads, rope_dim], token stride q_rope_stride, head stride q_rope_head_stride
  float* out;                   // [tokens, num_heads, latent_dim], token stride out_stride
  const void* cache;            // [num_blocks, block_size, latent_dim + rope_dim]
  const float* scales = nullptr;  // [num_blocks, block_size]; when kv_cache_scaled(kv_type)
  dtype kv_type = dtype::f32;
  const std::int32_t* seq;          // [tokens] the token's row of table_begin
  const std::int32_t* pos;          // [tokens]
  const std::int32_t* block_tables; // [table_begin[rows]] each row's blocks (paged_attention.h)
  const std::int32_t* table_begin;  // [rows + 1]
  // DSA (optional): the positions each token attends to.
  const std::int32_t* selected = nullptr;        // [tokens, select_stride], ascending
  const std::int32_t* selected_count = nullptr;  // [tokens]; 0: every position 0..pos[t]
  std::int64_t select_stride = 0;
  std::int64_t tokens = 0;
  std::int64_t num_heads = 0;
  std::int64_t latent_dim = 0;
  std::int64_t rope_dim = 0;
  std::int64_t block_size = 0;
  std::int64_t num_blocks = 0;
  std::int64_t q_latent_stride = 0;
  std::int64_t q_rope_stride = 0;
  std::int64_t q_rope_head_stride = 0;
  std::int64_t out_stride = 0;
  float scale = 0.0f;  // qk_head_dim^-0.5 (times YaRN's mscale²)

  // CUDA only, optional: scratch for the partial results of contexts split across blocks
  // (split-K, combined in a fixed order). Null (or too small) gives each (token, band of heads)
  // one block. The CPU needs none.
  float* workspace = nullptr;  // [workspace_floats]
  std::int64_t workspace_floats = 0;
};

// The CUDA kernel splits a context at most this many ways: 128 for one token (a block takes
// 64 heads, so a token alone is one block per slice, and 128 slices cover an H100's 132 SMs),
// fewer as tokens add blocks of their own, never under 32.
inline constexpr std::int64_t mla_attention_max_splits = 128;
constexpr std::int64_t mla_attention_splits_cap(std::int64_t tokens) {
  const std::int64_t share = tokens > 0 ? mla_attention_max_splits / tokens : mla_attention_max_splits;
  return share > 32 ? share : 32;
}

// Workspace floats with which the CUDA MLA attention of up to `tokens` tokens never gives up a
// split it wants.
constexpr std::int64_t mla_attention_workspace_floats(std::int64_t tokens, std::int64_t num_heads,
                                                      std::int64_t latent_dim) {
  std::int64_t most = 0;  // the largest tokens x splits cap of any call of up to `tokens` tokens
  for (std::int64_t t = 1; t <= tokens && t <= mla_attention_max_splits; ++t) {
    if (t * mla_attention_splits_cap(t) > most) most = t * mla_attention_splits_cap(t);
  }
  if (tokens * 32 > most) most = tokens * 32;
  return most * num_heads * (latent_dim + 2);
}

// Whether the CUDA MLA attention runs a call on tensor cores, rounding the queries and the
// softmax weights to bf16 (the scores, the softmax and the output stay f32; an FP8 cache's codes
// are exact in bf16): a bf16 or FP8 cache at DeepSeek-V3's row (latent 512, RoPE 64). Every
// other call multiplies in f32.
constexpr bool cuda_mla_uses_tensor_cores(dtype kv, std::int64_t latent_dim, std::int64_t rope_dim) {
  return (kv == dtype::bf16 || kv == dtype::fp8_e4m3) && latent_dim == 512 && rope_dim == 64;
}

// invalid_argument for shapes beyond the limits, a position beyond its block table, a block
// outside the cache, a selected position after the token's own, or a scaled dtype without
// scales. The CUDA kernels also need latent_dim up to 512, latent_dim and rope_dim in multiples
// of 4 and a 16-byte aligned cache; what the CPU refuses by reading the tables (positions,
// blocks, selections) they leave out of the softmax instead of reading outside the cache.
status run_mla_attention(const mla_attention_params& p, const stream& s);

// The DSA indexer's choice: for each token with more than top_k positions (pos[t] + 1 > top_k),
// the top_k earlier-or-equal positions s by
//   score(s) = Σ_h weight_scale · head_weights[t, h] · relu(q[t, h] · k[s])
// (ties to the lower position), written ascending to selected[t] with selected_count[t] =
// top_k; for every other token selected_count[t] = 0 (all positions). The index keys are
// cached per token ([num_blocks, block_size, index_dim], one scale per row for fp8).
struct dsa_select_params {
  const float* q;              // [tokens, index_heads, index_dim] rotated, token stride q_stride
  const float* head_weights;   // [tokens, index_heads], token stride weights_stride (weights_proj(x))
  float weight_scale = 1.0f;   // index_heads^-0.5 · index_dim^-0.5
  const void* key_cache;       // [num_blocks, block_size, index_dim]
  const float* key_scales = nullptr;  // [num_blocks, block_size]; when kv_cache_scaled(kv_type)
  dtype kv_type = dtype::f32;
  const std::int32_t* seq;
  const std::int32_t* pos;
  const std::int32_t* block_tables;
  const std::int32_t* table_begin;
  std::int32_t* selected;        // [tokens, top_k]
  std::int32_t* selected_count;  // [tokens]
  std::int64_t tokens = 0;
  std::int64_t index_heads = 0;
  std::int64_t index_dim = 0;
  std::int64_t top_k = 0;
  std::int64_t block_size = 0;
  std::int64_t num_blocks = 0;
  std::int64_t q_stride = 0;
  std::int64_t weights_stride = 0;

  // CUDA only: scratch for every position's score, workspace_context floats per token, for
  // workspace_floats / workspace_context tokens at a time (dsa_select_workspace_floats).
  // workspace_context bounds the contexts (the longest the executor's block tables reach); a
  // token with a longer context, which no caller schedules, gets selected_count 0. The CPU
  // needs none.
  float* workspace = nullptr;  // [workspace_floats]
  std::int64_t workspace_floats = 0;
  std::int64_t workspace_context = 0;
};

// Tokens whose scores the CUDA selection keeps at a time, at most.
inline constexpr std::int64_t dsa_select_chunk_tokens = 128;

// Workspace floats for selections of up to `tokens` tokens whose contexts reach `context`
// positions: every token's scores at once, or those of dsa_select_chunk_tokens tokens at a time.
constexpr std::int64_t dsa_select_workspace_floats(std::int64_t tokens, std::int64_t context) {
  return (tokens < dsa_select_chunk_tokens ? tokens : dsa_select_chunk_tokens) * context;
}

// invalid_argument as run_mla_attention's checks. The CUDA kernels also need up to 64 index
// heads, index_dim up to 128 in multiples of 4, a 16-byte aligned key cache and the workspace.
status run_dsa_select(const dsa_select_params& p, const stream& s);

// The expanded form, for a run of query tokens of one sequence (a prefill chunk): the
// sequence's cached latents are decompressed through kv_b_proj into per-head keys and values,
// mla_prefill_chunk positions at a time, and each query attends to them as in ordinary
// multi-head attention (head_dim nope + rope for the keys, v_head_dim for the values). Per
// (query, key) it costs heads × 2 × (qk_head + v_head_dim) flops against the absorbed form's
// heads × 2 × (2 kv_lora_rank + rope), plus the decompression, heads × 2 × kv_lora_rank × (nope +
// v_head_dim) per key, once per run: mla_expanded_pays says which is cheaper. The queries need
// no absorption and the output no per-head V projection. Token t of the run sits at position
// first_position + t and attends causally (or, with a selection, to its selected positions);
// keys are visited in position order in fixed chunks, so a token's result does not depend on
// the other tokens of its run. CPU only for now: a CUDA stream is failed_precondition, and
// the forward pass keeps the absorbed form there.
inline constexpr std::int64_t mla_prefill_chunk = 256;

struct mla_prefill_params {
  const float* q;               // [tokens, heads, nope + rope] (q_nope | q_pe rotated), token stride q_stride
  float* out;                   // [tokens, heads, v_head_dim], token stride out_stride
  const void* cache;            // [num_blocks, block_size, latent_dim + rope] (mla_attention_params' layout)
  const float* scales = nullptr;  // [num_blocks, block_size]; when kv_cache_scaled(kv_type)
  dtype kv_type = dtype::f32;
  const std::int32_t* block_table;  // [blocks covering first_position + tokens] the sequence's blocks
  const std::int32_t* selected = nullptr;        // [tokens, select_stride] (DSA), ascending
  const std::int32_t* selected_count = nullptr;  // [tokens]; 0: every position up to the token's own
  std::int64_t select_stride = 0;
  weight_view kv_b;             // [heads * (nope + v_head_dim), latent_dim]: per head K rows, then V rows
  std::int64_t first_position = 0;
  std::int64_t tokens = 0;
  std::int64_t heads = 0;
  std::int64_t latent_dim = 0;
  std::int64_t rope_dim = 0;
  std::int64_t nope = 0;
  std::int64_t v_head_dim = 0;
  std::int64_t block_size = 0;
  std::int64_t num_blocks = 0;
  std::int64_t q_stride = 0;
  std::int64_t out_stride = 0;
  float scale = 0.0f;
  float* workspace;             // [mla_prefill_workspace_floats(tokens, ...)]
  std::int64_t workspace_floats = 0;
};

constexpr std::int64_t mla_prefill_workspace_floats(std::int64_t tokens, std::int64_t heads, std::int64_t latent_dim,
                                                    std::int64_t rope_dim, std::int64_t nope, std::int64_t v_head_dim) {
  return mla_prefill_chunk * (latent_dim + rope_dim) + mla_prefill_chunk * heads * (nope + v_head_dim) +
         tokens * heads * (v_head_dim + 2);
}

// Whether the expanded form costs fewer flops than the absorbed one for `tokens` queries whose
// last sits at context `context` (tokens ≤ context).
constexpr bool mla_expanded_pays(std::int64_t tokens, std::int64_t context, std::int64_t latent_dim,
                                 std::int64_t rope_dim, std::int64_t nope, std::int64_t v_head_dim) {
  const std::int64_t saved_per_pair = 2 * latent_dim + rope_dim - (nope + rope_dim) - v_head_dim;
  const std::int64_t decompress_per_key = latent_dim * (nope + v_head_dim);
  // The absorbed form's own per-query work (absorption and the V projection) is saved too.
  return tokens * context * saved_per_pair + tokens * decompress_per_key >= context * decompress_per_key;
}

// invalid_argument for bad shapes, a short workspace, or a position beyond the block table.
status run_mla_prefill(const mla_prefill_params& p, const stream& s);

}  // namespace edge::kernels
