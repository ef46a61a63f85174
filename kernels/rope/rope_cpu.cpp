#include "kernels/rope/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/cpu/parallel.h"
#include "kernels/cuda/launchers.h"

namespace edge::kernels {

namespace {

// The pair index (fractional) at which a frequency turns `rotations` times over `positions`.
double yarn_pair_turning(double rotations, std::int64_t head_dim, double theta, double positions) {
  return static_cast<double>(head_dim) * std::log(positions / (rotations * 2.0 * std::numbers::pi)) /
         (2.0 * std::log(theta));
}

}  // namespace

std::vector<float> rope_inv_freq(std::int64_t head_dim, double theta,
                                 const std::optional<rope_llama3_scaling>& scaling,
                                 const std::optional<rope_yarn_scaling>& yarn) {
  const std::int64_t pairs = head_dim / 2;
  std::vector<float> inv_freq(static_cast<std::size_t>(pairs));
  // YaRN's ramp runs from pair `low` (the faster pairs before it keep their frequency) to pair
  // `high` (the slower pairs after it are interpolated).
  double low = 0.0;
  double high = 0.0;
  if (yarn) {
    low = yarn_pair_turning(yarn->beta_fast, head_dim, theta, yarn->original_max_position);
    high = yarn_pair_turning(yarn->beta_slow, head_dim, theta, yarn->original_max_position);
    if (yarn->truncate) {
      low = std::floor(low);
      high = std::ceil(high);
    }
    low = std::max(low, 0.0);
    high = std::min(high, static_cast<double>(head_dim - 1));
    if (low == high) high += 0.001;  // a ramp of width zero would divide by zero
  }
  for (std::int64_t i = 0; i < pairs; ++i) {
    double f = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
    if (yarn) {
      // ramp 0 keeps the frequency (extrapolation), ramp 1 divides it by the factor.
      const double ramp = std::clamp((static_cast<double>(i) - low) / (high - low), 0.0, 1.0);
      f = f / yarn->factor * ramp + f * (1.0 - ramp);
    }
    if (scaling) {
      // Llama 3.1: wavelengths longer than the original context / low_freq_factor are
      // stretched by `factor`, those shorter than context / high_freq_factor kept, and the
      // band between blended linearly in context / wavelength.
      const double wavelength = 2.0 * std::numbers::pi / f;
      const double low_freq_wavelength = scaling->original_max_position / scaling->low_freq_factor;
      const double high_freq_wavelength = scaling->original_max_position / scaling->high_freq_factor;
      if (wavelength > low_freq_wavelength) {
        f /= scaling->factor;
      } else if (wavelength >= high_freq_wavelength) {
        const double smooth = (scaling->original_max_position / wavelength - scaling->low_freq_factor) /
                              (scaling->high_freq_factor - scaling->low_freq_factor);
        f = (1.0 - smooth) * f / scaling->factor + smooth * f;
      }
    }
    inv_freq[static_cast<std::size_t>(i)] = static_cast<float>(f);
  }
  return inv_freq;
}

status run_rope(const rope_params& p, const stream& s) {
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_rope(p, s);
  const std::int64_t rotated = detail::rope_rotated(p);
  if (rotated == 0) return invalid_argument("rope: the rotated width must be even and at most head_dim");
  const std::int64_t pairs = rotated / 2;
  cpu::parallel_for(s, p.tokens, 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      const float position = static_cast<float>(p.positions[t]);
      float* row = p.x + t * p.x_stride;
      for (std::int64_t i = 0; i < pairs; ++i) {
        // The angle is rounded to float before cos/sin, as the reference implementations do.
        const float angle = position * p.inv_freq[i];
        const float c = std::cos(angle);
        const float sn = std::sin(angle);
        const std::int64_t a = p.pairs == rope_pairs::adjacent ? 2 * i : i;
        const std::int64_t b = p.pairs == rope_pairs::adjacent ? 2 * i + 1 : i + pairs;
        for (std::int64_t h = 0; h < p.heads; ++h) {
          float* head = row + h * p.head_dim;
          const float x0 = head[a];
          const float x1 = head[b];
          head[a] = (x0 * c - x1 * sn) * p.scale;
          head[b] = (x0 * sn + x1 * c) * p.scale;
        }
      }
    }
  });
  return {};
}

}  // namespace edge::kernels
