// CUDA sampling: one block of 1024 threads per row of logits, the same steps and order as the
// CPU reference (temperature, top-k, softmax, min-p, top-p, draw), with the row's uniform
// number deciding the draw, so a seeded request picks the same token on either device unless
// the draw falls within float rounding of a boundary between two tokens.
//
// The CPU sorts candidates; here every "first items in sorted order" question (the k largest,
// the smallest prefix of mass >= top_p, the item whose cumulative mass passes the draw) is
// answered by bisection over a 64-bit key whose order is the sort order: the value's bits made
// monotonic (high 32 bits), then the complement of the token id (low 32 bits: lower ids first
// among equal values, as on the CPU). Each bisection step is one pass over the row and a block
// reduction; the low half is bisected only when several tokens share the boundary value.
// Greedy rows are a plain argmax (lowest index among equal maxima, NaN never chosen).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace edge::kernels::cuda {
namespace {

constexpr int sampling_threads = 1024;
constexpr int sampling_warps = sampling_threads / warp_size;
constexpr int key_bits = 32;

// Float bits in an order that matches the float order (negative values reversed). -0.0 and
// +0.0 get one key, as they compare equal on the CPU: their tie goes to the lower id there too.
__device__ __forceinline__ std::uint32_t ordered_bits(float v) {
  const std::uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x8000'0000u) != 0u ? ~u : u | 0x8000'0000u;
}

__device__ __forceinline__ std::uint32_t id_key(std::int64_t id) { return ~static_cast<std::uint32_t>(id); }

struct block_scratch {
  double sums[sampling_warps];
  float values[sampling_warps];
  std::int32_t ids[sampling_warps];
  unsigned long long keys[sampling_warps];
};

// The smallest (or largest) 64-bit key over the block.
template <bool Largest>
__device__ unsigned long long block_extreme(unsigned long long v, block_scratch& s) {
  const auto pick = [](unsigned long long a, unsigned long long b) { return Largest ? (a > b ? a : b) : (a < b ? a : b); };
#pragma unroll
  for (int offset = warp_size / 2; offset > 0; offset /= 2) v = pick(v, __shfl_xor_sync(full_warp, v, offset));
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  __syncthreads();
  if (lane == 0) s.keys[warp] = v;
  __syncthreads();
  for (int w = 0; w < sampling_warps; ++w) v = pick(v, s.keys[w]);
  return v;
}

__device__ __forceinline__ unsigned long long full_key(float v, std::int64_t id) {
  return (static_cast<unsigned long long>(ordered_bits(v)) << key_bits) | id_key(id);
}

__device__ double block_sum(double v, block_scratch& s) {
#pragma unroll
  for (int offset = warp_size / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(full_warp, v, offset);
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  __syncthreads();  // earlier readers of the scratch are done
  if (lane == 0) s.sums[warp] = v;
  __syncthreads();
  double total = 0.0;
  for (int w = 0; w < sampling_warps; ++w) total += s.sums[w];  // the same order in every thread
  return total;
}

__device__ float block_max(float v, block_scratch& s) {
  v = warp_max(v);
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  __syncthreads();
  if (lane == 0) s.values[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < sampling_warps; ++w) m = fmaxf(m, s.values[w]);
  return m;
}

// The better of two (value, id) candidates: larger value, then lower id; id < 0 is no candidate.
__device__ __forceinline__ void better(float& value, std::int32_t& id, float other_value, std::int32_t other_id) {
  if (other_id < 0) return;
  if (id < 0 || other_value > value || (other_value == value && other_id < id)) {
    value = other_value;
    id = other_id;
  }
}

__device__ std::int32_t block_argmax(const float* row, std::int64_t vocab, block_scratch& s) {
  float value = -INFINITY;
  std::int32_t id = -1;
  for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
    if (!isnan(row[i])) better(value, id, row[i], static_cast<std::int32_t>(i));
  }
#pragma unroll
  for (int offset = warp_size / 2; offset > 0; offset /= 2) {
    better(value, id, __shfl_xor_sync(full_warp, value, offset), __shfl_xor_sync(full_warp, id, offset));
  }
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  __syncthreads();
  if (lane == 0) {
    s.values[warp] = value;
    s.ids[warp] = id;
  }
  __syncthreads();
  for (int w = 0; w < sampling_warps; ++w) better(value, id, s.values[w], s.ids[w]);
  return id < 0 ? 0 : id;
}

enum class weighting { count, mass };
enum class passes { at_least, more_than };

// Weight (count or mass) of the kept items (non-NaN) whose key is at least (hi, lo), where
// lo only matters among items whose high half equals hi (use_lo).
template <weighting W>
__device__ double weight_from(const float* row, std::int64_t vocab, std::uint32_t hi, bool use_lo, std::uint32_t lo,
                              block_scratch& s) {
  double sum = 0.0;
  for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
    const float v = row[i];
    if (isnan(v)) continue;
    const std::uint32_t h = ordered_bits(v);
    const bool in = h > hi || (h == hi && (!use_lo || id_key(i) >= lo));
    if (in) sum += W == weighting::count ? 1.0 : static_cast<double>(v);
  }
  return block_sum(sum, s);
}

template <passes P>
__device__ __forceinline__ bool passes_threshold(double weight, double threshold) {
  return P == passes::at_least ? weight >= threshold : weight > threshold;
}

// The largest key (hi, lo) among kept items whose weight from that key on passes `threshold`:
// the boundary item of the sorted order. found = false when no key passes.
struct boundary {
  std::uint32_t hi = 0;
  std::uint32_t lo = 0;
  bool found = false;
};

template <weighting W, passes P>
__device__ boundary find_boundary(const float* row, std::int64_t vocab, double threshold, block_scratch& s) {
  boundary b;
  if (!passes_threshold<P>(weight_from<W>(row, vocab, 0, false, 0, s), threshold)) return b;
  std::uint32_t hi = 0;
  for (int bit = key_bits - 1; bit >= 0; --bit) {
    const std::uint32_t candidate = hi | (1u << bit);
    if (passes_threshold<P>(weight_from<W>(row, vocab, candidate, false, 0, s), threshold)) hi = candidate;
  }
  // Among the items with value bits == hi, bisect their ids only when there are several.
  std::uint32_t lo = 0;
  const double ties = weight_from<weighting::count>(row, vocab, hi, false, 0, s) -
                      (hi == 0xFFFF'FFFFu ? 0.0 : weight_from<weighting::count>(row, vocab, hi + 1, false, 0, s));
  if (ties > 1.0) {
    for (int bit = key_bits - 1; bit >= 0; --bit) {
      const std::uint32_t candidate = lo | (1u << bit);
      if (passes_threshold<P>(weight_from<W>(row, vocab, hi, true, candidate, s), threshold)) lo = candidate;
    }
  } else {
    // The one item with these value bits.
    unsigned long long key = 0;
    for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
      if (!isnan(row[i]) && ordered_bits(row[i]) == hi) key = full_key(row[i], i);
    }
    lo = static_cast<std::uint32_t>(block_extreme<true>(key, s));
  }
  b.hi = hi;
  b.lo = lo;
  b.found = true;
  return b;
}

// Drops (sets to NaN) the kept items ordered after the boundary.
__device__ void keep_from(float* row, std::int64_t vocab, const boundary& b) {
  for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
    const float v = row[i];
    if (isnan(v)) continue;
    const std::uint32_t h = ordered_bits(v);
    if (h < b.hi || (h == b.hi && id_key(i) < b.lo)) row[i] = NAN;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(sampling_threads)
    sampling_kernel(float* __restrict__ logits,                // [rows, vocab]; scratch
                    const sampling_row* __restrict__ config,   // [rows]
                    std::int32_t* __restrict__ out,            // [rows]
                    std::int64_t vocab) {
  __shared__ block_scratch s;
  float* row = logits + static_cast<std::int64_t>(blockIdx.x) * vocab;
  const sampling_row c = config[blockIdx.x];
  if (c.temperature <= 0.0f) {
    const std::int32_t id = block_argmax(row, vocab, s);
    if (threadIdx.x == 0) out[blockIdx.x] = id;
    return;
  }

  // Temperature; from here on the row holds each candidate's value, NaN for dropped ones.
  const float inv_temperature = 1.0f / c.temperature;
  for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) row[i] *= inv_temperature;
  __syncthreads();
  const double candidates = weight_from<weighting::count>(row, vocab, 0, false, 0, s);
  if (candidates == 0.0) {
    if (threadIdx.x == 0) out[blockIdx.x] = 0;
    return;
  }
  if (c.top_k > 0 && static_cast<double>(c.top_k) < candidates) {
    keep_from(row, vocab, find_boundary<weighting::count, passes::at_least>(row, vocab, c.top_k, s));
  }

  // Softmax over what is left: exp in float, the total in double, as on the CPU.
  float max_value = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
    if (!isnan(row[i])) max_value = fmaxf(max_value, row[i]);
  }
  max_value = block_max(max_value, s);
  double total = 0.0;
  for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
    if (isnan(row[i])) continue;
    row[i] = expf(row[i] - max_value);
    total += row[i];
  }
  total = block_sum(total, s);
  const float inv_total = static_cast<float>(1.0 / total);
  const float min_p_threshold = c.min_p * inv_total;  // the most likely token has probability exp(0) / total
  for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
    if (isnan(row[i])) continue;
    row[i] *= inv_total;
    if (c.min_p > 0.0f && row[i] < min_p_threshold) row[i] = NAN;
  }
  __syncthreads();

  if (c.top_p < 1.0f) {
    const boundary b = find_boundary<weighting::mass, passes::at_least>(row, vocab, c.top_p, s);
    // Mass short of top_p (rounding): everything stays, as on the CPU.
    if (b.found) keep_from(row, vocab, b);
  }

  const double kept = weight_from<weighting::mass>(row, vocab, 0, false, 0, s);
  const double target = static_cast<double>(c.uniform) * kept;
  const boundary chosen = find_boundary<weighting::mass, passes::more_than>(row, vocab, target, s);
  std::int32_t id = 0;
  if (chosen.found) {
    id = static_cast<std::int32_t>(~chosen.lo);
  } else {
    // The draw landed past the total (rounding): the CPU takes its last candidate in sorted
    // order, the one with the smallest key.
    unsigned long long key = ~0ull;
    for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
      if (!isnan(row[i])) key = min(key, full_key(row[i], i));
    }
    key = block_extreme<false>(key, s);
    id = key == ~0ull ? 0 : static_cast<std::int32_t>(~static_cast<std::uint32_t>(key));
  }
  if (threadIdx.x == 0) out[blockIdx.x] = id;
}

}  // namespace

status run_sampling(const sampling_params& p, const stream& s) {
  if (p.rows < 0 || p.vocab <= 0) return invalid_argument("sampling: bad shape");
  if (p.rows == 0) return {};
  sampling_kernel<<<static_cast<unsigned>(p.rows), sampling_threads, 0, native(s)>>>(p.logits, p.config, p.out, p.vocab);
  return check_launch("sampling");
}

}  // namespace edge::kernels::cuda
