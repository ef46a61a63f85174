// The pipelined tensor-core GEMM tile (bf16, fp8, int4 weights; k a multiple of 32): one block
// computes gemm_tiles::block_rows weight rows x block_tokens token rows of y = x · wᵀ. The
// matmul's GEMM (matmul.cu) runs one per grid cell; the grouped expert matmul (moe_experts.cu)
// runs one per (expert, 64 of its rows) cell of a work list built on the device. Device code only.
//
// 8 warps of 32 rows x 32 tokens; k in stages of 32 through a 4-stage cp.async pipeline of the
// stage's raw weight bytes (swizzled), its x rows (f32) and, for int4, its scales. Each warp
// takes its A registers with ldmatrix and converts them in registers (bf16 as is, fp8 codes
// exactly, int4 as q), rounds its x pairs to bf16, and runs mma.m16n8k16; int4's group scale
// multiplies each stage's f32 product. The finished dot products go to the caller's `emit`
// (fp8's row scale, a bias, a residual or a split's part are the caller's). Where each byte
// goes: gemm_tiles.h (its host test emulates a warp's stage).
#pragma once

#include <cstdint>

#include "edge/kernels/weight_format.h"
#include "kernels/cuda/common.cuh"
#include "kernels/matmul/gemm_tiles.h"
#include "kernels/matmul/w4a16_fragments.h"

namespace edge::kernels::cuda {

namespace gt = gemm_tiles;

// Pair p of a lane's INT4 word as bf16 q values (exact: small integers).
__device__ __forceinline__ std::uint32_t dequantized_pair(std::uint32_t word, int p) {
  return bf16x2_bits(__hsub2(bf16x2_of(w4a16::pair_bits(word, p)), bf16x2_of(w4a16::pair_offset_bits)));
}

template <weight_format F>
struct gemm_stage_bytes {
  static constexpr int weights = gt::block_rows * gt::stage_row_bytes(F);
  static constexpr int x = gt::block_tokens * gt::x_row_floats * static_cast<int>(sizeof(float));
  static constexpr int scales = F == weight_format::int4 ? gt::block_rows * static_cast<int>(sizeof(float)) : 0;
  static constexpr int stage = weights + x + scales;
  static constexpr int total = stage * gt::stages;
  static_assert(stage % 16 == 0, "every stage starts 16-byte aligned");
};

// The two weights of an A register from its ldmatrix word, as bf16 bits.
template <weight_format F>
__device__ __forceinline__ std::uint32_t a_register_bits(std::uint32_t word, int part) {
  if constexpr (F == weight_format::int4) {
    return dequantized_pair(word, part);
  } else if constexpr (F == weight_format::fp8_e4m3) {
    const float2 v = fp8x2_to_float2(static_cast<std::uint16_t>(word >> (16 * part)));  // exact in bf16
    return bf16x2_bits(__floats2bfloat162_rn(v.x, v.y));
  } else {
    return word;
  }
}

// What a tile reads: x [tokens, k] (16-byte aligned rows, x_stride a multiple of 4) and the
// weights w [n, row_bytes] (16-byte aligned rows), with int4's scales [n, groups_per_row].
struct mma_operands {
  const float* x;
  const std::uint8_t* w;
  const float* scales;
  std::int64_t tokens, n, x_stride, row_bytes, group_size, groups_per_row;
};

// Token rows t0.. and weight rows n0.. of o over k in [k_begin, k_end) (whole stages), on
// gemm_stage_bytes<F>::total bytes of dynamic shared memory; emit(token, row, dot) for each
// output inside [0, tokens) x [0, n). Every thread of the block must call it.
template <weight_format F, class Emit>
__device__ __forceinline__ void gemm_mma_tile(const mma_operands& a, std::int64_t t0, std::int64_t n0,
                                              std::int64_t k_begin, std::int64_t k_end, unsigned char* shared,
                                              Emit&& emit) {
  using sizes = gemm_stage_bytes<F>;
  constexpr int row_bytes = gt::stage_row_bytes(F);  // of a stage (32 k)
  constexpr int segments = gt::stage_segments(F);
  constexpr int calls = gt::ldmatrix_calls(F);
  constexpr bool int4 = F == weight_format::int4;
  const std::int64_t stage_count = k_end > k_begin ? (k_end - k_begin) / gt::stage_k : 0;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / warp_size;
  const int lane = tid % warp_size;
  const int g = lane / 4;
  const int t = lane % 4;
  const int warp_row0 = (warp % gt::warps_m) * gt::warp_m_tiles * 16;  // within the block
  const int warp_token0 = (warp / gt::warps_m) * gt::warp_n_tiles * 8;
  const auto stage_at = [&](std::int64_t s) { return shared + (s % gt::stages) * sizes::stage; };

  // Queues stage s: rows past n repeat the last row, tokens past the batch read as zeros (both
  // dropped at the end).
  const auto load_stage = [&](std::int64_t s) {
    unsigned char* base = stage_at(s);
    const std::int64_t kb = k_begin + s * gt::stage_k;
    for (int i = tid; i < gt::block_rows * segments; i += gt::threads) {
      const int r = i / segments;
      const int seg = i % segments;
      const std::int64_t row = min(n0 + r, a.n - 1);
      copy_async_16(base + r * row_bytes + gt::swizzled_segment(F, r, seg) * gt::segment_bytes,
                    a.w + row * a.row_bytes + kb / gt::stage_k * row_bytes + seg * gt::segment_bytes, true);
    }
    auto* xs = reinterpret_cast<float*>(base + sizes::weights);
    constexpr int quads = gt::stage_k / 4;
    for (int i = tid; i < gt::block_tokens * quads; i += gt::threads) {
      const int r = i / quads;
      const int q = i % quads;
      const std::int64_t token = t0 + r;
      const bool inside = token < a.tokens;
      copy_async_16(xs + r * gt::x_row_floats + 4 * q, a.x + (inside ? token : 0) * a.x_stride + kb + 4 * q, inside);
    }
    if constexpr (int4) {
      auto* scales = reinterpret_cast<float*>(base + sizes::weights + sizes::x);
      for (int r = tid; r < gt::block_rows; r += gt::threads) {
        const std::int64_t row = min(n0 + r, a.n - 1);
        copy_async_4(scales + r, a.scales + row * a.groups_per_row + kb / a.group_size, true);
      }
    }
  };

#pragma unroll
  for (int s = 0; s < gt::stages - 1; ++s) {
    if (s < stage_count) load_stage(s);
    copy_async_commit();
  }
  float acc[gt::warp_m_tiles][gt::warp_n_tiles][4] = {};
  for (std::int64_t s = 0; s < stage_count; ++s) {
    copy_async_wait<gt::stages - 2>();
    __syncthreads();
    if (s + gt::stages - 1 < stage_count) load_stage(s + gt::stages - 1);
    copy_async_commit();
    const unsigned char* base = stage_at(s);
    const auto* xs = reinterpret_cast<const float*>(base + sizes::weights);

    std::uint32_t words[calls][4];
#pragma unroll
    for (int c = 0; c < calls; ++c) {
      const gt::ldmatrix_source src = gt::ldmatrix_row(F, c, lane);
      const int row = warp_row0 + src.row;
      ldmatrix_x4(words[c], base + row * row_bytes + gt::swizzled_segment(F, row, src.segment) * gt::segment_bytes);
    }
    // int4: each stage's product apart, then scaled by its group's scale (rows g and g + 8).
    float part[int4 ? gt::warp_m_tiles : 1][int4 ? gt::warp_n_tiles : 1][4] = {};
#pragma unroll
    for (int step = 0; step < 2; ++step) {
      std::uint32_t af[gt::warp_m_tiles][4];
#pragma unroll
      for (int mt = 0; mt < gt::warp_m_tiles; ++mt) {
#pragma unroll
        for (int reg = 0; reg < 4; ++reg) {
          const gt::a_source src = gt::a_register(F, mt, step, reg);
          af[mt][reg] = a_register_bits<F>(words[src.call][src.reg], src.part);
        }
      }
      const gt::b_loads loads = gt::b_load(F, t, step);
#pragma unroll
      for (int nt = 0; nt < gt::warp_n_tiles; ++nt) {
        const float* xr = xs + (warp_token0 + nt * 8 + g) * gt::x_row_floats;
        std::uint32_t b[2];
        if (loads.float4_load) {
          const float4 v = *reinterpret_cast<const float4*>(xr + loads.first);
          b[0] = bf16x2_bits(loads.interleaved ? __floats2bfloat162_rn(v.x, v.z) : __floats2bfloat162_rn(v.x, v.y));
          b[1] = bf16x2_bits(loads.interleaved ? __floats2bfloat162_rn(v.y, v.w) : __floats2bfloat162_rn(v.z, v.w));
        } else {
          const float2 lo = *reinterpret_cast<const float2*>(xr + loads.first);
          const float2 hi = *reinterpret_cast<const float2*>(xr + loads.second);
          b[0] = bf16x2_bits(__floats2bfloat162_rn(lo.x, lo.y));
          b[1] = bf16x2_bits(__floats2bfloat162_rn(hi.x, hi.y));
        }
#pragma unroll
        for (int mt = 0; mt < gt::warp_m_tiles; ++mt) {
          if constexpr (int4) {
            mma_bf16(part[mt][nt], af[mt], b);
          } else {
            mma_bf16(acc[mt][nt], af[mt], b);
          }
        }
      }
    }
    if constexpr (int4) {
      const auto* scales = reinterpret_cast<const float*>(base + sizes::weights + sizes::x);
#pragma unroll
      for (int mt = 0; mt < gt::warp_m_tiles; ++mt) {
        const float scale_g = scales[warp_row0 + mt * 16 + g];
        const float scale_g8 = scales[warp_row0 + mt * 16 + g + 8];
#pragma unroll
        for (int nt = 0; nt < gt::warp_n_tiles; ++nt) {
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[mt][nt][i] = fmaf(i < 2 ? scale_g : scale_g8, part[mt][nt][i], acc[mt][nt][i]);
        }
      }
    }
  }
  copy_async_wait<0>();

  // c0, c1: row g, tokens 2t and 2t + 1 of the tile; c2, c3: row g + 8.
#pragma unroll
  for (int mt = 0; mt < gt::warp_m_tiles; ++mt) {
#pragma unroll
    for (int nt = 0; nt < gt::warp_n_tiles; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const std::int64_t row = n0 + warp_row0 + mt * 16 + g + 8 * (i / 2);
        const std::int64_t token = t0 + warp_token0 + nt * 8 + 2 * t + i % 2;
        if (token < a.tokens && row < a.n) emit(token, row, acc[mt][nt][i]);
      }
    }
  }
}

}  // namespace edge::kernels::cuda
