#include "kernels/rmsnorm/rmsnorm.h"

#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/cuda/launchers.h"

namespace edge::kernels {
namespace {

// Lanes of the partial sums: a fixed split, so the sum's rounding is the same on every call.
constexpr std::int64_t sum_lanes = 16;

// Vector `group` of row `row`.
void normalize_row(const rmsnorm_params& p, std::int64_t row, std::int64_t group) {
  float* x = p.x + (p.row_index != nullptr ? p.row_index[row] : row) * p.x_stride + group * p.cols;
  if (p.residual != nullptr) {
    const float* r = p.residual + row * p.cols;
    for (std::int64_t i = 0; i < p.cols; ++i) x[i] += r[i];
  }
  const auto lane_sum = [&](auto term) {
    float partial[sum_lanes] = {};
    for (std::int64_t i = 0; i < p.cols; ++i) partial[i % sum_lanes] += term(x[i]);
    float sum = 0.0f;
    for (float v : partial) sum += v;
    return sum;
  };
  const float n = static_cast<float>(p.cols);
  const float mean = p.center ? lane_sum([](float v) { return v; }) / n : 0.0f;
  const float variance = lane_sum([mean](float v) { return (v - mean) * (v - mean); }) / n;
  const float inv_rms = 1.0f / std::sqrt(variance + p.eps);
  float* out = p.out + row * p.out_stride + group * p.cols;
  for (std::int64_t i = 0; i < p.cols; ++i) {
    out[i] = (x[i] - mean) * inv_rms * p.weight[i] + (p.bias != nullptr ? p.bias[i] : 0.0f);
  }
}

status check_rmsnorm(const rmsnorm_params& p) {
  if (p.cols <= 0 || p.groups <= 0 || p.x_stride < p.groups * p.cols || p.out_stride < p.groups * p.cols) {
    return invalid_argument("rmsnorm: bad shape or strides");
  }
  if (p.row_index != nullptr && p.residual != nullptr) return invalid_argument("rmsnorm: a gather takes no residual");
  if ((p.center && p.residual != nullptr) || (p.bias != nullptr && !p.center)) {
    return invalid_argument("rmsnorm: a bias only with center, which takes no residual");
  }
  if (p.groups > 1 && (p.row_index != nullptr || p.residual != nullptr)) {
    return invalid_argument("rmsnorm: groups take no residual and no gather");
  }
  return {};
}

}  // namespace

status run_rmsnorm(const rmsnorm_params& p, const stream& s) {
  EDGE_RETURN_IF_ERROR(check_rmsnorm(p));
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_rmsnorm(p, s);
  cpu::parallel_for(s, p.rows * p.groups, 8, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t i = begin; i < end; ++i) normalize_row(p, i / p.groups, i % p.groups);
  });
  return {};
}

}  // namespace edge::kernels
