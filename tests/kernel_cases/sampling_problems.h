// The inputs of the sampling cases (kernel_cases.h), built the same way by the GPU program and
// the CPU suite, and the plain reference of a draw: sampling.h's definition in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <iterator>
#include <vector>

#include "kernel_cases.h"
#include "kernels/sampling/sampling.h"

namespace edge::kernel_cases {

struct sampling_problem {
  sampling_case c;
  std::vector<float> logits;                 // [rows, vocab] before biases and masks
  std::vector<kernels::sampling_row> config;  // [rows]
  std::vector<kernels::logit_bias> biases;   // every row's, row after row
  std::vector<std::uint32_t> masks;          // [masked rows, allowed_words(vocab)]
  std::vector<std::int32_t> banned;          // [rows] the token a row's bias bans, or -1
  std::vector<std::int32_t> forced;          // [rows] the token a +100 bias makes certain, or -1

  std::int64_t words() const { return kernels::allowed_words(c.vocab); }
  kernels::sampling_params params(float* scratch_logits, const kernels::sampling_row* rows, std::int32_t* out,
                                  const kernels::logit_bias* row_biases, const std::uint32_t* allowed) const {
    return {.logits = scratch_logits, .config = rows, .out = out, .rows = c.rows, .vocab = c.vocab,
            .biases = biases.empty() ? nullptr : row_biases, .allowed = masks.empty() ? nullptr : allowed};
  }

  // Row i as the draw sees it, from sampling.h's words: each bias added to its token's logit, a
  // bias of logit_ban or below dropping the token (NaN, as a NaN logit is dropped), and every
  // token outside the row's mask dropped. Into `row` (reused: rows of 10^5 logits).
  void effective_row(std::int64_t i, std::vector<float>& row) const {
    row.assign(logits.begin() + i * c.vocab, logits.begin() + (i + 1) * c.vocab);
    const kernels::sampling_row& r = config[static_cast<std::size_t>(i)];
    for (std::int32_t b = r.bias_begin; b < r.bias_begin + r.bias_count; ++b) {
      const kernels::logit_bias& bias = biases[static_cast<std::size_t>(b)];
      if (bias.id < 0 || bias.id >= c.vocab) continue;
      float& v = row[static_cast<std::size_t>(bias.id)];
      v = bias.bias <= kernels::logit_ban ? NAN : v + bias.bias;
    }
    if (r.allowed_row >= 0) {
      const std::uint32_t* mask = masks.data() + r.allowed_row * words();
      for (std::int64_t t = 0; t < c.vocab; ++t) {
        if (((mask[t / 32] >> (t % 32)) & 1u) == 0) row[static_cast<std::size_t>(t)] = NAN;
      }
    }
  }
  std::vector<float> effective_row(std::int64_t i) const {
    std::vector<float> row;
    effective_row(i, row);
    return row;
  }
};

// The index of the largest value, the lowest on ties, NaN never (0 when all are NaN).
inline std::int32_t first_largest(const std::vector<float>& row) {
  std::int32_t best = -1;
  for (std::size_t i = 0; i < row.size(); ++i) {
    if (std::isnan(row[i])) continue;
    if (best < 0 || row[i] > row[static_cast<std::size_t>(best)]) best = static_cast<std::int32_t>(i);
  }
  return std::max(best, 0);
}

// Unmasked cases: the rows cycle through greedy, top-1, plain, top-p, top-k and combined
// configurations; rows hold a tie, a NaN, two +inf (row 5), nothing but -inf (row 6), whole
// numbers (every fourth row: ties at every boundary), -0.0 and +0.0 as row 0's best; every third
// row from 8 has logit biases: its most likely token banned, another +3, and in every ninth row a
// third +100 (it must be drawn). Masked cases: two rows of three alternate between a grammar's
// mask of three tokens and one of nine in ten.
inline sampling_problem make_sampling_problem(const sampling_case& c, std::uint32_t seed) {
  using kernels::sampling_row;
  sampling_problem p{.c = c};
  const std::int64_t vocab = c.vocab;
  const auto at = [&](std::int64_t row, std::int64_t id) -> float& {
    return p.logits[static_cast<std::size_t>(row * vocab + id)];
  };
  p.logits = scaled_floats(static_cast<std::size_t>(c.rows * vocab), seed, 0, 0.0f, 6.0f);
  p.banned.assign(static_cast<std::size_t>(c.rows), -1);
  p.forced.assign(static_cast<std::size_t>(c.rows), -1);
  test_random rng(seed + 1);
  if (c.masked) {
    const std::vector<sampling_row> configs = {
        {.temperature = 0.0f}, {.temperature = 1.0f}, {.temperature = 0.8f, .top_p = 0.9f}, {.temperature = 1.2f, .top_k = 40}};
    for (std::int64_t i = 0; i < c.rows; ++i) {
      sampling_row r = configs[static_cast<std::size_t>(i) % configs.size()];
      r.uniform = rng.uniform(0.0f, 1.0f);
      if (i % 3 != 2) {
        r.allowed_row = static_cast<std::int32_t>(p.masks.size() / static_cast<std::size_t>(p.words()));
        std::vector<std::uint32_t> mask(static_cast<std::size_t>(p.words()), 0);
        for (std::int64_t t = 0; t < vocab; ++t) {
          const bool allowed = i % 2 == 0 ? (t == 1 || t == vocab / 2 || t == vocab - 1) : (rng.next() % 10 != 0);
          if (allowed) mask[static_cast<std::size_t>(t / 32)] |= 1u << (t % 32);
        }
        p.masks.insert(p.masks.end(), mask.begin(), mask.end());
      }
      p.config.push_back(r);
    }
    return p;
  }
  const std::vector<sampling_row> configs = {
      {.temperature = 0.0f},
      {.temperature = 0.7f, .top_k = 1},
      {.temperature = 1.0f},
      {.temperature = 0.8f, .top_p = 0.9f},
      {.temperature = 1.2f, .top_k = 40},
      {.temperature = 0.6f, .top_k = 50, .top_p = 0.95f, .min_p = 0.05f},
      {.temperature = 1.0f, .min_p = 0.1f},
  };
  at(0, 3) = at(0, 7);
  at(1, 1) = NAN;
  at(5, vocab / 2) = INFINITY;
  at(5, 1) = INFINITY;
  for (std::int64_t i = 0; i < vocab; ++i) at(6, i) = -INFINITY;
  for (std::int64_t i = 3; i < c.rows; i += 4) {
    for (std::int64_t j = 0; j < vocab; ++j) at(i, j) = std::round(at(i, j));
  }
  // Row 0 (greedy): its best logits are -0.0 at id 5 and +0.0 at id 9, equal as floats, so the
  // lower id wins (the sign bit must not order them).
  for (std::int64_t i = 0; i < vocab; ++i) at(0, i) = -std::fabs(at(0, i)) - 0.5f;
  at(0, 5) = -0.0f;
  at(0, 9) = 0.0f;
  for (std::int64_t i = 0; i < c.rows; ++i) {
    sampling_row r = configs[static_cast<std::size_t>(i) % configs.size()];
    r.uniform = rng.uniform(0.0f, 1.0f);
    if (i >= 8 && i % 3 == 0) {
      const std::vector<float> row(p.logits.begin() + i * vocab, p.logits.begin() + (i + 1) * vocab);
      const std::int32_t best = first_largest(row);
      p.banned[static_cast<std::size_t>(i)] = best;
      r.bias_begin = static_cast<std::int32_t>(p.biases.size());
      p.biases.push_back({.id = best, .bias = kernels::logit_ban});
      p.biases.push_back({.id = static_cast<std::int32_t>((best + 7) % vocab), .bias = 3.0f});
      if (i % 9 == 0) {
        p.forced[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((best + 11) % vocab);
        p.biases.push_back({.id = p.forced[static_cast<std::size_t>(i)], .bias = 100.0f});
      }
      r.bias_count = static_cast<std::int32_t>(p.biases.size()) - r.bias_begin;
    }
    p.config.push_back(r);
  }
  return p;
}

// The order "larger logit first, lower id first among equals" (dividing by a positive
// temperature keeps it) as one integer per token, larger first: the logit's bits made monotone
// (-0.0 as +0.0), then the id reversed.
inline std::uint64_t sampling_key(float logit, std::int32_t id) {
  const float v = logit == 0.0f ? 0.0f : logit;
  std::uint32_t bits = 0;
  std::memcpy(&bits, &v, 4);
  bits = (bits & 0x8000'0000u) != 0 ? ~bits : bits | 0x8000'0000u;
  return static_cast<std::uint64_t>(bits) << 32 | (0xFFFF'FFFFu - static_cast<std::uint32_t>(id));
}

// A draw by sampling.h's definition, in double: the row's logits over the temperature; the top_k
// largest (lower id first among equals); their softmax; min_p drops what is less likely than
// min_p times the most likely; top_p keeps the most likely tokens, best first, while the mass
// before each is below top_p (one at least); the draw lands `uniform` of the way through the kept
// mass, best first. Greedy (temperature 0) is the argmax; a row without a finite maximum (+inf
// logits, or nothing but -inf) gives the first of its largest.
struct sampling_reference {
  std::int32_t token = 0;
  // Tokens a sampler in float arithmetic may draw: `token`, and those whose share of the kept
  // mass begins or ends within rounding of where the draw lands (with top_p's last token kept or
  // not, where the mass before it lies within rounding of top_p).
  std::vector<std::int32_t> draws;
  // Whether top_k's or min_p's boundary lies within rounding: then any kept token may be drawn.
  bool near_boundary = false;
  // What may be kept, each boundary taken at its loosest, is a run of the best tokens: those
  // whose sampling_key is at least this one.
  std::uint64_t last_kept = ~std::uint64_t{0};

  bool keeps(const std::vector<float>& row, std::int32_t drawn) const {
    return drawn >= 0 && static_cast<std::size_t>(drawn) < row.size() && !std::isnan(row[static_cast<std::size_t>(drawn)]) &&
           sampling_key(row[static_cast<std::size_t>(drawn)], drawn) >= last_kept;
  }
  bool allows(const std::vector<float>& row, std::int32_t drawn) const {
    if (near_boundary) return keeps(row, drawn);
    return std::find(draws.begin(), draws.end(), drawn) != draws.end();
  }
};

inline sampling_reference reference_sample(const std::vector<float>& row, const kernels::sampling_row& c) {
  // Bounds on the relative rounding of a logit over the temperature, and of the kept mass up to a
  // token as float probabilities add up: the kernel's work is in float, the reference's in double.
  constexpr double value_rounding = 0x1p-22;
  constexpr double mass_rounding = 0x1p-20;
  sampling_reference r;
  const auto id_of = [](std::uint64_t key) { return static_cast<std::int32_t>(0xFFFF'FFFFu - (key & 0xFFFF'FFFFu)); };
  const auto only = [&](std::int32_t token) {
    r.token = token;
    r.draws = {token};
    r.last_kept = std::isnan(row[static_cast<std::size_t>(token)]) ? 0 : sampling_key(row[static_cast<std::size_t>(token)], token);
    return r;
  };
  if (c.temperature <= 0.0f) return only(first_largest(row));
  // Rows of 10^5 logits, each row's keys in this thread's buffer.
  thread_local std::vector<std::uint64_t> keys;
  keys.clear();
  for (std::size_t i = 0; i < row.size(); ++i) {
    if (!std::isnan(row[i])) keys.push_back(sampling_key(row[i], static_cast<std::int32_t>(i)));
  }
  if (keys.empty()) return only(0);
  const double t = c.temperature;
  const auto value_of = [&](std::uint64_t key) { return row[static_cast<std::size_t>(id_of(key))] / t; };
  const std::uint64_t best = *std::max_element(keys.begin(), keys.end());
  const double top = value_of(best);
  if (!std::isfinite(top)) return only(id_of(best));
  // The softmax's sum over the candidates (the top_k, or every token), and only the tokens that
  // may be kept sorted: a top_k's and a margin past it, or what min_p cannot drop.
  std::size_t candidates = 0;
  double total = 0.0;
  constexpr std::size_t top_k_margin = 64;
  if (c.top_k > 0 && static_cast<std::size_t>(c.top_k) < keys.size()) {
    candidates = static_cast<std::size_t>(c.top_k);
    const std::size_t sorted = std::min(keys.size(), candidates + top_k_margin);
    std::partial_sort(keys.begin(), keys.begin() + static_cast<std::ptrdiff_t>(sorted), keys.end(), std::greater<>());
    keys.resize(sorted);
    for (std::size_t i = 0; i < candidates; ++i) total += std::exp(value_of(keys[i]) - top);
  } else {
    for (const std::uint64_t key : keys) total += std::exp(value_of(key) - top);
    if (c.min_p > 0.0f) {
      const double floor = top + std::log(0.5 * c.min_p);
      std::erase_if(keys, [&](std::uint64_t key) { return value_of(key) < floor; });
    }
    std::sort(keys.begin(), keys.end(), std::greater<>());
    candidates = keys.size();
  }
  const auto value = [&](std::size_t i) { return value_of(keys[i]); };
  const auto id = [&](std::size_t i) { return id_of(keys[i]); };
  std::size_t loose = candidates;
  if (candidates < keys.size()) {
    const double last = value(candidates - 1);
    while (loose < keys.size() && last - value(loose) <= value_rounding * std::fabs(last)) {
      // Equal logits are ordered by id on both sides; only distinct ones may swap.
      if (value(loose) != last) r.near_boundary = true;
      ++loose;
    }
  }
  const auto prob = [&](std::size_t i) { return std::exp(value(i) - top) / total; };
  // min_p: the most likely token's probability is 1 / total; it keeps a run of the best.
  std::size_t kept = candidates;
  if (c.min_p > 0.0f) {
    const double threshold = c.min_p * prob(0);
    const double rounding = mass_rounding * prob(0);
    std::size_t strict = 0, loosest = 0;
    for (std::size_t i = 0; i < loose; ++i) {
      const double q = prob(i);
      if (std::fabs(q - threshold) <= rounding) r.near_boundary = true;
      if (q >= threshold && i < candidates) strict = i + 1;
      if (q >= threshold - rounding) loosest = i + 1;
    }
    kept = strict;
    loose = loosest;
  }
  // top_p over what min_p kept, in order; where the mass before the last token kept, or before
  // the first one left out, lies within rounding of top_p, the draw may see either run.
  std::vector<std::size_t> runs = {kept};
  if (c.top_p < 1.0f) {
    double mass = 0.0;
    std::size_t keep = 0;
    while (keep < kept && mass < c.top_p) mass += prob(keep++);
    double loose_mass = 0.0;
    std::size_t loose_keep = 0;
    while (loose_keep < loose && loose_mass < c.top_p + mass_rounding) loose_mass += prob(loose_keep++);
    keep = std::max<std::size_t>(keep, 1);
    runs = {keep};
    if (keep > 1 && std::fabs(mass - prob(keep - 1) - c.top_p) <= mass_rounding) runs.push_back(keep - 1);
    if (keep < kept && std::fabs(mass - c.top_p) <= mass_rounding) runs.push_back(keep + 1);
    loose = std::max<std::size_t>(loose_keep, 1);
  }
  for (const std::size_t run : runs) {
    double kept_mass = 0.0;
    for (std::size_t i = 0; i < run; ++i) kept_mass += prob(i);
    const double target = static_cast<double>(c.uniform) * kept_mass;
    const double margin = mass_rounding * kept_mass;
    double cumulative = 0.0;
    std::int32_t drawn = id(run - 1);
    for (std::size_t i = 0; i < run; ++i) {
      const double begin = cumulative;
      cumulative += prob(i);
      if (begin > target + margin) break;
      if (target < cumulative && drawn == id(run - 1)) drawn = id(i);
      if (begin - margin <= target && target < cumulative + margin) r.draws.push_back(id(i));
    }
    r.draws.push_back(drawn);
    if (run == runs.front()) r.token = drawn;
  }
  r.last_kept = keys[std::max(loose, runs.front()) - 1];
  return r;
}

}  // namespace edge::kernel_cases
