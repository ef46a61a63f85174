#include "kernels/matmul/integer_dot.h"

#include <algorithm>
#include <cmath>

namespace edge::kernels::cpu {

void quantize_activations(const float* x, std::int64_t tokens, std::int64_t k, std::int64_t x_stride, code_order order,
                          int8_activations& out) {
  using traits = int8_activation_traits;
  const std::int64_t padded = (k + traits::row_multiple - 1) / traits::row_multiple * traits::row_multiple;
  out.tokens = tokens;
  out.k = k;
  out.padded_k = padded;
  out.order = order;
  const auto grow = [](auto& v, std::int64_t size) {
    if (static_cast<std::int64_t>(v.size()) < size) v.resize(static_cast<std::size_t>(size));
  };
  grow(out.codes, tokens * padded);
  grow(out.scales, tokens * (padded / traits::block));
  grow(out.sums16, tokens * (padded / traits::sum_span));
  for (std::int64_t t = 0; t < tokens; ++t) {
    const float* row = x + t * x_stride;
    std::int8_t* codes = out.codes.data() + t * padded;
    float* scales = out.scales.data() + t * (padded / traits::block);
    for (std::int64_t b0 = 0; b0 < padded; b0 += traits::block) {
      const std::int64_t valid = std::clamp<std::int64_t>(k - b0, 0, traits::block);
      float amax = 0.0f;
      bool finite = true;
      for (std::int64_t i = 0; i < valid; ++i) {
        amax = std::max(amax, std::fabs(row[b0 + i]));
        finite = finite && std::isfinite(row[b0 + i]);
      }
      scales[b0 / traits::block] = finite ? amax / static_cast<float>(traits::max_code) : std::nanf("");
      const float inverse = finite && amax > 0.0f ? static_cast<float>(traits::max_code) / amax : 0.0f;
      for (std::int64_t i = 0; i < traits::block; ++i) {
        const float code = i < valid && inverse != 0.0f ? std::nearbyint(row[b0 + i] * inverse) : 0.0f;
        codes[b0 + i] = static_cast<std::int8_t>(std::clamp(code, -static_cast<float>(traits::max_code),
                                                            static_cast<float>(traits::max_code)));
      }
    }
    std::int32_t* sums = out.sums16.data() + t * (padded / traits::sum_span);
    for (std::int64_t s = 0; s < padded; s += traits::sum_span) {
      std::int32_t sum = 0;
      for (std::int64_t i = 0; i < traits::sum_span; ++i) sum += codes[s + i];
      sums[s / traits::sum_span] = sum;
    }
  }
}

}  // namespace edge::kernels::cpu
