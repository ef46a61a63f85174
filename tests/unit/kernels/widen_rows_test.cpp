// The CUDA decode attention's widening of K and V rows into shared memory (widen_rows.h): a
// model of the 32 banks shows every store of a warp hits 32 different banks, for each head size
// and cache dtype (the element-after-element order it replaced met 4 to 16 lanes in one bank),
// and the rotated chunks put every element where it belongs.
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <random>
#include <set>

#include "kernels/paged_attention/widen_rows.h"

namespace {

namespace wr = edge::kernels::widen_rows;

constexpr int threads = 128;   // paged_attention.cu's attn_threads
constexpr int key_tile = 32;   // the decode kernel's keys per tile (a lane per key)
constexpr int banks = 32;

// The most lanes of one warp that store to different floats of one bank, over every store of a
// tile's widening; `rotated` false: each lane's elements one after another (the old order).
int worst_conflict(int head_dim, int vec, bool k_rows, bool rotated) {
  const int pieces = head_dim / vec;
  const std::int64_t stride = k_rows ? head_dim + 1 : head_dim;
  int worst = 1;
  for (int first = 0; first < key_tile * pieces; first += threads) {
    for (int warp = 0; warp < threads / 32; ++warp) {
      for (int e = 0; e < vec; ++e) {
        std::map<int, std::set<std::int64_t>> by_bank;
        for (int lane = 0; lane < 32; ++lane) {
          const int i = first + warp * 32 + lane;
          if (i >= key_tile * pieces) continue;
          const int row = i / pieces;
          const int piece = i % pieces;
          const int rotation = !rotated ? 0 : (k_rows ? wr::k_rotation(lane, row, vec) : wr::v_rotation(lane, vec));
          const std::int64_t at = wr::store_index(row, stride, piece, vec, rotation, e);
          by_bank[static_cast<int>(at % banks)].insert(at);
        }
        for (const auto& [bank, addresses] : by_bank) worst = std::max(worst, static_cast<int>(addresses.size()));
      }
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("widen_rows: every store of a warp hits 32 different banks") {
  for (const int head_dim : {64, 128, 256}) {
    for (const int vec : {4, 8, 16}) {  // f32, bf16 / f16, FP8
      INFO("head_dim " << head_dim << ", " << vec << " elements a chunk");
      CHECK(worst_conflict(head_dim, vec, true, true) == 1);
      CHECK(worst_conflict(head_dim, vec, false, true) == 1);
    }
  }
  // What the order before it cost (V rows: 16-bit 8-way, FP8 16-way; K rows up to 8-way).
  CHECK(worst_conflict(128, 8, false, false) == 8);
  CHECK(worst_conflict(128, 16, false, false) == 16);
  CHECK(worst_conflict(256, 8, true, false) == 8);
}

TEST_CASE("widen_rows: a rotated chunk puts each element in its place") {
  std::mt19937 rng(5);
  for (int round = 0; round < 50; ++round) {
    wr::chunk c{{static_cast<std::uint32_t>(rng()), static_cast<std::uint32_t>(rng()), static_cast<std::uint32_t>(rng()),
                 static_cast<std::uint32_t>(rng())}};
    for (const int bytes : {1, 2, 4}) {
      const int vec = 16 / bytes;
      const auto element = [&](const wr::chunk& x, int e) {
        const int bit = e * bytes * 8;
        const std::uint64_t word = x.w[bit / 32] >> (bit % 32);
        return bytes == 4 ? word & 0xffffffffu : word & ((std::uint64_t{1} << (bytes * 8)) - 1);
      };
      for (int r = 0; r < vec; ++r) {
        const wr::chunk rotated = wr::rotate_right(c, r * bytes * 8);
        std::set<std::int64_t> placed;
        for (int e = 0; e < vec; ++e) {
          // The e-th store writes the rotated chunk's element e at (e + r) % vec of the row's chunk.
          const std::int64_t at = wr::store_index(0, 0, 0, vec, r, e);
          CHECK(element(rotated, e) == element(c, static_cast<int>(at)));
          placed.insert(at);
        }
        CHECK(placed.size() == static_cast<std::size_t>(vec));
      }
    }
  }
}
