// From a generate_request to what runs it, written once for the engine (engine::submit) and the
// generator (generator::run), so that both refuse the same requests and decode them alike.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "edge/backend/engine/engine.h"
#include "edge/backend/engine/request_rules.h"
#include "edge/backend/engine/scheduler.h"
#include "edge/backend/runtime/sequence_decoder.h"
#include "edge/backend/tokenizer/tokenizer.h"

namespace edge::backend {

// What a request is checked against.
struct submission_limits {
  const scheduler& sched;  // its check_fits and whether it computes prompt logits rows
  std::int64_t vocab = 0;  // the executor's vocabulary (token ids, logit_bias keys)
  // The tokenizer a grammar must have been compiled for. Null: any of `vocab` tokens (the decode
  // benchmark pairs a synthetic model with a real tokenizer's vocabulary).
  const tokenizer* grammar_tokenizer = nullptr;
};

// Why the request can never run, naming the generate_request field at fault (submit_error), or
// nothing. Pure: reads the request, the scheduler's configuration and the grammar.
std::optional<submit_error> check_submission(const generate_request& request, const submission_limits& limits);

// The decoder of each of the request's n choices: choice i samples with choice_seed(seed, i)
// when the request has a seed. `tok` detokenizes; `context` is the model's context length.
std::vector<std::unique_ptr<sequence_decoder>> choice_decoders(const generate_request& request, const tokenizer& tok,
                                                               std::int64_t context);

}  // namespace edge::backend
