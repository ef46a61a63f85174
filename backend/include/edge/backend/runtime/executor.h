// The executor runs the model over one step's batch: a ragged set of sequences, each
// contributing a chunk of prompt tokens (prefill) or its one newest token (decode).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/status.h"

namespace edge::backend {

struct batch_entry {
  std::span<const token_id> tokens;           // this step's tokens of the sequence
  std::int64_t start_position = 0;            // position of tokens[0]
  std::span<const std::int32_t> block_table;  // blocks covering positions [0, start_position + tokens.size())
  bool compute_logits = false;                // logits for the last of `tokens`
};

struct batch_plan {
  std::vector<batch_entry> entries;

  std::int64_t total_tokens() const;
  std::int64_t logits_rows() const;
};

class executor {
 public:
  virtual ~executor() = default;

  // Writes every token's K/V into the cache and, for each entry with compute_logits (in entry
  // order), one row of `logits` ([logits_rows, vocab]).
  virtual status forward(const batch_plan& plan, std::span<float> logits) = 0;

  // Most tokens one forward() takes (all entries together), and most entries.
  virtual std::int64_t max_batch_tokens() const = 0;
  virtual std::int64_t max_sequences() const = 0;
  virtual std::int64_t vocab_size() const = 0;
};

}  // namespace edge::backend
