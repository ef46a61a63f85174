// Runs a set of requests to completion together on one executor: every prompt is prefilled
// (optionally in chunks), then all sequences decode in one ragged batch per step until each
// ends. This is what `edgeinfer generate`, the model tests and the decode benchmark use; the
// serving engine schedules requests continuously on the same executor interface.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/model/model.h"
#include "edge/backend/runtime/executor.h"
#include "edge/backend/runtime/kv_block_pool.h"
#include "edge/backend/runtime/sampler.h"
#include "edge/backend/runtime/sequence_decoder.h"

namespace edge::backend {

struct generation_request {
  std::vector<token_id> prompt;
  sampling_params sampling;
  std::int64_t max_tokens = 16;
  bool ignore_eos = false;
  std::vector<std::string> stop;  // stop strings
};

struct generation_output {
  std::vector<token_id> tokens;  // generated ids (a stop string's tokens included)
  std::string text;              // released text (up to, not including, a stop string)
  finish_reason reason = finish_reason::length;  // stop or length
};

struct generation_timing {
  double prefill_seconds = 0.0;
  double decode_seconds = 0.0;
  std::int64_t prefill_tokens = 0;
  std::int64_t decode_tokens = 0;  // tokens sampled after the first of each sequence
  std::int64_t decode_steps = 0;
};

struct generator_options {
  std::int64_t prefill_chunk = 0;  // 0: as much of each prompt per step as max_batch_tokens allows
};

class generator {
 public:
  // All must outlive the generator. `blocks` hands out blocks of the executor's cache.
  generator(const model& m, executor& exec, kv_block_pool& blocks, std::int64_t block_size,
            generator_options options = {});

  // `on_text(i, text)` receives request i's text as it is released (may be empty: not called).
  result<std::vector<generation_output>> run(std::span<const generation_request> requests,
                                             const std::function<void(std::size_t, std::string_view)>& on_text = {},
                                             generation_timing* timing = nullptr);

 private:
  const model& model_;
  executor& exec_;
  kv_block_pool& blocks_;
  std::int64_t block_size_;
  generator_options options_;
};

}  // namespace edge::backend
