#include "kernels/embedding/embedding.h"

#include "edge/common/format.h"
#include "kernels/cpu/load.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cuda/launchers.h"

namespace edge::kernels {

status run_embedding(const embedding_params& p, const stream& s) {
  if (s.where == device::count) {
    count_launches(s, 1);
    return {};
  }
  if (s.where == device::cuda) return cuda::run_embedding(p, s);
  for (std::int64_t t = 0; t < p.tokens; ++t) {
    if (p.ids[t] < 0 || p.ids[t] >= p.vocab) {
      return invalid_argument(format("token id {} is outside the vocabulary of {}", p.ids[t], p.vocab));
    }
  }
  const std::size_t row_bytes = static_cast<std::size_t>(p.hidden) * dtype_size(p.table_type);
  cpu::parallel_for(s, p.tokens, 16, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      const auto* row = static_cast<const std::byte*>(p.table) + static_cast<std::size_t>(p.ids[t]) * row_bytes;
      cpu::convert_to_float(p.table_type, row, p.hidden, p.out + t * p.hidden);
    }
  });
  return {};
}

}  // namespace edge::kernels
