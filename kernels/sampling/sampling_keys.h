// The order both samplers share, as integer keys, and the radix selection the CUDA sampler runs
// over them. Host code too, so that the selection is tested where no GPU is
// (tests/unit/kernels/sampling_keys_test.cpp); no CUDA header.
//
// Every "first items in sorted order" question of sampling (the k largest, the smallest prefix
// of mass >= top_p, the item whose cumulative mass passes the draw) is one question: the largest
// key whose weight from it on (the count, or the probability mass, of the items whose key is at
// least as large) passes a threshold. The key orders items as the CPU sorts them: the value's
// bits made monotonic (`hi`), then the complement of the token id (`lo`: lower ids first among
// equal values). The weight from a key on falls as the key grows, so the boundary is found one
// digit at a time from the top: 8 bits a level, each level one pass over the row that histograms
// the items still agreeing with the digits chosen so far; the high half in 4 levels, the low
// half in 4 more only when several items share the boundary's value. That is 4 to 8 passes where
// bisection took 34 to 66.
//
// Masses are fixed point (units of 2^-62): sums of integers are exact in any order, so a
// histogram filled by atomics gives the same boundary on every run, and the host model of the
// selection and the device agree on it exactly. Next to the CPU sampler's double sums in sorted
// order, the rounding differs by far less than a float's: a draw that lands within rounding of
// the boundary between two tokens may pick either, as before.
#pragma once

#include <cstdint>

#include "edge/kernels/numerics.h"

namespace edge::kernels::sampling_keys {

// Float bits in an order that matches the float order (negative values reversed). -0.0 and +0.0
// get one key, as they compare equal on the CPU: their tie goes to the lower id there too.
EDGE_HOST_DEVICE inline std::uint32_t ordered_bits(float v) {
  const std::uint32_t u = bit_cast_u32(v == 0.0f ? 0.0f : v);
  return (u & 0x8000'0000u) != 0u ? ~u : u | 0x8000'0000u;
}

// Lower ids sort first among equal values: their keys are larger.
EDGE_HOST_DEVICE inline std::uint32_t id_key(std::int64_t id) { return ~static_cast<std::uint32_t>(id); }
EDGE_HOST_DEVICE inline std::int32_t id_of(std::uint32_t key) { return static_cast<std::int32_t>(~key); }

inline constexpr int radix_bits = 8;
inline constexpr int radix_bins = 1 << radix_bits;
inline constexpr int radix_levels = 32 / radix_bits;  // per 32-bit half of the key

// The digit of `key` at `level` (0: the top 8 bits).
EDGE_HOST_DEVICE inline int digit(std::uint32_t key, int level) {
  return static_cast<int>((key >> (32 - radix_bits * (level + 1))) & (radix_bins - 1));
}
// Whether `key` agrees with `prefix` on the digits above `level`.
EDGE_HOST_DEVICE inline bool matches(std::uint32_t key, std::uint32_t prefix, int level) {
  return level == 0 || (key >> (32 - radix_bits * level)) == (prefix >> (32 - radix_bits * level));
}
// `prefix` with `d` as its digit at `level`.
EDGE_HOST_DEVICE inline std::uint32_t with_digit(std::uint32_t prefix, int level, int d) {
  return prefix | (static_cast<std::uint32_t>(d) << (32 - radix_bits * (level + 1)));
}

// A probability in units of 2^-62. Probabilities are at most 1 (a few roundings over, for a
// threshold of total mass), so a whole vocabulary's sum fits in 64 bits.
inline constexpr double mass_unit = 4611686018427387904.0;  // 2^62
EDGE_HOST_DEVICE inline std::uint64_t fixed_mass(double p) {
  if (!(p > 0.0)) return 0;
  return static_cast<std::uint64_t>((p < 3.0 ? p : 3.0) * mass_unit + 0.5);
}

enum class passes { at_least, more_than };

EDGE_HOST_DEVICE inline bool passes_threshold(std::uint64_t weight, std::uint64_t threshold, passes p) {
  return p == passes::at_least ? weight >= threshold : weight > threshold;
}

struct digit_choice {
  int digit = -1;           // -1: no digit passes
  std::uint64_t above = 0;  // the weight of the items ahead of the digit's bin
};

// The largest digit d whose weight from it on (`above` plus bins[d..]) passes, over one level's
// histogram `bins` [radix_bins]. What the CUDA sampler computes with one warp; this is the plain
// form, for the host model.
EDGE_HOST_DEVICE inline digit_choice choose_digit(const std::uint64_t* bins, std::uint64_t above,
                                                  std::uint64_t threshold, passes p) {
  std::uint64_t from = above;
  for (int d = radix_bins - 1; d >= 0; --d) {
    const std::uint64_t at = from + bins[d];
    if (passes_threshold(at, threshold, p)) return {.digit = d, .above = from};
    from = at;
  }
  return {};
}

// The boundary item's key; found = false when even all kept items fall short of the threshold.
struct boundary {
  std::uint32_t hi = 0;
  std::uint32_t lo = 0;
  bool found = false;
};

// The radix selection over a row, given its passes (`Passes`, one implementation per side):
//   void histogram(bool low_half, std::uint32_t hi, std::uint32_t lo, int level): fills the
//     level's bins (weights and counts) over the kept items whose ordered bits agree with `hi`
//     above `level` (high half), or equal `hi` and whose id key agrees with `lo` above `level`
//     (low half); the digit is the key's at `level`;
//   std::uint64_t total(): the sum of the weights binned last;
//   std::uint32_t count(int d): the items binned last at digit d;
//   digit_choice choose(std::uint64_t above, std::uint64_t threshold, passes p): choose_digit
//     over the weights binned last;
//   std::uint32_t only_key(std::uint32_t hi): the id key of the one kept item with bits `hi`.
// `threshold_of(total)` gives the threshold from the total weight of the kept items (the draw's
// depends on it); every thread of a block runs this in step on the device.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <class Passes, class Threshold>
EDGE_HOST_DEVICE boundary find_boundary(Passes& ops, Threshold threshold_of, passes p) {
  boundary b;
  std::uint64_t above = 0;
  std::uint64_t threshold = 0;
  int last_digit = 0;
  for (int level = 0; level < radix_levels; ++level) {
    ops.histogram(false, b.hi, 0, level);
    if (level == 0) {
      threshold = threshold_of(ops.total());
      // "At least nothing" would be met before the first item: at least one unit is the same
      // question for every item that carries weight.
      if (p == passes::at_least && threshold == 0) threshold = 1;
    }
    const digit_choice c = ops.choose(above, threshold, p);
    if (c.digit < 0) return b;  // level 0 only: even the whole row falls short
    b.hi = with_digit(b.hi, level, c.digit);
    above = c.above;
    last_digit = c.digit;
  }
  if (ops.count(last_digit) == 1) {
    b.lo = ops.only_key(b.hi);
  } else {
    for (int level = 0; level < radix_levels; ++level) {
      ops.histogram(true, b.hi, b.lo, level);
      const digit_choice c = ops.choose(above, threshold, p);
      b.lo = with_digit(b.lo, level, c.digit);
      above = c.above;
    }
  }
  b.found = true;
  return b;
}

// Whether an item with bits `h` and id key `lo` comes after boundary `b` in sorted order.
EDGE_HOST_DEVICE inline bool after(const boundary& b, std::uint32_t h, std::uint32_t lo) {
  return h < b.hi || (h == b.hi && lo < b.lo);
}

}  // namespace edge::kernels::sampling_keys
