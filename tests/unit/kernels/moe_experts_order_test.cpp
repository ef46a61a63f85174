// The CUDA experts' grouping (moe_experts_order.h) run on the host as the device runs it (a
// block of warps per expert, a round of pairs at a time, ballots), against the CPU's stable
// counting sort; the tensor-core work list of 64-row tiles; and the order in which a token's
// contributions are summed.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/moe_experts/moe_experts.h"
#include "kernels/moe_experts/moe_experts_order.h"

namespace {

namespace order = edge::kernels::moe_experts_order;

struct grouping {
  std::vector<std::int32_t> begin;   // [num_experts + 1]
  std::vector<std::int32_t> rows;    // [pairs] the pair of each row (placed rows only)
  std::vector<std::int32_t> row_of;  // [pairs] the row of each pair, -1 when left out
};

// count_kernel and place_kernel of moe_experts.cu, with `warps` warps per block.
grouping device_grouping(const std::vector<std::int32_t>& experts, int num_experts, int warps) {
  const auto pairs = static_cast<std::int64_t>(experts.size());
  grouping g{std::vector<std::int32_t>(static_cast<std::size_t>(num_experts + 1), 0),
             std::vector<std::int32_t>(experts.size(), -1), std::vector<std::int32_t>(experts.size(), -1)};
  std::vector<std::int32_t> counts(static_cast<std::size_t>(num_experts), 0);
  for (const std::int32_t e : experts) {
    if (e >= 0 && e < num_experts) ++counts[static_cast<std::size_t>(e)];
  }
  for (int e = 0; e < num_experts; ++e) g.begin[e + 1] = g.begin[e] + counts[static_cast<std::size_t>(e)];
  const int threads = warps * order::warp_lanes;
  for (int e = 0; e < num_experts; ++e) {
    const std::int32_t first = g.begin[e];
    const std::int32_t count = g.begin[e + 1] - first;
    std::int32_t placed = 0;
    for (std::int64_t round = 0; round < pairs && placed < count; round += threads) {
      std::vector<std::uint32_t> ballots(static_cast<std::size_t>(warps), 0u);
      for (int tid = 0; tid < threads; ++tid) {
        const std::int64_t i = round + tid;
        if (i < pairs && experts[static_cast<std::size_t>(i)] == e) {
          ballots[static_cast<std::size_t>(tid / order::warp_lanes)] |= std::uint32_t{1} << (tid % order::warp_lanes);
        }
      }
      for (int tid = 0; tid < threads; ++tid) {
        const std::int64_t i = round + tid;
        if (i >= pairs || experts[static_cast<std::size_t>(i)] != e) continue;
        const std::int32_t row =
            first + placed + order::round_place(ballots.data(), tid / order::warp_lanes, tid % order::warp_lanes);
        g.rows[static_cast<std::size_t>(row)] = static_cast<std::int32_t>(i);
        g.row_of[static_cast<std::size_t>(i)] = row;
      }
      placed += order::round_count(ballots.data(), warps);
    }
  }
  return g;
}

}  // namespace

TEST_CASE("ballot places count the marks of earlier warps, then of lower lanes") {
  const std::array<std::uint32_t, 3> ballots = {0x8000'0001u, 0u, 0xFFFF'FFFFu};
  CHECK(order::round_place(ballots.data(), 0, 0) == 0);
  CHECK(order::round_place(ballots.data(), 0, 31) == 1);
  CHECK(order::round_place(ballots.data(), 2, 0) == 2);
  CHECK(order::round_place(ballots.data(), 2, 31) == 33);
  CHECK(order::round_count(ballots.data(), 3) == 34);
  CHECK(order::marks_below(0xFFFF'FFFFu, 0) == 0);
}

TEST_CASE("the device's grouping is the CPU's stable counting sort of the pairs by expert") {
  std::mt19937 rng(5);
  // {tokens, top_k, experts}: decode and prefill batches, experts with 0, 1 and many pairs.
  for (const auto& [tokens, top_k, num_experts] : std::vector<std::array<int, 3>>{
           {1, 8, 128}, {97, 8, 128}, {513, 8, 384}, {3, 2, 8}, {300, 4, 4}, {64, 1, 1024}}) {
    CAPTURE(tokens);
    std::vector<std::int32_t> experts;
    for (int t = 0; t < tokens; ++t) {
      // Distinct experts per token, skewed so that a few are popular and many unchosen.
      std::vector<std::int32_t> chosen;
      while (static_cast<int>(chosen.size()) < top_k) {
        const auto e = static_cast<std::int32_t>(
            std::min<double>(num_experts - 1, std::exponential_distribution<>(8.0 / num_experts)(rng)));
        if (std::find(chosen.begin(), chosen.end(), e) == chosen.end()) chosen.push_back(e);
      }
      experts.insert(experts.end(), chosen.begin(), chosen.end());
    }
    // Ids outside the set are left out, as the kernels do with them.
    if (tokens > 3) {
      experts[2] = -1;
      experts[experts.size() - 1] = num_experts;
    }
    std::vector<std::int32_t> want(experts.size());
    std::iota(want.begin(), want.end(), 0);
    want.erase(std::remove_if(want.begin(), want.end(),
                              [&](std::int32_t i) {
                                return experts[static_cast<std::size_t>(i)] < 0 ||
                                       experts[static_cast<std::size_t>(i)] >= num_experts;
                              }),
               want.end());
    std::stable_sort(want.begin(), want.end(), [&](std::int32_t a, std::int32_t b) {
      return experts[static_cast<std::size_t>(a)] < experts[static_cast<std::size_t>(b)];
    });
    for (const int warps : {8, 1}) {
      const grouping g = device_grouping(experts, num_experts, warps);
      CHECK(g.begin.back() == static_cast<std::int32_t>(want.size()));
      CHECK(std::equal(want.begin(), want.end(), g.rows.begin()));
      for (std::size_t j = 0; j < want.size(); ++j)
        CHECK(g.row_of[static_cast<std::size_t>(want[j])] == static_cast<std::int32_t>(j));
      for (int e = 0; e < num_experts; ++e) {
        for (std::int32_t j = g.begin[e]; j < g.begin[e + 1]; ++j)
          CHECK(experts[static_cast<std::size_t>(g.rows[static_cast<std::size_t>(j)])] == e);
      }
    }
  }
}

TEST_CASE("a token's contributions are summed by expert id, equal ids in choice order") {
  const std::vector<std::int32_t> experts = {7, 2, 9, 2, 0, 7};
  std::vector<std::int32_t> sorted(experts.size());
  std::iota(sorted.begin(), sorted.end(), 0);
  std::sort(sorted.begin(), sorted.end(), [&](std::int32_t a, std::int32_t b) {
    return experts[static_cast<std::size_t>(a)] < experts[static_cast<std::size_t>(b)] ||
           (experts[static_cast<std::size_t>(a)] == experts[static_cast<std::size_t>(b)] && a < b);
  });
  std::vector<std::int32_t> placed(experts.size(), -1);
  for (std::size_t i = 0; i < experts.size(); ++i) {
    placed[static_cast<std::size_t>(order::choice_rank(experts.data(), static_cast<std::int64_t>(experts.size()),
                                                       static_cast<std::int64_t>(i)))] = static_cast<std::int32_t>(i);
  }
  CHECK(placed == sorted);
  CHECK(placed == std::vector<std::int32_t>{4, 1, 3, 0, 5, 2});
}

TEST_CASE("the workspace holds the CPU's sums or the CUDA grouping, whichever is larger") {
  // Decode of a small model: the int32 grouping (begin 129, order and row_of 2 x 8, the chosen
  // experts 129, their first tiles 129) outgrows one token's sums (64).
  const auto small = edge::kernels::moe_experts_workspace(1, 8, 128, 64, 32);
  CHECK(small.activation == 8 * 64);
  CHECK(small.expert_out == small.activation + 8 * 2 * 32);
  CHECK(small.tail == small.expert_out + 8 * 64);
  CHECK(small.floats == small.tail + 129 + 16 + 129 + 129);
  const auto large = edge::kernels::moe_experts_workspace(97, 8, 128, 2048, 768);
  CHECK(large.floats == large.tail + 97 * 2048);
  CHECK(edge::kernels::moe_experts_workspace_floats(97, 8, 128, 2048, 768) == large.floats);
}

// count_kernel's work list (tile_begin over the chosen experts) and grouped_gemm_kernel's
// reading of it, for every block of the grid: each chosen expert's rows are covered by its
// tiles exactly once, in order, no tile is empty, and the blocks past the count are idle.
TEST_CASE("the tensor-core work list covers every chosen expert's rows once, in tiles of 64") {
  constexpr std::int32_t tile_rows = 64;
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int num_experts = std::array{1, 5, 16, 128, 384}[trial % 5];
    const std::int64_t tokens = std::uniform_int_distribution<std::int64_t>(1, 600)(rng);
    const std::int64_t top_k = std::min<std::int64_t>(num_experts, std::array{1, 2, 8}[trial % 3]);
    // Skewed choices: a few hot experts, as real routers make, and ids outside the set.
    std::vector<std::int32_t> experts(static_cast<std::size_t>(tokens * top_k));
    std::geometric_distribution<int> hot(0.05);
    for (auto& e : experts) e = rng() % 50 == 0 ? -1 : hot(rng) % num_experts;
    std::vector<std::int32_t> counts(static_cast<std::size_t>(num_experts), 0);
    for (const std::int32_t e : experts) {
      if (e >= 0) ++counts[static_cast<std::size_t>(e)];
    }
    // count_kernel: the chosen experts in id order, the exclusive scan of their tiles.
    std::vector<std::int32_t> chosen, tile_begin, begin(static_cast<std::size_t>(num_experts + 1), 0);
    std::int32_t tiles = 0;
    for (int e = 0; e < num_experts; ++e) {
      begin[static_cast<std::size_t>(e) + 1] = begin[static_cast<std::size_t>(e)] + counts[static_cast<std::size_t>(e)];
      if (counts[static_cast<std::size_t>(e)] == 0) continue;
      chosen.push_back(e);
      tile_begin.push_back(tiles);
      tiles += order::tiles_of(counts[static_cast<std::size_t>(e)], tile_rows);
    }
    tile_begin.push_back(tiles);
    const auto slots = std::min<std::int64_t>(tokens * top_k, num_experts);
    const std::int64_t grid = order::max_tiles(tokens * top_k, slots, tile_rows);
    REQUIRE(tiles <= grid);
    // grouped_gemm_kernel: each block of the grid finds its expert and first row.
    std::vector<std::int32_t> covered(static_cast<std::size_t>(num_experts), 0);
    const auto n_chosen = static_cast<std::int32_t>(chosen.size());
    for (std::int32_t j = 0; j < grid; ++j) {
      if (n_chosen == 0 || j >= tile_begin[static_cast<std::size_t>(n_chosen)]) continue;  // idle
      const std::int32_t slot = order::tile_slot(tile_begin.data(), n_chosen, j);
      const std::int32_t e = chosen[static_cast<std::size_t>(slot)];
      const std::int32_t t0 = (j - tile_begin[static_cast<std::size_t>(slot)]) * tile_rows;
      const std::int32_t rows = counts[static_cast<std::size_t>(e)];
      REQUIRE(t0 == covered[static_cast<std::size_t>(e)]);  // in order, no gap, no overlap
      REQUIRE(t0 < rows);                                   // no empty tile
      covered[static_cast<std::size_t>(e)] = std::min(rows, t0 + tile_rows);
    }
    CHECK(covered == counts);
  }
  // The bound: 2,048 pairs of Kimi K2's prefill chunk in at most 384 experts.
  CHECK(order::max_tiles(2048, 384, 64) == (2048 + 63 * 384) / 64);
  CHECK(order::max_tiles(8, 8, 64) == 8);  // one row each at most
  CHECK(order::max_tiles(64 * 8, 1, 64) == 8);
}
