// Log probabilities as OpenAI's two APIs write them, for one choice of an answer:
//
//   chat         {"content":[{"token","logprob","bytes":[…],"top_logprobs":[{"token","logprob",
//                 "bytes"}]}],"refusal":null}: one entry per completion token, its alternatives
//                 most likely first (none for top_logprobs 0).
//   completions  {"tokens":[…],"token_logprobs":[…],"top_logprobs":[{token: logprob}],
//                 "text_offset":[…]}: with echo the prompt's tokens first, the first of them with
//                 null log probability and alternatives (nothing predicts it); an alternatives
//                 dict holds the chosen token besides the most likely ones, as OpenAI's does.
//
// A token's text is its bytes (special tokens as their text), invalid UTF-8 replaced by U+FFFD;
// chat's "bytes" are the bytes themselves, so the pieces of a character split across tokens add
// up. text_offset is where the token's text begins in the choice's text, in code points (the
// text as a Python string indexes it): the offset of the text released when the token was
// sampled (a token whose bytes the UTF-8-safe detokenizer or a stop string holds back begins
// where the released text stands). -inf log probabilities are written as -9999.0, as vLLM does.
//
// Streaming: every token is recorded as its delta arrives; take() gives the entries recorded
// since the previous take(), for the chunk that carries their text (a token whose text is held
// back travels with the next chunk that has text, or with the choice's finish chunk). The
// entries of all chunks of a choice, concatenated, are exactly those of the whole answer.
// Connection strand only.
#pragma once

#include <boost/json/value.hpp>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "edge/backend/engine/engine.h"
#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/gateway/openai/openai_request.h"

namespace edge::gateway {

// What JSON says for a log probability: -inf and anything below become -9999.0.
double api_logprob(float logprob);

class choice_logprobs {
 public:
  // `prompt` is the request's prompt (for the first token's spacing after BOS); `tok` must
  // outlive this.
  choice_logprobs(openai_api api, const backend::tokenizer& tok, std::span<const backend::token_id> prompt);

  // Completions with echo: the prompt's tokens, their log probabilities (`scores`: the engine's
  // prompt_logprobs_event, one per token after the first), and the prompt's text as the answer
  // shows it (`echoed`, whose length moves the completion's offsets along).
  void add_prompt(std::span<const backend::token_id> prompt, std::span<const backend::sampled_logprobs> scores,
                  std::string_view echoed);
  // A completion delta: its tokens with their log probabilities, and the text it released.
  void add(const backend::delta_event& delta);

  // The logprobs object of the entries recorded since the previous take(), or null when there
  // are none.
  boost::json::value take();
  // The logprobs object of every entry recorded, as JSON text: each entry written by Boost.JSON
  // and joined, so that the tree of a large answer's entries (many times the size of its text)
  // is never built whole.
  std::string all() const;

 private:
  struct entry {
    std::string token;  // its text, valid UTF-8
    std::string bytes;  // its bytes as the tokenizer gives them
    std::optional<float> logprob;  // none: the first prompt token
    std::vector<std::pair<backend::token_id, float>> top;  // alternatives, most likely first
    backend::token_id id = 0;
    bool after_bos = false;        // how its text, and its alternatives' (at the same place), read
    std::int64_t text_offset = 0;  // code points
  };

  entry make_entry(backend::token_id id, bool after_bos) const;
  boost::json::value object_of(std::span<const entry> entries) const;
  // Chat: one entry's object. Completions: one entry's dict of alternatives (null for the first
  // prompt token).
  boost::json::object chat_entry(const entry& e) const;
  boost::json::value completion_alternatives(const entry& e) const;

  openai_api api_;
  const backend::tokenizer& tok_;
  bool after_bos_;           // the next completion token directly follows BOS
  std::int64_t offset_ = 0;  // code points of the choice's text so far
  std::vector<entry> entries_;
  std::size_t taken_ = 0;    // entries already given out by take()
};

}  // namespace edge::gateway
