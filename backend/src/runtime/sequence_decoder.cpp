#include "edge/backend/runtime/sequence_decoder.h"

#include <algorithm>
#include <cassert>

#include "edge/common/format.h"

namespace edge::backend {
namespace {

bool prompt_ends_with_bos(const tokenizer& tok, std::span<const token_id> prompt) {
  const auto bos = tok.bos_id();
  return bos && !prompt.empty() && prompt.back() == *bos;
}

bool contains(std::span<const token_id> ids, token_id id) { return std::find(ids.begin(), ids.end(), id) != ids.end(); }

}  // namespace

sequence_decoder::sequence_decoder(const tokenizer& tok, const sampling_params& sampling,
                                   std::span<const token_id> prompt, decode_limits limits)
    : tok_(tok),
      limits_(std::move(limits)),
      sampler_(sampling, prompt),
      detokenizer_(tok, prompt_ends_with_bos(tok, prompt), /*with_special=*/!limits_.skip_special_tokens),
      stops_(limits_.grammar ? std::vector<std::string>{} : limits_.stop) {
  if (limits_.grammar) matcher_.emplace(limits_.grammar, limits_.stop_token_ids);
}

kernels::sampling_row sequence_decoder::prepare(std::span<float> logits) const {
  sampler_.apply_penalties(logits);
  return sampler_.next_row();
}

sequence_decoder::step sequence_decoder::accept(token_id id, std::int64_t length) {
  assert(!finished_ && "a finished sequence takes no more tokens");
  sampler_.accept(id);
  ++generated_;
  step out;
  if (matcher_) {
    // The mask allowed only tokens that continue the grammar: one that does not means no token
    // could (the vocabulary cannot spell what must come next), or the grammar is too ambiguous
    // to follow (its mask allowed nothing).
    if (!matcher_->accept(id)) {
      finished_ = true;
      out.finish = finish_reason::error;
      if (matcher_->failed()) {
        out.error = matcher_->error();
        return out;
      }
      out.error = format("token {} ('{}') does not continue the output's grammar: the vocabulary cannot write what "
                         "must come next",
                         id, tok_.token_text(id));
      return out;
    }
    if (matcher_->ended()) {
      finished_ = true;
      out.finish = finish_reason::stop;
      out.text += stops_.flush();
      out.text += detokenizer_.finish();
      return out;
    }
  }
  const bool ends_like_eos = (!limits_.ignore_eos && contains(tok_.eos_ids(), id)) || contains(limits_.stop_token_ids, id);
  if (ends_like_eos) {
    out.finish = finish_reason::stop;
  } else {
    stop_checker::step released = stops_.push(detokenizer_.push(id));
    out.text = std::move(released.text);
    if (released.stopped) {
      // What follows a stop string is never shown, held-back bytes included.
      finished_ = true;
      out.finish = finish_reason::stop;
      return out;
    }
  }
  const bool context_full = limits_.context > 0 && length >= limits_.context;
  if (!out.finish && (generated_ >= limits_.max_tokens || context_full)) out.finish = finish_reason::length;
  if (out.finish) {
    finished_ = true;
    out.text += stops_.flush();
    out.text += detokenizer_.finish();
  }
  return out;
}

}  // namespace edge::backend
