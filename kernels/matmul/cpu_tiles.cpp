#include "kernels/matmul/cpu_tiles.h"

#include <cstring>

#include "edge/common/format.h"
#include "edge/common/thread_pool.h"

namespace edge::kernels {
namespace {

// Calls word(tiled byte, row byte or -1) for every 4-byte word and scale(tiled index, row
// index or -1) for every scale of tiles [tile_begin, tile_end); -1 marks padding, which has no
// counterpart in the row layout.
template <class Word, class Scale>
void walk_tiles(weight_format format, std::int64_t group_size, std::int64_t n, std::int64_t k, std::int64_t tile_begin,
                std::int64_t tile_end, const Word& word, const Scale& scale) {
  const bool int4 = format == weight_format::int4;
  const std::int64_t spans = cpu_tiles::spans(format, k);
  const std::int64_t span_elements = cpu_tiles::span_elements(format);
  const std::int64_t lane_elements = int4 ? int4_traits::chunk_elements : cpu_tiles::lanes;
  const std::int64_t row_bytes = int4 ? int4_row_bytes(k) : k;
  const std::int64_t row_group = int4 ? group_size : int8_traits::group_size;
  const std::int64_t row_groups = k / row_group;
  const std::int64_t per_span = cpu_tiles::scales_per_span(format, group_size);
  const std::int64_t span_group = cpu_tiles::span_group(format, group_size);
  for (std::int64_t t = tile_begin; t < tile_end; ++t) {
    for (std::int64_t s = 0; s < spans; ++s) {
      for (std::int64_t r = 0; r < cpu_tiles::rows; ++r) {
        const std::int64_t slot = (t * spans + s) * cpu_tiles::rows + r;
        const std::int64_t row = t * cpu_tiles::rows + r;
        for (std::int64_t lane = 0; lane < cpu_tiles::lanes; ++lane) {
          const std::int64_t first = s * span_elements + lane * lane_elements;  // the lane's first element
          // INT4: the chunk's 16 bytes; INT8: the piece's 16 codes.
          const std::int64_t at = int4 ? first / int4_traits::chunk_elements * int4_traits::chunk_bytes : first;
          const bool present = row < n && first < k;
          for (std::int64_t w = 0; w < 4; ++w) {
            word(slot * cpu_tiles::span_bytes + (w * cpu_tiles::lanes + lane) * cpu_tiles::lane_bytes,
                 present ? row * row_bytes + at + w * cpu_tiles::lane_bytes : std::int64_t{-1});
          }
        }
        for (std::int64_t q = 0; q < per_span; ++q) {
          const std::int64_t element = s * span_elements + q * span_group;
          scale(slot * per_span + q, row < n && element < k ? row * row_groups + element / row_group : std::int64_t{-1});
        }
      }
    }
  }
}

// Runs body(tile_begin, tile_end) over the tiles of an n-row matrix, on `pool` when given.
template <class Body>
void over_tiles(std::int64_t n, thread_pool* pool, const Body& body) {
  const std::int64_t tiles = cpu_tiles::tiles(n);
  if (pool == nullptr) {
    body(std::int64_t{0}, tiles);
    return;
  }
  pool->parallel_for(0, static_cast<std::size_t>(tiles), 0, [&](std::size_t begin, std::size_t end) {
    body(static_cast<std::int64_t>(begin), static_cast<std::int64_t>(end));
  });
}

status check(const weight_view& w, weight_layout layout, std::int64_t n, std::int64_t k) {
  if (!cpu_tiles::takes(w.format, w.group_size)) {
    return invalid_argument(format("CPU row tiles hold INT4 with groups of 32 or more and INT8, not {} (group {})",
                                   to_string(w.format), w.group_size));
  }
  if (w.layout != layout) return invalid_argument("CPU row tiles: the matrix is not in the layout converted from");
  if (n < 0 || k <= 0 || (w.format == weight_format::int4 && !valid_int4_group_size(w.group_size, k)) ||
      (w.format == weight_format::int8 && k % int8_traits::group_size != 0)) {
    return invalid_argument(format("CPU row tiles: bad shape [{}, {}] for group {}", n, k, w.group_size));
  }
  return {};
}

}  // namespace

status pack_cpu_tiles(const weight_view& rows, std::int64_t n, std::int64_t k, void* values, float* scales,
                      thread_pool* pool) {
  EDGE_RETURN_IF_ERROR(check(rows, weight_layout::rows, n, k));
  const auto* from = static_cast<const std::uint8_t*>(rows.values);
  auto* to = static_cast<std::uint8_t*>(values);
  const std::uint8_t padding =
      rows.format == weight_format::int4 ? static_cast<std::uint8_t>(int4_traits::code_offset * 0x11) : 0;
  over_tiles(n, pool, [&](std::int64_t begin, std::int64_t end) {
    walk_tiles(
        rows.format, rows.group_size, n, k, begin, end,
        [&](std::int64_t tiled, std::int64_t row) {
          if (row < 0) {
            std::memset(to + tiled, padding, cpu_tiles::lane_bytes);
          } else {
            std::memcpy(to + tiled, from + row, cpu_tiles::lane_bytes);
          }
        },
        [&](std::int64_t tiled, std::int64_t row) { scales[tiled] = row < 0 ? 0.0f : rows.scales[row]; });
  });
  return {};
}

status unpack_cpu_tiles(const weight_view& tiles, std::int64_t n, std::int64_t k, void* values, float* scales,
                        thread_pool* pool) {
  EDGE_RETURN_IF_ERROR(check(tiles, weight_layout::cpu_tiles, n, k));
  const auto* from = static_cast<const std::uint8_t*>(tiles.values);
  auto* to = static_cast<std::uint8_t*>(values);
  over_tiles(n, pool, [&](std::int64_t begin, std::int64_t end) {
    walk_tiles(
        tiles.format, tiles.group_size, n, k, begin, end,
        [&](std::int64_t tiled, std::int64_t row) {
          if (row >= 0) std::memcpy(to + row, from + tiled, cpu_tiles::lane_bytes);
        },
        [&](std::int64_t tiled, std::int64_t row) {
          if (row >= 0) scales[row] = tiles.scales[tiled];
        });
  });
  return {};
}

}  // namespace edge::kernels
