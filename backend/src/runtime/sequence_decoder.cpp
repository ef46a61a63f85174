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

void sequence_decoder::fill_allowed(std::span<std::uint32_t> allowed) {
  dead_end_.clear();
  bool any = false;
  try {
    any = matcher_->fill_mask(allowed);
  } catch (const std::exception& e) {
    // Following this request's grammar ran out of something (memory): that ends the request,
    // not the engine thread every other request needs.
    dead_end_ = format("following the output's grammar failed: {}", e.what());
    return;
  }
  if (matcher_->failed()) {
    dead_end_ = matcher_->error();
    return;
  }
  if (!any) {
    dead_end_ = "the grammar allows no token here: the vocabulary cannot write what must come next";
    return;
  }
  // A ban is absolute: a token the grammar allows but the request bans is not a way on.
  bool banned_some = false;
  for (const kernels::logit_bias& b : sampling().logit_bias) {
    if (b.bias > kernels::logit_ban || b.id < 0 || static_cast<std::size_t>(b.id) / 32 >= allowed.size()) continue;
    std::uint32_t& word = allowed[static_cast<std::size_t>(b.id) / 32];
    const std::uint32_t bit = 1u << (static_cast<std::uint32_t>(b.id) % 32);
    banned_some = banned_some || (word & bit) != 0;
    word &= ~bit;
  }
  if (banned_some && std::all_of(allowed.begin(), allowed.end(), [](std::uint32_t w) { return w == 0; })) {
    dead_end_ = "logit_bias bans every token the grammar allows here";
  }
}

sequence_decoder::step sequence_decoder::end_early(step out, finish_reason reason, std::string why) {
  finished_ = true;
  out.finish = reason;
  out.error = std::move(why);
  out.text += stops_.flush();
  out.text += detokenizer_.finish();
  return out;
}

sequence_decoder::step sequence_decoder::accept(token_id id, std::int64_t length) {
  assert(!finished_ && "a finished sequence takes no more tokens");
  step out;
  if (!dead_end_.empty()) {
    // No token was allowed: whatever the draw gave is not part of the output.
    out.dropped = true;
    return end_early(std::move(out), finish_reason::content_filter, std::move(dead_end_));
  }
  sampler_.accept(id);
  ++generated_;
  if (matcher_) {
    bool accepted = false;
    try {
      accepted = matcher_->accept(id);
    } catch (const std::exception& e) {
      return end_early(std::move(out), finish_reason::content_filter,
                       format("following the output's grammar failed: {}", e.what()));
    }
    // Following the token passed the grammar's parse limits: the request's grammar is too
    // ambiguous, which ends its output, not the engine.
    if (!accepted && matcher_->failed()) {
      return end_early(std::move(out), finish_reason::content_filter, matcher_->error());
    }
    // The mask allowed only tokens that continue the grammar, so one that does not is the
    // engine's fault (a mask not applied), not the request's.
    if (!accepted) {
      return end_early(std::move(out), finish_reason::error,
                       format("token {} ('{}') was drawn outside the grammar's mask", id, tok_.token_text(id)));
    }
    if (matcher_->ended()) return end_early(std::move(out), finish_reason::stop, {});
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
      out.stop_string = std::move(released.matched);
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
