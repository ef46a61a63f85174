#include "kernels/matmul/cpu_tiles.h"

#include <cstring>

#include "edge/common/format.h"
#include "edge/common/thread_pool.h"

namespace edge::kernels {
namespace {

// The 32 codes (q) of block b of row n in the row layout, and back.
void read_block(const weight_view& w, std::int64_t k, std::int64_t n, std::int64_t b, int (&q)[cpu_tiles::block]) {
  const auto* values = static_cast<const std::uint8_t*>(w.values);
  if (w.format == weight_format::int8) {
    const auto* codes = reinterpret_cast<const std::int8_t*>(values) + n * k + b * cpu_tiles::block;
    for (std::int64_t e = 0; e < cpu_tiles::block; ++e) q[e] = codes[e];
    return;
  }
  const std::uint8_t* chunk = values + n * int4_row_bytes(k) + b * int4_traits::chunk_bytes;
  for (std::int64_t e = 0; e < cpu_tiles::block; ++e) q[e] = int4_get(chunk, e);
}

void write_block(void* values, weight_format format, std::int64_t k, std::int64_t n, std::int64_t b,
                 const int (&q)[cpu_tiles::block]) {
  if (format == weight_format::int8) {
    auto* codes = static_cast<std::int8_t*>(values) + n * k + b * cpu_tiles::block;
    for (std::int64_t e = 0; e < cpu_tiles::block; ++e) codes[e] = static_cast<std::int8_t>(q[e]);
    return;
  }
  std::uint8_t* chunk = static_cast<std::uint8_t*>(values) + n * int4_row_bytes(k) + b * int4_traits::chunk_bytes;
  for (std::int64_t e = 0; e < cpu_tiles::block; ++e) int4_set(chunk, e, q[e]);
}

// Block b of row r (within the tile) in the tiled block at `tiled`, and back.
void store_tiled(std::uint8_t* tiled, weight_format format, std::int64_t r, const int (&q)[cpu_tiles::block]) {
  if (format == weight_format::int8) {
    for (std::int64_t e = 0; e < cpu_tiles::block; ++e) {
      tiled[(e / 4 * cpu_tiles::rows + r) * cpu_tiles::word_bytes + e % 4] =
          static_cast<std::uint8_t>(q[e] + cpu_tiles::int8_offset);
    }
    return;
  }
  for (std::int64_t v = 0; v < 4; ++v) {
    for (std::int64_t i = 0; i < 4; ++i) {
      tiled[(v * cpu_tiles::rows + r) * cpu_tiles::word_bytes + i] =
          static_cast<std::uint8_t>((q[8 * v + i] + int4_traits::code_offset) |
                                    ((q[8 * v + 4 + i] + int4_traits::code_offset) << int4_traits::nibble_bits));
    }
  }
}

void load_tiled(const std::uint8_t* tiled, weight_format format, std::int64_t r, int (&q)[cpu_tiles::block]) {
  if (format == weight_format::int8) {
    for (std::int64_t e = 0; e < cpu_tiles::block; ++e) {
      q[e] = static_cast<int>(tiled[(e / 4 * cpu_tiles::rows + r) * cpu_tiles::word_bytes + e % 4]) - cpu_tiles::int8_offset;
    }
    return;
  }
  for (std::int64_t v = 0; v < 4; ++v) {
    for (std::int64_t i = 0; i < 4; ++i) {
      const std::uint8_t byte = tiled[(v * cpu_tiles::rows + r) * cpu_tiles::word_bytes + i];
      q[8 * v + i] = (byte & int4_traits::nibble_mask) - int4_traits::code_offset;
      q[8 * v + 4 + i] = (byte >> int4_traits::nibble_bits) - int4_traits::code_offset;
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
    return invalid_argument(format("CPU row tiles hold INT4 with groups of 32 or more, INT8, f16, bf16 and FP8, "
                                   "not {} (group {})",
                                   to_string(w.format), w.group_size));
  }
  if (w.layout != layout) return invalid_argument("CPU row tiles: the matrix is not in the layout converted from");
  if (n < 0 || k <= 0 || (w.format == weight_format::int4 && !valid_int4_group_size(w.group_size, k)) ||
      (w.format == weight_format::int8 && k % int8_traits::group_size != 0)) {
    return invalid_argument(format("CPU row tiles: bad shape [{}, {}] for group {}", n, k, w.group_size));
  }
  return {};
}

// The float formats: each tile [k, 16] is its rows' elements transposed (FP8's by quads);
// FP8 scales per row.
void pack_float_tile(const weight_view& rows, std::int64_t n, std::int64_t k, std::int64_t t, void* values, float* scales) {
  const std::int64_t size = cpu_tiles::element_bytes(rows.format);
  auto* tiles = static_cast<std::uint8_t*>(values);
  for (std::int64_t r = 0; r < cpu_tiles::rows; ++r) {
    const std::int64_t row = t * cpu_tiles::rows + r;
    const auto* from = static_cast<const std::uint8_t*>(rows.values) + row * k * size;
    for (std::int64_t i = 0; i < k; ++i) {
      std::uint8_t* to = tiles + cpu_tiles::of(rows.format, 0, k, row, i).byte;
      if (row < n) {
        std::memcpy(to, from + i * size, static_cast<std::size_t>(size));
      } else {
        std::memset(to, 0, static_cast<std::size_t>(size));  // +0 in every float format
      }
    }
    if (rows.format == weight_format::fp8_e4m3) scales[t * cpu_tiles::rows + r] = row < n ? rows.scales[row] : 0.0f;
  }
}

void unpack_float_tile(const weight_view& tiles, std::int64_t n, std::int64_t k, std::int64_t t, void* values,
                       float* scales) {
  const std::int64_t size = cpu_tiles::element_bytes(tiles.format);
  const auto* from = static_cast<const std::uint8_t*>(tiles.values);
  for (std::int64_t r = 0; r < cpu_tiles::rows && t * cpu_tiles::rows + r < n; ++r) {
    const std::int64_t row = t * cpu_tiles::rows + r;
    auto* to = static_cast<std::uint8_t*>(values) + row * k * size;
    for (std::int64_t i = 0; i < k; ++i) {
      std::memcpy(to + i * size, from + cpu_tiles::of(tiles.format, 0, k, row, i).byte, static_cast<std::size_t>(size));
    }
    if (tiles.format == weight_format::fp8_e4m3) scales[row] = tiles.scales[t * cpu_tiles::rows + r];
  }
}

}  // namespace

status pack_cpu_tiles(const weight_view& rows, std::int64_t n, std::int64_t k, void* values, float* scales,
                      thread_pool* pool) {
  EDGE_RETURN_IF_ERROR(check(rows, weight_layout::rows, n, k));
  const weight_format format = rows.format;
  if (!cpu_tiles::integer(format)) {
    over_tiles(n, pool, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) pack_float_tile(rows, n, k, t, values, scales);
    });
    return {};
  }
  const std::int64_t blocks = k / cpu_tiles::block;
  const std::int64_t group = cpu_tiles::group_of(format, rows.group_size);
  const std::int64_t groups = k / group;
  over_tiles(n, pool, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      for (std::int64_t r = 0; r < cpu_tiles::rows; ++r) {
        const std::int64_t row = t * cpu_tiles::rows + r;
        for (std::int64_t b = 0; b < blocks; ++b) {
          int q[cpu_tiles::block] = {};  // padding rows: q = 0
          if (row < n) read_block(rows, k, row, b, q);
          store_tiled(static_cast<std::uint8_t*>(values) + (t * blocks + b) * cpu_tiles::block_bytes(format), format, r, q);
        }
        for (std::int64_t g = 0; g < groups; ++g) {
          scales[(t * groups + g) * cpu_tiles::rows + r] = row < n ? rows.scales[row * groups + g] : 0.0f;
        }
      }
    }
  });
  return {};
}

status unpack_cpu_tiles(const weight_view& tiles, std::int64_t n, std::int64_t k, void* values, float* scales,
                        thread_pool* pool) {
  EDGE_RETURN_IF_ERROR(check(tiles, weight_layout::cpu_tiles, n, k));
  const weight_format format = tiles.format;
  if (!cpu_tiles::integer(format)) {
    over_tiles(n, pool, [&](std::int64_t begin, std::int64_t end) {
      for (std::int64_t t = begin; t < end; ++t) unpack_float_tile(tiles, n, k, t, values, scales);
    });
    return {};
  }
  const std::int64_t blocks = k / cpu_tiles::block;
  const std::int64_t group = cpu_tiles::group_of(format, tiles.group_size);
  const std::int64_t groups = k / group;
  const auto* from = static_cast<const std::uint8_t*>(tiles.values);
  over_tiles(n, pool, [&](std::int64_t begin, std::int64_t end) {
    for (std::int64_t t = begin; t < end; ++t) {
      for (std::int64_t r = 0; r < cpu_tiles::rows && t * cpu_tiles::rows + r < n; ++r) {
        const std::int64_t row = t * cpu_tiles::rows + r;
        for (std::int64_t b = 0; b < blocks; ++b) {
          int q[cpu_tiles::block];
          load_tiled(from + (t * blocks + b) * cpu_tiles::block_bytes(format), format, r, q);
          write_block(values, format, k, row, b, q);
        }
        for (std::int64_t g = 0; g < groups; ++g) scales[row * groups + g] = tiles.scales[(t * groups + g) * cpu_tiles::rows + r];
      }
    }
  });
  return {};
}

}  // namespace edge::kernels
