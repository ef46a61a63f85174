#include "kernels/silu_mul/silu_mul.h"

#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/cuda/launchers.h"

namespace edge::kernels {

status run_silu_mul(const silu_mul_params& p, const stream& s) {
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_silu_mul(p, s);
  cpu::parallel_for(s, p.rows, 4, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t r = begin; r < end; ++r) {
      const float* gate = p.gate + r * p.in_stride;
      const float* up = p.up + r * p.in_stride;
      float* out = p.out + r * p.out_stride;
      for (std::int64_t i = 0; i < p.cols; ++i) {
        const float g = gate[i];
        out[i] = g / (1.0f + std::exp(-g)) * up[i];
      }
    }
  });
  return {};
}

}  // namespace edge::kernels
