#include "kernels/rope/rope.h"

#include <cmath>
#include <numbers>

#include "kernels/cpu/parallel.h"
#include "kernels/cuda/launchers.h"

namespace edge::kernels {

std::vector<float> rope_inv_freq(std::int64_t head_dim, double theta,
                                 const std::optional<rope_llama3_scaling>& scaling) {
  const std::int64_t pairs = head_dim / 2;
  std::vector<float> inv_freq(static_cast<std::size_t>(pairs));
  for (std::int64_t i = 0; i < pairs; ++i) {
    double f = 1.0 / std::pow(theta, static_cast<double>(2 * i) / static_cast<double>(head_dim));
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
          head[a] = x0 * c - x1 * sn;
          head[b] = x0 * sn + x1 * c;
        }
      }
    }
  });
  return {};
}

}  // namespace edge::kernels
