// What happens to one sequence's logits and sampled tokens (the step driver applies it for the
// engine and the generator alike): penalties and sampling settings per row, then for each sampled token the
// end-of-sequence and stop-token checks, incremental UTF-8-safe detokenization, stop strings
// and the length limits. Owned by whoever drives the sequence (one thread).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/grammar/compiled_grammar.h"
#include "edge/backend/runtime/sampler.h"
#include "edge/backend/runtime/stop_checker.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/status.h"

namespace edge::backend {

// Why a sequence ended. The generator only ends sequences with stop, length or content_filter.
enum class finish_reason {
  stop,    // EOS, a stop token or a stop string
  length,  // max_tokens, or the model's context
  abort,   // cancelled by its client, or the engine shut down
  error,   // the engine failed while running it
  // The request's own constraints left no token to write: its grammar (response_format, a
  // forced tool call) and its logit_bias bans together allow nothing next, or the grammar grew
  // too ambiguous to follow. The request's doing, not the engine's: the output so far is
  // kept and the choice ends there (OpenAI's reason for output a filter cut short).
  content_filter,
};

// "stop", "length", "abort", "error", "content_filter": the OpenAI / vLLM spelling. Inline, so
// that the wire formats that name a reason need nothing of the runtime.
constexpr std::string_view to_string(finish_reason reason) {
  switch (reason) {
    case finish_reason::stop: return "stop";
    case finish_reason::length: return "length";
    case finish_reason::abort: return "abort";
    case finish_reason::error: return "error";
    case finish_reason::content_filter: return "content_filter";
  }
  return "unknown";
}

struct decode_limits {
  std::int64_t max_tokens = 16;  // generated tokens at most
  std::int64_t context = 0;      // prompt + generated tokens at most (the model's context)
  bool ignore_eos = false;       // keep going past EOS (stop tokens and strings still end it)
  std::vector<token_id> stop_token_ids;  // end the output like EOS, and are not part of its text
  std::vector<std::string> stop;         // stop strings: the text ends right before the first
  // Constrained decoding: only tokens that continue this grammar (grammar_matcher); null: any.
  // The output ends at the end token that closes the match, ignore_eos or not. The grammar covers
  // the whole output, so stop strings are not matched: one inside a JSON string or a forced
  // tool call would cut what the grammar promises whole (max_tokens still cuts it: "length").
  std::shared_ptr<const grammar::compiled_grammar> grammar;
  // Special tokens add nothing to the text (vLLM's skip_special_tokens); false writes their text
  // out, for a reader of markers that are special tokens (tool-call syntaxes such as Kimi K2's).
  bool skip_special_tokens = true;
};

class sequence_decoder {
 public:
  // `prompt` is the whole prompt (for the repetition penalty and the first token's spacing).
  sequence_decoder(const tokenizer& tok, const sampling_params& sampling, std::span<const token_id> prompt,
                   decode_limits limits);

  // Whether the next token must be sampled where the logits can be changed first (penalties):
  // on the host, from a copy of the row.
  bool samples_on_host() const { return sampler_.has_penalties(); }
  // The next draw's sampling settings, for an executor that samples (samples_on_host() false).
  kernels::sampling_row next_row() const { return sampler_.next_row(); }
  // Applies the penalties to this sequence's row of logits and returns the row's sampling settings.
  kernels::sampling_row prepare(std::span<float> logits) const;
  // Whether a grammar constrains the next token: then fill_allowed() gives its mask.
  bool constrained() const { return matcher_.has_value(); }
  // The tokens the grammar allows next, less those the logit biases ban, in `allowed`
  // ([kernels::allowed_words(vocab)]). When that leaves none, the next accept() ends the
  // sequence with content_filter whatever token was drawn (a row with no token left).
  void fill_allowed(std::span<std::uint32_t> allowed);

  struct step {
    std::string text;                     // text released by this token (possibly empty)
    std::optional<finish_reason> finish;  // set when this token ended the sequence
    std::string stop_string;              // finish stop by a stop string: that string
    std::string error;                    // finish error or content_filter: why
    // The drawn token is not part of the output (no token was allowed: content_filter).
    bool dropped = false;
  };
  // Takes the token sampled for this sequence; `length` is the sequence's length with it
  // (prompt + generated). Calling it after the sequence finished is a programming error.
  step accept(token_id id, std::int64_t length);

  std::int64_t generated() const { return generated_; }
  bool finished() const { return finished_; }
  const sampling_params& sampling() const { return sampler_.params(); }

 private:
  // Ends the sequence here, with what it has (held-back text released): the grammar matched
  // whole, or the output cannot go on.
  step end_early(step out, finish_reason reason, std::string why);

  const tokenizer& tok_;
  decode_limits limits_;
  sequence_sampler sampler_;
  incremental_detokenizer detokenizer_;
  stop_checker stops_;
  std::optional<grammar::grammar_matcher> matcher_;
  std::string dead_end_;  // why the last mask allowed no token ("" while some token is allowed)
  std::int64_t generated_ = 0;
  bool finished_ = false;
};

}  // namespace edge::backend
