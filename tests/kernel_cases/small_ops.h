// The inputs of the element-wise and copying kernels' cases (kernel_cases.h: embedding, rmsnorm,
// rope, silu_mul, quantize / dequantize, kv_cache_write, kv_block_copy), built the same way by
// the GPU program and the CPU suite, and their plain references: double precision from each
// op's definition (its header), or the exact bytes where the op is exact.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernel_cases.h"
#include "kernels/embedding/embedding.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/quantize/quantize.h"
#include "kernels/rmsnorm/rmsnorm.h"
#include "kernels/rope/rope.h"
#include "kernels/silu_mul/silu_mul.h"
#include "problems.h"

namespace edge::kernel_cases {

// ---- embedding --------------------------------------------------------------------------------

struct embedding_problem {
  embedding_case c;
  std::vector<std::uint8_t> table;  // [vocab, hidden] of c.table
  std::vector<std::int32_t> ids;    // [tokens]
};

// Each table row times its own magnitude, so a token given its neighbour's row reads visibly wrong.
inline embedding_problem make_embedding_problem(const embedding_case& c, std::uint32_t seed) {
  embedding_problem p{.c = c};
  p.table = encode(scaled_floats(static_cast<std::size_t>(c.vocab * c.hidden), seed, static_cast<std::size_t>(c.hidden), 2.0f),
                   c.table);
  for (std::int64_t t = 0; t < c.tokens; ++t) p.ids.push_back(static_cast<std::int32_t>((t * 37) % c.vocab));
  return p;
}

// out[t] = table[ids[t]] widened to float: exact.
inline std::vector<float> reference_embedding(const embedding_problem& p) {
  std::vector<float> out(static_cast<std::size_t>(p.c.tokens * p.c.hidden));
  for (std::int64_t t = 0; t < p.c.tokens; ++t) {
    const std::int64_t row = p.ids[static_cast<std::size_t>(t)];
    for (std::int64_t d = 0; d < p.c.hidden; ++d) {
      out[static_cast<std::size_t>(t * p.c.hidden + d)] =
          decode(p.table.data(), p.c.table, static_cast<std::size_t>(row * p.c.hidden + d));
    }
  }
  return out;
}

// ---- rmsnorm ----------------------------------------------------------------------------------

// The per-head form normalises vectors of this many values (a head of Q or K).
inline constexpr std::int64_t rmsnorm_head = 64;

struct rmsnorm_problem {
  rows_case c;
  std::vector<float> x;            // [rows, cols]: each row times its own 2^U(-2, 2)
  std::vector<float> residual;     // [rows, cols]: likewise, a magnitude of its own
  std::vector<float> weight;       // [cols]
  std::vector<float> heads;        // [rows, cols] as heads of rmsnorm_head, each its own magnitude
  std::vector<float> head_weight;  // [rmsnorm_head]
  std::vector<std::int64_t> gather;  // every third row, backwards: the rows a gather normalises

  bool per_head() const { return c.cols % rmsnorm_head == 0; }
};

inline rmsnorm_problem make_rmsnorm_problem(const rows_case& c, std::uint32_t seed) {
  rmsnorm_problem p{.c = c};
  const auto count = static_cast<std::size_t>(c.rows * c.cols);
  const auto cols = static_cast<std::size_t>(c.cols);
  test_random rng(seed);
  p.x = scaled_floats(count, seed + 1, cols, 2.0f, 3.0f);
  p.residual = scaled_floats(count, seed + 2, cols, 2.0f);
  p.heads = scaled_floats(count, seed + 3, static_cast<std::size_t>(rmsnorm_head), 2.0f, 3.0f);
  for (std::int64_t i = 0; i < c.cols; ++i) p.weight.push_back(rng.uniform(0.5f, 1.5f));
  for (std::int64_t i = 0; i < rmsnorm_head; ++i) p.head_weight.push_back(rng.uniform(0.5f, 1.5f));
  for (std::int64_t r = c.rows - 1; r >= 0; r -= 3) p.gather.push_back(r);
  return p;
}

// x / sqrt(mean(x²) + eps) · weight over one vector of `cols`.
inline std::vector<double> reference_rms_row(const float* x, const float* weight, std::int64_t cols, double eps) {
  double squares = 0.0;
  for (std::int64_t i = 0; i < cols; ++i) squares += static_cast<double>(x[i]) * x[i];
  const double inv = 1.0 / std::sqrt(squares / static_cast<double>(cols) + eps);
  std::vector<double> out(static_cast<std::size_t>(cols));
  for (std::int64_t i = 0; i < cols; ++i) out[static_cast<std::size_t>(i)] = x[i] * inv * weight[i];
  return out;
}

// The largest |out - reference| over `rows` vectors of `cols` (output vector r normalises input
// vector source(r); strides in floats).
template <class Source>
double worst_rms_error(const std::vector<float>& out, std::int64_t out_stride, const float* x, std::int64_t x_stride,
                       const float* weight, std::int64_t rows, std::int64_t cols, double eps, Source source) {
  double worst = 0.0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto want = reference_rms_row(x + source(r) * x_stride, weight, cols, eps);
    for (std::int64_t i = 0; i < cols; ++i) {
      const double d = std::fabs(out[static_cast<std::size_t>(r * out_stride + i)] - want[static_cast<std::size_t>(i)]);
      worst = std::max(worst, std::isnan(d) ? INFINITY : d);
    }
  }
  return worst;
}

// ---- rope -------------------------------------------------------------------------------------

struct rope_problem {
  rope_case c;
  std::int64_t stride = 0;               // heads · head_dim + 16: a strided view, as in fused QKV
  std::vector<float> x;                  // [tokens, stride]
  std::vector<std::int32_t> positions;   // [tokens], up to 131071
  std::vector<float> inv_freq;           // [rotated / 2], Llama 3.1's scaling

  std::int64_t rotated() const { return c.rotary_dim > 0 ? c.rotary_dim : c.head_dim; }
  kernels::rope_params params(float* rows, const std::int32_t* pos, const float* freq) const {
    return {.x = rows, .positions = pos, .inv_freq = freq, .tokens = c.tokens, .heads = c.heads,
            .head_dim = c.head_dim, .rotary_dim = c.rotary_dim, .x_stride = stride, .pairs = c.pairs};
  }
};

inline rope_problem make_rope_problem(const rope_case& c, std::uint32_t seed) {
  rope_problem p{.c = c};
  p.stride = c.heads * c.head_dim + 16;
  p.x = scaled_floats(static_cast<std::size_t>(c.tokens * p.stride), seed, 0, 0.0f);
  for (std::int64_t t = 0; t < c.tokens; ++t) p.positions.push_back(static_cast<std::int32_t>(t * 1013 % 131072));
  p.inv_freq = kernels::rope_inv_freq(p.rotated(), 500000.0, kernels::rope_llama3_scaling{8.0, 1.0, 4.0, 8192.0});
  return p;
}

// Every row rotated per rope.h: pair i of each head by position · inv_freq[i]; the elements past
// the rotated width and the stride's gap unchanged. The angle is the float product, as
// transformers computes it (position_ids.float() times inv_freq in float32): at position 10^5 its
// rounding alone moves the output by 10^-3, so a reference of the exact product would judge the
// convention rather than the kernel. Everything after it in double.
inline std::vector<double> reference_rope(const rope_problem& p) {
  std::vector<double> out(p.x.begin(), p.x.end());
  const std::int64_t pairs = p.rotated() / 2;
  for (std::int64_t t = 0; t < p.c.tokens; ++t) {
    for (std::int64_t i = 0; i < pairs; ++i) {
      const float angle = static_cast<float>(p.positions[static_cast<std::size_t>(t)]) * p.inv_freq[static_cast<std::size_t>(i)];
      const double c = std::cos(static_cast<double>(angle));
      const double s = std::sin(static_cast<double>(angle));
      const bool adjacent = p.c.pairs == kernels::rope_pairs::adjacent;
      const std::int64_t a = adjacent ? 2 * i : i;
      const std::int64_t b = adjacent ? 2 * i + 1 : i + pairs;
      for (std::int64_t h = 0; h < p.c.heads; ++h) {
        const auto at = static_cast<std::size_t>(t * p.stride + h * p.c.head_dim);
        const double x0 = p.x[at + static_cast<std::size_t>(a)];
        const double x1 = p.x[at + static_cast<std::size_t>(b)];
        out[at + static_cast<std::size_t>(a)] = x0 * c - x1 * s;
        out[at + static_cast<std::size_t>(b)] = x0 * s + x1 * c;
      }
    }
  }
  return out;
}

// ---- silu_mul ---------------------------------------------------------------------------------

struct silu_mul_problem {
  rows_case c;
  std::vector<float> gate;  // [rows, cols] in +-8: silu's saturated ends and its bend
  std::vector<float> up;    // [rows, cols] in +-1
};

inline silu_mul_problem make_silu_mul_problem(const rows_case& c, std::uint32_t seed) {
  const auto count = static_cast<std::size_t>(c.rows * c.cols);
  return {.c = c, .gate = scaled_floats(count, seed, 0, 0.0f, 8.0f), .up = scaled_floats(count, seed + 1, 0, 0.0f)};
}

// silu(gate) · up, silu(g) = g / (1 + exp(-g)).
inline std::vector<double> reference_silu_mul(const silu_mul_problem& p) {
  std::vector<double> out(p.gate.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    const double g = p.gate[i];
    out[i] = g / (1.0 + std::exp(-g)) * p.up[i];
  }
  return out;
}

// ---- quantize, dequantize ---------------------------------------------------------------------

struct quantize_problem {
  quantize_case c;
  std::int64_t group = 0;  // int4: int4_group_size_for(k)
  std::vector<float> x;    // [n, k]: weight_values, magnitudes per row and per group

  std::size_t values_bytes() const { return static_cast<std::size_t>(kernels::weight_values_bytes(c.format, c.n, c.k)); }
  std::size_t scale_count() const {
    return static_cast<std::size_t>(kernels::weight_scale_count(c.format, c.n, c.k, group));
  }
};

inline quantize_problem make_quantize_problem(const quantize_case& c, std::uint32_t seed) {
  quantize_problem p{.c = c};
  if (c.format == weight_format::int4) p.group = kernels::int4_group_size_for(c.k);
  p.x = weight_values(c.n, c.k, p.group, seed);
  return p;
}

struct quantized_bytes {
  std::vector<std::uint8_t> values;
  std::vector<float> scales;
};

// The bytes weight_format.h specifies, written out from its text. INT4: scale = amax / 7.5 per
// group, q = x / scale (a float division) rounded half to even and clamped to [-8, 7], element i
// in chunk i / 32's byte i % 16 (the low nibble when i % 32 < 16), q + 8 per nibble, the last
// chunk padded with q = 0. FP8: scale = amax / 448 per row, code = E4M3(x / scale). A zero group
// or row: scale 0, codes for 0.
inline quantized_bytes reference_quantize(const quantize_problem& p) {
  constexpr std::uint8_t int4_zeros = 0x88;  // q = 0 in both nibbles
  quantized_bytes out;
  out.scales.assign(p.scale_count(), 0.0f);
  const bool int4 = p.c.format == weight_format::int4;
  out.values.assign(p.values_bytes(), int4 ? int4_zeros : 0);
  const std::int64_t group = int4 ? p.group : p.c.k;
  const std::int64_t row_bytes = int4 ? (p.c.k + 31) / 32 * 16 : p.c.k;
  for (std::int64_t r = 0; r < p.c.n; ++r) {
    const float* x = p.x.data() + r * p.c.k;
    std::uint8_t* row = out.values.data() + r * row_bytes;
    for (std::int64_t g0 = 0; g0 < p.c.k; g0 += group) {
      float amax = 0.0f;
      for (std::int64_t i = g0; i < g0 + group; ++i) amax = std::max(amax, std::fabs(x[i]));
      const float scale = amax / (int4 ? 7.5f : 448.0f);
      out.scales[static_cast<std::size_t>((r * p.c.k + g0) / group)] = scale;
      for (std::int64_t i = g0; i < g0 + group; ++i) {
        if (!int4) {
          row[i] = scale > 0.0f ? kernels::float_to_fp8_e4m3(x[i] / scale) : std::uint8_t{0};
          continue;
        }
        const float q = scale > 0.0f ? std::clamp(std::nearbyint(x[i] / scale), -8.0f, 7.0f) : 0.0f;
        const auto code = static_cast<std::uint8_t>(static_cast<int>(q) + 8);
        std::uint8_t& byte = row[i / 32 * 16 + i % 16];
        byte = i % 32 < 16 ? static_cast<std::uint8_t>((byte & 0xF0) | code)
                           : static_cast<std::uint8_t>((byte & 0x0F) | (code << 4));
      }
    }
  }
  return out;
}

// The weights those bytes stand for: float(q) · scale, E4M3(code) · scale (one float multiply:
// exact for the test to compare).
inline std::vector<float> reference_dequantize(const quantize_problem& p, const quantized_bytes& q) {
  const bool int4 = p.c.format == weight_format::int4;
  const std::int64_t group = int4 ? p.group : p.c.k;
  const std::int64_t row_bytes = int4 ? (p.c.k + 31) / 32 * 16 : p.c.k;
  std::vector<float> out(static_cast<std::size_t>(p.c.n * p.c.k));
  for (std::int64_t r = 0; r < p.c.n; ++r) {
    const std::uint8_t* row = q.values.data() + r * row_bytes;
    for (std::int64_t i = 0; i < p.c.k; ++i) {
      const float scale = q.scales[static_cast<std::size_t>((r * p.c.k + i) / group)];
      float value = 0.0f;
      if (int4) {
        const std::uint8_t byte = row[i / 32 * 16 + i % 16];
        value = static_cast<float>((i % 32 < 16 ? byte & 0x0F : byte >> 4) - 8);
      } else {
        value = kernels::fp8_e4m3_to_float(row[i]);
      }
      out[static_cast<std::size_t>(r * p.c.k + i)] = value * scale;
    }
  }
  return out;
}

// ---- kv_cache_write ---------------------------------------------------------------------------

struct kv_write_problem {
  kv_write_case c;
  std::int64_t num_blocks = 0;
  std::int64_t kv_stride = 0;      // K and V inside a fused QKV row: 3 · kv_heads · head_dim
  std::vector<float> qkv;          // [tokens, kv_stride]: K at 0, V at kv_heads · head_dim
  std::vector<std::int64_t> slots;  // [used] ascending, every seventh slot of the cache, wrapping

  std::int64_t used() const { return static_cast<std::int64_t>(slots.size()); }
  std::int64_t kv_dim() const { return c.kv_heads * c.head_dim; }
  std::size_t cache_bytes() const {
    return static_cast<std::size_t>(num_blocks * c.kv_heads * c.block_size * c.head_dim) * kernels::dtype_size(c.kv);
  }
  std::size_t scale_count() const { return static_cast<std::size_t>(num_blocks * c.kv_heads * c.block_size); }
  bool scaled() const { return kernels::kv_cache_scaled(c.kv); }
  kernels::kv_cache_write_params params(const float* rows, const std::int64_t* slot_list, void* k_cache, void* v_cache,
                                        float* k_scales, float* v_scales) const {
    return {.k = rows, .v = c.values ? rows + kv_dim() : nullptr, .k_cache = k_cache,
            .v_cache = c.values ? v_cache : nullptr, .k_scales = scaled() ? k_scales : nullptr,
            .v_scales = scaled() && c.values ? v_scales : nullptr, .kv_type = c.kv, .slots = slot_list,
            .tokens = used(), .num_kv_heads = c.kv_heads, .head_dim = c.head_dim, .block_size = c.block_size,
            .num_blocks = num_blocks, .kv_stride = kv_stride};
  }
};

// Each (token, head) row of K and of V times its own 2^U(-3, 3) (so FP8 row scales differ); one
// zero element, and one whole zero row (its scale 0, its codes 0).
inline kv_write_problem make_kv_write_problem(const kv_write_case& c, std::uint32_t seed) {
  kv_write_problem p{.c = c};
  p.num_blocks = (c.tokens * 2 + c.block_size - 1) / c.block_size;
  p.kv_stride = 3 * p.kv_dim();
  p.qkv = scaled_floats(static_cast<std::size_t>(c.tokens * p.kv_stride), seed, static_cast<std::size_t>(c.head_dim),
                        3.0f, 4.0f);
  p.qkv[5] = 0.0f;
  std::fill_n(p.qkv.begin() + 2 * p.kv_stride, c.head_dim, 0.0f);
  for (std::int64_t t = 0; t < c.tokens; ++t) p.slots.push_back((t * 7) % (p.num_blocks * c.block_size));
  std::sort(p.slots.begin(), p.slots.end());
  p.slots.erase(std::unique(p.slots.begin(), p.slots.end()), p.slots.end());
  return p;
}

struct kv_cache_bytes {
  std::vector<std::uint8_t> k, v;  // [num_blocks, kv_heads, block_size, head_dim] of kv
  std::vector<float> k_scales, v_scales;  // [num_blocks, kv_heads, block_size]
};

// What kv_cache_write.h specifies, into caches that start as zeros: token t's row of head h at
// block slot / block_size, offset slot % block_size; FP8 rows with scale amax / 448 and codes
// E4M3(x / scale) (0 for a zero row), the other dtypes rounded to nearest even.
inline kv_cache_bytes reference_kv_cache_write(const kv_write_problem& p) {
  const auto& c = p.c;
  const std::size_t size = kernels::dtype_size(c.kv);
  kv_cache_bytes out{.k = std::vector<std::uint8_t>(p.cache_bytes(), 0),
                     .v = std::vector<std::uint8_t>(p.cache_bytes(), 0),
                     .k_scales = std::vector<float>(p.scale_count(), 0.0f),
                     .v_scales = std::vector<float>(p.scale_count(), 0.0f)};
  for (std::int64_t t = 0; t < p.used(); ++t) {
    const std::int64_t slot = p.slots[static_cast<std::size_t>(t)];
    for (int part = 0; part < (c.values ? 2 : 1); ++part) {
      for (std::int64_t h = 0; h < c.kv_heads; ++h) {
        const float* x = p.qkv.data() + t * p.kv_stride + part * p.kv_dim() + h * c.head_dim;
        const std::int64_t row = (slot / c.block_size * c.kv_heads + h) * c.block_size + slot % c.block_size;
        float scale = 1.0f;
        if (p.scaled()) {
          float amax = 0.0f;
          for (std::int64_t d = 0; d < c.head_dim; ++d) amax = std::max(amax, std::fabs(x[d]));
          scale = amax / kernels::fp8_e4m3_traits::max;
          (part == 0 ? out.k_scales : out.v_scales)[static_cast<std::size_t>(row)] = scale;
        }
        std::vector<float> values(x, x + c.head_dim);
        if (p.scaled()) {
          for (auto& v : values) v = scale > 0.0f ? v / scale : 0.0f;
        }
        const auto bytes = encode(values, c.kv);
        std::copy(bytes.begin(), bytes.end(), (part == 0 ? out.k : out.v).begin() + row * c.head_dim * static_cast<std::int64_t>(size));
      }
    }
  }
  return out;
}

// ---- kv_block_copy ----------------------------------------------------------------------------

struct block_copy_problem {
  std::size_t block_bytes = 0;
  std::int64_t layers = 3;
  std::int64_t blocks = 160;
  std::size_t layer_stride = 0;      // blocks · block_bytes rounded up to 256: aligned pools
  std::vector<std::uint8_t> bytes;   // [layers, layer_stride]
  std::vector<std::int32_t> from, to;  // 70 pairs (two launches of up to 64): i -> 80 + i

  kernels::kv_block_copy_params params(void* first_region) const {
    return {.first_region = first_region, .layer_stride = layer_stride, .block_bytes = block_bytes, .layers = layers,
            .num_blocks = blocks, .from = from.data(), .to = to.data(), .count = static_cast<std::int64_t>(from.size())};
  }
};

inline block_copy_problem make_block_copy_problem(std::size_t block_bytes, std::uint32_t seed) {
  block_copy_problem p{.block_bytes = block_bytes};
  p.layer_stride = (static_cast<std::size_t>(p.blocks) * block_bytes + 255) / 256 * 256;
  p.bytes.resize(p.layer_stride * static_cast<std::size_t>(p.layers));
  test_random rng(seed);
  for (auto& b : p.bytes) b = static_cast<std::uint8_t>(rng.next());
  for (std::int32_t i = 0; i < 70; ++i) {
    p.from.push_back(i);
    p.to.push_back(80 + i);
  }
  return p;
}

// Block to[i] of every layer a copy of block from[i]; nothing else changed.
inline std::vector<std::uint8_t> reference_block_copy(const block_copy_problem& p) {
  std::vector<std::uint8_t> out = p.bytes;
  for (std::int64_t layer = 0; layer < p.layers; ++layer) {
    const std::size_t base = static_cast<std::size_t>(layer) * p.layer_stride;
    for (std::size_t i = 0; i < p.from.size(); ++i) {
      std::memcpy(out.data() + base + static_cast<std::size_t>(p.to[i]) * p.block_bytes,
                  p.bytes.data() + base + static_cast<std::size_t>(p.from[i]) * p.block_bytes, p.block_bytes);
    }
  }
  return out;
}

}  // namespace edge::kernel_cases
