// The routers' order as 64-bit integer keys, and the arithmetic the CPU and CUDA routers share,
// so that the CUDA router (moe_routing.cu: the top items by repeated block-wide maxima of these
// keys) makes the CPU's choice. Host code too, so that the selection is tested where no GPU is
// (tests/unit/kernels/moe_routing_keys_test.cpp); no CUDA header.
#pragma once

#include <cstdint>

#include "kernels/sampling/sampling_keys.h"

namespace edge::kernels::moe_routing_keys {

// A score's key; a larger key ranks first. The high half is the value's bits made monotonic
// (-0.0 and +0.0 one key, as they compare equal on the CPU), with a NaN as 0: below every
// number, whose high half is at least -inf's 0x007F'FFFF. The low half is the complement of
// the id, so that among equal values the lower id ranks first. No score's key is 0.
EDGE_HOST_DEVICE inline std::uint64_t rank_key(float value, std::int64_t id) {
  const std::uint32_t high = value != value ? 0u : sampling_keys::ordered_bits(value);
  return (static_cast<std::uint64_t>(high) << 32) | sampling_keys::id_key(id);
}

EDGE_HOST_DEVICE inline std::int32_t id_of(std::uint64_t key) {
  return sampling_keys::id_of(static_cast<std::uint32_t>(key & 0xFFFF'FFFFu));
}

// What an item's key becomes once it is chosen: below every score's key.
inline constexpr std::uint64_t taken = 0;

// A group's score: the sum of its two best choice values (the best alone in a group of one),
// added best first onto 0.0f, as the CPU router adds them.
EDGE_HOST_DEVICE inline float group_score(const float* choice, std::int64_t size) {
  std::uint64_t first = taken;
  std::uint64_t second = taken;
  for (std::int64_t e = 0; e < size; ++e) {
    const std::uint64_t key = rank_key(choice[e], e);
    if (key > first) {
      second = first;
      first = key;
    } else if (key > second) {
      second = key;
    }
  }
  float sum = 0.0f;
  sum += choice[id_of(first)];
  if (size > 1) sum += choice[id_of(second)];
  return sum;
}

// The chosen experts' weights from their scores (`weights` [top_k] holds the scores on entry,
// best first): with `normalize` divided by their sum (in double; + 1e-20 for sigmoid), and for
// sigmoid multiplied by `scaling`.
EDGE_HOST_DEVICE inline void finish_weights(float* weights, std::int64_t top_k, bool normalize, bool sigmoid,
                                            float scaling) {
  double sum = 0.0;
  for (std::int64_t i = 0; i < top_k; ++i) sum += weights[i];
  const double divisor = normalize ? sum + (sigmoid ? 1e-20 : 0.0) : 1.0;
  const double factor = sigmoid ? scaling : 1.0;
  for (std::int64_t i = 0; i < top_k; ++i) weights[i] = static_cast<float>(weights[i] / divisor * factor);
}

}  // namespace edge::kernels::moe_routing_keys
