// Per-request sampling: the request's parameters, the penalties that depend on what it has
// seen, and its random stream. The random draw for step i depends only on (seed, i), so a
// request with a seed produces the same tokens whatever else is in the batch; the choices of a
// request for several (n) draw from (choice_seed(seed, i), step).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "edge/backend/tokenizer/tokenizer.h"
#include "edge/common/status.h"
#include "kernels/sampling/sampling.h"

namespace edge::backend {

struct sampling_params {
  float temperature = 1.0f;         // 0: greedy
  std::int32_t top_k = 0;           // 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // 1: off; > 1 discourages tokens of the prompt and output
  float presence_penalty = 0.0f;    // OpenAI: subtracted once from every token already generated
  float frequency_penalty = 0.0f;   // OpenAI: subtracted per occurrence in the generated text
  std::optional<std::uint64_t> seed;
  // OpenAI's logit_bias: added to these tokens' logits before sampling; a bias of
  // kernels::logit_ban or below bans the token. Distinct ids, at most max_logit_bias_entries.
  std::vector<kernels::logit_bias> logit_bias;

  bool greedy() const { return temperature <= 0.0f; }
};

// The most logit_bias entries one request may give (OpenAI's limit).
inline constexpr std::int64_t max_logit_bias_entries = 300;
// Each logit_bias value lies in [-max_logit_bias, max_logit_bias] (OpenAI's range).
inline constexpr float max_logit_bias = 100.0f;

// The seed of choice `choice` of a request seeded with `seed`: the seed itself for the first
// choice (so a request's first choice is the same whatever its n), a mix of both for the others.
std::uint64_t choice_seed(std::uint64_t seed, std::int64_t choice);

struct token_logprob {
  token_id id = 0;
  float logprob = 0.0f;  // natural log of the model's probability (before penalties and temperature)
};

struct sampled_logprobs {
  token_logprob chosen;
  std::vector<token_logprob> top;  // most likely first
};

// log_softmax of the chosen token and of the `top` most likely ones, from a row of raw logits.
sampled_logprobs logprobs_of(std::span<const float> logits, token_id chosen, std::int32_t top);

class sequence_sampler {
 public:
  // Without a seed, one is drawn from the system's random source.
  sequence_sampler(const sampling_params& params, std::span<const token_id> prompt);

  // Whether any of the repetition, presence and frequency penalties is on: then the logits must
  // be changed (apply_penalties) before they are sampled.
  bool has_penalties() const;
  // Applies the repetition, presence and frequency penalties to one row of logits.
  void apply_penalties(std::span<float> logits) const;
  // The kernel's per-row settings for the next draw, its uniform number included, and
  // params().logit_bias as the row's biases (bias_begin 0).
  kernels::sampling_row next_row() const;
  // Records the chosen token and moves to the next step.
  void accept(token_id id);

  const sampling_params& params() const { return params_; }
  std::uint64_t seed() const { return seed_; }

 private:
  sampling_params params_;
  std::uint64_t seed_;
  std::uint64_t step_ = 0;
  std::unordered_set<token_id> prompt_tokens_;           // only kept for the repetition penalty
  std::unordered_map<token_id, std::uint32_t> output_counts_;
};

// A uniform number in [0, 1) determined by (seed, step): SplitMix64 of their combination.
float uniform_for_step(std::uint64_t seed, std::uint64_t step);

}  // namespace edge::backend
