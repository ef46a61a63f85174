// Parallel loops for CPU kernels: on the stream's pool when it has one, else on the caller.
#pragma once

#include <cstdint>

#include "edge/common/thread_pool.h"
#include "edge/kernels/stream.h"

namespace edge::kernels::cpu {

// Calls body(begin, end) over chunks of at most `grain` items covering [0, count).
template <class F>
void parallel_for(const stream& s, std::int64_t count, std::int64_t grain, const F& body) {
  if (count <= 0) return;
  if (s.pool == nullptr || count <= grain) {
    body(std::int64_t{0}, count);
    return;
  }
  s.pool->parallel_for(0, static_cast<std::size_t>(count), static_cast<std::size_t>(grain),
                       [&](std::size_t begin, std::size_t end) {
                         body(static_cast<std::int64_t>(begin), static_cast<std::int64_t>(end));
                       });
}

}  // namespace edge::kernels::cpu
