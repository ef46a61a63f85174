// One step of continuous batching, for the serving engine and the synchronous generator alike:
// the scheduler's plan runs on the executor (forward_sample: sampled there, the logits rows
// copied to the host only for the sequences that need them), each sampled token is recorded with
// the scheduler and fed to its sequence's decoder. What happens around a step (events, clocks,
// metrics, finishing sequences) is the caller's. Engine thread only (or the generator's thread).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "edge/backend/engine/scheduler.h"
#include "edge/backend/runtime/executor.h"
#include "edge/backend/runtime/sampler.h"
#include "edge/backend/runtime/sequence_decoder.h"
#include "edge/common/status.h"

namespace edge::backend {

// What the driver needs of a sequence whose chunk samples or has prompt logits rows.
struct driven_sequence {
  sequence_decoder* decoder = nullptr;
  std::optional<std::int32_t> logprobs;  // log probabilities of the sampled token and this many alternatives
  std::int32_t prompt_logprobs = 0;      // alternatives for each prompt token's log probability
};

struct sampled_token {
  sequence_id id = 0;
  token_id token = 0;
  sequence_decoder::step decoded;           // the text it released, and whether it ended the sequence
  std::optional<sampled_logprobs> logprobs; // when the sequence asked for them
};

// A sequence's prompt log probabilities from one step, in position order: entry i is prompt
// token first + i's, given the tokens before it (first >= 1).
struct scored_prompt {
  sequence_id id = 0;
  std::int64_t first = 0;
  std::vector<sampled_logprobs> logprobs;
};

class step_driver {
 public:
  // The scheduler and executor must outlive the driver.
  step_driver(scheduler& sched, executor& exec);

  // Runs `plan` (the scheduler's latest) and returns one sampled token per chunk that samples,
  // in plan order (the driver's own buffer: valid until the next run; the caller may move out
  // of it). `sequence_of(id)` gives each such sequence's decoder, and that of each sequence with
  // prompt logits rows; a sequence must not be removed from the scheduler until run() returns.
  // On an error nothing is recorded (the caller ends the plan's sequences).
  result<std::span<sampled_token>> run(const step_plan& plan,
                                       const std::function<driven_sequence(sequence_id)>& sequence_of);
  // The prompt log probabilities the latest run() computed, in plan order (the caller may move
  // out of them).
  std::span<scored_prompt> scored_prompts() { return scored_; }

 private:
  scheduler& sched_;
  executor& exec_;
  // Per step, kept to avoid allocations.
  batch_plan batch_;
  std::vector<sequence_id> row_ids_;        // [rows]
  std::vector<driven_sequence> row_seqs_;   // [rows]
  std::vector<row_sampling> rows_;          // [rows]
  std::vector<std::int32_t> tokens_;        // [rows]
  std::vector<float> logits_;               // [rows with copy_logits + prompt logits rows, vocab]
  std::vector<float> raw_;                  // [vocab] a row's logits before penalties
  std::vector<std::uint32_t> masks_;        // [constrained rows, allowed_words(vocab)] grammars' token masks
  std::vector<std::size_t> constrained_rows_;  // [constrained rows] their rows' indices, in order
  std::vector<sampled_token> sampled_;      // [rows] what run() returns
  std::vector<scored_prompt> scored_;       // what scored_prompts() returns
};

}  // namespace edge::backend
