// Helpers for kernel tests: seeded random data, weight storage in any dtype, and error norms.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "edge/common/thread_pool.h"
#include "edge/kernels/dtype.h"
#include "edge/kernels/numerics.h"
#include "edge/kernels/stream.h"

namespace edge::testing {

// The kernel tests' thread pool (the machine's cores), made once, and a CPU stream on it.
inline thread_pool& kernel_test_pool() {
  static thread_pool pool(0);
  return pool;
}
inline kernels::stream cpu_stream() { return {.where = kernels::device::cpu, .pool = &kernel_test_pool()}; }

inline std::vector<float> random_floats(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Values encoded in `type`, and the floats they decode to (what a kernel actually multiplies).
struct typed_buffer {
  std::vector<std::byte> bytes;
  std::vector<float> decoded;
};

inline typed_buffer encode(const std::vector<float>& values, kernels::dtype type) {
  typed_buffer out;
  out.bytes.resize(values.size() * kernels::dtype_size(type));
  out.decoded.resize(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    switch (type) {
      case kernels::dtype::f32:
        std::memcpy(out.bytes.data() + 4 * i, &values[i], 4);
        out.decoded[i] = values[i];
        break;
      case kernels::dtype::bf16: {
        const std::uint16_t bits = kernels::float_to_bf16(values[i]);
        std::memcpy(out.bytes.data() + 2 * i, &bits, 2);
        out.decoded[i] = kernels::bf16_to_float(bits);
        break;
      }
      case kernels::dtype::f16: {
        const std::uint16_t bits = kernels::float_to_fp16(values[i]);
        std::memcpy(out.bytes.data() + 2 * i, &bits, 2);
        out.decoded[i] = kernels::fp16_to_float(bits);
        break;
      }
      case kernels::dtype::fp8_e4m3: {
        const std::uint8_t bits = kernels::float_to_fp8_e4m3(values[i]);
        std::memcpy(out.bytes.data() + i, &bits, 1);
        out.decoded[i] = kernels::fp8_e4m3_to_float(bits);
        break;
      }
    }
  }
  return out;
}

// ‖a − b‖ / ‖b‖ over the whole buffer.
inline double relative_error(const std::vector<float>& a, const std::vector<double>& b) {
  double diff = 0.0, norm = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (a[i] - b[i]) * (a[i] - b[i]);
    norm += b[i] * b[i];
  }
  return std::sqrt(diff / std::max(norm, 1e-300));
}

inline bool all_finite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

}  // namespace edge::testing
