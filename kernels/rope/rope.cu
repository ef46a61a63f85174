// CUDA rotary embedding, both pair layouts: one thread per (token, pair, head). The angle is
// rounded to float before cosf/sinf (the accurate versions, with full range reduction), as
// the CPU reference does.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launchers.h"

namespace edge::kernels::cuda {
namespace {

constexpr int rope_threads = 256;
constexpr std::int64_t max_rope_blocks = 65535;

__global__ void rope_kernel(float* __restrict__ x,                    // [tokens, heads, head_dim], token stride x_stride
                            const std::int32_t* __restrict__ positions,  // [tokens]
                            const float* __restrict__ inv_freq,          // [rotary_dim / 2]
                            std::int64_t tokens, std::int64_t heads, std::int64_t head_dim,
                            std::int64_t rotary_dim, std::int64_t x_stride, bool adjacent, float scale) {
  const std::int64_t pairs = rotary_dim / 2;
  const std::int64_t total = tokens * pairs * heads;
  for (std::int64_t item = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; item < total;
       item += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t h = item % heads;
    const std::int64_t i = (item / heads) % pairs;
    const std::int64_t t = item / (heads * pairs);
    const float angle = static_cast<float>(positions[t]) * inv_freq[i];
    float sn = 0.0f;
    float c = 0.0f;
    sincosf(angle, &sn, &c);
    float* head = x + t * x_stride + h * head_dim;
    const std::int64_t a = adjacent ? 2 * i : i;
    const std::int64_t b = adjacent ? 2 * i + 1 : i + pairs;
    const float x0 = head[a];
    const float x1 = head[b];
    head[a] = (x0 * c - x1 * sn) * scale;
    head[b] = (x0 * sn + x1 * c) * scale;
  }
}

}  // namespace

status run_rope(const rope_params& p, const stream& s) {
  const std::int64_t rotated = detail::rope_rotated(p);
  if (rotated == 0) return invalid_argument("rope: the rotated width must be even and at most head_dim");
  const std::int64_t total = p.tokens * p.heads * (rotated / 2);
  if (total <= 0) return {};
  const std::int64_t blocks = std::min(max_rope_blocks, ceil_div(total, rope_threads));
  rope_kernel<<<static_cast<unsigned>(blocks), rope_threads, 0, native(s)>>>(
      p.x, p.positions, p.inv_freq, p.tokens, p.heads, p.head_dim, rotated, p.x_stride, p.pairs == rope_pairs::adjacent, p.scale);
  return check_launch("rope");
}

}  // namespace edge::kernels::cuda
