// CUDA routed experts (moe_experts.h): the CPU's grouped execution with the per-expert split
// kept on the device, so that nothing waits for the GPU and a call can be captured in a graph.
// Pairs are the batch's (token, choice) entries, pair index t * top_k + i.
//
//   1. count_kernel (one block): pairs per expert (shared-memory atomics on integers, so the
//      same counts on every run), their exclusive scan into begin, expert_tokens, the chosen
//      experts' ids compacted in id order (a second scan, of "has pairs") with their count, and
//      each chosen expert's first 64-row tile (a third scan, of its tiles: the tensor-core work
//      list of moe_experts_order.h).
//   2. place_kernel (a block per chosen expert): the expert's pairs in pair order, by warp
//      ballots (moe_experts_order.h), into order[row] and row_of[pair].
//   3. gather_kernel (a block per row): the x row of each placed pair, in expert order.
//   4. The grouped matmul for gate and up (stacked: one call of 2 intermediate rows), the
//      shared silu_mul over all rows, and again for down; one launch per matrix, in one of two
//      forms (cuda_moe_experts_use_tensor_cores):
//      * decode (1..8 tokens), and formats or shapes the tensor cores do not take:
//        grouped_matmul_kernel, grid (weight-row tile, chosen expert slot), as many slots as the
//        call can have chosen experts (tokens × top_k, at most the expert count:
//        moe_grouped_blocks); a slot past the chosen count returns at once, so an expert nobody
//        chose is never read nor given blocks. A block reads its tile of weight rows (the GEMV
//        tile of weight_chunks.cuh, f32 multiply-adds on CUDA cores) for each group of up to 4
//        of its expert's rows: once in decode, where an expert has few.
//      * 9+ tokens with bf16, fp8 or int4 weights: grouped_gemm_kernel, grid (128 weight rows,
//        work-list tile), gemm_mma.cuh's tile (mma.sync, x rounded to bf16, as the dense GEMM)
//        over 64 of an expert's rows at a time, so its weights are read once per 64 rows. The
//        grid holds as many tiles as the pairs could make (moe_experts_order::max_tiles); those
//        past the work list's count return at once.
//   5. combine_kernel (a block per token): out[t] += Σ weight · expert output over the token's
//      choices in expert-id order, products and sums rounded one by one as the CPU rounds them.
//
// The weight views come from moe_experts_params::device_matrices, a device copy of the
// matrices that the caller keeps; the layout (format, group size, stacked) is read from the host
// copy and must be the same for every expert with weights, so that each matmul is one launch.
#include <algorithm>
#include <limits>
#include <optional>

#include "edge/common/format.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/matmul/gemm_mma.cuh"
#include "kernels/matmul/weight_chunks.cuh"
#include "kernels/moe_experts/moe_experts_order.h"

namespace edge::kernels::cuda {
namespace {

namespace order = moe_experts_order;

constexpr int max_experts = static_cast<int>(max_router_experts);
constexpr int count_threads = 1024;
constexpr int count_warps = count_threads / warp_size;
constexpr int place_threads = 256;
constexpr int place_warps = place_threads / warp_size;
constexpr int gather_threads = 128;
constexpr int combine_threads = 256;
static_assert(max_experts <= count_threads, "one thread per expert in the scan");
static_assert(order::warp_lanes == warp_size);

// ---- grouping ----------------------------------------------------------------------------------

__device__ __forceinline__ bool valid_expert_device(std::int32_t e, std::int64_t num_experts) {
  return e >= 0 && e < num_experts;
}

// The exclusive scan of one value per thread of a count_threads block (expert tid's), within
// each warp and then over the warps' totals; every thread must call it.
__device__ __forceinline__ std::int32_t block_exclusive_scan(std::int32_t value,
                                                             std::int32_t (&warp_totals)[count_warps]) {
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  std::int32_t inclusive = value;
#pragma unroll
  for (int offset = 1; offset < warp_size; offset *= 2) {
    const std::int32_t v = __shfl_up_sync(full_warp, inclusive, offset);
    if (lane >= offset) inclusive += v;
  }
  __syncthreads();  // every warp has read the totals of an earlier scan
  if (lane == warp_size - 1) warp_totals[warp] = inclusive;
  __syncthreads();
  std::int32_t before = 0;
  for (int w = 0; w < warp; ++w) before += warp_totals[w];
  return before + inclusive - value;
}

__global__ void __launch_bounds__(count_threads)
    count_kernel(const std::int32_t* experts,    // [pairs]
                 std::int64_t pairs, int num_experts,
                 std::int32_t* begin,            // [num_experts + 1]
                 std::int32_t* expert_tokens,    // [num_experts] or null
                 std::int32_t* chosen,           // [num_experts + 1] chosen ids, then their count
                 std::int32_t* tile_begin,       // [num_experts + 1] each chosen expert's first tile, then the count
                 bool add_counts) {              // expert_tokens += counts (a later chunk)
  __shared__ std::int32_t counts[max_experts];
  __shared__ std::int32_t warp_totals[count_warps];
  const int tid = static_cast<int>(threadIdx.x);
  if (tid < num_experts) counts[tid] = 0;
  __syncthreads();
  for (std::int64_t i = tid; i < pairs; i += count_threads) {
    const std::int32_t e = experts[i];
    if (valid_expert_device(e, num_experts)) atomicAdd(&counts[e], 1);
  }
  __syncthreads();
  const std::int32_t count = tid < num_experts ? counts[tid] : 0;
  const std::int32_t first = block_exclusive_scan(count, warp_totals);
  if (tid < num_experts) {
    begin[tid] = first;
    if (expert_tokens != nullptr) expert_tokens[tid] = (add_counts ? expert_tokens[tid] : 0) + count;
  }
  if (tid == num_experts - 1) begin[num_experts] = first + count;
  // The chosen experts in id order: the same scan over "has pairs"; and their first tiles of
  // the tensor-core work list: the same scan over their tiles.
  const std::int32_t has = count > 0 ? 1 : 0;
  const std::int32_t slot = block_exclusive_scan(has, warp_totals);
  const std::int32_t tiles = order::tiles_of(count, gemm_tiles::block_tokens);
  const std::int32_t tiles_before = block_exclusive_scan(tiles, warp_totals);
  if (tid < num_experts && has != 0) {
    chosen[slot] = tid;
    tile_begin[slot] = tiles_before;
  }
  if (tid == num_experts - 1) {
    chosen[num_experts] = slot + has;
    tile_begin[slot + has] = tiles_before + tiles;
  }
}

__global__ void __launch_bounds__(place_threads)
    place_kernel(const std::int32_t* experts,  // [pairs]
                 std::int64_t pairs,
                 const std::int32_t* begin,    // [num_experts + 1]
                 const std::int32_t* chosen,   // [num_experts + 1] chosen ids, then their count
                 int num_experts,
                 std::int32_t* rows,           // [pairs] order: the pair of each row
                 std::int32_t* row_of) {       // [pairs] the row of each pair
  __shared__ std::uint32_t ballots[place_warps];
  if (static_cast<std::int32_t>(blockIdx.x) >= chosen[num_experts]) return;
  const std::int32_t e = chosen[blockIdx.x];
  const std::int32_t first = begin[e];
  const std::int32_t count = begin[e + 1] - first;
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid / warp_size;
  const int lane = tid % warp_size;
  std::int32_t placed = 0;  // the same on every thread
  for (std::int64_t round = 0; round < pairs && placed < count; round += place_threads) {
    const std::int64_t i = round + tid;
    const bool mine = i < pairs && experts[i] == e;
    const std::uint32_t ballot = __ballot_sync(full_warp, mine);
    if (lane == 0) ballots[warp] = ballot;
    __syncthreads();
    if (mine) {
      const std::int32_t row = first + placed + order::round_place(ballots, warp, lane);
      rows[row] = static_cast<std::int32_t>(i);
      row_of[i] = row;
    }
    placed += order::round_count(ballots, place_warps);
    __syncthreads();  // everyone has read this round's ballots
  }
}

__global__ void __launch_bounds__(gather_threads)
    gather_kernel(const float* x,              // [tokens, hidden], row stride x_stride
                  std::int64_t x_stride, std::int64_t hidden, std::int64_t top_k,
                  const std::int32_t* rows,    // [pairs] the pair of each row
                  const std::int32_t* placed,  // [1] rows placed (begin[num_experts])
                  float* gathered,             // [pairs, hidden]
                  bool vec) {                  // 16-byte aligned rows of a multiple of 4 floats
  const std::int64_t j = blockIdx.x;
  if (j >= *placed) return;  // the rows of pairs left out (an expert id outside the set)
  const float* from = x + rows[j] / static_cast<std::int32_t>(top_k) * x_stride;  // top_k <= max_experts
  float* to = gathered + j * hidden;
  if (vec) {
    for (std::int64_t d = threadIdx.x; d < hidden / 4; d += gather_threads) {
      reinterpret_cast<float4*>(to)[d] = reinterpret_cast<const float4*>(from)[d];
    }
  } else {
    for (std::int64_t d = threadIdx.x; d < hidden; d += gather_threads) to[d] = from[d];
  }
}

// ---- the grouped matmul ------------------------------------------------------------------------

enum class expert_matrix { gate, up, down };

// An expert's rows go through the GEMV tile this many at a time (one alone: the decode case of
// few rows per expert takes a tile of one). More would hold more accumulators than the INT4
// tile has registers for without spilling.
constexpr std::int64_t grouped_tokens = 4;

struct grouped_args {
  const float* x;                     // [pairs, k] rows grouped by expert (begin), row stride x_stride
  float* y;                           // [pairs, n] row stride y_stride: y = x · wᵀ of each row's expert
  const moe_expert_weights* experts;  // [num_experts] device memory
  const std::int32_t* begin;          // [num_experts + 1]
  const std::int32_t* chosen;         // [num_experts + 1] chosen ids, then their count
  std::int64_t num_experts;
  std::int64_t n, k, x_stride, y_stride;
  std::int64_t row_bytes;             // bytes of one weight row
  std::int64_t group_size;            // int4 only
  std::int64_t groups_per_row;        // int4 only
  expert_matrix matrix;
  bool x_vec;                         // x rows are 16-byte aligned
};

template <weight_format F, bool FINE_GROUPS>
__global__ void __launch_bounds__(gemv_threads) grouped_matmul_kernel(grouped_args a) {
  if (static_cast<std::int32_t>(blockIdx.y) >= a.chosen[a.num_experts]) return;  // fewer experts chosen than slots
  const std::int32_t e = a.chosen[blockIdx.y];
  const std::int32_t first = a.begin[e];
  const std::int32_t rows = a.begin[e + 1] - first;
  if (rows <= 0) return;  // (chosen experts have rows)
  const moe_expert_weights& m = a.experts[e];
  const weight_view& w = a.matrix == expert_matrix::gate ? m.gate : (a.matrix == expert_matrix::up ? m.up : m.down);
  const auto* values = static_cast<const std::uint8_t*>(w.values);
  const std::int64_t row0 = static_cast<std::int64_t>(blockIdx.x) * gemv_rows;
  __shared__ float partial[gemv_warps][grouped_tokens][gemv_rows];
  const bool w_vec = reinterpret_cast<std::uintptr_t>(values) % chunk_bytes == 0 && a.row_bytes % chunk_bytes == 0;
  gemv_operands o{.x = nullptr, .w = values, .scales = w.scales, .tokens = 0, .n = a.n, .k = a.k,
                  .x_stride = a.x_stride, .row_bytes = a.row_bytes, .group_size = a.group_size,
                  .groups_per_row = a.groups_per_row, .w_vec = w_vec, .x_vec = a.x_vec};
  for (std::int64_t r0 = 0; r0 < rows; r0 += grouped_tokens) {
    o.x = a.x + (first + r0) * a.x_stride;
    o.tokens = min(rows - r0, grouped_tokens);
    float* y = a.y + (first + r0) * a.y_stride;
    if (values == nullptr) {
      // A chosen expert without weights (the host checks cannot see which are chosen): zeros,
      // never memory outside the buffers.
      for (int i = static_cast<int>(threadIdx.x); i < o.tokens * gemv_rows; i += gemv_threads) {
        const std::int64_t row = row0 + i % gemv_rows;
        if (row < a.n) y[i / gemv_rows * a.y_stride + row] = 0.0f;
      }
      continue;
    }
    gemv_tiles_store<F, FINE_GROUPS>(o, row0, partial, y, a.y_stride);
    __syncthreads();  // the next group of rows reuses partial
  }
}

// The tensor-core form of grouped_matmul_kernel: block (x, j) runs gemm_mma.cuh's tile over
// weight rows x · 128.. and tile j of the work list (count_kernel's tile_begin): 64 rows of one
// chosen expert. Blocks past the tiles' count return at once.
template <weight_format F>
__global__ void __launch_bounds__(gt::threads) grouped_gemm_kernel(grouped_args a, const std::int32_t* tile_begin) {
  extern __shared__ __align__(128) unsigned char grouped_shared[];
  const std::int32_t chosen = a.chosen[a.num_experts];
  const auto j = static_cast<std::int32_t>(blockIdx.y);
  if (chosen <= 0 || j >= tile_begin[chosen]) return;
  const std::int32_t slot = order::tile_slot(tile_begin, chosen, j);
  const std::int32_t e = a.chosen[slot];
  const std::int32_t first = a.begin[e];
  const std::int32_t rows = a.begin[e + 1] - first;
  const std::int64_t t0 = static_cast<std::int64_t>(j - tile_begin[slot]) * gt::block_tokens;
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * gt::block_rows;
  const moe_expert_weights& m = a.experts[e];
  const weight_view& w = a.matrix == expert_matrix::gate ? m.gate : (a.matrix == expert_matrix::up ? m.up : m.down);
  float* y = a.y + static_cast<std::int64_t>(first) * a.y_stride;
  if (w.values == nullptr) {
    // A chosen expert without weights: zeros, as grouped_matmul_kernel writes.
    for (int i = static_cast<int>(threadIdx.x); i < gt::block_tokens * gt::block_rows; i += gt::threads) {
      const std::int64_t token = t0 + i / gt::block_rows;
      const std::int64_t row = n0 + i % gt::block_rows;
      if (token < rows && row < a.n) y[token * a.y_stride + row] = 0.0f;
    }
    return;
  }
  const mma_operands o{.x = a.x + static_cast<std::int64_t>(first) * a.x_stride,
                       .w = static_cast<const std::uint8_t*>(w.values), .scales = w.scales, .tokens = rows, .n = a.n,
                       .x_stride = a.x_stride, .row_bytes = a.row_bytes, .group_size = a.group_size,
                       .groups_per_row = a.groups_per_row};
  gemm_mma_tile<F>(o, t0, n0, 0, a.k, grouped_shared, [&](std::int64_t token, std::int64_t row, float dot) {
    if constexpr (F == weight_format::fp8_e4m3) dot *= w.scales[row];
    y[token * a.y_stride + row] = dot;
  });
}

// ---- combining ---------------------------------------------------------------------------------

__global__ void __launch_bounds__(combine_threads)
    combine_kernel(const std::int32_t* experts,  // [tokens, top_k]
                   const float* weights,         // [tokens, top_k]
                   const std::int32_t* row_of,   // [pairs]
                   const float* expert_out,      // [pairs, hidden]
                   std::int64_t top_k, std::int64_t num_experts, std::int64_t hidden,
                   float* out,                   // [tokens, hidden], row stride out_stride
                   std::int64_t out_stride) {
  __shared__ std::int32_t rows[max_experts];  // [top_k] the token's choices in expert order: their rows
  __shared__ float row_weight[max_experts];   // [top_k] and their weights
  const std::int64_t t = blockIdx.x;
  const std::int32_t* mine = experts + t * top_k;
  for (std::int64_t i = threadIdx.x; i < top_k; i += combine_threads) {
    const int place = order::choice_rank(mine, top_k, i);
    rows[place] = valid_expert_device(mine[i], num_experts) ? row_of[t * top_k + i] : -1;
    row_weight[place] = weights[t * top_k + i];
  }
  __syncthreads();
  float* o = out + t * out_stride;
  for (std::int64_t d = threadIdx.x; d < hidden; d += combine_threads) {
    // A product, then a sum, each rounded: the CPU's arithmetic (no fused multiply-add).
    float sum = 0.0f;
    for (std::int64_t r = 0; r < top_k; ++r) {
      if (rows[r] >= 0) sum = __fadd_rn(sum, __fmul_rn(row_weight[r], expert_out[rows[r] * hidden + d]));
    }
    o[d] = __fadd_rn(o[d], sum);
  }
}

// ---- host side ---------------------------------------------------------------------------------

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

// The layout every expert with weights shares.
struct matrix_layout {
  weight_format format = weight_format::f32;
  std::int64_t group_size = 0;
};

struct experts_layout {
  matrix_layout gate, up, down;  // up unused when stacked
  bool stacked = true;
  bool aligned = true;  // every expert's matrices start 16-byte aligned (the tensor-core tile's copies)
};

status check_matrix(const weight_view& w, std::int64_t k, const char* which) {
  if (!cuda_matmul_reads(w.format)) {
    return invalid_argument(format("moe experts: the CUDA kernels do not read {} {} weights (the CUDA placement "
                                   "widens them)",
                                   which, to_string(w.format)));
  }
  if (has_scales(w.format) && w.scales == nullptr) {
    return invalid_argument(format("moe experts: {} {} weights need scales", which, to_string(w.format)));
  }
  if (w.format == weight_format::int4 && !valid_int4_group_size(w.group_size, k)) {
    return invalid_argument(format("moe experts: the {} INT4 group size must be a power of two dividing {}", which, k));
  }
  return {};
}

bool same_layout(const weight_view& w, const matrix_layout& l) {
  return w.format == l.format && (w.format != weight_format::int4 || w.group_size == l.group_size);
}

result<experts_layout> layout_of(const moe_experts_params& p) {
  if (p.matrices == nullptr) return invalid_argument("moe experts: no matrices");
  std::optional<experts_layout> shared;
  for (std::int64_t e = 0; e < p.num_experts; ++e) {
    const moe_expert_weights& m = p.matrices[e];
    if (m.gate.values == nullptr) continue;  // never chosen, the caller says; if chosen, it adds zeros
    if (m.down.values == nullptr) return invalid_argument(format("moe experts: expert {} has no down matrix", e));
    EDGE_RETURN_IF_ERROR(check_matrix(m.gate, p.hidden, "gate"));
    if (!m.stacked()) EDGE_RETURN_IF_ERROR(check_matrix(m.up, p.hidden, "up"));
    EDGE_RETURN_IF_ERROR(check_matrix(m.down, p.intermediate, "down"));
    if (!shared) {
      shared = experts_layout{.gate = {m.gate.format, m.gate.group_size},
                              .up = {m.up.format, m.up.group_size},
                              .down = {m.down.format, m.down.group_size},
                              .stacked = m.stacked()};
      continue;
    }
    if (m.stacked() != shared->stacked || !same_layout(m.gate, shared->gate) || !same_layout(m.down, shared->down) ||
        (!m.stacked() && !same_layout(m.up, shared->up))) {
      return invalid_argument(format("moe experts: expert {} is stored unlike expert 0's layout; on CUDA all "
                                     "experts share one",
                                     e));
    }
  }
  if (!shared) return invalid_argument("moe experts: no expert has weights");
  for (std::int64_t e = 0; e < p.num_experts; ++e) {
    const moe_expert_weights& m = p.matrices[e];
    shared->aligned = shared->aligned && aligned16(m.gate.values) && aligned16(m.up.values) && aligned16(m.down.values);
  }
  return *shared;
}

template <weight_format F>
void launch_grouped_format(const grouped_args& a, bool fine_groups, const dim3& grid, cudaStream_t stream) {
  if constexpr (F == weight_format::int4) {
    if (fine_groups) {
      grouped_matmul_kernel<F, true><<<grid, gemv_threads, 0, stream>>>(a);
      return;
    }
  }
  grouped_matmul_kernel<F, false><<<grid, gemv_threads, 0, stream>>>(a);
}

template <weight_format F>
status launch_grouped_gemm(const grouped_args& a, const std::int32_t* tile_begin, std::int64_t pairs,
                           std::int64_t slots, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(ceil_div(a.n, gt::block_rows)),
                  static_cast<unsigned>(order::max_tiles(pairs, slots, gt::block_tokens)));
  constexpr int bytes = gemm_stage_bytes<F>::total;
  EDGE_RETURN_IF_ERROR(allow_shared_memory(reinterpret_cast<const void*>(&grouped_gemm_kernel<F>), bytes));
  grouped_gemm_kernel<F><<<grid, gt::threads, bytes, stream>>>(a, tile_begin);
  return check_launch("moe experts (grouped gemm)");
}

// y [pairs, n] = each row of x [pairs, k] through its expert's `matrix`: on tensor cores where
// cuda_moe_experts_use_tensor_cores says so (and x and the weights are 16-byte aligned), else
// the GEMV tile.
status launch_grouped(const matrix_layout& l, expert_matrix matrix, const float* x, std::int64_t x_stride, float* y,
                      std::int64_t y_stride, std::int64_t n, std::int64_t k, const moe_experts_params& p,
                      const std::int32_t* begin, const std::int32_t* chosen, const std::int32_t* tile_begin,
                      bool weights_aligned, cudaStream_t stream) {
  const grouped_args a{.x = x, .y = y, .experts = p.device_matrices, .begin = begin, .chosen = chosen,
                       .num_experts = p.num_experts, .n = n, .k = k,
                       .x_stride = x_stride, .y_stride = y_stride, .row_bytes = weight_values_bytes(l.format, 1, k),
                       .group_size = l.group_size,
                       .groups_per_row = l.format == weight_format::int4 ? k / l.group_size : 0, .matrix = matrix,
                       .x_vec = aligned16(x) && x_stride % 4 == 0};
  static_assert(gemv_rows == moe_grouped_tile_rows);
  const std::int64_t slots = std::min(p.tokens * p.top_k, p.num_experts);
  const std::int64_t pairs = p.tokens * p.top_k;
  // A call of more tiles than a grid's y can hold (a workspace past any chunk's) takes the GEMV tile.
  constexpr std::int64_t max_grid_y = 65535;
  if (cuda_moe_experts_use_tensor_cores(l.format, p.tokens, k, l.group_size) && weights_aligned && a.x_vec &&
      order::max_tiles(pairs, slots, gt::block_tokens) <= max_grid_y) {
    switch (l.format) {
      case weight_format::bf16: return launch_grouped_gemm<weight_format::bf16>(a, tile_begin, pairs, slots, stream);
      case weight_format::fp8_e4m3:
        return launch_grouped_gemm<weight_format::fp8_e4m3>(a, tile_begin, pairs, slots, stream);
      case weight_format::int4: return launch_grouped_gemm<weight_format::int4>(a, tile_begin, pairs, slots, stream);
      default: break;  // (cuda_moe_experts_use_tensor_cores takes only these)
    }
  }
  const dim3 grid(static_cast<unsigned>(ceil_div(n, gemv_rows)), static_cast<unsigned>(slots));
  const bool fine_groups = l.format == weight_format::int4 && l.group_size < int4_traits::chunk_elements;
  switch (l.format) {
    case weight_format::f32: launch_grouped_format<weight_format::f32>(a, fine_groups, grid, stream); break;
    case weight_format::f16: launch_grouped_format<weight_format::f16>(a, fine_groups, grid, stream); break;
    case weight_format::bf16: launch_grouped_format<weight_format::bf16>(a, fine_groups, grid, stream); break;
    case weight_format::fp8_e4m3: launch_grouped_format<weight_format::fp8_e4m3>(a, fine_groups, grid, stream); break;
    case weight_format::int4: launch_grouped_format<weight_format::int4>(a, fine_groups, grid, stream); break;
    case weight_format::int8:
    case weight_format::q4_k:
    case weight_format::q5_k:
    case weight_format::q6_k: break;  // refused by check_matrix
  }
  return check_launch("moe experts (grouped matmul)");
}

}  // namespace

status run_moe_experts(const moe_experts_params& p, const stream& s) {
  EDGE_RETURN_IF_ERROR(detail::check_moe_experts(p));
  if (p.num_experts > max_router_experts || p.top_k > max_router_experts) {
    return invalid_argument(format("moe experts: {} of {} experts; on CUDA at most {} of each", p.top_k,
                                   p.num_experts, max_router_experts));
  }
  const std::int64_t pairs = p.tokens * p.top_k;
  if (pairs > std::numeric_limits<std::int32_t>::max()) {
    return invalid_argument(format("moe experts: {} pairs of tokens and experts; on CUDA at most 2^31 - 1", pairs));
  }
  if (p.device_matrices == nullptr) {
    return invalid_argument("moe experts: a CUDA stream needs device_matrices, a device copy of matrices");
  }
  EDGE_ASSIGN_OR_RETURN(const experts_layout layout, layout_of(p));
  const cudaStream_t stream = native(s);
  if (p.tokens == 0) {
    if (p.expert_tokens == nullptr || p.add_expert_tokens) return {};
    return from_cuda(cudaMemsetAsync(p.expert_tokens, 0, static_cast<std::size_t>(p.num_experts) * sizeof(std::int32_t),
                                     stream),
                     "moe experts (expert_tokens)");
  }

  const moe_experts_layout w = moe_experts_workspace(p.tokens, p.top_k, p.num_experts, p.hidden, p.intermediate);
  float* gathered = p.workspace + w.gathered;      // [pairs, hidden]
  float* activation = p.workspace + w.activation;  // [pairs, 2 intermediate]
  float* expert_out = p.workspace + w.expert_out;  // [pairs, hidden]
  // int32 scratch in the tail of the float workspace (only ever read as int32).
  auto* begin = reinterpret_cast<std::int32_t*>(p.workspace + w.tail);  // [num_experts + 1]
  std::int32_t* rows = begin + p.num_experts + 1;                        // [pairs]
  std::int32_t* row_of = rows + pairs;                                   // [pairs]
  std::int32_t* chosen = row_of + pairs;                                 // [num_experts + 1]
  std::int32_t* tile_begin = chosen + p.num_experts + 1;                 // [num_experts + 1]
  const auto experts = static_cast<int>(p.num_experts);
  const auto slots = static_cast<unsigned>(std::min(pairs, p.num_experts));

  count_kernel<<<1, count_threads, 0, stream>>>(p.experts, pairs, experts, begin, p.expert_tokens, chosen,
                                                tile_begin, p.add_expert_tokens);
  EDGE_RETURN_IF_ERROR(check_launch("moe experts (count)"));
  place_kernel<<<slots, place_threads, 0, stream>>>(p.experts, pairs, begin, chosen, experts, rows, row_of);
  EDGE_RETURN_IF_ERROR(check_launch("moe experts (place)"));
  const bool gather_vec = aligned16(p.x) && p.x_stride % 4 == 0 && aligned16(gathered) && p.hidden % 4 == 0;
  gather_kernel<<<static_cast<unsigned>(pairs), gather_threads, 0, stream>>>(
      p.x, p.x_stride, p.hidden, p.top_k, rows, begin + p.num_experts, gathered, gather_vec);
  EDGE_RETURN_IF_ERROR(check_launch("moe experts (gather)"));

  const std::int64_t inter = p.intermediate;
  if (layout.stacked) {
    EDGE_RETURN_IF_ERROR(launch_grouped(layout.gate, expert_matrix::gate, gathered, p.hidden, activation, 2 * inter,
                                        2 * inter, p.hidden, p, begin, chosen, tile_begin, layout.aligned, stream));
  } else {
    EDGE_RETURN_IF_ERROR(launch_grouped(layout.gate, expert_matrix::gate, gathered, p.hidden, activation, 2 * inter,
                                        inter, p.hidden, p, begin, chosen, tile_begin, layout.aligned, stream));
    EDGE_RETURN_IF_ERROR(launch_grouped(layout.up, expert_matrix::up, gathered, p.hidden, activation + inter, 2 * inter,
                                        inter, p.hidden, p, begin, chosen, tile_begin, layout.aligned, stream));
  }
  EDGE_RETURN_IF_ERROR(cuda::run_silu_mul({.gate = activation, .up = activation + inter, .out = activation,
                                           .rows = pairs, .cols = inter, .in_stride = 2 * inter,
                                           .out_stride = 2 * inter},
                                          s));
  EDGE_RETURN_IF_ERROR(launch_grouped(layout.down, expert_matrix::down, activation, 2 * inter, expert_out, p.hidden,
                                      p.hidden, inter, p, begin, chosen, tile_begin, layout.aligned, stream));

  combine_kernel<<<static_cast<unsigned>(p.tokens), combine_threads, 0, stream>>>(
      p.experts, p.weights, row_of, expert_out, p.top_k, p.num_experts, p.hidden, p.out, p.out_stride);
  return check_launch("moe experts (combine)");
}

}  // namespace edge::kernels::cuda
