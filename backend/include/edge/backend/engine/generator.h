// Runs a set of requests to completion on one executor, synchronously on the calling thread:
// a thin loop over the serving engine's own scheduler and step driver (step_driver.h), so that
// `edgeinfer generate`, the model tests and the decode benchmark run exactly what serving runs.
// All requests are queued at once; the scheduler admits them as the token budget and the KV
// cache allow, prefills their prompts (in chunks when the budget is smaller) and decodes them in
// ragged batches until each ends.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/engine/engine.h"
#include "edge/backend/model/model.h"
#include "edge/backend/runtime/executor.h"
#include "edge/backend/runtime/kv_block_pool.h"

namespace edge::backend {

struct generation_output {
  std::vector<token_id> tokens;  // generated ids (a stop string's tokens included)
  std::string text;              // released text (up to, not including, a stop string)
  finish_reason reason = finish_reason::length;  // stop or length
};

// Steps are timed by what they computed: a step with any prompt chunk (or a recompute after a
// preemption) counts as prefill, one where every sequence decoded a single token as decode.
// With a budget that admits every prompt at once, these are the prefill phase and the decode
// phase; with a smaller one, the steps that mix both count as prefill.
struct generation_timing {
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  std::int64_t prefill_tokens = 0;  // tokens computed by prefill steps
  std::int64_t decode_tokens = 0;   // tokens sampled by decode steps
  std::int64_t decode_steps = 0;
};

struct generator_options {
  // Tokens per step at most (the scheduler's max_num_batched_tokens; at least a KV block):
  // smaller than a prompt, it is prefilled in chunks. 0: the executor's max_batch_tokens.
  std::int64_t max_num_batched_tokens = 0;
};

class generator {
 public:
  // All must outlive the generator. `blocks` hands out blocks of the executor's KV cache.
  generator(const model& m, executor& exec, kv_block_pool& blocks, generator_options options = {});

  // Runs every request, one choice each (n = 1); the fields of generate_request that concern a
  // tenant (id, tenant, weight, priority) are not used. A request is checked as the engine
  // checks it (check_submission), except that a grammar may be compiled for any vocabulary of
  // the executor's size (the decode benchmark pairs a synthetic model with a real vocabulary).
  // `on_text(i, text)` receives request i's text as it is released (never empty).
  // invalid_argument / out_of_range for a request that can never run; resource_exhausted when
  // the KV cache cannot hold the requests' work at all.
  result<std::vector<generation_output>> run(std::span<const generate_request> requests,
                                             const std::function<void(std::size_t, std::string_view)>& on_text = {},
                                             generation_timing* timing = nullptr);

 private:
  const model& model_;
  executor& exec_;
  kv_block_pool& blocks_;
  generator_options options_;
};

}  // namespace edge::backend
