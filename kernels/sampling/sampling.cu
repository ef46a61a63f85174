// CUDA sampling: one block of 1024 threads per row of logits, the same steps and order as the
// CPU reference (temperature, top-k, softmax, min-p, top-p, draw), with the row's uniform
// number deciding the draw, so a seeded request picks the same token on either device unless
// the draw falls within rounding of a boundary between two tokens.
//
// The CPU sorts candidates; here every "first items in sorted order" question is answered by
// the radix selection of sampling_keys.h: a pass over the row per 8-bit digit of the key, each
// filling a 256-bin histogram in shared memory (8 copies, one per 4 warps, to spread the
// atomics), then one warp choosing the digit. Greedy rows are a plain argmax (lowest index
// among equal maxima, NaN never chosen).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"
#include "kernels/sampling/sampling_keys.h"

namespace edge::kernels::cuda {
namespace {

namespace keys = sampling_keys;

constexpr int sampling_threads = 1024;
constexpr int sampling_warps = sampling_threads / warp_size;
constexpr int histogram_copies = 8;
constexpr int bins_per_lane = keys::radix_bins / warp_size;
static_assert(keys::radix_bins % warp_size == 0);

struct block_scratch {
  double sums[sampling_warps];
  float values[sampling_warps];
  std::int32_t ids[sampling_warps];
  unsigned long long keys[sampling_warps];
};

// One level's histogram and the digit chosen from it (about 27 KiB).
struct radix_scratch {
  unsigned long long copy_weights[histogram_copies][keys::radix_bins];
  std::uint32_t copy_counts[histogram_copies][keys::radix_bins];
  unsigned long long weights[keys::radix_bins];
  std::uint32_t counts[keys::radix_bins];
  unsigned long long total;
  int choice_digit;  // the chosen digit_choice, held as plain fields (no initialisers in shared memory)
  unsigned long long choice_above;
  std::uint32_t only;
};

// The smallest 64-bit key over the block.
__device__ unsigned long long block_min(unsigned long long v, block_scratch& s) {
#pragma unroll
  for (int offset = warp_size / 2; offset > 0; offset /= 2) v = min(v, __shfl_xor_sync(full_warp, v, offset));
  const int warp = static_cast<int>(threadIdx.x) / warp_size;
  const int lane = static_cast<int>(threadIdx.x) % warp_size;
  __syncthreads();
  if (lane == 0) s.keys[warp] = v;
  __syncthreads();
  for (int w = 0; w < sampling_warps; ++w) v = min(v, s.keys[w]);
  return v;
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

// The kept items (non-NaN) of a row, weighted by count or by fixed-point probability mass: the
// passes keys::find_boundary asks for, each run by every thread of the block in step.
template <bool Mass>
struct block_passes {
  const float* row;  // [vocab]
  std::int64_t vocab;
  radix_scratch& s;

  __device__ void histogram(bool low_half, std::uint32_t hi, std::uint32_t lo, int level) {
    for (int i = static_cast<int>(threadIdx.x); i < histogram_copies * keys::radix_bins; i += sampling_threads) {
      (&s.copy_weights[0][0])[i] = 0;
      (&s.copy_counts[0][0])[i] = 0;
    }
    __syncthreads();
    const int copy = static_cast<int>(threadIdx.x) / warp_size % histogram_copies;
    for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
      const float v = row[i];
      if (isnan(v)) continue;
      const std::uint32_t h = keys::ordered_bits(v);
      std::uint32_t key = h;
      if (!low_half) {
        if (!keys::matches(h, hi, level)) continue;
      } else {
        key = keys::id_key(i);
        if (h != hi || !keys::matches(key, lo, level)) continue;
      }
      const int d = keys::digit(key, level);
      atomicAdd(&s.copy_counts[copy][d], 1u);
      if constexpr (Mass) atomicAdd(&s.copy_weights[copy][d], static_cast<unsigned long long>(keys::fixed_mass(v)));
    }
    __syncthreads();
    for (int d = static_cast<int>(threadIdx.x); d < keys::radix_bins; d += sampling_threads) {
      unsigned long long w = 0;
      std::uint32_t c = 0;
      for (int k = 0; k < histogram_copies; ++k) {
        w += s.copy_weights[k][d];
        c += s.copy_counts[k][d];
      }
      s.counts[d] = c;
      s.weights[d] = Mass ? w : c;
    }
    __syncthreads();
    if (threadIdx.x < warp_size) {
      unsigned long long t = 0;
      for (int d = static_cast<int>(threadIdx.x); d < keys::radix_bins; d += warp_size) t += s.weights[d];
#pragma unroll
      for (int offset = warp_size / 2; offset > 0; offset /= 2) t += __shfl_xor_sync(full_warp, t, offset);
      if (threadIdx.x == 0) s.total = t;
    }
    __syncthreads();
  }

  __device__ std::uint64_t total() const { return s.total; }
  __device__ std::uint32_t count(int d) const { return s.counts[d]; }

  // keys::choose_digit with one warp: each lane takes 8 bins, a suffix scan over the lanes
  // gives the weight ahead of each lane's bins, and the highest lane holding a passing digit
  // holds the boundary (the weight from a digit on falls as the digit grows).
  __device__ keys::digit_choice choose(std::uint64_t above, std::uint64_t threshold, keys::passes p) {
    if (threadIdx.x < warp_size) {
      const int lane = static_cast<int>(threadIdx.x);
      unsigned long long own = 0;
#pragma unroll
      for (int j = 0; j < bins_per_lane; ++j) own += s.weights[lane * bins_per_lane + j];
      unsigned long long from_lane = own;  // this lane's bins and every higher lane's
#pragma unroll
      for (int offset = 1; offset < warp_size; offset *= 2) {
        const unsigned long long higher = __shfl_down_sync(full_warp, from_lane, offset);
        if (lane + offset < warp_size) from_lane += higher;
      }
      std::uint64_t from = above + (from_lane - own);
      keys::digit_choice mine;
      for (int j = bins_per_lane - 1; j >= 0; --j) {
        const int d = lane * bins_per_lane + j;
        const std::uint64_t at = from + s.weights[d];
        if (keys::passes_threshold(at, threshold, p)) {
          mine = {.digit = d, .above = from};
          break;
        }
        from = at;
      }
      const unsigned holders = __ballot_sync(full_warp, mine.digit >= 0);
      if (holders == 0u) {
        if (lane == 0) s.choice_digit = -1;
      } else if (lane == warp_size - 1 - __clz(holders)) {
        s.choice_digit = mine.digit;
        s.choice_above = mine.above;
      }
    }
    __syncthreads();
    const keys::digit_choice c{.digit = s.choice_digit, .above = s.choice_digit < 0 ? 0 : s.choice_above};
    __syncthreads();  // read by all before the next choice is written
    return c;
  }

  __device__ std::uint32_t only_key(std::uint32_t hi) {
    for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
      if (!isnan(row[i]) && keys::ordered_bits(row[i]) == hi) s.only = keys::id_key(i);  // exactly one item
    }
    __syncthreads();
    const std::uint32_t key = s.only;
    __syncthreads();
    return key;
  }
};

struct fixed_threshold {
  std::uint64_t value;
  __device__ std::uint64_t operator()(std::uint64_t) const { return value; }
};

// The draw's threshold: its share of the kept mass.
struct draw_threshold {
  float uniform;
  __device__ std::uint64_t operator()(std::uint64_t kept) const {
    return static_cast<std::uint64_t>(static_cast<double>(uniform) * static_cast<double>(kept));
  }
};

// Drops (sets to NaN) the kept items ordered after the boundary.
__device__ void keep_from(float* row, std::int64_t vocab, const keys::boundary& b) {
  for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
    const float v = row[i];
    if (!isnan(v) && keys::after(b, keys::ordered_bits(v), keys::id_key(i))) row[i] = NAN;
  }
  __syncthreads();
}

__global__ void __launch_bounds__(sampling_threads)
    sampling_kernel(float* __restrict__ logits,                // [rows, vocab]; scratch
                    const sampling_row* __restrict__ config,   // [rows]
                    const logit_bias* __restrict__ biases,     // [Σ rows' bias_count]
                    std::int32_t* __restrict__ out,            // [rows]
                    std::int64_t vocab,
                    const std::uint32_t* __restrict__ allowed) {  // [allowed rows, allowed_words(vocab)]
  __shared__ block_scratch s;
  __shared__ radix_scratch radix;
  float* row = logits + static_cast<std::int64_t>(blockIdx.x) * vocab;
  const sampling_row c = config[blockIdx.x];
  // The row's biases, as apply_logit_bias does on the CPU: a row's ids are distinct, so each
  // entry is one thread's alone.
  for (std::int32_t i = static_cast<std::int32_t>(threadIdx.x); i < c.bias_count; i += sampling_threads) {
    const logit_bias b = biases[c.bias_begin + i];
    if (b.id < 0 || b.id >= vocab) continue;
    row[b.id] = b.bias <= logit_ban ? NAN : row[b.id] + b.bias;
  }
  __syncthreads();
  if (c.allowed_row >= 0) {
    // The grammar's mask (keep_allowed on the CPU): a token left out is a NaN from here on.
    const std::uint32_t* bits = allowed + static_cast<std::int64_t>(c.allowed_row) * ((vocab + 31) / 32);
    for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
      if (((bits[i / 32] >> (i % 32)) & 1u) == 0u) row[i] = NAN;
    }
    __syncthreads();
  }
  if (c.temperature <= 0.0f) {
    const std::int32_t id = block_argmax(row, vocab, s);
    if (threadIdx.x == 0) out[blockIdx.x] = id;
    return;
  }

  // Temperature; from here on the row holds each candidate's value, NaN for dropped ones.
  const float inv_temperature = 1.0f / c.temperature;
  double own = 0.0;
  for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
    row[i] *= inv_temperature;
    if (!isnan(row[i])) own += 1.0;
  }
  const double candidates = block_sum(own, s);
  if (candidates == 0.0) {
    if (threadIdx.x == 0) out[blockIdx.x] = 0;
    return;
  }
  if (c.top_k > 0 && static_cast<double>(c.top_k) < candidates) {
    block_passes<false> counted{.row = row, .vocab = vocab, .s = radix};
    keep_from(row, vocab,
              keys::find_boundary(counted, fixed_threshold{static_cast<std::uint64_t>(c.top_k)}, keys::passes::at_least));
  }

  // Softmax over what is left: exp in float, the total in double, as on the CPU.
  float max_value = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
    if (!isnan(row[i])) max_value = fmaxf(max_value, row[i]);
  }
  max_value = block_max(max_value, s);
  if (!isfinite(max_value)) {
    // +inf logits (or nothing but -inf) leave no distribution to draw from: the first of the
    // largest, as greedy would take it (the CPU sampler does the same).
    const std::int32_t id = block_argmax(row, vocab, s);
    if (threadIdx.x == 0) out[blockIdx.x] = id;
    return;
  }
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

  block_passes<true> weighed{.row = row, .vocab = vocab, .s = radix};
  if (c.top_p < 1.0f) {
    const keys::boundary b =
        keys::find_boundary(weighed, fixed_threshold{keys::fixed_mass(c.top_p)}, keys::passes::at_least);
    // Mass short of top_p (rounding): everything stays, as on the CPU.
    if (b.found) keep_from(row, vocab, b);
  }

  const keys::boundary chosen = keys::find_boundary(weighed, draw_threshold{c.uniform}, keys::passes::more_than);
  std::int32_t id = 0;
  if (chosen.found) {
    id = keys::id_of(chosen.lo);
  } else {
    // The draw landed past the total (rounding): the CPU takes its last candidate in sorted
    // order, the one with the smallest key.
    unsigned long long key = ~0ull;
    for (std::int64_t i = threadIdx.x; i < vocab; i += sampling_threads) {
      if (isnan(row[i])) continue;
      key = min(key, (static_cast<unsigned long long>(keys::ordered_bits(row[i])) << 32) | keys::id_key(i));
    }
    key = block_min(key, s);
    id = key == ~0ull ? 0 : keys::id_of(static_cast<std::uint32_t>(key));
  }
  if (threadIdx.x == 0) out[blockIdx.x] = id;
}

}  // namespace

status run_sampling(const sampling_params& p, const stream& s) {
  if (p.rows < 0 || p.vocab <= 0) return invalid_argument("sampling: bad shape");
  if (p.rows == 0) return {};
  sampling_kernel<<<static_cast<unsigned>(p.rows), sampling_threads, 0, native(s)>>>(p.logits, p.config, p.biases,
                                                                                     p.out, p.vocab, p.allowed);
  return check_launch("sampling");
}

}  // namespace edge::kernels::cuda
