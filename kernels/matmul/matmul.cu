// CUDA matmul: y = x · wᵀ (+ bias) (+ y) for every weight format, dequantizing in registers.
//
// Five kernels, chosen by the number of tokens, the weight format and the shape (which ones
// round x to bf16: cuda_matmul_uses_tensor_cores in matmul.h):
//   * W4A16 decode (1..8 tokens, INT4 groups of 32 or more): tensor cores fed from a cp.async
//     pipeline, the weights dequantized two at a time in registers (below, and
//     w4a16_fragments.h), so that the instructions per weight stay below what the memory
//     bandwidth allows at every token count up to 8.
//   * GEMV (1..8 tokens, the other formats; weight_chunks.cuh, which the grouped expert matmul
//     shares): memory-bound. A block of 4 warps takes 4 weight rows; each
//     thread streams 16-byte chunks of those rows (ld.global.nc, not kept in L1, so x stays
//     there), two chunks per row in flight, dequantizes them in registers and multiplies them
//     with every token's x in f32. INT4 nibbles become floats with one byte permute and one
//     subtract (2^23 + nibble is a float whose low bits are the nibble); the group scale
//     multiplies a chunk's partial sum once (group_size >= 32) or each weight (smaller groups).
//     FP8 codes are converted by the hardware (cvt e4m3x2 -> f16x2), the row scale applied
//     once per output.
//   * Pipelined tensor-core GEMM (9+ tokens, bf16 / fp8 / int4 weights, k a multiple of 32,
//     16-byte aligned rows, int4 groups of 32 or more: prefill and batched decode in the
//     executor): 128 rows x 64 tokens per block through a 4-stage cp.async pipeline, mma.sync
//     on registers converted from ldmatrix (gemm_mma.cuh, which the grouped expert matmul
//     shares, and gemm_tiles.h).
//   * wmma GEMM (9+ tokens, bf16 / fp8 / int4 weights of any other shape):
//     64 tokens x 64 rows per block, k in steps of 64; x is rounded to bf16 and weights are
//     dequantized to bf16 (fp8 codes exactly, their row scale applied to the f32 result; int4
//     as q x scale) into shared memory, multiplied with wmma (bf16 in, f32 accumulate).
//   * SIMT GEMM (9+ tokens, f32 / f16 weights): f32 multiply-adds, so the reference formats
//     keep f32 products.
// When the output tiles alone leave multiprocessors idle (few rows, a small batch), k is split
// across blocks into matmul_params::workspace and a second kernel adds the parts in a fixed
// order, so results stay deterministic. Summation orders differ from the CPU reference's
// 16-lane order; tests/gpu/kernels_gpu_test.cpp states the tolerances.
#include <mma.h>

#include "edge/common/format.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/matmul/gemm_mma.cuh"
#include "kernels/matmul/gemm_tiles.h"
#include "kernels/matmul/w4a16_fragments.h"
#include "kernels/matmul/weight_chunks.cuh"

namespace edge::kernels::cuda {
namespace {

// ---- arguments --------------------------------------------------------------------------------

struct matmul_args {
  const float* x;          // [tokens, k], row stride x_stride
  const void* w;           // plain/fp8: [n, k] elements; int4: [n, row_bytes] packed
  const float* scales;     // fp8: [n]; int4: [n, groups_per_row]; else null
  const float* bias;       // [n] or null
  float* y;                // [tokens, n], row stride y_stride
  float* workspace;        // split-K parts: [splits, tokens, n]
  std::int64_t tokens, n, k, x_stride, y_stride;
  std::int64_t row_bytes;       // bytes of one weight row
  std::int64_t group_size;      // int4 only
  std::int64_t groups_per_row;  // int4 only
  std::int64_t k_per_split;     // multiple of the kernel's k step
  bool accumulate;
  bool w_vec;  // weight rows are 16-byte aligned: whole chunks load as one vector
  bool x_vec;  // x rows are 16-byte aligned: 4 floats load as one vector
};

// y[t, row] from a finished dot product: the fp8 row scale, the bias, the residual.
template <weight_format F>
__device__ __forceinline__ void store_output(const matmul_args& a, std::int64_t t, std::int64_t row, float dot) {
  float value = dot;
  if constexpr (F == weight_format::fp8_e4m3) value *= a.scales[row];
  if (a.bias != nullptr) value += a.bias[row];
  float& out = a.y[t * a.y_stride + row];
  out = a.accumulate ? out + value : value;
}

// ---- GEMV -------------------------------------------------------------------------------------

template <weight_format F, int T_MAX, bool FINE_GROUPS>
__global__ void __launch_bounds__(gemv_threads) gemv_kernel(matmul_args a) {
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * gemv_rows;
  const gemv_operands o{.x = a.x, .w = static_cast<const std::uint8_t*>(a.w), .scales = a.scales, .tokens = a.tokens,
                        .n = a.n, .k = a.k, .x_stride = a.x_stride, .row_bytes = a.row_bytes,
                        .group_size = a.group_size, .groups_per_row = a.groups_per_row, .w_vec = a.w_vec,
                        .x_vec = a.x_vec};
  float acc[T_MAX][gemv_rows];
  gemv_accumulate<F, T_MAX, FINE_GROUPS>(o, row0, acc);
  __shared__ float partial[gemv_warps][T_MAX][gemv_rows];
  gemv_reduce(acc, partial);
  for (int i = static_cast<int>(threadIdx.x); i < T_MAX * gemv_rows; i += gemv_threads) {
    const int t = i / gemv_rows;
    const int r = i % gemv_rows;
    const std::int64_t row = row0 + r;
    if (t >= a.tokens || row >= a.n) continue;
    store_output<F>(a, t, row, gemv_dot(partial, t, r));
  }
}

// ---- split-K reduction ------------------------------------------------------------------------

template <weight_format F>
__global__ void split_reduce_kernel(matmul_args a, int splits) {
  const std::int64_t total = a.tokens * a.n;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float dot = 0.0f;
    for (int z = 0; z < splits; ++z) dot += a.workspace[z * total + i];
    store_output<F>(a, i / a.n, i % a.n, dot);
  }
}

// Either the final output, or this split's part for split_reduce_kernel.
template <weight_format F>
__device__ __forceinline__ void emit(const matmul_args& a, std::int64_t t, std::int64_t row, float dot) {
  if (gridDim.z == 1) {
    store_output<F>(a, t, row, dot);
  } else {
    a.workspace[(static_cast<std::int64_t>(blockIdx.z) * a.tokens + t) * a.n + row] = dot;
  }
}

// ---- W4A16 decode on tensor cores (INT4 groups of 32 or more, 1..8 tokens) ---------------------
//
// A block of 4 warps takes 16 weight rows and walks k in stages of 16 chunks (512 k): cp.async
// copies each stage's raw INT4 chunks and their scales into shared memory, 4 stages in flight;
// each warp takes 4 chunks of a stage, ldmatrix hands every lane its word of rows g and g + 8,
// one mask-and-OR and one bf16x2 subtraction dequantize two weights at a time, and each chunk
// is two mma.m16n8k16 steps against the tokens' x rounded to bf16 (w4a16_fragments.h says which
// element goes where; its host test emulates it). The chunk's product is scaled in f32 by its
// group's scale, so q stays exact and only x is rounded. The warps' parts meet in shared memory.
// Few rows (Kimi K2's 576-row kv_a_proj is 36 blocks for 132 SMs) split k across blockIdx.z in
// whole stages (matmul_split_count), their parts added by split_reduce_kernel.

namespace w4 = w4a16;


struct w4a16_stage {
  uint4 weights[w4::tile_rows][w4::stage_chunks];  // chunk c of row r in slot [r][swizzled_chunk(r, c)]
  float scales[w4::tile_rows][w4::scale_stride];   // [r][c]: the scale of chunk c's group
};

__global__ void __launch_bounds__(w4::threads) w4a16_decode_kernel(matmul_args a) {
  __shared__ __align__(128) w4a16_stage stage[w4::stages];
  __shared__ float partial[w4::warps][w4::tile_rows][w4::tile_tokens];
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * w4::tile_rows;
  // This split's chunks (k / 32 in all: groups of 32+ divide k); k_per_split is whole stages.
  const std::int64_t chunk_begin = static_cast<std::int64_t>(blockIdx.z) * (a.k_per_split / w4::chunk_k);
  const std::int64_t chunks = min(a.row_bytes / w4::chunk_bytes, chunk_begin + a.k_per_split / w4::chunk_k);
  const std::int64_t stage_count = ceil_div(chunks - chunk_begin, w4::stage_chunks);
  const auto* weights = static_cast<const std::uint8_t*>(a.w);
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / warp_size;
  const int lane = tid % warp_size;
  const int g = lane / 4;  // the lane's rows g and g + 8, and its token
  const int t = lane % 4;

  // Queues stage s into its buffer: chunks past the row read as zeros (their scale too), rows
  // past n repeat the last row (their results are dropped).
  const auto load_stage = [&](std::int64_t s) {
    w4a16_stage& st = stage[s % w4::stages];
    for (int i = tid; i < w4::tile_rows * w4::stage_chunks; i += w4::threads) {
      const int r = i / w4::stage_chunks;
      const int c = i % w4::stage_chunks;
      const std::int64_t row = min(row0 + r, a.n - 1);
      const std::int64_t chunk = chunk_begin + s * w4::stage_chunks + c;
      const bool inside = chunk < chunks;
      const std::int64_t at = inside ? chunk : 0;
      copy_async_16(&st.weights[r][w4::swizzled_chunk(r, c)], weights + row * a.row_bytes + at * w4::chunk_bytes, inside);
      copy_async_4(&st.scales[r][c], a.scales + row * a.groups_per_row + at * w4::chunk_k / a.group_size, inside);
    }
  };

  // One commit per stage slot, empty or not, so that wait_group counts stages.
#pragma unroll
  for (int s = 0; s < w4::stages - 1; ++s) {
    if (s < stage_count) load_stage(s);
    copy_async_commit();
  }
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // (row g, tokens 2t, 2t+1), (row g + 8, tokens 2t, 2t+1)
  for (std::int64_t s = 0; s < stage_count; ++s) {
    copy_async_wait<w4::stages - 2>();  // this thread's copies of stage s have landed
    __syncthreads();                    // everyone's have, and nobody still reads stage s - 1's buffer
    if (s + w4::stages - 1 < stage_count) load_stage(s + w4::stages - 1);
    copy_async_commit();
    const w4a16_stage& st = stage[s % w4::stages];
#pragma unroll
    for (int j = 0; j < w4::chunks_per_warp / 2; ++j) {
      const int pair_chunk = warp * w4::chunks_per_warp + 2 * j;  // within the stage
      const std::int64_t first = chunk_begin + s * w4::stage_chunks + pair_chunk;
      if (first >= chunks) break;  // the same for the whole warp
      const w4::ldmatrix_source src = w4::ldmatrix_row(warp, j, lane);
      std::uint32_t words[4];
      ldmatrix_x4(words, &st.weights[src.row][w4::swizzled_chunk(src.row, src.chunk)]);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const std::int64_t chunk = first + h;
        if (chunk >= chunks) break;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int step = 0; step < 2; ++step) {
          std::uint32_t b[2] = {0u, 0u};
          if (g < a.tokens) {
            const float4 xv = load_x4(a.x + g * a.x_stride, chunk * w4::chunk_k + w4::step_x_element(t, step), a.k, a.x_vec);
            b[0] = bf16x2_bits(__floats2bfloat162_rn(xv.x, xv.z));
            b[1] = bf16x2_bits(__floats2bfloat162_rn(xv.y, xv.w));
          }
          const std::uint32_t af[4] = {dequantized_pair(words[2 * h], w4::step_pair(step, 0)),
                                       dequantized_pair(words[2 * h + 1], w4::step_pair(step, 0)),
                                       dequantized_pair(words[2 * h], w4::step_pair(step, 1)),
                                       dequantized_pair(words[2 * h + 1], w4::step_pair(step, 1))};
          mma_bf16(d, af, b);
        }
        const float scale_g = st.scales[g][pair_chunk + h];
        const float scale_g8 = st.scales[g + 8][pair_chunk + h];
        acc[0] = fmaf(scale_g, d[0], acc[0]);
        acc[1] = fmaf(scale_g, d[1], acc[1]);
        acc[2] = fmaf(scale_g8, d[2], acc[2]);
        acc[3] = fmaf(scale_g8, d[3], acc[3]);
      }
    }
  }
  copy_async_wait<0>();

  partial[warp][g][2 * t] = acc[0];
  partial[warp][g][2 * t + 1] = acc[1];
  partial[warp][g + 8][2 * t] = acc[2];
  partial[warp][g + 8][2 * t + 1] = acc[3];
  __syncthreads();
  static_assert(w4::threads == w4::tile_rows * w4::tile_tokens, "one output per thread");
  const int r = tid / w4::tile_tokens;
  const int token = tid % w4::tile_tokens;
  const std::int64_t row = row0 + r;
  if (row < a.n && token < a.tokens) {
    float dot = 0.0f;
#pragma unroll
    for (int w = 0; w < w4::warps; ++w) dot += partial[w][r][token];
    emit<weight_format::int4>(a, token, row, dot);
  }
}

// ---- tensor-core GEMM (bf16, fp8, int4 weights) -----------------------------------------------

constexpr int tc_bm = 64;   // tokens per block
constexpr int tc_bn = 64;   // weight rows per block
constexpr int tc_bk = 64;   // k per step
constexpr int tc_pad = 8;   // bf16 elements of padding per shared row (keeps wmma rows 32-byte aligned)
constexpr int tc_threads = 128;
constexpr int tc_ld = tc_bk + tc_pad;
constexpr int tc_out_ld = tc_bn + 4;
constexpr int wmma_m = 16;
constexpr int wmma_n = 16;
constexpr int wmma_k = 16;
constexpr int tc_warp_tile = 32;  // each of the 4 warps computes 32 tokens x 32 rows
constexpr int tc_frags = tc_warp_tile / wmma_m;
constexpr std::size_t tc_tile_bytes = 2 * tc_bm * tc_ld * sizeof(__nv_bfloat16);
constexpr std::size_t tc_out_bytes = tc_bm * tc_out_ld * sizeof(float);
constexpr std::size_t tc_shared_bytes = tc_tile_bytes > tc_out_bytes ? tc_tile_bytes : tc_out_bytes;
static_assert(tc_bm == tc_bn, "the shared tiles are carved as two equal halves");

// Dequantizes the [tc_bn, tc_bk] weight tile starting at (n0, kb) into `ws` as bf16. Elements
// at or past k_end (the end of this block's split of k) read as zero: neither a scale past the
// row nor a weight of the next split (a NaN code there must not reach this split's sum) is read.
template <weight_format F>
__device__ __forceinline__ void load_weight_tile(const matmul_args& a, std::int64_t n0, std::int64_t kb,
                                                 std::int64_t k_end, __nv_bfloat16 (*ws)[tc_ld]) {
  constexpr int elements = chunk_elements<F>();
  constexpr int chunks_per_row = tc_bk / elements;
  constexpr int chunks = tc_bn * chunks_per_row;
  const std::int64_t valid_bytes = F == weight_format::int4 ? a.row_bytes : a.k * element_bytes<F>();
  const auto* weights = static_cast<const std::uint8_t*>(a.w);
  for (int i = static_cast<int>(threadIdx.x); i < chunks; i += tc_threads) {
    const int r = i / chunks_per_row;
    const int part = i % chunks_per_row;
    const std::int64_t row = n0 + r;
    const std::int64_t c = kb / elements + part;
    const bool inside = row < a.n && c * elements < k_end;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (inside) raw = load_chunk(weights + row * a.row_bytes, c, valid_bytes, a.w_vec);
    float chunk_scale = 1.0f;
    if constexpr (F == weight_format::int4) {
      if (a.group_size >= elements) chunk_scale = inside ? a.scales[row * a.groups_per_row + c * elements / a.group_size] : 0.0f;
    }
#pragma unroll
    for (int q = 0; q < chunk_quads<F>(); ++q) {
      float w[4];
      quad_weights<F>(raw, q, w);
      const int first = quad_first_element<F>(q);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float value = w[e];
        if constexpr (F == weight_format::int4) {
          const std::int64_t k_index = c * elements + first + e;
          if (a.group_size >= elements) {
            value *= chunk_scale;
          } else {
            value *= row < a.n && k_index < k_end ? a.scales[row * a.groups_per_row + k_index / a.group_size] : 0.0f;
          }
        }
        ws[r][part * elements + first + e] = __float2bfloat16_rn(value);
      }
    }
  }
}

template <weight_format F>
__global__ void __launch_bounds__(tc_threads) gemm_tc_kernel(matmul_args a) {
  using namespace nvcuda;
  __shared__ __align__(128) unsigned char shared[tc_shared_bytes];
  auto* xs = reinterpret_cast<__nv_bfloat16(*)[tc_ld]>(shared);                          // [tc_bm][tc_ld]
  auto* ws = reinterpret_cast<__nv_bfloat16(*)[tc_ld]>(shared + tc_tile_bytes / 2);      // [tc_bn][tc_ld]
  auto* out = reinterpret_cast<float(*)[tc_out_ld]>(shared);                             // [tc_bm][tc_out_ld]

  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x) * tc_bm;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.y) * tc_bn;
  const std::int64_t k_begin = static_cast<std::int64_t>(blockIdx.z) * a.k_per_split;
  const std::int64_t k_end = min(a.k, k_begin + a.k_per_split);
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int warp_t = (warp / 2) * tc_warp_tile;
  const int warp_n = (warp % 2) * tc_warp_tile;

  wmma::fragment<wmma::accumulator, wmma_m, wmma_n, wmma_k, float> acc[tc_frags][tc_frags];
#pragma unroll
  for (int i = 0; i < tc_frags; ++i) {
#pragma unroll
    for (int j = 0; j < tc_frags; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }

  for (std::int64_t kb = k_begin; kb < k_end; kb += tc_bk) {
    // x tile [tc_bm, tc_bk], rounded to bf16; k past this split's end reads as zero.
    constexpr int x_quads = tc_bm * tc_bk / 4;
    for (int i = static_cast<int>(threadIdx.x); i < x_quads; i += tc_threads) {
      const int r = i / (tc_bk / 4);
      const int col = (i % (tc_bk / 4)) * 4;
      const std::int64_t t = t0 + r;
      const float4 v = t < a.tokens ? load_x4(a.x + t * a.x_stride, kb + col, k_end, a.x_vec) : make_float4(0, 0, 0, 0);
      xs[r][col] = __float2bfloat16_rn(v.x);
      xs[r][col + 1] = __float2bfloat16_rn(v.y);
      xs[r][col + 2] = __float2bfloat16_rn(v.z);
      xs[r][col + 3] = __float2bfloat16_rn(v.w);
    }
    load_weight_tile<F>(a, n0, kb, k_end, ws);
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < tc_bk; kk += wmma_k) {
      wmma::fragment<wmma::matrix_a, wmma_m, wmma_n, wmma_k, __nv_bfloat16, wmma::row_major> fa[tc_frags];
      wmma::fragment<wmma::matrix_b, wmma_m, wmma_n, wmma_k, __nv_bfloat16, wmma::col_major> fb[tc_frags];
#pragma unroll
      for (int i = 0; i < tc_frags; ++i) wmma::load_matrix_sync(fa[i], &xs[warp_t + i * wmma_m][kk], tc_ld);
      // B[k][n] = w[n][k]: the weight tile read column-major.
#pragma unroll
      for (int j = 0; j < tc_frags; ++j) wmma::load_matrix_sync(fb[j], &ws[warp_n + j * wmma_n][kk], tc_ld);
#pragma unroll
      for (int i = 0; i < tc_frags; ++i) {
#pragma unroll
        for (int j = 0; j < tc_frags; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < tc_frags; ++i) {
#pragma unroll
    for (int j = 0; j < tc_frags; ++j) {
      wmma::store_matrix_sync(&out[warp_t + i * wmma_m][warp_n + j * wmma_n], acc[i][j], tc_out_ld, wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < tc_bm * tc_bn; i += tc_threads) {
    const std::int64_t t = t0 + i / tc_bn;
    const std::int64_t row = n0 + i % tc_bn;
    if (t < a.tokens && row < a.n) emit<F>(a, t, row, out[i / tc_bn][i % tc_bn]);
  }
}

// ---- pipelined tensor-core GEMM (bf16, fp8, int4 weights; k a multiple of 32) -----------------
//
// gemm_mma.cuh's tile (128 weight rows x 64 tokens, which the grouped expert matmul shares) per
// block, k split across blockIdx.z when the tiles alone leave multiprocessors idle.

template <weight_format F>
__global__ void __launch_bounds__(gt::threads) gemm_mma_kernel(matmul_args a) {
  extern __shared__ __align__(128) unsigned char gemm_shared[];
  const std::int64_t k_begin = static_cast<std::int64_t>(blockIdx.z) * a.k_per_split;
  const mma_operands o{.x = a.x, .w = static_cast<const std::uint8_t*>(a.w), .scales = a.scales, .tokens = a.tokens,
                       .n = a.n, .x_stride = a.x_stride, .row_bytes = a.row_bytes, .group_size = a.group_size,
                       .groups_per_row = a.groups_per_row};
  gemm_mma_tile<F>(o, static_cast<std::int64_t>(blockIdx.x) * gt::block_tokens,
                   static_cast<std::int64_t>(blockIdx.y) * gt::block_rows, k_begin, min(a.k, k_begin + a.k_per_split),
                   gemm_shared, [&](std::int64_t token, std::int64_t row, float dot) { emit<F>(a, token, row, dot); });
}

// ---- SIMT GEMM (f32, f16 weights) -------------------------------------------------------------

constexpr int simt_bm = 32;  // tokens per block
constexpr int simt_bn = 64;  // weight rows per block
constexpr int simt_bk = 16;
constexpr int simt_side = 16;  // 16 x 16 threads
constexpr int simt_threads = simt_side * simt_side;
constexpr int simt_tokens_per_thread = simt_bm / simt_side;
constexpr int simt_rows_per_thread = simt_bn / simt_side;

template <weight_format F>
__global__ void __launch_bounds__(simt_threads) gemm_simt_kernel(matmul_args a) {
  constexpr dtype element = F == weight_format::f16 ? dtype::f16 : dtype::f32;
  __shared__ float xs[simt_bk][simt_bm + 1];
  __shared__ float ws[simt_bk][simt_bn + 1];
  const std::int64_t t0 = static_cast<std::int64_t>(blockIdx.x) * simt_bm;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.y) * simt_bn;
  const std::int64_t k_begin = static_cast<std::int64_t>(blockIdx.z) * a.k_per_split;
  const std::int64_t k_end = min(a.k, k_begin + a.k_per_split);
  const int tx = static_cast<int>(threadIdx.x) % simt_side;
  const int ty = static_cast<int>(threadIdx.x) / simt_side;

  float acc[simt_tokens_per_thread][simt_rows_per_thread] = {};
  for (std::int64_t kb = k_begin; kb < k_end; kb += simt_bk) {
    for (int i = static_cast<int>(threadIdx.x); i < simt_bm * simt_bk; i += simt_threads) {
      const std::int64_t t = t0 + i / simt_bk;
      const std::int64_t kk = kb + i % simt_bk;
      xs[i % simt_bk][i / simt_bk] = t < a.tokens && kk < k_end ? a.x[t * a.x_stride + kk] : 0.0f;
    }
    for (int i = static_cast<int>(threadIdx.x); i < simt_bn * simt_bk; i += simt_threads) {
      const std::int64_t row = n0 + i / simt_bk;
      const std::int64_t kk = kb + i % simt_bk;
      ws[i % simt_bk][i / simt_bk] = row < a.n && kk < k_end ? load_float<element>(a.w, row * a.k + kk) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < simt_bk; ++kk) {
      float xv[simt_tokens_per_thread];
      float wv[simt_rows_per_thread];
#pragma unroll
      for (int i = 0; i < simt_tokens_per_thread; ++i) xv[i] = xs[kk][ty * simt_tokens_per_thread + i];
#pragma unroll
      for (int j = 0; j < simt_rows_per_thread; ++j) wv[j] = ws[kk][tx + simt_side * j];
#pragma unroll
      for (int i = 0; i < simt_tokens_per_thread; ++i) {
#pragma unroll
        for (int j = 0; j < simt_rows_per_thread; ++j) acc[i][j] = fmaf(xv[i], wv[j], acc[i][j]);
      }
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < simt_tokens_per_thread; ++i) {
#pragma unroll
    for (int j = 0; j < simt_rows_per_thread; ++j) {
      const std::int64_t t = t0 + ty * simt_tokens_per_thread + i;
      const std::int64_t row = n0 + tx + simt_side * j;
      if (t < a.tokens && row < a.n) emit<F>(a, t, row, acc[i][j]);
    }
  }
}

// ---- host side --------------------------------------------------------------------------------

constexpr int reduce_threads = 256;
constexpr std::int64_t max_reduce_blocks = 4096;

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// How many ways to split k for a grid of `tiles` output tiles (1: no split).
int choose_splits(const matmul_params& p, std::int64_t tiles, std::int64_t k_step) {
  return static_cast<int>(matmul_split_count(tiles, multiprocessor_count(), p.tokens, p.n, p.k, k_step,
                                             p.workspace == nullptr ? 0 : p.workspace_floats));
}

// Adds the split-K parts (when k was split) into y.
template <weight_format F>
status reduce_splits(const matmul_params& p, const matmul_args& a, int splits, cudaStream_t stream) {
  if (splits <= 1) return {};
  const auto blocks = static_cast<unsigned>(std::min(max_reduce_blocks, ceil_div(p.tokens * p.n, reduce_threads)));
  split_reduce_kernel<F><<<blocks, reduce_threads, 0, stream>>>(a, splits);
  return check_launch("matmul (split-k reduction)");
}

template <weight_format F, int T_MAX>
void launch_gemv(const matmul_args& a, bool fine_groups, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(ceil_div(a.n, gemv_rows));
  if constexpr (F == weight_format::int4) {
    if (fine_groups) {
      gemv_kernel<F, T_MAX, true><<<blocks, gemv_threads, 0, stream>>>(a);
      return;
    }
  }
  gemv_kernel<F, T_MAX, false><<<blocks, gemv_threads, 0, stream>>>(a);
}

template <weight_format F>
status run_format(const matmul_params& p, matmul_args a, cudaStream_t stream) {
  if (F == weight_format::int4 && a.w_vec && cuda_matmul_uses_tensor_cores(F, p.tokens, p.w.group_size) &&
      p.tokens <= gemv_max_tokens) {
    const std::int64_t tiles = ceil_div(p.n, w4::tile_rows);
    const std::int64_t stage_k = w4::stage_chunks * w4::chunk_k;
    int splits = choose_splits(p, tiles, stage_k);
    a.k_per_split = ceil_div(ceil_div(p.k, splits), stage_k) * stage_k;
    splits = static_cast<int>(ceil_div(p.k, a.k_per_split));
    const dim3 grid(static_cast<unsigned>(tiles), 1, static_cast<unsigned>(splits));
    w4a16_decode_kernel<<<grid, w4::threads, 0, stream>>>(a);
    EDGE_RETURN_IF_ERROR(check_launch("matmul (w4a16 decode)"));
    return reduce_splits<weight_format::int4>(p, a, splits, stream);
  }
  if (p.tokens <= gemv_max_tokens) {
    const bool fine_groups = F == weight_format::int4 && p.w.group_size < int4_traits::chunk_elements;
    if (p.tokens == 1) {
      launch_gemv<F, 1>(a, fine_groups, stream);
    } else if (p.tokens <= 4) {
      launch_gemv<F, 4>(a, fine_groups, stream);
    } else {
      launch_gemv<F, 8>(a, fine_groups, stream);
    }
    return check_launch("matmul (gemv)");
  }
  constexpr bool tensor_cores =
      F == weight_format::bf16 || F == weight_format::fp8_e4m3 || F == weight_format::int4;
  // The pipelined GEMM takes what its cp.async copies allow: whole 32-k stages of 16-byte
  // aligned rows (and int4 groups that hold a stage); the wmma GEMM takes every other shape.
  const bool pipelined = tensor_cores && p.k % gt::stage_k == 0 && a.w_vec && a.x_vec &&
                         (F != weight_format::int4 || p.w.group_size >= gt::stage_k);
  if constexpr (tensor_cores) {
    if (pipelined) {
      const std::int64_t tiles = ceil_div(p.tokens, gt::block_tokens) * ceil_div(p.n, gt::block_rows);
      int splits = choose_splits(p, tiles, gt::stage_k);
      a.k_per_split = ceil_div(ceil_div(p.k, splits), gt::stage_k) * gt::stage_k;
      splits = static_cast<int>(ceil_div(p.k, a.k_per_split));
      const dim3 grid(static_cast<unsigned>(ceil_div(p.tokens, gt::block_tokens)),
                      static_cast<unsigned>(ceil_div(p.n, gt::block_rows)), static_cast<unsigned>(splits));
      constexpr int bytes = gemm_stage_bytes<F>::total;
      EDGE_RETURN_IF_ERROR(allow_shared_memory(reinterpret_cast<const void*>(&gemm_mma_kernel<F>), bytes));
      gemm_mma_kernel<F><<<grid, gt::threads, bytes, stream>>>(a);
      EDGE_RETURN_IF_ERROR(check_launch("matmul (pipelined gemm)"));
      return reduce_splits<F>(p, a, splits, stream);
    }
  }
  const std::int64_t bm = tensor_cores ? tc_bm : simt_bm;
  const std::int64_t bn = tensor_cores ? tc_bn : simt_bn;
  const std::int64_t k_step = tensor_cores ? tc_bk : simt_bk;
  const std::int64_t tiles_t = ceil_div(p.tokens, bm);
  const std::int64_t tiles_n = ceil_div(p.n, bn);
  int splits = choose_splits(p, tiles_t * tiles_n, k_step);
  a.k_per_split = ceil_div(ceil_div(p.k, splits), k_step) * k_step;
  splits = static_cast<int>(ceil_div(p.k, a.k_per_split));
  const dim3 grid(static_cast<unsigned>(tiles_t), static_cast<unsigned>(tiles_n), static_cast<unsigned>(splits));
  if constexpr (tensor_cores) {
    gemm_tc_kernel<F><<<grid, tc_threads, 0, stream>>>(a);
  } else {
    gemm_simt_kernel<F><<<grid, simt_threads, 0, stream>>>(a);
  }
  EDGE_RETURN_IF_ERROR(check_launch("matmul (gemm)"));
  return reduce_splits<F>(p, a, splits, stream);
}

// ---- every head's small matmul in one launch ---------------------------------------------------

struct head_args {
  const float* x;
  const std::uint8_t* w;        // the first head's first row
  const float* scales;          // the same row's scales (fp8, int4), else null
  float* y;
  std::int64_t tokens, n, k, x_stride, x_head_stride, y_stride, y_head_stride;
  std::int64_t head_rows;       // rows from one head's matrix to the next's
  std::int64_t row_bytes, group_size, groups_per_row;
  bool w_vec, x_vec;
};

constexpr int head_tokens = 4;  // tokens a block multiplies at once (the MoE grouped tile's count)

// Block (row tile, head): weight rows row0.. of head h's matrix against every token's x of that
// head, head_tokens tokens at a time (a tile of one for one token).
template <weight_format F, bool FINE_GROUPS>
__global__ void __launch_bounds__(gemv_threads) head_matmul_kernel(head_args a) {
  const std::int64_t h = blockIdx.y;
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * gemv_rows;
  const std::int64_t first = h * a.head_rows;  // the head's first row
  const std::int64_t scale_offset =
      F == weight_format::int4 ? first * a.groups_per_row : (F == weight_format::fp8_e4m3 ? first : 0);
  gemv_operands o{.x = nullptr, .w = a.w + first * a.row_bytes, .scales = a.scales == nullptr ? nullptr : a.scales + scale_offset,
                  .tokens = 0, .n = a.n, .k = a.k, .x_stride = a.x_stride, .row_bytes = a.row_bytes,
                  .group_size = a.group_size, .groups_per_row = a.groups_per_row, .w_vec = a.w_vec, .x_vec = a.x_vec};
  __shared__ float partial[gemv_warps][head_tokens][gemv_rows];
  for (std::int64_t t0 = 0; t0 < a.tokens; t0 += head_tokens) {
    o.x = a.x + t0 * a.x_stride + h * a.x_head_stride;
    o.tokens = min(a.tokens - t0, static_cast<std::int64_t>(head_tokens));
    gemv_tiles_store<F, FINE_GROUPS>(o, row0, partial, a.y + t0 * a.y_stride + h * a.y_head_stride, a.y_stride);
    __syncthreads();  // the next tokens reuse partial
  }
}

template <weight_format F>
status launch_heads(const head_args& a, std::int64_t heads, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n, gemv_rows)), static_cast<unsigned>(heads));
  if constexpr (F == weight_format::int4) {
    if (a.group_size < int4_traits::chunk_elements) {
      head_matmul_kernel<F, true><<<grid, gemv_threads, 0, stream>>>(a);
      return check_launch("head matmul");
    }
  }
  head_matmul_kernel<F, false><<<grid, gemv_threads, 0, stream>>>(a);
  return check_launch("head matmul");
}

}  // namespace

status run_head_matmul(const head_matmul_params& p, const stream& s) {
  EDGE_RETURN_IF_ERROR(detail::check_head_matmul(p));
  if (p.tokens == 0 || p.heads == 0) return {};
  if (p.tokens > head_matmul_gemv_tokens || p.heads > std::int64_t{65535}) {
    // A prefill chunk: each head through run_matmul's GEMM (its tensor cores pay for the launches).
    for (std::int64_t h = 0; h < p.heads; ++h) {
      EDGE_RETURN_IF_ERROR(cuda::run_matmul(matmul_params{.x = p.x + h * p.x_head_stride,
                                       .w = weight_rows_from(p.w, p.first_row + h * p.head_rows, p.k),
                                       .y = p.y + h * p.y_head_stride, .tokens = p.tokens, .n = p.n, .k = p.k,
                                       .x_stride = p.x_stride, .y_stride = p.y_stride},
                                      s));
    }
    return {};
  }
  if (p.w.values == nullptr) return invalid_argument("head matmul: no weights");
  if (!cuda_matmul_reads(p.w.format)) {
    return invalid_argument(format("head matmul: the CUDA kernels do not read {} weights", to_string(p.w.format)));
  }
  if (p.w.layout != weight_layout::rows) return invalid_argument("head matmul: the CUDA kernels read the row layout");
  if (has_scales(p.w.format) && p.w.scales == nullptr) return invalid_argument("head matmul: quantized weights need scales");
  if (p.w.format == weight_format::int4 && !valid_int4_group_size(p.w.group_size, p.k)) {
    return invalid_argument("head matmul: the INT4 group size must be a power of two dividing k");
  }
  const weight_view first = weight_rows_from(p.w, p.first_row, p.k);
  head_args a{};
  a.x = p.x;
  a.w = static_cast<const std::uint8_t*>(first.values);
  a.scales = first.scales;
  a.y = p.y;
  a.tokens = p.tokens;
  a.n = p.n;
  a.k = p.k;
  a.x_stride = p.x_stride;
  a.x_head_stride = p.x_head_stride;
  a.y_stride = p.y_stride;
  a.y_head_stride = p.y_head_stride;
  a.head_rows = p.head_rows;
  a.row_bytes = weight_values_bytes(p.w.format, 1, p.k);
  a.group_size = p.w.group_size;
  a.groups_per_row = p.w.format == weight_format::int4 ? p.k / p.w.group_size : 0;
  a.w_vec = aligned16(first.values) && a.row_bytes % chunk_bytes == 0;
  a.x_vec = aligned16(p.x) && p.x_stride % 4 == 0 && p.x_head_stride % 4 == 0;
  const cudaStream_t stream = native(s);
  switch (p.w.format) {
    case weight_format::f32: return launch_heads<weight_format::f32>(a, p.heads, stream);
    case weight_format::f16: return launch_heads<weight_format::f16>(a, p.heads, stream);
    case weight_format::bf16: return launch_heads<weight_format::bf16>(a, p.heads, stream);
    case weight_format::fp8_e4m3: return launch_heads<weight_format::fp8_e4m3>(a, p.heads, stream);
    case weight_format::int4: return launch_heads<weight_format::int4>(a, p.heads, stream);
    case weight_format::int8:
    case weight_format::q4_k:
    case weight_format::q5_k:
    case weight_format::q6_k: break;  // refused above
  }
  return invalid_argument("head matmul: unknown weight format");
}

status run_matmul(const matmul_params& p, const stream& s) {
  if (p.tokens < 0 || p.n <= 0 || p.k <= 0 || p.x_stride < p.k || p.y_stride < p.n) {
    return invalid_argument("matmul: bad shape or strides");
  }
  if (p.w.values == nullptr) return invalid_argument("matmul: no weights");
  if (!cuda_matmul_reads(p.w.format)) {
    return invalid_argument(format("matmul: the CUDA kernels do not read {} weights (the CUDA placement widens them)",
                                   to_string(p.w.format)));
  }
  if (p.w.layout != weight_layout::rows) {
    return invalid_argument("matmul: the CUDA kernels read the row layout (the CUDA placement unpacks CPU row tiles)");
  }
  if (has_scales(p.w.format) && p.w.scales == nullptr) return invalid_argument("matmul: quantized weights need scales");
  if (p.w.format == weight_format::int4 && !valid_int4_group_size(p.w.group_size, p.k)) {
    return invalid_argument("matmul: the INT4 group size must be a power of two dividing k");
  }
  if (p.tokens == 0) return {};
  matmul_args a{};
  a.x = p.x;
  a.w = p.w.values;
  a.scales = p.w.scales;
  a.bias = p.bias;
  a.y = p.y;
  a.workspace = p.workspace;
  a.tokens = p.tokens;
  a.n = p.n;
  a.k = p.k;
  a.x_stride = p.x_stride;
  a.y_stride = p.y_stride;
  a.row_bytes = weight_values_bytes(p.w.format, 1, p.k);
  a.group_size = p.w.group_size;
  a.groups_per_row = p.w.format == weight_format::int4 ? p.k / p.w.group_size : 0;
  a.k_per_split = p.k;
  a.accumulate = p.accumulate;
  a.w_vec = aligned16(p.w.values) && a.row_bytes % chunk_bytes == 0;
  a.x_vec = aligned16(p.x) && p.x_stride % 4 == 0;
  const cudaStream_t stream = native(s);
  switch (p.w.format) {
    case weight_format::f32: return run_format<weight_format::f32>(p, a, stream);
    case weight_format::f16: return run_format<weight_format::f16>(p, a, stream);
    case weight_format::bf16: return run_format<weight_format::bf16>(p, a, stream);
    case weight_format::fp8_e4m3: return run_format<weight_format::fp8_e4m3>(p, a, stream);
    case weight_format::int4: return run_format<weight_format::int4>(p, a, stream);
    case weight_format::int8:
    case weight_format::q4_k:
    case weight_format::q5_k:
    case weight_format::q6_k: break;  // refused above
  }
  return invalid_argument("matmul: unknown weight format");
}

}  // namespace edge::kernels::cuda
