// Whether a request's constraints leave any way to write an output at all: its grammar
// (response_format, a forced tool call) with the tokens its logit_bias bans taken out of the
// vocabulary. A client that bans "{" and asks for a JSON object asks for the impossible; that is
// known before anything is generated, and answered as a 400 naming logit_bias, rather than
// found mid-way (where the output ends with content_filter: sequence_decoder.h).
//
// A bounded search from the grammar's start over the allowed, unbanned tokens: it proves the
// output possible (a path reaches an end token), impossible (every path dies before one), or
// gives up (unknown) at a state that allows many tokens or past its budget. Such states are
// where no small set of bans can close every way on, so giving up there loses little.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "edge/backend/grammar/compiled_grammar.h"

namespace edge::backend::grammar {

enum class output_reach { possible, impossible, unknown };

struct output_reach_limits {
  std::int64_t max_states = 256;    // matcher states expanded
  std::int64_t max_branching = 32;  // tokens a state may allow and still be expanded one by one
};

// `banned`: tokens that may never be written; `end_tokens`: besides the tokenizer's EOS tokens,
// what ends the output (stop token ids), as grammar_matcher takes them. Runs on the caller's
// thread; its cost is bounded by `limits` (each state replays its path in a fresh matcher).
output_reach find_output(const std::shared_ptr<const compiled_grammar>& g, std::span<const token_id> banned,
                         std::span<const token_id> end_tokens, const output_reach_limits& limits = {});

}  // namespace edge::backend::grammar
