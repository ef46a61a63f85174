// The CUDA tensor-core MLA attention's fragment arithmetic (mla_tiles.h), run on the host: the
// eight warps of a block over one tile of 32 cache rows, with ldmatrix and ldmatrix.trans
// emulated over the shared queries, rows and P, every register placed where PTX's fragment
// layout for mma.m16n8k16 (bf16) puts it and P written where the kernel writes it; S = Q Kᵀ and
// O = P V checked against plain sums.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "edge/kernels/numerics.h"
#include "kernels/mla_attention/mla_attention.h"
#include "kernels/mla_attention/mla_tiles.h"
#include "mma_emulation.h"

namespace {

namespace at = edge::kernels::attention_tiles;
namespace mt = edge::kernels::mla_tiles;
using edge::kernels::bf16_to_float;
using edge::kernels::float_to_bf16;

float bf16_round(float v) { return bf16_to_float(float_to_bf16(v)); }

// A shared row-major array of bf16 values (held as floats already rounded), `stride` per row.
struct shared_array {
  int stride;
  std::vector<float> values;
  float at(int row, int col) const { return values[static_cast<std::size_t>(row * stride + col)]; }
  float& at(int row, int col) { return values[static_cast<std::size_t>(row * stride + col)]; }
};

using fragments = std::array<std::array<std::array<float, 2>, 4>, 32>;  // [lane][register][pair]

// ldmatrix.x4 (trans = false): register m of lane L holds (row L / 4, columns 2 (L % 4), +1) of
// matrix m, whose row r starts where lane 8m + r points; with trans, (rows 2 (L % 4), +1 of
// column L / 4).
template <class Source>
fragments ldmatrix(const shared_array& shared, bool trans, Source source) {
  fragments regs{};
  for (int lane = 0; lane < 32; ++lane) {
    for (int m = 0; m < 4; ++m) {
      for (int e = 0; e < 2; ++e) {
        const int r = trans ? 2 * (lane % 4) + e : lane / 4;
        const int c = trans ? lane / 4 : 2 * (lane % 4) + e;
        const auto [row, col] = source(8 * m + r);  // the row lane 8m + r points at, and its first column
        regs[static_cast<std::size_t>(lane)][static_cast<std::size_t>(m)][static_cast<std::size_t>(e)] =
            shared.at(row, col + c);
      }
    }
  }
  return regs;
}

// One mma: A from a register set, B from registers b_first, b_first + 1 of another.
double accumulate(const fragments& a, const fragments& b, int b_first, int lane, int c) {
  edge::testing::mma_step mma;
  for (int l = 0; l < 32; ++l) {
    for (int reg = 0; reg < 4; ++reg) {
      const auto& v = a[static_cast<std::size_t>(l)][static_cast<std::size_t>(reg)];
      mma.set_a(l, reg, v[0], v[1]);
    }
    for (int reg = 0; reg < 2; ++reg) {
      const auto& v = b[static_cast<std::size_t>(l)][static_cast<std::size_t>(b_first + reg)];
      mma.set_b(l, reg, v[0], v[1]);
    }
  }
  return mma.product(lane, c);
}

}  // namespace

TEST_CASE("a block's MLA tile: S = Q K^T over two halves of the keys, P through shared memory, O = P V") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> spread(-1.0f, 1.0f);
  shared_array q{mt::row_elements, std::vector<float>(static_cast<std::size_t>(mt::rows * mt::row_elements), 0.0f)};
  shared_array k{mt::row_elements, std::vector<float>(static_cast<std::size_t>(mt::keys * mt::row_elements), 0.0f)};
  for (int r = 0; r < mt::rows; ++r) {
    for (int d = 0; d < mt::width; ++d) q.at(r, d) = bf16_round(spread(rng));
  }
  for (int key = 0; key < mt::keys; ++key) {
    for (int d = 0; d < mt::width; ++d) k.at(key, d) = bf16_round(spread(rng));
  }
  // The padding of each row holds NaN: a fragment that reads it turns its sums NaN.
  for (int r = 0; r < mt::rows; ++r) {
    for (int d = mt::width; d < mt::row_elements; ++d) q.at(r, d) = NAN;
  }
  for (int key = 0; key < mt::keys; ++key) {
    for (int d = mt::width; d < mt::row_elements; ++d) k.at(key, d) = NAN;
  }

  shared_array p{mt::p_row_elements, std::vector<float>(static_cast<std::size_t>(mt::rows * mt::p_row_elements), NAN)};
  std::set<std::pair<int, int>> written;  // (row, key) of P
  for (int warp = 0; warp < mt::warps; ++warp) {
    const mt::warp_role role = mt::role_of(warp);
    std::array<std::array<std::array<double, 4>, 2>, 32> s{};  // [lane][n-tile][accumulator]
    for (int step = 0; step < mt::score_steps; ++step) {
      const fragments qa = ldmatrix(q, false, [&](int lane) {
        const mt::a_source src = mt::a_row(lane);
        return std::pair{16 * role.m + src.row, 16 * step + src.col};
      });
      // The A registers are the ones attention_tiles::q_register names.
      for (int lane = 0; lane < 32; ++lane) {
        for (int reg = 0; reg < 4; ++reg) {
          const at::q_element e = at::q_register(lane / 4, lane % 4, step, reg);
          CHECK(qa[static_cast<std::size_t>(lane)][static_cast<std::size_t>(reg)][0] == q.at(16 * role.m + e.row, e.d));
        }
      }
      const fragments kb = ldmatrix(k, false, [&](int lane) {
        const at::k_source src = at::k_row(role.half, step, lane);
        return std::pair{src.key, src.d};
      });
      for (int lane = 0; lane < 32; ++lane) {
        for (int j = 0; j < 2; ++j) {
          for (int c = 0; c < 4; ++c) {
            s[static_cast<std::size_t>(lane)][static_cast<std::size_t>(j)][static_cast<std::size_t>(c)] +=
                accumulate(qa, kb, 2 * j, lane, c);
          }
        }
      }
    }
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane / 4;
      const int t = lane % 4;
      for (int j = 0; j < 2; ++j) {
        for (int c = 0; c < 4; ++c) {
          const int row = 16 * role.m + at::s_accumulator(g, t, j, c).row;
          const int key = mt::score_key(role.half, g, t, j, c);
          double want = 0.0;
          for (int d = 0; d < mt::width; ++d) want += static_cast<double>(q.at(row, d)) * k.at(key, d);
          const double got = s[static_cast<std::size_t>(lane)][static_cast<std::size_t>(j)][static_cast<std::size_t>(c)];
          CHECK(got == doctest::Approx(want).epsilon(1e-9));
        }
        // P as the kernel stores it: pairs (0, 1) in row g, (2, 3) in row g + 8, at key
        // 16 half + 8 j + 2 t (unnormalised weights: any values do).
        const int key = 16 * role.half + 8 * j + 2 * t;
        for (int c = 0; c < 4; ++c) {
          const int row = 16 * role.m + g + 8 * (c / 2);
          CHECK(key + c % 2 == mt::score_key(role.half, g, t, j, c));
          const double value = s[static_cast<std::size_t>(lane)][static_cast<std::size_t>(j)][static_cast<std::size_t>(c)];
          p.at(row, key + c % 2) = bf16_round(static_cast<float>(std::exp(value / 16.0)));
          CHECK(written.insert({row, key + c % 2}).second);
        }
      }
    }
  }
  // Every (row, key) of P is written once, by the warp that scored it.
  CHECK(written.size() == static_cast<std::size_t>(mt::rows * mt::keys));

  for (int warp = 0; warp < mt::warps; ++warp) {
    const mt::warp_role role = mt::role_of(warp);
    std::vector<double> o(static_cast<std::size_t>(16 * mt::half_columns), 0.0);  // [row of the tile][column of the half]
    for (int key_step = 0; key_step < mt::keys / 16; ++key_step) {
      const fragments pa = ldmatrix(p, false, [&](int lane) {
        const mt::a_source src = mt::a_row(lane);
        return std::pair{16 * role.m + src.row, 16 * key_step + src.col};
      });
      for (int pair = 0; pair < mt::o_tiles / 2; ++pair) {
        const fragments vb = ldmatrix(k, true, [&](int lane) {
          const at::v_source src = at::v_row(key_step, pair, lane);
          return std::pair{src.key, mt::half_columns * role.half + src.d};
        });
        for (int lane = 0; lane < 32; ++lane) {
          for (int sub = 0; sub < 2; ++sub) {
            const int n = 2 * pair + sub;
            for (int c = 0; c < 4; ++c) {
              const at::o_element e = at::o_accumulator(lane / 4, lane % 4, n, c);
              o[static_cast<std::size_t>(e.row * mt::half_columns + e.d)] += accumulate(pa, vb, 2 * sub, lane, c);
            }
          }
        }
      }
    }
    for (int row = 0; row < 16; ++row) {
      for (int d = 0; d < mt::half_columns; ++d) {
        const int column = mt::half_columns * role.half + d;
        double want = 0.0;
        for (int key = 0; key < mt::keys; ++key) want += static_cast<double>(p.at(16 * role.m + row, key)) * k.at(key, column);
        CAPTURE(warp);
        CAPTURE(row);
        CAPTURE(d);
        CHECK(o[static_cast<std::size_t>(row * mt::half_columns + d)] == doctest::Approx(want).epsilon(1e-9));
      }
    }
  }
}

TEST_CASE("the MLA tile's shared rows: each ldmatrix reads 8 rows from 8 distinct bank groups") {
  for (const int row_bytes : {mt::row_elements * 2, mt::p_row_elements * 2}) {
    for (int lane0 = 0; lane0 < 32; lane0 += 8) {
      std::set<int> groups;
      for (int lane = lane0; lane < lane0 + 8; ++lane) {
        const mt::a_source src = mt::a_row(lane);
        groups.insert((src.row * row_bytes + src.col * 2) % 128 / 16);
      }
      CHECK(groups.size() == 8);
    }
  }
}

TEST_CASE("mla split: one token takes up to 128 slices, a batch never fewer than 32 each, within the workspace") {
  namespace ek = edge::kernels;
  // 64 heads are one tensor-core block: a token alone was 32 blocks for 132 SMs.
  CHECK(ek::mla_attention_splits_cap(1) == 128);
  CHECK(ek::mla_attention_splits_cap(2) == 64);
  CHECK(ek::mla_attention_splits_cap(4) == 32);
  CHECK(ek::mla_attention_splits_cap(64) == 32);
  // The workspace holds every call of up to `tokens` tokens at its cap, and no more than the
  // 32 slices a token it held before past 4 tokens.
  for (std::int64_t tokens = 1; tokens <= 300; ++tokens) {
    const std::int64_t floats = ek::mla_attention_workspace_floats(tokens, 64, 512);
    for (std::int64_t t = 1; t <= tokens; ++t) CHECK(floats >= t * ek::mla_attention_splits_cap(t) * 64 * 514);
    if (tokens >= 4) CHECK(floats == tokens * 32 * 64 * 514);
  }
}
