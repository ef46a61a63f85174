// The inputs of a case (kernel_cases.h), built once on the host with the CPU kernels, and the
// plain double-precision references the CPU suite holds the CPU kernels to. The mutation test
// builds its "wrong kernels" from these references too: the same sums with one thing changed.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "edge/common/status.h"
#include "edge/common/thread_pool.h"
#include "edge/kernels/numerics.h"
#include "kernel_cases.h"
#include "kernels/kv_cache_write/kv_cache_write.h"
#include "kernels/matmul/matmul.h"
#include "kernels/paged_attention/paged_attention.h"
#include "kernels/quantize/quantize.h"

namespace edge::kernel_cases {

inline void require_ok(const status& s, const char* what) {
  if (!s.ok()) throw std::runtime_error(std::string(what) + ": " + s.to_string());
}

inline float bf16_round(float v) { return kernels::bf16_to_float(kernels::float_to_bf16(v)); }

// Host storage of floats in a plain dtype.
inline std::vector<std::uint8_t> encode(const std::vector<float>& v, dtype type) {
  std::vector<std::uint8_t> out(v.size() * kernels::dtype_size(type));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (type == dtype::f32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else if (type == dtype::bf16) {
      const std::uint16_t b = kernels::float_to_bf16(v[i]);
      std::memcpy(&out[i * 2], &b, 2);
    } else if (type == dtype::f16) {
      const std::uint16_t b = kernels::float_to_fp16(v[i]);
      std::memcpy(&out[i * 2], &b, 2);
    } else {
      out[i] = kernels::float_to_fp8_e4m3(v[i]);
    }
  }
  return out;
}

// Element i of host storage in a plain dtype, as float.
inline float decode(const std::uint8_t* bytes, dtype type, std::size_t i) {
  if (type == dtype::f32) {
    float v = 0.0f;
    std::memcpy(&v, bytes + 4 * i, 4);
    return v;
  }
  if (type == dtype::fp8_e4m3) return kernels::fp8_e4m3_to_float(bytes[i]);
  std::uint16_t bits = 0;
  std::memcpy(&bits, bytes + 2 * i, 2);
  return type == dtype::bf16 ? kernels::bf16_to_float(bits) : kernels::fp16_to_float(bits);
}

// ---- matmul -----------------------------------------------------------------------------------

struct host_weights {
  weight_format format = weight_format::f32;
  std::int64_t n = 0, k = 0;
  std::vector<std::uint8_t> values;
  std::vector<float> scales;
  std::int64_t group_size = 0;
  std::vector<float> dense;  // the dequantized matrix [n, k]

  kernels::weight_view view() const {
    return {.format = format, .values = values.data(), .scales = scales.empty() ? nullptr : scales.data(),
            .group_size = group_size};
  }
  // The dense matrix these values give with other scales (the mutation test's wrong scales).
  std::vector<float> dense_with(const std::vector<float>& other_scales, const kernels::stream& s) const {
    std::vector<float> out(dense.size());
    kernels::weight_view v = view();
    v.scales = other_scales.data();
    require_ok(kernels::run_dequantize({.w = v, .k = k, .row_begin = 0, .rows = n, .y = out.data(), .y_stride = k}, s),
               "dequantize");
    return out;
  }
};

// Row r of a matrix, as the floats every kernel multiplies (weight_format.h): plain elements
// widened, E4M3(code) · the row's scale, float(q) · the group's scale.
inline void weight_row(const host_weights& w, std::int64_t r, float* out) {
  const std::int64_t k = w.k;
  if (w.format == weight_format::int4) {
    const std::uint8_t* row = w.values.data() + r * kernels::int4_row_bytes(k);
    const float* scales = w.scales.data() + r * (k / w.group_size);
    const int group_shift = std::countr_zero(static_cast<std::uint64_t>(w.group_size));
    for (std::int64_t chunk = 0; chunk * 32 < k; ++chunk) {
      for (std::int64_t i = 0; i < 16; ++i) {
        const std::uint8_t byte = row[chunk * 16 + i];
        const std::int64_t low = chunk * 32 + i, high = low + 16;
        if (low < k) out[low] = static_cast<float>((byte & 0x0F) - 8) * scales[low >> group_shift];
        if (high < k) out[high] = static_cast<float>((byte >> 4) - 8) * scales[high >> group_shift];
      }
    }
  } else if (w.format == weight_format::fp8_e4m3) {
    static const std::vector<float> codes = [] {
      std::vector<float> table(256);
      for (int c = 0; c < 256; ++c) table[static_cast<std::size_t>(c)] = kernels::fp8_e4m3_to_float(static_cast<std::uint8_t>(c));
      return table;
    }();
    const std::uint8_t* row = w.values.data() + r * k;
    const float scale = w.scales[static_cast<std::size_t>(r)];
    for (std::int64_t j = 0; j < k; ++j) out[j] = codes[row[j]] * scale;
  } else if (w.format == weight_format::bf16) {
    const std::uint8_t* row = w.values.data() + 2 * r * k;
    for (std::int64_t j = 0; j < k; ++j) {
      std::uint16_t bits = 0;
      std::memcpy(&bits, row + 2 * j, 2);
      out[j] = kernels::bf16_to_float(bits);
    }
  } else {
    const dtype type = *kernels::element_dtype(w.format);
    for (std::int64_t j = 0; j < k; ++j) out[j] = decode(w.values.data(), type, static_cast<std::size_t>(r * k + j));
  }
}

inline host_weights make_weights(weight_format f, std::int64_t n, std::int64_t k, std::int64_t group_size,
                                 std::uint32_t seed, const kernels::stream& s) {
  host_weights w{.format = f, .n = n, .k = k};
  if (f == weight_format::int4) w.group_size = group_size > 0 ? group_size : kernels::int4_group_size_for(k);
  const auto x = weight_values(n, k, w.group_size, seed);
  if (kernels::is_quantized(f)) {
    w.values.resize(static_cast<std::size_t>(kernels::weight_values_bytes(f, n, k)));
    w.scales.resize(static_cast<std::size_t>(kernels::weight_scale_count(f, n, k, w.group_size)));
    require_ok(kernels::run_quantize({.x = x.data(), .rows = n, .k = k, .x_stride = k, .format = f,
                                      .group_size = w.group_size, .values = w.values.data(), .scales = w.scales.data()},
                                     s),
               "quantize");
  } else {
    w.values = encode(x, *kernels::element_dtype(f));
  }
  w.dense.resize(static_cast<std::size_t>(n * k));
  require_ok(kernels::run_dequantize({.w = w.view(), .k = k, .row_begin = 0, .rows = n, .y = w.dense.data(), .y_stride = k}, s),
             "dequantize");
  return w;
}

inline host_weights make_weights(const matmul_case& c, std::uint32_t seed, const kernels::stream& s) {
  return make_weights(c.format, c.n, c.k, c.group_size, seed, s);
}

// y = x · wᵀ over a dense [n, k] matrix, in f32 on the CPU kernel (the mutation test's sums:
// their own rounding is far below what it compares).
inline std::vector<float> dense_matmul(const std::vector<float>& x, const std::vector<float>& dense, std::int64_t tokens,
                                       std::int64_t n, std::int64_t k, std::int64_t x_stride, const kernels::stream& s) {
  std::vector<float> y(static_cast<std::size_t>(tokens * n));
  require_ok(kernels::run_matmul({.x = x.data(), .w = {.format = weight_format::f32, .values = dense.data()},
                                  .y = y.data(), .tokens = tokens, .n = n, .k = k, .x_stride = x_stride, .y_stride = n,
                                  .exact_activations = true},
                                 s),
             "dense matmul");
  return y;
}

// Every element squared (products_l2 takes the weights squared, made once per matrix).
inline std::vector<float> squared(const std::vector<float>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = v[i] * v[i];
  return out;
}

// sqrt(sum_k (x_k w_k)^2) of every output [tokens, n]: matmul_error's denominator.
inline std::vector<float> products_l2(const std::vector<float>& x, const std::vector<float>& dense_squared,
                                      std::int64_t tokens, std::int64_t n, std::int64_t k, std::int64_t x_stride,
                                      const kernels::stream& s) {
  auto y = dense_matmul(squared(x), dense_squared, tokens, n, k, x_stride, s);
  for (auto& v : y) v = std::sqrt(v);
  return y;
}

// The plain double-precision y = x · wᵀ (+ bias) over the dense matrix, and each output's
// sqrt(sum_k (x_k w_k)^2) (matmul_error's denominator).
struct exact_products {
  std::vector<double> y;   // [tokens, n]
  std::vector<double> l2;  // [tokens, n]
};

inline exact_products exact_matmul(const float* x, const host_weights& w, const float* bias, std::int64_t tokens,
                                   std::int64_t x_stride) {
  exact_products out;
  out.y.resize(static_cast<std::size_t>(tokens * w.n));
  out.l2.resize(out.y.size());
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float* xr = x + t * x_stride;
    for (std::int64_t r = 0; r < w.n; ++r) {
      const float* wr = w.dense.data() + r * w.k;
      double sum = 0.0, squares = 0.0;
      for (std::int64_t j = 0; j < w.k; ++j) {
        const double product = static_cast<double>(xr[j]) * wr[j];
        sum += product;
        squares += product * product;
      }
      if (bias != nullptr) sum += bias[r];
      const auto at = static_cast<std::size_t>(t * w.n + r);
      out.y[at] = sum;
      out.l2[at] = std::sqrt(squares);
    }
  }
  return out;
}

// The largest matmul_error over a [tokens, n] output.
inline double worst_matmul_error(const std::vector<float>& y, const std::vector<float>& y_ref,
                                 const std::vector<float>& l2, const float* bias, const float* y0, std::int64_t tokens,
                                 std::int64_t n) {
  double worst = 0.0;
  for (std::int64_t t = 0; t < tokens; ++t) {
    for (std::int64_t r = 0; r < n; ++r) {
      const auto at = static_cast<std::size_t>(t * n + r);
      const double added = (bias != nullptr ? std::fabs(bias[r]) : 0.0) + (y0 != nullptr ? std::fabs(y0[at]) : 0.0);
      worst = std::max(worst, matmul_error(y[at], y_ref[at], l2[at], added));
    }
  }
  return worst;
}

// ---- paged attention --------------------------------------------------------------------------

// A batch over a paged cache, written by the CPU's kv_cache_write: decode tokens at the ends of
// the first sequences (in runs of one) and a prefill chunk of the last; blocks handed out in a
// shuffled order, each sequence's table right after the previous one's. Every (position, K or
// V, KV head) row has its own magnitude (x 2^U(-3, 3)), so K and V scales differ per row.
struct attention_problem {
  attention_case c;
  std::int64_t heads = 0, kv_dim = 0, num_blocks = 0, tokens = 0, positions = 0;
  float scale = 0.0f;
  std::vector<std::int32_t> tables, table_begin, seq, pos, run_begin;
  std::vector<std::int64_t> slots;
  std::vector<std::uint8_t> k_cache, v_cache;
  std::vector<float> k_scales, v_scales;
  std::vector<float> q;

  bool scaled() const { return kernels::kv_cache_scaled(c.kv); }
  std::int64_t num_seqs() const { return static_cast<std::int64_t>(c.contexts.size()); }

  // The parameters over these (host) arrays; a caller swaps in device copies.
  kernels::paged_attention_params params(float* out) const {
    return {.q = q.data(), .out = out, .k_cache = k_cache.data(), .v_cache = v_cache.data(),
            .k_scales = scaled() ? k_scales.data() : nullptr, .v_scales = scaled() ? v_scales.data() : nullptr,
            .kv_type = c.kv, .seq = seq.data(), .pos = pos.data(), .block_tables = tables.data(),
            .table_begin = table_begin.data(), .tokens = tokens, .num_heads = heads, .num_kv_heads = c.kv_heads,
            .head_dim = c.head_dim, .block_size = c.block_size, .num_blocks = num_blocks,
            .q_stride = heads * c.head_dim, .out_stride = heads * c.head_dim, .scale = scale};
  }

  // The cache row of (sequence s, position p, KV head h): its index among the scales, and times
  // head_dim among the elements.
  std::int64_t row(std::int64_t s, std::int64_t p, std::int64_t h) const {
    const std::int64_t slot = slots_begin(s) + p;
    const std::int64_t cache_slot = slots[static_cast<std::size_t>(slot)];
    const std::int64_t block = cache_slot / c.block_size;
    return (block * c.kv_heads + h) * c.block_size + cache_slot % c.block_size;
  }
  std::int64_t slots_begin(std::int64_t s) const {
    std::int64_t at = 0;
    for (std::int64_t i = 0; i < s; ++i) at += c.contexts[static_cast<std::size_t>(i)];
    return at;
  }
  // An element of the cache as the kernels read it, without its row's scale.
  float code(const std::vector<std::uint8_t>& cache, std::int64_t element) const {
    const auto e = static_cast<std::size_t>(element);
    if (c.kv == dtype::fp8_e4m3) return kernels::fp8_e4m3_to_float(cache[e]);
    std::uint16_t bits = 0;
    std::memcpy(&bits, &cache[2 * e], 2);
    return c.kv == dtype::bf16 ? kernels::bf16_to_float(bits) : kernels::fp16_to_float(bits);
  }
};

inline attention_problem make_attention_problem(const attention_case& c, std::uint32_t seed, const kernels::stream& s) {
  attention_problem p{.c = c};
  p.heads = c.kv_heads * c.group;
  p.kv_dim = c.kv_heads * c.head_dim;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  block_tables t = shuffled_block_tables(c.contexts, c.block_size, seed);
  p.tables = std::move(t.tables);
  p.table_begin = std::move(t.table_begin);
  p.num_blocks = t.num_blocks;
  for (std::size_t q = 0; q < c.contexts.size(); ++q) {
    for (std::int64_t pos = 0; pos < c.contexts[q]; ++pos) {
      p.slots.push_back(p.tables[static_cast<std::size_t>(p.table_begin[q] + pos / c.block_size)] * c.block_size +
                        pos % c.block_size);
    }
    p.positions += c.contexts[q];
  }
  const auto kv = scaled_floats(static_cast<std::size_t>(p.positions * 2 * p.kv_dim), seed + 1,
                                static_cast<std::size_t>(c.head_dim), 3.0f);
  const std::size_t elements = static_cast<std::size_t>(p.num_blocks * c.kv_heads * c.block_size * c.head_dim);
  p.k_cache.assign(elements * kernels::dtype_size(c.kv), 0);
  p.v_cache.assign(elements * kernels::dtype_size(c.kv), 0);
  p.k_scales.assign(static_cast<std::size_t>(p.num_blocks * c.kv_heads * c.block_size), 0.0f);
  p.v_scales.assign(p.k_scales.size(), 0.0f);
  require_ok(kernels::run_kv_cache_write({.k = kv.data(), .v = kv.data() + p.kv_dim, .k_cache = p.k_cache.data(),
                                          .v_cache = p.v_cache.data(),
                                          .k_scales = p.scaled() ? p.k_scales.data() : nullptr,
                                          .v_scales = p.scaled() ? p.v_scales.data() : nullptr, .kv_type = c.kv,
                                          .slots = p.slots.data(), .tokens = p.positions, .num_kv_heads = c.kv_heads,
                                          .head_dim = c.head_dim, .block_size = c.block_size,
                                          .num_blocks = p.num_blocks, .kv_stride = 2 * p.kv_dim},
                                         s),
             "kv cache write");
  const auto last = static_cast<std::int32_t>(c.contexts.size() - 1);
  for (std::int32_t q = 0; q < last; ++q) {
    p.run_begin.push_back(static_cast<std::int32_t>(p.seq.size()));
    p.seq.push_back(q);
    p.pos.push_back(static_cast<std::int32_t>(c.contexts[static_cast<std::size_t>(q)] - 1));
  }
  p.run_begin.push_back(static_cast<std::int32_t>(p.seq.size()));
  for (std::int64_t i = 0; i < c.chunk; ++i) {
    p.seq.push_back(last);
    p.pos.push_back(static_cast<std::int32_t>(c.contexts.back() - c.chunk + i));
  }
  p.run_begin.push_back(static_cast<std::int32_t>(p.seq.size()));
  p.tokens = static_cast<std::int64_t>(p.seq.size());
  // Each query head's row times its own 2^U(-1, 1).
  p.q = scaled_floats(static_cast<std::size_t>(p.tokens * p.heads * c.head_dim), seed + 2,
                      static_cast<std::size_t>(c.head_dim), 1.0f);
  return p;
}

// How a reference attention computes: exactly (double), or as the tensor cores do (q, K and the
// softmax weights rounded to bf16), or with one of the bugs the mutation test injects.
enum class attention_flaw {
  none,
  kv_scales_swapped,     // K rows read with V's scales and V rows with K's
  neighbour_key_scale,   // each K row read with the next row's scale
  last_key_missed,       // a tile's edge one short: the query's own position left out
};

// The largest |v| each query (token, head) attends [tokens, heads]: attention_error's denominator.
inline std::vector<double> attended_v_max(const attention_problem& p) {
  const std::int64_t hd = p.c.head_dim;
  std::vector<double> out(static_cast<std::size_t>(p.tokens * p.heads), 0.0);
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    for (std::int64_t kvh = 0; kvh < p.c.kv_heads; ++kvh) {
      double m = 0.0;
      for (std::int64_t j = 0; j <= p.pos[static_cast<std::size_t>(t)]; ++j) {
        const std::int64_t row = p.row(p.seq[static_cast<std::size_t>(t)], j, kvh);
        const double scale = p.scaled() ? p.v_scales[static_cast<std::size_t>(row)] : 1.0;
        for (std::int64_t d = 0; d < hd; ++d) m = std::max(m, std::fabs(p.code(p.v_cache, row * hd + d) * scale));
      }
      for (std::int64_t g = 0; g < p.c.group; ++g) out[static_cast<std::size_t>(t * p.heads + kvh * p.c.group + g)] = m;
    }
  }
  return out;
}

struct attention_reference {
  std::vector<double> out;    // [tokens, heads, head_dim]
  std::vector<double> v_max;  // [tokens, heads]: the largest |v| the query attends
};

inline attention_reference reference_attention(const attention_problem& p, bool bf16_tensor_cores,
                                               attention_flaw flaw = attention_flaw::none,
                                               thread_pool* pool = nullptr) {
  const auto& c = p.c;
  const std::int64_t hd = c.head_dim;
  attention_reference r;
  r.out.assign(static_cast<std::size_t>(p.tokens * p.heads * hd), 0.0);
  r.v_max = attended_v_max(p);
  const std::size_t scale_count = p.k_scales.size();
  const auto k_scale = [&](std::int64_t row) -> double {
    if (!p.scaled()) return 1.0;
    if (flaw == attention_flaw::kv_scales_swapped) return p.v_scales[static_cast<std::size_t>(row)];
    if (flaw == attention_flaw::neighbour_key_scale) return p.k_scales[std::min(static_cast<std::size_t>(row + 1), scale_count - 1)];
    return p.k_scales[static_cast<std::size_t>(row)];
  };
  const auto v_scale = [&](std::int64_t row) -> double {
    if (!p.scaled()) return 1.0;
    if (flaw == attention_flaw::kv_scales_swapped) return p.k_scales[static_cast<std::size_t>(row)];
    return p.v_scales[static_cast<std::size_t>(row)];
  };
  // One query token (its heads), on any thread.
  const auto one = [&](std::int64_t t) {
    std::vector<double> scores, qv(static_cast<std::size_t>(hd));
    const std::int64_t s = p.seq[static_cast<std::size_t>(t)];
    std::int64_t last = p.pos[static_cast<std::size_t>(t)];
    if (flaw == attention_flaw::last_key_missed && last > 0) --last;
    for (std::int64_t h = 0; h < p.heads; ++h) {
      const std::int64_t kvh = h / c.group;
      const float* q = p.q.data() + (t * p.heads + h) * hd;
      for (std::int64_t d = 0; d < hd; ++d) qv[static_cast<std::size_t>(d)] = bf16_tensor_cores ? bf16_round(q[d]) : q[d];
      scores.assign(static_cast<std::size_t>(last + 1), 0.0);
      double best = -INFINITY;
      for (std::int64_t j = 0; j <= last; ++j) {
        const std::int64_t row = p.row(s, j, kvh);
        double dot = 0.0;
        for (std::int64_t d = 0; d < hd; ++d) {
          dot += qv[static_cast<std::size_t>(d)] * static_cast<double>(p.code(p.k_cache, row * hd + d));
        }
        scores[static_cast<std::size_t>(j)] = dot * k_scale(row) * p.scale;
        best = std::max(best, scores[static_cast<std::size_t>(j)]);
      }
      double total = 0.0;
      double* o = r.out.data() + (t * p.heads + h) * hd;
      for (std::int64_t j = 0; j <= last; ++j) {
        const std::int64_t row = p.row(s, j, kvh);
        const double e = std::exp(scores[static_cast<std::size_t>(j)] - best);
        total += e;
        // The tensor cores multiply V's codes by the weight times V's scale, rounded to bf16.
        const double vs = v_scale(row);
        const double w = bf16_tensor_cores ? bf16_round(static_cast<float>(e * vs)) : e * vs;
        for (std::int64_t d = 0; d < hd; ++d) o[d] += w * p.code(p.v_cache, row * hd + d);
      }
      for (std::int64_t d = 0; d < hd; ++d) o[d] /= total;
    }
  };
  if (pool != nullptr) {
    pool->parallel_for(0, static_cast<std::size_t>(p.tokens), 1, [&](std::size_t begin, std::size_t end) {
      for (std::size_t t = begin; t < end; ++t) one(static_cast<std::int64_t>(t));
    });
  } else {
    for (std::int64_t t = 0; t < p.tokens; ++t) one(t);
  }
  return r;
}

// The largest attention_error of an output against a reference.
inline double worst_attention_error(const std::vector<float>& out, const attention_reference& ref,
                                    const attention_problem& p) {
  double worst = 0.0;
  const std::int64_t hd = p.c.head_dim;
  for (std::int64_t th = 0; th < p.tokens * p.heads; ++th) {
    for (std::int64_t d = 0; d < hd; ++d) {
      const auto at = static_cast<std::size_t>(th * hd + d);
      worst = std::max(worst, attention_error(out[at], ref.out[at], ref.v_max[static_cast<std::size_t>(th)]));
    }
  }
  return worst;
}

}  // namespace edge::kernel_cases
