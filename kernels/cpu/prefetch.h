// Software prefetch for kernels that stream several weight rows at once. Hardware prefetchers
// alone leave bandwidth unused with this many interleaved streams.
#pragma once

#include <xmmintrin.h>

#include <cstdint>

namespace edge::kernels::cpu {

// How far ahead of the loads each weight row is prefetched (measured best on Zen 4: 1 KiB).
inline constexpr std::int64_t prefetch_distance = 1024;
// The same for kernels that read CPU row tiles (weight_format.h), which are one stream: bytes
// ahead of the loads in that stream.
inline constexpr std::int64_t tile_prefetch_distance = 2048;

// Prefetches byte `at` + prefetch_distance of rows n0 .. n0 + R - 1 (rows of row_bytes from
// base). Near the end of a row it moves on to the same row of the next tile (rows n0 + R ..),
// so that a tile starts with its first bytes already on the way.
template <int R>
__attribute__((always_inline)) inline void prefetch_rows(const void* base, std::int64_t row_bytes, std::int64_t n0, std::int64_t at) {
  std::int64_t ahead = at + prefetch_distance;
  std::int64_t ahead_row = n0;
  if (ahead >= row_bytes) {
    ahead -= row_bytes;
    ahead_row += R;
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    _mm_prefetch(static_cast<const char*>(base) + (ahead_row + r) * row_bytes + ahead, _MM_HINT_T0);
  }
}

}  // namespace edge::kernels::cpu
