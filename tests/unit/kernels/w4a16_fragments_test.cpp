// The CUDA W4A16 decode kernel's fragment arithmetic (w4a16_fragments.h), run on the host: a
// warp is emulated lane by lane over INT4 rows in their stored layout, its registers placed
// where PTX's fragment layout for mma.m16n8k16 (bf16) puts them, and the product compared with
// a plain dot product of the same weights and bf16-rounded activations.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "edge/kernels/numerics.h"
#include "edge/kernels/weight_format.h"
#include "kernels/matmul/matmul.h"
#include "kernels/matmul/w4a16_fragments.h"
#include "mma_emulation.h"

namespace {

namespace w4 = edge::kernels::w4a16;
using edge::kernels::bf16_to_float;
using edge::kernels::float_to_bf16;

// The two bf16 halves of a 32-bit register, low half first.
std::array<float, 2> halves(std::uint32_t bits) {
  return {bf16_to_float(static_cast<std::uint16_t>(bits & 0xFFFFu)), bf16_to_float(static_cast<std::uint16_t>(bits >> 16))};
}
std::uint32_t pack(float lo, float hi) {
  return static_cast<std::uint32_t>(float_to_bf16(lo)) | (static_cast<std::uint32_t>(float_to_bf16(hi)) << 16);
}
// What the kernel's bf16x2 subtraction of pair_offset_bits leaves: exact, as both are small
// integers.
std::array<float, 2> dequantized(std::uint32_t pair) {
  const auto v = halves(pair);
  const auto offset = halves(w4::pair_offset_bits);
  return {v[0] - offset[0], v[1] - offset[1]};
}

std::uint32_t word_at(const std::uint8_t* row, std::int64_t chunk, int t) {
  std::uint32_t w = 0;
  std::memcpy(&w, row + chunk * w4::chunk_bytes + 4 * t, sizeof w);
  return w;
}

}  // namespace

TEST_CASE("pair_bits turns two nibbles into bf16 pairs that leave q exactly") {
  std::mt19937 rng(3);
  std::vector<std::uint8_t> chunk(w4::chunk_bytes);
  for (int trial = 0; trial < 200; ++trial) {
    for (auto& b : chunk) b = static_cast<std::uint8_t>(rng());
    for (int t = 0; t < 4; ++t) {
      const std::uint32_t word = word_at(chunk.data(), 0, t);
      std::set<int> seen;
      for (int p = 0; p < 4; ++p) {
        const auto q = dequantized(w4::pair_bits(word, p));
        const int first = w4::pair_first_element(t, p);
        CHECK(q[0] == static_cast<float>(edge::kernels::int4_get(chunk.data(), first)));
        CHECK(q[1] == static_cast<float>(edge::kernels::int4_get(chunk.data(), first + 2)));
        seen.insert(first);
        seen.insert(first + 2);
      }
      // A lane's word holds 8 distinct elements: 4t..4t+3 and 16+4t..16+4t+3.
      CHECK(seen == std::set<int>{4 * t, 4 * t + 1, 4 * t + 2, 4 * t + 3, 16 + 4 * t, 17 + 4 * t, 18 + 4 * t, 19 + 4 * t});
    }
  }
}

TEST_CASE("two mma steps over a chunk's fragments give the chunk's dot products") {
  // 16 rows of 3 chunks (k = 96), 8 tokens; each chunk checked on its own.
  constexpr int k = 3 * w4::chunk_k;
  std::mt19937 rng(5);
  std::vector<std::uint8_t> rows(static_cast<std::size_t>(w4::tile_rows) * edge::kernels::int4_row_bytes(k));
  for (auto& b : rows) b = static_cast<std::uint8_t>(rng());
  const std::int64_t row_bytes = edge::kernels::int4_row_bytes(k);
  std::uniform_real_distribution<float> spread(-3.0f, 3.0f);
  std::vector<float> x(static_cast<std::size_t>(w4::tile_tokens) * k);
  for (float& v : x) v = spread(rng);

  for (std::int64_t c = 0; c < k / w4::chunk_k; ++c) {
    double d[w4::tile_rows][w4::tile_tokens] = {};
    for (int step = 0; step < 2; ++step) {
      edge::testing::mma_step mma;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane / 4;
        const int t = lane % 4;
        const std::uint32_t word_g = word_at(rows.data() + g * row_bytes, c, t);
        const std::uint32_t word_g8 = word_at(rows.data() + (g + 8) * row_bytes, c, t);
        const std::uint32_t a[4] = {w4::pair_bits(word_g, w4::step_pair(step, 0)),
                                    w4::pair_bits(word_g8, w4::step_pair(step, 0)),
                                    w4::pair_bits(word_g, w4::step_pair(step, 1)),
                                    w4::pair_bits(word_g8, w4::step_pair(step, 1))};
        for (int reg = 0; reg < 4; ++reg) {
          const auto q = dequantized(a[reg]);
          mma.set_a(lane, reg, q[0], q[1]);
        }
        // The lane's float4 of x for token g, paired as the kernel pairs it.
        const float* x4 = x.data() + g * k + c * w4::chunk_k + w4::step_x_element(t, step);
        const std::uint32_t b[2] = {pack(x4[0], x4[2]), pack(x4[1], x4[3])};
        for (int reg = 0; reg < 2; ++reg) {
          const auto v = halves(b[reg]);
          mma.set_b(lane, reg, v[0], v[1]);
        }
      }
      for (int lane = 0; lane < 32; ++lane) {
        for (int acc = 0; acc < 4; ++acc) {
          d[edge::testing::mma_step::c_row(lane, acc)][edge::testing::mma_step::c_col(lane, acc)] += mma.product(lane, acc);
        }
      }
    }
    for (int row = 0; row < w4::tile_rows; ++row) {
      for (int token = 0; token < w4::tile_tokens; ++token) {
        double want = 0.0;
        for (int e = 0; e < w4::chunk_k; ++e) {
          const std::int64_t at = c * w4::chunk_k + e;
          const float xb = bf16_to_float(float_to_bf16(x[static_cast<std::size_t>(token * k + at)]));
          want += edge::kernels::int4_get(rows.data() + row * row_bytes, at) * static_cast<double>(xb);
        }
        CAPTURE(c);
        CAPTURE(row);
        CAPTURE(token);
        CHECK(d[row][token] == doctest::Approx(want).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("ldmatrix sources cover each warp's chunks, rows g and g + 8, in register order") {
  for (int warp = 0; warp < w4::warps; ++warp) {
    std::set<std::pair<int, int>> covered;
    for (int j = 0; j < w4::chunks_per_warp / 2; ++j) {
      for (int lane = 0; lane < 32; ++lane) {
        const auto src = w4::ldmatrix_row(warp, j, lane);
        covered.insert({src.row, src.chunk});
        // Register m of every lane comes from matrix m = lane / 8 of the pointing lanes: rows
        // g (m even) or g + 8 (m odd) of chunk a (m < 2) or a + 1.
        const int m = lane / 8;
        CHECK(src.row == (m % 2 == 0 ? lane % 8 : lane % 8 + 8));
        CHECK(src.chunk == warp * w4::chunks_per_warp + 2 * j + m / 2);
      }
    }
    CHECK(covered.size() == static_cast<std::size_t>(w4::tile_rows * w4::chunks_per_warp));
  }
}

TEST_CASE("the stage swizzle is a permutation of each row and spreads one chunk's 8 rows over the banks") {
  for (int row = 0; row < w4::tile_rows; ++row) {
    std::set<int> slots;
    for (int c = 0; c < w4::stage_chunks; ++c) slots.insert(w4::swizzled_chunk(row, c));
    CHECK(slots.size() == static_cast<std::size_t>(w4::stage_chunks));
    CHECK(*slots.rbegin() == w4::stage_chunks - 1);
  }
  // ldmatrix reads 8 rows' 16 bytes at once: their byte offsets modulo 128 (32 banks of 4
  // bytes) must differ for every chunk and either half of the rows.
  constexpr int row_bytes = w4::stage_chunks * w4::chunk_bytes;
  for (int c = 0; c < w4::stage_chunks; ++c) {
    for (int half = 0; half < 2; ++half) {
      std::set<int> banks;
      for (int r = 8 * half; r < 8 * half + 8; ++r) banks.insert((r * row_bytes + w4::swizzled_chunk(r, c) * w4::chunk_bytes) % 128);
      CHECK(banks.size() == 8);
    }
  }
  // Scales: rows g = 0..7 at one chunk in distinct banks.
  for (int c = 0; c < w4::stage_chunks; ++c) {
    std::set<int> banks;
    for (int g = 0; g < 8; ++g) banks.insert((g * w4::scale_stride + c) % 32);
    CHECK(banks.size() == 8);
  }
}

TEST_CASE("w4a16: few rows split k so that the blocks cover the GPU") {
  namespace ek = edge::kernels;
  constexpr std::int64_t sms = 132;  // an H100 SXM
  constexpr std::int64_t stage_k = 512;
  const auto blocks = [&](std::int64_t n, std::int64_t k) {
    const std::int64_t tiles = (n + 15) / 16;
    return tiles * ek::matmul_split_count(tiles, sms, 1, n, k, stage_k, ek::matmul_workspace_floats(1, n));
  };
  // Kimi K2's kv_a_proj: 36 blocks alone, 7 parts of 1024 k each.
  CHECK(ek::matmul_split_count(36, sms, 1, 576, 7168, stage_k, ek::matmul_workspace_floats(1, 576)) == 7);
  CHECK(blocks(576, 7168) == 252);
  // GLM-5's kv_a_proj (576 x 6144) and Qwen3-30B-A3B's k_proj (512 x 2048).
  CHECK(blocks(576, 6144) == 36 * 6);
  CHECK(blocks(512, 2048) == 32 * 2);
  // Rows enough to fill the GPU, a large batch, or no workspace: no split.
  CHECK(blocks(4096, 14336) == 256);
  CHECK(ek::matmul_split_count(36, sms, 512, 576, 7168, stage_k, ek::matmul_workspace_floats(512, 576)) == 1);
  CHECK(ek::matmul_split_count(36, sms, 1, 576, 7168, stage_k, 0) == 1);
  // A workspace too small for 7 parts takes as many as it holds.
  CHECK(ek::matmul_split_count(36, sms, 1, 576, 7168, stage_k, 3 * 576) == 3);
}
