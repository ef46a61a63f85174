// The forward pass, once for every executor: it walks a model_plan and calls the kernels'
// run_<op> entry points, which run on the stream's device. An executor supplies where things
// live (weights placed by place_weights, buffers carved by carve_forward_buffers, the step's
// metadata staged by stage_step and, on a GPU, copied to the device) and how steps are
// launched (eagerly, or replayed as CUDA graphs); the arithmetic is here.
//
// Pointers in these structs are host or device pointers, as the stream's device says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "edge/backend/model/model.h"
#include "edge/backend/model/model_plan.h"
#include "edge/backend/runtime/executor.h"
#include "edge/backend/runtime/kv_cache.h"
#include "edge/common/status.h"
#include "edge/kernels/stream.h"
#include "edge/kernels/weight_format.h"
#include "kernels/moe_experts/moe_experts.h"

namespace edge::backend {

// Matrices whose outputs lie side by side in one row of the output: Q, K and V (gate and up).
// One part when they are stacked (by the loader, layer_weights::wqkv, or by the placement),
// else one per matrix; a part's output starts where the previous one's ends.
struct projection_part {
  kernels::weight_view w;     // [rows, k]
  std::int64_t rows = 0;
  const float* bias = nullptr;  // [rows] or null
};

struct layer_forward_weights {
  const float* attn_norm = nullptr;         // [hidden]
  std::vector<projection_part> qkv;         // [qkv_dim, hidden] in all (MLA: mla_plan's first projection)
  const float* q_norm = nullptr;            // [head_dim] (qk_norm only)
  const float* k_norm = nullptr;            // [head_dim] (qk_norm only)
  const float* rope_inv_freq = nullptr;     // [rotary_dim / 2]
  kernels::weight_view wo;                  // [hidden, q_dim]
  // Latent attention (model.h's layer_weights has the shapes).
  const float* q_a_norm = nullptr;          // [q_lora_rank]
  kernels::weight_view wq_b;                // [heads * qk_head, q_lora_rank]
  const float* kv_a_norm = nullptr;         // [kv_lora_rank]
  kernels::weight_view wkv_b;               // [heads * (nope + v_head_dim), kv_lora_rank]
  kernels::weight_view w_uk_t;              // [heads * kv_lora_rank, nope]
  kernels::weight_view index_wq;            // [index_heads * index_head_dim, q_lora_rank]
  const float* index_k_norm = nullptr;      // [index_head_dim]
  const float* index_k_norm_bias = nullptr; // [index_head_dim]
  const float* ffn_norm = nullptr;          // [hidden]
  // The dense SwiGLU, or a MoE layer's shared experts (empty without them).
  std::vector<projection_part> gate_up;     // [2 intermediate, hidden] in all: gate rows, then up rows
  kernels::weight_view w_down;              // [hidden, intermediate]
  kernels::weight_view router;              // [experts, hidden] (MoE)
  const float* router_bias = nullptr;       // [experts] (MoE with a correction bias)
  std::vector<kernels::moe_expert_weights> experts;  // [experts] (MoE)
  // [experts] a copy of `experts` where the kernels read it on a device (CUDA), or null.
  const kernels::moe_expert_weights* device_experts = nullptr;
};

struct forward_weights {
  const void* embedding = nullptr;  // [vocab, hidden] of embedding_type
  kernels::dtype embedding_type = kernels::dtype::f32;
  std::vector<layer_forward_weights> layers;
  const float* final_norm = nullptr;  // [hidden]
  kernels::weight_view lm_head;       // [vocab, hidden]
};

// Where an executor keeps weights: host views of the model's memory, or device copies.
class weight_placement {
 public:
  virtual ~weight_placement() = default;
  virtual result<kernels::weight_view> matrix(const weight_matrix& w) = 0;
  // Matrices of one layout (same_layout) placed as one, their rows in order; nullopt when this
  // placement runs them as they are (the host: no copy of weights used in place).
  virtual result<std::optional<kernels::weight_view>> stack(std::span<const weight_matrix* const> parts) = 0;
  // The values must stay valid (copied, or kept) after the call returns.
  virtual result<const float*> floats(std::span<const float> values) = 0;
  // A tensor's elements as stored (the token embedding table).
  virtual result<const void*> elements(const tensor_view& t) = 0;
  // The views of a MoE layer's experts where a device's kernels read them
  // (moe_experts_params::device_matrices), or null where they read the host array.
  virtual result<const kernels::moe_expert_weights*> expert_views(std::span<const kernels::moe_expert_weights> views) = 0;
};

// Checks every weight's shape against the plan (invalid_argument naming the tensor) and places
// it: matrices as stored (stacked where the model stacked them, or where the placement stacks
// them), norms and biases as f32, one RoPE frequency table per distinct rope plan, and a tied
// classifier as the placed embedding. unimplemented for a plan the forward pass cannot run.
result<forward_weights> place_weights(const model& m, const model_plan& plan, weight_placement& place);

struct forward_buffers {
  float* x = nullptr;        // [tokens, hidden] the residual stream
  float* xn = nullptr;       // [tokens, hidden] normalised
  float* qkv = nullptr;      // [tokens, qkv_dim] Q, K and V side by side
  float* attn = nullptr;     // [tokens, q_dim]
  float* gate_up = nullptr;  // [tokens, 2 intermediate] gate, then up
  float* last = nullptr;     // [rows, hidden] the rows that produce logits, normalised
  float* logits = nullptr;   // [rows, vocab]
  float* matmul_workspace = nullptr;  // [matmul_workspace_floats] (CUDA split-K)
  std::int64_t matmul_workspace_floats = 0;
  float* attention_workspace = nullptr;  // [attention_workspace_floats] (CUDA split attention, GQA and MLA)
  std::int64_t attention_workspace_floats = 0;
  float* index_scores = nullptr;         // [index_scores_floats] (CUDA DSA selection: every position's score)
  std::int64_t index_scores_floats = 0;
  // Mixture-of-Experts layers (null for a dense model). After a step, route_experts and
  // expert_tokens hold what each MoE layer chose: the m-th MoE layer's rows begin at
  // m × tokens × max_top_k and m × max_experts.
  float* router_logits = nullptr;          // [tokens, max_experts]
  float* route_weights = nullptr;          // [tokens, max_top_k]
  std::int32_t* route_experts = nullptr;   // [moe_layers, tokens, max_top_k] each token's experts, best first
  std::int32_t* expert_tokens = nullptr;   // [moe_layers, max_experts] tokens each expert ran
  float* moe_workspace = nullptr;          // [moe_workspace_floats]
  std::int64_t moe_workspace_floats = 0;
  // Latent attention layers (null without them).
  float* mla_query = nullptr;              // [tokens, heads * qk_head] q after q_b_proj
  float* latents = nullptr;                // [tokens, heads * kv_lora_rank] the absorbed queries, then the attention's latents
  float* index_query = nullptr;            // [tokens, index_heads * index_head_dim] (DSA)
  std::int32_t* selected = nullptr;        // [tokens, index_topk] the positions each token attends to (DSA)
  std::int32_t* selected_count = nullptr;  // [tokens] (DSA; 0: all of them)
  float* mla_workspace = nullptr;          // [mla_workspace_floats] the expanded prefill's (CPU)
  std::int64_t mla_workspace_floats = 0;
};

// What a step's buffers are sized for.
struct forward_buffer_shape {
  std::int64_t tokens = 0;       // the most tokens of a step
  std::int64_t logits_rows = 0;  // the most logits rows of a step: a sampled one per entry, then the prompt logits rows
  std::int64_t context = 0;      // the most positions one block table reaches (the DSA indexer's scores)
  kernels::device where = kernels::device::cpu;  // whose kernels use them: each device has workspaces of its own
};

// Every array of forward_buffers lives in one allocation, carved in the order of the buffer
// table in forward.cpp, which gives each array's length for a shape: a buffer is a member above
// and a row there, and both executors' memory follows. Each array starts at a multiple of
// forward_buffer_alignment bytes.
inline constexpr std::size_t forward_buffer_alignment = 256;

// Bytes of the allocation for `shape` (the MoE and latent attention arrays are empty without
// such layers, a device's workspaces empty on another).
std::size_t forward_buffer_bytes(const model_plan& plan, const forward_buffer_shape& shape);

// The arrays carved from `memory` (forward_buffer_bytes(plan, shape) bytes, aligned to
// forward_buffer_alignment), their *_floats lengths set; an empty array's pointer is null.
forward_buffers carve_forward_buffers(const model_plan& plan, const forward_buffer_shape& shape, std::byte* memory);

// One step's metadata, as the kernels read it.
struct forward_step {
  const std::int32_t* ids = nullptr;           // [tokens]
  const std::int32_t* positions = nullptr;     // [tokens]
  const std::int32_t* seq = nullptr;           // [tokens] entry of each token
  const std::int64_t* slots = nullptr;         // [tokens] KV slot: block * block_size + offset
  const std::int32_t* block_tables = nullptr;  // [table_begin[seqs]] each entry's blocks, one after another
  const std::int32_t* table_begin = nullptr;   // [seqs + 1] first block-table element of each entry
  const std::int32_t* seq_begin = nullptr;     // [seqs + 1] first token of each entry
  const std::int64_t* last_token = nullptr;    // [rows] token whose hidden state gives each logits row
  std::int64_t tokens = 0;
  std::int64_t seqs = 0;
  std::int64_t rows = 0;     // sampled rows, then prompt logits rows
  std::int64_t max_run = 0;  // most tokens of one entry
  // Host memory: blocks to copy before the step's tokens are computed (batch_plan::copies; a
  // step with copies never runs as a CUDA graph).
  std::span<const block_copy> copies;
};

// Host arrays stage_step writes, sized for the step (tokens and entries, padding included).
struct step_arrays {
  std::int32_t* ids = nullptr;           // [tokens]
  std::int32_t* positions = nullptr;     // [tokens]
  std::int32_t* seq = nullptr;           // [tokens]
  std::int64_t* slots = nullptr;         // [tokens]
  std::int32_t* block_tables = nullptr;  // [seqs * max_table_blocks] room; each entry's blocks, ragged
  std::int32_t* table_begin = nullptr;   // [seqs + 1]
  std::int32_t* seq_begin = nullptr;     // [seqs + 1]
  std::int64_t* last_token = nullptr;    // [seqs + prompt logits rows]
};

struct staged_step {
  std::int64_t tokens = 0;
  std::int64_t seqs = 0;
  std::int64_t rows = 0;         // logits rows in all: one per entry with compute_logits (and per padding entry), then the prompt logits rows
  std::int64_t sampled_rows = 0; // of those, the first ones
  std::int64_t max_run = 0;
  std::int64_t table_entries = 0;  // block-table elements written: what a device copy of them needs
};

// Tokens and entries a batch needs in the executor's buffers when padded to `padded_seqs`
// entries (each padding entry is one token).
std::int64_t padded_tokens(const batch_plan& plan, std::int64_t padded_seqs);

// Checks the plan against the executor's limits, the vocabulary and the KV pool
// (invalid_argument) and writes its metadata. Each entry's block table holds the blocks its
// positions reach (at most `max_table_blocks`), right after the previous entry's. Entries past
// the plan's, up to `padded_seqs`, are padding for CUDA-graph batches: one token at position 0
// of block `pad_block` (which stays zero: its slot is -1, written nowhere), its logits computed
// and unused. last_token gets the sampled rows' tokens, then the prompt logits rows' tokens;
// the plan's block copies are checked against the pool.
result<staged_step> stage_step(const batch_plan& plan, std::int64_t padded_seqs, std::int64_t vocab,
                               const kv_cache_layout& kv, std::int64_t max_table_blocks, std::int64_t pad_block,
                               const step_arrays& out);

// invalid_argument unless forward_sample's arguments fit the plan: one row_sampling and one
// token per logits row, and `logits` holding vocab floats per row with copy_logits.
status check_sampling_args(const batch_plan& plan, std::span<const row_sampling> rows, std::span<std::int32_t> tokens,
                           std::span<float> logits, std::int64_t vocab);

// Where stage_sampling writes the step's sampling settings.
struct sampling_arrays {
  kernels::sampling_row* config = nullptr;  // [rows]
  kernels::logit_bias* biases = nullptr;    // [rows * max_logit_bias_entries] room: the rows' biases, one after another
};

struct staged_sampling {
  std::int64_t bias_entries = 0;  // biases written
  // The constrained rows' token masks, in the order of their allowed_row. Not read here: a
  // mask_filler may still be writing their words.
  std::vector<std::span<const std::uint32_t>> masks;
};

// Writes the settings of the step's first `rows` sampled rows as kernels::run_sampling reads
// them: a row sampled on the executor gets its config, its biases (after the previous rows') and
// its mask's row; a row left to the caller (or past the end of `sampling`) gets a greedy draw
// nobody reads. invalid_argument for a row of more than max_logit_bias_entries biases or a mask
// of other than allowed_words(vocab) words.
result<staged_sampling> stage_sampling(std::span<const row_sampling> sampling, std::int64_t rows, std::int64_t vocab,
                                       const sampling_arrays& out);

// invalid_argument unless forward's `logits` holds vocab floats per logits row of the plan.
status check_logits_buffer(const batch_plan& plan, std::span<float> logits, std::int64_t vocab);

// failed_precondition when the plan has host tier copies and the executor no host tier;
// invalid_argument when a copy names a block past `blocks` or a slot past `slots`.
status check_tier_copies(const batch_plan& plan, std::int64_t blocks, std::int64_t slots);

// invalid_argument when the plan exceeds max_tokens tokens, max_seqs entries or
// max_prompt_logits prompt logits rows, or an entry's prompt logits rows fall outside its tokens.
status check_batch_limits(const batch_plan& plan, std::int64_t max_tokens, std::int64_t max_seqs,
                          std::int64_t max_prompt_logits);

// Block-table entries a sequence needs at most: the model's context in blocks.
std::int64_t max_table_blocks(const model_plan& plan, std::int64_t block_size);

// The whole forward pass of one staged step: the block copies, every token's K/V into the
// cache, and for each logits row its logits. Queues work on the stream and returns (a CUDA
// stream runs it later).
status run_forward(const model_plan& plan, const forward_weights& weights, const forward_buffers& buffers,
                   const forward_step& step, const kv_cache_view& kv, const kernels::stream& stream);

// The kernels a one-token decode step's forward pass queues on a CUDA stream: run_forward on
// kernels::device::count, where nothing runs and nothing is read (no weights or device needed).
// What the CUDA executor reports at start-up and a test holds Kimi K2 and GLM-5 to; -1 when the
// pass refuses the plan.
std::int64_t count_decode_launches(const model_plan& plan, const forward_weights& weights,
                                   const forward_buffers& buffers, const kv_cache_view& kv);

}  // namespace edge::backend
