// The CUDA tensor-core prefill attention's fragment arithmetic (attention_tiles.h), run on the
// host: one warp's 16 query rows against a 64-key tile, with ldmatrix and ldmatrix.trans
// emulated over the shared K and V rows and every register placed where PTX's fragment layout
// for mma.m16n8k16 (bf16) puts it; S = Q Kᵀ and O = P V checked against plain sums.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "edge/kernels/numerics.h"
#include "kernels/paged_attention/attention_tiles.h"
#include "mma_emulation.h"

namespace {

namespace at = edge::kernels::attention_tiles;
using edge::kernels::bf16_to_float;
using edge::kernels::float_to_bf16;

constexpr int head_dim = 64;
constexpr int row_elements = at::row_elements(head_dim);

float bf16_round(float v) { return bf16_to_float(float_to_bf16(v)); }

// A shared [key_tile][row_elements] bf16 tile (as floats already rounded to bf16).
using tile = std::vector<float>;

// ldmatrix.x4 (trans = false): register m of lane L holds (row L / 4, columns 2 (L % 4), +1) of
// matrix m, whose row r starts where lane 8m + r points; with trans, (rows 2 (L % 4), +1 of
// column L / 4).
template <class Source>
std::array<std::array<std::array<float, 2>, 4>, 32> ldmatrix(const tile& shared, bool trans, Source source) {
  std::array<std::array<std::array<float, 2>, 4>, 32> regs{};
  for (int lane = 0; lane < 32; ++lane) {
    for (int m = 0; m < 4; ++m) {
      for (int e = 0; e < 2; ++e) {
        const int r = trans ? 2 * (lane % 4) + e : lane / 4;
        const int c = trans ? lane / 4 : 2 * (lane % 4) + e;
        const auto [row, col] = source(8 * m + r);  // the row lane 8m + r points at, and its first column
        regs[static_cast<std::size_t>(lane)][static_cast<std::size_t>(m)][static_cast<std::size_t>(e)] =
            shared[static_cast<std::size_t>(row * row_elements + col + c)];
      }
    }
  }
  return regs;
}

}  // namespace

TEST_CASE("a warp's attention tile: S = Q K^T and O = P V from the mma fragments") {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> spread(-2.0f, 2.0f);
  std::vector<float> q(16 * head_dim);
  for (float& v : q) v = bf16_round(spread(rng));
  tile k(static_cast<std::size_t>(at::key_tile * row_elements), 0.0f);
  tile v(k.size(), 0.0f);
  for (int key = 0; key < at::key_tile; ++key) {
    for (int d = 0; d < head_dim; ++d) {
      k[static_cast<std::size_t>(key * row_elements + d)] = bf16_round(spread(rng));
      v[static_cast<std::size_t>(key * row_elements + d)] = bf16_round(spread(rng));
    }
  }

  // S: 8 key n-tiles of accumulators per lane.
  std::array<std::array<std::array<float, 4>, at::key_n_tiles>, 32> s{};
  for (int step = 0; step < head_dim / 16; ++step) {
    for (int pair = 0; pair < at::key_n_tiles / 2; ++pair) {
      const auto b = ldmatrix(k, false, [&](int lane) {
        const at::k_source src = at::k_row(pair, step, lane);
        return std::pair{src.key, src.d};
      });
      for (int half = 0; half < 2; ++half) {
        const int j = 2 * pair + half;
        edge::testing::mma_step mma;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4;
          const int t = lane % 4;
          for (int a = 0; a < 4; ++a) {
            const at::q_element e = at::q_register(g, t, step, a);
            CHECK(e.row == edge::testing::mma_step::a_row(lane, a));
            CHECK(e.d == 16 * step + edge::testing::mma_step::a_col(lane, a));
            mma.set_a(lane, a, q[static_cast<std::size_t>(e.row * head_dim + e.d)],
                      q[static_cast<std::size_t>(e.row * head_dim + e.d + 1)]);
          }
          for (int r = 0; r < 2; ++r) {
            const auto& pairv = b[static_cast<std::size_t>(lane)][static_cast<std::size_t>(2 * half + r)];
            mma.set_b(lane, r, pairv[0], pairv[1]);
          }
        }
        for (int lane = 0; lane < 32; ++lane) {
          for (int c = 0; c < 4; ++c) {
            s[static_cast<std::size_t>(lane)][static_cast<std::size_t>(j)][static_cast<std::size_t>(c)] +=
                static_cast<float>(mma.product(lane, c));
          }
        }
      }
    }
  }
  // Each accumulator is the dot product of its row and key.
  std::vector<float> p_full(16 * at::key_tile);  // [row][key], the probabilities used below
  for (int lane = 0; lane < 32; ++lane) {
    for (int j = 0; j < at::key_n_tiles; ++j) {
      for (int c = 0; c < 4; ++c) {
        const at::s_element e = at::s_accumulator(lane / 4, lane % 4, j, c);
        double want = 0.0;
        for (int d = 0; d < head_dim; ++d) {
          want += static_cast<double>(q[static_cast<std::size_t>(e.row * head_dim + d)]) *
                  k[static_cast<std::size_t>(e.key * row_elements + d)];
        }
        const float got = s[static_cast<std::size_t>(lane)][static_cast<std::size_t>(j)][static_cast<std::size_t>(c)];
        CHECK(got == doctest::Approx(want).epsilon(1e-5));
        // Probabilities rounded to bf16 as the kernel packs them (not normalised: any weights do).
        p_full[static_cast<std::size_t>(e.row * at::key_tile + e.key)] = bf16_round(std::exp(got / 16.0f));
      }
    }
  }

  // O = P V: P's A registers from the S accumulators, V's B registers through ldmatrix.trans.
  std::vector<double> o(16 * head_dim, 0.0);
  for (int key_step = 0; key_step < at::key_tile / 16; ++key_step) {
    for (int pair = 0; pair < head_dim / 16; ++pair) {
      const auto b = ldmatrix(v, true, [&](int lane) {
        const at::v_source src = at::v_row(key_step, pair, lane);
        return std::pair{src.key, src.d};
      });
      for (int half = 0; half < 2; ++half) {
        const int n = 2 * pair + half;
        edge::testing::mma_step mma;
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane / 4;
          const int t = lane % 4;
          for (int a = 0; a < 4; ++a) {
            const at::p_source src = at::p_register(key_step, a);
            float pair_values[2];
            for (int e = 0; e < 2; ++e) {
              const at::s_element se = at::s_accumulator(g, t, src.n_tile, src.first_accumulator + e);
              CHECK(se.row == edge::testing::mma_step::a_row(lane, a));
              CHECK(se.key == 16 * key_step + edge::testing::mma_step::a_col(lane, a) + e);
              pair_values[e] = p_full[static_cast<std::size_t>(se.row * at::key_tile + se.key)];
            }
            mma.set_a(lane, a, pair_values[0], pair_values[1]);
          }
          for (int r = 0; r < 2; ++r) {
            const auto& pairv = b[static_cast<std::size_t>(lane)][static_cast<std::size_t>(2 * half + r)];
            mma.set_b(lane, r, pairv[0], pairv[1]);
          }
        }
        for (int lane = 0; lane < 32; ++lane) {
          for (int c = 0; c < 4; ++c) {
            const at::o_element e = at::o_accumulator(lane / 4, lane % 4, n, c);
            CHECK(e.row == edge::testing::mma_step::c_row(lane, c));
            CHECK(e.d == 8 * n + edge::testing::mma_step::c_col(lane, c));
            o[static_cast<std::size_t>(e.row * head_dim + e.d)] += mma.product(lane, c);
          }
        }
      }
    }
  }
  for (int row = 0; row < 16; ++row) {
    for (int d = 0; d < head_dim; ++d) {
      double want = 0.0;
      for (int key = 0; key < at::key_tile; ++key) {
        want += static_cast<double>(p_full[static_cast<std::size_t>(row * at::key_tile + key)]) *
                v[static_cast<std::size_t>(key * row_elements + d)];
      }
      CAPTURE(row);
      CAPTURE(d);
      CHECK(o[static_cast<std::size_t>(row * head_dim + d)] == doctest::Approx(want).epsilon(1e-9));
    }
  }
}

TEST_CASE("K and V tiles: each ldmatrix reads 8 rows from 8 distinct bank groups") {
  for (const int d : {64, 128}) {
    const int row_bytes = at::row_elements(d) * 2;
    for (int lane0 = 0; lane0 < 32; lane0 += 8) {
      std::set<int> k_groups;
      std::set<int> v_groups;
      for (int lane = lane0; lane < lane0 + 8; ++lane) {
        const at::k_source ks = at::k_row(1, 1, lane);
        const at::v_source vs = at::v_row(1, 1, lane);
        k_groups.insert((ks.key * row_bytes + ks.d * 2) % 128 / 16);
        v_groups.insert((vs.key * row_bytes + vs.d * 2) % 128 / 16);
      }
      CHECK(k_groups.size() == 8);
      CHECK(v_groups.size() == 8);
    }
  }
}

TEST_CASE("the flat list of (run, tile) blocks finds every block's run, empty runs included") {
  // Runs of 97, 1, 0, 1, 16 and 5 tokens, 8 tokens a tile.
  const std::vector<std::int64_t> lengths = {97, 1, 0, 1, 16, 5};
  const std::int64_t tile = 8;
  std::vector<std::int32_t> offsets = {0};
  std::int64_t tokens = 0;
  for (const std::int64_t len : lengths) {
    offsets.push_back(offsets.back() + static_cast<std::int32_t>((len + tile - 1) / tile));
    tokens += len;
  }
  const auto runs = static_cast<std::int64_t>(lengths.size());
  CHECK(offsets.back() <= at::flat_tile_bound(tokens, runs, tile));
  std::vector<std::int64_t> blocks_of(lengths.size(), 0);
  for (std::int64_t b = 0; b < at::flat_tile_bound(tokens, runs, tile); ++b) {
    const std::int64_t run = at::run_of_block(offsets.data(), runs, b);
    if (b >= offsets.back()) {
      CHECK(run == -1);
      continue;
    }
    REQUIRE(run >= 0);
    CHECK(offsets[static_cast<std::size_t>(run)] <= b);
    CHECK(b < offsets[static_cast<std::size_t>(run) + 1]);  // never an empty run
    ++blocks_of[static_cast<std::size_t>(run)];
  }
  CHECK(blocks_of == std::vector<std::int64_t>{13, 1, 0, 1, 2, 1});
  // The bound holds for runs that each waste most of a tile.
  CHECK(at::flat_tile_bound(64 * 9, 64, 8) >= 64 * 2);
}
