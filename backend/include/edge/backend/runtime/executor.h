// The executor runs the model over one step's batch: a ragged set of sequences, each
// contributing a chunk of prompt tokens (prefill) or its one newest token (decode).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/backend/runtime/kv_cache.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/status.h"
#include "kernels/sampling/sampling.h"

namespace edge::backend {

struct batch_entry {
  std::span<const token_id> tokens;           // this step's tokens of the sequence
  std::int64_t start_position = 0;            // position of tokens[0]
  std::span<const std::int32_t> block_table;  // blocks covering positions [0, start_position + tokens.size())
  bool compute_logits = false;                // logits for the last of `tokens` (the row sampled)
  // Prompt logits rows too, for tokens [prompt_logits_offset, + prompt_logits_count) of
  // `tokens` (a prompt's own log probabilities): they come after every entry's compute_logits
  // row, entry after entry.
  std::int64_t prompt_logits_offset = 0;
  std::int64_t prompt_logits_count = 0;
};

struct batch_plan {
  std::vector<batch_entry> entries;
  // Whole blocks copied (every layer's K, V and scales) before any token of the step is computed.
  std::vector<block_copy> copies;
  // The host tier's copies (allocate_host_tier), before `copies`: KV blocks packed into host
  // slots first, then host slots unpacked into KV blocks. The restores are done before this
  // step computes, or, where restores_overlap_step() says so, beside it and before the next.
  // A plan may hold copies and no tokens.
  std::vector<tier_copy> spills;
  std::vector<tier_copy> restores;

  std::int64_t total_tokens() const;
  std::int64_t logits_rows() const;         // entries with compute_logits
  std::int64_t prompt_logits_rows() const;  // Σ prompt_logits_count
};

// Prompt logits rows a step of an executor whose KV blocks hold `block_size` tokens computes at
// most: at least a block (a prompt chunk is whole blocks), and at least enough that a long
// prompt is not cut into slivers; the buffers grow by as many rows of the vocabulary.
std::int64_t prompt_logits_rows_per_step(std::int64_t block_size);

// What forward_sample does with one logits row (one per entry with compute_logits, in order).
struct row_sampling {
  // Sample on the executor with `config`; false leaves the row to the caller (who needs to
  // change the logits first: repetition, presence and frequency penalties).
  bool sample = true;
  kernels::sampling_row config;
  // Copy the row's raw logits to the host (for log probabilities, or for sampling there).
  bool copy_logits = false;
  // [kernels::allowed_words(vocab)] the tokens the draw may take (a grammar's mask: bit t % 32
  // of word t / 32); empty: any. Its words may be written by forward_sample's mask_filler, which
  // runs before they are read. Copied logits stay raw (unmasked).
  std::span<const std::uint32_t> allowed;
  // The row's logit biases (a request's logit_bias): applied before it is sampled, on the
  // executor or, for a row left to the caller, by the caller.
  std::span<const kernels::logit_bias> bias;
};

// Writes the token masks that rows' `allowed` spans point to. forward_sample calls it once, once
// the forward pass is under way and before it reads any mask: on a GPU the host fills the masks
// while the device computes the step. Empty: the masks are written already.
using mask_filler = std::function<void()>;

// What an executor did on its own, counted since it was created (for metrics).
struct executor_counters {
  std::int64_t graph_capture_failures = 0;  // CUDA graph captures that failed (those sizes run eagerly)
};

// What the Mixture-of-Experts layers of the last forward pass chose (all empty for a dense
// model, or before the first forward).
struct expert_routing {
  std::int64_t moe_layers = 0;
  std::int64_t tokens = 0;   // of the last step, padding included
  std::int64_t top_k = 0;    // the most experts a token takes in any layer
  std::int64_t experts = 0;  // the most experts of any layer
  // [moe_layers, tokens, top_k] each token's experts, best first; empty where the executor does
  // not bring them to the host.
  std::span<const std::int32_t> choices;
  std::span<const std::int32_t> expert_tokens;  // [moe_layers, experts] tokens each expert ran
};

class executor {
 public:
  virtual ~executor() = default;

  // Does the plan's block copies, writes every token's K/V into the cache and, for each entry
  // with compute_logits (in entry order), one row of `logits`, then the prompt logits rows
  // ([logits_rows + prompt_logits_rows, vocab]).
  virtual status forward(const batch_plan& plan, std::span<float> logits) = 0;

  // The serving path: forward, then each compute_logits row as `rows` says. tokens[r] is the
  // token sampled for row r (untouched for rows that are not sampled); `logits` receives the
  // rows with copy_logits, in order, then the plan's prompt logits rows ([rows with
  // copy_logits + prompt_logits_rows, vocab]). On a GPU only those rows and the token ids cross
  // to the host. `fill_masks` (when set) writes the rows' masks, as mask_filler says.
  virtual status forward_sample(const batch_plan& plan, std::span<const row_sampling> rows,
                                std::span<std::int32_t> tokens, std::span<float> logits,
                                const mask_filler& fill_masks) = 0;

  // The KV pool the executor computes on: what the engine's block pool may hand out.
  virtual const kv_cache_layout& kv_layout() const = 0;

  // Most tokens one forward() takes (all entries together), and most entries.
  virtual std::int64_t max_batch_tokens() const = 0;
  virtual std::int64_t max_sequences() const = 0;
  virtual std::int64_t vocab_size() const = 0;
  // Most prompt logits rows one step takes (prompt_logits_rows_per_step of its block size).
  virtual std::int64_t max_prompt_logits_rows() const = 0;

  virtual executor_counters counters() const { return {}; }

  // Host memory for a host tier of `slots` blocks (kv_host_tier.h), each kv_layout()
  // .bytes_per_block() bytes packed as kv_cache_view packs a block, which the plans' spills and
  // restores address by slot. Page-locked on a GPU, so that its copies are asynchronous. Once,
  // before the first step: resource_exhausted when the memory cannot be had.
  virtual result<std::span<std::byte>> allocate_host_tier(std::int64_t slots) {
    static_cast<void>(slots);
    return failed_precondition("this executor keeps no host tier");
  }
  // Whether a step's restores run beside its compute (scheduler_config::restores_overlap_step).
  virtual bool restores_overlap_step() const { return false; }
  // Waits until the host tier copies of the steps run so far are done, so that the host may
  // read and write their slots.
  virtual status finish_tier_copies() { return {}; }
  // Appends how long each step's copies back (restores) took, for those measured since the last
  // call (on a GPU, those finished by now).
  virtual void take_copy_back_seconds(std::vector<double>& out) { static_cast<void>(out); }

  virtual expert_routing last_routing() const { return {}; }
};

}  // namespace edge::backend
