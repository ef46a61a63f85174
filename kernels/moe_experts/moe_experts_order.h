// How the CUDA experts (moe_experts.cu) put the batch's (token, choice) pairs in the CPU's order
// without a sort: the arithmetic of each step, as host code too, so that the order is tested
// where no GPU is (tests/unit/kernels/moe_experts_order_test.cpp); no CUDA header.
//
// Grouping: one block per expert scans the pairs in order, a round of block_threads pairs at a
// time; each warp's ballot marks its pairs of that expert, and a pair's row is the expert's
// first row (the exclusive scan of the counts) + the expert's pairs of earlier rounds + its
// place in this round (the marks of earlier warps, then of lower lanes). So each expert's rows
// hold its pairs in pair order, token order among them: the CPU's stable counting sort.
//
// Tensor-core work list: each chosen expert's rows in tiles of tile_rows (the last one
// partial); tile_begin[s] is the first tile of the s-th chosen expert (id order), the exclusive
// scan of tiles_of(count) that count_kernel computes beside begin, and tile_begin[chosen] the
// tiles' count. Block j of the grouped GEMM finds its expert by tile_slot and its first row by
// (j - tile_begin[slot]) · tile_rows. The grid cannot know the count, so it launches
// max_tiles(pairs, slots) blocks along it, and those past the count return at once.
//
// Summing: a token's contributions are added in the order of its choices' expert ids (equal
// ids in choice order); choice i goes to place choice_rank(i) of that order.
#pragma once

#include <cstdint>

#include "edge/kernels/numerics.h"

namespace edge::kernels::moe_experts_order {

inline constexpr int warp_lanes = 32;

EDGE_HOST_DEVICE inline int marks(std::uint32_t ballot) {
#if defined(__CUDA_ARCH__)
  return __popc(ballot);
#else
  return __builtin_popcount(ballot);
#endif
}

// The marks of a warp's ballot below `lane`.
EDGE_HOST_DEVICE inline int marks_below(std::uint32_t ballot, int lane) {
  return marks(ballot & ((std::uint32_t{1} << lane) - 1u));
}

// The place, within a round of ballots (one per warp), of the marked pair at (warp, lane).
EDGE_HOST_DEVICE inline int round_place(const std::uint32_t* ballots, int warp, int lane) {
  int place = marks_below(ballots[warp], lane);
  for (int w = 0; w < warp; ++w) place += marks(ballots[w]);
  return place;
}

// The marked pairs of a round of `warps` ballots.
EDGE_HOST_DEVICE inline int round_count(const std::uint32_t* ballots, int warps) {
  int count = 0;
  for (int w = 0; w < warps; ++w) count += marks(ballots[w]);
  return count;
}

// Choice i's place among a token's `top_k` choices `experts` ordered by expert id, then by
// choice index.
EDGE_HOST_DEVICE inline int choice_rank(const std::int32_t* experts, std::int64_t top_k, std::int64_t i) {
  int rank = 0;
  for (std::int64_t j = 0; j < top_k; ++j) {
    rank += experts[j] < experts[i] || (experts[j] == experts[i] && j < i) ? 1 : 0;
  }
  return rank;
}

// Tiles of `rows` rows.
EDGE_HOST_DEVICE inline std::int32_t tiles_of(std::int32_t rows, std::int32_t tile_rows) {
  return rows > 0 ? (rows - 1) / tile_rows + 1 : 0;
}

// The most tiles `pairs` rows in at most `slots` experts can make: each expert at most one
// partial tile, and no tile without a row.
EDGE_HOST_DEVICE inline std::int64_t max_tiles(std::int64_t pairs, std::int64_t slots, std::int64_t tile_rows) {
  const std::int64_t bound = (pairs + (tile_rows - 1) * slots) / tile_rows;
  return bound < pairs ? bound : pairs;
}

// The chosen slot whose tiles hold tile j: the last s in [0, chosen) with tile_begin[s] <= j
// (j < tile_begin[chosen], chosen >= 1).
EDGE_HOST_DEVICE inline std::int32_t tile_slot(const std::int32_t* tile_begin, std::int32_t chosen, std::int32_t j) {
  std::int32_t lo = 0;
  std::int32_t hi = chosen - 1;
  while (lo < hi) {
    const std::int32_t mid = (lo + hi + 1) / 2;
    if (tile_begin[mid] <= j) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace edge::kernels::moe_experts_order
