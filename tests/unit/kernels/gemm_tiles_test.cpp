// The CUDA tensor-core GEMM's fragment arithmetic (gemm_tiles.h), run on the host: one warp's
// stage (32 weight rows, 32 k, 32 tokens) for each weight format, with ldmatrix emulated over
// the swizzled shared-memory stage and each register placed where PTX's fragment layout for
// mma.m16n8k16 (bf16) puts it, checked against plain dot products.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "edge/kernels/numerics.h"
#include "edge/kernels/weight_format.h"
#include "kernels/matmul/gemm_tiles.h"
#include "kernels/matmul/w4a16_fragments.h"
#include "mma_emulation.h"

namespace {

namespace gt = edge::kernels::gemm_tiles;
namespace w4 = edge::kernels::w4a16;
using edge::kernels::bf16_to_float;
using edge::kernels::float_to_bf16;
using edge::kernels::weight_format;

constexpr int rows = gt::warp_m_tiles * 16;
constexpr int tokens = gt::warp_n_tiles * 8;
constexpr int k = gt::stage_k;

float bf16_round(float v) { return bf16_to_float(float_to_bf16(v)); }

// A warp's stage: weight rows in the format's bytes, as the block's shared memory holds them.
struct stage {
  weight_format f;
  std::vector<std::uint8_t> shared;        // [rows][stage_row_bytes], segments swizzled
  std::vector<float> dense;                // [rows][k] the values the mma should see (unscaled)

  explicit stage(weight_format format, std::uint32_t seed) : f(format) {
    const int row_bytes = gt::stage_row_bytes(f);
    std::mt19937 rng(seed);
    std::vector<std::uint8_t> plain(static_cast<std::size_t>(rows * row_bytes));
    for (auto& b : plain) b = static_cast<std::uint8_t>(rng());
    dense.resize(static_cast<std::size_t>(rows * k));
    for (int r = 0; r < rows; ++r) {
      std::uint8_t* row = plain.data() + r * row_bytes;
      for (int e = 0; e < k; ++e) {
        float v = 0.0f;
        if (f == weight_format::int4) {
          v = static_cast<float>(edge::kernels::int4_get(row, e));
        } else if (f == weight_format::fp8_e4m3) {
          if ((row[e] & 0x7F) == 0x7F) row[e] = 0x3C;  // no NaN codes in this test
          v = edge::kernels::fp8_e4m3_to_float(row[e]);
        } else {
          std::uint16_t bits = 0;
          std::memcpy(&bits, row + 2 * e, 2);
          bits = float_to_bf16(static_cast<float>(static_cast<int>(bits % 2001) - 1000) / 64.0f);
          std::memcpy(row + 2 * e, &bits, 2);
          v = bf16_to_float(bits);
        }
        dense[static_cast<std::size_t>(r * k + e)] = v;
      }
    }
    shared.resize(plain.size());
    for (int r = 0; r < rows; ++r) {
      for (int s = 0; s < gt::stage_segments(f); ++s) {
        std::memcpy(shared.data() + r * row_bytes + gt::swizzled_segment(f, r, s) * gt::segment_bytes,
                    plain.data() + r * row_bytes + s * gt::segment_bytes, gt::segment_bytes);
      }
    }
  }

  // ldmatrix.x4: register m of lane L is bytes 4t..4t+3 of the segment lane 8m + g points at.
  std::array<std::array<std::uint32_t, 4>, 32> ldmatrix(int call) const {
    std::array<std::array<std::uint32_t, 4>, 32> regs{};
    for (int lane = 0; lane < 32; ++lane) {
      for (int m = 0; m < 4; ++m) {
        const gt::ldmatrix_source src = gt::ldmatrix_row(f, call, 8 * m + lane / 4);
        const std::uint8_t* segment = shared.data() + src.row * gt::stage_row_bytes(f) +
                                      gt::swizzled_segment(f, src.row, src.segment) * gt::segment_bytes;
        std::memcpy(&regs[static_cast<std::size_t>(lane)][static_cast<std::size_t>(m)], segment + 4 * (lane % 4), 4);
      }
    }
    return regs;
  }
};

// The two values an A register holds, as the kernel converts its source word.
std::array<float, 2> a_values(weight_format f, std::uint32_t word, int part) {
  if (f == weight_format::int4) {
    const std::uint32_t bits = w4::pair_bits(word, part);
    const float offset = bf16_to_float(static_cast<std::uint16_t>(w4::pair_offset_bits & 0xFFFFu));
    return {bf16_to_float(static_cast<std::uint16_t>(bits & 0xFFFFu)) - offset,
            bf16_to_float(static_cast<std::uint16_t>(bits >> 16)) - offset};
  }
  if (f == weight_format::fp8_e4m3) {
    const auto code = [&](int i) { return static_cast<std::uint8_t>(word >> (8 * i)); };
    return {edge::kernels::fp8_e4m3_to_float(code(2 * part)), edge::kernels::fp8_e4m3_to_float(code(2 * part + 1))};
  }
  return {bf16_to_float(static_cast<std::uint16_t>(word & 0xFFFFu)), bf16_to_float(static_cast<std::uint16_t>(word >> 16))};
}

}  // namespace

TEST_CASE("a warp's GEMM stage gives the dot products of its rows and tokens, in every format") {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> spread(-2.0f, 2.0f);
  std::vector<float> x(static_cast<std::size_t>(tokens * k));  // [tokens][k] of this stage
  for (float& v : x) v = spread(rng);
  for (const weight_format f : {weight_format::bf16, weight_format::fp8_e4m3, weight_format::int4}) {
    CAPTURE(edge::kernels::to_string(f));
    const stage st(f, 17);
    std::vector<std::array<std::array<std::uint32_t, 4>, 32>> calls;
    for (int c = 0; c < gt::ldmatrix_calls(f); ++c) calls.push_back(st.ldmatrix(c));
    std::vector<double> d(static_cast<std::size_t>(rows * tokens), 0.0);
    for (int mt = 0; mt < gt::warp_m_tiles; ++mt) {
      for (int nt = 0; nt < gt::warp_n_tiles; ++nt) {
        for (int step = 0; step < 2; ++step) {
          edge::testing::mma_step mma;
          for (int lane = 0; lane < 32; ++lane) {
            const int g = lane / 4;
            const int t = lane % 4;
            for (int reg = 0; reg < 4; ++reg) {
              const gt::a_source src = gt::a_register(f, mt, step, reg);
              const auto v = a_values(f, calls[static_cast<std::size_t>(src.call)][static_cast<std::size_t>(lane)]
                                             [static_cast<std::size_t>(src.reg)],
                                      src.part);
              mma.set_a(lane, reg, v[0], v[1]);
            }
            for (int half = 0; half < 2; ++half) {
              const gt::x_pair p = gt::b_pair(f, t, step, half);
              const float* xr = x.data() + (nt * 8 + g) * k;
              mma.set_b(lane, half, bf16_round(xr[p.first]), bf16_round(xr[p.second]));
            }
          }
          for (int lane = 0; lane < 32; ++lane) {
            for (int c = 0; c < 4; ++c) {
              const int row = mt * 16 + edge::testing::mma_step::c_row(lane, c);
              const int tok = nt * 8 + edge::testing::mma_step::c_col(lane, c);
              d[static_cast<std::size_t>(row * tokens + tok)] += mma.product(lane, c);
            }
          }
        }
      }
    }
    for (int r = 0; r < rows; ++r) {
      for (int tok = 0; tok < tokens; ++tok) {
        double want = 0.0;
        for (int e = 0; e < k; ++e) {
          want += static_cast<double>(st.dense[static_cast<std::size_t>(r * k + e)]) *
                  bf16_round(x[static_cast<std::size_t>(tok * k + e)]);
        }
        CAPTURE(r);
        CAPTURE(tok);
        CHECK(d[static_cast<std::size_t>(r * tokens + tok)] == doctest::Approx(want).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("every ldmatrix of a GEMM stage reads 8 rows from 8 distinct bank groups") {
  for (const weight_format f : {weight_format::bf16, weight_format::fp8_e4m3, weight_format::int4}) {
    CAPTURE(edge::kernels::to_string(f));
    const int row_bytes = gt::stage_row_bytes(f);
    std::set<std::pair<int, int>> covered;
    for (int call = 0; call < gt::ldmatrix_calls(f); ++call) {
      for (int m = 0; m < 4; ++m) {
        std::set<int> groups;
        for (int lane = 8 * m; lane < 8 * m + 8; ++lane) {
          const gt::ldmatrix_source src = gt::ldmatrix_row(f, call, lane);
          covered.insert({src.row, src.segment});
          groups.insert((src.row * row_bytes + gt::swizzled_segment(f, src.row, src.segment) * gt::segment_bytes) % 128);
        }
        CHECK(groups.size() == 8);
      }
    }
    // Together the calls read every segment of the warp's rows once.
    CHECK(covered.size() == static_cast<std::size_t>(rows * gt::stage_segments(f)));
  }
}

TEST_CASE("the swizzle keeps a row's segments and the x rows spread the float4 reads") {
  for (const weight_format f : {weight_format::bf16, weight_format::fp8_e4m3, weight_format::int4}) {
    for (int r = 0; r < gt::block_rows; ++r) {
      std::set<int> slots;
      for (int s = 0; s < gt::stage_segments(f); ++s) slots.insert(gt::swizzled_segment(f, r, s));
      CHECK(slots.size() == static_cast<std::size_t>(gt::stage_segments(f)));
      CHECK(*slots.rbegin() < gt::stage_segments(f));
    }
  }
  // A quarter warp's float4 reads of x (lanes g = 2q, 2q + 1 and t = 0..3) in 8 distinct
  // 16-byte bank groups, for both steps.
  for (int step = 0; step < 2; ++step) {
    for (int q = 0; q < 4; ++q) {
      std::set<int> groups;
      for (int g = 2 * q; g < 2 * q + 2; ++g) {
        for (int t = 0; t < 4; ++t) {
          const int element = gt::b_pair(weight_format::fp8_e4m3, t, step, 0).first;
          groups.insert((g * gt::x_row_floats + element) * 4 % 128 / 16);
        }
      }
      CHECK(groups.size() == 8);
    }
  }
}

TEST_CASE("the kernel's vector reads of x are b_pair's elements") {
  for (const weight_format f : {weight_format::bf16, weight_format::fp8_e4m3, weight_format::int4}) {
    for (int t = 0; t < 4; ++t) {
      for (int step = 0; step < 2; ++step) {
        const gt::b_loads l = gt::b_load(f, t, step);
        for (int half = 0; half < 2; ++half) {
          const gt::x_pair p = gt::b_pair(f, t, step, half);
          int first = 0;
          int second = 0;
          if (l.float4_load) {
            // float4 elements: interleaved halves are (0, 2) and (1, 3); adjacent (0, 1), (2, 3).
            first = l.first + (l.interleaved ? half : 2 * half);
            second = first + (l.interleaved ? 2 : 1);
            CHECK(l.first % 4 == 0);  // a 16-byte aligned read
          } else {
            first = half == 0 ? l.first : l.second;
            second = first + 1;
            CHECK(first % 2 == 0);
          }
          CHECK(first == p.first);
          CHECK(second == p.second);
        }
      }
    }
  }
}
