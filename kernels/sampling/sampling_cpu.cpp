#include "kernels/sampling/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cuda/launchers.h"

namespace edge::kernels {
namespace {

struct candidate {
  float value;  // logit, then probability
  std::int32_t id;
};

// Larger first; lower id first among equals, so the order (and the draw) is deterministic.
bool before(const candidate& a, const candidate& b) { return a.value > b.value || (a.value == b.value && a.id < b.id); }

// top_p usually keeps a few hundred tokens: sort this many first, and only sort everything
// when their mass falls short.
constexpr std::size_t nucleus_first_pass = 1024;

std::int32_t sample_row(float* logits, std::int64_t vocab, const sampling_row& c, std::vector<candidate>& pool) {
  if (c.temperature <= 0.0f) return argmax({logits, static_cast<std::size_t>(vocab)});

  pool.clear();
  const float inv_temperature = 1.0f / c.temperature;
  for (std::int64_t i = 0; i < vocab; ++i) {
    if (!std::isnan(logits[i])) pool.push_back({logits[i] * inv_temperature, static_cast<std::int32_t>(i)});
  }
  if (pool.empty()) return 0;

  if (c.top_k > 0 && static_cast<std::size_t>(c.top_k) < pool.size()) {
    std::nth_element(pool.begin(), pool.begin() + c.top_k, pool.end(), before);
    pool.resize(static_cast<std::size_t>(c.top_k));
  }

  // Softmax over what is left.
  float max_value = -std::numeric_limits<float>::infinity();
  for (const auto& x : pool) max_value = std::max(max_value, x.value);
  if (!std::isfinite(max_value)) {
    // +inf logits (or nothing but -inf) leave no distribution to draw from: the first of the
    // largest, as greedy would take it (the CUDA sampler does the same).
    const auto best = std::min_element(pool.begin(), pool.end(), before);
    return best->id;
  }
  double total = 0.0;
  for (auto& x : pool) {
    x.value = std::exp(x.value - max_value);
    total += x.value;
  }
  const float inv_total = static_cast<float>(1.0 / total);
  for (auto& x : pool) x.value *= inv_total;

  if (c.min_p > 0.0f) {
    // The most likely token has probability exp(0) / total.
    const float threshold = c.min_p * inv_total;
    std::erase_if(pool, [&](const candidate& x) { return x.value < threshold; });
  }

  if (c.top_p < 1.0f) {
    std::size_t sorted = std::min(nucleus_first_pass, pool.size());
    std::partial_sort(pool.begin(), pool.begin() + static_cast<std::ptrdiff_t>(sorted), pool.end(), before);
    double mass = 0.0;
    std::size_t keep = 0;
    while (keep < sorted && mass < c.top_p) mass += pool[keep++].value;
    if (mass < c.top_p && sorted < pool.size()) {
      std::sort(pool.begin() + static_cast<std::ptrdiff_t>(sorted), pool.end(), before);
      sorted = pool.size();
      while (keep < sorted && mass < c.top_p) mass += pool[keep++].value;
    }
    pool.resize(std::max<std::size_t>(keep, 1));
  } else {
    std::sort(pool.begin(), pool.end(), before);
  }

  double kept = 0.0;
  for (const auto& x : pool) kept += x.value;
  const double target = static_cast<double>(c.uniform) * kept;
  double cumulative = 0.0;
  for (const auto& x : pool) {
    cumulative += x.value;
    if (target < cumulative) return x.id;
  }
  return pool.back().id;
}

}  // namespace

void apply_logit_bias(float* row, std::int64_t vocab, const logit_bias* biases, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    const logit_bias& b = biases[i];
    if (b.id < 0 || b.id >= vocab) continue;
    row[b.id] = b.bias <= logit_ban ? std::numeric_limits<float>::quiet_NaN() : row[b.id] + b.bias;
  }
}

std::int32_t argmax(std::span<const float> values) {
  std::int32_t best = 0;
  float best_value = -std::numeric_limits<float>::infinity();
  bool found = false;
  for (std::size_t i = 0; i < values.size(); ++i) {
    if (std::isnan(values[i])) continue;
    if (!found || values[i] > best_value) {
      best = static_cast<std::int32_t>(i);
      best_value = values[i];
      found = true;
    }
  }
  return best;
}

void keep_allowed(float* logits, std::int64_t vocab, const std::uint32_t* allowed) {
  for (std::int64_t i = 0; i < vocab; ++i) {
    if (((allowed[i / 32] >> (i % 32)) & 1u) == 0) logits[i] = std::numeric_limits<float>::quiet_NaN();
  }
}

status run_sampling(const sampling_params& p, const stream& s) {
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_sampling(p, s);
  const std::int64_t words = allowed_words(p.vocab);
  cpu::parallel_for(s, p.rows, 1, [&](std::int64_t begin, std::int64_t end) {
    // Grows to the vocabulary once per thread, then is reused: no allocation per token.
    thread_local std::vector<candidate> pool;
    for (std::int64_t r = begin; r < end; ++r) {
      pool.reserve(static_cast<std::size_t>(p.vocab));
      const sampling_row& c = p.config[r];
      float* row = p.logits + r * p.vocab;
      if (c.bias_count > 0) apply_logit_bias(row, p.vocab, p.biases + c.bias_begin, c.bias_count);
      if (c.allowed_row >= 0) keep_allowed(row, p.vocab, p.allowed + c.allowed_row * words);
      p.out[r] = sample_row(row, p.vocab, c, pool);
    }
  });
  return {};
}

}  // namespace edge::kernels
