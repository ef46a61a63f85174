#include "edge/backend/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "edge/common/format.h"

namespace edge::backend {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

std::uint64_t random_seed() {
  std::random_device device;
  return (static_cast<std::uint64_t>(device()) << 32) ^ device();
}

}  // namespace


std::uint64_t choice_seed(std::uint64_t seed, std::int64_t choice) {
  if (choice == 0) return seed;
  return splitmix64(seed ^ splitmix64(0x63686F6963650000ull + static_cast<std::uint64_t>(choice)));
}

float uniform_for_step(std::uint64_t seed, std::uint64_t step) {
  // 24 random bits: every value is exactly representable as a float below 1.
  const std::uint64_t bits = splitmix64(splitmix64(seed) ^ step) >> 40;
  return static_cast<float>(bits) * (1.0f / 16777216.0f);
}

sequence_sampler::sequence_sampler(const sampling_params& params, std::span<const token_id> prompt)
    : params_(params), seed_(params.seed ? *params.seed : random_seed()) {
  if (params_.repetition_penalty != 1.0f) prompt_tokens_.insert(prompt.begin(), prompt.end());
}

sampled_logprobs logprobs_of(std::span<const float> logits, token_id chosen, std::int32_t top) {
  const float max = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (const float l : logits) sum += std::exp(static_cast<double>(l - max));
  const double log_norm = static_cast<double>(max) + std::log(sum);
  const auto logprob = [&](token_id id) {
    return static_cast<float>(static_cast<double>(logits[static_cast<std::size_t>(id)]) - log_norm);
  };
  sampled_logprobs out;
  out.chosen = {chosen, logprob(chosen)};
  if (top > 0) {
    std::vector<token_id> ids(logits.size());
    std::iota(ids.begin(), ids.end(), 0);
    const auto n = std::min<std::size_t>(static_cast<std::size_t>(top), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(n), ids.end(), [&](token_id a, token_id b) {
      const float la = logits[static_cast<std::size_t>(a)];
      const float lb = logits[static_cast<std::size_t>(b)];
      return la != lb ? la > lb : a < b;
    });
    for (std::size_t i = 0; i < n; ++i) out.top.push_back({ids[i], logprob(ids[i])});
  }
  return out;
}

bool sequence_sampler::has_penalties() const {
  return params_.repetition_penalty != 1.0f || params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f;
}

void sequence_sampler::apply_penalties(std::span<float> logits) const {
  const auto in_vocab = [&](token_id id) { return id >= 0 && static_cast<std::size_t>(id) < logits.size(); };
  if (params_.repetition_penalty != 1.0f) {
    // As in the CTRL paper and Hugging Face: a token seen before is made less likely whatever
    // the sign of its logit.
    const auto penalize = [&](token_id id) {
      if (!in_vocab(id)) return;
      float& l = logits[static_cast<std::size_t>(id)];
      l = l > 0.0f ? l / params_.repetition_penalty : l * params_.repetition_penalty;
    };
    for (token_id id : prompt_tokens_) penalize(id);
    for (const auto& [id, count] : output_counts_) {
      if (!prompt_tokens_.contains(id)) penalize(id);
    }
  }
  if (params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f) {
    for (const auto& [id, count] : output_counts_) {
      if (!in_vocab(id)) continue;
      logits[static_cast<std::size_t>(id)] -=
          params_.presence_penalty + params_.frequency_penalty * static_cast<float>(count);
    }
  }
}

kernels::sampling_row sequence_sampler::next_row() const {
  return {.temperature = params_.temperature,
          .top_k = params_.top_k,
          .top_p = params_.top_p,
          .min_p = params_.min_p,
          .uniform = params_.greedy() ? 0.0f : uniform_for_step(seed_, step_),
          .bias_begin = 0,
          .bias_count = static_cast<std::int32_t>(params_.logit_bias.size())};
}

void sequence_sampler::accept(token_id id) {
  if (has_penalties()) {
    ++output_counts_[id];
  }
  ++step_;
}

}  // namespace edge::backend
